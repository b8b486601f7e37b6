"""safetensors files to and from torch tensors on the CPU or a CUDA device, through ferry.

Drop-in for ``safetensors.torch``'s ``load_file`` and ``save_file`` (same names, same arguments,
same errors where they make sense), with ferry's extras as keyword arguments::

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

import functools as _functools
import os as _os
import sys as _sys
import threading as _threading
import time as _time
import weakref as _weakref

from .. import _ferry
from .. import default_context as _default_context

__all__ = ["load_file", "save_file", "load_model_dir", "safe_open", "SafetensorError", "have_checksums",
           "last_trace"]


class SafetensorError(Exception):
    """Raised for what Hugging Face's reader reports as ``SafetensorError`` and ferry's Python layer
    checks itself (a tensor whose dtype torch lacks, a bad slice). File errors are OSError /
    ferry.Error with the C library's detail (file, byte offset, rule)."""


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
    raise ValueError("torch dtype %s has no safetensors equivalent ferry knows (%s)"
                     % (dtype, ", ".join(_torch_dtypes())))


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
        except (RuntimeError, TypeError) as e:
            raise ValueError("device must be 'cpu', 'cuda', 'cuda:N', an int or a torch.device, "
                             "not %r (%s)" % (device, e)) from None
    if dev.type == "cpu":
        return dev, -1
    if dev.type != "cuda":
        raise ValueError("ferry loads into CPU or CUDA memory, not %r" % (device,))
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
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
    only when that load started the context's workers, beside the other spans). None before the
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


def _load_torch(path, device, keys, slices, verify, views, staging_budget, context, alloc):
    """The load behind load_file (torch) and ferry.safetensors.numpy.load_file (alloc decides)."""
    clock = _time.perf_counter
    t0 = clock()
    spans = {}
    ctx = context if context is not None else _default_context()
    starter = _start_workers(ctx, spans)
    t = clock()
    spans["context"] = t - t0
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
    out, dests = alloc(entries, places)
    for i, (ptr, length) in enumerate(dests):
        ld.set_dest(i, ptr, length)
    t1 = clock()
    spans["alloc"] = t1 - t
    flags = _ferry.LOAD_VERIFY if verify else 0
    ld.run(alloc.device_index, flags, int(staging_budget or 0))
    spans["read"] = clock() - t1
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
        for size, group in regions.values():
            buf = self.empty((size,), torch.uint8)
            base = buf.data_ptr()
            typed = {}  # dtype -> the region as that dtype
            for i, name, at, nb, dtype, tshape in group:
                isz = dtype.itemsize
                if at % isz:
                    # A file whose offsets do not keep this dtype aligned: its own allocation.
                    t = self.empty(tshape, dtype)
                    out[name] = t
                    dests[i] = (t.data_ptr(), nb)
                    continue
                # one as_strided of the region's typed view: 2.7 us a tensor where slice, view
                # and view took 6-7 (4,000 tensors: 15 ms, issue 22)
                tv = typed.get(dtype)
                if tv is None:
                    tv = typed[dtype] = buf[:size - size % isz].view(dtype)
                out[name] = tv.as_strided(tshape, _contiguous_strides(tshape), at // isz)
                dests[i] = (base + at, nb)
        _sync_device(self.dev)
        # The dict in the order of the entries (file order, or the selection's).
        return {e[0]: out[e[0]] for e in entries}, dests

    def _anchor(self):
        if self.anchor is None:
            self.anchor = self.empty((1,), self.torch.uint8)
        return self.anchor.data_ptr()


def load_file(filename, device="cpu", *, keys=None, slices=None, verify=False, views=True,
              staging_budget=None, context=None, backend=None) -> dict:
    """Load a safetensors file into torch tensors on ``device``.

    Like ``safetensors.torch.load_file(filename, device)``. ``filename`` may also be a sharded
    Hugging Face set's ``model.safetensors.index.json``, a ferry checkpoint step's
    ``manifest.json``, or a directory holding one of them (or ``*.safetensors`` files).

    Args:
        filename: the file (str or os.PathLike).
        device: "cpu", "cuda", "cuda:N", an int (a CUDA device) or a torch.device.
        keys: load only these tensors (a KeyError names a missing one).
        slices: ``{name: (dim, start, stop)}``: load only ``[start, stop)`` of dimension ``dim``
            of these tensors (negative indices and None as in Python slices), packed contiguously:
            what a tensor-parallel rank needs.
        verify: check every loaded tensor against the xxh3 checksum ferry stored when saving
            (``save_file(..., checksum=True)``); a mismatch or a missing checksum raises
            ``ferry.Error`` (FERRY_EVERIFY) naming the file and the tensor.
        views: True (default): one allocation per file, tensors are views of it (one long read);
            False: one allocation per tensor (each can be freed on its own).
        staging_budget: bytes of host memory for slices and verification (default 256 MiB).
        context: the ferry.Context to use (default: ferry.default_context()).
        backend: accepted for compatibility with safetensors >= 0.6 and ignored.

    Returns:
        ``dict[str, torch.Tensor]`` in file order.

    Raises:
        FileNotFoundError (and other OSError) for the file; ferry.Error (FERRY_ECORRUPT) for a file
        that breaks the format, with the byte offset and the rule; KeyError for a missing key;
        SafetensorError for a dtype torch lacks.
    """
    return _load_torch(filename, device, keys, slices, verify, views, staging_budget, context,
                       _TorchAlloc(device))


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
        seen, failing = {}, []
        for k, v in items:
            if v.numel() == 0:
                continue
            st = v.untyped_storage()
            key = (v.device, st.data_ptr())
            seen.setdefault(key, []).append(k)
        failing = [set(names) for names in seen.values() if len(names) > 1]
        if failing:
            raise RuntimeError(
                "Some tensors share memory, this will lead to duplicate memory on disk and potential "
                "differences when loading them again: %s. A potential way to correctly save your model "
                "is to use `save_model` (safetensors.torch), or .clone() one of them." % failing)
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
        out.append((k, v))
    return out


def _add_tensors(w, items):
    """Adds (name, tensor) to a C writer or checkpoint; returns the CUDA devices involved."""
    devices = set()
    for k, v in items:
        dt = _st_dtype_name(v.dtype)
        shape = list(v.shape)
        if dt == "F4":
            if not shape:
                raise ValueError("tensor %r: a float4_e2m1fn_x2 scalar holds two F4 values; "
                                 "safetensors needs a shape" % k)
            shape[-1] *= 2
        nb = v.numel() * v.element_size()
        w.add(k, dt, shape, v.data_ptr() if nb else 0, nb)
        if v.device.type == "cuda":
            devices.add(v.device)
    return devices


def save_file(tensors, filename, metadata=None, *, checksum=False, durable=True, context=None) -> None:
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
    """
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
        w.save(_os.fspath(filename), flags)
    finally:
        w.reset()
        if context is None:
            with _idle_lock:
                if _idle_writer is None:
                    _idle_writer = (ctx, w)


# ------------------------------------------------------------------------------- safe_open

class safe_open:
    """Lazy access to one safetensors file, like ``safetensors.safe_open`` (framework "pt")::

        with ferry.safetensors.safe_open("model.safetensors", framework="pt", device="cuda") as f:
            for k in f.keys():
                t = f.get_tensor(k)
            rows = f.get_slice("embed.weight")[0:1024]     # reads only those rows

    Each ``get_tensor`` / slice reads from storage into a new tensor on ``device``.
    """

    def __init__(self, filename, framework="pt", device="cpu", *, context=None):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError("ferry.safetensors.safe_open supports framework='pt'; "
                             "ferry.safetensors.numpy has the NumPy functions")
        self._alloc = _TorchAlloc(device)
        ctx = context if context is not None else _default_context()
        self._st = _ferry.st_open(ctx, _os.fspath(filename))
        self._info = {t[0]: (i,) + tuple(t[1:]) for i, t in enumerate(self._st.tensors())}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._st.close()

    def keys(self) -> list:
        """Tensor names, in file order (safetensors sorts them by name; so does ``sorted``)."""
        return list(self._info)

    def offset_keys(self) -> list:
        return list(self._info)

    def metadata(self) -> dict:
        """``__metadata__`` (None when the file has none, as in safetensors)."""
        return self._st.metadata() or None

    def _get(self, name):
        try:
            return self._info[name]
        except KeyError:
            raise SafetensorError("File does not contain tensor %s" % name) from None

    def get_tensor(self, name):
        i, dt, shape, _off, nb = self._get(name)
        t = self._alloc.empty(_torch_shape(name, dt, shape), self._alloc.dtype(name, dt))
        _sync_device(self._alloc.dev)
        if nb:
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
        self._f, self._name = f, name
        self._i, self._dt, self._shape, _off, self._nb = f._get(name)

    def get_shape(self):
        return list(self._shape)

    def get_dtype(self):
        return self._dt

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        shape = self._shape
        if len(index) > len(shape) or any(x is Ellipsis or x is None for x in index):
            raise SafetensorError("slice %r of tensor %r (shape %s): ints and slices with a positive "
                                  "step, at most one per dimension" % (index, self._name, list(shape)))
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
            elif isinstance(x, slice):
                r = range(*x.indices(n))
                if r.step <= 0:
                    raise SafetensorError("negative slice steps are not supported")
                lo, hi = (r.start, r[-1] + 1) if len(r) else (0, 0)
                rest = slice(0, None, r.step)
            else:
                raise SafetensorError("unsupported index %r" % (x,))
            t = self._read(d, lo, hi)
            return t[index[:d] + (rest,) + index[d + 1:]]
        return self._f.get_tensor(self._name)

    def _read(self, dim, start, stop):
        a = self._f._alloc
        shape = list(self._shape)
        shape[dim] = stop - start
        t = a.empty(_torch_shape(self._name, self._dt, shape), a.dtype(self._name, self._dt))
        _sync_device(a.dev)
        nb = t.numel() * t.element_size()
        if nb:
            self._f._st.read_slice(self._i, dim, start, stop, t.data_ptr(), nb)
        return t
