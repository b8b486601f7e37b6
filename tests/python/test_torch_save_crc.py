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


def test_staged_pieces_pipelined_across_storages(tmp_path, monkeypatch):
    """The GPU path's host side, run on host tensors: storages staged through a few small pinned
    buffers in pieces (more pieces than buffers, so buffers are reused across storages), the
    crc32s combined per storage, the buffers given back once, and the file is what torch.load
    reads with every record's crc32 right."""
    piece, nbuf = 1 << 16, 3
    monkeypatch.setattr(ft, "_STAGE_PIECE", piece)
    monkeypatch.setattr(ft, "_STAGE_BUFFERS", nbuf)
    monkeypatch.setattr(ft, "_staged_device", lambda buf: True)
    monkeypatch.setattr(ft, "_stagers", {})
    monkeypatch.setattr(ft, "_after_current", lambda stream, dev: None)
    monkeypatch.setattr(ft, "_stager_take", lambda dev: (
        [torch.empty(piece + ft._ALIGN, dtype=torch.uint8) for _ in range(nbuf)], None))
    copies = []

    class Ev:
        def synchronize(self):
            pass

    def copy_out(stream, dst, src):
        copies.append(src.numel())
        dst.copy_(src)
        return Ev()

    monkeypatch.setattr(ft, "_copy_out", copy_out)
    state = {"a": torch.randn((3 * piece + 100) // 4), "b": torch.arange(5000, dtype=torch.int16),
             "c": torch.randn(7, 9).t(), "e": torch.empty(0)}
    p = tmp_path / "m.pt"
    ft.save(state, p)
    total = (3 * piece + 100) + 10000 + 7 * 9 * 4
    assert sum(copies) == total and max(copies) <= piece and len(copies) > nbuf, copies
    import zipfile
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    got = torch.load(p, weights_only=True)
    for k, v in state.items():
        assert torch.equal(got[k], v) and got[k].stride() == v.stride(), k
    assert [len(v) for v in ft._stagers.values()] == [1]  # given back, once


def test_writes_split_at_block_boundaries():
    """_pwrite: a range at a zip's 64-byte offset goes as a head up to the first 4 KiB boundary,
    the whole blocks in one request, and the tail: only partial blocks meet the page cache."""
    class F:
        def __init__(self):
            self.calls = []

        def pwrite_from_async(self, buf, at):
            n = buf.numel() if isinstance(buf, torch.Tensor) else len(buf)
            self.calls.append((at, n))

            class Done:
                def result(self):
                    return n
            return Done()

    for at, n, want in [(64, 3 * 4096, [(64, 4032), (4096, 8192), (12288, 64)]),
                        (4096, 8192, [(4096, 8192)]),
                        (100, 50, [(100, 50)]),
                        (4000, 200, [(4000, 200)]),
                        (4096, 5000, [(4096, 4096), (8192, 904)])]:
        f = F()
        got = ft._pwrite(f, torch.zeros(n, dtype=torch.uint8), at)
        assert f.calls == want and got.result() == n, (at, n, f.calls)
