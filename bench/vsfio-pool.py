#!/usr/bin/env python3
"""Pools the rounds of several bench/vs-fio.sh runs (their --json files) row by row: for each row,
every round's own ratio ferry/fio from every file, their median, and how many rounds ferry ran at
or above fio and at or above 0.95x; and the median of the rounds' ratios of CPU seconds per GB
(ferry's over fio's), held to vs-fio.sh's mark of 1.05. A single table of 3-5 rounds moves a row
by 0.1-0.3 between VMs (docs/PERFORMANCE.md); the rounds of several tables, on several VMs, say
where a row sits.

    python3 bench/vsfio-pool.py [--label disk] A.json B.json ...   [--variant ferry]

Rows are matched by name; a file that lacks a row adds nothing to it. Only files of the same
build should be pooled. Exit 1 if a file cannot be read or holds no rounds.
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="vs-fio.sh --json outputs")
    ap.add_argument("--variant", default="ferry", help="which ferry run of the rounds (a FERRY_VARIANTS label)")
    ap.add_argument("--label", default="", help="printed before each row (e.g. disk, /dev/shm)")
    a = ap.parse_args()
    pool, cpu, order = {}, {}, []
    for f in a.files:
        try:
            with open(f) as fh:
                raw = json.load(fh)["raw"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"vsfio-pool: {f}: not a vs-fio.sh JSON file ({e})")
        for row, rounds in raw.items():
            if row not in pool:
                pool[row], cpu[row] = [], []
                order.append(row)
            for g in rounds:
                fio, fer = g.get("fio", {}), g.get(a.variant, {})
                if "error" in fio or "error" in fer or not fio.get("gbps") or "gbps" not in fer:
                    continue
                pool[row].append(fer["gbps"] / fio["gbps"])
                if fio.get("cpu_s_per_gb") and fer.get("cpu_s_per_gb") is not None:
                    cpu[row].append(fer["cpu_s_per_gb"] / fio["cpu_s_per_gb"])
    if not any(pool.values()):
        sys.exit(f"vsfio-pool: no rounds of '{a.variant}' in {' '.join(a.files)}")
    met = cpu_met = 0
    print(f"{'row':<40} {'rounds':>6} {'median':>7} {'range':>11} {'ahead':>6} {'>=0.95':>7} {'cpu':>5} {'cpu<=1.05':>9}")
    for row in order:
        r = pool[row]
        if not r:
            print(f"{(a.label + ' ' + row).strip():<40} {0:>6}")
            continue
        m = statistics.median(r)
        met += m >= 0.95
        c = statistics.median(cpu[row]) if cpu[row] else None
        cpu_met += c is not None and c <= 1.05
        print(f"{(a.label + ' ' + row).strip():<40} {len(r):>6} {m:>7.2f} {min(r):>5.2f}-{max(r):<5.2f} "
              f"{sum(x >= 1 for x in r):>6} {sum(x >= 0.95 for x in r):>7} "
              + ("    -         -" if c is None else f"{c:>5.2f} {'yes' if c <= 1.05 else 'NO':>9}"))
    rows = sum(1 for r in pool.values() if r)
    print(f"\n{met} of {rows} rows with the pooled median at or above 0.95x; {cpu_met} of {rows} with the "
          f"median of the rounds' CPU per GB at most 1.05x fio's ({len(a.files)} files)")


if __name__ == "__main__":
    main()
