"""ferry's sampler equals torch.utils.data.DistributedSampler index for index: many sizes (including
n around randperm's switch from random() to random64() at UINT32_MAX // 20 when FERRY_SLOW=1), ranks,
seeds, epochs, shuffle and drop_last. Runs under pytest or as a script (exit 77 when skipped)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ferrylib  # noqa: E402

np, torch = _ferrylib.need("numpy", "torch")
from torch.utils.data import DistributedSampler  # noqa: E402

L = _ferrylib.lib()
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
                            got = _ferrylib.distributed_indices(L, np, n, R, r, shuffle, seed, epoch,
                                                                drop_last)
                            assert np.array_equal(got, want), (n, R, r, shuffle, seed, epoch, drop_last)
                            checked += 1
    assert checked > 1000


def test_randperm_matches_torch():
    ptr = __import__("ctypes").POINTER(__import__("ctypes").c_int64)
    sizes = [1, 2, 10, 1000, 123457]
    if os.environ.get("FERRY_SLOW") == "1":
        sizes += [THRESHOLD - 1, THRESHOLD, THRESHOLD + 1]
    for n in sizes:
        for seed in (0, 1, 123456789):
            want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
            got = np.empty(n, dtype=np.int64)
            assert L.ferry_randperm(n, seed, got.ctypes.data_as(ptr)) == 0
            assert np.array_equal(got, want), (n, seed)
            del want, got


if __name__ == "__main__":
    test_matches_torch()
    test_randperm_matches_torch()
    print("test_sampler_torch: 2 passed, 0 failed")
