"""Weights into N ranks, each byte read once (issue 28): ``load_file(..., distributed=True)``.

Every rank reads the header (bytes, not tensors), so every rank makes the same plan: the tensors a
``slices`` rule cuts are read by each rank for its own slice (nothing to exchange); every other
tensor is read by one owner rank, chosen so that the ranks' shares are balanced by bytes (largest
first, to the least loaded rank), and broadcast from it. Small tensors of one owner travel packed
in buckets (one broadcast per bucket instead of one per tensor). The call is collective: every rank
of the group must make it with the same file set, which is checked first.
"""
from __future__ import annotations

import hashlib as _hashlib
import os as _os

BUCKET_BYTES = 64 << 20  # one broadcast carries at most this much of small tensors


def _group_info(torch, distributed):
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("load_file(distributed=...): torch.distributed has no process group "
                         "(call torch.distributed.init_process_group first, or leave distributed off)")
    group = None if distributed is True else distributed
    return dist, group, dist.get_rank(group), dist.get_world_size(group)


def plan_owners(sizes, world):
    """{name: owner rank} for the names of ``sizes`` ({name: bytes}, in file order): largest first
    to the rank holding the fewest bytes so far (the lowest rank on a tie), so every rank that
    calls it with the same sizes gets the same answer."""
    load = [0] * world
    owner = {}
    for name in sorted(sizes, key=lambda n: -sizes[n]):  # stable: file order among equal sizes
        r = min(range(world), key=lambda k: (load[k], k))
        owner[name] = r
        load[r] += sizes[name]
    return owner


def load(filename, tensors, *, keys, slices, views, distributed, local, torch_dtype, torch_shape, dev):
    """tensors: [(name, dtype name, shape, nbytes)] of the set in file order (its headers, parsed
    once by the caller); local(keys, slices): this rank's own read, a plain load of the set
    opened already."""
    import torch

    dist, group, rank, world = _group_info(torch, distributed)
    if keys is not None:
        if isinstance(keys, str):
            keys = [keys]
        known = {t[0] for t in tensors}
        for k in keys:
            if k not in known:
                raise KeyError("%s: no tensor %r" % (_os.fspath(filename), k))
        wanted = set(keys)
        tensors = [t for t in tensors if t[0] in wanted]
    cut = {}
    if callable(slices):
        for name, _dt, shape, _nb in tensors:
            spec = slices(name, tuple(shape))
            if spec is not None:
                cut[name] = spec
    elif slices:
        cut = dict(slices)
    # the same file set on every rank, or the broadcasts below would pair different tensors
    h = _hashlib.sha256(repr([(n, d, list(s), b, n in cut) for n, d, s, b in tensors]).encode()).hexdigest()
    seen = [None] * world
    dist.all_gather_object(seen, h, group=group)
    if len(set(seen)) != 1:
        bad = [r for r in range(world) if seen[r] != seen[0]]
        raise ValueError("load_file(distributed=...): rank%s %s named other tensors than rank 0 (%s): "
                         "every rank must load the same file set with the same keys and slices"
                         % ("s" if len(bad) > 1 else "", ", ".join(map(str, bad)), _os.fspath(filename)))
    whole = {n: b for n, _d, _s, b in tensors if n not in cut}
    owner = plan_owners(whole, world)
    mine = [n for n in whole if owner[n] == rank]
    got = local(mine, cut) if mine or cut else {}
    out = {}
    # broadcasts, in the same order on every rank: per owner, its tensors in file order, small
    # ones packed into buckets
    info = {n: (d, s, b) for n, d, s, b in tensors}
    for r in range(world):
        src = dist.get_global_rank(group, r) if group is not None else r
        names = [n for n in whole if owner[n] == r]
        bucket, size = [], 0
        for i, n in enumerate(names + [None]):
            nb = info[n][2] if n is not None else 0
            if n is not None and nb < BUCKET_BYTES and size + _aligned(nb) <= BUCKET_BYTES:
                bucket.append(n)
                size += _aligned(nb)
                continue
            if bucket:
                _send_bucket(torch, dist, group, src, rank == r, bucket, size, got, out, info, dev,
                             torch_dtype, torch_shape, views)
            bucket, size = [], 0
            if n is not None:
                if nb < BUCKET_BYTES:
                    bucket, size = [n], _aligned(nb)
                else:
                    t = got[n] if rank == r else torch.empty(torch_shape(n, info[n][0], info[n][1]),
                                                               dtype=torch_dtype(n, info[n][0]), device=dev)
                    if nb:
                        dist.broadcast(_bytes_of(t), src, group=group)
                    out[n] = t
    for n in cut:
        out[n] = got[n]
    return {n: out[n] for n, _d, _s, _b in tensors}


def _bytes_of(t):
    import torch
    return t.reshape(-1).view(torch.uint8)


def _aligned(n):
    return (n + 15) & ~15  # each tensor's place in a bucket is aligned for any dtype's view


def _send_bucket(torch, dist, group, src, is_src, names, size, local, out, info, dev, torch_dtype,
                 torch_shape, views):
    buf = torch.empty(size, dtype=torch.uint8, device=dev)
    if is_src:
        at = 0
        for n in names:
            nb = info[n][2]
            if nb:
                buf[at:at + nb].copy_(_bytes_of(local[n]))
            at += _aligned(nb)
            out[n] = local[n]
        if size:
            dist.broadcast(buf, src, group=group)
        return
    if size:
        dist.broadcast(buf, src, group=group)
    at = 0
    for n in names:
        dt, shape, nb = info[n]
        dtype = torch_dtype(n, dt)
        tshape = torch_shape(n, dt, shape)
        # views=True: tensors share the bucket's memory, as a plain load's share their file's region
        t = buf[at:at + nb].view(dtype).reshape(tshape) if nb else torch.empty(tshape, dtype=dtype, device=dev)
        at += _aligned(nb)
        out[n] = t if views or not nb else t.clone()
