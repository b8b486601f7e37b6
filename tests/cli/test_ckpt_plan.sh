#!/usr/bin/env bash
# ferry ckpt plan: the table and --json against values worked by hand, --from-bench, usage errors.
set -u
FERRY=${1:?usage: test_ckpt_plan.sh path/to/ferry}
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/cli-ckpt-plan.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
check() { # description, command...
	local what=$1; shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fail=1; fi
}
# By hand: M = 5000 h * 3600 / 100 = 180,000 s; C = 60, R = 300.
# Young sqrt(2*60*180000) = 4647.58; saves 60/4647.58 = 1.291 %;
# failures (4647.58 + 60)/360000 + 300/180000 = 1.3077 % + 0.1667 % = 1.474 %; total 2.765 %.
# Current 3600: saves 60/3600 = 1.667 %; failures 3660/360000 + 0.1667 % = 1.0167 + 0.1667 = 1.183 %;
# total 2.850 %. Daly: 4607.67 (tests/unit/test_ckpt_plan.c works it).
# Async, B = 5, S = 60: Young sqrt(2*5*180000) = 1341.6; 5/1341.6 = 0.373 %;
# (1341.6 + 60)/360000 + 0.1667 % = 0.3893 + 0.1667 = 0.556 %; total 0.929 %.
"$FERRY" ckpt plan --save-s 60 --restart-s 300 --mtbf-h 5000 --nodes 100 --interval-s 3600 \
	--async-blocked-s 5 >"$T/t.txt" 2>&1
check "exit 0" test $? = 0
check "job MTBF 50 h" grep -q 'job MTBF M = 50 h (5000 h per node / 100 nodes)' "$T/t.txt"
check "young row" grep -Eq '^young +sync +4647\.6 +1\.291 +1\.474 +2\.765 ' "$T/t.txt"
check "daly row" grep -Eq '^daly +sync +4607\.7 ' "$T/t.txt"
check "current row" grep -Eq '^current +sync +3600\.0 +1\.667 +1\.183 +2\.850 ' "$T/t.txt"
check "async young row" grep -Eq '^young +async +1341\.6 +0\.373 +0\.556 +0\.929 ' "$T/t.txt"
# Async with the interval below the save's duration: B = 1, S = 60, M = 180000:
# with --mtbf-h 0.005 --nodes 1 (M = 18 s) sqrt(2*1*18) = 6 < 60: raised to 60.
"$FERRY" ckpt plan --save-s 60 --restart-s 0 --mtbf-h 0.005 --nodes 1 --async-blocked-s 1 >"$T/r.txt" 2>&1
check "async interval raised to the save's duration" grep -Eq "^young +async +60\.0 .*raised to the save's duration" "$T/r.txt"
# Daly with C >= 2M: C = 60, M = 18 -> tau = M = 18.
check "daly C >= 2M is M" grep -Eq '^daly +sync +18\.0 .*C >= 2M: M' "$T/r.txt"
check "C above M/10: the model is said to be rough" grep -q 'first-order model' "$T/r.txt"

"$FERRY" ckpt plan --save-s 60 --restart-s 300 --mtbf-h 5000 --nodes 100 --json >"$T/j.json"
check "--json" python3 - "$T/j.json" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1]))
rows = {(r["name"], r["mode"]): r for r in d["rows"]}
assert d["job_mtbf_s"] == 180000, d
y = rows[("young", "sync")]
assert abs(y["interval_s"] - math.sqrt(2 * 60 * 180000)) < 0.01, y
assert abs(y["lost_total"] - 0.0276532) < 1e-6, y
assert abs(rows[("daly", "sync")]["interval_s"] - 4607.67) < 0.01, rows
assert ("current", "sync") not in rows
PY
# --from-bench: save_s 2, async blocked 0.5, async total 3; M = 10 h * 3600 / 1 = 36000.
# Young sqrt(2*2*36000) = 379.5; async sqrt(2*0.5*36000) = 189.7.
printf '{"bytes":1000,"save_s":2.0000,"async_blocked_s":0.5000,"async_total_s":3.0000,"load_chunks":{"all":1}}\n' >"$T/b.json"
"$FERRY" ckpt plan --from-bench "$T/b.json" --restart-s 60 --mtbf-h 10 --nodes 1 >"$T/b.txt" 2>&1
check "--from-bench: C from save_s" grep -Eq '^young +sync +379\.5 ' "$T/b.txt"
check "--from-bench: async from async_blocked_s" grep -Eq '^young +async +189\.7 ' "$T/b.txt"
check "--from-bench: S from async_total_s" grep -q 'save lasts S = 3 s' "$T/b.txt"
printf '{"bytes":1000}\n' >"$T/bad.json"
"$FERRY" ckpt plan --from-bench "$T/bad.json" --restart-s 60 --mtbf-h 10 --nodes 1 >"$T/e.txt" 2>&1
check "--from-bench without save_s: exit 1" test $? = 1
check "--from-bench without save_s: says so" grep -q 'bad.json: field "save_s" is missing' "$T/e.txt"
"$FERRY" ckpt plan --save-s 1 --from-bench "$T/b.json" --restart-s 60 --mtbf-h 10 --nodes 1 >/dev/null 2>&1
check "both --save-s and --from-bench: exit 2" test $? = 2
"$FERRY" ckpt plan --save-s 1 --restart-s 60 --mtbf-h 10 >/dev/null 2>&1
check "--nodes missing: exit 2" test $? = 2
exit $fail
