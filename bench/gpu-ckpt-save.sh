#!/usr/bin/env bash
# Issue 5's save target alone (bench/ckpt-save.py: the disk's raw write ceiling, `ferry ckpt bench
# --save-only` with save_prealloc auto and off, ferry.safetensors.save_file from CUDA tensors; in turns,
# 2 rounds), for a device call shorter than bench/gpu-ckpt.sh's: about 2.5 minutes at 8g.
#   GPU_BENCHES=gpu-ckpt-save scripts/gpu-check.sh     (FERRY_CKPT_BENCH_SIZE, default 8g)
set -u
FERRY=${FERRY_CLI:-build/ferry}
DISK=${DISK_DIR:-$PWD/build-bench-disk}
mkdir -p "$DISK"
python3 -c 'import ferry.safetensors, torch' 2>/dev/null || { echo "skipped: the ferry Python package or torch is not installed (pip install .)"; exit 77; }
exec python3 bench/ckpt-save.py --ferry "$FERRY" --disk "$DISK" --size "${FERRY_CKPT_BENCH_SIZE:-8g}" --rounds "${FERRY_CKPT_SAVE_ROUNDS:-2}" \
	--variants "${FERRY_CKPT_SAVE_VARIANTS:-auto,off,deep}"
