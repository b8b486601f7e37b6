"""Loads libferry.so through ctypes for tests that compare the C side with PyTorch/NumPy while the
Python extension lacks the data API. FERRY_LIB names the library; else build/libferry.so."""
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def skip(reason):
    print(f"skipped: {reason}")
    if "pytest" in sys.modules:
        import pytest
        pytest.skip(reason, allow_module_level=True)
    sys.exit(77)


def need(*modules):
    out = []
    for m in modules:
        try:
            out.append(__import__(m))
        except ImportError as e:
            skip(f"{m} is not installed ({e})")
    return out


def lib():
    path = os.environ.get("FERRY_LIB") or os.path.join(ROOT, "build", "libferry.so")
    if not os.path.exists(path):
        skip(f"{path} not built (cmake --build build, or set FERRY_LIB)")
    L = ctypes.CDLL(path)
    i64p = ctypes.POINTER(ctypes.c_int64)
    L.ferry_distributed_indices.restype = ctypes.c_int64
    L.ferry_distributed_indices.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                                            ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                            ctypes.c_int, i64p, ctypes.c_size_t]
    L.ferry_distributed_num_samples.restype = ctypes.c_uint64
    L.ferry_distributed_num_samples.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int]
    L.ferry_randperm.restype = ctypes.c_int
    L.ferry_randperm.argtypes = [ctypes.c_uint64, ctypes.c_uint64, i64p]
    L.ferry_last_error.restype = ctypes.c_char_p
    L.ferry_ctx_create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    L.ferry_dataset_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    L.ferry_dataset_count.restype = ctypes.c_uint64
    L.ferry_dataset_count.argtypes = [ctypes.c_void_p]
    L.ferry_dataset_dtype.argtypes = [ctypes.c_void_p]
    L.ferry_dataset_sample_bytes.restype = ctypes.c_int64
    L.ferry_dataset_sample_bytes.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    L.ferry_dataset_read.restype = ctypes.c_ssize_t
    L.ferry_dataset_read.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    L.ferry_dataset_close.argtypes = [ctypes.c_void_p]
    L.ferry_ctx_destroy.argtypes = [ctypes.c_void_p]
    return L


def distributed_indices(L, np, n, R, r, shuffle, seed, epoch, drop_last):
    k = L.ferry_distributed_num_samples(n, R, int(drop_last))
    out = np.empty(max(k, 1), dtype=np.int64)
    got = L.ferry_distributed_indices(n, R, r, int(shuffle), seed, epoch, int(drop_last),
                                      out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(out))
    assert got == k, (got, k, L.ferry_last_error())
    return out[:k]
