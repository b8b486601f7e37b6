"""ferry doctor URL against moto's S3 server on 127.0.0.1 (started and stopped here; skipped, exit
77, where moto is not installed): an object's remote.reach, remote.credentials (from the
environment, from a profile file, none), remote.head_ms and remote.get_rate; a missing key fails
remote.reach naming the 404 and exits 1."""
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


def check(cond, what, got=None):
    if not cond:
        print("FAIL: %s%s" % (what, "" if got is None else ": %r" % (got,)))
        sys.exit(1)


def doctor(url, env, rc):
    p = subprocess.run([FERRY, "doctor", "--json", url], capture_output=True, text=True, env=env, timeout=120)
    checks = json.loads(p.stdout)["checks"]
    # exit 1 where any check fails: the machine's own checks (not ours) may fail here
    others = [c["id"] for c in checks if c["verdict"] == "fail" and not c["id"].startswith("remote.")]
    check(p.returncode == (1 if others else rc), "ferry doctor %s: exit %d (stderr %s; other failed checks %s)"
          % (url, rc, p.stderr.strip(), others), (p.returncode, [c for c in checks if c["id"].startswith("remote.")]))
    return {c["id"]: c for c in checks if c["id"].startswith("remote.")}


def main():
    s = _moto.Server()
    try:
        home = tempfile.mkdtemp(prefix="ferry-doctor-url-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(HOME=home, AWS_ENDPOINT_URL_S3=s.endpoint, AWS_REGION="us-east-1")
        keys = dict(env, AWS_ACCESS_KEY_ID=s.key_id, AWS_SECRET_ACCESS_KEY=s.secret)
        s.s3.put_object(Bucket=_moto.BUCKET, Key="doctor/obj.bin", Body=os.urandom(3 << 20), ACL="public-read")
        url = s.url("doctor/obj.bin")

        c = doctor(url, keys, 0)
        check(sorted(c) == ["remote.credentials", "remote.get_rate", "remote.head_ms", "remote.reach"], "checks", sorted(c))
        check(c["remote.reach"]["verdict"] == "ok" and "3145728 bytes" in c["remote.reach"]["value"], "reach", c["remote.reach"])
        check(c["remote.credentials"]["value"] == "environment (AWS_ACCESS_KEY_ID)", "credentials", c["remote.credentials"])
        check(c["remote.head_ms"]["value"].endswith(")") and " ms " in c["remote.head_ms"]["value"], "head_ms", c["remote.head_ms"])
        check("MB/s (3145728 bytes in" in c["remote.get_rate"]["value"], "get_rate", c["remote.get_rate"])

        c = doctor(s.url("doctor/missing"), keys, 1)
        check(c["remote.reach"]["verdict"] == "fail" and "HTTP 404 NoSuchKey" in c["remote.reach"]["value"],
              "missing key", c["remote.reach"])
        check("remote.get_rate" not in c, "no rate without the object", sorted(c))

        os.makedirs(os.path.join(home, ".aws"))
        with open(os.path.join(home, ".aws", "credentials"), "w") as f:
            f.write("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (s.key_id, s.secret))
        c = doctor(url, env, 0)
        check(".aws/credentials" in c["remote.credentials"]["value"] and c["remote.credentials"]["verdict"] == "ok",
              "credentials from the profile file", c["remote.credentials"])
        os.remove(os.path.join(home, ".aws", "credentials"))
        c = doctor(url, env, 0)  # unsigned: a public object
        check(c["remote.credentials"]["verdict"] == "warn" and c["remote.credentials"]["value"].startswith("none"),
              "no credentials: warned", c["remote.credentials"])
    finally:
        s.stop()
    print("ok")


if __name__ == "__main__":
    main()
