#!/usr/bin/env bash
# The disk side of the `threads` default (docs/CONFIG.md): cold disk -> GPU memory and GPU memory
# -> disk with THREADS_LIST worker threads (default "8 12"; T:D for T threads of queue depth D), alternating, ROUNDS rounds, beside the
# disk's raw O_DIRECT ceilings from ferry bench to host memory in the same run. Prints TABLE rows.
#   FERRY_CLI=build/ferry bash bench/gpu-threads-disk.sh
set -u
FERRY=${FERRY_CLI:-build/ferry}
DIR=${DISK_DIR:-$PWD/build-bench-disk}
F=$DIR/threads-ab.dat
mkdir -p "$DIR"
gb() { python3 -c 'import json,sys; d=json.load(sys.stdin)["jobs"][0]; r=d[sys.argv[1]]; print("%.2f GB/s | %.2f cores" % (r["bw_bytes"]/1e9, d["ferry"]["cpu_cores"]))' "$1"; }
"$FERRY" bench --filename "$F" --size 4g --bs 4m --rw write --direct 1 >/dev/null || exit 1
for round in $(seq 1 "${ROUNDS:-2}"); do
	echo "TABLE round $round disk raw read ceiling (ferry bench to host, O_DIRECT 4x QD16 4m) | $("$FERRY" bench --filename "$F" --rw read --bs 4m --iodepth 16 --numjobs 4 --direct 1 --cold=system --output-format=json | gb read)"
	echo "TABLE round $round disk raw write ceiling (ferry bench from host, O_DIRECT 4x QD16 4m) | $("$FERRY" bench --filename "$F" --rw write --bs 4m --iodepth 16 --numjobs 4 --direct 1 --size 4g --output-format=json | gb write)"
	for td in ${THREADS_LIST:-8 12}; do
		t=${td%%:*} d=16
		[ "$td" != "$t" ] && d=${td#*:}
		echo "TABLE round $round cold disk->GPU threads=$t queue_depth=$d | $(FERRY_THREADS=$t FERRY_QUEUE_DEPTH=$d "$FERRY" bench --filename "$F" --bs 1g --size 4g --api pread -x auto --cold=system --output-format=json | gb read)"
		echo "TABLE round $round GPU->disk threads=$t queue_depth=$d | $(FERRY_THREADS=$t FERRY_QUEUE_DEPTH=$d "$FERRY" bench --filename "$F" --rw write --bs 1g --size 4g --api pread -x auto --direct 1 --output-format=json | gb write)"
	done
done
rm -f "$F"
