#!/usr/bin/env bash
# fio and `ferry bench` on the same file with the same parameters, alternating, several rounds.
# Prints each pair with the ratio ferry/fio and the CPU seconds per GB of both, then a summary
# table (median over rounds) saying whether ferry met 0.95x fio on each row.
#
#   bench/vs-fio.sh [--dir D] [--size S] [--runtime SECONDS] [--rounds N] [--json OUT] [--rows LIST]
#                   [--taskset CPUS] [--where]
#   FIO=/path/to/fio FERRY=/path/to/ferry bench/vs-fio.sh ...
#   FERRY_ARGS="--iodepth_batch_submit=1" bench/vs-fio.sh ...   (extra options for ferry's runs)
#   FERRY_VARIANTS="defer:FERRY_URING_DEFER=1|b0:--iodepth_batch_submit=0" bench/vs-fio.sh ...
#     (more ferry runs in the same rounds, each LABEL:WORDS, a word NAME=VALUE set in its
#     environment, any other word an option; each gets its own ratio against the same fio runs)
#   FIO_VARIANTS="fio-thread:--thread" bench/vs-fio.sh ...   (more fio runs, the same form; a
#     fio variant's figure is printed in ferry's column, its ratio is against plain fio)
#   VARIANT_ROWS="read rand 4KiB QD1 direct" ...   (variants run on these rows only; default all)
#
# --dir: where the test file lives (default $TMPDIR or /tmp; try the machine's disk and /dev/shm).
# --rows: comma-separated subset of row names (see --list). Needs python3 (stdlib only).
# --taskset: run both tools under `taskset -c CPUS` (e.g. 1): the same CPUs for both, so that where
#   the kernel places each tool's threads (and io_uring's workers, which inherit the CPU mask) is
#   no longer a draw that differs between the runs (docs/BENCH.md, "Where the threads land").
# --where: every 20 ms, note the CPU each thread of the tool ran on (/proc/PID/task/TID/stat),
#   and its migrations and context switches (/proc/PID/task/TID/sched); the busiest thread's
#   figures go into each run's JSON and line ("job on CPUs ...").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../build/ferry}
FIO=${FIO:-$(command -v fio || true)}
DIR=${TMPDIR:-/tmp}
SIZE=1g
RUNTIME=10
ROUNDS=3
JSON=
ROWS=
TASKSET=
WHERE=

usage() { sed -n '2,/^set -e/{/^set -e/!p}' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
	opt=$1
	case $opt in
	--*=*) val=${opt#*=}; opt=${opt%%=*} ;;
	--help|-h|--list|--where) val= ;;
	*) val=${2-}; [ $# -ge 2 ] || { echo "vs-fio.sh: $opt needs a value" >&2; exit 2; }; shift ;;
	esac
	case $opt in
	--dir) DIR=$val ;;
	--size) SIZE=$val ;;
	--runtime) RUNTIME=$val ;;
	--rounds) ROUNDS=$val ;;
	--json) JSON=$val ;;
	--rows) ROWS=$val ;;
	--taskset) TASKSET=$val ;;
	--list) ROWS=list ;;
	--where) WHERE=1 ;;
	--help|-h) usage; exit 0 ;;
	*) echo "vs-fio.sh: unknown option $opt" >&2; usage >&2; exit 2 ;;
	esac
	shift
done
if [ "$ROWS" != list ]; then
	[ -x "$FERRY" ] || { echo "vs-fio.sh: no ferry binary at $FERRY (build it, or set FERRY=)" >&2; exit 1; }
	[ -n "$FIO" ] && [ -x "$FIO" ] || { echo "vs-fio.sh: fio not found; install it or set FIO=/path/to/fio (an unpacked .deb works)" >&2; exit 1; }
	[ -d "$DIR" ] || { echo "vs-fio.sh: --dir $DIR is not a directory" >&2; exit 1; }
fi

if [ -n "$TASKSET" ]; then
	command -v taskset >/dev/null || { echo "vs-fio.sh: --taskset needs taskset (util-linux)" >&2; exit 1; }
	taskset -c "$TASKSET" true 2>/dev/null || { echo "vs-fio.sh: --taskset $TASKSET: not a CPU list this machine accepts" >&2; exit 2; }
fi
export FERRY FIO DIR SIZE RUNTIME ROUNDS JSON ROWS TASKSET WHERE
exec python3 - <<'PY'
import json, os, resource, statistics, subprocess, sys, tempfile, time

E = os.environ
ferry, fio, d = E["FERRY"], E["FIO"], E["DIR"]
size, runtime, rounds = E["SIZE"], E["RUNTIME"], int(E["ROUNDS"])

ROWS = []
for direct in (1, 0):
    for rw in ("read", "write"):
        for name, bs, qd, seq in (("seq 1MiB QD32", "1m", 32, True), ("rand 4KiB QD64", "4k", 64, False),
                                  ("rand 4KiB QD1", "4k", 1, False)):
            mode = rw if seq else "rand" + rw
            ROWS.append({"row": f"{rw} {name} {'direct' if direct else 'buffered'}",
                         "rw": mode, "bs": bs, "iodepth": qd, "direct": direct})
if E["ROWS"] == "list":
    for r in ROWS:
        print(r["row"])
    sys.exit(0)
if E["ROWS"]:
    want = [w.strip() for w in E["ROWS"].split(",")]
    ROWS = [r for r in ROWS if r["row"] in want]
    if not ROWS:
        sys.exit("vs-fio.sh: --rows matched no row (see --list)")

path = os.path.join(d, f"vs-fio-{os.getpid()}.dat")

# ferry's and fio's variants: label -> (environment additions, extra options)
def variants(name, taken):
    out = {}
    for v in filter(None, (x.strip() for x in E.get(name, "").split("|"))):
        label, _, words = v.partition(":")
        if not label or label in taken or label in out:
            sys.exit(f"vs-fio.sh: {name}: bad or repeated label in '{v}' (expected LABEL:WORDS)")
        env = dict(w.split("=", 1) for w in words.split() if "=" in w and not w.startswith("-"))
        out[label] = (env, [w for w in words.split() if w.startswith("-")])
    return out


VARIANTS = variants("FERRY_VARIANTS", ("fio", "ferry"))
FIO_VARIANTS = variants("FIO_VARIANTS", ["fio", "ferry"] + list(VARIANTS))
TOOLS = ["fio", "ferry"] + list(VARIANTS) + list(FIO_VARIANTS)
VARIANT_ROWS = [w.strip() for w in E.get("VARIANT_ROWS", "").split(",") if w.strip()]
if VARIANT_ROWS and not set(VARIANT_ROWS) <= {r["row"] for r in ROWS}:
    sys.exit(f"vs-fio.sh: VARIANT_ROWS names rows not run: {sorted(set(VARIANT_ROWS) - {r['row'] for r in ROWS})}")


def tools_of(r):
    """The tools run on row r: every variant, or with VARIANT_ROWS only on those rows."""
    return [t for t in TOOLS if t in ("fio", "ferry") or not VARIANT_ROWS or r["row"] in VARIANT_ROWS]


def proc_tree(pid):
    """The pids of pid and its descendants (fio runs each job as a child process)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def sample(pid, seen):
    """One look at every thread of the tree: the CPU it ran on since the last look, its sched figures."""
    for p in proc_tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                with open(f"/proc/{p}/task/{t}/stat") as f:
                    st = f.read()
                with open(f"/proc/{p}/task/{t}/sched") as f:
                    sc = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            cpu_t, cpu = int(fields[11]) + int(fields[12]), int(fields[36])
            s = seen.setdefault(t, {"cpu_ticks": 0, "cpus": {}, "moves": 0, "last": None, "sched": {}})
            if cpu_t > s["cpu_ticks"] or s["last"] is None:
                s["cpus"][cpu] = s["cpus"].get(cpu, 0) + 1
                if s["last"] is not None and cpu != s["last"]:
                    s["moves"] += 1
                s["last"] = cpu
            s["cpu_ticks"] = cpu_t
            for line in sc.splitlines():
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("se.nr_migrations", "nr_voluntary_switches", "nr_involuntary_switches", "se.sum_exec_runtime"):
                    s["sched"][k.replace("se.", "")] = float(v)


def where_of(seen):
    """The busiest thread's placement: CPUs (samples on each), moves between samples, migrations."""
    if not seen:
        return None
    s = max(seen.values(), key=lambda x: x["sched"].get("sum_exec_runtime", 0))
    return {"cpus": {str(c): n for c, n in sorted(s["cpus"].items(), key=lambda x: -x[1])},
            "moves": s["moves"], **{k: int(v) for k, v in s["sched"].items() if k != "sum_exec_runtime"}}


def meminfo_kb(*keys):
    """Dirty and Writeback (kB) before a run: a previous row's dirty pages make O_DIRECT reads of
    those blocks wait for their write first (io_uring hands such reads to its workers)."""
    try:
        with open("/proc/meminfo") as f:
            m = {k.rstrip(":"): int(v) for k, v, *_ in (line.split() for line in f)}
        return {k.lower() + "_kb": m.get(k) for k in keys}
    except (OSError, ValueError):
        return {}


def timed(cmd, env=None):
    """Runs cmd; returns (rc, stdout, stderr, cpu seconds of the child, where its job ran or None)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                             env=dict(os.environ, **env) if env else None)
        seen = {}
        if E["WHERE"]:
            while p.poll() is None:
                sample(p.pid, seen)
                time.sleep(0.02)
        p.wait()
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p.returncode, o, e, cpu, where_of(seen)


def common(r):
    # Buffered: fio invalidates the file's cache before a job (invalidate=1); --cold does the same.
    return [f"--filename={path}", f"--size={size}", f"--rw={r['rw']}", f"--bs={r['bs']}",
            f"--iodepth={r['iodepth']}", f"--direct={r['direct']}", "--ioengine=io_uring",
            f"--runtime={runtime}", "--time_based", "--output-format=json", "--numjobs=1"]


def figures(out):
    j = json.loads(out[out.index("{"):])["jobs"][0]
    b = j["read"]["io_bytes"] + j["write"]["io_bytes"]
    bw = j["read"]["bw_bytes"] + j["write"]["bw_bytes"]
    iops = j["read"]["iops"] + j["write"]["iops"]
    # latency of the direction that moved the bytes: a slower run shows whether every I/O took
    # longer (p50) or a few stalled (p99). Completion latency (clat) starts at the submit in fio
    # and before it in ferry, so compare it within a tool; the total's mean (lat) across tools.
    d = j["read"] if j["read"]["io_bytes"] >= j["write"]["io_bytes"] else j["write"]
    pct = d.get("clat_ns", {}).get("percentile", {})
    lat = {k: pct.get(f) for k, f in (("clat_p50_ns", "50.000000"), ("clat_p99_ns", "99.000000"))}
    lat["lat_mean_ns"] = d.get("lat_ns", {}).get("mean")
    return b, bw, iops, lat


def one(tool, r):
    if tool == "fio" or tool in FIO_VARIANTS:
        # fadvise_hint=0: fio would otherwise advise RANDOM/SEQUENTIAL on its descriptor, which
        # changes read-ahead on buffered rows; ferry's public API has no such hint yet.
        env, extra = FIO_VARIANTS.get(tool, ({}, []))
        cmd = [fio, "--name=vs", "--fadvise_hint=0"] + common(r) + extra
    else:
        env, extra = VARIANTS.get(tool, ({}, []))
        cmd = [ferry, "bench", "--name=vs"] + common(r) + ([] if r["direct"] else ["--cold"]) + E.get("FERRY_ARGS", "").split() + extra
    if E["TASKSET"]:
        cmd = ["taskset", "-c", E["TASKSET"]] + cmd
    before = meminfo_kb("Dirty", "Writeback")
    rc, out, err, cpu, where = timed(cmd, env)
    if rc != 0:
        return {"error": (err.strip() or out.strip()).splitlines()[-1] if (err or out) else f"exit {rc}"}
    b, bw, iops, lat = figures(out)
    got = {"gbps": bw / 1e9, "iops": iops, "cpu_s": cpu, "cpu_s_per_gb": cpu / (b / 1e9) if b else None,
           "lat": lat, "before": before}
    if where:
        got["where"] = where
    return got


def where_line(tool, g):
    w = g.get("where")
    if not w:
        return ""
    cpus = " ".join(f"{c}:{n}" for c, n in list(w["cpus"].items())[:4])
    return (f"\n    {tool:<10} job on CPUs {cpus} (samples); moves {w['moves']}, migrations "
            f"{w.get('nr_migrations', '-')}, switches {w.get('nr_voluntary_switches', '-')}+"
            f"{w.get('nr_involuntary_switches', '-')}")


def lat_us(g):
    v = g.get("lat", {}).get("lat_mean_ns")
    return "-" if v is None else f"{v / 1e3:.1f}"


def fmt(x, f="%.3f"):
    return "-" if x is None else f % x


print(f"vs-fio: ferry={ferry} fio={fio} ({subprocess.run([fio, '--version'], capture_output=True, text=True).stdout.strip()})")
print(f"vs-fio: file {path}, size {size}, runtime {runtime}s, rounds {rounds}, ioengine io_uring, 1 job"
      + (f", both tools on CPUs {E['TASKSET']} (taskset)" if E["TASKSET"] else ""))
rc = subprocess.run([ferry, "bench", f"--filename={path}", f"--size={size}", "--bs=1m", "--io_size=1m"],
                    capture_output=True, text=True)
if rc.returncode != 0:
    sys.exit(f"vs-fio.sh: cannot lay out {path}: {rc.stderr.strip()}")

results = {r["row"]: {"params": r, "rounds": []} for r in ROWS}
try:
    for k in range(rounds):
        for r in ROWS:
            # each round starts with the next tool, so no tool always runs first (or after fio)
            tools = tools_of(r)
            order = tools[k % len(tools):] + tools[:k % len(tools)]
            got = {t: one(t, r) for t in order}
            results[r["row"]]["rounds"].append(got)
            f = got["fio"]
            for t in tools[1:]:
                y = got[t]
                if "error" in f or "error" in y:
                    print(f"round {k + 1} {r['row']:<32} fio: {f.get('error', 'ok')} | {t}: {y.get('error', 'ok')}")
                    continue
                ratio = y["gbps"] / f["gbps"] if f["gbps"] else None
                print(f"round {k + 1} {r['row']:<32} fio {f['gbps']:8.3f} GB/s {f['iops']:10.0f} IOPS "
                      f"{fmt(f['cpu_s_per_gb'], '%6.2f')} cpu-s/GB | {t} {y['gbps']:8.3f} GB/s "
                      f"{y['iops']:10.0f} IOPS {fmt(y['cpu_s_per_gb'], '%6.2f')} cpu-s/GB | ratio {fmt(ratio)}"
                      f" | lat {lat_us(f)}/{lat_us(y)} us"
                      + (where_line("fio", f) if t == TOOLS[1] else "") + where_line(t, y), flush=True)
        if E["JSON"]:
            # the rounds so far, should the run be cut short (a device call's time limit)
            with open(E["JSON"] + ".partial", "w") as fp:
                json.dump({"rounds_done": k + 1, "raw": {n: v["rounds"] for n, v in results.items()}}, fp)
finally:
    try:
        os.unlink(path)
    except OSError:
        pass

print()
print(f"{'row':<32} {'fio GB/s':>9} {'ferry GB/s':>10} {'ratio':>6} {'>=0.95':>6} "
      f"{'fio cpu-s/GB':>12} {'ferry cpu-s/GB':>14} {'cpu ok':>6} {'round ratios':>12} (range, rounds)")
summary = []
met_all = True
for name, res in results.items():
    for t in tools_of(res["params"])[1:]:
        label = name if t == "ferry" else f"{name} [{t}]"
        ok_rounds = [g for g in res["rounds"] if "error" not in g["fio"] and "error" not in g[t]]
        if not ok_rounds:
            errs = res["rounds"][0] if res["rounds"] else {}
            why = "; ".join(f"{k}: {g['error']}" for k, g in errs.items() if "error" in g and k in ("fio", t))
            print(f"{label:<32} n/a: {why}")
            summary.append({"row": name, "variant": t, "error": why})
            continue
        med = lambda tool, key: statistics.median(g[tool][key] for g in ok_rounds if g[tool][key] is not None)
        fg, yg = med("fio", "gbps"), med(t, "gbps")
        fc, yc = med("fio", "cpu_s_per_gb"), med(t, "cpu_s_per_gb")
        ratio = yg / fg if fg else 0
        # the median of each round's own ratio: the two runs of a round are minutes closer than
        # the rounds are to each other, so this one is less moved by the machine's drift
        rrs = [g[t]["gbps"] / g["fio"]["gbps"] for g in ok_rounds if g["fio"]["gbps"]]
        rr = statistics.median(rrs)
        # how the rounds spread: ferry at or above fio, and at or above the mark, in how many
        ahead, at_mark = sum(x >= 1 for x in rrs), sum(x >= 0.95 for x in rrs)
        met = ratio >= 0.95
        cpu_ok = yc <= fc * 1.05
        if t == "ferry":
            met_all &= met
        print(f"{label:<32} {fg:9.3f} {yg:10.3f} {ratio:6.3f} {'yes' if met else 'NO':>6} "
              f"{fc:12.2f} {yc:14.2f} {'yes' if cpu_ok else 'NO':>6} {rr:12.3f} "
              f"{min(rrs):.2f}-{max(rrs):.2f}, {ahead}/{len(rrs)} ahead, {at_mark}/{len(rrs)} >=0.95")
        summary.append({"row": name, "variant": t, "fio_gbps": fg, "ferry_gbps": yg, "ratio": ratio,
                        "ratio_median_of_rounds": rr, "met_0_95": met, "round_ratios": rrs,
                        "rounds_ahead": ahead, "rounds_at_0_95": at_mark,
                        "fio_cpu_s_per_gb": fc, "ferry_cpu_s_per_gb": yc, "cpu_no_higher": cpu_ok})
print(f"\nferry >= 0.95x fio on every row: {'yes' if met_all else 'NO'} "
      "(GB/s and cpu-s/GB are medians over rounds; cpu ok: ferry's CPU per GB within 5% of fio's; "
      "round ratios: the median of each round's ferry/fio, their range, the rounds where ferry ran at or above "
      "fio and at or above 0.95x)")
if E["JSON"]:
    with open(E["JSON"], "w") as f:
        json.dump({"schema_version": 2, "ferry": ferry, "variants": {k: {"env": e, "args": x} for k, (e, x) in VARIANTS.items()},
                   "fio_variants": {k: {"env": e, "args": x} for k, (e, x) in FIO_VARIANTS.items()}, "fio": fio, "dir": d, "size": size,
                   "runtime_s": float(runtime), "rounds": rounds, "timestamp": int(time.time()),
                   "taskset": E["TASKSET"] or None, "variant_rows": VARIANT_ROWS or None,
                   "uname": " ".join(os.uname()), "summary": summary,
                   "raw": {k: v["rounds"] for k, v in results.items()}}, f, indent=2)
        f.write("\n")
    try:
        os.unlink(E["JSON"] + ".partial")
    except OSError:
        pass
PY
