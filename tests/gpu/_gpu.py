"""The preamble of tests/gpu/test_python_*.py."""
import pytest

import ferry


def cuda_torch():
    """torch, where ferry can use a GPU and torch sees a CUDA device; otherwise the calling test
    module is skipped, saying why."""
    ok, why = ferry.gpu_available()
    if not ok:
        pytest.skip("no usable GPU: %s" % why, allow_module_level=True)
    torch = pytest.importorskip("torch", reason="torch is not installed on this machine")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device", allow_module_level=True)
    return torch
