#!/usr/bin/env python3
"""What a fresh process pays the CUDA driver before its first byte moves (issue 22): each cost
timed in a new process whose CUDA context torch made first (as a model server's is), through the
driver API (ctypes on libcuda.so.1, the library torch loaded). The engine pays these once per
process: the copy units' buffer (copy_units x copy_unit = 32 MiB), one stream and queue_depth
events per worker, and, before 1232d0b, every worker's bounce slots (16 x 1.125 MiB) registered.

    python bench/pin-cost.py [--procs 3] [--workers 12] [--json out.json]

Rows: cuMemHostAlloc of 32 MiB (how units.c makes the units today); the same 32 MiB as anonymous
memory with transparent huge pages, touched, then cuMemHostRegister'ed (how pinned.c makes pool
slots); workers x 18 MiB of slots registered one after the other (the old first chunks); workers
streams with 16 events each. Prints the median ms over --procs fresh processes and GB/s of pinning.
Exit 77 with the reason where torch sees no CUDA device."""
import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, json, sys, time
import torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()   # the context exists, as in a server
cu = ctypes.CDLL("libcuda.so.1")
what, n, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
MADV_HUGEPAGE = 14
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def check(r, call):
    if r:
        raise SystemExit("%s failed: CUresult %d" % (call, r))
ctxp = ctypes.c_void_p()
check(cu.cuCtxGetCurrent(ctypes.byref(ctxp)), "cuCtxGetCurrent")
def anon(size):
    p = libc.mmap(None, size, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    libc.madvise(p, size, MADV_HUGEPAGE)
    return p
t0 = time.perf_counter()
if what == "hostalloc":
    p = ctypes.c_void_p()
    check(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 1), "cuMemHostAlloc")
elif what == "thp_register":
    p = anon(n)
    libc.memset(p, 0, n)
    check(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1), "cuMemHostRegister")
elif what == "register_untouched":
    p = anon(n)
    check(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1), "cuMemHostRegister")
elif what == "slots":
    for w in range(workers):
        p = anon(n)
        check(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1), "cuMemHostRegister")
elif what == "streams":
    for w in range(workers):
        s = ctypes.c_void_p()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        for e in range(16):
            ev = ctypes.c_void_p()
            check(cu.cuEventCreate(ctypes.byref(ev), 2 | 1), "cuEventCreate")
print(json.dumps({"s": time.perf_counter() - t0}))
"""

ROWS = [  # name, child's what, bytes, what it stands for
    ("units: cuMemHostAlloc 32 MiB", "hostalloc", 32 << 20, "copy units as made now (units.c)"),
    ("units: THP mmap + touch + cuMemHostRegister 32 MiB", "thp_register", 32 << 20, "as pinned.c makes slots"),
    ("cuMemHostRegister 32 MiB untouched (THP)", "register_untouched", 32 << 20, "the driver faults the pages"),
    ("slots: W x 18 MiB cuMemHostRegister", "slots", 18 << 20, "every worker's slots (before 1232d0b)"),
    ("streams: W x (stream + 16 events)", "streams", 0, "each worker's copy ring"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    r = subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"])
    if r.returncode:
        print("skipped: torch sees no CUDA device")
        return 77
    out, rc = [], 0
    print("%-52s %10s %10s  %s" % ("fresh-process cost", "median ms", "GB/s", "(each in %d new processes)" % a.procs))
    for name, what, n, why in ROWS:
        times = []
        for _ in range(a.procs):
            p = subprocess.run([sys.executable, "-c", CHILD, what, str(n), str(a.workers)], capture_output=True,
                               text=True, timeout=120)
            if p.returncode:
                print("%-52s FAILED: %s" % (name, (p.stderr.strip().splitlines() or ["?"])[-1]))
                rc = 1
                break
            times.append(json.loads(p.stdout.strip().splitlines()[-1])["s"])
        if not times:
            continue
        med = statistics.median(times)
        total = n * (a.workers if what == "slots" else 1)
        gbps = total / med / 1e9 if total else None
        print("%-52s %10.2f %10s  %s" % (name.replace("W x", "%d x" % a.workers), med * 1e3,
                                          "%.2f" % gbps if gbps else "-", why))
        out.append({"row": name, "what": what, "bytes": total, "times_s": times, "median_ms": med * 1e3,
                    "gbps": gbps, "workers": a.workers})
    text = json.dumps({"bench": "pin-cost", "procs": a.procs, "rows": out})
    print(text)
    if a.json:
        with open(a.json, "w") as w:
            w.write(text + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
