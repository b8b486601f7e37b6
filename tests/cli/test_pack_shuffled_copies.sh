#!/usr/bin/env bash
# ferry pack --shuffled-copies N --seed S: N copies beside the shards, each holding every sample once
# (a permutation of the shards' bytes), the same for the same seed, another for another seed;
# ferry.copies written, and removed by a later pack without copies; refused for Megatron output.
set -u
FERRY=${1:?usage: test_pack_shuffled_copies.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}"
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_shuffled_copies.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
mkdir -p "$T/in"
for c in a b c d e f g h i j k l m n o p q r s t; do printf '%s' "$c" >"$T/in/$c"; done
sorted() { fold -w1 | sort | tr -d '\n'; }
j=$("$FERRY" pack -q --json --shuffled-copies 3 --seed 7 --shard-size 8 -o "$T/o" "$T/in")
check "json" '[[ "$j" == *"\"shuffled_copies\": 3"* && "$j" == *"\"samples\": 20"* ]]'
check "sidecar" '[ "$(head -c 8 "$T/o/ferry.copies")" = FERRYCPY ]'
orig=$(cat "$T"/o/shard-*.fsh)
check "shards as before" '[ "$orig" = abcdefghijklmnopqrst ]'
for c in 000 001 002; do
	check "copy $c split like the shards" '[ "$(ls "$T/o" | grep -c "^copy-$c-shard-")" = 3 ]'
	check "copy $c holds every sample once" '[ "$(cat "$T"/o/copy-$c-shard-*.fsh | sorted)" = "$orig" ]'
done
c0=$(cat "$T"/o/copy-000-shard-*.fsh); c1=$(cat "$T"/o/copy-001-shard-*.fsh)
check "shuffled" '[ "$c0" != "$orig" ] && [ "$c0" != "$c1" ]'
"$FERRY" pack -q --shuffled-copies 1 --seed 7 -o "$T/same" "$T/in" >/dev/null
check "same seed, same order" '[ "$(cat "$T"/same/copy-000-shard-*.fsh)" = "$c0" ]'
"$FERRY" pack -q --shuffled-copies 1 --seed 8 -o "$T/other" "$T/in" >/dev/null
check "another seed, another order" '[ "$(cat "$T"/other/copy-000-shard-*.fsh)" != "$c0" ]'
"$FERRY" pack -q -o "$T/o" "$T/in" >/dev/null
check "a pack without copies removes ferry.copies" '[ ! -e "$T/o/ferry.copies" ] && [ -f "$T/o/ferry.idx" ]'
"$FERRY" pack -q --format megatron --shuffled-copies 2 -o "$T/m" "$T/in" >/dev/null 2>&1
check "megatron refused (usage)" '[ $? = 2 ] && [ ! -e "$T/m.idx" ]'
"$FERRY" pack -q --shuffled-copies 0 -o "$T/z" "$T/in" >/dev/null 2>&1
check "zero copies refused (usage)" '[ $? = 2 ]'
exit $fail
