#!/usr/bin/env bash
# The disk side of the engine's defaults (docs/CONFIG.md): cold disk -> GPU memory (and, with
# WRITES=1, GPU memory -> disk) with each of CONFIGS, alternating, ROUNDS rounds, each round beside
# the disk's raw O_DIRECT ceilings from ferry bench to host memory (4 jobs x QD16 x 4 MiB, each its
# quarter of the file once; writes, here and below, end with an fsync), and the
# ratio of each setting to its own round's ceiling (the disk moves by 10-25% between minutes).
# A config is "default" or space-separated knob=value pairs (FERRY_* variables), and may hold
# bs=SIZE for the size of each ferry_pread call (default 1g).
#   FERRY_CLI=build/ferry CONFIGS="default|threads=8|chunk_size=4m|bs=4g" bash bench/gpu-threads-disk.sh
set -u
FERRY=${FERRY_CLI:-build/ferry}
DIR=${DISK_DIR:-$PWD/build-bench-disk}
F=$DIR/threads-ab.dat
mkdir -p "$DIR"
CONFIGS=${CONFIGS:-"default|threads=8"}
gb() { python3 -c 'import json,sys; d=json.load(sys.stdin)["jobs"][0]; r=d[sys.argv[1]]; print("%.3f %.2f" % (r["bw_bytes"]/1e9, d["ferry"]["cpu_cores"]))' "$1"; }
"$FERRY" bench --filename "$F" --size 4g --bs 4m --rw write --direct 1 >/dev/null || exit 1
IFS='|' read -r -a cfgs <<<"$CONFIGS"
res=$(mktemp)
for round in $(seq 1 "${ROUNDS:-2}"); do
	read -r rc _ < <("$FERRY" bench --filename "$F" --rw read --bs 4m --iodepth 16 --numjobs 4 --size 1g --offset_increment 1g --direct 1 --cold=system --output-format=json | gb read)
	echo "TABLE round $round disk raw read ceiling (ferry bench to host, O_DIRECT 4x QD16 4m) | $rc GB/s |"
	echo "ceiling $round read $rc" >>"$res"
	if [ "${WRITES:-0}" = 1 ]; then
		read -r wc _ < <("$FERRY" bench --filename "$F" --rw write --bs 4m --iodepth 16 --numjobs 4 --size 1g --offset_increment 1g --end_fsync 1 --direct 1 --output-format=json | gb write)
		echo "TABLE round $round disk raw write ceiling (ferry bench from host, O_DIRECT 4x QD16 4m) | $wc GB/s |"
		echo "ceiling $round write $wc" >>"$res"
	fi
	n=${#cfgs[@]}
	for ((i = 0; i < n; i++)); do
		cfg=${cfgs[$(((i + round - 1) % n))]}
		envs=() bs=1g
		for kv in $cfg; do
			case $kv in
			default) ;;
			bs=*) bs=${kv#bs=} ;;
			*) envs+=("FERRY_$(echo "${kv%%=*}" | tr a-z A-Z)=${kv#*=}") ;;
			esac
		done
		read -r g c < <(env "${envs[@]}" "$FERRY" bench --filename "$F" --bs "$bs" --size 4g --api pread -x auto --cold=system --output-format=json | gb read)
		echo "TABLE round $round cold disk->GPU $cfg | $g GB/s | $(python3 -c "print('%.2f' % ($g / $rc))")x the round's read ceiling, $c cores"
		echo "read $round $cfg|$g" >>"$res"
		if [ "${WRITES:-0}" = 1 ]; then
			read -r g c < <(env "${envs[@]}" "$FERRY" bench --filename "$F" --rw write --bs "$bs" --size 4g --api pread -x auto --direct 1 --end_fsync 1 --output-format=json | gb write)
			echo "TABLE round $round GPU->disk $cfg | $g GB/s | $(python3 -c "print('%.2f' % ($g / $wc))")x the round's write ceiling, $c cores"
			echo "write $round $cfg|$g" >>"$res"
		fi
	done
done
python3 - "$res" <<'PY'
import statistics, sys
ceil, got = {}, {}
for line in open(sys.argv[1]):
    w = line.split(maxsplit=2)
    if w[0] == "ceiling":
        ceil[(w[2].split()[0], w[1])] = float(w[2].split()[1])
    else:
        cfg, g = w[2].rsplit("|", 1)
        got.setdefault((w[0], cfg.strip()), []).append(float(g) / ceil[(w[0], w[1])])
for (d, cfg), r in got.items():
    print(f"TABLE median cold disk {d} {cfg} | {statistics.median(r):.2f}x its round's ceiling | rounds {', '.join('%.2f' % x for x in r)}")
PY
rm -f "$F" "$res"
