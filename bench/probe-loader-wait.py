"""Diagnosis for the loader's GPU-wait figure (docs/DATA.md): the ferry shuffle loader's GPU wait at a
fraction of its peak, three times as the bench runs it, with 2 pipeline threads, and with Python's
garbage collector frozen (gc.freeze()) or off, with the pauses the collector made in each run; the
no-loader floor beside them. Prints one line each.
    python3 bench/probe-loader-wait.py [--gb 2] [--seconds 4]
Needs `pip install .` and a GPU; uses bench/loader-gpu.py's data, peers and measures."""
import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import time

import torch

spec = importlib.util.spec_from_file_location("lg", os.path.join(os.path.dirname(__file__), "loader-gpu.py"))
lg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lg)


class EventPeer(lg.NullPeer):
    """The no-loader floor plus what ferry's loader adds to the consumer's stream per step: an
    event recorded where the previous batch is freed (between two steps)."""

    def batches(self):
        while True:
            torch.cuda.Event().record()
            yield self.b


class FreshPeer(lg.NullPeer):
    """The no-loader floor, each step on another of 12 batches already on the GPU."""

    def __init__(self, batch, device):
        self.bs = [torch.zeros((batch, lg.SEQ), dtype=torch.uint16, device=device) for _ in range(12)]

    def batches(self):
        while True:
            yield from self.bs


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

    gc_pause = []

    def gc_cb(phase, info):
        if phase == "start":
            gc_pause.append([time.perf_counter(), info["generation"]])
        elif gc_pause:
            gc_pause[-1][0] = time.perf_counter() - gc_pause[-1][0]

    gc.callbacks.append(gc_cb)

    def run(name, frac, threads=1, prefetch=8, fn=lg.with_gpu_step, peer=None):
        step = B / (peak * frac)
        p = peer or lg.FerryPeer(prefix, B, "shuffle", dev, threads, prefetch)
        gc_pause.clear()
        wait, rate = fn(p, step, S, hz)
        g = [x for x in gc_pause if x[0] < 1]
        gcs = (f"; GC {len(g)} pauses, {sum(x[0] for x in g) * 1e3:.1f} ms in all, gen2 "
               f"{sum(1 for x in g if x[1] == 2)}, longest {max((x[0] for x in g), default=0) * 1e3:.2f} ms")
        if peer is not None:
            print(f"PROBE {name} | wait {wait * 100:.2f}% | {rate * B:.0f} samples/s{gcs}", flush=True)
            return
        st = p.loader.stats()
        p.close()
        print(f"PROBE {name} | wait {wait * 100:.2f}% | step {step * 1e6:.0f} us, {rate * B:.0f} samples/s "
              f"({rate * B / peak:.2f} of peak), loader wait p50/p90/p99 {st['wait_p50_ns'] / 1e3:.0f}/"
              f"{st['wait_p90_ns'] / 1e3:.0f}/{st['wait_p99_ns'] / 1e3:.0f} us, pipeline "
              f"{st['cpu_cores']:.2f} cores, device_buffers {st.get('device_buffers', -1):.0f}{gcs}", flush=True)

    run("floor (no loader) at 0.8", 0.8, peer=lg.NullPeer(B, dev))
    for k in range(3):
        run(f"0.8 as in the bench, {k + 1}", 0.8)
    run("0.8 threads 2", 0.8, threads=2)
    gc.freeze()
    run("floor (no loader) at 0.8, gc.freeze()", 0.8, peer=lg.NullPeer(B, dev))
    run("floor + an event recorded per step, gc.freeze()", 0.8, peer=EventPeer(B, dev))
    run("floor on 12 batches in turn, gc.freeze()", 0.8, peer=FreshPeer(B, dev))
    for k in range(3):
        run(f"0.8 after gc.freeze(), {k + 1}", 0.8)
    gc.disable()
    run("0.8 gc disabled", 0.8)
    run("floor (no loader) at 0.8, gc disabled", 0.8, peer=lg.NullPeer(B, dev))
    gc.enable()

if __name__ == "__main__":
    main()
