"""The ferry Python package on the CPU: every API, every host destination kind, errors, the GIL,
reference counts. GPU cases live in tests/gpu/test_python_gpu.py (run by scripts/gpu-check.sh)."""
import asyncio
import concurrent.futures as cf
import errno
import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest

import ferry
from conftest import need


# ------------------------------------------------------------------------------------ import

def test_import_does_not_import_torch():
    code = "import sys, ferry; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout


def test_module_surface():
    assert ferry.__version__ == "0.1.0"
    # The C API's knobs, in its order (more may follow as the library grows).
    assert ferry.KNOBS[:13] == ("threads", "chunk_size", "queue_depth", "slots", "direct",
                                "backend", "sqpoll", "register", "path", "device", "host_budget",
                                "device_budget", "log_level")
    assert ferry.ENOGDS == -5002 and ferry.ERROR_CODES["FERRY_ENOGPU"] == -5001
    assert ferry.err_name(-errno.ENOENT) == "ENOENT"
    assert ferry.err_name(ferry.ENOGDS) == "FERRY_ENOGDS"
    assert "GPUDirect" in ferry.strerror(ferry.ENOGDS)
    ok, why = ferry.gpu_available()
    assert isinstance(ok, bool) and (ok or why), (ok, why)
    assert ferry.backend_unavailable_reason("psync") == ""
    for name in ferry.__all__:
        assert hasattr(ferry, name), name


def test_stubs_cover_the_public_names():
    stub = os.path.join(os.path.dirname(ferry.__file__), "__init__.pyi")
    assert os.path.exists(stub), "the package ships no __init__.pyi"
    text = open(stub).read()
    for name in ferry.__all__:
        assert name in text, "%s missing from __init__.pyi" % name
    assert os.path.exists(os.path.join(os.path.dirname(ferry.__file__), "py.typed"))


# -------------------------------------------------------------------------------- open/File

def test_open_modes_and_attributes(tmp_path, data):
    path, payload = data
    with ferry.open(path) as f:
        assert f.name == str(path) and f.mode == "r" and not f.closed
        assert f.size == len(payload)
        assert f.block_size in (512, 1024, 2048, 4096)
        assert f.mem_align >= 1 and isinstance(f.is_direct, bool)
        assert isinstance(f.context, ferry.Context) and f.context is ferry.default_context()
        info = f.path_info()
        assert str(path) in info and ("io_uring" in info or "psync" in info), info
        assert "ferry.File" in repr(f)
    assert f.closed
    f.close()  # idempotent
    with pytest.raises(ValueError, match="closed file"):
        f.pread_into(bytearray(1), 0)
    with pytest.raises(ValueError, match="closed file"):
        f.size

    new = tmp_path / "new.bin"
    with ferry.open(new, "w") as f:
        assert f.pwrite_from(b"hello", 0) == 5
        with pytest.raises(OSError) as e:  # write-only: the read fails in the engine
            f.pread_into(bytearray(5), 0)
        assert e.value.errno == errno.EBADF
    with ferry.open(new, "wb+") as f:  # truncates; "b" ignored
        assert f.size == 0
        f.pwrite_from(b"abc", 0)
        buf = bytearray(3)
        assert f.pread_into(buf, 0) == 3 and buf == b"abc"
        f.truncate(1)
        assert f.size == 1
        f.sync()
        f.sync(full=True)
    with ferry.open(str(new), "r+") as f:
        assert f.pwrite_from(b"Z", 1) == 1
    assert new.read_bytes() == b"aZ"
    with pytest.raises(FileExistsError):
        ferry.open(new, "x")
    with ferry.open(tmp_path / "x.bin", "x+") as f:
        assert f.size == 0
    with ferry.open(new, "r", buffered=True) as f:
        assert not f.is_direct
    with pytest.raises(ValueError, match="invalid mode"):
        ferry.open(new, "a")
    with pytest.raises(TypeError):
        ferry.open(new, 1)


def test_open_errors_are_oserror_subclasses(tmp_path):
    missing = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError) as e:
        ferry.open(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert "open(%s" % missing in str(e.value), str(e.value)
    with pytest.raises(IsADirectoryError) as e:
        ferry.open(tmp_path)
    assert "directory" in str(e.value)
    with pytest.raises(FileNotFoundError):
        ferry.open(tmp_path / "no" / "such" / "dir.bin", "w")


def test_permission_error(tmp_path):
    # kernfs refuses write opens of read-only attributes with EACCES even for root.
    target = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
    if not os.path.exists(target):
        target = None
        if os.geteuid() == 0:
            pytest.skip("running as root without /sys: no file refuses us with EACCES")
        target = tmp_path / "locked.bin"
        target.write_bytes(b"x")
        os.chmod(target, 0o400)
    with pytest.raises(PermissionError) as e:
        ferry.open(target, "r+")
    assert e.value.errno == errno.EACCES and str(target) in str(e.value)


# --------------------------------------------------------------------- destinations (host)

def check_read(f, buf, payload, offset, view):
    n = f.pread_into(buf, offset)
    assert n == min(len(view), len(payload) - offset)
    assert bytes(view[:n]) == payload[offset:offset + n]
    return n


def test_read_into_bytearray_and_memoryview(data):
    path, payload = data
    with ferry.open(path) as f:
        b = bytearray(10000)
        check_read(f, b, payload, 12345, memoryview(b))
        b = bytearray(8192)
        check_read(f, memoryview(b), payload, 4096, memoryview(b))
        b = bytearray(9000)
        check_read(f, memoryview(b)[100:5100], payload, 7, memoryview(b)[100:5100])
        assert f.pread_into(bytearray(0), 0) == 0
        assert f.pread_into(buf=bytearray(3), offset=1) == 3


def test_read_short_at_end_of_file(data):
    path, payload = data
    with ferry.open(path) as f:
        b = bytearray(b"\xee" * 8192)
        assert f.pread_into(b, len(payload) - 100) == 100
        assert b[:100] == payload[-100:]
        assert f.pread_into(bytearray(10), len(payload) + 4096) == 0


def test_read_into_numpy(data):
    np = need("numpy")
    path, payload = data
    with ferry.open(path) as f:
        a = np.empty(4096, dtype=np.uint8)
        check_read(f, a, payload, 0, memoryview(a))
        assert a.tobytes() == payload[:4096]
        m = np.empty((16, 64), dtype=np.float32)
        assert f.pread_into(m, 512) == m.nbytes
        assert m.tobytes() == payload[512:512 + m.nbytes]
        info = ferry.buffer_info(m, writable=True)
        assert info["ptr"] == m.ctypes.data and info["nbytes"] == m.nbytes
        assert info["memory"] == "host" and info["protocol"] == "buffer"
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.pread_into(m[:, ::2], 0)
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.pread_into(np.asfortranarray(m), 0)
        ro = np.zeros(16, dtype=np.uint8)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            f.pread_into(ro, 0)


def test_read_into_torch_cpu(data):
    torch = need("torch")
    path, payload = data
    with ferry.open(path) as f:
        t = torch.empty(4096, dtype=torch.uint8)
        assert f.pread_into(t, 100) == 4096
        assert t.numpy().tobytes() == payload[100:4196]
        w = torch.empty((8, 32), dtype=torch.float64)
        assert f.pread_into(w, 0) == w.numel() * 8
        assert w.numpy().tobytes() == payload[:w.numel() * 8]
        info = ferry.buffer_info(w, writable=True)
        assert info["ptr"] == w.data_ptr() and info["nbytes"] == 8 * 32 * 8, info
        assert info["protocol"] == "dlpack" and info["memory"] == "host"
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.pread_into(w.t(), 0)
        sl = torch.zeros(100, dtype=torch.uint8)[10:20]  # an offset view: byte_offset or data
        assert f.pread_into(sl, 0) == 10
        assert sl.numpy().tobytes() == payload[:10]
        b = torch.empty(16, dtype=torch.bfloat16)
        assert f.pread_into(b, 0) == 32


def test_read_into_dlpack_capsules(data):
    torch = need("torch")
    np = need("numpy")
    path, payload = data
    with ferry.open(path) as f:
        t = torch.zeros(256, dtype=torch.uint8)
        cap = torch.utils.dlpack.to_dlpack(t)
        assert f.pread_into(cap, 64) == 256
        assert t.numpy().tobytes() == payload[64:320]
        with pytest.raises(TypeError, match="not an unused DLPack"):
            f.pread_into(cap, 0)  # a capsule is consumed once
        a = np.zeros(128, dtype=np.uint8)
        assert f.pread_into(a.__dlpack__(), 0) == 128
        assert a.tobytes() == payload[:128]


class DLPackOnly:
    """An object that offers DLPack only (as JAX arrays do), wrapping a NumPy array."""

    def __init__(self, a, legacy=False):
        self.a, self.legacy = a, legacy

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        if self.legacy and kw:
            raise TypeError("unexpected keyword argument %r" % next(iter(kw)))
        return self.a.__dlpack__()


class CAIOnly:
    """An object that offers __cuda_array_interface__ only (here over host memory: ferry finds
    out what memory it is with ferry_mem_kind, which says host without a GPU)."""

    def __init__(self, a, readonly=False, strides=None):
        self.a = a
        self.__cuda_array_interface__ = {
            "shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, readonly),
            "strides": strides, "version": 3}


def test_read_into_protocol_only_objects(data):
    np = need("numpy")
    path, payload = data
    with ferry.open(path) as f:
        for legacy in (False, True):
            a = np.zeros(300, dtype=np.uint8)
            assert f.pread_into(DLPackOnly(a, legacy), 5) == 300
            assert a.tobytes() == payload[5:305]
        a = np.zeros((4, 25), dtype=np.int32)
        assert f.pread_into(CAIOnly(a), 0) == 400
        assert a.tobytes() == payload[:400]
        info = ferry.buffer_info(CAIOnly(a))
        assert info["protocol"] == "cuda_array_interface" and info["ptr"] == a.ctypes.data
        with pytest.raises(ValueError, match="read-only"):
            f.pread_into(CAIOnly(a, readonly=True), 0)
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.pread_into(CAIOnly(a, strides=(4, 16)), 0)


def test_bad_buffers_and_arguments(data):
    path, _ = data
    with ferry.open(path) as f:
        with pytest.raises(TypeError, match="buffer protocol"):
            f.pread_into(12, 0)
        with pytest.raises(ValueError, match="read-only"):
            f.pread_into(b"immutable", 0)
        with pytest.raises(ValueError, match="negative"):
            f.pread_into(bytearray(1), -1)
        with pytest.raises(TypeError, match="offset must be an int"):
            f.pread_into(bytearray(1), 1.5)
        with pytest.raises(TypeError, match="unexpected keyword"):
            f.pread_into(bytearray(1), off=0)
        with pytest.raises(TypeError, match="missing required"):
            f.pread_into()
        with pytest.raises(TypeError, match="multiple values"):
            f.pread_into(bytearray(1), 0, offset=0)
        with pytest.raises(TypeError, match="at most 2"):
            f.pread_into(bytearray(1), 0, 0)
        with pytest.raises(TypeError, match="stream must be"):
            f.pread_into(bytearray(1), 0, stream="s")
        with pytest.raises(OSError) as e:  # stream ordering is for device memory
            f.pread_into(bytearray(1), 0, stream=0)
        assert e.value.errno == errno.EINVAL and "host memory" in str(e.value)

        class TorchLikeStream:
            cuda_stream = 0

        with pytest.raises(OSError):
            f.pwrite_from(b"x", 0, stream=TorchLikeStream())


# -------------------------------------------------------------------------- sources (host)

def test_write_from_every_source(tmp_path):
    np = need("numpy")
    path = tmp_path / "w.bin"
    with ferry.open(path, "w+") as f:
        sources = [b"bytes!", bytearray(b"bytearray"), memoryview(b"view"),
                   np.arange(10, dtype=np.uint16)]
        torch = None
        try:
            import torch
        except ImportError:
            pass
        if torch is not None:
            sources.append(torch.arange(6, dtype=torch.int32))
        ro = np.arange(3, dtype=np.uint8)
        ro.flags.writeable = False
        sources.append(ro)  # read-only is fine for a source
        off, expect = 0, b""
        for s in sources:
            raw = bytes(s.numpy().tobytes()) if torch is not None and isinstance(s, torch.Tensor) \
                else bytes(s)
            assert f.pwrite_from(s, off) == len(raw)
            off += len(raw)
            expect += raw
    assert path.read_bytes() == expect


# ------------------------------------------------------------------------------------ async

def test_async_read_and_write(tmp_path, data):
    path, payload = data
    with ferry.open(path) as f:
        bufs = [bytearray(65536) for _ in range(8)]
        futs = [f.pread_into_async(b, i * 65536) for i, b in enumerate(bufs)]
        assert all(isinstance(x, ferry.Future) for x in futs)
        for i, (fu, b) in enumerate(zip(futs, bufs)):
            assert fu.wait(10) is True
            assert fu.done() and not fu.running() and not fu.cancelled() and not fu.cancel()
            assert fu.result() == 65536 and fu.exception() is None
            assert b == payload[i * 65536:(i + 1) * 65536]
            assert fu.nbytes == 65536 and fu.offset == i * 65536 and fu.file is f
            assert "returned 65536" in repr(fu)
    out = tmp_path / "out.bin"
    with ferry.open(out, "w") as f:
        fu = f.pwrite_from_async(payload, 0)
        assert fu.result(timeout=30) == len(payload)
    assert out.read_bytes() == payload


def test_async_error_raised_at_result(tmp_path):
    path = tmp_path / "wo.bin"
    path.write_bytes(b"x" * 4096)
    with ferry.open(path, "r+") as f:
        pass
    with ferry.open(path, "w") as f:  # write-only: the read fails on a worker
        fu = f.pread_into_async(bytearray(4096), 0)
        exc = fu.exception(timeout=10)
        assert isinstance(exc, OSError) and exc.errno == errno.EBADF, exc
        assert "pread(%s, offset 0" % path in str(exc), str(exc)
        with pytest.raises(OSError) as e:
            fu.result()
        assert e.value is exc
        assert "raised" in repr(fu)
    with ferry.open(path, "r") as f:
        with pytest.raises(OSError) as e:  # refused at submit
            f.pwrite_from_async(b"abc", 0)
        assert e.value.errno == errno.EBADF and "read-only" in str(e.value)


def test_future_keeps_buffer_alive_and_close_refuses(tmp_path, data):
    path, payload = data
    f = ferry.open(path)
    b = bytearray(1 << 20)
    before = sys.getrefcount(b)
    fu = f.pread_into_async(b, 0)
    assert sys.getrefcount(b) > before  # held by the future
    if not fu.done():
        with pytest.raises(RuntimeError, match="in flight"):
            f.close()
        with pytest.raises(BufferError):  # the export pins the bytearray while in flight
            b.extend(b"x")
    assert fu.result() == 1 << 20
    assert sys.getrefcount(b) == before  # released once finished
    f.close()
    # A future dropped while running waits for its transfer rather than free the memory under it.
    f = ferry.open(path)
    fu = f.pread_into_async(bytearray(1 << 20), 0)
    del fu
    gc.collect()
    f.close()


def test_future_callbacks_and_concurrent_futures(data):
    path, payload = data
    with ferry.open(path) as f:
        seen = []
        done = threading.Event()
        fu = f.pread_into_async(bytearray(1 << 20), 0)

        def cb(x):
            seen.append(x.result())
            done.set()

        fu.add_done_callback(cb)
        assert done.wait(10) and seen == [1 << 20]
        fu.add_done_callback(lambda x: seen.append("late"))  # already done: called at once
        assert seen[-1] == "late"
        futs = [f.pread_into_async(bytearray(4096), i * 4096).as_concurrent() for i in range(16)]
        finished, pending = cf.wait(futs, timeout=10)
        assert not pending and all(x.result() == 4096 for x in finished)
        assert sorted(x.result() for x in cf.as_completed(futs)) == [4096] * 16

        async def main():
            return await f.pread_into_async(bytearray(100), 0)

        assert asyncio.run(main()) == 100


def test_wait_from_many_threads(data):
    path, _ = data
    with ferry.open(path) as f:
        for _ in range(20):
            fu = f.pread_into_async(bytearray(1 << 20), 0)
            results = []
            ts = [threading.Thread(target=lambda: results.append(fu.result())) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert results == [1 << 20] * 4


# ------------------------------------------------------------------------------------ batch

def test_batches(tmp_path, data):
    np = need("numpy")
    path, payload = data
    with ferry.open(path) as f:
        bufs = [bytearray(1000), np.empty(4096, np.uint8), memoryview(bytearray(10))]
        offs = [0, 5000, len(payload) - 4]
        res = f.read_batch(list(zip(offs, bufs)))
        assert res == [1000, 4096, 4]
        for o, b, n in zip(offs, bufs, res):
            assert bytes(b)[:n] == payload[o:o + n]
        assert f.pread_batch([]) == []
        with pytest.raises(TypeError, match=r"\(offset, buffer\)"):
            f.read_batch([(0, bytearray(1), 3)])
        with pytest.raises(TypeError) as e:
            f.read_batch([(0, bytearray(1)), (0, 5)])
        assert "batch entry 1" in "".join(getattr(e.value, "__notes__", [])), e.value
    out = tmp_path / "b.bin"
    ctx = ferry.Context(threads=2)
    with ctx.open(out, "w+") as g, ctx.open(path) as h:
        assert g.write_batch([(0, b"abc"), (3, b"def")]) == [3, 3]
        a, b = bytearray(3), bytearray(6)
        assert ctx.read_batch([(g, 3, a), (h, 0, b)]) == [3, 6]
        assert a == b"def" and b == payload[:6]
        assert ctx.write_batch([(g, 6, b"g")]) == [1]
        with ferry.open(path) as other:  # the default context's file
            with pytest.raises(ValueError, match="another context"):
                ctx.read_batch([(other, 0, bytearray(1))])
    assert out.read_bytes() == b"abcdefg"


# ---------------------------------------------------------------------------------- context

def test_context_knobs_and_stats(data):
    path, payload = data
    ctx = ferry.Context(threads=3, chunk_size="64k", queue_depth=16, direct=False,
                        backend="psync", register=False, log_level=0)
    assert ctx.get("threads") == "3" and ctx.get("direct") == "off"
    assert ctx.get("register") == "0" and ctx.get("backend") == "psync"
    assert int(ctx.get("chunk_size")) == 65536 or ctx.get("chunk_size") in ("64k", "65536")
    opts = ctx.options()
    assert set(opts) == set(ferry.KNOBS)
    ctx.set("chunk_size", 1 << 20)
    with pytest.raises(ferry.Error) as e:
        ferry.Context(threads=0)
    assert e.value.code == ferry.EBADOPT and e.value.name == "FERRY_EBADOPT"
    assert "threads" in str(e.value) and isinstance(e.value, OSError)
    with pytest.raises(ferry.Error, match="unknown knob 'nope'"):
        ferry.Context(nope=1)
    with ferry.open(path, context=ctx) as f:
        s0 = ctx.stats()
        assert f.pread_into(bytearray(300000), 0) == 300000
        s1 = ctx.stats()
    assert s1["bytes_read"] - s0["bytes_read"] == 300000
    assert s1["reads"] - s0["reads"] == 1
    assert set(s1) >= {"bytes_read", "bytes_written", "reads", "writes", "chunks", "errors",
                       "fallbacks", "retries"}
    assert ctx.backend == "psync"
    with pytest.raises(ferry.Error) as e:
        ctx.set("threads", 8)  # the workers have started
    assert e.value.code == ferry.EBUSY
    assert "ferry.Context" in repr(ctx)
    ctx.start()


def test_context_environment():
    code = ("import ferry; c = ferry.Context(); print(c.get('threads'), c.get('path'));"
            "print(ferry.Context(threads=5).get('threads'))")
    env = dict(os.environ, FERRY_THREADS="7", FERRY_PATH="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7", "cpu", "5"]
    env["FERRY_THREADS"] = "lots"
    out = subprocess.run([sys.executable, "-c", "import ferry; ferry.Context()"],
                         capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "FERRY_THREADS" in out.stderr and "ferry.Error" in out.stderr


def test_default_context_is_lazy_and_replaceable(data):
    path, _ = data
    ferry.set_default_context(None)
    a = ferry.default_context()
    assert a is ferry.default_context()
    mine = ferry.Context(threads=1)
    ferry.set_default_context(mine)
    with ferry.open(path) as f:
        assert f.context is mine
    ferry.set_default_context(None)
    assert ferry.default_context() is not mine
    with pytest.raises(TypeError):
        ferry.set_default_context(object())


def test_every_host_path_mode(data):
    path, payload = data
    for mode in ("auto", "cpu", "cpu-gpu", "cpu-async-gpu", "pagecache-gpu"):
        ctx = ferry.Context(path=mode)
        with ferry.open(path, context=ctx) as f:
            b = bytearray(100000)
            assert f.pread_into(b, 3) == 100000 and b == payload[3:100003], mode
    for mode in ("gds", "gds-async", "gds-batch"):
        with ferry.open(path, context=ferry.Context(path=mode)) as f:
            with pytest.raises(OSError) as e:
                f.pread_into(bytearray(10), 0)
            assert e.value.errno == errno.EINVAL
            assert "path=%s moves data to and from device memory" % mode in str(e.value)


# ------------------------------------------------------------------------------ convenience

def test_read_convenience(data):
    path, payload = data
    torch = need("torch")
    t = ferry.read(path)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.numel() == len(payload)
    assert t.numpy().tobytes() == payload
    t = ferry.read(path, offset=len(payload) - 10, length=100)
    assert t.numel() == 10 and t.numpy().tobytes() == payload[-10:]
    t = ferry.read(path, offset=8, length=64, dtype=torch.float32)
    assert t.dtype == torch.float32 and t.numel() == 16
    assert t.numpy().tobytes() == payload[8:72]
    with pytest.raises(ValueError, match="whole number"):
        ferry.read(path, length=6, dtype=torch.float32)
    np = need("numpy")
    a = ferry.read(path, length=32, like="numpy", dtype=np.uint32)
    assert isinstance(a, np.ndarray) and a.dtype == np.uint32 and a.tobytes() == payload[:32]
    with pytest.raises(ValueError, match="device must be"):
        ferry.read(path, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(Exception):  # torch says it has no CUDA device; ferry copies nothing
            ferry.read(path, length=16, device="cuda")


def test_write_convenience(tmp_path):
    path = tmp_path / "conv.bin"
    assert ferry.write(path, b"hello world") == 11
    assert ferry.write(path, b"W", offset=6, sync=True) == 1
    assert path.read_bytes() == b"hello World"


# ------------------------------------------------------------------------------------- GIL

def test_open_releases_the_gil(tmp_path):
    """open() of a FIFO blocks until a writer comes: only possible if the GIL was let go."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = """
import os, sys, threading, ferry
fifo = sys.argv[1]
opened = []
t = threading.Thread(target=lambda: opened.append(ferry.open(fifo, buffered=True)))
t.start()
fd = os.open(fifo, os.O_WRONLY)   # the main thread runs Python while the other blocks in open
t.join(20)
print("ok" if opened else "stuck")
os.close(fd)
"""
    out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_read_releases_the_gil(tmp_path):
    """A counter thread keeps ticking while one long read runs (psync, 4 KiB chunks, 1 thread)."""
    path = tmp_path / "big.bin"
    size = 64 << 20
    with open(path, "wb") as w:
        w.truncate(size)
    ctx = ferry.Context(threads=1, chunk_size="4k", backend="psync", direct="off")
    buf = bytearray(size)
    with ferry.open(path, context=ctx) as f:
        f.pread_into(buf, 0)  # warm the page cache and the workers
        ticks = [0]
        stop = threading.Event()

        def count():
            while not stop.is_set():
                ticks[0] += 1

        t = threading.Thread(target=count)
        t.start()
        time.sleep(0.2)
        c0, t0 = ticks[0], time.perf_counter()
        time.sleep(0.2)
        free_rate = (ticks[0] - c0) / (time.perf_counter() - t0)
        reads, t0 = 0, time.perf_counter()
        c0 = ticks[0]
        while time.perf_counter() - t0 < 0.5:
            f.pread_into(buf, 0)
            reads += 1
        busy = time.perf_counter() - t0
        during = ticks[0] - c0
        stop.set()
        t.join()
    # Held, the GIL would let the counter run only between calls (one switch interval, 5 ms, per
    # call at most); released, it runs alongside each read.
    per_call = busy / reads
    assert during / busy > 0.1 * free_rate, (during, busy, free_rate, reads, per_call)
    if per_call > 0.05:
        assert during / busy > 0.25 * free_rate, (during, busy, free_rate, reads)


def test_async_wait_releases_the_gil(data):
    path, _ = data
    ctx = ferry.Context(threads=1, chunk_size="4k", backend="psync", direct="off")
    with ferry.open(path, context=ctx) as f:
        fu = f.pread_into_async(bytearray(1 << 20), 0)
        other = []
        th = threading.Thread(target=lambda: other.append(sum(range(100000))))
        th.start()
        fu.wait()
        th.join(10)
        assert other == [sum(range(100000))]


# ------------------------------------------------------------------------- reference counts

def rss_kib():
    with open("/proc/self/statm") as s:
        return int(s.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_no_leaks_over_100k_calls(tmp_path, data):
    np = need("numpy")
    path, _ = data
    out = tmp_path / "leak.bin"
    with ferry.open(path) as f, ferry.open(out, "w") as g:
        a = np.empty(4096, dtype=np.uint8)
        b = bytearray(4096)
        refs = (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(f))

        def round_(n):
            for i in range(n):
                f.pread_into(a, (i % 200) * 4096)
                g.pwrite_from(b, 0)
            for i in range(n // 50):
                f.pread_into_async(b, 0).result()
                f.read_batch([(0, a), (4096, b)])
                try:
                    f.pread_into(b"ro", 0)
                except ValueError:
                    pass
                try:
                    ferry.open(tmp_path / "missing")
                except FileNotFoundError:
                    pass

        round_(5000)
        gc.collect()
        tracemalloc.start()
        rss0 = rss_kib()
        snap0 = tracemalloc.take_snapshot()
        round_(100000)
        gc.collect()
        snap1 = tracemalloc.take_snapshot()
        rss1 = rss_kib()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
        assert grown < 256 * 1024, snap1.compare_to(snap0, "lineno")[:5]
        assert rss1 - rss0 < 8 * 1024, (rss0, rss1)
        assert (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(f)) == refs


def test_no_leaks_with_torch_tensors(data):
    torch = need("torch")
    path, _ = data
    with ferry.open(path) as f:
        t = torch.empty(4096, dtype=torch.uint8)
        for _ in range(2000):
            f.pread_into(t, 0)
        gc.collect()
        refs = sys.getrefcount(t)
        rss0 = rss_kib()
        for _ in range(20000):
            f.pread_into(t, 0)
            f.pread_into_async(t, 0).result()
        gc.collect()
        assert sys.getrefcount(t) == refs
        assert rss_kib() - rss0 < 8 * 1024
