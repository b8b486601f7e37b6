#!/usr/bin/env bash
# Issue 2's figures on the GPU machine, for scripts/gpu-check.sh (GPU_BENCHES=gpu-vsfio): fio and
# ferry bench side by side (bench/vs-fio.sh) on the machine's disk, every row, and on /dev/shm the
# rows named in SHM_ROWS; first the buffered random-read probe (bench/probe-buffered-rand.sh: each
# tool with each generator of random offsets, bytes read from storage per byte delivered).
# fio comes from .deb/fio (scripts/stage-device.sh builds it; the GPU machine has none) or $FIO.
# Prints TABLE rows; about 5 minutes with the defaults (ROUNDS=3 RUNTIME=2).
#   FERRY_CLI=build/ferry bash bench/gpu-vsfio.sh
set -u
FERRY=${FERRY_CLI:-build/ferry}
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-vsfio}
FIO=${FIO:-$(command -v fio || true)}
[ -z "$FIO" ] && [ -x .deb/fio ] && FIO=$PWD/.deb/fio
[ -n "$FIO" ] || { echo "skipped: no fio (scripts/stage-device.sh fio, then carry .deb)"; exit 77; }
DISK=${DISK_DIR:-$PWD/build-bench-disk}/vsfio
mkdir -p "$DISK" "$LOG"
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-2}
# BATCH1_ROWS / SHM_BATCH1_ROWS: disk / /dev/shm rows run again with ferry submitting each I/O as
# fio does by default (--iodepth_batch_submit=1), the lead for the rows below 0.95x
# (docs/PERFORMANCE.md); "" for none.
BATCH1_ROWS=${BATCH1_ROWS-"read rand 4KiB QD64 direct,write rand 4KiB QD64 direct,read seq 1MiB QD32 buffered"}
SHM_BATCH1_ROWS=${SHM_BATCH1_ROWS-"read rand 4KiB QD64 direct,write rand 4KiB QD64 direct"}
SHM_ROWS=${SHM_ROWS-"read rand 4KiB QD64 direct,write rand 4KiB QD64 direct,read rand 4KiB QD64 buffered,write rand 4KiB QD64 buffered,read seq 1MiB QD32 buffered"}
status=0

# PROBE=0 leaves the probe out (its row is settled: docs/PERFORMANCE.md, fourth session)
if [ "${PROBE:-1}" != 0 ]; then
	FIO=$FIO FERRY=$FERRY ROUNDS=2 RUNTIME=$RUNTIME bash bench/probe-buffered-rand.sh "$DISK" >"$LOG/probe-buffered-rand.log" 2>&1 || status=1
	# "PROBE round | variant | GB/s IOPS | storage/app | cached"
	sed -n 's/^PROBE /TABLE probe disk buffered rand 4k QD64 /p' "$LOG/probe-buffered-rand.log"
fi

summary() { # json, where
	python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["summary"]:
    row = r["row"] if r.get("variant", "ferry") == "ferry" else f"{r['row']} [{r['variant']}]"
    if "error" in r:
        print(f"TABLE vs-fio {sys.argv[2]} {row} | n/a | {r['error'][:160]}")
        continue
    print(f"TABLE vs-fio {sys.argv[2]} {row} | {r['ratio']:.2f}x | fio {r['fio_gbps']:.3f} / ferry "
          f"{r['ferry_gbps']:.3f} GB/s; cpu-s/GB fio {r['fio_cpu_s_per_gb']:.2f} / ferry {r['ferry_cpu_s_per_gb']:.2f}; "
          f"rounds' median {r['ratio_median_of_rounds']:.2f}x; {'met' if r['met_0_95'] else 'NOT met'}")
PY
}
# DISK_ROWS: the disk rows (default: every row)
FIO=$FIO FERRY=$FERRY bash bench/vs-fio.sh --dir "$DISK" --size 1g --runtime "$RUNTIME" --rounds "$ROUNDS" \
	${DISK_ROWS:+--rows "$DISK_ROWS"} --json "$LOG/vsfio-disk.json" >"$LOG/vsfio-disk.log" 2>&1 || status=1
summary "$LOG/vsfio-disk.json" disk
if [ -n "$BATCH1_ROWS" ]; then
	FIO=$FIO FERRY=$FERRY FERRY_ARGS="--iodepth_batch_submit=1" bash bench/vs-fio.sh --dir "$DISK" --size 1g \
		--runtime "$RUNTIME" --rounds "$ROUNDS" --rows "$BATCH1_ROWS" --json "$LOG/vsfio-disk-batch1.json" \
		>"$LOG/vsfio-disk-batch1.log" 2>&1 || status=1
	summary "$LOG/vsfio-disk-batch1.json" "disk, ferry --iodepth_batch_submit=1,"
fi
if [ -n "$SHM_ROWS" ]; then
	FIO=$FIO FERRY=$FERRY bash bench/vs-fio.sh --dir /dev/shm --size 1g --runtime "$RUNTIME" --rounds "$ROUNDS" \
		--rows "$SHM_ROWS" --json "$LOG/vsfio-shm.json" >"$LOG/vsfio-shm.log" 2>&1 || status=1
	summary "$LOG/vsfio-shm.json" /dev/shm
fi
if [ -n "$SHM_BATCH1_ROWS" ]; then
	FIO=$FIO FERRY=$FERRY FERRY_ARGS="--iodepth_batch_submit=1" bash bench/vs-fio.sh --dir /dev/shm --size 1g \
		--runtime "$RUNTIME" --rounds "$ROUNDS" --rows "$SHM_BATCH1_ROWS" --json "$LOG/vsfio-shm-batch1.json" \
		>"$LOG/vsfio-shm-batch1.log" 2>&1 || status=1
	summary "$LOG/vsfio-shm-batch1.json" "/dev/shm, ferry --iodepth_batch_submit=1,"
fi
rm -rf "$DISK"
exit $status
