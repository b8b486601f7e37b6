#!/usr/bin/env bash
# Issue 5's figures for scripts/gpu-check.sh: bench/ckpt-gpu.py (ferry vs safetensors.torch,
# fastsafetensors, runai-model-streamer and torch.load; warm and cold; the disk's raw ceilings; a
# `TABLE target ...` line per target of the issue) on FERRY_CKPT_BENCH_SIZE of bf16 tensors, 8g by
# default (the size): about 4.5 minutes on the GPU machine (estimate in the script's header),
# so give it a device call of its own: GPU_BENCHES=gpu-ckpt scripts/gpu-check.sh. 2g takes about one
# minute. Needs `pip install .` (and the peers' wheels for their rows).
set -u
FERRY=${FERRY_CLI:-build/ferry}
DISK=${DISK_DIR:-$PWD/build-bench-disk}
mkdir -p "$DISK"
python3 -c 'import ferry.safetensors' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
exec python3 bench/ckpt-gpu.py --ferry "$FERRY" --disk "$DISK" --size "${FERRY_CKPT_BENCH_SIZE:-8g}"
