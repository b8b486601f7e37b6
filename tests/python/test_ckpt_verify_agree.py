"""One set of rules for checkpoint verification (issue 20 finding 7, issue 21 item 4): every case
of a table of valid and damaged checkpoint steps, written by ferry.checkpoint.save (multi-rank
through rank=/world_size=, no torch.distributed), is checked through the built CLI
(``ferry ckpt verify --json``) and through ferry.checkpoint.verify, and both must agree: pass or
fail alike, with the same first problem."""
import json
import os
import shutil
import struct
import subprocess

import pytest

from conftest import ferry_cli as cli_path, need

torch = need("torch")
import ferry  # noqa: E402
import ferry.checkpoint as fc  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
STEP = "step-%012d"


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}


def save(d, step, world=1, run="runA", seed=0):
    # the other ranks first: rank 0 commits once their markers are in
    for r in reversed(range(world)):
        fc.save(state(seed + r), d, step, rank=r, world_size=world, run=run, keep=0)


def shard(d, step, rank=0, world=1):
    return os.path.join(d, STEP % step, "rank-%05d-of-%05d.safetensors" % (rank, world))


def manifest(d, step):
    return os.path.join(d, STEP % step, "manifest.json")


def edit_manifest(d, step, fn):
    with open(manifest(d, step)) as f:
        m = json.load(f)
    fn(m)
    with open(manifest(d, step), "w") as f:
        json.dump(m, f)


def untie(path):
    """The shard as ferry wrote it before it stored ferry.step/run/rank/world: same data, same offsets."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    for k in ("ferry.step", "ferry.run", "ferry.rank", "ferry.world"):
        head["__metadata__"].pop(k)
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + text + raw[8 + n:])


def flip_last_byte(path):
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))


def case_valid_1(d, tmp):
    save(d, 1)
    return 1


def case_valid_2(d, tmp):
    save(d, 1, world=2)
    return 1


def case_untied(d, tmp):
    save(d, 1)
    untie(shard(d, 1))
    return 1


def case_manifest_deleted(d, tmp):
    save(d, 1)
    os.remove(manifest(d, 1))
    return 1


def case_world_2_one_shard(d, tmp):
    save(d, 1)
    edit_manifest(d, 1, lambda m: m.update(world=2))
    return 1


def case_wrong_bytes(d, tmp):
    save(d, 1, world=2)
    edit_manifest(d, 1, lambda m: m["shards"][1].update(bytes=m["shards"][1]["bytes"] + 1))
    return 1


def case_missing_shard(d, tmp):
    save(d, 1, world=2)
    os.remove(shard(d, 1, 1, 2))
    return 1


def case_other_step(d, tmp):
    save(d, 1, world=2)
    save(d, 2, world=2)
    shutil.copyfile(shard(d, 1, 1, 2), shard(d, 2, 1, 2))
    return 2


def case_other_run(d, tmp):
    other = os.path.join(tmp, "other")
    save(d, 1, run="runA")
    save(other, 1, run="runB")
    shutil.copyfile(shard(other, 1), shard(d, 1))
    return 1


def case_flipped_bit(d, tmp):
    save(d, 1, world=2)
    flip_last_byte(shard(d, 1, 1, 2))
    return 1


def case_manifest_not_json(d, tmp):
    save(d, 1)
    with open(manifest(d, 1), "w") as f:
        f.write('{"format": "ferry-checkpoint-1", "world": 1,, }')
    return 1


def case_truncated_shard(d, tmp):
    save(d, 1)
    p = shard(d, 1)
    os.truncate(p, os.path.getsize(p) - 100)
    return 1


# name, case, passes, what the first problem says
CASES = [
    ("valid 1-rank", case_valid_1, True, None),
    ("valid 2-rank", case_valid_2, True, None),
    ("untied shard (saved before ferry.step metadata)", case_untied, True, None),
    ("manifest deleted", case_manifest_deleted, False, "not committed"),
    ("world=2 with one shard", case_world_2_one_shard, False, "1 shards listed for a world of 2"),
    ("wrong bytes", case_wrong_bytes, False, "manifest.json says"),
    ("shard missing", case_missing_shard, False, "listed in manifest.json but missing"),
    ("shard from another step", case_other_step, False, 'metadata ferry.step is "1", expected "2"'),
    ("shard from another run", case_other_run, False, 'metadata ferry.run is "runB", expected "runA"'),
    ("flipped data bit", case_flipped_bit, False, "xxh3"),
    ("manifest not JSON", case_manifest_not_json, False, "manifest.json: byte"),
    ("truncated shard", case_truncated_shard, False, "manifest.json says"),
]


@pytest.mark.parametrize("name,case,passes,says", CASES, ids=[c[0] for c in CASES])
def test_cli_and_python_agree(tmp_path, name, case, passes, says):
    cli = cli_path()
    d = str(tmp_path / "ck")
    step = case(d, str(tmp_path))

    p = subprocess.run([cli, "ckpt", "verify", "--json", "--step", str(step), d], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    out = json.loads(p.stdout)
    cli_ok = p.returncode == 0
    assert out["ok"] == cli_ok, out

    py_err = None
    try:
        assert fc.verify(d, step) == step
    except (ferry.Error, OSError) as e:
        py_err = e
    py_ok = py_err is None

    assert cli_ok == py_ok, "%s: CLI %s, Python %s (%s; %s)" % (name, cli_ok, py_ok, out, py_err)
    assert cli_ok == passes, "%s: expected %s, got %s: %s" % (name, passes, cli_ok, out)
    if passes:
        assert out["problems"] == [] and out["failed"] == 0, out
        assert out["files"] == out["world"] >= 1, out
        assert out["untied"] == (1 if "untied" in name else 0), out
        return
    first = out["problems"][0]["message"]
    assert says in first, "%s: %r not in the CLI's first problem %r" % (name, says, first)
    assert first in str(py_err), "%s: CLI says %r, Python %r" % (name, first, str(py_err))
    assert out["problem_count"] == len(out["problems"]) >= 1, out


def test_report_lists_every_problem(tmp_path):
    """Two problems in one step (wrong bytes on one shard, a flipped bit in the other): both
    reported, the return code the first one's."""
    cli = cli_path()
    d = str(tmp_path / "ck")
    save(d, 1, world=2)
    edit_manifest(d, 1, lambda m: m["shards"][0].update(bytes=1))
    flip_last_byte(shard(d, 1, 1, 2))
    p = subprocess.run([cli, "ckpt", "verify", "--json", d], capture_output=True, text=True, timeout=60)
    out = json.loads(p.stdout)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    msgs = [x["message"] for x in out["problems"]]
    assert len(msgs) == 2 and "manifest.json says 1" in msgs[0] and "xxh3" in msgs[1], msgs
    assert out["failed"] == 1 and out["verified"] == 3, out
    with pytest.raises(ferry.Error) as e:
        fc.verify(d, 1)
    assert e.value.code == ferry.ECORRUPT and msgs[0] in str(e.value), str(e.value)
