#!/usr/bin/env python3
"""ferry top --json --count 3: three lines, each one JSON sample with the documented shape; and a
ferry publication written from here (the documented binary layout) shows up as a ferry row."""
import json
import os
import struct
import subprocess
import sys
import time

ferry = sys.argv[1]
run = os.path.join(os.environ.get("FERRY_TEST_TMPDIR", "/tmp"), "top-json-%d" % os.getpid())
os.makedirs(run, exist_ok=True)
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


from _top import publication

pubfile = os.path.join(run, "ferry-%d-0.stats" % os.getpid())
with open(pubfile, "wb") as f:
    f.write(publication(os.getpid(), "py-loader", "gds", [10 << 20, 0, 10, 0, 0, 0, 0]))
assert len(publication(1, "", "", [0] * 7)) == 192

env = dict(os.environ, FERRY_RUN_DIR=run)
p = subprocess.Popen([ferry, "top", "--json", "--count", "3", "-i", "0.3"], env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
# Grow the counters while top samples: 10 MiB more per 0.1 s.
for i in range(12):
    time.sleep(0.1)
    with open(pubfile, "r+b") as f:
        f.seek(136)
        f.write(struct.pack("<Q", (10 + 10 * (i + 1)) << 20))
out, err = p.communicate(timeout=30)
lines = [l for l in out.split("\n") if l]
if p.returncode != 0 or len(lines) != 3:
    fail("exit %d with %d lines (want 0 and 3); stderr: %s" % (p.returncode, len(lines), err))
rates = []
for l in lines:
    s = json.loads(l)
    for k in ("schema_version", "time", "interval_s", "cpu", "disk", "gpu", "ferry", "notes"):
        if k not in s:
            fail("sample lacks %s: %s" % (k, l[:200]))
    if not 0.2 < s["interval_s"] < 2:
        fail("interval_s %r for -i 0.3" % s["interval_s"])
    cpu = s["cpu"][0]
    if not (0 <= cpu["busy_pct"] <= 100 and 0 <= cpu["iowait_pct"] <= 100):
        fail("cpu out of range: %r" % cpu)
    for d in s["disk"]:
        for k in ("read_mbps", "write_mbps", "read_iops", "write_iops", "read_await_ms", "write_await_ms",
                  "queue_depth", "util_pct"):
            if not isinstance(d.get(k), (int, float)) or d[k] < 0:
                fail("disk %s: bad %s %r" % (d.get("name"), k, d.get(k)))
    if not s["gpu"] and not any("NVML" in n for n in s["notes"]):
        fail("no GPU rows and no note saying why: %r" % s["notes"])
    mine = [r for r in s["ferry"] if r["name"] == str(os.getpid())]
    if len(mine) != 1 or mine[0]["label"] != "py-loader" or mine[0]["path"] != "gds":
        fail("publication not shown as one ferry row: %r" % s["ferry"])
    else:
        rates.append(mine[0]["read_mbps"])
if not rates or max(rates) <= 0:
    fail("the publication's read rate never moved: %r" % rates)
os.unlink(pubfile)
os.rmdir(run)
u = subprocess.run([ferry, "top", "-i", "nope"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
if u.returncode != 2:
    fail("bad -i exit %d, expected 2" % u.returncode)
sys.exit(1 if failures else 0)
