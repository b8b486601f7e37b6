#!/usr/bin/env python3
"""Issue 5's asynchronous-save figure alone: how long ferry.checkpoint.async_save blocks the caller
for --size of bf16 CUDA tensors (the state of bench/ckpt-gpu.py's model shape, simplified to equal
tensors), against the device-to-host copy of the same bytes into pinned memory (the floor), with
a host_budget that holds the state (--budget; beyond it the caller waits for the writes). Twice:
the second save shows the steady state (pinned memory kept). Prints TABLE rows.
    python3 bench/ckpt-async.py [--size 8g] [--dir /dev/shm/ferry-ckpt-async] [--budget auto]"""
import argparse
import os
import shutil
import time

import torch

import ferry
import ferry.checkpoint as fck


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="8g")
    ap.add_argument("--dir", default="/dev/shm/ferry-ckpt-async")
    ap.add_argument("--budget", default="auto")
    a = ap.parse_args()
    size = int(float(a.size[:-1]) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[a.size[-1].lower()])
    budget = a.budget if a.budget != "auto" else f"{-(-size * 5 // 4 // (1 << 30)) + 1}g"
    n = 64
    per = size // n // 2  # bf16 elements per tensor
    state = {f"layer.{i}.weight": torch.randn(per, dtype=torch.bfloat16, device="cuda") for i in range(n)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    flat = [t.view(torch.uint8).flatten() for t in state.values()]
    t = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        off = 0
        for f in flat:
            host[off:off + f.numel()].copy_(f, non_blocking=True)
            off += f.numel()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    floor = sorted(t)[1]
    print(f"TABLE async save: D2H copy into pinned memory (the floor) | {floor:.3f} s | {nbytes / floor / 1e9:.2f} GB/s, {nbytes / 1e9:.2f} GB")
    del host
    ctx = ferry.Context(host_budget=budget)
    blocked = []
    for step in (1, 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = fck.async_save(state, a.dir, step, keep=1, context=ctx)
        blocked.append(time.perf_counter() - t0)
        h.wait()
        total = time.perf_counter() - t0
    shutil.rmtree(a.dir, ignore_errors=True)
    r = blocked[1] / floor
    print(f"TABLE async save: ferry.checkpoint.async_save blocked | {blocked[1]:.3f} s | first {blocked[0]:.3f} s; "
          f"total {total:.3f} s; host_budget={budget}")
    print(f"TABLE target async save blocked vs D2H copy | {r:.2f}x | target <= 1.2x: {'met' if r <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
    main()
