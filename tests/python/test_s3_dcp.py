"""torch.distributed.checkpoint on an s3:// prefix through ferry.dcp.Writer / Reader (issue 24 with
issue 23's remote backend): dcp.save and dcp.load against moto's S3 s3_server, bit-exact; the objects
are FileSystemWriter's (downloaded into a directory, the stock FileSystemReader loads them);
`.metadata` is committed after every data object; a save over an existing checkpoint that fails
midway leaves an empty `.metadata` that no reader takes as complete, and no half object."""
import os
import warnings

import pytest

from conftest import need

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
torch = need("torch")
dcp = need("torch.distributed.checkpoint")
import ferry  # noqa: E402
import ferry.dcp as fdcp  # noqa: E402


def _ctx():
    return ferry.Context(remote_part_size="5m", remote_connections=2, remote_retries=1, threads=2)


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8, generator=g)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(),
            "big": torch.randn(3 << 18, generator=g),  # 3 MiB
            "bf16": torch.randn(33, generator=g).to(torch.bfloat16),
            "ints": torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),
            "step": 7 + seed, "name": "run-%d" % seed}


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    return sd


def same(a, b, path="state"):
    if isinstance(a, dict):
        assert set(a) == set(b), (path, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], "%s.%s" % (path, k))
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (path, i))
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.contiguous().view(-1).view(torch.uint8),
                           b.contiguous().view(-1).view(torch.uint8)), path
    else:
        assert a == b, (path, a, b)


def save(sd, url, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=fdcp.Writer(url, context=_ctx(), **kw))


def load(sd, reader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=reader)
    return sd


def test_dcp_roundtrip_on_s3(s3_server, s3_env, tmp_path):
    url = s3_server.url("runs/dcp1")
    sd = state()
    save(sd, url, thread_count=2)
    keys = s3_server.keys("runs/dcp1/")
    assert "runs/dcp1/.metadata" in keys and sum(k.endswith(".distcp") for k in keys) == 2, keys
    assert not s3_server.uploads()
    got = load(zeros_like(sd), fdcp.Reader(url, context=_ctx()))
    same(sd, got)
    # the stock reader loads the same objects from a directory: FileSystemWriter's format
    d = tmp_path / "copy"
    d.mkdir()
    for k in keys:
        (d / os.path.basename(k)).write_bytes(s3_server.get(k))
    same(sd, load(zeros_like(sd), dcp.FileSystemReader(str(d))))
    # and ferry's CLI verifies it (every item's zip and crc32)
    cli = os.environ.get("FERRY_CLI")
    if cli and os.access(cli, os.X_OK):
        import subprocess
        p = subprocess.run([cli, "ckpt", "verify", str(d)], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr


def test_metadata_is_committed_last(s3_server, s3_env, monkeypatch):
    order = []
    real = fdcp._UrlFS.put

    def put(self, path, blob):
        order.append((path.rsplit("/", 1)[1], len(blob)))
        return real(self, path, blob)

    real_url = fdcp.Writer._write_url

    def write_url(self, ctx, planner, url, key, items):
        r = real_url(self, ctx, planner, url, key, items)
        order.append((url.rsplit("/", 1)[1], -1))
        return r

    monkeypatch.setattr(fdcp._UrlFS, "put", put)
    monkeypatch.setattr(fdcp.Writer, "_write_url", write_url)
    url = s3_server.url("runs/order")
    save(state(), url)
    save(state(1), url)  # over an existing checkpoint: .metadata emptied first
    first, second = order[:len(order) // 2], order[len(order) // 2:]
    assert first[-1][0] == ".metadata" and first[-1][1] > 0, first
    assert all(n.endswith(".distcp") for n, _ in first[:-1]), first
    assert second[0] == (".metadata", 0) and second[-1][0] == ".metadata", second


def test_failed_save_leaves_no_complete_checkpoint(s3_server, s3_env, monkeypatch):
    url = s3_server.url("runs/fail")
    save(state(), url)
    before = s3_server.get("runs/fail/__0_0.distcp")

    def boom(self, ctx, planner, u, key, items):
        raise OSError("injected: upload failed")

    monkeypatch.setattr(fdcp.Writer, "_write_url", boom)
    # DCP wraps a rank's error: CheckpointException (a BaseException) naming the rank
    with pytest.raises(BaseException, match="injected"):
        save(state(1), url)
    assert s3_server.get("runs/fail/.metadata") == b""
    assert s3_server.get("runs/fail/__0_0.distcp") == before  # no half object
    assert not s3_server.uploads()
    with pytest.raises(BaseException, match="did not finish"):
        load(zeros_like(state()), fdcp.Reader(url, context=_ctx()))


def test_missing_checkpoint_on_s3(s3_server, s3_env):
    with pytest.raises(BaseException, match="No such file"):  # raised, or wrapped by DCP
        load(zeros_like(state()), fdcp.Reader(s3_server.url("runs/none"), context=_ctx()))
