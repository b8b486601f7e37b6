"""Compressed files on the CPU (issue 26, docs/PERFORMANCE.md "Compressed files"): ratio and one
thread's compress and decompress rates for zstd and LZ4 at chunk sizes 256 KiB, 1 MiB and 4 MiB,
on token data and on bf16 weights. What chose the cz_chunk default (docs/CONFIG.md).

  PYTHONPATH=<ferry> python bench/cz-codecs.py [--mib 64] [--dir /dev/shm] [--reps 3]

Token data: English text from the Python installation's own documentation (pydoc_data/topics.py,
the license texts), split into words and punctuation, each numbered by its frequency rank (as a
BPE tokenizer's ids are roughly), as uint16; new documents of 4096 tokens are generated from it by
random walks over its bigrams (the corpus repeated would let zstd find the repeats). bf16: torch.randn * 0.02 rounded to bfloat16 (the
distribution of initialised weights). Each figure is the best of --reps; rates count
uncompressed bytes. The files live in --dir (tmpfs by default), so storage is not measured.
"""
import argparse
import collections
import os
import re
import sys
import sysconfig
import time

import numpy as np

import ferry


def token_data(nbytes):
    lib = sysconfig.get_paths()["stdlib"]
    text = ""
    for p in ("pydoc_data/topics.py", "../../share/common-licenses/GPL-3", "LICENSE.txt"):
        q = os.path.normpath(os.path.join(lib, p))
        if os.path.exists(q):
            text += open(q, encoding="utf-8", errors="replace").read()
    if not text:
        sys.exit("no text found under %s (pydoc_data/topics.py)" % lib)
    words = re.findall(r"\w+|[^\w\s]|\s+", text)
    rank = {w: i for i, (w, _) in enumerate(collections.Counter(words).most_common(65535))}
    ids = np.array([rank.get(w, 65535) for w in words], dtype=np.int64)
    # New text, not the corpus repeated (a compressor would find the repeats): documents of 4096
    # tokens, each a random walk over the corpus's bigrams, so the words and their order have the
    # corpus's statistics without long verbatim copies.
    order = np.argsort(ids[:-1], kind="stable")
    succ = ids[1:][order]
    start = np.searchsorted(ids[:-1][order], np.arange(ids.max() + 2))
    count = start[1:] - start[:-1]
    rng = np.random.default_rng(0)
    n = nbytes // 2
    docs, steps = max(1, n // 4096), 4096
    cur = rng.choice(ids[:-1], size=docs)
    out = np.empty((steps, docs), dtype=np.uint16)
    for t in range(steps):
        out[t] = cur
        c = count[cur]
        nxt = succ[start[cur] + (rng.random(docs) * np.maximum(c, 1)).astype(np.int64)]
        cur = np.where(c > 0, nxt, rng.choice(ids[:-1], size=docs))
    return np.resize(out.T.reshape(-1), n).tobytes(), len(words), len(rank)


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
    a = ap.parse_args()
    nbytes = a.mib << 20
    tokens, nwords, vocab = token_data(nbytes)
    sets = {"tokens": tokens, "bf16": bf16_data(nbytes)}
    print("token data: %d words of text, %d distinct, repeated to %d MiB" % (nwords, vocab, a.mib))
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
