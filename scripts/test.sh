#!/usr/bin/env bash
# The README's second command, and what CI runs (.ci/run): set up, build, run every test; then the
# same C tests under AddressSanitizer+UndefinedBehaviorSanitizer and ThreadSanitizer.
#   QUICK=1 scripts/test.sh     skip the sanitizer builds
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
status=0
run() { # name, command...
	local name=$1; shift
	echo "=== $name"
	if "$@"; then echo "=== $name: ok"; else echo "=== $name: FAILED"; status=1; fi
}
J=$(nproc)
run "tests" ctest --test-dir build --output-on-failure -j"$J"
if [ "${QUICK:-0}" != 1 ]; then
	run "build asan+ubsan" cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address,undefined
	run "compile asan+ubsan" cmake --build build-asan -j"$J"
	run "tests asan+ubsan" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --test-dir build-asan --output-on-failure -j"$J" -L '' -E 'cli/test_suite'
	run "build tsan" cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=thread
	run "compile tsan" cmake --build build-tsan -j"$J"
	run "tests tsan" env TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -j"$J" -R 'unit/'
fi
# --- ckpt (issue 5): bounded libFuzzer run of the safetensors header parser over its seed corpus ---
if command -v clang >/dev/null; then
	run "build fuzz" env CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_FUZZ=ON \
		-DFERRY_SANITIZE=address,undefined
	run "compile fuzz" cmake --build build-fuzz -j"$J" --target fuzz_safetensors
	run "fuzz safetensors 60s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_safetensors -max_total_time=60 \
		-max_len=4096 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/safetensors 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
else
	echo "=== fuzz safetensors: skipped: clang not installed"
fi
# --- end ckpt ---
exit $status
