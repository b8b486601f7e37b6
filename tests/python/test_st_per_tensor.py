"""The safetensors loader's per-tensor cost (issue 22): placing thousands of small tensors is linear
in their number (ferry_st_load_place was quadratic), and the views load_file hands out are right
(values, dtypes, shapes, one shared allocation) whatever order the placements are asked in."""
import json
import os
import time

import numpy as np
import pytest

import ferry
from ferry import _ferry


def _write(path, specs):
    """specs: [(name, dtype, shape, bytes)]; returns the payload by name."""
    header, off, blobs = {}, 0, {}
    for name, dt, shape, raw in specs:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs[name] = raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as w:
        w.write(len(h).to_bytes(8, "little"))
        w.write(h)
        for _, _, _, raw in specs:
            w.write(raw)
    return blobs


def _many(path, n):
    rng = np.random.default_rng(n)
    return _write(path, [("t%05d" % i, "F32", (3,), rng.random(3, dtype=np.float32).tobytes())
                         for i in range(n)])


def _place_all(path):
    ld = _ferry.load_open(ferry.default_context(), os.fspath(path))
    n = len(ld.entries())
    best = None
    for _ in range(5):
        t = time.perf_counter()
        places = [ld.place(i, 0) for i in range(n)]
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return places, best


def test_place_is_linear(tmp_path):
    """10x the tensors takes about 10x the time (it took about 230x: each call scanned them all)."""
    small, large = tmp_path / "small.safetensors", tmp_path / "large.safetensors"
    _many(small, 2000)
    _many(large, 20000)
    _, t_small = _place_all(small)
    places, t_large = _place_all(large)
    assert places[0][0] and places[-1][0], places[:2]
    assert t_large < 50 * t_small, (t_small, t_large)  # quadratic: about 230x


def test_place_any_order(tmp_path):
    """Asked in reverse, or again after a destination was set, the answers are the in-order ones."""
    path = tmp_path / "m.safetensors"
    rng = np.random.default_rng(1)
    # a sparse selection makes the packed layout (not the file's span), where offsets accumulate
    specs = [("a%03d" % i, "F32", (5 + i,), rng.random(5 + i, dtype=np.float32).tobytes()) for i in range(40)]
    _write(path, specs)
    ctx = ferry.default_context()
    ld = _ferry.load_open(ctx, os.fspath(path))
    for i in range(0, 40, 4):
        ld.select("a%03d" % i)
    n = len(ld.entries())
    fwd = [ld.place(i, 0) for i in range(n)]
    rev = [ld.place(i, 0) for i in reversed(range(n))][::-1]
    assert fwd == rev
    mixed = [ld.place(i, 0) for i in (3, 1, 7, 0, 9, 2)]
    assert mixed == [fwd[i] for i in (3, 1, 7, 0, 9, 2)]
    offs = [p[2] for p in fwd]
    assert offs == sorted(offs) and len(set(offs)) == n, offs
    buf = np.empty(1 << 12, np.uint8)
    ld.set_dest(2, buf.ctypes.data, buf.nbytes)  # entry 2 leaves the shared region
    after = [ld.place(i, 0) for i in range(n)]
    assert after[2][0] is False
    assert after[3][2] == fwd[2][2], (after[3], fwd[2])  # the next one moves into its place


def test_views_many_small(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    import ferry.safetensors as st
    path = tmp_path / "mixed.safetensors"
    rng = np.random.default_rng(7)
    specs = []
    for i in range(300):
        kind = i % 4
        if kind == 0:
            specs.append(("f%03d" % i, "F32", (2, 3), rng.random(6, dtype=np.float32).tobytes()))
        elif kind == 1:
            specs.append(("h%03d" % i, "F16", (4,), rng.random(4).astype(np.float16).tobytes()))
        elif kind == 2:
            specs.append(("i%03d" % i, "I64", (), rng.integers(0, 1 << 40, 1).astype(np.int64).tobytes()))
        else:
            specs.append(("u%03d" % i, "U8", (1, 8, 1), rng.integers(0, 255, 8).astype(np.uint8).tobytes()))
    _write(path, specs)
    out = st.load_file(path)
    assert list(out) == [s[0] for s in specs]
    np_dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "U8": np.uint8}
    storages = set()
    for name, dt, shape, raw in specs:
        t = out[name]
        assert tuple(t.shape) == tuple(shape), (name, t.shape, shape)
        assert t.is_contiguous(), name
        want = np.frombuffer(raw, np_dt[dt]).reshape(shape)
        assert np.array_equal(t.numpy(), want), name
        storages.add(t.untyped_storage().data_ptr())
    assert len(storages) == 1, storages  # views of one allocation
