"""ferry.Loader on the GPU: device="cuda" gives the same batches as device="cpu" (tokens and whole
samples, every order, dtype conversion in the copy, resume); a consumer on a non-default
torch.cuda.Stream sees complete batches even when that stream is busy and the host runs ahead;
tensors stay valid after the loader closes. Run by scripts/gpu-check.sh (pytest -rs)."""
import numpy as np
import pytest

import _gpu
import ferry

torch = _gpu.cuda_torch()

N = 3001


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpudata")
    rng = np.random.default_rng(0)
    samples = []
    for i in range(N):
        a = rng.integers(0, 65535, size=int(rng.integers(1, 600))).astype(np.uint16)
        a[0] = i % 65535
        samples.append(a)
    ferry.write_dataset(d / "ds", samples, shard_size=256 << 10)
    return d / "ds", samples


def collect(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for b in loader:
            if isinstance(b, tuple):
                out.append(tuple(t.cpu() for t in b))
            else:
                out.append(b.cpu())
    torch.cuda.synchronize()
    return out


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, tuple):
            assert all(torch.equal(p, q) for p, q in zip(x, y))
        else:
            assert torch.equal(x, y)


@pytest.mark.parametrize("order", ["shuffle", "sequential", "block"])
@pytest.mark.parametrize("seq_len", [2048, None])
def test_cuda_equals_cpu(data, order, seq_len):
    path, _ = data
    kw = dict(batch_size=16, seq_len=seq_len, order=order, seed=7, threads=2, prefetch=4,
              rank=1, world_size=3)
    cpu = collect(ferry.Loader(path, device="cpu", **kw), epochs=2)
    gpu_loader = ferry.Loader(path, device="cuda", **kw)
    first = next(iter(gpu_loader))
    t = first if seq_len else first[0]
    assert t.is_cuda and t.device.index == torch.cuda.current_device()
    if not seq_len:
        assert first[1].is_cuda and first[1].dtype == torch.int64
    gpu = [tuple(x.cpu() for x in first) if isinstance(first, tuple) else first.cpu()]
    gpu += collect(gpu_loader, epochs=2)  # the rest of epoch 0, then epoch 1
    same(cpu, gpu)
    s = gpu_loader.stats()
    assert s["steps"] == 2 * len(gpu_loader) and s["bytes_per_s"] > 0


def test_dtype_conversion_on_device(data):
    path, _ = data
    a = collect(ferry.Loader(path, batch_size=8, seq_len=512, device="cpu", dtype=torch.int64))
    b = collect(ferry.Loader(path, batch_size=8, seq_len=512, device="cuda", dtype=torch.int64))
    assert b[0].dtype == torch.int64
    same(a, b)


def test_resume_on_device(data):
    path, _ = data
    kw = dict(batch_size=32, seq_len=1024, seed=3, device="cuda")
    want = collect(ferry.Loader(path, **kw))
    a = ferry.Loader(path, **kw)
    got = []
    for x in a:
        got.append(x.cpu())
        if len(got) == 5:
            break
    state = a.state_dict()
    a.close()
    b = ferry.Loader(path, **kw)
    b.load_state_dict(state)
    got += collect(b)
    same(want, got)


@pytest.mark.parametrize("dtype", [None, torch.int64])
def test_consumer_on_another_stream_sees_complete_batches(data, dtype):
    """The consumer's stream is busy (a long sleep kernel queued first) and the host enqueues many
    batches before anything completes: each batch must still be whole when the stream reads it,
    no slot may be refilled under a copy not yet done, and no batch's memory may be written while
    the stream has not yet read the batch freed before it. dtype None: the C loader copies
    (copy_release); int64: torch converts in the copy."""
    path, samples = data
    stream = np.concatenate(samples)
    L = 2048
    ref = torch.from_numpy(stream[: (len(stream) // L) * L].astype(np.int64)).view(-1, L)
    loader = ferry.Loader(path, batch_size=8, seq_len=L, seed=1, device="cuda", prefetch=2,
                          threads=2, dtype=dtype)
    assert loader._direct == (dtype is None)
    s = torch.cuda.Stream()
    sums, indices = [], []
    with torch.cuda.stream(s):
        for k, x in enumerate(loader):
            if k % 4 == 0:
                torch.cuda._sleep(2_000_000)  # keep s busy so the host runs ahead of it
            sums.append(x.long().sum(dim=1))   # queued on s, after the batch's copy
            indices.append(loader.last_indices.copy())
            del x                              # freed early: its memory is held until s is past it
    s.synchronize()
    for got, idx in zip(sums, indices):
        want = ref[torch.from_numpy(idx)].sum(dim=1)
        assert torch.equal(got.cpu(), want)
    assert len(sums) == len(loader)


def test_tensors_outlive_loader(data):
    path, _ = data
    loader = ferry.Loader(path, batch_size=4, seq_len=256, device="cuda", prefetch=2, shuffle=False)
    kept = []
    for x in loader:
        kept.append(x)
        if len(kept) == 10:
            break
    loader.close()
    del loader
    cpu = ferry.Loader(path, batch_size=4, seq_len=256, device="cpu", shuffle=False)
    for x, y in zip(kept, cpu):
        assert torch.equal(x.cpu(), y)


def test_cpu_pinned(data):
    path, _ = data
    loader = ferry.Loader(path, batch_size=4, seq_len=256, device="cpu", pin_memory=True, shuffle=False)
    x = next(iter(loader))
    assert x.is_pinned()
    y = x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), x)


def test_device_memory_is_reused_and_kept_tensors_stay_valid(data):
    """Batch tensors are the loader's device memory: freed ones come back to it (the number of
    buffers stays bounded over many batches), kept ones are never reused under the keeper."""
    path, _ = data
    kw = dict(batch_size=4, seq_len=256, shuffle=False, prefetch=2, threads=1)
    loader = ferry.Loader(path, device="cuda", **kw)
    assert loader._direct
    kept = []
    for k, x in enumerate(loader):
        if k % 10 == 0:
            kept.append((k, x))
        _ = x.long().sum()
    n = len(loader)
    bufs = loader.stats()["device_buffers"]
    # prefetch + threads slots, each refilled while the consumer holds a few: bounded by
    # twice the slots plus 4, plus the tensors kept
    assert n > 50 and bufs <= 2 * 3 + 4 + len(kept), (n, bufs, len(kept))
    cpu = list(ferry.Loader(path, device="cpu", **kw))
    for k, x in kept:
        assert torch.equal(x.cpu(), cpu[k])



@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_shards_decoded_on_the_gpu(tmp_path, codec):
    """cz_decode="gpu" (nvCOMP into the pipeline threads' device caches) gives the batches the host
    loader gives (its decoding on the CPU: the same order, the chunk window), and the samples of the
    plain shards; gpu_chunk_decodes counts."""
    import glob
    import os
    import shutil
    rng = np.random.default_rng(1)  # phrases of a small vocabulary: both codecs compress them
    phrases = [rng.integers(0, 5000, size=50).astype(np.uint16) for _ in range(20)]
    path = str(tmp_path / "plain")
    ferry.write_dataset(path, [np.concatenate([phrases[j] for j in rng.integers(0, 20, size=int(rng.integers(1, 12)))])
                               for _ in range(3001)], shard_size=256 << 10)
    out = tmp_path / codec
    out.mkdir()
    for p in sorted(glob.glob(os.path.join(path, "*.fsh"))):
        ferry.compress_file(p, str(out / os.path.basename(p)), codec=codec, chunk="64k")
    shutil.copy(os.path.join(path, "ferry.idx"), out / "ferry.idx")
    kw = dict(batch_size=16, seq_len=512, seed=3, threads=2)
    cpu = collect(ferry.Loader(str(out), device="cpu", **kw))
    seq = collect(ferry.Loader(path, device="cpu", order="sequential", batch_size=16, seq_len=512))
    rows = lambda bs: sorted(r.numpy().tobytes() for b in bs for r in b)  # noqa: E731
    assert rows(cpu) == rows(seq)  # the plain shards' windows, each once
    ld = ferry.Loader(str(out), device="cuda", cz_decode="gpu", **kw)
    try:
        gpu = collect(ld)
    except ferry.Error as e:  # nvCOMP absent: cz_decode="gpu" must say so
        assert "nvCOMP" in str(e)
        pytest.skip(f"nvCOMP cannot decode here: {e}")
    same(cpu, gpu)
    s = ld.stats()
    assert s["gpu_chunk_decodes"] > 0 and s["chunk_decodes"] >= s["gpu_chunk_decodes"]
