"""`import ferry` hands the nvidia-libnvcomp-cu13 wheel's library to the C side (FERRY_NVCOMP_LIB,
read when nvCOMP is first loaded: src/gpu/nvcomp.c), so that installing the wheel is all GPU
decompression needs. A stand-in package `nvidia.libnvcomp` with a lib64/libnvcomp.so.6 is put on
the path of a fresh interpreter."""
import os
import subprocess
import sys

import ferry

FERRY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))


def _fake_wheel(tmp_path):
    pkg = tmp_path / "site" / "nvidia" / "libnvcomp"
    (pkg / "lib64").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('ferry must locate this package, not import it')\n")
    (pkg / "lib64" / "libnvcomp.so.6").write_bytes(b"")
    return tmp_path / "site", str(pkg / "lib64" / "libnvcomp.so.6")


def _env_after_import(site, preset=None):
    env = {k: v for k, v in os.environ.items() if k != "FERRY_NVCOMP_LIB"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site) if site else "", FERRY_DIR,
                                                    os.environ.get("PYTHONPATH", "")) if p)
    if preset is not None:
        env["FERRY_NVCOMP_LIB"] = preset
    out = subprocess.run([sys.executable, "-c", "import os, ferry; print(os.environ.get('FERRY_NVCOMP_LIB', ''))"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_wheel_library_is_handed_to_the_c_side(tmp_path):
    site, lib = _fake_wheel(tmp_path)
    assert _env_after_import(site) == lib


def test_an_explicit_library_wins(tmp_path):
    site, _ = _fake_wheel(tmp_path)
    assert _env_after_import(site, preset="/opt/nvcomp/libnvcomp.so.6") == "/opt/nvcomp/libnvcomp.so.6"


def test_no_wheel_leaves_it_unset(tmp_path):
    # an `nvidia` namespace without libnvcomp (as torch's CUDA wheels install) finds nothing
    (tmp_path / "site" / "nvidia" / "other").mkdir(parents=True)
    assert _env_after_import(tmp_path / "site") == ""
