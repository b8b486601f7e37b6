#!/usr/bin/env bash
# Loader benchmark for the GPU machine (bench/loader-gpu.py has the details): ferry.Loader, the
# Python package, vs PyTorch DataLoader (8 workers, pin_memory, prefetch_factor 4) on a uint16 token
# dataset of 2048-token samples; warm (/dev/shm) alone and with a GPU step at 80% of peak, cold
# (page cache dropped) against the disk's raw ceiling measured in the same run. Prints
# `TABLE name | figure | note` lines; about 3 minutes on a 16-core machine with GB=2 SECONDS_PER_RUN=5 (bench/gpu-loader.sh).
#   GB=4 SECONDS_PER_RUN=8 BATCH=32 COLD_DIR=/var/tmp/ferry-loader bash bench/loader-gpu.sh
# From scripts/gpu-check.sh: GPU_BENCHES=loader-gpu bash scripts/gpu-check.sh
#
# mosaicml-streaming (the third peer) from wheels carried in .whl/ (git-ignored; the GPU machine has
# no network), installed with --no-deps into build-bench-disk/mosaic-py. The minimal set for local
# MDS writing and reading, found by importing streaming with each missing module added in turn,
# 20.6 MB for Python 3.12 (torch 2.11 and numpy are already there; transformers, 13 MB plus its
# dependencies, is only imported for isinstance checks and tokenizers that local MDS reading never
# uses: loader-gpu.py stands in for it):
#   pip download --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_28_x86_64 --only-binary=:all: -d .whl mosaicml-streaming brotli \
#     python-snappy cramjam zstd xxhash tqdm pillow catalogue torchvision==0.26.0
# (torchvision 0.26 is the one built for torch 2.11; change it with the machine's torch.)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
if ! (cd /tmp && "$PY" -c 'import ferry; ferry.Loader' 2>/dev/null); then
	"$PY" -m pip install -q --no-build-isolation --no-deps . ||
		"$PY" -m pip install -q --no-build-isolation --no-deps --break-system-packages . || exit 1
fi
MOSAIC=$ROOT/build-bench-disk/mosaic-py
if ! (cd /tmp && "$PY" -c 'import streaming' 2>/dev/null) && ls "$ROOT"/.whl/mosaicml_streaming-*.whl >/dev/null 2>&1; then
	[ -d "$MOSAIC/streaming" ] || "$PY" -m pip install -q --no-deps --no-index --target "$MOSAIC" \
		"$ROOT"/.whl/{mosaicml_streaming,brotli,python_snappy,cramjam,zstd,xxhash,tqdm,pillow,catalogue,torchvision}-*.whl ||
		echo "mosaicml-streaming: installing the carried wheels failed (the bench says skipped)"
	export PYTHONPATH=$MOSAIC${PYTHONPATH:+:$PYTHONPATH}
fi
cd /tmp && exec "$PY" "$ROOT/bench/loader-gpu.py" --gb "${GB:-4}" --seconds "${SECONDS_PER_RUN:-8}" \
	--batch-size "${BATCH:-32}" --cold-dir "${COLD_DIR:-/var/tmp/ferry-loader}" ${LOADER_BENCH_ARGS:-}
