"""ferry.torch.save's crc32s (issue 24, item 3): a storage larger than a piece is checksummed in
pieces on the pool's threads and the pieces' crc32s combined (crc32_combine), so one large tensor
no longer checksums on one core; the zip's crc32s are right (zipfile.testzip, torch.load, ferry's
CLI). A CUDA storage goes through pinned buffers and is checksummed there: tests/gpu."""
import os
import threading
import zlib

import pytest

from conftest import need

torch = need("torch")
import ferry.torch as ft  # noqa: E402


def test_crc32_is_zlibs():
    for n in (0, 1, 7, 4096, 1 << 20):
        b = os.urandom(n)
        assert ft._crc32(b) == zlib.crc32(b) and ft._crc32(b, 12345) == zlib.crc32(b, 12345), n


def test_crc32_combine_matches_zlib():
    for la, lb in [(0, 5), (5, 0), (1, 1), (1000, 4096), (65537, 3), (3, 1 << 20)]:
        a, b = os.urandom(la), os.urandom(lb)
        assert ft._crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b), (la, lb)


def test_large_storage_checksummed_in_pieces(tmp_path, monkeypatch):
    piece = 1 << 20
    monkeypatch.setattr(ft, "_CRC_PIECE", piece)
    calls = []
    real = ft._crc32

    def crc32(data, value=0):
        calls.append((memoryview(data).nbytes, threading.current_thread().name))
        return real(data, value)

    monkeypatch.setattr(ft, "_crc32", crc32)
    big = torch.randn((8 * piece + 12345) // 4)  # 8 pieces and a part
    small = torch.arange(10, dtype=torch.int16)
    p = tmp_path / "m.pt"
    ft.save({"big": big, "small": small}, p)
    sizes = sorted(n for n, _ in calls)
    assert sizes.count(piece) == 8 and max(sizes) == piece, sizes
    assert all(name.startswith("ferry-crc32") for _, name in calls), calls
    import zipfile
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None  # every record's crc32 right
    got = torch.load(p, weights_only=True)
    assert torch.equal(got["big"], big) and torch.equal(got["small"], small)
