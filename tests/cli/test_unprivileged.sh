#!/usr/bin/env bash
# The file-safety tests again as an unprivileged user (issue 20): the checkpoint, safetensors, dataset
# and stats-file tests run as `nobody`, in a directory of its own; then root works in a shared sticky
# directory where `nobody` planted symlinks at the names ferry writes, and nothing outside is touched.
# Needs root (to switch users); skipped with the reason otherwise.
set -u
FERRY=${1:?usage: test_unprivileged.sh path/to/ferry}
B=$(cd "$(dirname "$FERRY")" && pwd)
SRC=${FERRY_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if [ "$(id -u)" != 0 ]; then
	echo "skipped: needs root to run the tests as the unprivileged user nobody (running as uid $(id -u))"
	exit 77
fi
if ! command -v runuser >/dev/null || ! id nobody >/dev/null 2>&1; then
	echo "skipped: runuser or the user nobody is missing"
	exit 77
fi
# Everything nobody runs is copied where it can read it (the build tree may be under a private home)
T=$(mktemp -d /tmp/ferry-unpriv.XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT
chmod 755 "$T"
mkdir -p "$T/bin" "$T/work" "$T/shared"
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
for t in test_ckpt test_safetensors test_shards; do
	[ -x "$B/$t" ] && cp "$B/$t" "$T/bin/"
done
cp "$FERRY" "$T/bin/ferry"
cp "$SRC"/tests/cli/_top.py "$SRC"/tests/cli/test_top_stale.py "$SRC"/tests/cli/test_top_json.py "$T/bin/"
chmod -R a+rX "$T/bin"
chown nobody "$T/work"
chmod 1777 "$T/shared"
as_nobody() { runuser -u nobody -- env -i PATH=/usr/bin:/bin HOME=/ ${LD_LIBRARY_PATH:+LD_LIBRARY_PATH="$LD_LIBRARY_PATH"} FERRY_TEST_TMPDIR="$T/work" "$@"; }

# 1. The C tests of the files ferry creates and removes, as nobody
for t in test_ckpt test_safetensors test_shards; do
	if [ ! -x "$T/bin/$t" ]; then
		echo "FAIL: $t is not built next to the CLI ($B)"
		fail=1
		continue
	fi
	out=$(as_nobody "$T/bin/$t" 2>&1); r=$?
	check "$t as nobody (rc $r): $(echo "$out" | grep -E 'failed|FAIL' | head -5)" '[ $r = 0 ]'
	echo "$out" | grep -E '^skipped|: skipped' | sed "s/^/$t as nobody: /"
done
# 2. ferry top's stats files (created 0600 and exclusively; dead ones removed only by their owner)
for t in test_top_stale test_top_json; do
	out=$(cd "$T/bin" && as_nobody python3 "$t.py" "$T/bin/ferry" 2>&1); r=$?
	check "$t as nobody (rc $r): $(echo "$out" | tail -5)" '[ $r = 0 ]'
done

# 3. Root writes into a sticky directory shared with nobody, who planted symlinks at the fixed names
#    ferry writes (OUT.bin, OUT.idx of --format megatron; a dataset's index): the targets, root's
#    files, are never written, truncated or removed.
echo precious >"$T/victim" && chmod 600 "$T/victim"
mkdir -p "$T/in" && printf '{"text":"a"}\n{"text":"bb"}\n' >"$T/in/a.jsonl"
mkdir -m 700 "$T/victimdir" && echo precious >"$T/victimdir/ferry.idx"
for n in m.bin m.idx; do
	as_nobody ln -s "$T/victim" "$T/shared/$n"
done
as_nobody ln -s "$T/victimdir" "$T/shared/ds"
"$FERRY" pack -q --format megatron -o "$T/shared/m" "$T/in" >/dev/null 2>"$T/err"; r=$?
check "megatron output over nobody's symlinks leaves root's file alone (rc $r: $(cat "$T/err"))" \
	'[ "$(cat "$T/victim")" = precious ] && [ "$(stat -c %U "$T/victim")" = root ]'
"$FERRY" pack -q -o "$T/shared/ds" "$T/in" >/dev/null 2>"$T/err"; r=$?
check "an output directory that is nobody's symlink (to root's directory) is refused, as the kernel's
	fs.protected_symlinks would (rc $r: $(cat "$T/err"))" \
	'[ $r != 0 ] && grep -q "symlink of another user" "$T/err" && [ "$(cat "$T/victimdir/ferry.idx")" = precious ] &&
	 [ "$(ls "$T/victimdir")" = ferry.idx ]'
exit $fail
