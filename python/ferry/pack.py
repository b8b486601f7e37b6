"""Tokenize JSON Lines with a Hugging Face ``tokenizers`` file and pack the token ids.

    python -m ferry.pack --tokenizer tokenizer.json --append-eod -o OUT corpus.jsonl ...

does what Megatron-LM's ``tools/preprocess_data.py`` does (one document per line, its
``--json-key`` field tokenized, an end-of-document token appended, documents in input order) and
writes ferry shards (``--format ferry``, the format of ``ferry pack``) or Megatron's ``.bin/.idx``
(``--format megatron``) through ferry's dataset writer. docs/DATA.md describes it.

Where its speed comes from: the main process reads the inputs in large blocks of whole lines and
hands each block to a worker process (no per-line pickling); a worker tokenizes its block with one
``encode_batch`` call and sends back one NumPy array of tokens and one of lengths; the main process
only appends them to a spool file, and the C writer writes the dataset from it at the end (the
writer needs every length before it lays out the shards).
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import mmap
import multiprocessing
import os
import sys
import tempfile
import time

# Why a line is bad, by the names `ferry pack --skip-bad` counts them under (docs/DATA.md).
REASONS = {
    "utf8": "not valid UTF-8",
    "json": "not valid JSON",
    "no_key": "no member {key} (or not a JSON object)",
    "type": "member {key} is not a string",
}
# Tokens taken as the end of a document when --append-eod names none, first found wins: what
# GPT-2/NeoX, Llama/Mistral/T5, Llama 3 and others call it (Megatron's HuggingFaceTokenizer uses
# the tokenizer's eos_token, which tokenizer.json alone does not name).
EOD_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<eod>", "<|eod|>")
# uint16 while every id fits; past that int32 (uint32 is no dtype Megatron's index can name).
_DTYPE_MAX = {"uint8": 255, "uint16": 65535, "int16": 32767, "int32": 2**31 - 1, "int64": 2**63 - 1}


class PackError(Exception):
    """A refusal naming the file and line (or the option) at fault."""


def _tokenizers():
    try:
        import tokenizers
    except ImportError as e:
        raise PackError("python -m ferry.pack needs the Hugging Face tokenizers package "
                        "(pip install tokenizers)") from e
    return tokenizers


def find_eod(tok, spec) -> int | None:
    """The end-of-document id: None (spec None: no EOD), an id (int or decimal text), a token
    (its id), or "auto": the first of EOD_TOKENS the tokenizer knows."""
    if spec is None:
        return None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        eod = int(spec)
        if eod >= vocab:
            raise PackError(f"--append-eod {eod}: past the tokenizer's {vocab} ids")
        return eod
    if spec != "auto":
        eod = tok.token_to_id(spec)
        if eod is None:
            raise PackError(f"--append-eod {spec!r}: the tokenizer has no such token")
        return eod
    for name in EOD_TOKENS:
        eod = tok.token_to_id(name)
        if eod is not None:
            return eod
    raise PackError("--append-eod: the tokenizer has none of the usual end-of-document tokens ("
                    + ", ".join(EOD_TOKENS) + "); give its id or token: --append-eod ID")


def default_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65536 else "int32"


# ----------------------------------------------------------------------------------- workers

_W = {}


def _init_worker(tokenizer_path: str, key: str, eod, dtype: str, skip_bad: bool, threads: int,
                 special: bool) -> None:
    # Before the tokenizer's first batch starts its thread pool (rayon reads this then). With a
    # worker per CPU, more threads per worker only spin: measured, 10% more CPU for the same work.
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    tok = _tokenizers().Tokenizer.from_file(tokenizer_path)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    _W.update(tok=tok, key=key, eod=eod, dtype=dtype, skip_bad=skip_bad,
              encode=lambda texts: encode(texts, add_special_tokens=special))


def _classify(line: bytes, key: str, loads=json.loads):
    """(text, None) or (None, reason)."""
    try:
        obj = loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "utf8"
    except ValueError:
        return None, "json"
    text = obj.get(key, _classify) if isinstance(obj, dict) else _classify
    if text is _classify:
        return None, "no_key"
    if not isinstance(text, str):
        return None, "type"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escape ("\\ud800"): ferry pack refuses it too
            return None, "json"
    return text, None


def _encode(task):
    """A block of whole lines -> (lengths in bytes uint64, tokens, stats)."""
    import numpy as np

    fi, first_line, data = task
    key, eod, dtype, skip_bad = _W["key"], _W["eod"], _W["dtype"], _W["skip_bad"]
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    texts, where = [], []
    skipped = collections.Counter()
    named = []  # the first five bad lines: (line, reason)
    blank = 0
    for j, line in enumerate(lines):
        if not line or line.isspace():
            blank += 1
            continue
        text, why = _classify(line, key)
        if why:
            if not skip_bad:
                return {"error": (fi, first_line + j, why)}
            skipped[why] += 1
            if len(named) < 5:
                named.append((first_line + j, why))
            continue
        texts.append(text)
        where.append(first_line + j)
    ids = [e.ids for e in _W["encode"](texts)] if texts else []
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    total = int(lens.sum())
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)
    if total:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi > _DTYPE_MAX[dtype]:
            bad = int(np.argmax((flat < 0) | (flat > _DTYPE_MAX[dtype])))
            d = int(np.searchsorted(np.cumsum(lens), bad, side="right"))
            return {"error": (fi, where[d], f"token id {int(flat[bad])} does not fit {dtype} "
                              f"(--dtype int32 holds it)")}
    keep = lens > 0
    empty = int(len(keep) - np.count_nonzero(keep))
    if empty:
        lens = lens[keep]
    if eod is not None and len(lens):
        flat = np.insert(flat, np.cumsum(lens), eod)
        lens = lens + 1
    tokens = flat.astype(dtype)
    return {"lens": (lens * tokens.itemsize).astype(np.uint64), "tokens": tokens, "lines": len(lines),
            "blank": blank, "docs": len(texts) + sum(skipped.values()), "empty": empty,
            "skipped": dict(skipped), "named": [(fi, line, why) for line, why in named], "bytes": len(data)}


# --------------------------------------------------------------------------------------- main


def _inputs(paths):
    """Files as given; directories walked in name order for *.jsonl."""
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = sorted(os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if f.endswith(".jsonl"))
            if not found:
                raise PackError(f"{p}: the directory holds no .jsonl files")
            out.extend(found)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise PackError(f"{p}: {'no such file' if not os.path.exists(p) else 'not a regular file'}")
    return out


def _blocks(paths, size):
    """(input index, first line number, whole lines) of about size bytes each."""
    for fi, p in enumerate(paths):
        line, rest = 1, b""
        with open(p, "rb") as f:
            while True:
                b = f.read(size)
                if not b:
                    break
                if rest:
                    b, rest = rest + b, b""
                cut = b.rfind(b"\n")
                if cut < 0:
                    rest = b
                    continue
                if cut + 1 < len(b):
                    b, rest = b[:cut + 1], b[cut + 1:]
                yield fi, line, b
                line += b.count(b"\n")
        if rest:
            yield fi, line, rest


class _Progress:
    def __init__(self, enabled: bool, total_bytes: int):
        self.on = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.total = total_bytes
        self.t0 = self.last = time.monotonic()

    def __call__(self, docs: int, nbytes: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.on or (not final and now - self.last < (0.25 if self.tty else 5.0)):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        pct = f"{100.0 * nbytes / self.total:5.1f}% " if self.total else ""
        msg = (f"ferry.pack: {pct}{docs} documents, {nbytes / 1e6:.1f} MB in {el:.1f} s "
               f"({docs / el:.0f} documents/s, {nbytes / 1e6 / el:.1f} MB/s)")
        if self.tty:
            sys.stderr.write("\r" + msg + ("\n" if final else ""))
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def pack(inputs, output, tokenizer, *, json_key: str = "text", append_eod=None, format: str = "ferry",
         workers: int | None = None, dtype: str | None = None, shard_size: int = 0,
         skip_bad: bool = False, block_size: int = 1 << 20, add_special_tokens: bool = False,
         progress: bool = False) -> dict:
    """Tokenizes the ``json_key`` field of every line of the JSONL ``inputs`` with the
    ``tokenizers`` file ``tokenizer`` in ``workers`` processes and packs one sample per document
    into ``output``: ferry shards (a directory) or Megatron's ``output.bin``/``output.idx``.
    ``append_eod``: None, "auto", an id or a token. ``add_special_tokens``: what the tokenizer's
    post-processor adds (a BOS, say); off, as in Megatron's HuggingFaceTokenizer. A line that is not a JSON object holding a
    string in ``json_key`` is refused (PackError naming file and line) unless ``skip_bad``, which
    counts it; documents without tokens are left out and counted (Megatron writes no tokens for
    them either). Returns the summary dict."""
    import numpy as np

    from . import _ferry

    kinds = {"ferry": _ferry.WRITE_FERRY, "megatron": _ferry.WRITE_MEGATRON}
    if format not in kinds:
        raise PackError(f"--format must be ferry or megatron, not {format!r}")
    t0, c0 = time.monotonic(), _cpu()
    paths = _inputs(inputs)
    if not paths:
        raise PackError("no inputs")
    tok_path = os.fspath(tokenizer)
    try:
        tok = _tokenizers().Tokenizer.from_file(tok_path)
    except Exception as e:  # tokenizers raises its own Exception for unreadable files
        if isinstance(e, PackError):
            raise
        raise PackError(f"{tok_path}: not a tokenizers file: {e}") from e
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eod = find_eod(tok, append_eod)
    dtype = dtype or default_dtype(vocab)
    if dtype not in _DTYPE_MAX:
        raise PackError(f"--dtype {dtype}: one of {', '.join(_DTYPE_MAX)}")
    if eod is not None and eod > _DTYPE_MAX[dtype]:
        raise PackError(f"--append-eod {eod} does not fit {dtype}")
    del tok
    elem = _ferry.elem_from_name(dtype)
    workers = workers or os.cpu_count() or 1
    output = os.fspath(output)
    parent = os.path.dirname(os.path.abspath(output.rstrip("/") or output))
    os.makedirs(parent, exist_ok=True)
    total_in = sum(os.path.getsize(p) for p in paths)
    show = _Progress(progress, total_in)

    lens_list = []
    st = {"docs": 0, "lines": 0, "blank": 0, "bytes": 0, "tokens": 0, "empty": 0}
    skipped = collections.Counter()
    named = []

    def take(r):
        if "error" in r:
            fi, line, why = r["error"]
            raise PackError(f"{paths[fi]}:{line}: " + (REASONS[why].format(key=json.dumps(json_key))
                                                        + "; --skip-bad counts and skips such lines"
                                                        if why in REASONS else why))
        if len(r["lens"]):
            spool.write(memoryview(r["tokens"]).cast("B"))
            lens_list.append(r["lens"])
        st["tokens"] += len(r["tokens"])
        for k in ("docs", "lines", "blank", "bytes", "empty"):
            st[k] += r[k]
        skipped.update(r["skipped"])
        for fi, line, why in r["named"]:
            if len(named) < 5:
                named.append(f"{paths[fi]}:{line}: {REASONS[why].format(key=json.dumps(json_key))}")
                if progress:
                    print(f"python -m ferry.pack: skipped {named[-1]}", file=sys.stderr)
        show(st["docs"], st["bytes"])

    # Unnamed (O_TMPFILE where it exists): nothing is left behind by a crash. Beside the output so
    # that it takes space where the output will.
    with tempfile.TemporaryFile(dir=parent, prefix=".ferry-pack-") as spool:
        init = (tok_path, json_key, eod, dtype, skip_bad, max(1, (os.cpu_count() or 1) // workers),
                bool(add_special_tokens))
        inflight = collections.deque()
        # apply_async with a bounded number of blocks in flight: Pool.imap would read the whole
        # corpus into its task queue as fast as the disk gives it.
        with multiprocessing.get_context("fork" if sys.platform == "linux" else None).Pool(
                workers, initializer=_init_worker, initargs=init) as pool:
            for task in _blocks(paths, block_size):
                inflight.append(pool.apply_async(_encode, (task,)))
                while len(inflight) >= 2 * workers + 2:
                    take(inflight.popleft().get())
            while inflight:
                take(inflight.popleft().get())
        spool.flush()
        written = sum(len(x) for x in lens_list)
        if not written:
            raise PackError(f"no documents to pack in {paths[0]}" + (" and the other inputs" if len(paths) > 1 else "")
                            + f" ({st['docs']} lines read, {sum(skipped.values())} skipped, {st['empty']} "
                            "without tokens)")
        nbytes = spool.tell()
        w = _ferry.PackWriter(output, kinds[format], elem, shard_size)
        try:
            for lens in lens_list:
                w.add(lens)
            shards = w.layout()
            with mmap.mmap(spool.fileno(), nbytes, access=mmap.ACCESS_READ) as mm:
                mv = memoryview(mm)
                try:
                    first = off = 0
                    for lens in lens_list:
                        nb = int(lens.sum())
                        w.put(first, lens, mv[off:off + nb])
                        first += len(lens)
                        off += nb
                finally:
                    mv.release()
            w.finish()
        except BaseException:
            w.abort()
            raise
    el = time.monotonic() - t0
    show(st["docs"], st["bytes"], final=True)
    return {
        "format": format, "output": output, "samples": written, "bytes": nbytes, "shards": shards,
        "dtype": dtype, "inputs": len(paths), "input_bytes": st["bytes"], "blank_lines": st["blank"],
        "skipped_lines": sum(skipped.values()), "skipped": {k: skipped[k] for k in REASONS},
        "documents_read": st["docs"], "empty_documents": st["empty"], "tokens": st["tokens"], "eod": eod,
        "vocab_size": vocab, "workers": workers, "seconds": round(el, 3),
        "cpu_seconds": round(_cpu() - c0, 3), "bytes_per_s": round(st["bytes"] / el) if el > 0 else 0,
        "documents_per_s": round(st["docs"] / el, 1) if el > 0 else 0.0,
    }


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (the workers, once joined)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _size(text: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("ib")
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with k, m, g)") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ferry.pack",
        description="Tokenizes the text of JSON Lines with a Hugging Face tokenizers file in worker "
                    "processes, as Megatron-LM's tools/preprocess_data.py does, and packs one sample "
                    "per document into ferry shards or Megatron .bin/.idx.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".jsonl files, or directories (their "
                   "*.jsonl in name order)")
    p.add_argument("-o", "--output", required=True, help="output directory (ferry) or prefix (megatron)")
    p.add_argument("--tokenizer", required=True, help="a tokenizers file (tokenizer.json)")
    p.add_argument("--json-key", default="text", help="the field holding each document's text (default text)")
    p.add_argument("--append-eod", nargs="?", const="auto", default=None, metavar="ID|TOKEN",
                   help="append an end-of-document id to each document: the one given, or (no value) "
                        "the tokenizer's " + " / ".join(EOD_TOKENS[:3]) + " ...")
    p.add_argument("--format", choices=("ferry", "megatron"), default="ferry", help="what to write (default ferry)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="tokenizing processes (default: number of CPUs)")
    p.add_argument("--add-special-tokens", action="store_true",
                   help="keep what the tokenizer's post-processor adds (a BOS, say); Megatron leaves it out")
    p.add_argument("--dtype", choices=tuple(_DTYPE_MAX), default=None,
                   help="token type (default uint16 when the vocabulary fits, else int32); range-checked")
    p.add_argument("--shard-size", type=_size, default=0, metavar="SIZE",
                   help="bytes per ferry shard (default 1g)")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="SIZE",
                   help="bytes of whole lines handed to a worker at once (default 1m)")
    p.add_argument("--skip-bad", action="store_true",
                   help="count and skip lines that are not a JSON object with a string --json-key "
                        "(default: refuse them, naming file and line)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def _summary_text(s: dict) -> str:
    el = s["seconds"] or 1e-9
    what = "file (.bin/.idx)" if s["format"] == "megatron" else ("shard" if s["shards"] == 1 else "shards")
    out = (f"packed {s['samples']} documents ({s['tokens']} tokens, {s['dtype']}, eod {s['eod']}) from "
           f"{s['inputs']} inputs ({s['input_bytes'] / 1048576:.1f} MiB, {s['documents_read']} documents read) "
           f"into {s['shards']} {what} in {el:.2f} s ({s['documents_per_s']:.0f} documents/s, "
           f"{s['input_bytes'] / 1048576 / el:.1f} MiB/s): {s['output']}")
    if s["empty_documents"]:
        out += f"\nleft out {s['empty_documents']} documents without tokens (empty text)"
    if s["skipped_lines"]:
        out += f"\nskipped {s['skipped_lines']} lines (--skip-bad): " + ", ".join(
            f"{n} {k}" for k, n in s["skipped"].items() if n)
    return out


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    if a.workers is not None and a.workers < 1:
        print("python -m ferry.pack: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        s = pack(a.inputs, a.output, a.tokenizer, json_key=a.json_key, append_eod=a.append_eod,
                 format=a.format, workers=a.workers, dtype=a.dtype, shard_size=a.shard_size,
                 skip_bad=a.skip_bad, block_size=a.block_size, add_special_tokens=a.add_special_tokens,
                 progress=not a.quiet)
    except PackError as e:
        print(f"python -m ferry.pack: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"python -m ferry.pack: {e}", file=sys.stderr)
        return 1
    print(json.dumps(s) if a.json else _summary_text(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
