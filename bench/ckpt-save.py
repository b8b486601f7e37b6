#!/usr/bin/env python3
"""Issue 5's save target alone: durable saves against the disk's raw write ceiling, measured in
turns in the same run (a shorter call than bench/ckpt-gpu.py, which also runs the peers and loads).

    python3 bench/ckpt-save.py --ferry build/ferry --disk /path/on/disk [--size 8g] [--rounds 2]

Each round, in this order, each step untimed `sync` first (so that no earlier deletion's discards
or writeback land inside it):
  1. the raw write ceiling: `ferry bench --rw write --direct 1 --bs 4m --iodepth 16 --numjobs 4
     --offset_increment S/4 --size S/4 --end_fsync 1`: each job overwrites its quarter of a file laid
     out once before the first round, once, then fsyncs (as bench/ckpt-gpu.py defines it); the
     former definition beside it (every job over the whole file for --ceiling-runtime, no fsync);
     with fio (--fio, .deb/fio), fio writing a new file of the same size + fsync (fallocate native
     and none): the same work a save does, which no writer of a new file avoids;
  2. `ferry ckpt bench --save-only --saves 3 --phases` (the C save, xxh3, durable, bf16 tensors
     shaped like a 4B transformer on the GPU) per --variants: auto (the defaults: the temporary
     file fallocated first), off (save_prealloc=off: sized by ftruncate, each write allocating its
     blocks), deep (16 writes of 16 MiB in flight in 4 MiB pieces, as deep as the raw ceiling's
     256 MiB), each printing a PHASES row per save: where its time went (writer.write_wait,
     writer.hash, writer.fsync, writer.dirsync, ...);
  3. ferry.safetensors.save_file from CUDA tensors, three times, each into a new file (the one
     before deleted and synced first), reported as the C save is: the first, and the best of the
     later ones;
  4. ferry.checkpoint.save, --ckpt-steps steps (default 4) into a checkpoint directory with keep=1:
     steps 1-2 write new files, the later ones write over the shard of the step pruned before
     (recycled shards, docs/CHECKPOINTS.md), which is the steady state of a training job.
Then `TABLE target save (durable) vs disk raw write` per round, each save against the ceiling of
its own round, for save_file and for the checkpoint steady state. --device cpu runs it without a GPU (the saves from host memory).

Run time at 8g on the GPU machine (~3 GB/s write): laying out the ceiling file ~3 s, per round
the ceilings ~4 s + 8 s, fio's two new files ~10 s, 2 x `ferry ckpt bench` (GPU allocation, 3 saves
of ~3 s, syncs) ~30 s, 3 Python saves ~12 s, the state ~5 s: about 70 s a round (measured: one
round with variants auto,off in 2.5 minutes of gpu-check's call, the build included). Space: ~26
GB on --disk at most (the ceiling file and the C bench's two files).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def table(name, fig, note=""):
    print(f"TABLE {name} | {fig} | {note}", flush=True)


def fio_new_file(fio, path, size_bytes, falloc):
    """A raw writer's ceiling for what a durable save must do: write a new file of the save's size
    once, O_DIRECT, 4 jobs x QD16 x 4 MiB (each job its quarter), fsync at the end; fallocate
    native (unwritten extents, as ferry's save) or none (blocks allocated by the writes). GB/s over
    the process's wall time, the file's creation and the fsync included (as in a save)."""
    q = size_bytes // 4 // (4 << 20) * (4 << 20)
    cmd = [fio, "--name=newfile", f"--filename={path}", "--rw=write", "--bs=4m", "--iodepth=16", "--numjobs=4",
           "--direct=1", "--ioengine=io_uring", f"--size={q}", f"--offset_increment={q}", f"--fallocate={falloc}",
           "--end_fsync=1", "--group_reporting", "--output-format=json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    el = time.perf_counter() - t0
    try:
        os.unlink(path)
    except OSError:
        pass
    os.sync()
    if out.returncode:
        print(out.stderr[-500:], file=sys.stderr)
        return None
    return 4 * q / el / 1e9


# The C save's variants: name -> environment (ferry's knobs and the save pipeline's shape).
VARIANTS = {
    "auto": {"FERRY_SAVE_PREALLOC": "auto"},  # the default: fallocate (not on tmpfs)
    "off": {"FERRY_SAVE_PREALLOC": "off"},    # ftruncate: each write allocates its blocks
    # as deep as the raw ceiling: 16 x 16 MiB in flight (256 MiB) in 4 MiB pieces
    "deep": {"FERRY_SAVE_PREALLOC": "auto", "FERRY_SAVE_INFLIGHT": "16", "FERRY_CHUNK_SIZE": "4m"},
}


def c_save(ferry, d, size, dev, variant):
    cmd = [ferry, "ckpt", "bench", "--dir", d, "--size", size, "--save-only", "--saves", "3", "--phases"]
    cmd += ["--host"] if dev == "cpu" else ["--device", "0"]
    prealloc = variant
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **VARIANTS[variant]))
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return None
    saves = []
    for line in out.stdout.splitlines():
        if line.startswith("PHASES save"):
            head, js = line.split(" {", 1)
            p = json.loads("{" + js)
            saves.append(p)
            w = " ".join(f"{k[7:]}={v:.3f}" for k, v in p.items() if k.startswith("writer.") and v >= 0.001)
            c = " ".join(f"{k[5:]}={v:.3f}" for k, v in p.items() if k.startswith("call.") and v >= 0.001)
            print(f"PHASES C {prealloc} {head[7:]}: caller {c}; writer {w}", flush=True)
    return saves


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default="build/ferry")
    ap.add_argument("--disk", required=True, help="a directory on the disk under test")
    ap.add_argument("--size", default="8g")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ceiling-runtime", default="8")
    ap.add_argument("--device", default="cuda", help="cpu: without a GPU")
    ap.add_argument("--fio", default=os.environ.get("FIO") or (".deb/fio" if os.access(".deb/fio", os.X_OK) else ""),
                    help="fio for the new-file ceilings (default $FIO or .deb/fio; none: skipped)")
    ap.add_argument("--ckpt-steps", type=int, default=4,
                    help="ferry.checkpoint.save steps per round, keep=1 (from step 3 they recycle); 0: none")
    ap.add_argument("--variants", default="auto,off,deep", help="C save variants: " + ", ".join(
        f"{k} ({' '.join(f'{e}={v}' for e, v in env.items())})" for k, env in VARIANTS.items()))
    a = ap.parse_args()
    # bench/ckpt-gpu.py's state, size parsing and ceilings, so that both benches measure alike
    import importlib.util
    spec = importlib.util.spec_from_file_location("ckpt_gpu", os.path.join(os.path.dirname(__file__), "ckpt-gpu.py"))
    cg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cg)
    size_bytes = cg.size_bytes_of(a.size)
    os.makedirs(a.disk, exist_ok=True)
    ceil_file = os.path.join(a.disk, "ferry-save-ceiling.dat")
    # Laid out once (a read of a new file with --size creates it), so that the write ceiling
    # overwrites an existing file, as bench/ckpt-gpu.py measures it.
    cg.ceiling(a.ferry, ceil_file, "read", "1", a.size)

    import torch
    import ferry.checkpoint as ferry_ckpt
    import ferry.safetensors as fst
    sd, total = cg.make_state(torch, size_bytes, a.device)
    if a.device != "cpu":
        torch.cuda.synchronize()
    gb = total / 1e9
    table("state", f"{gb:.2f} GB", f"{len(sd)} bf16 tensors on {a.device}")
    q = os.path.join(a.disk, "ferry-save-py.safetensors")
    results = []
    for rnd in range(a.rounds):
        os.sync()
        raw = cg.ceiling(a.ferry, ceil_file, "write", a.ceiling_runtime, a.size)[0]
        table(f"round {rnd + 1}: disk raw write ceiling (ferry bench O_DIRECT 4m qd16 x4, each job its quarter once, fsync)",
              f"{raw:.2f} GB/s" if raw else "n/a")
        os.sync()
        former = cg.ceiling(a.ferry, ceil_file, "write", a.ceiling_runtime, a.size, quarters=False)[0]
        table(f"round {rnd + 1}: disk raw write ceiling, former definition (4 jobs over the same blocks, "
              f"{a.ceiling_runtime} s, no fsync)", f"{former:.2f} GB/s" if former else "n/a", "not used by the target")
        r = {"raw": raw}
        if a.fio:
            for falloc in ("native", "none"):
                g = fio_new_file(a.fio, os.path.join(a.disk, "ferry-save-fio-new.dat"), size_bytes, falloc)
                r[f"new_{falloc}"] = g
                table(f"round {rnd + 1}: new-file write ceiling, fio fallocate={falloc} + fsync", f"{g:.2f} GB/s" if g else "n/a",
                      "O_DIRECT 4 jobs x QD16 x 4m, each its quarter of a new file, wall time")
        for pre in a.variants.split(","):
            saves = c_save(a.ferry, a.disk, a.size, a.device, pre)
            if saves:
                first, best = saves[0]["call.total"], min(s["call.total"] for s in saves[1:])
                b = min(saves[1:], key=lambda s: s["call.total"])
                table(f"round {rnd + 1}: phases of that save ({pre})", f"{best:.3f} s",
                      " ".join(f"{k}={b[k]:.3f}" for k in ("writer.layout", "writer.hash", "writer.write_wait",
                               "writer.ready_wait", "writer.header", "writer.fsync", "writer.rename",
                               "writer.dirsync", "call.slots")))
                r[f"c{pre}"] = gb / best
                table(f"round {rnd + 1}: ferry C save durable+xxh3, {pre}", f"{gb / best:.2f} GB/s",
                      f"best of saves 2-3; first {gb / first:.2f} GB/s" + (f"; {gb / best / raw:.2f}x raw" if raw else ""))
        # Three saves, reported as the C save's are (`ferry ckpt bench`: the first, then the best of
        # the later ones), so that the two compare like with like.
        py = []
        for rep in range(3):
            os.sync()
            t0 = time.perf_counter()
            fst.save_file(sd, q)
            py.append(time.perf_counter() - t0)
            os.unlink(q)
        os.sync()
        best = min(py[1:])
        r["py"] = gb / best
        table(f"round {rnd + 1}: ferry.safetensors.save_file durable from {a.device} tensors", f"{gb / best:.2f} GB/s",
              f"best of saves 2-3; first {gb / py[0]:.2f} GB/s" + (f"; {gb / best / raw:.2f}x raw" if raw else ""))
        # The training job's steady state: ferry.checkpoint.save into a directory, keep=1. Steps 1
        # and 2 make new files; from step 3 each save writes over the shard of the step pruned
        # before it (DIR/recycle, the default): the overwrite a raw write ceiling is.
        if a.ckpt_steps:
            cdir = os.path.join(a.disk, "ferry-save-ckpt")
            shutil.rmtree(cdir, ignore_errors=True)
            shard = "rank-00000-of-00001.safetensors"
            new_t, rec_t = [], []
            for step in range(1, a.ckpt_steps + 1):
                try:
                    before = os.stat(os.path.join(cdir, "recycle", shard)).st_ino
                except OSError:
                    before = None
                os.sync()
                t0 = time.perf_counter()
                ferry_ckpt.save(sd, cdir, step, keep=1)
                el = time.perf_counter() - t0
                recycled = before is not None and os.stat(os.path.join(cdir, "step-%012d" % step, shard)).st_ino == before
                (rec_t if recycled else new_t).append(el)
                table(f"round {rnd + 1}: ferry.checkpoint.save step {step}, keep=1", f"{gb / el:.2f} GB/s",
                      ("wrote over the pruned step's shard" if recycled else "a new file")
                      + (f"; {gb / el / raw:.2f}x raw" if raw else ""))
            shutil.rmtree(cdir)
            os.sync()
            if new_t:
                r["dir_new"] = gb / min(new_t)
            if rec_t:
                r["dir_recycled"] = gb / min(rec_t)
        results.append(r)
    os.unlink(ceil_file)
    for i, r in enumerate(results):
        if not r.get("raw"):
            continue
        x = r["py"] / r["raw"]
        table(f"target save (durable) vs disk raw write, round {i + 1}", f"{x:.2f}x",
              f"target >= 0.9x: {'met' if x >= 0.9 else 'NOT met'}; ferry.safetensors.save_file; C save "
              + ", ".join(f"{r[k] / r['raw']:.2f}x ({k[1:]})" for k in r if k.startswith("c")))
        if r.get("dir_recycled"):
            x = r["dir_recycled"] / r["raw"]
            table(f"target save (durable) vs disk raw write, checkpoint steady state, round {i + 1}", f"{x:.2f}x",
                  f"target >= 0.9x: {'met' if x >= 0.9 else 'NOT met'}; ferry.checkpoint.save keep=1, best "
                  f"of the saves that wrote over a pruned step's shard"
                  + (f"; its saves into new files {r['dir_new'] / r['raw']:.2f}x" if r.get("dir_new") else ""))
        new = [r[k] for k in ("new_native", "new_none") if r.get(k)]
        if new:
            table(f"save (durable) vs fio writing a new file + fsync, round {i + 1}", f"{r['py'] / max(new):.2f}x",
                  "ferry.safetensors.save_file against the better of fio's fallocate=native/none; C save "
                  + ", ".join(f"{r[k] / max(new):.2f}x ({k[1:]})" for k in r if k.startswith("c")))


if __name__ == "__main__":
    main()
