"""Loader rate and CPU with documents off and on (issue 21): the C loader alone (_ferry.Loader,
each batch released as it comes, position_ids copied out when on) and ferry.Loader on the CPU
(torch tensors). uint16 tokens in DIR (default /dev/shm), 200,000 documents of 50..1000 tokens
(~105 M tokens), windows of 2048, batch 16, shuffled, one pipeline thread. Off and on alternate,
ROUNDS rounds; the best rate and the least CPU per batch of each are printed. CPU time is the
figure to compare on a shared machine: rates move with the other processes.

    PYTHONPATH=<ferry package> python bench/loader-documents.py [DIR] [ROUNDS]
DEVICE=cuda puts ferry.Loader's batches on the GPU. OFF_ONLY=1 runs documents off only, without
naming the knob: for a package from before it existed (the off path against the commit before).
"""
import os
import shutil
import sys
import time

import numpy as np

import ferry
from ferry import _ferry

DIR = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
DEVICE = os.environ.get("DEVICE", "cpu")
MODES = (0,) if os.environ.get("OFF_ONLY") else (0, 1)
B, L = 16, 2048
path = os.path.join(DIR, "ferry-bench-docs")
shutil.rmtree(path, ignore_errors=True)
rng = np.random.default_rng(0)
lens = rng.integers(50, 1000, size=200_000)
toks = rng.integers(0, 65536, size=int(lens.sum()), dtype=np.uint16)
ferry.write_dataset(path, np.split(toks, np.cumsum(lens)[:-1]))
del toks
ds = ferry.IndexedDataset(path, mmap=False)
pos = np.empty(B * L, np.int64)
cu = np.empty(B * L + 1, np.int32)


def c_loader(docs, batches=800):
    knobs = {"batch_size": B, "seq_len": L, "order": "shuffle", "seed": 1, "threads": 1, "prefetch": 4}
    if docs:
        knobs["documents"] = 1
    cl = _ferry.Loader(ds._ds, knobs, -1)
    for _ in range(20):
        cl.next().release()
    m0 = cl.metrics()["cpu_ns"]
    t, c = time.perf_counter(), time.process_time()
    for _ in range(batches):
        b = cl.next()
        if docs:
            b.documents(pos, cu)
        b.release()
    el, cpu = time.perf_counter() - t, time.process_time() - c
    pipe = (cl.metrics()["cpu_ns"] - m0) / batches
    cl.close()
    return batches * B / el, pipe, cpu / batches * 1e9


def py_loader(docs, batches=400):
    ld = ferry.Loader(ds, batch_size=B, seq_len=L, device=DEVICE, seed=1,
                      **({"documents": True} if docs else {}))
    it = iter(ld)
    for _ in range(20):
        next(it)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    if DEVICE != "cpu":
        import torch
        torch.cuda.synchronize()
    el, cpu = time.perf_counter() - t, time.process_time() - c
    ld.close()
    return batches * B / el, cpu / batches * 1e9


res = {k: [] for k in ("c0", "c1", "p0", "p1")}
for _ in range(ROUNDS):
    for d in MODES:
        res[f"c{d}"].append(c_loader(d))
        res[f"p{d}"].append(py_loader(bool(d)))
for d in MODES:
    r = res[f"c{d}"]
    pipe = min(x[1] for x in r)
    print(f"C loader     documents={d}: {max(x[0] for x in r):9.0f} windows/s, pipeline CPU "
          f"{pipe / 1e3:6.1f} us/batch ({pipe / B / L:.2f} ns/token), process CPU "
          f"{min(x[2] for x in r) / 1e3:6.1f} us/batch")
for d in MODES:
    r = res[f"p{d}"]
    print(f"ferry.Loader ({DEVICE}) documents={d}: {max(x[0] for x in r):9.0f} windows/s, process CPU "
          f"{min(x[1] for x in r) / 1e3:6.1f} us/batch")
ds.close()
shutil.rmtree(path, ignore_errors=True)
