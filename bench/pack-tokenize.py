#!/usr/bin/env python3
"""Issue 21's tokenize-and-pack figure: `python -m ferry.pack --format megatron` against a baseline
doing what Megatron-LM's tools/preprocess_data.py does (its Encoder.encode per line in a
multiprocessing Pool, pool.imap(encode, fin, 32), the main process adding each document to
megatron-core's IndexedDatasetBuilder), with the same tokenizers file, --append-eod, and the same
number of worker processes. The baseline calls tokenizers.Tokenizer.encode(text).ids where Megatron
goes through transformers' wrapper of the same tokenizer (which only adds work), so it is no slower
than the real script.

A generated JSONL corpus (Zipf-distributed words of a synthetic vocabulary, documents of
log-normal length) and a byte-level BPE trained on its first megabytes are made once under --dir.
Each round runs both in fresh processes (order alternating), timed from outside (wall) and from
inside (after the imports); the median of --rounds is reported. The outputs are then compared:
the .bin and .idx files byte for byte, and every document read back with megatron-core's
IndexedDataset.

    PYTHONPATH=<ferry>:<tokenizers>:<megatron-core> python3 bench/pack-tokenize.py \
        [--mb 100] [--vocab 32000] [--workers N] [--rounds 3] [--dir /tmp/ferry-pack-bench]

Prints TABLE rows (markdown)."""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def make_corpus(path, mb, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    nwords = 60000
    lens = rng.integers(1, 11, nwords)
    words = ["".join(rng.choice(letters, n)) for n in lens]
    words[:20] = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
                  "be", "by", "on", "not", "he", "this", "are"]
    p = 1.0 / np.arange(1, nwords + 1) ** 1.1
    p /= p.sum()
    punct = np.array([" ", " ", " ", " ", " ", " ", " ", " ", ", ", ". "])
    target = mb << 20
    done = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        while done < target:
            nd = 2000
            dl = np.clip(rng.lognormal(5.5, 0.8, nd).astype(int), 5, 20000)
            idx = rng.choice(nwords, int(dl.sum()), p=p)
            seps = rng.choice(punct, int(dl.sum()))
            pos = 0
            lines = []
            for k in dl:
                ws = [words[i] + s for i, s in zip(idx[pos:pos + k], seps[pos:pos + k])]
                pos += k
                text = "".join(ws).strip().capitalize()
                lines.append(json.dumps({"id": done + len(lines), "text": text}))
            blob = "\n".join(lines) + "\n"
            f.write(blob)
            done += len(blob.encode())
    os.rename(path + ".tmp", path)


def make_tokenizer(path, corpus, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    def texts(limit=16 << 20):
        n = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                n += len(line)
                if n > limit:
                    break
                yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), tr)
    tok.save(path)


# ------------------------------------------------------------- the baseline (preprocess_data.py)

class RawTokenizer:
    """The tokenizers file itself: encode(text).ids, the least work a baseline can do per document."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.t = Tokenizer.from_file(path)
        self.eod = self.t.token_to_id("<|endoftext|>")
        self.vocab_size = self.t.get_vocab_size(with_added_tokens=True)

    def tokenize(self, text):
        return self.t.encode(text).ids


def load_tokenizer(kind, path):
    if kind == "raw":
        return RawTokenizer(path)
    # What preprocess_data.py builds for --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR
    # --tokenizer-hf-use-fast: megatron-core's wrapper of transformers' AutoTokenizer over the same
    # tokenizer.json (DIR holds it and a tokenizer_config.json naming eos_token).
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer

    h = HuggingFaceTokenizer(path, use_fast=True)
    h.tokenize = h.text_to_ids
    return h


class Encoder:
    """tools/preprocess_data.py's Encoder, json_keys ["text"], no sentence splitting."""

    def __init__(self, kind, tokenizer_path, append_eod):
        self.kind = kind
        self.tokenizer_path = tokenizer_path
        self.append_eod = append_eod

    def initializer(self):
        Encoder.tokenizer = load_tokenizer(self.kind, self.tokenizer_path)
        Encoder.eod = Encoder.tokenizer.eod

    def encode(self, json_line):
        data = json.loads(json_line)
        ids = {}
        lens = {}
        for key in ["text"]:
            text = data[key]
            sentences = text if isinstance(text, list) else [text]
            doc_ids = []
            sentence_lens = []
            for sentence in sentences:
                sentence_ids = Encoder.tokenizer.tokenize(sentence)
                if len(sentence_ids) > 0:
                    doc_ids.extend(sentence_ids)
                    sentence_lens.append(len(sentence_ids))
            if len(doc_ids) > 0 and self.append_eod:
                doc_ids.append(Encoder.eod)
                sentence_lens[-1] += 1
            ids[key] = doc_ids
            lens[key] = sentence_lens
        return ids, lens, len(json_line)


def baseline(kind, corpus, tokenizer, prefix, workers):
    import multiprocessing

    from megatron.core.datasets import indexed_dataset

    if kind != "raw":
        from megatron.core.tokenizers.text.libraries import huggingface_tokenizer  # noqa: F401 (imports)
    t0 = time.monotonic()
    c0 = cpu_now()
    fin = open(corpus, "r", encoding="utf-8")
    encoder = Encoder(kind, tokenizer, True)
    vocab_size = load_tokenizer(kind, tokenizer).vocab_size
    pool = multiprocessing.Pool(workers, initializer=encoder.initializer)
    encoded_docs = pool.imap(encoder.encode, fin, 32)
    builder = indexed_dataset.IndexedDatasetBuilder(
        prefix + ".bin", dtype=indexed_dataset.DType.optimal_dtype(vocab_size))
    proc_start = time.time()
    total = 0
    for i, (doc, sentence_lens, nbytes) in enumerate(encoded_docs, start=1):
        total += nbytes
        for key in doc.keys():
            builder.add_document(doc[key], sentence_lens[key])
        if i % 1000 == 0:  # print_processing_stats, log_interval 1000
            el = time.time() - proc_start
            print(f"Processed {i} documents", f"({i / el} docs/s, {total / el / 1024 / 1024} MB/s).",
                  file=sys.stderr)
    fin.close()
    builder.finalize(prefix + ".idx")
    pool.close()
    pool.join()
    print(json.dumps({"seconds": time.monotonic() - t0, "cpu": cpu_now() - c0, "documents": i}))


def cpu_now():
    """CPU seconds of this process and its reaped children (the pool's workers once joined)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


# -------------------------------------------------------------------------------------- driver

def run(cmd, env):
    """(wall s, CPU s of the process and its workers, its last stdout line as JSON)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.monotonic() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)}: rc {r.returncode}\n{r.stderr[-3000:]}")
    cpu = ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime
    return wall, cpu, json.loads(r.stdout.strip().splitlines()[-1])


def rm(prefix):
    for ext in (".bin", ".idx"):
        try:
            os.unlink(prefix + ext)
        except FileNotFoundError:
            pass


def compare(a, b):
    """(bin identical, idx identical, documents equal as read by megatron-core, count)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    same = [open(a + e, "rb").read() == open(b + e, "rb").read() for e in (".bin", ".idx")]
    da, db = IndexedDataset(a, mmap=True), IndexedDataset(b, mmap=True)
    ok = len(da) == len(db) and list(da.document_indices) == list(db.document_indices)
    for i in range(len(da)) if ok else ():
        if not np.array_equal(da[i], db[i]):
            ok = False
            break
    return same[0], same[1], ok, len(da)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100, help="corpus size in MiB")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ferry-pack-bench")
    ap.add_argument("--peers", default="raw,megatron-hf",
                    help="baselines: raw (tokenizers' encode), megatron-hf (megatron-core's HuggingFaceTokenizer)")
    ap.add_argument("--baseline", nargs=5, metavar=("KIND", "CORPUS", "TOKENIZER", "PREFIX", "WORKERS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.baseline:
        return baseline(a.baseline[0], a.baseline[1], a.baseline[2], a.baseline[3], int(a.baseline[4]))
    os.makedirs(a.dir, exist_ok=True)
    corpus = os.path.join(a.dir, f"corpus-{a.mb}m.jsonl")
    tok = os.path.join(a.dir, f"bpe-{a.vocab}.json")
    if not os.path.exists(corpus):
        t = time.monotonic()
        make_corpus(corpus, a.mb)
        print(f"# corpus {corpus}: {time.monotonic() - t:.0f} s to make", file=sys.stderr)
    if not os.path.exists(tok):
        t = time.monotonic()
        make_tokenizer(tok, corpus, a.vocab)
        print(f"# tokenizer {tok}: {time.monotonic() - t:.0f} s to train", file=sys.stderr)
    hf = os.path.join(a.dir, f"hf-{a.vocab}")
    os.makedirs(hf, exist_ok=True)
    with open(tok) as f, open(os.path.join(hf, "tokenizer.json"), "w") as g:
        g.write(f.read())
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as g:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}, g)
    size = os.path.getsize(corpus)
    with open(corpus, "rb") as f:  # both runs read it from the page cache
        while f.read(1 << 24):
            pass
    env = dict(os.environ)
    out_f = os.path.join(a.dir, "ferry")
    runs = {"ferry": ([sys.executable, "-m", "ferry.pack", "--tokenizer", tok, "--append-eod", "--format",
                       "megatron", "--workers", str(a.workers), "--json", "-q", "-o", out_f, corpus], out_f)}
    labels = {"ferry": "`python -m ferry.pack --format megatron`",
              "raw": "baseline: preprocess_data.py's flow, `tokenizers` encode(text).ids",
              "megatron-hf": "baseline: preprocess_data.py's flow, megatron-core's HuggingFaceTokenizer"}
    for kind in a.peers.split(","):
        out = os.path.join(a.dir, f"megatron-{kind}")
        runs[kind] = ([sys.executable, os.path.abspath(__file__), "--baseline", kind, corpus,
                       tok if kind == "raw" else hf, out, str(a.workers)], out)
    wall, wall_in, cpu, cpu_in = ({k: [] for k in runs} for _ in range(4))
    names = list(runs)
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            cmd, out = runs[name]
            rm(out)
            w, c, s = run(cmd, env)
            wall[name].append(w)
            cpu[name].append(c)
            wall_in[name].append(s["seconds"])
            cpu_in[name].append(s.get("cpu", s.get("cpu_seconds")))
            print(f"# round {r + 1} {name}: wall {w:.2f} s ({s['seconds']:.2f} after imports), CPU {c:.2f} s "
                  f"({cpu_in[name][-1]:.2f} after imports)", file=sys.stderr)
    med = lambda d, k: statistics.median(d[k])  # noqa: E731
    print(f"| run | wall s, median of {a.rounds} (each) | MB/s of JSONL | wall after imports | CPU s (process + "
          "workers) | CPU after imports | ratio to ferry: wall, after imports, CPU after imports |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        ratio = "" if name == "ferry" else (
            f"**{med(wall, name) / med(wall, 'ferry'):.2f}x**, **{med(wall_in, name) / med(wall_in, 'ferry'):.2f}x**, "
            f"{med(cpu_in, name) / med(cpu_in, 'ferry'):.2f}x")
        print(f"| {labels[name]} | {med(wall, name):.2f} ({', '.join(f'{t:.2f}' for t in wall[name])}) | "
              f"{size / 1e6 / med(wall, name):.1f} | {med(wall_in, name):.2f} | {med(cpu, name):.2f} | "
              f"{med(cpu_in, name):.2f} | {ratio} |")
    docs_equal = True
    for name in names[1:]:
        same_bin, same_idx, equal, ndocs = compare(out_f, runs[name][1])
        docs_equal &= equal
        print(f"# {name}: .bin identical: {same_bin}, .idx identical: {same_idx}, every document equal "
              f"(megatron-core IndexedDataset): {equal} ({ndocs} documents)")
    print(f"# corpus {size / 1e6:.0f} MB, vocab {a.vocab}, workers {a.workers}")
    return 0 if docs_equal else 1


if __name__ == "__main__":
    sys.exit(main())
