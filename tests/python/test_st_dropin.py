"""ferry.safetensors as a drop-in for safetensors.torch and safetensors' safe_open (issue 24).

Each case runs against both modules (parametrised over the module: ``hf`` is the installed
safetensors, ``ferry`` is ferry.safetensors) and asserts what safetensors documents and tests, so
that the case checks the reference too; the ``CASES`` run on both and compare the results and the
exception types (ferry's must be the reference's type or a subclass of it). test_signatures checks
every public name of safetensors and safetensors.torch (and safe_open's methods) against ferry's,
or that docs/PYTHON.md lists it with the reason."""
import inspect
import os
import pickle
import re
import warnings

import pytest

from conftest import need

torch = need("torch")
safetensors = need("safetensors")
hf = need("safetensors.torch")
need("numpy")

import ferry.safetensors as fst  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Mod:
    """One implementation: its torch functions, its safe_open and its error class."""

    def __init__(self, name, torch_mod, safe_open, error):
        self.name, self.t, self.safe_open, self.Error = name, torch_mod, safe_open, error

    def __repr__(self):
        return self.name


HF = Mod("hf", hf, safetensors.safe_open, safetensors.SafetensorError)
FERRY = Mod("ferry", fst, fst.safe_open, fst.SafetensorError)
MODS = pytest.mark.parametrize("m", [HF, FERRY], ids=["hf", "ferry"])


def raw(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


def same_dict(a, b, ordered=True):
    """ordered=False for safetensors' load() (bytes), whose order follows a Rust HashMap."""
    assert (list(a) if ordered else sorted(a)) == (list(b) if ordered else sorted(b)), (list(a), list(b))
    for k in a:
        assert same(a[k], b[k]), (k, a[k], b[k])
    return True


def state():
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(4, 6, generator=g), "b": torch.arange(5, dtype=torch.int64),
            "h": torch.randn(3, 2, generator=g).to(torch.bfloat16), "s": torch.tensor(2.5),
            "e": torch.zeros(0, 3), "m": torch.tensor([True, False])}


def hf_file(tmp_path, name="ref.safetensors", sd=None, metadata=None):
    p = tmp_path / name
    hf.save_file(state() if sd is None else sd, str(p), metadata=metadata)
    return p


# --------------------------------------------------------------------- behaviour, per module

@MODS
def test_load_then_save_by_default(m, tmp_path):
    """sd = load_file(p); save_file(sd, q): ferry's views of one allocation do not overlap."""
    p = hf_file(tmp_path)
    sd = m.t.load_file(p)
    q = tmp_path / "again.safetensors"
    m.t.save_file(sd, q)
    assert same_dict(hf.load_file(str(q)), hf.load_file(str(p)))
    with m.safe_open(p, framework="pt") as f:
        m.t.save_file(f.get_tensors(), tmp_path / "again2.safetensors")


@MODS
def test_shared_memory_rules(m, tmp_path):
    q = tmp_path / "x.safetensors"
    base = torch.arange(10.0)
    m.t.save_file({"a": base[:5], "b": base[5:]}, q)  # side by side: allowed
    assert same_dict(m.t.load_file(q), {"a": base[:5], "b": base[5:]})
    for sd in ({"a": base[:6], "b": base[5:]}, {"a": base, "b": base}, {"a": base, "b": base[:4]}):
        with pytest.raises(RuntimeError, match="share memory"):
            m.t.save_file(sd, q)
    m.t.save_file({"a": base[:0], "b": base[:0]}, q)  # empty views share nothing
    assert m.t.storage_ptr(base[3:]) == base.data_ptr()
    assert m.t.storage_size(base[3:]) == 40


@MODS
def test_bytes(m):
    sd = state()
    data = m.t.save(sd, metadata={"k": "v"})
    assert isinstance(data, bytes)
    assert same_dict(hf.load(data), sd, ordered=False)
    got = m.t.load(hf.save(sd))
    assert set(got) == set(sd) and all(same(got[k], sd[k]) for k in sd)
    with pytest.raises(safetensors.SafetensorError):
        m.t.load(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json......}")
    with pytest.raises(safetensors.SafetensorError):
        m.t.load(hf.save(sd)[:-1])
    with pytest.raises(safetensors.SafetensorError):
        m.t.load(b"\x01")
    with pytest.raises(TypeError):
        m.t.load("not bytes")


def test_save_bytes_identical():
    """save() lays the bytes out as safetensors does (no metadata, and one key)."""
    sd = state()
    assert fst.save(sd) == hf.save(sd)
    assert fst.save(sd, metadata={"format": "pt"}) == hf.save(sd, metadata={"format": "pt"})


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight


class One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)


@MODS
def test_models(m, tmp_path):
    torch.manual_seed(0)
    model, p = Tied(), tmp_path / "m.safetensors"
    with pytest.raises(RuntimeError):
        m.t.save_file(model.state_dict(), p)
    m.t.save_model(model, p)
    with m.safe_open(p, "pt") as f:
        assert f.metadata() == {"b.weight": "a.weight"}
        assert f.keys() == ["a.bias", "a.weight", "b.bias"]
    model2 = Tied()
    assert m.t.load_model(model2, p) == (set(), [])
    for k, v in model.state_dict().items():
        assert torch.equal(v, model2.state_dict()[k]), k
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "b.bias"'):
        m.t.load_model(One(), p)
    assert m.t.load_model(One(), p, strict=False) == (set(), ["b.bias"])
    with pytest.raises(safetensors.SafetensorError):
        m.t.load_model(One(), p, backend="bogus")


@MODS
def test_safe_open(m, tmp_path):
    p = hf_file(tmp_path, metadata={"format": "pt"})
    sd = state()
    f = m.safe_open(p, framework="pt", device="cpu")
    with f:
        assert f.keys() == sorted(sd)
        assert f.offset_keys() == list(hf.load_file(str(p)))
        assert f.metadata() == {"format": "pt"}
        got = f.get_tensors()
        assert list(got) == f.offset_keys() and all(same(got[k], sd[k]) for k in sd)
        assert same(f.get_tensor("w"), sd["w"])
        with pytest.raises(safetensors.SafetensorError, match="File does not contain tensor nope"):
            f.get_tensor("nope")
        with pytest.raises(safetensors.SafetensorError):
            f.get_slice("nope")
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("w"),
                 lambda: f.get_slice("w")):
        with pytest.raises(safetensors.SafetensorError, match="File is closed"):
            call()


@MODS
def test_backend_device_framework(m, tmp_path):
    p = hf_file(tmp_path)
    assert same_dict(m.t.load_file(p, backend="pread"), hf.load_file(str(p)))
    with pytest.raises(safetensors.SafetensorError, match='backend "bogus" is invalid'):
        m.t.load_file(p, backend="bogus")
    with pytest.raises(TypeError):
        m.t.load_file(p, backend=None)
    with pytest.raises(safetensors.SafetensorError, match='backend "bogus" is invalid'):
        m.safe_open(p, "pt", backend="bogus")
    for dev in ("tpu:0", "meta", "bogus"):
        with pytest.raises(safetensors.SafetensorError, match="device %s is invalid" % dev):
            m.t.load_file(p, device=dev)
    with pytest.raises(safetensors.SafetensorError, match="framework mindspore is invalid"):
        m.safe_open(p, "mindspore")


def fp_dtypes():
    names = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
             "uint16", "uint32", "uint64", "complex64", "bfloat16", "float16", "float64", "int16"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@MODS
@pytest.mark.parametrize("dtype", fp_dtypes(), ids=str)
def test_every_dtype(m, dtype, tmp_path):
    """Every dtype safetensors saves and loads, each way between the two."""
    t = torch.randint(0, 200, (3, 4 * dtype.itemsize), dtype=torch.uint8).view(dtype)
    p, q = tmp_path / "m.safetensors", tmp_path / "hf.safetensors"
    m.t.save_file({"t": t}, p)
    assert same(hf.load_file(str(p))["t"], t)
    hf.save_file({"t": t}, str(q))
    assert same(m.t.load_file(q)["t"], t)
    with m.safe_open(q, "pt") as f:
        assert f.get_slice("t").get_dtype() == safetensors.safe_open(str(q), "pt").get_slice("t").get_dtype()
        assert same(f.get_slice("t")[1:], t[1:])
    if m is FERRY or dtype in getattr(hf, "_TYPES", {}).values():  # 0.8's load() lacks F8_E8M0
        assert same(m.t.load(m.t.save({"t": t}))["t"], t)


@MODS
def test_meta_and_bad_tensors(m, tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(NotImplementedError):
        m.t.save_file({"a": torch.empty(3, device="meta")}, p)
    with pytest.raises(NotImplementedError):
        m.t.save({"a": torch.empty(3, device="meta")})
    with pytest.raises(KeyError):
        m.t.save_file({"a": torch.zeros(2, dtype=torch.complex128)}, p)
    with pytest.raises(ValueError, match="Expected a dict"):
        m.t.save_file([torch.zeros(1)], p)
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        m.t.save_file({"a": 1}, p)
    with pytest.raises(ValueError, match="non contiguous"):
        m.t.save_file({"a": torch.zeros(4, 4).t()}, p)
    with pytest.raises(ValueError, match="sparse"):
        m.t.save_file({"a": torch.zeros(4, 4).to_sparse()}, p)
    with pytest.raises(TypeError):
        m.t.save_file({"a": torch.zeros(1)}, p, metadata={"n": 1})
    with pytest.raises(TypeError):
        m.t.save_file({1: torch.zeros(1)}, p)


INDEXES = [[], ..., (..., 1), 0, -1, (slice(None), slice(1, None)), None, slice(None, None, 2), (),
           (slice(None), slice(None, None, 2)), [0], (0, slice(1, 3))]
BAD_INDEXES = [slice(None, None, -1), 5, (0, 0, 0), "x", 1.0]


@MODS
def test_get_slice(m, tmp_path):
    p = hf_file(tmp_path)
    w = state()["w"]
    with m.safe_open(p, "pt") as f:
        s = f.get_slice("w")
        assert s.get_shape() == [4, 6] and s.get_dtype() == "F32"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation of list indexes
            for idx in INDEXES:
                assert same(s[idx], w[idx]), idx
    assert same(s[1:3], w[1:3]) and same(s[[1]], w[[1]])  # after the with: the slice still reads


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")  # torch's, on both sides
@pytest.mark.parametrize("idx", BAD_INDEXES, ids=repr)
def test_get_slice_errors_match(idx, tmp_path):
    p = hf_file(tmp_path)
    errs = []
    for m in (HF, FERRY):
        with m.safe_open(p, "pt") as f:
            with pytest.raises(Exception) as e:
                f.get_slice("w")[idx]
            errs.append(e.value)
    assert isinstance(errs[1], type(errs[0])), (repr(errs[0]), repr(errs[1]))
    assert str(errs[1]) == str(errs[0])


@MODS
def test_file_errors(m, tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        m.t.load_file(str(missing))
    assert str(e.value) == "No such file or directory: %s" % missing
    with pytest.raises(FileNotFoundError) as e:
        m.safe_open(str(missing), "pt")
    assert str(e.value) == "No such file or directory: %s" % missing
    good = hf_file(tmp_path).read_bytes()
    for name, data in (("json", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json......}"),
                       ("short", b"\x10\x00"), ("large", b"\xff" * 8 + b"{}"), ("truncated", good[:-1])):
        bad = tmp_path / ("%s.safetensors" % name)
        bad.write_bytes(data)
        try:
            m.t.load_file(bad)
        except safetensors.SafetensorError as exc:  # the reference's class catches ferry's
            assert isinstance(exc, m.Error)
            e = exc
        else:
            pytest.fail("%s: no SafetensorError" % name)
        back = pickle.loads(pickle.dumps(e))  # as safetensors' own tests pickle theirs
        assert type(back) is type(e) and str(back) == str(e)
        with pytest.raises(safetensors.SafetensorError):
            m.safe_open(bad, "pt")


# ------------------------------------------------------------- the same case, both compared

def _case_roundtrip(m, d):
    p = hf_file(d, "r.safetensors")
    return m.t.load_file(p)


def _case_bytes(m, d):
    return m.t.load(m.t.save(state()))


def _case_get_tensors(m, d):
    with m.safe_open(hf_file(d, "g.safetensors"), "pt") as f:
        return f.get_tensors()


def _case_load_missing_key(m, d):
    with m.safe_open(hf_file(d, "k.safetensors"), "pt") as f:
        return f.get_tensor("nope")


def _case_corrupt(m, d):
    p = d / "c.safetensors"
    p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}")
    return m.t.load_file(p)


def _case_shared(m, d):
    base = torch.zeros(8)
    return m.t.save_file({"a": base, "b": base[2:]}, d / "s.safetensors")


def _case_bad_backend(m, d):
    return m.t.load_file(hf_file(d, "b.safetensors"), backend="bogus")


def _case_model_strict(m, d):
    p = d / "t.safetensors"
    m.t.save_model(Tied(), p)
    return m.t.load_model(One(), p)


def _case_save_no_dir(m, d):
    return m.t.save_file({"a": torch.zeros(2)}, d / "no" / "dir" / "x.safetensors")


CASES = [_case_roundtrip, _case_bytes, _case_get_tensors, _case_load_missing_key, _case_corrupt,
         _case_shared, _case_bad_backend, _case_model_strict, _case_save_no_dir]


def outcome(case, m, d):
    d.mkdir()
    try:
        return "value", case(m, d)
    except Exception as e:  # noqa: BLE001 - the comparison is the test
        return "raised", e


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[6:])
def test_same_outcome(case, tmp_path):
    (hk, hv), (fk, fv) = outcome(case, HF, tmp_path / "hf"), outcome(case, FERRY, tmp_path / "ferry")
    assert hk == fk, (hv, fv)
    if hk == "raised":
        assert isinstance(fv, type(hv)), "ferry raised %r where safetensors raised %r" % (fv, hv)
    elif isinstance(hv, dict):
        assert same_dict(fv, hv, ordered=case is not _case_bytes)
    else:
        assert fv == hv


# ------------------------------------------------------------------------------- signatures

# Public names of safetensors ferry does not provide; docs/PYTHON.md says why for each.
NOT_PROVIDED = ("serialize", "serialize_file", "deserialize", "TensorSpec")


def public(mod):
    """Public names of a module: not underscored, not modules, not typing's or collections'."""
    out = {}
    for n in dir(mod):
        o = getattr(mod, n)
        if n.startswith("_") or inspect.ismodule(o) or getattr(o, "__module__", "") in ("typing",
                                                                                         "collections"):
            continue
        out[n] = o
    return out


def check_signature(name, ref, ours):
    """Each of ref's parameters in ours: same name, kind and default (PyO3's '...' means 'has
    one'), positional ones in the same places; ours' extras keyword-only with defaults."""
    try:
        rs = inspect.signature(ref)
    except (TypeError, ValueError):
        return
    ps = list(inspect.signature(ours).parameters.values())
    rp = list(rs.parameters.values())
    if rp and rp[0].name == "self":
        rp = rp[1:]
    if ps and ps[0].name == "self":
        ps = ps[1:]
    mine = {p.name: p for p in ps}
    for i, r in enumerate(rp):
        assert r.name in mine, "%s: no parameter %s (%s vs %s)" % (name, r.name, rs, inspect.signature(ours))
        p = mine[r.name]
        kind = r.kind if r.kind != r.POSITIONAL_ONLY else r.POSITIONAL_OR_KEYWORD
        assert p.kind == kind, "%s(%s): %s vs %s" % (name, r.name, p.kind, r.kind)
        if r.kind != r.KEYWORD_ONLY:
            assert ps[i].name == r.name, "%s: parameter %d is %s, not %s" % (name, i, ps[i].name, r.name)
        if r.default is inspect.Parameter.empty:
            assert p.default is inspect.Parameter.empty, "%s(%s) needs no default" % (name, r.name)
        elif r.default is Ellipsis:
            assert p.default is not inspect.Parameter.empty, "%s(%s) has a default" % (name, r.name)
        else:
            assert p.default == r.default, "%s(%s): default %r vs %r" % (name, r.name, p.default, r.default)
    for p in ps:
        if p.name not in {r.name for r in rp}:
            assert p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) and (
                p.kind == p.VAR_KEYWORD or p.default is not p.empty), "%s: extra %s" % (name, p)


def test_signatures(tmp_path):
    docs = open(os.path.join(ROOT, "docs", "PYTHON.md"), encoding="utf-8").read()
    names = {}
    names.update(public(safetensors))
    names.update(public(hf))
    assert {"load", "save", "load_file", "save_file", "load_model", "save_model", "safe_open"} <= set(names)
    for n, ref in sorted(names.items()):
        if n in NOT_PROVIDED:
            assert re.search(r"`%s`" % n, docs), "docs/PYTHON.md does not say why %s is absent" % n
            continue
        assert hasattr(fst, n), "ferry.safetensors has no %s" % n
        ours = getattr(fst, n)
        if n == "SafetensorError":
            assert issubclass(ours, ref)
            continue
        check_signature(n, ref, ours)
    methods = [n for n in dir(safetensors.safe_open) if not n.startswith("_")] + ["__enter__", "__exit__"]
    assert {"get_tensors", "keys", "offset_keys", "get_slice"} <= set(methods)
    for n in methods:
        assert hasattr(fst.safe_open, n), "ferry's safe_open has no %s" % n
        check_signature("safe_open." + n, getattr(safetensors.safe_open, n), getattr(fst.safe_open, n))
    with safetensors.safe_open(str(hf_file(tmp_path)), "pt") as f:
        ref_slice = [n for n in dir(f.get_slice("w")) if not n.startswith("_")]
    for n in ref_slice:
        assert hasattr(fst._Slice, n), "ferry's slice has no %s" % n



def test_missing_shard_of_an_index_is_named(tmp_path):
    """A sharded set whose index names a shard that is not there: the error names that shard (ferry's
    own message), not the index as if the index were missing (safetensors' message is for the file
    asked for)."""
    import json
    import ferry.safetensors as fst
    torch = need("torch")
    fst.save_file({"a": torch.ones(3)}, str(tmp_path / "m-1.safetensors"))
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}))
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(str(tmp_path / "m.safetensors.index.json"))
    assert "m-2.safetensors" in str(e.value), str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(str(tmp_path / "absent.safetensors"))
    assert str(e.value) == "No such file or directory: %s" % (tmp_path / "absent.safetensors")
