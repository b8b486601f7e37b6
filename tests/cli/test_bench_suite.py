"""ferry bench --suite: the table with a reading per section, JSON, and a self-contained HTML report."""
import json
import os

from _bench import check, finish, run, scratch
from _suite_html import Checker

SECTIONS = ["Sequential vs random", "4 KiB vs 1 MiB requests", "Queue depth", "Jobs",
            "Buffered vs O_DIRECT", "psync vs io_uring"]


def main():
    d = scratch()
    report = os.path.join(d, "report.html")
    rc, out, err = run("--suite", "--quick", "--runtime", "0.25", "--size", "16m", "--directory", d,
                       "--report", report, timeout=300)
    check(rc == 0, "--suite exits 0", (rc, err[-2000:]), 0)
    for title in SECTIONS:
        check(title in out, f"table has section {title!r}", out)
    readings = [l for l in out.splitlines() if l.strip().startswith("->")]
    skipped = [l for l in out.splitlines() if "skipped:" in l]
    check(len(readings) + len(skipped) >= len(SECTIONS), "each section has a reading or says skipped",
          len(readings) + len(skipped), len(SECTIONS))
    check(any("%" in l or "x the" in l for l in readings), "readings carry figures", readings)
    check(not [f for f in os.listdir(d) if f.startswith("ferry-suite-")], "the temporary file is removed",
          os.listdir(d))

    check(os.path.exists(report), "report written")
    if os.path.exists(report):
        text = open(report, encoding="utf-8").read()
        p = Checker()
        p.feed(text)
        p.close()
        check(not p.errors, "HTML well formed and self-contained", p.errors)
        check(not p.stack, "every element closed", p.stack)
        check(text.startswith("<!DOCTYPE html>"), "HTML doctype")
        check(p.tags.get("svg", 0) >= 1 and p.tags.get("rect", 0) >= 3, "inline SVG bar charts", p.tags)
        check(p.tags.get("table", 0) >= 1 and p.tags.get("style", 0) == 1, "table and inline CSS", p.tags)
        for title in SECTIONS:
            check(title in text, f"report has section {title!r}")

    rc, out, err = run("--suite", "--quick", "--runtime", "0.25", "--size", "16m", "--directory", d,
                       "--output-format", "json", timeout=300)
    check(rc == 0, "--suite --output-format json exits 0", (rc, err[-2000:]), 0)
    if rc == 0:
        doc = json.loads(out)
        suite = doc["ferry"]["suite"]
        check(len(suite) == len(SECTIONS), "JSON has every section", len(suite), len(SECTIONS))
        names = {j["jobname"] for j in doc["jobs"]}
        for s in suite:
            check("reading" in s or "skipped" in s, f"{s['section']}: reading or skipped", s)
            if "reading" in s:
                check(all(c in names for c in s["cases"]), f"{s['section']}: its cases are jobs", s["cases"])
        for j in doc["jobs"]:
            r = j["read"]
            check(r["io_bytes"] == r["total_ios"] * j["ferry"]["bs"], f"{j['jobname']}: io_bytes")
    rc, _, err = run("--suite", "--rw", "read")
    check(rc == 2 and "--rw" in err, "options that do not apply to --suite are usage errors", (rc, err))
    finish()


main()
