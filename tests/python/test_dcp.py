"""ferry.dcp.Writer / Reader against torch.distributed.checkpoint's FileSystemWriter / Reader
(issue 24): all four pairings, world sizes 1, 2 and 4 over gloo (saved by 4, loaded by 2), nested
state with tensors, scalars, strings and an optimizer's state, compared bit-exact; the files
ferry writes equal the stock writer's byte for byte but for torch.save's random serialization
ids; a save killed with SIGKILL leaves no directory that the stock reader takes as complete."""
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")
if not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend here", allow_module_level=True)

import ferry.dcp as fdcp  # noqa: E402
import ferry.torch as ftorch  # noqa: E402
import _ranks  # noqa: E402

WORKER = textwrap.dedent(r'''
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    import ferry.dcp

    def make(seed, mesh):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01 * (seed + 1))
        torch.manual_seed(100 + seed)
        model(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()
        g = torch.Generator().manual_seed(seed)
        big = torch.randn(24, 7, generator=g)
        return {
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "sharded": distribute_tensor(big, mesh, [Shard(0)]),
            "nested": {"bf16": torch.randn(9, generator=g).to(torch.bfloat16),
                       "ints": torch.arange(30, dtype=torch.int64).reshape(5, 6).t() * (seed + 1),
                       "u8": torch.randint(0, 255, (13,), dtype=torch.uint8, generator=g),
                       "scalar": torch.tensor(3.5 * (seed + 1)),
                       "empty": torch.empty(0, 4)},
            "step": 17 * (seed + 1),
            "lr": 0.125 * (seed + 1),
            "name": "run-%d" % seed,
        }

    def full(v):
        return v.full_tensor() if hasattr(v, "full_tensor") else v

    def same(a, b, path="state"):
        if isinstance(a, dict):
            assert set(a) == set(b), (path, sorted(a), sorted(b))
            for k in a:
                same(a[k], b[k], "%s.%s" % (path, k))
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, "%s[%d]" % (path, i))
        elif isinstance(a, torch.Tensor):
            x, y = full(a), full(b)
            assert x.dtype == y.dtype and x.shape == y.shape, (path, x.dtype, y.dtype, x.shape, y.shape)
            bx = x.reshape(-1).contiguous().view(torch.uint8)
            by = y.reshape(-1).contiguous().view(torch.uint8)
            assert torch.equal(bx, by), (path, x, y)
        else:
            assert type(a) is type(b) and a == b, (path, a, b)

    port, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    writers = {"ferry": ferry.dcp.Writer, "stock": dcp.FileSystemWriter}
    readers = {"ferry": ferry.dcp.Reader, "stock": dcp.FileSystemReader}
    for op in sys.argv[4:]:  # save:<writer>:<dir> or load:<reader>:<dir>, in order
        mode, which, d = op.split(":", 2)
        if mode == "save":
            dcp.save(make(0, mesh), storage_writer=writers[which](d))
        elif mode == "snapsave":
            # Writer.stage's snapshot (on the host here: device_type="cpu"), the state
            # overwritten after it, the snapshot saved
            st = make(0, mesh)
            ferry.dcp._free_bytes = lambda dev: 1 << 40
            times = {}
            snap = ferry.dcp._device_snapshot(st, times, device_type="cpu")
            assert snap is not None and times["path"].startswith("device snapshot"), times
            assert type(snap["sharded"]) is type(st["sharded"])
            assert snap["sharded"].placements == st["sharded"].placements
            with torch.no_grad():
                def zero(v):
                    if hasattr(v, "_local_tensor"):
                        v._local_tensor.zero_()
                    elif isinstance(v, torch.Tensor):
                        v.zero_()
                    elif isinstance(v, dict):
                        for x in v.values():
                            zero(x)
                    elif isinstance(v, (list, tuple)):
                        for x in v:
                            zero(x)
                zero(st)
            dcp.save(snap, storage_writer=writers[which](d))
        else:
            got = make(1, mesh)
            dcp.load(got, storage_reader=readers[which](d))
            same(make(0, mesh), got)
            if rank == 0:
                print("LOADED", which, d, flush=True)
    dist.barrier()
    dist.destroy_process_group()
''')




def test_four_pairings_world_sizes_and_resharding(tmp_path):
    # three launches (4, 2 and 1 ranks): each saves with both writers, then loads what it and
    # the launch before saved with both readers (4 -> 2, 2 -> 1 resharding).
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    d = {(w, n): str(tmp_path / ("%s-%d" % (w, n))) for w in ("ferry", "stock") for n in (1, 2, 4)}
    prev = None
    for n in (4, 2, 1):
        ops = ["save:%s:%s" % (w, d[(w, n)]) for w in ("ferry", "stock")]
        loads = ["load:%s:%s" % (r, d[(w, m)]) for m in ((n,) if prev is None else (n, prev))
                 for w in ("ferry", "stock") for r in ("ferry", "stock")]
        out = _ranks.run(script, n, ops + loads)
        assert out.count("LOADED") == len(loads), out
        prev = n
    # each rank wrote its own file, as the stock writer does
    assert sorted(os.listdir(d[("ferry", 4)])) == sorted(os.listdir(d[("stock", 4)]))


def test_async_staging_snapshot(tmp_path):
    """Writer.stage's device snapshot (run on host tensors: device_type="cpu"), 2 ranks with a
    DTensor: taken, the source state overwritten, the snapshot saved by ferry's writer (its
    tensors are views into one allocation), loaded by both readers equal to the state before."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    d = str(tmp_path / "snap")
    out = _ranks.run(script, 2, ["snapsave:ferry:" + d, "load:stock:" + d, "load:ferry:" + d])
    assert out.count("LOADED") == 2, out


def test_snapshot_files_equal_the_stock_writers(tmp_path, monkeypatch):
    """The snapshot's tensors are views into one allocation per device: ferry's writer writes
    their bytes, not the allocation's, and the files equal the stock writer's of the state."""
    monkeypatch.setattr(fdcp, "_free_bytes", lambda dev: 1 << 40)
    times = {}
    snap = fdcp._device_snapshot(_state(), times, device_type="cpu")
    assert snap is not None, times
    big = {t.untyped_storage().data_ptr() for t in snap["model"].values()}
    assert len(big) == 1 and snap["model"]["weight"].untyped_storage().nbytes() > 4 * 5 * 4
    a, b = tmp_path / "ferry", tmp_path / "stock"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(snap, storage_writer=fdcp.Writer(a))
        dcp.save(_state(), storage_writer=dcp.FileSystemWriter(b))
    ma = pickle.loads((a / ".metadata").read_bytes())
    mb = pickle.loads((b / ".metadata").read_bytes())
    names = sorted(n for n in os.listdir(a) if n.endswith(".distcp"))
    for n in names:
        fa = _blank_ids((a / n).read_bytes(), ma.storage_data, n)
        fb = _blank_ids((b / n).read_bytes(), mb.storage_data, n)
        assert fa == fb, n


def test_stage_without_gpu_tensors_is_the_stock_one(tmp_path):
    w = fdcp.Writer(tmp_path / "x")
    st = _state()
    out = w.stage(st)
    assert w.stage_times["path"].startswith("stock (no GPU tensor"), w.stage_times
    assert torch.equal(out["t"], st["t"]) and out["t"].data_ptr() != st["t"].data_ptr()


def _state():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 4)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 5)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "note": "x" * 10,
            "t": torch.arange(24, dtype=torch.float16).reshape(4, 6).t(),
            "half_view": torch.arange(40, dtype=torch.int32)[10:30]}


def _blank_ids(blob, storage_data, fname):
    """blob with each tensor item's .data/serialization_id (random in torch.save) and its crc32s
    zeroed, so that two saves of one state compare equal."""
    out = bytearray(blob)
    for info in storage_data.values():
        if info.relative_path != fname:
            continue
        z = ftorch._bytes_zip(fname, out[info.offset:info.offset + info.length])
        rec = z.find(".data/serialization_id")
        if rec is None:
            continue  # a BytesIO item
        at = info.offset + z.offset(rec)
        out[at:at + rec.size] = bytes(rec.size)
        out[at + rec.size + 4:at + rec.size + 8] = bytes(4)  # data descriptor crc
        out[info.offset + rec.cd_at:info.offset + rec.cd_at + 4] = bytes(4)
    return bytes(out)


def test_files_equal_the_stock_writers(tmp_path):
    st = _state()
    a, b = tmp_path / "ferry", tmp_path / "stock"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=fdcp.Writer(a))
        dcp.save(st, storage_writer=dcp.FileSystemWriter(b))
    ma = pickle.loads((a / ".metadata").read_bytes())
    mb = pickle.loads((b / ".metadata").read_bytes())
    assert {k: (v.relative_path, v.offset, v.length) for k, v in ma.storage_data.items()} == \
        {k: (v.relative_path, v.offset, v.length) for k, v in mb.storage_data.items()}
    assert ma.state_dict_metadata == mb.state_dict_metadata
    names = sorted(n for n in os.listdir(a) if n.endswith(".distcp"))
    assert names == sorted(n for n in os.listdir(b) if n.endswith(".distcp"))
    for n in names:
        fa = _blank_ids((a / n).read_bytes(), ma.storage_data, n)
        fb = _blank_ids((b / n).read_bytes(), mb.storage_data, n)
        assert len(fa) == len(fb)
        diff = [i for i in range(len(fa)) if fa[i] != fb[i]]
        assert not diff, "%s differs from the stock writer's at %s" % (n, diff[:10])
    assert not [n for n in os.listdir(a) if "tmp" in n], os.listdir(a)


def test_thread_count_and_async_save(tmp_path):
    st = _state()
    big = {"w%d" % i: torch.randn(300 + i, 17) for i in range(6)}
    st.update(big)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.async_save(st, storage_writer=fdcp.Writer(tmp_path / "a", thread_count=3)).result()
        got = {k: torch.zeros_like(v) for k, v in big.items()}
        dcp.load(got, storage_reader=dcp.FileSystemReader(tmp_path / "a"))
    assert len([n for n in os.listdir(tmp_path / "a") if n.endswith(".distcp")]) == 3
    for k, v in big.items():
        assert torch.equal(got[k], v), k


def test_reader_reads_narrowed_and_noncontiguous_targets(tmp_path):
    # a stock-saved column-major tensor read into a row-major target: the copy path
    st = {"t": torch.arange(60, dtype=torch.float64).reshape(6, 10).t()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=dcp.FileSystemWriter(tmp_path / "c"))
        got = {"t": torch.zeros(10, 6, dtype=torch.float64)}
        dcp.load(got, storage_reader=fdcp.Reader(tmp_path / "c"))
    assert torch.equal(got["t"], st["t"])


KILLED = textwrap.dedent(r'''
    import os, signal, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import filesystem
    import ferry.dcp, ferry.torch
    which, d = sys.argv[1], sys.argv[2]
    state = {"w%d" % i: torch.full((1000,), float(i)) for i in range(8)}
    W = ferry.dcp.Writer if which == "ferry" else dcp.FileSystemWriter
    dcp.save(state, storage_writer=W(d))           # a complete checkpoint
    for k in state:
        state[k] += 100
    calls = [0]
    def dying(real):
        def f(*a, **k):
            calls[0] += 1
            if calls[0] == 4:                       # midway through the data file
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        return f
    if which == "ferry":
        ferry.dcp._ft._Writes.add = dying(ferry.dcp._ft._Writes.add)
    else:
        filesystem.torch.save = dying(filesystem.torch.save)
    dcp.save(state, storage_writer=W(d))           # overwritten, killed midway
    print("not killed")
''')


@pytest.mark.parametrize("which", ["ferry", "stock"])
def test_sigkill_mid_save(tmp_path, which):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    d = tmp_path / "ck"
    p = subprocess.run([sys.executable, str(script), which, str(d)], env=_ranks.env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    complete = (d / ".metadata").exists()
    if which == "stock":
        # The stock writer rewrites the data files under the old .metadata: a reader takes the
        # half-written directory as complete. This is what ferry's writer fixes.
        assert complete
        return
    assert not complete, sorted(os.listdir(d))
    with pytest.raises(FileNotFoundError):
        dcp.FileSystemReader(d).read_metadata()
    with pytest.raises(dcp.api.CheckpointException):
        dcp.load({"w0": torch.zeros(1000)}, storage_reader=dcp.FileSystemReader(d))
    # the killed writer's temporary is left; the next save removes it (its flock died with it)
    assert [n for n in os.listdir(d) if ".ferry-tmp-" in n], sorted(os.listdir(d))
    state = {"w%d" % i: torch.full((1000,), float(i)) for i in range(8)}
    dcp.save(state, storage_writer=fdcp.Writer(d))
    assert not [n for n in os.listdir(d) if ".ferry-tmp-" in n], sorted(os.listdir(d))
    got = {"w3": torch.zeros(1000)}
    dcp.load(got, storage_reader=dcp.FileSystemReader(d))
    assert torch.equal(got["w3"], state["w3"])


def test_same_shape_items_have_their_own_zips(tmp_path):
    """The writer lays out one zip per dtype, shape and strides and copies it per item: each
    item's crc32s are its own (zipfile checks them) and the stock reader loads every value."""
    import io
    import zipfile
    st = {"w%d" % i: torch.randn(1000 + i % 2, 3) for i in range(8)}
    st.update({"s%d" % i: torch.tensor(float(i)) for i in range(4)})
    st["t"] = torch.randn(5, 6).t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=fdcp.Writer(tmp_path), no_dist=True)
        out = {k: torch.zeros_like(v) for k, v in st.items()}
        dcp.load(out, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    assert all(torch.equal(out[k], st[k]) for k in st)
    md = pickle.loads((tmp_path / ".metadata").read_bytes())
    for sd in md.storage_data.values():
        raw = (tmp_path / sd.relative_path).read_bytes()[sd.offset:sd.offset + sd.length]
        assert zipfile.ZipFile(io.BytesIO(raw)).testzip() is None, sd
    assert len(md.storage_data) == len(st)


@pytest.mark.parametrize("prefetch", [True, False])
def test_reader_reads_in_batches(tmp_path, monkeypatch, prefetch):
    """ferry's reader reads a plan's framing in one submission (every item's: on a thread of its
    own from set_up_storage_reader on, while DCP plans, unless the checkpoint has more than
    _PREFETCH_ITEMS items; else in read_data), each contiguous
    region as one read submitted as soon as its item is parsed (a Future), then the others
    through host memory in groups of at most _HOST_BATCH bytes, and every value lands where it
    belongs: large items (framing read from their ends), small ones (read whole), same-shape
    items (one pickle parsed), non-contiguous regions spread over several host groups."""
    st = {"big%d" % i: torch.randn(5000 + 7 * (i % 2)) for i in range(6)}
    st.update({"s%d" % i: torch.tensor(float(i)) for i in range(5)})
    st.update({"t%d" % i: torch.randn(40, 30).t() for i in range(4)})  # column-major on disk
    st["b"] = "a byte item"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=fdcp.Writer(tmp_path), no_dist=True)
    calls = []
    real = fdcp._ferry.Context.read_batch

    def counting(self, entries):
        calls.append(len(entries))
        threads.append(threading.current_thread().name)
        return real(self, entries)

    threads = []
    if not prefetch:
        monkeypatch.setattr(fdcp, "_PREFETCH_ITEMS", 0)

    monkeypatch.setattr(fdcp._ferry.Context, "read_batch", counting)
    submitted, seen = [], []
    real_async, real_item = fdcp._read_async, fdcp.Reader._item

    def read_async(f, off, buf):
        submitted.append(off)
        return real_async(f, off, buf)

    def item(self, *a):
        seen.append(len(submitted))  # reads in flight when the next item is parsed
        return real_item(self, *a)

    monkeypatch.setattr(fdcp, "_read_async", read_async)
    monkeypatch.setattr(fdcp.Reader, "_item", item)
    monkeypatch.setattr(fdcp, "_HOST_BATCH", 2 * 40 * 30 * 4)  # two of the four per group
    out = {k: torch.zeros(30, 40) if k.startswith("t") else
           (torch.zeros_like(v) if isinstance(v, torch.Tensor) else "") for k, v in st.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(out, storage_reader=fdcp.Reader(tmp_path), no_dist=True)
    bad = [k for k, v in st.items() if isinstance(v, torch.Tensor) and not torch.equal(out[k], v)]
    assert not bad, bad
    assert out["b"] == st["b"]
    # framing (16 items, the large ones as two windows), 2 host groups of 2
    assert calls == [6 * 2 + 5 + 4 + 1, 2, 2], calls
    main = threading.current_thread().name
    assert threads == ["ferry-dcp-frames" if prefetch else main, main, main], threads
    # the 11 contiguous regions: one read each, submitted while the later items are parsed
    assert len(submitted) == 11 and len(set(submitted)) == 11, submitted
    assert len(seen) == 15 and seen == sorted(seen) and seen[-1] >= 10, seen


def test_reader_tells_apart_items_of_one_length(tmp_path):
    """Items of the same length whose zips differ only inside data.pkl (shapes 3x4 and 4x3,
    the same bytes) or in the crc32s (same shape, other values; the stock writer's random
    serialization ids) each get their own tensor: the reader's reuse of an earlier item's
    parse compares every byte it read but the crc32 fields."""
    st = {"a": torch.arange(12.0).reshape(3, 4), "b": torch.arange(12.0).reshape(4, 3) + 100,
          "c": torch.arange(12.0).reshape(3, 4) * -1, "d": torch.arange(12.0).reshape(4, 3).t()}
    for name, W in (("ferry", fdcp.Writer), ("stock", dcp.FileSystemWriter)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(st, storage_writer=W(tmp_path / name), no_dist=True)
            out = {k: torch.zeros(v.shape) for k, v in st.items()}
            dcp.load(out, storage_reader=fdcp.Reader(tmp_path / name), no_dist=True)
        bad = [k for k in st if not torch.equal(out[k], st[k])]
        assert not bad, (name, bad)
        md = pickle.loads((tmp_path / name / ".metadata").read_bytes())
        assert len({sd.length for sd in md.storage_data.values()}) < len(st), name


def test_reader_truncated_file_names_the_item(tmp_path):
    st = {"w%d" % i: torch.full((4096,), float(i)) for i in range(4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=fdcp.Writer(tmp_path), no_dist=True)
    md = pickle.loads((tmp_path / ".metadata").read_bytes())
    last = max(md.storage_data.values(), key=lambda s: s.offset)
    os.truncate(tmp_path / last.relative_path, last.offset + last.length // 2)
    out = {k: torch.zeros(4096) for k in st}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(dcp.api.CheckpointException) as e:
            dcp.load(out, storage_reader=fdcp.Reader(tmp_path), no_dist=True)
    # dcp.load wraps it in a CheckpointException, with the rank's exception in failures
    msg = str(e.value) + " ".join(str(x) for x in getattr(e.value, "failures", {}).values())
    assert "run past the end" in msg and last.relative_path in msg, msg
