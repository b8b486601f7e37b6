#!/usr/bin/env python3
"""Issue 23's throughput rows on a machine without network or nginx: a file in /dev/shm served over
127.0.0.1 by a small HTTP range server started here (--procs processes on one SO_REUSEPORT port,
threads each, bodies sent with os.sendfile; HEAD, single-range GET, ETag, If-Match), then read whole
  - by curl with N parallel ranged GETs to /dev/null (the loopback ceiling: the server's own rate),
  - by ferry (ferry.read of the http:// URL, into GPU memory, and into host memory), over a few
    remote_connections / threads settings,
  - by kvikio's RemoteFile.open_http into GPU memory over a few thread counts,
each after an untimed read, the median of --rounds; process CPU seconds per GB (user+sys of this
process; the server's processes are not counted). Prints "TABLE name | figure | note" rows and one
JSON line per measurement. Without CUDA (or with --cpu) only the host rows run: the GPU rows say
skipped. Keep it under a minute: --size 1g by default.

  python3 bench/remote-read.py --size 1g [--cpu] [--procs 8]
"""
import argparse
import http.server
import json
import multiprocessing
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(s):
    return int(s[:-1]) * UNITS[s[-1].lower()] if s[-1].lower() in UNITS else int(s)


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------------ the range server

def serve(path, sock_fd, etag):
    """One server process: threads on the shared listening socket, ranged bodies by sendfile."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _head(self, status, length, extra=()):
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()

        def do_HEAD(self):
            self._head(200, size)

        def do_GET(self):
            im = self.headers.get("If-Match")
            if im and im != etag:
                self._head(412, 0)
                return
            a, b = 0, size - 1
            rng = self.headers.get("Range")
            status, extra = 200, ()
            if rng and rng.startswith("bytes="):
                lo, _, hi = rng[6:].partition("-")
                a, b = int(lo), min(int(hi) if hi else size - 1, size - 1)
                status, extra = 206, (("Content-Range", "bytes %d-%d/%d" % (a, b, size)),)
            n = b - a + 1
            self._head(status, n, extra)
            self.wfile.flush()
            out = self.connection.fileno()
            off = a
            while n > 0:
                k = os.sendfile(out, fd, off, min(n, 1 << 30))
                if k <= 0:
                    break
                off += k
                n -= k

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

        def server_bind(self):
            pass

        def server_activate(self):
            pass

    srv = Server(("127.0.0.1", 0), Handler, bind_and_activate=False)
    srv.socket = socket.socket(fileno=sock_fd)
    srv.serve_forever()


def start_server(path, procs):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(512)
    port = s.getsockname()[1]
    st = os.stat(path)
    etag = '"%x-%x"' % (st.st_ino, st.st_mtime_ns)
    ctx = multiprocessing.get_context("fork")
    ps = [ctx.Process(target=serve, args=(path, s.fileno(), etag), daemon=True) for _ in range(procs)]
    for p in ps:
        p.start()
    return "http://127.0.0.1:%d/bucket/object.bin" % port, ps, s


# ------------------------------------------------------------------------------------ the readers

def timed(fn, size, rounds):
    fn()  # untimed: connections, threads, buffers
    ts, cs = [], []
    for _ in range(rounds):
        c0, t0 = cpu_s(), time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(cpu_s() - c0)
    t = statistics.median(ts)
    return {"gbps": size / t / 1e9, "cpu_s_per_gb": statistics.median(cs) / (size / 1e9), "seconds": t}


def curl_ceiling(url, size, conns, rounds):
    curl = shutil.which("curl")
    if not curl:
        return None
    part = -(-size // conns)
    args = [curl, "-s", "--parallel", "--parallel-immediate", "--parallel-max", str(conns)]
    for i in range(conns):
        a, b = i * part, min(size, (i + 1) * part) - 1
        if a <= b:
            args += ["-r", "%d-%d" % (a, b), "-o", "/dev/null", url]

    def run():
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = timed(run, size, rounds)
    r["cpu_s_per_gb"] = None  # curl's CPU is not this process's
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default=os.environ.get("REMOTE_SIZE", "1g"))
    ap.add_argument("--file", default=os.path.join(os.environ.get("SHM_DIR", "/dev/shm"), "ferry-remote-read.dat"))
    ap.add_argument("--procs", type=int, default=int(os.environ.get("REMOTE_SERVER_PROCS", "8")))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", default="16,32,64", help="curl ceiling and ferry remote_connections")
    ap.add_argument("--kvikio-threads", default="16,32,64")
    ap.add_argument("--cpu", action="store_true", help="host-memory rows only (no GPU)")
    a = ap.parse_args()
    size = parse_size(a.size)
    conns = [int(x) for x in a.conns.split(",")]

    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        with open(a.file, "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
            f.write(chunk[: size & ((1 << 20) - 1)])
    url, procs, lsock = start_server(a.file, a.procs)
    rows, gpu_rows = [], []

    def row(name, figure, note=""):
        print("TABLE remote-read %s | %s | %s" % (name, figure, note), flush=True)

    def report(name, r, note=""):
        print(json.dumps(dict(name=name, **r)), flush=True)
        cpu = "" if r.get("cpu_s_per_gb") is None else ", %.2f CPU s/GB" % r["cpu_s_per_gb"]
        row(name, "%.2f GB/s%s" % (r["gbps"], cpu), note)

    try:
        import ferry
        import torch
        cuda = not a.cpu and torch.cuda.is_available()
        try:
            ferry.open(url).close()
        except Exception as e:  # noqa: BLE001
            row("all", "skipped", "ferry cannot open a URL here: %s" % str(e)[:200])
            return 77
        ceiling = None
        for c in conns:
            r = curl_ceiling(url, size, c, a.rounds)
            if r is None:
                row("ceiling", "skipped", "no curl on PATH")
                break
            report("ceiling curl x%d to /dev/null" % c, r, "%d server processes, %s object" % (a.procs, a.size))
            ceiling = max(ceiling or 0, r["gbps"])
        host = torch.empty(size, dtype=torch.uint8)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda") if cuda else None
        best = {}
        for c in conns:
            for target, buf in (("host", host), ("gpu", dev)):
                if buf is None:
                    continue
                # device reads go through the workers, one GET per chunk at a time each: threads x
                # chunk_size in flight, and a worker needs no more than 2 pinned slots (pinned host
                # memory: threads x 2 x 8 MiB, 1 GiB at 64 threads; host reads use the caller's buffer)
                ctx = ferry.Context(remote_connections=c, remote_part_size="8m", threads=min(c, 64),
                                    chunk_size="8m", slots=2)
                f = ferry.open(url, context=ctx)

                def run(f=f, buf=buf):
                    n = f.pread_into(buf, 0)
                    assert n == size, (n, size)
                    if buf.is_cuda:
                        torch.cuda.synchronize()
                try:
                    r = timed(run, size, a.rounds)
                except Exception as e:  # noqa: BLE001
                    row("ferry %s x%d" % (target, c), "FAILED", str(e)[:200])
                    continue
                finally:
                    f.close()
                report("ferry %s remote_connections=%d" % (target, c), r,
                       "threads=%d chunk_size=8m slots=2: %d MiB pinned" % (min(c, 64), min(c, 64) * 16)
                       if target == "gpu" else "into the caller's buffer, no staging memory")
                if r["gbps"] > best.get(target, {"gbps": 0})["gbps"]:
                    best[target] = r
        kv = None
        if cuda:
            try:
                import kvikio
                import kvikio.defaults
                for t in [int(x) for x in a.kvikio_threads.split(",")]:
                    try:
                        kvikio.defaults.set({"num_threads": t})
                    except Exception:  # noqa: BLE001 (older kvikio)
                        kvikio.defaults.num_threads_reset(t)
                    rf = kvikio.RemoteFile.open_http(url)

                    def run(rf=rf):
                        n = rf.read(dev)
                        assert n == size, (n, size)
                        torch.cuda.synchronize()
                    r = timed(run, size, a.rounds)
                    rf.close()
                    report("kvikio RemoteFile gpu threads=%d" % t, r)
                    if kv is None or r["gbps"] > kv["gbps"]:
                        kv = r
            except Exception as e:  # noqa: BLE001
                row("kvikio RemoteFile gpu", "skipped", "kvikio not usable: %s" % str(e)[:160])
        else:
            row("ferry gpu / kvikio gpu", "skipped", "no CUDA device (--cpu or torch sees none)")
        # the targets, judged in this run
        for target in ("gpu", "host"):
            b = best.get(target)
            if b and ceiling:
                ratio = b["gbps"] / ceiling
                row("ferry %s vs ceiling" % target, "%.2fx" % ratio,
                    "target 0.9x: %s" % ("met" if ratio >= 0.9 else "not met"))
        b = best.get("gpu")
        if b and kv:
            met = b["gbps"] >= kv["gbps"] and b["cpu_s_per_gb"] <= kv["cpu_s_per_gb"] / 2
            row("ferry gpu vs kvikio best", "%.2fx rate, %.2fx CPU s/GB" % (b["gbps"] / kv["gbps"],
                                                                            b["cpu_s_per_gb"] / kv["cpu_s_per_gb"]),
                "target >=1x at <=0.5x CPU: %s" % ("met" if met else "not met"))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
        lsock.close()
        if not os.environ.get("REMOTE_KEEP_FILE"):
            os.unlink(a.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
