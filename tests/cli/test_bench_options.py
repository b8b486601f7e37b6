"""ferry bench: every option parses, as --opt=value and as --opt value, and takes effect."""
import ctypes
import json
import os
import platform
import subprocess

from _bench import check, finish, run, scratch, write_random

MiB = 1 << 20


def job(args, equals):
    """Runs with options given in one of the two spellings; returns jobs[0] or None."""
    argv = []
    for name, val in args:
        if val is None:
            argv.append(f"--{name}")
        elif equals:
            argv.append(f"--{name}={val}")
        else:
            argv += [f"--{name}", str(val)]
    rc, out, err = run(*argv, "--output-format=json")
    if not check(rc == 0, f"{' '.join(argv)}: exit 0", (rc, err.strip()), 0):
        return None
    return json.loads(out)["jobs"][0]


def dirty_pages(path):
    """The file's pages dirty or under writeback (cachestat(2), Linux 6.5); None where unknown."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    rng, cs = (ctypes.c_uint64 * 2)(0, 0), (ctypes.c_uint64 * 5)()
    fd = os.open(path, os.O_RDONLY)
    try:
        r = libc.syscall(ctypes.c_long(451), fd, rng, cs, 0)
    finally:
        os.close(fd)
    return cs[1] + cs[2] if r == 0 else None


def direct_writes_back_dirty_pages(d):
    """An O_DIRECT run writes the file's dirty pages back first, as fio's invalidate=1: else each
    read of a dirty block waits, in an io_uring worker, for the block's write."""
    path = os.path.join(d, "dirty")
    write_random(path, 8 * MiB)
    fs = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip()
    n = dirty_pages(path)
    if fs == "tmpfs" or not n:
        print(f"skipped: O_DIRECT writes back dirty pages: {fs or 'this'} file system, "
              f"{'cachestat(2) unavailable' if n is None else f'{n} dirty pages after a buffered write'}")
        return
    rc, out, err = run("--filename", path, "--rw", "randread", "--bs", "4k", "--io_size", "4k", "--direct", "1",
                       "--output-format=json")
    if rc != 0:
        print(f"skipped: O_DIRECT writes back dirty pages: --direct 1: {err.strip()}")
        return
    cold = json.loads(out)["jobs"][0]["ferry"]["cold_cache"]
    check("written back" in cold and dirty_pages(path) == 0, "--direct 1 writes the file's dirty pages back first",
          (cold, f"{n} dirty pages before, {dirty_pages(path)} after"))


def main():
    d = scratch()
    direct_writes_back_dirty_pages(d)
    data = os.path.join(d, "data")
    write_random(data, 8 * MiB)
    base = [("filename", data), ("io_size", "256k")]
    direct_ok = True
    for equals in (True, False):
        form = "--opt=value" if equals else "--opt value"
        for rw in ("read", "write", "randread", "randwrite", "randrw"):
            j = job(base + [("rw", rw)], equals)
            if j:
                check(j["ferry"]["rw"] == rw, f"{form}: --rw {rw}", j["ferry"]["rw"], rw)
        for spelled in ("4096", "4k", "4K", "4KiB", "4kb"):
            j = job(base + [("bs", spelled)], equals)
            if j:
                check(j["ferry"]["bs"] == 4096, f"{form}: --bs {spelled}", j["ferry"]["bs"], 4096)
        j = job([("filename", data), ("bs", "1.5m"), ("size", "3m")], equals)
        if j:
            check(j["ferry"]["bs"] == 1536 * 1024, f"{form}: --bs 1.5m", j["ferry"]["bs"])
        cases = [
            ("size", "2m", lambda j: j["ferry"]["size"] == 2 * MiB),
            ("offset", "1m", lambda j: j["ferry"]["offset"] == MiB and j["ferry"]["size"] == 7 * MiB),
            ("numjobs", "3", lambda j: j["ferry"]["numjobs"] == 3 and j["read"]["total_ios"] == 3 * 64),
            ("name", "my job", lambda j: j["jobname"] == "my job"),
            ("randseed", "42", lambda j: j["job options"]["randseed"] == "42"),
            ("random_generator", "lfsr", lambda j: j["job options"]["random_generator"] == "lfsr"),
            ("random_generator", "tausworthe", lambda j: "random_generator" not in j["job options"]),
            ("random_generator", "tausworthe64", lambda j: "random_generator" not in j["job options"]),
            ("ioengine", "psync", lambda j: j["ferry"]["backend"] == "psync"),
            ("ioengine", "auto", lambda j: j["ferry"]["backend"] in ("psync", "io_uring")),
            ("direct", "0", lambda j: j["ferry"]["direct"] is False),
            ("cold", "file", lambda j: "posix_fadvise" in j["ferry"]["cold_cache"]),
            ("cold", "system", lambda j: "drop_caches" in j["ferry"]["cold_cache"]
             or "posix_fadvise" in j["ferry"]["cold_cache"]),
        ]
        for name, val, ok in cases:
            j = job(base + [(name, val)], equals)
            if j:
                check(ok(j), f"{form}: --{name} {val} takes effect", j["ferry"])
        j = job(base + [("cold", None)], equals)
        if j:
            check("posix_fadvise" in j["ferry"]["cold_cache"], f"{form}: --cold", j["ferry"]["cold_cache"])
        for rw in ("randread", "randwrite"):
            j = job(base + [("rw", rw), ("norandommap", None)], equals)
            if j:
                check(j["job options"].get("norandommap") == "1" and
                      j["read" if rw == "randread" else "write"]["total_ios"] == 64,
                      f"{form}: --norandommap --rw {rw}", j["job options"])
        j = job([("filename", data), ("rw", "randrw"), ("rwmixread", "0"), ("io_size", "256k")], equals)
        if j:
            check(j["read"]["total_ios"] == 0 and j["write"]["total_ios"] == 64, f"{form}: --rwmixread 0",
                  (j["read"]["total_ios"], j["write"]["total_ios"]))
        # --offset_increment: each job its own region. Two jobs write verified blocks into the two
        # halves of a new file; reading the whole file back verifies every block where it belongs
        # (a job that wrote over the other's half would leave the first half unwritten: a hole of
        # zeros fails verification), and --end_fsync is accepted and reported.
        oi = os.path.join(d, f"oi-{int(equals)}")
        j = job([("filename", oi), ("rw", "write"), ("bs", "64k"), ("size", "1m"), ("numjobs", "2"),
                 ("offset_increment", "1m"), ("end_fsync", "1"), ("verify", "crc32c")], equals)
        if j:
            check(j["job options"].get("offset_increment") == "1048576" and j["job options"].get("end_fsync") == "1"
                  and j["write"]["io_bytes"] == 2 * MiB and os.path.getsize(oi) == 2 * MiB,
                  f"{form}: --offset_increment 1m --numjobs 2 --end_fsync 1", (j["job options"], j["write"]["io_bytes"]))
            rc, out, err = run("--filename", oi, "--bs", "64k", "--verify", "crc32c", "--output-format=json")
            check(rc == 0 and json.loads(out)["jobs"][0]["read"]["io_bytes"] == 2 * MiB,
                  f"{form}: both halves written by --offset_increment verify", (rc, err.strip()))
        # --iodepth_batch_submit: 1 (a submit per I/O) is the default, as fio's; 0 submits all queued
        # with the wait, 4 each fourth; every block still written once and verified after
        for batch in (None, "0", "4"):
            bf = os.path.join(d, f"bs{batch}-{int(equals)}")
            j = job([("filename", bf), ("rw", "randwrite"), ("bs", "4k"), ("size", "1m"), ("iodepth", "16"),
                     ("verify", "crc32c")] + ([("iodepth_batch_submit", batch)] if batch else []), equals)
            if j:
                check(j["job options"].get("iodepth_batch_submit") == (batch or "1") and j["write"]["total_ios"] == 256,
                      f"{form}: --iodepth_batch_submit {batch}", (j["job options"], j["write"]["total_ios"]))
                rc, out, err = run("--filename", bf, "--bs", "4k", "--size", "1m", "--rw", "randread", "--iodepth", "16",
                                   "--verify", "crc32c", "--output-format=json")
                check(rc == 0 and json.loads(out)["jobs"][0]["read"]["io_bytes"] == MiB,
                      f"{form}: --iodepth_batch_submit {batch}: every block verifies", (rc, err.strip()))
        j = job([("filename", data), ("runtime", "300ms"), ("time_based", None)], equals)
        if j:
            check(250 <= j["job_runtime"] <= 1500, f"{form}: --runtime 300ms", j["job_runtime"])
        j = job([("filename", "data"), ("directory", d), ("io_size", "64k")], equals)
        if j:
            check(j["job options"]["filename"] == data, f"{form}: --directory", j["job options"]["filename"])
        j = job([("filename", os.path.join(d, "v")), ("rw", "write"), ("size", "1m"), ("bs", "64k"),
                 ("verify", "crc32c")], equals)
        if j:
            check(j["ferry"]["verify"] == "crc32c", f"{form}: --verify", j["ferry"]["verify"])
        rc, _, err = run("--filename", data, "--ioengine", "io_uring", "--io_size", "64k")
        if rc == 0:
            j = job(base + [("ioengine", "io_uring"), ("iodepth", "8")], equals)
            if j:
                check(j["ferry"]["backend"] == "io_uring" and j["ferry"]["iodepth"] == 8,
                      f"{form}: --ioengine io_uring --iodepth 8", j["ferry"])
        else:
            print(f"skipped: io_uring options: {err.strip()}")
        if direct_ok:
            rc, out, err = run("--filename", data, "--direct", "1", "--io_size", "64k", "--output-format", "json")
            if rc == 0:
                check(json.loads(out)["jobs"][0]["ferry"]["direct"] is True, f"{form}: --direct 1")
            else:
                direct_ok = False
                print(f"skipped: --direct 1: {err.strip()}")
        out = os.path.join(d, "out.txt")
        rc, stdout, err = run("--filename", data, "--io_size", "64k", *(
            [f"--output={out}"] if equals else ["--output", out]))
        check(rc == 0 and stdout == "" and "GB/s" in open(out).read(), f"{form}: --output", (rc, err))
    finish()


main()
