#!/usr/bin/env bash
# Does a new file written right after a large delete cost more than one written over blocks the
# file system has kept? (docs/CHECKPOINTS.md, sixth session: ferry.safetensors.save_file ran at
# 0.55x and 0.82x of the disk's write ceiling in bench/ckpt-gpu.py, each save right after 8 GiB
# were deleted, on an ext4 mounted with `discard` over a virtio disk.) fio alone, O_DIRECT,
# 4 jobs x QD16 x 4 MiB, each job its quarter, fsync at the end, GB/s over each fio's wall time:
#   overwrite       an existing file, written over
#   new-after-rm    a new file (fallocate=none), right after the previous one was deleted and synced
#   new-after-wait  the same, WAIT (20) s after the delete and sync (discards of the freed blocks done)
# With REMOUNT=1 (root), the two new-file rows again with the file system remounted `nodiscard`
# (then `discard` again, if it had it): with no discard on delete, the host keeps the blocks.
# Prints the mount options and the disk's discard limits first. About 1.5 minutes at 3 GB/s.
#   FIO=.deb/fio DIR=build-bench-disk SIZE=8g ROUNDS=2 REMOUNT=1 bash bench/probe-discard.sh
set -u
. "$(dirname "$0")/fio-probe-common.sh" # FIO, DIR, SIZE, ROUNDS, bytes, q, fio_wall
F=$DIR/pd-existing.dat
N=$DIR/pd-new.dat
c="--bs=4m --iodepth=16 --numjobs=4 --direct=1 --ioengine=io_uring --group_reporting --size=$q --offset_increment=$q --end_fsync=1"
mnt=$(findmnt -no TARGET -T "$DIR")
opts=$(findmnt -no OPTIONS -T "$DIR")
src=$(findmnt -no SOURCE -T "$DIR")
dev=$(basename "$(readlink -f "$src")")
sys=/sys/class/block/$dev
[ -e "$sys/partition" ] && sys=$(readlink -f "$sys/..")
echo "TABLE discard probe: file system | $(findmnt -no FSTYPE -T "$DIR") on $src at $mnt | options $opts"
echo "TABLE discard probe: disk | $(basename "$sys") | discard_max_bytes $(cat "$sys/queue/discard_max_bytes" 2>/dev/null || echo ?), discard_granularity $(cat "$sys/queue/discard_granularity" 2>/dev/null || echo ?)"
"$FIO" --name=lay --filename="$F" --rw=write --bs=4m --iodepth=16 --direct=1 --ioengine=io_uring --size="$bytes" >/dev/null || exit 1
"$FIO" --name=lay --filename="$N" --rw=write --bs=4m --iodepth=16 --direct=1 --ioengine=io_uring --size="$bytes" >/dev/null || exit 1
wall() { fio_wall pd "$@"; } # fio args...: GB/s over the wall time
new_file() { # label, seconds to wait after the delete
	rm -f "$N"
	sync
	sleep "$2"
	echo "TABLE discard probe round $r: $1 | $(wall --filename="$N" --rw=write $c --fallocate=none) GB/s | wall time, fsync included"
}
rows() {
	sync
	echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
	echo "TABLE discard probe round $r: overwrite$1 | $(wall --filename="$F" --rw=write $c) GB/s | wall time, fsync included"
	new_file "new-after-rm$1" 0
	new_file "new-after-wait$1" "${WAIT:-20}"
}
for r in $(seq 1 "$ROUNDS"); do
	rows ""
done
if [ "${REMOUNT:-0}" = 1 ]; then
	case ",$opts," in
	*,discard,*)
		if mount -o remount,nodiscard "$mnt"; then
			echo "TABLE discard probe: remounted | $mnt nodiscard | $(findmnt -no OPTIONS -T "$DIR")"
			for r in $(seq 1 "$ROUNDS"); do
				rows " (nodiscard)"
			done
			mount -o remount,discard "$mnt" && echo "TABLE discard probe: remounted | $mnt discard again | $(findmnt -no OPTIONS -T "$DIR")"
		else
			echo "TABLE discard probe: remount | failed | not root?"
		fi ;;
	*) echo "TABLE discard probe: remount | not needed | $mnt is not mounted with discard" ;;
	esac
fi
rm -f "$F" "$N"
