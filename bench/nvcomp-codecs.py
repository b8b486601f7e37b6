#!/usr/bin/env python3
"""Issue 26's open question: do nvCOMP's own formats (ANS, Bitcomp, GDeflate, Cascaded) win on
ferry's data where zstd and LZ4 (the codecs of ferry's compressed format, docs/FORMATS.md) do not?
In one process on the GPU: for uint16 tokens (a real tokenizer's ids where a file of them is given,
else Zipf ids) and bf16 and fp32 weights (normal, std 0.02), each algorithm at each chunk size it
takes, through nvCOMP's Python API (PyPI nvidia-nvcomp-cu13, beside the nvidia-libnvcomp-cu13 that
ferry loads): the ratio, the GPU's compression rate once, and its decompression rate (input and
output in device memory, median of --rounds, GB/s of output), the bytes compared with the input.
zstd and LZ4 run in the same table, so each row is judged against the codecs ferry has.

Prints "TABLE nvcomp-codecs name | figure | note" rows; exit 77 where there is no CUDA device or
no nvidia.nvcomp module (the reason printed).

  python3 bench/nvcomp-codecs.py [--mib 256] [--tokens FILE.u16] [--rounds 5]
"""
import argparse
import statistics
import sys
import time


def row(name, figure, note=""):
    print("TABLE nvcomp-codecs %s | %s | %s" % (name, figure, note), flush=True)


# (algorithm, options, chunk sizes): GDeflate's chunks are at most 64 KiB; Bitcomp and Cascaded get
# the data's type (their models are per element); ANS runs on bytes and, for 16-bit data, on 16-bit
# symbols; the others on bytes.
def configs(kind):
    elem = {"tokens": "<u2", "bf16": "<u2", "fp32": "<f4"}[kind]
    out = [("Zstd", {}, ["64k", "256k", "1m"]),
           ("LZ4", {}, ["64k", "256k", "1m"]),
           ("GDeflate", {"algorithm_type": 1}, ["64k"]),
           ("GDeflate", {"algorithm_type": 4}, ["64k"]),
           ("ANS", {"data_type": "|u1"}, ["64k", "256k", "1m"]),
           ("Bitcomp", {"data_type": elem}, ["64k", "256k", "1m"]),
           ("Cascaded", {"data_type": "<u2" if kind != "fp32" else "<u4"}, ["64k"])]
    if kind != "tokens":
        out.insert(5, ("ANS", {"data_type": "<f2" if kind == "bf16" else "<f4"}, ["64k", "256k", "1m"]))
    return out


def size_of(s):
    return int(s[:-1]) << (10 if s.endswith("k") else 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="bytes of each data set")
    ap.add_argument("--tokens", default="", help="a file of uint16 token ids (bench/cz-tokens.py's)")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        from nvidia import nvcomp
    except Exception as e:  # noqa: BLE001 (any reason is the skip's reason)
        print("skipped: %s" % e, flush=True)
        row("setup", "skipped", str(e))
        return 77
    import numpy as np
    n = a.mib << 20
    gen = torch.Generator(device="cuda").manual_seed(26)
    sets = {}
    if a.tokens:
        t = np.fromfile(a.tokens, dtype=np.uint16)
        t = np.resize(t, n // 2)  # repeated where shorter
        sets["tokens"] = torch.from_numpy(t.view(np.int16)).cuda()
        src = "real tokenizer ids from %s" % a.tokens
    else:
        rng = np.random.default_rng(26)
        sets["tokens"] = torch.from_numpy((rng.zipf(1.3, size=n // 2) % 50257).astype(np.uint16).view(np.int16)).cuda()
        src = "Zipf ids (no --tokens file)"
    sets["bf16"] = (torch.randn(n // 2, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    sets["fp32"] = torch.randn(n // 4, generator=gen, device="cuda") * 0.02
    row("setup", "%d MiB a data set" % a.mib, "tokens: %s; bf16 and fp32: normal, std 0.02; nvCOMP %s, %s"
        % (src, nvcomp.__version__, torch.cuda.get_device_name()))
    for kind, x in sets.items():
        raw = x.view(torch.uint8).reshape(-1)
        for alg, opts, chunks in configs(kind):
            for ch in chunks:
                name = "%s %s%s %s" % (kind, alg, "".join(" %s=%s" % kv for kv in opts.items()), ch)
                try:
                    codec = nvcomp.Codec(algorithm=alg, uncomp_chunk_size=size_of(ch), **opts)
                    arr = nvcomp.as_array(raw)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    comp = codec.encode(arr)
                    torch.cuda.synchronize()
                    tc = time.perf_counter() - t0
                    csize = comp.buffer_size
                    cfg = codec.decompression_config(comp)
                    out = torch.empty_like(raw)
                    times = []
                    for _ in range(a.rounds):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        codec.decode(comp, out=out, decompression_config=cfg)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t0)
                    same = bool(torch.equal(out, raw))
                except Exception as e:  # noqa: BLE001 (a refused configuration is a row, not a stop)
                    row(name, "refused", str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
                    continue
                td = statistics.median(times)
                row(name, "ratio %.3f; decode %.1f GB/s" % (n / csize, n / td / 1e9),
                    "encode %.1f GB/s (once); decode median of %d; bytes %s"
                    % (n / tc / 1e9, a.rounds, "the same" if same else "DIFFERENT"))
                if not same:
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
