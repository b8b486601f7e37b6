#!/usr/bin/env bash
# Issue 23's throughput rows (docs/PERFORMANCE.md, "Object storage"), in one run: nginx from Debian
# (installed, or unpacked from .deb/nginx by tests/python/_nginx.py) serving /dev/shm on 127.0.0.1;
# a 4 GiB object and a 4 GiB safetensors file read by ferry (GPU and host memory), kvikio's
# RemoteFile, boto3 download_fileobj + a copy, runai-model-streamer's S3 path and tensorizer's
# HTTP path, beside curl's parallel ranged GETs to /dev/null (the ceiling). The peers' wheels come
# from .whl/ (scripts/stage-device.sh), installed into a folder of this bench's own. About 2-3
# minutes on the GPU machine at REMOTE_SIZE=4g.
#   GPU_BENCHES=remote-read bash scripts/gpu-check.sh        (on the device)
#   REMOTE_SIZE=256m bash bench/remote-read.sh --cpu          (here: host memory only)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
LOG=${FERRY_LOG_DIR:-/tmp/ferry-remote-read}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
if ! (cd /tmp && "$PY" -c 'import ferry' 2>/dev/null); then
	"$PY" -m pip install -q --no-build-isolation --no-deps . >"$LOG/remote-read-install.log" 2>&1 ||
		"$PY" -m pip install -q --no-build-isolation --no-deps --break-system-packages . >>"$LOG/remote-read-install.log" 2>&1 ||
		{ echo "skipped: the ferry Python package is not installed and pip install . failed ($LOG/remote-read-install.log)"; exit 77; }
fi
PEERS=${FERRY_BUILD_DIR:-$ROOT/build}/remote-peers-py
if ls .whl/tensorizer-*.whl >/dev/null 2>&1; then
	[ -d "$PEERS/tensorizer" ] || "$PY" -m pip install -q --no-deps --no-index --no-compile --target "$PEERS" \
		.whl/{runai_model_streamer,runai_model_streamer_s3,tensorizer,boto3,botocore,s3transfer,jmespath,python_dateutil,six,humanize,protobuf,psutil,redis,hiredis,libnacl,urllib3}-*.whl \
		>"$LOG/remote-peers-install.log" 2>&1 || echo "remote-read: installing the peers' wheels failed ($LOG/remote-peers-install.log): they say skipped"
	# for this bench's process only (they come before the image's own packages there)
	export PYTHONPATH=$PEERS${PYTHONPATH:+:$PYTHONPATH}
fi
rc=0
if [ "${REMOTE_READ_ROWS:-1}" != 0 ]; then # REMOTE_READ_ROWS=0: the loader's rows alone
	timeout 400 "$PY" bench/remote-read.py --size "${REMOTE_SIZE:-4g}" "$@" | tee "$LOG/remote-read.jsonl" | grep '^TABLE '
	rc=${PIPESTATUS[0]}
	[ "$rc" = 77 ] && echo "skipped: $(grep -m1 'skipped' "$LOG/remote-read.jsonl")" && exit 77
fi
# the loader over a cached s3:// dataset, the cache unbounded and at half the dataset (full and
# evicting; the evicting cache also at shard_window 14 and 3, its default being 1 at this budget:
# REMOTE_LOADER_WINDOWS; more of remote-loader.py's options in REMOTE_LOADER_ARGS, e.g. --unmapped
# or --jobs 16), per epoch, then 3 epoch pairs of the local loader alone and beside a fetch at the
# evicting cache's rate (REMOTE_LOADER_GB=0 leaves it out; about 40 s at 1 GB)
if [ "${REMOTE_LOADER_GB:-1}" != 0 ]; then
	timeout 300 "$PY" bench/remote-loader.py --gb "${REMOTE_LOADER_GB:-1}" --epochs 3 --fractions 1,0.5 --contend 3 \
		--windows "${REMOTE_LOADER_WINDOWS-14,3}" ${REMOTE_LOADER_ARGS:-} |
		tee "$LOG/remote-loader.jsonl" | grep '^TABLE ' || rc=1
fi
exit "$rc"
