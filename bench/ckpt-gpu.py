#!/usr/bin/env python3
"""Checkpoint load/save on the GPU machine: ferry vs safetensors.torch vs torch.load, ~8 GB bf16
shaped like a 4B transformer, warm (/dev/shm) and cold (disk after drop_caches), beside the disk's
raw read/write ceiling measured in the same run. Prints `TABLE name | figure | note` lines.

    python3 bench/ckpt-gpu.py --ferry build/ferry --disk /mnt/nvme/tmp [--size 8g]

ferry is measured twice: through `ferry ckpt bench` (the C API) and through the Python package
(`ferry.safetensors.load_file(device="cuda")` on the very file safetensors.torch wrote and loads,
`save_file` from the CUDA tensors, `ferry.checkpoint.async_save`), beside the peers in this
process. Needs torch (CUDA) and safetensors; a peer that is missing is reported as skipped.
The size defaults to $FERRY_CKPT_BENCH_SIZE or 8g (8g takes about 3.5 minutes with a 2 GB/s disk).
"""
import argparse
import json
import os
import re
import shutil
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


def ferry_bench(ferry, d, size, cold):
    cmd = [ferry, "ckpt", "bench", "--dir", d, "--size", size, "--json"] + (["--cold"] if cold else [])
    if cold:
        # --cold only evicts the file with fadvise; drop everything as the peers get
        cmd.append("--keep")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def ceiling(ferry, d, rw):
    f = os.path.join(d, "ferry-ceiling.dat")
    cmd = [ferry, "bench", f"--rw={rw}", "--direct=1", "--bs=4m", "--iodepth=16", "--numjobs=4", "--size=8g",
           "--runtime=15", f"--filename={f}", "--output-format=json"]
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


def make_state(torch, size_bytes):
    h, ffn, vocab, kv = 2560, 9728, 151936, 1024
    sd, total, layer = {}, 0, 0
    sd["model.embed_tokens.weight"] = torch.empty(vocab, h, dtype=torch.bfloat16, device="cuda")
    total += vocab * h * 2
    while total < size_bytes:
        p = f"model.layers.{layer}."
        for n, shp in (("self_attn.q_proj", (4096, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                       ("self_attn.o_proj", (h, 4096)), ("mlp.gate_proj", (ffn, h)), ("mlp.up_proj", (ffn, h)),
                       ("mlp.down_proj", (h, ffn))):
            sd[p + n + ".weight"] = torch.randn(*shp, dtype=torch.bfloat16, device="cuda")
            total += shp[0] * shp[1] * 2
        sd[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device="cuda")
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device="cuda")
        layer += 1
    return sd, total


def peer_loads(torch, path, where, gb, cold):
    """The other peers the issue names, on the same file, when their wheels are installed:
    fastsafetensors without GDS (it is refused on machines without it) and runai-model-streamer."""
    def timed(name, fn, note=""):
        if cold:
            drop_caches()
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
            table(f"{name} {where}", "failed", f"{type(e).__name__}: {str(e)[:150]}")
            return
        table(f"{name} {where}", f"{gb / (time.perf_counter() - t0):.2f} GB/s", note)

    try:
        from fastsafetensors import fastsafe_open
    except ImportError as e:
        table(f"fastsafetensors {where}", "skipped", f"not installed ({e})")
    else:
        def fst_load():
            with fastsafe_open(filenames=[path], nogds=True, device="cuda:0") as f:
                out = {k: f.get_tensor(k).clone() for k in f.keys()}
            return out
        timed("fastsafetensors (nogds) load to cuda", fst_load, "fastsafe_open(nogds=True), tensors cloned out")
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as e:
        table(f"runai-model-streamer {where}", "skipped", f"not installed ({e})")
    else:
        def runai_load():
            out = {}
            with SafetensorsStreamer() as s:
                s.stream_file(path)
                for name, t in s.get_tensors():
                    out[name] = t.to("cuda", non_blocking=True)
            return out
        timed("runai-model-streamer load to cuda", runai_load, "stream_file, then .to(cuda)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", default="build/ferry")
    ap.add_argument("--disk", default="/tmp", help="a directory on the disk under test")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--size", default=os.environ.get("FERRY_CKPT_BENCH_SIZE", "8g"))
    a = ap.parse_args()
    size_bytes = int(float(a.size[:-1]) * (1 << 30)) if a.size[-1] in "gG" else int(a.size)

    ceil = {}
    for rw in ("read", "write"):
        bw, note = ceiling(a.ferry, a.disk, rw)
        ceil[rw] = bw
        table(f"disk raw {rw} ceiling (ferry bench O_DIRECT 4m qd16 x4)", f"{bw:.2f} GB/s" if bw else "n/a", note)
    try:
        os.unlink(os.path.join(a.disk, "ferry-ceiling.dat"))
    except OSError:
        pass

    for where, d, cold in (("warm /dev/shm", a.shm, False), ("cold disk", a.disk, True)):
        if cold:
            drop_caches()
        r = ferry_bench(a.ferry, d, a.size, cold)
        if r is None:
            table(f"ferry {where}", "failed", "see stderr")
            continue
        gb = r["bytes"] / 1e9
        table(f"ferry load -> {r['memory']} {where}", f"{gb / r['load_s']:.2f} GB/s", f"{gb:.2f} GB in {r['load_s']:.3f} s")
        table(f"ferry save durable+xxh3 {where}", f"{gb / r['save_s']:.2f} GB/s", f"{r['save_s']:.3f} s")
        table(f"ferry async save blocked {where}", f"{r['async_blocked_s']:.3f} s",
              f"{gb / r['async_blocked_s']:.2f} GB/s snapshot; first {r['async_first_blocked_s']:.3f} s; total {r['async_total_s']:.3f} s")
        for f in os.listdir(d):
            if f.startswith("ferry-ckpt-bench-"):
                os.unlink(os.path.join(d, f))

    try:
        import torch
        import safetensors.torch as st
    except ImportError as e:
        table("peers", "skipped", f"{e.name} not installed")
        return
    if not torch.cuda.is_available():
        table("peers", "skipped", "torch sees no CUDA device")
        return
    sd, total = make_state(torch, size_bytes)
    gb = total / 1e9
    t0 = time.perf_counter()
    host = {k: v.to("cpu", non_blocking=True) for k, v in sd.items()}
    torch.cuda.synchronize()
    table("pinned-less D2H copy of the state (torch .to(cpu))", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "")
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in sd.items()}
    t0 = time.perf_counter()
    for k, v in sd.items():
        pinned[k].copy_(v, non_blocking=True)
    torch.cuda.synchronize()
    d2h_floor = time.perf_counter() - t0
    table("D2H copy into pinned memory (the async-save floor)", f"{d2h_floor:.3f} s", f"{gb / d2h_floor:.2f} GB/s")
    del host, pinned
    try:
        import ferry.checkpoint as fck
        import ferry.safetensors as fst
    except ImportError as e:
        fst = fck = None
        table("ferry python", "skipped", f"import ferry: {e} (pip install . first)")
    for where, d, cold in (("warm /dev/shm", a.shm, False), ("cold disk", a.disk, True)):
        p = os.path.join(d, "peer.safetensors")
        t0 = time.perf_counter()
        st.save_file(sd, p)
        os.sync()
        table(f"safetensors.torch.save_file {where}", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "with os.sync()")
        if cold:
            drop_caches()
        t0 = time.perf_counter()
        x = st.load_file(p, device="cuda")
        torch.cuda.synchronize()
        hf_s = time.perf_counter() - t0
        table(f"safetensors.torch.load_file(device=cuda) {where}", f"{gb / hf_s:.2f} GB/s", "")
        del x
        peer_loads(torch, p, where, gb, cold)
        if fst is not None:
            # The same file, through the Python package: storage -> GPU into torch allocations.
            if cold:
                drop_caches()
            t0 = time.perf_counter()
            x = fst.load_file(p, device="cuda")
            torch.cuda.synchronize()
            f_s = time.perf_counter() - t0
            note = f"{hf_s / f_s:.1f}x safetensors"
            if cold and ceil.get("read"):
                note += f", {gb / f_s / ceil['read']:.2f}x disk raw read"
            table(f"ferry.safetensors.load_file(device=cuda) {where}", f"{gb / f_s:.2f} GB/s", note)
            del x
            q = os.path.join(d, "ferry-py.safetensors")
            t0 = time.perf_counter()
            fst.save_file(sd, q)  # durable: fsync of the file and the directory
            f_s = time.perf_counter() - t0
            note = "durable (fsynced), from CUDA tensors"
            if cold and ceil.get("write"):
                note += f", {gb / f_s / ceil['write']:.2f}x disk raw write"
            table(f"ferry.safetensors.save_file {where}", f"{gb / f_s:.2f} GB/s", note)
            os.unlink(q)
            if not cold:
                # Twice: the second shows the steady state (pinned slots kept from the first).
                cd = os.path.join(d, "ferry-py-ckpt")
                blocked = []
                for step in (1, 2):
                    t0 = time.perf_counter()
                    h = fck.async_save(sd, cd, step, keep=1)
                    blocked.append(time.perf_counter() - t0)
                    h.wait()
                    total = time.perf_counter() - t0
                note = f"first {blocked[0]:.3f} s; total {total:.3f} s"
                if d2h_floor:
                    note += f"; {blocked[1] / d2h_floor:.2f}x the pinned D2H copy time"
                table(f"ferry.checkpoint.async_save blocked {where}", f"{blocked[1]:.3f} s", note)
                shutil.rmtree(cd, ignore_errors=True)
        os.unlink(p)
        p = os.path.join(d, "peer.pt")
        t0 = time.perf_counter()
        torch.save(sd, p)
        os.sync()
        table(f"torch.save {where}", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "with os.sync()")
        if cold:
            drop_caches()
        t0 = time.perf_counter()
        x = torch.load(p, map_location="cuda")
        torch.cuda.synchronize()
        table(f"torch.load(map_location=cuda) {where}", f"{gb / (time.perf_counter() - t0):.2f} GB/s", "")
        del x
        os.unlink(p)


if __name__ == "__main__":
    main()
