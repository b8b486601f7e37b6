#!/usr/bin/env bash
# GPU process snapshots on the GPU machine: a torch process holding CUDA tensors is suspended and
# resumed by the driver (ferry snapshot --gpu-only), then snapshotted with CRIU (ferry snapshot PID
# DIR, the process ends), restored (ferry restore DIR), and must compute on: the tensors' bytes and a
# matmul on them the same after as before. Each stage that is refused prints "REFUSED <stage>: <the
# error>" and the doctor's snapshot.* rows are printed first, so the log says exactly what refused.
# Exit 0 pass, 1 fail (ferry's part failed, or results differ), 77 when CRIU is missing or refuses
# this machine (criu check failed) after the driver's part passed.
#
#   bash tests/gpu/test_snapshot.sh [path/to/ferry]
#   SNAP_MB="1024 10240 40960" bash tests/gpu/test_snapshot.sh build/ferry   (timings per size; the
#   image of SNAP_MB and then ferry ckpt bench's file of the same size go into SNAP_DIR, default the
#   test's temporary directory: 40960 needs about 45 GB free there)
#
# Lines "TABLE snapshot ..." give the times (scripts/gpu-check.sh makes them rows). CRIU: $FERRY_CRIU,
# criu on PATH, or the Debian packages staged in .deb/criu by scripts/stage-device.sh (unpacked here
# and run through a wrapper that gives criu alone their libraries).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FERRY=${1:-${FERRY_CLI:-$ROOT/build/ferry}}
PY=${PYTHON:-python3}
SIZES=${SNAP_MB:-256}
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/gpu-snapshot.XXXXXX")
IMG=${SNAP_DIR:-$T}
WORKER=
cleanup() { [ -n "$WORKER" ] && kill -9 "$WORKER" 2>/dev/null; rm -rf "$T"; [ "$IMG" != "$T" ] && rm -rf "$IMG"/snap-*; }
trap cleanup EXIT
say() { echo "$*"; }

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
	{ say "skipped: torch with CUDA is not available to $PY"; exit 77; }
[ -x "$FERRY" ] || { say "FAIL: $FERRY is not built"; exit 1; }

source "$ROOT/scripts/criu-env.sh" "$T"

say "--- ferry doctor, snapshot rows"
"$FERRY" doctor --no-color 2>&1 | grep -E 'snapshot\.' | cut -c1-600
command -v nvidia-smi >/dev/null &&
	nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader 2>&1 | head -1 | sed 's/^/driver, persistence: /'

cat >"$T/worker.py" <<'PY'
# Holds CUDA tensors; writes the results of a step on them into before.txt, waits for the file
# "go", then does the same step again into after.txt (files opened and closed at once: CRIU
# restores open files only if their size did not change).
import hashlib, os, sys, time
import torch
d, mb = sys.argv[1], int(sys.argv[2])
torch.manual_seed(1234)
x = torch.rand(mb * 1024 * 1024 // 4, device="cuda")
w = torch.rand(1024, 1024, device="cuda")
def step(name):
    torch.cuda.synchronize()
    h = hashlib.sha256()
    for i in range(0, x.numel(), 64 << 20):  # 256 MiB at a time: host memory stays small at 40 GB
        h.update(x[i : i + (64 << 20)].cpu().numpy().data)
    digest = h.hexdigest()
    y = (x[: 1024 * 1024].view(1024, 1024) @ w).double().sum().item()
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write("%s %.17g\n" % (digest, y))
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
step("before.txt")
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.05)
step("after.txt")
PY

wait_file() { # file seconds
	local i=0
	while [ ! -s "$1" ] && [ $i -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
	[ -s "$1" ]
}

fail=0 criu_refused=0
for mb in $SIZES; do
	W=$T/w$mb; mkdir -p "$W"
	"$PY" "$T/worker.py" "$W" "$mb" </dev/null >"$W/worker.log" 2>&1 &
	WORKER=$!
	if ! wait_file "$W/before.txt" 300; then
		say "FAIL ($mb MiB): the worker did not start: $(tail -3 "$W/worker.log")"; fail=1; break
	fi
	say "--- $mb MiB of CUDA tensors in pid $WORKER"

	# 1. The driver alone: suspend and resume, the process runs on.
	if "$FERRY" snapshot "$WORKER" --gpu-only >"$W/gpu-only.out" 2>&1; then
		cat "$W/gpu-only.out"
		read -r s_sus s_res < <(sed -E 's/.*suspended in ([0-9.]+) s.*resumed in ([0-9.]+) s.*/\1 \2/' "$W/gpu-only.out")
		say "TABLE snapshot gpu-only $mb MiB | ok | suspend $s_sus s, resume $s_res s"
	else
		say "REFUSED driver (ferry snapshot --gpu-only): $(cat "$W/gpu-only.out")"
		say "TABLE snapshot gpu-only $mb MiB | FAILED | $(head -c 200 "$W/gpu-only.out" | tr '|\n' '/ ')"
		fail=1; kill -9 "$WORKER"; WORKER=; continue
	fi

	# 2. CRIU: dump (the process ends), restore, compute on.
	D=$IMG/snap-$mb
	rm -rf "$D"
	if ! "$FERRY" snapshot "$WORKER" "$D" >"$W/snap.out" 2>&1; then
		say "REFUSED criu dump (ferry snapshot $WORKER $D): $(cat "$W/snap.out")"
		say "TABLE snapshot criu $mb MiB | REFUSED | $(head -c 300 "$W/snap.out" | tr '|\n' '/ ')"
		criu_refused=1
		# ferry resumed the GPU state: the process must still compute right
		touch "$W/go"
		if wait_file "$W/after.txt" 120 && cmp -s "$W/before.txt" "$W/after.txt"; then
			say "after the refused dump the process computed on with the same results"
		else
			say "FAIL ($mb MiB): after the refused dump the process did not compute the same: $(cat "$W/after.txt" 2>/dev/null) vs $(cat "$W/before.txt"); $(tail -3 "$W/worker.log")"
			fail=1
		fi
		kill -9 "$WORKER" 2>/dev/null; WORKER=
		continue
	fi
	cat "$W/snap.out"
	wait "$WORKER" 2>/dev/null
	pid=$WORKER; WORKER=
	du -sh "$D" | sed 's/^/image: /'
	if ! "$FERRY" restore "$D" >"$W/restore.out" 2>&1; then
		say "REFUSED criu restore (ferry restore $D): $(cat "$W/restore.out")"
		say "TABLE snapshot criu $mb MiB | REFUSED at restore | $(head -c 300 "$W/restore.out" | tr '|\n' '/ ')"
		criu_refused=1; kill -9 "$pid" 2>/dev/null; continue
	fi
	cat "$W/restore.out"
	WORKER=$pid
	touch "$W/go"
	if wait_file "$W/after.txt" 300 && cmp -s "$W/before.txt" "$W/after.txt"; then
		say "restored pid $pid computed the same results: $(cat "$W/after.txt")"
		read -r s_sus s_dump < <(sed -E 's/.*suspended in ([0-9.]+) s, CRIU dump ([0-9.]+) s.*/\1 \2/' "$W/snap.out")
		read -r s_crest s_gres < <(sed -E 's/.*CRIU restore ([0-9.]+) s, GPU resumed in ([0-9.]+) s.*/\1 \2/' "$W/restore.out")
		say "TABLE snapshot criu $mb MiB | ok | suspend $s_sus s, dump $s_dump s, criu restore $s_crest s, GPU resume $s_gres s"
	else
		say "FAIL ($mb MiB): after restore: $(cat "$W/after.txt" 2>/dev/null || echo 'no after.txt') vs before $(cat "$W/before.txt"); worker log: $(tail -5 "$W/worker.log")"
		say "TABLE snapshot criu $mb MiB | FAILED | results differ or none after restore"
		fail=1
	fi
	kill -9 "$WORKER" 2>/dev/null; WORKER=
	rm -rf "$D" # the disk holds one image or one checkpoint file of this size at a time
	# Beside it, ferry's own checkpoint path for the same bytes (host memory as the dump does).
	if "$FERRY" ckpt bench --size "${mb}m" --dir "$IMG" --json --loads 1 >"$W/bench.json" 2>"$W/bench.err"; then
		say "TABLE snapshot ferry-ckpt $mb MiB | ok | $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("save %.3f s, load %.3f s (%s)" % (d["save_s"], d["load_s"], d["memory"]))' "$W/bench.json")"
	fi
done
[ $fail = 1 ] && exit 1
if [ $criu_refused = 1 ]; then
	say "skipped: CRIU refused on this machine (REFUSED lines above); the driver's part passed"
	exit 77
fi
exit 0
