"""ferry.checkpoint's load side against damaged and missing checkpoints (issue 20: 3, 7, 8;
issue 21: 5): load_latest verifies and falls back to the newest step that loads, with a warning;
an explicit load of a damaged step raises; a missing directory is an error, not "no checkpoint";
malformed JSON names its file; a refused save leaves nothing behind for the next one."""
import os
import struct
import textwrap
import warnings

import pytest

from conftest import need, run_ranks

torch = need("torch")

import ferry  # noqa: E402
import ferry.checkpoint as ck  # noqa: E402
from ferry import _ferry  # noqa: E402


def shard(d, step, rank=0, world=1):
    return os.path.join(d, "step-%012d" % step, "rank-%05d-of-%05d.safetensors" % (rank, world))


def flip_bit(path, at=0):
    """Flips one bit of the tensor data (byte ``at`` after the header), as a bad disk would."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        f.seek(8 + n + at)
        b = f.read(1)
        f.seek(8 + n + at)
        f.write(bytes([b[0] ^ 0x10]))


def three_steps(d):
    for s in (1, 2, 3):
        ck.save({"w": torch.full((1000,), float(s)), "step": s}, d, s, keep=0)


def test_flipped_bit_in_latest_falls_back_with_a_warning(tmp_path):
    d = str(tmp_path / "ck")
    three_steps(d)
    flip_bit(shard(d, 3), 100)
    with pytest.warns(RuntimeWarning, match=r"step 3 is damaged, loading step 2 instead: .*rank-00000-of-00001"):
        step, state = ck.load_latest(d)
    assert step == 2, step
    assert state["step"] == 2 and torch.equal(state["w"], torch.full((1000,), 2.0)), state
    # verify=False is the caller's choice: the damaged latest comes back as it is on disk
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step, state = ck.load_latest(d, verify=False)
    assert step == 3 and not torch.equal(state["w"], torch.full((1000,), 3.0))


def test_explicit_load_of_a_damaged_step_raises(tmp_path):
    d = str(tmp_path / "ck")
    three_steps(d)
    flip_bit(shard(d, 3))
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 3)
    assert e.value.code == ferry.EVERIFY and "rank-00000-of-00001" in str(e.value), str(e.value)
    assert ck.load(d, 2)["step"] == 2


def test_every_step_damaged_raises(tmp_path):
    d = str(tmp_path / "ck")
    three_steps(d)
    for s in (1, 2, 3):
        flip_bit(shard(d, s), 4 * s)
    with pytest.raises(ferry.Error) as e:
        ck.load_latest(d)
    msg = str(e.value)
    assert e.value.code == ferry.ECORRUPT, msg
    assert "no committed step loads" in msg and all("step %d:" % s in msg for s in (1, 2, 3)), msg


def test_damaged_manifest_or_missing_shard_falls_back(tmp_path):
    d = str(tmp_path / "ck")
    three_steps(d)
    manifest = os.path.join(d, "step-%012d" % 3, "manifest.json")
    with open(manifest, "w") as f:
        f.write("{not json")
    os.remove(shard(d, 2))
    with pytest.warns(RuntimeWarning) as w:
        step, state = ck.load_latest(d)
    assert step == 1 and state["step"] == 1
    text = "\n".join(str(x.message) for x in w)
    assert "step 3 is damaged" in text and "manifest.json" in text, text
    assert "step 2 is damaged" in text and "rank-00000-of-00001.safetensors" in text, text


def test_unreadable_latest_falls_back_to_the_newest_committed_step(tmp_path):
    d = str(tmp_path / "ck")
    three_steps(d)
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("garbage\n")
    with pytest.warns(RuntimeWarning, match="'latest' is damaged, loading step 3"):
        step, _ = ck.load_latest(d)
    assert step == 3


def test_missing_directory_is_an_error(tmp_path):
    d = tmp_path / "chekpoints"  # misspelled
    for call in (ck.load_latest, ck.latest_step):
        with pytest.raises(FileNotFoundError) as e:
            call(d)
        assert e.value.filename == str(d) and "does not exist" in str(e.value), str(e.value)
    assert not d.exists()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        ck.load_latest(f, missing_ok=True)


def test_empty_directory_and_missing_ok(tmp_path):
    d = tmp_path / "new"
    assert ck.load_latest(d, missing_ok=True) == (None, {})
    assert ck.latest_step(d, missing_ok=True) is None
    d.mkdir()
    assert ck.load_latest(d) == (None, {})  # exists, nothing committed yet: no checkpoint yet
    assert ck.latest_step(d) is None


def test_malformed_json_names_the_file(tmp_path):
    d = str(tmp_path / "ck")
    ck.save({"w": torch.arange(10.0), "tag": "AAAA"}, d, 1)
    manifest = os.path.join(d, "step-%012d" % 1, "manifest.json")
    good = open(manifest).read()
    with open(manifest, "w") as f:
        f.write("{not json")
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 1)
    assert manifest in str(e.value) and "byte 1" in str(e.value), str(e.value)
    with open(manifest, "w") as f:
        f.write(good)
    # The structure's JSON in the shard's metadata, broken with the header's length unchanged:
    # {"V":"AAAA"} becomes {"V":AAAAAAAA}.
    p = shard(d, 1)
    raw = open(p, "rb").read()
    i = raw.find(b'\\"AAAA\\"')
    assert i > 0
    with open(p, "r+b") as f:
        f.seek(i)
        f.write(b"AAAAAAAA")
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 1)
    msg = str(e.value)
    assert e.value.code == ferry.ECORRUPT and p in msg and "ferry.tree" in msg and "char " in msg, msg


def test_out_of_range_step_leaves_nothing_added(tmp_path):
    d = str(tmp_path / "ck")
    for bad in (1 << 63, -1):
        with pytest.raises(ValueError, match="step"):
            ck.save({"w": torch.zeros(3)}, d, bad)
    ck.save({"w": torch.ones(3)}, d, 2)
    assert ck.load_latest(d)[0] == 2
    # The extension's handle itself: a step it cannot take forgets the tensors added for it.
    h = _ferry.ckpt_open(ferry.default_context(), str(tmp_path / "raw"), 0, 1)
    x = torch.arange(4.0)
    for bad in (1 << 63, -5):
        h.add("x", "F32", [4], x.data_ptr(), 16)
        with pytest.raises(ValueError, match="from 0 to 2\\*\\*63-1"):
            h.save(bad)
    h.add("x", "F32", [4], x.data_ptr(), 16)
    h.save(2)
    assert torch.equal(ck.load(tmp_path / "raw", 2)["x"], x)


WORKER = textwrap.dedent("""
    import sys, warnings, torch, torch.distributed as dist
    import ferry.checkpoint as ck
    rank, world, store, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        step, s = ck.load_latest(d)
    print("rank", rank, "step", step, "warned", sorted(str(x.message) for x in w))
    assert step == 1 and s["r"] == rank and torch.equal(s["w"], torch.full((100,), float(rank * 10 + 1))), s
    dist.destroy_process_group()
    print("rank", rank, "ok")
""")


def test_distributed_ranks_agree_on_the_fallback(tmp_path):
    """Rank 0's shard of step 3 and rank 1's of step 2 are damaged: both ranks load step 1."""
    dist = need("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch")
    d = str(tmp_path / "ck")
    for s in (1, 2, 3):
        for r in (1, 0):  # rank 0 commits once it sees rank 1's marker
            ck.save({"w": torch.full((100,), float(r * 10 + s)), "r": r}, d, s, rank=r, world_size=2,
                    run="agree", timeout=5, keep=0)
    flip_bit(shard(d, 3, 0, 2))
    flip_bit(shard(d, 2, 1, 2))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    for out in run_ranks(script, 2, tmp_path / "store", d):
        assert "step 3 is damaged" in out and "step 2 is damaged" in out, out


def test_step_saved_without_checksums_loads_by_default(tmp_path):
    # verify=None (the default) checks the checksums a shard holds; checksum=False stored none
    d = str(tmp_path / "ck")
    ck.save({"w": torch.arange(8.0)}, d, 1, checksum=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step, state = ck.load_latest(d)
    assert step == 1 and torch.equal(state["w"], torch.arange(8.0))
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 1, verify=True)  # asked for: a tensor without a checksum fails
    assert e.value.code == ferry.EVERIFY and "no stored checksum" in str(e.value), str(e.value)
