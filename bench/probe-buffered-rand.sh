#!/usr/bin/env bash
# Diagnosis of vs-fio's one large miss (buffered random 4 KiB QD64 reads on the GPU machine's disk,
# ferry 0.51x fio in every run): the same row with one difference at a time, each after dropping
# the page cache, alternating tools. Prints "PROBE name GB/s".
#   FIO=.deb/fio FERRY=build/ferry bash bench/probe-buffered-rand.sh DIR
set -u
D=${1:?usage: probe-buffered-rand.sh DIR}
FERRY=${FERRY:-build/ferry}
FIO=${FIO:-fio}
F=$D/probe-rand.dat
RT=${RUNTIME:-3}
"$FERRY" bench --filename "$F" --size 1g --bs 4m --rw write --direct 1 >/dev/null || exit 1
gb() { python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):])["jobs"][0]["read"]; print("%.3f GB/s %.0f IOPS" % (d["bw_bytes"]/1e9, d["iops"]))' 2>/dev/null || echo "failed"; }
c="--filename=$F --size=1g --rw=randread --bs=4k --iodepth=64 --direct=0 --runtime=$RT --output-format=json"
for round in 1 2; do
	for v in "fio" "fio --fixedbufs=1 --registerfiles=1" "fio --fadvise_hint=1" "fio --invalidate=0" \
		"ferry" "ferry FERRY_REGISTER=0" "ferry FERRY_URING_NO_COOP=1" "ferry --iodepth=8 --numjobs=8" "ferry nocold"; do
		sync; echo 3 >/proc/sys/vm/drop_caches
		case $v in
		fio*) r=$("$FIO" --name=p --ioengine=io_uring --time_based --fadvise_hint=0 $c ${v#fio} 2>&1 | gb) ;;
		"ferry FERRY_"*) kv=${v#ferry }; r=$(env "$kv" "$FERRY" bench --name=p --ioengine=io_uring --cold $c 2>&1 | gb) ;;
		"ferry nocold") r=$("$FERRY" bench --name=p --ioengine=io_uring $c 2>&1 | gb) ;;
		ferry*) r=$("$FERRY" bench --name=p --ioengine=io_uring --cold $c ${v#ferry} 2>&1 | gb) ;;
		esac
		echo "PROBE round $round | $v | $r"
	done
done
rm -f "$F"
