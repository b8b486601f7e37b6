"""Runs a worker script as the ranks of a gloo group on 127.0.0.1 (the DCP tests' launches)."""
import os
import socket
import subprocess
import sys


def env():
    """The tests' environment for a subprocess: this process's sys.path (ferry as installed for
    the tests), one OpenMP thread."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run(script, world, args, timeout=300):
    """script PORT RANK WORLD *args for each rank; every rank must exit 0. Returns rank 0's output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, str(script), port, str(r), str(world)] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(),
                              text=True) for r in range(world)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, "rank %d of %d failed:\n%s" % (r, world, out)
    return outs[0]
