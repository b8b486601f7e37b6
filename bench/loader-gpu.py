#!/usr/bin/env python3
"""The peer of `ferry loader-bench`: PyTorch DataLoader over a numpy.memmap Dataset of 2048-token
uint16 samples (8 workers, pin_memory=True, prefetch_factor=4, .to(device, non_blocking=True)).
Prints TABLE lines as ferry loader-bench does: samples/s, and with --step-fraction the share of time a
synthetic GPU step at that fraction of the peak rate waited for data.
    bench/loader-gpu.py DATA.bin --seq-len 2048 --batch-size 32 --seconds 20 [--shuffle] [--step-fraction 0.8]
"""
import argparse
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    def __init__(self, path, seq_len, dtype):
        self.path, self.seq_len, self.dtype = path, seq_len, dtype
        self.n = np.memmap(path, dtype=dtype, mode="r").size // seq_len
        self.mm = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = np.memmap(self.path, dtype=self.dtype, mode="r")
        return torch.from_numpy(np.array(self.mm[i * self.seq_len:(i + 1) * self.seq_len]))


def run(dl, device, seconds, step_s):
    t0 = time.perf_counter()
    end = t0 + seconds
    waited, samples, steps = 0.0, 0, 0
    it = iter(dl)
    while time.perf_counter() < end:
        w0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            it = iter(dl)
            b = next(it)
        b = b.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        waited += time.perf_counter() - w0
        samples += b.shape[0]
        steps += 1
        if step_s:
            s = time.perf_counter()
            while time.perf_counter() - s < step_s:
                pass
    el = time.perf_counter() - t0
    return samples / el, waited / el, steps / el


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--dtype", default="uint16")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--step-fraction", type=float, default=0)
    ap.add_argument("--name", default="torch DataLoader")
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ds = Tokens(a.data, a.seq_len, np.dtype(a.dtype))
    dl = DataLoader(ds, batch_size=a.batch_size, shuffle=a.shuffle, num_workers=a.workers,
                    pin_memory=device.type == "cuda", prefetch_factor=4 if a.workers else None,
                    persistent_workers=a.workers > 0)
    sps, wait, steps = run(dl, device, a.seconds, 0)
    print(f"TABLE {a.name} samples/s | {sps:.0f} | {a.workers} workers, pin_memory, prefetch_factor 4, {device}")
    if a.step_fraction:
        step_s = 1.0 / (steps * a.step_fraction)
        sps2, wait2, _ = run(dl, device, a.seconds, step_s)
        print(f"TABLE {a.name} GPU wait at {a.step_fraction * 100:.0f}% of peak | {wait2 * 100:.3f}% | "
              f"step {step_s * 1e6:.1f} us, {sps2:.0f} samples/s")


if __name__ == "__main__":
    main()
