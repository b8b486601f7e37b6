"""Replicated state saved once, written by all ranks (docs/CHECKPOINTS.md, "Replicated state").

Under torch.distributed, the tensors every rank holds alike (a DDP model and its optimizer) are
written once: their bytes, laid end to end in one order every rank agrees on, are cut into
``world`` contiguous ranges, and rank ``r`` writes range ``r`` into its own shard as ``uint8``
pieces named ``ferry.rep:<name>@<offset>`` (each piece gets its own xxh3 checksum, like any
tensor). The shard's ``__metadata__`` key ``ferry.replicated`` says what the pieces are:
``{"world": N, "tensors": T, "bytes": B, "pieces": [[piece, name, dtype, shape, offset], ...]}``
(T replicated tensors of B bytes in all, so that a load knows when one is missing; dtype and
shape as safetensors spells them, offset in bytes into the tensor). Every shard of a step with
replicated state has the key, an empty list of pieces when its range held nothing.

A load reads every piece of the step from storage, each straight into its place in the
reassembled tensor (one ``ferry_st_load`` per shard, the shards in parallel threads), so it needs
no collective and works at any world size, with none at all.
"""
from __future__ import annotations

import ctypes as _ctypes
import json as _json
import os as _os
from concurrent.futures import ThreadPoolExecutor as _Pool

from . import _ferry
from . import safetensors as _st

META_KEY = "ferry.replicated"
PREFIX = "ferry.rep:"
# Hashes of larger tensors are of 64 MiB chunks (a CUDA tensor is copied to the host chunk by chunk).
_CHUNK = 64 << 20


def is_piece(name) -> bool:
    return name.startswith(PREFIX)


def _check_option(replicated):
    if replicated is True or replicated is False or replicated == "auto":
        return replicated
    if isinstance(replicated, str):
        return (replicated,)
    try:
        marks = tuple(replicated)
    except TypeError:
        raise TypeError("replicated must be 'auto', True, False or names/prefixes, not %r"
                        % (replicated,)) from None
    for m in marks:
        if not isinstance(m, str) or not m:
            raise TypeError("replicated: %r is not a tensor name or prefix" % (m,))
    return marks


def _marked(name, marks):
    return any(name == m or name.startswith(m if m.endswith(".") else m + ".") for m in marks)


def _desc(v):
    """(safetensors dtype, shape, nbytes) as _st._add_tensors writes them."""
    dt = _st._st_dtype_name(v.dtype)
    shape = list(v.shape)
    if dt == "F4" and shape:
        shape[-1] *= 2
    return dt, shape, v.numel() * v.element_size()


def _bytes(v):
    return v.reshape(-1).view(_st._torch().uint8)


# splitmix64's constants, as signed int64 (torch has no uint64 arithmetic on every device)
_M1, _M2, _M3 = (c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def device_hash(b) -> int:
    """A 64-bit hash of a 1-D uint8 tensor computed where it lies (on the GPU: no copy of the state
    to the host, at the memory's speed): each 64-bit word, mixed with its index by splitmix64's
    finalizer, summed modulo 2**64 (the sum's order does not change it); the tail bytes by xxh3."""
    torch = _st._torch()
    n = b.numel()
    n8 = n // 8 * 8
    sums = []
    for lo in range(0, n8, _CHUNK):
        w = b[lo:min(n8, lo + _CHUNK)].view(torch.int64)
        x = torch.arange(lo // 8, lo // 8 + w.numel(), dtype=torch.int64, device=b.device)
        x.mul_(_M1).bitwise_xor_(w)
        x.mul_(_M2)
        x.bitwise_xor_(x >> 31)
        x.mul_(_M3)
        x.bitwise_xor_(x >> 29)
        sums.append(x.sum())
    tail = b[n8:].cpu()
    words = [int(s) & ((1 << 64) - 1) for s in (torch.stack(sums).cpu().tolist() if sums else [])]
    words += [_ferry.xxh3(tail.data_ptr(), tail.numel()) if tail.numel() else 0, n]
    d = (_ctypes.c_uint64 * len(words))(*words)
    return _ferry.xxh3(_ctypes.addressof(d), _ctypes.sizeof(d))


def content_hash(v) -> int:
    """A 64-bit hash of a tensor's bytes: on the host xxh3 of them (of 64 MiB chunks' xxh3s when
    larger), on a GPU device_hash. Ranks compare hashes of the same kind only when their tensors
    lie on the same kind of device; else the hashes differ and the tensor is saved per rank."""
    torch = _st._torch()
    b = _bytes(v)
    n = b.numel()
    if b.device.type != "cpu":
        try:
            return device_hash(b)
        except RuntimeError:  # a storage offset that no int64 view can take: through the host
            pass
    if b.device.type == "cpu" and n <= _CHUNK:
        return _ferry.xxh3(b.data_ptr(), n)
    digests = []
    host = None
    for lo in range(0, n, _CHUNK):
        part = b[lo:lo + _CHUNK]
        if part.device.type != "cpu":
            if host is None:
                host = torch.empty(min(n, _CHUNK), dtype=torch.uint8,
                                   pin_memory=torch.cuda.is_available())
            host[:part.numel()].copy_(part)
            part = host[:part.numel()]
        digests.append(_ferry.xxh3(part.data_ptr(), part.numel()))
    if len(digests) == 1:
        return digests[0]
    d = (_ctypes.c_uint64 * len(digests))(*digests)
    return _ferry.xxh3(_ctypes.addressof(d), _ctypes.sizeof(d))


def hashes(tensors) -> list:
    """content_hash of each tensor; the host ones' 64 MiB chunks hashed by up to 4 threads at once
    (xxh3 releases the GIL: one thread hashed at 1.3-2.8 GB/s on the 2-core CPU machine, less than
    the save's own pipeline, which copies and hashes on two threads)."""
    out = [None] * len(tensors)
    jobs, parts = [], {}
    for i, v in enumerate(tensors):
        if v.device.type != "cpu":
            out[i] = content_hash(v)
            continue
        b = _bytes(v)
        n = b.numel()
        parts[i] = [None] * max(1, -(-n // _CHUNK))
        for j, lo in enumerate(range(0, n, _CHUNK)):
            jobs.append((i, j, b.data_ptr() + lo, min(_CHUNK, n - lo)))

    def run(job):
        i, j, ptr, n = job
        parts[i][j] = _ferry.xxh3(ptr, n)

    threads = min(4, _os.cpu_count() or 1, len(jobs))
    if threads > 1:
        with _Pool(threads) as pool:
            list(pool.map(run, jobs))
    else:
        for job in jobs:
            run(job)
    for i, digests in parts.items():
        if len(digests) == 1:
            out[i] = digests[0]
        else:
            d = (_ctypes.c_uint64 * len(digests))(*digests)
            out[i] = _ferry.xxh3(_ctypes.addressof(d), _ctypes.sizeof(d))
    return out


def plan(items, rank, world, dist, replicated):
    """Splits a save's ``[(name, tensor)]`` (contiguous) into what this rank writes.

    Returns ``(items, metadata value or None, replicated bytes)``: the rank-local tensors followed
    by this rank's pieces, the ``ferry.replicated`` value, and the bytes of state found replicated.
    A collective (two ``all_gather_object`` with "auto", one otherwise) on every rank; nothing
    without torch.distributed or with one rank.
    """
    replicated = _check_option(replicated)
    if dist is None or world <= 1 or replicated is False:
        return items, None, 0
    tensors = dict(items)
    descs = {k: _desc(v) for k, v in items}
    marks = None if replicated is True or replicated == "auto" else replicated
    mine = [(k, dt, tuple(shape), nb) for k, (dt, shape, nb) in descs.items()
            if nb and (marks is None or _marked(k, marks))]
    every = [None] * world
    dist.all_gather_object(every, mine)
    sets = [set(x) for x in every]
    agreed = [e for e in every[0] if all(e in s for s in sets)]
    if replicated != "auto":
        # The caller says so: every rank must hold each alike (else a load would get another rank's).
        odd = sorted({e[0] for s in sets for e in s} - {e[0] for e in agreed})
        if odd:
            raise ValueError("replicated=%r: %s%s: not the same name, dtype and shape on every rank"
                             % (replicated, ", ".join(odd[:8]), " ..." if len(odd) > 8 else ""))
    else:
        mine_h = hashes([tensors[e[0]] for e in agreed])
        every_h = [None] * world
        dist.all_gather_object(every_h, mine_h)
        agreed = [e for i, e in enumerate(agreed) if all(h[i] == mine_h[i] for h in every_h)]
    if not agreed:
        return items, None, 0
    total = sum(e[3] for e in agreed)
    lo_r, hi_r = total * rank // world, total * (rank + 1) // world
    rep = {e[0] for e in agreed}
    out = [(k, v) for k, v in items if k not in rep]
    pieces = []
    at = 0
    for name, dt, shape, nb in agreed:
        a, b = max(lo_r, at), min(hi_r, at + nb)
        if a < b:
            piece = "%s%s@%d" % (PREFIX, name, a - at)
            out.append((piece, _bytes(tensors[name])[a - at:b - at]))
            pieces.append([piece, name, dt, list(shape), a - at])
        at += nb
    meta = _json.dumps({"world": world, "tensors": len(agreed), "bytes": total, "pieces": pieces},
                       separators=(",", ":"))
    return out, meta, total


# ------------------------------------------------------------------------------------ loads

def _corrupt(what):
    """ferry.Error FERRY_ECORRUPT, as the C library raises it for a malformed file."""
    e = _ferry.Error("[FERRY_ECORRUPT] %s" % what)
    e.code, e.name, e.strerror = _ferry.ERROR_CODES["FERRY_ECORRUPT"], "FERRY_ECORRUPT", what
    return e


def _table(ctx, paths):
    """{name: (dtype, shape, [(path, piece, offset, nbytes)])} of a step's shards, or None when
    they hold no replicated state; ferry.Error FERRY_ECORRUPT when the pieces do not make up
    every replicated tensor."""
    found, out, counts = [], {}, set()
    for p in paths:
        st = _ferry.st_open(ctx, p)
        md = st.metadata().get(META_KEY)
        if md is None:
            continue
        found.append(p)
        sizes = {t[0]: t[4] for t in st.tensors()}
        try:
            md = _json.loads(md)
            counts.add((md["tensors"], md["bytes"]))
            for piece, name, dt, shape, off in md["pieces"]:
                if piece not in sizes:
                    raise _corrupt("%s: __metadata__[%r] names piece %r, which the shard does not hold"
                                   % (p, META_KEY, piece))
                e = out.setdefault(name, (dt, tuple(shape), []))
                if (dt, tuple(shape)) != e[:2]:
                    raise _corrupt("%s: replicated tensor %r is %s%s here, %s%s in another shard"
                                   % (p, name, dt, list(shape), e[0], list(e[1])))
                e[2].append((p, piece, int(off), sizes[piece]))
        except (ValueError, KeyError, TypeError) as e:
            raise _corrupt("%s: __metadata__[%r] is malformed: %r" % (p, META_KEY, e)) from None
    if not found:
        return None
    step = _os.path.dirname(paths[0])
    if len(found) != len(paths):
        raise _corrupt("%s: %s: no __metadata__[%r], which the step's other shards have"
                       % (step, ", ".join(sorted(set(paths) - set(found))), META_KEY))
    if len(counts) != 1:
        raise _corrupt("%s: the shards disagree on the replicated tensors: %s" % (step, sorted(counts)))
    (count, total), = counts
    if len(out) != count:
        raise _corrupt("%s: %d replicated tensors, pieces of %d are in the step's shards"
                       % (step, count, len(out)))
    for name, (dt, shape, parts) in out.items():
        nb = 1
        for s in shape:
            nb *= s
        nb = nb * _ferry.dtype_bits(dt) // 8
        parts.sort(key=lambda x: x[2])
        at = 0
        for p, piece, off, n in parts:
            if off != at:
                raise _corrupt("%s: replicated tensor %r: bytes [%d, %d) are in no shard of the step"
                               % (step, name, at, off) if off > at else
                               "%s: replicated tensor %r: pieces overlap at byte %d" % (p, name, off))
            at += n
        if at != nb:
            raise _corrupt("%s: replicated tensor %r: bytes [%d, %d) are in no shard of the step"
                           % (step, name, at, nb))
    return out


def shard_keys(ctx, path):
    """The names of a shard that are not replicated pieces, or None when it holds none."""
    st = _ferry.st_open(ctx, path)
    if META_KEY not in st.metadata():
        return None
    return [t[0] for t in st.tensors() if not is_piece(t[0])]


def restore(ctx, paths, device, verify, views):
    """The replicated tensors of a step (its shards' ``paths``), reassembled: ``{name: tensor}``
    (empty when there are none). Every piece is read from storage into its place; ``verify``
    checks each piece's stored checksum."""
    table = _table(ctx, paths)
    if not table:
        return {}
    torch = _st._torch()
    dev, index = _st._device(device)
    dtypes = _st._torch_dtypes()
    out, dests = {}, {}  # dests: path -> [(piece, ptr, nbytes)]
    sizes = {}
    for name, (dt, shape, parts) in table.items():
        if dt not in dtypes:
            raise _st.SafetensorError("tensor %r has dtype %s, which this torch (%s) has no dtype for"
                                      % (name, dt, torch.__version__))
        sizes[name] = sum(p[3] for p in parts)
    if views:
        # One allocation, each tensor at a 64-byte aligned offset of it.
        offs, at = {}, 0
        for name in table:
            offs[name] = at
            at += (sizes[name] + 63) & ~63
        buf = torch.empty((at,), dtype=torch.uint8, device=dev)
        raw = {n: buf[offs[n]:offs[n] + sizes[n]] for n in table}
    else:
        raw = {n: torch.empty((sizes[n],), dtype=torch.uint8, device=dev) for n in table}
    for name, (dt, shape, parts) in table.items():
        base = raw[name].data_ptr()
        for p, piece, off, n in parts:
            dests.setdefault(p, []).append((piece, base + off, n))
        out[name] = raw[name].view(dtypes[dt]).view(_st._torch_shape(name, dt, shape))
    _st._sync_device(dev)
    flags = _ferry.LOAD_VERIFY if verify else 0

    def read(p):
        ld = _ferry.load_open(ctx, p)
        for piece, _, _ in dests[p]:
            ld.select(piece)
        at = {e[0]: i for i, e in enumerate(ld.entries())}
        for piece, ptr, n in dests[p]:
            ld.set_dest(at[piece], ptr, n)
        ld.run(index, flags, 0)

    if len(dests) == 1:
        read(next(iter(dests)))
    else:
        with _Pool(min(len(dests), 8)) as pool:
            list(pool.map(read, dests))
    return out


def load_file(directory, step, world, path, device, verify, views, context):
    """``ferry.safetensors.load_file(path)`` of a step's shard (or of its manifest: every shard),
    with the step's replicated tensors reassembled in place of their pieces."""
    from . import default_context
    ctx = context if context is not None else default_context()
    d = _os.fspath(directory)
    paths = [_ferry.ckpt_path(d, step, k, world) for k in range(world)]
    own = [path] if path in paths else paths
    keys = shard_keys(ctx, own[0])
    if keys is None:
        return _st.load_file(path, device, verify=verify, views=views, context=context)
    for p in own[1:]:
        keys += shard_keys(ctx, p) or []
    flat = _st.load_file(path, device, keys=keys, verify=verify, views=views, context=context) if keys else {}
    flat.update(restore(ctx, paths, device, verify, views))
    return flat
