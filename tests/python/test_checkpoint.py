"""ferry.checkpoint: save / async_save / load_latest round trips, snapshots, pruning, errors at
wait, and several ranks through torch.distributed (gloo on the CPU, processes spawned here)."""
import os
import textwrap

import pytest

from conftest import need, run_ranks

torch = need("torch")

import ferry  # noqa: E402
import ferry.checkpoint as ck  # noqa: E402


def steps(d):
    return sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step-"))


def nested_state():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "note": None}


def assert_state_equal(a, b, path="state"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), (path, list(a), list(b))
        for k in a:
            assert_state_equal(a[k], b[k], "%s.%s" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_state_equal(x, y, "%s.%d" % (path, i))
    else:
        assert a == b, (path, a, b)


def test_round_trip_nested_and_flat(tmp_path):
    d = tmp_path / "ck"
    assert ck.load_latest(d, missing_ok=True) == (None, {})  # d does not exist yet
    state = nested_state()
    ck.save(state, d, step=10, metadata={"arch": "mlp"})
    step, back = ck.load_latest(d)
    assert step == 10
    assert_state_equal(state, back)
    flat, tree = ck.flatten(state)
    assert "optim.state.0.exp_avg" in flat and "model.0.weight" in flat
    back = ck.load(d, 10, nested=False)  # file order (the writer's layout), as safetensors gives
    assert_state_equal(dict(sorted(back.items())), dict(sorted(flat.items())))
    assert ck.verify(d) == 10
    ck.save({"w": torch.arange(6.0)}, d, 11)
    step, back = ck.load_latest(d)
    assert step == 11 and list(back) == ["w"] and torch.equal(back["w"], torch.arange(6.0))


def test_async_save_is_a_snapshot(tmp_path):
    d = tmp_path / "ck"
    big = torch.randn(8 << 20)  # 32 MiB
    small = torch.arange(1000, dtype=torch.int64)
    want = {"big": big.clone(), "small": small.clone()}
    h = ck.async_save({"big": big, "small": small}, d, step=1)
    big.fill_(0)  # the caller goes on at once
    small.mul_(-1)
    assert h.wait(timeout=120) is True and h.done()
    assert h.result() == 1
    step, back = ck.load_latest(d)
    assert step == 1
    assert torch.equal(back["big"], want["big"]) and torch.equal(back["small"], want["small"])
    # a second async save waits for the first (busy="wait", the default)
    h2 = ck.async_save({"big": big}, d, step=2)
    h3 = ck.async_save({"big": big + 1}, d, step=3)
    assert h2.wait() and h3.wait()
    assert torch.equal(ck.load(d, 2)["big"], big) and torch.equal(ck.load_latest(d)[1]["big"], big + 1)


def test_busy_refuse(tmp_path):
    d = tmp_path / "ck"
    state = {"t": torch.randn(64 << 20)}  # 256 MiB: long enough to still be in flight
    h = ck.async_save(state, d, step=1)
    if h.done():
        pytest.skip("the 256 MiB save finished before the second call could be refused")
    with pytest.raises(ferry.Error) as e:
        ck.async_save(state, d, step=2, busy="refuse")
    assert e.value.code == ferry.EBUSY
    assert h.wait()
    assert ck.latest_step(d) == 1


def test_keep_prunes(tmp_path):
    d = tmp_path / "ck"
    for s in range(1, 6):
        ck.save({"x": torch.full((4,), float(s))}, d, s, keep=2)
    assert steps(d) == [4, 5]
    ck.save({"x": torch.zeros(1)}, d, 6, keep=0)
    ck.save({"x": torch.zeros(1)}, d, 7, keep=0)
    assert steps(d) == [4, 5, 6, 7]
    assert os.path.isdir(d / "recycle")  # step 3's shard, kept for a later save to write over
    assert ck.prune(d, 1) == 4 and steps(d) == [7]  # 4, 5, 6 and the recycled step
    assert not os.path.exists(d / "recycle")


def test_recycle(tmp_path):
    # keep=1: from step 3 on each save writes over the shard of the step pruned before (the same
    # inode), and every step loads what was saved; recycle=False makes new files.
    d = tmp_path / "ck"
    shard = "rank-00000-of-00001.safetensors"
    inodes = []
    for s in range(1, 6):
        ck.save({"x": torch.full((1000,), float(s))}, d, s, keep=1)
        inodes.append(os.stat(d / ("step-%012d" % s) / shard).st_ino)
        step, state = ck.load_latest(d, verify=True)
        assert step == s and torch.equal(state["x"], torch.full((1000,), float(s)))
    if inodes[2] != inodes[0]:
        pytest.skip("%s grants no write leases: shards are not recycled there" % tmp_path)
    assert inodes[2:] == inodes[:3] and inodes[0] != inodes[1]
    assert os.listdir(d / "recycle") == [shard]  # step 4's; no marker, no manifest
    ck.save({"x": torch.ones(1000)}, d, 6, keep=1, recycle=False)
    assert os.stat(d / ("step-%012d" % 6) / shard).st_ino not in inodes
    assert not os.path.exists(d / "recycle")  # without recycling, its space goes back


def test_errors(tmp_path):
    d = tmp_path / "ck"
    ck.save({"x": torch.zeros(2)}, d, 5)
    with pytest.raises(FileExistsError, match="not after the latest"):
        ck.save({"x": torch.zeros(2)}, d, 5)
    with pytest.raises(ValueError, match="step"):
        ck.save({"x": torch.zeros(2)}, d, -1)
    with pytest.raises(TypeError, match="object"):
        ck.save({"x": object()}, d, 6)
    with pytest.raises(ValueError, match="busy"):
        ck.save({"x": torch.zeros(2)}, d, 6, busy="maybe")
    with pytest.raises(ValueError, match="rank"):
        ck.save({"x": torch.zeros(2)}, d, 6, rank=2, world_size=2)
    with pytest.raises(FileNotFoundError):
        ck.load(d, 4)
    # a refused or failed attempt leaves nothing behind for the next save
    with pytest.raises(OSError, match="a/b"):
        ck.save({"ok": torch.zeros(1), "a/b": torch.zeros(1)}, d, 6)
    with pytest.raises(FileExistsError):
        ck.save({"y": torch.zeros(1)}, d, 5)
    ck.save({"z": torch.ones(1)}, d, 6)
    assert list(ck.load(d, 6)) == ["z"]
    # An error in the background comes back from wait(), every time it is asked: rank 0 of two
    # waits for rank 1's marker, which never comes.
    e2 = tmp_path / "two"
    h = ck.async_save({"x": torch.zeros(2)}, e2, 1, rank=0, world_size=2, timeout=0.2, run="r1")
    for _ in range(2):
        with pytest.raises(TimeoutError, match="marker missing"):
            h.wait(timeout=60)
    assert h.done() and isinstance(h.exception(), TimeoutError)
    assert ck.latest_step(e2) is None
    # ... while the one-rank directory above is untouched
    assert ck.load_latest(d)[0] == 6


def test_non_contiguous_and_tied_tensors_are_saved(tmp_path):
    w = torch.randn(6, 4)
    ck.save({"emb": w, "head": w, "t": w.t()}, tmp_path / "ck", 1)
    back = ck.load_latest(tmp_path / "ck")[1]
    assert torch.equal(back["emb"], w) and torch.equal(back["head"], w) and torch.equal(back["t"], w.t())


WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import ferry.checkpoint as ck
    rank, world, store, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    def state(step):
        return {"model": {"w": torch.full((1000,), float(rank * 100 + step))},
                "optim": {"step": step, "rank": rank}}
    ck.save(state(1), d, 1, keep=2)
    # save() returns on every rank once rank 0 committed: every rank sees step 1 at once
    assert ck.latest_step(d) == 1, ck.latest_step(d)
    step, s = ck.load_latest(d)
    assert step == 1 and s["optim"] == {"step": 1, "rank": rank}, s
    assert torch.equal(s["model"]["w"], torch.full((1000,), float(rank * 100 + 1)))
    try:
        ck.save(state(1), d, 1)          # not after latest: every rank fails, none hangs
        raise SystemExit("step 1 saved twice")
    except FileExistsError:
        pass
    for k in (2, 3):
        t = state(k)
        h = ck.async_save(t, d, k)
        t["model"]["w"].fill_(-1)        # mutated at once: the snapshot must hold
        assert h.wait(timeout=60)
    dist.barrier()                       # async: rank 0 commits in the background
    step, s = ck.load_latest(d)
    assert step == 3 and torch.equal(s["model"]["w"], torch.full((1000,), float(rank * 100 + 3))), s
    if rank == 0:
        assert ck.verify(d) == 3
        names = sorted(os.listdir(os.path.join(d, "step-000000000003")))
        assert names == ["manifest.json"] + sorted(
            f"rank-{r:05d}-of-{world:05d}.{e}" for r in range(world) for e in ("done", "safetensors")), names
        assert sorted(n for n in os.listdir(d) if n.startswith("step-")) == [
            "step-000000000002", "step-000000000003"]
    dist.destroy_process_group()
    print("rank", rank, "ok")
""")


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_gloo(tmp_path, world):
    dist = need("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = tmp_path / "store"
    d = tmp_path / "ck"
    run_ranks(script, world, store, d)


def save_ranks(d, step, states, run="reshard"):
    """A step saved by len(states) ranks from this one process: the others first, rank 0 (which
    commits once it sees every marker) last."""
    w = len(states)
    for r in list(range(1, w)) + [0]:
        ck.save(states[r], d, step, rank=r, world_size=w, run=run, timeout=5)


def test_reshard_on_load(tmp_path):
    d = str(tmp_path / "c")
    full_w = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)   # rows split over saved ranks
    full_c = torch.arange(3 * 12, dtype=torch.bfloat16).reshape(3, 12)  # columns split
    bias = torch.randn(5)                                            # replicated
    states = [{"w": full_w[4 * r:4 * r + 4].clone(), "c": full_c[:, 6 * r:6 * r + 6].clone(),
               "bias": bias.clone(), "opt.part%d" % r: torch.full((2,), float(r))} for r in range(2)]
    save_ranks(d, 7, states)
    dims = {"w": 0, "c": 1}
    for m in (1, 2, 3, 4):
        for r in range(m):
            if m == 3:  # 8 rows do not split into 3
                with pytest.raises(ValueError, match="split evenly"):
                    ck.load_latest(d, rank=r, world_size=m, shard_dims=dims)
                break
            step, got = ck.load_latest(d, rank=r, world_size=m, shard_dims=dims)
            assert step == 7
            n = 8 // m
            assert torch.equal(got["w"], full_w[n * r:n * r + n]), (m, r)
            k = 12 // m
            assert torch.equal(got["c"], full_c[:, k * r:k * r + k]), (m, r)
            assert torch.equal(got["bias"], bias)
            assert torch.equal(got["opt.part0"], torch.zeros(2)) and torch.equal(got["opt.part1"], torch.ones(2))
    # c along 3 ranks: rank 1's columns [4, 8) come from both saved shards.
    _, got = ck.load_latest(d, rank=1, world_size=3, shard_dims={"c": 1})
    assert torch.equal(got["c"], full_c[:, 4:8])
    assert got["w"].shape == (4, 3)  # not in shard_dims and in every shard: one saved rank's copy
    # Without shard_dims and with the saved world size: this rank's own shard, as before.
    _, own = ck.load_latest(d, rank=1, world_size=2)
    assert torch.equal(own["w"], full_w[4:]) and "opt.part0" not in own
    with pytest.raises(KeyError):
        ck.load_latest(d, rank=0, world_size=2, shard_dims={"nope": 0})
    with pytest.raises(ValueError):
        ck.load_latest(d, world_size=4, shard_dims=dims)  # no rank, no torch.distributed
    with pytest.raises(ValueError):
        ck.load_latest(d, rank=4, world_size=4, shard_dims=dims)


def test_prepare_pins_ahead_and_phases(tmp_path):
    """prepare() allocates (pins, with a GPU) the snapshot's memory, so that the first async_save
    allocates none; each save's phases say where its time went."""
    state = {"a": torch.randn(5 << 20), "b": torch.arange(1000)}  # 20 MiB: two 16 MiB slots
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    ctx = ferry.Context(host_budget="1g")
    d = tmp_path / "ck"
    held = ck.prepare(state, d, context=ctx)
    assert held >= nbytes
    h = ck.async_save(state, d, 1, context=ctx)
    assert h.wait()
    p = h.phases()
    assert p["pinned_new_bytes"] == 0 and p["bytes"] == nbytes and p["slots"] == 2
    for k in ("py.flatten", "py.add", "py.c_save", "ckpt.prepare", "call.header", "call.slots", "call.copy",
              "call.total", "writer.layout", "writer.write_wait", "writer.fsync", "writer.dirsync",
              "writer.after", "writer.total"):
        assert k in p and p[k] >= 0, k
    assert p["blocked"] >= p["py.c_save"] >= p["call.total"] > 0
    assert p["writer.total"] >= p["writer.after"] > 0  # the marker, the commit
    assert ck.load_latest(d)[0] == 1

    # Without prepare the first save of a directory allocates its memory; the next reuses it.
    h = ck.async_save(state, tmp_path / "other", 1, context=ctx)
    assert h.wait() and h.phases()["pinned_new_bytes"] >= nbytes
    h = ck.async_save(state, tmp_path / "other", 2, context=ctx)
    assert h.wait() and h.phases()["pinned_new_bytes"] == 0

    # In the background, by size: the next save waits for it.
    assert ck.prepare(100 << 20, tmp_path / "bg", background=True, context=ctx) == 0
    h = ck.async_save(state, tmp_path / "bg", 1, context=ctx)
    assert h.wait() and h.phases()["pinned_new_bytes"] == 0

    # A state smaller than a slot: one slot of its size.
    tiny = {"t": torch.arange(10.0)}
    ck.prepare(tiny, tmp_path / "tiny", context=ctx)
    h = ck.async_save(tiny, tmp_path / "tiny", 1, context=ctx)
    assert h.wait() and h.phases()["pinned_new_bytes"] == 0

    # host_budget bounds what is held.
    small = ferry.Context(host_budget="32m")
    assert ck.prepare(1 << 30, tmp_path / "capped", context=small) <= 32 << 20
    h = ck.async_save(state, tmp_path / "capped", 1, context=small)
    assert h.wait() and ck.load_latest(tmp_path / "capped")[0] == 1
