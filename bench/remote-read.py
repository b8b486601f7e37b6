#!/usr/bin/env python3
"""Issue 23's throughput rows: nginx from Debian (tests/python/_nginx.py: installed, or unpacked
from .deb/nginx) serving /dev/shm on 127.0.0.1, path-style s3://bucket/KEY, and in one run:
  - the ceiling: curl with N parallel ranged GETs of the plain object to /dev/null (the server's
    own rate, measured beside the readers);
  - the plain object (--size bytes) read whole by ferry into GPU memory and into host memory (a few
    threads / chunk / part settings), kvikio's RemoteFile into GPU memory (a few thread counts), and
    boto3's download_fileobj into memory plus a copy to the device;
  - a safetensors file of the same size: ferry.safetensors.load_file of its s3:// URL,
    runai-model-streamer's S3 path (AWS_ENDPOINT_URL at nginx) and tensorizer's HTTP path on a
    file it serialised from the same tensors.
Each reader runs once untimed, then the median of --rounds (--slow-rounds for boto3, runai,
tensorizer); CPU seconds per GB are this process's and its children's (curl, tensorizer's curl
readers), not nginx's. Prints "TABLE remote-read NAME | FIGURE | NOTE" rows (the issue's targets
judged at the end) and one JSON line per measurement. Without CUDA (or with --cpu) the same readers
run into host memory and the GPU targets say skipped.

  python3 bench/remote-read.py --size 4g            (the device: bench/remote-read.sh)
  python3 bench/remote-read.py --size 256m --cpu    (anywhere)
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import _nginx  # noqa: E402

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
BUCKET = "bucket"


def parse_size(s):
    return int(s[:-1]) * UNITS[s[-1].lower()] if s[-1].lower() in UNITS else int(s)


def cpu_s():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def row(name, figure, note=""):
    print("TABLE remote-read %s | %s | %s" % (name, figure, note), flush=True)


def timed(fn, size, rounds):
    fn()  # untimed: connections, threads, buffers
    ts, cs = [], []
    for _ in range(rounds):
        c0, t0 = cpu_s(), time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(cpu_s() - c0)
    t = statistics.median(ts)
    return {"gbps": size / t / 1e9, "cpu_s_per_gb": statistics.median(cs) / (size / 1e9), "seconds": t,
            "spread": (max(ts) - min(ts)) / t}


def report(name, r, note=""):
    print(json.dumps(dict(name=name, note=note, **r)), flush=True)
    row(name, "%.2f GB/s, %.3f CPU s/GB" % (r["gbps"], r["cpu_s_per_gb"]), note)


def make_files(d, size):
    """The plain object and a safetensors file of the same size (bf16 tensors of 4096 columns,
    64 of them), from one random MiB repeated: nothing here compresses."""
    os.makedirs(d, exist_ok=True)
    chunk = os.urandom(1 << 20)
    plain = os.path.join(d, "object.bin")
    if not os.path.exists(plain) or os.path.getsize(plain) != size:
        with open(plain, "wb") as f:
            for _ in range(size >> 20):
                f.write(chunk)
            f.write(chunk[: size & ((1 << 20) - 1)])
    st = os.path.join(d, "model.safetensors")
    n = 64
    rows = max(1, size // n // (4096 * 2))
    per = rows * 4096 * 2
    header, off = {}, 0
    for i in range(n):
        header["layer.%02d.weight" % i] = {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [off, off + per]}
        off += per
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    if not os.path.exists(st) or os.path.getsize(st) != 8 + len(h) + off:
        with open(st, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            left = off
            while left:
                k = min(left, len(chunk))
                f.write(chunk[:k])
                left -= k
    return plain, st, off


def curl_ceiling(url, size, conns, rounds):
    """conns ranged GETs at once to /dev/null, spread over one curl process per core (one curl
    --parallel is a single thread: on the GPU machine it measured curl, 3.7-4.8 GB/s, not the
    server). The time includes the processes' start, a few ms."""
    curl = shutil.which("curl")
    if not curl:
        return None
    part = -(-size // conns)
    procs = max(1, min(conns, os.cpu_count() or 1))
    argv = [[curl, "-s", "--parallel", "--parallel-immediate", "--parallel-max", str(conns)] for _ in range(procs)]
    for i in range(conns):
        a, b = i * part, min(size, (i + 1) * part) - 1
        if a <= b:
            argv[i % procs] += ["-r", "%d-%d" % (a, b), "-o", "/dev/null", url]

    def run():
        ps = [subprocess.Popen(x, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for x in argv if len(x) > 6]
        rcs = [p.wait() for p in ps]
        assert not any(rcs), rcs
    r = timed(run, size, rounds)
    r["curl_processes"] = procs
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default=os.environ.get("REMOTE_SIZE", "4g"))
    ap.add_argument("--dir", default=os.path.join(os.environ.get("SHM_DIR", "/dev/shm"), "ferry-remote-read"))
    ap.add_argument("--workers", type=int, default=int(os.environ.get("REMOTE_SERVER_PROCS", "8")),
                    help="nginx worker processes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slow-rounds", type=int, default=2, help="rounds of boto3, runai and tensorizer")
    ap.add_argument("--conns", default=os.environ.get("REMOTE_CONNS", "16,32,64"),
                    help="curl's parallel GETs; kvikio's threads; ferry's threads at one GET each")
    ap.add_argument("--cpu", action="store_true", help="into host memory only (no GPU)")
    ap.add_argument("--skip", default=os.environ.get("REMOTE_SKIP", ""), help="readers to leave out: "
                    "ferry-host,ferry-gpu,kvikio,boto3,runai,tensorizer,safetensors")
    a = ap.parse_args()
    size = parse_size(a.size)
    conns = [int(x) for x in a.conns.split(",")]
    skip = set(a.skip.split(",")) - {""}
    www = os.path.join(a.dir, "www")
    plain, st_path, st_bytes = make_files(os.path.join(www, BUCKET), size)
    try:
        srv = _nginx.Nginx(www, os.path.join(a.dir, "nginx"), workers=a.workers)
    except (FileNotFoundError, RuntimeError) as e:
        row("all", "skipped", str(e)[:200])
        return 77
    url = srv.url + "/%s/object.bin" % BUCKET
    st_url = "s3://%s/model.safetensors" % BUCKET
    os.environ.update(AWS_ENDPOINT_URL=srv.url, AWS_ACCESS_KEY_ID="nginx-ignores-it",
                      AWS_SECRET_ACCESS_KEY="nginx-ignores-it", AWS_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true", RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
    for v in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(v, None)
    best = {}  # reader -> best result by rate

    def keep(key, r):
        if r["gbps"] > best.get(key, {"gbps": 0})["gbps"]:
            best[key] = r

    try:
        import ferry
        import torch
        cuda = not a.cpu and torch.cuda.is_available()
        dev = "cuda" if cuda else "cpu"
        row("setup", "nginx %s, %d workers" % (srv.url, a.workers),
            "%s object and a %s-byte safetensors file in %s; into %s" % (a.size, st_bytes, www,
                                                                        "GPU memory" if cuda else "host memory"))
        try:
            ferry.open(url).close()
        except Exception as e:  # noqa: BLE001
            row("all", "skipped", "ferry cannot open a URL here: %s" % str(e)[:200])
            return 77

        # ------------------------------------------------------------------ the ceiling: curl
        for c in conns:
            r = curl_ceiling(url, size, c, a.rounds)
            if r is None:
                row("ceiling", "skipped", "no curl on PATH")
                break
            report("ceiling curl x%d to /dev/null" % c, r,
                   "the server's own rate: %d curl processes; their CPU" % r["curl_processes"])
            keep("ceiling", r)

        # ------------------------------------------------------------------ ferry, the plain object
        # (threads, chunk, part): one GET a worker at a time (a thread per connection, as kvikio),
        # then fewer threads each running several GETs of a chunk on its own multi handle.
        # Pinned staging for GPU reads: threads x slots (2) x chunk.
        configs = [(c, 8 << 20, 8 << 20) for c in conns] + [(8, 32 << 20, 4 << 20), (16, 16 << 20, 4 << 20)]
        host = torch.empty(size, dtype=torch.uint8)
        gbuf = torch.empty(size, dtype=torch.uint8, device="cuda") if cuda else None
        for target, buf in (("gpu", gbuf), ("host", host)):
            if buf is None or "ferry-" + target in skip:
                continue
            # into host memory also as one chunk: the caller's thread alone running 16 GETs of 8 MiB
            # on one multi handle (how every host read ran before they went to the workers)
            extra = [(1, 1 << 30, 8 << 20)] if target == "host" and size <= 1 << 30 else []
            for th, chunk, part in configs + extra:
                ctx = ferry.Context(threads=th, chunk_size=chunk, remote_part_size=part,
                                    remote_connections=min(16, max(1, chunk // part)), slots=2)
                f = ferry.open(url, context=ctx)

                def run(f=f, buf=buf):
                    n = f.pread_into(buf, 0)
                    assert n == size, (n, size)
                    if buf.is_cuda:
                        torch.cuda.synchronize()
                try:
                    r = timed(run, size, a.rounds)
                except Exception as e:  # noqa: BLE001
                    row("ferry %s threads=%d" % (target, th), "FAILED", str(e)[:200])
                    continue
                finally:
                    f.close()
                gets = th * min(16, max(1, chunk // part))
                mem = th * 2 * chunk if target == "gpu" else 0
                r.update(threads=th, chunk=chunk, part=part, gets_in_flight=gets, staging_bytes=mem)
                report("ferry %s %s chunk=%dm part=%dm" % (target, "threads=%d" % th if th > 1 or chunk < 1 << 30
                                                          else "in the caller's thread", chunk >> 20, part >> 20), r,
                       "%d GETs in flight; %s" % (gets, "%d MiB pinned staging" % (mem >> 20) if mem
                                                  else "straight into the caller's buffer"))
                keep("ferry-" + target, r)
                best.setdefault("ferry-" + target + "-all", []).append(r)

        # ------------------------------------------------------------------ kvikio RemoteFile
        if cuda and "kvikio" not in skip:
            try:
                import kvikio
                import kvikio.defaults
                for t in conns:
                    try:
                        kvikio.defaults.set({"num_threads": t})
                    except Exception:  # noqa: BLE001 (older kvikio)
                        kvikio.defaults.num_threads_reset(t)
                    rf = kvikio.RemoteFile.open_http(url)

                    def run(rf=rf):
                        n = rf.read(gbuf)
                        assert n == size, (n, size)
                        torch.cuda.synchronize()
                    r = timed(run, size, a.rounds)
                    rf.close()
                    report("kvikio RemoteFile gpu threads=%d" % t, r)
                    keep("kvikio", r)
            except Exception as e:  # noqa: BLE001
                row("kvikio RemoteFile gpu", "skipped", "kvikio not usable: %s" % str(e)[:160])
        elif not cuda:
            row("kvikio RemoteFile gpu", "skipped", "no CUDA device (--cpu or torch sees none)")

        # ------------------------------------------------------------------ boto3 + a copy
        if "boto3" not in skip:
            try:
                import io
                import boto3
                from boto3.s3.transfer import TransferConfig
                from botocore.config import Config
                s3 = boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1",
                                  config=Config(s3={"addressing_style": "path"}, max_pool_connections=64))
                for c in (16, 64):
                    cfg = TransferConfig(max_concurrency=c, multipart_chunksize=8 << 20)
                    sink = None if cuda else bytearray(size)

                    def run(cfg=cfg, sink=sink):
                        bio = io.BytesIO()
                        s3.download_fileobj(BUCKET, "object.bin", bio, Config=cfg)
                        view = bio.getbuffer()
                        assert len(view) == size
                        t = torch.frombuffer(view, dtype=torch.uint8)
                        if cuda:
                            gbuf.copy_(t)
                            torch.cuda.synchronize()
                        else:
                            memoryview(sink)[:] = view
                        del t, view
                    r = timed(run, size, a.slow_rounds)
                    report("boto3 download_fileobj + copy max_concurrency=%d" % c, r, "into a BytesIO, then to %s" % dev)
                    keep("boto3", r)
            except Exception as e:  # noqa: BLE001
                row("boto3", "skipped", "boto3 not usable: %s" % str(e)[:160])

        # ------------------------------------------------------------------ the safetensors file
        nbytes = os.path.getsize(st_path)
        if "safetensors" not in skip:
            import ferry.safetensors as fst
            ctx = ferry.Context(threads=16, chunk_size=16 << 20, remote_part_size=4 << 20, remote_connections=4, slots=2)

            def run():
                t = fst.load_file(st_url, device=dev, context=ctx)
                if cuda:
                    torch.cuda.synchronize()
                assert len(t) == 64
            try:
                r = timed(run, nbytes, a.rounds)
                report("ferry safetensors.load_file s3://", r, "threads=16 chunk=16m part=4m, to %s" % dev)
                keep("ferry-st", r)
            except Exception as e:  # noqa: BLE001
                row("ferry safetensors.load_file s3://", "FAILED", str(e)[:200])
        if "runai" not in skip:
            try:
                from runai_model_streamer import SafetensorsStreamer
                for c in (16, 64):
                    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(c)

                    def run():
                        n = 0
                        with SafetensorsStreamer() as s:
                            s.stream_file(st_url, device=dev)
                            for _, t in s.get_tensors():
                                t = t.to(dev)
                                n += 1
                        if cuda:
                            torch.cuda.synchronize()
                        assert n == 64, n
                    r = timed(run, nbytes, a.slow_rounds)
                    report("runai-model-streamer s3:// concurrency=%d" % c, r,
                           "RUNAI_STREAMER_MEMORY_LIMIT unset: its buffer is the file's size")
                    keep("runai", r)
            except Exception as e:  # noqa: BLE001
                row("runai-model-streamer", "skipped", "not usable: %s" % str(e)[:160])
        if "tensorizer" not in skip:
            try:
                from tensorizer import TensorDeserializer, TensorSerializer
                tz = os.path.join(www, BUCKET, "model.tensors")
                if not os.path.exists(tz):
                    from safetensors.torch import load_file
                    ser = TensorSerializer(tz)
                    ser.write_state_dict(load_file(st_path))
                    ser.close()
                tz_url = srv.url + "/%s/model.tensors" % BUCKET
                for c in (8, 32):
                    def run(c=c):
                        d = TensorDeserializer(tz_url, device=dev, num_readers=c, lazy_load=False)
                        assert len(d) == 64, len(d)
                        if cuda:
                            torch.cuda.synchronize()
                        d.close()
                    r = timed(run, nbytes, a.slow_rounds)
                    report("tensorizer http:// num_readers=%d" % c, r, "a file it serialised from the same tensors")
                    keep("tensorizer", r)
            except Exception as e:  # noqa: BLE001
                row("tensorizer", "skipped", "not usable: %s" % str(e)[:160])

        # ------------------------------------------------------------------ the targets
        ceil = best.get("ceiling")
        for target in ("gpu", "host"):
            b = best.get("ferry-" + target)
            if b and ceil:
                ratio = b["gbps"] / ceil["gbps"]
                row("target ferry %s vs ceiling" % target, "%.2fx" % ratio,
                    "%.2f of %.2f GB/s; target 0.9x: %s" % (b["gbps"], ceil["gbps"], "met" if ratio >= 0.9 else "not met"))
        kv = best.get("kvikio")
        if kv:
            fast = [r for r in best.get("ferry-gpu-all", []) if r["gbps"] >= kv["gbps"]]
            pick = min(fast, key=lambda r: r["cpu_s_per_gb"]) if fast else best.get("ferry-gpu")
            if pick:
                met = bool(fast) and pick["cpu_s_per_gb"] <= kv["cpu_s_per_gb"] / 2
                row("target ferry gpu vs kvikio best", "%.2fx rate, %.2fx CPU s/GB" % (
                    pick["gbps"] / kv["gbps"], pick["cpu_s_per_gb"] / kv["cpu_s_per_gb"]),
                    "threads=%d chunk=%dm part=%dm against kvikio's %.2f GB/s at %.3f CPU s/GB; target >=1x at "
                    "<=0.5x CPU: %s" % (pick["threads"], pick["chunk"] >> 20, pick["part"] >> 20, kv["gbps"],
                                        kv["cpu_s_per_gb"], "met" if met else "not met"))
        else:
            row("target ferry gpu vs kvikio best", "skipped", "no kvikio figure in this run")
        fs = best.get("ferry-st")
        for peer in ("runai", "tensorizer"):
            p = best.get(peer)
            if fs and p:
                ratio = fs["gbps"] / p["gbps"]
                alt = ceil and fs["gbps"] >= 0.9 * ceil["gbps"]
                row("target ferry safetensors vs %s" % peer, "%.2fx" % ratio, "%.2f vs %.2f GB/s; target 1.5x "
                    "(or 0.9x the ceiling): %s" % (fs["gbps"], p["gbps"], "met" if ratio >= 1.5 or alt else "not met"))
            else:
                row("target ferry safetensors vs %s" % peer, "skipped", "no figure for one of them in this run")
        b = best.get("ferry-gpu")
        if b:
            row("ferry host memory", "%d MiB" % (b["staging_bytes"] >> 20),
                "pinned staging of the fastest GPU setting (threads x 2 slots x chunk), set by the knobs whatever "
                "the object's size; host reads stage nothing")
        if best.get("boto3") and b:
            row("ferry gpu vs boto3", "%.2fx" % (b["gbps"] / best["boto3"]["gbps"]), "for scale")
        if best.get("boto3") and best.get("ferry-host"):
            row("ferry host vs boto3", "%.2fx" % (best["ferry-host"]["gbps"] / best["boto3"]["gbps"]), "for scale")
    finally:
        srv.stop()
        if not os.environ.get("REMOTE_KEEP_FILE"):
            shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
