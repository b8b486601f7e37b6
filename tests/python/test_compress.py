"""Compressed files from Python (docs/FORMATS.md, docs/PYTHON.md, issue 26): ferry.compress_file,
ferry.open / ferry.read of a compressed file into NumPy and torch (CPU, and CUDA where there is a
GPU), ranges, the path reported, the stock tools, a damaged chunk named."""
import os
import shutil
import struct
import subprocess

import pytest

import ferry
from conftest import ferry_cli as _cli, need


def _kinds(np, n):
    rng = np.random.default_rng(3)
    words = np.frombuffer(b"the of ferry moves bytes GPU and memory ", dtype=np.uint8)
    tokens = (rng.zipf(1.3, n // 2) % 50257).astype(np.uint16)
    bf16 = (rng.standard_normal(n // 2).astype(np.float32) * 0.02).view(np.uint32) >> 16
    return {
        "random": rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
        "zero": bytes(n),
        "text": np.resize(words, n).tobytes(),
        "tokens": tokens.tobytes(),
        "bf16": bf16.astype(np.uint16).tobytes(),
    }


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("chunk", [65536, "256k"])
def test_round_trip(tmp_path, codec, chunk):
    np = need("numpy")
    csize = 65536 if chunk == 65536 else 262144
    n = 2 * csize + 4322  # even: tokens and bf16 are 2-byte elements
    for kind, payload in _kinds(np, n).items():
        src, dst = tmp_path / ("%s.bin" % kind), tmp_path / ("%s.fz" % kind)
        src.write_bytes(payload)
        size = ferry.compress_file(src, dst, codec=codec, chunk=chunk, threads=2)
        assert size == dst.stat().st_size
        assert ferry.is_compressed(dst) and not ferry.is_compressed(src)
        with ferry.open(dst) as f:
            assert isinstance(f, ferry.CompressedFile)
            assert (f.size, f.codec, f.chunk_size, f.chunks) == (n, codec, csize, 3)
            if kind == "random":
                assert f.stored_chunks == 3
            buf = np.empty(n, np.uint8)
            assert f.pread_into(buf) == n and buf.tobytes() == payload, kind
            part = np.zeros(csize + 10, np.uint8)  # across a chunk boundary
            assert f.pread_into(part, csize - 5) == csize + 10
            assert part.tobytes() == payload[csize - 5:2 * csize + 5]
            tail = np.zeros(100, np.uint8)  # to the end: short
            assert f.pread_into(tail, n - 30) == 30 and tail[:30].tobytes() == payload[-30:]
            assert f.path_info() == "cpu (host memory)"
        info = {}
        got = ferry.read(dst, offset=7, length=csize, like="numpy", info=info)
        assert got.tobytes() == payload[7:7 + csize]
        assert info == {"compressed": True, "path": "cpu (host memory)", "codec": codec}


def test_torch_read_and_dtype(tmp_path):
    torch = need("torch")
    np = need("numpy")
    t = (torch.randn(300_000) * 0.02).to(torch.bfloat16)
    src, dst = tmp_path / "w.bin", tmp_path / "w.fz"
    src.write_bytes(t.view(torch.uint8).numpy().tobytes())
    ferry.compress_file(src, dst, codec="zstd", chunk="64k")
    with ferry.open(dst) as f:
        assert f.compressed_size < f.size  # bf16: zstd's entropy stage pays
    got = ferry.read(dst, dtype=torch.bfloat16)
    assert isinstance(got, torch.Tensor) and torch.equal(got, t)
    assert np.array_equal(ferry.read(dst, like="numpy", dtype=np.uint16), t.view(torch.uint16).numpy())


def test_cuda_read(tmp_path):
    torch = need("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    t = torch.arange(1_000_000, dtype=torch.int32) % 977
    src, dst = tmp_path / "t.bin", tmp_path / "t.fz"
    src.write_bytes(t.numpy().tobytes())
    for codec in ("zstd", "lz4"):
        ferry.compress_file(src, dst, codec=codec, chunk="256k")
        info = {}
        got = ferry.read(dst, device="cuda", dtype=torch.int32, info=info)
        assert got.is_cuda and torch.equal(got.cpu(), t), info
        assert info["path"].startswith(("nvcomp (", "cpu (nvcomp: ")), info
        print(codec, info["path"])


def test_open_modes_and_refusals(tmp_path):
    src, dst = tmp_path / "a.bin", tmp_path / "a.fz"
    payload = b"ferry " * 50000
    src.write_bytes(payload)
    ferry.compress_file(src, dst, codec="lz4", level=9)
    with ferry.open(dst, compressed=False) as f:  # the raw file
        assert isinstance(f, ferry.File) and f.size == dst.stat().st_size
    with ferry.open(src) as f:
        assert isinstance(f, ferry.File)
    with pytest.raises(ferry.Error, match="not a ferry compressed file"):
        ferry.open(src, compressed=True)
    with pytest.raises(ValueError, match="reading only"):
        ferry.open(dst, "r+", compressed=True)
    with pytest.raises(FileExistsError):
        ferry.compress_file(src, dst, codec="zstd", exclusive=True)
    with pytest.raises(ValueError, match="codec"):
        ferry.compress_file(src, tmp_path / "b.fz", codec="gzip")
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.fz"]  # no temporaries left
    f = ferry.CompressedFile(dst)
    f.set("cz_verify", "0")
    with pytest.raises(ferry.Error):
        f.set("cz_chunk", "1m")  # the file's, not the reader's
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.pread_into(bytearray(10))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_stock_tool_decodes(tmp_path, codec):
    tool = shutil.which(codec)
    if not tool:
        pytest.skip("the %s command-line tool is not installed (apt-get install %s)" % (codec, codec))
    payload = os.urandom(100_000) + b"abc" * 300_000
    src, dst = tmp_path / "a.bin", tmp_path / "a.fz"
    src.write_bytes(payload)
    ferry.compress_file(src, dst, codec=codec, chunk="64k")
    out = subprocess.run([tool, "-d", "-q", "-c", str(dst)], stdout=subprocess.PIPE, check=True).stdout
    assert out == payload


def test_damaged_chunk_is_named(tmp_path):
    src, dst = tmp_path / "a.bin", tmp_path / "a.fz"
    src.write_bytes(b"0123456789abcdef" * 20000)
    ferry.compress_file(src, dst, codec="zstd", chunk="64k")
    b = bytearray(dst.read_bytes())
    index = struct.unpack_from("<Q", b, len(b) - 80 + 32)[0]
    c2 = struct.unpack_from("<Q", b, index + 24 + 2 * 48)[0]  # chunk 2's frame offset
    b[c2 + 20] ^= 0xFF
    dst.write_bytes(bytes(b))
    with pytest.raises(ferry.Error, match=r"chunk 2 \(compressed offset %d" % c2):
        ferry.read(dst, like="numpy")
    # a read that does not cover chunk 2 still works
    assert ferry.read(dst, length=65536, like="numpy").tobytes() == (b"0123456789abcdef" * 20000)[:65536]


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool((a == b).all()) if hasattr(a, "all") else a == b


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_pack_compress_dataset_and_loader(tmp_path, codec):
    """ferry pack --compress: shards are compressed files; IndexedDataset (mmap asked for: it reads
    through the C library instead) and the Loader give the same samples as the plain pack."""
    np = need("numpy")
    torch = need("torch")
    cli = _cli()
    rng = np.random.default_rng(7)
    rows = (rng.zipf(1.4, (400, 512)) % 50257).astype(np.uint16)
    np.save(tmp_path / "in.npy", rows)
    for name, extra in (("plain", []), ("cz", ["--compress", codec])):
        subprocess.run([cli, "pack", "-q", "--shard-size", "64k", "-o", str(tmp_path / name)] + extra +
                       [str(tmp_path / "in.npy")], check=True)
    ds = ferry.IndexedDataset(tmp_path / "cz")
    assert ds.shards > 3 and len(ds) == 400
    assert all(ferry.is_compressed(ds._ds.shard_path(k)) for k in range(ds.shards))
    for i in (0, 1, 199, 399):
        assert np.array_equal(ds[i], rows[i])
    plain = ferry.Loader(str(tmp_path / "plain"), batch_size=16, seq_len=256, shuffle=True, seed=3)
    # chunk_window=0: the full shuffle, the plain pack's order (compressed shards' default is the
    # chunk window: test_loader_cz.py)
    packed = ferry.Loader(str(tmp_path / "cz"), batch_size=16, seq_len=256, shuffle=True, seed=3, chunk_window=0)
    n = 0
    for a, b in zip(plain, packed):
        assert _same(a, b)
        n += 1
    assert n > 10


def test_pack_compress_auto_keeps_random_plain(tmp_path):
    np = need("numpy")
    cli = _cli()
    rng = np.random.default_rng(8)
    np.save(tmp_path / "r.npy", rng.integers(0, 65535, (100, 512), dtype=np.uint16))
    np.save(tmp_path / "t.npy", np.tile(np.arange(512, dtype=np.uint16), (100, 1)))
    for name in ("r", "t"):
        subprocess.run([cli, "pack", "-q", "--compress", "auto", "-o", str(tmp_path / name),
                        str(tmp_path / (name + ".npy"))], check=True)
    r, t = ferry.IndexedDataset(tmp_path / "r"), ferry.IndexedDataset(tmp_path / "t")
    assert not ferry.is_compressed(r._ds.shard_path(0))  # random: zstd saves nothing, stays plain
    assert ferry.is_compressed(t._ds.shard_path(0))
    assert np.array_equal(t[99], np.arange(512, dtype=np.uint16))
    assert not [p for p in os.listdir(tmp_path / "r") if "cz-auto" in p]
