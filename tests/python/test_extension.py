"""The extension's shared paths: buffers taken one way by every part (files, datasets, sample
orders), errors from the C library as exceptions, and Python asking the C library (manifests,
the loader's placement) instead of doing it again."""
import json
import os

import pytest

from conftest import need

import ferry  # noqa: E402
from ferry import _ferry  # noqa: E402


def test_dataset_takes_buffers_like_files(tmp_path):
    np = need("numpy")
    samples = [np.arange(n, dtype=np.int32) for n in (3, 0, 5)]
    ferry.write_dataset(tmp_path / "ds", samples)
    ds = _ferry.Dataset(os.fspath(tmp_path / "ds"))
    out = np.zeros(5, dtype=np.int32)
    assert ds.read_into(2, out) == 20 and list(out) == list(range(5))
    # memoryview and bytearray through the same path as File.pread_into
    b = bytearray(12)
    assert ds.read_into(0, memoryview(b)) == 12
    assert np.frombuffer(b, dtype=np.int32).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="read-only"):
        ds.read_into(0, bytes(12))
    with pytest.raises(ValueError, match="holds 4 bytes, 20 are needed"):
        ds.read_into(2, bytearray(4))
    with pytest.raises(TypeError, match="sample index must be an int"):
        ds.sample_bytes("x")
    with pytest.raises(ValueError, match="sample index must not be negative"):
        ds.sample_bytes(-1)
    ds.close()
    with pytest.raises(ValueError, match="the dataset is closed"):
        ds.sample_bytes(0)


def test_dataset_read_into_torch_tensor(tmp_path):
    np = need("numpy")
    torch = need("torch")
    ferry.write_dataset(tmp_path / "ds", [np.arange(4, dtype=np.int64)])
    ds = _ferry.Dataset(os.fspath(tmp_path / "ds"))
    t = torch.zeros(4, dtype=torch.int64)  # DLPack, host memory
    assert ds.read_into(0, t) == 32 and t.tolist() == [0, 1, 2, 3]


def test_sample_orders_take_any_host_buffer():
    np = need("numpy")
    out = bytearray(8 * 6)
    _ferry.randperm_into(6, 7, out)
    assert sorted(np.frombuffer(out, dtype=np.int64).tolist()) == list(range(6))
    with pytest.raises(ValueError, match="randperm_into"):
        _ferry.randperm_into(6, 7, bytearray(8))


def test_path_calls_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as e:
        _ferry.st_open(ferry.default_context(), missing)
    assert e.value.filename == missing
    with pytest.raises(TypeError, match="ferry.Context"):
        _ferry.st_open(object(), missing)
    with pytest.raises(TypeError):
        _ferry.ckpt_prune(3.5, 1)
    assert _ferry.ckpt_latest(tmp_path) is None
    assert _ferry.ckpt_path(tmp_path, 3).endswith("step-000000000003")


def test_manifest_is_read_by_the_c_library(tmp_path):
    torch = need("torch")
    import ferry.checkpoint as ck
    d = tmp_path / "ck"
    ck.save({"x": torch.arange(4)}, d, 1)
    assert _ferry.ckpt_world(os.fspath(d), 1) == 1
    with pytest.raises(FileNotFoundError, match="not committed"):
        ck.load(d, 2)
    # A manifest whose world its shards do not match: ferry.Error, not a silent guess.
    m = os.path.join(_ferry.ckpt_path(os.fspath(d), 1), "manifest.json")
    with open(m) as f:
        man = json.load(f)
    man["world"] = 2
    with open(m, "w") as f:
        json.dump(man, f)
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 1)
    assert e.value.name == "FERRY_ECORRUPT" and "world of 2" in str(e.value)


def test_views_follow_the_c_placement(tmp_path):
    torch = need("torch")
    import ferry.safetensors as fst
    sd = {"a%d" % i: torch.full((100 + i,), i, dtype=torch.float32) for i in range(8)}
    p = tmp_path / "m.safetensors"
    fst.save_file(sd, p)
    ld = _ferry.load_open(ferry.default_context(), os.fspath(p))
    places = [ld.place(i, 0) for i in range(len(ld.entries()))]
    assert all(placed for placed, *_ in places)
    # Everything: one region laid out like the file, views at the C loader's offsets.
    got = fst.load_file(p)
    base = min(t.data_ptr() for t in got.values())
    for (name, _dt, _shape, _nb), (_, _f, off, size) in zip(ld.entries(), places):
        assert got[name].data_ptr() - base == off - min(o for _, _, o, _ in places)
        assert got[name].untyped_storage().nbytes() == size
        assert torch.equal(got[name], sd[name])
    # Two tensors far apart in the file: packed, each 256-byte aligned, one allocation.
    got = fst.load_file(p, keys=["a0", "a7"])
    ptrs = sorted(t.data_ptr() for t in got.values())
    assert ptrs[1] - ptrs[0] == 512  # 400 bytes, rounded up to 256
    assert len({t.untyped_storage().data_ptr() for t in got.values()}) == 1
    assert torch.equal(got["a7"], sd["a7"])
    with pytest.raises(OSError, match="no entry"):
        ld.place(99, 0)
    assert ld.place(0, _ferry.LOAD_PER_TENSOR)[0] is False
