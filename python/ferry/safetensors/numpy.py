"""safetensors files to and from NumPy arrays (host memory), like ``safetensors.numpy``::

    from ferry.safetensors.numpy import load_file, save_file
    arrays = load_file("model.safetensors", keys=["embed.weight"])

The dtypes NumPy has: BOOL, U8, I8, U16, I16, F16, U32, I32, F32, C64, U64, I64, F64 (BF16, F8
and F4 tensors raise SafetensorError here; load them with torch, ferry.safetensors.load_file).
Takes the torch functions' keyword arguments, except device.
"""
from __future__ import annotations

import os as _os

from .. import _ferry
from .. import default_context as _default_context
from . import SafetensorError, _check_metadata, _load_torch

__all__ = ["load_file", "save_file"]

_NP = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "F16": "float16",
       "U32": "uint32", "I32": "int32", "F32": "float32", "C64": "complex64", "U64": "uint64",
       "I64": "int64", "F64": "float64"}


class _NumpyAlloc:
    device_index = -1

    def __init__(self):
        import numpy
        self.np = numpy

    def __call__(self, entries, places):
        np = self.np
        out, dests = {}, []
        # One array per tensor: NumPy has no caching allocator to make one big block pay off.
        for name, dt, shape, nb in entries:
            if dt not in _NP:
                raise SafetensorError("tensor %r has dtype %s, which NumPy has no dtype for" % (name, dt))
            a = np.empty(shape, dtype=_NP[dt])
            out[name] = a
            dests.append((a.ctypes.data if nb else _anchor(np), nb))
        return out, dests


_ANCHOR = []


def _anchor(np):
    if not _ANCHOR:
        _ANCHOR.append(np.empty(1, np.uint8))
    return _ANCHOR[0].ctypes.data


def load_file(filename, *, keys=None, slices=None, verify=False, staging_budget=None, context=None) -> dict:
    """Load a safetensors file (or sharded set, or directory) into ``dict[str, numpy.ndarray]``."""
    return _load_torch(filename, "cpu", keys, slices, verify, False, staging_budget, context, _NumpyAlloc())


def save_file(tensor_dict, filename, metadata=None, *, checksum=False, durable=True, context=None) -> None:
    """Save ``dict[str, numpy.ndarray]`` (C-contiguous) to ``filename``, durably (like save_file)."""
    import numpy as np
    if not isinstance(tensor_dict, dict):
        raise ValueError("Expected a dict of [str, numpy.ndarray] but received %s" % type(tensor_dict))
    names = {np.dtype(v): k for k, v in _NP.items()}
    metadata = _check_metadata(metadata)
    w = _ferry.writer_create(context if context is not None else _default_context())
    for k, a in tensor_dict.items():
        if not isinstance(a, np.ndarray):
            raise ValueError("Key `%s` is invalid, expected numpy.ndarray but received %s" % (k, type(a)))
        if not a.flags.c_contiguous:
            raise ValueError("array `%s` is not C-contiguous (np.ascontiguousarray first)" % k)
        dt = names.get(a.dtype.newbyteorder("=")) if a.dtype.byteorder in "=|<" else None
        if dt is None:
            raise ValueError("array `%s`: dtype %s has no safetensors equivalent" % (k, a.dtype))
        w.add(k, dt, list(a.shape), a.ctypes.data if a.nbytes else 0, a.nbytes)
    for k, v in metadata.items():
        w.metadata(k, v)
    flags = (_ferry.SAVE_CHECKSUM if checksum else 0) | (0 if durable else _ferry.SAVE_NOSYNC)
    w.save(_os.fspath(filename), flags)
