"""write_dataset with its value checks (issue 21) against the same call without them: ~100 MB of
uint16 tokens (50 M), from int64 arrays (converted and range-checked) and from uint16 arrays (no
conversion), in samples of 1000 and of 100 tokens, to DIR (default /dev/shm). The least CPU time
of REPS runs is printed (process CPU: the figure to compare on a shared machine).

    PYTHONPATH=<ferry package> python bench/write-dataset-values.py [DIR] [REPS]
Run it with two packages (before and after) to compare.
"""
import os
import shutil
import sys
import time

import numpy as np

import ferry

DIR = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
out = os.path.join(DIR, "ferry-bench-wd")
tokens = 50_000_000
rng = np.random.default_rng(0)
for per in (1000, 100):
    n = tokens // per
    base = rng.integers(0, 65536, size=tokens, dtype=np.int64)
    for name, arr in (("int64 -> uint16", base), ("uint16 -> uint16", base.astype(np.uint16))):
        samples = np.split(arr, n)
        best = float("inf")
        for _ in range(REPS):
            shutil.rmtree(out, ignore_errors=True)
            t = time.process_time()
            ferry.write_dataset(out, samples, dtype=np.uint16)
            best = min(best, time.process_time() - t)
        print(f"{name}, {n} samples of {per}: {best:.3f} s CPU ({tokens * 2 / best / 1e6:.0f} MB/s)")
shutil.rmtree(out, ignore_errors=True)
