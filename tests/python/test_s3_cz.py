"""Compressed files to object storage (issue 26): `ferry cp --compress zstd|lz4 SRC s3://bucket/key`
writes the compressed file through the cz writer straight into an object (chunks, index and
trailer in order: one multipart upload, visible only whole at the end), and the object reads back
through ferry (`ferry cp --decompress URL LOCAL`) and, downloaded, through `ferry cz info` and the
stock zstd tool. A failed upload leaves no object. moto's S3 server on 127.0.0.1 (conftest's
s3_server); the CLI is FERRY_CLI or build/ferry."""
import os
import shutil
import subprocess

import pytest

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")

import _moto  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _run(cli, *args, **env):
    return subprocess.run([cli] + list(args), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **env))


def _payload(n, random_bytes=1 << 20):
    """Text-like bytes that compress, with an incompressible (stored) stretch in the middle."""
    words = b"the quick brown fox jumps over a lazy dog while ferry moves bytes to the GPU ".split()
    out = bytearray()
    i = 0
    while len(out) < n:
        out += words[(i * 7 + i // 13) % len(words)] + b" "
        i += 1
    out = out[:n]
    out[n // 3:n // 3 + random_bytes] = os.urandom(random_bytes)
    return bytes(out)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_cp_compress_to_s3(cli, s3_server, s3_env, tmp_path, codec):
    data = _payload(16 << 20, 11 << 20)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    key = "cz/%s.fz" % codec
    # incompressible stretch and 5 MiB parts: the object goes up in several parts
    p = _run(cli, "cp", "--compress", codec, "--chunk", "256k", "--quiet", str(src), s3_server.url(key),
             FERRY_REMOTE_PART_SIZE="5m")
    assert p.returncode == 0, p.stderr
    obj = s3_server.get(key)
    assert obj and len(obj) < len(data), (len(obj or b""), len(data))
    etag = s3_server.s3.head_object(Bucket=_moto.BUCKET, Key=key)["ETag"]
    assert etag.strip('"').endswith("-3"), etag  # 11+ MiB in 5 MiB parts: a multipart upload of 3
    assert not s3_server.uploads(), s3_server.uploads()  # completed, none left open
    back = tmp_path / "back.bin"
    p = _run(cli, "cp", "--decompress", "--quiet", s3_server.url(key), str(back))
    assert p.returncode == 0, p.stderr
    assert back.read_bytes() == data
    local = tmp_path / "local.fz"
    local.write_bytes(obj)
    p = _run(cli, "cz", "info", str(local))
    assert p.returncode == 0 and codec in p.stdout, p.stdout + p.stderr
    tool = shutil.which(codec)
    if tool:  # the stock tool decodes the object's bytes (the format's promise)
        out = subprocess.run([tool, "-d", "-c", str(local)], capture_output=True, timeout=60)
        assert out.returncode == 0 and out.stdout == data, out.stderr


def test_cp_compress_to_s3_failure_leaves_no_object(cli, s3_server, s3_env, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(_payload(1 << 20))
    bad = s3_server.url("cz/x.fz").replace(s3_server.url(""), "s3://no-such-bucket-here/")
    p = _run(cli, "cp", "--compress", "zstd", "--quiet", str(src), bad, FERRY_REMOTE_RETRIES="0")
    assert p.returncode != 0 and "no-such-bucket-here" in p.stderr, p.stderr
    assert "cz/x.fz" not in s3_server.keys("cz/")


def test_cp_decompress_to_s3_is_refused(cli, s3_server, s3_env, tmp_path):
    src = tmp_path / "src.fz"
    plain = tmp_path / "plain.bin"
    plain.write_bytes(_payload(1 << 20))
    assert _run(cli, "cp", "--compress", "zstd", "--quiet", str(plain), str(src)).returncode == 0
    p = _run(cli, "cp", "--decompress", str(src), s3_server.url("cz/plain.bin"))
    assert p.returncode == 2 and "decompressed copy is written to a local path" in p.stderr, p.stderr
