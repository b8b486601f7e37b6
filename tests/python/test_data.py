"""The Python layer of the training-data pipeline (issue 6) on the CPU: IndexedDataset over ferry and
Megatron datasets, the Loader (every sample once per epoch across ranks, in one process and across
processes; resume equals an uninterrupted run; batches' bytes equal the dataset's; stats), errors
naming shard and sample, and the examples of docs/PYTHON.md and docs/DATA.md."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import need

np = need("numpy")
torch = need("torch")
import ferry  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 203  # samples: not a multiple of any batch size or world size used here


def make_samples(n=N, dtype=np.uint16, seed=0):
    """Sample i holds i in its first element, then random tokens; lengths 0..40."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 41)) if i % 50 else 0  # a few empty samples
        a = rng.integers(0, 60000, size=k).astype(dtype)
        if k:
            a[0] = i
        out.append(a)
    return out


def write_megatron_reference(prefix, docs, dtype):
    from test_megatron_reference import write_reference
    write_reference(prefix, docs, dtype)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    samples = make_samples()
    ferry.write_dataset(d / "ds", samples, shard_size=1000, keys=[f"k{i}" for i in range(N)])
    write_megatron_reference(str(d / "mega"), samples, np.uint16)
    return d, samples


# ------------------------------------------------------------------------------ IndexedDataset


@pytest.mark.parametrize("kind", ["ferry", "megatron"])
@pytest.mark.parametrize("mmap", [True, False])
def test_indexed_dataset(data, kind, mmap):
    d, samples = data
    path = d / ("ds" if kind == "ferry" else "mega")
    with ferry.IndexedDataset(path, mmap=mmap) as ds:
        assert len(ds) == N and ds.format == kind and ds.dtype == np.uint16
        assert ds.nbytes == sum(a.nbytes for a in samples)
        assert ds.shards > 3 if kind == "ferry" else ds.shards == 1
        assert np.array_equal(ds.sizes, [len(a) for a in samples])
        for i in (0, 1, 49, 50, N - 1):
            assert ds[i].dtype == np.uint16 and np.array_equal(ds[i], samples[i])
        assert np.array_equal(ds[-1], samples[-1]) and np.array_equal(ds[-N], samples[0])
        assert np.array_equal(ds[np.int64(7)], samples[7])
        got = ds[10:20:3]
        assert len(got) == 4 and all(np.array_equal(a, samples[i]) for a, i in zip(got, range(10, 20, 3)))
        assert all(np.array_equal(a, b) for a, b in zip(ds, samples))
        assert np.array_equal(ds.get(5, 1, 3), samples[5][1:4])
        if mmap:
            assert not ds[3].flags.writeable  # a view of the mapped shard
        else:
            assert ds[3].flags.writeable
        with pytest.raises(IndexError):
            ds[N]
        with pytest.raises(IndexError):
            ds[-N - 1]
        with pytest.raises(TypeError):
            ds["x"]
        if kind == "ferry":
            assert ds.key(3) == b"k3"
            ds.verify()
        else:
            assert ds.key(3) is None


def test_dataset_errors(tmp_path):
    samples = make_samples(60)
    ferry.write_dataset(tmp_path / "ds", samples, shard_size=200)
    idx = tmp_path / "ds" / "ferry.idx"
    good = idx.read_bytes()
    # corrupt index: one byte of a sample entry flipped; the footer checksum catches it
    bad = bytearray(good)
    bad[200] ^= 0xFF
    idx.write_bytes(bytes(bad))
    with pytest.raises(ferry.Error) as e:
        ferry.IndexedDataset(tmp_path / "ds")
    assert e.value.code == ferry.ECORRUPT and "ferry.idx" in str(e.value), str(e.value)
    idx.write_bytes(good)
    # truncated shard: refused on open, naming the shard file and the first sample cut
    shards = sorted(p for p in os.listdir(tmp_path / "ds") if p.startswith("shard-"))
    victim = tmp_path / "ds" / shards[2]
    size = victim.stat().st_size
    os.truncate(victim, size - 3)
    with pytest.raises(ferry.Error) as e:
        ferry.IndexedDataset(tmp_path / "ds")
    msg = str(e.value)
    assert e.value.code == ferry.ECORRUPT and shards[2] in msg and "sample" in msg, msg
    os.truncate(victim, size)
    with pytest.raises(FileNotFoundError):
        ferry.IndexedDataset(tmp_path / "nothing")


def test_truncated_after_open(tmp_path):
    """A shard cut after open: a read (and the loader) fail naming the shard and the sample."""
    samples = [np.full(100, i, np.uint16) for i in range(40)]
    ferry.write_dataset(tmp_path / "ds", samples, shard_size=2000)
    ds = ferry.IndexedDataset(tmp_path / "ds", mmap=False)
    loader = ferry.Loader(ds, batch_size=4, device="cpu", shuffle=False)
    shards = sorted(p for p in os.listdir(tmp_path / "ds") if p.startswith("shard-"))
    os.truncate(tmp_path / "ds" / shards[1], 10)
    with pytest.raises(ferry.Error) as e:
        ds[12]  # shard 1 holds samples 10..19
    assert shards[1] in str(e.value) and "sample 1" in str(e.value), str(e.value)
    with pytest.raises(ferry.Error) as e:
        for _ in loader:
            pass
    msg = str(e.value)
    assert e.value.code == ferry.ECORRUPT and shards[1] in msg and "sample 1" in msg, msg
    loader.close()


def test_write_dataset_bytes(tmp_path):
    lines = ["{\"a\": 1}", "", "héllo", "x" * 1000]
    ferry.write_dataset(tmp_path / "b", lines)
    ds = ferry.IndexedDataset(tmp_path / "b")
    assert ds.dtype == np.uint8 and [bytes(ds[i]).decode() for i in range(4)] == lines


# ------------------------------------------------------------------------------------ Loader


def run_epoch(loader):
    """[(indices, batch tensor(s))] of one epoch."""
    out = []
    for b in loader:
        out.append((loader.last_indices.copy(), b))
    return out


@pytest.mark.parametrize("kind", ["ferry", "megatron"])
def test_loader_samples_bytes_equal(data, kind):
    d, samples = data
    path = d / ("ds" if kind == "ferry" else "mega")
    loader = ferry.Loader(path, batch_size=8, seed=3, device="cpu", threads=2, prefetch=3)
    assert str(loader.device) == "cpu"
    assert len(loader) == -(-N // 8)
    batches = run_epoch(loader)
    assert len(batches) == len(loader)
    seen = []
    for idx, (flat, offs) in batches:
        assert flat.dtype == torch.uint16 and offs.dtype == torch.int64
        assert len(offs) == len(idx) + 1 and offs[0] == 0 and offs[-1] == flat.numel()
        for k, i in enumerate(idx):
            assert np.array_equal(flat[offs[k]:offs[k + 1]].numpy(), samples[i]), (i, k)
        seen.extend(idx.tolist())
    assert seen == ferry.distributed_indices(N, 1, 0, seed=3, epoch=0).tolist()
    loader.close()


def test_loader_tokens(data):
    d, samples = data
    stream = np.concatenate(samples)
    L = 16
    loader = ferry.Loader(d / "ds", batch_size=5, seq_len=L, seed=1, device="cpu",
                          dtype=torch.int64, drop_last_batch=True)
    items = len(stream) // L
    assert loader.samples_per_epoch == items and len(loader) == items // 5
    seen = []
    for x in loader:
        assert x.shape == (5, L) and x.dtype == torch.int64
        for row, i in zip(x, loader.last_indices):
            assert np.array_equal(row.numpy(), stream[i * L:(i + 1) * L].astype(np.int64))
        seen.extend(loader.last_indices.tolist())
    assert seen == ferry.distributed_indices(items, 1, 0, seed=1)[:len(loader) * 5].tolist()


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_across_ranks(data, world, drop_last):
    """Ranks simulated in one process: each rank's order is DistributedSampler's, and together
    they cover every sample once per epoch (plus the documented padding, or minus the cut)."""
    d, _ = data
    for epoch in (0, 1):
        allidx = []
        for r in range(world):
            loader = ferry.Loader(d / "ds", batch_size=4, rank=r, world_size=world, seed=11,
                                  drop_last=drop_last, device="cpu", epoch=epoch)
            got = np.concatenate([i for i, _ in run_epoch(loader)])
            want = ferry.distributed_indices(N, world, r, seed=11, epoch=epoch, drop_last=drop_last)
            assert np.array_equal(got, want)
            allidx.append(got)
            loader.close()
        allidx = np.concatenate(allidx)
        counts = np.bincount(allidx, minlength=N)
        if drop_last:
            assert counts.max() == 1 and counts.sum() == (N // world) * world
        else:
            assert counts.min() == 1 and counts.sum() == -(-N // world) * world


def test_ranks_across_processes(data, tmp_path):
    """RANK and WORLD_SIZE from the environment, as torchrun sets them, in separate processes."""
    d, _ = data
    world = 3
    script = textwrap.dedent(f"""
        import json, sys, ferry, numpy as np
        loader = ferry.Loader({str(d / 'ds')!r}, batch_size=7, seed=5, device="cpu")
        out = {{"rank": loader.rank, "world": loader.world_size, "epochs": []}}
        for epoch in range(2):
            out["epochs"].append(np.concatenate([loader.last_indices for _ in loader]).tolist())
        json.dump(out, sys.stdout)
    """)
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    for epoch in range(2):
        seen = []
        for res in results:
            r = res["rank"]
            assert res["world"] == world
            want = ferry.distributed_indices(N, world, r, seed=5, epoch=epoch).tolist()
            assert res["epochs"][epoch] == want
            seen += res["epochs"][epoch]
        assert set(seen) == set(range(N)) and len(seen) == -(-N // world) * world


def test_env_rank(data, monkeypatch):
    d, _ = data
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = ferry.Loader(d / "ds", batch_size=4, device="cpu")
    assert (loader.rank, loader.world_size) == (1, 4)
    assert ferry.Loader(d / "ds", batch_size=4, device="cpu", rank=0, world_size=1).world_size == 1
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="rank"):
        ferry.Loader(d / "ds", batch_size=4, device="cpu")


def test_epochs_advance_and_set_epoch(data):
    d, _ = data
    loader = ferry.Loader(d / "ds", batch_size=16, seed=2, device="cpu")
    for epoch in range(3):
        assert loader.epoch == epoch
        loader.set_epoch(epoch)  # as a DistributedSampler loop does: a no-op here
        got = np.concatenate([i for i, _ in run_epoch(loader)])
        assert np.array_equal(got, ferry.distributed_indices(N, 1, 0, seed=2, epoch=epoch))
    loader.set_epoch(7)
    got = np.concatenate([i for i, _ in run_epoch(loader)])
    assert np.array_equal(got, ferry.distributed_indices(N, 1, 0, seed=2, epoch=7))


def flat(batches):
    return [(i.tolist(), [t.tolist() for t in b] if isinstance(b, tuple) else b.tolist())
            for i, b in batches]


@pytest.mark.parametrize("seq_len", [None, 8])
@pytest.mark.parametrize("order", ["shuffle", "block", "sequential"])
def test_resume_equals_uninterrupted(data, seq_len, order):
    d, _ = data
    kw = dict(batch_size=6, seq_len=seq_len, seed=9, order=order, block=16, device="cpu",
              rank=1, world_size=2)
    ref = ferry.Loader(d / "ds", **kw)
    want = []
    for _ in range(3):
        want += run_epoch(ref)
    bpe = len(ref)
    for stop in (0, 1, bpe - 1, bpe, bpe + 5, 2 * bpe + 1):
        a = ferry.Loader(d / "ds", **kw)
        got = []
        while len(got) < stop:
            for x in a:  # an iteration left early continues where it stopped
                got.append((a.last_indices.copy(), x))
                if len(got) == stop:
                    break
        state = json.loads(json.dumps(a.state_dict()))  # it survives a checkpoint as JSON
        a.close()
        b = ferry.Loader(d / "ds", **kw)
        b.load_state_dict(state)
        assert b.epoch == state["epoch"]
        while len(got) < len(want):
            got += run_epoch(b)
        assert flat(got[:len(want)]) == flat(want), (order, seq_len, stop)


def test_resume_mismatch(data):
    d, _ = data
    a = ferry.Loader(d / "ds", batch_size=6, seed=9, device="cpu")
    next(iter(a))
    state = a.state_dict()
    b = ferry.Loader(d / "ds", batch_size=6, seed=10, device="cpu")
    with pytest.raises(ferry.Error) as e:
        b.load_state_dict(state)
    assert e.value.code == ferry.EBADOPT and "seed" in str(e.value)
    c = ferry.Loader(d / "ds", batch_size=6, seed=9, device="cpu", world_size=2, rank=0)
    with pytest.raises(ferry.Error, match="world_size"):
        c.load_state_dict(state)


def test_batches_outlive_the_loader(data):
    """Tensors are torch's own: keep a whole epoch (more than prefetch) and after close."""
    d, samples = data
    loader = ferry.Loader(d / "ds", batch_size=3, device="cpu", prefetch=2, shuffle=False)
    kept = list(loader)
    loader.close()
    del loader
    got = []
    for flat_, offs in kept:
        got += [flat_[offs[k]:offs[k + 1]].numpy() for k in range(len(offs) - 1)]
    assert len(got) == N and all(np.array_equal(a, b) for a, b in zip(got, samples))


def test_stats(data):
    d, _ = data
    loader = ferry.Loader(d / "ds", batch_size=4, device="cpu", threads=2)
    s0 = loader.stats()
    assert s0["steps"] == 0
    n = 0
    total_bytes = 0
    for flat_, _ in loader:
        n += 1
        total_bytes += flat_.numel() * 2
    s = loader.stats()
    names = {"steps", "wait_total_ns", "wait_mean_ns", "wait_p50_ns", "wait_p90_ns", "wait_p99_ns",
             "wait_max_ns", "bytes", "samples", "elapsed_ns", "samples_per_s", "bytes_per_s", "reads",
             "merged", "cpu_ns", "wait_fraction", "cpu_cores", "inline_reads"}
    assert names <= set(s), set(s) ^ names
    assert 0 <= s["inline_reads"] <= s["reads"]
    assert s["steps"] == n == len(loader)
    assert 0 <= s["wait_p50_ns"] <= s["wait_p90_ns"] <= s["wait_p99_ns"] <= s["wait_max_ns"]
    assert s["wait_max_ns"] <= s["wait_total_ns"] <= s["elapsed_ns"]
    assert s["bytes"] >= total_bytes and s["samples"] >= loader.samples_per_epoch
    assert s["samples_per_s"] > 0 and s["bytes_per_s"] > 0 and s["reads"] > 0
    assert 0 <= s["wait_fraction"] <= 1 and s["cpu_ns"] > 0
    w = loader.waits()
    assert w.dtype == np.uint64 and len(w) == n and int(w.sum()) == s["wait_total_ns"]


def test_loader_arguments(data):
    d, _ = data
    with pytest.raises(ValueError):
        ferry.Loader(d / "ds", batch_size=0, device="cpu")
    with pytest.raises(ValueError):
        ferry.Loader(d / "ds", batch_size=2, device="cpu", order="random")
    with pytest.raises(ValueError):
        ferry.Loader(d / "ds", batch_size=2, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA"):
            ferry.Loader(d / "ds", batch_size=2, device="cuda")
        assert str(ferry.Loader(d / "ds", batch_size=2).device) == "cpu"
    ds = ferry.IndexedDataset(d / "ds")
    loader = ferry.Loader(ds, batch_size=2, device="cpu", dtype="int32")
    assert loader.dataset is ds and next(iter(loader))[0].dtype == torch.int32
    assert "batch_size=2" in repr(loader)


def test_bytes_dataset(tmp_path):
    ferry.write_dataset(tmp_path / "b", [b"abc", b"de"])
    loader = ferry.Loader(tmp_path / "b", batch_size=2, device="cpu", shuffle=False)
    flat_, offs = next(iter(loader))
    assert flat_.dtype == torch.uint8 and bytes(flat_.numpy()) == b"abcde" and offs.tolist() == [0, 3, 5]
    loader = ferry.Loader(tmp_path / "b", batch_size=2, seq_len=2, device="cpu", shuffle=False)
    assert [bytes(r.numpy()) for r in next(iter(loader))] == [b"ab", b"cd"]


# ------------------------------------------------------------------------ the docs' examples


def doc_blocks(path, heading):
    """The ```python blocks of the section of `path` that starts with `heading`."""
    text = open(os.path.join(ROOT, path)).read()
    start = text.index(heading)
    nxt = re.search(r"^## ", text[start + len(heading):], re.M)
    section = text[start:start + len(heading) + (nxt.start() if nxt else len(text))]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.parametrize("path,heading", [("docs/PYTHON.md", "## Training data"),
                                          ("docs/DATA.md", "## Python")])
def test_doc_examples(tmp_path, monkeypatch, path, heading):
    blocks = doc_blocks(path, heading)
    assert blocks, f"no python examples under {heading} in {path}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    env = {}
    for code in blocks:  # one namespace: later blocks use what earlier ones made
        exec(compile(code, f"{path}:{heading}", "exec"), env)


def test_loaders_leave_no_threads(data):
    """Loaders closed, dropped mid-epoch or collected stop their pipeline threads."""
    import gc
    d, _ = data
    ferry.Loader(d / "ds", batch_size=4, device="cpu")  # torch's own threads start here
    gc.collect()
    base = len(os.listdir("/proc/self/task"))
    for i in range(40):
        loader = ferry.Loader(d / "ds", batch_size=4, seq_len=16, device="cpu", threads=2)
        it = iter(loader)
        next(it)
        if i % 2:
            loader.close()
        del loader, it
    gc.collect()
    assert len(os.listdir("/proc/self/task")) <= base


def test_distributed_indices_replicas_out_of_range():
    """num_replicas beyond the sampler's 32 bits is refused naming it, not truncated to 0
    ("rank 0 of 0 replicas"; issue 20, finding 8)."""
    with pytest.raises(ValueError, match=r"num_replicas 9223372036854775808 is out of range"):
        ferry.distributed_indices(10, 2**63, 0)
    with pytest.raises(ValueError, match=r"num_replicas 4294967296 is out of range"):
        ferry.distributed_indices(10, 2**32, 1)
