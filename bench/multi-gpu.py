#!/usr/bin/env python3
"""Issue 28's per-rank measurements, one process per GPU (bench/multi-gpu.sh launches them with
torch.distributed.run, so each is a fresh process with RANK, WORLD_SIZE and LOCAL_RANK set).

  prep-weights DIR GB      a two-shard safetensors set (DIR/m.safetensors.index.json) of GB, 256
                           tensors of mixed sizes
  prep-tokens DIR GB       a ferry token dataset (DIR/tokens) of uint16 samples of 2048 tokens
  weights INDEX MODE       loads the set into cuda:LOCAL_RANK: MODE plain (the whole set, no
                           exchange), ferry (load_file(distributed=True)), instanttensor
                           (safe_open(process_group=WORLD)); prints the rank's load seconds
  loader DIR SECONDS       ferry.Loader over DIR/tokens on this rank's GPU: samples/s and the
                           process's CPU cores (its 1-core budget: threads=1)
  ckpt DIR GB              ferry.checkpoint.save of GB / WORLD_SIZE per rank from its GPU, then
                           load back to it: seconds of each, the slowest rank's

Each rank prints one line `RESULT {json}`; bench/multi-gpu.sh gathers them into TABLE rows.
--device cpu (gloo) runs every mode without a GPU, as a dry run of the script.
"""
import json
import os
import resource
import sys
import time

T_START = time.perf_counter()


def env_rank():
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def result(**kw):
    line = "RESULT " + json.dumps(kw) + "\n"
    d = os.environ.get("MULTI_GPU_RESULTS")
    if d:  # one file per rank: ranks sharing torchrun's stdout interleaved their lines
        with open(os.path.join(d, "rank-%d.json" % env_rank()[0]), "a") as f:
            f.write(line)
    sys.stdout.write(line)
    sys.stdout.flush()


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def init(device):
    import torch
    import torch.distributed as dist
    rank, world, local = env_rank()
    if device == "cuda":
        torch.cuda.set_device(local)
    if world > 1:  # one rank needs no group (nor pays for NCCL's start)
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return torch, dist, rank, world, local


def dev_of(device, local):
    return "cuda:%d" % local if device == "cuda" else "cpu"


def sync(torch, dist, device):
    if device == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def prep_weights(d, gb):
    import torch
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    total = int(gb * (1 << 30))
    # 256 tensors: a few large (embedding-like), most mid-sized, some small norms
    sizes = [total // 8] * 2 + [total * 3 // 4 // 200] * 200 + [4096] * 54
    g = torch.Generator().manual_seed(1)
    shards, cur, n = [], {}, 0
    for i, nb in enumerate(sizes):
        cur["t%03d" % i] = torch.randint(0, 255, (nb // 2,), dtype=torch.int16, generator=g).view(torch.bfloat16)
        n += nb
        if n >= total // 2 and len(shards) == 0:
            shards.append(cur)
            cur, n = {}, 0
    shards.append(cur)
    wm = {}
    for k, s in enumerate(shards):
        name = "m-%d.safetensors" % (k + 1)
        save_file(s, os.path.join(d, name))
        wm.update({t: name for t in s})
    with open(os.path.join(d, "m.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    print("prepared %s: %d tensors, %.2f GB" % (d, len(wm), sum(sizes) / 1e9))


def prep_tokens(d, gb):
    import numpy as np
    import ferry
    os.makedirs(d, exist_ok=True)
    n = int(gb * (1 << 30)) // (2048 * 2)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 50000, size=2048 * 64, dtype=np.uint16)
    ferry.write_dataset(os.path.join(d, "tokens"), (np.roll(base, i)[:2048] for i in range(n)),
                        dtype=np.uint16, shard_size=1 << 30)
    print("prepared %s/tokens: %d samples" % (d, n))


def weights(index, mode, device):
    torch, dist, rank, world, local = init(device)
    dev = dev_of(device, local)
    sync(torch, dist, device)
    t0 = time.perf_counter()
    if mode == "instanttensor":
        import instanttensor
        d = os.path.dirname(index)
        files = sorted(os.path.join(d, f) for f in set(json.load(open(index))["weight_map"].values()))
        pg = dist.GroupMember.WORLD if dist.is_initialized() else None
        with instanttensor.safe_open(files, framework="pt", device=local, process_group=pg) as f:
            sd = {k: t for k, t in f.tensors()}
    else:
        import ferry
        import ferry.safetensors as fst
        ctx = ferry.Context()
        sd = fst.load_file(index, dev, distributed=(mode == "ferry" and world > 1), context=ctx)
        read = ctx.stats().get("bytes_read", 0)
    sync(torch, dist, device)
    t = time.perf_counter() - t0
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    result(mode="weights", loader=mode, rank=rank, world=world, load_s=t, process_s=time.perf_counter() - T_START,
           bytes=nbytes, tensors=len(sd), read=read if mode != "instanttensor" else None)
    if dist.is_initialized():
        dist.destroy_process_group()


def loader(d, seconds, device):
    torch, dist, rank, world, local = init(device)
    import ferry
    if os.environ.get("MULTI_GPU_LOADER_BIND", "1") != "0":
        # issue 28: each rank "within its 1-core budget": every thread of the rank's process (the
        # CUDA runtime's and NCCL's included) bound to one CPU of its own before the loader starts
        # its threads, which inherit it; the ranks' CPUs spread over the machine
        cpus = sorted(os.sched_getaffinity(0))
        one = {cpus[(2 * rank + 1) * len(cpus) // (2 * world)]}
        for t in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(t), one)
            except OSError:
                pass
    ld = ferry.Loader(os.path.join(d, "tokens"), batch_size=32, seq_len=2048, device=dev_of(device, local), threads=1,
                      prefetch=8, rank=rank, world_size=world, seed=1)
    it = iter(ld)
    next(it)  # the first batch starts the pipeline: not timed
    sync(torch, dist, device)
    c0, t0, n = cpu_s(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        try:
            b = next(it)
        except StopIteration:
            it = iter(ld)
            continue
        n += b.shape[0]
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter() - t0
    result(mode="loader", rank=rank, world=world, samples_per_s=n / t, cores=(cpu_s() - c0) / t)
    if dist.is_initialized():
        dist.destroy_process_group()


def drop_cache(d):
    for root, _dirs, files in os.walk(d):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def ckpt(d, gb, device):
    torch, dist, rank, world, local = init(device)
    import ferry.checkpoint as ck
    dev = dev_of(device, local)
    per = int(gb * (1 << 30)) // world
    n = 16
    state = {"model": {"w%02d" % i: torch.empty(per // n // 2, dtype=torch.bfloat16, device=dev).normal_()
                       for i in range(n)}}
    nbytes = sum(v.numel() * v.element_size() for v in state["model"].values())
    sync(torch, dist, device)
    t0 = time.perf_counter()
    ck.save(state, d, 1, keep=0, replicated=False)
    sync(torch, dist, device)
    t_save = time.perf_counter() - t0
    if rank == 0:
        drop_cache(d)  # the load reads from storage, not from the pages the save left cached
    sync(torch, dist, device)
    t0 = time.perf_counter()
    s = ck.load(d, 1, device=dev)
    sync(torch, dist, device)
    t_load = time.perf_counter() - t0
    assert torch.equal(s["model"]["w00"], state["model"]["w00"])
    result(mode="ckpt", rank=rank, world=world, bytes=nbytes, save_s=t_save, load_s=t_load)
    if dist.is_initialized():
        dist.destroy_process_group()


def main():
    a = sys.argv[1:]
    device = "cuda"
    if "--device" in a:
        i = a.index("--device")
        device = a[i + 1]
        del a[i:i + 2]
    if not a:
        sys.exit(__doc__)
    cmd = a[0]
    if cmd == "prep-weights":
        prep_weights(a[1], float(a[2]))
    elif cmd == "prep-tokens":
        prep_tokens(a[1], float(a[2]))
    elif cmd == "weights":
        weights(a[1], a[2], device)
    elif cmd == "loader":
        loader(a[1], float(a[2]), device)
    elif cmd == "ckpt":
        ckpt(a[1], float(a[2]), device)
    else:
        sys.exit("unknown mode %r\n%s" % (cmd, __doc__))


if __name__ == "__main__":
    main()
