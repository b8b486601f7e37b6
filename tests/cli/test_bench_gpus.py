"""ferry bench --gpus (issue 28) against the fake CUDA driver of tests/unit/fakes/ built with two
devices and with one (device memory kept in host memory, so the figures mean nothing): one process
and one context drive both GPUs, each GPU's part and the total come out with the pinned ceilings of
one GPU and of both at once (text and --json), and with one GPU, --gpus 0 runs while --gpus 0,1
says that GPU 1 does not exist. bench/multi-gpu.sh runs it on real GPUs."""
import json
import os
import shutil
import subprocess

from _bench import FERRY, check, finish, scratch, skip

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "fakes")


def build(d, name, flags):
    out = os.path.join(d, name)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        skip("no C compiler to build the fake CUDA driver")
    p = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-o", out, *flags,
                        os.path.join(FAKES, "fake_libcuda.c"), "-lpthread"], capture_output=True, text=True)
    if p.returncode:
        skip(f"building fake_libcuda.c failed: {p.stderr[-500:]}")
    return out


def bench(env, *args, timeout=120):
    p = subprocess.run([FERRY, "bench", *args], capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def main():
    d = scratch()
    data = os.path.join(d, "data")
    with open(data, "wb") as f:
        f.write(os.urandom(8 << 20))
    # cuFile is left out: the fake's absence makes -x cpu-async-gpu the only path, as on a machine without GDS
    two = dict(os.environ, FERRY_CUDA_LIBRARY=build(d, "cuda2.so", ["-DFAKE_ATTRIBUTES", "-DFAKE_DEVICES=2"]),
               FERRY_CUFILE_LIBRARY=os.path.join(d, "no-cufile.so"))
    one = dict(two, FERRY_CUDA_LIBRARY=build(d, "cuda1.so", ["-DFAKE_ATTRIBUTES", "-DFAKE_DEVICES=1"]))
    two.pop("CUDA_VISIBLE_DEVICES", None)
    one.pop("CUDA_VISIBLE_DEVICES", None)
    common = ["--filename", data, "--bs", "1m", "--iodepth", "2", "-x", "cpu-async-gpu", "--io_size", "8m"]

    rc, out, err = bench(two, *common, "--gpus", "0,1", "--output-format", "json")
    check(rc == 0, "--gpus 0,1 with two GPUs exits 0", (rc, err[-1500:]), 0)
    if rc == 0:
        doc = json.loads(out)
        top = doc["ferry"]
        gpus = top.get("gpus", [])
        check([g.get("gpu") for g in gpus] == [0, 1], "one entry per GPU, in order", gpus)
        for g in gpus:
            check(g.get("bytes") == 8 << 20, f"GPU {g.get('gpu')}: its job moved --io_size bytes", g.get("bytes"),
                  8 << 20)
            check(g.get("bw_bytes", 0) > 0 and g.get("htod_ceiling_bytes", 0) > 0,
                  f"GPU {g.get('gpu')}: a figure and its ceiling alone", g)
        check(top.get("gpus_htod_ceiling_all_bytes", 0) > 0 and top.get("gpus_dtoh_ceiling_all_bytes", 0) > 0,
              "the ceilings of both GPUs at once, measured in the run", top)
        check(top.get("gpus_total_bw_bytes", 0) > 0, "the total", top.get("gpus_total_bw_bytes"))
        check("gpus_cpu_cores" in top, "the CPU cores used", sorted(top))
        job = doc["jobs"][0]
        check(job["ferry"]["numjobs"] == 2, "--numjobs 1 per GPU: two jobs", job["ferry"]["numjobs"], 2)
        check(job["read"]["io_bytes"] == 16 << 20, "the run's bytes are both GPUs'", job["read"]["io_bytes"], 16 << 20)

    # One read of the whole (page-cache-resident) file per GPU through the library, the way
    # bench/multi-gpu.sh reads: the copy units of both devices at once. Their rounds were numbered
    # by one counter for all devices, and the two reads waited for ever on the 2-GPU machine.
    try:
        rc, out, err = bench(two, "--filename", data, "--bs", "8m", "--api", "pread", "--io_size", "64m",
                             "--gpus", "0,1", "--output-format", "json", timeout=60)
    except subprocess.TimeoutExpired:
        rc, out, err = -1, "", "did not finish in 60 s (hung)"
    check(rc == 0, "--api pread --bs 8m into both GPUs at once finishes", (rc, err[-1500:]), 0)
    if rc == 0:
        gpus = json.loads(out)["ferry"].get("gpus", [])
        check([g.get("bytes") for g in gpus] == [64 << 20, 64 << 20], "each GPU's job moved --io_size bytes",
              [g.get("bytes") for g in gpus])

    rc, out, err = bench(two, *common, "--gpus", "1,0")
    check(rc == 0, "text output exits 0", (rc, err[-1500:]), 0)
    check("2 GPUs at once" in out and "total" in out and "all at once" in out,
          "the text table has each GPU, the total and the all-at-once ceiling", out[-1500:])
    rows = [l.split()[0] for l in out.splitlines() if l.strip() and l.split()[0] in ("0", "1")]
    check(rows == ["1", "0"], "rows in the order given", rows)

    rc, out, err = bench(one, *common, "--gpus", "0")
    check(rc == 0, "--gpus 0 with one GPU exits 0", (rc, err[-1500:]), 0)
    rc, out, err = bench(one, *common, "--gpus", "0,1")
    check(rc == 1, "--gpus 0,1 with one GPU fails", (rc, out[-500:]), 1)
    check("GPU 1 does not exist" in err and "sees 1 GPU" in err, "it says GPU 1 does not exist", err)
    check(out == "", "and prints no table", out)

    for bad, why in ((["--gpus", "0,0"], "each once"), (["--gpus", "0,"], "comma-separated"),
                     (["--gpus", "a"], "comma-separated"), (["--gpus", "0,1", "--gpu", "1"], "not both"),
                     (["--gpus", "0,1", "-x", "cpu"], "not -x cpu")):
        args = [a for a in common if a not in ("-x", "cpu-async-gpu")] if "-x" in bad else common
        rc, out, err = bench(two, *args, *bad)
        check(rc == 2 and why in err, f"{' '.join(bad)}: a usage error saying {why!r}", (rc, err), 2)
    finish()


if __name__ == "__main__":
    main()
