"""The CLI on s3:// (issue 23): `ferry bench --filename s3://...` reads an object (reads only: a
write is refused naming the URL), `ferry ckpt inspect` of a checkpoint prefix and of one of its
step URLs shows the step's shards, and `ferry ckpt verify` of a prefix checks the step's objects
by listing them (an extra shard, one cut short and one missing are each named). moto's S3 server on 127.0.0.1, started and stopped here; the
CLI is FERRY_CLI (CI: the wheel's) or build/ferry."""
import json
import os
import subprocess

import pytest

from conftest import need

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
import ferry  # noqa: E402
import _moto  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _run(cli, *args):
    return subprocess.run([cli] + list(args), capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_bench_reads_an_object(cli, s3_server, s3_env):
    url = s3_server.put("cli/object.bin", os.urandom(4 << 20))
    p = _run(cli, "bench", "--filename", url, "--bs", "1m", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    job = json.loads(p.stdout)["jobs"][0]
    assert job["read"]["io_bytes"] == 4 << 20, job["read"]
    p = _run(cli, "bench", "--filename", url, "--rw", "write", "--size", "1m")
    assert p.returncode == 1 and url in p.stderr and "reads only" in p.stderr, p.stderr
    assert s3_server.get("cli/object.bin") and len(s3_server.get("cli/object.bin")) == 4 << 20
    p = _run(cli, "bench", "--filename", s3_server.url("cli/missing.bin"), "--size", "1m")
    assert p.returncode == 1 and "404" in p.stderr, p.stderr


def test_ckpt_inspect_of_a_prefix(cli, s3_server, s3_env):
    torch = need("torch")
    prefix = s3_server.url("cli/run")
    ctx = ferry.Context(threads=2)
    ferry.checkpoint.save({"w": torch.ones(4, 4), "b": torch.zeros(3, dtype=torch.int64)}, prefix, 3, context=ctx)
    ferry.checkpoint.save({"w": torch.ones(4, 4), "b": torch.zeros(5, dtype=torch.int64)}, prefix, 7, context=ctx,
                          keep=0)
    p = _run(cli, "ckpt", "inspect", prefix, "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["step"] == 7 and got["world"] == 1, got  # the step `latest` names
    shapes = {t["name"]: t["shape"] for t in got["files"][0]["tensors"]}
    assert shapes == {"w": [4, 4], "b": [5]}, shapes
    p = _run(cli, "ckpt", "inspect", prefix + "/step-000000000003")
    assert p.returncode == 0 and "step 3, 1 rank" in p.stdout and "rank-00000-of-00001.safetensors" in p.stdout, \
        p.stdout + p.stderr
    p = _run(cli, "ckpt", "inspect", prefix, "--step", "3", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["step"] == 3, p.stderr
    # one object of it, as a file
    p = _run(cli, "ckpt", "inspect", prefix + "/step-000000000007/rank-00000-of-00001.safetensors")
    assert p.returncode == 0 and "[5]" in p.stdout, p.stdout + p.stderr
    p = _run(cli, "ckpt", "inspect", s3_server.url("cli/nothing-here"))
    assert p.returncode == 1 and "NoSuchKey" in p.stderr, p.stderr


def test_ckpt_verify_of_a_prefix(cli, s3_server, s3_env):
    torch = need("torch")
    prefix = s3_server.url("cli/verified")
    ferry.checkpoint.save({"w": torch.ones(4, 4)}, prefix, 5, context=ferry.Context(threads=2))
    p = _run(cli, "ckpt", "verify", prefix, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout)
    assert got["ok"] and got["verified"] == 1 and got["shards"][0]["present"], got
    shard = "cli/verified/step-000000000005/rank-00000-of-00001.safetensors"
    body = s3_server.get(shard)
    # a shard another run left beside it: not in the manifest
    s3_server.put("cli/verified/step-000000000005/rank-00001-of-00002.safetensors", body)
    p = _run(cli, "ckpt", "verify", prefix)
    assert p.returncode == 1 and "rank-00001-of-00002.safetensors" in p.stdout + p.stderr and \
        "not in manifest.json" in p.stdout + p.stderr, p.stdout + p.stderr
    s3_server.s3.delete_object(Bucket=_moto.BUCKET, Key="cli/verified/step-000000000005/rank-00001-of-00002.safetensors")
    # the shard cut short: its size is not the manifest's
    s3_server.put(shard, body[:-8])
    p = _run(cli, "ckpt", "verify", prefix)
    assert p.returncode == 1 and "manifest.json says" in p.stdout + p.stderr, p.stdout + p.stderr
    # the shard gone
    s3_server.s3.delete_object(Bucket=_moto.BUCKET, Key=shard)
    p = _run(cli, "ckpt", "verify", prefix)
    assert p.returncode == 1 and "listed in manifest.json but missing" in p.stdout + p.stderr, p.stdout + p.stderr
