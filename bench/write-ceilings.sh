#!/usr/bin/env bash
# What "the disk's raw write ceiling" is for a durable save (docs/CHECKPOINTS.md): fio alone, O_DIRECT,
# 4 jobs x QD16 x 4 MiB, SIZE bytes, in ROUNDS rounds (sync and caches dropped before each run):
#   same-offsets  4 jobs each writing the whole existing file from offset 0 for RUNTIME seconds, no
#                 fsync: the shape of the ceiling bench/ckpt-gpu.py and ckpt-save.py use (ferry bench
#                 --numjobs 4 gives every job the whole region, as fio without offset_increment)
#   overwrite     each job its quarter of the existing file, once, then fsync
#   new-native    each job its quarter of a new file, fallocate=native (unwritten extents), fsync
#   new-none      the same, fallocate=none (blocks allocated by the writes)
# GB/s over each fio process's wall time (fio's own bw for same-offsets). Prints TABLE rows.
#   FIO=.deb/fio DIR=/var/tmp SIZE=8g bash bench/write-ceilings.sh
set -u
. "$(dirname "$0")/fio-probe-common.sh" # FIO, DIR, SIZE, ROUNDS, bytes, q, fio_wall
RUNTIME=${RUNTIME:-8}
F=$DIR/wc-existing.dat
N=$DIR/wc-new.dat
c="--bs=4m --iodepth=16 --numjobs=4 --direct=1 --ioengine=io_uring --group_reporting --output-format=json"
"$FIO" --name=lay --filename="$F" --rw=write --bs=4m --iodepth=16 --direct=1 --ioengine=io_uring --size="$bytes" >/dev/null || exit 1
quiet() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
wall() { quiet; fio_wall "$@"; } # name, fio args...: GB/s over the wall time, caches dropped first
for r in $(seq 1 "$ROUNDS"); do
	quiet
	g=$("$FIO" --name=same --filename="$F" --rw=write $c --size="$bytes" --runtime="$RUNTIME" --time_based |
		python3 -c 'import json,sys; t=sys.stdin.read(); print("%.2f" % (json.loads(t[t.index("{"):])["jobs"][0]["write"]["bw_bytes"] / 1e9))')
	echo "TABLE write ceiling round $r same-offsets (4 jobs over the whole existing file, ${RUNTIME} s, no fsync) | $g GB/s |"
	echo "TABLE write ceiling round $r overwrite (quarters of the existing file, once, fsync) | $(wall ow --filename="$F" --rw=write $c --size=$q --offset_increment=$q --end_fsync=1) GB/s | wall time"
	for fa in native none; do
		echo "TABLE write ceiling round $r new-$fa (quarters of a new file, fallocate=$fa, fsync) | $(wall new --filename="$N" --rw=write $c --size=$q --offset_increment=$q --fallocate=$fa --end_fsync=1) GB/s | wall time"
		rm -f "$N"
	done
done
rm -f "$F" "$N"
