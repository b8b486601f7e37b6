"""A child made by fork() without exec while a Loader runs (os.fork, multiprocessing's fork start
method) exits normally: destroying its copies of the loader and the contexts no longer joins the
parent's threads, which do not exist in the child, or waits on a lock one of them held at the fork
(the child hung at exit)."""
import os
import subprocess
import sys
import textwrap

from conftest import need

need("numpy")
need("torch")

CODE = textwrap.dedent("""
    import gc, os, sys, tempfile
    import numpy as np
    import ferry
    d = tempfile.mkdtemp()
    ferry.write_dataset(d + "/ds", [np.arange(100, dtype=np.uint16)] * 64)
    loader = ferry.Loader(d + "/ds", batch_size=2, device="cpu", prefetch=4, threads=2)
    it = iter(loader)
    next(it)
    pid = os.fork()
    if pid == 0:
        del it, loader
        gc.collect()
        sys.exit(0)
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
    assert sum(1 for _ in loader) > 0  # the parent's loader still works
    print("ok")
""")


def test_forked_child_exits_while_a_loader_runs():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
