"""ferry.dcp.LoadPlanner against torch's DefaultLoadPlanner (issue 24): for DTensors on 1-D and 2-D
meshes of gloo world sizes 1, 2, 3 and 4 (every factorisation of the world into a 2-D mesh, and
a 1-D mesh of the ranks in reverse order), with
Shard(0), Shard(1), Shard of one dim on both mesh dims and Replicate mixed, dims that the mesh does
not divide, empty local shards, scalars, plain tensors and non-tensor (BytesIO) items, its local
plan equals torch's item by item, each plain-placement DTensor's chunk (ferry's arithmetic) equals
torch's ``__create_chunk_list__``, torch's arange path is not taken for them, other placements
(_StridedShard, Partial) take torch's path with torch's errors, the missing-key and size errors
are torch's; and states saved by N ranks load through ferry's reader with the planner (N -> M for
every pair of the four world sizes), values compared with the saved ones."""
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
pytest.importorskip("torch.distributed.checkpoint")
if not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend here", allow_module_level=True)

import ferry.dcp  # noqa: E402,F401  (the worker imports it; fail here first if it cannot)
import _ranks  # noqa: E402

WORKER = textwrap.dedent(r'''
    import itertools, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import planner_helpers
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import Partial, _StridedShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    import ferry.dcp

    port, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    # every mesh of this world: 1-D, and each a x b == world as 2-D
    meshes = [init_device_mesh("cpu", (world,))]
    meshes += [init_device_mesh("cpu", (a, world // a), mesh_dim_names=("x", "y"))
               for a in range(1, world + 1) if world % a == 0]
    # ranks in reverse order: a rank's coordinate is not its rank
    meshes.append(DeviceMesh("cpu", list(reversed(range(world)))))
    P = [Replicate(), Shard(0), Shard(1)]
    layouts = [(m, pl) for m in meshes for pl in itertools.product(P, repeat=m.ndim)]
    SHAPES = [(), (0,), (1,), (2,), (5,), (13,), (0, 6), (2, 3), (7, 5), (5, 7), (4, 8),
              (3, 2, 5), (9, 0), (1, 11)]
    DTYPES = [torch.float32, torch.bfloat16, torch.int64]

    def full(i, j, shape, seed):
        n = 1
        for s in shape:
            n *= s
        return (torch.arange(n, dtype=torch.int64) * 7 + 1000 * i + 100 * j + seed).reshape(
            shape).to(DTYPES[(i + j) % len(DTYPES)])

    def fits(shape, pl):
        return all(not isinstance(p, Shard) or p.dim < len(shape) for p in pl)

    def layout_for(i, j, shape):
        ok = [lay for lay in layouts if fits(shape, lay[1])]
        return ok[(7 * i + 3 * j + world) % len(ok)]

    def dtensor(v, mesh, pl):
        # the local chunk torch's own function names (distribute_tensor's scatter is not used: on
        # gloo it gives the ranks of a mesh in reverse order the wrong chunks, torch 2.15)
        ls, off = compute_local_shape_and_global_offset(v.shape, mesh, pl)
        loc = v
        for d, (o, n) in enumerate(zip(off, ls)):
            loc = loc.narrow(d, o, n)
        return DTensor.from_local(loc.clone(), mesh, list(pl), run_check=False, shape=v.shape,
                                  stride=v.stride())

    def state(seed, fill):
        st, want = {}, {}
        for i, shape in enumerate(SHAPES):
            for j in range(4):
                mesh, pl = layout_for(i, j, shape)
                v = full(i, j, shape, seed)
                want["t%d_%d" % (i, j)] = v
                st["t%d_%d" % (i, j)] = dtensor(v if fill else torch.zeros_like(v), mesh, pl)
        plain = torch.arange(12, dtype=torch.float32).reshape(3, 4) + seed
        st["plain"] = plain if fill else torch.zeros_like(plain)
        st["nested"] = {"s": torch.tensor(2.5 + seed) if fill else torch.tensor(0.0),
                        "step": 17 + seed if fill else -1,
                        "name": "run-%d" % seed if fill else "",
                        "lst": [1, seed, "x"] if fill else []}
        want["plain"], want["nested.s"] = plain, torch.tensor(2.5 + seed)
        want["nested.step"], want["nested.name"] = 17 + seed, "run-%d" % seed
        want["nested.lst"] = [1, seed, "x"]
        return st, want

    def plans(st, md, **kw):
        out = []
        for cls in (dcp.DefaultLoadPlanner, ferry.dcp.LoadPlanner):
            pl = cls(**kw)
            pl.set_up_planner(st, md, rank == 0)
            try:
                out.append(pl.create_local_plan())
            except Exception as e:
                out.append(e)
        return out

    def same_plans(st, md, what, **kw):
        ref, got = plans(st, md, **kw)
        if isinstance(ref, Exception) or isinstance(got, Exception):
            assert type(ref) is type(got) and str(ref) == str(got), (what, ref, got)
            return ref
        assert len(ref.items) == len(got.items), (what, len(ref.items), len(got.items))
        for a, b in zip(ref.items, got.items):
            assert a == b and repr(a) == repr(b), (what, a, b)
        assert ref.storage_data == got.storage_data and ref.planner_data == got.planner_data
        return ref

    def check_chunks(st):
        fast = 0
        for k, v in st.items():
            if isinstance(v, DTensor):
                want = v.__create_chunk_list__()
                got = ferry.dcp._dtensor_chunk(v)
                assert got is not None, (k, v.placements)
                assert [got] == want and got.offsets == want[0].offsets, (
                    k, v.shape, v.placements, got, want)
                fast += 1
        return fast

    seed = world
    out_dir = sys.argv[4]
    loads = sys.argv[5:]
    # 1. save this world's state
    st, _ = state(seed, True)
    n_fast = check_chunks(st)
    assert n_fast == 4 * len(SHAPES), n_fast
    dcp.save(st, storage_writer=ferry.dcp.Writer(os.path.join(out_dir, "w%d" % world)))
    # 2. the plans and the loads of every checkpoint named, each saved by its own world size
    empty_seen = 0
    for src in loads:
        saved_world = int(src)
        d = os.path.join(out_dir, "w%d" % saved_world)
        md = ferry.dcp.Reader(d).read_metadata()
        tgt, _ = state(saved_world, False)
        _, want = state(saved_world, True)
        ref = same_plans(tgt, md, "load of w%d" % saved_world)
        assert len(ref.items) > 0
        empty_seen += sum(1 for v in tgt.values() if isinstance(v, DTensor) and v.numel() and
                          v.to_local().numel() == 0)
        # no arange path for plain placements: torch's chunk function is not called
        calls = []
        real = planner_helpers.compute_local_shape_and_global_offset
        planner_helpers.compute_local_shape_and_global_offset = (
            lambda *a, **k: calls.append(a) or real(*a, **k))
        try:
            pl = ferry.dcp.LoadPlanner()
            pl.set_up_planner(tgt, md, rank == 0)
            pl.create_local_plan()
            assert not calls, calls
            pl = dcp.DefaultLoadPlanner()
            pl.set_up_planner(tgt, md, rank == 0)
            pl.create_local_plan()
            assert len(calls) == 4 * len(SHAPES), len(calls)  # the check itself sees torch's path
        finally:
            planner_helpers.compute_local_shape_and_global_offset = real
        dcp.load(tgt, storage_reader=ferry.dcp.Reader(d), planner=ferry.dcp.LoadPlanner())
        for k, v in tgt.items():
            if k == "nested":
                for kk, vv in v.items():
                    w = want["nested." + kk]
                    ok = (torch.equal(vv, w) if isinstance(w, torch.Tensor) else
                          type(vv) is type(w) and vv == w)
                    assert ok, (kk, vv, w)
                continue
            w = want[k]
            if isinstance(v, DTensor):
                c = v.__create_chunk_list__()[0]  # torch's own chunk: the reference
                exp = w
                for dim, (o, s) in enumerate(zip(c.offsets, c.sizes)):
                    exp = exp.narrow(dim, o, s)
                v = v.to_local()
            else:
                exp = w
            assert v.dtype == exp.dtype and v.shape == exp.shape, (k, v.shape, exp.shape)
            assert torch.equal(v, exp), (k, saved_world, world, v, exp)
        # strictness and errors: torch's, word for word
        extra = dict(tgt)
        extra["not_saved"] = torch.zeros(3)
        e = same_plans(extra, md, "missing key")
        assert isinstance(e, RuntimeError) and "not_saved" in str(e), e
        r = same_plans(extra, md, "partial load", allow_partial_load=True)
        assert not isinstance(r, Exception)
        bad = dict(tgt)
        bad["t8_0"] = torch.zeros(3, 3)
        e = same_plans(bad, md, "size mismatch")
        assert isinstance(e, ValueError), e
    if world > 1 and loads:
        n = torch.tensor([empty_seen])
        dist.all_reduce(n)
        assert int(n) > 0, "no empty local shard of a non-empty tensor was exercised"
    # 3. placements ferry leaves to torch: _StridedShard and Partial
    md = ferry.dcp.Reader(os.path.join(out_dir, "w%d" % world)).read_metadata()
    key = "t%d_0" % SHAPES.index((7, 5))
    shape = torch.Size((7, 5))
    # FSDP2 over tensor parallel's layout: the dim split across both mesh dims, right first
    strided = [(m, [_StridedShard(0, split_factor=m.shape[1]), Shard(0)])
               for m in meshes if m.ndim == 2]
    assert strided
    for mesh, pl in strided:
        ls, _ = compute_local_shape_and_global_offset(shape, mesh, pl)
        dt = DTensor.from_local(torch.zeros(ls), mesh, pl, run_check=False, shape=shape,
                                stride=(5, 1))
        assert ferry.dcp._dtensor_chunk(dt) is None, pl
        ref = same_plans({key: dt}, md, "strided %s" % (pl,))
        assert not isinstance(ref, Exception), ref
    part = DTensor.from_local(torch.zeros(7, 5), meshes[0], [Partial()], run_check=False)
    assert ferry.dcp._dtensor_chunk(part) is None
    e = same_plans({key: part}, md, "partial")
    assert isinstance(e, Exception), e
    dist.barrier()
    if rank == 0:
        print("WORKER OK", world, loads, flush=True)
    dist.destroy_process_group()
''')




def test_planner_equals_torchs_and_loads_resharded(tmp_path):
    # four launches (4, 3, 2, 1 ranks, then 4 again): each saves its state, then plans and loads
    # every checkpoint saved so far (its own included), so every N -> M pair of {1, 2, 3, 4} is
    # planned and loaded by some launch.
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = []
    for world in (4, 3, 2, 1, 4):
        if world not in done:
            done.append(world)
        out = _ranks.run(script, world, [str(tmp_path)] + [str(w) for w in done], timeout=600)
        assert "WORKER OK" in out, out
