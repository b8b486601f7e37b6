"""Helpers for the ferry bench CLI tests: exit 0 pass, 1 fail, 77 skipped (with a printed reason)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

FERRY = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "ferry"
failures = 0


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


def check(cond, what, got=None, expected=None):
    """Records a failure, printing both sides."""
    global failures
    if cond:
        return True
    failures += 1
    line = f"FAIL: {what}"
    if got is not None or expected is not None:
        line += f"\n  got:      {got!r}\n  expected: {expected!r}"
    print(line, flush=True)
    return False


def finish():
    if failures:
        print(f"{failures} check(s) failed")
        sys.exit(1)
    print("ok")
    sys.exit(0)


def scratch():
    base = os.environ.get("FERRY_TEST_TMPDIR") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix="bench-", dir=base)
    import atexit
    atexit.register(shutil.rmtree, d, True)
    return d


def run(*args, timeout=120):
    p = subprocess.run([FERRY, "bench", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def run_json(*args):
    rc, out, err = run(*args, "--output-format=json")
    if not check(rc == 0, f"ferry bench {' '.join(map(str, args))} exits 0", (rc, err), 0):
        return None
    return json.loads(out)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_random(path, nbytes):
    with open(path, "wb") as f:
        f.write(os.urandom(nbytes))


def engines(d):
    """The engines that run here; prints a skip line for each that does not."""
    probe = os.path.join(d, "engine-probe")
    write_random(probe, 1 << 20)
    found = []
    for e in ("psync", "io_uring"):
        rc, _, err = run("--filename", probe, "--ioengine", e, "--bs", "64k")
        if rc == 0:
            found.append(e)
        else:
            print(f"skipped: engine {e}: {err.strip()}")
    os.unlink(probe)
    if not found:
        skip("no I/O engine runs here")
    return found


def stderr_line(err):
    """The message: one line, no usage dump."""
    return [l for l in err.strip().splitlines() if l]
