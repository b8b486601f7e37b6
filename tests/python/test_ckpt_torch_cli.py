"""`ferry ckpt inspect` and `ferry ckpt verify` of PyTorch's own files, without Python in the CLI
(issue 24): torch.distributed.checkpoint directories written by the stock FileSystemWriter and by
ferry.dcp.Writer (one process, and two gloo ranks with a sharded DTensor), and torch.save files
(torch.save and ferry.torch.save). Damaged inputs fail naming the file, the offset and the field:
a truncated or missing data file, a flipped byte (crc32), a .metadata naming a global DCP never
writes, a truncated .metadata, a truncated zip, a storage record running past the end."""
import json
import os
import pickle
import struct
import subprocess
import textwrap
import warnings

import pytest

from conftest import ferry_cli as cli_path, need, run_ranks

torch = need("torch")
dcp = need("torch.distributed.checkpoint")
import ferry.dcp as fdcp  # noqa: E402
import ferry.torch as ftorch  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def run(*args):
    p = subprocess.run([cli_path(), "ckpt"] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def state():
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(12, 5, generator=g), "b": {"h": torch.randn(7, generator=g).to(torch.bfloat16),
                                                        "i": torch.arange(6, dtype=torch.int64)},
            "step": 11, "name": "run"}


def save_dcp(d, ferry_writer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = fdcp.Writer(str(d)) if ferry_writer else dcp.FileSystemWriter(str(d))
        dcp.save(state(), storage_writer=w)
    return d


@pytest.mark.parametrize("writer", ["stock", "ferry"])
def test_dcp_inspect_and_verify(tmp_path, writer):
    d = save_dcp(tmp_path / "ck", writer == "ferry")
    rc, out, err = run("inspect", "--json", d)
    assert rc == 0, err
    j = json.loads(out)
    assert j["format"] == "dcp" and j["tensors"] == 3 and j["bytes_items"] == 2, j
    items = {it["fqn"]: it for it in j["items"]}
    assert items["w"]["dtype"] == "float32" and items["w"]["shape"] == [12, 5], items["w"]
    assert items["w"]["bytes"] == 240 and len(items["w"]["pieces"]) == 1
    assert items["b.h"]["dtype"] == "bfloat16" and items["b.i"]["dtype"] == "int64"
    assert items["step"]["kind"] == "bytes"
    names = {f["name"] for f in j["files"]}
    assert names == set(n for n in os.listdir(d) if n.endswith(".distcp")), (names, os.listdir(d))
    assert all(f["size"] == os.path.getsize(d / f["name"]) for f in j["files"])
    rc, out, err = run("inspect", d)
    assert rc == 0 and "w" in out and "float32" in out and "[12, 5]" in out, out + err
    rc, out, err = run("verify", "--json", d)
    j = json.loads(out)
    assert rc == 0 and j["ok"] and j["items"] == 5 and j["crc32_verified"] > 5, (out, err)
    rc, out, err = run("verify", d)
    assert rc == 0 and out.rstrip().endswith("OK"), out + err


def _piece(d, fqn):
    rc, out, _ = run("inspect", "--json", d)
    it = {i["fqn"]: i for i in json.loads(out)["items"]}[fqn]
    return it["pieces"][0]


def _verify_fails(d, *needles):
    rc, out, err = run("verify", "--json", d)
    j = json.loads(out)
    assert rc == 1 and not j["ok"], (out, err)
    text = " | ".join(p["message"] for p in j["problems"])
    for n in needles:
        assert n in text, (n, text)
    return text


def test_dcp_truncated_file(tmp_path):
    d = save_dcp(tmp_path / "ck", True)
    p = _piece(d, "w")
    f = d / p["file"]
    os.truncate(f, p["offset"] + 10)
    _verify_fails(d, str(f), "offset %d" % p["offset"], "item w", "run past the end")


def test_dcp_missing_file(tmp_path):
    d = save_dcp(tmp_path / "ck", False)
    p = _piece(d, "w")
    os.unlink(d / p["file"])
    _verify_fails(d, p["file"], "missing")


def test_dcp_flipped_byte(tmp_path):
    d = save_dcp(tmp_path / "ck", True)
    p = _piece(d, "w")
    f = d / p["file"]
    blob = bytearray(f.read_bytes())
    item = blob[p["offset"]:p["offset"] + p["length"]]
    # the tensor's 240 bytes are the item's data/0 record: flip one of them
    at = p["offset"] + item.index(struct.pack("<f", state()["w"][0, 0].item()))
    blob[at] ^= 0x40
    f.write_bytes(bytes(blob))
    _verify_fails(d, str(f), "crc32", "data/0")


def test_dcp_forbidden_global(tmp_path):
    d = save_dcp(tmp_path / "ck", False)
    with open(d / ".metadata", "rb") as fh:
        md = pickle.load(fh)
    md.planner_data = {"w": os.getcwd}  # a pickle naming posix.getcwd: never in DCP's classes
    blob = pickle.dumps(md)
    (d / ".metadata").write_bytes(blob)
    at = blob.index(b"getcwd")
    for cmd in ("inspect", "verify"):
        rc, out, err = run(cmd, d)
        assert rc == 1 and ".metadata: offset " in err and "global posix.getcwd" in err, out + err
        off = int(err.split(".metadata: offset ")[1].split(":")[0])
        assert at - 16 <= off <= at + 8, (off, at, err)


def test_dcp_truncated_metadata(tmp_path):
    d = save_dcp(tmp_path / "ck", True)
    blob = (d / ".metadata").read_bytes()
    (d / ".metadata").write_bytes(blob[:len(blob) // 2])
    rc, out, err = run("verify", "--json", d)
    j = json.loads(out)
    assert rc == 1 and not j["ok"], out + err
    assert ".metadata: offset" in j["problems"][0]["message"], j


RANKS = textwrap.dedent(r'''
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    import ferry.dcp
    rank, world, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    big = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)
    dcp.save({"big": distribute_tensor(big, mesh, [Shard(0)]), "r": torch.ones(2)},
             storage_writer=ferry.dcp.Writer(path))
    dist.destroy_process_group()
    print("rank %d ok" % rank)
''')


def test_dcp_two_ranks_sharded(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    d = tmp_path / "ck"
    run_ranks(script, 2, port, d)
    rc, out, err = run("inspect", "--json", d)
    j = json.loads(out)
    big = {i["fqn"]: i for i in j["items"]}["big"]
    assert big["shape"] == [40, 3] and len(big["pieces"]) == 2, big
    assert sorted(p["offsets"] for p in big["pieces"]) == [[0, 0], [20, 0]], big
    assert {p["file"] for p in big["pieces"]} == {"__0_0.distcp", "__1_0.distcp"}, big
    rc, out, err = run("verify", d)
    assert rc == 0 and out.rstrip().endswith("OK"), out + err


@pytest.mark.parametrize("writer", ["torch", "ferry"])
def test_torch_save_inspect_and_verify(tmp_path, writer):
    p = tmp_path / "m.pt"
    base = torch.arange(20, dtype=torch.float32)
    obj = {"layer": {"weight": torch.randn(4, 3), "view": base[2:10].view(2, 4).t()},
           "p": torch.nn.Parameter(torch.zeros(3, dtype=torch.float16)), "f8": torch.zeros(5, dtype=torch.float8_e4m3fn)}
    (ftorch.save if writer == "ferry" else torch.save)(obj, p)
    rc, out, err = run("inspect", "--json", p)
    assert rc == 0, err
    j = json.loads(out)
    t = {x["name"]: x for x in j["tensors"]}
    assert set(t) == {"layer.weight", "layer.view", "p", "f8"}, t
    assert t["layer.view"]["shape"] == [4, 2] and t["layer.view"]["stride"] == [1, 4], t["layer.view"]
    assert t["layer.view"]["storage_offset"] == 2 and t["layer.view"]["dtype"] == "float32"
    assert t["p"]["dtype"] == "float16" and t["f8"]["dtype"] == "float8_e4m3fn"
    assert j["storages"] == 4 and j["storage_bytes"] == 48 + 80 + 6 + 5, j
    rc, out, err = run("verify", "--json", p)
    j = json.loads(out)
    assert rc == 0 and j["ok"] and j["crc32_verified"] == j["records"], out + err


def test_torch_save_damaged(tmp_path):
    p = tmp_path / "m.pt"
    torch.save({"w": torch.arange(64, dtype=torch.float32)}, p)
    blob = p.read_bytes()
    # a flipped storage byte: the record's crc32, at the record's offset
    at = blob.index(struct.pack("<f", 33.0))
    bad = bytearray(blob)
    bad[at] ^= 1
    p.write_bytes(bytes(bad))
    rc, out, err = run("verify", p)
    assert rc == 1 and "record" in err and "data/0" in err and "crc32" in err, out + err
    # truncated: the end records are gone
    p.write_bytes(blob[:len(blob) - 30])
    rc, out, err = run("verify", p)
    assert rc == 1 and "end of central directory" in err and str(p) in err, out + err
    # a storage record whose size runs past the end: data/0's size in the central directory
    cd = blob.rindex(b"PK\x01\x02", 0, blob.index(b"PK\x05\x06"))
    while not blob[cd + 46:].startswith(b"m/data/0") and cd > 0:
        cd = blob.rindex(b"PK\x01\x02", 0, cd)
    bad = bytearray(blob)
    struct.pack_into("<II", bad, cd + 20, 1 << 30, 1 << 30)
    p.write_bytes(bytes(bad))
    for cmd in ("inspect", "verify"):
        rc, out, err = run(cmd, p)
        assert rc == 1 and "record m/data/0" in err and "run past" in err and "offset" in err, out + err
