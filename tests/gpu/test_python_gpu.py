"""ferry's Python package against GPU memory: torch CUDA tensors and CuPy arrays as destinations and
sources, every transfer mode through Context(path=...), GDS modes refused with a reason where the
machine refuses GDS. Run by scripts/gpu-check.sh on the GPU machine (pytest -rs)."""
import os

import pytest

import _gpu
import ferry

torch = _gpu.cuda_torch()

HOST_PATHS = ("auto", "cpu-gpu", "cpu-async-gpu", "pagecache-gpu")
GDS_PATHS = ("gds", "gds-async", "gds-batch")
SIZE = 48 << 20 | 4096 + 123  # several chunks and an unaligned tail


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    payload = os.urandom(SIZE)
    path = tmp_path_factory.mktemp("gpu") / "data.bin"
    path.write_bytes(payload)
    return path, payload


def host_bytes(t):
    return t.cpu().numpy().tobytes()


def gds_refused(path):
    status, reason = ferry.gds_status(path)
    return status == ferry.GDS_REFUSED, reason


def test_buffer_info_sees_device_memory():
    t = torch.empty(1000, dtype=torch.float32, device="cuda")
    info = ferry.buffer_info(t, writable=True)
    assert info["memory"] == "cuda" and info["ptr"] == t.data_ptr() and info["nbytes"] == 4000
    assert info["device"] == t.device.index
    p = torch.empty(64, dtype=torch.uint8).pin_memory()
    assert ferry.buffer_info(p)["memory"] == "host"


@pytest.mark.parametrize("mode", HOST_PATHS)
def test_torch_cuda_read_and_write_every_host_mode(tmp_path, data, mode):
    path, payload = data
    ctx = ferry.Context(path=mode)
    t = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
    with ferry.open(path, context=ctx) as f:
        assert f.pread_into(t, 0) == SIZE
        assert host_bytes(t) == payload, mode
        part = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        # ferry does not wait for GPU work queued before a call (docs/PYTHON.md, "GPU
        # ordering"): the fill kernel must be done before ferry's copy lands, or it may zero it
        torch.cuda.current_stream().synchronize()
        assert f.pread_into(part, 777) == 1 << 20
        assert host_bytes(part) == payload[777:777 + (1 << 20)]
        fu = f.pread_into_async(part, 4096)
        assert fu.result(timeout=60) == 1 << 20
        assert host_bytes(part) == payload[4096:4096 + (1 << 20)]
    out = tmp_path / ("out-%s.bin" % mode)
    with ferry.open(out, "w", context=ctx) as g:
        assert g.pwrite_from(t, 0) == SIZE
    assert out.read_bytes() == payload


@pytest.mark.parametrize("mode", GDS_PATHS)
def test_gds_modes_succeed_or_refuse_with_reason(data, mode):
    path, payload = data
    refused, reason = gds_refused(path)
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    with ferry.open(path, context=ferry.Context(path=mode)) as f:
        if refused:
            with pytest.raises(ferry.Error) as e:
                f.pread_into(t, 0)
            assert e.value.code == ferry.ENOGDS and e.value.name == "FERRY_ENOGDS"
            assert "path=%s" % mode in str(e.value) and len(e.value.strerror) > 40, str(e.value)
            print("GDS refused (%s): %s" % (mode, e.value))
        else:
            assert f.pread_into(t, 0) == 1 << 20
            assert host_bytes(t) == payload[:1 << 20]


def test_path_cpu_refuses_device_memory(data):
    path, _ = data
    t = torch.empty(4096, dtype=torch.uint8, device="cuda")
    with ferry.open(path, context=ferry.Context(path="cpu")) as f:
        with pytest.raises(OSError, match="path=cpu moves data to host memory only"):
            f.pread_into(t, 0)


def test_torch_cuda_dtypes_views_and_capsules(data):
    path, payload = data
    with ferry.open(path) as f:
        w = torch.empty((256, 256), dtype=torch.float16, device="cuda")
        assert f.pread_into(w, 0) == w.numel() * 2
        assert host_bytes(w) == payload[:w.numel() * 2]
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.pread_into(w.t(), 0)
        sl = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda")[100:4100]
        c = torch.zeros(1024, dtype=torch.uint8, device="cuda")
        # the fill kernels are done before ferry's copies land (docs/PYTHON.md, "GPU ordering");
        # without this the H200 run of 2026-11-23 saw the head of sl zeroed after the read
        torch.cuda.current_stream().synchronize()
        assert f.pread_into(sl, 5) == 4000 and host_bytes(sl) == payload[5:4005]
        assert f.pread_into(torch.utils.dlpack.to_dlpack(c), 9) == 1024
        assert host_bytes(c) == payload[9:1033]
        batch = [torch.empty(4096, dtype=torch.uint8, device="cuda") for _ in range(4)]
        assert f.read_batch([(i * 8192, b) for i, b in enumerate(batch)]) == [4096] * 4
        for i, b in enumerate(batch):
            assert host_bytes(b) == payload[i * 8192:i * 8192 + 4096]


def test_cupy_destination_and_source(tmp_path, data):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed on this machine")
    path, payload = data
    a = cupy.empty(1 << 20, dtype=cupy.uint8)
    info = ferry.buffer_info(a, writable=True)
    assert info["memory"] == "cuda" and info["ptr"] == a.data.ptr
    with ferry.open(path) as f:
        assert f.pread_into(a, 3) == 1 << 20
    assert cupy.asnumpy(a).tobytes() == payload[3:3 + (1 << 20)]

    class CAI:  # __cuda_array_interface__ only (Numba-style)
        def __init__(self, arr):
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    b = cupy.zeros(4096, dtype=cupy.uint8)
    with ferry.open(path) as f:
        assert f.pread_into(CAI(b), 0) == 4096
    assert cupy.asnumpy(b).tobytes() == payload[:4096]
    out = tmp_path / "cupy.bin"
    assert ferry.write(out, a) == 1 << 20
    assert out.read_bytes() == payload[3:3 + (1 << 20)]


def test_read_convenience_to_cuda(data):
    path, payload = data
    t = ferry.read(path, offset=11, length=1 << 20, device="cuda:0")
    assert t.is_cuda and t.numel() == 1 << 20 and host_bytes(t) == payload[11:11 + (1 << 20)]
    h = ferry.read(path, length=64, device="cuda", dtype=torch.float32)
    assert h.is_cuda and h.dtype == torch.float32 and h.numel() == 16


def test_stream_ordered_read_from_torch_stream(tmp_path, data):
    path, payload = data
    n = 8 << 20
    s = torch.cuda.Stream()
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    with ferry.open(path) as f, torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # keeps s busy well past the storage read
        t.fill_(7)  # queued before the read: the read must land after it
        fut = f.pread_into(t, 0, stream=s)
        assert isinstance(fut, ferry.Future)
        u = t.clone()  # queued after the read: must see it all
        assert f.pread_into(t[:4096], 0, stream=s.cuda_stream).result() == 4096  # an int CUstream
        s.synchronize()
        assert fut.result() == n  # close() is refused while a stream transfer is in flight
    assert host_bytes(u) == payload[:n]
    # A dropped stream future neither blocks nor frees the buffer under the transfer.
    v = torch.zeros(n, dtype=torch.uint8, device="cuda")
    with ferry.open(path) as f:
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            f.pread_into(v, 1, stream=s)
        s.synchronize()
        w = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        f.pread_into(w, 0, stream=s).result()  # prunes the finished one
    assert host_bytes(v) == payload[1:1 + n]
    out = tmp_path / "stream-out.bin"
    with ferry.open(out, "w") as g:
        with torch.cuda.stream(s):
            u.add_(0)
            assert g.pwrite_from(u, 0, stream=s).result() == n
    assert out.read_bytes() == payload[:n]


def test_stream_ordered_read_cupy(data):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed on this machine")
    path, payload = data
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.empty(1 << 20, dtype=cupy.uint8)
    with ferry.open(path) as f:
        fut = f.pread_into(a, 5, stream=s)
        s.synchronize()
        assert fut.result() == 1 << 20
    assert cupy.asnumpy(a).tobytes() == payload[5:5 + (1 << 20)]
