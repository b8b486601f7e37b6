"""Diagnosis for the loader's GPU-wait figure (docs/DATA.md): the ferry shuffle loader's GPU wait at a
fraction of its peak, with one difference at a time: the step loop's final sync spinning (torch's
default) or blocking, pipeline threads, prefetch depth, and lower fractions. Prints one line each.
    python3 bench/probe-loader-wait.py [--gb 2] [--seconds 4]
Needs `pip install .` and a GPU; uses bench/loader-gpu.py's data, peers and measures."""
import argparse
import importlib.util
import os
import subprocess
import sys
import time

import torch

spec = importlib.util.spec_from_file_location("lg", os.path.join(os.path.dirname(__file__), "loader-gpu.py"))
lg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lg)


def with_gpu_step_blocking(peer, step_s, seconds, hz):
    """lg.with_gpu_step with events that block (sleep) instead of spinning in synchronize()."""
    it = peer.batches()
    next(it)
    torch.cuda.synchronize()
    cycles = max(1, int(step_s * hz))
    starts, ends = [], []
    acc = torch.zeros((), device="cuda", dtype=torch.int64)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        b = next(it)
        s = torch.cuda.Event(enable_timing=True, blocking=True)
        e = torch.cuda.Event(enable_timing=True, blocking=True)
        s.record()
        acc += b.view(torch.int16)[:, 0].sum()
        torch.cuda._sleep(cycles)
        e.record()
        starts.append(s)
        ends.append(e)
        if len(ends) > 2:
            ends[-3].synchronize()
    torch.cuda.synchronize()
    busy = sum(s.elapsed_time(e) for s, e in zip(starts, ends))
    span = starts[0].elapsed_time(ends[-1])
    return max(0.0, 1 - busy / span), len(starts) / (span / 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2)
    ap.add_argument("--seconds", type=float, default=4)
    a = ap.parse_args()
    try:
        print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.strip().replace("\n", "; ")[:600])
    except OSError:
        pass
    dev = torch.device("cuda", torch.cuda.current_device())
    prefix, _, n = lg.make_data("/dev/shm/ferry-loader", a.gb)
    hz = lg.calibrate_sleep()
    B, S = 32, a.seconds
    p = lg.FerryPeer(prefix, B, "shuffle", dev, 1, 8)
    peak, _, _ = lg.alone(p, S)
    st = p.loader.stats()
    p.close()
    print(f"PROBE peak shuffle threads 1 prefetch 8 | {peak:.0f} samples/s | pipeline {st['cpu_cores']:.2f} cores")

    def run(name, frac, threads=1, prefetch=8, fn=lg.with_gpu_step):
        step = B / (peak * frac)
        p = lg.FerryPeer(prefix, B, "shuffle", dev, threads, prefetch)
        wait, rate = fn(p, step, S, hz)
        st = p.loader.stats()
        p.close()
        print(f"PROBE {name} | wait {wait * 100:.2f}% | step {step * 1e6:.0f} us, {rate * B:.0f} samples/s "
              f"({rate * B / peak:.2f} of peak), loader wait p50/p90/p99 {st['wait_p50_ns'] / 1e3:.0f}/"
              f"{st['wait_p90_ns'] / 1e3:.0f}/{st['wait_p99_ns'] / 1e3:.0f} us, pipeline "
              f"{st['cpu_cores']:.2f} cores, device_buffers {st.get('device_buffers', -1):.0f}", flush=True)

    floor, _ = lg.with_gpu_step(lg.NullPeer(B, dev), B / (peak * 0.8), 3, hz)
    print(f"PROBE floor at 0.8 | wait {floor * 100:.2f}%")
    run("0.8 as in the bench", 0.8)
    run("0.8 blocking sync", 0.8, fn=with_gpu_step_blocking)
    run("0.8 prefetch 32", 0.8, prefetch=32)
    run("0.8 threads 2", 0.8, threads=2)
    run("0.7", 0.7)
    run("0.6", 0.6)
    run("0.8 again", 0.8)


if __name__ == "__main__":
    main()
