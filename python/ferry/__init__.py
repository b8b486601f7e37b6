"""ferry: move bytes between storage and host or GPU memory at the speed of the hardware.

The Python face of libferry (docs/PYTHON.md)::

    import ferry, torch
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    with ferry.open("shard-000.bin") as f:
        n = f.pread_into(t, offset=0)          # zero-copy, GIL released

    x = ferry.read("weights.bin", device="cuda:0", dtype=torch.float16)

Buffers are taken zero-copy through the buffer protocol (NumPy, bytearray, memoryview), DLPack
(torch, CuPy, JAX) or ``__cuda_array_interface__``. torch is never imported by ``import ferry``.
"""
from __future__ import annotations

import concurrent.futures as _cf
import os as _os
import threading as _threading


def _nvcomp_from_wheel() -> None:
    """Points FERRY_NVCOMP_LIB at the nvidia-libnvcomp-cu13 wheel's libnvcomp.so.6 when that package
    is installed and the variable is unset, so that `pip install nvidia-libnvcomp-cu13` is all GPU
    decompression needs: the C side reads the variable when it first loads nvCOMP
    (src/gpu/nvcomp.c). The package is located, not imported."""
    if _os.environ.get("FERRY_NVCOMP_LIB"):
        return
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        return
    for d in (spec.submodule_search_locations or []) if spec else []:
        lib = _os.path.join(d, "lib64", "libnvcomp.so.6")
        if _os.path.exists(lib):
            _os.environ["FERRY_NVCOMP_LIB"] = lib
            return


_nvcomp_from_wheel()

from . import _ferry
from ._ferry import (  # noqa: F401  (re-exported)
    ERROR_CODES,
    CompressedFile as _CompressedFile,
    GDS_COMPAT,
    GDS_NATIVE,
    GDS_REFUSED,
    Error,
    File,
    buffer_info,
    backend_unavailable_reason,
    err_name,
    gds_status as _gds_status,
    gpu_available,
    gpu_count,
    strerror,
)

__version__ = _ferry.version
__all__ = [
    "Context", "Error", "File", "Future", "KNOBS", "ERROR_CODES", "open", "read", "write",
    "default_context", "set_default_context", "buffer_info", "gpu_available", "gpu_count",
    "gds_status", "strerror", "err_name", "backend_unavailable_reason",
    "CompressedFile", "compress_file", "is_compressed",
]

#: The knob names, as in ferry_ctx_keys() and FERRY_<KEY> environment variables.
KNOBS: tuple = _ferry.keys()

# ferry's own error codes as module constants: ferry.ENOGDS == -5002, ...
for _name, _code in ERROR_CODES.items():
    globals()[_name[len("FERRY_"):]] = _code
del _name, _code


def _knob_text(key: str, value) -> str:
    if isinstance(value, bool):
        if key == "direct":
            return "on" if value else "off"
        return "1" if value else "0"
    return str(value)


class Context(_ferry.Context):
    """A ferry context: the knobs, the worker threads and their buffers, and the counters.

    ``Context(threads=8, chunk_size="4m", path="cpu-async-gpu")`` takes the knob names of the C
    API (``ferry.KNOBS``); values may be ints, bools or the C API's text ("1m", "auto").
    Unset knobs come from ``FERRY_<KEY>`` environment variables, then the defaults. An unknown
    knob or invalid value raises ``ferry.Error`` (``FERRY_EBADOPT``) naming it.
    """

    def __init__(self, **options):
        for key, value in options.items():
            self.set(key, _knob_text(key, value))

    def set(self, key: str, value) -> None:  # noqa: D401 (same as the C method, with conversion)
        """Set a knob: ``ctx.set("threads", 8)``."""
        _ferry.Context.set(self, key, _knob_text(key, value))

    def options(self) -> dict:
        """Every knob's current value, as text."""
        return {k: self.get(k) for k in KNOBS}

    def open(self, path, mode: str = "r", *, buffered: bool = False) -> File:
        """``ferry.open(path, mode, context=self)``."""
        return open(path, mode, context=self, buffered=buffered)

    def read_batch(self, entries) -> list:
        """Read ``[(file, offset, buf), ...]`` (files of this context) as one submission."""
        return self._batch(entries, False)

    def write_batch(self, entries) -> list:
        """Write ``[(file, offset, buf), ...]`` as one submission."""
        return self._batch(entries, True)

    def __repr__(self) -> str:
        return "<ferry.Context %s>" % " ".join("%s=%s" % kv for kv in self.options().items())


_default_ctx = None
_default_lock = _threading.Lock()


def default_context() -> Context:
    """The context used where none is given; created at first use (FERRY_* env applies)."""
    global _default_ctx
    ctx = _default_ctx
    if ctx is None:
        with _default_lock:
            if _default_ctx is None:
                _default_ctx = Context()
            ctx = _default_ctx
    return ctx


def set_default_context(ctx: Context | None) -> None:
    """Replace the default context (None: a new one is created at next use)."""
    global _default_ctx
    if ctx is not None and not isinstance(ctx, _ferry.Context):
        raise TypeError("expected a ferry.Context, not %s" % type(ctx).__name__)
    with _default_lock:
        _default_ctx = ctx


_MODES = {
    "r": _ferry.O_RDONLY,
    "r+": _ferry.O_RDWR,
    "w": _ferry.O_WRONLY | _ferry.O_CREAT | _ferry.O_TRUNC,
    "w+": _ferry.O_RDWR | _ferry.O_CREAT | _ferry.O_TRUNC,
    "x": _ferry.O_WRONLY | _ferry.O_CREAT | _ferry.O_EXCL,
    "x+": _ferry.O_RDWR | _ferry.O_CREAT | _ferry.O_EXCL,
}


def open(path, mode: str = "r", context: Context | None = None, *, buffered: bool = False,
         compressed: bool | None = None):
    """Open a file for positional, zero-copy transfers.

    mode: "r", "r+", "w" (create, truncate), "w+", "x" (create, must not exist), "x+"; a "b" is
    accepted and ignored (ferry is always binary). buffered=True never opens an O_DIRECT
    descriptor. Raises FileNotFoundError, PermissionError, IsADirectoryError, ... (OSError).

    In mode "r", a ferry compressed file (docs/FORMATS.md) opens as a ``CompressedFile``, whose
    ``pread_into`` and ``size`` are the uncompressed bytes': ``compressed=None`` looks at a local
    file's last 80 bytes to tell (one more open and read), True requires one, False never checks.
    A URL (``s3://``, ``http(s)://``) is not looked at unless ``compressed=True``: the look would be
    one more request, a round trip to the store, at every open.
    """
    if not isinstance(mode, str):
        raise TypeError("mode must be a str, not %s" % type(mode).__name__)
    flags = _MODES.get(mode.replace("b", ""))
    if flags is None:
        raise ValueError("invalid mode %r: expected one of %s" % (mode, ", ".join(_MODES)))
    ctx = context if context is not None else default_context()
    path = _os.fspath(path)
    if mode.replace("b", "") == "r" and compressed is not False:
        if compressed or (compressed is None and "://" not in path and _ferry.cz_is_compressed(ctx, path)):
            return CompressedFile(path, context=ctx)
    elif compressed:
        raise ValueError("compressed=True opens for reading only (mode 'r'), not %r" % mode)
    if buffered:
        flags |= _ferry.O_BUFFERED
    return _ferry.open(ctx, path, flags, mode)


class CompressedFile(_CompressedFile):
    """A ferry compressed file (docs/FORMATS.md) opened for reading: ``pread_into(buf, offset)``
    reads uncompressed bytes into host or CUDA memory, decoding only the chunks covered, in
    parallel (nvCOMP on the GPU for CUDA buffers where it is loaded); ``path_info()`` says how the
    last read decoded. ``size``, ``compressed_size``, ``codec``, ``chunk_size``, ``chunks``,
    ``stored_chunks``; ``set(key, value)`` for the knobs cz_threads, cz_verify, cz_gpu. Raises
    ferry.Error (FERRY_ECORRUPT) naming the chunk and field of a damaged file."""

    def __new__(cls, path, context: Context | None = None):
        return super().__new__(cls, context if context is not None else default_context(), path)


def compress_file(src, dst, codec: str = "zstd", level: int | None = None, chunk=None,
                  threads: int | None = None, context: Context | None = None,
                  exclusive: bool = False) -> int:
    """Write ``src`` (a path or URL ferry reads) as a ferry compressed file at ``dst``.

    codec: "zstd" or "lz4"; level: the codec's level (None: zstd 3, lz4 fast); chunk: bytes per
    chunk (an int or "1m"; None: the cz_chunk knob); threads: chunks compressed at once.
    ``dst`` appears only complete (a temporary renamed); exclusive=True refuses an existing one
    (FileExistsError). Returns ``dst``'s size in bytes.
    """
    return _ferry.compress_file(context if context is not None else default_context(), src, dst,
                                codec, level, chunk, threads, exclusive)


def is_compressed(path, context: Context | None = None) -> bool:
    """True when ``path`` is a ferry compressed file (it ends in the format's trailer)."""
    return _ferry.cz_is_compressed(context if context is not None else default_context(), path)


class Future(_ferry.Request):
    """An asynchronous transfer, returned by ``File.pread_into_async`` and ``pwrite_from_async``.

    Shaped like ``concurrent.futures.Future``: ``done()``, ``wait(timeout)``, ``result(timeout)``
    (bytes transferred, or raises the transfer's error), ``exception(timeout)``,
    ``add_done_callback(fn)``. The future holds a reference to the buffer until the transfer ends.
    ``as_concurrent()`` gives a real ``concurrent.futures.Future`` for ``concurrent.futures.wait``
    and ``as_completed``; ``await fut`` works in asyncio. Waits release the GIL.
    """

    def add_done_callback(self, fn) -> None:
        """Call ``fn(self)`` once finished: at once if it is, else from a waiter thread."""
        if self.done():
            fn(self)
            return
        _waiter().submit(_call_when_done, self, fn)

    def as_concurrent(self) -> _cf.Future:
        """A ``concurrent.futures.Future`` that completes with this transfer."""
        cf = _cf.Future()
        cf.set_running_or_notify_cancel()

        def settle(me):
            exc = me.exception()
            if exc is not None:
                cf.set_exception(exc)
            else:
                cf.set_result(me.result())

        self.add_done_callback(settle)
        return cf

    def __await__(self):
        import asyncio
        return asyncio.wrap_future(self.as_concurrent()).__await__()


_ferry._set_future_type(Future)

_waiter_pool = None


def _waiter() -> _cf.ThreadPoolExecutor:
    global _waiter_pool
    with _default_lock:
        if _waiter_pool is None:
            _waiter_pool = _cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ferry-waiter")
        return _waiter_pool


def _call_when_done(fut, fn) -> None:
    fut.wait()
    fn(fut)


def gds_status(path) -> tuple:
    """``(status, why)``: GDS_NATIVE, GDS_COMPAT or GDS_REFUSED for ``path``, with the reason.

    Raises ferry.Error (FERRY_ENOGPU) without a GPU.
    """
    return _gds_status(_os.fspath(path))


# --------------------------------------------------------------------------- convenience reads

def _parse_device(device) -> tuple:
    """("cpu", -1) or ("cuda", index or None) from "cpu", "cuda", "cuda:N", an int or a torch.device."""
    if device is None:
        return "cpu", -1
    if isinstance(device, int):
        return "cuda", device
    text = str(device)
    if text == "cpu":
        return "cpu", -1
    if text == "cuda":
        return "cuda", None
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise ValueError("device must be 'cpu', 'cuda' or 'cuda:N', not %r" % (device,))


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _allocate(nbytes: int, kind: str, index, prefer: str | None):
    """An uninitialized byte buffer of nbytes: torch, else NumPy or CuPy, else bytearray."""
    torch = _torch() if prefer in (None, "torch") else None
    if torch is not None:
        if kind == "cuda":
            dev = torch.device("cuda", index if index is not None else torch.cuda.current_device())
            t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            # ferry's copies run on its own streams: the memory the caching allocator hands out
            # may still be in use by work queued on the current stream.
            torch.cuda.current_stream(dev).synchronize()
            return t, "torch"
        return torch.empty(nbytes, dtype=torch.uint8), "torch"
    if prefer == "torch":
        raise ImportError("ferry.read(..., like='torch') needs torch, which cannot be imported")
    if kind == "cuda":
        try:
            import cupy
        except ImportError:
            raise ImportError("ferry.read(device=%r) needs torch or cupy to allocate GPU memory"
                              % (kind if index is None else "cuda:%d" % index)) from None
        with cupy.cuda.Device(index if index is not None else cupy.cuda.runtime.getDevice()):
            a = cupy.empty(nbytes, dtype=cupy.uint8)
            cupy.cuda.get_current_stream().synchronize()
        return a, "cupy"
    try:
        import numpy
    except ImportError:
        if prefer == "numpy":
            raise
        return bytearray(nbytes), "bytes"
    return numpy.empty(nbytes, dtype=numpy.uint8), "numpy"


def read(path, offset: int = 0, length: int | None = None, device="cpu", dtype=None,
         context: Context | None = None, like: str | None = None, info: dict | None = None):
    """Read ``length`` bytes (default: to the end of the file) at ``offset`` into new memory.

    Returns a ``torch.Tensor`` on ``device`` ("cpu", "cuda", "cuda:N") when torch can be imported,
    else a NumPy array (host) or CuPy array (GPU), else a bytearray; ``like`` ("torch", "numpy")
    forces the kind. ``dtype`` (a torch or NumPy dtype) reinterprets the bytes, which must then be
    a whole number of elements. Fewer bytes than asked come back only at end of file.

    A ferry compressed file reads as its uncompressed bytes (offset and length count those).
    ``info``, a dict, gets ``compressed`` (bool), ``path`` (how the read ran: for a compressed
    file, "cpu (...)" or "nvcomp (...)", else ``File.path_info()``) and, compressed, ``codec``.
    """
    kind, index = _parse_device(device)
    with open(path, "r", context=context) as f:
        if length is None:
            length = max(f.size - offset, 0)
        if length < 0:
            raise ValueError("length must not be negative")
        buf, lib = _allocate(length, kind, index, like)
        n = f.pread_into(buf, offset)
        if info is not None:
            info["compressed"] = isinstance(f, _CompressedFile)
            info["path"] = f.path_info()
            if info["compressed"]:
                info["codec"] = f.codec
    if n < length:
        buf = buf[:n]
    if dtype is not None:
        if lib == "bytes":
            raise TypeError("dtype needs torch or numpy")
        itemsize = _itemsize(dtype, lib)
        if n % itemsize:
            raise ValueError("%d bytes read from %r at offset %d are not a whole number of "
                             "%s elements (%d bytes each)" % (n, _os.fspath(path), offset,
                                                              dtype, itemsize))
        buf = buf.view(dtype)
    return buf


def _itemsize(dtype, lib: str) -> int:
    if lib == "torch":
        import torch
        return torch.empty(0, dtype=dtype).element_size()
    import numpy
    return numpy.dtype(dtype).itemsize


def write(path, buf, offset: int = 0, context: Context | None = None, sync: bool = False) -> int:
    """Write all of ``buf`` (any supported buffer, host or GPU) at ``offset``; create the file if
    needed, never truncate it. ``sync=True`` fdatasyncs before returning. Returns bytes written."""
    p = _os.fspath(path)
    mode = "r+" if _os.path.exists(p) else "w"
    with open(p, mode, context=context) as f:
        n = f.pwrite_from(buf, offset)
        if sync:
            f.sync()
    return n


# --- data (issue 6): datasets, sample orders, the loader (ferry/data.py) ---
from .data import (  # noqa: E402,F401
    IndexedDataset, Loader, distributed_indices, order_indices, write_dataset,
)
__all__ += ["IndexedDataset", "Loader", "distributed_indices", "order_indices", "write_dataset"]
# --- end data ---


# ------------------------------------------------------------- submodules (safetensors, checkpoints)

def __getattr__(name):
    # ferry.safetensors, ferry.checkpoint, ferry.dcp and ferry.torch without an import of their own,
    # on first use (the first two do not import torch; the last two do, when used).
    if name in ("safetensors", "checkpoint", "dcp", "torch"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'ferry' has no attribute %r" % name)
