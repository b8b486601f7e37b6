#!/usr/bin/env bash
# Issue 22's loader target in one device call (GPU_BENCHES=gpu-loader-fixed): bench/loader-gpu.py
# --fixed-costs on 2 GB of tokens in /dev/shm: ferry.Loader at its defaults against DataLoader with 8
# and 16 workers (batches of 64 x 2049, shuffled, to the GPU), the cores of ferry's process, and the
# wait fraction with a ~50 ms step of matmuls next to the no-work loop; before it, the pipeline alone
# (--pipeline) with mapped=1 and 0. About 2 minutes.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
"$PY" -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
ROOT=$PWD
cd /tmp || exit 1
# the pipeline alone first (device cpu, its CPU per batch from its own counter), shards copied from
# mappings (mapped=1, the default) and with a pread per read (mapped=0); about 20 s
for m in 1 0; do
	echo "pipeline with FERRY_LOADER_MAPPED=$m"
	FERRY_LOADER_MAPPED=$m "$PY" "$ROOT/bench/loader-gpu.py" --pipeline --gb "${GB:-2}" --batches 4000 --rounds 3 \
		--warm-dir /dev/shm/ferry-loader-fixed | sed "s/^TABLE loader pipeline/TABLE loader pipeline mapped=$m/"
done
exec "$PY" "$ROOT/bench/loader-gpu.py" --fixed-costs --gb "${GB:-2}" --seconds "${SECONDS_PER_RUN:-8}" \
	--warm-dir /dev/shm/ferry-loader-fixed
