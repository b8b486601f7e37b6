#!/usr/bin/env bash
# Issue 23's throughput rows (docs/PERFORMANCE.md, "Object storage"): a /dev/shm file served over
# 127.0.0.1 by bench/remote-read.py's own HTTP range server (the GPU machine has no network, no S3
# server and no nginx), read whole into GPU memory by ferry and by kvikio's RemoteFile (the wheels
# carried in .whl/, on PYTHONPATH from scripts/gpu-check.sh), with curl's parallel ranged GETs to
# /dev/null as the ceiling. Under a minute at REMOTE_SIZE=1g.
#   GPU_BENCHES=remote-read bash scripts/gpu-check.sh        (on the device)
#   REMOTE_SIZE=256m bash bench/remote-read.sh --cpu          (here: host rows only)
set -u
cd "$(dirname "$0")/.." || exit 1
LOG=${FERRY_LOG_DIR:-/tmp/ferry-remote-read}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
"$PY" -c 'import ferry' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
timeout 300 "$PY" bench/remote-read.py --size "${REMOTE_SIZE:-1g}" "$@" | tee "$LOG/remote-read.jsonl" | grep '^TABLE '
exit "${PIPESTATUS[0]}"
