#!/usr/bin/env bash
# Issue 28's four measurements on a host with 2 GPUs, in one call (GPU_BENCHES=multi-gpu):
#   reads    ferry bench --gpus 0 then --gpus 0,1 from /dev/shm into GPU memory: the total beside one
#            GPU's and the pinned ceiling of both GPUs at once (measured in the same run), CPU cores;
#            then the same reads into host memory (the host's page-cache copy limit) and into both
#            GPUs with FERRY_THREADS 24 and 32 (MULTI_GPU_READ_THREADS, default "16 24 32")
#   loader   ferry.Loader on 1 rank, then on 2 ranks at once (torchrun): samples/s per rank, cores;
#            each rank's process bound to one CPU of its own (MULTI_GPU_LOADER_BIND=0: unbound)
#   ckpt     the disk's write and read ceilings (ferry bench, O_DIRECT), then ferry.checkpoint save
#            and load from 1 and from 2 GPUs at once (page cache dropped before each load)
#   weights  a safetensors set in /dev/shm into 1 GPU (one fresh process, plain load) and into 2 GPUs
#            (fresh processes: ferry's load_file(distributed=True), InstantTensor's process_group load);
#            judged on the load's time in the fresh processes (ranks started together, to the slowest
#            rank's end: the first load's context, workers and NCCL's first collective included),
#            with the whole processes' time (torchrun, imports, NCCL's start) beside it
# On one GPU it runs every 1-GPU baseline row, prints a "needs 2 GPUs, found 1" row and exits 77.
# Rows are `TABLE multi-gpu NAME | FIGURE | NOTE`; the figures go to docs/PERFORMANCE.md.
# MULTI_GPU_DEVICE=cpu is a dry run of the Python rows on the CPU (gloo), for the script itself.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
FERRY=${FERRY_CLI:-build/ferry}
DEVICE=${MULTI_GPU_DEVICE:-cuda}
READ_GB=${READ_GB:-4} WEIGHTS_GB=${WEIGHTS_GB:-8} TOKENS_GB=${TOKENS_GB:-1} CKPT_GB=${CKPT_GB:-4}
SECS=${SECS:-5}
CKPT_MIB=$($PY -c "print(max(1, int(float('$CKPT_GB') * 1024)))")
SHM=/dev/shm/ferry-multi-gpu
DISK=${MULTI_GPU_DISK:-$PWD/build-bench-disk/multi-gpu}
LOG=${FERRY_LOG_DIR:-/tmp}/multi-gpu
$PY -c 'import ferry, torch' 2>/dev/null || { echo "skipped: the ferry Python package or torch is not installed (pip install .)"; exit 77; }
if [ "$DEVICE" = cpu ]; then NGPU=${MULTI_GPU_FAKE_COUNT:-2}; else
	NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
[ "$DEVICE" = cpu ] || [ "$NGPU" -ge 1 ] || { echo "skipped: torch sees no GPU"; exit 77; }
rm -rf "$SHM" "$DISK" && mkdir -p "$SHM" "$DISK" "$LOG" || exit 1
trap 'rm -rf "$SHM" "$DISK"' EXIT
rc=0
row() { echo "TABLE multi-gpu $1 | $2 | $3"; }
now() { date +%s.%N; }
TR=("$PY" -m torch.distributed.run --standalone)
# ranks NPROC MODE ARGS...: runs bench/multi-gpu.py under torchrun, prints its RESULT lines (by rank)
ranks() {
	local n=$1; shift
	rm -rf "$LOG/results" && mkdir -p "$LOG/results" || return 1
	MULTI_GPU_RESULTS=$LOG/results OMP_NUM_THREADS=1 "${TR[@]}" --nproc-per-node "$n" bench/multi-gpu.py --device "$DEVICE" "$@" \
		>"$LOG/last.out" 2>&1 || { echo "=== failed: $*"; tail -n 30 "$LOG/last.out"; return 1; }
	cp "$LOG/last.out" "$LOG/run-$n-$1-${3:-}.out" # each run's log kept (FERRY_TRACE's spans in the weights runs)
	cat "$LOG"/results/rank-*.json | sed 's/^RESULT //'
}
# j EXPR: evaluates a Python expression over R (the RESULT objects on stdin, a list)
j() { $PY -c "import json,sys; R=[json.loads(l) for l in sys.stdin if l.strip()]; print($1)"; }

echo "=== $(date -u +%FT%TZ) $(hostname): $NGPU GPU(s), device $DEVICE, $(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null)"

# ------------------------------------------------------------------------------------------- reads
if [ "$DEVICE" = cuda ]; then
	# one read of the whole file per GPU through the library (gpu-read.sh's ferry rows: --api pread,
	# --bs 1g), so the engine's workers and the copy units carry it, not the bench's job thread
	rd() { "$FERRY" bench --filename "$SHM/read.bin" --size "${READ_GB}g" --bs 1g --api pread --runtime "$SECS" \
		--gpus "$1" --output-format json >"$LOG/read-$1.json" 2>"$LOG/read-$1.err"; }
	f() { $PY -c "import json; t=json.load(open('$1'))['ferry']; print($2)"; }
	if rd 0; then
		one=$(f "$LOG/read-0.json" "round(t['gpus_total_bw_bytes']/1e9,2)")
		row reads-1gpu "$one GB/s" "$(f "$LOG/read-0.json" "'ceiling %.1f GB/s, %.2f cores' % (t['gpus_htod_ceiling_all_bytes']/1e9, t['gpus_cpu_cores'])")"
		if [ "$NGPU" -ge 2 ]; then
			if rd 0,1; then
				row reads-2gpu "$(f "$LOG/read-0,1.json" "round(t['gpus_total_bw_bytes']/1e9,2)") GB/s" "$(f "$LOG/read-0,1.json" \
					"'per GPU %s; both at once ceiling %.1f GB/s; %.2fx one GPU (target >= min(1.8x, ceiling): %s); %.2f cores' % ([round(g['bw_bytes']/1e9,2) for g in t['gpus']], t['gpus_htod_ceiling_all_bytes']/1e9, t['gpus_total_bw_bytes']/1e9/$one, 'met' if t['gpus_total_bw_bytes'] >= min(1.8*$one*1e9, t['gpus_htod_ceiling_all_bytes']) else 'NOT met', t['gpus_cpu_cores'])")"
			else row reads-2gpu FAILED "$(tail -n 1 "$LOG/read-0,1.err")"; rc=1; fi
			# the host's side (issue 28: "or the host's measured limit"): the same reads into host
			# memory (the page-cache copy alone, no GPU), and both GPUs with more worker threads
			# than the default's cap of 16 (MULTI_GPU_READ_THREADS; "none" leaves them out)
			for t in ${MULTI_GPU_READ_THREADS:-16 24 32}; do
				[ "$t" = none ] && break
				if FERRY_THREADS=$t "$FERRY" bench --filename "$SHM/read.bin" --size "${READ_GB}g" --bs 1g \
					--api pread --runtime "$SECS" --output-format json >"$LOG/read-host-$t.json" 2>"$LOG/read-host-$t.err"; then
					row "reads-host threads=$t" "$($PY -c "import json; t=json.load(open('$LOG/read-host-$t.json'))['jobs'][0]['ferry']; print(round(t['gbps'],2))") GB/s" \
						"/dev/shm into host memory (the page-cache copy, no GPU); $($PY -c "import json; t=json.load(open('$LOG/read-host-$t.json'))['jobs'][0]['ferry']; print('%.2f cores' % t['cpu_cores'])")"
				else row "reads-host threads=$t" FAILED "$(tail -n 1 "$LOG/read-host-$t.err")"; rc=1; fi
				[ "$t" = 16 ] && continue # reads-2gpu above ran the default (16 threads on 32 CPUs or more)
				if FERRY_THREADS=$t rd 0,1; then
					row "reads-2gpu threads=$t" "$(f "$LOG/read-0,1.json" "round(t['gpus_total_bw_bytes']/1e9,2)") GB/s" \
						"$(f "$LOG/read-0,1.json" "'per GPU %s; %.2fx one GPU at the default threads; %.2f cores' % ([round(g['bw_bytes']/1e9,2) for g in t['gpus']], t['gpus_total_bw_bytes']/1e9/$one, t['gpus_cpu_cores'])")"
				else row "reads-2gpu threads=$t" FAILED "$(tail -n 1 "$LOG/read-0,1.err")"; rc=1; fi
			done
		fi
	else row reads-1gpu FAILED "$(tail -n 1 "$LOG/read-0.err")"; rc=1; fi
	rm -f "$SHM/read.bin"
else
	row reads "-" "skipped: ferry bench --gpus needs a GPU (dry run on the CPU)"
fi

# ------------------------------------------------------------------------------------------ loader
$PY bench/multi-gpu.py prep-tokens "$SHM/tok" "$TOKENS_GB" || rc=1
if r1=$(ranks 1 loader "$SHM/tok" "$SECS"); then
	one=$(echo "$r1" | j "round(R[0]['samples_per_s'])")
	row loader-1rank "$one samples/s" "$(echo "$r1" | j "'%.2f cores' % R[0]['cores']")"
	if [ "$NGPU" -ge 2 ]; then
		if r2=$(ranks 2 loader "$SHM/tok" "$SECS"); then
			row loader-2ranks "$(echo "$r2" | j "min(round(r['samples_per_s']) for r in R)") samples/s (slowest rank)" "$(echo "$r2" | j \
				"'per rank %s, cores %s; %.2fx one rank (target >= 0.9x, each <= 1 core: %s)' % ([round(r['samples_per_s']) for r in R], [round(r['cores'],2) for r in R], min(r['samples_per_s'] for r in R)/$one, 'met' if min(r['samples_per_s'] for r in R) >= 0.9*$one and max(r['cores'] for r in R) <= 1.02 else 'NOT met')")"
		else row loader-2ranks FAILED "see multi-gpu.log"; rc=1; fi
	fi
else row loader-1rank FAILED "see multi-gpu.log"; rc=1; fi
rm -rf "$SHM/tok"

# -------------------------------------------------------------------------------------------- ckpt
cw=0; cr=0
if "$FERRY" bench --filename "$DISK/ceiling.bin" --rw write --bs 16m --iodepth 8 --direct 1 --size "${CKPT_MIB}m" \
	--output-format json >"$LOG/ceil-w.json" 2>"$LOG/ceil.err" &&
	"$FERRY" bench --filename "$DISK/ceiling.bin" --rw read --bs 16m --iodepth 8 --direct 1 --cold \
	--output-format json >"$LOG/ceil-r.json" 2>>"$LOG/ceil.err"; then
	cw=$($PY -c "import json; print(json.load(open('$LOG/ceil-w.json'))['ferry']['gbps'])")
	cr=$($PY -c "import json; print(json.load(open('$LOG/ceil-r.json'))['ferry']['gbps'])")
	row ckpt-ceiling "write $(printf %.2f "$cw") GB/s, read $(printf %.2f "$cr") GB/s" "ferry bench --direct 1 --bs 16m --iodepth 8 on $DISK"
else row ckpt-ceiling FAILED "$(tail -n 1 "$LOG/ceil.err")"; rc=1; fi
rm -f "$DISK/ceiling.bin"
ck() { # NPROC
	local r
	rm -rf "$DISK/ck"
	if r=$(ranks "$1" ckpt "$DISK/ck" "$CKPT_GB"); then
		row "ckpt-${1}gpu" "$(echo "$r" | j "'save %.2f GB/s, load %.2f GB/s' % (sum(x['bytes'] for x in R)/max(x['save_s'] for x in R)/1e9, sum(x['bytes'] for x in R)/max(x['load_s'] for x in R)/1e9)")" \
			"$(echo "$r" | j "'of the ceiling: save %.2f, load %.2f (target >= 0.9: %s)' % ((sum(x['bytes'] for x in R)/max(x['save_s'] for x in R)/1e9/$cw) if $cw else 0, (sum(x['bytes'] for x in R)/max(x['load_s'] for x in R)/1e9/$cr) if $cr else 0, 'met' if $cw and $cr and sum(x['bytes'] for x in R)/max(x['save_s'] for x in R)/1e9 >= 0.9*$cw and sum(x['bytes'] for x in R)/max(x['load_s'] for x in R)/1e9 >= 0.9*$cr else 'NOT met')")"
	else row "ckpt-${1}gpu" FAILED "see multi-gpu.log"; rc=1; fi
	rm -rf "$DISK/ck"
}
ck 1
[ "$NGPU" -ge 2 ] && ck 2

# ----------------------------------------------------------------------------------------- weights
$PY bench/multi-gpu.py prep-weights "$SHM/w" "$WEIGHTS_GB" || rc=1
IDX=$SHM/w/m.safetensors.index.json
wl() { # NPROC LOADER -> "wall_s max_load_s" (each rank a fresh process, torchrun's launch in both)
	local t0 t1 r
	t0=$(now)
	r=$(ranks "$1" weights "$IDX" "$2") || return 1
	t1=$(now)
	echo "$r" | j "'%.3f %.3f %d' % ($t1 - $t0, max(x['load_s'] for x in R), max(x['bytes'] for x in R))"
}
export FERRY_TRACE=1 # load_file's spans (context, open, plan, alloc, read) on each rank's stderr
plain=$(wl 1 plain) && row weights-1gpu "$(echo "$plain" | awk '{printf "%.2f s", $2}')" "ferry load_file in one fresh process, $(echo "$plain" | awk '{printf "%.2f GB/s; the whole process %.2f s", $3/$2/1e9, $1}')" || { row weights-1gpu FAILED "see multi-gpu.log"; rc=1; }
it1=$(wl 1 instanttensor 2>/dev/null) && row weights-1gpu-instanttensor "$(echo "$it1" | awk '{printf "%.2f s", $2}')" "InstantTensor safe_open in one fresh process; the whole process $(echo "$it1" | awk '{printf "%.2f s", $1}')" || row weights-1gpu-instanttensor "-" "InstantTensor did not run (pip install .whl/instanttensor-*.whl?)"
if [ "$NGPU" -ge 2 ]; then
	if fd=$(wl 2 ferry); then
		its=-; itr="InstantTensor did not run"
		if it=$(wl 2 instanttensor); then its=$(echo "$it" | awk '{print $2}'); itr="InstantTensor $its s"; fi
		row weights-2gpu "$(echo "$fd" | awk '{printf "%.2f s", $2}')" "$($PY -c "
fd, pl, it = $(echo "$fd" | awk '{print $2}'), $(echo "$plain" | awk '{print $2}'), '$its'
fw, pw = $(echo "$fd" | awk '{print $1}'), $(echo "$plain" | awk '{print $1}')
r = fd / pl
s = float(it) / fd if it != '-' else 0
print('load_file(distributed=True) on 2 fresh processes, slowest rank: %.2fx one GPU (target <= 0.6: %s); $itr, %.2fx ferry (target >= 1.5: %s); whole processes %.2f s vs %.2f s' % (r, 'met' if r <= 0.6 else 'NOT met', s, 'met' if s >= 1.5 else 'NOT met', fw, pw))")"
	else row weights-2gpu FAILED "see multi-gpu.log"; rc=1; fi
fi
rm -rf "$SHM/w"

if [ "$NGPU" -lt 2 ]; then
	row "2-GPU rows" "needs 2 GPUs, found $NGPU" "the 1-GPU baseline rows above ran; run on nvidia-h100-x2 for reads-2gpu, loader-2ranks, ckpt-2gpu, weights-2gpu"
	echo "skipped: needs 2 GPUs, found $NGPU (the 1-GPU baseline rows ran)"
	[ $rc -eq 0 ] && exit 77
fi
exit $rc
