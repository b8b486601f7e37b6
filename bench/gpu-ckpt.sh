#!/usr/bin/env bash
# Issue 5's figures for scripts/gpu-check.sh: bench/ckpt-gpu.py (ferry vs safetensors.torch,
# fastsafetensors, runai-model-streamer and torch.load; warm and cold; the disk's raw ceilings) on
# FERRY_CKPT_BENCH_SIZE of bf16 tensors (2g here so that the whole check fits one device call; the
# issue's figure is for 8g: FERRY_CKPT_BENCH_SIZE=8g bash bench/gpu-ckpt.sh). Needs `pip install .`.
set -u
FERRY=${FERRY_CLI:-build/ferry}
DISK=${DISK_DIR:-$PWD/build-bench-disk}
mkdir -p "$DISK"
python3 -c 'import ferry.safetensors' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
exec python3 bench/ckpt-gpu.py --ferry "$FERRY" --disk "$DISK" --size "${FERRY_CKPT_BENCH_SIZE:-2g}"
