#!/usr/bin/env python3
"""ferry top removes the stats file of a dead process that the calling user owns (one left by a
SIGKILL), keeps the file of a live process (shown as a row), and leaves alone a dead process's file
of another user (tried only as root, which can chown one)."""
import json
import os
import subprocess
import sys

ferry = sys.argv[1]
run = os.path.join(os.environ.get("FERRY_TEST_TMPDIR", "/tmp"), "top-stale-%d" % os.getpid())
os.makedirs(run, mode=0o700, exist_ok=True)
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


from _top import publication

def put(name, pid):
    path = os.path.join(run, name)
    with open(path, "wb") as f:
        f.write(publication(pid, "t"))
    os.chmod(path, 0o600)
    return path

# A pid that has exited: a child we waited for (its pid is free until reused, which the check
# below would show as a live row rather than a false pass).
child = subprocess.Popen(["true"])
child.wait()
dead = child.pid
stale = put("ferry-%d-0123456789abcdef.stats" % dead, dead)
live = put("ferry-%d-fedcba9876543210.stats" % os.getpid(), os.getpid())
other = None
if os.geteuid() == 0:
    other = put("ferry-%d-00112233445566aa.stats" % dead, dead)
    os.chown(other, 65534, 65534)

env = dict(os.environ, FERRY_RUN_DIR=run)
p = subprocess.run([ferry, "top", "--json", "--count", "1"], env=env, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, timeout=30)
if p.returncode != 0:
    fail("ferry top exit %d: %s" % (p.returncode, p.stderr))
else:
    s = json.loads(p.stdout.split("\n")[0])
    if [r["name"] for r in s["ferry"]] != [str(os.getpid())]:
        fail("ferry rows %r, want only this process" % s["ferry"])
if os.path.exists(stale):
    fail("the dead process's own file %s was not removed" % stale)
if not os.path.exists(live):
    fail("the live process's file %s was removed" % live)
if other is not None and not os.path.exists(other):
    fail("another user's file %s was removed" % other)
if other is None:
    print("note: another user's file not tried (needs root to chown)")
for f in os.listdir(run):
    os.unlink(os.path.join(run, f))
os.rmdir(run)
sys.exit(1 if failures else 0)
