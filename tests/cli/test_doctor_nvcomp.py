#!/usr/bin/env python3
"""ferry doctor's gpu.nvcomp row on the live machine: nvCOMP absent (FERRY_NVCOMP_LIB pointing
nowhere), and present with both codecs or without zstd (the fake libnvcomp and libcuda of
tests/unit/fakes)."""
import json
import os
import shutil
import subprocess
import sys

ferry = sys.argv[1]
src = os.environ.get("FERRY_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
tmp = os.path.join(os.environ.get("FERRY_TEST_TMPDIR", "/tmp"), "doctor-nvcomp-%d" % os.getpid())
cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
if not cc:
    print("skipped: no C compiler to build the fake libraries")
    sys.exit(77)
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
fakes = {"cuda.so": ("fake_libcuda.c", [], ["-lpthread"]),
         "nvcomp.so": ("fake_libnvcomp.c", [], ["-l:libzstd.so.1", "-l:liblz4.so.1"]),
         "nvcomp_nozstd.so": ("fake_libnvcomp.c", ["-DFAKE_NO_ZSTD"], ["-l:libzstd.so.1", "-l:liblz4.so.1"])}
for out, (c, defs, libs) in fakes.items():
    r = subprocess.run([cc, "-shared", "-fPIC", "-fvisibility=hidden"] + defs +
                       ["-o", os.path.join(tmp, out), os.path.join(src, "tests/unit/fakes", c)] + libs,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode:
        print("skipped: cannot build the fake %s: %s" % (out, r.stderr.strip()[:300]))
        sys.exit(77)

failures = []


def row(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(extra)
    p = subprocess.run([ferry, "doctor", "--json"], env=env, stdout=subprocess.PIPE, timeout=120)
    doc = json.loads(p.stdout)
    got = [c for c in doc["checks"] if c["id"] == "gpu.nvcomp"]
    assert len(got) == 1, "gpu.nvcomp rows: %r" % got
    gpus = [c for c in doc["checks"] if c["id"] == "gpu.present"][0]["value"]
    return got[0], not gpus.startswith("no NVIDIA GPU")


def check(name, c, verdict, *texts):
    if c["verdict"] != verdict:
        failures.append("%s: verdict %r, expected %r (value: %s)" % (name, c["verdict"], verdict, c["value"]))
    for t in texts:
        if t not in c["value"]:
            failures.append("%s: value does not contain %r: %s" % (name, t, c["value"]))


c, gpu = row({"FERRY_NVCOMP_LIB": "/nonexistent/libnvcomp.so.6"})
check("absent", c, "warn" if gpu else "ok", "library not found", "FERRY_NVCOMP_LIB=/nonexistent/libnvcomp.so.6")
if gpu and "pip install nvidia-libnvcomp-cu13" not in c["fix"]:
    failures.append("absent: fix does not say how to install it: %r" % c["fix"])
lib = os.path.realpath(os.path.join(tmp, "nvcomp.so"))
c, _ = row({"FERRY_NVCOMP_LIB": lib, "FERRY_CUDA_LIBRARY": os.path.join(tmp, "cuda.so")})
check("fake", c, "ok", "nvCOMP 6.0.0 (%s): GPU decompression of LZ4, zstd" % lib)
c, gpu = row({"FERRY_NVCOMP_LIB": os.path.join(tmp, "nvcomp_nozstd.so"), "FERRY_CUDA_LIBRARY": os.path.join(tmp, "cuda.so")})
check("no zstd", c, "warn" if gpu else "ok", "LZ4 only", "nvcompBatchedZstdDecompressAsync")
c, gpu = row({"FERRY_NVCOMP_LIB": lib, "FERRY_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
check("no GPU", c, "warn" if gpu else "ok", "cannot decompress here: no GPU")

shutil.rmtree(tmp, ignore_errors=True)
if failures:
    print("\n".join("FAIL: " + f for f in failures), file=sys.stderr)
    sys.exit(1)
print("ok")
