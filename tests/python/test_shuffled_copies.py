"""Pre-shuffled copies from Python (issue 27): write_dataset(shuffled_copies=N, seed=S) and
Loader(copies=True): per rank per epoch the loader's sample ids (last_indices) are
distributed_indices of epoch e mod N's order, with and without padding, the bytes are the
original samples', and the state_dict resumes it exactly."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import ferry  # noqa: E402

N = 101


def _samples():
    rng = np.random.default_rng(4)
    return [rng.integers(0, 60000, size=1 + (i * 7) % 23, dtype=np.uint16) for i in range(N)]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    p = tmp_path_factory.mktemp("copies") / "ds"
    ferry.write_dataset(p, _samples(), shard_size=512, shuffled_copies=2, seed=9)
    return p


def _epoch(path, world, rank, epoch, drop_last, copies):
    ld = ferry.Loader(path, batch_size=5, world_size=world, rank=rank, seed=9, epoch=epoch,
                      drop_last=drop_last, device="cpu", copies=copies)
    ids, data = [], []
    for batch, offsets in ld:
        idx = ld.last_indices
        ids.extend(idx.tolist())
        offsets = offsets.tolist()
        data.extend(batch[offsets[k]:offsets[k + 1]].numpy() for k in range(len(idx)))
    ld.close()
    return ids, data


@pytest.mark.parametrize("world,drop_last", [(1, False), (3, False), (4, True), (7, False)])
@pytest.mark.parametrize("copies", [True, False])
def test_ids_and_bytes(ds, world, drop_last, copies):
    samples = _samples()
    assert sorted(os.listdir(ds)).count("ferry.copies") == 1
    assert ferry.IndexedDataset(ds).copies == 2
    for epoch in range(4):
        for rank in range(world):
            ids, data = _epoch(ds, world, rank, epoch, drop_last, copies)
            want = ferry.distributed_indices(N, world, rank, True, 9, epoch % 2 if copies else epoch,
                                             drop_last)
            assert ids == want.tolist(), (world, rank, epoch)
            for i, d in zip(ids, data):
                assert np.array_equal(d, samples[i])


def test_copy_files_hold_the_epoch_order(ds):
    raw = b"".join(s.tobytes() for s in _samples())
    for c in range(2):
        order = ferry.order_indices(N, "shuffle", seed=9, epoch=c)
        got = b"".join((ds / f).read_bytes() for f in sorted(os.listdir(ds))
                       if f.startswith(f"copy-{c:03d}-shard-"))
        assert got == b"".join(_samples()[i].tobytes() for i in order)
        assert len(got) == len(raw)


def test_resume(ds):
    full, _ = _epoch(ds, 3, 2, 1, False, True)
    ld = ferry.Loader(ds, batch_size=5, world_size=3, rank=2, seed=9, epoch=1, device="cpu", copies=True)
    it = iter(ld)
    first = []
    for _ in range(3):
        next(it)
        first.extend(ld.last_indices.tolist())
    st = ld.state_dict()
    ld.close()
    ld = ferry.Loader(ds, batch_size=5, world_size=3, rank=2, seed=9, device="cpu", copies=True)
    ld.load_state_dict(st)
    rest = []
    for _ in ld:
        rest.extend(ld.last_indices.tolist())
    ld.close()
    assert first + rest == full


def test_refusals(ds, tmp_path):
    with pytest.raises(Exception, match="copies"):
        next(iter(ferry.Loader(ds, batch_size=5, seed=8, device="cpu", copies=True)))
    plain = tmp_path / "plain"
    ferry.write_dataset(plain, _samples())
    with pytest.raises(Exception, match="copies"):
        next(iter(ferry.Loader(plain, batch_size=5, seed=9, device="cpu", copies=True)))
    with pytest.raises(ValueError):
        ferry.write_dataset(tmp_path / "m", _samples(), format="megatron", shuffled_copies=2)
