#!/usr/bin/env python3
"""ferry.Loader (the Python package) against PyTorch DataLoader over a numpy.memmap Dataset (8 workers,
pin_memory=True, prefetch_factor=4, .to(device, non_blocking=True)) on one uint16 token dataset of
2048-token samples: DIR/tokens.bin (the tokens) + DIR/tokens.idx (Megatron MMIDIDX, one sample per
2048 tokens), which ferry reads as a Megatron prefix and the peer as a memmap, window for window.

  warm (/dev/shm): each loader alone (samples/s, CPU cores used), then a synthetic GPU step that needs
    80% of that loader's peak rate (torch.cuda._sleep sized by calibration), GPU wait % measured
    with CUDA events: 1 - busy / span of the stream (the host runs at most 2 steps ahead); for
    ferry also the data stall: its steps/s against the same loop on a resident batch, in alternating
    rounds (the issue's figure: the idle share also holds the loop's own gap between steps);
  cold (--cold-dir, page cache dropped before each run): the disk's raw read ceiling in the same
    run (O_DIRECT, 8 threads x 8 MiB), then sequential, shuffled and block orders, at most one pass.

  --fixed-costs (issue 22's workload alone, bench/gpu-loader-fixed.sh): batches of 64 x 2049 uint16
    tokens, shuffled, to the GPU, ferry.Loader at its defaults against DataLoader with 8 and with 16
    workers (pin_memory, prefetch_factor 4); samples/s, the cores of each (ferry: the whole process
    and without the consuming thread; DataLoader: the process and its workers), the consumer's wait
    fraction (time inside next() over the wall time) in a loop that does no work and in one whose
    step is about 50 ms of bf16 matmuls (at most 2 steps queued ahead), beside the GPU's idle share.

Prints `TABLE name | figure | note` lines. Sized to finish in under 4 minutes on a 16-core machine
with the defaults (--gb 4 --seconds 8); bench/loader-gpu.sh is the wrapper gpu-check.sh style.
    bench/loader-gpu.py [--gb 4] [--seconds 8] [--warm-dir /dev/shm/ferry-loader]
                        [--cold-dir /var/tmp/ferry-loader] [--batch-size 32] [--skip-cold]
"""
import argparse
import gc
import os
import statistics
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import ferry

SEQ = 2048
T0 = time.perf_counter()


def table(name, figure, note=""):
    print(f"TABLE {name} | {figure} | {note}", flush=True)


# ------------------------------------------------------------------------------------- data


def make_data(d, gb):
    """DIR/tokens.bin (uint16) + DIR/tokens.idx (Megatron, one sample per SEQ tokens)."""
    os.makedirs(d, exist_ok=True)
    bin_path, idx_path = os.path.join(d, "tokens.bin"), os.path.join(d, "tokens.idx")
    n = int(gb * (1 << 30)) // (2 * SEQ)  # samples
    want = n * SEQ * 2
    if not (os.path.exists(idx_path) and os.path.getsize(bin_path) == want):
        rng = np.random.default_rng(0)
        block = rng.integers(0, 50000, size=1 << 25, dtype=np.uint16)  # 64 MiB
        with open(bin_path, "wb") as f:
            left, k = want, 0
            while left:
                chunk = (block + np.uint16(k)).tobytes()[:left]
                f.write(chunk)
                left -= len(chunk)
                k += 1
        with open(idx_path, "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
            f.write(struct.pack("<QQ", n, n + 1))
            f.write(np.full(n, SEQ, np.int32).tobytes())
            f.write((np.arange(n, dtype=np.int64) * (SEQ * 2)).tobytes())
            f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    return os.path.join(d, "tokens"), bin_path, n


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def raw_ceiling(path, seconds, threads=8, chunk=8 << 20):
    """The disk's sequential read ceiling: O_DIRECT, `threads` readers of `chunk` bytes."""
    import mmap
    size = os.path.getsize(path)
    nxt = [0]
    lock = threading.Lock()
    done = [0]
    end = time.perf_counter() + seconds

    def reader():
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, chunk)  # page-aligned
        try:
            while time.perf_counter() < end:
                with lock:
                    off = nxt[0]
                    nxt[0] += chunk
                if off >= size:
                    break
                n = os.preadv(fd, [buf], off)
                with lock:
                    done[0] += n
        finally:
            os.close(fd)
            buf.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0] / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------ peers


def thread_cpu_s():
    """(whole process, the calling (consumer) thread) CPU seconds, from /proc/self/task/*/stat:
    the rest is the loader's pipeline threads, the I/O engine's workers, io_uring's io-wq threads
    and torch's own threads."""
    tick = os.sysconf("SC_CLK_TCK")
    total = mine = 0.0
    me = threading.get_native_id()
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        c = (int(fields[11]) + int(fields[12])) / tick
        total += c
        if int(t) == me:
            mine = c
    return total, mine


def proc_cpu_s(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


class Windows(Dataset):
    """Windows of `seq` tokens one after another over the token file (issue 22's 2049: 2048 and
    the label's shift), as ferry.Loader(seq_len=seq) cuts them."""

    def __init__(self, path, seq):
        self.path, self.seq = path, seq
        self.n = os.path.getsize(path) // (2 * seq)
        self.mm = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = np.memmap(self.path, dtype=np.uint16, mode="r")
        return torch.from_numpy(np.array(self.mm[i * self.seq:(i + 1) * self.seq]))


class TorchPeer:
    def __init__(self, bin_path, batch, shuffle, device, workers=8, seq=None):
        self.device = device
        ds = Windows(bin_path, SEQ if seq is None else seq)
        self.dl = DataLoader(ds, batch_size=batch, shuffle=shuffle, num_workers=workers,
                             pin_memory=True, prefetch_factor=4, persistent_workers=True)
        self.it = None

    def batches(self):
        while True:
            if self.it is None:
                self.it = iter(self.dl)
            try:
                b = next(self.it)
            except StopIteration:
                self.it = None
                continue
            yield b.to(self.device, non_blocking=True)

    def cpu_s(self):
        pids = [os.getpid()]
        if self.it is not None and hasattr(self.it, "_workers"):
            pids += [w.pid for w in self.it._workers]
        return proc_cpu_s(pids)

    def close(self):
        self.it = None
        del self.dl


class FerryPeer:
    def __init__(self, prefix, batch, order, device, threads, prefetch, seq=SEQ):
        kw = {k: v for k, v in (("threads", threads), ("prefetch", prefetch)) if v is not None}  # None: the default
        self.loader = ferry.Loader(prefix, batch_size=batch, seq_len=seq, order=order, seed=0,
                                   device=device, block=256, **kw)

    def batches(self):
        while True:
            yield from self.loader

    def cpu_s(self):
        return proc_cpu_s([os.getpid()])

    def cpu_split(self):
        return thread_cpu_s()

    def close(self):
        self.loader.close()


class NullPeer:
    """No loader: the same batch, already on the GPU, every step. Its GPU wait is the floor the step
    loop itself has (event records, the batch's read, launch gaps), which no loader can go under."""

    def __init__(self, batch, device):
        self.b = torch.zeros((batch, SEQ), dtype=torch.uint16, device=device)

    def batches(self):
        while True:
            yield self.b

    def close(self):
        pass


def mosaic_import():
    """streaming, or the reason it cannot be used. Its package imports transformers (only for
    isinstance checks in StreamingDataLoader and the tokenizers of its C4/Pile datasets, none of
    which local MDS reading uses): when transformers is missing, stand-in classes are installed so
    that the 13 MB wheel and its dependencies need not be carried (bench/loader-gpu.sh)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        import types
        for name, attrs in (("transformers", ()), ("transformers.feature_extraction_utils", ("BatchFeature",)),
                            ("transformers.tokenization_utils_base", ("BatchEncoding",)),
                            ("transformers.models", ()), ("transformers.models.auto", ()),
                            ("transformers.models.auto.tokenization_auto", ("AutoTokenizer",))):
            m = types.ModuleType(name)
            for a in attrs:
                setattr(m, a, type(a, (dict,), {}))
            sys.modules[name] = m
    try:
        import streaming
        return streaming, ""
    except Exception as e:  # ImportError, or a wheel built against another torch
        return None, f"{type(e).__name__}: {e}"


def make_mds(streaming, bin_path, d):
    """The same samples (2048 uint16 tokens each, in order) as streaming's MDS shards, uncompressed."""
    out = os.path.join(d, "mds")
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    mm = np.memmap(bin_path, dtype=np.uint16, mode="r")
    with streaming.MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{SEQ}"}, compression=None,
                             size_limit=1 << 27) as w:
        for i in range(len(mm) // SEQ):
            w.write({"tokens": np.asarray(mm[i * SEQ:(i + 1) * SEQ])})
    return out


class MosaicPeer(TorchPeer):
    """StreamingDataset (local MDS, no remote) + DataLoader as its docs show, with the DataLoader
    peer's settings (8 workers, pin_memory, prefetch_factor 4), then .to(device, non_blocking)."""

    def __init__(self, streaming, mds, batch, shuffle, device):
        self.device = device
        ds = streaming.StreamingDataset(local=mds, shuffle=shuffle, batch_size=batch, shuffle_seed=0)
        self.dl = DataLoader(ds, batch_size=batch, num_workers=8, pin_memory=True, prefetch_factor=4,
                             persistent_workers=True, collate_fn=lambda xs: torch.from_numpy(
                                 np.stack([x["tokens"] for x in xs])))
        self.it = None


# ---------------------------------------------------------------------------------- measures


def alone(peer, seconds, max_samples=None):
    """Samples/s from the first batch on (startup excluded), with the CPU cores used meanwhile."""
    it = peer.batches()
    b = next(it)
    torch.cuda.synchronize()
    split = getattr(peer, "cpu_split", None)
    s0 = split() if split else None
    t0, c0 = time.perf_counter(), peer.cpu_s()
    samples = 0
    end = t0 + seconds
    while time.perf_counter() < end and (max_samples is None or samples < max_samples):
        b = next(it)
        samples += b.shape[0]
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    if s0 is not None:
        s1 = split()
        peer.split_cores = ((s1[0] - s0[0]) / el, (s1[1] - s0[1]) / el)
    return samples / el, (peer.cpu_s() - c0) / el, samples * SEQ * 2 / el


def calibrate_sleep():
    """torch.cuda._sleep cycles per second on this GPU."""
    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / (a.elapsed_time(b) / 1e3)


def with_gpu_step(peer, step_s, seconds, hz):
    """GPU wait %: the share of the stream's span in which no step ran (it waited for data).
    Python's collector is frozen first (gc.freeze(), as training loops do, e.g. Megatron's
    --manual-gc): with torch imported a full collection pauses the loop 60-80 ms, 1.5-2% of a
    4 s run, whatever feeds it (docs/DATA.md)."""
    gc.collect()
    gc.freeze()
    it = peer.batches()
    next(it)
    torch.cuda.synchronize()
    cycles = max(1, int(step_s * hz))
    starts, ends = [], []
    acc = torch.zeros((), device="cuda", dtype=torch.int64)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        b = next(it)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        acc += b.view(torch.int16)[:, 0].sum()  # the step reads its batch (uint16 has no CUDA sum)
        torch.cuda._sleep(cycles)
        e.record()
        starts.append(s)
        ends.append(e)
        if len(ends) > 2:
            ends[-3].synchronize()  # at most 2 steps queued ahead, as a training loop runs
    torch.cuda.synchronize()
    busy = sum(s.elapsed_time(e) for s, e in zip(starts, ends))
    span = starts[0].elapsed_time(ends[-1])
    return max(0.0, 1 - busy / span), len(starts) / (span / 1e3)


def data_stall(make_peer, batch, device, step_s, seconds, hz, rounds):
    """The GPU's wait for data, in rounds that alternate the loader with the no-loader floor (the
    same step loop on one resident batch), each as long, so that both see the same GPU and host.
    Returns per round (rate stall, loader idle, floor idle, steps/s, loader stats).
    - idle (with_gpu_step): the share of the stream's span outside the steps. It also holds the gap
      the GPU leaves between one step's end event and the next step's start in any loop, with or
      without a loader: about 1.2 us per step, 1.45% of an 80 us step on the GPU machine. The
      loader's own share is its idle minus the floor's of the same round (the target line).
    - rate stall (DS-Analyzer's definition, Mohan et al., VLDB 2021): 1 - the loader's steps/s over
      the floor's. It also counts busy time that differs between the runs: the steps are
      torch.cuda._sleep cycles, whose length in time follows the SM clock (rounds of 0.9-3.1% where
      the idle excess was 0.3-0.6%, most likely clocks; not measured), so it is printed, not judged."""
    out = []
    for _ in range(rounds):
        p = NullPeer(batch, device)
        f_idle, f_rate = with_gpu_step(p, step_s, seconds, hz)
        p.close()
        p = make_peer()
        l_idle, l_rate = with_gpu_step(p, step_s, seconds, hz)
        st = p.loader.stats()
        p.close()
        out.append((max(0.0, 1 - l_rate / f_rate), l_idle, f_idle, l_rate, st))
    return out


# --------------------------------------------------------------------- issue 22's workload


def matmul_step(target_s):
    """A realistic GPU step: k bf16 matmuls of 4096 x 4096, k calibrated to take about target_s."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    k = max(1, round(target_s / ((time.perf_counter() - t0) / 20)))

    def step(batch, acc):
        acc += batch.view(torch.int16)[:, 0].sum()  # the step reads its batch
        for _ in range(k):
            c = a @ b
        acc += c[0, 0].to(torch.int64)
    return step, k


def consumer_loop(it, seconds, step=None):
    """The consumer's wait fraction (time inside next() over the wall time), samples/s, and with a
    step the GPU's idle share (1 - the steps' event time over the stream's span; at most 2 steps
    queued ahead, as a training loop runs). `it`: the peer's batches() (one per peer: a second
    generator over a ferry.Loader would close it when the first is collected)."""
    gc.collect()
    gc.freeze()
    next(it)
    torch.cuda.synchronize()
    acc = torch.zeros((), device="cuda", dtype=torch.int64)
    starts, ends = [], []
    waited = 0.0
    samples = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        w0 = time.perf_counter()
        b = next(it)
        waited += time.perf_counter() - w0
        samples += b.shape[0]
        if step is not None:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step(b, acc)
            e.record()
            starts.append(s)
            ends.append(e)
            if len(ends) > 2:
                ends[-3].synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gc.unfreeze()
    idle = None
    if starts:
        busy = sum(s.elapsed_time(e) for s, e in zip(starts, ends))
        idle = max(0.0, 1 - busy / starts[0].elapsed_time(ends[-1]))
    return waited / wall, samples / wall, idle


def fixed_costs(a, dev):
    """Issue 22's loader target in one run: ferry >= 10x DataLoader with 8 and with 16 workers,
    ferry's process <= 1 core, and the wait fraction with a ~50 ms GPU step next to the no-work loop."""
    seq, batch = 2049, 64
    prefix, bin_path, n = make_data(a.warm_dir, a.gb)
    table("loader fixed-costs data", f"{n * SEQ * 2 / 2**30:.2f} GiB in {a.warm_dir}",
          f"batches of {batch} x {seq} uint16 tokens, shuffled, to {dev}")
    rates = {}
    p = FerryPeer(prefix, batch, "shuffle", dev, None, None, seq=seq)
    sps, cores, bps = alone(p, a.seconds)
    st = p.loader.stats()
    whole, consumer = p.split_cores
    p.close()
    p = FerryPeer(prefix, batch, "shuffle", dev, None, None, seq=seq)
    w_nowork = consumer_loop(p.batches(), a.seconds / 2)[0]
    p.close()
    rates["ferry"] = sps
    table("loader fixed-costs ferry", f"{sps:.0f} samples/s",
          f"{bps / 1e9:.2f} GB/s; {whole:.2f} cores in the process (target <= 1) = consumer thread {consumer:.2f} "
          f"+ the rest {whole - consumer:.2f} (pipeline {st['cpu_cores']:.2f}); defaults (threads, prefetch); "
          f"wait fraction {st['wait_fraction']:.2f} (the loader's own measure), {w_nowork:.2f} in a loop doing no work; "
          f"CPU per batch: pipeline {st['cpu_ns'] / max(1, st['samples']) * batch / 1e3:.1f} us (its counter, start "
          f"included), consumer thread {consumer / sps * batch * 1e6:.1f} us; {st.get('mapped_reads', 0)} of "
          f"{st['reads']} reads copied from mappings ({st.get('mapped_faults', 0)} faults)")
    # The target's reading: the loader's process given one core. Every thread of the process (the
    # CUDA runtime's included) is bound to one CPU before the loader starts its threads, which
    # inherit it; the rate on that core is what is held against 10x DataLoader.
    cpus = sorted(os.sched_getaffinity(0))
    one = {cpus[len(cpus) // 2]}
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    for t in tasks:
        try:
            os.sched_setaffinity(t, one)
        except OSError:
            pass
    try:
        p = FerryPeer(prefix, batch, "shuffle", dev, None, None, seq=seq)
        sps1, cores1, bps1 = alone(p, a.seconds)
        whole1, consumer1 = p.split_cores
        p.close()
    finally:
        for t in [int(t) for t in os.listdir("/proc/self/task")]:
            try:
                os.sched_setaffinity(t, set(cpus))
            except OSError:
                pass
    rates["ferry 1 core"] = sps1
    table("loader fixed-costs ferry on one core", f"{sps1:.0f} samples/s",
          f"{bps1 / 1e9:.2f} GB/s; every thread of the process bound to CPU {min(one)}: {whole1:.2f} cores "
          f"(consumer thread {consumer1:.2f}); defaults otherwise")
    table("target loader fixed-costs ferry process cores <= 1", f"{whole:.2f} unbound, {whole1:.2f} bound",
          "met (on one core, against DataLoader below)" if whole1 <= 1.02 else "NOT met")
    for workers in (8, 16):
        p = TorchPeer(bin_path, batch, True, dev, workers=workers, seq=seq)
        sps, cores, bps = alone(p, a.seconds)
        p.close()
        rates[workers] = sps
        table(f"loader fixed-costs DataLoader {workers} workers", f"{sps:.0f} samples/s",
              f"{bps / 1e9:.2f} GB/s, {cores:.2f} cores (process and workers), pin_memory, prefetch_factor 4")
        r = rates["ferry"] / sps
        table(f"target loader fixed-costs ferry vs DataLoader {workers} workers >= 10x", f"{r:.2f}x",
              "met" if r >= 10 else "NOT met")
        r1 = rates["ferry 1 core"] / sps
        table(f"target loader fixed-costs ferry on one core vs DataLoader {workers} workers >= 10x", f"{r1:.2f}x",
              "met" if r1 >= 10 else "NOT met")
    step, k = matmul_step(0.05)
    for name, make in (("ferry", lambda: FerryPeer(prefix, batch, "shuffle", dev, None, None, seq=seq)),
                       ("DataLoader 16 workers", lambda: TorchPeer(bin_path, batch, True, dev, workers=16, seq=seq))):
        p = make()
        it = p.batches()
        w0, r0, _ = consumer_loop(it, a.seconds / 2)
        w1, r1, idle = consumer_loop(it, max(a.seconds, 4), step)
        p.close()
        table(f"loader fixed-costs {name} wait fraction, 50 ms GPU step", f"{w1:.3f}",
              f"step {k} bf16 matmuls 4096^2 ({1 / (r1 / batch) * 1e3:.0f} ms a step measured), GPU idle {idle * 100:.2f}%; "
              f"the loop doing no work: wait fraction {w0:.2f} at {r0:.0f} samples/s")
    if not a.keep:
        for f in (bin_path, prefix + ".idx"):
            os.unlink(f)


def pipeline(a):
    """The pipeline alone (no GPU needed): ferry.Loader(device="cpu") at its defaults on issue 22's
    workload, drained through the C loader (next() and release(): no torch copy), after 50 batches
    of warm-up, then rounds of --batches one after another (an epoch of 2 GiB is 4,096 batches;
    the first maps the shards' pages). Its own counters: the pipeline thread's CPU ns per batch
    and per window (the load of other processes inflates the wall time, not this), and samples/s."""
    seq, batch = 2049, 64
    prefix, _, n = make_data(a.warm_dir, a.gb)
    ld = ferry.Loader(prefix, batch_size=batch, seq_len=seq, order="shuffle", device="cpu")
    cl = ld._ensure()
    t0 = time.perf_counter()
    cl.next().release()
    first = time.perf_counter() - t0
    for _ in range(49):
        cl.next().release()
    table("loader pipeline warm-up", f"{cl.metrics()['cpu_ns'] / 1e6:.1f} ms CPU for 50 batches",
          f"the first batch after {first * 1e3:.1f} ms (the loader's start included)")
    for r in range(a.rounds):
        m0, t0, c0 = cl.metrics(), time.perf_counter(), time.thread_time()
        for _ in range(a.batches):
            cl.next().release()
        m1, el, cons = cl.metrics(), time.perf_counter() - t0, time.thread_time() - c0
        cpu = (m1["cpu_ns"] - m0["cpu_ns"]) / a.batches
        table(f"loader pipeline round {r}", f"{cpu / 1e3:.1f} us CPU per batch",
              f"{cpu / batch:.0f} ns a window, batch {batch} x {seq} over {n * SEQ * 2 / 2**30:.2f} GiB in "
              f"{a.warm_dir}; {a.batches * batch / el:.0f} samples/s; the draining thread "
              f"{cons / a.batches * 1e6:.1f} us CPU per batch; "
              f"{m1['inline_reads'] - m0['inline_reads']:.0f} inline reads of "
              f"{m1['reads'] - m0['reads']:.0f}; {1e9 / cpu * batch:.0f} windows/s a pipeline core; "
              f"{m1.get('mapped_reads', 0) - m0.get('mapped_reads', 0):.0f} copied from mappings")
    ld.close()


# -------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=4)
    ap.add_argument("--seconds", type=float, default=8, help="per measured run")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="ferry pipeline threads, warm")
    ap.add_argument("--cold-threads", type=int, default=8, help="ferry pipeline threads, cold")
    ap.add_argument("--prefetch", type=int, default=8)
    ap.add_argument("--step-fraction", type=float, default=0.8)
    ap.add_argument("--stall-rounds", type=int, default=3, help="alternating loader / no-loader GPU-step rounds")
    ap.add_argument("--stall-seconds", type=float, default=3, help="per GPU-step run of those rounds")
    ap.add_argument("--warm-dir", default="/dev/shm/ferry-loader")
    ap.add_argument("--cold-dir", default="/var/tmp/ferry-loader")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the data files")
    ap.add_argument("--fixed-costs", action="store_true",
                    help="only issue 22's loader workload (batch 64 x 2049, DataLoader 8 and 16 workers, 50 ms step)")
    ap.add_argument("--ferry-warm-only", action="store_true",
                    help="only ferry's warm samples/s per order, then stop (bench/gpu-ab.sh runs it per build)")
    ap.add_argument("--pipeline", action="store_true",
                    help="only the pipeline's CPU per batch on issue 22's workload, device cpu (no GPU needed)")
    ap.add_argument("--batches", type=int, default=10000, help="--pipeline: batches per round")
    ap.add_argument("--rounds", type=int, default=3, help="--pipeline: rounds")
    a = ap.parse_args()
    if a.pipeline:
        pipeline(a)
        return
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        sys.exit(77)
    dev = torch.device("cuda", torch.cuda.current_device())
    B, S = a.batch_size, a.seconds
    table("loader machine", torch.cuda.get_device_name(dev), f"{os.cpu_count()} CPUs, torch {torch.__version__}")

    if a.fixed_costs:
        fixed_costs(a, dev)
        table("loader bench time", f"{time.perf_counter() - T0:.0f} s", "")
        return
    prefix, bin_path, n = make_data(a.warm_dir, a.gb)
    table("loader data", f"{n * SEQ * 2 / 2**30:.2f} GiB", f"{n} samples of {SEQ} uint16 tokens, batch {B}, "
          f"made in {time.perf_counter() - T0:.0f} s")
    if a.ferry_warm_only:
        for order in ("shuffle", "sequential", "block"):
            p = FerryPeer(prefix, B, order, dev, a.threads, a.prefetch)
            sps, cores, _ = alone(p, S)
            p.close()
            table(f"loader warm ferry {order}", f"{sps:.0f} samples/s", f"{cores:.2f} cores in the process")
        return
    hz = calibrate_sleep()

    # -- warm: each alone, then the GPU step at 80% of its own peak
    peaks = {}
    for order in ("sequential", "shuffle", "block"):
        p = FerryPeer(prefix, B, order, dev, a.threads, a.prefetch)
        sps, cores, bps = alone(p, S)
        st = p.loader.stats()
        pipe = st["cpu_cores"]
        whole, consumer = p.split_cores
        p.close()
        peaks[f"ferry {order}"] = sps
        table(f"loader warm ferry {order}", f"{sps:.0f} samples/s",
              f"{bps / 1e9:.2f} GB/s, {whole:.2f} cores in the process = consumer thread {consumer:.2f} "
              f"(the Python loop, ferry.Loader's per-batch Python included) + other threads "
              f"{whole - consumer:.2f} (loader pipeline {pipe:.2f}, I/O engine, torch), threads {a.threads}, "
              f"{st.get('inline_reads', 0):.0f}/{st.get('reads', 0):.0f} reads inline")
        table(f"loader warm ferry {order} CPU cores without the consumer", f"{whole - consumer:.2f}",
              "goal <= 1 core for the loader")
    for shuffle in (False, True):
        name = "torch " + ("shuffle" if shuffle else "sequential")
        p = TorchPeer(bin_path, B, shuffle, dev)
        sps, cores, bps = alone(p, S)
        peaks[name] = sps
        table(f"loader warm {name}", f"{sps:.0f} samples/s",
              f"{bps / 1e9:.2f} GB/s, {cores:.2f} cores, 8 workers, pin_memory, prefetch_factor 4")
        if shuffle:
            step = B / (peaks[name] * a.step_fraction)
            wait, rate = with_gpu_step(p, step, S, hz)
            table(f"loader warm {name} GPU wait at {a.step_fraction:.0%} of peak", f"{wait * 100:.2f}%",
                  f"step {step * 1e6:.0f} us, {rate * B:.0f} samples/s")
        p.close()
    streaming, why = mosaic_import()
    if streaming is None:
        table("loader warm mosaic", "skipped", why)
    else:
        t = time.perf_counter()
        mds = make_mds(streaming, bin_path, a.warm_dir)
        table("loader mosaic data", "MDS", f"written in {time.perf_counter() - t:.0f} s, streaming "
              f"{getattr(streaming, '__version__', '?')}")
        p = MosaicPeer(streaming, mds, B, True, dev)
        sps, cores, bps = alone(p, S)
        p.close()
        peaks["mosaic shuffle"] = sps
        table("loader warm mosaic shuffle", f"{sps:.0f} samples/s",
              f"{bps / 1e9:.2f} GB/s, {cores:.2f} cores, StreamingDataset + DataLoader 8 workers, pin_memory, "
              "prefetch_factor 4")
        table("loader warm ferry/mosaic shuffle", f"{peaks['ferry shuffle'] / sps:.2f}x", "samples/s ratio")
        if not a.keep:
            import shutil
            shutil.rmtree(mds, ignore_errors=True)
    ratio = peaks["ferry shuffle"] / peaks["torch shuffle"]
    table("loader warm ferry/torch shuffle", f"{ratio:.2f}x", "samples/s ratio (goal >= 3x)")
    step = B / (peaks["ferry shuffle"] * a.step_fraction)
    rs = data_stall(lambda: FerryPeer(prefix, B, "shuffle", dev, a.threads, a.prefetch), B, dev, step,
                    a.stall_seconds, hz, a.stall_rounds)
    for k, (stall, idle, f_idle, rate, st) in enumerate(rs, 1):
        table(f"loader warm ferry shuffle GPU step round {k}", f"stall {stall * 100:.2f}%",
              f"GPU idle {idle * 100:.2f}% with the loader, {f_idle * 100:.2f}% without (the floor); "
              f"{rate * B:.0f} samples/s; loader p99 wait {st['wait_p99_ns'] / 1e3:.0f} us")
    med = lambda k: statistics.median(r[k] for r in rs)
    table("loader warm no-loader GPU wait floor", f"{med(2) * 100:.2f}%",
          f"step {step * 1e6:.0f} us on a batch already on the GPU: the step loop's own gaps, median of {len(rs)}")
    table(f"loader warm ferry shuffle GPU wait at {a.step_fraction:.0%} of peak", f"{med(1) * 100:.2f}%",
          f"step {step * 1e6:.0f} us; the GPU's idle share with the loader, the floor's gaps included, median of {len(rs)}")
    table(f"loader warm ferry shuffle rate stall at {a.step_fraction:.0%} of peak", f"{med(0) * 100:.2f}%",
          f"1 - steps/s over the no-loader loop's (DS-Analyzer's definition; counts busy-time changes too), "
          f"rounds {', '.join('%.2f%%' % (r[0] * 100) for r in rs)}")
    excess = [r[1] - r[2] for r in rs]
    ex = statistics.median(excess)
    table(f"target loader GPU wait at {a.step_fraction:.0%} of peak < 1%", f"{ex * 100:.2f}% (+ the loop's {med(2) * 100:.2f}%)",
          f"the GPU's idle share with the loader minus the same loop's without one, alternating rounds "
          f"{', '.join('%.2f%%' % (x * 100) for x in excess)}; the idle share counting the loop's own gaps "
          f"{med(1) * 100:.2f}%; {'met' if ex < 0.01 else 'NOT met'} for the loader's part, "
          f"{'met' if med(1) < 0.01 else 'NOT met'} counting the loop's gaps")
    if not a.keep:
        for f in (bin_path, prefix + ".idx"):
            os.unlink(f)

    # -- cold: the disk's ceiling, then each order from a dropped page cache, at most one pass
    if a.skip_cold:
        return
    prefix, bin_path, n = make_data(a.cold_dir, a.gb)
    dropped = drop_caches()
    if not dropped:
        table("loader cold note", "cannot drop caches", "not root: the cold figures are warm")
    ceiling = raw_ceiling(bin_path, S)
    table("loader cold raw read ceiling", f"{ceiling / 1e9:.2f} GB/s", f"O_DIRECT 8 x 8 MiB, {a.cold_dir}")
    for order in ("sequential", "shuffle", "block"):
        drop_caches()
        p = FerryPeer(prefix, B, order, dev, a.cold_threads, max(a.prefetch, 32))
        sps, cores, bps = alone(p, S, max_samples=n - 2 * B)
        p.close()
        table(f"loader cold ferry {order}", f"{bps / 1e9:.2f} GB/s",
              f"{bps / ceiling:.2f}x ceiling, {sps:.0f} samples/s, {cores:.2f} cores, threads {a.cold_threads}")
    for shuffle in (False, True):
        drop_caches()
        name = "torch " + ("shuffle" if shuffle else "sequential")
        p = TorchPeer(bin_path, B, shuffle, dev)
        sps, cores, bps = alone(p, S, max_samples=n - 2 * B)
        p.close()
        table(f"loader cold {name}", f"{bps / 1e9:.2f} GB/s",
              f"{bps / ceiling:.2f}x ceiling, {sps:.0f} samples/s, {cores:.2f} cores")
    if not a.keep:
        for f in (bin_path, prefix + ".idx"):
            os.unlink(f)
    table("loader bench time", f"{time.perf_counter() - T0:.0f} s", "goal < 240 s")


if __name__ == "__main__":
    main()
