"""ferry bench --suite --quiet: no progress bar and no per-case lines on stderr; the table (and report) only."""
import os

from _bench import check, finish, run, scratch


def main():
    d = scratch()
    report = os.path.join(d, "report.html")
    rc, out, err = run("--suite", "--quiet", "--quick", "--runtime", "0.1", "--size", "4m", "--directory", d,
                       "--report", report, timeout=300)
    check(rc == 0, "--suite --quiet exits 0", (rc, err[-2000:]), 0)
    check("Sequential vs random" in out, "the table is printed", out[-2000:])
    check("report: " + report in out, "the report line is printed", out[-500:])
    check(os.path.exists(report), "the report is written")
    check("ferry bench --suite:" not in err, "no per-case or preparing lines on stderr", err[-2000:])
    check("\r" not in err and "steps" not in err, "no progress bar on stderr", err[-2000:])
    rc, _, err = run("--quiet", "--filename", os.path.join(d, "x"), "--size", "4m")
    check(rc == 2 and "--quiet goes with --suite" in err, "--quiet without --suite is a usage error", (rc, err))
    finish()


main()
