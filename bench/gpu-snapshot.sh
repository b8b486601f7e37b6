#!/usr/bin/env bash
# Issue 27's snapshot figures for scripts/gpu-check.sh (GPU_BENCHES=gpu-snapshot): suspend and
# resume of a torch process holding 1, 10 and 40 GiB of GPU memory through `ferry snapshot
# --gpu-only`, its tensors checked bit-identical after, CRIU tried at 1 GiB (a refusal is a row
# with the error), beside ferry.checkpoint save/load of the same bytes to /dev/shm
# (bench/gpu-snapshot.py). About 2 minutes on an H100 after the build; sizes: SNAP_GIB=1,10,40.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
PY=${PYTHON:-python3}
FERRY=${FERRY_CLI:-$ROOT/build/ferry}
[ -x "$FERRY" ] || { echo "FAIL: $FERRY is not built"; exit 1; }
if ! (cd /tmp && "$PY" -c 'import ferry.checkpoint' 2>/dev/null); then
	"$PY" -m pip install -q --no-build-isolation --no-deps . ||
		"$PY" -m pip install -q --no-build-isolation --no-deps --break-system-packages . || exit 1
fi
T=$(mktemp -d /tmp/gpu-snapshot.XXXXXX)
trap 'rm -rf "$T"' EXIT
source scripts/criu-env.sh "$T"
"$PY" bench/gpu-snapshot.py --ferry "$FERRY" --sizes "${SNAP_GIB:-1,10,40}" --shm /dev/shm --work "$T" \
	--criu-max-gib "${SNAP_CRIU_MAX_GIB:-1}" ${FERRY_LOG_DIR:+--json "$FERRY_LOG_DIR/gpu-snapshot.json"}
