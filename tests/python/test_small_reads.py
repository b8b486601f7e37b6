"""Small and scattered reads (issue 22): every piece of a batch and of per-piece futures lands with
the file's bytes (random sizes 1 B to 2 MiB, unaligned offsets, pieces that end at or run past EOF);
and small resident reads into host memory are copied by ferry's workers, not punted one by one to
io_uring's kernel threads."""
import glob
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ferry


def _shm_dir():
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def scattered(tmp_path):
    size = (5 << 20) + 12345
    payload = os.urandom(size)
    path = tmp_path / "scattered.bin"
    path.write_bytes(payload)
    rng = random.Random(22)
    pieces = []
    for i in range(300):
        n = rng.choice((1, 7, 4096, 4097, 65536, 100_000, 1 << 20, 2 << 20)) if i % 3 else rng.randint(1, 2 << 20)
        off = rng.randrange(0, size)
        pieces.append((off, n))
    pieces += [(size - 10, 10), (size - 5, 100), (size, 4096), (0, size)]  # at, past and beyond EOF
    return path, payload, pieces


def _check(payload, pieces, bufs, results):
    for (off, n), b, r in zip(pieces, bufs, results):
        want = payload[off:off + n]
        assert r == len(want), (off, n, r, len(want))
        assert bytes(b[:r]) == want, (off, n)


def test_batch_pieces_land(scattered):
    path, payload, pieces = scattered
    bufs = [np.empty(n, np.uint8) for _, n in pieces]
    with ferry.open(path) as f:
        res = f.read_batch([(off, b) for (off, _), b in zip(pieces, bufs)])
    _check(payload, pieces, bufs, res)


def test_batch_error_names_the_calls_entry(scattered):
    """read_batch goes to the engine in parts (16, 32, 64, 64, ... entries) as they are converted: a
    read failing in a later part raises with the entry's index in the call, and every other piece
    still lands; an entry that cannot be converted after parts went out raises with its index,
    once the parts running into the buffers are done."""
    path, payload, _ = scattered
    if not os.access("/proc/self/mem", os.R_OK):
        pytest.skip("no /proc/self/mem to fail a read (offset 0 is unmapped: EIO)")
    n, bad = 200, 131  # in the fourth part (112..239)
    bufs = [np.zeros(4096, np.uint8) for _ in range(n)]
    offs = [(i * 7919) % (len(payload) - 4096) for i in range(n)]
    ctx = ferry.Context(threads=2)
    with ctx.open(path) as f, ctx.open("/proc/self/mem") as mem:
        entries = [(mem, 0, b) if i == bad else (f, o, b) for i, (o, b) in enumerate(zip(offs, bufs))]
        with pytest.raises(OSError) as e:
            ctx.read_batch(entries)
        assert e.value.errno == 5, e.value
        assert "batch entry %d" % bad in str(e.value), e.value
        assert "batch entry %d" % (bad - 112) not in str(e.value), e.value
        for i, (o, b) in enumerate(zip(offs, bufs)):
            if i != bad:
                assert bytes(b) == payload[o:o + 4096], i
        with pytest.raises(TypeError) as e:
            ctx.read_batch(entries[:100] + [(f, 0, 5)] + entries[101:120])
        assert "batch entry 100" in "".join(getattr(e.value, "__notes__", [])), e.value
        assert ctx.read_batch([(f, o, b) for o, b in zip(offs, bufs)]) == [4096] * n


def test_futures_pieces_land(scattered):
    path, payload, pieces = scattered
    bufs = [np.empty(n, np.uint8) for _, n in pieces]
    with ferry.open(path) as f:
        futs = [f.pread_into_async(b, off) for (off, _), b in zip(pieces, bufs)]
        res = [x.result() for x in futs]
    _check(payload, pieces, bufs, res)


def test_resident_small_reads_skip_io_wq(tmp_path):
    """A batch of resident 4 KiB reads into host memory leaves no io_uring kernel worker
    (iou-wrk) behind: the workers copied them. Before, tmpfs reads were each punted to one."""
    shm = _shm_dir()
    if not shm:
        pytest.skip("no writable /dev/shm (tmpfs is where io_uring punts every read)")
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task to list the process's threads")
    path = os.path.join(shm, "ferry-test-small-%d.bin" % os.getpid())
    with open(path, "wb") as w:
        w.write(os.urandom(4 << 20))
    code = textwrap.dedent("""
        import glob, sys
        import numpy as np
        import ferry
        ctx = ferry.Context()
        f = ctx.open(sys.argv[1])
        if ctx.backend != "io_uring":
            print("SKIP backend is %s, not io_uring" % ctx.backend); sys.exit(0)
        if not f.is_direct:
            print("SKIP tmpfs refused O_DIRECT here: residency is not checked for buffered files"); sys.exit(0)
        data = open(sys.argv[1], "rb").read()
        b = np.empty(256 * 4096, np.uint8)
        for _ in range(4):
            res = ctx.read_batch([(f, (i * 37 % 1024) * 4096, b[i * 4096:(i + 1) * 4096]) for i in range(256)])
            assert res == [4096] * 256, res
        for i in range(256):
            o = (i * 37 % 1024) * 4096
            assert bytes(b[i * 4096:(i + 1) * 4096]) == data[o:o + 4096], i
        names = sorted(open(t + "/comm").read().strip() for t in glob.glob("/proc/self/task/*"))
        print("THREADS", " ".join(names))
        print("CACHED", ctx.stats()["cached_chunks"])
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ))
    finally:
        os.unlink(path)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout[5:].strip())
    threads = out.stdout.split("THREADS", 1)[1].splitlines()[0].split()
    cached = int(out.stdout.split("CACHED", 1)[1].split()[0])
    if cached == 0:
        pytest.skip("no residency answer here (cachestat(2) needs Linux 6.5): reads stay on the ring")
    assert cached == 4 * 256, out.stdout
    assert not [t for t in threads if t.startswith("iou-wrk")], threads
