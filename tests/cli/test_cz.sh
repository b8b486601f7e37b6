#!/usr/bin/env bash
# ferry cp --compress, ferry cp of a compressed file and ferry cz info (docs/FORMATS.md, issue 26):
# both codecs; the stock zstd -d / lz4 -d give the input back; ferry cp gives it back; cz info's
# JSON has the codec, ratio and chunks; a damaged chunk makes ferry cp exit 1 naming the chunk;
# a failed copy leaves nothing at DST.
set -u
FERRY=${1:?usage: test_cz.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}"
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_cz.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
for tool in zstd lz4 python3; do
	command -v $tool >/dev/null || { echo "skipped: $tool is not installed (apt-get install zstd lz4)"; exit 77; }
done
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
python3 -c '
import random, sys
random.seed(5)
w = ["the ", "of ", "ferry ", "moves ", "bytes ", "GPU ", "and ", "memory\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(150000)))
open(sys.argv[2], "wb").write(random.randbytes(300000))' "$T/text" "$T/rand"
for codec in zstd lz4; do
	"$FERRY" cp -q --compress $codec --chunk 64k "$T/text" "$T/text.$codec"
	check "$codec: cp --compress exits 0" '[ $? = 0 ]'
	$codec -d -q -c "$T/text.$codec" >"$T/stock.$codec"
	check "$codec: the stock $codec -d gives the input back" 'cmp -s "$T/stock.$codec" "$T/text"'
	"$FERRY" cp -q "$T/text.$codec" "$T/back.$codec"
	check "$codec: ferry cp of the compressed file gives the input back" 'cmp -s "$T/back.$codec" "$T/text"'
	"$FERRY" cz info --json "$T/text.$codec" >"$T/info.$codec"
	check "$codec: cz info --json ($(cat "$T/info.$codec"))" "python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d[\"codec\"] == \"$codec\" and d[\"bytes\"] == $(stat -c %s "$T/text") and d[\"chunk_size\"] == 65536
assert d[\"chunks\"] == ($(stat -c %s "$T/text") + 65535) // 65536 and d[\"stored_chunks\"] == 0
assert d[\"ratio\"] > 2 and abs(d[\"ratio\"] - d[\"bytes\"] / d[\"compressed_bytes\"]) < 1e-3' \"$T/info.$codec\""
	"$FERRY" cp -q --compress $codec "$T/rand" "$T/rand.$codec"
	"$FERRY" cz info --json "$T/rand.$codec" >"$T/rinfo.$codec"
	check "$codec: random bytes are stored ($(cat "$T/rinfo.$codec"))" "grep -q '\"stored_chunks\":1}' \"$T/rinfo.$codec\""
	$codec -d -q -c "$T/rand.$codec" | cmp -s - "$T/rand"
	check "$codec: the stock $codec -d gives stored chunks back" '[ ${PIPESTATUS[1]} = 0 ]'
	# a byte of chunk 1's frame flipped: the copy fails, names chunk 1, and leaves no DST
	python3 -c '
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
ioff = struct.unpack_from("<Q", b, len(b) - 80 + 32)[0]
c1 = struct.unpack_from("<Q", b, ioff + 24 + 48)[0]
b[c1 + 40] ^= 0x10
open(sys.argv[2], "wb").write(b)' "$T/text.$codec" "$T/bad.$codec"
	"$FERRY" cp -q "$T/bad.$codec" "$T/out.$codec" 2>"$T/err"; r=$?
	check "$codec: a damaged chunk: exit 1 (got $r)" '[ $r = 1 ]'
	check "$codec: the message names chunk 1 ($(cat "$T/err"))" 'grep -q "chunk 1 " "$T/err"'
	check "$codec: nothing left at DST ($(ls "$T"))" '! ls -a "$T" | grep -q "out\.$codec"'
done
"$FERRY" cz info "$T/text" 2>"$T/err"; r=$?
check "cz info of a plain file: exit 1, says so (got $r: $(cat "$T/err"))" '[ $r = 1 ] && grep -q "not a ferry compressed file" "$T/err"'
"$FERRY" cp --compress gzip "$T/text" "$T/x" 2>"$T/err"; r=$?
check "--compress gzip: a usage error (got $r)" '[ $r = 2 ]'
"$FERRY" cp -q "$T/text" "$T/plain"
check "cp of a plain local file copies it" 'cmp -s "$T/plain" "$T/text"'
# ferry pack --compress: each shard a compressed file whose bytes are the plain pack's shard
mkdir "$T/in" && for k in 1 2 3 4 5 6; do head -c 30000 "$T/text" >"$T/in/f$k"; done
"$FERRY" pack -q --shard-size 64k -o "$T/pplain" "$T/in" && "$FERRY" pack -q --shard-size 64k --compress zstd -o "$T/pcz" "$T/in"
check "pack --compress: exits 0 and writes the same shards" '[ "$(ls "$T/pplain")" = "$(ls "$T/pcz")" ]'
for s in "$T"/pplain/*.fsh; do
	b=$(basename "$s")
	zstd -d -q -c "$T/pcz/$b" | cmp -s - "$s"
	check "pack --compress: zstd -d of $b is the plain pack's $b" '[ ${PIPESTATUS[1]} = 0 ]'
done
"$FERRY" pack -q --compress zstd --format megatron -o "$T/m" "$T/in" 2>"$T/err"; r=$?
check "pack --compress --format megatron: a usage error (got $r)" '[ $r = 2 ]'
[ $fail = 0 ] && echo "test_cz: ok"
exit $fail
