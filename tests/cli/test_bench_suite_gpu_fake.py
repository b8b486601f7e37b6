"""ferry bench --suite's GPU rows against the fake CUDA driver and cuFile of tests/unit/fakes/ (device
memory kept in host memory, cuFile refusing the file with 5027 as on a machine without /run/udev):
every GPU section measures and reads, the gds row says cuFile refused and why, --json carries the rows
and ceilings, and the report draws each GPU chart with its ceiling marked. The figures mean nothing
here; scripts/gpu-check.sh runs the suite on a real GPU."""
import json
import os
import shutil
import subprocess

from _bench import FERRY, check, finish, scratch, skip
from _suite_html import parse

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "fakes")


def build(d, name, src, flags):
    out = os.path.join(d, name)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        skip("no C compiler to build the fake CUDA driver")
    p = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-o", out, *flags,
                        os.path.join(FAKES, src), "-lpthread"], capture_output=True, text=True)
    if p.returncode:
        skip(f"building {src} failed: {p.stderr[-500:]}")
    return out


def main():
    d = scratch()
    env = dict(os.environ,
               FERRY_CUDA_LIBRARY=build(d, "cuda.so", "fake_libcuda.c", ["-DFAKE_ATTRIBUTES"]),
               FERRY_CUFILE_LIBRARY=build(d, "cufile.so", "fake_libcufile.c",
                                          ["-DFAKE_REGISTER_RESULT=5027", "-DFAKE_CLOSE_V2"]))
    report = os.path.join(d, "report.html")
    args = [FERRY, "bench", "--suite", "--quick", "--runtime", "0.2", "--size", "8m", "--directory", d,
            "--report", report]
    p = subprocess.run(args + ["--output-format", "json"], capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, "--suite exits 0 on the fake GPU", (p.returncode, p.stderr[-2000:]), 0)
    if p.returncode:
        finish()
    top = json.loads(p.stdout)["ferry"]
    check("gpu_skipped" not in top, "no GPU skip line with a GPU", top.get("gpu_skipped"))
    gpu = {s["section"]: s for s in top.get("gpu", [])}
    check(len(gpu) == 4, "four GPU sections", list(gpu))
    for name, s in gpu.items():
        check("reading" in s, f"{name}: a one-line reading", s)
        check(s.get("ceiling_gbps", 0) > 0, f"{name}: the pinned copy ceiling measured in the run", s)
    rows = {r["case"]: r for s in gpu.values() for r in s["rows"]}
    for case in ("cpu-gpu (bounce buffers)", "pagecache-gpu (page cache)", "ferry (ferry_st_load_run)",
                 "pread + cudaMemcpy, pageable", "save, synchronous (durable, xxh3)", "save_async, caller blocked",
                 "loader, peak (no step)", "loader, step at 80% of peak"):
        check(rows.get(case, {}).get("gbps", 0) > 0, f"row {case!r} measured", rows.get(case))
    gds = rows.get("gds (GPUDirect Storage)", {})
    check("cuFile refused" in gds.get("skipped", "") and "5027" in gds.get("skipped", ""),
          "the gds row says cuFile refused the file and why", gds)
    check("samples/s" in rows.get("loader, peak (no step)", {}).get("note", ""), "the loader row gives samples/s")
    check("waited" in rows.get("loader, step at 80% of peak", {}).get("note", ""), "the loader row gives the wait")
    check("blocked" in rows.get("save_async, caller blocked", {}).get("note", ""), "the async row gives time blocked")
    check(not [f for f in os.listdir(d) if f.startswith("ferry-suite-")], "the suite's files are removed",
          os.listdir(d))

    h, text = parse(report)
    check(not h.errors and not h.stack, "HTML well formed and self-contained", (h.errors, h.stack))
    check(h.classes.get("ceil", 0) == 4, "each GPU chart marks its ceiling", h.classes)
    check(text.count("<svg") >= 6 + 4, "host and GPU charts are inline SVG", text.count("<svg"))
    for name in gpu:
        check(name in text, f"the report has {name!r}")

    p = subprocess.run(args[:-2], capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, "--suite (table) exits 0 on the fake GPU", (p.returncode, p.stderr[-2000:]), 0)
    readings = [l for l in p.stdout.split("\nGPU: ")[1:]]
    check(len(readings) == 4 and all("\n  -> " in r for r in readings), "each GPU table ends in a reading",
          p.stdout[-3000:])
    check("ceiling, measured in this run" in p.stdout, "the table shows the ceiling")
    check("GPU: " in p.stderr, "the GPU steps are counted on stderr (not a terminal)", p.stderr[-800:])
    steps = [tuple(map(int, l.split()[3].split("/"))) for l in p.stderr.splitlines()
             if l.startswith("ferry bench --suite: ") and l.split()[3].split("/")[0].isdigit()]
    check(steps and all(a <= b for a, b in steps) and steps[-1][0] == steps[-1][1],
          "the step count ends at its total", steps)
    finish()


main()
