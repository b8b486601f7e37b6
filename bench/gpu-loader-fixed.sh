#!/usr/bin/env bash
# Issue 22's loader target in one device call (GPU_BENCHES=gpu-loader-fixed): bench/loader-gpu.py
# --fixed-costs on 2 GB of tokens in /dev/shm: ferry.Loader at its defaults against DataLoader with 8
# and 16 workers (batches of 64 x 2049, shuffled, to the GPU), the cores of ferry's process, and the
# wait fraction with a ~50 ms step of matmuls next to the no-work loop. About 1.5 minutes.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
"$PY" -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
ROOT=$PWD
cd /tmp && exec "$PY" "$ROOT/bench/loader-gpu.py" --fixed-costs --gb "${GB:-2}" --seconds "${SECONDS_PER_RUN:-8}" \
	--warm-dir /dev/shm/ferry-loader-fixed
