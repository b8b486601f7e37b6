"""python -m ferry.pack (issue 21): JSONL text tokenized with a tokenizers file made here, packed
into ferry shards and Megatron .bin/.idx; the ids must be tokenizer.encode(text).ids + [eod] per
document, in input order, and bad lines must be refused or counted."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (pip install tokenizers)")
import ferry  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "ferry", "boat", "river", "token", "the", "of", "and",
         "é", "日本", "naïve", "x"]


def _docs(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[k] for k in rng.integers(0, len(WORDS), rng.integers(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_docs(400, 1), tr)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _write_jsonl(path, docs, key="text", extra=()):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d, "meta": 1}) + "\n")
        for line in extra:
            f.write(line + "\n")


def _run(*args, check=True, quiet=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-m", "ferry.pack", *(["-q"] if quiet else []), *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r


def _megatron_index(prefix):
    """(dtype code, sizes, pointers, document index) read by hand from prefix.idx."""
    b = open(f"{prefix}.idx", "rb").read()
    assert b[:9] == b"MMIDIDX\x00\x00", b[:9]
    code = b[17]
    s, d = struct.unpack_from("<QQ", b, 18)
    sizes = np.frombuffer(b, np.int32, s, 34)
    ptrs = np.frombuffer(b, np.int64, s, 34 + 4 * s)
    docs = np.frombuffer(b, np.int64, d, 34 + 12 * s)
    return code, sizes, ptrs, docs


@pytest.mark.parametrize("fmt", ["ferry", "megatron"])
def test_ids_equal_encode_plus_eod(tmp_path, tok_path, fmt):
    tok = tokenizers.Tokenizer.from_file(str(tok_path))
    eod = tok.token_to_id("<|endoftext|>")
    a, b = _docs(700, 2), _docs(300, 3)
    _write_jsonl(tmp_path / "a.jsonl", a, extra=["", "   "])  # blank lines are not documents
    _write_jsonl(tmp_path / "b.jsonl", b)
    out = tmp_path / "new" / "dir" / "out"  # parents are created
    r = _run("--tokenizer", tok_path, "--append-eod", "--format", fmt, "--workers", 2, "--block-size", "8k",
             "--json", "-o", out, tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    s = json.loads(r.stdout)
    want = [tok.encode(t, add_special_tokens=False).ids + [eod] for t in a + b]
    assert (s["documents_read"], s["samples"], s["skipped_lines"], s["blank_lines"]) == (1000, 1000, 0, 2), s
    assert (s["eod"], s["dtype"], s["tokens"]) == (eod, "uint16", sum(map(len, want))), s
    ds = ferry.IndexedDataset(out)
    assert (ds.format, ds.dtype, len(ds)) == (fmt, np.dtype("uint16"), len(want))
    for i, w in enumerate(want):
        assert ds[i].tolist() == w, (i, ds[i].tolist(), w)
    if fmt == "megatron":
        code, sizes, ptrs, docs = _megatron_index(out)
        assert code == 8, code  # Megatron's code for uint16
        assert sizes.tolist() == [len(w) for w in want]
        assert docs.tolist() == list(range(len(want) + 1))  # one sequence per document
        assert ptrs.tolist() == (np.cumsum([0] + [len(w) for w in want[:-1]]) * 2).tolist()
    ds.close()


def test_eod_by_id_and_none(tmp_path, tok_path):
    tok = tokenizers.Tokenizer.from_file(str(tok_path))
    docs = _docs(50, 4)
    _write_jsonl(tmp_path / "c.jsonl", docs, key="body")
    _run("--tokenizer", tok_path, "--json-key", "body", "--append-eod", "7", "-o", tmp_path / "e7", tmp_path / "c.jsonl")
    _run("--tokenizer", tok_path, "--json-key", "body", "-o", tmp_path / "none", tmp_path / "c.jsonl")
    with ferry.IndexedDataset(tmp_path / "e7") as d7, ferry.IndexedDataset(tmp_path / "none") as d0:
        for i, t in enumerate(docs):
            ids = tok.encode(t).ids
            assert d7[i].tolist() == ids + [7], i
            assert d0[i].tolist() == ids, i
    r = _run("--tokenizer", tok_path, "--append-eod", "<nope>", "-o", tmp_path / "x", tmp_path / "c.jsonl", check=False)
    assert r.returncode == 1 and "no such token" in r.stderr, r.stderr


def test_bad_lines_refused_or_counted(tmp_path, tok_path):
    docs = _docs(20, 5)
    bad = ['{"text": 3}', "not json", '["a list"]', '{"other": "x"}', '{"text": ""}', '{"text": "a\\ud800"}']
    _write_jsonl(tmp_path / "bad.jsonl", docs, extra=bad)
    with open(tmp_path / "bad.jsonl", "ab") as f:
        f.write(b'{"text": "\xff\xfe"}\n')
    # small blocks: line numbers must count across them
    r = _run("--tokenizer", tok_path, "--block-size", "1k", "-o", tmp_path / "o1", tmp_path / "bad.jsonl", check=False)
    assert r.returncode == 1, r
    assert f"{tmp_path / 'bad.jsonl'}:21: member \"text\" is not a string" in r.stderr, r.stderr
    assert not (tmp_path / "o1" / "ferry.idx").exists()
    r = _run("--tokenizer", tok_path, "--skip-bad", "--json", "--block-size", "1k", "-o", tmp_path / "o2",
             tmp_path / "bad.jsonl", quiet=False)
    s = json.loads(r.stdout)
    # the same reasons, under the same names, as ferry pack --skip-bad; an empty text is no bad line
    assert s["skipped"] == {"utf8": 1, "json": 2, "no_key": 2, "type": 1}, s
    assert (s["skipped_lines"], s["empty_documents"], s["documents_read"], s["samples"]) == (6, 1, 27, 20), s
    assert f"skipped {tmp_path / 'bad.jsonl'}:22: not valid JSON" in r.stderr, r.stderr  # the first five named
    assert f"bad.jsonl:27:" not in r.stderr, r.stderr
    with ferry.IndexedDataset(tmp_path / "o2") as ds:
        assert len(ds) == 20
    # nothing at all to pack is an error, as for ferry pack
    _write_jsonl(tmp_path / "empty.jsonl", [""])
    r = _run("--tokenizer", tok_path, "-o", tmp_path / "o3", tmp_path / "empty.jsonl", check=False)
    assert r.returncode == 1 and "no documents to pack" in r.stderr, r.stderr


def test_large_vocab_int32_and_range_check(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    docs = ["w1 w2 w69999", "w65535 w65536", "w3"]
    _write_jsonl(tmp_path / "big.jsonl", docs)
    r = _run("--tokenizer", tmp_path / "big.json", "--append-eod", "70000", "--format", "megatron", "--json",
             "-o", tmp_path / "m", tmp_path / "big.jsonl")
    assert json.loads(r.stdout)["dtype"] == "int32"
    with ferry.IndexedDataset(tmp_path / "m") as ds:
        assert ds.dtype == np.dtype("int32")
        assert [ds[i].tolist() for i in range(3)] == [[1, 2, 69999, 70000], [65535, 65536, 70000], [3, 70000]]
    r = _run("--tokenizer", tmp_path / "big.json", "--dtype", "uint16", "-o", tmp_path / "u", tmp_path / "big.jsonl",
             check=False)
    assert r.returncode == 1, r
    assert f"big.jsonl:1: token id 69999 does not fit uint16" in r.stderr, r.stderr


def test_pack_api_summary(tmp_path, tok_path):
    from ferry.pack import pack

    docs = _docs(30, 6)
    _write_jsonl(tmp_path / "p.jsonl", docs)
    s = pack([tmp_path], tmp_path / "out", tok_path, append_eod="<|endoftext|>", workers=1)  # a directory input
    assert (s["samples"], s["inputs"], s["shards"]) == (30, 1, 1), s


def test_special_tokens_left_out_as_megatron_does(tmp_path):
    """A post-processor that adds a BOS: left out by default (Megatron's HuggingFaceTokenizer calls
    tokenize + convert_tokens_to_ids), kept with --add-special-tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(tmp_path / "t.json"))
    assert tok.encode("a b").ids == [1, 3, 4]
    _write_jsonl(tmp_path / "d.jsonl", ["a b", "b"])
    _run("--tokenizer", tmp_path / "t.json", "--append-eod", "-o", tmp_path / "plain", tmp_path / "d.jsonl")
    _run("--tokenizer", tmp_path / "t.json", "--append-eod", "--add-special-tokens", "-o", tmp_path / "bos",
         tmp_path / "d.jsonl")
    with ferry.IndexedDataset(tmp_path / "plain") as p, ferry.IndexedDataset(tmp_path / "bos") as b:
        assert [p[0].tolist(), p[1].tolist()] == [[3, 4, 2], [4, 2]]  # </s> found as the EOD
        assert [b[0].tolist(), b[1].tolist()] == [[1, 3, 4, 2], [1, 4, 2]]
