#!/usr/bin/env bash
# Issue 4's figure for scripts/gpu-check.sh (GPU_BENCHES=gpu-py-overhead): bench/py-overhead.py, a
# File.pread_into loop in Python against the same ferry_pread from the C CLI, on a warm 256 MiB file
# in /dev/shm, 5 rounds of 1 s per side and block size (about 30 s). Needs `pip install .`; no GPU.
set -u
FERRY=${FERRY_CLI:-build/ferry}
python3 -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
F=${SHM_DIR:-/dev/shm}/ferry-py-overhead.bin
out=$(python3 bench/py-overhead.py --cli "$FERRY" --rounds 5 --runtime 1 --file "$F")
rc=$?
rm -f "$F"
printf '%s\n' "$out"
[ $rc -eq 0 ] || exit $rc
# py-overhead.py's rows: "4k  1.183  1.679  0.496  70.5%   (median of rounds)"; its last line:
# "target: at 16 MiB Python within 2% of C: met (0.80%)"
printf '%s\n' "$out" | awk '/\(median of rounds\)/ {
	printf "TABLE python call overhead bs=%s | %+.3f us per call | C %s / Python %s us per call (medians); Python %s of C\x27s throughput\n", $1, $4, $2, $3, $5 }'
printf '%s\n' "$out" | sed -n 's/^target: \(.*\): \(.*\)$/TABLE target \1 | \2 |/p'
