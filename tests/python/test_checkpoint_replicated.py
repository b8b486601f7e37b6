"""ferry.checkpoint: replicated state (the same on every rank) saved once, each of 2 gloo ranks
writing half of its bytes; loads at the saved world size, at world size 1 and of every shard;
mixed state, marks, async saves, replicated=False, a corrupted piece."""
import json
import os
import shutil
import subprocess
import textwrap

import pytest

from conftest import ferry_cli, need, run_ranks

torch = need("torch")

import ferry  # noqa: E402
import ferry.checkpoint as ck  # noqa: E402

WORLD = 2

WORKER = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    import ferry.checkpoint as ck
    rank, world, store, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(7)                 # the same on every rank, as DDP's
    model = {"w": torch.randn(256, 128, generator=g), "b": torch.randn(128, generator=g),
             "h": torch.randn(3, 5, generator=g).to(torch.bfloat16), "n": torch.arange(7)}
    optim = {"state": {0: {"exp_avg": torch.randn(256, 128, generator=g), "step": torch.tensor(5.0)}},
             "param_groups": [{"lr": 0.1, "params": [0]}]}
    ddp = {"model": model, "optim": optim, "epoch": 3}
    expect = {"model": {k: v.clone() for k, v in model.items()}, "exp_avg": optim["state"][0]["exp_avg"]}
    ck.save(ddp, d, 1, keep=0, replicated=False)
    ck.save(ddp, d, 2, keep=0)                           # "auto": all of it is alike
    step, s = ck.load_latest(d)
    assert step == 2
    for k, v in model.items():
        assert s["model"][k].dtype == v.dtype and torch.equal(s["model"][k], v), k
    assert torch.equal(s["optim"]["state"][0]["exp_avg"], optim["state"][0]["exp_avg"])
    assert s["optim"]["param_groups"] == optim["param_groups"] and s["epoch"] == 3
    # Mixed: a tensor that differs per rank, one that is alike but for its shape, an empty one.
    mixed = {"model": model, "mine": torch.full((1000,), float(rank)),
             "shape": torch.zeros(rank + 1), "empty": torch.zeros(0), "rank": rank}
    ck.save(mixed, d, 3, keep=0)
    _, s = ck.load_latest(d)
    assert torch.equal(s["mine"], torch.full((1000,), float(rank))) and s["rank"] == rank
    assert s["shape"].shape == (rank + 1,) and s["empty"].shape == (0,)
    assert torch.equal(s["model"]["w"], model["w"])
    # Marked by name/prefix, and asynchronously with the tensors changed at once.
    h = ck.async_save(ddp, d, 4, keep=0, replicated=["model"])
    model["w"].fill_(-1)
    assert h.wait(timeout=60)
    dist.barrier()
    _, s = ck.load_latest(d)
    assert (s["model"]["w"] != -1).all() and torch.equal(s["model"]["b"], model["b"])
    assert torch.equal(s["optim"]["state"][0]["exp_avg"], optim["state"][0]["exp_avg"])
    # prepare() agrees on the replicated tensors too (a collective), then pins what this rank writes.
    assert ck.prepare(ddp, d + "-prepared", replicated=True) >= 0
    # replicated=True on tensors that differ in shape: refused on every rank, nothing hangs.
    try:
        ck.save({"x": torch.zeros(rank + 1)}, d, 5, keep=0, replicated=True)
        raise SystemExit("replicated=True accepted different shapes")
    except ValueError as e:
        assert "'x'" in str(e) or " x" in str(e), e
    expect["mixed_mine"] = mixed["mine"]
    torch.save(expect, os.path.join(d, "expect-%d.pt" % rank))
    dist.destroy_process_group()
    print("rank", rank, "ok")
""")


def shard(d, step, r, world=WORLD):
    return os.path.join(d, "step-%012d" % step, "rank-%05d-of-%05d.safetensors" % (r, world))


def header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    dist = need("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch")
    tmp = tmp_path_factory.mktemp("rep")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    d = tmp / "ck"
    run_ranks(script, WORLD, tmp / "store", d)
    return d, [torch.load(os.path.join(d, "expect-%d.pt" % r)) for r in range(WORLD)]


def test_replicated_state_is_written_once_half_per_rank(saved):
    d, _ = saved
    full = [os.path.getsize(shard(d, 1, r)) for r in range(WORLD)]
    half = [os.path.getsize(shard(d, 2, r)) for r in range(WORLD)]
    # replicated=False: every rank writes everything (today's layout, no pieces)
    for r in range(WORLD):
        h, _ = header(shard(d, 1, r))
        assert "ferry.replicated" not in h.get("__metadata__", {}), h["__metadata__"].keys()
        assert not any(k.startswith("ferry.rep:") for k in h), list(h)
    data = sum(full) // WORLD  # one copy of the state (plus a header)
    for r in range(WORLD):
        assert abs(half[r] - data / WORLD) < 0.1 * data, (r, half, full)
    assert sum(half) < 0.6 * sum(full), (half, full)
    for r in range(WORLD):
        h, _ = header(shard(d, 2, r))
        pieces = json.loads(h["__metadata__"]["ferry.replicated"])
        assert pieces["world"] == WORLD and pieces["pieces"], pieces
        assert all(k.startswith("ferry.rep:") for k in h if k != "__metadata__"), list(h)


def test_load_at_world_one_and_every_shard(saved):
    d, expect = saved
    for step in (1, 2):
        for kw in ({"rank": 0}, {"rank": 1}, {"rank": 0, "world_size": 1}):
            s = ck.load(d, step, **kw)
            for k, v in expect[0]["model"].items():
                got = s["model"][k] if "world_size" not in kw else s["model." + k]
                assert got.dtype == v.dtype and torch.equal(got, v), (step, kw, k)
        flat = ck.load(d, step, rank="all") if step == 2 else None
        if flat is not None:
            assert torch.equal(flat["optim.state.0.exp_avg"], expect[0]["exp_avg"])
            assert not any(k.startswith("ferry.rep:") for k in flat), list(flat)
    s = ck.load(d, 2, rank=1, views=False, verify=True)
    assert torch.equal(s["model"]["w"], expect[1]["model"]["w"])
    # Resharding: replicated tensors come whole; naming one in shard_dims is a mistake, said so.
    with pytest.raises(ValueError, match="saved replicated"):
        ck.load(d, 2, rank=0, world_size=1, shard_dims={"model.w": 0})


def test_mixed_state_keeps_what_differs_per_rank(saved):
    d, expect = saved
    for r in range(WORLD):
        h, _ = header(shard(d, 3, r))
        assert "mine" in h and "shape" in h and "empty" in h, list(h)
        assert "model.w" not in h, list(h)
        assert torch.equal(ck.load(d, 3, rank=r)["mine"], expect[r]["mixed_mine"])
    both = [set(header(shard(d, 4, r))[0]) for r in range(WORLD)]
    # marked ["model"]: the optimizer stays in both shards, the model is in pieces
    assert all("optim.state.0.exp_avg" in b and "model.w" not in b for b in both), both
    assert ck.verify(d, 4) == 4


def test_corrupted_piece_is_detected(saved, tmp_path):
    d, _ = saved
    c = tmp_path / "ck"
    shutil.copytree(d, c)
    p = shard(c, 2, 1)
    h, start = header(p)
    piece = next(k for k in h if k.startswith("ferry.rep:"))
    at = start + h[piece]["data_offsets"][0] + 3
    with open(p, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(ferry.Error, match="EVERIFY"):
        ck.load(c, 2, rank=0, verify=True)
    with pytest.raises(ferry.Error):
        ck.verify(c, 2)
    # A piece gone from the metadata: the tensor's bytes are in no shard, said rather than zeros.
    c = tmp_path / "ck2"
    shutil.copytree(d, c)
    q = shard(c, 2, 0)
    h0, _ = header(q)
    meta = json.loads(h0["__metadata__"]["ferry.replicated"])
    assert meta["pieces"]
    n = header(q)[1] - 8
    # The header's length stays: the metadata is rewritten with its first piece dropped, padded.
    meta["pieces"] = meta["pieces"][1:]
    h0["__metadata__"]["ferry.replicated"] = json.dumps(meta, separators=(",", ":"))
    text = json.dumps(h0, separators=(",", ":"))
    assert len(text) <= n
    with open(q, "r+b") as f:
        f.seek(8)
        f.write(text.encode().ljust(n))
    with pytest.raises(ferry.Error, match="ECORRUPT.*replicated tensors, pieces of"):
        ck.load(c, 2, rank=0)
    # verify is the C check (ferry_ckpt_verify), the same for the CLI
    with pytest.raises(ferry.Error, match="ECORRUPT.*replicated tensor"):
        ck.verify(c, 2)
    cli = os.environ.get("FERRY_CLI") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "ferry")
    if os.access(cli, os.X_OK):
        r = subprocess.run([cli, "ckpt", "verify", os.path.join(c, "step-%012d" % 2)], capture_output=True, text=True)
        assert r.returncode == 1 and "replicated tensor" in r.stderr, (r.stdout, r.stderr)


def test_cli_verify_passes_on_the_replicated_layout(saved):
    cli = ferry_cli()
    d, _ = saved
    for step in (2, 3, 4):
        r = subprocess.run([cli, "ckpt", "verify", os.path.join(d, "step-%012d" % step)],
                           capture_output=True, text=True)
        assert r.returncode == 0, (step, r.stdout, r.stderr)


def test_device_hash_tells_contents_apart():
    # The hash "auto" uses for GPU tensors (computed by torch where the tensor lies), run here on the CPU.
    from ferry import _replicated
    b = torch.randint(0, 256, ((1 << 20) + 5,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    h = _replicated.device_hash(b)
    assert h == _replicated.device_hash(b.clone())
    seen = {h}
    for change in ("swap", "tail", "middle", "longer"):
        c = b.clone()
        if change == "swap":
            w = c[:16].view(torch.int64)
            w[0], w[1] = w[1].clone(), w[0].clone()
        elif change == "tail":
            c[-1] ^= 1
        elif change == "middle":
            c[1 << 19] ^= 0x80
        else:
            c = torch.cat([c, torch.zeros(1, dtype=torch.uint8)])
        seen.add(_replicated.device_hash(c))
    assert len(seen) == 5, seen
