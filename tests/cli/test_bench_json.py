"""ferry bench --output-format=json, read the way scripts read fio's JSON, once per engine."""
import json
import os
import shutil
import subprocess

from _bench import check, engines, finish, run, run_json, scratch, write_random

PCTS = ["1.000000", "5.000000", "10.000000", "20.000000", "30.000000", "40.000000", "50.000000",
        "60.000000", "70.000000", "80.000000", "90.000000", "95.000000", "99.000000", "99.500000",
        "99.900000", "99.950000", "99.990000"]


def check_dir(tag, d, bs, want_ios):
    """Relations that hold in fio's output too."""
    ios, nbytes = d["total_ios"], d["io_bytes"]
    if not want_ios:
        check(ios == 0 and nbytes == 0, f"{tag}: no I/O", (ios, nbytes), (0, 0))
        check("percentile" not in d["clat_ns"], f"{tag}: no percentiles without I/O (as fio)")
        return
    check(ios > 0, f"{tag}: total_ios > 0", ios)
    check(nbytes == ios * bs, f"{tag}: io_bytes == total_ios * bs", nbytes, ios * bs)
    check(d["io_kbytes"] == nbytes // 1024, f"{tag}: io_kbytes", d["io_kbytes"], nbytes // 1024)
    check(d["bw"] == d["bw_bytes"] // 1024, f"{tag}: bw is KiB/s", d["bw"], d["bw_bytes"] // 1024)
    secs = d["runtime"] / 1000.0
    if secs >= 0.2:
        want = nbytes / secs
        check(abs(d["bw_bytes"] - want) <= 0.02 * want, f"{tag}: bw_bytes ~ io_bytes / runtime",
              d["bw_bytes"], want)
        check(abs(d["iops"] - ios / secs) <= 0.02 * ios / secs, f"{tag}: iops ~ total_ios / runtime",
              d["iops"], ios / secs)
    for key in ("clat_ns", "lat_ns"):
        lat = d[key]
        check(lat["N"] == ios, f"{tag}: {key}.N == total_ios", lat["N"], ios)
        check(0 < lat["min"] <= lat["mean"] <= lat["max"], f"{tag}: {key} min <= mean <= max",
              (lat["min"], lat["mean"], lat["max"]))
        check(lat["stddev"] >= 0, f"{tag}: {key}.stddev >= 0", lat["stddev"])
        p = lat.get("percentile", {})
        check(list(p.keys()) == PCTS, f"{tag}: {key} percentile keys as fio's", list(p.keys()), PCTS)
        vals = [p[k] for k in PCTS if k in p]
        check(vals == sorted(vals), f"{tag}: {key} percentiles monotonic", vals)
        if vals:
            check(lat["min"] <= vals[0] and vals[-1] <= lat["max"],
                  f"{tag}: {key} percentiles within [min, max]", (lat["min"], vals, lat["max"]))
    check(d["lat_ns"]["mean"] >= d["clat_ns"]["mean"], f"{tag}: lat_ns.mean >= clat_ns.mean",
          d["lat_ns"]["mean"], d["clat_ns"]["mean"])


def check_job(tag, job, engine):
    check(isinstance(job["usr_cpu"], float) and job["usr_cpu"] >= 0, f"{tag}: usr_cpu", job["usr_cpu"])
    check(isinstance(job["sys_cpu"], float) and job["sys_cpu"] >= 0, f"{tag}: sys_cpu", job["sys_cpu"])
    check(job["usr_cpu"] + job["sys_cpu"] > 0, f"{tag}: some CPU time was measured")
    check(isinstance(job["ctx"], int) and job["ctx"] >= 0, f"{tag}: ctx", job["ctx"])
    f = job["ferry"]
    check(f["schema_version"] == 1, f"{tag}: ferry.schema_version", f["schema_version"], 1)
    check(f["backend"] == engine, f"{tag}: ferry.backend is the engine asked for", f["backend"], engine)
    check(isinstance(f["direct"], bool), f"{tag}: ferry.direct is a boolean", f["direct"])
    check(f["cpu_cores"] > 0, f"{tag}: ferry.cpu_cores > 0", f["cpu_cores"])
    total = job["read"]["bw_bytes"] + job["write"]["bw_bytes"]
    check(abs(f["gbps"] * 1e9 - total) <= 0.01 * total + 1, f"{tag}: ferry.gbps ~ bw_bytes / 1e9",
          f["gbps"], total / 1e9)


def main():
    d = scratch()
    path = os.path.join(d, "data")
    write_random(path, 16 << 20)
    for e in engines(d):
        # Time based: each direction's runtime is long enough to check bw against bytes/runtime.
        doc = run_json("--filename", path, "--rw", "randread", "--bs", "4k", "--iodepth", "8",
                       "--ioengine", e, "--runtime", "0.4", "--name", f"rr-{e}")
        if doc:
            job = doc["jobs"][0]
            check(job["jobname"] == f"rr-{e}", "jobname", job["jobname"], f"rr-{e}")
            check(doc["ferry version"].startswith("ferry-"), "ferry version", doc["ferry version"])
            check(isinstance(doc["timestamp"], int), "timestamp is an integer", doc["timestamp"])
            check_dir(f"{e} randread", job["read"], 4096, True)
            check_dir(f"{e} randread write side", job["write"], 4096, False)
            check_job(f"{e} randread", job, e)
            want_qd = 1 if e == "psync" else 8
            check(job["ferry"]["iodepth"] == want_qd, f"{e}: effective iodepth", job["ferry"]["iodepth"], want_qd)
            top = doc["ferry"]
            check(top["schema_version"] == 1 and top["backend"] == e and top["cpu_cores"] > 0,
                  f"{e}: top-level ferry object", top)

        # By bytes: exactly io_size / bs I/Os per job.
        doc = run_json("--filename", path, "--rw", "write", "--bs", "64k", "--size", "4m",
                       "--io_size", "8m", "--numjobs", "2", "--iodepth", "4", "--ioengine", e)
        if doc:
            job = doc["jobs"][0]
            check(job["write"]["total_ios"] == 2 * (8 << 20) // (64 << 10), f"{e}: write total_ios",
                  job["write"]["total_ios"], 256)
            check_dir(f"{e} write", job["write"], 65536, True)
            check_dir(f"{e} write read side", job["read"], 65536, False)

        doc = run_json("--filename", path, "--rw", "randrw", "--rwmixread", "70", "--bs", "4k",
                       "--io_size", "8m", "--iodepth", "4", "--ioengine", e)
        if doc:
            r, w = doc["jobs"][0]["read"], doc["jobs"][0]["write"]
            n = r["total_ios"] + w["total_ios"]
            check(n == 2048, f"{e}: randrw total I/Os", n, 2048)
            check(0.62 <= r["total_ios"] / n <= 0.78, f"{e}: randrw read share ~ 70%", r["total_ios"] / n)

        doc = run_json("--filename", path, "--rw", "read", "--bs", "4k:32k", "--io_size", "1m",
                       "--ioengine", e)
        if doc:
            got = [j["ferry"]["bs"] for j in doc["jobs"]]
            check(got == [4096, 8192, 16384, 32768], f"{e}: --bs sweep doubles", got)

    # --output FILE
    out = os.path.join(d, "out.json")
    rc, stdout, err = run("--filename", path, "--io_size", "1m", "--output-format=json", "--output", out)
    check(rc == 0 and stdout == "", "--output writes nothing on stdout", (rc, stdout, err))
    with open(out) as f:
        check(json.load(f)["jobs"][0]["read"]["io_bytes"] == 1 << 20, "--output file holds the JSON")

    # Same key names and nesting as fio's, for what both report.
    fio = os.environ.get("FIO") or shutil.which("fio")
    if not fio:
        print("skipped: comparison with fio's keys: fio is not installed")
    else:
        p = subprocess.run([fio, "--name=k", f"--filename={path}", "--rw=randread", "--bs=4k",
                            "--size=1m", "--output-format=json"], capture_output=True, text=True)
        if p.returncode == 0:
            fj = json.loads(p.stdout)["jobs"][0]
            doc = run_json("--filename", path, "--rw", "randread", "--bs", "4k", "--size", "1m")
            if doc:
                fe = doc["jobs"][0]
                extra = set(fe) - set(fj) - {"ferry"}
                check(not extra, "job keys that fio does not have", sorted(extra), [])
                for side in ("read", "write"):
                    extra = set(fe[side]) - set(fj[side])
                    check(not extra, f"{side} keys that fio does not have", sorted(extra), [])
                    for k in ("clat_ns", "lat_ns", "slat_ns"):
                        extra = set(fe[side][k]) - set(fj[side][k]) - {"percentile"}
                        check(not extra, f"{side}.{k} keys that fio does not have", sorted(extra), [])
                check(list(fe["read"]["clat_ns"]["percentile"]) == list(fj["read"]["clat_ns"]["percentile"]),
                      "percentile keys equal fio's", list(fe["read"]["clat_ns"]["percentile"]),
                      list(fj["read"]["clat_ns"]["percentile"]))
        else:
            print(f"skipped: comparison with fio's keys: fio failed: {p.stderr.strip()}")
    finish()


main()
