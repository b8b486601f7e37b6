#!/usr/bin/env python3
"""One safetensors load per new process (issue 22): what a model server pays on its only load.
Each round starts a fresh Python process per loader; the child imports its modules and (with
--device cuda) creates the CUDA context first, outside the timer, then times one
`load_file(path, device)` to the point where every tensor is on the device (synchronized), and
then --loads - 1 more loads in the same process (the warm rate). Loaders: ferry, safetensors,
fastsafetensors, instanttensor and kvikio (CuFile.pread of the data section into one device
buffer, 16 threads x 4 MiB tasks, its best setting in bench/gpu-read.sh, then a view per tensor)
when importable (skipped with the reason otherwise), and the ceiling: the file's bytes copied into
newly allocated memory of the device (cpu: one read(2) into a new tensor; cuda: a pinned host
copy, filled before the timer, into new device memory). A loader that fails (or outlasts
--timeout) gets a FAILED row with its error and the others go on; the exit status is then 1.

    .venv/bin/python bench/st-fresh.py [--device cpu|cuda] [--size 1g] [--tensors 78,4000]
        [--procs 5] [--loads 3] [--loaders ferry,safetensors,fastsafetensors,instanttensor,kvikio,ceiling]
        [--dir /dev/shm] [--json out.json]

--tensors makes one file per count, all of --size bytes (bf16 tensors of equal size), so that
4000 small tensors compare with 78 large ones (the per-tensor cost). With FERRY_TRACE=1 the ferry
child prints its spans (import, context, open, allocation, read) to stderr and into the JSON; with
FERRY_ENGINE_TRACE=1 as well, the engine's timeline of the process (workers set up, GPU streams and
copy units made, slots pinned, first chunk taken, first unit copy, requests done) is printed placed
in the first load, beside those spans (use --loads 1 for a timeline of the fresh load alone).
Prints a table (GB/s: median over the fresh processes; spread = max/min of them; rounds = the
largest distance of a fresh process's time from their median, the issue's 15% bound; warm = the
median of the later loads), TABLE rows for scripts/gpu-check.sh's summary (ferry against the
ceiling and the best peer, 4,000 against 78 tensors), and the rows as JSON."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
loader, path, device, loads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import torch
spans = {}
if loader == "ferry":
    import ferry.safetensors as m
    load = lambda: m.load_file(path, device=device)
elif loader == "safetensors":
    import safetensors.torch as m
    load = lambda: m.load_file(path, device=device)
elif loader == "fastsafetensors":
    from fastsafetensors import fastsafe_open
    def load():
        # fastsafetensors wants the device's index ("cuda:0"; plain "cuda" is refused by set_device)
        dev = "cuda:0" if device == "cuda" else device
        with fastsafe_open(filenames=[path], nogds=True, device=dev, debug_log=False) as f:
            return {k: f.get_tensor(k).clone() for k in f.keys()}
elif loader == "instanttensor":
    import instanttensor
    def load():
        # InstantTensor passes the device's index to its C++ open: "cuda" (index None) is refused
        dev = "cuda:0" if device == "cuda" else device
        with instanttensor.safe_open(path, framework="pt", device=dev) as f:
            return dict(f.tensors())  # its one way to the tensors (0.2.2 has no get_tensor)
elif loader == "kvikio":
    import kvikio
    import kvikio.defaults
    kvikio.defaults.set({"num_threads": 16, "task_size": 4 << 20})
    DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "U8": torch.uint8,
          "I32": torch.int32, "I64": torch.int64}
    def load():
        with open(path, "rb") as r:
            n = int.from_bytes(r.read(8), "little")
            hdr = json.loads(r.read(n))
        start = 8 + n
        size = os.path.getsize(path) - start
        buf = torch.empty(size, dtype=torch.uint8, device=device)
        with kvikio.CuFile(path, "r") as f:
            got = f.pread(buf, size, start).get()
        assert got == size, (got, size)
        return {k: buf[v["data_offsets"][0]:v["data_offsets"][1]].view(DT[v["dtype"]]).view(v["shape"])
                for k, v in hdr.items() if k != "__metadata__"}
elif loader == "ceiling":
    size = os.path.getsize(path)
    if device == "cpu":
        def load():
            t = torch.empty(size, dtype=torch.uint8)
            with open(path, "rb", buffering=0) as r:
                n = r.readinto(memoryview(t.numpy()))
            assert n == size
            return {"all": t}
    else:
        src = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        with open(path, "rb", buffering=0) as r:
            r.readinto(memoryview(src.numpy()))
        def load():
            return {"all": src.to(device, non_blocking=True)}
t_import = time.perf_counter() - t_start
if device != "cpu":
    torch.cuda.init()
    torch.empty(1, device=device)
    torch.cuda.synchronize()
times = []
t0_first = None
for i in range(loads):
    t0 = time.perf_counter()
    if t0_first is None:
        t0_first = t0
    out = load()
    if device != "cpu":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    if i == 0 and loader == "ferry" and os.environ.get("FERRY_TRACE"):
        spans = dict(m.last_trace() or {}) if hasattr(m, "last_trace") else {}
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    ntensors = len(out)
    del out
# the first load's start on CLOCK_MONOTONIC (perf_counter's clock on Linux, and the engine
# timeline's: FERRY_ENGINE_TRACE=1), so that the parent can place the engine's marks in the load
print(json.dumps({"times": times, "import_s": t_import, "bytes": nbytes, "tensors": ntensors,
                  "spans": spans, "t0_mono_ms": t0_first * 1e3}))
"""


def size_arg(text):
    t = text.strip().lower()
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def make_file(path, size, count):
    """count bf16 tensors of equal size (the rest in the last), written with safetensors' format by
    hand (no dependency): header, then the data."""
    if os.path.exists(path):
        return
    per = (size // count) // 2 * 2
    header, off = {}, 0
    for i in range(count):
        nb = per if i < count - 1 else size - per * (count - 1)
        nb -= nb % 2
        header["layers.%05d.weight" % i] = {"dtype": "BF16", "shape": [nb // 2], "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as w:
        w.write(len(h).to_bytes(8, "little"))
        w.write(h)
        block = os.urandom(1 << 20)
        left = off
        while left:
            n = min(left, len(block))
            w.write(block[:n])
            left -= n
    os.rename(tmp, path)


TIMELINE = re.compile(r"engine timeline \(ms from CLOCK_MONOTONIC ([0-9.]+) ms[^)]*\):(.*)")
MARK = re.compile(r" ([a-z_()]+) x(\d+) \+([0-9.]+)\.\.\+([0-9.]+)(?: busy ([0-9.]+) \(longest ([0-9.]+)\))?;")


def timeline(stderr, t0_ms, spans):
    """The engine's timeline (FERRY_ENGINE_TRACE=1, logged at the child's exit) placed in the first
    load: [(from ms, to ms, what, count, busy ms, longest ms)] from the load's start, the Python
    spans (FERRY_TRACE=1) laid end to end beside it; [] when the child logged none."""
    m = TIMELINE.search(stderr or "")
    if not m or t0_ms is None:
        return []
    shift = float(m.group(1)) - t0_ms
    rows = [(float(a) + shift, float(b) + shift, what, int(n), float(busy or 0), float(lng or 0))
            for what, n, a, b, busy, lng in MARK.findall(m.group(2))]
    at = 0.0
    for k in ("context", "open", "plan", "alloc", "read"):  # in load_file's order
        if k in spans:
            rows.append((at, at + spans[k] * 1e3, "py:" + k, 1, spans[k] * 1e3, spans[k] * 1e3))
            at += spans[k] * 1e3
    if "workers_start" in spans:
        ws = spans.get("context", 0) * 1e3
        rows.append((ws, ws + spans["workers_start"] * 1e3, "py:workers_start", 1, spans["workers_start"] * 1e3,
                     spans["workers_start"] * 1e3))
    return sorted(rows)


def print_timeline(rows, what):
    print("timeline of %s (ms from the first load's start; engine marks: FERRY_ENGINE_TRACE=1, "
          "py: load_file's spans):" % what)
    for a, b, name, n, busy, lng in rows:
        print("  %9.2f .. %9.2f  %-22s x%-4d busy %8.2f  longest %7.2f" % (a, b, name, n, busy, lng))


def importable(loader):
    mod = {"ferry": "ferry.safetensors", "safetensors": "safetensors.torch",
           "fastsafetensors": "fastsafetensors", "instanttensor": "instanttensor",
           "kvikio": "kvikio", "ceiling": "torch"}[loader]
    r = subprocess.run([sys.executable, "-c", "import " + mod], capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["failed"])[-1]
        return "%s not importable (%s)" % (mod, last)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="1g")
    ap.add_argument("--tensors", default="78,4000")
    ap.add_argument("--procs", type=int, default=5, help="fresh processes per loader and file")
    ap.add_argument("--loads", type=int, default=3, help="loads per process (the first is the fresh one)")
    ap.add_argument("--loaders", default="ferry,safetensors,fastsafetensors,instanttensor,kvikio,ceiling")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one child process may take")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.device != "cpu":
        r = subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"])
        if r.returncode:
            print("skipped: --device %s but torch sees no CUDA device" % a.device)
            return 77
    size = size_arg(a.size)
    loaders, skipped = [], {}
    for ld in a.loaders.split(","):
        why = importable(ld)
        if why:
            skipped[ld] = why
        else:
            loaders.append(ld)
    rows, failed = [], {}
    print("device %s, %d MiB per file in %s, %d fresh processes x %d loads, Python %s, %d CPUs" % (
        a.device, size >> 20, a.dir, a.procs, a.loads, sys.version.split()[0], os.cpu_count()))
    for k, why in skipped.items():
        print("skipped %s: %s" % (k, why))
    files = []
    for count in [int(c) for c in a.tensors.split(",")]:
        path = os.path.join(a.dir, "ferry-st-fresh-%d-%d.safetensors" % (size, count))
        make_file(path, size, count)
        files.append((count, path))
    env = dict(os.environ)
    for count, path in files:
        with open(path, "rb") as r:  # resident
            while r.read(1 << 24):
                pass
        res = {ld: [] for ld in loaders}
        for p in range(a.procs):
            order = loaders if p % 2 == 0 else loaders[::-1]
            for ld in order:
                if (ld, count) in failed:
                    continue
                # A loader that fails is reported (a FAILED row) and left out; the others go on.
                try:
                    out = subprocess.run([sys.executable, "-c", CHILD, ld, path, a.device, str(a.loads)],
                                         capture_output=True, text=True, env=env, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    failed[(ld, count)] = "no result within --timeout %g s" % a.timeout
                    print("%s on %s: FAILED: %s" % (ld, path, failed[(ld, count)]), flush=True)
                    continue
                if out.stderr.strip() and (env.get("FERRY_TRACE") or out.returncode):
                    sys.stderr.write(out.stderr[-4000:])
                try:
                    if out.returncode:
                        raise RuntimeError("exit %d: %s" % (out.returncode, " | ".join(
                            out.stderr.strip().splitlines()[-2:])))
                    res[ld].append(json.loads(out.stdout.strip().splitlines()[-1]))
                    tl = timeline(out.stderr, res[ld][-1].get("t0_mono_ms"), res[ld][-1]["spans"])
                    if tl:
                        res[ld][-1]["timeline"] = tl
                        print_timeline(tl, "%s, %d tensors, process %d" % (ld, count, p + 1))
                except (RuntimeError, ValueError, IndexError) as e:
                    failed[(ld, count)] = str(e)[-300:]
                    print("%s on %s: FAILED: %s" % (ld, path, failed[(ld, count)]), flush=True)
        for ld in loaders:
            if (ld, count) in failed:
                res[ld] = []
            if not res[ld]:
                rows.append({"loader": ld, "file_tensors": count, "failed": failed.get((ld, count), "no result")})
                continue
            first = [r["times"][0] for r in res[ld]]
            warm = [t for r in res[ld] for t in r["times"][1:]]
            nb = res[ld][0]["bytes"]
            med = statistics.median(first)
            row = {"loader": ld, "tensors": res[ld][0]["tensors"], "file_tensors": count, "bytes": nb,
                   "fresh_s": first, "fresh_gbps": nb / med / 1e9,
                   "spread": max(first) / min(first),
                   "rounds_dev": max(abs(t / med - 1) for t in first),
                   "warm_gbps": nb / statistics.median(warm) / 1e9 if warm else None,
                   "import_s": statistics.median(r["import_s"] for r in res[ld]),
                   "spans": [r["spans"] for r in res[ld] if r["spans"]],
                   "timelines": [r["timeline"] for r in res[ld] if r.get("timeline")]}
            if ld == "safetensors" and a.device == "cpu":
                row["note"] = "mmap: the bytes are read at first use, not by the timed call"
            rows.append(row)
    print("%-16s %8s %11s %8s %7s %11s %9s %10s %10s" % ("loader", "tensors", "fresh GB/s", "spread", "rounds",
                                                           "warm GB/s", "import s", "vs ceiling", "vs 78"))
    ok = [r for r in rows if "failed" not in r]
    for row in rows:
        if "failed" in row:
            print("%-16s %8d FAILED: %s" % (row["loader"], row["file_tensors"], row["failed"]))
            continue
        ceil = [r for r in ok if r["loader"] == "ceiling" and r["file_tensors"] == row["file_tensors"]]
        large = [r for r in ok if r["loader"] == row["loader"] and r["file_tensors"] == min(
            x["file_tensors"] for x in ok)]
        row["vs_ceiling"] = row["fresh_gbps"] / ceil[0]["fresh_gbps"] if ceil and row["loader"] != "ceiling" else None
        row["vs_large_fresh"] = row["fresh_gbps"] / large[0]["fresh_gbps"] if large and large[0] is not row else None
        row["vs_large_warm"] = (row["warm_gbps"] / large[0]["warm_gbps"]
                                if large and large[0] is not row and row["warm_gbps"] else None)
        print("%-16s %8d %11.2f %8.2f %6.0f%% %11s %9.3f %10s %10s" % (
            row["loader"], row["file_tensors"], row["fresh_gbps"], row["spread"], 100 * row["rounds_dev"],
            "%.2f" % row["warm_gbps"] if row["warm_gbps"] else "-", row["import_s"],
            "%.2fx" % row["vs_ceiling"] if row["vs_ceiling"] else "-",
            "%.2fx/%.2fx" % (row["vs_large_fresh"], row["vs_large_warm"] or 0) if row["vs_large_fresh"] else "-")
              + ("  (%s)" % row["note"] if row.get("note") else ""))
    for ld, why in skipped.items():  # a row each, so that a missing peer shows in the table too
        print("%-16s %8s skipped: %s" % (ld, "-", why))
    targets(ok, a, size)
    out = {"bench": "st-fresh", "device": a.device, "dir": a.dir, "size": size, "procs": a.procs, "loads": a.loads,
           "cpus": os.cpu_count(), "skipped": skipped, "rows": rows}
    text = json.dumps(out)
    print(text)
    if a.json:
        with open(a.json, "w") as w:
            w.write(text + "\n")
    if not a.keep:
        for _, path in files:
            os.unlink(path)
    return 1 if failed else 0


PEERS = ("instanttensor", "fastsafetensors", "kvikio")


def targets(rows, a, size):
    """TABLE rows (scripts/gpu-check.sh's summary): issue 22's targets for one load per new process,
    ferry >= 0.85x the ceiling and >= 1.5x the best of the peers, rounds within 15% of their median;
    and thousands of small tensors >= 0.8x the large tensors' rate of the same call (warm)."""
    where = "%s %s %d MiB" % (a.device, a.dir, size >> 20)
    counts = sorted({r["file_tensors"] for r in rows})
    for count in counts:
        at = {r["loader"]: r for r in rows if r["file_tensors"] == count}
        f = at.get("ferry")
        if not f:
            print("TABLE st-fresh %s, %d tensors: ferry | FAILED | no result" % (where, count))
            continue
        c = at.get("ceiling")
        peers = [at[p] for p in PEERS if p in at]
        best = max(peers, key=lambda r: r["fresh_gbps"]) if peers else None
        vc = f["fresh_gbps"] / c["fresh_gbps"] if c else None
        vp = f["fresh_gbps"] / best["fresh_gbps"] if best else None
        print("TABLE st-fresh %s, %d tensors: ferry fresh | %.2f GB/s | ceiling %s (%s, target >= 0.85x); best peer %s "
              "(%s, target >= 1.5x); %s; ferry's rounds within %.0f%% of their median (target 15%%): %s" % (
                  where, count, f["fresh_gbps"], "%.2f GB/s" % c["fresh_gbps"] if c else "none",
                  "%.2fx" % vc if vc else "-", "%s %.2f GB/s" % (best["loader"], best["fresh_gbps"]) if best else "none",
                  "%.2fx" % vp if vp else "-",
                  ", ".join("%s %.2f" % (p["loader"], p["fresh_gbps"]) for p in peers) or "no peer ran",
                  100 * f["rounds_dev"], "met" if f["rounds_dev"] <= 0.15 else "NOT met"))
    if len(counts) >= 2:
        lo, hi = counts[0], counts[-1]
        fl = [r for r in rows if r["loader"] == "ferry" and r["file_tensors"] == lo]
        fh = [r for r in rows if r["loader"] == "ferry" and r["file_tensors"] == hi]
        if fl and fh and fl[0]["warm_gbps"] and fh[0]["warm_gbps"]:
            v = fh[0]["warm_gbps"] / fl[0]["warm_gbps"]
            print("TABLE st-fresh %s: ferry %d small vs %d large tensors, warm load_file | %.2fx | %.2f vs %.2f GB/s "
                  "(fresh %.2fx); target >= 0.8x: %s" % (
                      where, hi, lo, v, fh[0]["warm_gbps"], fl[0]["warm_gbps"],
                      fh[0]["fresh_gbps"] / fl[0]["fresh_gbps"], "met" if v >= 0.8 else "NOT met"))


if __name__ == "__main__":
    sys.exit(main())
