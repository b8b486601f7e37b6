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

--targets (bench/gpu-dcp-torch.sh) measures issue 24's targets in ONE process instead, beside the
ceilings measured in the same run: a --size state (model bf16, optimizer fp32) on --device;
dcp.save (fsynced) against dd's fsynced write; dcp.load warm against the pinned copy into new
device memory and cold (pages dropped by POSIX_FADV_DONTNEED, no root needed) against dd's read;
a checkpoint saved by 4 gloo ranks loaded by this process (4->1) and by 2 processes (4->2, their
DTensor shards on GPU rank % device_count); dcp.async_save's blocked time
against the device-to-host copy with a matmul training step running meanwhile (its slowdown);
ferry.torch.save/load of a --pt-size pytorch_model.bin. Stock PyTorch in every row. After each
warm ferry load a PHASES line says where its time went (ferry.dcp.Reader's trace: DCP's planning
before read_data, then read_data's steps; ferry.torch.last_trace()), in ms from its start. With --device
cpu the warm rows' ceiling is the same files read by ferry into one host buffer allocated before.

    python3 bench/dcp-torch.py --targets --device cuda --size 8g --pt-size 4g --dir /var/tmp/ferry-dcp
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


# ------------------------------------------------------------------ --targets: issue 24 in one run

RESHARD = r"""
import os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
import ferry.dcp
rank, world, port, path, n, layers = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                      int(sys.argv[5]), int(sys.argv[6]))
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
st = {}
for i in range(layers):
    full = torch.full((n,), float(i), dtype=torch.bfloat16 if i % 2 else torch.float32)
    st["layer.%d" % i] = distribute_tensor(full, mesh, [Shard(0)])
dcp.save(st, storage_writer=ferry.dcp.Writer(path))
dist.destroy_process_group()
print("rank %d ok" % rank)
"""

# The same checkpoint loaded by 2 ranks (issue 24's "saved by 4 ranks, loaded by 2"): each rank's
# targets are the local halves of DTensors sharded over a 2-rank mesh, on GPU rank % device_count
# (both on one GPU where there is one). After an untimed load with each reader (a process's first
# collectives and ferry's context), each reader's load is timed between barriers on every rank;
# the parent takes the slowest rank's time. Each reader is timed with torch's DefaultLoadPlanner
# and with ferry.dcp.LoadPlanner (whose DTensor chunks skip torch's arange over each shard).
LOAD2 = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
import ferry.dcp
rank, world, port, path, n, layers, dev = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                           sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
cuda = dev.startswith("cuda")
if cuda:
    dev = "cuda:%d" % (rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
# gloo alone: the load's collectives exchange plans (objects, on the CPU); no collective
# touches the CUDA tensors (DTensor.from_local without run_check), and the ranks may share a GPU
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
sync = torch.cuda.synchronize if cuda else (lambda: None)
tgt = {"layer.%d" % i: DTensor.from_local(
    torch.zeros(n // world, dtype=torch.bfloat16 if i % 2 else torch.float32, device=dev), mesh,
    [Shard(0)], run_check=False) for i in range(layers)}
# each reader with torch's default planner (what dcp.load takes given none) and with ferry's
readers = (("ferry", ferry.dcp.Reader, dcp.DefaultLoadPlanner),
           ("stock", dcp.FileSystemReader, dcp.DefaultLoadPlanner),
           ("ferry+planner", ferry.dcp.Reader, ferry.dcp.LoadPlanner),
           ("stock+planner", dcp.FileSystemReader, ferry.dcp.LoadPlanner))
for name, R, P in readers:
    dcp.load(tgt, storage_reader=R(path), planner=P())
for name, R, P in readers:
    for t in tgt.values():
        t._local_tensor.zero_()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(tgt, storage_reader=R(path), planner=P())
    sync()
    dt = time.perf_counter() - t0
    dist.barrier()
    for i in range(layers):
        loc = tgt["layer.%d" % i]._local_tensor
        if not torch.equal(loc, torch.full_like(loc, float(i))):
            raise SystemExit("rank %d: %s: layer.%d differs" % (rank, name, i))
    print("RESULT %s %.6f %d" % (name, dt, sum(t._local_tensor.nbytes for t in tgt.values())), flush=True)
dist.destroy_process_group()
"""


def _targets_state(size, device):
    """Model (bf16 weights) and optimizer (fp32 exp_avg, exp_avg_sq) of 64 layers, about size bytes."""
    import torch
    layers = 64
    n = max(1, size // (10 * layers))
    model, optim = {}, {}
    for i in range(layers):
        model["layer.%d.weight" % i] = torch.full((n,), float(i % 7), dtype=torch.bfloat16, device=device)
        optim[i] = {"exp_avg": torch.full((n,), 0.5 * i, device=device),
                    "exp_avg_sq": torch.full((n,), 0.25 * i, device=device),
                    "step": torch.tensor(10.0)}
    return {"model": model, "optim": {"state": optim}}


def _tensors(sd):
    import torch
    if isinstance(sd, dict):
        return [t for v in sd.values() for t in _tensors(v)]
    return [sd] if isinstance(sd, torch.Tensor) else []


def _nbytes(sd):
    return sum(t.numel() * t.element_size() for t in _tensors(sd))


def _files(path):
    """path itself, or every file under the directory path."""
    return [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def _warm(path):
    """Reads path (every file under a directory) once through the page cache, untimed, so that a
    warm load is one: ferry's writer writes with O_DIRECT, so a checkpoint it just wrote is not in
    the page cache (the "warm" rows had timed the disk: 1.37 GB/s for 8 GB on the H100)."""
    for f in _files(path):
        with open(f, "rb", buffering=0) as r:
            while r.read(16 << 20):
                pass


def _resident(path):
    """The fraction of path's bytes (every file under a directory) in the page cache, by
    mincore(2) over a read-only mapping of each file: what says a "warm" row read from memory."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    have = total = 0
    for f in _files(path):
        n = os.path.getsize(f)
        if not n:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap(%s)" % f)
            try:
                pages = (n + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, n, vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore(%s)" % f)
                have += sum(v & 1 for v in bytes(vec))
                total += pages
            finally:
                libc.munmap(addr, n)
        finally:
            os.close(fd)
    return have / total if total else 1.0


def _evict(path):
    """Drops path's pages (every file under a directory) from the page cache: fsync, then
    POSIX_FADV_DONTNEED, which needs no root."""
    for f in _files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _TimedStage(w):
    """The stock writer, its stage() timed into stage_times as ferry's writer does."""
    stage = w.stage

    def timed_stage(state_dict):
        t = time.perf_counter()
        try:
            return stage(state_dict)
        finally:
            w.stage_times = {"path": "stock (pageable host copy)", "total": time.perf_counter() - t}

    w.stage = timed_stage
    return w


def targets(a):
    """Issue 24's targets at --size (8 GB) and --pt-size (4 GB) on the GPU, with the ceilings
    measured in the same run. TABLE rows: capability | ferry | stock | ceiling | ratio | target."""
    import socket
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import ferry.dcp
    import ferry.torch
    warnings.simplefilter("ignore")
    dev = a.device
    cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    size, pt_size = _size(a.size), _size(a.pt_size)
    d = a.dir
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo",
                            init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    t_start = time.perf_counter()

    def timed(fn):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    def gb(nbytes, s):
        return nbytes / s / 1e9

    def table(cap, nbytes, fs, stock_name, ss, ceil_name, cs, target):
        """target: the least ferry/ceiling ratio (None: no ceiling target)."""
        r = cs / fs if cs else None
        met = "n/a" if target is None or r is None else ("met" if r >= target else "MISSED")
        print("TABLE %s | ferry %.2f GB/s (%.2f s) | %s %s | %s %s | %s | %s" % (
            cap, gb(nbytes, fs), fs,
            stock_name, "%.2f GB/s (%.2f s), ferry %.2fx" % (gb(nbytes, ss), ss, ss / fs) if ss else "-",
            ceil_name, "%.2f GB/s" % gb(nbytes, cs) if cs else "-",
            "%.2fx of the ceiling" % r if r else "-",
            "target >= %.2fx: %s" % (target, met) if target else "-"), flush=True)

    readers = []

    def reader(path):
        """ferry.dcp.Reader(path), kept so that its phases can be printed after the load."""
        readers.append(ferry.dcp.Reader(path))
        return readers[-1]

    def phases(what, total, trace):
        """Where a ferry load's time went (Reader.trace, ferry.torch.last_trace()): ms."""
        print("PHASES %s: total %.1f ms; %s" % (what, total * 1e3, ", ".join(
            "%s %.1f" % (k, v * 1e3) for k, v in (trace or {}).items())), flush=True)

    def warm_note(res_f, res_s):
        """The page cache's share of the files just before each warm load (mincore)."""
        worst = min(res_f, res_s)
        return " (page cache before the loads: ferry %.1f%%, stock %.1f%% resident%s)" % (
            100 * res_f, 100 * res_s, "" if worst >= 0.99 else "; NOT WARM: the disk was timed")

    def host_read(path, nbytes):
        """Without a GPU, the warm rows' ceiling: every file under path read (warm, just before
        by the load) with ferry's File.pread_into into one host buffer allocated and touched
        before the timing, scaled to nbytes (the files hold the zips' framing too)."""
        files = sorted(_files(path))
        total = sum(os.path.getsize(f) for f in files)
        buf = torch.ones(total, dtype=torch.uint8)

        def read():
            at = 0
            for f in files:
                with ferry.open(f) as fh:
                    n = fh.size
                    if n and fh.pread_into(buf[at:at + n], 0) != n:
                        raise SystemExit("%s: short read" % f)
                    at += n

        read()
        return min(timed(read) for _ in range(3)) * nbytes / total

    def load2(rdir, n, rb):
        """The 4-rank checkpoint at rdir loaded warm by 2 ranks (LOAD2), beside the stock
        reader; the ceiling is the copy of both ranks' bytes (one GPU: the same device's)."""
        script = os.path.join(d, "load2.py")
        with open(script, "w") as f:
            f.write(LOAD2)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            lport = s.getsockname()[1]
        _warm(rdir)
        res = _resident(rdir)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, script, str(r), "2", str(lport), rdir, str(n),
                                   str(a.reshard_layers), dev], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            bad = outs[[p.returncode != 0 for p in procs].index(True)]
            print("TABLE dcp.load warm resharded 4->2 | not measured: the 2-rank load failed: %s"
                  % bad[-400:].replace("\n", " "), flush=True)
            return
        t = {}
        for out in outs:
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    _, name, sec, _n = line.split()
                    t[name] = max(t.get(name, 0.0), float(sec))
        note = " (page cache before the loads: %.1f%% resident%s)" % (
            100 * res, "" if res >= 0.99 else "; NOT WARM: the disk was timed")
        ceil = (("pinned copy", h2d * rb / nbytes) if cuda else
                ("ferry read into host memory", host_read(rdir, rb)))
        table("dcp.load warm resharded 4->2 %s%s" % (a.size, note), rb, t["ferry"],
              "FileSystemReader", t["stock"], *ceil, 0.85)
        table("dcp.load warm resharded 4->2 %s, planner=ferry.dcp.LoadPlanner (FileSystemReader "
              "with it %.2f s; the peer is FileSystemReader with torch's planner)"
              % (a.size, t["stock+planner"]), rb, t["ferry+planner"],
              "FileSystemReader", t["stock"], *ceil, 0.85)

    st = _targets_state(size, dev)
    nbytes = _nbytes(st)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    # ceilings: pinned host -> new device memory, device -> pinned host, the disk's fsynced
    # write and cold read (dd, 16 MiB blocks)
    if cuda:
        h2d = timed(lambda: torch.empty(nbytes, dtype=torch.uint8, device=dev).copy_(pinned, non_blocking=True))
        d2h = timed(lambda: pinned.copy_(flat, non_blocking=True))
    else:
        h2d = d2h = None
    del flat
    ddf = os.path.join(d, "dd.bin")
    blocks = max(1, nbytes >> 24)
    wr = timed(lambda: subprocess.run(["dd", "if=/dev/zero", "of=" + ddf, "bs=16M", "count=%d" % blocks,
                                       "conv=fsync"], check=True, capture_output=True))
    _evict(ddf)
    rd = timed(lambda: subprocess.run(["dd", "if=" + ddf, "of=/dev/null", "bs=16M"], check=True,
                                      capture_output=True))
    os.unlink(ddf)
    scale = nbytes / (blocks << 24)
    wr, rd = wr * scale, rd * scale
    print("CEILING pinned->device %s, device->pinned %s, disk write+fsync %.2f GB/s, disk read cold "
          "%.2f GB/s (%d bytes)" % ("%.2f GB/s" % gb(nbytes, h2d) if h2d else "-",
                                    "%.2f GB/s" % gb(nbytes, d2h) if d2h else "-",
                                    gb(nbytes, wr), gb(nbytes, rd), nbytes), flush=True)

    # dcp.save to the disk, fsynced (FileSystemWriter's sync_files=True, ferry always). First a
    # small untimed save with each writer: the process group's first collectives (NCCL's
    # communicator), DCP's first planning and ferry's pinned staging buffers (made once per
    # process, 16 x 16 MiB) are paid by the first save of a run, not by the checkpoints after it;
    # ferry.torch.save below finds them made, so the rows compare like with like.
    small = _targets_state(64 << 20, dev)
    for i, w in enumerate((ferry.dcp.Writer, dcp.FileSystemWriter)):
        dcp.save(small, storage_writer=w(os.path.join(d, "warm%d" % i)))
        shutil.rmtree(os.path.join(d, "warm%d" % i))
    del small
    fs_ = timed(lambda: dcp.save(st, storage_writer=ferry.dcp.Writer(os.path.join(d, "ferry"))))
    ss = timed(lambda: dcp.save(st, storage_writer=dcp.FileSystemWriter(os.path.join(d, "stock"))))
    shutil.rmtree(os.path.join(d, "stock"))
    table("dcp.save %s" % a.size, nbytes, fs_, "FileSystemWriter", ss, "disk write+fsync", wr, 0.95)

    # dcp.load into GPU memory: warm (just written) against the pinned copy, cold against dd
    zeros = _targets_state(size, dev)
    for t in _tensors(zeros):
        t.zero_()
    src = os.path.join(d, "ferry")
    ceil_name, ceil = ("pinned copy", h2d) if cuda else ("ferry read into host memory", None)
    # Twice: the first is the process's first read into GPU memory by ferry (the engine's copy
    # units and first copies are made then: a job's first load pays them), the second finds them.
    for which in ("the process's first read into GPU memory" if cuda else "first", "second"):
        for t in _tensors(zeros):
            t.zero_()
        _warm(src)
        res_f = _resident(src)
        fl = timed(lambda: dcp.load(zeros, storage_reader=reader(src)))
        phases("dcp.load warm, %s" % which, fl, readers[-1].trace)
        bad = [i for i, (x, y) in enumerate(zip(_tensors(st), _tensors(zeros))) if not torch.equal(x, y)]
        if bad:
            raise SystemExit("dcp.load ferry: %d tensors differ, first #%d" % (len(bad), bad[0]))
        _warm(src)
        res_s = _resident(src)
        sl = timed(lambda: dcp.load(zeros, storage_reader=dcp.FileSystemReader(src)))
        if ceil is None:
            ceil = host_read(src, nbytes)
        table("dcp.load warm %s, %s%s" % (a.size, which, warm_note(res_f, res_s)), nbytes, fl,
              "FileSystemReader", sl, ceil_name, ceil, 0.85)
    _evict(src)
    flc = timed(lambda: dcp.load(zeros, storage_reader=ferry.dcp.Reader(src)))
    _evict(src)
    slc = timed(lambda: dcp.load(zeros, storage_reader=dcp.FileSystemReader(src)))
    table("dcp.load cold %s" % a.size, nbytes, flc, "FileSystemReader", slc, "disk read", rd, 0.95)
    shutil.rmtree(src)

    # dcp.async_save: the caller's blocked time against the device-to-host copy, and a training
    # step's slowdown while the save runs
    if cuda:
        m = torch.randn(a.step_dim, a.step_dim, dtype=torch.bfloat16, device=dev)

        def train_step():
            for _ in range(8):
                torch.mm(m, m)
            torch.cuda.synchronize()

        for _ in range(3):
            train_step()
        base = [timed(train_step) for _ in range(10)]
        base_s = statistics.median(base)
        # the first call of a cached writer pins its staging memory; the second is the steady state
        for name, calls, mk in (
                ("ferry", 1, lambda p: ferry.dcp.Writer(p)),
                ("ferry cached", 2, lambda p: ferry.dcp.Writer(p, cache_staged_state_dict=True)),
                ("stock", 1, lambda p: _TimedStage(dcp.FileSystemWriter(p)))):
            w = None
            for call in range(1, calls + 1):
                p = os.path.join(d, "async-%s-%d" % (name.replace(" ", "-"), call))
                sync()
                t = time.perf_counter()
                if w is None:
                    w = mk(p)
                fut = dcp.async_save(st, storage_writer=w, checkpoint_id=p)
                blocked = time.perf_counter() - t
                # where the caller's time went: the writer's staging (ferry.dcp.Writer.stage's
                # phases; the stock writer's stage timed whole by a wrapper) and async_save's own
                stt = dict(getattr(w, "stage_times", None) or {})
                if "total" in stt:
                    print("ASYNC %s call %d: blocked %.4f s = staging %.4f s [%s] + async_save's own "
                          "%.4f s (stateful state_dict(), executor, thread start)" % (
                              name, call, blocked, stt["total"], ", ".join(
                                  "%s %.4f s" % (k, v) if isinstance(v, float) else "%s: %s" % (k, v)
                                  for k, v in stt.items() if k != "total" and not k.startswith("_")),
                              blocked - stt["total"]), flush=True)
                during = []
                while not fut.done():
                    during.append(timed(train_step))
                fut.result()
                total = time.perf_counter() - t
                slow = (statistics.median(during) / base_s - 1) * 100 if during else float("nan")
                print("TABLE dcp.async_save %s %s, call %d | blocked %.3f s | device->pinned copy "
                      "%.3f s | %.2fx of the copy (target <= 1.2x: %s) | %d training steps during the "
                      "save: %+.1f%% step time (target <= 5%%: %s) | save done after %.2f s" % (
                          a.size, name, call, blocked, d2h, blocked / d2h,
                          "met" if blocked <= 1.2 * d2h else "MISSED", len(during), slow,
                          "met" if during and slow <= 5 else ("no step ran" if not during else "MISSED"),
                          total), flush=True)
                shutil.rmtree(p, ignore_errors=True)
        del m

    # resharded: saved by 4 ranks (gloo processes on the CPU), loaded here by one into GPU memory
    if a.reshard:
        rdir = os.path.join(d, "reshard")
        n = max(4, size // (3 * a.reshard_layers) // 4 * 4)  # fp32 and bf16 layers, ~size bytes
        script = os.path.join(d, "reshard.py")
        with open(script, "w") as f:
            f.write(RESHARD)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            rport = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, script, str(r), "4", str(rport), rdir, str(n),
                                   str(a.reshard_layers)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(4)]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            print("TABLE dcp.load resharded | not measured: the 4-rank save failed: %s"
                  % outs[[p.returncode != 0 for p in procs].index(True)][-300:].replace("\n", " "))
        else:
            tgt = {"layer.%d" % i: torch.zeros(n, dtype=torch.bfloat16 if i % 2 else torch.float32,
                                               device=dev) for i in range(a.reshard_layers)}
            rb = _nbytes(tgt)
            _warm(rdir)
            res_f = _resident(rdir)
            frw = timed(lambda: dcp.load(tgt, storage_reader=reader(rdir)))
            phases("dcp.load warm 4->1", frw, readers[-1].trace)
            if any(not torch.equal(tgt["layer.%d" % i], torch.full_like(tgt["layer.%d" % i], float(i)))
                   for i in range(a.reshard_layers)):
                raise SystemExit("resharded dcp.load ferry: values differ")
            _warm(rdir)
            res_s = _resident(rdir)
            srw = timed(lambda: dcp.load(tgt, storage_reader=dcp.FileSystemReader(rdir)))
            table("dcp.load warm resharded 4->1 %s%s" % (a.size, warm_note(res_f, res_s)), rb, frw,
                  "FileSystemReader", srw, *(("pinned copy", h2d * rb / nbytes) if cuda else
                                             ("ferry read into host memory", host_read(rdir, rb))),
                  0.85)
            _evict(rdir)
            frc = timed(lambda: dcp.load(tgt, storage_reader=ferry.dcp.Reader(rdir)))
            _evict(rdir)
            src_ = timed(lambda: dcp.load(tgt, storage_reader=dcp.FileSystemReader(rdir)))
            table("dcp.load cold resharded 4->1 %s" % a.size, rb, frc, "FileSystemReader", src_,
                  "disk read", rd * rb / nbytes, 0.95)
            del tgt
            load2(rdir, n, rb)
        shutil.rmtree(rdir, ignore_errors=True)
    del st, zeros

    # torch.save / torch.load of a --pt-size pytorch_model.bin (bf16, GPU tensors)
    pt = {"layer.%d.weight" % i: torch.full((pt_size // 2 // 64,), float(i), dtype=torch.bfloat16,
                                            device=dev) for i in range(64)}
    pb = _nbytes(pt)
    mp = os.path.join(d, "pytorch_model.bin")
    fsv = timed(lambda: ferry.torch.save(pt, mp))
    os.unlink(mp)

    def stock_save():
        torch.save(pt, mp)
        fd = os.open(mp, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    ssv = timed(stock_save)
    table("ferry.torch.save %s (torch.save + fsync)" % a.pt_size, pb, fsv, "torch.save", ssv,
          "disk write+fsync", wr * pb / nbytes, 0.95)
    del pt
    _warm(mp)
    res_f = _resident(mp)
    fl = timed(lambda: ferry.torch.load(mp, map_location=dev))
    phases("ferry.torch.load warm", fl, ferry.torch.last_trace())
    _warm(mp)
    res_s = _resident(mp)
    sl = timed(lambda: torch.load(mp, map_location=dev, weights_only=True))
    table("ferry.torch.load warm %s%s" % (a.pt_size, warm_note(res_f, res_s)), pb, fl, "torch.load", sl,
          *(("pinned copy", h2d * pb / nbytes) if cuda else
            ("ferry read into host memory", host_read(mp, pb))), 0.85)
    _evict(mp)
    flc = timed(lambda: ferry.torch.load(mp, map_location=dev))
    _evict(mp)
    slc = timed(lambda: torch.load(mp, map_location=dev, weights_only=True))
    table("ferry.torch.load cold %s" % a.pt_size, pb, flc, "torch.load", slc, "disk read",
          rd * pb / nbytes, 0.95)
    shutil.rmtree(d, ignore_errors=True)
    dist.destroy_process_group()
    print("DONE in %.1f s (torch %s, device %s)" % (time.perf_counter() - t_start, torch.__version__,
                                                    torch.cuda.get_device_name() if cuda else "cpu"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1g")
    ap.add_argument("--dir", default="/tmp/ferry-dcp-bench")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--targets", action="store_true",
                    help="issue 24's targets in one process, with the ceilings (bench/gpu-dcp-torch.sh)")
    ap.add_argument("--pt-size", default="4g", help="--targets: the pytorch_model.bin's size")
    ap.add_argument("--step-dim", type=int, default=8192, help="--targets: the training step's matmul size")
    ap.add_argument("--no-reshard", dest="reshard", action="store_false",
                    help="--targets: skip the load of a checkpoint saved by 4 ranks")
    ap.add_argument("--reshard-layers", type=int, default=16)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a)
    if a.targets:
        return targets(a)
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
