"""ferry bench --suite without a usable GPU: one line names the GPU rows skipped and why, --json lists
every GPU row with "skipped", and the HTML report says so and stays valid. The driver is made
unavailable on purpose (FERRY_CUDA_LIBRARY names a library that does not exist), so this runs the
same on a GPU machine."""
import json
import os

from _bench import FERRY, check, finish, scratch
from _suite_html import parse
import subprocess

GPU_SECTIONS = 4


def main():
    d = scratch()
    env = dict(os.environ, FERRY_CUDA_LIBRARY=os.path.join(d, "no-libcuda.so"))
    report = os.path.join(d, "report.html")
    args = [FERRY, "bench", "--suite", "--quick", "--runtime", "0.1", "--size", "8m", "--directory", d]
    p = subprocess.run(args + ["--report", report], capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, "--suite exits 0 without a GPU", (p.returncode, p.stderr[-2000:]), 0)
    lines = [l for l in p.stdout.splitlines() if l.startswith("GPU rows skipped")]
    check(len(lines) == 1, "one line says the GPU rows were skipped", p.stdout[-1500:])
    if lines:
        for what in ("-x mode", "safetensors", "checkpoint", "loader", "no-libcuda.so", "gpu.present: "):
            check(what in lines[0], f"the skip line names {what!r}", lines[0])
    check(not [l for l in p.stdout.splitlines() if l.startswith("GPU: ")], "no GPU section tables when skipped",
          p.stdout[-1500:])
    steps = [l.split()[3] for l in p.stderr.splitlines() if l.startswith("ferry bench --suite: ")
             and l.split()[3].split("/")[0].isdigit()]
    check(steps and steps[-1].split("/")[0] == steps[-1].split("/")[1], "the step count ends at its total", steps)
    check(os.path.exists(report), "report written")
    if os.path.exists(report):
        h, text = parse(report)
        check(not h.errors and not h.stack, "HTML well formed and self-contained", (h.errors, h.stack))
        check("GPU rows skipped" in text and "no-libcuda.so" in text, "the report says why the GPU rows are missing")

    p = subprocess.run(args + ["--output-format", "json"], capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0, "--suite --output-format json exits 0", (p.returncode, p.stderr[-2000:]), 0)
    if p.returncode == 0:
        top = json.loads(p.stdout)["ferry"]
        check("no-libcuda.so" in top.get("gpu_skipped", ""), "gpu_skipped says why", top.get("gpu_skipped"))
        gpu = top.get("gpu", [])
        check(len(gpu) == GPU_SECTIONS, "every GPU section is listed", len(gpu), GPU_SECTIONS)
        rows = [r for s in gpu for r in s.get("rows", [])]
        check(len(rows) >= 10, "every GPU row is listed", len(rows))
        for s in gpu:
            check("skipped" in s and "reading" not in s, f"{s.get('section')}: skipped", s)
        for r in rows:
            check("no-libcuda.so" in r.get("skipped", "") and "gbps" not in r, f"row {r.get('case')}: skipped with why", r)
    finish()


main()
