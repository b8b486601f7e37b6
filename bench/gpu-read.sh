#!/usr/bin/env bash
# Issue 3's figures, side by side in one run on one machine (scripts/gpu-check.sh runs it):
#  - pinned copy ceilings (ferry's measurement and torch's), the disk's raw read and write ceilings
#    (fio when given as $FIO, and ferry bench to host memory, O_DIRECT);
#  - warm page cache (/dev/shm) into GPU memory: ferry (-x auto, --api=pread: one read of the whole
#    file over the worker threads, a small sweep of threads and chunk size) vs kvikio (its sweep of
#    threads and task size);
#  - cold disk into GPU memory (caches dropped before each read);
#  - GPU memory to a file on disk (O_DIRECT, then fsync) against the raw write ceiling.
# Prints "TABLE name | figure | note" rows; full outputs go to $FERRY_LOG_DIR.
#   FERRY_CLI=build/ferry SHM_GIB=4 DISK_GIB=4 bash bench/gpu-read.sh
#   PARTS=warm ... (only the pinned ceiling and the warm /dev/shm part; default: all)
set -u
FERRY=${FERRY_CLI:-build/ferry}
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-read}
mkdir -p "$LOG"
SHM=${SHM_DIR:-/dev/shm}/ferry-gpu-read.dat
DISKDIR=${DISK_DIR:-$PWD/build-bench-disk}
DISK=$DISKDIR/ferry-gpu-read.dat
SHM_GIB=${SHM_GIB:-4}
DISK_GIB=${DISK_GIB:-4}
FIO=${FIO:-$(command -v fio || true)}
[ -x .deb/fio ] && FIO=${FIO:-.deb/fio}
mkdir -p "$DISKDIR"
row() { echo "TABLE $1 | $2 | $3"; }
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

"$FERRY" bench --filename "$SHM" --size ${SHM_GIB}g --bs 4m --rw write >/dev/null || exit 1
PARTS=${PARTS:-all}
disk() { [ "$PARTS" = all ]; }
disk && { "$FERRY" bench --filename "$DISK" --size ${DISK_GIB}g --bs 4m --rw write --direct 1 >/dev/null || exit 1; }

# ---- ceilings
python3 - <<'PY' >"$LOG/torch-ceiling.json" 2>&1
import json, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(2): d.copy_(h, non_blocking=True)
torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); t = []
for _ in range(5):
    s.record(); d.copy_(h, non_blocking=True); e.record(); torch.cuda.synchronize(); t.append(s.elapsed_time(e))
t.sort(); print(json.dumps({"htod_gbps": n / (t[2] / 1e3) / 1e9}))
PY
row "ceiling: torch pinned HtoD 1 GiB" "$(jget "$LOG/torch-ceiling.json" '"%.1f GB/s" % d["htod_gbps"]')" "median of 5, CUDA events"
if disk && [ -n "$FIO" ]; then
	drop
	"$FIO" --name=r --filename="$DISK" --rw=read --bs=4m --iodepth=16 --numjobs=4 --direct=1 --ioengine=io_uring \
		--group_reporting --output-format=json >"$LOG/fio-disk-read.json" 2>&1
	row "ceiling: fio disk read O_DIRECT 4x QD16 4m" "$(jget "$LOG/fio-disk-read.json" '"%.2f GB/s" % (d["jobs"][0]["read"]["bw_bytes"]/1e9)')" "fio $("$FIO" --version)"
	"$FIO" --name=w --filename="$DISK" --rw=write --bs=4m --iodepth=16 --numjobs=4 --direct=1 --ioengine=io_uring \
		--size=${DISK_GIB}g --group_reporting --output-format=json >"$LOG/fio-disk-write.json" 2>&1
	row "ceiling: fio disk write O_DIRECT 4x QD16 4m" "$(jget "$LOG/fio-disk-write.json" '"%.2f GB/s" % (d["jobs"][0]["write"]["bw_bytes"]/1e9)')" "no fsync, as ferry bench"
fi
if disk; then
"$FERRY" bench --filename "$DISK" --rw read --bs 4m --iodepth 16 --numjobs 4 --direct 1 --cold=system \
	--output-format=json >"$LOG/ferry-disk-read.json"
row "ceiling: ferry bench disk read to host, O_DIRECT 4x QD16 4m" "$(jget "$LOG/ferry-disk-read.json" '"%.2f GB/s" % (d["jobs"][0]["read"]["bw_bytes"]/1e9)')" "cold"
fi

# ---- warm: /dev/shm into GPU memory
size=$((SHM_GIB << 30))
# ferry's defaults first, then the knobs that matter for memory-bound reads: who copies resident
# chunks (cached_io: the worker itself, or io_uring, which runs queued reads in io_uring_enter or
# punts them to kernel workers), the backend, chunk size (small chunks stay in the CPU caches until
# the DMA reads them), resident chunks in flight per worker (cached_depth), and threads; kvikio's
# settings (threads x task size) in the same rounds. The machine's figures drift between processes
# (the first reader of a fresh file was 30% slower than the same settings 12 runs later), so every
# setting runs in each of SHM_ROUNDS rounds, after an untimed read, and the summary takes medians.
SHM_CONFIGS=${SHM_CONFIGS:-"default|threads=12|threads=16|cached_io=ring|backend=psync|chunk_size=512k|cached_depth=8"}
KVIKIO_CONFIGS=${KVIKIO_CONFIGS:-"8x4m 16x4m 16x16m"}
SHM_ROUNDS=${SHM_ROUNDS:-3}
IFS='|' read -r -a shm_cfgs <<<"$SHM_CONFIGS"
"$FERRY" bench --filename "$SHM" --bs 1g --size $size --api pread -x auto --output-format=json >/dev/null
# Every run of a round in turn, the order rotated by one each round, so that no setting is always
# the first run after the untimed read (run 1 of the second session: the first run of a round was
# 25% slower than the rest, whichever setting it was).
runs=()
for cfg in "${shm_cfgs[@]}"; do runs+=("ferry|$cfg"); done
for kc in $KVIKIO_CONFIGS; do runs+=("kvikio|$kc"); done
kvikio_ok=1
for round in $(seq 1 "$SHM_ROUNDS"); do
	n=${#runs[@]}
	for ((i = 0; i < n; i++)); do
		run=${runs[$(((i + round - 1) % n))]}
		kind=${run%%|*} cfg=${run#*|}
		if [ "$kind" = ferry ]; then
			envs=()
			for kv in $cfg; do [ "$kv" = default ] || envs+=("FERRY_$(echo "${kv%%=*}" | tr a-z A-Z)=${kv#*=}"); done
			tag=$(echo "$cfg" | tr ' =' '_-')-r$round
			env "${envs[@]}" "$FERRY" bench --filename "$SHM" --bs 1g --size $size --api pread \
				-x auto --io_size $((size * 3)) --output-format=json >"$LOG/ferry-shm-$tag.json" || continue
			g=$(jget "$LOG/ferry-shm-$tag.json" '"%.2f" % (d["jobs"][0]["read"]["bw_bytes"]/1e9)')
			cores=$(jget "$LOG/ferry-shm-$tag.json" '"%.2f" % d["jobs"][0]["ferry"]["cpu_cores"]')
			frac=$(jget "$LOG/ferry-shm-$tag.json" '"%.2f" % d["jobs"][0]["ferry"]["xfer"]["fraction_of_copy_ceiling"]')
			row "warm /dev/shm->GPU round $round ferry $cfg" "$g GB/s" "$frac of pinned HtoD; $cores cores"
		elif [ $kvikio_ok = 1 ]; then
			kc=$cfg
			out="$LOG/kvikio-shm-$kc-r$round.json"
			python3 bench/kvikio_read.py "$SHM" --threads "${kc%x*}" --task-sizes "${kc#*x}" >"$out" 2>"$LOG/kvikio-shm.err"
			if grep -q skipped "$out"; then
				row "warm /dev/shm->GPU kvikio" "skipped" "$(head -c 200 "$out")"
				kvikio_ok=0
				continue
			fi
			row "warm /dev/shm->GPU round $round kvikio threads=${kc%x*} task=${kc#*x}" \
				"$(jget "$out" '"%.2f GB/s" % d["gbps"]')" "$(jget "$out" '"%.2f cores, compat %s" % (d["cores"], d["compat_mode"])')"
		fi
	done
done
# medians over the rounds; ferry's defaults against kvikio's best setting and the pinned ceiling
python3 - "$LOG" <<'PY'
import glob, json, os, re, statistics, sys
log = sys.argv[1]
fig = {}
for p in glob.glob(os.path.join(log, "ferry-shm-*-r*.json")):
    tag = re.sub(r"-r\d+$", "", os.path.basename(p)[len("ferry-shm-"):-5])
    j = json.load(open(p))["jobs"][0]
    fig.setdefault("ferry " + tag, []).append((j["read"]["bw_bytes"] / 1e9, j["ferry"]["cpu_cores"],
                                                 j["ferry"]["xfer"]["fraction_of_copy_ceiling"]))
for p in glob.glob(os.path.join(log, "kvikio-shm-*-r*.json")):
    try:
        j = json.loads(open(p).read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        continue
    if "gbps" in j:
        tag = re.sub(r"-r\d+$", "", os.path.basename(p)[len("kvikio-shm-"):-5])
        fig.setdefault("kvikio " + tag, []).append((j["gbps"], j["cores"], None))
med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), len(v),
           statistics.median(x[2] for x in v) if v[0][2] is not None else None) for k, v in fig.items()}
for k in sorted(med, key=lambda k: -med[k][0]):
    g, c, n, f = med[k]
    print(f"TABLE warm /dev/shm->GPU median {k} | {g:.2f} GB/s | {c:.2f} cores ({c / g:.2f} per GB/s), {n} rounds" +
          (f", {f:.2f} of pinned HtoD" if f is not None else ""))
kv = [v for k, v in med.items() if k.startswith("kvikio")]
if "ferry default" in med and kv:
    best = max(kv, key=lambda v: v[0])
    d = med["ferry default"]
    print(f"TABLE warm /dev/shm->GPU ferry defaults / kvikio best | {d[0] / best[0]:.2f}x | "
          f"{d[0]:.2f} vs {best[0]:.2f} GB/s; ferry {d[3]:.2f} of pinned HtoD (target 0.9)")
PY

if disk; then
# ---- cold disk into GPU memory
dsize=$((DISK_GIB << 30))
"$FERRY" bench --filename "$DISK" --bs 1g --size $dsize --api pread -x auto --cold=system --output-format=json >"$LOG/ferry-disk-gpu.json"
row "cold disk->GPU ferry -x auto" "$(jget "$LOG/ferry-disk-gpu.json" '"%.2f GB/s" % (d["jobs"][0]["read"]["bw_bytes"]/1e9)')" \
	"$(jget "$LOG/ferry-disk-gpu.json" '"%.2f cores" % d["jobs"][0]["ferry"]["cpu_cores"]')"
python3 bench/kvikio_read.py "$DISK" --threads 16 --task-sizes 4m --rounds 1 --drop-caches >"$LOG/kvikio-disk.jsonl" 2>&1
grep -q gbps "$LOG/kvikio-disk.jsonl" && row "cold disk->GPU kvikio threads=16 task=4m" \
	"$(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readlines()[-1]); print("%.2f GB/s" % d["gbps"])' "$LOG/kvikio-disk.jsonl")" "caches dropped"

# ---- GPU memory to a file on disk
"$FERRY" bench --filename "$DISK" --rw write --bs 1g --size $dsize --api pread -x auto --direct 1 --output-format=json >"$LOG/ferry-gpu-disk.json"
row "GPU->disk ferry -x auto, O_DIRECT" "$(jget "$LOG/ferry-gpu-disk.json" '"%.2f GB/s" % (d["jobs"][0]["write"]["bw_bytes"]/1e9)')" \
	"$(jget "$LOG/ferry-gpu-disk.json" '"%.2f cores" % d["jobs"][0]["ferry"]["cpu_cores"]')"
"$FERRY" bench --filename "$SHM" --bs 256m --api pread -x all --io_size 2g >"$LOG/ferry-xall-shm.txt" 2>&1
sed -n '/transfer modes/,$p' "$LOG/ferry-xall-shm.txt"
fi
rm -f "$SHM" "$DISK"
exit 0
