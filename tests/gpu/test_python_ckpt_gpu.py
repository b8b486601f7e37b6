"""ferry.safetensors and ferry.checkpoint against CUDA memory: loads into the GPU equal
safetensors.torch.load_file(device="cuda"), saves from CUDA tensors load back in Hugging Face's
safetensors, async_save from CUDA tensors is a snapshot. Run by scripts/gpu-check.sh (pytest -rs);
tests that need the `safetensors` package skip without it and say so."""

import pytest

import _gpu
import ferry

torch = _gpu.cuda_torch()

import ferry.checkpoint as ck  # noqa: E402
import ferry.safetensors as fst  # noqa: E402


def need_hf():
    return pytest.importorskip("safetensors.torch", reason="the safetensors package is not installed here")


def state(device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(1)
    sd = {
        "embed": torch.randn(8192, 2048, generator=g).to(torch.bfloat16),   # 32 MiB
        "q": torch.randn(2048, 2048, generator=g).to(torch.bfloat16),
        "norm": torch.ones(2048, dtype=torch.float16),
        "bias": torch.randn(3001, generator=g),                            # odd size
        "ids": torch.arange(777, dtype=torch.int64),
        "flag": torch.tensor(True),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 16),
        "f8": torch.randn(64, 64, generator=g).to(torch.float8_e4m3fn),
    }
    return {k: v.to(device) for k, v in sd.items()}


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.reshape(-1), b.reshape(-1)
    if a.numel() == 0:
        return True
    return torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu())


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("ckgpu") / "hf.safetensors"
    try:
        import safetensors.torch as hf
        hf.save_file(state(), p)
    except ImportError:
        fst.save_file(state(), p)
    return p


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
@pytest.mark.parametrize("views", [True, False])
def test_load_to_cuda_equals_safetensors(hf_file, device, views):
    hf = need_hf()
    want = hf.load_file(hf_file, device="cuda")
    got = fst.load_file(hf_file, device=device, views=views)
    assert set(got) == set(want)
    for k in want:
        assert got[k].device.type == "cuda", k
        assert same(got[k], want[k]), k


@pytest.mark.parametrize("mode", ["auto", "cpu-gpu", "cpu-async-gpu", "pagecache-gpu"])
def test_load_to_cuda_every_host_path(hf_file, mode):
    want = state()
    got = fst.load_file(hf_file, device="cuda", context=ferry.Context(path=mode))
    for k in want:
        assert same(got[k], want[k]), (mode, k)


def test_subset_and_slices_on_cuda(hf_file):
    full = state()
    got = fst.load_file(hf_file, device="cuda", keys=["norm"],
                        slices={"embed": (0, 1024, 3072), "q": (1, 512, 1024)})
    assert same(got["norm"], full["norm"])
    assert same(got["embed"], full["embed"][1024:3072])
    assert same(got["q"], full["q"][:, 512:1024].contiguous())
    with fst.safe_open(hf_file, framework="pt", device="cuda") as f:
        assert same(f.get_slice("embed")[10:20], full["embed"][10:20])
        assert same(f.get_tensor("bias"), full["bias"])


def test_save_from_cuda_loads_in_hf(tmp_path):
    sd = state("cuda")
    p = tmp_path / "ferry.safetensors"
    fst.save_file(sd, p, metadata={"from": "cuda"}, checksum=fst.have_checksums())
    try:
        import safetensors.torch as hf
    except ImportError:
        hf = None
    back = hf.load_file(p) if hf else fst.load_file(p)
    for k in sd:
        assert same(back[k], sd[k]), k
    if fst.have_checksums():
        got = fst.load_file(p, device="cuda", verify=True)
        assert all(same(got[k], sd[k]) for k in sd)


def test_async_save_from_cuda_is_a_snapshot(tmp_path):
    d = tmp_path / "ck"
    sd = state("cuda")
    big = torch.randn(64 << 20, device="cuda")  # 256 MiB on the GPU
    sd["big"] = big
    want = {k: v.clone() for k, v in sd.items()}
    model = {"model": sd, "optim": {"step": 7}}
    h = ck.async_save(model, d, step=7)
    big.mul_(0)  # queued on torch's stream right after the call returns
    for v in sd.values():
        if v.numel() and v.dtype.is_floating_point and v.dtype != torch.float8_e4m3fn:
            v.add_(1)
    assert h.wait(timeout=300)
    step, back = ck.load_latest(d, device="cuda")
    assert step == 7 and back["optim"] == {"step": 7}
    for k in want:
        assert back["model"][k].device.type == "cuda"
        assert same(back["model"][k], want[k]), k
    ck.save({"w": big}, d, 8)
    assert same(ck.load_latest(d, device="cuda:0")[1]["w"], big)


def test_prepare_pins_ahead_for_cuda_state(tmp_path):
    """prepare() pins the snapshot's memory for CUDA tensors: the first async_save pins none, its
    snapshot is right, and its phases say where the blocked time went; the writer's stream and
    events serve the next save too."""
    d = tmp_path / "ck"
    big = torch.randn(40 << 20, device="cuda")  # 160 MiB: with small, 11 slots
    sd = {"big": big, "small": torch.arange(1000, device="cuda")}
    want = {k: v.clone() for k, v in sd.items()}
    ctx = ferry.Context(host_budget="1g")
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    assert ck.prepare(sd, d, context=ctx) >= nbytes
    h = ck.async_save(sd, d, 1, context=ctx)
    big.mul_(0)
    assert h.wait(timeout=300)
    p = h.phases()
    assert p["pinned_new_bytes"] == 0 and p["bytes"] == nbytes, p
    assert p["blocked"] >= p["call.total"] >= p["call.sync"] >= 0, p
    back = ck.load_latest(d, device="cuda")[1]
    assert all(same(back[k], want[k]) for k in want)
    h = ck.async_save({"big": big, "small": sd["small"]}, d, 2, context=ctx)
    assert h.wait(timeout=300) and h.phases()["pinned_new_bytes"] == 0
    assert same(ck.load_latest(d, device="cuda")[1]["big"], big)
