#!/usr/bin/env python3
"""Checkpoint load/save on the GPU machine (issue 5): ferry vs safetensors.torch, fastsafetensors
(nogds), runai-model-streamer and torch.load, on bf16 tensors shaped like a 4B transformer (8 GB by
default), warm (/dev/shm) and cold (the disk, caches dropped before each cold load), beside the
disk's raw read/write ceilings and the device-to-host copy time measured in the same run. Prints
`TABLE name | figure | note` lines, then `TABLE target ...` lines with each ratio the issue sets.

    python3 bench/ckpt-gpu.py --ferry build/ferry --disk /mnt/nvme/tmp [--size 8g]

The state is made once on the GPU; each file is written once (timed as that peer's save) and read
by every loader: `peer.safetensors` (safetensors.torch.save_file) by safetensors, fastsafetensors,
runai-model-streamer and ferry.safetensors.load_file (the targets use this row); `peer.pt`
(torch.save) by torch.load; `ferry-py.safetensors` (ferry's save_file: data 4 KiB-aligned) by ferry
again, to tell the file's layout from the loader. The /dev/shm copies are plain file copies of the
disk files. Each loader is timed once cold and three times warm (the median kept); torch's cached
GPU memory is emptied before each load so that every loader pays for its allocations. Before a cold
load, garbage is collected and caches dropped, and mincore says whether the drop left part of the
file cached (a `NOT cold` note). The cold target is then measured in rounds (--cold-rounds, 3):
each round the disk's read ceiling and ferry's cold load, seconds apart, order rotated
(cold_rounds()); more ferry contexts can join the rounds (--cold-variants chunk_size=4m). ferry's C
figures come from `ferry ckpt bench` (its own file, the same shapes). A peer whose wheel is missing
is reported as skipped. `--device cpu` runs the whole script without a GPU (figures meaningless) to
test it.

Run time, 8g on the GPU machine (16 cores, disk ~1.9 GB/s read and ~3.1 GB/s write, ~1.4 GB/s for
torch.load and ~0.8 GB/s for safetensors' and torch's saves; figures of the 2g run scaled): the
ceilings, each job its quarter of the file once (~3-4 s each), and the former ones for comparison
(2 x 8 s), plus laying out their file (~3 s); `ferry ckpt bench` warm ~15 s and cold ~20 s
(2 durable saves, 2 async saves, loads); peer saves ~25 s (safetensors.torch and torch.save, 8 GB
each, + os.sync); the write ceiling again before ferry's 2 saves ~10 s, the saves ~6 s; copies to
/dev/shm ~10 s; warm loads, 3 of each, ~35 s (torch.load ~18 s of it); cold loads ~35 s (6 loaders
at 1.3-2 GB/s) + drop_caches ~1 s each; the cold rounds ~40 s (3 x a ceiling and a load of ~5 s
each, + drop_caches, +15 s per variant; the ceiling's file kept from the read ceiling before the
loads); async saves ~8 s; imports, CUDA start and the state ~15 s: about 4.5 minutes, under 5.5.
--size 2g takes about a minute.
Space: ~25 GB on --disk (three 8 GB files at once), ~25 GB in /dev/shm.
"""
import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time


def table(name, fig, note=""):
    print(f"TABLE {name} | {fig} | {note}", flush=True)


def drop_caches():
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        print(f"note: cannot drop caches ({e}); cold figures are not cold", file=sys.stderr)
        return False


def ferry_bench(ferry, d, size, cold, budget):
    cmd = [ferry, "ckpt", "bench", "--dir", d, "--size", size, "--json"]
    cmd += ["--cold", "--loads", "1"] if cold else ["--loads", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FERRY_HOST_BUDGET=budget))
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def size_bytes_of(size):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(size[-1].lower())
    return int(float(size[:-1]) * mult) if mult else int(size)


def ceiling(ferry, f, rw, runtime, size, quarters=True):
    """The disk's raw O_DIRECT ceiling, 4 jobs x QD16 x 4 MiB, on an existing file. quarters (the
    definition the targets use): one pass, each job its quarter (--offset_increment), caches dropped
    before a read, the file fsynced at the end of a write (--end_fsync): what a save or a load must
    do. Otherwise the former definition: every job over the whole file from offset 0 for `runtime`
    seconds, no fsync; on the GPU machine's virtio disk it read 16-25% above the quarters' writes
    (fio alone, 2026-11-23; docs/CHECKPOINTS.md), the jobs writing the same blocks at once.
    Returns (GB/s or None, the command or why it failed)."""
    cmd = [ferry, "bench", f"--rw={rw}", "--direct=1", "--bs=4m", "--iodepth=16", "--numjobs=4",
           f"--filename={f}", "--output-format=json"]
    if quarters:
        q = size_bytes_of(size) // 4 // (4 << 20) * (4 << 20)
        cmd += [f"--size={q}", f"--offset_increment={q}"] + (["--end_fsync=1"] if rw == "write" else ["--cold=system"])
    else:
        cmd += [f"--size={size}", f"--runtime={runtime}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        return None, (out.stderr.strip().splitlines() or ["?"])[-1]
    try:
        j = json.loads(out.stdout)
        job = j["jobs"][0][rw if rw in ("read", "write") else "read"]
        return job["bw_bytes"] / 1e9, " ".join(cmd[1:])
    except (ValueError, KeyError, IndexError) as e:
        m = re.search(r"([0-9.]+)\s*GB/s", out.stdout)
        return (float(m.group(1)) if m else None), f"parse: {e}"


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def ceiling_again(a, f, rw, start, before, keep=False):
    """The rw ceiling measured again (for a write, a read first lays f out, untimed), f removed
    after unless keep (the cold rounds read it again), and a TABLE row beside the figure from the
    start. Returns GB/s or None."""
    for r in ("read", "write") if rw == "write" else ("read",):
        bw, _ = ceiling(a.ferry, f, r, a.ceiling_runtime, a.ceiling_size)
    if not keep:
        remove(f)
    if bw:
        table(f"disk raw {rw} ceiling, again just before {before}", f"{bw:.2f} GB/s",
              f"at the start {start:.2f} GB/s" if start else "")
    return bw


def sync(torch, dev):
    if dev != "cpu":
        torch.cuda.synchronize()


def make_state(torch, size_bytes, dev):
    h, ffn, vocab, kv = 2560, 9728, 151936, 1024
    sd, total, layer = {}, 0, 0
    sd["model.embed_tokens.weight"] = torch.randn(vocab, h, dtype=torch.bfloat16, device=dev)
    total += vocab * h * 2
    while total < size_bytes:
        p = f"model.layers.{layer}."
        for n, shp in (("self_attn.q_proj", (4096, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                       ("self_attn.o_proj", (h, 4096)), ("mlp.gate_proj", (ffn, h)), ("mlp.up_proj", (ffn, h)),
                       ("mlp.down_proj", (h, ffn))):
            sd[p + n + ".weight"] = torch.randn(*shp, dtype=torch.bfloat16, device=dev)
            total += shp[0] * shp[1] * 2
        sd[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device=dev)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device=dev)
        layer += 1
    return sd, total


def loaders(torch, fst, dev):
    """(name, path key, function) of every loader present; path key: "st" or "pt"."""
    import safetensors.torch as st
    out = [("safetensors.torch.load_file(device=cuda)", "st", lambda p: st.load_file(p, device=dev))]
    try:
        from fastsafetensors import fastsafe_open
    except ImportError as e:
        table("fastsafetensors", "skipped", f"not installed ({e})")
    else:
        def fst_load(p):
            with fastsafe_open(filenames=[p], nogds=True, device="cuda:0" if dev == "cuda" else dev) as f:
                return {k: f.get_tensor(k).clone() for k in f.keys()}
        out.append(("fastsafetensors (nogds) load to cuda", "st", fst_load))
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as e:
        table("runai-model-streamer", "skipped", f"not installed ({e})")
    else:
        def runai_load(p):
            res = {}
            with SafetensorsStreamer() as s:
                s.stream_file(p)
                for name, t in s.get_tensors():
                    res[name] = t.to(dev, non_blocking=True)
            return res
        out.append(("runai-model-streamer load to cuda", "st", runai_load))
    out.append(("torch.load(map_location=cuda)", "pt", lambda p: torch.load(p, map_location=dev)))
    if fst is not None:
        out.append(("ferry.safetensors.load_file(device=cuda)", "st", lambda p: fst.load_file(p, device=dev)))
        out.append(("ferry.safetensors.load_file(device=cuda), the file ferry wrote", "ferry",
                    lambda p: fst.load_file(p, device=dev)))
    return out


def resident(path):
    """Bytes of path in the page cache (mincore over a mapping of the file, which faults nothing
    in), or None with the reason printed once where it cannot be told."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        fd = os.open(path, os.O_RDONLY)
    except (OSError, AttributeError) as e:
        return _no_residency(f"{path}: {e}")
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return _no_residency(f"mmap({path}): {os.strerror(ctypes.get_errno())}")
        page = os.sysconf("SC_PAGE_SIZE")
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        r = libc.mincore(ctypes.c_void_p(addr), size, vec)
        err = ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(addr), size)
        if r:
            return _no_residency(f"mincore({path}): {os.strerror(err)}")
        return (len(vec.raw) - vec.raw.count(0)) * page  # a page's byte is 1 where it is resident
    finally:
        os.close(fd)


def _no_residency(why):
    if not getattr(_no_residency, "said", False):
        table("page-cache check after each cache drop", "unavailable", why)
        _no_residency.said = True
    return None


LEFT_CACHED = {}  # path -> bytes still in the page cache after the last cold load's drop


def timed_load(torch, dev, fn, path, cold):
    """Seconds for one load, or the exception's text."""
    if dev != "cpu":
        torch.cuda.empty_cache()
    if cold:
        # A previous loader's mapping that is still alive (a cycle not yet collected) pins its
        # pages: drop_caches cannot drop mapped pages, and the next "cold" load would read them
        # from memory. Collect first, then say what the drop left.
        gc.collect()
        drop_caches()
        LEFT_CACHED[path] = resident(path)
    t0 = time.perf_counter()
    try:
        x = fn(path)
        sync(torch, dev)
    except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
        return f"{type(e).__name__}: {str(e)[:150]}"
    s = time.perf_counter() - t0
    del x
    return s


def cold_rounds(a, torch, dev, fst, path, shm_path, gb, ceil_file):
    """The cold-load target's measure, paired as bench/vs-fio.sh pairs fio and ferry: a.cold_rounds
    rounds, each the disk's read ceiling (caches dropped first) and ferry's cold load of `path` (caches
    dropped first) with the default context and each one --cold-variants names, the order rotated so that none
    always runs first. The disk's read rate moved by up to 18% between measurements minutes apart
    (2026-11-24); within a round they are seconds apart. Prints a row per round and
    one per variant; returns {variant: median of its rounds' ratios to their round's ceiling}."""
    import ferry
    variants = {"default": None}
    for spec in filter(None, a.cold_variants.split(",")):
        k, _, v = spec.partition("=")
        variants[spec] = ferry.Context(**{k: v})
        # untimed: the context's first load pays for its slots and workers (warm, from /dev/shm)
        timed_load(torch, dev, lambda p: fst.load_file(p, device=dev, context=variants[spec]), shm_path, False)
    runs = ["ceiling"] + list(variants)
    got = {r: [] for r in runs}
    for k in range(a.cold_rounds):
        order = runs[k % len(runs):] + runs[:k % len(runs)]
        row = {}
        for r in order:
            if r == "ceiling":
                row[r], _ = ceiling(a.ferry, ceil_file, "read", a.ceiling_runtime, a.ceiling_size)
            else:
                ctx = variants[r]
                x = timed_load(torch, dev, lambda p: fst.load_file(p, device=dev, context=ctx), path, True)
                row[r] = gb / x if not isinstance(x, str) else None
                if isinstance(x, str):
                    table(f"cold round {k + 1} ferry [{r}]", "failed", x)
                elif LEFT_CACHED.get(path):
                    table(f"cold round {k + 1} ferry [{r}]", "NOT cold",
                          f"{LEFT_CACHED[path] / 1e9:.2f} GB of the file stayed cached after the drop")
        for r in runs:
            got[r].append(row[r])
        c = row["ceiling"]
        table(f"cold round {k + 1}: read ceiling and ferry.safetensors.load_file", f"{c:.2f} GB/s" if c else "n/a",
              "order " + ", ".join(order) + "; " + "; ".join(
                  f"[{r}] {row[r]:.2f} GB/s" + (f" ({row[r] / c:.2f}x)" if c else "") for r in variants if row[r]))
    remove(ceil_file)
    out = {}
    for r in variants:
        rr = [y / c for y, c in zip(got[r], got["ceiling"]) if y and c]
        if rr:
            out[r] = statistics.median(rr)
            table(f"ferry.safetensors.load_file cold disk [{r}], paired with the ceiling", f"{out[r]:.2f}x",
                  f"median of {len(rr)} rounds' ratios: " + ", ".join(f"{x:.2f}" for x in rr))
    return out


def h2d_ceilings(torch, nbytes, reps=3):
    """The warm loads' ceiling: GB/s of one pinned host-to-device copy of nbytes (median of reps)
    into device memory allocated just before, as a load's is (timed_load empties torch's cache
    first), and into memory copied into before: 48.9 GB/s and 54.5 for 8 GiB on the GPU machine
    (docs/PAGECACHE.md, third round). The copy engine's first writes into new memory cost about a
    tenth, whoever copies (a memset first does not help)."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    fresh, again = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        for out in (fresh, again):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            d.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            out.append(nbytes / 1e9 / (time.perf_counter() - t0))
        del d
    del src
    torch.cuda.empty_cache()
    return statistics.median(fresh), statistics.median(again)


def ratio(name, value, target, higher=True, note=""):
    if value is None:
        table(f"target {name}", "n/a", note or "a figure is missing")
        return
    met = value >= target if higher else value <= target
    table(f"target {name}", f"{value:.2f}x", f"target {'>=' if higher else '<='} {target}x: "
          f"{'met' if met else 'NOT met'}" + (f"; {note}" if note else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default="build/ferry")
    ap.add_argument("--disk", default="/tmp", help="a directory on the disk under test")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--size", default=os.environ.get("FERRY_CKPT_BENCH_SIZE", "8g"))
    ap.add_argument("--ceiling-runtime", default="8", help="seconds of each raw ceiling run")
    ap.add_argument("--ceiling-size", default="8g", help="the region of the disk the ceilings use")
    ap.add_argument("--warm-loads", type=int, default=3, help="warm loads per loader (the median is kept)")
    ap.add_argument("--cold-rounds", type=int, default=3, help="rounds of the read ceiling paired with ferry's "
                    "cold load (the cold target's measure; 0: compare with one ceiling measured before the loads)")
    ap.add_argument("--cold-variants", default=os.environ.get("FERRY_CKPT_COLD_VARIANTS", ""),
                    help="more ferry contexts in the cold rounds, comma-separated knob=value (e.g. chunk_size=4m)")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the whole script without a GPU "
                    "(figures meaningless; for testing the script)")
    a = ap.parse_args()
    size_bytes = size_bytes_of(a.size)
    # An asynchronous save returns once the whole state is in pinned memory, which the context's
    # host_budget bounds (4g by default): the saves here get a budget that holds the state, as a
    # job saving this much would set; beyond the budget the caller waits for the writes.
    budget = f"{-(-size_bytes * 5 // 4 // (1 << 30)) + 1}g"
    dev = a.device
    t_start = time.perf_counter()
    fig = {}  # what the target lines need

    ceil = {}
    # read first: it lays the file out at its full size (untimed); the write then overwrites an
    # existing file, as the ceiling is defined (a time-limited write may not reach the end).
    ceil_file = os.path.join(a.disk, "ferry-ceiling.dat")
    for rw in ("read", "write"):
        bw, note = ceiling(a.ferry, ceil_file, rw, a.ceiling_runtime, a.ceiling_size)
        ceil[rw] = bw
        table(f"disk raw {rw} ceiling (ferry bench O_DIRECT 4m qd16 x4, each job its quarter, once"
              + (", fsync)" if rw == "write" else ", cold)"), f"{bw:.2f} GB/s" if bw else "n/a", note)
        bw, note = ceiling(a.ferry, ceil_file, rw, a.ceiling_runtime, a.ceiling_size, quarters=False)
        table(f"disk raw {rw} ceiling, former definition (4 jobs over the same blocks, {a.ceiling_runtime} s, no fsync)",
              f"{bw:.2f} GB/s" if bw else "n/a", "not used by the targets; " + note)
    remove(ceil_file)

    for where, d, cold in (("warm /dev/shm", a.shm, False), ("cold disk", a.disk, True)):
        r = ferry_bench(a.ferry, d, a.size, cold, budget)
        if r is None:
            table(f"ferry ckpt bench {where}", "failed", "see stderr")
            continue
        gb = r["bytes"] / 1e9
        ch = r.get("load_chunks", {})
        table(f"ferry C load -> {r['memory']} {where}", f"{gb / r['load_s']:.2f} GB/s",
              f"{gb:.2f} GB; best of {r['loads']} {r['load_s']:.3f} s, first {r['load_first_s']:.3f} s; chunks "
              f"{ch.get('direct')} direct {ch.get('buffered')} buffered {ch.get('cached')} cached")
        table(f"ferry C save durable+xxh3 {where}", f"{gb / r['save_s']:.2f} GB/s",
              f"{r['save_s']:.3f} s (first save of the writer); second {gb / r['save_second_s']:.2f} GB/s")
        table(f"ferry C async save blocked {where}", f"{r['async_blocked_s']:.3f} s",
              f"{gb / r['async_blocked_s']:.2f} GB/s snapshot; first {r['async_first_blocked_s']:.3f} s; "
              f"total {r['async_total_s']:.3f} s")
        if cold:
            fig["c_save"] = gb / min(r["save_s"], r["save_second_s"])
            fig["c_load_cold"] = gb / r["load_s"]
        else:
            fig["c_load_warm"] = gb / r["load_s"]
        for f in os.listdir(d):
            if f.startswith("ferry-ckpt-bench-"):
                os.unlink(os.path.join(d, f))

    try:
        import torch
        import safetensors.torch as st
    except ImportError as e:
        table("peers", "skipped", f"{e.name} not installed")
        return
    if dev != "cpu" and not torch.cuda.is_available():
        table("peers", "skipped", "torch sees no CUDA device")
        return
    try:
        import ferry
        import ferry.checkpoint as fck
        import ferry.safetensors as fst
    except ImportError as e:
        fst = fck = None
        table("ferry python", "skipped", f"import ferry: {e} (pip install . first)")

    sd, total = make_state(torch, size_bytes, dev)
    sync(torch, dev)
    gb = total / 1e9
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=dev != "cpu") for k, v in sd.items()}
    for rep in range(2):  # the second: the copy engines warm
        t0 = time.perf_counter()
        for k, v in sd.items():
            pinned[k].copy_(v, non_blocking=True)
        sync(torch, dev)
        d2h_floor = time.perf_counter() - t0
    table("D2H copy into pinned memory (the async-save floor)", f"{d2h_floor:.3f} s", f"{gb / d2h_floor:.2f} GB/s")
    del pinned

    # Saves, once each, into the disk (the save target is the disk's raw write ceiling).
    paths = {"st": os.path.join(a.disk, "peer.safetensors"), "pt": os.path.join(a.disk, "peer.pt")}
    t0 = time.perf_counter()
    st.save_file(sd, paths["st"])
    os.sync()
    table("safetensors.torch.save_file cold disk", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "with os.sync()")
    t0 = time.perf_counter()
    torch.save(sd, paths["pt"])
    os.sync()
    table("torch.save cold disk", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "with os.sync()")
    if fst is not None:
        # The write ceiling again, here: a run on 2026-11-23 had save_file at 0.46-0.57x of the
        # ceiling measured at the start, while bench/ckpt-save.py (a ceiling beside each save) had
        # the same call at 0.86-0.97x; after the peers' 17 GB of writes the virtio disk may not be
        # what it was at the start. The target uses this one; the first is printed beside it.
        os.sync()
        fig["write_near"] = ceiling_again(a, ceil_file, "write", ceil.get("write"), "ferry's save_file")
        q = os.path.join(a.disk, "ferry-py.safetensors")
        for rep in range(2):  # a new file each time; the second with the engine and CUDA warm
            # Untimed: the disk quiet first. ext4 mounted with `discard` discards a deleted file's
            # blocks at the next journal commit: the first save's file, deleted just before the
            # second, and the peers' writeback would otherwise land inside the timed save.
            os.sync()
            t0 = time.perf_counter()
            fst.save_file(sd, q)  # durable: fsync of the file and the directory
            f_s = time.perf_counter() - t0
            if not rep:
                os.unlink(q)
            note = "durable (fsynced), from CUDA tensors"
            if fig.get("write_near"):
                note += f", {gb / f_s / fig['write_near']:.2f}x the write ceiling just before"
            if ceil.get("write"):
                note += f", {gb / f_s / ceil['write']:.2f}x the one at the start"
            table(f"ferry.safetensors.save_file cold disk{' (second)' if rep else ''}", f"{gb / f_s:.2f} GB/s", note)
        fig["py_save"] = gb / f_s
        paths["ferry"] = q  # its data starts 4 KiB-aligned, unlike safetensors.torch's file
    shm = {k: os.path.join(a.shm, os.path.basename(p)) for k, p in paths.items()}
    for k in paths:
        shutil.copyfile(paths[k], shm[k])

    # The read ceiling again, just before the cold loads, for the same reason as the write's: in
    # one run (2026-11-24) every loader read cold at 0.84-0.86x of the ceiling measured at the start.
    # kept for the cold rounds after the loads, instead of laying out 8 GB again there
    rounds = fst is not None and a.cold_rounds > 0
    rnear = ceiling_again(a, ceil_file, "read", ceil.get("read"), "the cold loads", keep=rounds) or ceil.get("read")
    h2d_new = None
    if dev != "cpu":
        h2d_new, h2d_again = h2d_ceilings(torch, total)
        table("pinned H2D copy into new device memory (the warm loads' ceiling)", f"{h2d_new:.2f} GB/s",
              f"{gb:.2f} GB, median of 3; into memory copied into before: {h2d_again:.2f} GB/s")
    load = {}
    for where, cold, files in (("warm /dev/shm", False, shm), ("cold disk", True, paths)):
        for name, key, fn in loaders(torch, fst, dev):
            if key not in files:
                continue
            # warm: every loader three times, the median kept (one peer's single warm load ran at
            # 3.04 GB/s on one VM and 4.68 on the next); cold: once each (a cache drop each)
            runs = [timed_load(torch, dev, fn, files[key], cold) for _ in range(1 if cold else a.warm_loads)]
            err = next((x for x in runs if isinstance(x, str)), None)
            if err:
                table(f"{name} {where}", "failed", err)
                continue
            s = statistics.median(runs)
            load[(name, cold)] = gb / s
            note = ""
            if cold and rnear:
                note = f"{gb / s / rnear:.2f}x the read ceiling just before"
                if ceil.get("read"):
                    note += f", {gb / s / ceil['read']:.2f}x the one at the start"
            if cold and LEFT_CACHED.get(files[key]):
                note += f"; NOT cold: {LEFT_CACHED[files[key]] / 1e9:.2f} GB of the file stayed cached after the drop"
            if not cold:
                note = f"median of {len(runs)}: " + ", ".join(f"{gb / x:.2f}" for x in runs) + " GB/s in order"
                if h2d_new:
                    note += f"; {gb / s / h2d_new:.2f}x the copy into new memory"
            table(f"{name} {where}", f"{gb / s:.2f} GB/s", note)
    if rounds:
        fig["cold_rounds"] = cold_rounds(a, torch, dev, fst, paths["st"], shm["st"], gb, ceil_file)
    for p in list(shm.values()) + list(paths.values()):
        os.unlink(p)

    if fck is not None:
        # Twice: the second shows the steady state (pinned slots kept from the first).
        cd = os.path.join(a.shm, "ferry-py-ckpt")
        save_ctx = ferry.Context(host_budget=budget)
        blocked = []
        for step in (1, 2):
            t0 = time.perf_counter()
            hnd = fck.async_save(sd, cd, step, keep=1, context=save_ctx)
            blocked.append(time.perf_counter() - t0)
            hnd.wait()
            tot = time.perf_counter() - t0
        table("ferry.checkpoint.async_save blocked warm /dev/shm", f"{blocked[1]:.3f} s",
              f"first {blocked[0]:.3f} s; total {tot:.3f} s; {blocked[1] / d2h_floor:.2f}x the pinned D2H copy time; "
              f"host_budget={budget}")
        fig["async"] = blocked[1] / d2h_floor
        shutil.rmtree(cd, ignore_errors=True)

    # The targets.
    ferry_py = "ferry.safetensors.load_file(device=cuda)"
    fw, fc = load.get((ferry_py, False)), load.get((ferry_py, True))
    hf = load.get(("safetensors.torch.load_file(device=cuda)", False))
    peers = {n: v for (n, c), v in load.items() if not c and not n.startswith("ferry")}
    # The targets use ferry's load of the file safetensors.torch wrote, the file every peer reads.
    best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
    ratio("load warm vs safetensors.torch", fw / hf if fw and hf else None, 10,
          note=f"ferry {fw and round(fw, 2)} GB/s; C loader {fig.get('c_load_warm', 0):.2f} GB/s")
    ratio("load warm vs best peer", fw / best[1] if fw and best else None, 1.5,
          note=f"best peer: {best[0]} {best[1]:.2f} GB/s" if best else "")
    paired = fig.get("cold_rounds", {}).get("default")
    single = (f"one load against the read ceiling just before the loads: {fc / rnear:.2f}x of {rnear:.2f} GB/s"
              if fc and rnear else "")
    c_load = (f"C loader {fig.get('c_load_cold', 0) / ceil['read']:.2f}x the ceiling at the start "
              f"({ceil['read']:.2f} GB/s), next to which it ran" if ceil.get("read") else "")
    # the paired rounds when they ran, else the one load against the ceiling just before
    value, how = ((paired, f"median of {a.cold_rounds} rounds, each the ceiling and the load seconds apart")
                  if paired is not None else (fc / rnear if fc and rnear else None, ""))
    ratio("load cold vs disk raw read", value, 0.95, note="; ".join(x for x in (how, single, c_load) if x))
    # save_file against the ceiling measured just before it (the one at the start if that failed);
    # the C save ran right after the first ceiling, so it is compared with that one
    wnear = fig.get("write_near") or ceil.get("write")
    ratio("save (durable) vs disk raw write", fig["py_save"] / wnear if fig.get("py_save") and wnear else None, 0.9,
          note=(f"ferry.safetensors.save_file, second, against the ceiling just before it ({wnear:.2f} GB/s); "
                f"C save (xxh3) {fig.get('c_save', 0) / ceil['write']:.2f}x the ceiling at the start "
                f"({ceil['write']:.2f} GB/s)") if wnear and ceil.get("write") else "")
    ratio("async save blocked vs D2H copy", fig.get("async"), 1.2, higher=False)
    table("bench run time", f"{time.perf_counter() - t_start:.0f} s", f"--size {a.size}, {gb:.2f} GB")


if __name__ == "__main__":
    main()
