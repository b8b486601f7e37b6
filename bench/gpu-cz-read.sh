#!/usr/bin/env bash
# Issue 26's read-path figures: ferry compressed files read into GPU memory through ferry_cz_pread
# (the read pipeline of src/format/cz_file.c), for uint16 tokens of a real tokenizer
# (bench/cz-tokens.py: a byte-level BPE trained on the Python standard library's docstrings and
# comments, or tiktoken's gpt2 where TIKTOKEN_CACHE_DIR holds it; no network) and bf16 weights,
# zstd and LZ4, chunks of 256 KiB and 1 MiB:
#  - first, the host side's bound: bf16 LZ4 1 MiB (every chunk stored, nothing to decode) warm from
#    /dev/shm through ferry_cz_pread (CPU and nvCOMP paths, GPU and host memory) beside ferry_pread
#    of the plain file (`TABLE cz stored ...`, ratios to the plain read; about 10 s);
#  - warm, from /dev/shm: nvCOMP (cz_gpu=on) against the CPU path on every core (cz_gpu=off),
#    effective GB/s on one open reader, medians of 3; target: 3x. Each row's path info has the
#    pipeline's phase times (setup, read wait, host work, GPU wait): where the time goes;
#  - cold, from the disk (build-bench-disk/cz; pages dropped with posix_fadvise): CZ_COLD_MIB of
#    the data set repeated (default 2048: a read's fixed costs at its two ends are not what a read
#    of a few hundred MiB would make them look; CZ_BENCH_COLD_ONLY=1: these rows alone);
#    cz_gpu=auto's effective GB/s against the plain file read into GPU memory (the disk's ceiling
#    through ferry) times the ratio, each the median of 3; target: 0.9x. Fresh opens that take the
#    slots an earlier reader left (a process's reads after its first), then one as the process's
#    first reader (its pinned windows registered on the way); each with its phases, windows, most
#    bytes in flight and its reads' timings;
#  - small batches (tokens, zstd, 256 KiB and 1 MiB): reads of 1-128 chunks on nvCOMP and on the
#    CPU, and the crossover that cz_gpu_min should be; for zstd, nvCOMP's warm rate at cz_window
#    16m-512m, and the CPU path's at 128m-512m (their ratio, the 3x target's at that window).
#    CZ_BENCH_WARM_ONLY=1: the warm rows and window sweeps alone.
# Rows go in the order of what they decide (tokens zstd, then tokens LZ4, then bf16), each only
# while the time budget has room for it (CZ_BENCH_TOTAL_S, default 110 s for the tokenizer's step
# and the measurement together; a row left out prints `skipped`). Each row prints its seconds.
# The measurement is tests/gpu/test_cz_bench.c's bench mode (built with -DFERRY_GPU_TESTS=ON).
# Prints "TABLE name | figure | note" rows; the full output goes to $FERRY_LOG_DIR.
#   FERRY_BUILD_DIR=build-gpu-check bash bench/gpu-cz-read.sh     CZ_BENCH_MIB=512 (bytes per data set:
#   the warm reads' size; CZ_BENCH_MIB=2048 CZ_TOKENS_MIB=512 CZ_BENCH_TOTAL_S=400 reads 2 GiB warm too)
set -u
source bench/nvcomp-env.sh test_cz_bench
if [ ! -e /dev/nvidiactl ] && [ -z "${FERRY_CUDA_LIBRARY:-}" ]; then # (FERRY_CUDA_LIBRARY: a fake driver's run)
	echo "skipped: no NVIDIA GPU here (/dev/nvidiactl absent)"
	exit 77
fi
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-cz-read}
mkdir -p "$LOG"
WARM=/dev/shm/ferry-cz-bench-$$ COLD=${CZ_COLD_DIR:-$PWD/build-bench-disk/cz}
mkdir -p "$WARM" "$COLD"
trap 'rm -rf "$WARM" "$COLD"/cz-bench-*' EXIT
MIB=${CZ_BENCH_MIB:-512}
TOTAL=${CZ_BENCH_TOTAL_S:-110}
PY=${PYTHON:-python3}
tokens=$WARM/tokens.u16
SECONDS=0
# (CZ_TOKENS_MIB: fewer tokens than MIB, repeated to it: a 2 GiB read's tokens in the tokenizer's time)
if ! (set -o pipefail; timeout 60 "$PY" bench/cz-tokens.py "$tokens" "${CZ_TOKENS_MIB:-$MIB}" 2>&1 | tee "$LOG/gpu-cz-tokens.txt"); then
	echo "TABLE cz tokens | synthetic | bench/cz-tokens.py failed (see above): the token rows use tests/nvcomp_check.h's ids"
	tokens=
fi
left=$((TOTAL - SECONDS)) # what the tokenizer's step left, at least 30 s
export CZ_BENCH_BUDGET_S=$((left > 30 ? left : 30))
echo "measurement budget: ${CZ_BENCH_BUDGET_S} s (the tokens took ${SECONDS} s)"
timeout $((CZ_BENCH_BUDGET_S + 60)) "$prog" bench "$WARM" "$COLD" "$MIB" ${tokens:+"$tokens"} 2>&1 | tee "$LOG/gpu-cz-read.txt"
exit "${PIPESTATUS[0]}"
