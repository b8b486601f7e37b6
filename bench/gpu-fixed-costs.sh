#!/usr/bin/env bash
# Issue 22's fixed costs on the GPU machine, in one call (GPU_BENCHES=gpu-fixed-costs):
# small random reads from /dev/shm into device memory through the batch API and per-piece futures
# beside kvikio and the same reads into pinned host memory (bench/small-reads.py); one safetensors
# load per fresh process, 78 large against 4,000 small tensors, beside the peers carried in .whl/
# and the pinned-copy ceiling (bench/st-fresh.py, FERRY_TRACE spans); and what verifying a
# checkpoint load costs (bench/ckpt-verify-load.py). The tables are in this script's log; the
# figures go to docs/PERFORMANCE.md.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
D=/dev/shm/ferry-fixed-costs
rm -rf "$D" && mkdir -p "$D"
rc=0
run() { # name, command...
	local name=$1; shift
	echo "=== $name: $*"
	if "$@"; then echo "TABLE fixed-costs $name | ran | tables in gpu-fixed-costs.log"
	else echo "TABLE fixed-costs $name | FAILED | see gpu-fixed-costs.log"; rc=1; fi
}
run verify-load "$PY" bench/ckpt-verify-load.py --dir "$D/verify" --size 2g --rounds 3 --device cuda
run small-reads "$PY" bench/small-reads.py --device cuda --mem pinned --sizes 4k,64k,1m --depths 1,32,256 \
	--pieces 4096 --rounds 3 --file "$D/reads.bin" --json "$D/small-reads.json"
run st-fresh env FERRY_TRACE=1 "$PY" bench/st-fresh.py --device cuda --size 2g --tensors 78,4000 --procs 3 \
	--loads 2 --dir "$D" --json "$D/st-fresh.json"
[ -n "${FERRY_LOG_DIR:-}" ] && cp "$D"/*.json "$FERRY_LOG_DIR/" 2>/dev/null
rm -rf "$D"
exit $rc
