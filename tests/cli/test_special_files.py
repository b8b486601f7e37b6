"""Issue 20 finding 8: FIFOs, sockets and directories are refused at once, naming the path and what it
is (an open of a FIFO would block forever); --bs that O_DIRECT cannot take is a usage error."""
import os
import socket
import subprocess

from _bench import FERRY, check, finish, run, scratch, write_random


def ferry(*args, timeout=20):
    try:
        p = subprocess.run([FERRY, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timed out (blocked on open?)"
    return p.returncode, p.stdout, p.stderr


def main():
    d = scratch()
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    sock_path = os.path.join(d, "sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(sock_path)

    for path, what in ((fifo, "FIFO"), (sock_path, "socket")):
        for rw in ("read", "write"):
            rc, _, err = ferry("bench", "--filename", path, "--rw", rw, "--size", "1m")
            check(rc == 1 and path in err and what in err, f"bench --rw {rw} of a {what}: exit 1 naming it",
                  (rc, err))

    rc, out, err = ferry("doctor", "--verbose", fifo, timeout=60)
    check(rc is not None, "doctor on a FIFO finishes", err)
    check(fifo in out and "FIFO" in out, "doctor says the path is a FIFO", out)

    rc, out, err = ferry("ckpt", "inspect", fifo)
    check(rc == 1 and fifo in err and "FIFO" in err, "ckpt inspect of a FIFO: exit 1 naming it", (rc, err))

    data = os.path.join(d, "data")
    write_random(data, 1 << 20)
    for bs in ("3", "4k:6000", "1000"):
        rc, out, err = run("--filename", data, "--bs", bs, "--direct", "1")
        check(rc == 2 and "--bs" in err and "512" in err, f"--bs {bs} --direct 1: usage error naming 512",
              (rc, err))
    rc, _, err = run("--filename", data, "--bs", "3", "--direct", "0", "--io_size", "3k")
    check(rc == 0, "--bs 3 buffered still runs", (rc, err))
    rc, _, err = run("--filename", data, "--bs", "4k", "--direct", "1", "--io_size", "64k")
    check(rc == 0 or "O_DIRECT" in err, "--bs 4k --direct 1 runs (or O_DIRECT is unsupported here)", (rc, err))
    sock.close()
    finish()


main()
