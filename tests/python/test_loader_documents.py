"""Packed sequences that know their documents (issue 21): Loader(documents=True) returns with each
batch position_ids (restarting at each row and each document start) and cu_seqlens/max_seqlen (as
FlashAttention's varlen kernels take them), compared with a reference computed here from the
documents' boundaries: a ferry dataset (each sample a document) and a Megatron dataset whose
document index groups several sequences into one document."""
import struct

import pytest

from conftest import need

np = need("numpy")
torch = need("torch")
import ferry  # noqa: E402


def make_docs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, size=int(rng.integers(0, 60)) if i % 17 else 0).astype(np.uint16)
            for i in range(n)]


def write_megatron(prefix, seqs, doc_idx):
    """A Megatron MMIDIDX v1 dataset of uint16 sequences with the given document index."""
    sizes = [len(s) for s in seqs]
    ptrs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * 2 if seqs else []
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(np.asarray(s, np.uint16).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]))
        f.write(struct.pack("<QQ", len(seqs), len(doc_idx)))
        f.write(np.asarray(sizes, np.int32).tobytes())
        f.write(np.asarray(ptrs, np.int64).tobytes())
        f.write(np.asarray(doc_idx, np.int64).tobytes())


def reference(rows, doc_starts):
    """position_ids and cu_seqlens of a batch whose rows are (stream start, length) pairs, given the
    sorted stream positions where documents start."""
    pos, cu, base = [], [0], 0
    for g0, length in rows:
        seg = 0
        for e in range(length):
            if e and (g0 + e) in doc_starts:
                seg = e
                cu.append(base + e)
            pos.append(e - seg)
        base += length
        cu.append(base)
    cu = np.asarray(cu, np.int32)
    return np.asarray(pos, np.int64), cu, int(np.diff(cu).max()) if len(cu) > 1 else 0


def check(ld, rows_of, doc_starts, data_of):
    n = 0
    for batch in ld:
        assert set(batch) >= {"input_ids", "position_ids", "cu_seqlens", "max_seqlen"}
        assert batch["position_ids"].dtype == torch.int64 and batch["cu_seqlens"].dtype == torch.int32
        rows = rows_of(ld.last_indices, batch)
        pos, cu, mx = reference(rows, doc_starts)
        assert torch.equal(batch["position_ids"].reshape(-1), torch.from_numpy(pos))
        assert torch.equal(batch["cu_seqlens"], torch.from_numpy(cu))
        assert batch["max_seqlen"] == mx
        assert np.array_equal(batch["input_ids"].reshape(-1).numpy(), data_of(rows))
        n += 1
    assert n == len(ld)


@pytest.mark.parametrize("world_size,rank", [(1, 0), (3, 2)])
def test_windows_ferry(tmp_path, world_size, rank):
    docs = make_docs(300)
    ferry.write_dataset(tmp_path / "ds", docs, shard_size=4096)
    stream = np.concatenate(docs)
    starts = set(np.cumsum([0] + [len(d) for d in docs[:-1]]).tolist())
    L = 45
    ld = ferry.Loader(tmp_path / "ds", batch_size=6, seq_len=L, device="cpu", seed=2,
                      world_size=world_size, rank=rank, documents=True)
    check(ld, lambda ix, b: [(int(i) * L, L) for i in ix], starts,
          lambda rows: np.concatenate([stream[g:g + n] for g, n in rows]))
    # a step's wait and the batch's data are as without documents: the same windows
    plain = ferry.Loader(tmp_path / "ds", batch_size=6, seq_len=L, device="cpu", seed=2,
                         world_size=world_size, rank=rank)
    assert isinstance(next(iter(plain)), torch.Tensor)


def test_windows_megatron_document_index(tmp_path):
    # sequences (sentences) grouped into documents: only the document index starts a document
    seqs = make_docs(200, seed=1)
    doc_idx = [0, 1, 4, 5, 9] + list(range(12, 200, 3)) + [200]
    write_megatron(str(tmp_path / "m"), seqs, doc_idx)
    cum = np.cumsum([0] + [len(s) for s in seqs])
    starts = {int(cum[d]) for d in doc_idx[:-1]}
    stream = np.concatenate(seqs)
    L = 64
    ld = ferry.Loader(str(tmp_path / "m"), batch_size=5, seq_len=L, device="cpu", seed=7,
                      documents=True)
    check(ld, lambda ix, b: [(int(i) * L, L) for i in ix], starts,
          lambda rows: np.concatenate([stream[g:g + n] for g, n in rows]))
    # not every sequence start is a document start here, so some row crosses a sequence start
    # without a new position 0
    assert len(starts) < len([s for s in seqs if len(s)])


def test_whole_samples(tmp_path):
    docs = make_docs(120, seed=3)
    ferry.write_dataset(tmp_path / "ds", docs)
    ld = ferry.Loader(tmp_path / "ds", batch_size=7, device="cpu", documents=True, shuffle=False)
    for batch in ld:
        offs = batch["offsets"]
        ix = ld.last_indices
        assert torch.equal(batch["cu_seqlens"], offs.to(torch.int32))
        want = np.concatenate([np.arange(len(docs[i])) for i in ix])
        assert torch.equal(batch["position_ids"], torch.from_numpy(want.astype(np.int64)))
        assert batch["max_seqlen"] == max(len(docs[i]) for i in ix)
        assert np.array_equal(batch["input_ids"].numpy(), np.concatenate([docs[i] for i in ix]))


def test_documents_resume(tmp_path):
    # documents do not change the order or the state: a resumed run gives the same dicts
    docs = make_docs(150, seed=4)
    ferry.write_dataset(tmp_path / "ds", docs)
    kw = dict(batch_size=4, seq_len=33, device="cpu", documents=True)
    full = [(b["position_ids"].clone(), b["cu_seqlens"].clone()) for b in ferry.Loader(tmp_path / "ds", **kw)]
    a = ferry.Loader(tmp_path / "ds", **kw)
    it = iter(a)
    for _ in range(3):
        next(it)
    b = ferry.Loader(tmp_path / "ds", **kw)
    b.load_state_dict(a.state_dict())
    rest = [(x["position_ids"], x["cu_seqlens"]) for x in b]
    assert len(rest) == len(full) - 3
    for (p, c), (p2, c2) in zip(full[3:], rest):
        assert torch.equal(p, p2) and torch.equal(c, c2)


@pytest.mark.parametrize("seq_len", [40, None])
def test_cuda_equals_cpu(tmp_path, seq_len):
    # on the GPU (the data's device memory handed over without a copy) the dicts equal the CPU's
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device here (the CPU cases above cover the values)")
    docs = make_docs(200, seed=5)
    ferry.write_dataset(tmp_path / "ds", docs)
    kw = dict(batch_size=6, seq_len=seq_len, seed=4, documents=True, threads=2)
    cpu = list(ferry.Loader(tmp_path / "ds", device="cpu", **kw))
    gpu = list(ferry.Loader(tmp_path / "ds", device="cuda", **kw))
    torch.cuda.synchronize()
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu):
        assert set(c) == set(g)
        for k in c:
            if k == "max_seqlen":
                assert c[k] == g[k]
            else:
                assert g[k].device.type == "cuda" and torch.equal(c[k], g[k].cpu()), k
