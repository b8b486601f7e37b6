#!/usr/bin/env bash
# Issue 5's asynchronous-save figure alone (bench/ckpt-async.py), for a short device call:
#   GPU_BENCHES=gpu-ckpt-async scripts/gpu-check.sh     (FERRY_CKPT_BENCH_SIZE, default 8g)
set -u
python3 -c 'import ferry.checkpoint' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
exec python3 bench/ckpt-async.py --size "${FERRY_CKPT_BENCH_SIZE:-8g}"
