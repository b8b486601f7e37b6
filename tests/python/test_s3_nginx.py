"""s3:// and http:// reads through a fast real HTTP server (issue 23): nginx from Debian serving a
directory on 127.0.0.1, started and stopped here (tests/python/_nginx.py; scripts/setup.sh installs
it). Path-style s3://bucket/key under AWS_ENDPOINT_URL is the file ROOT/bucket/key; nginx ignores the
signature. Checked against nginx's own access log: a large read into host memory is many ranged GETs
over several kept-alive connections (the workers' pool, as reads into GPU memory), every byte right;
objects of 0 and 1 bytes, a range at the end, a missing key, and a file replaced during a read (the
ETag's If-Match: 412, an error, never mixed bytes)."""
import errno
import os

import numpy as np
import pytest

import ferry
import _moto
import _nginx

BUCKET = "bucket"
PART = 1 << 20


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    base = tmp_path_factory.mktemp("nginx")
    root = base / "www"
    (root / BUCKET).mkdir(parents=True)
    try:
        n = _nginx.Nginx(str(root), str(base / "srv"), workers=2, log=True)
    except FileNotFoundError as e:
        pytest.skip("skipped: %s" % e)
    n.root = root / BUCKET
    yield n
    n.stop()


@pytest.fixture
def env(monkeypatch, tmp_path, nginx):
    for v in _moto.AWS_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL", nginx.url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nginx-ignores-it")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nginx-ignores-it")
    return nginx


def put(n, key, data):
    with open(n.root / key, "wb") as f:
        f.write(data)
    return "s3://%s/%s" % (BUCKET, key)


def log_since(n, mark, uri):
    return [r for r in n.requests()[mark:] if r[2] == uri]


def test_large_read_parallel_ranged_gets(env):
    data = np.random.default_rng(1).integers(0, 256, 48 * PART + 12345, dtype=np.uint8)
    url = put(env, "large.bin", data.tobytes())
    # one connection per read of a chunk: more than one connection is the workers' doing
    ctx = ferry.Context(remote_part_size=PART, chunk_size=PART, threads=4, remote_connections=1)
    f = ferry.open(url, context=ctx)
    mark = len(env.requests())
    out = np.zeros_like(data)
    assert f.pread_into(out, 0) == data.size
    assert np.array_equal(out, data), "first differing byte %d" % int(np.argmax(out != data))
    gets = [r for r in log_since(env, mark, "/bucket/large.bin") if r[1] == "GET"]
    # one GET a chunk, each a 206 of its range, from more than one connection (the workers)
    assert len(gets) == 49, [r[3] for r in gets]
    assert all(r[4] == 206 for r in gets), gets
    assert sorted(int(r[3].split("=")[1].split("-")[0]) for r in gets) == [i * PART for i in range(49)]
    conns = {r[0] for r in gets}
    assert len(conns) > 1, "all %d GETs on connection %s: the read ran in one thread" % (len(gets), conns)
    assert len(conns) <= 4, "%d connections for 4 workers" % len(conns)
    # a second read of the same file: the connections kept alive by the pool, at most one a worker
    out[:] = 0
    mark = len(env.requests())
    assert f.pread_into(out, 0) == data.size
    assert np.array_equal(out, data)
    both = conns | {r[0] for r in log_since(env, mark, "/bucket/large.bin")}
    f.close()
    assert len(both) <= 4, "%d connections over two reads by 4 workers" % len(both)


def test_small_objects_and_the_end(env):
    assert ferry.open(put(env, "empty.bin", b"")).size == 0
    one = put(env, "one.bin", b"\x7f")
    f = ferry.open(one)
    buf = np.zeros(4, np.uint8)
    assert f.pread_into(buf, 0) == 1 and buf[0] == 0x7F
    f.close()
    data = os.urandom(3 * PART + 7)
    url = put(env, "end.bin", data)
    f = ferry.open(url, context=ferry.Context(remote_part_size=PART))
    buf = np.zeros(2 * PART, np.uint8)
    n = f.pread_into(buf, 2 * PART)  # clipped at the object's end
    assert n == PART + 7 and buf[:n].tobytes() == data[2 * PART:]
    f.close()
    # the same file as a plain http:// URL
    f = ferry.open("%s/%s/end.bin" % (env.url, BUCKET))
    assert f.size == len(data)
    f.close()


def test_missing_key(env):
    with pytest.raises(FileNotFoundError) as e:
        ferry.open("s3://%s/no-such-key" % BUCKET)
    assert "s3://%s/no-such-key" % BUCKET in str(e.value) and "HTTP 404" in str(e.value), str(e.value)


def test_replaced_during_read(env):
    data = os.urandom(8 * PART)
    url = put(env, "replaced.bin", data)
    f = ferry.open(url, context=ferry.Context(remote_part_size=PART, chunk_size=PART))
    st = os.stat(env.root / "replaced.bin")
    put(env, "replaced.bin", os.urandom(8 * PART))  # same size, other bytes, a later mtime: another ETag
    os.utime(env.root / "replaced.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    buf = np.zeros(8 * PART, np.uint8)
    with pytest.raises(OSError) as e:
        f.pread_into(buf, 0)
    f.close()
    assert e.value.errno == errno.ESTALE and "HTTP 412" in str(e.value), str(e.value)
