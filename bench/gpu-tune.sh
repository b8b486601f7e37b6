#!/usr/bin/env bash
# The measurements that chose ferry's defaults for the GPU paths (docs/CONFIG.md, docs/PAGECACHE.md),
# in one run: page-cache designs (bench_gpu_pagecache), then threads x queue depth x chunk size for
# cold disk into GPU memory and GPU memory to disk, O_DIRECT. Prints "TABLE name | figure | note".
#   FERRY_CLI=build/ferry FERRY_BUILD_DIR=build bash bench/gpu-tune.sh
set -u
FERRY=${FERRY_CLI:-build/ferry}
B=${FERRY_BUILD_DIR:-build}
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-tune}
DISKDIR=${DISK_DIR:-$PWD/build-bench-disk}
mkdir -p "$LOG" "$DISKDIR"
DISK=$DISKDIR/tune.dat
"$B/bench_gpu_pagecache" /dev/shm/ferry-pagecache.dat 4 | tee "$LOG/pagecache.txt"
rm -f /dev/shm/ferry-pagecache.dat
"$FERRY" bench --filename "$DISK" --size 4g --bs 4m --rw write --direct 1 >/dev/null || exit 1
g() { python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['jobs'][0]; print('%.2f GB/s | %.2f cores' % (d[sys.argv[2]]['bw_bytes']/1e9, d['ferry']['cpu_cores']))" "$@"; }
for rw in read write; do
	for t in 4 8; do
		for qd in 8 16; do
			for c in 1m 4m; do
				cold=; [ $rw = read ] && cold=--cold=system
				FERRY_THREADS=$t FERRY_QUEUE_DEPTH=$qd FERRY_SLOTS=$qd FERRY_CHUNK_SIZE=$c "$FERRY" bench \
					--filename "$DISK" --rw $rw --bs 1g --size 4g --api pread -x cpu-async-gpu --direct 1 $cold \
					--output-format=json >"$LOG/disk-$rw-$t-$qd-$c.json" || continue
				echo "TABLE disk $rw GPU threads=$t qd=$qd chunk=$c | $(g "$LOG/disk-$rw-$t-$qd-$c.json" $rw)"
			done
		done
	done
done
rm -f "$DISK"
