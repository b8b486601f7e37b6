"""Compressed checkpoints and CUDA tensors (issue 26; docs/CHECKPOINTS.md, "Compressed
checkpoints"): ferry.checkpoint.save / async_save(compress=) from CUDA tensors, loaded back with
ferry.checkpoint.load(device="cuda") and ferry.safetensors.load_file(device="cuda") bit-exact, the
chunks decoded on the CPU (FERRY_CZ_GPU=off) and by nvCOMP (auto for zstd, on for LZ4) where it is
loaded (scripts/gpu-check.sh points FERRY_NVCOMP_LIB at the carried wheel). Which path ran is
checked in C (tests/gpu/test_ckpt_cz_gpu.c); here, the tensors. Run by scripts/gpu-check.sh."""
import os

import pytest

import _gpu
import ferry

torch = _gpu.cuda_torch()

import ferry.checkpoint as ck  # noqa: E402
import ferry.safetensors as fst  # noqa: E402


def state(device):
    g = torch.Generator(device="cpu").manual_seed(3)
    sd = {
        "model": {
            "embed": (torch.randn(8192, 1024, generator=g) * 0.02).to(torch.bfloat16),  # 16 MiB
            "proj": torch.randn(1031, 257, generator=g),
            "norm": torch.ones(1024, dtype=torch.float16),
        },
        "optim": {"step": torch.tensor(11, dtype=torch.int64),
                  "ids": torch.randint(0, 1000, (100003,), dtype=torch.int32, generator=g),
                  "empty": torch.empty(0, 8)},
    }
    return {k: {n: t.to(device) for n, t in v.items()} for k, v in sd.items()}


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    if a.numel() == 0:
        return True
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.fixture(params=["off", "nvcomp"])
def cz_gpu(request, monkeypatch):
    if request.param == "nvcomp" and not os.environ.get("FERRY_NVCOMP_LIB"):
        pytest.skip("nvCOMP path: FERRY_NVCOMP_LIB is unset (scripts/gpu-check.sh sets it from the "
                    "carried wheel); the CPU path runs")
    monkeypatch.setenv("FERRY_CZ_GPU_MIN", "1")
    monkeypatch.setenv("FERRY_CZ_CHUNK", "256k")
    return request.param


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("async_", [False, True])
def test_cuda_round_trip(tmp_path, codec, async_, cz_gpu, monkeypatch):
    d = str(tmp_path / "ck")
    s = state("cuda")
    if async_:
        want = {k: {n: t.clone() for n, t in v.items()} for k, v in s.items()}
        h = ck.async_save(s, d, 2, compress=codec)
        s["model"]["embed"].zero_()  # the snapshot was taken before it returned
        h.wait()
        s = want
    else:
        ck.save(s, d, 2, compress=codec)
    shard = os.path.join(d, "step-%012d" % 2, "rank-00000-of-00001.safetensors.fz")
    assert os.path.exists(shard)
    monkeypatch.setenv("FERRY_CZ_GPU", "off" if cz_gpu == "off" else ("auto" if codec == "zstd" else "on"))
    back = ck.load(d, 2, device="cuda")
    for part in s:
        for n, t in s[part].items():
            b = back[part][n]
            assert b.is_cuda, n
            assert same(b, t), (part, n)
    flat = fst.load_file(shard, device="cuda")
    assert sorted(flat) == sorted("%s.%s" % (p, n) for p in s for n in s[p])
    for p in s:
        for n, t in s[p].items():
            assert same(flat["%s.%s" % (p, n)], t), n
    assert ck.verify(d, 2, require_checksums=True) == 2
