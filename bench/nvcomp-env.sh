# Sourced (bash) by bench/gpu-compress.sh and bench/gpu-cz-read.sh, from the repository root:
# `source bench/nvcomp-env.sh [TEST]` sets B (the build: FERRY_BUILD_DIR, else build; made absolute)
# and, given TEST, prog ($B/tests/gpu/TEST), exiting 77 where that is not built, and points FERRY_NVCOMP_LIB at the
# carried wheel's nvCOMP (.whl/, unpacked into $B, not installed) unless it names one already.
B=${FERRY_BUILD_DIR:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
if [ -n "${1:-}" ]; then # a script that runs the CLI alone (gpu-ckpt-cz.sh) names no test program
	prog=$B/tests/gpu/$1
	if [ ! -x "$prog" ]; then
		echo "skipped: $prog not built (configure with -DFERRY_GPU_TESTS=ON)"
		exit 77
	fi
fi
if [ -z "${FERRY_NVCOMP_LIB:-}" ]; then
	whl=$(ls .whl/nvidia_libnvcomp_cu13-*.whl 2>/dev/null | head -n 1)
	if [ -n "$whl" ] && python3 -m zipfile -e "$whl" "$B/nvcomp-whl" >/dev/null 2>&1; then
		export FERRY_NVCOMP_LIB=$B/nvcomp-whl/nvidia/libnvcomp/lib64/libnvcomp.so.6
	fi
fi
echo "FERRY_NVCOMP_LIB=${FERRY_NVCOMP_LIB:-unset, libnvcomp.so.6 from the library path}"
