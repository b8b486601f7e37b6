"""Issue 27's device benchmarks, the parts that run without a GPU: bench/gpu-snapshot.py's worker
(its tensors regenerated and compared bit for bit, saved and loaded through ferry.checkpoint) on
the CPU, its skip without CUDA, and bench/shuffled-copies.py's rows and space cost on a tiny
dataset (warm: the figures mean nothing here, the arithmetic and the rows do)."""
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _snapshot_module():
    spec = importlib.util.spec_from_file_location("gpu_snapshot", ROOT / "bench" / "gpu-snapshot.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_snapshot_worker_checks_bits_and_round_trips_a_checkpoint(tmp_path, monkeypatch):
    gs = _snapshot_module()
    monkeypatch.setenv("SNAP_DEVICE", "cpu")
    w = gs.Worker(0.01, str(tmp_path))
    try:
        info = w.wait(0, 120)
        assert info["bytes"] == int(0.01 * (1 << 30)) // 4 * 4
        assert w.ask("verify")["same"] is True
        ck = tmp_path / "ck"
        s = w.ask("save", str(ck))
        assert "error" not in s and s["seconds"] > 0
        assert w.ask("load", str(ck))["same"] is True
        w.ask("poke")
        assert w.ask("verify")["same"] is False  # one flipped bit is seen
        assert w.ask("load", str(tmp_path / "missing")).get("error")
        w.ask("quit")
    finally:
        w.stop()


def test_snapshot_bench_skips_without_cuda():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the bench would run")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu-snapshot.py"), "--ferry", "/bin/true"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 77, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.startswith("skipped: torch with CUDA is not available"), p.stdout


def test_shuffled_copies_rows_and_space(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "shuffled-copies.py"), "--dir", str(tmp_path),
                        "--size", "4m", "--sample", "4k", "--copies", "2", "--seconds", "5", "--no-drop",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("TABLE ")]
    names = [l.split("|")[0][6:].strip() for l in rows]
    assert names[1:] == ["sequential", "copies", "block", "shuffle", "target copy >= 0.9x sequential", "space"], names
    assert "not measured (warm)" in rows[5]
    r = json.loads(out.read_text())
    assert [x["samples"] for x in r["rows"]] == [1024] * 4
    sp = r["space"]
    assert sp["copy_shards_bytes"] == 2 * sp["data_bytes"] and sp["data_bytes"] >= 4 << 20, sp
    assert sp["sidecar_bytes"] > 0
    assert rows[6].split("|")[1].strip().startswith("2.0"), rows[6]
