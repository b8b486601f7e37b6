#!/usr/bin/env bash
# Issue 27's pre-shuffled copies on the GPU machine's disk (GPU_BENCHES=gpu-shuffled-copies): one
# dataset (1 GiB of 4 KiB samples, two copies: 3 GiB) written under the repository on the device's
# disk (not tmpfs), then one cold epoch (sync and drop_caches before each, as root) in sequential,
# copy, block and shuffle order, at most SECONDS_PER_ORDER each (bench/shuffled-copies.py): rows with
# samples/s, ratio to sequential, the target copy >= 0.9x sequential, and the space the copies cost.
# About 1.5 minutes after the build. COPIES_DIR, COPIES_SIZE, SECONDS_PER_ORDER may be set.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
D=${COPIES_DIR:-$PWD/build-bench-disk/copies}
mkdir -p "$D" || exit 1
fs=$(stat -f -c %T "$D")
case $fs in tmpfs | ramfs) echo "skipped: $D is on $fs, not a disk (set COPIES_DIR)"; exit 77 ;; esac
[ -w /proc/sys/vm/drop_caches ] || echo "warning: /proc/sys/vm/drop_caches is not writable (not root): the rows will say WARM"
if ! (cd /tmp && "$PY" -c 'import ferry; ferry.Loader' 2>/dev/null); then
	"$PY" -m pip install -q --no-build-isolation --no-deps . ||
		"$PY" -m pip install -q --no-build-isolation --no-deps --break-system-packages . || exit 1
fi
echo "disk: $D on $fs, $(df -h --output=source,size,avail "$D" | tail -1)"
cd /tmp && "$PY" "$OLDPWD/bench/shuffled-copies.py" --dir "$D" --size "${COPIES_SIZE:-1g}" --sample 4k \
	--copies 2 --batch 256 --threads 2 --seconds "${SECONDS_PER_ORDER:-15}" \
	--orders sequential,copies,block,shuffle ${FERRY_LOG_DIR:+--json "$FERRY_LOG_DIR/gpu-shuffled-copies.json"}
rc=$?
rm -rf "$D"
exit $rc
