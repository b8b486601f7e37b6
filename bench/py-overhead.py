#!/usr/bin/env python3
"""Python call overhead: the same reads through `File.pread_into` in a Python loop and through the
C CLI (`ferry bench --api=pread`: one ferry_pread per I/O, like a pread_into), same file, same
buffered descriptor and page-aligned buffer, page cache warm, rounds alternating between the two.

    .venv/bin/python bench/py-overhead.py [--cli build/ferry] [--rounds 5] [--runtime 2]
        [--file /tmp/ferry-py-overhead.bin] [--size 256m] [--bs 4k,16m]

Prints one row per block size: per-call time in C and in Python (median of the rounds), the
overhead per call, and Python's throughput as a share of C's. docs/PERFORMANCE.md has the figures.
"""
import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

import ferry


def size_arg(text):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    return int(t[:-1]) * mult[t[-1]] if t[-1] in mult else int(t)


def run_cli(cli, path, bs_text, runtime):
    out = subprocess.run([cli, "bench", "--filename", path, "--rw=read", "--bs=" + bs_text,
                          "--api=pread", "--numjobs=1", "--iodepth=1", "--direct=0",
                          "--runtime=%gs" % runtime, "--output-format=json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("ferry bench failed (%d): %s" % (out.returncode, out.stderr.strip()))
    job = json.loads(out.stdout)["jobs"][0]["read"]
    return job["io_bytes"] / job["bw_bytes"] / job["total_ios"] if job["bw_bytes"] else 0.0, \
        job["total_ios"]


def run_py(path, bs, runtime):
    f = ferry.open(path, buffered=True)  # as the CLI's --direct=0
    buf = mmap.mmap(-1, bs)  # page-aligned, as the CLI's ferry_alloc_aligned
    if bs >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)  # as ferry_alloc_aligned does for large buffers
    nblocks = f.size // bs
    pread = f.pread_into
    clock = time.perf_counter
    i = 0
    t0 = clock()
    end = t0 + runtime
    while True:
        if pread(buf, (i % nblocks) * bs) != bs:
            sys.exit("short read")
        i += 1
        if clock() >= end:
            break
    elapsed = clock() - t0
    f.close()
    return elapsed / i, i


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.environ.get("FERRY_CLI", "build/ferry"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", type=float, default=2.0)
    ap.add_argument("--file", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                   "ferry-py-overhead.bin"))
    ap.add_argument("--size", default="256m")
    ap.add_argument("--bs", default="4k,16m")
    a = ap.parse_args()
    size = size_arg(a.size)
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        with open(a.file, "wb") as w:
            for _ in range(size >> 20):
                w.write(os.urandom(1 << 20))
    with open(a.file, "rb") as r:  # warm the page cache
        while r.read(1 << 24):
            pass
    print("file %s (%d MiB, page cache warm), %d rounds of %gs each, alternating; ferry %s, "
          "Python %s" % (a.file, size >> 20, a.rounds, a.runtime, ferry.__version__,
                         sys.version.split()[0]))
    print("%-6s %12s %12s %14s %12s" % ("bs", "C us/call", "Py us/call", "overhead us",
                                        "Py/C thrpt"))
    worst = 0.0
    for bs_text in a.bs.split(","):
        bs = size_arg(bs_text)
        c, p = [], []
        for r in range(a.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for which in order:
                if which == 0:
                    c.append(run_cli(a.cli, a.file, bs_text, a.runtime)[0])
                else:
                    p.append(run_py(a.file, bs, a.runtime)[0])
        for label, agg in (("median", statistics.median), ("min", min)):
            cm, pm = agg(c), agg(p)
            ratio = cm / pm
            print("%-6s %12.3f %12.3f %14.3f %11.1f%%   (%s of rounds)" % (
                bs_text, cm * 1e6, pm * 1e6, (pm - cm) * 1e6, ratio * 100, label))
        cm, pm = statistics.median(c), statistics.median(p)
        ratio = cm / pm
        print("       C rounds us: %s" % " ".join("%.3f" % (x * 1e6) for x in c))
        print("       Py rounds us: %s" % " ".join("%.3f" % (x * 1e6) for x in p))
        if bs >= 16 << 20:
            worst = max(worst, 1 - ratio)
    print("target: at 16 MiB Python within 2%% of C: %s (%.2f%%)" %
          ("met" if worst < 0.02 else "NOT met", worst * 100))


if __name__ == "__main__":
    main()
