#!/usr/bin/env python3
"""One safetensors load per new process (issue 22): what a model server pays on its only load.
Each round starts a fresh Python process per loader; the child imports its modules and (with
--device cuda) creates the CUDA context first, outside the timer, then times one
`load_file(path, device)` to the point where every tensor is on the device (synchronized), and
then --loads - 1 more loads in the same process (the warm rate). Loaders: ferry, safetensors,
fastsafetensors and instanttensor when importable (skipped with the reason otherwise), and the
ceiling: the file's bytes copied into newly allocated memory of the device (cpu: one read(2) into
a new tensor; cuda: a pinned host copy, filled before the timer, into new device memory).

    .venv/bin/python bench/st-fresh.py [--device cpu|cuda] [--size 1g] [--tensors 78,4000]
        [--procs 5] [--loads 3] [--loaders ferry,safetensors,fastsafetensors,instanttensor]
        [--dir /dev/shm] [--json out.json]

--tensors makes one file per count, all of --size bytes (bf16 tensors of equal size), so that
4000 small tensors compare with 78 large ones (the per-tensor cost). With FERRY_TRACE=1 the ferry
child prints its spans (import, context, open, allocation, read) to stderr and into the JSON.
Prints a table (GB/s: median over the fresh processes; spread = max/min of them; warm = the
median of the later loads) and the rows as JSON."""
import argparse
import json
import os
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
            return {k: f.get_tensor(k).clone() for k in f.get_keys()}
elif loader == "instanttensor":
    import instanttensor
    def load():
        with instanttensor.safe_open(path, framework="pt", device=device) as f:
            return {k: f.get_tensor(k) for k in f.keys()}
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
for i in range(loads):
    t0 = time.perf_counter()
    out = load()
    if device != "cpu":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    if i == 0 and loader == "ferry" and os.environ.get("FERRY_TRACE"):
        spans = dict(m.last_trace() or {}) if hasattr(m, "last_trace") else {}
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    ntensors = len(out)
    del out
print(json.dumps({"times": times, "import_s": t_import, "bytes": nbytes, "tensors": ntensors,
                  "spans": spans}))
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


def importable(loader):
    mod = {"ferry": "ferry.safetensors", "safetensors": "safetensors.torch",
           "fastsafetensors": "fastsafetensors", "instanttensor": "instanttensor",
           "ceiling": "torch"}[loader]
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
    ap.add_argument("--loaders", default="ferry,safetensors,fastsafetensors,instanttensor,ceiling")
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
    rows = []
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
                out = subprocess.run([sys.executable, "-c", CHILD, ld, path, a.device, str(a.loads)],
                                     capture_output=True, text=True, env=env)
                if out.returncode:  # a peer that fails is reported and left out, the others go on
                    if ld in ("ferry", "ceiling"):
                        sys.exit("%s failed on %s:\n%s" % (ld, path, out.stderr[-2000:]))
                    print("skipped %s on %s: it failed: %s" % (ld, path, out.stderr.strip().splitlines()[-1:]))
                    continue
                if out.stderr.strip() and env.get("FERRY_TRACE"):
                    sys.stderr.write(out.stderr)
                res[ld].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for ld in loaders:
            if not res[ld]:
                continue
            first = [r["times"][0] for r in res[ld]]
            warm = [t for r in res[ld] for t in r["times"][1:]]
            nb = res[ld][0]["bytes"]
            row = {"loader": ld, "tensors": res[ld][0]["tensors"], "file_tensors": count, "bytes": nb,
                   "fresh_s": first, "fresh_gbps": nb / statistics.median(first) / 1e9,
                   "spread": max(first) / min(first),
                   "warm_gbps": nb / statistics.median(warm) / 1e9 if warm else None,
                   "import_s": statistics.median(r["import_s"] for r in res[ld]),
                   "spans": [r["spans"] for r in res[ld] if r["spans"]]}
            if ld == "safetensors" and a.device == "cpu":
                row["note"] = "mmap: the bytes are read at first use, not by the timed call"
            rows.append(row)
    print("%-16s %8s %11s %8s %11s %9s %10s %10s" % ("loader", "tensors", "fresh GB/s", "spread",
                                                      "warm GB/s", "import s", "vs ceiling", "vs 78"))
    for row in rows:
        ceil = [r for r in rows if r["loader"] == "ceiling" and r["file_tensors"] == row["file_tensors"]]
        large = [r for r in rows if r["loader"] == row["loader"] and r["file_tensors"] == min(
            x["file_tensors"] for x in rows)]
        row["vs_ceiling"] = row["fresh_gbps"] / ceil[0]["fresh_gbps"] if ceil and row["loader"] != "ceiling" else None
        row["vs_large_fresh"] = row["fresh_gbps"] / large[0]["fresh_gbps"] if large and large[0] is not row else None
        row["vs_large_warm"] = (row["warm_gbps"] / large[0]["warm_gbps"]
                                if large and large[0] is not row and row["warm_gbps"] else None)
        print("%-16s %8d %11.2f %8.2f %11s %9.3f %10s %10s" % (
            row["loader"], row["file_tensors"], row["fresh_gbps"], row["spread"],
            "%.2f" % row["warm_gbps"] if row["warm_gbps"] else "-", row["import_s"],
            "%.2fx" % row["vs_ceiling"] if row["vs_ceiling"] else "-",
            "%.2fx/%.2fx" % (row["vs_large_fresh"], row["vs_large_warm"] or 0) if row["vs_large_fresh"] else "-")
              + ("  (%s)" % row["note"] if row.get("note") else ""))
    out = {"bench": "st-fresh", "device": a.device, "size": size, "procs": a.procs, "loads": a.loads,
           "cpus": os.cpu_count(), "skipped": skipped, "rows": rows}
    text = json.dumps(out)
    print(text)
    if a.json:
        with open(a.json, "w") as w:
            w.write(text + "\n")
    if not a.keep:
        for _, path in files:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
