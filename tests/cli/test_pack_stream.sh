#!/usr/bin/env bash
# ferry pack streams its inputs (issue 21, item 3): 5,000 small .npy files pack under `ulimit -n 256`
# (one input open at a time per thread; it used to open every input at once and fail with "Too many
# open files"), and the shards hold exactly the inputs' data in name order; --format megatron creates
# the output's missing directories (mkdir -p) and never writes through a symlink planted at OUT.bin.
set -u
FERRY=${1:?usage: test_pack_stream.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_stream.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
# 5,000 1-D uint16 .npy files in 10 directories; $T/expect is their data, in the order pack walks them
python3 - "$T/in" "$T/expect" <<'PY'
import os, struct, sys
root, expect = sys.argv[1], sys.argv[2]
with open(expect, "wb") as ex:
    for d in range(10):
        os.makedirs(f"{root}/d{d}")
        for i in range(500):
            n = (d * 500 + i) % 7 + 1
            data = struct.pack(f"<{n}H", *[(d * 500 + i + k) & 0xFFFF for k in range(n)])
            header = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % n
            header += " " * (63 - (10 + len(header)) % 64) + "\n"
            with open(f"{root}/d{d}/f{i:04d}.npy", "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
            ex.write(data)
PY
(ulimit -n 256 && "$FERRY" pack -q --json -o "$T/out" "$T/in") >"$T/json" 2>"$T/err"; r=$?
check "5,000 files under ulimit -n 256 pack (rc $r: $(head -c 300 "$T/err"))" '[ $r = 0 ]'
check "5,000 samples of uint16 from 5,000 inputs ($(cat "$T/json"))" \
	'grep -q "\"samples\": 5000, " "$T/json" && grep -q "\"dtype\": \"uint16\"" "$T/json" && grep -q "\"inputs\": 5000, " "$T/json"'
cat "$T"/out/shard-*.fsh >"$T/got" 2>/dev/null
check "the shards hold the inputs' data in name order ($(stat -c %s "$T/got") vs $(stat -c %s "$T/expect") bytes)" \
	'cmp -s "$T/got" "$T/expect"'
# a limit too small even for one input at a time is an error that says which limit
(ulimit -n 5 && "$FERRY" pack -q -o "$T/out5" "$T/in") >/dev/null 2>"$T/err5"; r=$?
check "an open-file limit of 5 fails naming ulimit -n (rc $r: $(head -c 300 "$T/err5"))" \
	'[ $r = 1 ] && grep -q "ulimit -n" "$T/err5"'
# megatron: the prefix's directories are created; a symlink planted at OUT.bin is not followed
echo precious >"$T/victim"
"$FERRY" pack -q --format megatron -o "$T/new/a/b/m" "$T/in/d0" >/dev/null 2>"$T/err"; r=$?
check "megatron creates the missing directories (rc $r: $(cat "$T/err"))" \
	'[ $r = 0 ] && [ -f "$T/new/a/b/m.bin" ] && [ -f "$T/new/a/b/m.idx" ]'
mkdir -p "$T/trap" && ln -s "$T/victim" "$T/trap/m.bin" && ln -s "$T/victim" "$T/trap/m.idx"
"$FERRY" pack -q --format megatron -o "$T/trap/m" "$T/in/d1" >/dev/null 2>"$T/err"; r=$?
check "a symlink planted at OUT.bin/OUT.idx: its target untouched" '[ "$(cat "$T/victim")" = precious ]'
check "... and the link replaced by the output (rc $r: $(cat "$T/err"))" \
	'[ $r = 0 ] && [ ! -L "$T/trap/m.bin" ] && [ -f "$T/trap/m.bin" ] && [ ! -L "$T/trap/m.idx" ]'
"$FERRY" pack -q -o "$T/deep/er/ferry-out" "$T/in/d2" >/dev/null 2>"$T/err"; r=$?
check "ferry format creates the missing directories (rc $r: $(cat "$T/err"))" '[ $r = 0 ] && [ -f "$T/deep/er/ferry-out/ferry.idx" ]'
: >"$T/file"
"$FERRY" pack -q -o "$T/file/x/out" "$T/in/d2" >/dev/null 2>"$T/err"; r=$?
check "a file in the way of the output's directories is an error naming it (rc $r: $(cat "$T/err"))" \
	'[ $r = 1 ] && grep -q "file" "$T/err"'
if [ $fail = 0 ]; then echo "test_pack_stream: passed"; fi
exit $fail
