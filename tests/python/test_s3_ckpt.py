"""Saves to s3:// (issue 23, docs/REMOTE.md "Saves and sharded sets"): ferry.safetensors.save_file
to an s3:// URL (staged in a local temporary, then one multipart upload committed at the end: no
half object), a failed upload leaving no object, no upload and no temporary; a sharded set loaded
from its index JSON behind s3://. moto's S3 server on 127.0.0.1, started and stopped here."""
import json
import os

import pytest

from conftest import need

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
import ferry  # noqa: E402
import _moto  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def server():
    s = _moto.Server()
    yield s
    s.stop()


@pytest.fixture
def env(monkeypatch, tmp_path, server):
    stage = tmp_path / "stage"
    stage.mkdir()
    monkeypatch.setenv("TMPDIR", str(stage))  # where a URL's save stages its temporary
    _moto.use(monkeypatch, tmp_path, server)
    return stage


def _ctx(**kw):
    # 5 MiB parts (S3's smallest), one at a time: a 12 MiB file is a 3-part upload
    args = dict(remote_part_size="5m", remote_connections=1, remote_retries=1, threads=2,
                chunk_size="1m")
    args.update(kw)
    return ferry.Context(**args)


def _tensors(torch):
    return {"big": torch.arange(3 * MIB, dtype=torch.float32),  # 12 MiB
            "small": torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64),
            "empty": torch.zeros(0, dtype=torch.float16)}


def test_save_file_to_s3(server, env):
    torch = need("torch")
    st = need("safetensors.torch")
    import ferry.safetensors as fst
    tensors = _tensors(torch)
    url = server.url("saved/model.safetensors")
    ctx = _ctx()
    fst.save_file(tensors, url, metadata={"who": "h15"}, checksum=True, context=ctx)
    body = server.get("saved/model.safetensors")
    head = server.s3.head_object(Bucket=_moto.BUCKET, Key="saved/model.safetensors")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # a 3-part multipart upload
    got = st.load(body)  # Hugging Face's reader takes the object's bytes
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    back = fst.load_file(url, verify=True, context=ctx)  # with the checksums ferry stored
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
    assert not server.uploads()
    assert os.listdir(env) == [], os.listdir(env)  # the staging temporary is gone
    # saved again over it: replaced whole
    tensors["small"] += 10
    fst.save_file(tensors, url, context=ctx)
    assert torch.equal(fst.load_file(url, context=ctx)["small"], tensors["small"])


def test_save_file_upload_fails_leaves_nothing(server, env, monkeypatch):
    torch = need("torch")
    import ferry.safetensors as fst
    from test_s3 import FaultProxy
    proxy = FaultProxy(server.port, ["503"])  # the first part's PUT gets 503 SlowDown
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        url = server.url("saved/failed.safetensors")
        with pytest.raises(OSError) as e:
            fst.save_file(_tensors(torch), url, context=_ctx(remote_retries=0))
        msg = str(e.value)
        assert url in msg and "HTTP 503 SlowDown" in msg, msg
        assert proxy.seen == ["503"], proxy.seen
    finally:
        proxy.stop()
    assert "saved/failed.safetensors" not in server.keys("saved/")
    assert not server.uploads()
    assert os.listdir(env) == [], os.listdir(env)


def test_save_file_url_without_name(server, env):
    torch = need("torch")
    import ferry.safetensors as fst
    with pytest.raises(OSError) as e:
        fst.save_file({"a": torch.ones(2)}, "s3://%s/" % _moto.BUCKET, context=_ctx())
    assert "no object name" in str(e.value), str(e.value)


def test_sharded_set_from_s3(server, env):
    torch = need("torch")
    st = need("safetensors.torch")
    import ferry.safetensors as fst
    ctx = _ctx()
    shards = {"model-00001-of-00002.safetensors": {"w1": torch.randn(64, 32), "b1": torch.randn(32)},
              "model-00002-of-00002.safetensors": {"w2": torch.randn(32, 8)}}
    weight_map = {}
    for name, ts in shards.items():
        server.put("sharded/" + name, st.save(ts))  # Hugging Face's writer
        weight_map.update({k: name for k in ts})
    index = server.put("sharded/model.safetensors.index.json",
                       json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode())
    got = fst.load_file(index, context=ctx)
    assert sorted(got) == ["b1", "w1", "w2"]
    for ts in shards.values():
        for k, v in ts.items():
            assert torch.equal(got[k], v), k
    # an index naming a shard that is not there: the error names that object
    weight_map["w3"] = "model-00003-of-00003.safetensors"
    bad = server.put("sharded/bad.index.json", json.dumps({"weight_map": weight_map}).encode())
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(bad, context=ctx)
    assert "sharded/model-00003-of-00003.safetensors" in str(e.value), str(e.value)
