"""ferry.torch.load against torch.load, and ferry.torch.save against torch.save (issue 24): every
dtype, shared storages, views, non-contiguous tensors, the legacy format, map_location's forms,
weights_only; malformed files (truncated zip, a storage record past the end, a forbidden global)
give errors naming the file."""
import collections
import io
import os
import pickle
import struct

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import ferry.torch as ftorch  # noqa: E402


class NotAllowed:
    """A global that weights_only loading refuses."""

    def __init__(self, x=1):
        self.x = x

    def __eq__(self, other):
        return type(other) is NotAllowed and other.x == self.x


def _dtypes():
    names = ["float64", "float32", "float16", "bfloat16", "int8", "int16", "int32", "int64",
             "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128", "complex32",
             "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu", "float4_e2m1fn_x2"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _tensor(dtype, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (n * torch.empty(0, dtype=dtype).element_size(),),
                         dtype=torch.uint8, generator=g)
    return bits.view(dtype)


def _state(untyped=True):
    base = torch.arange(48, dtype=torch.float32)
    mat = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    st = collections.OrderedDict()
    st["dtypes"] = {str(dt): _tensor(dt, seed=i) for i, dt in enumerate(_dtypes())}
    st["base"] = base
    st["view"] = base[5:17]                       # shares base's storage, with an offset
    st["reshaped"] = base.view(6, 8)              # shares it again
    st["transposed"] = mat.t()                    # non-contiguous
    st["strided"] = mat[::2, 1::3]                # non-contiguous view with an offset
    st["scalar"] = torch.tensor(2.5)
    st["empty"] = torch.empty(0, 3)
    st["grad"] = torch.ones(3, requires_grad=True)
    if untyped:  # torch's legacy format cannot load an UntypedStorage back
        st["untyped"] = torch.arange(5, dtype=torch.int16).untyped_storage()
    st["meta"] = [1, 2.5, "text", None, True, (3, "x"), {"k": b"bytes"}, torch.float16,
                  torch.Size([2, 3])]
    return st


def _same(a, b, path="obj", shared=None):
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (path, list(a), list(b))
        for k in a:
            _same(a[k], b[k], "%s[%r]" % (path, k), shared)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, "%s[%d]" % (path, i), shared)
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad, a.device) == \
            (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad, b.device), path
        sa, sb = a.untyped_storage(), b.untyped_storage()
        assert sa.nbytes() == sb.nbytes(), path
        if sa.device.type != "meta":
            assert bytes(sa) == bytes(sb), "%s: storage bytes differ" % path
        if shared is not None:
            shared.append((sa.data_ptr(), sb.data_ptr()))
    elif isinstance(a, (torch.UntypedStorage, torch.storage.TypedStorage)):
        ua = a._untyped_storage if isinstance(a, torch.storage.TypedStorage) else a
        ub = b._untyped_storage if isinstance(b, torch.storage.TypedStorage) else b
        assert ua.nbytes() == ub.nbytes() and ua.device == ub.device, path
        if ua.device.type != "meta":
            assert bytes(ua) == bytes(ub), path
    else:
        assert a == b, (path, a, b)


def _sharing(pairs):
    """{ptr_a: ptr_b} must be one-to-one: storages shared in one are shared in the other."""
    fwd, back = {}, {}
    for x, y in pairs:
        if x == 0 and y == 0:
            continue
        assert fwd.setdefault(x, y) == y and back.setdefault(y, x) == x, "sharing differs"


def _legacy_ok(t):
    buf = io.BytesIO()
    try:
        torch.save(t, buf, _use_new_zipfile_serialization=False)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("new_zip", [True, False], ids=["zip", "legacy"])
def test_load_equals_torch_load(tmp_path, new_zip):
    p = tmp_path / "state.pt"
    st = _state(untyped=new_zip)
    if not new_zip:  # the dtypes torch's legacy format round-trips
        st["dtypes"] = {k: v for k, v in st["dtypes"].items() if _legacy_ok(v)}
    torch.save(st, p, _use_new_zipfile_serialization=new_zip)
    want = torch.load(p, weights_only=True)
    got = ftorch.load(p)
    pairs = []
    _same(want, got, shared=pairs)
    _sharing(pairs)
    assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()


@pytest.mark.parametrize("loc", ["cpu", "device", "dict", "callable", "meta"])
def test_map_location_forms(tmp_path, loc):
    p = tmp_path / "m.pt"
    torch.save(_state(), p)
    ml = {"cpu": "cpu", "device": torch.device("cpu"), "dict": {"cpu": "cpu"},
          "callable": (lambda s, where: s), "meta": "meta"}[loc]
    _same(torch.load(p, map_location=ml, weights_only=True), ftorch.load(p, map_location=ml))


def test_cuda_destination(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the reads into GPU memory run on the GPU machine")
    p = tmp_path / "c.pt"
    st = _state()
    torch.save(st, p)
    for ml in ("cuda", "cuda:0", torch.device("cuda", 0), {"cpu": "cuda:0"}):
        got = ftorch.load(p, map_location=ml)
        want = torch.load(p, map_location=ml, weights_only=True)
        assert got["base"].device == want["base"].device
        _same(want, got)
    torch.save({k: v.cuda() for k, v in st["dtypes"].items()}, p)
    _same(torch.load(p, weights_only=True), ftorch.load(p))
    ftorch.save({k: v.cuda() for k, v in st["dtypes"].items()}, tmp_path / "d.pt")
    _same(torch.load(p, weights_only=True), torch.load(tmp_path / "d.pt", weights_only=True))


def test_save_loads_in_torch_and_matches_torch_save(tmp_path):
    st = _state()
    p = tmp_path / "ferry.pt"
    ftorch.save(st, p)
    buf = io.BytesIO()
    torch.save(st, buf)
    pairs = []
    _same(torch.load(io.BytesIO(buf.getvalue()), weights_only=True),
          torch.load(p, weights_only=True), shared=pairs)
    _sharing(pairs)
    a, b = bytearray(p.read_bytes()), bytearray(buf.getvalue())
    assert len(a) == len(b)
    # torch.save's .data/serialization_id is random: blank it (data and crc32s) in both
    for blob in (a, b):
        z = ftorch._bytes_zip("x", blob)
        rec = z.find(".data/serialization_id")
        at = z.offset(rec)
        blob[at:at + rec.size + 8] = bytes(rec.size + 8)
        blob[rec.cd_at:rec.cd_at + 4] = bytes(4)
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    assert not diff, "ferry.torch.save differs from torch.save at %s" % diff[:10]
    z = ftorch._bytes_zip("x", a)
    for name, rec in z.records.items():
        if "/data/" in name:
            assert z.offset(rec) % 64 == 0, name
    assert not [n for n in os.listdir(tmp_path) if "tmp" in n]


def test_save_replaces_atomically_and_keeps_old_file_on_error(tmp_path):
    p = tmp_path / "x.pt"
    ftorch.save({"a": torch.ones(3)}, p)
    with pytest.raises(Exception):
        ftorch.save({"a": torch.ones(3), "bad": lambda: 0}, p)  # unpicklable
    assert torch.equal(torch.load(p)["a"], torch.ones(3))
    assert os.listdir(tmp_path) == ["x.pt"]


def test_weights_only(tmp_path):
    p = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "obj": NotAllowed(3)}, p)
    with pytest.raises(pickle.UnpicklingError) as e:
        ftorch.load(p)
    assert str(p) in str(e.value) and "NotAllowed" in str(e.value), str(e.value)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(p, weights_only=True)
    got = ftorch.load(p, weights_only=False)
    assert got["obj"] == NotAllowed(3) and torch.equal(got["w"], torch.ones(2))
    with pytest.raises(RuntimeError):
        ftorch.load(p, pickle_module=pickle)


def test_truncated_zip(tmp_path):
    p = tmp_path / "t.pt"
    torch.save(_state(), p)
    blob = p.read_bytes()
    p.write_bytes(blob[:len(blob) // 2])
    with pytest.raises(ftorch.FormatError) as e:
        ftorch.load(p)
    assert str(p) in str(e.value) and "central directory" in str(e.value), str(e.value)
    with pytest.raises(Exception):
        torch.load(p, weights_only=True)


def test_storage_record_past_the_end(tmp_path):
    p = tmp_path / "r.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, p)
    blob = bytearray(p.read_bytes())
    z = ftorch._bytes_zip(str(p), blob)
    rec = z.find("data/0")
    struct.pack_into("<II", blob, rec.cd_at + 4, 1 << 30, 1 << 30)  # its sizes: 1 GiB
    p.write_bytes(bytes(blob))
    with pytest.raises(ftorch.FormatError) as e:
        ftorch.load(p)
    msg = str(e.value)
    assert str(p) in msg and "data/0" in msg and "past the end" in msg, msg


def test_storage_record_of_wrong_size(tmp_path):
    p = tmp_path / "s.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, p)
    blob = bytearray(p.read_bytes())
    rec = ftorch._bytes_zip(str(p), blob).find("data/0")
    struct.pack_into("<II", blob, rec.cd_at + 4, 400, 400)
    p.write_bytes(bytes(blob))
    with pytest.raises(ftorch.FormatError) as e:
        ftorch.load(p)
    assert str(p) in str(e.value) and "data/0" in str(e.value) and "4000" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        ftorch.load(tmp_path / "nope.pt")


def test_submodules_without_their_own_import():
    """ferry.torch and ferry.dcp are reached as attributes of ferry, as ferry.safetensors is."""
    import subprocess, sys
    code = "import ferry; print(ferry.torch.load.__module__, ferry.dcp.Writer.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["ferry.torch", "ferry.dcp"], out.stderr[-1000:]


@pytest.mark.parametrize("loc", ["cpu", "callable"])
def test_big_endian_file(tmp_path, loc):
    """A file saved on a big-endian machine (byteorder "big", storages byteswapped): the
    storages are swapped after their reads (the batched read and the callable's host read)."""
    import zipfile
    st = {"f": torch.arange(7, dtype=torch.float32) / 3, "i": torch.arange(5, dtype=torch.int64),
          "h": torch.arange(9, dtype=torch.int16), "e": torch.empty(0, dtype=torch.int32)}
    little, big = tmp_path / "little.pt", tmp_path / "big.pt"
    torch.save(st, little)
    with zipfile.ZipFile(little) as z:  # storages keyed 0, 1, ... in the order pickled
        names = z.namelist()
        recs = {n: z.read(n) for n in names}
    with zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as z:
        for n in names:
            data = recs[n]
            if n.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in n and data:
                # every storage of this state: its element size from the tensor saved under it
                key = int(n.rsplit("/", 1)[1])
                es = list(st.values())[key].element_size()
                data = bytes(torch.frombuffer(bytearray(data), dtype=torch.uint8)
                             .view(-1, es).flip(1).reshape(-1).numpy())
            z.writestr(n, data)
    ml = "cpu" if loc == "cpu" else (lambda s, where: s)
    want = torch.load(big, map_location=ml, weights_only=True)
    have = ftorch.load(big, map_location=ml)
    for k, t in st.items():
        assert torch.equal(want[k], t) and torch.equal(have[k], t), k


def test_storages_read_while_the_pickle_is(tmp_path, monkeypatch):
    """With map_location a device, the storages' reads start before the pickle is read (on a
    thread) where the pickle names only globals that build without reading a storage; a
    per-channel quantized tensor (its scales are read while it is built) waits for them."""
    import warnings
    started = []
    real = ftorch._Loader.start

    def start(self):
        real(self)
        started.append(self.thread is not None)

    monkeypatch.setattr(ftorch._Loader, "start", start)
    plain = tmp_path / "plain.pt"
    st = {"w%d" % i: torch.randn(1000 + i) for i in range(8)}
    st["p"] = torch.nn.Parameter(torch.randn(3, 4))
    torch.save(st, plain)
    _same(torch.load(plain, map_location="cpu", weights_only=True),
          ftorch.load(plain, map_location="cpu"))
    assert started == [True], started
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(torch.randn(4, 3), torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                       torch.tensor([0, 1, 2, 3]), 0, torch.qint8)
        qp = tmp_path / "q.pt"
        torch.save({"q": q, "w": torch.randn(5)}, qp)
        want = torch.load(qp, map_location="cpu", weights_only=True)
        got = ftorch.load(qp, map_location="cpu")
    assert started == [True], started  # start() not called: the reads waited for the pickle
    assert torch.equal(got["q"].q_per_channel_scales(), want["q"].q_per_channel_scales())
    assert torch.equal(got["q"].int_repr(), want["q"].int_repr())
    assert torch.equal(got["w"], want["w"])
    zp = ftorch._Zip("q.pt", lambda off, n: qp.read_bytes()[off:off + n], 0, qp.stat().st_size)
    assert not ftorch._plain_globals(zp.get("data.pkl"))
