#!/usr/bin/env python3
"""Issue 23's loader rows: ferry.Loader over an s3:// dataset with a local cache, per epoch, against
the same loader over the local directory, in one run. nginx (tests/python/_nginx.py) serves the
dataset's directory on 127.0.0.1 (path-style s3://bucket/ds); the cache's budget is the whole
dataset (epoch 2 on reads only the cache) or a fraction of it (the cache is full and evicting from
the first epoch on: the loader's shard-window order tells the cache what to stage and evict, and
each epoch fetches again about what does not fit). Prints samples/s per epoch, the
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


class Run:
    """One loader (local directory or s3:// through a cache), its epochs run one at a time so that
    every configuration's epoch e runs beside the others' (the VM's noise drifts over minutes)."""

    def __init__(self, name, path, a, ctx, cached=False, window=None, mapped=True):
        self.name, self.path, self.a, self.ctx, self.cached = name, path, a, ctx, cached
        self.window = a.shard_window if window is None else window
        self.mapped = mapped
        self.loader = None
        self.out = []
        self.prev = {}

    def epoch(self, e):
        # the loader's mapped knob is read from the environment when its pipeline is made
        if not self.mapped:
            os.environ["FERRY_LOADER_MAPPED"] = "0"
        try:
            self._epoch(e)
        finally:
            os.environ.pop("FERRY_LOADER_MAPPED", None)

    def _epoch(self, e):
        if self.loader is None:
            # opened just before its first epoch: a cache's stagers start with the dataset, and
            # would otherwise fetch while the runs before it read
            import ferry
            a = self.a
            self.loader = ferry.Loader(self.path, batch_size=a.batch, seq_len=a.seq_len, shuffle=True, seed=1,
                                       context=self.ctx, prefetch=4, threads=a.threads,
                                       **({} if self.window is None else {"shard_window": self.window}))
            self.ds = self.loader.dataset if self.cached else None
        self.loader.set_epoch(e)
        n, b, t0 = 0, 0, time.perf_counter()
        for batch in self.loader:
            n += batch.shape[0]
            b += 1
        dt = time.perf_counter() - t0
        st = self.ds.cache_stats() if self.ds is not None else {}
        ls = self.loader.stats()
        # the pipeline's counters (cumulative while it runs; a restarted pipeline starts from 0)
        d = {k: ls.get(k, 0) - (self.prev.get(k, 0) if ls.get(k, 0) >= self.prev.get(k, 0) else 0)
             for k in ("cpu_ns", "reads", "inline_reads", "mapped_reads", "lent_maps")}
        self.prev = ls
        self.out.append({"epoch": e, "samples": n, "seconds": dt, "samples_per_s": n / dt,
                         "pipeline_us_per_batch": d["cpu_ns"] / 1e3 / max(b, 1),
                         "reads": d["reads"], "inline_reads": d["inline_reads"], "mapped_reads": d["mapped_reads"],
                         "lent_maps": d["lent_maps"],
                         **{k: st[k] for k in ("budget", "fetched", "fetched_bytes", "evicted", "remote_reads", "reused",
                                                      "waits", "wait_s") if k in st}})
        print(json.dumps({"run": self.name, "path": self.path, **self.out[-1]}), flush=True)

    def close(self):
        if self.loader is not None and hasattr(self.loader, "close"):
            self.loader.close()


def shard_names(ds_dir):
    """The dataset's shard files (its objects under s3://bucket/ds/), without the index's JSON."""
    return sorted(f for f in os.listdir(ds_dir) if not f.endswith(".json") and not f.startswith("."))


def fetch_ceiling(ds_dir, jobs=4):
    """The rate at which jobs threads (a cache's cache_jobs) fetch the dataset's shards whole with
    ferry.read from the server, each thread one shard at a time: what the stagers could reach."""
    import threading
    import ferry
    shards = shard_names(ds_dir)
    nxt, lock, moved = [0], threading.Lock(), [0]
    ferry.read("s3://bucket/ds/" + shards[0])  # untimed: the first read's imports and connections

    def one():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(shards):
                return
            buf = ferry.read("s3://bucket/ds/" + shards[i])
            with lock:
                moved[0] += (buf.numpy() if hasattr(buf, "numpy") else buf).nbytes
    t0 = time.perf_counter()
    ts = [threading.Thread(target=one) for _ in range(jobs)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    rate = moved[0] / (time.perf_counter() - t0)
    row("fetch ceiling" + ("" if jobs == 4 else ", %d threads" % jobs), "%.2f GB/s" % (rate / 1e9),
        "%d threads each reading whole shards with ferry.read (%d shards, %.2f GB): the most the stagers can fetch"
        % (jobs, len(shards), moved[0] / 1e9))
    return rate


def contend(a, runs, ds_dir):
    """The local loader's epochs alone and beside a fetch at the rate the smallest cache's stagers
    fetched (its later epochs' mean), alternating: whether the fetch's work on the shared cores
    and caches is what slows the evicting cache's loader (its pipeline CPU per batch)."""
    import threading
    import ferry
    got = runs[-1].out
    fb = [g.get("fetched_bytes", 0) - p.get("fetched_bytes", 0) for p, g in zip(got, got[1:])]
    secs = [g["seconds"] for g in got[1:]]
    rate = sum(fb) / max(sum(secs), 1e-9)
    shards = shard_names(ds_dir)
    scratch = os.path.join(a.dir, "contend")
    os.makedirs(scratch, exist_ok=True)
    stop = threading.Event()
    moved = [0, 0.0]

    failed = []

    def fetch():
        fetch_paced()

    def fetch_paced():
        # 4 threads (one Python thread's read, allocation and write fall short of the stagers'
        # rate), paced together
        t0, nxt, lock = time.perf_counter(), [0], threading.Lock()

        def one():
            try:
                one_paced()
            except BaseException as e:  # the row would time the loader alone: stop the bench instead
                failed.append(e)
                stop.set()

        def one_paced():
            while not stop.is_set():
                with lock:
                    i = nxt[0] = nxt[0] + 1
                buf = ferry.read("s3://bucket/ds/" + shards[i % len(shards)])
                buf = buf.numpy() if hasattr(buf, "numpy") else buf  # a tensor where torch is installed
                path = os.path.join(scratch, "s%d" % i)
                with open(path, "wb") as f:
                    f.write(memoryview(buf).cast("B"))
                os.unlink(path)
                with lock:
                    moved[0] += buf.nbytes
                    ahead = moved[0] / rate - (time.perf_counter() - t0)  # paced to the stagers' mean rate
                if ahead > 0:
                    stop.wait(ahead)
        ts = [threading.Thread(target=one) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        moved[1] = time.perf_counter() - t0

    local = runs[0]
    base = len(local.out)
    alone, beside = [], []
    for k in range(a.contend):
        local.epoch(base + 2 * k)
        alone.append(local.out[-1])
        stop.clear()
        th = threading.Thread(target=fetch)
        th.start()
        local.epoch(base + 2 * k + 1)
        stop.set()
        th.join()
        if failed:
            raise failed[0]
        beside.append(dict(local.out[-1], fetch_gbps=moved[0] / 1e9 / max(moved[1], 1e-9)))
        moved[0] = 0
    # the same epochs from a new loader each time: its mappings of the (resident) shards are new,
    # as an evicting cache's are for the shards it stages again each epoch
    fresh = []
    for k in range(a.contend):
        r = Run("local files, a new loader each epoch", local.path, a, local.ctx)
        r.epoch(base + 2 * a.contend + k)
        fresh.append(r.out[-1])
        r.close()
    med = lambda xs: sorted(xs)[len(xs) // 2]
    cf = med([e["pipeline_us_per_batch"] for e in fresh])
    sf = med([e["samples_per_s"] for e in fresh])
    sa, sb = med([e["samples_per_s"] for e in alone]), med([e["samples_per_s"] for e in beside])
    ca, cb = med([e["pipeline_us_per_batch"] for e in alone]), med([e["pipeline_us_per_batch"] for e in beside])
    row("local files beside a fetch", "%.0f against %.0f samples/s alone: %.2fx; pipeline CPU %.0f against %.0f us/batch: %.2fx"
        % (sb, sa, sb / sa, cb, ca, cb / ca),
        "medians of %d epoch pairs; the fetch paced to %.2f GB/s (%s's later epochs' mean), ran %s GB/s"
        % (a.contend, rate / 1e9, runs[-1].name, ", ".join("%.2f" % e["fetch_gbps"] for e in beside)))
    row("local files, a new loader each epoch", "%.0f against %.0f samples/s: %.2fx; pipeline CPU %.0f against %.0f us/batch: %.2fx"
        % (sf, sa, sf / sa, cf, ca, cf / ca),
        "medians of %d epochs against the kept loader's alone: new mappings of resident shards each epoch"
        % a.contend)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=0.5, help="dataset size")
    ap.add_argument("--shard", default="16m")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--fractions", default="1,0.5,0.25", help="cache budgets, fractions of the dataset")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2049)
    ap.add_argument("--threads", type=int, default=1, help="the loader's threads")
    ap.add_argument("--shard-window", type=int, default=None,
                    help="the loader's shard_window (left out: its default, windows from the cache's budget)")
    ap.add_argument("--windows", default="",
                    help="shard_window values (comma-separated) each evicting cache (a fraction below 1) is also "
                         "run with, beside its default: a smaller window keeps more of the cache from one epoch to "
                         "the next (fewer fetches) and mixes fewer shards at once")
    ap.add_argument("--jobs", default="",
                    help="cache_jobs values (comma-separated) each evicting cache's runs (its default window and "
                         "--windows) are also made with, beside the default 4: more stagers fetch more shards at "
                         "once; the fetch ceiling is also measured with that many threads")
    ap.add_argument("--unmapped", action="store_true",
                    help="each evicting cache's runs (its default window and --windows) also with the loader's "
                         "mapped=0: its staged shards are new files each epoch, whose mapping faults every page in")
    ap.add_argument("--contend", type=int, default=0,
                    help="N: after the runs, N more epoch pairs of the local loader, each alone then beside a "
                         "fetch of the dataset's objects (ferry.read, then written to a file and removed, as a "
                         "stager does) at the smallest cache's mean fetch rate: does the fetch alone slow it? "
                         "Then N epochs of a new local loader each (new mappings each epoch)")
    ap.add_argument("--server-workers", type=int, default=int(os.environ.get("REMOTE_SERVER_PROCS", "8")),
                    help="nginx worker processes (bench/remote-read.py's default; this bench had 2 until the "
                         "fetch ceiling row showed them to be the evicting cache's bound)")
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
    srv = _nginx.Nginx(www, os.path.join(a.dir, "nginx"), workers=a.server_workers)
    os.environ.update(AWS_ENDPOINT_URL=srv.url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1")
    try:
        row("setup", "%.2f GB in %d shards" % (size / 1e9, len(os.listdir(ds_dir)) - 1),
            "nginx %s, %d workers; batch %d x %d tokens, shuffled, %d epochs" % (srv.url, a.server_workers, a.batch,
                                                                                a.seq_len, a.epochs))
        jobs = [int(x) for x in a.jobs.split(",") if x]
        ceiling = fetch_ceiling(ds_dir)
        for j in jobs:  # the bound for the runs with more stagers (the table's bound stays the default's)
            fetch_ceiling(ds_dir, j)
        runs = [Run("local files", ds_dir, a, ferry.Context())]
        for frac in [float(x) for x in a.fractions.split(",")]:
            cache = os.path.join(a.dir, "cache-%g" % frac)
            shutil.rmtree(cache, ignore_errors=True)
            os.makedirs(cache)
            budget = int(size * frac) if frac < 1 else 0
            name = "s3:// cache %s" % ("unbounded" if not budget else "%.0f%% of the dataset" % (100 * frac))
            runs.append(Run(name, "s3://bucket/ds", a, ferry.Context(cache_dir=cache, cache_bytes=budget), cached=True))
            windows = [None] + [int(x) for x in a.windows.split(",") if x]  # None: the loader's default
            variants = [(w, m, j) for j in [None] + jobs for m in ([True, False] if a.unmapped else [True])
                        for w in windows] if budget else []
            for w, m, j in variants:
                if w is None and m and j is None:
                    continue  # the run just made
                cw = cache + "-w%s-m%d-j%s" % (w, m, j)
                shutil.rmtree(cw, ignore_errors=True)
                os.makedirs(cw)
                runs.append(Run(name + (", shard_window %d" % w if w is not None else "") + ("" if m else ", mapped=0")
                                + ("" if j is None else ", cache_jobs %d" % j), "s3://bucket/ds", a,
                                ferry.Context(cache_dir=cw, cache_bytes=budget, **({} if j is None else {"cache_jobs": j})),
                                cached=True, window=w, mapped=m))
        for e in range(a.epochs):
            for r in runs:
                r.epoch(e)
        local = runs[0].out

        def cpu(out):
            return "pipeline CPU " + ", ".join("%.0f" % e["pipeline_us_per_batch"] for e in out) + \
                " us/batch, mapped reads " + ", ".join("%.0f%%" % (100.0 * e["mapped_reads"] / max(e["reads"], 1)) for e in out) + \
                ", shards read through the cache's mappings " + ", ".join("%d" % e["lent_maps"] for e in out)
        row("local files", ", ".join("%.0f" % e["samples_per_s"] for e in local) + " samples/s", "per epoch; " + cpu(local))
        for r in runs[1:]:
            got, name = r.out, r.name
            row(name, ", ".join("%.0f" % e["samples_per_s"] for e in got) + " samples/s",
                "per epoch; after each (cumulative): fetched %s, evicted %s, remote reads %s, reads that waited for "
                "a staging %s (%s s); %s" % (
                    [e.get("fetched") for e in got], [e.get("evicted") for e in got],
                    [e.get("remote_reads") for e in got], [e.get("waits") for e in got],
                    ", ".join("%.2f" % e.get("wait_s", 0) for e in got), cpu(got)))
            # what the stagers fetched per second of each epoch: with a cache smaller than the
            # dataset an epoch cannot take less than what it must fetch at the server's rate
            fb = [got[0].get("fetched_bytes", 0)] + [g.get("fetched_bytes", 0) - p.get("fetched_bytes", 0)
                                                      for p, g in zip(got, got[1:])]
            row(name + " fetched", ", ".join("%.0f MB (%.2f GB/s)" % (b / 1e6, b / 1e9 / e["seconds"])
                                             for b, e in zip(fb, got)),
                "per epoch: bytes fetched from the object and their rate over the epoch")
            if len(got) > 1 and ceiling:
                # an epoch that fetches B bytes takes at least B / ceiling: the most it can be
                # against local files' same epoch, whatever the loader does
                bound = [min(1.0, (l["samples"] / l["samples_per_s"]) / (b / ceiling)) if b else 1.0
                         for b, l in zip(fb[1:], local[1:])]
                row(name + " fetch bound", "later epochs at most %s local" % ", ".join("%.2fx" % x for x in bound),
                    "each epoch's fetched bytes at the fetch ceiling (%.2f GB/s) against local files' epoch time"
                    % (ceiling / 1e9))
            first = got[0]["samples_per_s"]
            if len(got) > 1:
                # each later epoch against local files' same epoch (run beside it), and the
                # pipeline's CPU per batch against local files' (steadier on a loaded machine)
                ratios = [g["samples_per_s"] / l["samples_per_s"] for g, l in zip(got[1:], local[1:])]
                cpu_r = max(g["pipeline_us_per_batch"] / max(l["pipeline_us_per_batch"], 1e-9)
                            for g, l in zip(got[1:], local[1:]))
                worst = min(ratios)
                row(name + " later epochs vs local", "%.2fx local (worst epoch), %.2fx the first cached epoch; "
                    "pipeline CPU per batch up to %.2fx local's" % (worst, min(g["samples_per_s"] for g in got[1:]) / first, cpu_r),
                    "target: >= 0.9x local files after the first epoch, also when full and evicting: %s"
                    % ("met" if worst >= 0.9 else "not met"))
        if a.contend and len(runs) > 1:
            contend(a, runs, ds_dir)
        for r in runs:
            r.close()
    finally:
        srv.stop()
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
