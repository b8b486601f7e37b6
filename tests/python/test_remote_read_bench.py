"""bench/remote-read.py (issue 23's throughput bench for the GPU machine) runs here in its host-only
mode on a tiny object: its range server answers ferry's ranged GETs with the exact bytes (ferry's
read is checked against the file), it prints the ceiling, ferry's row and the target verdict, and
says the GPU rows are skipped and why. The device run: GPU_BENCHES=remote-read scripts/gpu-check.sh."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (the bench's buffers are torch tensors)")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_remote_read_bench_host_rows(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "remote-read.py"), "--cpu", "--size", "16m",
                        "--procs", "1", "--rounds", "1", "--conns", "2", "--file", str(tmp_path / "obj.dat")],
                       capture_output=True, text=True, timeout=120, env=env)
    if p.returncode == 77:
        pytest.skip("bench/remote-read.py skipped: " + p.stdout[-300:])
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("TABLE remote-read ")]
    assert any(r.startswith("TABLE remote-read ferry host remote_connections=2 | ") and "GB/s" in r for r in rows), rows
    assert any("gpu" in r and "| skipped | no CUDA device" in r for r in rows), rows
    if shutil.which("curl"):
        assert any(r.startswith("TABLE remote-read ceiling curl x2") for r in rows), rows
        assert any(r.startswith("TABLE remote-read ferry host vs ceiling | ") and "target 0.9x" in r for r in rows), rows
    assert not os.path.exists(tmp_path / "obj.dat")  # the object is removed


def test_range_server_bytes(tmp_path):
    """The server's ranged bodies are the file's bytes (what the bench's figures are worth)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("remote_read", os.path.join(ROOT, "bench", "remote-read.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = os.urandom(3 << 20)
    path = tmp_path / "obj.dat"
    path.write_bytes(data)
    url, procs, sock = mod.start_server(str(path), 1)
    try:
        import ferry
        f = ferry.open(url, context=ferry.Context(remote_part_size="256k", remote_connections=4, threads=2))
        buf = bytearray(len(data))
        assert f.pread_into(buf, 0) == len(data) and bytes(buf) == data
        part = bytearray(1000)
        assert f.pread_into(part, 12345) == 1000 and bytes(part) == data[12345:13345]
        f.close()
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
        sock.close()
