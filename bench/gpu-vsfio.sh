#!/usr/bin/env bash
# Issue 2's figures on the GPU machine, for scripts/gpu-check.sh (GPU_BENCHES=gpu-vsfio): fio and
# ferry bench side by side (bench/vs-fio.sh), every row on the machine's disk (DISK_ROWS: a
# subset, or none) and on /dev/shm (SHM_ROWS: a subset, or none). FERRY_VARIANTS and FIO_VARIANTS
# (bench/vs-fio.sh) add settings of each tool; WHERE=1 notes where each run's job ran (vs-fio.sh
# --where).
# fio comes from .deb/fio (scripts/stage-device.sh builds it; the GPU machine has none) or $FIO.
# Prints TABLE rows; about 8 minutes with the defaults (ROUNDS=3 on the disk, SHM_ROUNDS=4,
# RUNTIME=2 seconds a run): give it a device call of its own.
#   FERRY_CLI=build/ferry bash bench/gpu-vsfio.sh
set -u
FERRY=${FERRY_CLI:-build/ferry}
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-vsfio}
FIO=${FIO:-$(command -v fio || true)}
[ -z "$FIO" ] && [ -x .deb/fio ] && FIO=$PWD/.deb/fio
[ -n "$FIO" ] || { echo "skipped: no fio (scripts/stage-device.sh fio, then carry .deb)"; exit 77; }
DISK=${DISK_DIR:-$PWD/build-bench-disk}/vsfio
mkdir -p "$DISK" "$LOG"
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-2}
SHM_ROWS=${SHM_ROWS-}
WHERE_ARG=
[ "${WHERE:-0}" != 0 ] && WHERE_ARG=--where
status=0

summary() { # json, where
	python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["summary"]:
    row = r["row"] if r.get("variant", "ferry") == "ferry" else f"{r['row']} [{r['variant']}]"
    if "error" in r:
        print(f"TABLE vs-fio {sys.argv[2]} {row} | n/a | {r['error'][:160]}")
        continue
    print(f"TABLE vs-fio {sys.argv[2]} {row} | {r['ratio']:.2f}x | fio {r['fio_gbps']:.3f} / ferry "
          f"{r['ferry_gbps']:.3f} GB/s; cpu-s/GB fio {r['fio_cpu_s_per_gb']:.2f} / ferry {r['ferry_cpu_s_per_gb']:.2f}; "
          f"rounds' median {r['ratio_median_of_rounds']:.2f}x" + (f" (range {min(r['round_ratios']):.2f}-{max(r['round_ratios']):.2f}, "
          f"ahead in {r['rounds_ahead']}/{len(r['round_ratios'])}, >=0.95 in {r['rounds_at_0_95']}/{len(r['round_ratios'])})"
          if "round_ratios" in r else "") + f"; {'met' if r['met_0_95'] else 'NOT met'}")
PY
}
vsfio() { # name (disk, shm), dir, rounds, rows, label: one vs-fio.sh run and its TABLE rows
	FIO=$FIO FERRY=$FERRY bash bench/vs-fio.sh --dir "$2" --size 1g --runtime "$RUNTIME" --rounds "$3" \
		${4:+--rows "$4"} $WHERE_ARG --json "$LOG/vsfio-$1.json" >"$LOG/vsfio-$1.log" 2>&1 || status=1
	summary "$LOG/vsfio-$1.json" "$5"
}
# DISK_ROWS: the disk rows (default: every row; none: no disk rows)
[ "${DISK_ROWS-}" != none ] && vsfio disk "$DISK" "$ROUNDS" "${DISK_ROWS-}" disk
# 4 rounds: single rounds of a /dev/shm QD64 row ran 0.63-1.43x fio's (2026-11-23)
[ "$SHM_ROWS" != none ] && vsfio shm /dev/shm "${SHM_ROUNDS:-4}" "$SHM_ROWS" /dev/shm
rm -rf "$DISK"
exit $status
