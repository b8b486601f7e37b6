"""Interoperability of ferry's safetensors reader and writer with Hugging Face's `safetensors`.

Files written by HF (every dtype its serializer knows, scalars, empty tensors) read back in ferry
byte for byte; files written by ferry (every dtype ferry knows) load in HF byte for byte, with the
data section 4 KiB-aligned. Drives libferry through ctypes (public API only), so it needs no Python
package of ferry's. Runs under pytest or alone:
    python3 tests/python/test_safetensors_interop.py [path/to/libferry.so]
Skips (exit 77) only when the `safetensors` or `numpy` module is missing.
"""
import ctypes
import os
import struct
import sys
import tempfile

try:
    import numpy as np
    from safetensors import TensorSpec, deserialize, safe_open, serialize
except ImportError as e:  # pragma: no cover
    if __name__ == "__main__":
        print(f"skipped: {e.name} is not installed (pip install safetensors numpy)")
        sys.exit(77)
    import pytest

    pytest.skip(f"{e.name} is not installed", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# HF serializer dtype names -> safetensors header names, with bits per element.
HF_DTYPES = {
    "bool": ("BOOL", 8), "int8": ("I8", 8), "uint8": ("U8", 8), "int16": ("I16", 16), "uint16": ("U16", 16),
    "int32": ("I32", 32), "uint32": ("U32", 32), "int64": ("I64", 64), "uint64": ("U64", 64),
    "float16": ("F16", 16), "float32": ("F32", 32), "float64": ("F64", 64), "bfloat16": ("BF16", 16),
    "float8_e4m3fn": ("F8_E4M3", 8), "float8_e5m2": ("F8_E5M2", 8), "float8_e8m0fnu": ("F8_E8M0", 8),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 8), "float8_e5m2fnuz": ("F8_E5M2FNUZ", 8),
    "complex64": ("C64", 64),
}
FERRY_DTYPES = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
                "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def load_lib():
    cands = [a for a in sys.argv[1:] if a.endswith(".so")] + [os.environ.get("FERRY_LIB", "")]
    cands += [os.path.join(ROOT, d, "libferry.so") for d in ("build", "build-asan")]
    for c in cands:
        if c and os.path.exists(c):
            lib = ctypes.CDLL(c)
            break
    else:
        raise RuntimeError("libferry.so not found: build first (cmake --build build) or set FERRY_LIB")
    P, I, S, U64, C = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_char_p
    sig = {
        "ferry_ctx_create": (I, [ctypes.POINTER(P)]), "ferry_ctx_destroy": (None, [P]),
        "ferry_last_error": (C, []), "ferry_dtype_from_name": (I, [C, ctypes.POINTER(I)]), "ferry_dtype_name": (C, [I]),
        "ferry_st_open": (I, [P, C, ctypes.POINTER(P)]), "ferry_st_destroy": (None, [P]),
        "ferry_st_count": (S, [P]), "ferry_st_name": (C, [P, S]), "ferry_st_dtype": (I, [P, S]),
        "ferry_st_shape": (I, [P, S, ctypes.POINTER(U64), I]), "ferry_st_nbytes": (U64, [P, S]),
        "ferry_st_read": (ctypes.c_ssize_t, [P, S, P, S]), "ferry_st_verify": (I, [P, S]),
        "ferry_st_data_start": (U64, [P]), "ferry_st_metadata_get": (C, [P, C]),
        "ferry_st_writer_create": (I, [P, ctypes.POINTER(P)]), "ferry_st_writer_destroy": (None, [P]),
        "ferry_st_writer_add": (I, [P, C, I, I, ctypes.POINTER(U64), P, S]),
        "ferry_st_writer_metadata": (I, [P, C, C]), "ferry_st_writer_save": (ctypes.c_int64, [P, C, I]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


LIB = load_lib()


def dtype(name):
    """enum ferry_dtype of a safetensors dtype name."""
    out = ctypes.c_int()
    assert LIB.ferry_dtype_from_name(name, ctypes.byref(out)) == 0, name
    return out.value


CTX = ctypes.c_void_p()
assert LIB.ferry_ctx_create(ctypes.byref(CTX)) == 0


def nbytes(bits, shape):
    n = bits
    for d in shape:
        n *= d
    return n // 8


def rng_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def ferry_read_all(path):
    st = ctypes.c_void_p()
    r = LIB.ferry_st_open(CTX, path.encode(), ctypes.byref(st))
    assert r == 0, LIB.ferry_last_error().decode()
    out = {}
    try:
        for i in range(LIB.ferry_st_count(st)):
            dims = (ctypes.c_uint64 * 32)()
            nd = LIB.ferry_st_shape(st, i, dims, 32)
            n = LIB.ferry_st_nbytes(st, i)
            buf = ctypes.create_string_buffer(max(n, 1))
            assert LIB.ferry_st_read(st, i, buf, n) == n, LIB.ferry_last_error().decode()
            out[LIB.ferry_st_name(st, i).decode()] = (
                LIB.ferry_dtype_name(LIB.ferry_st_dtype(st, i)).decode(), [dims[k] for k in range(nd)],
                buf.raw[:n], LIB.ferry_st_verify(st, i))
        meta = LIB.ferry_st_metadata_get(st, b"who")
        return out, (meta.decode() if meta else None), LIB.ferry_st_data_start(st)
    finally:
        LIB.ferry_st_destroy(st)


def test_hf_to_ferry():
    keep, specs, want = [], {}, {}
    for k, (hf, (name, bits)) in enumerate(sorted(HF_DTYPES.items())):
        for shape in ([3, 4], [], [0, 5]):
            data = rng_bytes(nbytes(bits, shape), k)
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            keep.append(buf)
            tname = f"{hf}.{len(shape)}d.{'x'.join(map(str, shape))}"
            specs[tname] = TensorSpec(dtype=hf, shape=shape, data_ptr=ctypes.addressof(buf), data_len=len(data))
            want[tname] = (name, shape, data)
    blob = serialize(specs, {"who": "hf"})
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "hf.safetensors")
        with open(p, "wb") as f:
            f.write(blob)
        got, meta, _ = ferry_read_all(p)
    assert meta == "hf"
    assert set(got) == set(want)
    for k, (dt, shape, data) in want.items():
        assert got[k][0] == dt, (k, got[k][0], dt)
        assert got[k][1] == shape, (k, got[k][1], shape)
        assert got[k][2] == data, k
        assert got[k][3] == 0  # HF stores no checksums


def test_ferry_to_hf():
    w = ctypes.c_void_p()
    assert LIB.ferry_st_writer_create(CTX, ctypes.byref(w)) == 0
    keep, want = [], {}
    try:
        for k, name in enumerate(FERRY_DTYPES):
            bits = BITS.get(name, 0) or (8 if name in ("BOOL", "U8", "I8") or name.startswith("F8") else
                                         16 if name in ("I16", "U16", "F16", "BF16") else
                                         32 if name in ("I32", "U32", "F32") else 64)
            shapes = ([4, 4], [0, 3]) if name in BITS else ([3, 4], [], [0, 5])
            for shape in shapes:
                data = rng_bytes(nbytes(bits, shape), 100 + k)
                buf = ctypes.create_string_buffer(data, max(len(data), 1))
                keep.append(buf)
                dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
                tname = f"{name}.{len(shape)}d.{'x'.join(map(str, shape))}"
                r = LIB.ferry_st_writer_add(w, tname.encode(), dtype(name.encode()), len(shape),
                                            dims, buf, len(data))
                assert r >= 0, LIB.ferry_last_error().decode()
                want[tname] = (name, shape, data)
        assert LIB.ferry_st_writer_metadata(w, b"who", "ferry \u00e9\"\\".encode()) == 0
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "ferry.safetensors")
            size = LIB.ferry_st_writer_save(w, p.encode(), 1)
            assert size > 0, LIB.ferry_last_error().decode()
            blob = open(p, "rb").read()
            assert len(blob) == size
            (hlen,) = struct.unpack("<Q", blob[:8])
            assert (8 + hlen) % 4096 == 0, "data section must start 4 KiB-aligned"
            got = dict(deserialize(blob))
            with safe_open(p, framework="numpy") as f:
                meta = f.metadata()
            back, _, start = ferry_read_all(p)
        assert start % 4096 == 0
        assert meta["who"] == "ferry \u00e9\"\\"
        assert set(got) == set(want)
        for k, (dt, shape, data) in want.items():
            assert got[k]["dtype"] == dt, (k, got[k]["dtype"], dt)
            assert list(got[k]["shape"]) == shape, k
            assert bytes(got[k]["data"]) == data, k
            assert meta[f"ferry.xxh3:{k}"] and back[k][3] == 1, k  # checksum present and verified
    finally:
        LIB.ferry_st_writer_destroy(w)


def test_numpy_values():
    """A float32 tensor written by ferry reads back in HF's numpy loader with the same values."""
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.5
    w = ctypes.c_void_p()
    assert LIB.ferry_st_writer_create(CTX, ctypes.byref(w)) == 0
    dims = (ctypes.c_uint64 * 3)(2, 3, 4)
    assert LIB.ferry_st_writer_add(w, b"a", dtype(b"F32"), 3, dims, a.ctypes.data, a.nbytes) >= 0
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "v.safetensors")
        assert LIB.ferry_st_writer_save(w, p.encode(), 0) > 0
        from safetensors.numpy import load_file
        b = load_file(p)["a"]
    LIB.ferry_st_writer_destroy(w)
    assert b.dtype == np.float32 and b.shape == (2, 3, 4) and np.array_equal(a, b)


if __name__ == "__main__":
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok {name}")
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAILED {name}: {e!r}")
    print(f"{3 - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
