#!/usr/bin/env bash
# Issue 26's loader figure for scripts/gpu-check.sh: what decompression costs ferry.Loader on the
# GPU (bench/loader-cz.py --device cuda): token shards from /dev/shm, plain and compressed (zstd at
# 1 MiB and 256 KiB chunks, LZ4 at 1 MiB), batches of 64 x 2,048 tokens into GPU memory, one
# pipeline thread, the default shuffle (the chunk window); each compressed set with cz_decode=cpu
# (the pipeline thread decodes) and cz_decode=gpu (nvCOMP into the thread's device cache). Rows:
# pipeline CPU per sample against plain's, samples/s, and decompression's cost in cores against
# the target, at most one. LCZ_SETS names other sets (lz4-256k, ...). About 3 x 7 runs of
# LCZ_SECONDS (3) plus the data's set-up: ~2 minutes.
# Needs `pip install .`.
set -u
python3 -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
if [ ! -e /dev/nvidiactl ] && [ -z "${FERRY_CUDA_LIBRARY:-}" ]; then
	echo "skipped: no NVIDIA GPU here (/dev/nvidiactl absent)"
	exit 77
fi
source bench/nvcomp-env.sh
exec python3 bench/loader-cz.py --device cuda --decode cpu,gpu --sets "${LCZ_SETS:-zstd-1m,zstd-256k,lz4-1m}" --orders shuffle \
	--samples "${LCZ_SAMPLES:-40000}" --seconds "${LCZ_SECONDS:-3}" --rounds "${LCZ_ROUNDS:-3}" \
	--dir /dev/shm/ferry-loader-cz-$$
