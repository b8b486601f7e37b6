"""bench/vsfio-pool.py: the pooled figures a closing note quotes come from it, so its arithmetic is
tested here on rounds whose answer is known."""
import json
import pathlib
import subprocess
import sys

POOL = pathlib.Path(__file__).resolve().parents[2] / "bench" / "vsfio-pool.py"


def vsfio_json(path, rows):
    """rows: {row: [(fio GB/s, ferry GB/s), ...]} as vs-fio.sh's "raw" holds them."""
    raw = {r: [{"fio": {"gbps": f}, "ferry": {"gbps": y}} for f, y in rounds] for r, rounds in rows.items()}
    path.write_text(json.dumps({"schema_version": 2, "raw": raw}))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(POOL), *args], capture_output=True, text=True)


def test_pools_rounds_of_several_files(tmp_path):
    a = vsfio_json(tmp_path / "a.json", {"read x": [(1.0, 0.90), (1.0, 1.10)], "write y": [(2.0, 1.0)]})
    b = vsfio_json(tmp_path / "b.json", {"read x": [(2.0, 2.0), (1.0, 0.5), (1.0, 1.2)]})
    p = run(a, b)
    assert p.returncode == 0, p.stderr
    lines = {l.split()[0] + " " + l.split()[1]: l.split() for l in p.stdout.splitlines() if l.startswith(("read", "write"))}
    # read x: ratios 0.9, 1.1, 1.0, 0.5, 1.2 -> 5 rounds, median 1.00, range 0.50-1.20, 3 ahead, 3 >= 0.95
    assert lines["read x"][2:] == ["5", "1.00", "0.50-1.20", "3", "3"]
    # write y: one round at 0.5
    assert lines["write y"][2:] == ["1", "0.50", "0.50-0.50", "0", "0"]
    assert "1 of 2 rows with the pooled median at or above 0.95x (2 files)" in p.stdout


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
