#!/usr/bin/env bash
# ferry pack scans a JSON Lines file bigger than 32 MiB in parts, one thread each (--threads): the
# output and the index are those of a one-thread scan byte for byte, lines cut by a part boundary
# belong to one part only, and a refused or skipped line is named by its line number in the file
# (the parts before it counted), the skipped ones in file order.
set -u
FERRY=${1:?usage: test_pack_parts.sh path/to/ferry}
mkdir -p "${FERRY_TEST_TMPDIR:-/tmp}" # run alone (ctest -R), nothing else has made it
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/test_pack_parts.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
# ~40 MiB: lines of varying length (so boundaries fall anywhere), blank lines, and bad lines at
# known numbers in several parts; $T/bad: their line numbers
python3 - "$T" <<'PY'
import json, random, sys
T = sys.argv[1]
random.seed(7)
bad, n, size = [], 0, 0
with open(f"{T}/big.jsonl", "w") as f:
    while size < 40 << 20:
        n += 1
        if n % 9973 == 0:
            line, kind = ('{"text": ' if n % 2 else '{"txt": "x"}'), "bad"
            bad.append(n)
        elif n % 997 == 0:
            line = ""
        else:
            line = json.dumps({"id": n, "text": "w\u00e9\n" * random.randint(0, 120) + str(n)})
        f.write(line + "\n")
        size += len(line) + 1
with open(f"{T}/bad", "w") as f:
    f.write(" ".join(map(str, bad)))
PY
read -r -a bad <"$T/bad"
check "the file has bad lines in several parts (${#bad[@]})" '[ ${#bad[@]} -ge 5 ]'
"$FERRY" pack -q --threads 1 --skip-bad --json --json-key text -o "$T/one" "$T/big.jsonl" >"$T/j1" 2>"$T/err"; r=$?
check "one thread (rc $r: $(cat "$T/err"))" '[ $r = 0 ]'
"$FERRY" pack --threads 3 --skip-bad --json --json-key text -o "$T/three" "$T/big.jsonl" >"$T/j3" 2>"$T/err3"; r=$?
check "three threads (rc $r: $(grep -v skipped "$T/err3"))" '[ $r = 0 ]'
# the same summary but for the output's name and the timings (a sed of "one" also hit the name
# of a clone's directory, /tmp/ci-clone)
same_summary() {
	python3 - "$T/j1" "$T/j3" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
drop = ("output", "seconds", "scan_seconds", "copy_seconds", "bytes_per_s")
sys.exit(0 if {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop} else 1)
PY
}
check "same summary ($(cat "$T/j1") / $(cat "$T/j3"))" 'same_summary'
check "the same shards and index, byte for byte" \
	'cmp -s "$T/one/shard-00000.fsh" "$T/three/shard-00000.fsh" && cmp -s "$T/one/ferry.idx" "$T/three/ferry.idx"'
want=""; for b in "${bad[@]:0:5}"; do want+="$b "; done
got=$(sed -n 's/^ferry pack: skipped [^:]*:\([0-9]*\):.*/\1/p' "$T/err3" | tr '\n' ' ')
check "the first five skipped lines named in file order (want $want, got $got)" '[ "$got" = "$want" ]'
"$FERRY" pack -q --threads 3 --json-key text -o "$T/fail" "$T/big.jsonl" >/dev/null 2>"$T/err"; r=$?
check "without --skip-bad the first bad line, by its number in the file ($(cat "$T/err"))" \
	'[ $r = 1 ] && grep -qF "big.jsonl:${bad[0]}:" "$T/err" && [ "$(wc -l <"$T/err")" = 1 ]'
if [ $fail = 0 ]; then echo "test_pack_parts: passed"; fi
exit $fail
