#!/usr/bin/env bash
# ferry snapshot / ferry restore and the doctor's snapshot.* rows without a GPU: no driver said so,
# usage errors, and against the fake libcuda (tests/unit/fakes, built here with cc) and a stand-in
# criu, the whole CLI path: rows, snapshot, manifest, restore. The real thing: tests/gpu/test_snapshot.sh.
set -u
FERRY=${1:?usage: test_snapshot.sh path/to/ferry}
SRC=${FERRY_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/cli-snapshot.XXXXXX")
SLEEPER=
trap '[ -n "$SLEEPER" ] && kill $SLEEPER 2>/dev/null; rm -rf "$T"' EXIT
fail=0
check() { # description, command...
	local what=$1; shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fail=1; cat "$T/out" 2>/dev/null | head -5; fi
}
row() { # id field: from the doctor's JSON in $T/doc.json
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([c for c in d["checks"] if c["id"]==sys.argv[2]][0][sys.argv[3]])' "$T/doc.json" "$1" "$2"
}

export -f row; export T

# No driver: the CLI says so, exit 1.
FERRY_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$FERRY" snapshot $$ "$T/s0" >"$T/out" 2>&1
check "no driver: exit 1" test $? = 1
check "no driver: says why" grep -q 'ferry snapshot: cannot snapshot pid [0-9]*: no usable CUDA driver: libcuda.so.1 not loaded' "$T/out"
check "no driver: DIR not made" test ! -e "$T/s0"
"$FERRY" snapshot 12x "$T/s0" >"$T/out" 2>&1
check "bad PID: exit 2" test $? = 2
"$FERRY" snapshot 1 >"$T/out" 2>&1
check "DIR missing: exit 2" test $? = 2
"$FERRY" restore "$T" >"$T/out" 2>&1
check "restore of a directory without a manifest: exit 1" test $? = 1
check "restore names the manifest" grep -q 'ferry-snapshot.json: cannot open it' "$T/out"

FERRY_CUDA_LIBRARY=/nonexistent/libcuda.so.1 FERRY_CRIU=/nonexistent/criu "$FERRY" doctor --json >"$T/doc.json" 2>/dev/null
check "doctor: snapshot.driver says no driver" bash -c "[[ \"\$(row snapshot.driver value)\" == *'libcuda.so.1 not loaded from /nonexistent'* ]]"
check "doctor: snapshot.criu says FERRY_CRIU is not there" bash -c "[[ \"\$(row snapshot.criu value)\" == *'FERRY_CRIU=/nonexistent/criu is not an executable file'* ]]"
check "doctor: snapshot.kernel row present" bash -c "[ -n \"\$(row snapshot.kernel value)\" ]"

CC=${CC:-cc}
if ! command -v "$CC" >/dev/null; then
	echo "skipped: no C compiler ($CC) to build the fake libcuda; the checks above ran"
	[ $fail = 0 ] && exit 77 || exit 1
fi
"$CC" -shared -fPIC -O1 -fvisibility=hidden -DFAKE_CHECKPOINT -o "$T/cuda_ckpt.so" "$SRC/tests/unit/fakes/fake_libcuda.c" -lpthread &&
	"$CC" -shared -fPIC -O1 -fvisibility=hidden -o "$T/cuda_old.so" "$SRC/tests/unit/fakes/fake_libcuda.c" -lpthread
check "fake libcuda built" test -f "$T/cuda_ckpt.so" -a -f "$T/cuda_old.so"
cat >"$T/criu" <<'SH'
#!/bin/sh
case "$1" in
--version) echo 'Version: 3.17.1'; exit 0;;
check) echo 'Error (criu/util.c:642): exited, status=1'; echo 'Error (criu/cr-check.c:1411): fake: kernel lacks something'; exit 1;;
esac
d=; prev=; for a in "$@"; do [ "$prev" = -D ] && d=$a; prev=$a; done
echo "$*" >>"$d/args.txt"; echo image >"$d/core.img"; echo done >"$d/$1.log"
SH
chmod +x "$T/criu"

FERRY_CUDA_LIBRARY=$T/cuda_old.so FERRY_CRIU=$T/criu "$FERRY" doctor --json >"$T/doc.json" 2>/dev/null
check "doctor: a driver without the checkpoint API is named" bash -c "[[ \"\$(row snapshot.driver value)\" == *'lacks the checkpoint API: cuCheckpointProcessGetState, '*'570 and later'* ]]"
check "doctor: criu check's failure quoted" bash -c "[[ \"\$(row snapshot.criu value)\" == *'Version: 3.17.1 ('*'criu check failed (exit 1): Error (criu/cr-check.c:1411): fake: kernel lacks something'* ]]"
check "doctor: CRIU's 'exited, status=1' noise left out" bash -c "[[ \"\$(row snapshot.criu value)\" != *'exited, status'* ]]"
FERRY_CUDA_LIBRARY=$T/cuda_ckpt.so FERRY_CRIU=$T/criu "$FERRY" doctor --json >"$T/doc.json" 2>/dev/null
check "doctor: checkpoint API present" bash -c "[[ \"\$(row snapshot.driver value)\" == 'driver 12.8: all 6 checkpoint entry points present' ]]"
check "doctor: present is ok" bash -c "[ \"\$(row snapshot.driver verdict)\" = ok ]"

# The CLI's whole path against the fakes: a process (sleep) stands for the CUDA one.
sleep 60 & SLEEPER=$!
export FERRY_CUDA_LIBRARY=$T/cuda_ckpt.so FERRY_CRIU=$T/criu FAKE_CKPT_PID=$SLEEPER
"$FERRY" snapshot $SLEEPER "$T/snap" --criu-args=--tcp-established >"$T/out" 2>&1
check "snapshot: exit 0" test $? = 0
check "snapshot: says what it did" grep -q "snapshot of pid $SLEEPER in $T/snap: GPU suspended in" "$T/out"
check "snapshot: criu dump's arguments" grep -q "^dump -t $SLEEPER -D $T/snap --shell-job -o dump.log -v4 --tcp-established$" "$T/snap/args.txt"
check "snapshot: manifest" grep -q "\"format\":\"ferry-snapshot\",\"version\":1,\"pid\":$SLEEPER,\"driver_version\":12080" "$T/snap/ferry-snapshot.json"
"$FERRY" snapshot $SLEEPER "$T/snap" >"$T/out" 2>&1
check "snapshot into a non-empty DIR: exit 1" test $? = 1
check "snapshot into a non-empty DIR: says so" grep -q "snap: not empty" "$T/out"
"$FERRY" restore "$T/snap" >"$T/out" 2>&1
check "restore while the pid runs: exit 1" test $? = 1
check "restore while the pid runs: says so" grep -q "pid $SLEEPER is in use" "$T/out"
"$FERRY" snapshot $SLEEPER --gpu-only >"$T/out" 2>&1
check "--gpu-only: exit 0" test $? = 0
check "--gpu-only: suspended and resumed" grep -q "pid $SLEEPER: GPU suspended in .* resumed in " "$T/out"
"$FERRY" snapshot $SLEEPER "$T/x" --gpu-only >"$T/out" 2>&1
check "--gpu-only with DIR: exit 2" test $? = 2
FAKE_CKPT_FAIL=checkpoint "$FERRY" snapshot $SLEEPER --gpu-only >"$T/out" 2>&1
check "--gpu-only, checkpoint refused: exit 1" test $? = 1
check "--gpu-only, checkpoint refused: the call and the code" grep -q "cuCheckpointProcessCheckpoint(pid $SLEEPER): CUDA_ERROR_NOT_SUPPORTED (801).*unlocked again" "$T/out"
kill $SLEEPER; wait $SLEEPER 2>/dev/null; SLEEPER=
"$FERRY" restore "$T/snap" >"$T/out" 2>&1
check "restore: exit 0" test $? = 0
check "restore: says what it did" grep -q "restored pid [0-9]* from $T/snap: CRIU restore" "$T/out"
check "restore: criu restore's arguments" grep -q "^restore -D $T/snap --shell-job --restore-detached -o restore.log -v4$" "$T/snap/args.txt"
exit $fail
