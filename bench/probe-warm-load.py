#!/usr/bin/env python3
"""Where a warm load loses against the pinned copy ceiling (issue 5's warm-load target).

    python3 bench/probe-warm-load.py [--dir /dev/shm] [--size 8g] [--rounds 3]
        [--settings "default|threads=16|copy_units=8|copy_unit=16m copy_units=4"]

Writes one safetensors file of bf16 tensors shaped like a 4B transformer (bench/ckpt-gpu.py's
state) into --dir, then, round by round, each setting in turn (the order rotates each round):
  - `load`: ferry.safetensors.load_file(path, device="cuda", context=ctx), the call users make,
    into memory torch's caching allocator keeps from the load before;
  - `load, new allocation`: the same after torch.cuda.empty_cache(), so that the load's time
    includes cudaMalloc of the whole file (bench/ckpt-gpu.py times every loader this way);
  - `read`: one File.pread_into of the file's whole data section into one preallocated device
    tensor: the engine alone, no header, no tensors (what the load reads in one request);
  - `read 1g`: the same bytes in 1 GiB requests, one after another (bench/gpu-read.sh's shape);
each timed three times after an untimed load with a fresh context of that setting (its workers
started, its copy units pinned), the median kept. Every round also measures the pinned host-to-device
copy of the same number of bytes (one copy from one pinned buffer: the ceiling) and of 1 GiB.
Prints `TABLE` rows: GB/s, the fraction of the round's whole-size ceiling, and CPU cores used.
A setting is ferry.Context knobs, space-separated (docs/CONFIG.md); `default` is none.
--device cpu runs the same steps into host memory (no ceiling), to check the script without a GPU.
"""
import argparse
import importlib.util
import os
import statistics
import time


def table(name, fig, note=""):
    print(f"TABLE {name} | {fig} | {note}", flush=True)


def size_bytes(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].lower()]) if s[-1].lower() in mult else int(s)


def knobs(setting):
    if setting == "default":
        return {}
    return dict(w.split("=", 1) for w in setting.split())


def timed(torch, dev, fn):
    """(seconds, CPU seconds of the process) of fn(), the device synchronised after it."""
    if dev != "cpu":
        torch.cuda.synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    if dev != "cpu":
        torch.cuda.synchronize()
    s, c = time.perf_counter() - t0, time.process_time() - c0
    del out
    return s, c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--size", default="8g")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--settings", default="default|threads=16|copy_units=8|copy_unit=16m")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    import torch
    import ferry
    import ferry.safetensors as fst
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("ckpt_gpu", os.path.join(here, "ckpt-gpu.py"))
    ck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ck)

    dev = a.device
    path = os.path.join(a.dir, f"probe-warm-load-{os.getpid()}.safetensors")
    sd, total = ck.make_state(torch, size_bytes(a.size), dev)
    fst.save_file(sd, path, durable=False)
    del sd
    if dev != "cpu":
        torch.cuda.empty_cache()
    fsize = os.path.getsize(path)
    with open(path, "rb") as f:
        hlen = int.from_bytes(f.read(8), "little")
    start, nbytes = 8 + hlen, fsize - 8 - hlen
    gb = nbytes / 1e9
    table("file", f"{gb:.2f} GB", f"{path}: data section at byte {start}")

    settings = a.settings.split("|")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if dev != "cpu":
        pin_all = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        pin_1g = pin_all[: 1 << 30]
    res = {}  # (setting, what) -> [(GB/s, cores)]
    for rnd in range(a.rounds):
        if dev != "cpu":
            for what, src in (("pinned H2D copy, whole size", pin_all), ("pinned H2D copy, 1 GiB", pin_1g)):
                dst[: src.numel()].copy_(src, non_blocking=True)  # untimed: the copy engine warm
                s, _ = timed(torch, dev, lambda: dst[: src.numel()].copy_(src, non_blocking=True))
                res.setdefault(("ceiling", what), []).append((src.numel() / 1e9 / s, 0.0))
        k = rnd % len(settings)
        for setting in settings[k:] + settings[:k]:
            ctx = ferry.Context(**knobs(setting))
            fst.load_file(path, device=dev, context=ctx)  # untimed: workers, slots, copy units
            f = ferry.open(path, context=ctx)

            def read_all():
                return f.pread_into(dst, start)

            def read_1g():
                for off in range(0, nbytes, 1 << 30):
                    n = min(1 << 30, nbytes - off)
                    f.pread_into(dst[off:off + n], start + off)

            def load():
                return fst.load_file(path, device=dev, context=ctx)

            def fresh():  # untimed: torch's cache gives the allocation back, so the load makes it
                if dev != "cpu":
                    torch.cuda.empty_cache()

            for what, fn, before in (("load", load, None), ("load, new allocation", load, fresh),
                                     ("read", read_all, None), ("read 1g", read_1g, None)):
                runs = []
                for _ in range(a.loads):
                    if before:
                        before()
                    runs.append(timed(torch, dev, fn))
                s, c = sorted(runs)[len(runs) // 2]
                res.setdefault((setting, what), []).append((gb / s, c / s))
            f.close()
            del ctx
            if dev != "cpu":
                torch.cuda.empty_cache()
    os.unlink(path)

    def med(key):
        v = res.get(key)
        return (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) if v else (None, None)

    whole = med(("ceiling", "pinned H2D copy, whole size"))[0]
    for key in res:
        g, c = med(key)
        rounds = ", ".join(f"{x[0]:.2f}" for x in res[key])
        if key[0] == "ceiling":
            table(key[1], f"{g:.2f} GB/s", f"rounds {rounds}")
            continue
        frac = f"{g / whole:.3f} of the whole-size copy; " if whole else ""
        table(f"{key[1]} [{key[0]}]", f"{g:.2f} GB/s", f"{frac}{c:.1f} cores; rounds {rounds}")


if __name__ == "__main__":
    main()
