#!/usr/bin/env python3
"""ferry doctor against the fixture trees in tests/fixtures/sys: each must produce exactly the
checks (id, subject) listed in its `expected` file, with the verdicts listed there (and, where a
fourth column is given, a value containing that text). Usage: test_doctor_fixtures.py FERRY_BINARY"""
import json
import os
import subprocess
import sys

ferry = sys.argv[1]
src = os.environ.get("FERRY_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
fixtures = os.path.join(src, "tests", "fixtures", "sys")
WANT = {"nvme-bad-scheduler", "raid0-two-nvme", "gpu-x8-link", "nfs-small-rsize", "vm-no-udev"}
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


found = {d for d in os.listdir(fixtures) if os.path.isdir(os.path.join(fixtures, d))}
if not WANT <= found:
    fail("fixtures missing: %s" % sorted(WANT - found))

for name in sorted(found):
    root = os.path.join(fixtures, name)
    with open(os.path.join(root, "paths")) as f:
        paths = [p for p in f.read().split("\n") if p]
    expected = {}
    with open(os.path.join(root, "expected")) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            cols = line.split("\t")
            assert len(cols) in (3, 4), "%s/expected: bad line %r" % (name, line)
            expected[(cols[0], cols[1])] = (cols[2], cols[3] if len(cols) == 4 else None)
    # A clean environment: no root variables from the caller leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    p = subprocess.run([ferry, "doctor", "--json", "--root", root] + paths, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        fail("%s: output is not JSON (%s): %r" % (name, e, p.stdout[:300]))
        continue
    if doc.get("schema_version") != 1 or doc.get("host", {}).get("mode") != "fixture":
        fail("%s: schema_version/mode wrong: %r" % (name, {k: doc.get(k) for k in ("schema_version", "host")}))
    got = {}
    for c in doc["checks"]:
        for k in ("id", "subject", "verdict", "value", "expected", "source", "fix"):
            if not isinstance(c.get(k), str):
                fail("%s: check %r lacks string field %s" % (name, c, k))
        if c["verdict"] == "unknown" and not c["value"]:
            fail("%s: unknown without a reason: %r" % (name, c))
        if c["verdict"] in ("warn", "fail") and not c["fix"]:
            fail("%s: %s %s has no fix" % (name, c["verdict"], c["id"]))
        got[(c["id"], c["subject"])] = c
    for key, (verdict, text) in expected.items():
        c = got.get(key)
        if c is None:
            fail("%s: missing check %s on %r" % (name, key[0], key[1]))
            continue
        if c["verdict"] != verdict:
            fail("%s: %s on %r: verdict %r, expected %r (value: %s)" % (name, key[0], key[1], c["verdict"],
                                                                       verdict, c["value"]))
        if text and text not in c["value"]:
            fail("%s: %s on %r: value %r lacks %r" % (name, key[0], key[1], c["value"], text))
    for key in sorted(set(got) - set(expected)):
        fail("%s: unexpected check %s on %r (%s: %s)" % (name, key[0], key[1], got[key]["verdict"],
                                                         got[key]["value"]))
    any_fail = any(v == "fail" for v, _ in expected.values())
    if p.returncode != (1 if any_fail else 0):
        fail("%s: exit status %d, expected %d" % (name, p.returncode, 1 if any_fail else 0))
    # The table names every subject and the summary adds up.
    t = subprocess.run([ferry, "doctor", "--no-color", "--root", root] + paths, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, text=True)
    if "\033[" in t.stdout:
        fail("%s: colour codes with --no-color" % name)
    for (_, subj) in expected:
        if ("\n" + subj + "\n") not in t.stdout:
            fail("%s: table lacks subject heading %r" % (name, subj))
    if ("%d checks:" % len(got)) not in t.stdout:
        fail("%s: table summary does not count %d checks" % (name, len(got)))
    print("%s: %d checks compared" % (name, len(got)))

# Usage errors exit 2.
u = subprocess.run([ferry, "doctor", "--bogus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
if u.returncode != 2:
    fail("usage error exit status %d, expected 2" % u.returncode)
sys.exit(1 if failures else 0)
