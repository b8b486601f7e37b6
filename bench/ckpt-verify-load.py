"""What verifying costs in ferry.checkpoint.load_latest (issue 20, finding 3; docs/CHECKPOINTS.md).

Saves one one-rank step of SIZE bytes of float32 into DIR (checksums on, as every save stores
them), then loads it with load_latest(verify=False) and load_latest(verify=None, the default:
every tensor checked against its xxh3), each in a fresh process, alternating, ROUNDS times.
Prints each load's wall and CPU seconds (this process's, all threads) and the medians.

    python bench/ckpt-verify-load.py --dir /dev/shm/ferry-verify --size 1g --rounds 3 [--device cuda]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def size(text):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(float(text[:-1]) * mult[text[-1].lower()]) if text[-1].lower() in mult else int(text)


def child(d, verify, device):
    import torch  # noqa: F401
    import ferry.checkpoint as ck

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    c, t = cpu(), time.perf_counter()
    step, state = ck.load_latest(d, device=device, verify=verify)
    if device != "cpu":
        torch.cuda.synchronize()
    wall, used = time.perf_counter() - t, cpu() - c
    n = sum(x.numel() * x.element_size() for x in state.values())
    print(json.dumps({"verify": verify, "wall_s": wall, "cpu_s": used, "bytes": n}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/dev/shm/ferry-verify")
    ap.add_argument("--size", type=size, default=size("1g"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", choices=["off", "on"])
    a = ap.parse_args()
    if a.child:
        return child(a.dir, False if a.child == "off" else None, a.device)
    import torch
    import ferry.checkpoint as ck
    shutil.rmtree(a.dir, ignore_errors=True)
    n = a.size // 4
    parts = 8
    torch.manual_seed(0)
    ck.save({"w%d" % i: torch.randn(n // parts) for i in range(parts)}, a.dir, 1)
    runs = {"off": [], "on": []}
    for _ in range(a.rounds):
        for mode in ("off", "on"):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--dir", a.dir, "--device", a.device],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[mode].append(r)
            print("%-3s wall %.3f s  cpu %.3f s  %.2f GB/s" % (mode, r["wall_s"], r["cpu_s"], r["bytes"] / r["wall_s"] / 1e9))
    med = {m: {k: statistics.median(r[k] for r in v) for k in ("wall_s", "cpu_s")} for m, v in runs.items()}
    nbytes = runs["off"][0]["bytes"]
    print(json.dumps({"bytes": nbytes, "device": a.device, "cpus": os.cpu_count(), "median": med,
                      "verify_extra_wall_s_per_gib": (med["on"]["wall_s"] - med["off"]["wall_s"]) / (nbytes / (1 << 30)),
                      "verify_extra_cpu_s_per_gib": (med["on"]["cpu_s"] - med["off"]["cpu_s"]) / (nbytes / (1 << 30)),
                      "wall_ratio": med["on"]["wall_s"] / med["off"]["wall_s"]}))
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
