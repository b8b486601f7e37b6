#!/usr/bin/env python3
"""Issue 23's loader rows: ferry.Loader over an s3:// dataset with a local cache, per epoch, against
the same loader over the local directory, in one run. nginx (tests/python/_nginx.py) serves the
dataset's directory on 127.0.0.1 (path-style s3://bucket/ds); the cache's budget is the whole
dataset (epoch 2 on reads only the cache) or a fraction of it (the cache is full and evicting from
the first epoch on: every epoch fetches again what it evicted). Prints samples/s per epoch, the
cache's counters after each epoch, and TABLE rows: each cached epoch after the first against the
first cached epoch and against the local directory (the issue: the same samples/s once the cache is
full and evicting).

  python3 bench/remote-loader.py --gb 0.5 --epochs 4 [--fractions 1,0.5,0.25]
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import _nginx  # noqa: E402


def row(name, figure, note=""):
    print("TABLE remote-loader %s | %s | %s" % (name, figure, note), flush=True)


def epochs(path, a, ctx, cached=False):
    import ferry
    loader = ferry.Loader(path, batch_size=a.batch, seq_len=a.seq_len, shuffle=True, seed=1, context=ctx,
                          prefetch=4, threads=a.threads)
    ds = loader.dataset if cached else None
    out = []
    for e in range(a.epochs):
        loader.set_epoch(e)
        n, t0 = 0, time.perf_counter()
        for batch in loader:
            n += batch.shape[0]
        dt = time.perf_counter() - t0
        st = ds.cache_stats() if ds is not None else {}
        out.append({"epoch": e, "samples": n, "seconds": dt, "samples_per_s": n / dt,
                    **{k: st[k] for k in ("budget", "fetched", "fetched_bytes", "evicted", "remote_reads", "reused") if k in st}})
        print(json.dumps({"path": path, **out[-1]}), flush=True)
    loader.close() if hasattr(loader, "close") else None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=0.5, help="dataset size")
    ap.add_argument("--shard", default="16m")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--fractions", default="1,0.5,0.25", help="cache budgets, fractions of the dataset")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2049)
    ap.add_argument("--threads", type=int, default=1, help="the loader's threads")
    ap.add_argument("--dir", default=os.path.join(os.environ.get("SHM_DIR", "/dev/shm"), "ferry-remote-loader"))
    a = ap.parse_args()
    import ferry
    shard = int(a.shard[:-1]) << 20 if a.shard.endswith("m") else int(a.shard)
    www = os.path.join(a.dir, "www")
    ds_dir = os.path.join(www, "bucket", "ds")
    if not os.path.isdir(ds_dir):
        rng = np.random.default_rng(0)
        n = int(a.gb * 1e9) // (1024 * 2)
        samples = (rng.integers(0, 50000, size=int(rng.integers(256, 1792)), dtype=np.uint16) for _ in range(n))
        os.makedirs(os.path.dirname(ds_dir), exist_ok=True)
        ferry.write_dataset(ds_dir, samples, shard_size=shard)
    size = sum(os.path.getsize(os.path.join(ds_dir, f)) for f in os.listdir(ds_dir))
    srv = _nginx.Nginx(www, os.path.join(a.dir, "nginx"), workers=2)
    os.environ.update(AWS_ENDPOINT_URL=srv.url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1")
    try:
        row("setup", "%.2f GB in %d shards" % (size / 1e9, len(os.listdir(ds_dir)) - 1),
            "nginx %s; batch %d x %d tokens, shuffled, %d epochs" % (srv.url, a.batch, a.seq_len, a.epochs))
        local = epochs(ds_dir, a, ferry.Context())
        loc = max(e["samples_per_s"] for e in local[1:]) if len(local) > 1 else local[0]["samples_per_s"]
        row("local files", ", ".join("%.0f" % e["samples_per_s"] for e in local) + " samples/s", "per epoch")
        for frac in [float(x) for x in a.fractions.split(",")]:
            cache = os.path.join(a.dir, "cache-%g" % frac)
            shutil.rmtree(cache, ignore_errors=True)
            os.makedirs(cache)
            budget = int(size * frac) if frac < 1 else 0
            ctx = ferry.Context(cache_dir=cache, cache_bytes=budget)
            got = epochs("s3://bucket/ds", a, ctx, cached=True)
            name = "s3:// cache %s" % ("unbounded" if not budget else "%.0f%% of the dataset" % (100 * frac))
            row(name, ", ".join("%.0f" % e["samples_per_s"] for e in got) + " samples/s",
                "per epoch; after each: fetched %s, evicted %s, remote reads %s" % (
                    [e.get("fetched") for e in got], [e.get("evicted") for e in got],
                    [e.get("remote_reads") for e in got]))
            first = got[0]["samples_per_s"]
            later = [e["samples_per_s"] for e in got[1:]]
            if later:
                worst = min(later)
                row(name + " worst later epoch", "%.2fx the first, %.2fx local" % (worst / first, worst / loc),
                    "target: the first cached epoch's rate kept (>= 0.9x) once full and evicting: %s"
                    % ("met" if worst >= 0.9 * first else "not met"))
    finally:
        srv.stop()
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
