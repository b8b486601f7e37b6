#!/usr/bin/env python3
"""kvikio's side of bench/gpu-read.sh: reads FILE into GPU memory with kvikio.CuFile.pread, for each
thread count and task size given, and prints one JSON line per setting: GB/s (median of --rounds
after a warm-up read) and CPU cores used (process user+sys time over wall time).
GDS is refused on machines without it; kvikio then runs in its compatibility mode (POSIX reads
into its own pinned bounce buffers), which is its best path there; the mode is printed."""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--task-sizes", default="1m,4m,16m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before each read (root)")
    a = ap.parse_args()
    try:
        import cupy
        import kvikio
        import kvikio.defaults
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"skipped": f"kvikio or cupy not importable: {e}"}))
        return 77
    size = os.path.getsize(a.file)
    buf = cupy.empty(size, dtype=cupy.uint8)
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    for t in [int(x) for x in a.threads.split(",")]:
        for ts in a.task_sizes.split(","):
            task = int(ts[:-1]) * units[ts[-1]]
            kvikio.defaults.set({"num_threads": t, "task_size": task})
            times, cpus = [], []
            for r in range(a.rounds + 1):
                if a.drop_caches:
                    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
                with kvikio.CuFile(a.file, "r") as f:
                    c0, t0 = cpu_s(), time.perf_counter()
                    n = f.pread(buf).get()
                    cupy.cuda.runtime.deviceSynchronize()
                    dt, dc = time.perf_counter() - t0, cpu_s() - c0
                assert n == size, (n, size)
                if r:  # the first read warms kvikio's thread pool and bounce buffers
                    times.append(dt)
                    cpus.append(dc / dt)
            med = statistics.median(times)
            print(json.dumps({"threads": t, "task_size": ts, "gbps": size / med / 1e9,
                              "cores": statistics.median(cpus),
                              "compat_mode": str(kvikio.defaults.get("compat_mode"))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
