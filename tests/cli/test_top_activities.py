#!/usr/bin/env python3
"""ferry top --json shows what a ferry process is doing (issue 21 item 7): a Python process running
ferry.Loader with FERRY_PUBLISH=1 appears as a ferry row with a "loader" activity whose samples
grow, and one saving checkpoints in a loop with a "save" activity (step, bytes, phase).

The processes import the installed package: $FERRY_PYTHON (default: the repository's
.venv/bin/python, else this interpreter) with the caller's PYTHONPATH, e.g.
PYTHONPATH=/tmp/me-py ctest -R top_activities. Where ferry, numpy or torch cannot be imported the
test says skipped, and why (exit 77); likewise when neither FERRY_PYTHON nor PYTHONPATH names the
package and the default one is older than the library's sources (a stale `pip install`: CI's
ctest runs before it reinstalls; tests/python/test_top_activities.py runs this file afterwards,
against the package just installed)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ferry = sys.argv[1]
src = os.environ.get("FERRY_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
python = os.environ.get("FERRY_PYTHON") or os.path.join(src, ".venv", "bin", "python")
if not os.access(python, os.X_OK):
    python = sys.executable
tmp = tempfile.mkdtemp(prefix="cli-top-activities.", dir=os.environ.get("FERRY_TEST_TMPDIR", "/tmp"))
run = os.path.join(tmp, "run")
os.mkdir(run, 0o700)
env = dict(os.environ, FERRY_RUN_DIR=run, FERRY_PUBLISH="1")
failures = 0

probe = subprocess.run([python, "-c", "import ferry, ferry.checkpoint, numpy, torch; print(ferry.__file__)"], env=env,
                       capture_output=True, text=True)
if probe.returncode != 0:
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    print("skipped: the ferry package (with numpy and torch) is not importable by %s: %s "
          "(install it and set PYTHONPATH, or FERRY_PYTHON)" % (python, last))
    shutil.rmtree(tmp)
    sys.exit(77)
print("package: %s" % probe.stdout.strip())
if not os.environ.get("FERRY_PYTHON") and not os.environ.get("PYTHONPATH"):
    pkg = os.path.dirname(probe.stdout.strip())
    built = max([os.path.getmtime(os.path.join(pkg, f)) for f in os.listdir(pkg) if f.endswith(".so")] or [0])
    newest = max(os.path.getmtime(os.path.join(dp, f)) for top in ("src", "include")
                 for dp, _, fs in os.walk(os.path.join(src, top)) for f in fs if f.endswith((".c", ".h")))
    if built < newest:
        print("skipped: the package at %s is older than the sources in %s (reinstall it, or name one with "
              "FERRY_PYTHON / PYTHONPATH)" % (pkg, src))
        shutil.rmtree(tmp)
        sys.exit(77)

CHILD = r"""
import os, sys, time
import numpy as np, torch, ferry, ferry.checkpoint
mode, d, stop = sys.argv[1:4]
if mode == "loader":
    ferry.write_dataset(d, [np.full(64, i % 251, dtype=np.uint8) for i in range(4096)])
    loader = ferry.Loader(d, batch_size=8, shuffle=False, threads=2)
    print("ready", flush=True)
    while not os.path.exists(stop):
        for batch in loader:
            time.sleep(0.01)
            if os.path.exists(stop):
                break
else:
    state = {"w": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(1000)}
    print("ready", flush=True)
    step = 0
    while not os.path.exists(stop):
        step += 1
        ferry.checkpoint.save(state, d, step, keep=2)
        time.sleep(0.05)
"""


def check(what, cond, detail=""):
    global failures
    if cond:
        print("ok: %s" % what)
    else:
        failures += 1
        print("FAILED: %s\n  %s" % (what, detail))


def watch(mode):
    """Runs the child, samples it with ferry top --json; returns the child's activities per sample."""
    stop = os.path.join(tmp, mode + ".stop")
    child = subprocess.Popen([python, "-c", CHILD, mode, os.path.join(tmp, mode), stop], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            check("%s child starts" % mode, False, child.stderr.read()[-2000:])
            return []
        p = subprocess.run([ferry, "top", "--json", "--count", "4", "-i", "0.3"], env=env, capture_output=True,
                           text=True, timeout=60)
        check("%s: ferry top --json exits 0" % mode, p.returncode == 0, p.stderr)
        samples = []
        for l in p.stdout.splitlines():
            rows = [r for r in json.loads(l)["ferry"] if r["name"] == str(child.pid)]
            samples.append([a for r in rows for a in r.get("activities", [])])
        return samples
    finally:
        open(stop, "w").close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


try:
    s = watch("loader")
    loaders = [[a for a in acts if a["kind"] == "loader"] for acts in s]
    check("the loader process shows a loader activity in every sample", s and all(len(x) == 1 for x in loaders),
          json.dumps(s)[:2000])
    if s and all(len(x) == 1 for x in loaders):
        counts = [x[0]["samples_total"] for x in loaders]
        check("its samples grow: %r" % counts, counts[-1] > counts[0] > 0, json.dumps(loaders[-1]))
        a = loaders[-1][0]
        check("with batches, rates, wait and threads", a["batches_total"] > 0 and a["samples_per_s"] > 0 and
              a["gbps"] >= 0 and 0 <= a["wait_pct"] <= 100 and a["threads"] == 2 and a["phase"] == "run" and
              a["name"].endswith("loader"), json.dumps(a))

    s = watch("save")
    saves = [[a for a in acts if a["kind"] == "save"] for acts in s]
    check("the saving process shows one save activity (in flight or last) per sample",
          s and all(len(x) == 1 for x in saves), json.dumps(s)[:2000])
    if s and all(len(x) == 1 for x in saves):
        steps = [x[0].get("step", -1) for x in saves]
        check("its step moves on: %r" % steps, steps[-1] > steps[0] >= 1, json.dumps(saves))
        a = saves[-1][0]
        check("with its bytes, tensors and phase", a["total_bytes"] > 4 << 20 and a["tensors"] >= 2 and
              a["phase"] in ("snapshot", "write", "sync", "commit", "done"), json.dumps(a))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
