"""ferry's sampler equals torch.utils.data.DistributedSampler index for index, through the package
(ferry.distributed_indices): many sizes (with FERRY_SLOW=1 also n around randperm's switch from
random() to random64() at UINT32_MAX // 20), ranks, seeds, epochs, shuffle and drop_last."""
import os

import pytest

from conftest import need

np = need("numpy")
torch = need("torch")
from torch.utils.data import DistributedSampler  # noqa: E402

import ferry  # noqa: E402
from ferry import _ferry  # noqa: E402

SIZES = [0, 1, 2, 3, 5, 8, 13, 64, 100, 127, 1000, 4096, 9999, 65537]
THRESHOLD = (2**32 - 1) // 20  # randperm_cpu: n below it uses random() % (n - i)


def torch_indices(n, R, r, shuffle, seed, epoch, drop_last):
    s = DistributedSampler(range(n), num_replicas=R, rank=r, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    s.set_epoch(epoch)
    return np.fromiter(iter(s), dtype=np.int64, count=len(s))


def test_matches_torch():
    checked = 0
    for n in SIZES:
        for R in (1, 2, 3, 8, 64):
            for drop_last in (False, True):
                for shuffle in (True, False):
                    for seed, epoch in ((0, 0), (42, 1), (2**31 + 5, 7), (2**40 + 3, 2)):
                        for r in sorted({0, R // 2, R - 1}):
                            want = torch_indices(n, R, r, shuffle, seed, epoch, drop_last)
                            got = ferry.distributed_indices(n, R, r, shuffle=shuffle, seed=seed,
                                                            epoch=epoch, drop_last=drop_last)
                            assert got.dtype == np.int64
                            assert np.array_equal(got, want), (n, R, r, shuffle, seed, epoch, drop_last,
                                                               got[:10], want[:10])
                            checked += 1
    assert checked > 1000


def test_order_argument_matches_shuffle_flag():
    for n, R, r in ((0, 1, 0), (10, 3, 2), (1000, 8, 5)):
        for drop_last in (False, True):
            a = ferry.distributed_indices(n, R, r, seed=3, epoch=4, drop_last=drop_last, order="shuffle")
            b = torch_indices(n, R, r, True, 3, 4, drop_last)
            assert np.array_equal(a, b)
            a = ferry.distributed_indices(n, R, r, seed=3, epoch=4, drop_last=drop_last, order="sequential")
            b = torch_indices(n, R, r, False, 3, 4, drop_last)
            assert np.array_equal(a, b)


def test_block_order():
    """Blocks are permutations of neighbours, padded and strided as DistributedSampler does."""
    n, block = 1000, 64
    g = ferry.order_indices(n, "block", seed=5, epoch=1, block=block)
    assert sorted(g.tolist()) == list(range(n))
    # each run of `block` positions (but the short last block's run) holds one block's members
    starts = sorted({int(i) // block for i in g[:block]})
    assert len(starts) == 1
    assert not np.array_equal(g, ferry.order_indices(n, "block", seed=5, epoch=2, block=block))
    assert np.array_equal(ferry.order_indices(n, "sequential"), np.arange(n))
    assert np.array_equal(ferry.order_indices(n, "shuffle", seed=7, epoch=3),
                          torch.randperm(n, generator=torch.Generator().manual_seed(10)).numpy())
    for R, drop_last in ((3, False), (3, True), (7, False)):
        parts = [ferry.distributed_indices(n, R, r, order="block", block=block, seed=5, epoch=1,
                                           drop_last=drop_last) for r in range(R)]
        k = len(parts[0])
        assert all(len(p) == k for p in parts)
        merged = np.empty(k * R, np.int64)
        for r in range(R):
            merged[r::R] = parts[r]
        ext = np.concatenate([g, g])[:k * R]
        assert np.array_equal(merged, ext)


def test_errors():
    with pytest.raises(ValueError, match="rank"):
        ferry.distributed_indices(10, 2, 2)
    with pytest.raises(ValueError):
        ferry.distributed_indices(10, 0, 0)
    with pytest.raises(ValueError):
        ferry.order_indices(10, "random")


def test_randperm_matches_torch():
    sizes = [1, 2, 10, 1000, 123457]
    if os.environ.get("FERRY_SLOW") == "1":
        sizes += [THRESHOLD - 1, THRESHOLD, THRESHOLD + 1]
    for n in sizes:
        for seed in (0, 1, 123456789):
            want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
            got = np.empty(n, dtype=np.int64)
            _ferry.randperm_into(n, seed, got)
            assert np.array_equal(got, want), (n, seed)
            del want, got
