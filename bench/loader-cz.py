#!/usr/bin/env python3
"""The loader over compressed shards against the same shards plain (issue 26): the pipeline's own
CPU per sample (ferry.Loader.stats()["cpu_ns"] over the samples it delivered), which holds on a
loaded machine where samples/s does not, against the floor: plain's CPU per sample plus one core's
decoding (and checking) of a sample's bytes of the same shards.

    PYTHONPATH=<ferry> python bench/loader-cz.py [--dir /dev/shm/ferry-loader-cz] [--samples 20000]
        [--sets zstd-1m,zstd-64k,lz4-1m,lz4-64k] [--orders shuffle,sequential] [--seconds 3]
        [--rounds 2] [--full-shuffle] [--chunk-cache 32m,...] [--device cuda --decode cpu,gpu]

Writes a dataset of --samples samples of 2,049 uint16 tokens (16 MiB shards), then copies of its
shards compressed with ferry.compress_file(codec=C, chunk=K) for each --sets C-K; runs
ferry.Loader(batch_size=64, seq_len=2048, device="cpu", threads=1) over each for --seconds, the
datasets alternating, --rounds times; prints a row per dataset and order: the median pipeline CPU
per sample, its ratio to the plain dataset's and to the floor. The floor's decoding is timed as
ferry.CompressedFile(cz_threads=1).pread_into of every shard whole (the calling thread's CPU, where cz_threads=1 decodes; best of 3), per
sample's bytes. --full-shuffle adds the order shuffle with chunk_window=0 (every sample drawn from
the whole dataset) where the loader has that knob; --chunk-cache runs the shuffle once per
chunk_cache value given (the knob's default otherwise).

--device cuda (the GPU machine, bench/gpu-loader-cz.sh): batches go to the GPU, and each compressed
set runs once per --decode mode (the loader's cz_decode: cpu decodes on the pipeline thread, gpu with
nvCOMP into its device cache, auto picks); each row adds what decompression costs the loader in
cores: (its CPU per sample - plain's) x its samples/s, against issue 26's target of at most one
core, and the chunks nvCOMP decoded (gpu_chunk_decodes).
"""
import argparse
import glob
import inspect
import os
import shutil
import statistics
import time

import numpy as np

import ferry

SEQ = 2048


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


def compressed(d, plain, name):
    codec, chunk = name.split("-")
    out = os.path.join(d, name)
    if not os.path.exists(os.path.join(out, "ferry.idx")):
        os.makedirs(out, exist_ok=True)
        for p in sorted(glob.glob(os.path.join(plain, "*.fsh"))):
            ferry.compress_file(p, os.path.join(out, os.path.basename(p)), codec=codec, chunk=chunk)
        shutil.copy(os.path.join(plain, "ferry.idx"), os.path.join(out, "ferry.idx"))
    return out


def decode_floor(path):
    """One core's decoding of every shard, whole: seconds of the decoding thread's CPU per byte (best of 3)."""
    best, total = None, 0
    for _ in range(3):
        cpu, total = 0.0, 0
        for p in sorted(glob.glob(os.path.join(path, "*.fsh"))):
            f = ferry.CompressedFile(p)
            f.set("cz_threads", "1")
            buf = bytearray(f.size)
            t = time.thread_time()
            f.pread_into(buf, 0)
            cpu += time.thread_time() - t
            total += f.size
            f.close()
        best = cpu if best is None else min(best, cpu)
    return best / total


def run(prefix, order, seconds, device="cpu", **kw):
    ld = ferry.Loader(prefix, batch_size=64, seq_len=SEQ, device=device, order=order, threads=1, **kw)
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
    run.gpu_decodes = (s1.get("gpu_chunk_decodes", 0), s1.get("gpu_decode_batches", 0))
    return cpu / max(1, k) * 1e6, k / el


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--dir", default="/dev/shm/ferry-loader-cz")
    a.add_argument("--samples", type=int, default=20000)
    a.add_argument("--sets", default="zstd-1m,zstd-64k,lz4-1m,lz4-64k")
    a.add_argument("--orders", default="shuffle,sequential")
    a.add_argument("--seconds", type=float, default=3)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--full-shuffle", action="store_true")
    a.add_argument("--chunk-cache", default="")
    a.add_argument("--keep", action="store_true")
    a.add_argument("--device", default="cpu")
    a.add_argument("--decode", default="", help="cz_decode modes for the compressed sets (cpu,gpu,auto)")
    o = a.parse_args()
    os.makedirs(o.dir, exist_ok=True)
    plain = make(o.dir, o.samples)
    sets = [("plain", plain, {})]
    for s in (s for s in o.sets.split(",") if s):
        path = compressed(o.dir, plain, s)
        sets += [(f"{s} {d}", path, {"cz_decode": d}) for d in o.decode.split(",") if d] or [(s, path, {})]
    has_cw = "chunk_window" in inspect.signature(ferry.Loader).parameters
    floor = {name: decode_floor(path) * SEQ * 2 * 1e6 for name, path, _ in sets[1:]}  # us a sample
    runs = []  # (label, order, extra knobs)
    for order in o.orders.split(","):
        if order == "shuffle" and o.chunk_cache and has_cw:
            runs += [(f"shuffle, chunk_cache {c}", order, {"chunk_cache": c}) for c in o.chunk_cache.split(",")]
        else:
            runs.append((order, order, {}))
        if order == "shuffle" and o.full_shuffle and has_cw:
            runs.append(("shuffle, chunk_window=0", order, {"chunk_window": 0}))
    try:
        for label, order, kw in runs:
            got = {name: [] for name, _, _ in sets}
            gdec = {}
            for _ in range(o.rounds):
                for name, path, dk in sets:
                    got[name].append(run(path, order, o.seconds, device=o.device, **kw, **dk))
                    gdec[name] = run.gpu_decodes
            base = statistics.median(us for us, _ in got["plain"])
            for name, _, _ in sets:
                us = statistics.median(u for u, _ in got[name])
                sps = statistics.median(r for _, r in got[name])
                fl = base + floor.get(name, 0)
                extra = ""
                if o.device != "cpu" and name != "plain":
                    # at the rate it delivered (one pipeline thread: at most 1 by construction), and
                    # at plain's rate (what the same loader would need to keep up with plain shards)
                    cores = max(0.0, us - base) * sps / 1e6
                    at_plain = max(0.0, us - base) * statistics.median(r for _, r in got["plain"]) / 1e6
                    extra = (f" | decompression {cores:.2f} cores at its rate, {at_plain:.2f} at plain's "
                             f"({'met' if at_plain <= 1 else 'not met'}: at most 1)"
                             f" | {gdec[name][0]:.0f} chunks on the GPU in {gdec[name][1]:.0f} nvCOMP batches")
                print(f"TABLE loader-cz {o.device} {label} | {name} | {us:.1f} us pipeline CPU a sample | "
                      f"{us / base:.1f}x plain | floor {fl:.1f} us (plain + one core's decode {floor.get(name, 0):.1f}) | "
                      f"{us / fl:.2f}x floor | {sps:.0f} samples/s (median of {o.rounds}){extra}", flush=True)
    finally:
        if not o.keep:
            shutil.rmtree(o.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
