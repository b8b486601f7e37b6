"""Compressed files on the CPU (issue 26, docs/PERFORMANCE.md "Compressed files"): ratio and one
thread's compress and decompress rates for zstd and LZ4 at chunk sizes 256 KiB, 1 MiB and 4 MiB,
on token data and on bf16 weights. What chose the cz_chunk default (docs/CONFIG.md).

  PYTHONPATH=<ferry> python bench/cz-codecs.py [--mib 64] [--dir /dev/shm] [--reps 3]

Token data: uint16 ids of a real tokenizer over natural text, from bench/cz-tokens.py (a
byte-level BPE trained on the Python standard library's docstrings and comments, or tiktoken's gpt2
where its cache has it; no network), made once into --dir unless --tokens names such a file. bf16:
torch.randn * 0.02 rounded to bfloat16 (the distribution of initialised weights). Each figure is the
best of --reps; rates count uncompressed bytes. The files live in --dir (tmpfs by default), so
storage is not measured.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import ferry


def token_data(nbytes, path, where):
    """The tokens of path (bench/cz-tokens.py's output), made there first when path is None."""
    made = None
    if path is None:
        made = path = os.path.join(where, "cz-tokens-%d.u16" % os.getpid())
        out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "cz-tokens.py"), path,
                              str(max(1, nbytes >> 20))], check=True, capture_output=True, text=True).stdout
        print(out.strip())
    try:
        data = open(path, "rb").read(nbytes)
    finally:
        if made:
            os.unlink(made)
    if len(data) < nbytes:
        data = (data * (nbytes // max(1, len(data)) + 1))[:nbytes]
    return data


def bf16_data(nbytes):
    import torch
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(nbytes // 2, generator=g) * 0.02).to(torch.bfloat16)
    return t.view(torch.uint8).numpy().tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", help="a file of uint16 token ids (bench/cz-tokens.py's); made when not given")
    a = ap.parse_args()
    nbytes = a.mib << 20
    sets = {"tokens": token_data(nbytes, a.tokens, a.dir), "bf16": bf16_data(nbytes)}
    print("%-7s %-5s %6s %7s %12s %12s %16s" % ("data", "codec", "chunk", "ratio", "comp MB/s", "decomp MB/s",
                                                "decomp no-verify"))
    src = os.path.join(a.dir, "cz-bench-%d.bin" % os.getpid())
    dst = src + ".fz"
    try:
        for name, data in sets.items():
            with open(src, "wb") as f:
                f.write(data)
            for codec in ("zstd", "lz4"):
                for chunk in ("256k", "1m", "4m"):
                    best_c = best_d = best_dn = 1e9
                    for _ in range(a.reps):
                        t0 = time.perf_counter()
                        size = ferry.compress_file(src, dst, codec=codec, chunk=chunk, threads=1)
                        best_c = min(best_c, time.perf_counter() - t0)
                        buf = np.empty(len(data), np.uint8)
                        with ferry.CompressedFile(dst) as f:
                            f.set("cz_threads", "1")
                            t0 = time.perf_counter()
                            f.pread_into(buf)
                            best_d = min(best_d, time.perf_counter() - t0)
                            f.set("cz_verify", "0")
                            t0 = time.perf_counter()
                            f.pread_into(buf)
                            best_dn = min(best_dn, time.perf_counter() - t0)
                        assert buf.tobytes() == data
                    mb = len(data) / 1e6
                    print("%-7s %-5s %6s %7.2f %12.0f %12.0f %16.0f" % (name, codec, chunk, len(data) / size,
                                                                       mb / best_c, mb / best_d, mb / best_dn),
                          flush=True)
    finally:
        for p in (src, dst):
            if os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    main()
