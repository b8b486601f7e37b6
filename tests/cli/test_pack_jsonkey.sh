#!/usr/bin/env bash
# ferry pack --json-key (issue 21, item 3): JSON Lines as users have them. A string member packs as
# its decoded UTF-8 bytes (escapes, \u, surrogate pairs; invalid ones refused), an array member as
# token ids of --dtype (range-checked); a line without the member, of the wrong type or with a bad
# id is an error naming file, line (and value), or with --skip-bad is skipped and counted per reason
# in the summary (--json too). Progress goes to stderr on a terminal only, never with -q.
set -u
FERRY=${1:?usage: test_pack_jsonkey.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_jsonkey.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
# text.jsonl: every kind of escape; expect.bin: the decoded strings; sizes: their byte lengths
python3 - "$T" <<'PY'
import json, sys
T = sys.argv[1]
texts = ["plain", "", "line\nbreak \"quoted\" back\\slash /\t\b\f\r", "\u00e9t\u00e9 \u4e2d\u6587",
         "emoji \U0001F600 and \U0010FFFF", "\u0000nul inside", "x" * 5000]
with open(f"{T}/text.jsonl", "w") as f:
    for i, t in enumerate(texts):
        # ensure_ascii: \uXXXX escapes and surrogate pairs; every other line written as is
        f.write(json.dumps({"id": i, "meta": {"text": "not this one"}, "text": t}, ensure_ascii=i % 2 == 0) + "\n")
    f.write("\n")
with open(f"{T}/expect.bin", "wb") as f:
    f.write(b"".join(t.encode() for t in texts))
with open(f"{T}/sizes", "w") as f:
    f.write(" ".join(str(len(t.encode())) for t in texts))
with open(f"{T}/tokens.jsonl", "w") as f:
    f.write('{"tokens": [0, 1, 65535]}\n{"tokens": []}\n{"text": "x", "tokens": [128000, 7]}\n')
PY
# sizes of a Megatron .idx (int32 after the 34-byte header), to check each sample's length
sizes() { python3 -c "import struct,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack_from('<Q',b,18)[0]; print(*struct.unpack_from('<%di'%n,b,34))" "$1"; }
tokens() { python3 -c "import array,sys; a=array.array(sys.argv[2]); a.frombytes(open(sys.argv[1],'rb').read()); print(*a)" "$@"; }

"$FERRY" pack -q --json --json-key text -o "$T/t" "$T/text.jsonl" >"$T/json" 2>"$T/err"; r=$?
check "--json-key text packs (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && grep -q "\"samples\": 7, " "$T/json" && grep -q "\"blank_lines\": 1, " "$T/json"'
cat "$T"/t/shard-*.fsh >"$T/got" 2>/dev/null
check "the decoded strings, byte for byte" 'cmp -s "$T/got" "$T/expect.bin"'
"$FERRY" pack -q --format megatron --json-key text -o "$T/tm" "$T/text.jsonl" >/dev/null 2>"$T/err"
check "each sample is one string ($(sizes "$T/tm.idx") vs $(cat "$T/sizes"))" '[ "$(sizes "$T/tm.idx")" = "$(cat "$T/sizes")" ]'
check "megatron data too" 'cmp -s "$T/tm.bin" "$T/expect.bin"'

# with --json-key every input is JSON Lines, whatever its name (not one sample of the whole file)
cp "$T/text.jsonl" "$T/text.ndjson"
"$FERRY" pack -q --json --json-key text -o "$T/nd" "$T/text.ndjson" >"$T/json" 2>"$T/err"; r=$?
check "a .ndjson file is read as JSON Lines (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && grep -q "\"samples\": 7, " "$T/json"'
printf 'not json\n' >"$T/README"
"$FERRY" pack -q --json-key text -o "$T/rd" "$T/README" >/dev/null 2>"$T/err"; r=$?
check "a file that is not JSON Lines is refused, not packed whole (rc $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -qF "$T/README:1" "$T/err"'

# invalid escapes are refused, naming the line
bad() { # name, line text, words...
	local name=$1 line=$2; shift 2
	printf '{"text": "ok"}\n%s\n' "$line" >"$T/bad.jsonl"
	"$FERRY" pack -q --json-key text -o "$T/bad-$RANDOM" "$T/bad.jsonl" >/dev/null 2>"$T/err"; local r=$?
	check "$name: refused (rc $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -qF "$T/bad.jsonl:2" "$T/err"'
	for w in "$@"; do check "$name: names '$w' ($(cat "$T/err"))" 'grep -qF -- "$w" "$T/err"'; done
}
bad "lone high surrogate" '{"text": "a\ud800b"}' surrogate
bad "lone low surrogate" '{"text": "\udc00"}' surrogate
bad "high surrogate then not a low one" '{"text": "\ud800\u0041"}' surrogate
bad "unknown escape" '{"text": "\x41"}' escape
bad "short \\u" '{"text": "\u12"}' escape
bad "no such member" '{"txt": "a"}' 'no member "text"'
bad "not an object" '["text"]' 'no member "text"'
bad "not a string" '{"text": ["a"]}' "not a string"

# token ids
"$FERRY" pack -q --json-key tokens --dtype uint16 -o "$T/k16" "$T/tokens.jsonl" >/dev/null 2>"$T/err"; r=$?
check "an id above uint16 is refused naming file, line and value (rc $r: $(cat "$T/err"))" \
	'[ $r = 1 ] && grep -qF "$T/tokens.jsonl:3" "$T/err" && grep -qF 128000 "$T/err" && grep -qF -- --skip-bad "$T/err"'
"$FERRY" pack -q --json-key tokens --dtype int32 -o "$T/k32" "$T/tokens.jsonl" >/dev/null 2>"$T/err"; r=$?
check "int32 ids (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && [ "$(tokens "$T/k32/shard-00000.fsh" i)" = "0 1 65535 128000 7" ]'
"$FERRY" pack -q --format megatron --json-key tokens --dtype int64 -o "$T/k64" "$T/tokens.jsonl" >/dev/null 2>"$T/err"; r=$?
check "int64 ids into megatron, an empty array is an empty document (rc $r: $(cat "$T/err")) $(sizes "$T/k64.idx")" \
	'[ $r = 0 ] && [ "$(tokens "$T/k64.bin" q)" = "0 1 65535 128000 7" ] && [ "$(sizes "$T/k64.idx")" = "3 0 2" ]'
for v in -1 1.5 1e3 '"7"' 18446744073709551616 true; do
	printf '{"tokens": [1, %s]}\n' "$v" >"$T/v.jsonl"
	"$FERRY" pack -q --json-key tokens --dtype int64 -o "$T/v-$RANDOM" "$T/v.jsonl" >/dev/null 2>"$T/err"; r=$?
	w=$v; [[ $v == '"7"' || $v == true ]] && w="not a number"
	check "token id $v refused naming it (rc $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -qF "$T/v.jsonl:1" "$T/err" && grep -qF -- "$w" "$T/err"'
done
"$FERRY" pack -q --json-key tokens --dtype uint32 -o "$T/u32" "$T/tokens.jsonl" >/dev/null 2>"$T/err"; r=$?
check "a dtype datasets cannot hold is a usage error naming the ones they can (rc $r)" '[ $r = 2 ] && grep -q int32 "$T/err"'

# --skip-bad: skipped, counted per reason, the first named on stderr (not with -q)
printf '{"text": "a"}\n{"text": "\xff"}\n{"text": \n{"other": 1}\n{"text": 5}\n\n{"text": "b"}\n{"text": "c"}\n' >"$T/mixed.jsonl"
"$FERRY" pack -q --json-key text -o "$T/m0" "$T/mixed.jsonl" >/dev/null 2>"$T/err"; r=$?
check "without --skip-bad the first bad line fails the pack (rc $r)" '[ $r = 1 ] && grep -qF "$T/mixed.jsonl:2" "$T/err" && grep -q UTF-8 "$T/err"'
"$FERRY" pack --json --skip-bad --json-key text -o "$T/m1" "$T/mixed.jsonl" >"$T/json" 2>"$T/err"; r=$?
check "--skip-bad packs the good lines (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && [ "$(cat "$T"/m1/shard-*.fsh)" = abc ]'
check "--json counts each reason ($(cat "$T/json"))" \
	'grep -qF "\"samples\": 3, " "$T/json" && grep -qF "\"skipped_lines\": 4, " "$T/json" && grep -qF "\"skipped\": {\"utf8\": 1, \"json\": 1, \"no_key\": 1, \"type\": 1, \"range\": 0}" "$T/json" && grep -qF "\"blank_lines\": 1, " "$T/json"'
check "skipped lines are named on stderr" 'grep -qF "skipped $T/mixed.jsonl:4" "$T/err"'
"$FERRY" pack --skip-bad --json-key text -o "$T/m2" "$T/mixed.jsonl" >"$T/out" 2>/dev/null
check "the summary says what was skipped ($(cat "$T/out"))" \
	'grep -q "^packed 3 samples" "$T/out" && grep -q "^skipped 4 lines.*1 not UTF-8, 1 not one JSON value, 1 without the member, 1 of another type" "$T/out"'
"$FERRY" pack -q --skip-bad --json-key text -o "$T/m3" "$T/mixed.jsonl" >/dev/null 2>"$T/err"
check "-q: nothing on stderr ($(cat "$T/err"))" '[ ! -s "$T/err" ]'
printf '{"x": 1}\n' >"$T/nokey.jsonl"
"$FERRY" pack -q --skip-bad --json-key text -o "$T/m4" "$T/nokey.jsonl" >/dev/null 2>"$T/err"; r=$?
check "every line skipped: nothing to pack (rc $r)" '[ $r = 1 ] && grep -q "every line was skipped" "$T/err"'

# progress: on a terminal (script gives one), a progress line on stderr; not with -q
if command -v script >/dev/null; then
	script -qec "'$FERRY' pack --json-key text -o '$T/p1' '$T/text.jsonl'" /dev/null >"$T/tty" 2>&1
	check "a progress line on a terminal ($(head -c 300 "$T/tty" | od -c | head -3))" 'grep -aq "ferry pack: \[#*\] 100%" "$T/tty"'
	script -qec "'$FERRY' pack -q --json-key text -o '$T/p2' '$T/text.jsonl'" /dev/null >"$T/tty" 2>&1
	check "none with -q" '! grep -aq "ferry pack: \[" "$T/tty"'
else
	echo "skipped: the progress checks (no script(1) to give pack a terminal)"
fi
"$FERRY" pack --json-key text -o "$T/p3" "$T/text.jsonl" >/dev/null 2>"$T/err"
check "no progress when stderr is not a terminal, for a pack of less than 5 s ($(cat "$T/err"))" '[ ! -s "$T/err" ]'
if [ $fail = 0 ]; then echo "test_pack_jsonkey: passed"; fi
exit $fail
