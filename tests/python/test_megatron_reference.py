"""Megatron datasets written in the reference layout (a small numpy writer following
megatron/core/datasets/indexed_dataset.py: MMIDIDX, version 1, dtype code, int32 sizes, int64
pointers, int64 document indices) read back identical through ferry.IndexedDataset; and ferry's
Megatron output (write_dataset, ferry pack) parses with a reference-style numpy reader."""
import os
import struct
import subprocess
import tempfile

import pytest

from conftest import ferry_cli, need

np = need("numpy")
import ferry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def ferry_read_all(path, mmap):
    """(0, NumPy dtype, samples as uint8 arrays) or (error code, message, None)."""
    try:
        ds = ferry.IndexedDataset(path, mmap=mmap)
    except ferry.Error as e:
        return e.code, str(e), None
    with ds:
        out = [np.array(a).view(np.uint8) for a in ds]
        return 0, ds.dtype, out


def test_reference_reads_back():
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        for dtype in (np.uint16, np.int32, np.uint8, np.int64, np.float32):
            docs = [rng.integers(0, 30000, size=int(rng.integers(0, 300))).astype(dtype) for _ in range(57)]
            prefix = os.path.join(d, f"ref_{np.dtype(dtype).name}")
            write_reference(prefix, docs, dtype)
            for mmap in (True, False):
                err, code, got = ferry_read_all(prefix, mmap)
                assert err == 0, code
                assert code == np.dtype(dtype)  # the index's code CODES[dtype], read as its type
                assert len(got) == len(docs)
                for a, b in zip(got, docs):
                    assert np.array_equal(a.view(dtype), b)
            ds = ferry.IndexedDataset(prefix)
            assert ds.format == "megatron" and ds.dtype == np.dtype(dtype)
            assert np.array_equal(ds.sizes, [len(d) for d in docs])
            ds.close()
            # a truncated .bin is refused, naming the file and a sample
            size = os.path.getsize(prefix + ".bin")
            if size:
                os.truncate(prefix + ".bin", size // 2)
                err, msg, _ = ferry_read_all(prefix, True)
                assert err == ferry.ECORRUPT and ".bin" in msg and "sample" in msg, msg


def test_pack_megatron_reads_in_reference_reader():
    cli = ferry_cli()
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


def test_write_dataset_megatron_reads_in_reference_reader():
    with tempfile.TemporaryDirectory() as d:
        arrays = [np.arange(i * 7, i * 7 + 3 * i, dtype=np.int32) for i in range(30)]
        prefix = os.path.join(d, "w")
        assert ferry.write_dataset(prefix, arrays, format="megatron") == 1
        version, dtype, got, docs = read_reference(prefix)
        assert version == 1 and dtype == np.int32
        assert list(docs) == list(range(31))
        for a, b in zip(got, arrays):
            assert np.array_equal(a, b)
