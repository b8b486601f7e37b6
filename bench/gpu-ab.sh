#!/usr/bin/env bash
# A build of another commit beside this tree's, on the GPU machine, in one device call: for a change
# that must keep every figure (a restructuring), each benchmark is run on both builds, alternating,
# and printed as "TABLE ab <build> ..." rows to compare within the call.
#
#   here:  scripts/stage-device.sh base=46d4396      (the other commit's tree in .gpu/base)
#   there: PARTS="read ckpt loader" ROUNDS=2 bash bench/gpu-ab.sh     (carry .deb, .whl and .gpu)
#
# read:   bench/gpu-read.sh's warm part (PARTS=warm), ROUNDS times each build;
# ckpt:   bench/ckpt-gpu.py on CKPT_SIZE (4g) of state, once each build;
# loader: bench/loader-gpu.py --ferry-warm-only in a fresh process, ROUNDS + 1 times each build.
# Each build's Python package goes to a folder of its own (/tmp/ab-<build>-py), put first on PYTHONPATH.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
[ -d .gpu/base ] || { echo "skipped: no .gpu/base (scripts/stage-device.sh base=REV)"; exit 77; }
source scripts/deb-env.sh
PARTS=${PARTS:-read ckpt loader}
ROUNDS=${ROUNDS:-2}
LOG=${FERRY_LOG_DIR:-${OUT:-/tmp}/ab}
mkdir -p "$LOG"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
for v in head base; do
	src=$ROOT
	[ $v = base ] && src=$ROOT/.gpu/base
	{ cmake -S "$src" -B /tmp/ab-$v-build -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
		cmake --build /tmp/ab-$v-build -j"$(nproc)" --target ferry_cli &&
		python3 -m pip install -q --no-build-isolation --no-deps --upgrade --target /tmp/ab-$v-py "$src"; } \
		>"$LOG/build-$v.log" 2>&1 || { echo "TABLE ab $v build | FAILED | see build-$v.log"; exit 1; }
done
# the peers' wheels, as scripts/gpu-check.sh installs them
peers=(.whl/kvikio_cu13-*.whl .whl/libkvikio_cu13-*.whl .whl/rapids_logger-*.whl .whl/fastsafetensors-*.whl
	.whl/runai_model_streamer-*.whl)
PEERS=/tmp/ab-peers-py
[ -e "${peers[0]}" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target $PEERS --upgrade \
	"${peers[@]}" >"$LOG/peers.log" 2>&1
with() { # build command...: runs command with the build's CLI and package
	local v=$1
	shift
	FERRY_CLI=/tmp/ab-$v-build/ferry PYTHONPATH=/tmp/ab-$v-py:$PEERS "$@"
}
if has read; then
	for r in $(seq "$ROUNDS"); do
		for v in head base; do
			with $v env PARTS=warm FERRY_LOG_DIR=$LOG/read-$v-$r timeout 200 bash bench/gpu-read.sh 2>&1 |
				grep -E '^TABLE (warm /dev/shm->GPU (median|ferry defaults)|target)' | sed "s/^TABLE /TABLE ab $v read $r: /"
		done
	done
fi
if has ckpt; then
	for v in base head; do
		with $v timeout 300 python3 bench/ckpt-gpu.py --ferry /tmp/ab-$v-build/ferry --disk "$ROOT/build-bench-disk" \
			--size "${CKPT_SIZE:-4g}" 2>&1 | grep -E '^TABLE (target|ferry)' | sed "s/^TABLE /TABLE ab $v ckpt: /"
	done
fi
if has loader; then
	for r in $(seq $((ROUNDS + 1))); do
		for v in head base; do
			(cd /tmp && with $v timeout 90 python3 "$ROOT/bench/loader-gpu.py" --gb 2 --seconds 5 --keep \
				--ferry-warm-only 2>&1) | grep '^TABLE loader warm ferry' | sed "s/^TABLE /TABLE ab $v $r: /"
		done
	done
fi
