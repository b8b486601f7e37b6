#!/usr/bin/env python3
"""Pre-shuffled copies (issue 27): cold samples/s of one epoch read by ferry.Loader from a disk, in
four ways over the same dataset: the shuffle (random reads over the shards), the block order
(shuffled blocks of neighbours, reads merged), sequential (the shards front to back: the ceiling)
and the shuffle read from a pre-shuffled copy (copies=True: sequential reads of copy e mod N).
The page cache is dropped before each run (echo 3 > /proc/sys/vm/drop_caches: needs root; without
it the runs are reported as warm and the target as not measured).

    .venv/bin/python bench/shuffled-copies.py --dir /path/on/the/disk [--size 1g] [--sample 4k]
        [--copies 2] [--batch 256] [--threads 2] [--seconds 30] [--rounds 1] [--json out.json]

--dir must be on the disk being measured (not tmpfs); the dataset (shards + N copies, (N + 1) times
--size) is written there once and reused when it is already there with the same shape. Each run
reads for at most --seconds (a slow shuffle is measured on its first part). Prints one TABLE row per
order (samples/s, MB/s, ratio to sequential), then the target (copies >= 0.9x sequential) and JSON."""
import argparse
import json
import os
import sys
import time

import numpy as np

import ferry

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size_arg(text):
    t = text.strip().lower()
    return int(t[:-1]) * UNITS[t[-1]] if t[-1] in UNITS else int(t)


def make(path, n, sample, copies, seed):
    stamp = os.path.join(path, "bench-shape")
    shape = f"{n} {sample} {copies} {seed}\n"
    if os.path.exists(stamp) and open(stamp).read() == shape:
        return 0.0
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, size=n * sample, dtype=np.uint8)
    t0 = time.perf_counter()
    ferry.write_dataset(path, [buf[i * sample:(i + 1) * sample] for i in range(n)], dtype="uint8",
                        shard_size=256 << 20, shuffled_copies=copies, seed=seed)
    el = time.perf_counter() - t0
    with open(stamp, "w") as f:
        f.write(shape)
    return el


def space_cost(path):
    """Bytes on disk (allocated blocks) of the data shards, the copy shards and ferry.copies."""
    out = {"data_bytes": 0, "copy_shards_bytes": 0, "sidecar_bytes": 0}
    for name in os.listdir(path):
        b = os.stat(os.path.join(path, name)).st_blocks * 512
        if name.startswith("copy-"):
            out["copy_shards_bytes"] += b
        elif name == "ferry.copies":
            out["sidecar_bytes"] += b
        elif name.endswith(".fsh"):
            out["data_bytes"] += b
    out["copies_bytes"] = out["copy_shards_bytes"] + out["sidecar_bytes"]
    return out


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        print(f"# page cache not dropped ({e}): these runs are warm", file=sys.stderr)
        return False


def run(path, how, args):
    kw = dict(batch_size=args.batch, seed=args.seed, device="cpu", threads=args.threads,
              prefetch=8)
    if how == "copies":
        kw.update(order="shuffle", copies=True)
    else:
        kw.update(order=how)
    cold = drop_caches() if not args.no_drop else False
    ld = ferry.Loader(path, **kw)
    n = b = 0
    t0 = time.perf_counter()
    for data, offsets in ld:
        n += len(offsets) - 1
        b += data.numel()
        if time.perf_counter() - t0 > args.seconds:
            break
    el = time.perf_counter() - t0
    ld.close()
    return {"order": how, "samples": n, "bytes": b, "seconds": el, "samples_per_s": n / el,
            "mb_per_s": b / el / 1e6, "cold": cold}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory on the disk to measure")
    ap.add_argument("--size", type=size_arg, default=size_arg("1g"))
    ap.add_argument("--sample", type=size_arg, default=size_arg("4k"))
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--orders", default="sequential,copies,block,shuffle")
    ap.add_argument("--no-drop", action="store_true", help="leave the page cache (tests): rows say WARM")
    ap.add_argument("--json")
    args = ap.parse_args()
    path = os.path.join(args.dir, "ferry-shuffled-copies")
    n = args.size // args.sample
    wrote = make(path, n, args.sample, args.copies, args.seed)
    if wrote:
        print(f"# wrote {n} samples of {args.sample} B with {args.copies} copies in {wrote:.1f} s")
    rows = []
    for how in args.orders.split(","):
        rs = [run(path, how, args) for _ in range(args.rounds)]
        rows.append(max(rs, key=lambda r: r["samples_per_s"]))
    seq = next((r["samples_per_s"] for r in rows if r["order"] == "sequential"), None)
    print(f"TABLE order | samples/s | MB/s | x sequential | cold  ({n} samples of {args.sample} B, "
          f"batch {args.batch}, threads {args.threads}, {path})")
    for r in rows:
        ratio = r["samples_per_s"] / seq if seq else float("nan")
        r["x_sequential"] = ratio
        print(f"TABLE {r['order']} | {r['samples_per_s']:.0f} | {r['mb_per_s']:.1f} | {ratio:.2f} | "
              f"{'cold' if r['cold'] else 'WARM'}")
    cp = next((r for r in rows if r["order"] == "copies"), None)
    if cp and seq:
        met = cp["x_sequential"] >= 0.9 and cp["cold"]
        verdict = 'met' if met else 'NOT met' if cp['cold'] else 'not measured (warm)'
        print(f"TARGET copies >= 0.9x sequential (cold): {cp['x_sequential']:.2f}x, {verdict}")
        print(f"TABLE target copy >= 0.9x sequential | {verdict} | {cp['x_sequential']:.2f}x")
    space = space_cost(path)
    print(f"TABLE space | {space['copies_bytes'] / space['data_bytes']:.2f}x the data more | "
          f"data shards {space['data_bytes'] / 2**30:.2f} GiB, copy shards {space['copy_shards_bytes'] / 2**30:.2f} GiB, "
          f"ferry.copies {space['sidecar_bytes'] / 2**20:.1f} MiB")
    out = {"samples": n, "sample_bytes": args.sample, "copies": args.copies, "rows": rows, "space": space}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
