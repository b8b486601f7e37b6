"""ferry.safetensors through the Python package: interop both ways with Hugging Face's safetensors
(every dtype torch and safetensors share, scalars, empty tensors), subset and slice loads against
the full tensor, sharded sets, checksums, safe_open, the NumPy variant and the errors."""
import json
import os
import struct

import pytest

from conftest import need

torch = need("torch")
hf = need("safetensors.torch")
need("numpy")

import ferry  # noqa: E402
import ferry.safetensors as fst  # noqa: E402

SHAPES = ([3, 4], [], [0, 5], [2, 3, 4])


def dtypes():
    """(safetensors name, torch dtype) torch has, F4 aside (packed, checked on its own)."""
    return [(k, v) for k, v in fst._torch_dtypes().items() if k != "F4"]


def rand(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def raw(t):
    """The bytes of a tensor (bitwise comparison: NaNs and all)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


def every_dtype_state():
    sd = {}
    for k, (name, dt) in enumerate(dtypes()):
        for shape in SHAPES:
            sd["%s.%s" % (name, "x".join(map(str, shape)) or "scalar")] = rand(dt, shape, k)
    return sd


def hf_can_load(dt):
    return dt in hf._TYPES.values()


def test_hf_to_ferry_every_dtype(tmp_path):
    sd = {k: v for k, v in every_dtype_state().items() if hf_can_load(v.dtype)}
    p = tmp_path / "hf.safetensors"
    hf.save_file(sd, p, metadata={"who": "hf"})
    for views in (True, False):
        got = fst.load_file(p, views=views)
        assert list(got) == sorted(got, key=lambda k: list(got).index(k))
        assert set(got) == set(sd)
        for k in sd:
            assert same(got[k], sd[k]), (k, got[k], sd[k])
    with fst.safe_open(p, framework="pt") as f:
        assert f.metadata() == {"who": "hf"}
        assert sorted(f.keys()) == sorted(sd)


def test_ferry_to_hf_every_dtype(tmp_path):
    sd = every_dtype_state()
    p = tmp_path / "ferry.safetensors"
    fst.save_file(sd, p, metadata={"who": "ferry"})
    with open(p, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert (8 + n) % 4096 == 0, "data section not 4 KiB-aligned"
    assert header["__metadata__"] == {"who": "ferry"}
    loaded = hf.load_file(p)
    for k, v in sd.items():
        if hf_can_load(v.dtype):
            assert same(loaded[k], v), k
        assert header[k]["dtype"] == k.split(".")[0]
    back = fst.load_file(p)
    for k, v in sd.items():
        assert same(back[k], v), k


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no float4_e2m1fn_x2")
def test_f4_packed(tmp_path):
    t = rand(torch.uint8, [4, 6], 7).view(torch.float4_e2m1fn_x2)
    p = tmp_path / "f4.safetensors"
    fst.save_file({"f4": t}, p)
    with open(p, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        assert json.loads(f.read(n))["f4"]["shape"] == [4, 12]
    assert same(fst.load_file(p)["f4"], t)


def full_file(tmp_path, name="m.safetensors"):
    sd = {
        "emb": torch.randn(64, 48),
        "w1": torch.randn(48, 96).to(torch.bfloat16),
        "b1": torch.arange(96, dtype=torch.int32),
        "w3": torch.randn(4, 6, 8, dtype=torch.float64),
        "norm": torch.ones(48, dtype=torch.float16),
    }
    p = tmp_path / name
    hf.save_file(sd, p)
    return p, sd


def test_subset_and_slices_equal_full(tmp_path):
    p, sd = full_file(tmp_path)
    full = fst.load_file(p)
    got = fst.load_file(p, keys=["b1", "norm"])
    assert list(got) == ["b1", "norm"] or set(got) == {"b1", "norm"}
    assert all(same(got[k], full[k]) for k in got)
    cases = {"emb": (0, 16, 32), "w1": (1, 0, 48), "w3": (2, 3, 7), "b1": (0, 90, None)}
    for views in (True, False):
        got = fst.load_file(p, keys=["norm"], slices=cases, views=views)
        assert set(got) == {"norm"} | set(cases)
        assert same(got["emb"], full["emb"][16:32])
        assert same(got["w1"], full["w1"][:, 0:48].contiguous())
        assert same(got["w3"], full["w3"][:, :, 3:7].contiguous())
        assert same(got["b1"], full["b1"][90:])
        assert same(got["norm"], full["norm"])
    # negative dimension and indices, as in Python slices
    got = fst.load_file(p, slices={"w3": (-1, -4, -1)})
    assert same(got["w3"], full["w3"][..., -4:-1].contiguous())
    # tensor-parallel ranks: the pieces put together are the tensor
    parts = [fst.load_file(p, slices={"w1": (1, r * 24, (r + 1) * 24)})["w1"] for r in range(4)]
    assert same(torch.cat(parts, dim=1), full["w1"])


def test_sharded_index_and_dir(tmp_path):
    p, sd = full_file(tmp_path)
    a = {k: sd[k] for k in ("emb", "w1")}
    b = {k: sd[k] for k in ("b1", "w3", "norm")}
    d = tmp_path / "model"
    d.mkdir()
    hf.save_file(a, d / "model-00001-of-00002.safetensors")
    hf.save_file(b, d / "model-00002-of-00002.safetensors")
    wm = {k: "model-00001-of-00002.safetensors" for k in a}
    wm.update({k: "model-00002-of-00002.safetensors" for k in b})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    for got in (fst.load_file(d / "model.safetensors.index.json"), fst.load_model_dir(d),
                fst.load_file(d, keys=["norm", "emb"]), fst.load_file(d, slices={"emb": (0, 0, 8)})):
        for k, v in got.items():
            want = sd[k][:8] if got[k].shape[0] == 8 and k == "emb" else sd[k]
            assert same(v, want), k


def test_views_share_one_allocation(tmp_path):
    p, sd = full_file(tmp_path)
    got = fst.load_file(p)
    storages = {t.untyped_storage().data_ptr() for t in got.values()}
    assert len(storages) == 1
    got = fst.load_file(p, views=False)
    assert len({t.untyped_storage().data_ptr() for t in got.values()}) == len(got)


def test_checksum_mismatch_names_file_and_tensor(tmp_path):
    p, sd = full_file(tmp_path)
    q = tmp_path / "sums.safetensors"
    fst.save_file(sd, q, checksum=True)
    got = fst.load_file(q, verify=True)
    assert all(same(got[k], sd[k]) for k in sd)
    with fst.safe_open(q, "pt") as f:
        start = f._st.data_start
        off = [t for t in f._st.tensors() if t[0] == "b1"][0][3]
        assert f.verify("b1") is True
    with open(q, "r+b") as f:
        f.seek(off + 5)
        c = f.read(1)
        f.seek(off + 5)
        f.write(bytes([c[0] ^ 0xFF]))
    fst.load_file(q)  # without verify, the flipped byte goes unnoticed
    with pytest.raises(ferry.Error) as e:
        fst.load_file(q, verify=True)
    assert e.value.code == ferry.EVERIFY
    assert str(q) in str(e.value) and '"b1"' in str(e.value)
    with pytest.raises(ferry.Error) as e:
        fst.load_file(p, verify=True)  # HF's file has no checksums: verify refuses it
    assert e.value.code == ferry.EVERIFY and "no stored checksum" in str(e.value)
    assert start % 4096 == 0


def test_safe_open_and_get_slice(tmp_path):
    p, sd = full_file(tmp_path)
    with fst.safe_open(p, framework="pt", device="cpu") as f:
        assert set(f.keys()) == set(sd)
        assert f.metadata() is None
        for k in sd:
            assert same(f.get_tensor(k), sd[k])
        s = f.get_slice("w3")
        assert s.get_shape() == [4, 6, 8] and s.get_dtype() == "F64"
        w3 = sd["w3"]
        for idx in (1, slice(1, 3), (slice(None), 2), (slice(None), slice(1, 5, 2), 3), (-1,),
                    (slice(None), slice(None), slice(2, 8))):
            assert torch.equal(s[idx], w3[idx]), idx
        with pytest.raises(fst.SafetensorError):
            f.get_tensor("nope")


def test_numpy_variant(tmp_path):
    import numpy as np
    import safetensors.numpy as hfn
    from ferry.safetensors import numpy as fnp
    arrs = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array(7, dtype=np.int64),
            "c": np.zeros((0, 3), np.uint16), "d": np.array([True, False])}
    p = tmp_path / "np.safetensors"
    fnp.save_file(arrs, p, metadata={"k": "v"})
    back = hfn.load_file(str(p))
    assert all(np.array_equal(back[k], arrs[k]) and back[k].dtype == arrs[k].dtype for k in arrs)
    q = tmp_path / "hfnp.safetensors"
    hfn.save_file(arrs, str(q))
    got = fnp.load_file(q, slices={"a": (1, 1, 3)})
    assert np.array_equal(got["a"], arrs["a"][:, 1:3])
    got = fnp.load_file(q)
    assert all(np.array_equal(got[k], arrs[k]) for k in arrs)
    hf.save_file({"x": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path / "bf.safetensors")
    with pytest.raises(fst.SafetensorError, match="BF16"):
        fnp.load_file(tmp_path / "bf.safetensors")


def test_errors(tmp_path):
    p, sd = full_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        fst.load_file(tmp_path / "missing.safetensors")
    with pytest.raises(KeyError, match="nope"):
        fst.load_file(p, keys=["nope"])
    with pytest.raises(ValueError, match="not inside"):
        fst.load_file(p, slices={"emb": (0, 10, 100)})
    with pytest.raises(ValueError, match="dimension"):
        fst.load_file(p, slices={"emb": (2, 0, 1)})
    with pytest.raises(ValueError, match="device"):
        fst.load_file(p, device="tpu:0")
    bad = tmp_path / "bad.safetensors"
    data = p.read_bytes()
    bad.write_bytes(data[:-1])  # data section one byte short
    with pytest.raises(ferry.Error) as e:
        fst.load_file(bad)
    assert e.value.code == ferry.ECORRUPT and str(bad) in str(e.value)
    # save_file: safetensors.torch's checks and messages
    with pytest.raises(ValueError, match="Expected a dict"):
        fst.save_file([torch.zeros(1)], tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        fst.save_file({"a": [1, 2]}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        fst.save_file({"a": torch.zeros(4, 4).t()}, tmp_path / "x.safetensors")
    base = torch.zeros(8)
    with pytest.raises(RuntimeError, match="share memory"):
        fst.save_file({"a": base, "b": base[:4]}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="metadata"):
        fst.save_file({"a": base}, tmp_path / "x.safetensors", metadata={"n": 1})
    with pytest.raises(OSError):
        fst.save_file({"a/b": base}, tmp_path / "x.safetensors")  # names with '/' are refused
    with pytest.raises(FileNotFoundError):
        fst.save_file({"a": base}, tmp_path / "no" / "dir" / "x.safetensors")
    assert not os.path.exists(tmp_path / "x.safetensors")


def test_save_file_reuses_the_default_contexts_writer(tmp_path):
    """save_file keeps the default context's writer (its pinned slots) for the next call; a
    replaced default context gets a new one; a failed save leaves the writer clean for the next."""
    a = {"x": torch.arange(10.0)}
    fst.save_file(a, tmp_path / "a.safetensors")
    ctx, w = fst._idle_writer
    assert ctx is ferry.default_context()
    fst.save_file({"y": torch.ones(3)}, tmp_path / "b.safetensors")
    assert fst._idle_writer[1] is w
    assert list(fst.load_file(tmp_path / "b.safetensors")) == ["y"]  # nothing of the first save
    with pytest.raises(OSError):
        fst.save_file(a, tmp_path / "no-such-dir" / "c.safetensors")
    assert fst._idle_writer[1] is w
    fst.save_file({"z": torch.zeros(2)}, tmp_path / "c.safetensors")
    assert list(fst.load_file(tmp_path / "c.safetensors")) == ["z"]
    old = ferry.default_context()
    ferry.set_default_context(ferry.Context())
    try:
        fst.save_file(a, tmp_path / "d.safetensors")
        assert fst._idle_writer[0] is ferry.default_context() and fst._idle_writer[1] is not w
    finally:
        ferry.set_default_context(old)
    assert torch.equal(fst.load_file(tmp_path / "d.safetensors")["x"], a["x"])
