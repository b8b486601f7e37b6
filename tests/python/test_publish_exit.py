"""A process that exits without destroying its contexts (the Python interpreter does not) removes
its stats files (FERRY_PUBLISH=1); before, every Python process left one per context in the run
directory for `ferry top` to clean up. A fork()ed child's exit leaves the parent's in place."""
import os
import subprocess
import sys
import textwrap

from conftest import need

need("numpy")
need("torch")

CODE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import ferry
    path = sys.argv[1]
    ferry.write_dataset(path + "/ds", [np.arange(100, dtype=np.uint16)] * 8)
    loader = ferry.Loader(path + "/ds", batch_size=2, device="cpu")  # publishes its activity
    data, offsets = next(iter(loader))
    assert int(data[5]) == 5
    loader.close()  # its threads joined: the fork below is safe; the contexts stay (and publish)
    run = os.environ["FERRY_RUN_DIR"]
    before = sorted(os.listdir(run))
    print("published", len(before))
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal exit: the atexit handlers run in the child
    os.waitpid(pid, 0)
    assert sorted(os.listdir(run)) == before, "a forked child removed its parent's stats files"
""")


def test_stats_files_removed_at_exit(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, FERRY_PUBLISH="1", FERRY_RUN_DIR=str(run))
    out = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "published" in out.stdout
    published = int(out.stdout.split("published")[1].split()[0])
    assert published >= 1, "nothing was published: the test checks nothing"
    assert os.listdir(run) == [], "stats files left after a normal exit: %s" % os.listdir(run)
