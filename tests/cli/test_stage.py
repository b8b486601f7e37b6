"""ferry stage / ferry cp against moto's S3 server on 127.0.0.1 (started and stopped here; skipped,
exit 77, where moto is not installed): a prefix downloaded to a directory (bytes checked, keys of
other prefixes left out), resumed (everything skipped, then only a replaced object and a cut file
copied again), a directory uploaded to a prefix and resumed by size, one object to a file name,
a missing prefix, --json figures."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
try:
    import boto3  # noqa: F401
    import moto  # noqa: F401
    import pytest  # noqa: F401  (_moto's failure path)
except ImportError as e:
    print("skipped: %s (pip install 'moto[server]')" % e)
    sys.exit(77)
import _moto  # noqa: E402

FERRY = sys.argv[1]
B = _moto.BUCKET


def check(cond, what, got=None):
    if not cond:
        print("FAIL: %s%s" % (what, "" if got is None else ": %r" % (got,)))
        sys.exit(1)


def ferry(*args, rc=0):
    p = subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=120)
    check(p.returncode == rc, "ferry %s: exit %d (stderr %s)" % (" ".join(args), rc, p.stderr.strip()), p.returncode)
    return json.loads(p.stdout) if "--json" in args and p.stdout.strip() else p


def tree(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            if f != ".ferry-stage":
                p = os.path.join(root, f)
                out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def main():
    s = _moto.Server()
    try:
        os.environ.update(AWS_ENDPOINT_URL_S3=s.endpoint, AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID=s.key_id,
                          AWS_SECRET_ACCESS_KEY=s.secret, FERRY_REMOTE_PART_SIZE="1m")
        for v in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_NO_SIGN_REQUEST", "AWS_SESSION_TOKEN"):
            os.environ.pop(v, None)
        objs = {"a.bin": os.urandom(6 << 20), "sub/b.bin": os.urandom(1024), "empty": b""}
        for k, v in objs.items():
            s.put("ds/" + k, v)
        s.put("dsx/other", b"not under ds/")
        work = tempfile.mkdtemp(prefix="ferry-stage-")
        d = os.path.join(work, "down")

        j = ferry("stage", "--json", "s3://%s/ds/" % B, d)
        check(tree(d) == objs, "downloaded tree", sorted(tree(d)))
        check((j["objects"], j["copied"], j["skipped"], j["failed"]) == (3, 3, 0, 0), "first --json", j)
        check(j["bytes"] == sum(map(len, objs.values())), "bytes", j)
        check(os.path.exists(os.path.join(d, ".ferry-stage")), "sidecar written")

        j = ferry("stage", "--json", "s3://%s/ds/" % B, d)
        check((j["copied"], j["skipped"], j["bytes"]) == (0, 3, 0), "resumed: all skipped", j)

        objs["sub/b.bin"] = os.urandom(1024)  # same size, another ETag
        s.put("ds/sub/b.bin", objs["sub/b.bin"])
        with open(os.path.join(d, "a.bin"), "r+b") as f:
            f.truncate(1000)  # an interrupted copy's leftover of another size
        j = ferry("cp", "--json", "--jobs", "2", "s3://%s/ds/" % B, d)
        check((j["copied"], j["skipped"]) == (2, 1), "resumed: the replaced and the cut file again", j)
        check(tree(d) == objs, "tree after resume")

        ferry("cp", "--json", d, "s3://%s/up/" % B)
        check(s.keys("up/") == sorted("up/" + k for k in objs), "uploaded keys", s.keys("up/"))
        for k, v in objs.items():
            check(s.get("up/" + k) == v, "uploaded " + k)
        j = ferry("cp", "--json", d, "s3://%s/up/" % B)
        check((j["copied"], j["skipped"]) == (0, 3), "upload resumed by size", j)

        one = os.path.join(work, "one", "file.bin")
        ferry("cp", "--quiet", "s3://%s/ds/a.bin" % B, one)
        check(open(one, "rb").read() == objs["a.bin"], "one object to a file name")

        p = ferry("stage", "s3://%s/nothing/" % B, os.path.join(work, "none"), rc=1)
        check("no object" in p.stderr, "missing prefix named", p.stderr)
        p = ferry("stage", "--jobs", "0", "s3://%s/ds/" % B, d, rc=2)
        check("--jobs" in p.stderr, "--jobs 0 refused", p.stderr)
    finally:
        s.stop()
    print("ok")


if __name__ == "__main__":
    main()
