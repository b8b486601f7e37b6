#!/usr/bin/env bash
# ferry pack walks each directory once (by device and inode): a symlink back to an ancestor (a
# loop) or a second path to a directory used to pack the same files again, level after level until
# the path grew too long; now the second visit is left out with a note, and the files pack once.
set -u
FERRY=${1:?usage: test_pack_walk.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_walk.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
mkdir -p "$T/d/sub"
printf 'one' >"$T/d/a"; printf 'two' >"$T/d/sub/b"
ln -s .. "$T/d/sub/up"     # a loop: d/sub/up is d
ln -s sub "$T/d/alias"     # a second path to d/sub
# (timeout: the code before this packed the loop until its paths grew too long)
timeout 60 "$FERRY" pack --json -o "$T/out" "$T/d" >"$T/json" 2>"$T/err"; r=$?
check "packs (rc $r: $(head -c 300 "$T/err"))" '[ $r = 0 ]'
check "each file once ($(head -c 200 "$T/json"))" 'grep -q "\"samples\": 2, " "$T/json" && [ "$(cat "$T"/out/shard-*.fsh)" = onetwo ]'
# name order: d/alias is walked first, so d/alias/up (the loop) and d/sub are the second visits
check "the second visits are named ($(cat "$T/err"))" \
	'grep -qF "$T/d/alias/up: left out, the directory was walked already" "$T/err" && grep -qF "$T/d/sub: left out" "$T/err"'
timeout 60 "$FERRY" pack -q --json -o "$T/out2" "$T/d" "$T/d/sub" >"$T/json" 2>"$T/err"; r=$?
check "an input inside another is packed once (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && grep -q "\"samples\": 2, " "$T/json"'
if [ $fail = 0 ]; then echo "test_pack_walk: passed"; fi
exit $fail
