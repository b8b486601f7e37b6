#!/usr/bin/env bash
# Loader benchmark for the GPU machine (bench/loader-gpu.py has the details): ferry.Loader, the
# Python package, vs PyTorch DataLoader (8 workers, pin_memory, prefetch_factor 4) on a uint16 token
# dataset of 2048-token samples; warm (/dev/shm) alone and with a GPU step at 80% of peak, cold
# (page cache dropped) against the disk's raw ceiling measured in the same run. Prints
# `TABLE name | figure | note` lines; under 4 minutes on a 16-core machine with the defaults.
#   GB=4 SECONDS_PER_RUN=8 BATCH=32 COLD_DIR=/var/tmp/ferry-loader bash bench/loader-gpu.sh
# From scripts/gpu-check.sh: GPU_BENCHES=loader-gpu bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
if ! (cd /tmp && "$PY" -c 'import ferry; ferry.Loader' 2>/dev/null); then
	"$PY" -m pip install -q --no-build-isolation --no-deps . ||
		"$PY" -m pip install -q --no-build-isolation --no-deps --break-system-packages . || exit 1
fi
cd /tmp && exec "$PY" "$ROOT/bench/loader-gpu.py" --gb "${GB:-4}" --seconds "${SECONDS_PER_RUN:-8}" \
	--batch-size "${BATCH:-32}" --cold-dir "${COLD_DIR:-/var/tmp/ferry-loader}" ${LOADER_BENCH_ARGS:-}
