#!/usr/bin/env bash
# Issue 6's figures for scripts/gpu-check.sh: bench/loader-gpu.sh (ferry.Loader vs PyTorch DataLoader,
# warm, with a synthetic GPU step, cold against the disk's ceiling) on GB of tokens (2 here so that
# the whole check fits one device call), with mosaicml-streaming from the wheels carried in .whl/ (see
# bench/loader-gpu.sh). Needs `pip install .`.
set -u
python3 -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
ROOT=$PWD GB=${GB:-2} SECONDS_PER_RUN=${SECONDS_PER_RUN:-5} COLD_DIR=${COLD_DIR:-$PWD/build-bench-disk/loader} \
	exec bash bench/loader-gpu.sh
