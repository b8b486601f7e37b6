#!/usr/bin/env bash
# ferry pack refuses inputs that would pack nothing or pack garbage (issue 20 finding 8): an empty
# directory, no samples at all, a JSON Lines line that is not one JSON value or not UTF-8. Exit 1,
# the message names the file and the line; valid JSON of every shape still packs.
set -u
FERRY=${1:?usage: test_pack_refuse.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_refuse.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
refused() { # name, expected words..., then -- and the pack arguments
	local name=$1; shift; local words=(); while [ "$1" != -- ]; do words+=("$1"); shift; done; shift
	"$FERRY" pack -q -o "$T/out-$RANDOM" "$@" >"$T/out" 2>"$T/err"; local r=$?
	check "$name: exit 1 (got $r: $(cat "$T/err"))" '[ $r = 1 ]'
	for w in "${words[@]}"; do check "$name: message names '$w' ($(cat "$T/err"))" 'grep -qF -- "$w" "$T/err"'; done
}
mkdir "$T/empty"
refused "empty directory" "$T/empty" "no files" -- "$T/empty"
: >"$T/none.jsonl"
refused "empty .jsonl" "$T/none.jsonl" "no samples" -- "$T/none.jsonl"
printf '\n  \n' >"$T/blank.jsonl"
refused "only blank lines" "$T/blank.jsonl" "no samples" -- "$T/blank.jsonl"
printf '{"x": 1}\n{"x": \n{"x": 3}\n' >"$T/broken.jsonl"
refused "broken line" "$T/broken.jsonl:2" "JSON" -- "$T/broken.jsonl"
printf '{"x": 1}\n{"x": 2}\n{"x": "\xff\xfe"}\n' >"$T/latin.jsonl"
refused "invalid UTF-8" "$T/latin.jsonl:3" "UTF-8" -- "$T/latin.jsonl"
printf '{"x": "\xed\xa0\x80"}\n' >"$T/surrogate.jsonl"
refused "UTF-8 surrogate" "$T/surrogate.jsonl:1" "UTF-8" -- "$T/surrogate.jsonl"
printf '{"x": 1} {"y": 2}\n' >"$T/two.jsonl"
refused "two values on a line" "$T/two.jsonl:1" -- "$T/two.jsonl"
printf '{"x": 1}\n{"x": 2' >"$T/trunc.jsonl"
refused "truncated last line" "$T/trunc.jsonl:2" -- "$T/trunc.jsonl"
mkfifo "$T/fifo.jsonl"
timeout 20 "$FERRY" pack -q -o "$T/out-fifo" "$T/fifo.jsonl" >/dev/null 2>"$T/err"; r=$?
check "a FIFO input is refused without blocking (got $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -qF "$T/fifo.jsonl: is a FIFO" "$T/err"'
# valid JSON of every shape packs, blank and CRLF lines skipped or kept as before
python3 - "$T/ok.jsonl" <<'PY'
import json, sys
vals = [{"a": [1, -2.5e-3, True, False, None, "\u00e9\u4e2d\U0001f600", {"b": {}}, []]}, "s\\\"\n\t\u0001",
        0, -0.0, 1e400 if False else 12345678901234567890, [], {}, "", [[[[[]]]]]]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for v in vals:
        f.write(json.dumps(v, ensure_ascii=False) + "\n")
    f.write("\n")
    f.write('  {"crlf": 1}  \r\n')
PY
j=$("$FERRY" pack -q --json -o "$T/ok" "$T/ok.jsonl" 2>"$T/err"); r=$?
check "valid JSON Lines pack ($r: $(cat "$T/err"))" '[ $r = 0 ] && [[ "$j" == *"\"samples\": 10"* ]]'
if [ $fail = 0 ]; then echo "test_pack_refuse: passed"; fi
exit $fail
