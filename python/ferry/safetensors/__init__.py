"""safetensors files to and from torch tensors on the CPU or a CUDA device, through ferry.

Drop-in for ``safetensors.torch`` and safetensors' ``safe_open`` (the same public names,
signatures, results and exception types; docs/PYTHON.md lists where ferry differs on purpose), with
ferry's extras as keyword arguments::

    from ferry.safetensors import load_file, save_file

    sd = load_file("model.safetensors", device="cuda:0")            # storage -> GPU, no host copy
    sd = load_file("model.safetensors.index.json", device="cuda")   # a sharded Hugging Face set
    part = load_file(path, device="cuda", keys=["lm_head.weight"],
                     slices={"model.embed_tokens.weight": (0, 0, 32768)})   # (dim, start, stop)
    save_file(sd, "copy.safetensors", metadata={"format": "pt"}, checksum=True)

Destinations are allocated by torch (``torch.empty`` on the device, so the caching allocator owns
them) and filled through ferry's C API at their ``data_ptr()``: the bytes go from storage to GPU
memory through ferry's pipelined path (or GDS), never through a Python-side host copy.
docs/CHECKPOINTS.md ("Python") has the details.
"""
from __future__ import annotations

import errno as _errno
import functools as _functools
import json as _json
import os as _os
import struct as _struct
import sys as _sys
import threading as _threading
import time as _time
import weakref as _weakref

from .. import _ferry
from .. import _progress
from .. import Error as _FerryError
from .. import ECORRUPT as _ECORRUPT
from .. import default_context as _default_context

try:
    from safetensors import SafetensorError as _HFError
except ImportError:  # safetensors not installed: ferry's class stands alone
    _HFError = Exception

__all__ = ["load_file", "save_file", "load", "save", "load_model", "save_model", "storage_ptr",
           "storage_size", "load_model_dir", "safe_open", "SafetensorError", "have_checksums",
           "last_trace"]


class SafetensorError(_HFError):
    """safetensors' error (a subclass of ``safetensors.SafetensorError`` when safetensors is
    installed, so ``except safetensors.SafetensorError`` catches it). A file that breaks the
    format raises a SafetensorError that is also a ``ferry.Error`` (FERRY_ECORRUPT, with the file,
    byte offset and rule); a failed save's OSError is also a SafetensorError, as safetensors'
    "Error while serializing" is."""


_both = {}


def _also(base):
    """The class that is both a SafetensorError and ``base`` (ferry.Error, OSError, ValueError)."""
    cls = _both.get(base)
    if cls is None:
        # a module attribute of its own name, so that pickle finds it
        name = "_SafetensorError_" + base.__name__
        cls = _both[base] = globals()[name] = type(name, (SafetensorError, base), {
            "__module__": __name__, "__doc__": SafetensorError.__doc__})
    return cls


def _convert(e, filename=None):
    """safetensors' exception for an error of ferry's C layer (None: keep ``e``)."""
    if isinstance(e, SafetensorError):
        return None
    if isinstance(e, FileNotFoundError) and filename is not None:
        path = _os.fspath(filename)
        # safetensors' message only where the file asked for is the one missing: a shard that an
        # index names keeps ferry's message, which names that shard
        if "://" in str(path):
            asked = str(e).count("://") == str(e).count(str(path))
        else:
            asked = not _os.path.lexists(path)
        if asked and e.filename in (None, path):
            # safetensors' message; errno kept (without strerror set, str() stays the message)
            n = FileNotFoundError("No such file or directory: %s" % (path,))
            n.errno = _errno.ENOENT
            return n
        return None
    if isinstance(e, _FerryError) and getattr(e, "code", None) == _ECORRUPT:
        n = _also(_FerryError)(*e.args)
        n.code, n.name, n.strerror = e.code, e.name, e.strerror
        return n
    return None


class _errors:
    """``with _errors(filename):`` raises safetensors' exceptions for ferry's."""

    def __init__(self, filename=None, save=False):
        self.filename, self.save = filename, save

    def __enter__(self):
        return self

    def __exit__(self, t, e, tb):
        if e is None or not isinstance(e, OSError):
            return False
        n = _convert(e, None if self.save else self.filename)
        if n is None and self.save and not isinstance(e, SafetensorError):
            n = _also(type(e))(*e.args)
            n.__dict__.update(getattr(e, "__dict__", {}))
        if n is None:
            return False
        raise n.with_traceback(tb) from None


_BACKENDS = ("mmap", "pread")


def _check_backend(backend):
    """safetensors' check of ``backend=`` (ferry reads through its own engine either way)."""
    if not isinstance(backend, str):
        raise TypeError("argument 'backend': '%s' is not an instance of 'str'" % (backend,))
    if backend not in _BACKENDS:
        raise SafetensorError('backend "%s" is invalid (expected one of: %s)'
                              % (backend, ", ".join('"%s"' % b for b in _BACKENDS)))


def have_checksums() -> bool:
    """True: every build has xxh3 (``checksum=True`` and ``verify=True`` work); kept for callers that ask."""
    return _ferry.have_xxh3()


# ----------------------------------------------------------------------------------- dtypes

_TORCH_DT = None
# save_file's writer of the default context, idle between calls: its pinned slots (10 x 16 MiB,
# within host_budget), stream and events are made by the first save_file and reused by the next
# ones (pinning ran at about 2.7 GB/s on the GPU machine: an estimated 60 ms a call otherwise).
_idle_writer = None  # (context, writer)
_idle_lock = _threading.Lock()


def _torch():
    import torch
    return torch


def _torch_dtypes():
    """{safetensors name: torch dtype} for every dtype both know (F4 as float4_e2m1fn_x2, packed)."""
    global _TORCH_DT
    if _TORCH_DT is None:
        torch = _torch()
        m = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
             "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
             "F64": torch.float64, "I64": torch.int64, "C64": torch.complex64}
        for name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                           ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"),
                           ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
                           ("F8_E8M0", "float8_e8m0fnu"), ("F4", "float4_e2m1fn_x2")):
            dt = getattr(torch, attr, None)
            if dt is not None:
                m[name] = dt
        _TORCH_DT = m
    return _TORCH_DT


def _st_dtype_name(dtype) -> str:
    for name, dt in _torch_dtypes().items():
        if dt == dtype:
            return name
    # safetensors.torch raises KeyError (its dtype table); ValueError kept for ferry's callers
    raise _DtypeError("torch dtype %s has no safetensors equivalent ferry knows (%s)"
                      % (dtype, ", ".join(_torch_dtypes())))


class _DtypeError(KeyError, ValueError):
    def __str__(self):
        return str(self.args[0]) if self.args else ""


@_functools.lru_cache(maxsize=4096)
def _contiguous_strides(shape):
    """torch's strides of a contiguous tensor of this shape."""
    acc, out = 1, []
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _torch_shape(name, dtype_name, shape):
    """The torch shape of a file tensor: F4 packs two elements per byte in the last dimension."""
    if dtype_name != "F4":
        return tuple(shape)
    if not shape or shape[-1] % 2:
        raise SafetensorError("tensor %r: F4 with shape %s cannot be a float4_e2m1fn_x2 tensor "
                              "(the last dimension must be even)" % (name, list(shape)))
    return tuple(shape[:-1]) + (shape[-1] // 2,)


# ---------------------------------------------------------------------------------- devices

def _device(device):
    """(torch.device, ferry device index or -1) from "cpu", "cuda", "cuda:N", an int or a torch.device."""
    torch = _torch()
    if isinstance(device, bool):
        raise TypeError("device must be a str, an int or a torch.device, not bool")
    if isinstance(device, int):
        dev = torch.device("cuda", device)
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            dev = None
        if dev is None or dev.type not in ("cpu", "cuda"):
            # safetensors' error and message; a ValueError too (ferry's before)
            raise _also(ValueError)("device %s is invalid" % (device,))
    if dev.type == "cpu":
        return dev, -1
    if dev.index is None:
        # one process per GPU (torchrun): plain "cuda" is this rank's own GPU, LOCAL_RANK, not the
        # first one for every rank of the host
        local = _os.environ.get("LOCAL_RANK", "")
        dev = torch.device("cuda", int(local) if local.isdigit() else torch.cuda.current_device())
    return dev, dev.index


def _sync_device(dev):
    """ferry's copies run on its own streams: memory torch just handed out (or tensors torch just
    wrote) may still be used by work queued on the current stream."""
    if dev.type == "cuda":
        _torch().cuda.current_stream(dev).synchronize()


# ------------------------------------------------------------------------------------ loads

def _normalize_slice(name, shape, spec):
    try:
        dim, start, stop = spec
    except (TypeError, ValueError):
        raise TypeError("slices[%r] must be (dim, start, stop), not %r" % (name, spec)) from None
    nd = len(shape)
    if not isinstance(dim, int) or not -nd <= dim < nd:
        raise ValueError("slices[%r]: dimension %r out of range for shape %s" % (name, dim, list(shape)))
    dim %= nd
    n = shape[dim]
    start = 0 if start is None else start
    stop = n if stop is None else stop
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    if not 0 <= start <= stop <= n:
        raise ValueError("slices[%r]: [%r, %r) is not inside dimension %d of size %d"
                         % (name, spec[1], spec[2], dim, n))
    return dim, start, stop


# ------------------------------------------------------------------------------------ spans

_last_trace = None
_started = _weakref.WeakSet()  # contexts whose workers a load started in the background
_started_lock = _threading.Lock()


def last_trace():
    """The spans of this process's last load_file, in seconds: {"context": ..., "open": ...,
    "plan": ..., "alloc": ..., "read": ..., "total": ..., "workers_start": ...} (``workers_start``
    only when that load started the context's workers, beside the other spans; ``views``, the
    building of the result's tensors while ``read`` runs, within it, when torch allocated the
    result). None before the
    first load. FERRY_TRACE=1 prints them to stderr after each load as well."""
    return dict(_last_trace) if _last_trace is not None else None


def _start_workers(ctx, spans):
    """Starts the context's workers (threads, rings, slots) in the background, so that they come
    up while the header is parsed and the result allocated (issue 22: a fresh process's first
    load paid them first). A failure is reported by the load's read, which starts them too."""
    with _started_lock:
        try:
            if ctx in _started:
                return None
            _started.add(ctx)
        except TypeError:  # not weak-referenceable: start in the read, as before
            return None

    def run():
        t = _time.perf_counter()
        try:
            ctx.start()
        except Exception:  # noqa: BLE001 - the read reports it
            pass
        spans["workers_start"] = _time.perf_counter() - t

    th = _threading.Thread(target=run, name="ferry-start", daemon=True)
    th.start()
    return th


def _trace_done(spans, t0):
    global _last_trace
    spans["total"] = _time.perf_counter() - t0
    _last_trace = spans
    if _os.environ.get("FERRY_TRACE", "") not in ("", "0"):
        _sys.stderr.write("ferry.safetensors.load_file: %s\n" % " ".join(
            "%s=%.3fms" % (k, v * 1e3) for k, v in spans.items()))


def _load_torch(path, device, keys, slices, verify, views, staging_budget, context, alloc, ld=None):
    """The load behind load_file (torch) and ferry.safetensors.numpy.load_file (alloc decides).
    ld: the file set already opened (its headers parsed) by the caller, or None."""
    clock = _time.perf_counter
    t0 = clock()
    spans = {}
    ctx = context if context is not None else _default_context()
    starter = _start_workers(ctx, spans)
    t = clock()
    spans["context"] = t - t0
    if ld is None:
        with _errors(path):
            ld = _ferry.load_open(ctx, _os.fspath(path))
    files = ld.files()
    where = {}  # name -> (file index, offset, dtype, shape, nbytes)
    for f, (_fpath, _md, tensors) in enumerate(files):
        for name, dt, shape, off, nb in tensors:
            where[name] = (f, off, dt, shape, nb)
    slices = dict(slices or {})
    if keys is not None or slices:
        if isinstance(keys, str):
            keys = [keys]
        chosen = list(dict.fromkeys(keys or ()))
        chosen += [k for k in slices if k not in chosen]
        for k in chosen:
            if k not in where:
                raise KeyError("%s: no tensor %r" % (_os.fspath(path), k))
        # File order, so that tensors adjacent in the file are adjacent in memory and read together.
        for k in sorted(chosen, key=lambda k: where[k][:2]):
            if k in slices:
                dim, start, stop = _normalize_slice(k, where[k][3], slices[k])
                ld.select(k, dim, start, stop)
            else:
                ld.select(k)
    entries = ld.entries()
    t1 = clock()
    spans["open"] = t1 - t
    # Where the C loader would place each entry (ferry_st_load_place): views of one region per file.
    places = [ld.place(i, 0) for i in range(len(entries))] if views else None
    t = clock()
    spans["plan"] = t - t1
    flags = _ferry.LOAD_VERIFY if verify else 0
    prepare = getattr(alloc, "prepare", None)
    if prepare is None:
        out, dests = alloc(entries, places)
        for i, (ptr, length) in enumerate(dests):
            ld.set_dest(i, ptr, length)
        t1 = clock()
        spans["alloc"] = t1 - t
        with _errors(path):
            ld.run(alloc.device_index, flags, int(staging_budget or 0))
        spans["read"] = clock() - t1
    else:
        # The destinations first (one allocation per region), the read started on them (run drops
        # the GIL), and the views built while it runs (issue 22: ~3 us a tensor off the critical
        # path); nothing is returned before the read has finished or raised.
        dests, build = prepare(entries, places)
        for i, (ptr, length) in enumerate(dests):
            ld.set_dest(i, ptr, length)
        t1 = clock()
        spans["alloc"] = t1 - t
        failed = []

        def read():
            try:
                ld.run(alloc.device_index, flags, int(staging_budget or 0))
            except BaseException as e:  # re-raised by the caller's thread below
                failed.append(e)
        reader = _threading.Thread(target=read, name="ferry-st-read", daemon=True)
        reader.start()
        try:
            out = build()
            spans["views"] = clock() - t1
        finally:
            reader.join()
        spans["read"] = clock() - t1
        if failed:
            with _errors(path):
                raise failed[0]
    if starter is not None:
        starter.join()
    _trace_done(spans, t0)
    return out


class _TorchAlloc:
    """Allocates a load's destinations with torch on one device."""

    def __init__(self, device):
        self.torch = _torch()
        self.dev, self.device_index = _device(device)
        self.anchor = None

    def empty(self, shape, dtype):
        return self.torch.empty(shape, dtype=dtype, device=self.dev)

    def dtype(self, name, dt):
        d = _torch_dtypes().get(dt)
        if d is None:
            raise SafetensorError("tensor %r has dtype %s, which this torch (%s) has no dtype for"
                                  % (name, dt, self.torch.__version__))
        return d

    def __call__(self, entries, places):
        """places: per entry, (in a region, file, offset, region bytes) from the C loader, or None
        for an allocation per tensor."""
        dests, build = self.prepare(entries, places)
        return build(), dests

    def prepare(self, entries, places):
        """(dests, build): the destinations allocated, and build() -> the dict of tensors (views
        made then, so that they can be made while the read runs)."""
        torch = self.torch
        out, dests = {}, [None] * len(entries)
        regions = {}  # file -> (bytes, [(i, name, offset, nbytes, dtype, shape)])
        for i, (name, dt, shape, nb) in enumerate(entries):
            dtype = self.dtype(name, dt)
            tshape = _torch_shape(name, dt, shape)
            placed, f, at, size = places[i] if places else (False, 0, 0, 0)
            if placed and nb:
                regions.setdefault(f, (size, []))[1].append((i, name, at, nb, dtype, tshape))
                continue
            t = self.empty(tshape, dtype)
            out[name] = t
            dests[i] = (t.data_ptr() if nb else self._anchor(), nb)
        viewed = []  # (region buffer, [(name, offset, dtype, shape)])
        for size, group in regions.values():
            buf = self.empty((size,), torch.uint8)
            base = buf.data_ptr()
            mine = []
            for i, name, at, nb, dtype, tshape in group:
                if at % dtype.itemsize:
                    # A file whose offsets do not keep this dtype aligned: its own allocation.
                    t = self.empty(tshape, dtype)
                    out[name] = t
                    dests[i] = (t.data_ptr(), nb)
                    continue
                mine.append((name, at, dtype, tshape))
                dests[i] = (base + at, nb)
            viewed.append((buf, size, mine))
        _sync_device(self.dev)

        def build():
            for buf, size, mine in viewed:
                typed = {}  # dtype -> the region as that dtype
                for name, at, dtype, tshape in mine:
                    # one as_strided of the region's typed view: 2.7 us a tensor where slice, view
                    # and view took 6-7 (4,000 tensors: 15 ms, issue 22)
                    tv = typed.get(dtype)
                    isz = dtype.itemsize
                    if tv is None:
                        tv = typed[dtype] = buf[:size - size % isz].view(dtype)
                    out[name] = tv.as_strided(tshape, _contiguous_strides(tshape), at // isz)
            # The dict in the order of the entries (file order, or the selection's).
            return {e[0]: out[e[0]] for e in entries}
        return dests, build

    def _anchor(self):
        if self.anchor is None:
            self.anchor = self.empty((1,), self.torch.uint8)
        return self.anchor.data_ptr()


def _open_set(path, context):
    """(the file set opened, its headers parsed; [(name, dtype name, shape, nbytes)] in file order).
    The opened set is handed to _load_torch, so that a load that plans first parses each header once."""
    ctx = context if context is not None else _default_context()
    with _errors(path):
        ld = _ferry.load_open(ctx, _os.fspath(path))
    out = []
    for f, (_fpath, _md, tensors) in enumerate(ld.files()):
        for name, dt, shape, off, nb in sorted(tensors, key=lambda t: t[3]):
            out.append((name, dt, tuple(shape), nb))
    return ld, out


def _tensor_list(path, context):
    """[(name, dtype name, shape, nbytes)] of a file set, in file order (headers only)."""
    return _open_set(path, context)[1]


def _slices_of_rule(tensors, rule, keys):
    """slices= given as a function name, shape -> (dim, start, stop) or None: the dict it makes,
    and the keys to load (every tensor, or ``keys``: the ones the rule does not cut load whole)."""
    if keys is None:
        keys = [t[0] for t in tensors]
    elif isinstance(keys, str):
        keys = [keys]
    wanted = set(keys)
    cut = {}
    for name, _dt, shape, _nb in tensors:
        if name in wanted:
            spec = rule(name, shape)
            if spec is not None:
                cut[name] = spec
    return list(keys), cut


def load_file(filename, device="cpu", *, backend="mmap", keys=None, slices=None, verify=False,
              views=True, staging_budget=None, context=None, progress=None, distributed=False) -> dict:
    """Load a safetensors file into torch tensors on ``device``.

    Like ``safetensors.torch.load_file(filename, device)``. ``filename`` may also be a sharded
    Hugging Face set's ``model.safetensors.index.json``, a ferry checkpoint step's
    ``manifest.json``, or a directory holding one of them (or ``*.safetensors`` files).

    Args:
        filename: the file (str or os.PathLike).
        device: "cpu", "cuda", "cuda:N", an int (a CUDA device) or a torch.device. Plain "cuda"
            is cuda:LOCAL_RANK where torchrun set LOCAL_RANK, else the current device.
        keys: load only these tensors (a KeyError names a missing one).
        slices: ``{name: (dim, start, stop)}``: load only ``[start, stop)`` of dimension ``dim``
            of these tensors (negative indices and None as in Python slices), packed contiguously:
            what a tensor-parallel rank needs.
            Or a rule, a function ``slices(name, shape)`` returning ``(dim, start, stop)`` for a
            tensor to cut and None for one to load whole.
        verify: check every loaded tensor against the xxh3 checksum ferry stored when saving
            (``save_file(..., checksum=True)``); a mismatch or a missing checksum raises
            ``ferry.Error`` (FERRY_EVERIFY) naming the file and the tensor.
        views: True (default): one allocation per file, tensors are views of it (one long read);
            False: one allocation per tensor (each can be freed on its own).
        staging_budget: bytes of host memory for slices and verification (default 256 MiB).
        context: the ferry.Context to use (default: ferry.default_context()).
        progress: ferry's own: None (default), a callable ``progress(done_bytes, total_bytes)``
            called from this thread at most every 0.1 s and once at the end with done == total,
            or True for a tqdm bar (docs/PYTHON.md, "Progress").
        backend: safetensors' ``"mmap"`` or ``"pread"`` (checked as safetensors checks it, another
            value raises SafetensorError); ferry reads through its own engine either way.
        distributed: False (default); True (torch.distributed's default group) or a ProcessGroup:
            a collective load, every rank of the group calling it with the same file set, keys
            and slices. Each tensor a ``slices`` rule does not cut is read by one rank (the ranks'
            shares balanced by bytes) and broadcast to the others; each rank reads its own slices.
            Every rank returns the full dict, on its ``device`` (NCCL: each rank's own GPU; gloo:
            "cpu"). ValueError without a process group or when the ranks name different tensors.

    Returns:
        ``dict[str, torch.Tensor]`` in file order (safetensors' order: by offset).

    Raises:
        FileNotFoundError (safetensors' message) and other OSError for the file; SafetensorError
        (also a ferry.Error, FERRY_ECORRUPT, with the byte offset and the rule) for a file that
        breaks the format; KeyError for a missing key; SafetensorError for a dtype torch lacks, a
        bad ``backend`` or ``device``.
    """
    _check_backend(backend)
    ctx = context if context is not None else _default_context()
    ld = None
    if callable(slices) or (distributed is not False and distributed is not None):
        ld, tensors = _open_set(filename, ctx)

    def local(keys, slices):
        alloc = _TorchAlloc(device)
        if progress is None:
            return _load_torch(filename, device, keys, slices, verify, views, staging_budget, ctx, alloc, ld)
        return _progress.run(lambda: _load_torch(filename, device, keys, slices, verify, views,
                                                 staging_budget, ctx, alloc, ld),
                             progress, _progress.load_total(filename), _progress.ctx_counter(ctx, "bytes_read"),
                             _os.path.basename(_os.fspath(filename)))

    if distributed is not False and distributed is not None:
        from . import _dist
        return _dist.load(filename, tensors, keys=keys, slices=slices, views=views, distributed=distributed,
                          local=local, torch_dtype=_TorchAlloc(device).dtype, torch_shape=_torch_shape,
                          dev=_device(device)[0])
    if callable(slices):
        keys, slices = _slices_of_rule(tensors, slices, keys)
    return local(keys, slices)


def load_model_dir(directory, device="cpu", **kwargs) -> dict:
    """Load a model directory: its ``model.safetensors.index.json`` (a sharded set), else its
    ``*.safetensors`` files. Takes load_file's keyword arguments."""
    return load_file(directory, device, **kwargs)


# ------------------------------------------------------------------------------------ saves

def _check_metadata(metadata):
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError("metadata must be a dict[str, str], not %s" % type(metadata).__name__)
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata must be a dict[str, str]: %r: %r is not" % (k, v))
    return metadata


def _check_tensors(tensors, shared_ok=False, contiguous_ok=False):
    """safetensors.torch's checks (same messages where they apply); returns [(name, tensor)]."""
    torch = _torch()
    if not isinstance(tensors, dict):
        raise ValueError("Expected a dict of [str, torch.Tensor] but received %s" % type(tensors))
    items, sparse = [], []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError("Key `%s` is invalid, expected torch.Tensor but received %s" % (k, type(v)))
        if not isinstance(k, str):
            raise TypeError("tensor names must be str, not %s (%r)" % (type(k).__name__, k))
        if v.layout != torch.strided:
            sparse.append(k)
        items.append((k, v))
    if sparse:
        raise ValueError("You are trying to save a sparse tensors: `%s` which this library does not "
                         "support. You can make it a dense tensor before saving with `.to_dense()` "
                         "but be aware this might make a much larger file than needed." % sparse)
    if not shared_ok:
        # safetensors refuses tensors whose bytes overlap, not views of one allocation side by
        # side (what load_file returns)
        failing = [names for names in _find_shared_tensors(dict(items)) if len(names) > 1]
        if failing:
            raise RuntimeError(
                "Some tensors share memory, this will lead to duplicate memory on disk and potential "
                "differences when loading them again: %s. A potential way to correctly save your model "
                "is to use `save_model`, or .clone() one of them. More information at "
                "https://huggingface.co/docs/safetensors/torch_shared_tensors" % failing)
    out = []
    for k, v in items:
        if not v.is_contiguous():
            if not contiguous_ok:
                raise ValueError(
                    "You are trying to save a non contiguous tensor: `%s` which is not allowed. It "
                    "either means you are trying to save tensors which are reference of each other in "
                    "which case it's recommended to save only the full tensors, and reslice at load "
                    "time, or simply call `.contiguous()` on your tensor to pack it before saving." % k)
            v = v.contiguous()
        if v.device.type not in ("cpu", "cuda"):
            v = v.to("cpu")  # as safetensors.torch does (a meta tensor: torch's NotImplementedError)
        out.append((k, v))
    return out


# safetensors.torch's rules for tensors sharing memory (safetensors/torch.py, 0.4 to 0.8)

def storage_ptr(tensor) -> int:
    """The address of ``tensor``'s storage (0 for a meta tensor), as ``safetensors.torch``'s."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - meta and other storages without data
        return 0


def storage_size(tensor) -> int:
    """The bytes of ``tensor``'s storage, as ``safetensors.torch``'s."""
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor) -> int:
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + tensor.element_size()
    return tensor.data_ptr()


def _filter_shared_not_shared(tensors, state_dict):
    """Splits each group of tensors on one storage into groups whose byte ranges overlap."""
    out = []
    for shared in tensors:
        if len(shared) < 2:
            out.append(shared)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in shared)
        _, last_stop, last_name = areas[0]
        out.append({last_name})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                out.append({name})
            else:
                out[-1].add(name)
            last_stop = stop
    return out


def _find_shared_tensors(state_dict):
    torch = _torch()
    groups = {}
    for k, v in state_dict.items():
        if v.device != torch.device("meta") and storage_ptr(v) != 0 and storage_size(v) != 0:
            groups.setdefault((v.device, storage_ptr(v), storage_size(v)), set()).add(k)
    return _filter_shared_not_shared(list(sorted(groups.values())), state_dict)


def _is_complete(tensor) -> bool:
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * tensor.element_size() == storage_size(tensor))


def _remove_duplicate_names(state_dict, *, preferred_names=None, discard_names=None):
    """{name kept: [names dropped]} for each group of tensors sharing memory (save_model's rule)."""
    preferred_names = set(preferred_names or [])
    discard_names = set(discard_names or [])
    to_remove = {}
    for shared in _find_shared_tensors(state_dict):
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable "
                "name to keep for saving amongst: %s. None is covering the entire storage.Refusing to "
                "save/load the model since you could be storing much more memory than needed. Please "
                "refer to https://huggingface.co/docs/safetensors/torch_shared_tensors for more "
                "information. Or open an issue." % (shared,))
        keep = sorted(complete)[0]
        preferred = complete - discard_names
        if preferred:
            keep = sorted(preferred)[0]
        if preferred_names:
            preferred = preferred_names & complete
            if preferred:
                keep = sorted(preferred)[0]
        for name in sorted(shared):
            if name != keep:
                to_remove.setdefault(keep, []).append(name)
    return to_remove


def _st_layout(k, v):
    """(safetensors dtype, shape) of tensor v named k as a file stores it: F4's last dimension counts
    values, two per float4_e2m1fn_x2 element (so a scalar of it cannot be stored)."""
    dt = _st_dtype_name(v.dtype)
    shape = list(v.shape)
    if dt == "F4":
        if not shape:
            raise ValueError("tensor %r: a float4_e2m1fn_x2 scalar holds two F4 values; "
                             "safetensors needs a shape" % k)
        shape[-1] *= 2
    return dt, shape


def _add_tensors(w, items):
    """Adds (name, tensor) to a C writer or checkpoint; returns the CUDA devices involved."""
    devices = set()
    for k, v in items:
        dt, shape = _st_layout(k, v)
        nb = v.numel() * v.element_size()
        w.add(k, dt, shape, v.data_ptr() if nb else 0, nb)
        if v.device.type == "cuda":
            devices.add(v.device)
    return devices


def save_file(tensors, filename, metadata=None, *, checksum=False, durable=True, context=None,
              progress=None) -> None:
    """Save ``tensors`` (``dict[str, torch.Tensor]``, CPU or CUDA) to ``filename`` in safetensors.

    Like ``safetensors.torch.save_file(tensors, filename, metadata)``: the same checks and errors
    (a dict of tensors, dense, contiguous, no two sharing memory), and the file loads in Hugging
    Face's safetensors. ferry writes CUDA tensors through pinned slots (device-to-host copies on its
    own streams), with the header padded so that the data starts 4 KiB-aligned, and durably:
    temporary name, fsync, rename, directory fsync; on error ``filename`` is untouched.

    Args:
        checksum: store each tensor's xxh3 in ``__metadata__`` (``ferry.xxh3:<name>``) for
            ``load_file(..., verify=True)``.
        durable: False skips the fsyncs (faster, not crash-safe).
        context: the ferry.Context to use.
        progress: ferry's own: None (default), a callable ``progress(done_bytes, total_bytes)``
            called from this thread at most every 0.1 s and once at the end with done == total,
            or True for a tqdm bar (docs/PYTHON.md, "Progress").
    """
    if progress is not None:
        ctx = context if context is not None else _default_context()
        return _progress.run(lambda: save_file(tensors, filename, metadata, checksum=checksum,
                                               durable=durable, context=context),
                             progress, _progress.tensor_bytes(tensors),
                             _progress.ctx_counter(ctx, "bytes_written"),
                             _os.path.basename(_os.fspath(filename)))
    global _idle_writer
    items = _check_tensors(tensors)
    metadata = _check_metadata(metadata)
    ctx = context if context is not None else _default_context()
    w = None
    if context is None:
        with _idle_lock:
            idle, _idle_writer = _idle_writer, None
        if idle is not None and idle[0] is ctx:  # else the default context was replaced
            w = idle[1]
        del idle
    if w is None:
        w = _ferry.writer_create(ctx)
    try:
        for dev in _add_tensors(w, items):
            _sync_device(dev)
        for k, v in metadata.items():
            w.metadata(k, v)
        flags = (_ferry.SAVE_CHECKSUM if checksum else 0) | (0 if durable else _ferry.SAVE_NOSYNC)
        with _errors(filename, save=True):
            w.save(_os.fspath(filename), flags)
    finally:
        w.reset()
        if context is None:
            with _idle_lock:
                if _idle_writer is None:
                    _idle_writer = (ctx, w)


def save_model(model, filename, metadata=None, force_contiguous=True):
    """``safetensors.torch.save_model``: saves ``model.state_dict()`` with ferry's save_file, each
    group of tensors sharing memory saved once (the name kept is recorded in ``metadata`` under each
    dropped name, without overriding the caller's keys)."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            if name not in metadata:
                metadata[name] = kept
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(str(e) + " Or use save_model(..., force_contiguous=True), read the docs for "
                         "potential caveats.") from None


def load_model(model, filename, strict=True, device="cpu", *, backend="mmap"):
    """``safetensors.torch.load_model``: loads ``filename`` with ferry's load_file into ``model``;
    returns ``(missing, unexpected)``, raises RuntimeError when ``strict`` and either is not empty
    (names shared in the model count as loaded)."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for group in to_removes.values():
        for name in group:
            if name not in missing:
                unexpected.append(name)
            else:
                missing.remove(name)
    if strict and (missing or unexpected):
        error = "Error(s) in loading state_dict for %s:" % model.__class__.__name__
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join('"%s"' % k for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                '"%s"' % k for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


# ---------------------------------------------------------------------------- bytes in memory

# safetensors' dtypes by increasing alignment: its writer lays tensors out by decreasing
# position here, then by name (include/ferry/ferry.h's enum ferry_dtype has the same order)
_LAYOUT = ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
           "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
           "F64", "I64", "U64")
_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _dtype_bits(name):
    if name in _BITS:
        return _BITS[name]
    if name in ("BOOL", "U8", "I8") or name.startswith("F8"):
        return 8
    return {"I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32}.get(name, 64)


def save(tensors, metadata=None) -> bytes:
    """``safetensors.torch.save``: ``tensors`` as the bytes of a safetensors file, laid out as
    safetensors lays them out (no 4 KiB alignment: these bytes are for memory, not for ferry's reads)."""
    torch = _torch()
    items = _check_tensors(tensors)
    metadata = _check_metadata(metadata) if metadata is not None else None
    rows = []
    for k, v in items:
        dt, shape = _st_layout(k, v)
        rows.append((-_LAYOUT.index(dt), k, dt, shape, v))
    rows.sort(key=lambda r: (r[0], r[1]))
    header, chunks, at = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for _, k, dt, shape, v in rows:
        data = v.detach().to("cpu").reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b""
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(data)]}
        chunks.append(data)
        at += len(data)
    h = _json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * (-len(h) % 8)
    return _struct.pack("<Q", len(h)) + h + b"".join(chunks)


def _deserialize_error(why):
    return SafetensorError("Error while deserializing: %s" % why)


def load(data: bytes) -> dict:
    """``safetensors.torch.load``: the tensors (on the CPU) of a safetensors file's bytes; the
    checks of safetensors' reader (SafetensorError "Error while deserializing: ...")."""
    torch = _torch()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("argument 'bytes': '%s' object is not an instance of 'bytes'" % type(data).__name__)
    data = memoryview(data).cast("B")
    if len(data) < 8:
        raise _deserialize_error("header too small")
    (n,) = _struct.unpack("<Q", data[:8])
    if n > 100_000_000:
        raise _deserialize_error("header too large")
    if 8 + n > len(data):
        raise _deserialize_error("invalid header length")
    try:
        header = _json.loads(bytes(data[8:8 + n]).decode("utf-8"))
    except UnicodeDecodeError:
        raise _deserialize_error("invalid UTF-8 in header") from None
    except ValueError as e:
        raise _deserialize_error("invalid JSON in header: %s" % e) from None
    if not isinstance(header, dict):
        raise _deserialize_error("invalid JSON in header: not an object")
    body = data[8 + n:]
    entries = []
    for k, v in header.items():
        if k == "__metadata__":
            continue
        try:
            dt, shape, (a, b) = v["dtype"], list(v["shape"]), v["data_offsets"]
            if dt not in _LAYOUT or not all(isinstance(x, int) and x >= 0 for x in shape + [a, b]):
                raise ValueError
        except (TypeError, ValueError, KeyError):
            raise _deserialize_error("invalid JSON in header: tensor %r" % k) from None
        entries.append((a, b, k, dt, shape))
    entries.sort()
    at = 0
    for a, b, k, dt, shape in entries:
        if a != at or b < a:
            raise _deserialize_error("invalid offset for tensor %s" % k)
        count = 1
        for d in shape:
            count *= d
        if (count * _dtype_bits(dt) + 7) // 8 != b - a:
            raise _deserialize_error("invalid tensor info for %s" % k)
        at = b
    if at != len(body):
        raise _deserialize_error("incomplete metadata, file not fully covered")
    out = {}
    for a, b, k, dt, shape in entries:
        dtype = _torch_dtypes().get(dt)
        if dtype is None:
            raise SafetensorError("tensor %r has dtype %s, which this torch (%s) has no dtype for"
                                  % (k, dt, torch.__version__))
        tshape = _torch_shape(k, dt, shape)
        if b == a:
            out[k] = torch.empty(tshape, dtype=dtype)
        else:
            # a copy of the tensor's bytes (aligned, writable: the caller's bytes are neither)
            out[k] = torch.frombuffer(bytearray(body[a:b]), dtype=dtype).reshape(tshape)
    return out


# ------------------------------------------------------------------------------- safe_open

class safe_open:
    """Lazy access to one safetensors file, like ``safetensors.safe_open`` (framework "pt")::

        with ferry.safetensors.safe_open("model.safetensors", framework="pt", device="cuda") as f:
            for k in f.keys():
                t = f.get_tensor(k)
            rows = f.get_slice("embed.weight")[0:1024]     # reads only those rows

    Each ``get_tensor`` / slice reads from storage into a new tensor on ``device``;
    ``get_tensors()`` reads the whole file as ``load_file`` does. After ``close()`` (or the end of
    the ``with``) every method raises SafetensorError("File is closed"), as in safetensors.
    """

    _PT = ("pt", "torch", "pytorch")
    _OTHERS = ("np", "numpy", "tf", "tensorflow", "jax", "flax", "mlx", "paddle")

    def __init__(self, filename, framework, device="cpu", *, backend="mmap", context=None):
        if framework not in self._PT:
            if framework in self._OTHERS:
                raise _also(ValueError)(
                    "framework %s: ferry.safetensors.safe_open supports framework='pt' "
                    "(ferry.safetensors.numpy has the NumPy functions)" % (framework,))
            raise SafetensorError("framework %s is invalid" % (framework,))
        self._alloc = _TorchAlloc(device)
        _check_backend(backend)
        self._ctx = context if context is not None else _default_context()
        self._path = filename
        with _errors(filename):
            self._st = _ferry.st_open(self._ctx, _os.fspath(filename))
        self._info = {t[0]: (i,) + tuple(t[1:]) for i, t in enumerate(self._st.tensors())}
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, _exc_type, _exc_value, _traceback):
        self.close()

    def close(self):
        self._closed = True
        self._st.close()

    def _open(self):
        if self._closed:
            raise SafetensorError("File is closed")
        return self._st

    def keys(self) -> list:
        """Tensor names, sorted (as safetensors returns them)."""
        self._open()
        return sorted(self._info)

    def offset_keys(self) -> list:
        """Tensor names in the order of their data in the file."""
        self._open()
        return [k for k, _ in sorted(self._info.items(), key=lambda kv: kv[1][3])]

    def metadata(self) -> dict:
        """``__metadata__`` (None when the file has none, as in safetensors)."""
        return self._open().metadata() or None

    def get_tensors(self) -> dict:
        """Every tensor, by offset, read as ``load_file`` reads them (views of one allocation)."""
        self._open()
        return _load_torch(self._path, self._alloc.dev, None, None, False, True, None, self._ctx,
                           _TorchAlloc(self._alloc.dev))

    def _get(self, name):
        self._open()
        try:
            return self._info[name]
        except KeyError:
            raise SafetensorError("File does not contain tensor %s" % name) from None

    def get_tensor(self, name):
        i, dt, shape, _off, nb = self._get(name)
        t = self._alloc.empty(_torch_shape(name, dt, shape), self._alloc.dtype(name, dt))
        _sync_device(self._alloc.dev)
        if nb:
            with _errors(self._path):
                self._st.read(i, t.data_ptr(), nb)
        return t

    def get_slice(self, name):
        return _Slice(self, name)

    def verify(self, name) -> bool:
        """True when the stored checksum matches, False when the file holds none; raises
        ferry.Error (FERRY_EVERIFY) naming the file and tensor when it differs."""
        return bool(self._st.verify(self._get(name)[0]))


class _Slice:
    """``safe_open(...).get_slice(name)``: shape and dtype without reading; ``[...]`` reads only the
    rows of the first restricted dimension, then indexes the rest on the device."""

    def __init__(self, f, name):
        self._f, self._name, self._own = f, name, None
        self._i, self._dt, self._shape, _off, self._nb = f._get(name)

    def _st(self):
        """The file's handle; once the file is closed, the slice's own (safetensors' slice keeps
        its mapping and answers after the ``with``)."""
        f = self._f
        if not f._closed:
            return f._st, self._i
        if self._own is None:
            with _errors(f._path):
                st = _ferry.st_open(f._ctx, _os.fspath(f._path))
            names = [t[0] for t in st.tensors()]
            if self._name not in names:  # replaced since
                raise SafetensorError("File does not contain tensor %s" % self._name)
            self._own = (st, names.index(self._name))
        return self._own

    def _full(self):
        a = self._f._alloc
        t = a.empty(_torch_shape(self._name, self._dt, self._shape), a.dtype(self._name, self._dt))
        _sync_device(a.dev)
        if self._nb:
            st, i = self._st()
            with _errors(self._f._path):
                st.read(i, t.data_ptr(), self._nb)
        return t

    def get_shape(self):
        return list(self._shape)

    def get_dtype(self):
        return self._dt

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        shape = self._shape
        if len(index) > len(shape) or not all(
                (type(x) is int) or (type(x) is slice and (x.step is None or
                                                          (type(x.step) is int and x.step > 0)))
                for x in index):
            # Ellipsis, None, lists, tensors, negative steps, too many indices: torch's indexing
            # of the whole tensor, with its results and errors (as safetensors answers them)
            return self._full()[index if len(index) != 1 else index[0]]
        index = index + (slice(None),) * (len(shape) - len(index))
        for d, x in enumerate(index):
            if x == slice(None):
                continue
            n = shape[d]
            if isinstance(x, int):
                if not -n <= x < n:
                    raise IndexError("index %d is out of bounds for dimension %d with size %d" % (x, d, n))
                x %= n
                lo, hi, rest = x, x + 1, 0
            else:
                r = range(*x.indices(n))
                lo, hi = (r.start, r[-1] + 1) if len(r) else (0, 0)
                rest = slice(0, None, r.step)
            t = self._read(d, lo, hi)
            return t[index[:d] + (rest,) + index[d + 1:]]
        return self._full()

    def _read(self, dim, start, stop):
        a = self._f._alloc
        shape = list(self._shape)
        shape[dim] = stop - start
        t = a.empty(_torch_shape(self._name, self._dt, shape), a.dtype(self._name, self._dt))
        _sync_device(a.dev)
        nb = t.numel() * t.element_size()
        if nb:
            st, i = self._st()
            with _errors(self._f._path):
                st.read_slice(i, dim, start, stop, t.data_ptr(), nb)
        return t
