"""Megatron datasets written in the reference layout (a small numpy writer following
megatron/core/datasets/indexed_dataset.py: MMIDIDX, version 1, dtype code, int32 sizes, int64
pointers, int64 document indices) read back identical through libferry; and ferry pack's Megatron
output parses with a reference-style numpy reader. Runs under pytest or as a script."""
import ctypes
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ferrylib  # noqa: E402

(np,) = _ferrylib.need("numpy")
L = _ferrylib.lib()
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
         np.uint16: 8}


def write_reference(prefix, docs, dtype):
    sizes, pointers, ptr = [], [], 0
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            a = np.asarray(d, dtype=dtype)
            f.write(a.tobytes(order="C"))
            sizes.append(a.size)
            pointers.append(ptr)
            ptr += a.size * np.dtype(dtype).itemsize
    doc_idx = list(range(len(docs) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))


def read_reference(prefix):
    buf = open(prefix + ".idx", "rb").read()
    assert buf[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", buf[9:17])
    code = buf[17]
    s, d = struct.unpack("<QQ", buf[18:34])
    dtype = {v: k for k, v in CODES.items()}[code]
    sizes = np.frombuffer(buf, np.int32, s, 34)
    ptrs = np.frombuffer(buf, np.int64, s, 34 + 4 * s)
    docs = np.frombuffer(buf, np.int64, d, 34 + 12 * s)
    data = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")
    out = [np.frombuffer(data[p:p + n * np.dtype(dtype).itemsize].tobytes(), dtype) for p, n in zip(ptrs, sizes)]
    return version, dtype, out, docs


def ferry_read_all(path):
    ctx = ctypes.c_void_p()
    assert L.ferry_ctx_create(ctypes.byref(ctx)) == 0
    ds = ctypes.c_void_p()
    err = L.ferry_dataset_open(ctx, path.encode(), ctypes.byref(ds))
    if err:
        msg = L.ferry_last_error().decode()
        L.ferry_ctx_destroy(ctx)
        return err, msg, None
    out = []
    for i in range(L.ferry_dataset_count(ds)):
        n = L.ferry_dataset_sample_bytes(ds, i)
        b = np.empty(n, np.uint8)
        assert L.ferry_dataset_read(ds, i, b.ctypes.data, n) == n
        out.append(b)
    dt = L.ferry_dataset_dtype(ds)
    L.ferry_dataset_close(ds)
    L.ferry_ctx_destroy(ctx)
    return 0, dt, out


def test_reference_reads_back():
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        for dtype in (np.uint16, np.int32, np.uint8, np.int64, np.float32):
            docs = [rng.integers(0, 30000, size=int(rng.integers(0, 300))).astype(dtype) for _ in range(57)]
            prefix = os.path.join(d, f"ref_{np.dtype(dtype).name}")
            write_reference(prefix, docs, dtype)
            err, code, got = ferry_read_all(prefix)
            assert err == 0, code
            assert code == CODES[dtype]
            assert len(got) == len(docs)
            for a, b in zip(got, docs):
                assert np.array_equal(a.view(dtype), b)
            # a truncated .bin is refused, naming the file and a sample
            size = os.path.getsize(prefix + ".bin")
            if size:
                os.truncate(prefix + ".bin", size // 2)
                err, msg, _ = ferry_read_all(prefix)
                assert err == -5003 and ".bin" in msg and "sample" in msg, msg


def test_pack_megatron_reads_in_reference_reader():
    cli = os.environ.get("FERRY_CLI") or os.path.join(_ferrylib.ROOT, "build", "ferry")
    if not os.path.exists(cli):
        _ferrylib.skip(f"{cli} not built")
    with tempfile.TemporaryDirectory() as d:
        arrays = [np.arange(i * 10, i * 10 + 100 + i, dtype=np.uint16) for i in range(20)]
        paths = []
        for i, a in enumerate(arrays):
            paths.append(os.path.join(d, f"{i:03d}.npy"))
            np.save(paths[-1], a)
        prefix = os.path.join(d, "packed")
        subprocess.run([cli, "pack", "-q", "--format", "megatron", "-o", prefix] + paths, check=True,
                       stdout=subprocess.DEVNULL)
        version, dtype, got, docs = read_reference(prefix)
        assert version == 1 and dtype == np.uint16
        assert list(docs) == list(range(21))
        for a, b in zip(got, arrays):
            assert np.array_equal(a, b)


if __name__ == "__main__":
    test_reference_reads_back()
    test_pack_megatron_reads_in_reference_reader()
    print("test_megatron_reference: 2 passed, 0 failed")
