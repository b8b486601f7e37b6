"""torch.distributed.checkpoint with ferry.dcp.Writer/Reader on the GPU (issue 24): an FSDP2
(`fully_shard`) model and its optimizer state, on CUDA, saved with ferry's writer and loaded with
ferry's reader into a fresh FSDP2 model and optimizer, bit-exact; `dcp.async_save` with ferry's
writer while training steps run meanwhile, the saved state equal to the state at the call; and
ferry.torch.save of CUDA tensors (crc32s computed in pinned buffers) read back by torch.load.
The FSDP2 part runs in a process of its own (world size 1 over nccl), so no process group is left
in the pytest process. Run by scripts/gpu-check.sh (pytest -rs)."""
import os
import subprocess
import sys
import textwrap

import pytest

import _gpu
import ferry

torch = _gpu.cuda_torch()
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_nccl_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed lacks nccl or gloo here", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2, torch >= 2.6)
except ImportError:
    pytest.skip("torch.distributed.fsdp.fully_shard (FSDP2) is not in this torch", allow_module_level=True)

import ferry.torch as ftorch  # noqa: E402

FSDP = textwrap.dedent(r'''
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import ferry.dcp

    path, port = sys.argv[1], sys.argv[2]
    # a gloo group beside nccl: dcp.async_save runs its collectives on the CPU
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method="tcp://127.0.0.1:%s" % port, rank=0, world_size=1)
    torch.cuda.set_device(0)

    class Net(torch.nn.Module):  # a bf16 layer and fp32 layers, each its own FSDP2 group
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 512).to(torch.bfloat16)
            self.b = torch.nn.Linear(512, 256)
            self.n = torch.nn.LayerNorm(256)

        def forward(self, x):
            return self.n(self.b(torch.nn.functional.gelu(self.a(x.to(torch.bfloat16)).float())))

    def build(seed):
        torch.manual_seed(seed)
        m = Net().cuda()
        fully_shard(m.a)
        fully_shard(m.b)
        fully_shard(m)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    def step(m, opt, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(64, 256, device="cuda", generator=g)
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def full(sd):
        out = {}
        for k, v in sd.items():
            if isinstance(v, dict):
                out[k] = full(v)
            elif hasattr(v, "full_tensor"):
                out[k] = v.full_tensor().detach().clone()
            elif isinstance(v, torch.Tensor):
                out[k] = v.detach().clone()
            else:
                out[k] = v
        return out

    def same(a, b, where="state"):
        if isinstance(a, dict):
            assert set(a) == set(b), (where, sorted(a), sorted(b))
            for k in a:
                same(a[k], b[k], "%s.%s" % (where, k))
        elif isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype)
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), where
        else:
            assert a == b, (where, a, b)

    m, opt = build(0)
    for s in range(3):
        step(m, opt, s)
    msd, osd = get_state_dict(m, opt)
    assert any(hasattr(v, "full_tensor") for v in msd.values()), "FSDP2 state is not DTensors"
    want = full({"model": msd, "optim": osd})
    dcp.save({"model": msd, "optim": osd}, storage_writer=ferry.dcp.Writer(path + "/sync"))

    m2, opt2 = build(1)
    step(m2, opt2, 99)  # optimizer state exists, and differs
    msd2, osd2 = get_state_dict(m2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, storage_reader=ferry.dcp.Reader(path + "/sync"))
    set_state_dict(m2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same(want, full({"model": get_state_dict(m2, opt2)[0], "optim": get_state_dict(m2, opt2)[1]}))
    print("fsdp2 sync ok", flush=True)

    # async: the state at the call is what lands, while training goes on meanwhile
    msd, osd = get_state_dict(m, opt)
    at_call = full({"model": msd, "optim": osd})
    w = ferry.dcp.Writer(path + "/async")
    fut = dcp.async_save({"model": msd, "optim": osd}, storage_writer=w)
    # staged by a snapshot inside the GPU (DTensors rewrapped), not by the stock host copy
    assert w.stage_times.get("path", "").startswith("device snapshot"), w.stage_times
    steps = 0
    while not fut.done() or steps < 2:
        step(m, opt, 100 + steps)
        steps += 1
    fut.result()
    torch.cuda.synchronize()
    after = full({"model": get_state_dict(m, opt)[0], "optim": get_state_dict(m, opt)[1]})
    m3, opt3 = build(2)
    step(m3, opt3, 7)
    msd3, osd3 = get_state_dict(m3, opt3)
    state = {"model": msd3, "optim": osd3}
    dcp.load(state, storage_reader=ferry.dcp.Reader(path + "/async"))
    got = full(state)
    same(at_call, got)
    moved = [k for k in at_call["model"] if not torch.equal(at_call["model"][k], after["model"][k])]
    assert moved, "training steps during the async save changed nothing"
    print("fsdp2 async ok: %d steps ran during the save" % steps, flush=True)
    dist.destroy_process_group()
''')


def test_fsdp2_state_saved_and_loaded_by_ferry(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    script = tmp_path / "fsdp2.py"
    script.write_text(FSDP)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    p = subprocess.run([sys.executable, str(script), str(tmp_path), str(port)], capture_output=True,
                       text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "fsdp2 sync ok" in out and "fsdp2 async ok" in out, out[-4000:]
    print(out.strip().splitlines()[-1])


def test_torch_save_of_cuda_tensors_stages_through_pinned(tmp_path, monkeypatch):
    # a 5-piece storage through 4 pinned buffers, the next storages' pieces reusing them
    monkeypatch.setattr(ftorch, "_STAGE_PIECE", 1 << 20)
    monkeypatch.setattr(ftorch, "_STAGE_BUFFERS", 4)
    g = torch.Generator(device="cuda").manual_seed(5)
    sd = {"big": torch.randn((5 << 20) // 4 + 3, device="cuda", generator=g),
          "bf16": torch.randn(1000, device="cuda", generator=g).to(torch.bfloat16),
          "empty": torch.empty(0, device="cuda")}
    p = tmp_path / "m.pt"
    ftorch.save(sd, p)
    import zipfile
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    got = torch.load(p, map_location="cuda", weights_only=True)
    for k in sd:
        assert torch.equal(got[k], sd[k]), k
