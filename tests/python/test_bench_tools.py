"""bench/vsfio-pool.py: the pooled figures a closing note quotes come from it, so its arithmetic is
tested here on rounds whose answer is known."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
POOL = ROOT / "bench" / "vsfio-pool.py"


def vsfio_json(path, rows):
    """rows: {row: [(fio GB/s, ferry GB/s[, fio cpu-s/GB, ferry cpu-s/GB]), ...]} as vs-fio.sh's
    "raw" holds them."""
    def tool(gbps, cpu):
        return {"gbps": gbps, **({"cpu_s_per_gb": cpu} if cpu is not None else {})}
    raw = {r: [{"fio": tool(x[0], x[2] if len(x) > 2 else None), "ferry": tool(x[1], x[3] if len(x) > 2 else None)}
               for x in rounds] for r, rounds in rows.items()}
    path.write_text(json.dumps({"schema_version": 2, "raw": raw}))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(POOL), *args], capture_output=True, text=True)


def test_pools_rounds_of_several_files(tmp_path):
    a = vsfio_json(tmp_path / "a.json", {"read x": [(1.0, 0.90, 1.0, 1.2), (1.0, 1.10, 2.0, 2.0)],
                                         "write y": [(2.0, 1.0)]})
    b = vsfio_json(tmp_path / "b.json", {"read x": [(2.0, 2.0, 1.0, 1.04), (1.0, 0.5), (1.0, 1.2)]})
    p = run(a, b)
    assert p.returncode == 0, p.stderr
    lines = {l.split()[0] + " " + l.split()[1]: l.split() for l in p.stdout.splitlines() if l.startswith(("read", "write"))}
    # read x: ratios 0.9, 1.1, 1.0, 0.5, 1.2 -> 5 rounds, median 1.00, range 0.50-1.20, 3 ahead, 3 >= 0.95;
    # CPU per GB in 3 of them: 1.2, 1.0, 1.04 -> median 1.04, within 1.05
    assert lines["read x"][2:] == ["5", "1.00", "0.50-1.20", "3", "3", "1.04", "yes"]
    # write y: one round at 0.5, no CPU figures
    assert lines["write y"][2:] == ["1", "0.50", "0.50-0.50", "0", "0", "-", "-"]
    assert ("1 of 2 rows with the pooled median at or above 0.95x; 1 of 2 with the median of the rounds' "
            "CPU per GB at most 1.05x fio's (2 files)") in p.stdout


def test_cpu_above_the_mark_is_named(tmp_path):
    a = vsfio_json(tmp_path / "a.json", {"read x": [(1.0, 1.0, 1.0, 1.10), (1.0, 1.0, 1.0, 1.06)]})
    p = run(a)
    assert p.returncode == 0, p.stderr
    row = [l.split() for l in p.stdout.splitlines() if l.startswith("read x")][0]
    assert row[-2:] == ["1.08", "NO"]
    assert "0 of 1 with the median of the rounds' CPU per GB" in p.stdout


def test_failed_rounds_are_left_out(tmp_path):
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"raw": {"read x": [{"fio": {"error": "boom"}, "ferry": {"gbps": 1.0}},
                                                {"fio": {"gbps": 1.0}, "ferry": {"gbps": 0.96}}]}}))
    p = run(str(f))
    assert p.returncode == 0, p.stderr
    assert "read x" in p.stdout and " 1    0.96" in p.stdout


def test_bad_input_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    p = run(str(bad))
    assert p.returncode == 1 and "bad.json: not a vs-fio.sh JSON file" in p.stderr
    empty = vsfio_json(tmp_path / "empty.json", {"read x": [(1.0, 1.0)]})
    p = run("--variant", "nope", empty)
    assert p.returncode == 1 and "no rounds of 'nope'" in p.stderr


def fio_and_ferry():
    """fio's and ferry's paths for a test that runs bench/vs-fio.sh, or the test is skipped."""
    fio = shutil.which("fio")
    ferry = os.environ.get("FERRY_CLI") or str(ROOT / "build" / "ferry")
    if not fio:
        pytest.skip("fio is not installed (scripts/setup.sh installs it)")
    if not os.access(ferry, os.X_OK):
        pytest.skip(f"{ferry} not built (cmake --build build, or set FERRY_CLI)")
    return fio, ferry


def test_vsfio_runs_fio_variants_and_notes_where_jobs_ran(tmp_path):
    """bench/vs-fio.sh with FIO_VARIANTS and --where: every tool's run is in the JSON, each with
    the CPUs its busiest thread was seen on."""
    fio, ferry = fio_and_ferry()
    out = tmp_path / "v.json"
    env = dict(os.environ, FIO=fio, FERRY=ferry, FIO_VARIANTS="fio-thread:--thread")
    p = subprocess.run(["bash", str(ROOT / "bench" / "vs-fio.sh"), "--dir", str(tmp_path), "--size", "8m",
                        "--runtime", "1", "--rounds", "1", "--rows", "read rand 4KiB QD1 buffered", "--where",
                        "--json", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "read rand 4KiB QD1 buffered [fio-thread]" in p.stdout
    j = json.loads(out.read_text())
    assert j["fio_variants"] == {"fio-thread": {"env": {}, "args": ["--thread"]}}
    (rnd,) = j["raw"]["read rand 4KiB QD1 buffered"]
    assert set(rnd) == {"fio", "ferry", "fio-thread"}
    for tool, got in rnd.items():
        assert got["gbps"] > 0, tool
        w = got["where"]
        assert sum(w["cpus"].values()) >= 1 and all(0 <= int(c) < os.cpu_count() for c in w["cpus"]), (tool, w)
        assert w["nr_voluntary_switches"] >= 0, (tool, w)


def test_vsfio_variant_rows_limit_variants_and_runs_note_latency(tmp_path):
    """VARIANT_ROWS runs the variants on the named rows only; each run records its latency and the
    dirty page cache before it; a row that is not run is refused."""
    fio, ferry = fio_and_ferry()
    out = tmp_path / "v.json"
    rows = "read rand 4KiB QD1 buffered,write rand 4KiB QD1 buffered"
    env = dict(os.environ, FIO=fio, FERRY=ferry, FERRY_VARIANTS="again:", FIO_VARIANTS="fio7:--randseed=7",
               VARIANT_ROWS="write rand 4KiB QD1 buffered")
    cmd = ["bash", str(ROOT / "bench" / "vs-fio.sh"), "--dir", str(tmp_path), "--size", "8m", "--runtime", "1",
           "--rounds", "1", "--rows", rows, "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(out.read_text())
    assert j["variant_rows"] == ["write rand 4KiB QD1 buffered"]
    assert list(j["raw"]["read rand 4KiB QD1 buffered"][0]) == ["fio", "ferry"]
    assert set(j["raw"]["write rand 4KiB QD1 buffered"][0]) == {"fio", "ferry", "again", "fio7"}
    assert {s["row"] + "/" + s["variant"] for s in j["summary"]} == {
        "read rand 4KiB QD1 buffered/ferry", "write rand 4KiB QD1 buffered/ferry",
        "write rand 4KiB QD1 buffered/again", "write rand 4KiB QD1 buffered/fio7"}
    for row in j["raw"].values():
        for tool, got in row[0].items():
            assert got["lat"]["lat_mean_ns"] > 0 and got["lat"]["clat_p50_ns"] > 0, (tool, got)
            assert got["before"]["dirty_kb"] >= 0, (tool, got)
    assert not (tmp_path / "v.json.partial").exists()
    env["VARIANT_ROWS"] = "read seq 1MiB QD32 direct"
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0 and "VARIANT_ROWS names rows not run" in p.stderr, p.stdout + p.stderr


def test_nvcomp_codecs_bench_skips_without_a_gpu(tmp_path):
    """bench/gpu-nvcomp-codecs.sh and bench/nvcomp-codecs.py (issue 26's comparison of nvCOMP's own
    formats, run on the GPU machine) say skipped, with the reason, and exit 77 where there is no CUDA
    device, no nvCOMP Python module or no staged wheel, as every GPU bench here does."""
    env = dict(os.environ, FERRY_LOG_DIR=str(tmp_path), FERRY_BUILD_DIR=str(tmp_path / "b"),
               CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "nvcomp-codecs.py"), "--mib", "1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 77, p.stdout + p.stderr
    assert "skipped: " in p.stdout and "TABLE nvcomp-codecs setup | skipped | " in p.stdout, p.stdout
    p = subprocess.run(["bash", str(ROOT / "bench" / "gpu-nvcomp-codecs.sh")], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 77, p.stdout + p.stderr
    assert "skipped" in p.stdout, p.stdout
