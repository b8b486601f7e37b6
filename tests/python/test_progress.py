"""progress= on ferry's long Python calls (issue 25): a callback progress(done, total) from the
calling thread, monotonic, at most every ~0.1 s plus the last call with done == total; True draws a
tqdm bar (ImportError without tqdm)."""
import os
import sys
import threading
import time

import numpy as np
import pytest

import ferry
import ferry.checkpoint as ckpt
import ferry.safetensors as st
from ferry import _progress

torch = pytest.importorskip("torch")


class Recorder:
    def __init__(self):
        self.calls = []  # (monotonic time, done, total, thread)

    def __call__(self, done, total):
        self.calls.append((time.monotonic(), done, total, threading.get_ident()))

    def check(self, total=None):
        assert self.calls, "no progress call"
        dones = [c[1] for c in self.calls]
        totals = {c[2] for c in self.calls}
        assert len(totals) == 1, totals
        (t,) = totals
        if total is not None:
            assert t == total
        assert dones == sorted(dones), dones
        assert all(0 <= d <= t for d in dones), dones
        assert dones[-1] == t, "the last call has done == total: %r" % (dones,)
        assert dones.count(t) == 1, "done == total once: %r" % (dones,)
        assert {c[3] for c in self.calls} == {threading.get_ident()}, "called from the calling thread"
        gaps = [b[0] - a[0] for a, b in zip(self.calls[:-2], self.calls[1:-1])]
        assert all(g >= _progress.INTERVAL * 0.95 for g in gaps), gaps
        return t


def test_run_rate_limited_monotonic_last():
    """A slow call polled from the caller: several calls, ~0.1 s apart, the last at total."""
    state = {"n": 0}

    def work():
        for _ in range(60):
            time.sleep(0.01)
            state["n"] += 1000
        return "r"

    rec = Recorder()
    assert _progress.run(work, rec, 60000, lambda: state["n"] * 2) == "r"  # poll overshoots: clamped
    rec.check(60000)
    assert 3 <= len(rec.calls) <= 8, [c[1:3] for c in rec.calls]


def test_run_raises_the_calls_error_without_last_call():
    rec = Recorder()

    def bad():
        time.sleep(0.15)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _progress.run(bad, rec, 10, lambda: 5)
    assert all(c[1] < 10 for c in rec.calls)


def test_bad_progress_type():
    with pytest.raises(TypeError, match="progress="):
        st.save_file({"a": torch.zeros(4)}, "/nonexistent/x.safetensors", progress="yes")


@pytest.fixture
def tensors():
    return {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3, 1000, dtype=torch.int64)}


def nbytes(t):
    return sum(v.numel() * v.element_size() for v in t.values())


def test_safetensors_save_load(tmp_path, tensors):
    p = tmp_path / "m.safetensors"
    rec = Recorder()
    assert st.save_file(tensors, p, progress=rec) is None
    rec.check(nbytes(tensors))
    rec = Recorder()
    got = st.load_file(p, progress=rec)
    rec.check(os.path.getsize(p))
    assert torch.equal(got["a"], tensors["a"]) and torch.equal(got["b"], tensors["b"])


def test_checkpoint_save_async_load(tmp_path, tensors):
    d = tmp_path / "ck"
    rec = Recorder()
    ckpt.save({"model": tensors}, d, 1, keep=0, progress=rec)
    rec.check(nbytes(tensors))
    rec = Recorder()
    h = ckpt.async_save({"model": tensors}, d, 2, keep=0, progress=rec)
    assert h.wait()
    rec.check(nbytes(tensors))
    rec = Recorder()
    state = ckpt.load(d, 1, progress=rec)
    assert rec.check() > nbytes(tensors)  # the shard's size: data and header
    assert torch.equal(state["model"]["a"], tensors["a"])
    rec = Recorder()
    step, state = ckpt.load_latest(d, progress=rec)
    assert step == 2
    rec.check()
    assert torch.equal(state["model"]["b"], tensors["b"])


def test_write_dataset(tmp_path):
    samples = [np.arange(i % 500 + 1, dtype=np.int32) for i in range(2000)]
    rec = Recorder()
    assert ferry.write_dataset(tmp_path / "ds", samples, progress=rec) >= 1
    rec.check(sum(s.nbytes for s in samples))


def test_true_without_tqdm_raises_before_any_work(tmp_path, tensors, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    p = tmp_path / "m.safetensors"
    with pytest.raises(ImportError, match="tqdm is not installed"):
        st.save_file(tensors, p, progress=True)
    assert not p.exists()
    with pytest.raises(ImportError, match="tqdm"):
        ferry.write_dataset(tmp_path / "ds", [b"abc"], progress=True)


def test_true_draws_a_tqdm_bar(tmp_path, tensors, capsys):
    pytest.importorskip("tqdm", reason="tqdm is not installed (scripts/test.sh installs it)")
    p = tmp_path / "m.safetensors"
    st.save_file(tensors, p, progress=True)
    st.load_file(p, progress=True)
    err = capsys.readouterr().err
    assert "m.safetensors" in err and "100%" in err, err
    assert err.count("100%") >= 2, err


def test_default_makes_no_thread(tmp_path, tensors):
    """progress=None (the default) runs on the caller's thread, as before."""
    before = {t.name for t in threading.enumerate()}
    st.save_file(tensors, tmp_path / "m.safetensors")
    assert "ferry-progress" not in before | {t.name for t in threading.enumerate()}
