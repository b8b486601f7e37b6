import os

import pytest


@pytest.fixture
def data(tmp_path):
    """A 1 MiB file of known random bytes: (path, bytes)."""
    payload = os.urandom(1 << 20)
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    return path, payload


def need(module):
    """Import module or skip the test, saying why (never a silent pass)."""
    return pytest.importorskip(module, reason="%s is not installed in this environment" % module)
