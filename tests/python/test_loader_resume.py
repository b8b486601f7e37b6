"""The loader's epoch and position semantics (issue 21, item 1): set_epoch after load_state_dict
keeps the resumed position; set_epoch of another epoch starts it at batch 0; iter() mid-epoch and
after the end; the state names its world size, and a state resumed at another one is remapped
where that is exact (every sample once over the epoch) and refused otherwise."""
import pytest

from conftest import need

np = need("numpy")
torch = need("torch")
import ferry  # noqa: E402

N = 101  # samples


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("resume") / "ds"
    ferry.write_dataset(p, [np.full(1 + i % 9, i, np.int32) for i in range(N)])
    return p


def loader(path, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("seed", 3)
    return ferry.Loader(path, device="cpu", **kw)


def batches(ld, k):
    """k batches of one iteration, as their item indices."""
    out = []
    for _ in zip(range(k), ld):
        out.append(ld.last_indices.tolist())
    return out


def test_set_epoch_after_resume_keeps_position(path):
    # the reproduction: resume at epoch 0 batch 5, set_epoch(0): the state still says batch 5
    full = loader(path)
    want = batches(full, len(full))
    a = loader(path)
    batches(a, 5)
    st = a.state_dict()
    assert (st["epoch"], st["batch"]) == (0, 5)
    b = loader(path)
    b.load_state_dict(st)
    b.set_epoch(0)
    assert (b.state_dict()["epoch"], b.state_dict()["batch"]) == (0, 5)
    assert batches(b, len(b)) == want[5:]
    assert b.epoch == 1 and b.state_dict()["batch"] == 0


def test_epoch_loop_resumed_equals_uninterrupted(path):
    # the docs' loop calls set_epoch every epoch: a run resumed mid-epoch 1 sees what the
    # uninterrupted run saw from there on
    def run(ld, start, stop_after=None):
        seen = []
        for epoch in range(start, 3):
            ld.set_epoch(epoch)
            for _ in ld:
                seen.append((epoch, ld.last_indices.tolist()))
                if stop_after is not None and len(seen) == stop_after:
                    return seen, ld.state_dict()
        return seen, None

    full, _ = run(loader(path), 0)
    cut = len(full) // 2 + 1  # mid-epoch 1
    part, st = run(loader(path), 0, stop_after=cut)
    resumed = loader(path)
    resumed.load_state_dict(st)
    rest, _ = run(resumed, st["epoch"])
    assert part + rest == full


def test_set_epoch_other_epoch_starts_it(path):
    ld = loader(path)
    batches(ld, 3)
    ld.set_epoch(1)
    assert (ld.epoch, ld.state_dict()["batch"]) == (1, 0)
    got = batches(ld, 1)[0]
    assert got == ferry.distributed_indices(N, 1, 0, seed=3, epoch=1)[:4].tolist()
    # back to epoch 0: its batch 0 again
    ld.set_epoch(0)
    assert batches(ld, 1)[0] == ferry.distributed_indices(N, 1, 0, seed=3, epoch=0)[:4].tolist()
    with pytest.raises(ValueError):
        ld.set_epoch(-1)


def test_iter_semantics(path):
    ld = loader(path)
    n = len(ld)
    first = batches(ld, 2)
    # an iteration left early continues where it stopped (mid-epoch)
    more = batches(ld, n)
    assert len(more) == n - 2 and ld.epoch == 1
    assert first + more == [ld_b for ld_b in batches(loader(path), n)]
    # after the end of an epoch, iter() runs the next epoch, in that epoch's order
    nxt = batches(ld, 1)[0]
    assert nxt == ferry.distributed_indices(N, 1, 0, seed=3, epoch=1)[:4].tolist()


def test_state_names_world_size_and_is_refused_where_not_exact(path):
    a = loader(path, world_size=2, rank=1)
    batches(a, 3)
    st = a.state_dict()
    assert (st["world_size"], st["rank"], st["batch_size"], st["seed"]) == (2, 1, 4, 3)
    assert " world_size=2 rank=1 " in st["state"] and " dataset_bytes=" in st["state"]
    # 3 batches x 4 x 2 ranks = 24 samples: not whole steps of 4 x 4 at world size 4
    b = loader(path, world_size=4, rank=1)
    with pytest.raises(ferry.Error, match=r"rank 1 of world_size 2.*rank 1 of world_size 4"):
        b.load_state_dict(st)
    # another rank of the same world size is refused; the same rank resumes
    with pytest.raises(ferry.Error, match="rank 1 of world_size 2, this loader is rank 0"):
        loader(path, world_size=2, rank=0).load_state_dict(st)
    c = loader(path, world_size=2, rank=1)
    c.load_state_dict(st)
    assert c.state_dict()["batch"] == 3


def test_state_remapped_to_another_world_size_exactly(path):
    # 2 ranks take 4 batches of 4 (32 samples); 4 ranks resume at their batch 2: over the epoch
    # every sample is seen once, plus only the 4-rank order's padding (104 - 101 = 3 repeats)
    seen, st = [], None
    for r in range(2):
        a = loader(path, world_size=2, rank=r)
        seen += sum(batches(a, 4), [])
        st = a.state_dict()
    for r in range(4):
        b = loader(path, world_size=4, rank=r)
        b.load_state_dict(st)
        assert (b.epoch, b.state_dict()["batch"]) == (0, 2)
        rest = sum(batches(b, len(b)), [])
        # the rest is what an uninterrupted 4-rank run gives from its batch 2
        assert rest == ferry.distributed_indices(N, 4, r, seed=3)[8:].tolist()
        seen += rest
        assert b.epoch == 1
    counts = np.bincount(seen, minlength=N)
    assert len(seen) == 104 and counts.min() == 1 and (counts == 2).sum() == 3


def test_state_refuses_another_dataset(path, tmp_path):
    # as many samples, other lengths: the dataset's bytes differ
    other = tmp_path / "other"
    ferry.write_dataset(other, [np.full(2 + i % 9, i, np.int32) for i in range(N)])
    a = loader(path)
    batches(a, 1)
    with pytest.raises(ferry.Error, match="another dataset"):
        loader(other).load_state_dict(a.state_dict())
