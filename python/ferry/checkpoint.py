"""Training checkpoints: durable, asynchronous, one shard per rank (docs/CHECKPOINTS.md, "Python").

::

    import ferry.checkpoint as ckpt

    ckpt.save({"model": model.state_dict(), "optim": opt.state_dict()}, "ckpts", step=100)
    h = ckpt.async_save(state, "ckpts", step=200)     # returns once the tensors are snapshotted
    ...                                               # training goes on, tensors may change
    h.wait()                                          # raises the save's error, if any
    step, state = ckpt.load_latest("ckpts", device="cuda")

The directory layout and the commit protocol are the C API's (include/ferry/ckpt.h): each rank
writes ``step-N/rank-R-of-W.safetensors`` and a marker, rank 0 writes the manifest and moves
``latest`` once every rank's marker is in, then prunes to ``keep`` steps. When torch.distributed
is initialised, rank and world size come from it, the ranks agree on a run id (a broadcast, the
first time a directory is used) and ``save`` ends with a collective, so that it returns on every
rank once the step is committed (or raises on every rank when one rank failed).

Nested state (dicts, lists, tuples of tensors and plain values, such as an optimizer's
state_dict) is flattened to tensor names joined by ``.`` (``optim.state.0.exp_avg``); the
structure and the non-tensor values are stored as JSON in the shard's ``__metadata__``
(``ferry.tree``), and ``load_latest`` rebuilds it. A flat ``dict[str, Tensor]`` is stored as is.
"""
from __future__ import annotations

import errno as _errno
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
import uuid as _uuid
import warnings as _warnings

from . import _ferry
from . import _progress
from . import _replicated
from . import default_context as _default_context
from . import safetensors as _st

__all__ = ["save", "async_save", "prepare", "load_latest", "load", "latest_step", "verify", "prune",
           "flatten", "unflatten", "SaveHandle"]

TREE_KEY = "ferry.tree"


# ---------------------------------------------------------------------------------- nesting

def flatten(state) -> tuple:
    """``(flat, tree)``: the tensors of a nested state under dotted names, and the structure as a
    JSON-able object (None when ``state`` is already a flat ``dict[str, Tensor]``).

    Dict keys may be str or int (optimizer states use ints); containers are dict, list and tuple;
    other leaves must be None, bool, int, float or str. Two paths that give the same name raise
    ValueError.
    """
    torch = _st._torch()
    if isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                       for k, v in state.items()):
        return dict(state), None
    flat = {}

    def walk(node, path):
        if isinstance(node, torch.Tensor):
            name = ".".join(path)
            if not name:
                raise ValueError("the state is a bare tensor: give a dict")
            if name in flat:
                raise ValueError("two entries of the state flatten to the same name %r" % name)
            flat[name] = node
            return {"T": name}
        if isinstance(node, dict):
            pairs = []
            for k, v in node.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError("state key %r at %r: only str and int keys can be saved"
                                    % (k, ".".join(path)))
                pairs.append([k, walk(v, path + [str(k)])])
            return {"D": pairs}
        if isinstance(node, (list, tuple)):
            items = [walk(v, path + [str(i)]) for i, v in enumerate(node)]
            return {"U" if isinstance(node, tuple) else "L": items}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"V": node}
        raise TypeError("state entry %r is a %s: only tensors, dicts, lists, tuples, None, bool, "
                        "int, float and str can be saved" % (".".join(path), type(node).__name__))

    tree = walk(state, [])
    return flat, tree


def unflatten(flat: dict, tree):
    """The inverse of flatten: ``unflatten(*flatten(state))`` equals ``state``."""
    if tree is None:
        return flat

    def build(node):
        (kind, v), = node.items()
        if kind == "T":
            return flat[v]
        if kind == "D":
            return {k: build(x) for k, x in v}
        if kind == "L":
            return [build(x) for x in v]
        if kind == "U":
            return tuple(build(x) for x in v)
        return v

    return build(tree)


# ------------------------------------------------------------------------------ distributed

def _dist():
    """torch.distributed when it is initialised, else None (torch is imported only if loaded)."""
    import sys
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _ranks(rank, world_size):
    dist = _dist()
    if dist is not None:
        r, w = dist.get_rank(), dist.get_world_size()
        if (rank is not None and rank != r) or (world_size is not None and world_size != w):
            raise ValueError("rank=%r, world_size=%r disagree with torch.distributed (rank %d of %d)"
                             % (rank, world_size, r, w))
        return r, w, dist
    w = 1 if world_size is None else int(world_size)
    r = 0 if rank is None else int(rank)
    if not 0 <= r < w:
        raise ValueError("rank %d of world_size %d" % (r, w))
    return r, w, None


# ------------------------------------------------------------------------------------ saves

_handles = {}  # (realpath, rank, world) -> _Dir
_handles_lock = _threading.Lock()


class _Dir:
    """One checkpoint directory as this rank writes it: the C handle (its pinned slots are reused
    from save to save) and the save in flight."""

    def __init__(self, ctx, directory, rank, world, run):
        self.args = (ctx, directory, rank, world)
        self.run = run
        self.inflight = None  # the SaveHandle of the last async save, until settled
        self.lock = _threading.Lock()
        self.preparing, self.prepare_error = None, None  # prepare(background=True)
        self.renew()

    def renew(self):
        """A fresh C handle: the C API forgets added tensors at each save, not when an add fails."""
        self.ck = _ferry.ckpt_open(*self.args)
        if self.run:
            self.ck.set("run", self.run)


def _is_url(d):
    """An s3:// prefix (docs/REMOTE.md): its objects are read and written by the C library."""
    return isinstance(d, str) and "://" in d


def _open_dir(directory, rank, world, dist, run, context):
    d = _os.fspath(directory)
    key = (d if _is_url(d) else _os.path.realpath(d), rank, world)
    with _handles_lock:
        d = _handles.get(key)
    if d is not None and (run is None or run == d.run):
        return d
    if run is None:
        run = _os.environ.get("FERRY_CKPT_RUN") or ""
        if dist is not None:
            # The ranks of one run agree on an id, so that rank 0 never counts a marker left by
            # another run (a crashed one, or one with another world size) as this one's.
            obj = [_uuid.uuid4().hex if rank == 0 else None]
            dist.broadcast_object_list(obj, src=0)
            run = obj[0]
    ctx = context if context is not None else _default_context()
    d = _Dir(ctx, _os.fspath(directory), rank, world, run)
    with _handles_lock:
        old = _handles.get(key)
        _handles[key] = d
    if old is not None and old.inflight is not None:
        old.inflight._settle()
    return d


class SaveHandle:
    """An asynchronous checkpoint save (``async_save``): ``done()``, ``wait(timeout=None)``.

    ``wait`` returns True once the save has ended (False if ``timeout`` seconds passed first) and
    raises its error, every time it is called after the failure. On rank 0 the save ends when
    the step is committed (every rank's marker seen, ``latest`` moved); on the other ranks when
    this rank's shard and marker are durable.
    """

    def __init__(self, d, step, phases=None):
        self._d, self._ck, self.step = d, d.ck, step
        self._finished, self._error = False, None
        self._phases = dict(phases or {})
        self._progress = None  # async_save(progress=): reported by wait()

    def phases(self) -> dict:
        """Where the save's time went, in seconds: ``py.*`` (this module, on the caller's thread),
        ``call.*`` and ``ckpt.prepare`` (ferry's C save on the caller's thread), ``writer.*`` (the
        background writer; complete once ``done()``), and ``blocked``: how long ``async_save``
        blocked the caller. Also ``bytes``, ``slots`` and ``pinned_new_bytes`` (pinned memory this
        save allocated: 0 once the slots are reused or were reserved by ``prepare``), and
        ``replicated_bytes`` (the state found alike on every rank, of which this rank wrote 1/world)."""
        out = dict(self._phases)
        try:
            out.update(self._ck.stats())
        except RuntimeError:  # another thread uses the handle: the Python side only
            pass
        return out

    def done(self) -> bool:
        """True when the save has ended (successfully or not); never blocks."""
        return self._finished or bool(self._ck.done())

    def _settle(self, timeout=None):
        """Waits without raising; True when finished."""
        if self._finished:
            return True
        with self._d.lock:
            if self._finished:
                return True
            try:
                finished, _ = self._ck.wait(timeout)
            except Exception as e:  # noqa: BLE001 (kept for wait(), raised there)
                finished, self._error = True, e
            if finished:
                self._finished = True
                if self._d.inflight is self:
                    self._d.inflight = None
        return self._finished

    def _settle_reporting(self, timeout):
        """_settle in slices of the progress interval, reporting between them."""
        rep = self._progress
        end = None if timeout is None else _time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - _time.monotonic())
            step = rep.due() or _progress.INTERVAL
            if self._settle(step if left is None else min(step, left)):
                if self._error is None:
                    rep.finish()
                else:
                    rep.close()
                self._progress = None
                return True
            if left is not None and left <= 0:
                return False
            rep.tick()

    def wait(self, timeout=None) -> bool:
        if self._progress is not None and not self._finished:
            settled = self._settle_reporting(timeout)
        else:
            settled = self._settle(timeout)
        if not settled:
            return False
        if self._error is not None:
            raise self._error
        return True

    def result(self, timeout=None) -> int:
        """The step, once saved (raises the save's error; TimeoutError if not done in time)."""
        if not self.wait(timeout):
            raise TimeoutError("checkpoint step %d is still being saved" % self.step)
        return self.step

    def exception(self, timeout=None):
        if not self._settle(timeout):
            raise TimeoutError("checkpoint step %d is still being saved" % self.step)
        return self._error

    def __repr__(self):
        state = "running" if not self.done() else "failed" if self._error else "done"
        return "<ferry.checkpoint.SaveHandle step=%d %s>" % (self.step, state)


_COMPRESS = {None: "off", False: "off", True: "auto", "off": "off", "lz4": "lz4", "zstd": "zstd",
             "auto": "auto"}


def _save(state, directory, step, rank, world_size, keep, metadata, checksum, busy, run, timeout,
          context, async_, recycle=None, replicated="auto", compress=None):
    t0 = t = _time.perf_counter()
    ph = {}

    def lap(name):
        nonlocal t
        now = _time.perf_counter()
        ph[name] = ph.get(name, 0.0) + now - t
        t = now

    if busy not in ("wait", "refuse"):
        raise ValueError("busy must be 'wait' or 'refuse', not %r" % (busy,))
    if not isinstance(compress, (str, bool, type(None))) or compress not in _COMPRESS:
        raise ValueError("compress must be None, a bool, 'zstd', 'lz4', 'auto' or 'off', not %r" % (compress,))
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 63:
        raise ValueError("step must be an int from 0 to 2**63-1, not %r" % (step,))
    rank, world, dist = _ranks(rank, world_size)
    flat, tree = flatten(state)
    items = _st._check_tensors(flat, shared_ok=True, contiguous_ok=True)
    metadata = dict(_st._check_metadata(metadata))
    if TREE_KEY in metadata:
        raise ValueError("metadata key %r is ferry's own" % TREE_KEY)
    if tree is not None:
        metadata[TREE_KEY] = _json.dumps(tree, separators=(",", ":"))
    if _replicated.META_KEY in metadata:
        raise ValueError("metadata key %r is ferry's own" % _replicated.META_KEY)
    lap("py.flatten")  # and the checks (a non-contiguous tensor is copied here)
    items, rep_meta, ph["replicated_bytes"] = _replicated.plan(items, rank, world, dist, replicated)
    if rep_meta is not None:
        metadata[_replicated.META_KEY] = rep_meta
    lap("py.replicated")  # what every rank holds alike: the collectives, and hashing with "auto"
    d = _open_dir(directory, rank, world, dist, run, context)
    lap("py.open")
    _join_prepare(d)
    with d.lock:
        prev = d.inflight
    if prev is not None and busy == "wait":
        prev._settle()  # its result stays with its handle; the C save would otherwise take it
    lap("py.previous")  # waiting for the save in flight (busy="wait") or for prepare()
    ck = d.ck
    with d.lock:
        ck.set("busy", busy)
        ck.set("compress", _COMPRESS[compress])  # per save: the handle outlives it
        if keep is not None:
            ck.set("keep", str(int(keep)))
        if checksum is not None:
            ck.set("checksum", "1" if checksum else "0")
        if recycle is not None:
            ck.set("recycle", "1" if recycle else "0")
        if timeout is not None:
            ck.set("timeout_ms", str(int(timeout * 1000)))
        error, saving = None, False
        try:
            devices = _st._add_tensors(ck, items)
            lap("py.add")
            for dev in devices:
                _st._sync_device(dev)
            lap("py.device_sync")  # work queued on the current stream, which the snapshot must follow
            for k, v in metadata.items():
                ck.metadata(k, v)
            saving = True
            lap("py.add")
            ck.save(step, 0, async_)
            lap("py.c_save")
        except BaseException as e:
            if not saving:
                d.renew()  # a save in flight keeps the old handle (its SaveHandle holds it)
            if async_ or dist is None:
                raise
            error = e
        if async_:
            ph["blocked"] = _time.perf_counter() - t0
            h = SaveHandle(d, step, ph)
            d.inflight = h
            return h
    if dist is not None:
        # The barrier of a synchronous save: it returns on every rank once rank 0 has committed
        # the step, and every rank learns of a rank that failed (rather than wait for it forever).
        errors = [None] * world
        dist.all_gather_object(errors, None if error is None else "%s: %s" % (type(error).__name__, error))
        if error is not None:
            raise error
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            raise RuntimeError("checkpoint step %d of %s: %s" % (
                step, _os.fspath(directory), "; ".join("rank %d failed: %s" % f for f in failed)))
    return None


def _join_prepare(d):
    th = getattr(d, "preparing", None)
    if th is not None:
        th.join()
        d.preparing = None
        if d.prepare_error is not None:
            e, d.prepare_error = d.prepare_error, None
            raise e


def prepare(state, directory, rank=None, world_size=None, *, run=None, background=False, replicated="auto",
            context=None) -> int:
    """Pin ahead the host memory that ``async_save(state, directory, ...)`` will snapshot into, so
    that the first asynchronous save blocks no longer than later ones. Pinning is slow (seconds
    for gigabytes); it is done once, and the memory is kept for every later save of the directory
    (within the context's ``host_budget``; what exceeds it is not pinned). ``state`` is the state
    to be saved, or a number of bytes (with the CUDA device taken as the current one when CUDA is
    initialised, else host memory). ``background=True`` pins in a thread and returns at once (0);
    the next save of the directory waits for it and raises its error. Returns the bytes of pinned
    memory held for the directory. Under torch.distributed, call it on every rank (the first use
    of a directory agrees on a run id, and ``replicated``, as in ``save``, finds what this rank
    will write of a state: its own tensors and 1/world of the replicated ones)."""
    rank, world, dist = _ranks(rank, world_size)
    if isinstance(state, int) and not isinstance(state, bool):
        nbytes, device = state, -1
        torch = _st._torch() if "torch" in _sys.modules else None
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
    else:
        flat, _ = flatten(state)
        items = _st._check_tensors(flat, shared_ok=True, contiguous_ok=True)
        items = _replicated.plan(items, rank, world, dist, replicated)[0]
        nbytes, device = 0, -1
        for _, v in items:
            nb = v.numel() * v.element_size()
            nbytes += nb
            if device < 0 and nb and v.device.type == "cuda":
                device = v.device.index if v.device.index is not None else _st._torch().cuda.current_device()
    d = _open_dir(directory, rank, world, dist, run, context)
    _join_prepare(d)
    with d.lock:
        prev = d.inflight
    if prev is not None:
        prev._settle()
    if not background:
        return d.ck.reserve(int(nbytes), int(device))

    def run_():
        try:
            d.ck.reserve(int(nbytes), int(device))
        except BaseException as e:  # noqa: BLE001 (raised by the next save)
            d.prepare_error = e

    d.prepare_error = None
    d.preparing = _threading.Thread(target=run_, name="ferry-ckpt-prepare", daemon=True)
    d.preparing.start()
    return 0


def save(state, directory, step, rank=None, world_size=None, keep=None, metadata=None, *,
         checksum=None, busy="wait", run=None, timeout=None, recycle=None, replicated="auto",
         compress=None, context=None, progress=None) -> None:
    """Save ``state`` as checkpoint ``step`` of ``directory``, durably; returns once committed.

    Args:
        state: ``dict[str, Tensor]`` or nested dicts/lists/tuples of tensors (CPU or CUDA) and
            plain values (see the module's docstring); non-contiguous tensors are copied.
        directory: the checkpoint directory (created if needed).
        step: a non-negative int, after the latest committed one (else FileExistsError).
        rank, world_size: this process's shard; default from torch.distributed when it is
            initialised, else 0 of 1.
        keep: how many committed steps to keep (0: all; default 2), pruned by rank 0 after commit.
        metadata: ``dict[str, str]`` stored in this rank's shard.
        checksum: store xxh3 checksums (default: on).
        busy: "wait" (default) or "refuse" (ferry.Error FERRY_EBUSY) while an async save of this
            directory is in flight.
        run: an id shared by the ranks of one run (default: agreed through torch.distributed,
            else $FERRY_CKPT_RUN, else ""); markers of another run are ignored.
        timeout: seconds rank 0 waits for the other ranks' markers (default 600).
        recycle: the newest pruned step's shards are kept in ``directory/recycle`` and written
            over by the next save instead of new files (default True; docs/CHECKPOINTS.md,
            "Recycled shards"): one more checkpoint's space at rest, none more at the peak.
        replicated: under torch.distributed with several ranks, tensors every rank holds alike
            are written once, each rank writing 1/world of their bytes (docs/CHECKPOINTS.md,
            "Replicated state"). "auto" (default): those with the same name, dtype, shape and
            xxh3 of their bytes on every rank (a collective, and a hash of the state at memory
            speed); True: every tensor (the ranks must hold the same names, dtypes and shapes;
            no hashing); an iterable of names or prefixes (``"model"`` marks ``model.*``): those;
            False: every rank writes all of its state. A collective: call it on every rank.
        compress: None/False/"off" (default): a safetensors shard. "zstd", "lz4", or "auto"/True
            (zstd: the codec that compresses weights; chunks that do not compress are stored):
            the shard is written compressed, ``rank-R-of-W.safetensors.fz``, ferry's compressed
            format holding the safetensors file's bytes (docs/CHECKPOINTS.md, "Compressed
            checkpoints"); ``load``, ``load_latest``, ``verify`` and ``ferry.safetensors`` read it
            through ferry, decoding on the GPU (nvCOMP) for CUDA tensors where it is loaded. Its
            integrity is the chunks' checksums (every byte, header included) rather than
            per-tensor ones. Not to an s3:// prefix yet.
        progress: None (default), a callable ``progress(done_bytes, total_bytes)`` called from
            this thread at most every 0.1 s and once at the end with done == total, or True for a
            tqdm bar (docs/PYTHON.md, "Progress").
    """
    if progress is None:
        _save(state, directory, step, rank, world_size, keep, metadata, checksum, busy, run, timeout,
              context, False, recycle, replicated, compress)
        return
    ctx = context if context is not None else _default_context()
    _progress.run(lambda: _save(state, directory, step, rank, world_size, keep, metadata, checksum,
                                busy, run, timeout, context, False, recycle, replicated, compress),
                  progress, _progress.tensor_bytes(state), _progress.ctx_counter(ctx, "bytes_written"),
                  "save step %s" % step)


def async_save(state, directory, step, rank=None, world_size=None, keep=None, metadata=None, *,
               checksum=None, busy="wait", run=None, timeout=None, recycle=None, replicated="auto",
               compress=None, context=None, progress=None) -> SaveHandle:
    """``save`` in the background: returns once every tensor is snapshotted, so the caller may
    change the tensors at once: into one copy on the GPU (device-to-device copies) where the GPU has
    room and the directory's pinned slots do not hold the state yet, as at its first save, the save's
    own thread then pinning the slots and copying the snapshot out; else into pinned host memory
    (device-to-host copies at full speed, within the context's ``host_budget`` knob; a larger state
    blocks until written parts free memory). ``FERRY_SAVE_SNAPSHOT=device|pinned`` forces a path;
    ``phases()["device_snapshot_bytes"]`` says which one ran (docs/CHECKPOINTS.md).
    Errors come from ``handle.wait()``. A second save while one is in flight waits for it
    (``busy="wait"``) or raises ferry.Error FERRY_EBUSY (``busy="refuse"``). Under
    torch.distributed no collective runs in the background: rank 0 commits when it sees every
    rank's marker on the file system; ``replicated`` (see ``save``) agrees on the replicated
    tensors on the caller's thread, before the snapshot, so call it on every rank.
    ``progress`` (as ``save``'s) reports the bytes written while ``async_save`` blocks, then while
    ``handle.wait()``/``result()`` waits (from the thread that waits), ending with done == total
    when the save has ended.
    """
    if progress is None:
        return _save(state, directory, step, rank, world_size, keep, metadata, checksum, busy, run,
                     timeout, context, True, recycle, replicated, compress)
    ctx = context if context is not None else _default_context()
    h, rep = _progress.run(lambda: _save(state, directory, step, rank, world_size, keep, metadata,
                                         checksum, busy, run, timeout, context, True, recycle,
                                         replicated, compress),
                           progress, _progress.tensor_bytes(state),
                           _progress.ctx_counter(ctx, "bytes_written"), "save step %s" % step,
                           finish=False)
    if rep is not None:
        if h is None or h.done():
            rep.finish()
        else:
            h._progress = rep
    return h


# ------------------------------------------------------------------------------------ loads

def _checkpoint_dir(directory, missing_ok):
    """The directory's path; None when it does not exist and ``missing_ok``; else
    FileNotFoundError naming it (a misspelled path must not read as "no checkpoint yet")."""
    d = _os.fspath(directory)
    if _os.path.isdir(d):
        return d
    if _is_url(d):  # a prefix exists once `latest` does (latest_step, load_latest)
        return d
    if _os.path.lexists(d):
        raise NotADirectoryError(_errno.ENOTDIR, "checkpoint directory: not a directory", d)
    if missing_ok:
        return None
    raise FileNotFoundError(_errno.ENOENT, "checkpoint directory does not exist (missing_ok=True "
                            "when a new run may start without one)", d)


def latest_step(directory, *, missing_ok=False):
    """The step ``latest`` names; None when the directory exists but has no committed step (or
    does not exist and ``missing_ok``). FileNotFoundError naming the directory when it does not
    exist; ferry.Error (FERRY_ECORRUPT) when ``latest`` is unreadable."""
    d = _checkpoint_dir(directory, missing_ok)
    if d is not None and _is_url(d):
        try:
            return _ferry.ckpt_latest(d)
        except FileNotFoundError:  # no `latest` under the prefix: nothing committed there
            return None
    return None if d is None else _ferry.ckpt_latest(d)


def _committed_steps(d, below):
    """The committed steps of ``d`` (a manifest in their directory) older than ``below`` (all
    when None), newest first: where load_latest falls back to. Step directories that are
    symlinks, or whose names ferry would not have made, are not ferry's and are skipped."""
    out = []
    if _is_url(d):  # s3://: listed by the C library (ListObjectsV2)
        return [s for s in _ferry.ckpt_steps(d) if below is None or s < below]
    for name in _os.listdir(d):
        if not name.startswith("step-") or not name[5:].isdigit():
            continue
        s = int(name[5:])
        if s >= 1 << 63 or (below is not None and s >= below):
            continue
        p = _ferry.ckpt_path(d, s)
        if _os.path.basename(p) == name and not _os.path.islink(p) and \
                _os.path.isfile(_os.path.join(p, "manifest.json")):
            out.append(s)
    return sorted(out, reverse=True)


def _manifest(directory, step):
    """``(path of the step's manifest.json, the ranks that saved the step)``; FileNotFoundError
    when the step is not committed. The manifest is read by the C library (ferry_ckpt_world)."""
    d = _os.fspath(directory)
    return _os.path.join(_ferry.ckpt_path(d, step), "manifest.json"), _ferry.ckpt_world(d, step)


def _reshard(directory, step, world, rank, world_size, shard_dims, device, verify, views, context):
    """What rank ``rank`` of ``world_size`` needs of a step saved by ``world`` ranks (flat dict)."""
    ctx = context if context is not None else _default_context()
    paths = [_ferry.ckpt_path(_os.fspath(directory), step, k, world) for k in range(world)]
    held = []  # per saved rank: {name: shape}
    for p in paths:
        held.append({t[0]: list(t[2]) for t in _ferry.st_open(ctx, p).tensors()
                     if not _replicated.is_piece(t[0])})
    rep = _replicated.restore(ctx, paths, device, verify, views)  # every rank's, whole
    for n in shard_dims:
        if n in rep:
            raise ValueError("%r: saved replicated (whole on every rank), not sharded along a dim" % n)
    names = list(dict.fromkeys(n for h in held for n in h))
    for n in shard_dims:
        if n not in names:
            raise KeyError("%s: step %d: no tensor %r (shard_dims)" % (_os.fspath(directory), step, n))
    want = [dict(keys=[], slices={}) for _ in range(world)]
    pieces = {}  # name -> [(saved rank, dim)] in rank order, for the concatenation
    for n in names:
        owners = [k for k in range(world) if n in held[k]]
        if n not in shard_dims:
            # Replicated (in every shard): read it from one saved rank, spread over the readers.
            # Held by some ranks only (a partition of per-rank state): every reader gets it.
            k = owners[rank % len(owners)] if len(owners) == world else owners[0]
            want[k]["keys"].append(n)
            pieces[n] = [(k, None)]
            continue
        dim = shard_dims[n]
        if len(owners) != world:
            raise ValueError("%r: sharded along dim %d but saved by ranks %s of %d" % (n, dim, owners, world))
        shapes = [held[k][n] for k in range(world)]
        nd = len(shapes[0])
        if not -nd <= dim < nd:
            raise ValueError("%r: dim %d of a %d-dimensional tensor" % (n, dim, nd))
        dim %= nd
        if any(len(sh) != nd or sh[:dim] + sh[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:]
               for sh in shapes):
            raise ValueError("%r: the saved pieces' shapes %s do not concatenate along dim %d" % (n, shapes, dim))
        total = sum(sh[dim] for sh in shapes)
        if total % world_size:
            raise ValueError("%r: %d along dim %d does not split evenly into %d ranks" % (n, total, dim, world_size))
        lo, hi = total // world_size * rank, total // world_size * (rank + 1)
        pieces[n] = []
        at = 0
        for k, sh in enumerate(shapes):
            a, b = max(lo, at), min(hi, at + sh[dim])
            if a < b or (lo == hi and k == 0):
                want[k]["slices"][n] = (dim, a - at, b - at) if a < b else (dim, 0, 0)
                pieces[n].append((k, dim))
            at += sh[dim]
    got = [None] * world
    for k in range(world):
        if want[k]["keys"] or want[k]["slices"]:
            v = _sums_stored(context, [paths[k]]) if verify is None else verify
            got[k] = _st.load_file(paths[k], device, keys=want[k]["keys"], slices=want[k]["slices"],
                                   verify=v, views=views, context=context)
    out = {}
    for n in names:
        parts = [got[k][n] for k, _ in pieces[n]]
        dim = pieces[n][0][1]
        out[n] = parts[0] if len(parts) == 1 else _torch().cat(parts, dim)
    out.update(rep)
    return out


def _torch():
    import torch
    return torch


def load(directory, step, device="cpu", *, rank=None, world_size=None, shard_dims=None, verify=None,
         views=True, nested=True, context=None, progress=None):
    """Load checkpoint ``step``: this rank's shard (``rank``; default torch.distributed's rank
    when it is initialised and the checkpoint was saved by as many ranks, else all shards of a
    one-rank checkpoint); ``rank="all"`` merges every shard (names must differ between shards).
    ``nested=False`` returns the flat ``dict[str, Tensor]`` even when the state was nested.
    ``verify`` checks every loaded tensor against its stored checksum (ferry.Error FERRY_EVERIFY
    on a mismatch): a damaged step raises, it never comes back as data. None (default): verify
    each shard that stores checksums (every save does, unless ``checksum=False``); True: also
    fail on a tensor without one; False: no check.

    Resharding (a step saved by N ranks, loaded by M): give ``world_size`` (default
    torch.distributed's) different from N, or ``shard_dims``, ``{name: dim}`` of the tensors
    each saved rank held a piece of (the pieces, in rank order, concatenate along ``dim``): rank
    ``rank`` gets the M-th part ``rank`` of each such tensor along ``dim`` (reading only the
    overlapping rows of each saved shard), a tensor every shard holds otherwise (replicated) from
    one of them, and a tensor only some shards hold as it is. Returns the flat dict.

    ``progress``: None (default), a callable ``progress(done_bytes, total_bytes)`` called from
    this thread at most every 0.1 s and once at the end with done == total, or True for a tqdm
    bar (docs/PYTHON.md, "Progress")."""
    if progress is None:
        return _load(directory, step, device, rank, world_size, shard_dims, verify, views, nested,
                     context)
    _, world = _manifest(directory, step)
    paths = [_ferry.ckpt_path(_os.fspath(directory), step, k, world) for k in range(world)]
    if rank is None and world > 1 and world_size is None and shard_dims is None:
        dist = _dist()
        rank = dist.get_rank() if dist is not None and dist.get_world_size() == world else rank
    if isinstance(rank, int) and 0 <= rank < world and shard_dims is None and world_size in (None, world):
        paths = [paths[rank]]
    ctx = context if context is not None else _default_context()
    return _progress.run(lambda: _load(directory, step, device, rank, world_size, shard_dims, verify,
                                       views, nested, context),
                         progress, sum(_progress.load_total(p) for p in paths),
                         _progress.ctx_counter(ctx, "bytes_read"), "load step %s" % step)


def _load(directory, step, device, rank, world_size, shard_dims, verify, views, nested, context):
    mpath, world = _manifest(directory, step)
    if rank != "all" and (shard_dims is not None or (world_size is not None and world_size != world)):
        dist = _dist()
        if world_size is None:
            world_size = dist.get_world_size() if dist is not None else world
        if rank is None:
            if dist is None:
                raise ValueError("resharding needs rank= (torch.distributed is not initialised)")
            rank = dist.get_rank()
        if not 0 <= int(rank) < int(world_size):
            raise ValueError("rank %r of world_size %r" % (rank, world_size))
        return _reshard(directory, step, world, int(rank), int(world_size), dict(shard_dims or {}),
                        device, verify, views, context)
    if rank is None:
        dist = _dist()
        if dist is not None and dist.get_world_size() == world:
            rank = dist.get_rank()
        elif world == 1:
            rank = 0
        else:
            raise ValueError("%s: step %d has %d shards; give rank=N or rank='all'" % (directory, step, world))
    if rank == "all":
        path = mpath
    else:
        if not 0 <= int(rank) < world:
            raise ValueError("rank %r: step %d was saved by %d ranks" % (rank, step, world))
        path = _ferry.ckpt_path(_os.fspath(directory), step, int(rank), world)
    if verify is None:
        verify = _sums_stored(context, [_ferry.ckpt_path(_os.fspath(directory), step, k, world)
                                        for k in range(world)] if rank == "all" else [path])
    flat = _replicated.load_file(directory, step, world, path, device, verify, views, context)
    if not nested or rank == "all":
        return flat
    ctx = context if context is not None else _default_context()
    tree = _ferry.st_open(ctx, path).metadata().get(TREE_KEY)
    if not tree:
        return flat
    try:
        return unflatten(flat, _json.loads(tree))
    except ValueError as e:  # json.JSONDecodeError included: its position is in the message
        raise _corrupt("%s: __metadata__[%r]: not the JSON of a state's structure: %s"
                       % (path, TREE_KEY, e)) from None
    except (KeyError, TypeError, AttributeError) as e:
        raise _corrupt("%s: __metadata__[%r]: names no tensor of the file or is malformed: %r"
                       % (path, TREE_KEY, e)) from None


def _sums_stored(context, paths):
    """True when any of the files holds a checksum (a shard saved with ``checksum=False`` holds
    none, and loads unverified under ``verify=None``; one that holds some is verified whole, so a
    tensor whose checksum went missing fails)."""
    ctx = context if context is not None else _default_context()
    for p in paths:
        if any(k.startswith(_CHECKSUM_PREFIX) for k in _ferry.st_open(ctx, p).metadata()):
            return True
    return False


_CHECKSUM_PREFIX = "ferry.xxh3:"  # FERRY_ST_CHECKSUM_PREFIX (ferry/safetensors.h)


def _corrupt(what):
    """ferry.Error FERRY_ECORRUPT, as the C library raises it for a malformed file."""
    e = _ferry.Error("[FERRY_ECORRUPT] %s" % what)
    e.code, e.name, e.strerror = _ferry.ERROR_CODES["FERRY_ECORRUPT"], "FERRY_ECORRUPT", what
    return e


def _bad_step(e):
    """True for the errors of a step that is damaged (load_latest falls back to an older one),
    False for the caller's or the machine's (raised as they are)."""
    if isinstance(e, _ferry.Error):
        return e.code in (_ferry.ERROR_CODES["FERRY_ECORRUPT"], _ferry.ERROR_CODES["FERRY_EVERIFY"])
    return isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError))


def load_latest(directory, device="cpu", *, rank=None, world_size=None, shard_dims=None, verify=None,
                views=True, nested=True, missing_ok=False, context=None, progress=None) -> tuple:
    """``(step, state)`` of the newest committed step that loads (and verifies), or ``(None,
    {})`` when the directory exists and has no committed step (or does not exist and
    ``missing_ok``). Takes load's keyword arguments (``world_size`` and ``shard_dims`` to
    reshard).

    ``verify`` as in ``load``: by default every loaded tensor is checked against its stored
    checksum (shards saved with ``checksum=False`` have none). When the step ``latest`` names fails (a checksum mismatch, a corrupt or missing manifest or shard, or
    an unreadable ``latest``), it falls back to the newest older committed step that loads, with
    a warning naming the bad step and why; ferry.Error (FERRY_ECORRUPT) when none does. Raises
    FileNotFoundError naming ``directory`` when it does not exist (unless ``missing_ok``). Under
    torch.distributed it is a collective: every rank calls it, and all return the same step (the
    newest that loads on every rank). ``progress`` as in ``load``, for each step it loads."""
    d = _checkpoint_dir(directory, missing_ok)
    if d is None or (_is_url(d) and latest_step(d) is None):
        return None, {}
    bad = {}  # step -> why it did not load, on this rank
    try:
        latest = _ferry.ckpt_latest(d)
    except _ferry.Error as e:  # `latest` unreadable: the committed steps are still there
        if not _bad_step(e):
            raise
        latest, bad["latest"] = None, e
    steps = ([latest] if latest is not None else []) + _committed_steps(d, latest)
    if latest is None and "latest" not in bad:
        steps = []  # no step committed yet (a manifest without `latest` is an interrupted commit)
    dist = _dist()
    bound = None  # under torch.distributed: steps newer than one another rank could not load are out
    while True:
        step, state, fatal = None, None, None
        for s in steps:
            if (bound is not None and s > bound) or s in bad:
                continue
            try:
                state = load(d, s, device, rank=rank, world_size=world_size, shard_dims=shard_dims,
                             verify=verify, views=views, nested=nested, context=context,
                             progress=progress)
                step = s
                break
            except Exception as e:  # noqa: BLE001 (sorted by _bad_step; raised on every rank)
                if not _bad_step(e):
                    fatal = e
                    break
                bad[s] = e
        if dist is None:
            if fatal is not None:
                raise fatal
            break
        # Every rank proposes the newest step it could load; all settle on the oldest proposal.
        mine = (-1 if step is None else step, {k: str(v) for k, v in bad.items()},
                None if fatal is None else "%s: %s" % (type(fatal).__name__, fatal))
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, mine)
        if fatal is not None:
            raise fatal
        failed = [(r, g[2]) for r, g in enumerate(got) if g[2] is not None]
        if failed:
            raise RuntimeError("load_latest(%s): %s" % (d, "; ".join("rank %d failed: %s" % f for f in failed)))
        low, high = min(g[0] for g in got), max(g[0] for g in got)
        for r, g in enumerate(got):
            for k, why in g[1].items():
                if r != dist.get_rank() and k not in bad:
                    bad[k] = "(rank %d) %s" % (r, why)
        if low == high or low < 0:
            step = None if low < 0 else step
            break
        bound, state = low, None
    for k in sorted(bad, key=lambda k: -1 if k == "latest" else k, reverse=True):
        if step is None or k == "latest" or k > step:
            what = "'latest'" if k == "latest" else "step %d" % k
            if step is not None:
                _warnings.warn("ferry.checkpoint.load_latest(%s): %s is damaged, loading step %d instead: %s"
                               % (d, what, step, bad[k]), RuntimeWarning, stacklevel=2)
    if step is None:
        if not bad:
            return None, {}
        raise _corrupt("%s: no committed step loads%s: %s" % (
            d, "" if verify is False else " and verifies",
            "; ".join("%s: %s" % ("'latest'" if k == "latest" else "step %d" % k, bad[k])
                      for k in sorted(bad, key=lambda k: -1 if k == "latest" else k, reverse=True))))
    return step, state


def verify(directory, step=None, *, require_checksums=False, context=None) -> int:
    """Check a committed step (default: latest): manifest, every shard's structure and checksums.
    Returns the step; raises ferry.Error (FERRY_ECORRUPT / FERRY_EVERIFY) naming the problem."""
    if step is None:
        step = latest_step(directory)
        if step is None:
            raise FileNotFoundError("%s: no committed checkpoint (no 'latest')" % _os.fspath(directory))
    ctx = context if context is not None else _default_context()
    _ferry.ckpt_verify(ctx, _os.fspath(directory), step, require_checksums)
    return step


def prune(directory, keep) -> int:
    """Remove committed steps beyond the newest ``keep`` (never latest's), uncommitted debris
    older than latest, and the recycled shards of a pruned step (``directory/recycle``). Returns
    how many directories were removed."""
    return _ferry.ckpt_prune(_os.fspath(directory), int(keep))
