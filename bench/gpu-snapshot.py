#!/usr/bin/env python3
"""GPU process snapshots at N GiB of GPU memory (issue 27): a torch process holds N GiB of CUDA
tensors; `ferry snapshot PID --gpu-only` suspends it (driver: lock + checkpoint, device memory to
host) and resumes it (restore + unlock), and the process checks that its tensors are bit-identical
to what it wrote (regenerated chunk by chunk from their seeds, on the GPU). Beside it, the same
process writes and reads the same N GiB through ferry.checkpoint.save/load (from and into GPU
memory) to --shm (/dev/shm), the issue's comparison. CRIU (the process image) is tried at sizes up
to --criu-max-gib only; where `ferry snapshot PID DIR` is refused its row says so with the error.

    python3 bench/gpu-snapshot.py --ferry build/ferry [--sizes 1,10,40] [--shm /dev/shm]
        [--criu-max-gib 1] [--img-dir DIR]

Prints `TABLE name | result | figure` rows (scripts/gpu-check.sh makes them its table's rows) and a
JSON line. Exit 0 when every size ran and every check matched, 1 when one failed, 77 without CUDA.
The worker talks through files in its directory (CRIU restores a process with no pipe to us)."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CHUNK = 1 << 28  # float32 elements per seeded chunk: 1 GiB


def worker(d, gib):
    """Holds gib GiB of CUDA float32, chunk c filled by torch.rand under seed c; runs the commands
    the driver writes as d/cmd-K (K = 1, 2, ...), answering d/res-K (JSON)."""
    import torch
    import ferry.checkpoint

    n = int(gib * (1 << 30)) // 4
    dev = torch.device(os.environ.get("SNAP_DEVICE", "cuda"))  # cpu: to try the worker without a GPU
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator(device=dev)

    def fill(t):
        for c, a in enumerate(range(0, n, CHUNK)):
            g.manual_seed(1000 + c)
            t[a:a + CHUNK].copy_(torch.rand(min(CHUNK, n - a), device=dev, generator=g))

    def same(t):
        for c, a in enumerate(range(0, n, CHUNK)):
            g.manual_seed(1000 + c)
            want = torch.rand(min(CHUNK, n - a), device=dev, generator=g)
            # bit-identical: compare the words, not the floats
            if not torch.equal(t[a:a + CHUNK].view(torch.int32), want.view(torch.int32)):
                return False
        return True

    state = {"x": torch.empty(n, dtype=torch.float32, device=dev)}
    fill(state["x"])
    sync()
    answer(d, 0, {"pid": os.getpid(), "bytes": n * 4,
                  "allocated": torch.cuda.memory_allocated() if dev.type == "cuda" else n * 4})
    k = 1
    while True:
        p = os.path.join(d, "cmd-%d" % k)
        if not os.path.exists(p):
            time.sleep(0.01)
            continue
        with open(p) as f:
            cmd = f.read().split()
        res = {}
        try:
            t0 = time.perf_counter()
            if cmd[0] == "verify":
                res["same"] = same(state["x"])
            elif cmd[0] == "save":
                ferry.checkpoint.save(state, cmd[1], 0, checksum=False)
                sync()
            elif cmd[0] == "load":
                # the tensor goes first: at 40 GiB two copies do not fit an 80 GB GPU
                state.clear()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                t0 = time.perf_counter()
                state = dict(ferry.checkpoint.load(cmd[1], 0, device=dev.type, verify=False))
                sync()
                res["seconds"] = time.perf_counter() - t0
                res["same"] = same(state["x"])
            elif cmd[0] == "poke":  # one bit flipped: the tests' proof that verify can fail
                state["x"].view(torch.int32)[n // 2] ^= 1
            elif cmd[0] == "quit":
                answer(d, k, {})
                return
            res.setdefault("seconds", time.perf_counter() - t0)
        except Exception as e:  # the driver reports it
            res["error"] = "%s: %s" % (type(e).__name__, e)
        answer(d, k, res)
        k += 1


def answer(d, k, res):
    p = os.path.join(d, "res-%d" % k)
    with open(p + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(p + ".tmp", p)


class Worker:
    def __init__(self, gib, root):
        self.d = tempfile.mkdtemp(prefix="w%g-" % gib, dir=root)
        self.log = open(os.path.join(self.d, "worker.log"), "w")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", self.d, str(gib)],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd="/tmp")
        self.k = 0
        self.pid = self.proc.pid
        self.restored = False  # by CRIU: no longer our child

    def wait(self, k, timeout):
        p = os.path.join(self.d, "res-%d" % k)
        t0 = time.time()
        while not os.path.exists(p):
            if time.time() - t0 > timeout:
                raise TimeoutError("no answer %d in %d s; worker log: %s" % (k, timeout, self.tail()))
            if not self.restored and self.proc.poll() is not None and not os.path.exists(p):
                raise RuntimeError("the worker ended (exit %s): %s" % (self.proc.returncode, self.tail()))
            time.sleep(0.02)
        with open(p) as f:
            return json.load(f)

    def ask(self, *cmd, timeout=600):
        self.k += 1
        p = os.path.join(self.d, "cmd-%d" % self.k)
        with open(p + ".tmp", "w") as f:
            f.write(" ".join(cmd))
        os.rename(p + ".tmp", p)
        return self.wait(self.k, timeout)

    def tail(self):
        try:
            with open(os.path.join(self.d, "worker.log")) as f:
                return " / ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def stop(self):
        if self.restored:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass
        elif self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.d, ignore_errors=True)


def table(name, result, figure=""):
    print("TABLE %s | %s | %s" % (name, result, str(figure).replace("|", "/").replace("\n", " ")), flush=True)


def free_gib(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / (1 << 30)


def one_size(gib, a, rows):
    ok = True
    w = Worker(gib, a.work)
    try:
        info = w.wait(0, 300)
        row = {"gib": gib, "bytes": info["bytes"], "allocated": info["allocated"]}
        # 1. the driver: suspend (lock + checkpoint), resume (restore + unlock)
        r = subprocess.run([a.ferry, "snapshot", str(w.pid), "--gpu-only"], capture_output=True, text=True,
                           timeout=900)
        out = (r.stdout + r.stderr).strip()
        m = re.search(r"suspended in ([0-9.]+) s.*resumed in ([0-9.]+) s", out)
        if r.returncode or not m:
            table("snapshot gpu-only %g GiB" % gib, "FAILED", out[:300])
            return False
        row["suspend_s"], row["resume_s"] = float(m.group(1)), float(m.group(2))
        v = w.ask("verify")
        row["same_after_resume"] = v.get("same")
        ok &= v.get("same") is True
        table("snapshot gpu-only %g GiB" % gib, "ok" if v.get("same") else "FAILED (tensors differ)",
              "suspend %.3f s (%.2f GB/s), resume %.3f s (%.2f GB/s); tensors %s after resume"
              % (row["suspend_s"], info["bytes"] / row["suspend_s"] / 1e9, row["resume_s"],
                 info["bytes"] / row["resume_s"] / 1e9, "bit-identical" if v.get("same") else "DIFFER"))
        # 2. CRIU, at small sizes only (the image is the whole process, GPU state included)
        if gib <= a.criu_max_gib:
            img = os.path.join(a.img_dir or w.d, "snap-%g" % gib)
            r = subprocess.run([a.ferry, "snapshot", str(w.pid), img], capture_output=True, text=True, timeout=900)
            out = (r.stdout + r.stderr).strip()
            if r.returncode:
                table("snapshot criu %g GiB" % gib, "REFUSED (skipped)", out[:400])
                row["criu"] = "refused: " + out[:400]
                v = w.ask("verify")  # ferry resumed the GPU: the process runs on
                ok &= v.get("same") is True
                if not v.get("same"):
                    table("snapshot criu %g GiB, after the refusal" % gib, "FAILED", "tensors differ")
            else:
                w.proc.wait(timeout=60)  # dumped: the process ended
                r2 = subprocess.run([a.ferry, "restore", img], capture_output=True, text=True, timeout=900)
                out2 = (r2.stdout + r2.stderr).strip()
                m1 = re.search(r"GPU suspended in ([0-9.]+) s, CRIU dump ([0-9.]+) s", out)
                m2 = re.search(r"CRIU restore ([0-9.]+) s, GPU resumed in ([0-9.]+) s", out2)
                if r2.returncode or not (m1 and m2):
                    table("snapshot criu %g GiB" % gib, "FAILED at restore", (out2 or out)[:400])
                    row["criu"] = "restore failed: " + out2[:400]
                    ok = False
                else:
                    w.restored = True
                    v = w.ask("verify")
                    ok &= v.get("same") is True
                    row["criu"] = {"suspend_s": float(m1.group(1)), "dump_s": float(m1.group(2)),
                                   "restore_s": float(m2.group(1)), "gpu_resume_s": float(m2.group(2)),
                                   "same": v.get("same")}
                    table("snapshot criu %g GiB" % gib, "ok" if v.get("same") else "FAILED (tensors differ)",
                          "GPU suspend %s s, dump %s s, CRIU restore %s s, GPU resume %s s"
                          % (m1.group(1), m1.group(2), m2.group(1), m2.group(2)))
                shutil.rmtree(img, ignore_errors=True)
        else:
            table("snapshot criu %g GiB" % gib, "skipped", "CRIU is tried up to --criu-max-gib %g" % a.criu_max_gib)
        # 3. ferry's checkpoint path, the same bytes, GPU memory to --shm and back
        if free_gib(a.shm) < gib * 1.05 + 1:
            table("snapshot ferry-ckpt %g GiB" % gib, "skipped", "%s has %.1f GiB free" % (a.shm, free_gib(a.shm)))
        else:
            ck = tempfile.mkdtemp(prefix="ferry-snap-ckpt-", dir=a.shm)
            try:
                s = w.ask("save", ck)
                l = w.ask("load", ck) if "error" not in s else {"error": "not run"}
            finally:
                shutil.rmtree(ck, ignore_errors=True)
            if "error" in s or "error" in l:
                table("snapshot ferry-ckpt %g GiB" % gib, "FAILED", s.get("error") or l.get("error"))
                ok = False
            else:
                row["ckpt_save_s"], row["ckpt_load_s"] = s["seconds"], l["seconds"]
                ok &= l.get("same") is True
                table("snapshot ferry-ckpt %g GiB" % gib, "ok" if l.get("same") else "FAILED (tensors differ)",
                      "save %.3f s, load %.3f s (GPU memory to %s and back, no checksums); suspend/save %.2fx, "
                      "resume/load %.2fx" % (s["seconds"], l["seconds"], a.shm, row["suspend_s"] / s["seconds"],
                                             row["resume_s"] / l["seconds"]))
        rows.append(row)
        w.ask("quit", timeout=30)
    except Exception as e:
        table("snapshot %g GiB" % gib, "FAILED", "%s: %s" % (type(e).__name__, e))
        ok = False
    finally:
        w.stop()
    return ok


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", required=True, help="the ferry CLI")
    ap.add_argument("--sizes", default="1,10,40", help="GiB of GPU memory, comma-separated")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--criu-max-gib", type=float, default=1.0)
    ap.add_argument("--img-dir", help="where CRIU images go (default: the worker's directory)")
    ap.add_argument("--work", default="/tmp")
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch.cuda.is_available() is False")
        total = torch.cuda.get_device_properties(0).total_memory / (1 << 30)
    except Exception as e:  # ImportError, or no driver
        print("skipped: torch with CUDA is not available: %s" % e)
        return 77
    doctor = subprocess.run([a.ferry, "doctor", "--no-color"], capture_output=True, text=True).stdout
    for line in doctor.splitlines():
        if "snapshot." in line:
            print("doctor:", line.strip())
    rows, ok = [], True
    for gib in [float(s) for s in a.sizes.split(",") if s]:
        if gib > total - 2:
            table("snapshot %g GiB" % gib, "skipped", "the GPU has %.1f GiB" % total)
            continue
        ok &= one_size(gib, a, rows)
    print(json.dumps({"rows": rows}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
