#!/usr/bin/env python3
"""ferry doctor on damaged copies of the fixture trees: files deleted, emptied, filled with junk,
turned into directories, FIFOs or dangling links. The doctor must neither crash nor hang, must
print valid JSON, and every unknown must say why. Seeded, bounded: 60 rounds per fixture."""
import json
import os
import random
import shutil
import subprocess
import sys

ferry = sys.argv[1]
src = os.environ.get("FERRY_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
fixtures = os.path.join(src, "tests", "fixtures", "sys")
tmp = os.path.join(os.environ.get("FERRY_TEST_TMPDIR", "/tmp"), "doctor-damaged-%d" % os.getpid())
rng = random.Random(int(os.environ.get("FERRY_TEST_SEED", "7")))
failures = 0
JUNK = [b"", b"\n", b"-1\n", b"99999999999999999999999999\n", b"[[[[", b"\xff\xfe\x00abc",
        b"none [", b"Unknown\n", b"x" * 70000, b"0x\n", b"1 2 3 4\n", b"\"allow_compat_mode\": "]

env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
rounds = 0
for name in sorted(os.listdir(fixtures)):
    base = os.path.join(fixtures, name)
    if not os.path.isdir(base):
        continue
    with open(os.path.join(base, "paths")) as f:
        paths = [p for p in f.read().split("\n") if p]
    for r in range(60):
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base, tmp, symlinks=True)
        entries = []
        for d, dirs, files in os.walk(tmp):
            for e in dirs + files:
                entries.append(os.path.join(d, e))
        victims = rng.sample(entries, min(len(entries), rng.randint(1, 8)))
        for v in victims:
            if not os.path.lexists(v):
                continue
            how = rng.choice(["delete", "junk", "dir", "fifo", "dangling"])
            if os.path.isdir(v) and not os.path.islink(v):
                shutil.rmtree(v)
            else:
                os.unlink(v)
            if how == "junk":
                with open(v, "wb") as f:
                    f.write(rng.choice(JUNK))
            elif how == "dir":
                os.mkdir(v)
            elif how == "fifo":
                os.mkfifo(v)
            elif how == "dangling":
                os.symlink("../../nowhere/" + os.path.basename(v), v)
        try:
            p = subprocess.run([ferry, "doctor", "--json", "--root", tmp] + paths, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        except subprocess.TimeoutExpired:
            failures += 1
            print("FAIL: %s round %d hung (damaged: %s)" % (name, r, victims), file=sys.stderr)
            continue
        rounds += 1
        if p.returncode not in (0, 1):
            failures += 1
            print("FAIL: %s round %d: exit %d, stderr %s (damaged: %s)" % (name, r, p.returncode,
                  p.stderr[-500:], victims), file=sys.stderr)
            continue
        try:
            doc = json.loads(p.stdout)
        except ValueError as e:
            failures += 1
            print("FAIL: %s round %d: bad JSON (%s)" % (name, r, e), file=sys.stderr)
            continue
        for c in doc["checks"]:
            if c["verdict"] not in ("ok", "warn", "fail", "unknown"):
                failures += 1
                print("FAIL: %s: bad verdict %r" % (name, c), file=sys.stderr)
            if c["verdict"] == "unknown" and not c["value"].strip():
                failures += 1
                print("FAIL: %s: unknown without reason %r" % (name, c), file=sys.stderr)
shutil.rmtree(tmp, ignore_errors=True)
print("%d damaged trees checked" % rounds)
sys.exit(1 if failures or rounds == 0 else 0)
