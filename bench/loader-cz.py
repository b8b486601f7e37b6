#!/usr/bin/env python3
"""The loader over compressed shards against the same shards plain (issue 26): the pipeline's own
CPU per sample (ferry.Loader.stats()["cpu_cores"] over the samples it delivered), which holds on a
loaded machine where samples/s does not.

    PYTHONPATH=<ferry> python bench/loader-cz.py [--dir /dev/shm/ferry-loader-cz] [--samples 20000]
        [--chunks 1m,64k] [--orders shuffle,sequential] [--seconds 3] [--rounds 2]

Writes a dataset of --samples samples of 2,049 uint16 tokens (16 MiB shards), then copies of its
shards compressed with ferry.compress_file(codec="zstd", chunk=C) for each --chunks C; runs
ferry.Loader(batch_size=64, seq_len=2048, device="cpu", threads=1) over each for --seconds, the
datasets alternating, --rounds times; prints a row per dataset and order: the median pipeline CPU
per sample and its ratio to the plain dataset's.
"""
import argparse
import glob
import os
import shutil
import statistics
import time

import numpy as np

import ferry


def make(d, n):
    plain = os.path.join(d, "plain")
    if not os.path.exists(os.path.join(plain, "ferry.idx")):
        rng = np.random.default_rng(0)
        base = (rng.zipf(1.3, size=2049 * 256) % 50000).astype(np.uint16)
        # views of one array (write_dataset keeps the samples it is given until it has written
        # them: a view keeps its whole base alive)
        span = len(base) - 2049
        ferry.write_dataset(plain, (base[(i * 7919) % span:(i * 7919) % span + 2049] for i in range(n)),
                            dtype=np.uint16, shard_size=16 << 20)
    return plain


def compressed(d, plain, chunk):
    out = os.path.join(d, "zstd-" + chunk)
    if not os.path.exists(os.path.join(out, "ferry.idx")):
        os.makedirs(out, exist_ok=True)
        for p in sorted(glob.glob(os.path.join(plain, "*.fsh"))):
            ferry.compress_file(p, os.path.join(out, os.path.basename(p)), codec="zstd", chunk=chunk)
        shutil.copy(os.path.join(plain, "ferry.idx"), os.path.join(out, "ferry.idx"))
    return out


def run(prefix, order, seconds):
    ld = ferry.Loader(prefix, batch_size=64, seq_len=2048, device="cpu", order=order, threads=1)
    it = iter(ld)
    next(it)
    t0, k = time.perf_counter(), 0
    s0 = ld.stats()
    while time.perf_counter() - t0 < seconds:
        try:
            b = next(it)
        except StopIteration:
            it = iter(ld)
            continue
        k += b.shape[0]
    el = time.perf_counter() - t0
    s1 = ld.stats()
    ld.close()
    # cpu_ns: the pipeline's CPU since the loader started (its counter); per sample delivered
    cpu = (s1.get("cpu_ns", 0) - s0.get("cpu_ns", 0)) / 1e9
    return cpu / max(1, k) * 1e6, k / el


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--dir", default="/dev/shm/ferry-loader-cz")
    a.add_argument("--samples", type=int, default=20000)
    a.add_argument("--chunks", default="1m,64k")
    a.add_argument("--orders", default="shuffle,sequential")
    a.add_argument("--seconds", type=float, default=3)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--keep", action="store_true")
    o = a.parse_args()
    os.makedirs(o.dir, exist_ok=True)
    plain = make(o.dir, o.samples)
    sets = [("plain", plain)] + [("zstd " + c, compressed(o.dir, plain, c)) for c in o.chunks.split(",")]
    try:
        for order in o.orders.split(","):
            got = {name: [] for name, _ in sets}
            for _ in range(o.rounds):
                for name, path in sets:
                    got[name].append(run(path, order, o.seconds))
            base = statistics.median(us for us, _ in got["plain"])
            for name, _ in sets:
                us = statistics.median(u for u, _ in got[name])
                sps = statistics.median(r for _, r in got[name])
                print(f"TABLE loader-cz {order} {name} | {us:.1f} us pipeline CPU a sample | "
                      f"{us / base:.1f}x plain; {sps:.0f} samples/s (median of {o.rounds})")
    finally:
        if not o.keep:
            shutil.rmtree(o.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
