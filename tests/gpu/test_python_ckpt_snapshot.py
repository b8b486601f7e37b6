"""ferry.checkpoint.async_save's snapshot paths on a real GPU (the save_snapshot knob,
FERRY_SAVE_SNAPSHOT; docs/CHECKPOINTS.md): through the device-side snapshot and through pinned
slots, the saved bytes equal the state at the moment async_save returned, although the caller
overwrites its tensors (on the GPU and on the host) right after; auto takes the device for a
directory's first save and the slots that save left pinned for the next. Run by
scripts/gpu-check.sh (pytest -rs)."""

import pytest

import _gpu

torch = _gpu.cuda_torch()

import ferry.checkpoint as ck  # noqa: E402


def state():
    g = torch.Generator(device="cpu").manual_seed(3)
    sd = {
        "embed": torch.randn(8192, 4096, generator=g).to(torch.bfloat16),  # 64 MiB: 4 slots
        "w": torch.randn(1000, 1001, generator=g),                         # odd size, fp32
        "ids": torch.arange(12345, dtype=torch.int64),
        "f8": torch.randn(64, 64, generator=g).to(torch.float8_e4m3fn),
        "empty": torch.empty(0, 7),
    }
    out = {k: v.to("cuda") for k, v in sd.items()}
    out["host_counter"] = torch.arange(4099, dtype=torch.int32)  # a CPU tensor in a GPU state
    return out


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).view(torch.uint8).cpu(), b.reshape(-1).view(torch.uint8).cpu())


def scribble(sd):
    """Changes every tensor right after async_save returned: GPU kernels on torch's stream, host writes."""
    for k, v in sd.items():
        if not v.numel():
            continue
        if v.device.type == "cuda":
            v.view(torch.uint8).fill_(0xA5) if v.dtype == torch.float8_e4m3fn else v.mul_(0).add_(7)
        else:
            v.fill_(-1)


def save_and_check(sd, d, step, device_path):
    want = {k: v.clone() for k, v in sd.items()}
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    h = ck.async_save(sd, d, step)
    scribble(sd)
    assert h.wait(timeout=300)
    p = h.phases()
    assert p["device_snapshot_bytes"] == (nbytes if device_path else 0), p
    back = ck.load(d, step, device="cpu")
    for k in want:
        assert same(back[k], want[k]), k
    for k, v in want.items():  # the next save starts from known bytes again
        sd[k].copy_(v)
    return p


@pytest.mark.parametrize("mode", ["device", "pinned"])
def test_async_save_each_path_is_a_snapshot(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("FERRY_SAVE_SNAPSHOT", mode)  # read when the directory's writer is made
    sd = state()
    p = save_and_check(sd, tmp_path / mode, 1, mode == "device")
    assert p["pinned_new_bytes"] > 0  # the first save's slots (pinned by the save's thread on the device path)
    save_and_check(sd, tmp_path / mode, 2, mode == "device")


def test_async_save_auto_device_first_then_pinned(tmp_path, monkeypatch):
    monkeypatch.delenv("FERRY_SAVE_SNAPSHOT", raising=False)
    sd = state()
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    if free < nbytes + (1 << 30) + nbytes // 8:
        pytest.skip("the GPU has %d bytes free, too few for a device-side snapshot here" % free)
    save_and_check(sd, tmp_path / "auto", 1, True)   # nothing pinned yet: the device
    save_and_check(sd, tmp_path / "auto", 2, False)  # the first save's slots, pinned: no GPU memory
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info()[0] >= free - (64 << 20)  # the device snapshot was freed
