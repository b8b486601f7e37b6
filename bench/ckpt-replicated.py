#!/usr/bin/env python3
"""Issue 21, item 6: a DDP state (the same on every rank) saved by --world ranks with
ferry.checkpoint.save, every rank writing all of it (replicated=False, the peer: what saves did
before) against the replicated layout (each rank writes 1/world: replicated=True, and "auto",
which hashes the state first to find what is alike). Each mode runs in fresh processes (gloo over
a file:// store), --saves durable saves into a checkpoint directory with keep=1 after one untimed
warm-up save; the figure is the median save time (the slowest rank's, since save returns on every
rank once step is committed). Then load_latest on every rank (replicated: every rank reads every
piece from storage) and, beside it, the alternative a load could take: every rank reads 1/world and
the ranks all_gather the rest (only the all_gather is timed, over the same process group, on
--gather-mib per rank, scaled to the state).

    python3 bench/ckpt-replicated.py --size 2g --world 2 --dir /tmp/x [--device cpu|cuda] [--saves 3]

--device cuda puts every rank's state on the current GPU (all ranks on one GPU is fine: gloo
pickles through host memory). Prints one JSON line per mode and a TABLE line comparing them.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def parse_size(s):
    s = s.lower()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1], 1)
    return int(float(s.rstrip("kmg")) * mult)


def worker(args):
    import torch
    import torch.distributed as dist
    import ferry.checkpoint as ck
    rank, world = args.rank, args.world
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank, world_size=world)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev.index or 0)
    # A DDP-like state: 64 MiB fp32 tensors (the same on every rank), an optimizer state beside each.
    per = 16 << 20
    n = max(1, args.size // (per * 4) // 2)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(per, generator=g).to(dev)
    model = {"layer%d.weight" % i: base + i for i in range(n)}
    optim = {"state": {i: {"exp_avg": base - i} for i in range(n)}}
    state = {"model": model, "optim": optim}
    nbytes = 2 * n * per * 4
    mode = {"false": False, "true": True, "auto": "auto"}[args.mode]
    d = args.dir
    times = []
    for step in range(args.saves + 1):
        dist.barrier()
        t = time.perf_counter()
        ck.save(state, d, step, keep=1, replicated=mode)
        dt = time.perf_counter() - t
        if step:
            times.append(dt)
    all_t = [None] * world
    dist.all_gather_object(all_t, times)
    step_dir = os.path.join(d, "step-%012d" % args.saves)
    disk = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir)
               if f.endswith(".safetensors"))
    dist.barrier()
    t = time.perf_counter()
    _, s = ck.load_latest(d, device=args.device)
    load = time.perf_counter() - t
    assert torch.equal(s["model"]["layer0.weight"], model["layer0.weight"])
    del s
    loads = [None] * world
    dist.all_gather_object(loads, load)
    # The alternative load: 1/world read here, the rest from the other ranks (only the exchange timed).
    part = torch.empty(min(nbytes // world, args.gather_mib << 20), dtype=torch.uint8)
    outs = [torch.empty_like(part) for _ in range(world)]
    dist.barrier()
    t = time.perf_counter()
    dist.all_gather(outs, part)
    gather = time.perf_counter() - t
    gathers = [None] * world
    dist.all_gather_object(gathers, gather)
    if rank == 0:
        per_save = [max(x) for x in zip(*all_t)]
        print(json.dumps({"mode": args.mode, "world": world, "state_bytes": nbytes, "device": args.device,
                          "save_s": per_save, "save_median_s": statistics.median(per_save),
                          "disk_bytes": disk, "load_s": max(loads),
                          "all_gather_s": max(gathers) * (nbytes // world) / part.numel()}),
              flush=True)
    dist.destroy_process_group()


def run_mode(args, mode, root):
    store = os.path.join(root, "store-" + mode)
    d = os.path.join(root, "ck-" + mode)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                               "--world", str(args.world), "--store", store, "--dir", d, "--mode", mode,
                               "--size", str(args.size), "--saves", str(args.saves), "--device", args.device,
                               "--gather-mib", str(args.gather_mib)],
                              stdout=subprocess.PIPE, text=True, env=env)
             for r in range(args.world)]
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("mode %s: a rank failed (exit %s)" % (mode, [p.returncode for p in procs]))
    shutil.rmtree(d, ignore_errors=True)
    line = [x for x in out[0].splitlines() if x.startswith("{")][-1]
    print(line, flush=True)
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2g", help="the state's bytes per rank (2g)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where the checkpoint directories go (a temporary directory)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--saves", type=int, default=3, help="timed saves per mode, after one warm-up")
    ap.add_argument("--modes", default="false,true,auto")
    ap.add_argument("--gather-mib", type=int, default=256,
                    help="MiB per rank the all_gather alternative moves (its time is scaled to the state)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.size = parse_size(str(args.size))
    if args.worker:
        return worker(args)
    root = tempfile.mkdtemp(prefix="ferry-ckpt-rep-", dir=args.dir)
    try:
        res = {m: run_mode(args, m, root) for m in args.modes.split(",")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    peer = res.get("false")
    for m, r in res.items():
        if m == "false" or peer is None:
            continue
        print("TABLE replicated=%s world=%d state=%.2f GB device=%s | save %.2f s vs every-rank %.2f s "
              "(ratio %.2f, target <= 0.60: %s) | disk %.2f GB vs %.2f GB (%.2f) | load %.2f s vs %.2f s "
              "| all_gather alternative %.2f s" % (
                  m, r["world"], r["state_bytes"] / 1e9, r["device"], r["save_median_s"],
                  peer["save_median_s"], r["save_median_s"] / peer["save_median_s"],
                  "met" if r["save_median_s"] <= 0.6 * peer["save_median_s"] else "NOT met",
                  r["disk_bytes"] / 1e9, peer["disk_bytes"] / 1e9, r["disk_bytes"] / peer["disk_bytes"],
                  r["load_s"], peer["load_s"], r["all_gather_s"]), flush=True)


if __name__ == "__main__":
    main()
