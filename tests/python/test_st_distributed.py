"""ferry.safetensors.load_file(..., distributed=True) (issue 28): 2 and 3 gloo ranks on the CPU load
a two-shard set; every rank ends with the whole state dict, bit for bit a plain load's, while each
reads only its share of the tensor bytes (ferry's bytes_read counter of a context of its own), the
shares together read every byte once, balanced by bytes. A slices rule cuts tensors per rank with
no exchange. Ranks naming different tensors, and no process group, are refused."""
import json
import os
import textwrap

import pytest

from conftest import need, run_ranks

torch = need("torch")
need("safetensors")

import ferry  # noqa: E402
import ferry.safetensors as fst  # noqa: E402
from ferry.safetensors import _dist  # noqa: E402

WORKER = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    import ferry, ferry.safetensors as fst
    from safetensors.torch import load_file as st_load
    rank, world, store, index, shards, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                               sys.argv[4], sys.argv[5].split(","), sys.argv[6])
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    plain = {}
    for s in shards:
        plain.update(st_load(s))
    # 1. the whole set on every rank, bit for bit a plain load's, in file order
    ctx = ferry.Context()
    sd = fst.load_file(index, "cpu", distributed=True, context=ctx, views=(mode != "noviews"))
    assert list(sd) == list(fst.load_file(index, "cpu", context=ferry.Context())), "file order"
    assert set(sd) == set(plain), sorted(set(sd) ^ set(plain))
    for k, v in plain.items():
        assert sd[k].dtype == v.dtype and sd[k].shape == v.shape, k
        assert torch.equal(sd[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
    read_full = ctx.stats()["bytes_read"]
    # 2. a slices rule: the "w" matrices cut by rows, this rank's part read by itself
    def rule(name, shape):
        if name.startswith("w") and len(shape) == 2:
            n = shape[0] // world
            return (0, rank * n, shape[0] if rank == world - 1 else (rank + 1) * n)
        return None
    rctx = ferry.Context()
    sd = fst.load_file(index, "cpu", distributed=True, slices=rule, context=rctx)
    for k, v in plain.items():
        want = rule(k, tuple(v.shape))
        ref = v if want is None else v[want[1]:want[2]]
        assert sd[k].dtype == ref.dtype and sd[k].shape == ref.shape, (k, sd[k].shape, ref.shape)
        assert torch.equal(sd[k].reshape(-1).view(torch.uint8), ref.contiguous().reshape(-1).view(torch.uint8)), k
    # 3. ranks naming other tensors: refused on every rank, nothing hangs
    try:
        fst.load_file(index, "cpu", distributed=True, keys=["b"] if rank else None)
        raise SystemExit("rank %d: a mismatch was not refused" % rank)
    except ValueError as e:
        assert "other tensors than rank 0" in str(e), e
    print(json.dumps({"rank": rank, "read": read_full, "read_rule": rctx.stats()["bytes_read"]}))
    dist.destroy_process_group()
    print("rank %d ok" % rank)
""")


def make_set(d):
    """Two shards and an index; sizes spread so that balancing by bytes matters."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(3)
    a = {"w0": torch.randn(256, 64, generator=g), "w1": torch.randn(96, 32, generator=g).to(torch.bfloat16),
         "b": torch.randn(7, generator=g), "n": torch.arange(5, dtype=torch.int64),
         "flag": torch.tensor([True, False, True])}
    b = {"w2": torch.randn(128, 128, generator=g), "w3": torch.randn(64, 16, generator=g).to(torch.float16),
         "s": torch.tensor(2.5), "e": torch.zeros(0, 4), "u8": torch.arange(13, dtype=torch.uint8)}
    save_file(a, str(d / "m-1.safetensors"))
    save_file(b, str(d / "m-2.safetensors"))
    wm = {k: "m-1.safetensors" for k in a}
    wm.update({k: "m-2.safetensors" for k in b})
    (d / "m.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    sizes = {k: v.numel() * v.element_size() for k, v in {**a, **b}.items()}
    return str(d / "m.safetensors.index.json"), [str(d / "m-1.safetensors"), str(d / "m-2.safetensors")], sizes


def _needs_gloo():
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch")


def _reads(outs, key):
    r = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                r[j["rank"]] = j[key]
    return r


@pytest.mark.parametrize("world,mode", [(2, "views"), (3, "noviews")])
def test_each_rank_reads_its_share(tmp_path, world, mode):
    """Also, in the same ranks: the slices rule and a mismatch refused (the worker asserts them)."""
    _needs_gloo()
    index, shards, sizes = make_set(tmp_path)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = run_ranks(script, world, tmp_path / "store", index, ",".join(shards), mode)
    reads = _reads(outs, "read")
    owners = _dist.plan_owners({t[0]: sizes[t[0]] for t in fst._tensor_list(index, None)}, world)
    share = [sum(sizes[k] for k, r in owners.items() if r == rank) for rank in range(world)]
    assert sum(share) == sum(sizes.values())
    # beyond the tensor bytes it owns, a rank reads the shards' headers once (the plan and its own
    # load share the parsed set), never a byte of another rank's tensors
    hdr = sum(8 + int.from_bytes(open(s, "rb").read(8), "little") for s in shards)
    for rank in range(world):
        assert reads[rank] == share[rank] + hdr, (rank, reads, share, hdr)
    # balanced: no rank holds more than the largest tensor above an even share
    assert max(share) - sum(share) / world <= max(sizes.values()), share
    # the rule: the cut tensors' parts and the rest once: every tensor byte once, plus each rank's headers
    rule = _reads(outs, "read_rule")
    assert sum(rule.values()) == sum(sizes.values()) + world * hdr, (rule, sizes, hdr)


def test_without_a_process_group_it_says_so(tmp_path):
    index, _, _ = make_set(tmp_path)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(ValueError, match="no process group"):
        fst.load_file(index, "cpu", distributed=True)


def test_slices_rule_without_distributed(tmp_path):
    index, shards, _ = make_set(tmp_path)
    sd = fst.load_file(index, "cpu", slices=lambda n, s: (1, 0, 8) if n == "w0" else None)
    full = fst.load_file(index, "cpu")
    assert set(sd) == set(full)
    assert torch.equal(sd["w0"], full["w0"][:, 0:8])
    assert torch.equal(sd["w2"], full["w2"])


def test_plain_cuda_is_the_local_ranks_gpu(monkeypatch):
    # torchrun sets LOCAL_RANK; "cuda" then means this rank's GPU (no GPU is needed to resolve it)
    monkeypatch.setenv("LOCAL_RANK", "3")
    dev, index = fst._device("cuda")
    assert (str(dev), index) == ("cuda:3", 3)
    assert fst._device("cuda:1")[1] == 1  # an explicit index wins
    assert fst._device("cpu")[1] == -1


def test_loader_plain_cuda_is_the_local_ranks_gpu(tmp_path, monkeypatch):
    # ferry.Loader(device="cuda") under torchrun: LOCAL_RANK's GPU. The loader makes its CUDA state
    # lazily, so resolving the device needs no GPU once torch is told one exists.
    np = need("numpy")
    ferry.write_dataset(tmp_path / "ds", [np.arange(10, dtype=np.uint16)] * 20, shard_size=1000)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loader = ferry.Loader(tmp_path / "ds", batch_size=4, device="cuda")
    assert str(loader.device) == "cuda:3"
    assert str(ferry.Loader(tmp_path / "ds", batch_size=4, device="cuda:1").device) == "cuda:1"
