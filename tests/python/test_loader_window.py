"""The loader's shard-window shuffle (shard_window, docs/DATA.md): shards visited a window at a
time, each window's samples shuffled together; deterministic for a seed and epoch, every sample
once an epoch, each rank's share of the one global order, resumable. The default order of a
dataset without a cache limit is untouched (torch's DistributedSampler order)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
torch = pytest.importorskip("torch")
import ferry  # noqa: E402

N = 2000


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    d = tmp_path_factory.mktemp("win") / "ds"
    rng = np.random.default_rng(4)
    ferry.write_dataset(d, [rng.integers(0, 60000, size=int(rng.integers(16, 200)), dtype=np.uint16)
                            for _ in range(N)], shard_size=16 << 10)
    return d


def order(path, epoch=0, world=1, rank=0, **kw):
    ld = ferry.Loader(path, batch_size=10, seed=3, device="cpu", world_size=world, rank=rank, **kw)
    ld.set_epoch(epoch)
    out = []
    for _ in ld:
        out += ld.last_indices.tolist()
    ld.close()
    return out


def shard_of(path):
    return np.asarray(ferry.IndexedDataset(path)._shard)


def test_windows_cover_the_epoch_window_by_window(path):
    sh = shard_of(path)
    nsh = int(sh.max()) + 1
    assert nsh >= 10, nsh
    for w in (1, 3, nsh):
        got = order(path, shard_window=w)
        assert sorted(got) == list(range(N)), w
        # the shards in their first-seen order, cut w at a time: each window's samples are
        # exactly those shards' samples, one window after the other
        seen = list(dict.fromkeys(int(sh[i]) for i in got))
        assert sorted(seen) == list(range(nsh))
        pos = 0
        for k in range(0, nsh, w):
            win = set(seen[k:k + w])
            count = int(np.isin(sh, list(win)).sum())
            assert set(int(sh[i]) for i in got[pos:pos + count]) == win, (w, k)
            pos += count
        assert pos == N
    # within a window the samples are shuffled, not in shard order
    got = order(path, shard_window=3)
    assert got != sorted(got)


def test_deterministic_per_seed_and_epoch(path):
    a, b = order(path, shard_window=3), order(path, shard_window=3)
    assert a == b
    assert order(path, epoch=1, shard_window=3) != a
    # the default (no cache limit) and shard_window=0 keep DistributedSampler's order
    want = ferry.distributed_indices(N, 1, 0, seed=3, epoch=0).tolist()
    assert order(path) == want and order(path, shard_window=0) == want


def test_ranks_share_the_global_order(path):
    glob = order(path, shard_window=4)
    for rank in range(3):
        got = order(path, world=3, rank=rank, shard_window=4)
        assert got == [glob[(rank + 3 * j) % N] for j in range(len(got))], rank


def test_resume_and_state_mismatch(path):
    full = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=3)
    want = [full.last_indices.tolist() for _ in full]
    a = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=3)
    for _ in zip(range(7), a):
        pass
    st = a.state_dict()
    assert "window-3" in st["state"], st["state"]
    b = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=3)
    b.load_state_dict(st)
    assert [b.last_indices.tolist() for _ in b] == want[7:]
    # a loader left at shard_window's default takes the state's windows: the run resumes the order
    # it began with, though the default's own choice may differ (cache_bytes, or the default itself)
    c = ferry.Loader(path, batch_size=10, seed=3, device="cpu")
    c.load_state_dict(st)
    assert [c.last_indices.tolist() for _ in c] == want[7:]
    assert "window-3" in c.state_dict()["state"], c.state_dict()["state"]
    # one that names other windows (or none) is refused, naming both orders
    for w in (2, 0):
        d = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=w)
        with pytest.raises(ferry.Error) as e:
            d.load_state_dict(st)
            next(iter(d))
        assert "order was shuffle-window-3" in str(e.value), str(e.value)
    # and a plain shuffle's state resumes in a default loader as a plain shuffle (the default is no
    # windows here, without a cache; test_s3_dataset has a default that differs from the state's)
    p = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=0)
    plain = [p.last_indices.tolist() for _ in p]
    p = ferry.Loader(path, batch_size=10, seed=3, device="cpu", shard_window=0)
    for _ in zip(range(5), p):
        pass
    q = ferry.Loader(path, batch_size=10, seed=3, device="cpu")
    q.load_state_dict(p.state_dict())
    assert [q.last_indices.tolist() for _ in q] == plain[5:]


def test_token_windows(path):
    # seq_len: a token window belongs to the shard of its first token; every window once
    ld = ferry.Loader(path, batch_size=4, seq_len=64, seed=1, device="cpu", shard_window=2)
    got = []
    for _ in ld:
        got += ld.last_indices.tolist()
    assert sorted(got) == list(range(len(got)))
    plain = ferry.Loader(path, batch_size=4, seq_len=64, seed=1, device="cpu")
    assert len(plain) == len(ld)
