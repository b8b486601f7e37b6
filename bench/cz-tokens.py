"""Real token data for issue 26's compression benchmarks, made without a network: uint16 token ids
from a real BPE tokenizer over natural English text, written to a file.

The text: the docstrings and comments of the Python standard library's .py files (every machine with
Python has them; code is left out). The tokenizer, first that works:
  - tiktoken's "gpt2" (50,257 ids) when its BPE file is already in TIKTOKEN_CACHE_DIR (tiktoken
    downloads it otherwise, and the GPU machine has no network: not tried without the cache);
  - a byte-level BPE of 32,000 ids trained here with Hugging Face `tokenizers` on that text (the
    GPT-2 recipe: byte-level pre-tokenisation, BPE merges).
Documents (one per file, in a shuffled order each pass, an end-of-text id between them) are
repeated until the file has the bytes asked for; with chunks of at most 4 MiB compressed on their
own, a pass (several MiB of tokens) never repeats inside a chunk.

  python bench/cz-tokens.py OUT MIB        prints one line: the tokenizer, the text, the ids
"""
import ast
import multiprocessing
import os
import random
import re
import sys
import sysconfig
import time

import numpy as np


COMMENT = re.compile(r"^[ \t]*#+[ \t]?(.{3,})$", re.M)


def file_text(path):
    """The docstrings and whole-line comments of one .py file, as one document ("" if none)."""
    try:
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node)
            if d:
                parts.append(d)
    parts += [c for c in COMMENT.findall(src) if not c.startswith("!")]
    text = "\n".join(parts)
    return text if len(text) > 200 else ""


def corpus():
    lib = sysconfig.get_paths()["stdlib"]
    paths = []
    for root, dirs, files in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "__pycache__"))
        paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    with multiprocessing.Pool(min(16, os.cpu_count() or 1)) as pool:
        docs = [d for d in pool.map(file_text, paths, chunksize=16) if d]
    if not docs:
        sys.exit("no docstrings found under %s" % lib)
    return docs


def tokenizer(docs):
    cache = os.environ.get("TIKTOKEN_CACHE_DIR")
    if cache and os.path.isdir(cache):
        try:
            import tiktoken
            enc = tiktoken.get_encoding("gpt2")
            return "tiktoken gpt2", lambda texts: enc.encode_ordinary_batch(texts), enc.eot_token
        except Exception as e:  # noqa: BLE001 - any failure falls back to training, said below
            print("tiktoken gpt2 unavailable (%s): training a BPE" % e, file=sys.stderr)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    eot = tok.token_to_id("<|endoftext|>")
    return ("tokenizers byte-level BPE, %d ids trained on the text" % tok.get_vocab_size(),
            lambda texts: [e.ids for e in tok.encode_batch(texts)], eot)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, nbytes = sys.argv[1], int(sys.argv[2]) << 20
    t0 = time.time()
    docs = corpus()
    name, encode, eot = tokenizer(docs)
    ids = encode(docs)
    assert max(max(d) for d in ids if d) < 65536 and eot < 65536
    arrays = [np.array(d + [eot], dtype=np.uint16) for d in ids]
    per_pass = sum(a.size for a in arrays)
    rng = random.Random(26)
    n = nbytes // 2
    buf = np.empty(n, dtype=np.uint16)
    at = 0
    while at < n:
        rng.shuffle(arrays)
        for a in arrays:
            k = min(a.size, n - at)
            buf[at:at + k] = a[:k]
            at += k
            if at == n:
                break
    with open(out, "wb") as f:
        f.write(buf.tobytes())
    chars = sum(len(d) for d in docs)
    print("tokens: %s; text: %d docstring+comment documents of the stdlib, %.1f MB, %d tokens a pass "
          "(%.2f chars/token), %d distinct ids; %d MiB written in %.1f s" %
          (name, len(docs), chars / 1e6, per_pass, chars / per_pass, np.unique(buf).size, nbytes >> 20,
           time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
