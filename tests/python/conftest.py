import os

import pytest


@pytest.fixture
def data(tmp_path):
    """A 1 MiB file of known random bytes: (path, bytes)."""
    payload = os.urandom(1 << 20)
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    return path, payload


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def ferry_cli():
    """The ferry CLI the tests drive: FERRY_CLI (CI: the wheel's `ferry`) or build/ferry; skips the
    test, saying why, where there is none."""
    c = os.environ.get("FERRY_CLI") or os.path.join(ROOT, "build", "ferry")
    if not os.access(c, os.X_OK):
        pytest.skip("no ferry CLI at %s (cmake --build build, or set FERRY_CLI)" % c)
    return c


@pytest.fixture(scope="module")
def cli():
    """ferry_cli(), for a module's tests."""
    return ferry_cli()


def need(module):
    """Import module or skip the test, saying why (never a silent pass)."""
    return pytest.importorskip(module, reason="%s is not installed in this environment" % module)


def run_ranks(script, world, *args, timeout=120):
    """Runs `python script RANK WORLD *args` as `world` processes (gloo ranks on the CPU: no GPU,
    one OpenMP thread each), waits for all, kills what is left on a timeout, and asserts each exited
    0 having printed "rank R ok". Returns their outputs (stdout and stderr together), by rank."""
    import subprocess
    import sys
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world)] + [str(a) for a in args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and ("rank %d ok" % r) in out, "rank %d exit %s:\n%s" % (r, p.returncode, out)
    return outs


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on 127.0.0.1 with one bucket (_moto.Server), started for a test module and
    stopped after it. The module skips first, saying why, when moto or boto3 is missing."""
    import _moto
    s = _moto.Server()
    yield s
    s.stop()


@pytest.fixture
def s3_env(monkeypatch, tmp_path, s3_server):
    """A clean AWS environment pointed at s3_server, and TMPDIR an empty directory (where a save to a
    URL stages its temporary), which it returns."""
    import _moto
    stage = tmp_path / "stage"
    stage.mkdir()
    monkeypatch.setenv("TMPDIR", str(stage))
    _moto.use(monkeypatch, tmp_path, s3_server)
    return stage
