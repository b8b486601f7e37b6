"""bench/remote-read.py (issue 23's throughput bench for the GPU machine) runs here in its host-only
mode on a tiny object behind nginx (tests/python/_nginx.py; scripts/setup.sh installs it): it
prints the ceiling (curl's parallel ranged GETs), ferry's host rows, the GPU rows skipped with the
reason, and the target verdict, and removes what it made. That ferry's ranged reads through nginx
are the file's bytes is test_s3_nginx.py's. The device run: GPU_BENCHES=remote-read
scripts/gpu-check.sh."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (the bench's buffers are torch tensors)")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_remote_read_bench_host_rows(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    d = tmp_path / "rr"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "remote-read.py"), "--cpu", "--size", "16m",
                        "--rounds", "1", "--slow-rounds", "1", "--conns", "2", "--workers", "2", "--dir", str(d)],
                       capture_output=True, text=True, timeout=300, env=env)
    if p.returncode == 77:
        pytest.skip("bench/remote-read.py skipped: " + p.stdout[-300:])
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("TABLE remote-read ")]
    assert any(r.startswith("TABLE remote-read ferry host threads=2 ") and "GB/s" in r for r in rows), rows
    assert any("kvikio" in r and "| skipped | no CUDA device" in r for r in rows), rows
    if shutil.which("curl"):
        assert any(r.startswith("TABLE remote-read ceiling curl x2") for r in rows), rows
        assert any(r.startswith("TABLE remote-read target ferry host vs ceiling | ") and "target 0.9x" in r
                   for r in rows), rows
    assert not os.path.exists(d)  # the objects and nginx's files are removed


@pytest.mark.parametrize("window", [None, 2])
def test_remote_loader_bench_runs(tmp_path, window):
    """bench/remote-loader.py (the cached loader's rows, GPU_BENCHES=remote-read) runs to its TABLE
    rows on a tiny dataset, with the loader's default shard window and with --shard-window: a
    default it passed the loader once (-1, refused by the unsigned knob) stopped it at its first
    loader on the GPU machine."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    d = tmp_path / "rl"
    args = [sys.executable, os.path.join(ROOT, "bench", "remote-loader.py"), "--gb", "0.01", "--shard", "1m",
            "--epochs", "2", "--fractions", "1,0.5", "--dir", str(d)]
    if window is not None:
        args += ["--shard-window", str(window)]
    else:
        # the local loader beside a paced fetch (GPU_BENCHES=remote-read passes 3); the evicting
        # cache also with shard_window 1, mapped=0 and 8 stagers
        args += ["--contend", "1", "--windows", "1", "--unmapped", "--jobs", "8"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [l for l in p.stdout.splitlines() if l.startswith("TABLE remote-loader ")]
    for name in ("local files", "s3:// cache unbounded", "s3:// cache 50% of the dataset"):
        assert any(r.startswith("TABLE remote-loader %s | " % name) and "samples/s" in r for r in rows), rows
    assert any("later epochs vs local" in r for r in rows), rows
    # the server's fetch rate, and what it allows an evicting cache's epochs against local files'
    assert any(r.startswith("TABLE remote-loader fetch ceiling | ") and "GB/s" in r for r in rows), rows
    assert any(r.startswith("TABLE remote-loader s3:// cache 50% of the dataset fetch bound | later epochs at most ")
               for r in rows), rows
    if window is None:
        assert any(r.startswith("TABLE remote-loader s3:// cache 50% of the dataset, shard_window 1 | ") and
                   "samples/s" in r for r in rows), rows
        assert any(r.startswith("TABLE remote-loader s3:// cache 50% of the dataset, shard_window 1 later epochs vs local")
                   for r in rows), rows
        for name in ("s3:// cache 50% of the dataset, mapped=0", "s3:// cache 50% of the dataset, shard_window 1, mapped=0"):
            assert any(r.startswith("TABLE remote-loader %s | " % name) and "samples/s" in r for r in rows), rows
        for name in ("s3:// cache 50% of the dataset, cache_jobs 8",
                     "s3:// cache 50% of the dataset, shard_window 1, mapped=0, cache_jobs 8"):
            assert any(r.startswith("TABLE remote-loader %s | " % name) and "samples/s" in r for r in rows), rows
        assert any(r.startswith("TABLE remote-loader fetch ceiling, 8 threads | ") and "GB/s" in r for r in rows), rows
        assert not any(r.startswith("TABLE remote-loader s3:// cache unbounded,") for r in rows), rows
        assert any(r.startswith("TABLE remote-loader local files beside a fetch | ") and "samples/s alone" in r
                   for r in rows), rows
        assert any(r.startswith("TABLE remote-loader local files, a new loader each epoch | ") and "us/batch" in r
                   for r in rows), rows
