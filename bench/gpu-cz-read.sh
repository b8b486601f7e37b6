#!/usr/bin/env bash
# Issue 26's read-path figures (part 1): ferry compressed files read into GPU memory through
# ferry_cz_pread, for uint16 tokens and bf16 weights, zstd and LZ4 (1 MiB chunks, the default):
#  - warm, from /dev/shm: the nvCOMP path (cz_gpu=auto) against the CPU path on every core
#    (cz_gpu=off), effective GB/s; target: 3x;
#  - cold, from the disk (build-bench-disk/cz; pages dropped with posix_fadvise): the compressed
#    file's effective GB/s against the plain file read into GPU memory (the disk's ceiling through
#    ferry) times the ratio; target: 0.9x.
# The measurement is tests/gpu/test_cz_bench.c's bench mode (built with -DFERRY_GPU_TESTS=ON).
# Prints "TABLE name | figure | note" rows; the full output goes to $FERRY_LOG_DIR.
#   FERRY_BUILD_DIR=build-gpu-check bash bench/gpu-cz-read.sh     CZ_BENCH_MIB=1024 (bytes per data set)
set -u
source bench/nvcomp-env.sh test_cz_bench
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-cz-read}
mkdir -p "$LOG"
WARM=/dev/shm/ferry-cz-bench-$$ COLD=${CZ_COLD_DIR:-$PWD/build-bench-disk/cz}
mkdir -p "$WARM" "$COLD"
trap 'rm -rf "$WARM" "$COLD"/cz-bench-*' EXIT
timeout 400 "$prog" bench "$WARM" "$COLD" "${CZ_BENCH_MIB:-1024}" 2>&1 | tee "$LOG/gpu-cz-read.txt"
exit "${PIPESTATUS[0]}"
