#!/usr/bin/env bash
# Loader benchmark for the GPU machine: ferry's loader vs PyTorch DataLoader (8 workers,
# pin_memory, prefetch_factor 4) on a uint16 token dataset of 2048-token samples, warm (/dev/shm)
# and cold (disk, page cache dropped before each run), then a synthetic GPU step needing 80% of
# each loader's peak rate. Prints `TABLE name | figure | note` lines.
#   bench/loader-gpu.sh [GB=4] [DIR=/var/tmp] [SECONDS=20] [BATCH=32] [DEVICE=0]
set -uo pipefail
cd "$(dirname "$0")/.."
GB=${GB:-4}; DIR=${DIR:-/var/tmp}; SECS=${SECONDS_PER_RUN:-20}; BATCH=${BATCH:-32}; DEV=${DEVICE:-0}
PY=${PYTHON:-python3}
FERRY=${FERRY:-build/ferry}
[ -x "$FERRY" ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; } || exit 1
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "TABLE note | cold | cannot drop caches (not root): cold figures are warm"; }
mk() { # dir -> dir/tokens.bin (GB of uint16 tokens) and dir/tokens (the same, packed)
	local d=$1
	mkdir -p "$d"
	if [ ! -f "$d/tokens.bin" ]; then
		$PY -c "
import numpy as np, sys
n = int($GB * (1 << 30)) // 2
out = np.memmap('$d/tokens.bin', dtype=np.uint16, mode='w+', shape=(n,))
step = 1 << 26
rng = np.random.default_rng(0)
for i in range(0, n, step):
    out[i:i + step] = rng.integers(0, 50000, size=min(step, n - i), dtype=np.uint16)
out.flush()"
	fi
	# the same token stream packed as 256 MiB samples (a ferry sample holds < 4 GiB); the loader's
	# 2048-token windows over it are the peer's memmap slices, index for index
	if [ ! -f "$d/tokens/ferry.idx" ]; then
		mkdir -p "$d/parts" && split -b 256M -d -a 4 "$d/tokens.bin" "$d/parts/p" &&
			"$FERRY" pack -q --input raw --dtype uint16 -o "$d/tokens" "$d/parts" >/dev/null && rm -rf "$d/parts"
	fi
}
peak_bw() { dd if="$1" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/.*, //'; }
echo "TABLE machine | $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) | $(nproc) CPUs"
for where in warm cold; do
	if [ $where = warm ]; then d=/dev/shm/ferry-loader; else d=$DIR/ferry-loader; fi
	mk "$d"
	if [ $where = cold ]; then echo "TABLE cold raw read (dd O_DIRECT) | $(peak_bw "$d/tokens.bin") | ceiling"; fi
	for order in sequential shuffle block; do
		[ $where = cold ] && drop
		"$FERRY" loader-bench "$d/tokens" --name "ferry $where $order" --order $order --seq-len 2048 \
			--batch-size "$BATCH" --device "$DEV" --threads 2 --prefetch 8 --seconds "$SECS" \
			--step-fraction 0.8
	done
	for sh in "" --shuffle; do
		[ $where = cold ] && drop
		$PY bench/loader-gpu.py "$d/tokens.bin" --seq-len 2048 --batch-size "$BATCH" --seconds "$SECS" $sh \
			--name "torch $where ${sh:-sequential}" --step-fraction 0.8
	done
done
