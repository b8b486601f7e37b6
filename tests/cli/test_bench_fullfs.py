"""ferry bench on a full file system (a 4 MiB tmpfs): exit 1 naming the error, other bytes kept."""
import os
import subprocess
import time

from _bench import check, finish, run, scratch, skip, stderr_line, write_random

MiB = 1 << 20


def settle(mnt, want_free):
    """An exited process's io_uring is torn down asynchronously and holds its files a moment."""
    for _ in range(100):
        st = os.statvfs(mnt)
        if st.f_bavail * st.f_frsize >= want_free:
            return True
        time.sleep(0.05)
    return False


def umount(mnt):
    for _ in range(100):
        if subprocess.run(["umount", mnt], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    print(f"note: could not unmount {mnt}")


def main():
    if os.geteuid() != 0:
        skip("mounting a small tmpfs needs root")
    d = scratch()
    mnt = os.path.join(d, "full")
    os.mkdir(mnt)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], capture_output=True, text=True)
    if p.returncode != 0:
        skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        new = os.path.join(mnt, "new")
        rc, _, err = run("--filename", new, "--rw", "write", "--bs", "64k", "--size", "8m")
        check(rc == 1, "write past a full file system: exit 1", (rc, err), 1)
        check("No space left on device" in err and new in err and "offset" in err,
              "message names the error, file and offset", err.strip())
        check(len(stderr_line(err)) == 1, "one sentence", err)

        check(not os.path.exists(new), "the file this failed write created is removed")
        check(settle(mnt, 4 * MiB), "its space comes back")

        # The run fails at the end of the file system; the bytes before --offset stay as they were.
        old = os.path.join(mnt, "old")
        write_random(old, 3 * MiB)
        with open(old, "rb") as f:
            orig = f.read()
        for e in ("psync", "io_uring"):
            rc, _, err = run("--filename", old, "--rw", "write", "--bs", "64k", "--offset", "2m",
                             "--size", "4m", "--ioengine", e, "--iodepth", "4")
            if e == "io_uring" and "cannot run here" in err:
                print(f"skipped: io_uring part: {err.strip()}")
                continue
            check(rc == 1 and "No space left on device" in err, f"{e}: failed run exits 1", (rc, err))
            with open(old, "rb") as f:
                now = f.read()
            check(now[:2 * MiB] == orig[:2 * MiB], f"{e}: bytes before --offset untouched after a failed run")
            check(os.path.exists(old), f"{e}: the existing file is kept")

        # Laying out a file for a read fails cleanly and leaves no partial file.
        os.unlink(old)
        settle(mnt, 4 * MiB)
        lay = os.path.join(mnt, "layout")
        rc, _, err = run("--filename", lay, "--rw", "read", "--size", "8m")
        check(rc == 1 and "No space left on device" in err, "layout on a full file system exits 1", (rc, err))
        check(not os.path.exists(lay), "the partial laid-out file is removed")
    finally:
        umount(mnt)
    finish()


main()
