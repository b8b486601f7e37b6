#!/usr/bin/env python3
"""ferry doctor's GPU facts through NVML, with the fake NVML of tests/unit/fakes (one "Fake GPU" at
00000000:18:00.0, 80 GiB, persistence on, clock event reasons 0x4 = software power cap) against
the gpu-x8-link fixture with its GPU moved to that PCI address."""
import json
import os
import shutil
import subprocess
import sys

ferry = sys.argv[1]
src = os.environ.get("FERRY_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
tmp = os.path.join(os.environ.get("FERRY_TEST_TMPDIR", "/tmp"), "doctor-nvml-%d" % os.getpid())
cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
if not cc:
    print("skipped: no C compiler to build the fake NVML")
    sys.exit(77)
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
lib = os.path.join(tmp, "fake_nvml.so")
r = subprocess.run([cc, "-shared", "-fPIC", "-o", lib, os.path.join(src, "tests/unit/fakes/fake_libnvml.c")],
                   stderr=subprocess.PIPE, text=True)
if r.returncode:
    print("FAIL: building the fake NVML: " + r.stderr, file=sys.stderr)
    sys.exit(1)
root = os.path.join(tmp, "root")
shutil.copytree(os.path.join(src, "tests/fixtures/sys/gpu-x8-link"), root, symlinks=True)
old = os.path.join(root, "sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0")
os.rename(old, old.replace("0000:17:00.0", "0000:18:00.0"))
os.unlink(os.path.join(root, "sys/bus/pci/devices/0000:17:00.0"))
os.symlink("../../../devices/pci0000:16/0000:16:01.0/0000:18:00.0", os.path.join(root, "sys/bus/pci/devices/0000:18:00.0"))

env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
env["FERRY_NVML_LIBRARY"] = lib
p = subprocess.run([ferry, "doctor", "--json", "--root", root, "/data"], env=env, stdout=subprocess.PIPE, timeout=60)
doc = json.loads(p.stdout)
got = {(c["id"], c["subject"]): c for c in doc["checks"]}
subj = "GPU 0 (0000:18:00.0)"
want = {"gpu.model": ("ok", "Fake GPU (driver 999.1.2)"), "gpu.memory": ("ok", "80.0 GiB total, 1.0 GiB used"),
        "gpu.persistence": ("ok", "on"), "gpu.throttle": ("warn", "software power cap")}
failures = 0
for cid, (verdict, text) in want.items():
    c = got.get((cid, subj))
    if not c or c["verdict"] != verdict or text not in c["value"]:
        failures += 1
        print("FAIL: %s: got %r, want %s with %r" % (cid, c, verdict, text), file=sys.stderr)
# Without the fake, fixture mode keeps NVML out and says so.
del env["FERRY_NVML_LIBRARY"]
p = subprocess.run([ferry, "doctor", "--json", "--root", root, "/data"], env=env, stdout=subprocess.PIPE, timeout=60)
c = {(c["id"], c["subject"]): c for c in json.loads(p.stdout)["checks"]}.get(("gpu.model", subj))
if not c or c["verdict"] != "unknown" or "NVML not loaded" not in c["value"]:
    failures += 1
    print("FAIL: without NVML gpu.model is %r" % c, file=sys.stderr)
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
