"""Compressed checkpoints (issue 26; docs/CHECKPOINTS.md, "Compressed checkpoints"):
ferry.checkpoint.save(..., compress=) writes each shard in ferry's compressed format
(rank-R-of-W.safetensors.fz), and load, load_latest, verify, ferry.safetensors and the CLI read it
back bit-exact; damaged and truncated shards fail naming the shard and the chunk."""
import json
import os
import subprocess

import pytest

from conftest import ferry_cli as cli, need

torch = need("torch")

import ferry  # noqa: E402
import ferry.checkpoint as ck  # noqa: E402
import ferry.safetensors as fst  # noqa: E402

CODECS = ["zstd", "lz4", "auto", True]


def state():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 384, generator=g) * 0.02)
    return {
        "model": {
            "embed": w.to(torch.bfloat16),                       # compresses with zstd
            "proj": torch.randn(300, 70, generator=g),           # fp32: random mantissas
            "zeros": torch.zeros(1 << 18, dtype=torch.bfloat16),  # long runs
            "bias": torch.arange(1000, dtype=torch.float32),
        },
        "optim": {"step": torch.tensor(7, dtype=torch.int64),
                  "ids": torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int32, generator=g),
                  "mask": torch.zeros(0, 3, dtype=torch.int64)},  # empty tensor
        "epoch": 3,
    }


def equal(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b), (path, sorted(a), sorted(b))
        for k in a:
            equal(a[k], b[k], path + "." + k)
    else:
        assert a == b, (path, a, b)


def shard_of(d, step, rank=0, world=1):
    return os.path.join(d, "step-%012d" % step, "rank-%05d-of-%05d.safetensors" % (rank, world))


def manifest(d, step):
    with open(os.path.join(d, "step-%012d" % step, "manifest.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip(tmp_path, codec):
    d = str(tmp_path / "ck")
    s = state()
    ck.save(s, d, step=5, compress=codec)
    plain, fz = shard_of(d, 5), shard_of(d, 5) + ".fz"
    assert not os.path.exists(plain) and os.path.exists(fz)
    want = "zstd" if codec in ("auto", True) else codec
    assert ferry.is_compressed(fz)
    with ferry.CompressedFile(fz) as z:
        assert z.codec == want
    m = manifest(d, 5)
    assert m["shards"] == [{"file": os.path.basename(fz), "bytes": os.path.getsize(fz), "codec": want}]
    equal(s, ck.load(d, 5))
    equal(s, ck.load(d, 5, verify=True))  # the chunks' checksums stand for per-tensor ones
    step, back = ck.load_latest(d)
    assert step == 5
    equal(s, back)
    assert ck.verify(d, require_checksums=True) == 5
    # ferry.safetensors reads the shard through ferry (a safetensors file inside ferry's format)
    flat, _ = ck.flatten(s)
    got = fst.load_file(fz)
    assert sorted(got) == sorted(flat)
    for k in flat:
        assert torch.equal(got[k], flat[k]), k
    with fst.safe_open(fz, "pt") as f:
        assert torch.equal(f.get_tensor("model.bias"), flat["model.bias"])


def test_zstd_ratio_and_plain_next(tmp_path):
    """bf16 weights compress under zstd; compress=None after a compressed save writes a plain
    safetensors shard again (the knob is per save, the directory's handle outlives it), and both
    steps load."""
    d = str(tmp_path / "ck")
    w = {"w": (torch.randn(1 << 20) * 0.02).to(torch.bfloat16)}
    ck.save(w, d, 1, compress="zstd")
    fz = shard_of(d, 1) + ".fz"
    assert os.path.getsize(fz) < 0.85 * w["w"].numel() * 2, os.path.getsize(fz)
    ck.save(w, d, 2)
    assert os.path.exists(shard_of(d, 2)) and not os.path.exists(shard_of(d, 2) + ".fz")
    assert "codec" not in manifest(d, 2)["shards"][0]
    with open(shard_of(d, 2), "rb") as f:  # plain: the stock reader's file
        assert int.from_bytes(f.read(8), "little") < 100_000_000
    for step in (1, 2):
        assert torch.equal(ck.load(d, step)["w"], w["w"])


def test_async_save_compressed(tmp_path):
    d = str(tmp_path / "ck")
    s = {"a": torch.randn(1 << 16), "b": torch.arange(1 << 16, dtype=torch.int64)}
    want = {k: v.clone() for k, v in s.items()}
    h = ck.async_save(s, d, 3, compress="lz4")
    s["a"].zero_()  # the snapshot was taken
    h.wait()
    equal(want, ck.load(d, 3))


def test_two_ranks_mixed_codecs(tmp_path):
    """The manifest records each shard's codec: rank 1 compressed, rank 0 plain."""
    d = str(tmp_path / "ck")
    a, b = {"x": torch.arange(10.0)}, {"y": torch.arange(20, dtype=torch.int32)}
    ck.save(b, d, 1, rank=1, world_size=2, compress="zstd", run="r")
    ck.save(a, d, 1, rank=0, world_size=2, run="r")
    m = manifest(d, 1)
    assert [s.get("codec") for s in m["shards"]] == [None, "zstd"]
    assert m["shards"][1]["file"].endswith(".safetensors.fz")
    equal(b, ck.load(d, 1, rank=1))
    equal({**a, **b}, ck.load(d, 1, rank="all"))
    assert ck.verify(d, 1) == 1


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        c = f.read(1)
        f.seek(offset)
        f.write(bytes([c[0] ^ 0x55]))


def test_corrupted_chunk_names_shard_and_chunk(tmp_path):
    d = str(tmp_path / "ck")
    s = {"w": (torch.randn(1 << 20) * 0.02).to(torch.bfloat16)}  # 2 MiB: chunks 0-2 at 1 MiB
    ck.save(s, d, 1, compress="zstd")
    ck.save(s, d, 2, compress="zstd")
    fz = shard_of(d, 2) + ".fz"
    with ferry.CompressedFile(fz) as z:
        assert z.chunks >= 2
    flip(fz, os.path.getsize(fz) // 2)  # inside a chunk's frame
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 2)
    assert e.value.name == "FERRY_ECORRUPT"
    assert os.path.basename(fz) in str(e.value) and "chunk " in str(e.value), str(e.value)
    with pytest.raises(ferry.Error) as e:
        ck.verify(d, 2)
    assert os.path.basename(fz) in str(e.value) and "chunk " in str(e.value), str(e.value)
    with pytest.warns(RuntimeWarning, match="step 2 is damaged"):
        step, back = ck.load_latest(d)  # the damaged step is passed over for the one before
    assert step == 1 and torch.equal(back["w"], s["w"])


def test_truncated_shard_names_shard(tmp_path):
    d = str(tmp_path / "ck")
    ck.save({"w": torch.randn(1 << 18)}, d, 1, compress="lz4")
    fz = shard_of(d, 1) + ".fz"
    with open(fz, "r+b") as f:
        f.truncate(os.path.getsize(fz) - 100)
    with pytest.raises(ferry.Error) as e:
        ck.load(d, 1)
    assert e.value.name == "FERRY_ECORRUPT" and os.path.basename(fz) in str(e.value), str(e.value)
    with pytest.raises(ferry.Error) as e:
        ck.verify(d, 1)
    assert os.path.basename(fz) in str(e.value), str(e.value)


def test_manifest_codec_checked(tmp_path):
    """verify compares the manifest's codec with the file's."""
    d = str(tmp_path / "ck")
    ck.save({"w": torch.arange(100.0)}, d, 1, compress="zstd")
    mp = os.path.join(d, "step-%012d" % 1, "manifest.json")
    m = manifest(d, 1)
    m["shards"][0]["codec"] = "lz4"
    with open(mp, "w") as f:
        json.dump(m, f)
    with pytest.raises(ferry.Error) as e:
        ck.verify(d, 1)
    assert "zstd, manifest.json says lz4" in str(e.value), str(e.value)


def test_bad_compress_value(tmp_path):
    with pytest.raises(ValueError, match="compress"):
        ck.save({"w": torch.zeros(1)}, str(tmp_path / "ck"), 1, compress="gzip")


def test_cli_verify_and_inspect(tmp_path):
    exe = cli()
    d = str(tmp_path / "ck")
    ck.save(state(), d, 4, compress="zstd")
    r = subprocess.run([exe, "ckpt", "verify", d], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([exe, "ckpt", "inspect", d], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "zstd" in r.stdout and "model.embed" in r.stdout, r.stdout
    flip(shard_of(d, 4) + ".fz", 200)
    r = subprocess.run([exe, "ckpt", "verify", d], capture_output=True, text=True)
    assert r.returncode != 0 and "chunk 0" in r.stdout + r.stderr, r.stdout + r.stderr


def test_cli_ckpt_bench_compress(tmp_path):
    exe = cli()
    r = subprocess.run([exe, "ckpt", "bench", "--host", "--size", "1m", "--loads", "1", "--saves", "1",
                        "--dir", str(tmp_path), "--compress", "zstd", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    assert 1.15 < o["ratio"] < 1.45, o  # bf16 randn x 0.02 under zstd: 1.28 (PERFORMANCE.md)
    assert o["decoded"] == "cpu (host memory)" and o["effective_gbps"] > o["compressed_gbps"], o
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # its checkpoint removed


def test_stock_zstd_gives_the_safetensors_file(tmp_path):
    """The shard is standard zstd frames holding a safetensors file: `zstd -d` and Hugging Face's
    reader give the state back (docs/FORMATS.md, "Compressed checkpoints")."""
    import shutil
    st = pytest.importorskip("safetensors.torch", reason="the safetensors package is not installed")
    if not shutil.which("zstd"):
        pytest.skip("no zstd command here")
    d = str(tmp_path / "ck")
    s = {"a": (torch.randn(70000) * 0.02).to(torch.bfloat16), "b": torch.arange(5000, dtype=torch.int64)}
    ck.save(s, d, 1, compress="zstd")
    out = str(tmp_path / "plain.safetensors")
    subprocess.run(["zstd", "-q", "-d", shard_of(d, 1) + ".fz", "-o", out], check=True)
    back = st.load_file(out)
    assert sorted(back) == ["a", "b"] and all(torch.equal(back[k], s[k]) for k in s)


def test_compressed_save_to_a_url_refused(tmp_path):
    """Compressed shards are local files for now: a save under s3:// says so before any request."""
    with pytest.raises(OSError) as e:  # EOPNOTSUPP
        ck.save({"w": torch.zeros(4)}, "s3://bucket/ckpts", 1, compress="zstd", timeout=1)
    assert "compressed checkpoints under a URL are not supported" in str(e.value), str(e.value)
