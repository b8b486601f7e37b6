#!/usr/bin/env bash
# ferry ckpt inspect | verify | bench: output, exit codes, a corrupted byte caught, bad headers refused.
set -u
FERRY=${1:?usage: test_ckpt.sh path/to/ferry}
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/cli-ckpt.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
check() { # description, command...
	local what=$1; shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fail=1; fi
}
"$FERRY" ckpt bench --host --size 64m --dir "$T" --keep >"$T/bench.txt" 2>&1
check "bench runs and prints TABLE lines" grep -q '^TABLE ferry load host warm | ' "$T/bench.txt"
F=$(ls "$T"/ferry-ckpt-bench-*.safetensors)
check "inspect lists tensors" bash -c "'$FERRY' ckpt inspect '$F' | grep -q 'model.layers.0.mlp.down_proj.weight *BF16 *\[2560, 9728\]'"
check "inspect --json is JSON" bash -c "'$FERRY' ckpt inspect --json '$F' | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[\"files\"][0][\"data_start\"] % 4096 == 0'"
check "verify passes" bash -c "'$FERRY' ckpt verify '$F' | grep -q 'tensors verified, 0 without checksum, 0 failed'"
python3 - "$F" <<'PY'
import sys
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(-100, 2); b = f.read(1); f.seek(-100, 2); f.write(bytes([b[0] ^ 1]))
PY
"$FERRY" ckpt verify "$F" >"$T/v.txt" 2>&1
check "verify fails (exit 1) on a flipped byte" test $? = 1
check "verify names the tensor and xxh3" grep -q 'model.norm.weight.*xxh3' "$T/v.txt"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a/b":1}       ' >"$T/bad.safetensors"
"$FERRY" ckpt inspect "$T/bad.safetensors" >"$T/b.txt" 2>&1
check "bad header: exit 1" test $? = 1
check "bad header: file, byte and reason" grep -q 'bad.safetensors: safetensors byte 9: tensor "a/b": tensor name holds a path separator' "$T/b.txt"
"$FERRY" ckpt frobnicate >/dev/null 2>&1
check "unknown subcommand: exit 2" test $? = 2
exit $fail
