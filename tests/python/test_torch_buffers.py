"""torch tensors as buffers without DLPack (issue 22): torch's __dlpack__ cost 11-12 us a tensor,
most of a per-piece future's cost; the extension reads data_ptr() and nbytes instead, with the
checks DLPack makes. Tensors that path does not take (grad, non-contiguous, subclasses) still go
through DLPack, with its errors."""
import os

import numpy as np
import pytest

import ferry

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")


@pytest.fixture
def counted(monkeypatch):
    calls = []
    orig = torch.Tensor.__dlpack__

    def wrapped(self, *a, **k):
        calls.append(1)
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", wrapped)
    return calls


def test_plain_tensors_skip_dlpack(data, counted):
    path, payload = data
    with ferry.open(path) as f:
        base = torch.zeros(70000, dtype=torch.uint8)
        v = base[1000:1000 + 4096]  # a view with a storage offset
        assert f.pread_into(v, 123) == 4096
        assert bytes(v.numpy()) == payload[123:123 + 4096]
        w = torch.empty(1000, dtype=torch.float32)  # nbytes, not numel
        assert f.pread_into_async(w, 8).result() == 4000
        assert w.numpy().tobytes() == payload[8:4008]
        bufs = [torch.empty(n, dtype=torch.uint8) for n in (1, 4095, 65536)]
        assert f.read_batch([(o, b) for o, b in zip((5, 77, 4096), bufs)]) == [1, 4095, 65536]
        for o, b in zip((5, 77, 4096), bufs):
            assert bytes(b.numpy()) == payload[o:o + len(b)]
        src = torch.arange(256, dtype=torch.uint8)
        assert f.pread_into(torch.empty(0, dtype=torch.uint8), 0) == 0
    out = os.path.join(os.path.dirname(path), "w.bin")
    with ferry.open(out, "w") as g:
        assert g.pwrite_from(src, 0) == 256
    with open(out, "rb") as r:
        assert r.read() == bytes(range(256))
    assert counted == [], "torch.Tensor.__dlpack__ was called %d times" % len(counted)


def test_refusals_stay(data, counted):
    path, _ = data
    with ferry.open(path) as f:
        nc = torch.zeros(64, 64, dtype=torch.uint8).t()
        with pytest.raises(ValueError, match="contiguous"):
            f.pread_into(nc, 0)
        g = torch.zeros(16, requires_grad=True)
        with pytest.raises(Exception):
            f.pread_into(g, 0)
    assert len(counted) >= 2  # both went the general way


def test_subclass_goes_through_dlpack(data, counted):
    class Mine(torch.Tensor):
        pass

    path, payload = data
    t = torch.zeros(100, dtype=torch.uint8).as_subclass(Mine)
    with ferry.open(path) as f:
        assert f.pread_into(t, 0) == 100
    assert bytes(t.numpy()) == payload[:100]
    assert counted, "a subclass keeps its own __dlpack__"
