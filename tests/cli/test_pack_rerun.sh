#!/usr/bin/env bash
# ferry pack never packs its own output (issue 20, finding 8): with the output inside an input's
# tree, the walk leaves it out (by device and inode, so a second spelling of the path is caught),
# so running the same command twice packs the same samples; an input that is the output itself is
# refused with a message saying why.
set -u
FERRY=${1:?usage: test_pack_rerun.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_rerun.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
samples() { sed -n 's/.*"samples": \([0-9]*\),.*/\1/p' "$1"; }
mkdir -p "$T/in/sub"
printf 'alpha' >"$T/in/a"; printf 'beta' >"$T/in/sub/b"; printf '{"x": 1}\n{"x": 2}\n' >"$T/in/c.jsonl"
cat "$T/in/a" "$T/in/c.jsonl" "$T/in/sub/b" | tr -d '\n' >"$T/expect"
cp -r "$T/in" "$T/in2"
for run in 1 2; do
	"$FERRY" pack --json -o "$T/in/packed" "$T/in" >"$T/json$run" 2>"$T/err$run"; r=$?
	check "ferry output inside the input, run $run (rc $r: $(cat "$T/err$run"))" '[ $r = 0 ] && [ "$(samples "$T/json$run")" = 4 ]'
	check "run $run packs the inputs only" '[ "$(cat "$T"/in/packed/shard-*.fsh)" = "$(cat "$T/expect")" ]'
done
check "the second run says it left the output out ($(cat "$T/err2"))" \
	'grep -qF "$T/in/packed: left out, it is the output" "$T/err2" && grep -qF "\"output_left_out\": 1" "$T/json2"'
# the same directory reached through a symlink is still the output
ln -s "$T/in" "$T/link"
"$FERRY" pack -q --json -o "$T/in/packed" "$T/link" >"$T/json3" 2>"$T/err3"; r=$?
check "through a symlinked input, run 3 (rc $r: $(cat "$T/err3"))" '[ $r = 0 ] && [ "$(samples "$T/json3")" = 4 ]'
for run in 1 2; do
	"$FERRY" pack -q --json --format megatron -o "$T/in2/mega" "$T/in2" >"$T/mj$run" 2>"$T/err"; r=$?
	check "megatron output inside the input, run $run (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && [ "$(samples "$T/mj$run")" = 4 ]'
done
check "megatron data: the inputs only" '[ "$(cat "$T/in2/mega.bin")" = "$(cat "$T/expect")" ]'
# -o DIR DIR: the input is the output
mkdir "$T/same" && printf 'x' >"$T/same/f"
"$FERRY" pack -q -o "$T/same" "$T/same" >/dev/null 2>"$T/err"; r=$?
check "-o DIR DIR is refused, saying why (rc $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -q "is the output" "$T/err" && [ ! -e "$T/same/ferry.idx" ]'
"$FERRY" pack -q -o "$T/same/" "$T/same/." >/dev/null 2>"$T/err"; r=$?
check "... however the two are spelled (rc $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -q "is the output" "$T/err"'
if [ $fail = 0 ]; then echo "test_pack_rerun: passed"; fi
exit $fail
