#!/usr/bin/env python3
"""Issue 24: torch.distributed.checkpoint with ferry.dcp.Writer/Reader against FileSystemWriter/
Reader, and ferry.torch.load/save against torch.load/save, on one --size state of bf16 and fp32
tensors (2 bf16 to each fp32, 60 tensors) on --device. Each figure is the median of --repeat
fresh processes (each builds the state, then times the one operation; imports and the state's
creation are not timed). The loads read files written just before (warm page cache unless
--drop-caches, which needs root). Every save is fsynced: FileSystemWriter's sync_files=True,
ferry's writers always; torch.save never fsyncs (its row says so). Prints TABLE rows.

    python3 bench/dcp-torch.py [--size 1g] [--dir /tmp/ferry-dcp-bench] [--device cpu|cuda]
                               [--repeat 3] [--drop-caches]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings

OPS = ["dcp.save stock", "dcp.save ferry", "dcp.load stock", "dcp.load ferry",
       "torch.save", "ferry.torch.save", "torch.load", "ferry.torch.load"]


def _size(text):
    return int(float(text[:-1]) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[text[-1].lower()])


def _state(size, device, zero=False):
    import torch
    n = 60
    unit = size // (n // 3 * 4 + n // 3 * 2 * 2)  # elements so that the total is about size
    st = {}
    for i in range(n):
        dt = torch.float32 if i % 3 == 0 else torch.bfloat16
        st["layer.%d.%s" % (i, "w" if dt == torch.float32 else "h")] = (
            torch.zeros if zero else torch.ones)(unit, dtype=dt, device=device) * (0 if zero else i)
    return st


def child(op, a):
    import torch
    import torch.distributed.checkpoint as dcp
    import ferry.dcp
    import ferry.torch
    warnings.simplefilter("ignore")
    dev = a.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    size = _size(a.size)
    d = a.dir
    out = os.path.join(d, "out")
    if os.path.isdir(out):
        shutil.rmtree(out)
    elif os.path.exists(out):
        os.unlink(out)
    if op.startswith("dcp.save") or op.endswith(".save"):
        st = _state(size, dev)
    else:
        st = _state(size, dev, zero=True) if op.startswith("dcp.load") else None
    sync()
    t0 = time.perf_counter()
    if op == "dcp.save stock":
        dcp.save(st, storage_writer=dcp.FileSystemWriter(out))
    elif op == "dcp.save ferry":
        dcp.save(st, storage_writer=ferry.dcp.Writer(out))
    elif op == "dcp.load stock":
        dcp.load(st, storage_reader=dcp.FileSystemReader(os.path.join(d, "dcp")))
    elif op == "dcp.load ferry":
        dcp.load(st, storage_reader=ferry.dcp.Reader(os.path.join(d, "dcp")))
    elif op == "torch.save":
        torch.save(st, out)
    elif op == "ferry.torch.save":
        ferry.torch.save(st, out)
    elif op == "torch.load":
        st = torch.load(os.path.join(d, "model.pt"), map_location=dev, weights_only=True)
    elif op == "ferry.torch.load":
        st = ferry.torch.load(os.path.join(d, "model.pt"), map_location=dev)
    sync()
    dt = time.perf_counter() - t0
    if op.startswith("dcp.load") or op.endswith(".load"):
        want = _state(size, dev)
        bad = [k for k in want if not torch.equal(want[k], st[k])]
        if bad:
            raise SystemExit("%s: %d tensors differ from the saved state, first %s" % (op, len(bad), bad[0]))
    nbytes = sum(t.numel() * t.element_size() for t in _state(0 + size, "meta").values())
    print("RESULT %.6f %d" % (dt, nbytes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1g")
    ap.add_argument("--dir", default="/tmp/ferry-dcp-bench")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    # the files the loads read: written by stock PyTorch
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    st = _state(_size(a.size), a.device)
    dcp.save(st, storage_writer=dcp.FileSystemWriter(os.path.join(a.dir, "dcp")))
    torch.save(st, os.path.join(a.dir, "model.pt"))
    del st
    times = {op: [] for op in OPS}
    nbytes = 0
    for _ in range(a.repeat):
        for op in OPS:
            if a.drop_caches:
                subprocess.run(["sync"])
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", op, "--size", a.size,
                   "--dir", a.dir, "--device", a.device]
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")]
            if p.returncode or not line:
                raise SystemExit("%s failed:\n%s%s" % (op, p.stdout, p.stderr))
            s, nbytes = line[0].split()[1:]
            times[op].append(float(s))
            nbytes = int(nbytes)
            print("RUN %s %.3f s" % (op, float(s)), flush=True)
    cache = "cold" if a.drop_caches else "warm"
    for stock, fer in (("dcp.save stock", "dcp.save ferry"), ("dcp.load stock", "dcp.load ferry"),
                       ("torch.save", "ferry.torch.save"), ("torch.load", "ferry.torch.load")):
        ts, tf = statistics.median(times[stock]), statistics.median(times[fer])
        kind = "load (%s)" % cache if "load" in stock else "save"
        note = " (torch.save: no fsync; ferry: fsync)" if stock == "torch.save" else ""
        print("TABLE %s %s | %s %.2f GB/s (%.2f s) | %s %.2f GB/s (%.2f s) | %.2fx%s"
              % (stock.split()[0], kind, fer, nbytes / tf / 1e9, tf, stock, nbytes / ts / 1e9, ts,
                 ts / tf, note))
    print("RAW", {k: [round(x, 3) for x in v] for k, v in times.items()}, "bytes", nbytes)


if __name__ == "__main__":
    main()
