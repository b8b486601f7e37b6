#!/usr/bin/env bash
# Issue 26's warm figure, in one process on one machine: GPU batched decompression through nvCOMP
# (src/gpu/nvcomp.c) against the CPU's decompression of the same chunks on every core (libzstd and
# liblz4 in threads), for uint16 token data and bf16 weights, chunks of 256 KiB, 1 MiB and 4 MiB:
# the compression ratio, GPU GB/s with the compressed chunks already in device memory and from
# pinned host memory (the copy included), CPU GB/s, and the ratios (target: GPU >= 3x the CPU on
# all 16 cores, judged from pinned memory). The measurement is tests/gpu/test_nvcomp_gpu.c's
# `bench` mode; without a GPU or nvCOMP only the CPU half runs (exit 77).
# Prints "TABLE name | figure | note" rows; the full output goes to $FERRY_LOG_DIR.
#   FERRY_BUILD_DIR=build-gpu-check bash bench/gpu-compress.sh     (built with -DFERRY_GPU_TESTS=ON)
#   NVC_BENCH_MIB=256 (bytes per data set)
set -u
source bench/nvcomp-env.sh test_nvcomp_gpu
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-compress}
mkdir -p "$LOG"
nproc
timeout 300 "$prog" bench 2>&1 | tee "$LOG/gpu-compress.txt"
exit "${PIPESTATUS[0]}"
