#!/usr/bin/env python3
"""Can a load hide the cost of allocating its device memory? (issue 5's warm load)

    python3 bench/probe-alloc-overlap.py [--dir /dev/shm] [--size 8g] [--rounds 3]

bench/probe-warm-load.py measured a warm load at 0.95 of the pinned copy ceiling into memory
torch's caching allocator already held, and at 0.87 when the load had to allocate it (cudaMalloc
of the whole file, as every loader does on a server's cold start). This times, on one file in
--dir, after torch.cuda.empty_cache() each time:
  - `alloc`: torch.empty of the whole size alone;
  - `read`: one File.pread_into of the whole file into memory allocated beforehand (untimed);
  - `alloc, then read`: both, one after the other (what a load does now);
  - `alloc + memset`, `alloc + memset, then read`, `read, after a memset`: the fresh memory
    first written by the GPU itself (torch's zero_), then read into;
  - `read, the second into the same memory`: the ceiling of reads into memory touched before;
  - `read into fresh memory, right after a read`: host side warm, device memory new;
  - `pinned copy, into fresh memory` / `..., the second into the same memory`: the copy ceiling
    (one copy of the whole size from pinned memory) into new and into touched device memory;
  - `pieces of N, overlapped`: a thread allocates N-byte pieces one after another while this thread
    reads each piece as soon as it exists (so the allocation of piece k+1 runs during the read
    of piece k), for N in --pieces.
Prints `TABLE` rows with GB/s over the file's bytes and the median of --rounds.
"""
import argparse
import os
import queue
import statistics
import threading
import time


def table(name, fig, note=""):
    print(f"TABLE {name} | {fig} | {note}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--size", default="8g")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pieces", default="256m,1g,2g")
    a = ap.parse_args()
    import torch
    import ferry

    def size(s):
        return int(float(s[:-1]) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1]])

    n = size(a.size)
    path = os.path.join(a.dir, f"probe-alloc-{os.getpid()}.dat")
    with open(path, "wb") as f:
        block = os.urandom(1 << 20) * 64
        for _ in range(n // len(block)):
            f.write(block)
    ctx = ferry.Context()
    f = ferry.open(path, context=ctx)
    warm = torch.empty(n, dtype=torch.uint8, device="cuda")
    f.pread_into(warm, 0)  # untimed: workers, slots, copy units
    del warm

    def fresh():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def clock(fn):
        """Seconds of fn(), the device idle before and synchronised after."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def t(fn):
        fresh()
        return clock(fn)

    def alloc():
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    def read_only():
        fresh()
        d = alloc()
        return clock(lambda: f.pread_into(d, 0))

    def alloc_then_read():
        d = alloc()
        f.pread_into(d, 0)

    def memset_then_read():  # the memory touched by the GPU first (a memset: HBM speed), then the read
        d = alloc()
        d.zero_()
        f.pread_into(d, 0)

    def memset_only():
        d = alloc()
        d.zero_()

    def read_after_memset():
        fresh()
        d = alloc()
        d.zero_()
        return clock(lambda: f.pread_into(d, 0))

    def read_again():  # into memory the same process read into before (torch's cache keeps it)
        d = alloc()
        f.pread_into(d, 0)
        return clock(lambda: f.pread_into(d, 0))

    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()

    def copy_fresh():  # the pinned copy ceiling into memory just allocated
        fresh()
        d = alloc()
        return clock(lambda: d.copy_(pinned, non_blocking=True))

    def copy_again():  # ... and into memory copied into before
        d = alloc()
        d.copy_(pinned, non_blocking=True)
        return clock(lambda: d.copy_(pinned, non_blocking=True))

    def read_fresh_after_read():  # a read into touched memory, then one into fresh memory
        d = alloc()
        f.pread_into(d, 0)
        e = alloc()
        return clock(lambda: f.pread_into(e, 0))

    def overlapped(piece):
        def run():
            q = queue.Queue()

            def allocator():
                for off in range(0, n, piece):
                    q.put((off, torch.empty(min(piece, n - off), dtype=torch.uint8, device="cuda")))
            th = threading.Thread(target=allocator)
            th.start()
            keep = []
            for _ in range(0, n, piece):
                off, buf = q.get()
                f.pread_into(buf, off)
                keep.append(buf)
            th.join()
        return run

    res = {}
    pieces = [size(p) for p in a.pieces.split(",")]
    for _ in range(a.rounds):
        res.setdefault("alloc", []).append(t(alloc))
        res.setdefault("read", []).append(read_only())
        res.setdefault("alloc, then read", []).append(t(alloc_then_read))
        res.setdefault("pinned copy, into fresh memory", []).append(copy_fresh())
        res.setdefault("pinned copy, the second into the same memory", []).append(copy_again())
        fresh()
        res.setdefault("read into fresh memory, right after a read", []).append(read_fresh_after_read())
        res.setdefault("alloc + memset", []).append(t(memset_only))
        res.setdefault("alloc + memset, then read", []).append(t(memset_then_read))
        res.setdefault("read, after a memset", []).append(read_after_memset())
        res.setdefault("read, the second into the same memory", []).append(read_again())
        for p in pieces:
            res.setdefault(f"pieces of {p >> 20} MiB, overlapped", []).append(t(overlapped(p)))
    f.close()
    os.unlink(path)
    for k, v in res.items():
        s = statistics.median(v)
        table(k, f"{s * 1e3:.1f} ms", f"{n / 1e9 / s:.2f} GB/s over {n / 1e9:.2f} GB; rounds "
              + ", ".join(f"{x * 1e3:.1f}" for x in v))


if __name__ == "__main__":
    main()
