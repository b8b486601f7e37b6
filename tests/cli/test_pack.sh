#!/usr/bin/env bash
# ferry pack: files, JSON Lines, .npy (if numpy) and raw tokens into ferry shards and Megatron
# .bin/.idx; summary and JSON; usage errors; the published index opens (loader-bench reads it).
set -u
FERRY=${1:?usage: test_pack.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
mkdir -p "$T/in/sub"
printf 'alpha' >"$T/in/a"; printf 'beta-beta' >"$T/in/sub/b"; printf '' >"$T/in/empty"
printf '{"x": 1}\n{"x": 22}\n\n{"x": 333}' >"$T/d.jsonl"
out=$("$FERRY" pack -q -o "$T/o1" "$T/in" "$T/d.jsonl" --keys --shard-size 8)
check "summary" '[[ "$out" == "packed 6 samples"* ]]'
check "index" '[ -f "$T/o1/ferry.idx" ] && [ ! -e "$T/o1/ferry.idx.tmp" ]'
check "small shards" '[ "$(ls "$T/o1" | grep -c shard-)" -ge 4 ]'
check "concatenated bytes" '[ "$(cat "$T"/o1/shard-*.fsh)" = "alphabeta-beta{\"x\": 1}{\"x\": 22}{\"x\": 333}" ]'
j=$("$FERRY" pack -q --json -o "$T/o2" "$T/in")
check "json" '[[ "$j" == *"\"samples\": 3"* && "$j" == *"\"bytes\": 14"* && "$j" == *"\"format\": \"ferry\""* ]]'
# raw uint16 tokens, two files, into Megatron
python3 -c "import sys; sys.stdout.buffer.write(bytes(range(200)))" >"$T/t1.bin"
python3 -c "import sys; sys.stdout.buffer.write(bytes(range(100)))" >"$T/t2.bin"
j=$("$FERRY" pack -q --json --format megatron --input raw --dtype uint16 -o "$T/m" "$T/t1.bin" "$T/t2.bin")
check "megatron json" '[[ "$j" == *"\"samples\": 2"* && "$j" == *"\"dtype\": \"uint16\""* ]]'
check "megatron files" '[ -f "$T/m.idx" ] && [ -f "$T/m.bin" ] && [ "$(head -c 7 "$T/m.idx")" = MMIDIDX ]'
check "megatron size" '[ "$(stat -c %s "$T/m.idx")" = $((34 + 2*12 + 3*8)) ]'
check "loader reads it" '"$FERRY" loader-bench "$T/m" --batch-size 1 --seq-len 10 --seconds 0.2 | grep -q "TABLE ferry samples/s"'
# errors
"$FERRY" pack -o "$T/x" >/dev/null 2>&1; check "no input: usage" '[ $? = 2 ]'
"$FERRY" pack -q --input raw -o "$T/x" "$T/in/a" >/dev/null 2>&1; check "raw without dtype" '[ $? = 2 ]'
"$FERRY" pack -q --input raw --dtype int32 -o "$T/x" "$T/in/a" 2>"$T/err" >/dev/null; r=$?
check "raw not whole elements" '[ $r = 1 ] && grep -q "whole number" "$T/err"'
"$FERRY" pack -q -o "$T/x" "$T/nope" 2>/dev/null; check "missing input" '[ $? = 1 ]'
"$FERRY" pack --bogus 2>/dev/null; check "unknown option" '[ $? = 2 ]'
if [ $fail = 0 ]; then echo "test_pack: 13 passed, 0 failed"; fi
exit $fail
