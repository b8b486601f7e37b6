"""The remote backend against moto's S3 server (issue 23, docs/REMOTE.md): servers started here on
127.0.0.1 and stopped after. Reads of 0, 1 and several-part objects (bytes checked), through pread,
the workers (async, batch) and ferry.read; missing bucket and key, wrong credentials, unsigned
(public) access, credentials from a profile file, an object replaced during a read, and
safetensors' load_file from s3://."""
import errno
import os
import socket
import subprocess
import time

import pytest

from conftest import need

moto = pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
import ferry  # noqa: E402
import _moto  # noqa: E402

BUCKET = _moto.BUCKET
PART = 64 * 1024  # remote_part_size for these tests: several parts from a small object


class Server:
    """moto's S3 server in a process of its own; auth=True checks signatures and keys."""

    def __init__(self, auth):
        self.port = _moto.free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        env = dict(os.environ)
        if auth:
            # the first 3 requests (the IAM user, its policy, its key) go unchecked; the rest need
            # that key and a valid SigV4 signature
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        self.proc = _moto.start(self.port, env)
        self.key_id, self.secret = "testing", "testing"
        if auth:
            iam = self._client("iam")
            iam.create_user(UserName="ferry")
            iam.put_user_policy(UserName="ferry", PolicyName="all", PolicyDocument=(
                '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", '
                '"Resource": "*"}]}'))
            k = iam.create_access_key(UserName="ferry")["AccessKey"]
            self.key_id, self.secret = k["AccessKeyId"], k["SecretAccessKey"]
        self.s3 = self._client("s3")
        self.s3.create_bucket(Bucket=BUCKET)

    def _client(self, service):
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=getattr(self, "key_id", "testing"),
                            aws_secret_access_key=getattr(self, "secret", "testing"))

    def put(self, key, data, **kw):
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=data, **kw)
        return "s3://%s/%s" % (BUCKET, key)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def open_server():
    s = Server(auth=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def auth_server():
    s = Server(auth=True)
    yield s
    s.stop()


_AWS_VARS = _moto.AWS_VARS


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """A clean AWS environment with an empty HOME; returns a function that points it at a server."""
    for v in _AWS_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))

    def use(server, keys=True):
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        if keys:
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.key_id)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret)
    return use


def _ctx():
    return ferry.Context(remote_part_size=PART, remote_connections=4, remote_retries=1, threads=2,
                         chunk_size="64k")


@pytest.mark.parametrize("size", [0, 1, 3 * PART + 5])
def test_read_sizes(open_server, aws_env, size):
    aws_env(open_server)
    data = os.urandom(size)
    url = open_server.put("sizes/%d.bin" % size, data)
    ctx = _ctx()
    with ferry.open(url, context=ctx) as f:
        assert f.size == size
        buf = bytearray(size + 10)
        assert f.pread_into(buf, 0) == size  # pread: parallel parts straight into buf
        assert bytes(buf[:size]) == data
        if size > 2:
            mid = bytearray(PART + 3)  # across a part boundary, short at the end
            n = f.pread_into(mid, size - PART - 1)
            assert n == PART + 1 and bytes(mid[:n]) == data[size - PART - 1:]
            a = bytearray(size)  # the workers: chunk by chunk, each a ranged GET
            assert f.pread_into_async(a, 0).result() == size
            assert bytes(a) == data
            b1, b2 = bytearray(100), bytearray(PART)
            assert f.read_batch([(7, b1), (PART * 2, b2)]) == [100, PART]
            assert bytes(b1) == data[7:107] and bytes(b2) == data[2 * PART:3 * PART]
        assert "ETag" in f.path_info() and url in f.path_info()
    got = ferry.read(url, context=ctx, like="numpy" if size else None)
    assert bytes(got) == data


def test_missing_bucket_and_key(open_server, aws_env):
    aws_env(open_server)
    with pytest.raises(FileNotFoundError) as e:
        ferry.open("s3://%s/no/such/key" % BUCKET, context=_ctx())
    msg = str(e.value)
    assert "s3://%s/no/such/key" % BUCKET in msg and "HTTP 404" in msg and "NoSuchKey" in msg, msg
    with pytest.raises(FileNotFoundError) as e:
        ferry.open("s3://no-such-bucket-ferry/k", context=_ctx())
    msg = str(e.value)
    assert "s3://no-such-bucket-ferry/k" in msg and "HTTP 404" in msg and "NoSuchBucket" in msg, msg


def test_signed_and_wrong_credentials(auth_server, aws_env, monkeypatch):
    aws_env(auth_server)
    data = os.urandom(2 * PART + 1)
    url = auth_server.put("signed.bin", data)
    # the right key: libcurl's SigV4 signature is checked by the server
    assert bytes(ferry.read(url, context=_ctx(), like="numpy")) == data
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(PermissionError) as e:
        ferry.open(url, context=_ctx())
    msg = str(e.value)
    assert url in msg and "HTTP 403" in msg and "SignatureDoesNotMatch" in msg, msg
    assert "environment" in msg, msg  # where the credentials came from
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    with pytest.raises(PermissionError) as e:
        ferry.open(url, context=_ctx())
    assert "HTTP 403" in str(e.value) and "InvalidAccessKeyId" in str(e.value), str(e.value)
    # no credentials at all: unsigned, and this server refuses that
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(PermissionError) as e:
        ferry.open(url, context=_ctx())
    assert "HTTP 403" in str(e.value) and "unsigned" in str(e.value), str(e.value)


def test_public_unsigned(open_server, aws_env, monkeypatch):
    aws_env(open_server, keys=False)  # no credentials anywhere: unsigned requests
    data = os.urandom(PART + 7)
    url = open_server.put("public.bin", data, ACL="public-read")
    with ferry.open(url, context=_ctx()) as f:
        assert "unsigned" in f.path_info()
        buf = bytearray(len(data))
        assert f.pread_into(buf) == len(data) and bytes(buf) == data
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_NO_SIGN_REQUEST", "true")
    with ferry.open(url, context=_ctx()) as f:
        assert "AWS_NO_SIGN_REQUEST" in f.path_info()
    # plain https?/http:// URLs are read the same way, unsigned
    with ferry.open("%s/%s/public.bin" % (open_server.endpoint, BUCKET), context=_ctx()) as f:
        buf = bytearray(len(data))
        assert f.pread_into(buf) == len(data) and bytes(buf) == data


def test_profile_file(auth_server, aws_env, monkeypatch, tmp_path):
    aws_env(auth_server, keys=False)
    data = os.urandom(1000)
    url = auth_server.put("profile.bin", data)
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = AKIADEFAULTWRONG0000\naws_secret_access_key = nope\n\n"
        "[ci]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (auth_server.key_id,
                                                                        auth_server.secret))
    (tmp_path / ".aws" / "config").write_text("[profile ci]\nregion = us-east-1\n")
    with pytest.raises(PermissionError) as e:  # the default profile's key is wrong
        ferry.open(url, context=_ctx())
    assert "credentials [default]" in str(e.value), str(e.value)
    monkeypatch.setenv("AWS_PROFILE", "ci")
    with ferry.open(url, context=_ctx()) as f:
        assert "credentials [ci]" in f.path_info(), f.path_info()
        buf = bytearray(1000)
        assert f.pread_into(buf) == 1000 and bytes(buf) == data


def test_replaced_during_read(open_server, aws_env):
    aws_env(open_server)
    old = os.urandom(3 * PART)
    url = open_server.put("replaced.bin", old)
    with ferry.open(url, context=_ctx()) as f:  # HEAD: size and ETag
        open_server.put("replaced.bin", os.urandom(3 * PART))  # same size, other bytes
        buf = bytearray(3 * PART)
        with pytest.raises(OSError) as e:
            f.pread_into(buf)
        assert e.value.errno == errno.ESTALE
        msg = str(e.value)
        assert url in msg and "HTTP 412" in msg and "If-Match" in msg and "bytes=" in msg, msg
        with pytest.raises(OSError) as e:  # through the workers: the same detail
            f.pread_into_async(buf).result()
        assert e.value.errno == errno.ESTALE and "HTTP 412" in str(e.value), str(e.value)


def test_safetensors_load_file(open_server, aws_env):
    torch = need("torch")
    st = need("safetensors.torch")
    import ferry.safetensors as fst
    aws_env(open_server)
    tensors = {"a": torch.arange(100000, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.int64)}
    url = open_server.put("model.safetensors", st.save(tensors))
    got = fst.load_file(url, context=_ctx())
    assert sorted(got) == ["a", "b"]
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k


class FaultProxy(_moto.Proxy):
    """A tiny HTTP proxy of the test's own in front of moto: each ranged GET takes the next fault
    of the list ("503": S3's SlowDown, "reset": half the body, then the connection is reset;
    "shiftrange", "othersize": a Content-Range for other bytes, or of an object of another size;
    "stall": no answer for 3 s;
    None: passed through). HEADs and GETs without Range, and PUTs but parts', pass through."""

    def __init__(self, upstream_port, faults):
        import threading
        self.faults = list(faults)
        self.lock = threading.Lock()
        self.seen = []
        super().__init__(upstream_port)

    def handle(self, h, method, payload):
        import struct
        fault = None
        if (method == "GET" and "Range" in h.headers) or (method == "PUT" and "partNumber=" in h.path):
            with self.lock:
                fault = self.faults.pop(0) if self.faults else None
                self.seen.append(fault)
        if fault == "stall":  # nothing at all for 3 s, then the connection closes
            time.sleep(3)
            h.close_connection = True
            return
        if fault == "503":
            body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                    b'<Message>Please reduce your request rate.</Message></Error>')
            h.send_response(503)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        status, hdrs, body = self.forward(h, method, payload)
        h.send_response(status)
        for k, v in hdrs:
            if k.lower() == "content-range" and fault in ("shiftrange", "othersize"):
                unit, _, rest = v.partition(" ")
                span, _, total = rest.partition("/")
                a, _, b = span.partition("-")
                if fault == "shiftrange":  # the bytes that follow, as a bad cache might
                    v = "%s %d-%d/%s" % (unit, int(a) + 1, int(b) + 1, total)
                else:  # an object of another size (changed on a server without ETags)
                    v = "%s %s/%d" % (unit, span, int(total) + 1)
            if k.lower() not in _moto.HOP_HEADERS:
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if method != "HEAD" else
                                           dict((k.lower(), v) for k, v in hdrs).get("content-length", "0")))
        h.end_headers()
        if method == "HEAD":
            return
        if fault == "reset" and len(body) > 2:
            h.wfile.write(body[:len(body) // 2])
            h.wfile.flush()
            # SO_LINGER 0: close sends RST, the client sees a reset mid-body
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
            h.connection.close()
            return
        h.wfile.write(body)


def test_retries_slowdown_and_reset(open_server, aws_env, monkeypatch):
    aws_env(open_server)
    data = os.urandom(4 * PART)
    url = open_server.put("faults.bin", data)
    proxy = FaultProxy(open_server.port, ["503", "reset", None, "503", "reset"])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        ctx = ferry.Context(remote_part_size=PART, remote_connections=2, remote_retries=3)
        with ferry.open(url, context=ctx) as f:
            buf = bytearray(len(data))
            assert f.pread_into(buf) == len(data)
            assert bytes(buf) == data  # the retried parts (the reset ones resumed) are exact
        assert proxy.seen[:5] == ["503", "reset", None, "503", "reset"], proxy.seen
        assert ctx.stats()["retries"] >= 4, ctx.stats()
        # with no retries the first fault is the error, naming the range, status and Code
        ctx = ferry.Context(remote_part_size=PART, remote_connections=1, remote_retries=0)
        proxy.faults = ["503"]
        with ferry.open(url, context=ctx) as f:
            with pytest.raises(OSError) as e:
                f.pread_into(bytearray(len(data)))
        msg = str(e.value)
        assert url in msg and "bytes=0-%d" % (PART - 1) in msg and "HTTP 503 SlowDown" in msg, msg
        assert "after 0 retries" in msg, msg
        proxy.faults = ["reset"]
        with ferry.open(url, context=ctx) as f:
            with pytest.raises(ConnectionResetError) as e:
                f.pread_into(bytearray(len(data)))
        assert url in str(e.value) and "bytes=" in str(e.value), str(e.value)
    finally:
        proxy.stop()


def test_next_part_starts_at_once(open_server, aws_env):
    """A connection that finishes a part takes the next one without waiting: one connection, 40
    parts. (It used to sleep 100 ms after each part when no other transfer was running: 4 s here.)"""
    aws_env(open_server)
    data = os.urandom(40 * PART)
    url = open_server.put("serial.bin", data)
    ctx = ferry.Context(remote_part_size=PART, remote_connections=1)
    with ferry.open(url, context=ctx) as f:
        buf = bytearray(len(data))
        t0 = time.monotonic()
        assert f.pread_into(buf) == len(data)
        elapsed = time.monotonic() - t0
    assert bytes(buf) == data
    assert elapsed < 3.0, "40 parts over one connection took %.2f s" % elapsed


# ------------------------------------------------------------------------------------- writes

MIB = 1 << 20


def _exists(server, key):
    try:
        server.s3.head_object(Bucket=BUCKET, Key=key)
        return True
    except Exception as e:  # botocore's ClientError: 404
        assert "404" in str(e), e
        return False


def _write_in_pieces(f, data, piece):
    off = 0
    while off < len(data):
        n = f.pwrite_from(memoryview(data)[off:off + piece], off)
        assert n == min(piece, len(data) - off)
        off += n


def test_write_small_object(open_server, aws_env):
    aws_env(open_server)
    data = os.urandom(100000)
    url = "s3://%s/written/small.bin" % BUCKET
    with ferry.open(url, "w", context=_ctx()) as f:
        _write_in_pieces(f, data, 30000)
        assert f.size == len(data)
        assert not _exists(open_server, "written/small.bin")  # nothing visible before the commit
        f.sync()
    assert open_server.s3.get_object(Bucket=BUCKET, Key="written/small.bin")["Body"].read() == data
    assert bytes(ferry.read(url, context=_ctx(), like="numpy")) == data
    with ferry.open("s3://%s/written/empty.bin" % BUCKET, "w", context=_ctx()) as f:
        f.sync()
    assert open_server.s3.get_object(Bucket=BUCKET, Key="written/empty.bin")["Body"].read() == b""


def test_write_multipart(auth_server, aws_env):
    aws_env(auth_server)  # signed: the parts' PUTs and the POSTs checked by the server
    data = os.urandom(11 * MIB + 12345)  # parts of 5 MiB: 3, the first two uploaded before the commit
    url = "s3://%s/written/multi.bin" % BUCKET
    ctx = ferry.Context(remote_part_size="5m", remote_connections=2)
    with ferry.open(url, "w", context=ctx) as f:
        _write_in_pieces(f, data, MIB + 3)
        uploads = auth_server.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        assert [u["Key"] for u in uploads] == ["written/multi.bin"]  # under way, not visible
        assert not _exists(auth_server, "written/multi.bin")
        with pytest.raises(OSError) as e:  # in order only
            f.pwrite_from(b"x", 5)
        assert e.value.errno == errno.ESPIPE and url in str(e.value), str(e.value)
        f.sync()
    obj = auth_server.s3.get_object(Bucket=BUCKET, Key="written/multi.bin")
    assert obj["ETag"].strip('"').endswith("-3"), obj["ETag"]  # a multipart upload of 3 parts
    assert obj["Body"].read() == data
    assert not auth_server.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_write_not_committed_is_aborted(open_server, aws_env):
    aws_env(open_server)
    url = "s3://%s/written/dropped.bin" % BUCKET
    ctx = ferry.Context(remote_part_size="5m", remote_connections=1)
    with ferry.open(url, "w", context=ctx) as f:
        _write_in_pieces(f, os.urandom(6 * MIB), MIB)  # the first part went up
        assert open_server.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    # closed without sync: the upload is aborted, no object
    assert not open_server.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    assert not _exists(open_server, "written/dropped.bin")


def test_write_failure_aborts(open_server, aws_env, monkeypatch):
    aws_env(open_server)
    proxy = FaultProxy(open_server.port, ["503"])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        url = "s3://%s/written/failed.bin" % BUCKET
        ctx = ferry.Context(remote_part_size="5m", remote_connections=1, remote_retries=0)
        with ferry.open(url, "w", context=ctx) as f:
            with pytest.raises(OSError) as e:
                _write_in_pieces(f, os.urandom(6 * MIB), MIB)
            msg = str(e.value)
            assert "UploadPart 1" in msg and "HTTP 503 SlowDown" in msg and "aborted" in msg, msg
            with pytest.raises(OSError):  # the commit fails too: nothing is made visible
                f.sync()
        assert proxy.seen == ["503"], proxy.seen
        assert not open_server.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
        assert not _exists(open_server, "written/failed.bin")
        # retried, the same write goes through
        proxy.faults = ["503"]
        data = os.urandom(6 * MIB)
        ctx = ferry.Context(remote_part_size="5m", remote_connections=1, remote_retries=2)
        with ferry.open(url, "w", context=ctx) as f:
            _write_in_pieces(f, data, MIB)
            f.sync()
        assert open_server.s3.get_object(Bucket=BUCKET, Key="written/failed.bin")["Body"].read() == data
    finally:
        proxy.stop()


def test_write_modes_refused(open_server, aws_env):
    aws_env(open_server)
    for mode in ("r+", "x", "w+"):
        with pytest.raises(OSError) as e:
            ferry.open("s3://%s/written/x.bin" % BUCKET, mode, context=_ctx())
        assert e.value.errno == errno.EOPNOTSUPP, (mode, e.value)
    with pytest.raises(OSError) as e:
        ferry.open("%s/%s/x.bin" % (open_server.endpoint, BUCKET), "w", context=_ctx())
    assert e.value.errno == errno.EOPNOTSUPP


@pytest.mark.parametrize("fault", ["shiftrange", "othersize"])
def test_other_bytes_refused(open_server, aws_env, monkeypatch, fault):
    """A 206 whose Content-Range is not the range asked for (other bytes, or an object of another
    size) is an error, never bytes in the buffer: the ETag alone does not cover servers without one."""
    aws_env(open_server)
    data = os.urandom(3 * PART)
    url = open_server.put("ranges.bin", data)
    proxy = FaultProxy(open_server.port, [None, fault])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        ctx = ferry.Context(remote_part_size=PART, remote_connections=1, remote_retries=3)
        with ferry.open(url, context=ctx) as f:
            buf = bytearray(len(data))
            with pytest.raises(OSError) as e:
                f.pread_into(buf)
        assert e.value.errno == errno.ESTALE, e.value
        msg = str(e.value)
        assert url in msg and "Content-Range" in msg and "bytes=%d-%d" % (PART, 2 * PART - 1) in msg, msg
        assert proxy.seen == [None, fault], proxy.seen  # not retried: no other part ran after it
    finally:
        proxy.stop()


def test_stalled_server(open_server, aws_env, monkeypatch):
    """A server that stops answering: the request is cut after remote_timeout and retried (exact
    bytes), or with no retries the error is ETIMEDOUT naming the range."""
    aws_env(open_server)
    data = os.urandom(2 * PART)
    url = open_server.put("stall.bin", data)
    proxy = FaultProxy(open_server.port, ["stall"])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        ctx = ferry.Context(remote_part_size=PART, remote_connections=2, remote_retries=2,
                            remote_timeout=1)
        with ferry.open(url, context=ctx) as f:
            buf = bytearray(len(data))
            t0 = time.monotonic()
            assert f.pread_into(buf) == len(data)
            assert bytes(buf) == data
            assert time.monotonic() - t0 < 2.9  # cut after about 1 s, not after the stall's 3
        assert proxy.seen[0] == "stall" and ctx.stats()["retries"] >= 1
        proxy.faults = ["stall"]
        ctx = ferry.Context(remote_part_size=PART, remote_connections=1, remote_retries=0,
                            remote_timeout=1)
        with ferry.open(url, context=ctx) as f:
            with pytest.raises(TimeoutError) as e:
                f.pread_into(bytearray(len(data)))
        msg = str(e.value)
        assert url in msg and "bytes=0-%d" % (PART - 1) in msg and "after 0 retries" in msg, msg
    finally:
        proxy.stop()
