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


def test_save_file_to_s3(s3_server, s3_env):
    torch = need("torch")
    st = need("safetensors.torch")
    import ferry.safetensors as fst
    tensors = _tensors(torch)
    url = s3_server.url("saved/model.safetensors")
    ctx = _ctx()
    fst.save_file(tensors, url, metadata={"who": "h15"}, checksum=True, context=ctx)
    body = s3_server.get("saved/model.safetensors")
    head = s3_server.s3.head_object(Bucket=_moto.BUCKET, Key="saved/model.safetensors")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # a 3-part multipart upload
    got = st.load(body)  # Hugging Face's reader takes the object's bytes
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    back = fst.load_file(url, verify=True, context=ctx)  # with the checksums ferry stored
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
    assert not s3_server.uploads()
    assert os.listdir(s3_env) == [], os.listdir(s3_env)  # the staging temporary is gone
    # saved again over it: replaced whole
    tensors["small"] += 10
    fst.save_file(tensors, url, context=ctx)
    assert torch.equal(fst.load_file(url, context=ctx)["small"], tensors["small"])


def test_save_file_upload_fails_leaves_nothing(s3_server, s3_env, monkeypatch):
    torch = need("torch")
    import ferry.safetensors as fst
    from test_s3 import FaultProxy
    proxy = FaultProxy(s3_server.port, ["503"])  # the first part's PUT gets 503 SlowDown
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        url = s3_server.url("saved/failed.safetensors")
        with pytest.raises(OSError) as e:
            fst.save_file(_tensors(torch), url, context=_ctx(remote_retries=0))
        msg = str(e.value)
        assert url in msg and "HTTP 503 SlowDown" in msg, msg
        assert proxy.seen == ["503"], proxy.seen
    finally:
        proxy.stop()
    assert "saved/failed.safetensors" not in s3_server.keys("saved/")
    assert not s3_server.uploads()
    assert os.listdir(s3_env) == [], os.listdir(s3_env)


def test_save_file_url_without_name(s3_server, s3_env):
    torch = need("torch")
    import ferry.safetensors as fst
    with pytest.raises(OSError) as e:
        fst.save_file({"a": torch.ones(2)}, "s3://%s/" % _moto.BUCKET, context=_ctx())
    assert "no object name" in str(e.value), str(e.value)


def test_sharded_set_from_s3(s3_server, s3_env):
    torch = need("torch")
    st = need("safetensors.torch")
    import ferry.safetensors as fst
    ctx = _ctx()
    shards = {"model-00001-of-00002.safetensors": {"w1": torch.randn(64, 32), "b1": torch.randn(32)},
              "model-00002-of-00002.safetensors": {"w2": torch.randn(32, 8)}}
    weight_map = {}
    for name, ts in shards.items():
        s3_server.put("sharded/" + name, st.save(ts))  # Hugging Face's writer
        weight_map.update({k: name for k in ts})
    index = s3_server.put("sharded/model.safetensors.index.json",
                       json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode())
    got = fst.load_file(index, context=ctx)
    assert sorted(got) == ["b1", "w1", "w2"]
    for ts in shards.values():
        for k, v in ts.items():
            assert torch.equal(got[k], v), k
    # an index naming a shard that is not there: the error names that object
    weight_map["w3"] = "model-00003-of-00003.safetensors"
    bad = s3_server.put("sharded/bad.index.json", json.dumps({"weight_map": weight_map}).encode())
    with pytest.raises(FileNotFoundError) as e:  # safetensors' message names what was asked for
        fst.load_file(bad, context=ctx)
    assert "model-00003-of-00003.safetensors" in str(e.value), str(e.value)


def test_checkpoint_on_s3_prefix(s3_server, s3_env):
    torch = need("torch")
    import ferry.checkpoint as fck
    ctx = _ctx()
    prefix = s3_server.url("ckpt/run1")
    assert fck.load_latest(prefix, context=ctx) == (None, {})  # nothing committed under it yet
    assert fck.latest_step(prefix) is None
    state = {"model": {"w": torch.randn(256, 64), "b": torch.arange(10)}, "step": torch.tensor(10)}
    fck.save(state, prefix, 10, context=ctx)
    step_dir = "ckpt/run1/step-000000000010/"
    assert s3_server.keys(step_dir) == [step_dir + n for n in (
        "manifest.json", "rank-00000-of-00001.done", "rank-00000-of-00001.safetensors")]
    assert s3_server.get("ckpt/run1/latest") == b"step-000000000010\n"
    manifest = json.loads(s3_server.get(step_dir + "manifest.json"))
    assert manifest["step"] == 10 and manifest["world"] == 1, manifest
    step, got = fck.load_latest(prefix, context=ctx)
    assert step == 10
    assert torch.equal(got["model"]["w"], state["model"]["w"]) and torch.equal(got["step"], state["step"])
    state["model"]["w"] += 1
    h = fck.async_save(state, prefix, 20, context=ctx)
    assert h.wait(60) is True
    assert fck.latest_step(prefix) == 20
    step, got = fck.load_latest(prefix, context=ctx)
    assert step == 20 and torch.equal(got["model"]["w"], state["model"]["w"])
    assert fck.load(prefix, 10, context=ctx)["model"]["b"].equal(state["model"]["b"])  # keep=2
    with pytest.raises(FileExistsError):  # not after the latest
        fck.save(state, prefix, 15, context=ctx)
    s3_server.put("ckpt/run1/step-000000000005/rank-00000-of-00001.safetensors", b"debris")
    fck.save(state, prefix, 30, context=ctx)  # keep=2: step 10 is pruned (listed, then deleted)
    steps = sorted({k.split("/")[2] for k in s3_server.keys("ckpt/run1/step-")})
    assert steps == ["step-000000000020", "step-000000000030"], steps
    assert fck.prune(prefix, 1) == 1
    assert s3_server.keys("ckpt/run1/") == ["ckpt/run1/latest"] + [
        "ckpt/run1/step-000000000030/" + n for n in (
            "manifest.json", "rank-00000-of-00001.done", "rank-00000-of-00001.safetensors")]
    assert fck.load_latest(prefix, context=ctx)[0] == 30
    assert not s3_server.uploads()
    assert os.listdir(s3_env) == [], os.listdir(s3_env)


def test_checkpoint_on_s3_failed_save_keeps_latest(s3_server, s3_env, monkeypatch):
    torch = need("torch")
    import ferry.checkpoint as fck
    from test_s3 import FaultProxy
    prefix = s3_server.url("ckpt/run2")
    ctx = _ctx(remote_retries=0)  # the prefix's handle keeps the context of its first save
    fck.save({"w": torch.ones(4)}, prefix, 1, context=ctx)
    # the save's GET of `latest` passes; the shard's first part gets 503 SlowDown
    proxy = FaultProxy(s3_server.port, [None, "503"])
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        with pytest.raises(OSError) as e:
            fck.save({"w": torch.ones(3 * MIB)}, prefix, 2, context=ctx)
        assert "HTTP 503 SlowDown" in str(e.value) and "UploadPart 1" in str(e.value), str(e.value)
        assert proxy.seen == [None, "503"], proxy.seen
    finally:
        proxy.stop()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    assert s3_server.keys("ckpt/run2/step-000000000002/") == []  # no shard, no marker, no manifest
    assert s3_server.get("ckpt/run2/latest") == b"step-000000000001\n"
    step, got = fck.load_latest(prefix, context=_ctx())
    assert step == 1 and torch.equal(got["w"], torch.ones(4))
    assert not s3_server.uploads()


def test_prune_lists_past_a_page(s3_server, s3_env):
    torch = need("torch")
    import ferry.checkpoint as fck
    ctx = _ctx()
    prefix = s3_server.url("ckpt/run3")
    # debris of an old step: 130 objects, two pages of ListObjectsV2 (100 keys a page)
    for i in range(130):
        s3_server.put("ckpt/run3/step-000000000001/junk-%03d" % i, b"x")
    fck.save({"w": torch.ones(2)}, prefix, 2, context=ctx)  # its commit prunes the debris
    assert s3_server.keys("ckpt/run3/step-000000000001/") == []
    assert fck.load_latest(prefix, context=ctx)[0] == 2


def test_load_latest_falls_back_on_s3(s3_server, s3_env):
    torch = need("torch")
    import ferry.checkpoint as fck
    ctx = _ctx()
    prefix = s3_server.url("ckpt/run4")
    for step in (1, 2):
        fck.save({"w": torch.full((8,), float(step))}, prefix, step, keep=0, context=ctx)
    assert ferry._ferry.ckpt_steps(prefix) == [2, 1]  # listed: step-N/manifest.json objects
    s3_server.put("ckpt/run4/step-000000000002/rank-00000-of-00001.safetensors", b"damaged")
    with pytest.warns(RuntimeWarning, match="step 2 is damaged, loading step 1"):
        step, got = fck.load_latest(prefix, context=ctx)
    assert step == 1 and torch.equal(got["w"], torch.full((8,), 1.0))


def test_ckpt_steps_local(tmp_path):
    torch = need("torch")
    import ferry.checkpoint as fck
    d = str(tmp_path / "ck")
    for step in (2, 3, 4):
        fck.save({"w": torch.ones(2)}, d, step, keep=0)
    os.mkdir(os.path.join(d, "step-000000000009"))  # no manifest: not committed
    os.mkdir(os.path.join(d, "step-7"))  # not a name ferry makes
    open(os.path.join(d, "step-7", "manifest.json"), "w").close()
    assert ferry._ferry.ckpt_steps(d) == [4, 3, 2]
