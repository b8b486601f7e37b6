"""ferry bench: bad input gets one clear sentence and the right exit code, and data on disk is kept."""
import os
import subprocess

from _bench import check, finish, run, scratch, sha, stderr_line, write_random

MiB = 1 << 20


def one_sentence(tag, err, *words):
    lines = stderr_line(err)
    check(len(lines) == 1, f"{tag}: one line on stderr", lines)
    for w in words:
        check(w in err, f"{tag}: message names {w!r}", err.strip())


def main():
    d = scratch()
    data = os.path.join(d, "data")
    write_random(data, 8 * MiB)
    before = sha(data)

    # Usage errors: exit 2, naming the option and what was expected.
    usage = [
        (["--bogus", "1"], "--bogus"),
        (["--rw", "readwrite"], "--rw"),
        (["--bs", "4x"], "--bs"),
        (["--bs", "1m:4k"], "--bs"),
        (["--bs", "0"], "--bs"),
        (["--size", "-5"], "--size"),
        (["--iodepth", "0"], "--iodepth"),
        (["--iodepth", "many"], "--iodepth"),
        (["--numjobs", "1.5"], "--numjobs"),
        (["--direct", "2"], "--direct"),
        (["--ioengine", "libaio"], "--ioengine"),
        (["--runtime", "soon"], "--runtime"),
        (["--rwmixread", "101"], "--rwmixread"),
        (["--verify", "md5"], "--verify"),
        (["--output-format", "xml"], "--output-format"),
        (["--cold=sometimes"], "--cold"),
        (["--randseed", "-1"], "--randseed"),
        (["--random_generator", "mt19937"], "--random_generator"),
        (["--norandommap=yes"], "--norandommap"),
        (["--time_based"], "--time_based"),
        (["--runtime", "1", "--io_size", "1m"], "--runtime"),
        (["--report", "x.html"], "--report"),
        (["--iodepth"], "--iodepth"),
        (["--offset_increment", "1m", "--numjobs", "2"], "--offset_increment"),
        (["--offset_increment", "lots"], "--offset_increment"),
        (["--end_fsync", "2"], "--end_fsync"),
        (["--iodepth_batch_submit", "65537"], "--iodepth_batch_submit"),
        (["stray"], "stray"),
    ]
    for args, name in usage:
        rc, out, err = run("--filename", data, *args)
        tag = " ".join(args)
        check(rc == 2, f"{tag}: exit 2", (rc, err), 2)
        one_sentence(tag, err, name)
        check(out == "", f"{tag}: nothing on stdout", out)
    rc, _, err = run("--rw", "read")
    check(rc == 2 and "--filename" in err, "no --filename is a usage error", (rc, err))
    rc, out, _ = run("--help")
    check(rc == 0 and "--iodepth" in out and "--verify" in out, "--help exits 0 and lists options", rc)

    # Runtime errors: exit 1 with one sentence naming the file.
    missing = os.path.join(d, "missing")
    rc, _, err = run("--filename", missing)
    check(rc == 1, "missing file: exit 1", (rc, err), 1)
    one_sentence("missing file", err, missing)
    check(not os.path.exists(missing), "missing file is not created without --size")

    rc, _, err = run("--filename", d)
    check(rc == 1, "directory: exit 1", (rc, err), 1)
    one_sentence("directory", err, d, "directory")

    rc, _, err = run("--filename", data, "--size", "16m")
    check(rc == 1, "file smaller than --size: exit 1", (rc, err), 1)
    one_sentence("smaller than --size", err, data, str(8 * MiB), str(16 * MiB))
    check(os.path.getsize(data) == 8 * MiB and sha(data) == before,
          "a read never extends or changes the file", os.path.getsize(data), 8 * MiB)

    rc, _, err = run("--filename", data, "--size", "4m", "--numjobs", "3", "--offset_increment", "4m")
    check(rc == 1, "regions past the end of the file: exit 1", (rc, err), 1)
    one_sentence("regions past the end", err, data, "3 jobs", "--offset_increment")
    check(sha(data) == before, "a read with --offset_increment never changes the file")

    notdir = os.path.join(data, "x")
    rc, _, err = run("--filename", notdir, "--rw", "write", "--size", "1m")
    check(rc == 1, "path under a file: exit 1", (rc, err), 1)
    one_sentence("path under a file", err, notdir)

    # An unwritable directory: a read-only mount (root) or a mode 0555 directory (others).
    ro = os.path.join(d, "ro")
    os.mkdir(ro)
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro],
                                 capture_output=True).returncode == 0
        if not mounted:
            print("skipped: unwritable path: cannot mount a read-only tmpfs here")
    else:
        os.chmod(ro, 0o555)
    try:
        if mounted or os.geteuid() != 0:
            target = os.path.join(ro, "out")
            rc, _, err = run("--filename", target, "--rw", "write", "--size", "1m")
            check(rc == 1, "unwritable path: exit 1", (rc, err), 1)
            one_sentence("unwritable path", err, target)
    finally:
        if mounted:
            subprocess.run(["umount", ro])

    # A read creates and lays out a missing file when --size is given.
    fresh = os.path.join(d, "fresh")
    rc, _, err = run("--filename", fresh, "--size", "2m", "--bs", "64k")
    check(rc == 0 and os.path.getsize(fresh) == 2 * MiB, "read with --size lays out a new file",
          (rc, err, os.path.exists(fresh) and os.path.getsize(fresh)))

    # Reads leave the file as it was (cold cache too); writes stay inside [--offset, --offset + --size).
    for args in (["--rw", "randread", "--io_size", "1m"], ["--rw", "read", "--cold", "--io_size", "1m"]):
        rc, out, err = run("--filename", data, *args)
        check(rc == 0 and sha(data) == before, f"{' '.join(args)} leaves the file unchanged", (rc, err))
    rc, out, err = run("--filename", data, "--rw", "read", "--cold", "--io_size", "1m")
    check("posix_fadvise" in out, "--cold says what it did", out)

    with open(data, "rb") as f:
        orig = f.read()
    rc, _, err = run("--filename", data, "--rw", "randwrite", "--offset", "2m", "--size", "3m",
                     "--bs", "4k", "--io_size", "8m", "--iodepth", "8")
    check(rc == 0, "write inside the file", (rc, err), 0)
    with open(data, "rb") as f:
        now = f.read()
    check(len(now) == len(orig), "a write inside the file never truncates it", len(now), len(orig))
    check(now[:2 * MiB] == orig[:2 * MiB], "bytes before --offset untouched")
    check(now[5 * MiB:] == orig[5 * MiB:], "bytes after --offset + --size untouched")
    check(now[2 * MiB:5 * MiB] != orig[2 * MiB:5 * MiB], "the region itself was written")
    finish()


main()
