"""ferry bench -x (transfer modes to and from GPU memory): options, and what happens without a GPU.
On the GPU machine the same command runs every mode for real (scripts/gpu-check.sh)."""
import os

from _bench import FERRY, check, finish, run, run_json, scratch

d = scratch()
f = os.path.join(d, "x")
rc, out, err = run("--filename", f, "--size", "8m", "--bs", "1m", "--rw", "read")
check(rc == 0, "lay out the file", (rc, err), 0)

# usage errors exit 2 with a sentence naming the option
for args, needle in [
    (["-x", "bogus"], "-x expects a transfer mode"),
    (["-x", "9"], "-x expects a transfer mode"),
    (["--gpu", "1"], "--gpu goes with -x"),
    (["-x", "3", "--verify=crc32c", "--bs", "4k"], "does not go with -x"),
    (["-x", "all", "--bs", "4k:8k"], "-x all takes one --bs"),
    (["--api", "mmap"], "--api expects queue or pread"),
]:
    rc, out, err = run("--filename", f, *args)
    check(rc == 2, f"{args} is a usage error", (rc, err), 2)
    check(needle in err, f"{args} says why", err, needle)

# gdsio's numbers and the names are the same modes; -x1 (attached) works too
for spelling in (["-x", "1"], ["-x1"], ["--xfer", "cpu"], ["-x", "cpu"]):
    j = run_json("--filename", f, "--bs", "1m", *spelling)
    if j:
        x = j["jobs"][0]["ferry"]["xfer"]
        check(x["mode"] == "cpu" and x["gdsio_mode"] == 1, f"{spelling} is mode cpu", x)
        check(j["jobs"][0]["read"]["io_bytes"] == 8 << 20, f"{spelling} read the file",
              j["jobs"][0]["read"]["io_bytes"], 8 << 20)

rc, out, err = run("--filename", f, "--bs", "1m", "-x", "all")
check(rc == 0, "-x all runs what can run", (rc, err), 0)
check("transfer modes" in out and "cpu " in out, "-x all prints the modes' table", out)
# The test runs on machines with and without a GPU: which one this is comes from the library.
gpu = "cannot run here: no GPU" not in out
print(f"GPU present: {gpu}")
if gpu:
    # on a GPU machine the pipelined modes run; GDS modes run or say why not
    for mode in ("cpu-gpu", "cpu-async-gpu", "pagecache-gpu", "auto"):
        line = next((l for l in out.splitlines() if l.strip().startswith(mode + " ")), "")
        check(line and "cannot run" not in line, f"-x all: {mode} runs on a GPU machine", line)
    for mode in ("gds", "gds-async", "gds-batch"):
        line = next((l for l in out.splitlines() if l.strip().startswith(mode + " ")), "")
        check(line and ("cannot run here: " in line and "GDS" in line or "cannot run" not in line),
              f"-x all: {mode} runs or says why GDS cannot", line)
else:
    # without a GPU every GPU mode says why it cannot run, and the cpu mode still measures
    for mode in ("cpu-gpu", "cpu-async-gpu", "pagecache-gpu", "gds", "gds-async", "gds-batch", "auto"):
        line = next((l for l in out.splitlines() if l.strip().startswith(mode + " ")), "")
        check("cannot run here: no GPU" in line, f"-x all: {mode} says it cannot run, and why", line)
    rc, out, err = run("--filename", f, "--bs", "1m", "-x", "cpu-async-gpu")
    check(rc == 1, "an explicit GPU mode without a GPU fails", (rc, out, err), 1)
    check("needs a GPU" in err and "libcuda" in err, "and names what is missing", err)
    j = run_json("--filename", f, "--bs", "1m", "-x", "all")
    if j:
        modes = [c["mode"] for c in j["ferry"]["xfer_cannot_run"]]
        check(set(modes) == {"cpu-gpu", "cpu-async-gpu", "pagecache-gpu", "gds", "gds-async",
                             "gds-batch", "auto"}, "JSON lists the modes that cannot run", modes)
        check(len(j["jobs"]) == 1, "JSON has a job per mode that ran", len(j["jobs"]), 1)

# --api=pread goes through the worker pool: the same bytes, and the engine splits big I/Os
j = run_json("--filename", f, "--bs", "4m", "--api", "pread")
if j:
    check(j["jobs"][0]["read"]["io_bytes"] == 8 << 20, "--api=pread reads the region",
          j["jobs"][0]["read"]["io_bytes"], 8 << 20)
    check(j["jobs"][0]["ferry"]["engine_stats"]["chunks"] >= 8, "4 MiB I/Os are cut into 1 MiB chunks",
          j["jobs"][0]["ferry"]["engine_stats"]["chunks"])
finish()
