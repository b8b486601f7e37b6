"""examples/train_ddp.py, the guide's train-checkpoint-resume example, run as a user would: 2 gloo
ranks, killed with SIGKILL at a random step and again right after an asynchronous save started,
resumed each time with the same command. Every step must have seen the samples the uninterrupted
run saw (ids and data hashes, per rank), and the final parameters must be bit-equal (issue 21)."""
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import need

torch = need("torch")
np = need("numpy")
import ferry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
STEPS, EVERY = 120, 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp, tag, extra=()):
    """Both ranks of one run; rank 0's stdout is piped (its save messages)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        cmd = [sys.executable, EXAMPLE, "--data", str(tmp / "data"), "--ckpt", str(tmp / ("ckpt-" + tag)),
               "--steps", str(STEPS), "--every", str(EVERY), "--log", str(tmp / ("%s-%d.log" % (tag, rank))),
               "--out", str(tmp / ("%s.pt" % tag))] + list(extra)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs, timeout=300):
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, "rank exited %d: %s" % (p.returncode, err[-3000:])


def kill(procs):
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.communicate()


def steps_logged(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def records(path):
    """step -> (epoch, ids, hash), the last line written for each step (a resumed run writes the
    steps after its checkpoint again)."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                out[int(parts[0])] = tuple(parts[1:])
    return out


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(7)
    samples = [rng.integers(0, 256, size=int(rng.integers(20, 100)), dtype=np.uint16) for _ in range(220)]
    ferry.write_dataset(tmp_path / "data", samples, dtype="uint16")
    return tmp_path


def test_resume_after_sigkill_is_exact(corpus):
    tmp = corpus
    finish(launch(tmp, "ref"))
    rnd = random.Random(int(time.time()))
    # 1: killed at a random step (between saves or during one)
    target = rnd.randrange(EVERY + 3, 3 * EVERY)
    procs = launch(tmp, "run")
    t0 = time.time()
    while steps_logged(tmp / "run-0.log") < target and time.time() - t0 < 120:
        if procs[0].poll() is not None:
            break
        time.sleep(0.01)
    kill(procs)
    first = steps_logged(tmp / "run-0.log")
    assert EVERY <= first < STEPS, "the first run was not killed mid-way (%d steps logged)" % first
    # 2: resumed, and killed right after an asynchronous save started (its write in flight)
    procs = launch(tmp, "run")
    killed_in_save = None
    for line in procs[0].stdout:
        if "async save of step" in line:
            step = int(line.split("step")[1].split()[0])
            if step > first:
                kill(procs)
                killed_in_save = step
                break
    if killed_in_save is None:
        finish(procs)
    # 3: resumed to the end
    finish(launch(tmp, "run"))
    for rank in range(2):
        ref, got = records(tmp / ("ref-%d.log" % rank)), records(tmp / ("run-%d.log" % rank))
        assert sorted(ref) == list(range(1, STEPS + 1))
        assert sorted(got) == sorted(ref), "rank %d: steps missing after the resumes" % rank
        diff = [s for s in ref if ref[s] != got[s]]
        assert not diff, "rank %d: steps %s saw other samples than the uninterrupted run" % (rank, diff[:10])
    a, b = torch.load(tmp / "ref.pt"), torch.load(tmp / "run.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), "parameter %s differs from the uninterrupted run's" % k
    assert killed_in_save is not None, "no asynchronous save was seen to kill the run during"
