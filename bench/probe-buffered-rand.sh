#!/usr/bin/env bash
# Diagnosis of vs-fio's one large miss (buffered random 4 KiB QD64 reads on the GPU machine's disk,
# ferry 0.51x fio): the same row with one difference at a time, each after dropping the page cache,
# alternating tools. The order of random offsets decides how much read-ahead serves from memory
# (docs/measurements/2026-11-22-buffered-rand-notes.md), so each line also gives the bytes read from
# storage per byte delivered (/proc/vmstat pgpgin, the whole machine) and the pages of the file
# cached after the run. Prints "PROBE round | variant | GB/s IOPS | storage/app | cached".
#   FIO=.deb/fio FERRY=build/ferry bash bench/probe-buffered-rand.sh DIR
#   ROUNDS=2 RUNTIME=2 VARIANTS='fio|ferry|...' (a variant: fio or ferry, then its extra options;
#   a leading VAR=value word before the options is set in ferry's environment)
set -u
D=${1:?usage: probe-buffered-rand.sh DIR}
FERRY=${FERRY:-build/ferry}
FIO=${FIO:-fio}
F=$D/probe-rand.dat
RT=${RUNTIME:-2}
ROUNDS=${ROUNDS:-2}
# fio's default offsets (tausworthe with its random map), then its lfsr (each block once per pass,
# no map); ferry's default is fio's default since 2026-11-22, and its lfsr is its offsets before.
VARIANTS=${VARIANTS:-"fio|fio --random_generator=lfsr|ferry|ferry --random_generator=lfsr|fio --norandommap|ferry --norandommap"}
"$FERRY" bench --filename "$F" --size 1g --bs 4m --rw write --direct 1 >/dev/null || exit 1
vm() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }
cached() {
	python3 - "$1" <<'PY' 2>/dev/null || echo "?"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
rng = (ctypes.c_uint64 * 2)(0, 0); st = (ctypes.c_uint64 * 5)()
fd = os.open(sys.argv[1], os.O_RDONLY)
if libc.syscall(451, fd, rng, st, 0):  # cachestat(2), Linux 6.5
    raise OSError(ctypes.get_errno(), "cachestat")
print("%.0f MB" % (st[0] * os.sysconf("SC_PAGE_SIZE") / 1e6))
PY
}
report() { python3 -c '
import json, sys
t = sys.stdin.read()
try:
    d = json.loads(t[t.index("{"):])["jobs"][0]["read"]
except ValueError:
    print("failed: " + " ".join(t.split())[-200:]); sys.exit()
kib = int(sys.argv[1])
print("%.3f GB/s %.0f IOPS | storage/app %.2f" % (d["bw_bytes"] / 1e9, d["iops"], kib * 1024 / max(d["io_bytes"], 1)))' "$1"; }
c="--filename=$F --size=1g --rw=randread --bs=4k --iodepth=64 --direct=0 --ioengine=io_uring --runtime=$RT --time_based --output-format=json"
IFS='|' read -r -a vs <<<"$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
	order=("${vs[@]}")
	if [ $((round % 2)) = 0 ]; then # alternate the order between rounds
		order=()
		for ((k = ${#vs[@]} - 1; k >= 0; k--)); do order+=("${vs[k]}"); done
	fi
	for v in "${order[@]}"; do
		sync; echo 3 >/proc/sys/vm/drop_caches
		p0=$(vm pgpgin); d0=$(vm drop_pagecache)
		set -- $v
		tool=$1; shift
		envkv=()
		if [ $# -gt 0 ] && [[ $1 == *=* && $1 != --* ]]; then envkv=("$1"); shift; fi
		case $tool in
		fio) out=$("$FIO" --name=p --fadvise_hint=0 $c "$@" 2>&1) ;;
		ferry) out=$(env "${envkv[@]}" "$FERRY" bench --name=p --cold $c "$@" 2>&1) ;;
		esac
		p1=$(vm pgpgin); d1=$(vm drop_pagecache)
		note=""
		[ "$d1" != "$d0" ] && note=" (someone else dropped the caches during the run)"
		echo "PROBE round $round | $v | $(echo "$out" | report $((p1 - p0))) | cached $(cached "$F")$note"
	done
done
rm -f "$F"
