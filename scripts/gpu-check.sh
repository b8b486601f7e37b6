#!/usr/bin/env bash
# The one run on the GPU machine: build with the GPU tests, run every unit test, the GPU tests and
# the GPU benchmarks (bench/gpu-*.sh), keep the logs (under $OUT when set), and print a table last.
# A failing step does not stop the others; the exit status is non-zero if anything failed.
#
#   bash scripts/gpu-check.sh            (from the repository root; BUILD_DIR, JOBS may be set)
#   SKIP="unit python" bash scripts/gpu-check.sh   (leaves out steps: unit, gpu, python; for a
#                                        device call spent on one benchmark; the table says so)
#
# A benchmark script bench/gpu-NAME.sh runs with FERRY_BUILD_DIR, FERRY_CLI and FERRY_LOG_DIR set;
# each line it prints as "TABLE name | result | figure" becomes a row of the table, and its exit
# status counts like a test's (77: skipped).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu-check}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
LOG_DIR=${OUT:+$OUT/gpu-check}
LOG_DIR=${LOG_DIR:-$BUILD_DIR/gpu-check-logs}
mkdir -p "$LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
TABLE="$LOG_DIR/table.txt"
: >"$TABLE"
failed=0

row() { printf '%s | %s | %s\n' "$1" "$2" "${3:-}" >>"$TABLE"; }
skipping() { case " ${SKIP:-} " in *" $1 "*) row "$1 (step)" skipped "SKIP=$SKIP"; return 0 ;; esac; return 1; }
step() { echo; echo "=== $*"; }

# The device run carries .deb/ (liburing, xxhash) when they were staged: unpack without installing.
source scripts/deb-env.sh

# cuFile says why it refuses a file only in its log.
export CUFILE_LOGGING_LEVEL=${CUFILE_LOGGING_LEVEL:-INFO}
export CUFILE_LOGFILE_PATH=${CUFILE_LOGFILE_PATH:-$LOG_DIR/cufile.log}

step "machine"
{
	uname -a
	nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
	nvidia-smi --query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current,persistence_mode --format=csv 2>&1 || true
	echo "/run/udev: $([ -e /run/udev ] && echo present || echo absent)"
	echo "nvidia-fs: $(cat /proc/driver/nvidia-fs/version 2>/dev/null || echo 'not loaded')"
	ls /usr/local/cuda/targets/x86_64-linux/lib/libcufile.so* 2>/dev/null
	cmake --version | head -1
} 2>&1 | tee "$LOG_DIR/machine.log"

step "configure"
if cmake -S . -B "$BUILD_DIR" -DFERRY_GPU_TESTS=ON >"$LOG_DIR/configure.log" 2>&1; then
	row configure ok
else
	row configure FAILED "see configure.log"
	failed=1
fi
tail -n 5 "$LOG_DIR/configure.log"

step "build"
# -k: a target that does not build fails its own tests, not everything else.
if cmake --build "$BUILD_DIR" -j "$JOBS" -- -k >"$LOG_DIR/build.log" 2>&1; then
	row build ok
else
	row build FAILED "$(grep -m1 -E 'error:|undefined reference' "$LOG_DIR/build.log" | cut -c1-120)"
	failed=1
fi
grep -E 'error:|warning:|undefined reference' "$LOG_DIR/build.log" | head -n 20

# ctest's result lines: "  3/12 Test  #3: unit/test_io ......   Passed    1.20 sec"
run_ctest() {
	local label=$1 log=$2
	shift 2
	ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 "$@" >"$log" 2>&1
	local rc=$?
	cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "${log%.log}.full.log" 2>/dev/null
	awk '/Test +#[0-9]+: /{
		name=$0; sub(/.*Test +#[0-9]+: /, "", name); sub(/ .*/, "", name);
		res=$0; sub(/.*\.\.\.+ */, "", res); sub(/\*+/, "", res); sub(/ +[0-9.]+ sec.*/, "", res);
		if (res ~ /^Passed/) r="ok"; else if (res ~ /Skipped/) r="skipped"; else r="FAILED (" res ")";
		sec=$0; sub(/ sec.*/, "", sec); sub(/.* /, "", sec);
		printf "%s | %s | %s s\n", name, r, sec }' "$log" >>"$TABLE"
	tail -n 15 "$log"
	if [ $rc -ne 0 ]; then
		echo "ctest $label: exit $rc"
		failed=1
	fi
}

step "unit tests"
skipping unit || run_ctest unit "$LOG_DIR/unit.log" -LE gpu -j "$JOBS"

# nvCOMP for GPU decompression (issue 26; tests/gpu/test_nvcomp_gpu, bench/gpu-compress.sh): the
# carried wheel's library (.whl/, unpacked, not installed), unless FERRY_NVCOMP_LIB names one.
nvc_whl=$(ls .whl/nvidia_libnvcomp_cu13-*.whl 2>/dev/null | head -n 1)
if [ -z "${FERRY_NVCOMP_LIB:-}" ] && [ -n "$nvc_whl" ] && "${PYTHON:-python3}" -m zipfile -e "$nvc_whl" "$ROOT/$BUILD_DIR/nvcomp-whl" >/dev/null 2>&1; then
	export FERRY_NVCOMP_LIB=$ROOT/$BUILD_DIR/nvcomp-whl/nvidia/libnvcomp/lib64/libnvcomp.so.6
	echo "nvCOMP: $FERRY_NVCOMP_LIB"
fi

step "GPU tests"
skipping gpu || run_ctest gpu "$LOG_DIR/gpu.log" -L gpu
# Figures the GPU tests print as "FIGURE name value unit".
grep -h '^FIGURE ' "$LOG_DIR/gpu.full.log" 2>/dev/null | while read -r _ name value unit; do
	row "figure/$name" "$value" "$unit"
done
grep -h -E '^(skipped|GDS |libcufile|NVML|CUDA driver|/run/udev|resolved with)' "$LOG_DIR/gpu.full.log" 2>/dev/null | cut -c1-300
# GPU process snapshots (driver checkpoint API + CRIU from .deb/criu): its TABLE lines become rows.
if ! skipping gpu; then
	timeout 900 bash tests/gpu/test_snapshot.sh "$ROOT/$BUILD_DIR/ferry" >"$LOG_DIR/snapshot.log" 2>&1
	rc=$?
	grep '^TABLE ' "$LOG_DIR/snapshot.log" | sed 's/^TABLE //' >>"$TABLE"
	case $rc in
	0) row gpu/test_snapshot.sh ok ;;
	77) row gpu/test_snapshot.sh skipped "$(grep -m1 '^skipped' "$LOG_DIR/snapshot.log")" ;;
	*) row gpu/test_snapshot.sh "FAILED (exit $rc)" "see snapshot.log"; failed=1 ;;
	esac
	grep -E '^(REFUSED|FAIL|skipped|restored|TABLE)' "$LOG_DIR/snapshot.log" | cut -c1-600
fi

step "Python package"
# The machine has no network: build the extension with the scikit-build-core, torch, CuPy and
# NumPy already installed there (no build isolation, no dependencies), then pytest the GPU cases.
PY=${PYTHON:-python3}
if skipping python; then
	:
elif ! "$PY" -c 'import scikit_build_core, pytest' >/dev/null 2>&1; then
	row python/install skipped "scikit-build-core or pytest is not installed for $PY"
elif ! { "$PY" -m pip install --no-build-isolation --no-deps . ||
	 "$PY" -m pip install --no-build-isolation --no-deps --break-system-packages .; } \
	>"$LOG_DIR/python-install.log" 2>&1; then
	row python/install FAILED "$(grep -m1 -iE 'error' "$LOG_DIR/python-install.log" | cut -c1-120)"
	failed=1
else
	row python/install ok
	# From another directory so that `import ferry` is the installed package.
	(cd /tmp && "$PY" -m pytest -v -s -rs -p no:cacheprovider "$ROOT"/tests/gpu/test_python_*.py) \
		>"$LOG_DIR/python-gpu.log" 2>&1
	rc=$?
	awk '/::test_.* (PASSED|FAILED|SKIPPED|ERROR)/ {
		name=$1; sub(/.*::/, "", name);
		r=$2; if (r == "PASSED") r="ok"; else if (r == "SKIPPED") r="skipped"; else r="FAILED";
		printf "python/%s | %s | \n", name, r }' "$LOG_DIR/python-gpu.log" >>"$TABLE"
	grep -E '^SKIPPED|^FAILED|^ERROR|GDS refused|passed|failed' "$LOG_DIR/python-gpu.log" | cut -c1-300
	if [ $rc -ne 0 ]; then
		echo "pytest tests/gpu/test_python_*.py: exit $rc"
		[ $rc -eq 5 ] && row python/tests FAILED "no test collected"
		failed=1
	fi
fi

step "GPU benchmarks"
shopt -s nullglob
# The peers' wheels carried in .whl/ (scripts/stage-device.sh): kvikio for gpu-read, fastsafetensors
# and runai-model-streamer for gpu-ckpt, into a folder of their own on PYTHONPATH (mosaicml-streaming,
# for gpu-loader, is installed by bench/loader-gpu.sh apart, with its own dependencies).
peers=(.whl/kvikio_cu13-*.whl .whl/libkvikio_cu13-*.whl .whl/rapids_logger-*.whl .whl/fastsafetensors-*.whl
	.whl/runai_model_streamer-*.whl .whl/instanttensor-*.whl)
if [ ${#peers[@]} -gt 0 ]; then
	if "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$ROOT/$BUILD_DIR/peers-py" --upgrade \
		"${peers[@]}" >"$LOG_DIR/peers-install.log" 2>&1; then
		export PYTHONPATH=$ROOT/$BUILD_DIR/peers-py${PYTHONPATH:+:$PYTHONPATH}
		echo "peers from .whl/: $(cd .whl && ls kvikio_cu13-* fastsafetensors-* runai_model_streamer-* 2>/dev/null | cut -d- -f1,2 | tr '\n' ' ')"
	else
		row "peers (.whl)" FAILED "see peers-install.log"
	fi
fi
# GPU_BENCHES: which bench/NAME.sh to run (names or globs, space-separated; "none" for none), so
# that a long benchmark can have a device call of its own. One per capability of docs/PERFORMANCE.md:
# gpu-vsfio (the engine vs fio), gpu-read (GPU data paths), gpu-py-overhead (Python call overhead),
# gpu-ckpt (checkpoints and weights; gpu-ckpt-save and gpu-ckpt-async measure one target each in a
# shorter call), gpu-loader (the loader) and gpu-compress (GPU decompression through nvCOMP, issue 26);
# gpu-cz-read (compressed files read into GPU memory, warm nvCOMP vs CPU and cold vs disk x ratio, issue 26);
# issue 27's gpu-snapshot (GPU process snapshots at 1/10/40 GiB beside ferry.checkpoint) and
# gpu-shuffled-copies (pre-shuffled copies read cold from the device's disk). The default: gpu-read, gpu-ckpt and gpu-loader.
# gpu-dcp-torch: issue 24's DCP and torch.save/load targets at 8 GB with their ceilings (about 3 minutes).
# multi-gpu: several GPUs of one host (issue 28); on one GPU it runs its 1-GPU rows and exits 77.
# remote-read: object storage (issue 23), nginx serving /dev/shm on 127.0.0.1 (.deb/nginx), ferry into
# GPU and host memory vs kvikio, boto3, runai-model-streamer and tensorizer, curl as the ceiling, then
# the loader over a cached s3:// dataset (REMOTE_SIZE=2g: about 5 minutes).
# Issue 22's: gpu-st-fresh (one safetensors load per fresh process beside the peers; the
# FERRY_ST_FRESH_* settings shorten it to about 2 minutes), gpu-small-reads (small reads into GPU
# memory vs kvikio and pinned memory, about 1 minute), gpu-loader-fixed (the loader vs DataLoader at
# the issue's workload). Issue 26's gpu-ckpt-cz: ferry ckpt bench --compress, cold and warm.
benches=()
for pat in ${GPU_BENCHES:-gpu-read gpu-ckpt gpu-loader}; do
	benches+=(bench/$pat.sh)
done
[ ${#benches[@]} -eq 0 ] && echo "(no bench/gpu-*.sh yet)"
for b in "${benches[@]}"; do
	[ -f "$b" ] || continue # "none", or a name with no script
	name=$(basename "$b" .sh)
	FERRY_BUILD_DIR=$ROOT/$BUILD_DIR FERRY_CLI=$ROOT/$BUILD_DIR/ferry FERRY_LOG_DIR=$LOG_DIR \
		timeout 900 bash "$b" >"$LOG_DIR/$name.log" 2>&1
	rc=$?
	lines=$(grep '^TABLE ' "$LOG_DIR/$name.log" | sed 's/^TABLE //')
	if [ -n "$lines" ]; then
		printf '%s\n' "$lines" >>"$TABLE"
	fi
	case $rc in
	0) [ -z "$lines" ] && row "$name" ok ;;
	77) row "$name" skipped "$(grep -m1 '^skipped' "$LOG_DIR/$name.log")" ;;
	*) row "$name" "FAILED (exit $rc)" "see $name.log"; failed=1 ;;
	esac
	tail -n 5 "$LOG_DIR/$name.log"
done

skipping suite || { "$BUILD_DIR/ferry" bench --suite --report "$LOG_DIR/suite.html" >"$LOG_DIR/suite.log" 2>&1 && row "bench --suite" ok "$(grep -c '^GPU: ' "$LOG_DIR/suite.log") GPU sections measured, $(grep -c 'skipped' "$LOG_DIR/suite.log") skipped lines; suite.log, suite.html" || { row "bench --suite" FAILED "see suite.log"; failed=1; }; }
[ -f "$CUFILE_LOGFILE_PATH" ] && echo "cuFile log: $CUFILE_LOGFILE_PATH ($(wc -l <"$CUFILE_LOGFILE_PATH") lines)"

step "summary (logs in $LOG_DIR)"
column -t -s '|' -o '|' "$TABLE" 2>/dev/null || cat "$TABLE"
if [ $failed -ne 0 ]; then
	echo "gpu-check: FAILED"
	exit 1
fi
echo "gpu-check: all passed"
