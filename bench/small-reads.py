#!/usr/bin/env python3
"""Small random reads (issue 22): IOPS of random reads from one file (in /dev/shm by default) through
ferry's batch API (`File.read_batch`, one call per queue-depth's worth of pieces) and through per-piece
futures (`File.pread_into_async`, a window of `depth` in flight), for each size and queue depth, into
host memory (plain, or pinned where CUDA is there) and, with --device cuda, into one CUDA tensor. The
peer is kvikio's `CuFile.pread` per piece with 16 threads (skipped, with the reason, where kvikio or
CUDA is not importable). Each setting also gives the per-piece split of the caller's time: the
submitting calls (Python, buffer export, the engine's queueing) and the waits.

    .venv/bin/python bench/small-reads.py [--device cpu|cuda] [--sizes 4k,64k,1m]
        [--depths 1,32,256] [--pieces 8192] [--file /dev/shm/ferry-small-reads.bin] [--file-size 1g]
        [--apis batch,futures,kvikio] [--mem host,pinned] [--rounds 3] [--json out.json]

Prints one table row per (api, memory, size, depth): IOPS and GB/s (median of the rounds), microseconds
per piece in submission and in waiting, ratio to kvikio at the same setting and to the same api into
pinned host memory; then the rows as JSON (one object). Runs on a CPU-only machine (device cpu)."""
import argparse
import json
import os
import random
import statistics
import sys
import time

import ferry

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size_arg(text):
    t = text.strip().lower()
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def make_file(path, size):
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as w:
        for _ in range(size >> 20):
            w.write(chunk)


def offsets(file_size, bs, n, seed):
    """n random offsets, bs-aligned (the usual random-read pattern; 4 KiB pieces stay page-aligned)."""
    rng = random.Random(seed)
    blocks = file_size // bs
    return [rng.randrange(blocks) * bs for _ in range(n)]


class Dest:
    """A destination of `slots` pieces of bs bytes: a torch tensor (cpu, pinned cpu, or cuda)."""

    def __init__(self, torch, kind, bs, slots):
        self.bs = bs
        self.slots = slots
        if kind == "cuda":
            self.t = torch.empty(bs * slots, dtype=torch.uint8, device="cuda")
        else:
            self.t = torch.empty(bs * slots, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        # views made once, outside the timer: the per-piece cost measured is ferry's, not slicing's
        self.views = [self.t[i * bs:(i + 1) * bs] for i in range(slots)]
        # kvikio takes host memory as a NumPy array (buffer protocol), device memory via
        # __cuda_array_interface__ (torch has it)
        self.peer_views = self.views if kind == "cuda" else [v.numpy() for v in self.views]

    def view(self, i):
        return self.views[i % self.slots]

    def peer_view(self, i):
        return self.peer_views[i % self.slots]


def run_batch(f, dest, offs, depth):
    """read_batch of `depth` pieces at a time; returns (wall, submit+wait time split is not
    separable here: the call is both)."""
    t_call = 0.0
    clock = time.perf_counter
    t0 = clock()
    for s in range(0, len(offs), depth):
        entries = [(offs[i], dest.view(i)) for i in range(s, min(s + depth, len(offs)))]
        c0 = clock()
        res = f.read_batch(entries)
        t_call += clock() - c0
        if res[0] != dest.bs:
            raise SystemExit("short read: %r" % res[:4])
    wall = clock() - t0
    return wall, t_call, 0.0


def run_futures(f, dest, offs, depth):
    """A window of `depth` futures: the oldest is waited for before the next is submitted."""
    clock = time.perf_counter
    t_sub = t_wait = 0.0
    window = []
    submit = f.pread_into_async
    t0 = clock()
    for i, off in enumerate(offs):
        if len(window) == depth:
            c0 = clock()
            if window.pop(0).result() != dest.bs:
                raise SystemExit("short read")
            t_wait += clock() - c0
        c0 = clock()
        window.append(submit(dest.view(i), off))
        t_sub += clock() - c0
    c0 = clock()
    for fut in window:
        if fut.result() != dest.bs:
            raise SystemExit("short read")
    t_wait += clock() - c0
    return clock() - t0, t_sub, t_wait


def run_kvikio(kvikio, path, dest, offs, depth):
    """kvikio's CuFile.pread per piece (its thread pool, 16 threads), a window of `depth`."""
    clock = time.perf_counter
    t_sub = t_wait = 0.0
    window = []
    with kvikio.CuFile(path, "r") as cf:
        t0 = clock()
        for i, off in enumerate(offs):
            if len(window) == depth:
                c0 = clock()
                if window.pop(0).get() != dest.bs:
                    raise SystemExit("kvikio short read")
                t_wait += clock() - c0
            c0 = clock()
            window.append(cf.pread(dest.peer_view(i), dest.bs, off))
            t_sub += clock() - c0
        c0 = clock()
        for fut in window:
            fut.get()
        t_wait += clock() - c0
        wall = clock() - t0
    return wall, t_sub, t_wait


def kvikio_or_reason(device):
    try:
        import kvikio
        import kvikio.defaults
    except Exception as e:  # noqa: BLE001
        return None, "kvikio not importable (%s)" % (str(e).splitlines()[0] if str(e) else type(e).__name__)
    try:
        kvikio.defaults.set({"num_threads": 16})
    except Exception:  # noqa: BLE001 - older kvikio
        try:
            kvikio.defaults.num_threads_reset(16)
        except Exception as e:  # noqa: BLE001
            return None, "kvikio: cannot set 16 threads (%s)" % e
    return kvikio, None


def engine_counters(ctx):
    s = ctx.stats()
    return {k: s.get(k, 0) for k in ("reads", "chunks", "retries", "errors")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--file", default=os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp",
                                                   "ferry-small-reads.bin"))
    ap.add_argument("--file-size", default="1g")
    ap.add_argument("--sizes", default="4k,64k,1m")
    ap.add_argument("--depths", default="1,32,256")
    ap.add_argument("--pieces", type=int, default=8192, help="pieces per round (fewer for 1m: at most "
                    "--max-bytes of them)")
    ap.add_argument("--max-bytes", default="2g", help="bytes per round at most (caps 1 MiB pieces)")
    ap.add_argument("--apis", default="batch,futures,kvikio")
    ap.add_argument("--mem", default=None, help="host memories to read into: host,pinned (default: "
                    "pinned where CUDA is there, else host)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the data file")
    ap.add_argument("--json", default=None, help="also write the JSON to this file")
    a = ap.parse_args()

    import torch
    cuda = torch.cuda.is_available()
    if a.device == "cuda" and not cuda:
        print("skipped: --device cuda but torch sees no CUDA device")
        return 77
    mems = (a.mem or ("pinned" if cuda else "host")).split(",")
    skipped = {}
    if "pinned" in mems and not cuda:
        mems.remove("pinned")
        skipped["pinned"] = "pinned host memory needs CUDA (torch.cuda.is_available() is False)"
        if not mems:
            mems = ["host"]
    kinds = mems + (["cuda"] if a.device == "cuda" else [])
    apis = a.apis.split(",")
    kv = None
    if "kvikio" in apis:
        kv, why = kvikio_or_reason(a.device)
        if kv is None:
            apis.remove("kvikio")
            skipped["kvikio"] = why

    fsize = size_arg(a.file_size)
    make_file(a.file, fsize)
    with open(a.file, "rb") as r:  # resident: the page cache (tmpfs) is the source
        while r.read(1 << 24):
            pass
    ctx = ferry.default_context()
    f = ferry.open(a.file, "r", context=ctx)  # as a user would: direct=auto, resident data read buffered
    if a.device == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the CUDA context, outside the timers

    rows = []
    hdr = "%-8s %-7s %5s %5s %7s %10s %8s %9s %9s %8s %8s" % (
        "api", "memory", "size", "depth", "pieces", "IOPS", "GB/s", "sub us", "wait us", "vs kvik",
        "vs pin")
    print("file %s (%d MiB, resident), ferry %s, torch %s, Python %s, %d CPUs, %d rounds (median)" % (
        a.file, fsize >> 20, ferry.__version__, torch.__version__, sys.version.split()[0],
        os.cpu_count(), a.rounds))
    for k, why in skipped.items():
        print("skipped %s: %s" % (k, why))
    print(hdr)
    maxb = size_arg(a.max_bytes)
    for bs_text in a.sizes.split(","):
        bs = size_arg(bs_text)
        n = max(1, min(a.pieces, maxb // bs))
        for depth in [int(d) for d in a.depths.split(",")]:
            offs = offsets(fsize, bs, n, seed=bs + depth)
            for kind in kinds:
                slots = max(depth, min(n, (256 << 20) // bs))
                dest = Dest(torch, kind, bs, slots)
                for api in apis:
                    walls, subs, waits = [], [], []
                    c0 = engine_counters(ctx)
                    for r in range(a.rounds + 1):  # round 0 warms up (threads, slots, rings)
                        if api == "batch":
                            w, s, wt = run_batch(f, dest, offs, depth)
                        elif api == "futures":
                            w, s, wt = run_futures(f, dest, offs, depth)
                        else:
                            w, s, wt = run_kvikio(kv, a.file, dest, offs, depth)
                        if kind == "cuda":
                            torch.cuda.synchronize()
                        if r:
                            walls.append(w)
                            subs.append(s)
                            waits.append(wt)
                    c1 = engine_counters(ctx)
                    wall = statistics.median(walls)
                    row = {"api": api, "memory": kind, "size": bs, "depth": depth, "pieces": n,
                           "iops": n / wall, "gbps": n * bs / wall / 1e9,
                           "submit_us": statistics.median(subs) / n * 1e6,
                           "wait_us": statistics.median(waits) / n * 1e6,
                           "rounds_s": walls}
                    if api != "kvikio":
                        row["chunks_per_piece"] = (c1["chunks"] - c0["chunks"]) / (n * (a.rounds + 1))
                        row["retries"] = c1["retries"] - c0["retries"]
                    rows.append(row)
    # ratios: to kvikio at the same (memory, size, depth), to the same api into pinned/host memory
    base_mem = "pinned" if "pinned" in kinds else kinds[0]
    for row in rows:
        peer = [r for r in rows if r["api"] == "kvikio" and r["memory"] == row["memory"]
                and r["size"] == row["size"] and r["depth"] == row["depth"]]
        row["vs_kvikio"] = row["iops"] / peer[0]["iops"] if peer and row["api"] != "kvikio" else None
        host = [r for r in rows if r["api"] == row["api"] and r["memory"] == base_mem
                and r["size"] == row["size"] and r["depth"] == row["depth"]]
        row["vs_host"] = row["iops"] / host[0]["iops"] if host and row["memory"] != base_mem else None
        print("%-8s %-7s %5s %5d %7d %10.0f %8.2f %9.2f %9.2f %8s %8s" % (
            row["api"], row["memory"], "%dk" % (row["size"] >> 10) if row["size"] < 1 << 20
            else "%dm" % (row["size"] >> 20), row["depth"], row["pieces"], row["iops"], row["gbps"],
            row["submit_us"], row["wait_us"],
            "%.2fx" % row["vs_kvikio"] if row["vs_kvikio"] else "-",
            "%.2fx" % row["vs_host"] if row["vs_host"] else "-"))
    out = {"bench": "small-reads", "device": a.device, "file": a.file, "file_size": fsize,
           "ferry": ferry.__version__, "rounds": a.rounds, "cpus": os.cpu_count(),
           "skipped": skipped, "rows": rows}
    text = json.dumps(out)
    print(text)
    if a.json:
        with open(a.json, "w") as w:
            w.write(text + "\n")
    f.close()
    if not a.keep:
        os.unlink(a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
