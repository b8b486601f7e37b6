"""The loader over compressed shards (issue 26, docs/DATA.md "Sample orders"): the chunk window
(runs of chunks permuted, a window of them shuffled together) gives every sample once an epoch,
window by window, deterministic for a seed and epoch, resumable exactly mid-epoch; each chunk is
decoded about once an epoch (the metric chunk_decodes), where the full shuffle decodes one a
sample; sequential reads give the plain shards' batches; a damaged chunk is named."""
import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
torch = pytest.importorskip("torch")
import ferry  # noqa: E402

N = 6000
MIB = 1 << 20


def _write(d, codec):
    plain, cz = d / "plain", d / codec
    if not (plain / "ferry.idx").exists():
        rng = np.random.default_rng(5)
        ferry.write_dataset(plain, [(rng.zipf(1.3, int(rng.integers(100, 900))) % 50000).astype(np.uint16)
                                    for _ in range(N)], shard_size=5 * MIB // 2)
    cz.mkdir()
    for f in sorted(os.listdir(plain)):
        if f.endswith(".fsh"):
            ferry.compress_file(plain / f, cz / f, codec=codec, chunk="1m")
    (cz / "ferry.idx").write_bytes((plain / "ferry.idx").read_bytes())
    return plain, cz


@pytest.fixture(scope="module", params=["zstd", "lz4"])
def sets(tmp_path_factory, request):
    return _write(tmp_path_factory.mktemp("cz"), request.param)


def run(path, epoch=0, stats=False, **kw):
    kw.setdefault("seed", 3)
    ld = ferry.Loader(path, batch_size=16, device="cpu", **kw)
    ld.set_epoch(epoch)
    out, data = [], []
    for b in ld:
        out += ld.last_indices.tolist()
        data.append(b)
    st = ld.stats()
    ld.close()
    return (out, data, st) if stats else out


def units(plain):
    ds = ferry.IndexedDataset(plain)
    sh, off = np.asarray(ds._shard, dtype=np.int64), np.asarray(ds._off, dtype=np.int64)
    per_shard = {}
    for s in np.unique(sh):
        per_shard[int(s)] = int(off[sh == s].max()) // MIB + 1
    base, acc = {}, 0
    for s in sorted(per_shard):
        base[s], acc = acc, acc + per_shard[s]
    return np.array([base[int(s)] + int(o) // MIB for s, o in zip(sh, off)]), acc


def test_every_sample_once_window_by_window(sets):
    plain, cz = sets
    unit, nu = units(plain)
    assert nu >= 6, nu
    for w in (1, 2, nu):
        got = run(cz, chunk_window=w)
        assert sorted(got) == list(range(N)), w
        # the units in their first-seen order, w at a time: each window's samples are exactly
        # those units' samples, one window after the other
        seen = list(dict.fromkeys(int(unit[i]) for i in got))
        assert sorted(seen) == sorted(set(unit.tolist()))
        pos = 0
        for k in range(0, len(seen), w):
            win = set(seen[k:k + w])
            count = int(np.isin(unit, list(win)).sum())
            assert set(int(unit[i]) for i in got[pos:pos + count]) == win, (w, k)
            pos += count
        assert pos == N
    got = run(cz, chunk_window=2)
    assert got != sorted(got)


def test_default_is_the_chunk_window_and_deterministic(sets):
    plain, cz = sets
    a = run(cz)
    assert a == run(cz, chunk_cache="64m")  # the default: 64 - 16 - 1 units a window, all of this set
    assert a == run(cz) and sorted(a) == list(range(N))
    assert run(cz, epoch=1) != a and sorted(run(cz, epoch=1)) == list(range(N))
    # 6 MiB: 6 units, 3 kept for a batch crossing windows, 1 spare: windows of 2
    assert run(cz, chunk_cache="6m") == run(cz, chunk_window=2)
    # chunk_window=0: the full shuffle, DistributedSampler's order, as over the plain shards
    want = ferry.distributed_indices(N, 1, 0, seed=3, epoch=0).tolist()
    assert run(cz, chunk_window=0) == want == run(plain)
    # plain shards: the knob changes nothing
    assert run(plain, chunk_window=2) == want


def test_samples_equal_plain_and_chunks_decoded_once(sets):
    plain, cz = sets
    ds = ferry.IndexedDataset(plain)
    idx, data, st = run(cz, chunk_window=2, stats=True)
    pos = 0
    for b in data:
        d, offs = b
        for k in range(len(offs) - 1):
            assert np.array_equal(d[offs[k]:offs[k + 1]].numpy(), ds[idx[pos]]), idx[pos]
            pos += 1
    chunks = sum(ferry.CompressedFile(cz / f).chunks for f in os.listdir(cz) if f.endswith(".fsh"))
    # each chunk once, plus at most a head of the next for each unit (a sample crossing out)
    assert chunks <= st["chunk_decodes"] <= 2 * chunks, (st["chunk_decodes"], chunks)
    total = sum(ferry.CompressedFile(cz / f).size for f in os.listdir(cz) if f.endswith(".fsh"))
    assert st["chunk_decoded_bytes"] < 1.2 * total, (st["chunk_decoded_bytes"], total)
    # the full shuffle through a cache too small to keep the dataset decodes far more
    _, _, full = run(cz, chunk_window=0, chunk_cache="2m", stats=True)
    assert full["chunk_decodes"] > 10 * chunks, full["chunk_decodes"]


def test_sequential_equals_plain(sets):
    plain, cz = sets
    for seq_len in (None, 300):
        a = ferry.Loader(plain, batch_size=16, seq_len=seq_len, device="cpu", shuffle=False)
        b = ferry.Loader(cz, batch_size=16, seq_len=seq_len, device="cpu", shuffle=False)
        n = 0
        for x, y in zip(a, b):
            if seq_len is None:
                assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
            else:
                assert torch.equal(x, y)
            n += 1
        assert n == len(a) == len(b)
        st = b.stats()
        chunks = sum(ferry.CompressedFile(cz / f).chunks for f in os.listdir(cz) if f.endswith(".fsh"))
        assert st["chunk_decodes"] <= 2 * chunks, (st["chunk_decodes"], chunks)


def test_token_windows_once_each(sets):
    plain, cz = sets
    ld = ferry.Loader(cz, batch_size=8, seq_len=257, seed=1, device="cpu", chunk_window=2)
    got = []
    for _ in ld:
        got += ld.last_indices.tolist()
    assert sorted(got) == list(range(len(got))) and got != sorted(got)
    pl = ferry.Loader(plain, batch_size=8, seq_len=257, seed=1, device="cpu")
    assert len(pl) == len(ld)


def test_resume_mid_epoch_exact(sets):
    plain, cz = sets
    kw = dict(batch_size=16, seed=3, device="cpu", chunk_cache="6m", world_size=2, rank=1)
    full = ferry.Loader(cz, **kw)
    want = [(full.last_indices.tolist(), b[0].clone()) for b in full]
    a = ferry.Loader(cz, **kw)
    for _ in zip(range(41), a):
        pass
    st = a.state_dict()
    assert "chunks-2-of" in st["state"], st["state"]
    b = ferry.Loader(cz, **kw)
    b.load_state_dict(st)
    rest = [(b.last_indices.tolist(), x[0]) for x in b]
    assert [r[0] for r in rest] == [w[0] for w in want[41:]]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(rest, want[41:]))
    # another window (a different chunk_cache) is another order: refused, named
    c = ferry.Loader(cz, **dict(kw, chunk_cache="64m"))
    with pytest.raises(ferry.Error, match="order"):
        c.load_state_dict(st)
        next(iter(c))


def test_damaged_chunk_is_named(tmp_path):
    plain, cz = _write(tmp_path, "zstd")
    f = cz / "shard-00001.fsh"
    b = bytearray(f.read_bytes())
    tail = b[-80:]
    index = struct.unpack_from("<Q", tail, 32)[0]
    c1 = struct.unpack_from("<Q", b, index + 24 + 1 * 48)[0]  # chunk 1's frame offset
    b[c1 + 100] ^= 0xFF
    f.write_bytes(bytes(b))
    for kw in ({}, {"chunk_window": 0}, {"shuffle": False}):
        with pytest.raises(ferry.Error, match=r"shard-00001.fsh: chunk 1 \(compressed offset %d" % c1):
            run(cz, **kw)


def test_cz_decode_knob(sets):
    """cz_decode: cpu and auto decode on the pipeline threads of a host loader (the same batches);
    gpu asks for nvCOMP on a device, so a host loader refuses it when it starts, naming the knob;
    a value outside auto/cpu/gpu is refused naming the choices."""
    _, cz = sets
    a, b = run(cz, cz_decode="cpu"), run(cz, cz_decode="auto")
    assert a == b and len(a) == N
    with pytest.raises(ferry.Error, match="cz_decode=gpu"):
        run(cz, cz_decode="gpu")
    with pytest.raises(ferry.Error, match="cz_decode"):
        run(cz, cz_decode="nvcomp")
