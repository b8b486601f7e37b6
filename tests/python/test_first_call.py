"""The first call in a fresh process (issue 22): the workers set up their own queues, so the
starting thread builds no ring and no slot (and slots are registered at their first use), and load_file's
spans are there for the asking (ferry.safetensors.last_trace(), FERRY_TRACE=1 on stderr)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ferry

START = textwrap.dedent("""
    import os, threading, ferry
    def cpu():
        out = {}
        for t in os.listdir("/proc/self/task"):
            try:
                with open("/proc/self/task/%s/schedstat" % t) as f:
                    out[int(t)] = int(f.read().split()[0])
            except OSError:
                pass
        return out
    c = ferry.Context()
    c.set("threads", "4")
    c.set("slots", "16")
    if c.backend != "io_uring" or c.get("register") != "1":
        print("SKIP backend %s, register %s: queue setup costs little here" % (c.backend, c.get("register")))
        raise SystemExit(0)
    me = threading.get_native_id()
    b = cpu()
    c.start()
    a = cpu()
    main = a[me] - b.get(me, 0)
    others = sum(v - b.get(k, 0) for k, v in a.items() if k != me)
    print("CPU", main, others)
    data = os.urandom(1 << 20)
    with open(os.environ["T_PATH"], "wb") as w:
        w.write(data)
    with c.open(os.environ["T_PATH"]) as f:
        buf = bytearray(len(data))
        assert f.pread_into(buf, 0) == len(data) and bytes(buf) == data
""")


def test_workers_set_up_their_own_queues(tmp_path):
    if not os.path.exists("/proc/self/task/%d/schedstat" % os.getpid()):
        pytest.skip("no /proc/<pid>/task/<tid>/schedstat (per-thread CPU time) here")
    env = dict(os.environ, T_PATH=str(tmp_path / "x.bin"))
    out = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout[5:].strip())
    main, others = (int(x) for x in out.stdout.split("CPU", 1)[1].split()[:2])
    # The starting thread builds no worker's ring or slots: each worker sets up its own queue, and
    # since 1232d0b registers a slot only when an I/O first uses it. When the starting thread built
    # every ring and registered every slot, start() cost it 10 ms of CPU here (4 workers x 16
    # slots, the 2-core VM); now 1-3 ms (the threads' creation), the workers' part under 1 ms.
    assert main < 5_000_000, (main, others)


def test_context_start_twice_and_threads():
    """Concurrent starts agree; every worker takes work after the start."""
    import threading
    c = ferry.Context()
    c.set("threads", "3")
    errs = []

    def go():
        try:
            c.start()
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=go) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    c.start()


def test_start_failure_is_reported(tmp_path):
    """A worker whose queue cannot be set up fails the start, and every later one, with its reason."""
    code = textwrap.dedent("""
        import resource, ferry
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        c = ferry.Context()
        c.set("threads", "3")
        c.set("chunk_size", "256m")
        c.set("slots", "64")  # 16 GiB of slots a worker
        for i in (1, 2):
            try:
                c.start()
            except OSError as e:
                print("ERR%d" % i, e)
            else:
                print("OK%d" % i)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ERR1") and "allocating a queue" in lines[0], out.stdout
    assert lines[1].startswith("ERR2") and lines[1][4:] == lines[0][4:], out.stdout
    assert lines[0].count("Cannot allocate memory") == 1, lines[0]


TRACE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import ferry.safetensors as st
    assert st.last_trace() is None
    st.save_file({"a": __import__("torch").arange(1000), "b": __import__("torch").ones(3, 4)}, sys.argv[1])
    for i in (1, 2):
        out = st.load_file(sys.argv[1])
        assert out["a"].tolist() == list(range(1000)) and out["b"].sum().item() == 12
        print("TRACE%d" % i, " ".join(sorted(st.last_trace())))
""")


def test_load_spans(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed in this environment")
    env = dict(os.environ, FERRY_TRACE="1")
    env.pop("FERRY_THREADS", None)
    out = subprocess.run([sys.executable, "-c", TRACE, str(tmp_path / "m.safetensors")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    first = out.stdout.split("TRACE1", 1)[1].splitlines()[0].split()
    second = out.stdout.split("TRACE2", 1)[1].splitlines()[0].split()
    for k in ("context", "open", "plan", "alloc", "read", "total"):
        assert k in first and k in second, (k, first, second)
    # the save started the default context's workers already? then no load starts them
    assert "workers_start" not in second, second
    assert out.stderr.count("ferry.safetensors.load_file: ") == 2, out.stderr
    assert "read=" in out.stderr and "total=" in out.stderr, out.stderr


def test_first_load_starts_workers_in_background(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    import ferry.safetensors as st
    path = tmp_path / "w.safetensors"
    st.save_file({"x": torch.arange(10)}, path)
    code = ("import sys, ferry.safetensors as st; o = st.load_file(sys.argv[1]); "
            "assert o['x'].tolist() == list(range(10)); print('KEYS', sorted(st.last_trace()))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'workers_start'" in out.stdout, out.stdout
