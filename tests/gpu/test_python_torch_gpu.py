"""ferry.torch.load and ferry.dcp.Reader into GPU memory (issue 24): ferry.torch.load with
map_location "cuda" reads the storages on a thread of its own while the pickle is read;
ferry.dcp.Reader submits each contiguous item's read (a Future) as soon as the item is parsed.
Both equal stock PyTorch's loads, bit for bit. Run by scripts/gpu-check.sh (pytest -rs)."""
import warnings

import pytest

import _gpu

torch = _gpu.cuda_torch()
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ferry.dcp as fdcp  # noqa: E402
import ferry.torch as ftorch  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(5)
    st = {"w%d" % i: torch.randn(1 << 16, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
          for i in range(24)}
    st["p"] = torch.nn.Parameter(torch.randn(33, 7, generator=g))
    st["view"] = st["w0"][10:100]
    st["step"] = torch.tensor(3.0)
    return st


@pytest.mark.parametrize("loc", ["cuda", "cuda:0", "device"])
def test_torch_load_into_gpu_while_the_pickle_is_read(tmp_path, loc, monkeypatch):
    started = []
    real = ftorch._Loader.start

    def start(self):
        real(self)
        started.append(self.thread is not None)

    monkeypatch.setattr(ftorch._Loader, "start", start)
    p = tmp_path / "m.pt"
    torch.save(_state(), p)
    ml = torch.device("cuda", 0) if loc == "device" else loc
    want = torch.load(p, map_location=ml, weights_only=True)
    got = ftorch.load(p, map_location=ml)
    assert started == [True], started
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].device.type == "cuda", (k, got[k].device)
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert got["view"].untyped_storage().data_ptr() == got["w0"].untyped_storage().data_ptr()


def test_dcp_load_into_gpu_through_futures(tmp_path, monkeypatch):
    st = {k: v.detach().clone() for k, v in _state().items() if k != "view"}
    st["t"] = torch.randn(40, 30).t()  # column-major on disk: through host memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(st, storage_writer=fdcp.Writer(tmp_path), no_dist=True)
    submitted = []
    real = fdcp._read_async

    def counting(f, off, buf):
        submitted.append(buf.device.type)
        return real(f, off, buf)

    monkeypatch.setattr(fdcp, "_read_async", counting)
    for prefetch in (True, False):  # the framing read while DCP plans, or in read_data
        if not prefetch:
            monkeypatch.setattr(fdcp, "_PREFETCH_ITEMS", 0)
        submitted.clear()
        out = {k: torch.zeros(30, 40, device="cuda") if k == "t" else
               torch.zeros_like(v, device="cuda") for k, v in st.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(out, storage_reader=fdcp.Reader(tmp_path), no_dist=True)
        bad = [k for k in st if not torch.equal(out[k].cpu(), st[k])]
        assert not bad, (prefetch, bad)
        # one read per contiguous item, straight into GPU memory; "t" through host memory
        assert submitted == ["cuda"] * (len(st) - 1), (prefetch, submitted)
