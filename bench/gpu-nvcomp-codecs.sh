#!/usr/bin/env bash
# Issue 26: nvCOMP's own formats (ANS, Bitcomp, GDeflate, Cascaded) against its zstd and LZ4 on
# ferry's data, in one process (bench/nvcomp-codecs.py: ratio, GPU compression and decompression
# rates, bytes compared). nvCOMP's Python API comes from .whl (nvidia-nvcomp-cu13 and
# nvidia-libnvcomp-cu13, scripts/stage-device.sh), installed into a folder of this bench's own;
# the tokens are a real tokenizer's (bench/cz-tokens.py). About a minute on the GPU machine.
#   GPU_BENCHES=gpu-nvcomp-codecs bash scripts/gpu-check.sh       NVC_CODECS_MIB=256
# Prints "TABLE name | figure | note" rows; the full output goes to $FERRY_LOG_DIR.
set -u
LOG=${FERRY_LOG_DIR:-/tmp/ferry-gpu-nvcomp-codecs}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
DIR=${FERRY_BUILD_DIR:-build}/nvcomp-py
if ! ls .whl/nvidia_nvcomp_cu13-*.whl >/dev/null 2>&1; then
	echo "skipped: .whl/ has no nvidia_nvcomp_cu13 wheel (scripts/stage-device.sh stages it)"
	exit 77
fi
[ -d "$DIR/nvidia/nvcomp" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$DIR" \
	.whl/nvidia_nvcomp_cu13-*.whl .whl/nvidia_libnvcomp_cu13-*.whl >"$LOG/nvcomp-py-install.log" 2>&1 ||
	{ echo "skipped: installing nvCOMP's Python wheels failed ($LOG/nvcomp-py-install.log)"; exit 77; }
MIB=${NVC_CODECS_MIB:-256}
tokens=/dev/shm/ferry-nvcomp-codecs-$$.u16
trap 'rm -f "$tokens"' EXIT
timeout 60 "$PY" bench/cz-tokens.py "$tokens" "$MIB" >"$LOG/nvcomp-codecs-tokens.txt" 2>&1 || tokens=
PYTHONPATH=$DIR${PYTHONPATH:+:$PYTHONPATH} timeout 400 "$PY" bench/nvcomp-codecs.py --mib "$MIB" ${tokens:+--tokens "$tokens"} |
	tee "$LOG/nvcomp-codecs.txt" | grep '^TABLE \|^skipped'
exit "${PIPESTATUS[0]}"
