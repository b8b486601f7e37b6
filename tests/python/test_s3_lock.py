"""The lock of s3:// checkpoint writers (issue 23, docs/REMOTE.md "Checkpoints on an s3:// prefix"):
a step's manifest.json is written with If-None-Match: * and `latest` as a compare-and-swap
(If-Match its ETag, If-None-Match: * when there is none), so a second writer committing to the same
prefix is refused (FileExistsError) instead of overwriting the first; a store that does not do
conditional writes (501 NotImplemented) gives an error saying so and naming remote_lock=0, which
saves without the conditions. moto (which enforces both conditions) behind a proxy of the test's
own that records the headers and plays the other writer. Started and stopped here."""
import errno

import pytest

from conftest import need

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
import ferry  # noqa: E402
import _moto  # noqa: E402


class Proxy(_moto.Proxy):
    """Forwards to moto; records (method, path, condition header); hook(method, path, headers) may
    act first (play another writer) and return (status, body) to answer instead of moto."""

    def __init__(self, upstream_port, hook=None):
        self.seen = []
        self.hook = hook
        super().__init__(upstream_port)

    def handle(self, h, method, payload):
        path = h.path.split("?")[0]
        cond = h.headers.get("If-None-Match") or h.headers.get("If-Match")
        self.seen.append((method, path, cond))
        answer = self.hook(method, path, h.headers) if self.hook else None
        if answer:
            status, body = answer
        else:
            status, hdrs, body = self.forward(h, method, payload)
        h.send_response(status)
        if not answer:
            for k, v in hdrs:
                if k.lower() not in _moto.HOP_HEADERS:
                    h.send_header(k, v)
        clen = str(len(body))
        if method == "HEAD" and not answer:
            clen = dict((k.lower(), v) for k, v in hdrs).get("content-length", "0")
        h.send_header("Content-Length", clen)
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)

    def puts(self, suffix):
        return [c for m, p, c in self.seen if m == "PUT" and p.endswith(suffix)]


@pytest.fixture
def env(monkeypatch, s3_env):
    """s3_env, pointed at a proxy by env(proxy)."""
    return lambda proxy: monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)


def _ctx(**kw):
    return ferry.Context(threads=2, remote_retries=0, **kw)


def _state(torch, v):
    return {"w": torch.full((4, 4), float(v))}


def test_conditional_commits(s3_server, env):
    torch = need("torch")
    proxy = Proxy(s3_server.port)
    env(proxy)
    try:
        prefix = s3_server.url("lock/plain")
        ferry.checkpoint.save(_state(torch, 1), prefix, 1, context=_ctx())
        ferry.checkpoint.save(_state(torch, 2), prefix, 2, context=_ctx(), keep=0)
        assert proxy.puts("/step-000000000001/manifest.json") == ["*"]
        latest = proxy.puts("/lock/plain/latest")
        assert latest[0] == "*" and latest[1].strip('"'), latest  # the second: If-Match the first's ETag
        step, st = ferry.checkpoint.load_latest(prefix, context=_ctx())
        assert step == 2 and torch.equal(st["w"], _state(torch, 2)["w"])
    finally:
        proxy.stop()


def test_second_writer_of_a_manifest_refused(s3_server, env):
    torch = need("torch")
    proxy = Proxy(s3_server.port)
    env(proxy)
    try:
        prefix = s3_server.url("lock/manifest")
        ferry.checkpoint.save(_state(torch, 1), prefix, 1, context=_ctx())
        # another job has committed step 2's manifest and not yet moved `latest`
        other = b'{"format":"ferry-checkpoint-1","step":2,"world":1,"run":"other","shards":[]}\n'
        s3_server.put("lock/manifest/step-000000000002/manifest.json", other)
        with pytest.raises(FileExistsError) as e:
            ferry.checkpoint.save(_state(torch, 2), prefix, 2, context=_ctx())
        assert "another writer" in str(e.value) and "manifest.json" in str(e.value), str(e.value)
        assert s3_server.get("lock/manifest/step-000000000002/manifest.json") == other  # not overwritten
        assert s3_server.get("lock/manifest/latest") == b"step-000000000001\n"
    finally:
        proxy.stop()


def test_latest_changed_under_the_commit(s3_server, env):
    torch = need("torch")
    state = {"raced": False}

    def hook(method, path, headers):
        # the other writer moves `latest` between this writer's read of it and its PUT
        if method == "PUT" and path.endswith("/lock/race/latest") and headers.get("If-Match") and not state["raced"]:
            state["raced"] = True
            s3_server.put("lock/race/latest", b"step-000000000009\n")
        return None

    proxy = Proxy(s3_server.port, hook)
    env(proxy)
    try:
        prefix = s3_server.url("lock/race")
        ferry.checkpoint.save(_state(torch, 1), prefix, 1, context=_ctx())
        with pytest.raises(FileExistsError) as e:
            ferry.checkpoint.save(_state(torch, 2), prefix, 2, context=_ctx())
        assert state["raced"] and "another writer" in str(e.value) and "latest" in str(e.value), str(e.value)
        assert s3_server.get("lock/race/latest") == b"step-000000000009\n"  # the other writer's stays
        # `latest` naming a later step than this save's when it commits: refused, named
        s3_server.put("lock/race/latest", b"step-000000000001\n")
        ferry.checkpoint.save(_state(torch, 3), prefix, 3, context=_ctx())
        assert s3_server.get("lock/race/latest") == b"step-000000000003\n"
    finally:
        proxy.stop()


def test_store_without_conditional_writes(s3_server, env):
    torch = need("torch")
    body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code>'
            b'<Message>A header you provided implies functionality that is not implemented</Message></Error>')

    def hook(method, path, headers):
        if method in ("PUT", "POST") and (headers.get("If-None-Match") or headers.get("If-Match")):
            return 501, body
        return None

    proxy = Proxy(s3_server.port, hook)
    env(proxy)
    try:
        prefix = s3_server.url("lock/old-store")
        with pytest.raises(OSError) as e:
            ferry.checkpoint.save(_state(torch, 1), prefix, 1, context=_ctx())
        assert e.value.errno == errno.EOPNOTSUPP and "remote_lock=0" in str(e.value) and \
            "does not support conditional writes" in str(e.value), str(e.value)
        keys = s3_server.keys("lock/old-store/")  # not committed: no manifest, no latest
        assert not [k for k in keys if k.endswith(("manifest.json", "latest"))], keys
        # remote_lock=0: the same save without the conditions (another prefix: ferry.checkpoint
        # keeps one handle, and its context, per directory)
        proxy.seen.clear()
        prefix = s3_server.url("lock/old-store-unlocked")
        ferry.checkpoint.save(_state(torch, 1), prefix, 1, context=_ctx(remote_lock=0))
        assert [c for m, p, c in proxy.seen if m in ("PUT", "POST") and c] == [], proxy.seen
        assert s3_server.get("lock/old-store-unlocked/latest") == b"step-000000000001\n"
    finally:
        proxy.stop()
