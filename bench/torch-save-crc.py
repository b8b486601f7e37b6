#!/usr/bin/env python3
"""ferry.torch.save against torch.save and torch.save + fsync on CPU tensors (issue 24, item 3):
SIZE GiB of 8 fp32/bf16 tensors into /dev/shm, best of 3 per row, wall and CPU seconds (getrusage,
all threads: the figure that survives a loaded machine), and zlib.crc32's rate on one core.

    python3 bench/torch-save-crc.py 2      (OVERLAY=dir1:dir2 puts package folders first on sys.path)
"""
import os
import sys
import time
import zlib

sys.path[:0] = [p for p in os.environ.get("OVERLAY", "").split(":") if p]
import torch  # noqa: E402
import ferry.torch as ft  # noqa: E402
n = int(float(sys.argv[1]) * (1 << 30))
torch.manual_seed(0)
# 8 tensors, bf16 and fp32 mixed
sd = {}
per = n // 8
for i in range(8):
    dt = torch.bfloat16 if i % 2 else torch.float32
    sd["t%d" % i] = torch.empty(per // (2 if dt == torch.bfloat16 else 4), dtype=dt).uniform_()
def fsync(p):
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
def run(name, fn, reps=3):
    ts = []; cpu = []
    for _ in range(reps):
        p = "/dev/shm/h24-bench.pt"
        if os.path.exists(p): os.unlink(p)
        import resource
        r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter(); fn(p); ts.append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_SELF); cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    os.unlink(p)
    best = min(ts)
    print("%-28s %.3f s  %.2f GB/s  cpu %.2f s" % (name, best, n / best / 1e9, min(cpu)), flush=True)
    return best
a = run("torch.save", lambda p: torch.save(sd, p))
b = run("torch.save+fsync", lambda p: (torch.save(sd, p), fsync(p)))
c = run("ferry.torch.save", lambda p: ft.save(sd, p))
buf = sd["t0"].view(torch.uint8).numpy()
t = time.perf_counter(); zlib.crc32(buf); d = time.perf_counter() - t
print("zlib.crc32 one core %.2f GB/s" % (buf.nbytes / d / 1e9))
print("ferry/torch.save %.2fx  ferry/(torch.save+fsync) %.2fx" % (a / c, b / c))
