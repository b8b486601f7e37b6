"""Training data: packed datasets, the sample orders and the loader (docs/DATA.md, docs/PYTHON.md).

    ds = ferry.IndexedDataset("tokens")           # ferry.idx directory, or a Megatron prefix
    ds[3]                                          # sample 3 as a NumPy array (zero-copy)
    idx = ferry.distributed_indices(len(ds), 8, 0, seed=1, epoch=2)   # == DistributedSampler
    for x in ferry.Loader("tokens", batch_size=32, seq_len=2048):     # torch tensors on the GPU
        ...

The reading, merging, staging in pinned memory and host-to-device copies run on the C loader's
threads; Python only wraps each finished batch. NumPy is needed by IndexedDataset and the order
functions, torch by Loader; neither is imported before they are used.
"""
from __future__ import annotations

import mmap as _mmap
import os as _os

from . import _ferry

__all__ = ["IndexedDataset", "Loader", "distributed_indices", "order_indices", "write_dataset"]

_ORDERS = {"sequential": _ferry.ORDER_SEQUENTIAL, "shuffle": _ferry.ORDER_SHUFFLE,
           "block": _ferry.ORDER_BLOCK}
_U64 = 1 << 64


def _is_url(path) -> bool:
    return isinstance(path, str) and path[:5].lower() == "s3://" or \
        isinstance(path, str) and path.lower().startswith(("http://", "https://"))


def _elem_numpy(name: str) -> str:
    """The NumPy type of an element type NumPy names so (bytes are read as uint8)."""
    return "uint8" if name == "bytes" else name


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover (the tests have NumPy)
        raise ImportError("this ferry function returns NumPy arrays: pip install numpy") from e
    return numpy


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        raise ImportError("ferry.Loader returns torch tensors: pip install torch") from e
    return torch


# ------------------------------------------------------------------------------------ orders


def _check_replicas(num_replicas: int, rank: int) -> None:
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, not {num_replicas}")
    if num_replicas > 0xFFFFFFFF:  # the C sampler counts replicas in 32 bits
        raise ValueError(f"num_replicas {num_replicas} is out of range: at most {0xFFFFFFFF}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")


def order_indices(n: int, order: str = "shuffle", *, seed: int = 0, epoch: int = 0,
                  block: int = 256):
    """The global order of one epoch over ``n`` samples, before the split across ranks.

    ``order`` is ``"shuffle"`` (``torch.randperm(n)`` on a generator seeded with ``seed + epoch``,
    as DistributedSampler draws it), ``"sequential"`` (``0..n-1``) or ``"block"``: the ⌈n/block⌉
    runs of ``block`` neighbouring samples are permuted, then the samples within each run. A
    batch then reads from few neighbouring places, which keeps storage with slow random reads
    (disks, network file systems) near its sequential bandwidth; the price is that neighbours
    stay in the same run every epoch (less randomness than a full shuffle). Keep ``block`` well
    below ``n`` and at or above the batch size. Returns an ``int64`` NumPy array of length ``n``.
    """
    np = _numpy()
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {sorted(_ORDERS)}, not {order!r}")
    if block < 1:
        raise ValueError("block must be at least 1")
    out = np.empty(n, dtype=np.int64)
    _ferry.order_indices_into(n, _ORDERS[order], block, seed % _U64, epoch, out)
    return out


def distributed_indices(n: int, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0,
                        epoch: int = 0, drop_last: bool = False, *, order: str | None = None,
                        block: int = 256):
    """Rank ``rank``'s sample indices for ``epoch``, as an ``int64`` NumPy array.

    Equal, index for index, to ``list(s)`` after
    ``s = DistributedSampler(range(n), num_replicas, rank, shuffle, seed, drop_last);
    s.set_epoch(epoch)``, including its padding (the order repeated from its start up to a
    multiple of ``num_replicas``) and drop_last cut. ``order="block"`` (with ``block``) or
    ``"sequential"`` replaces the order while keeping the same padding and striding
    (``order_indices`` describes the orders; ``order`` overrides ``shuffle``).
    """
    np = _numpy()
    _check_replicas(num_replicas, rank)
    if n < 0:
        raise ValueError("n must be non-negative")
    if order is None or order in ("shuffle", "sequential"):
        if order is not None:
            shuffle = order == "shuffle"
        k = _ferry.distributed_num_samples(n, num_replicas, bool(drop_last))
        out = np.empty(max(k, 1), dtype=np.int64)
        got = _ferry.distributed_indices_into(n, num_replicas, rank, bool(shuffle), seed % _U64,
                                              epoch, bool(drop_last), out)
        return out[:got]
    glob = order_indices(n, order, seed=seed, epoch=epoch, block=block)
    k = _ferry.distributed_num_samples(n, num_replicas, bool(drop_last))
    total = k * num_replicas
    if total > n:  # padding: repeat the order from its start, as DistributedSampler does
        reps = -(-total // n) if n else 0
        glob = np.tile(glob, reps)
    return np.ascontiguousarray(glob[:total][rank::num_replicas])


# ----------------------------------------------------------------------------------- datasets


def _is_compressed(path) -> bool:
    from . import is_compressed  # ferry/__init__.py imports this module
    return is_compressed(path)


class IndexedDataset:
    """A packed dataset: a directory written by ``ferry pack``/``write_dataset`` (or its
    ``ferry.idx``), or a Megatron/NeMo prefix (``prefix.idx`` + ``prefix.bin``, given without
    extension). The whole index is checked on open; a corrupt index or a truncated shard raises
    ``ferry.Error`` (``FERRY_ECORRUPT``) naming the file, the shard and the first sample affected.

    ``ds[i]`` is sample ``i`` as a 1-D NumPy array of the dataset's ``dtype`` (``uint8`` for
    bytes); negative indices count from the end; ``ds[a:b:c]`` is a list of them. With
    ``mmap=True`` (the default) the arrays are read-only views of the shards mapped in memory
    (zero-copy, as Megatron's ``MMapIndexedDataset`` does: a shard shrunk by someone else while
    mapped raises SIGBUS on access); with ``mmap=False`` each is one read into a new array.
    ``sizes`` are the samples' lengths in elements (``int64``). ``copies``: the number of
    pre-shuffled copies (``write_dataset(shuffled_copies=N)``), 0 without.

    ``path`` may be an ``s3://`` or ``http(s)://`` prefix of the same objects (read through the
    remote backend; samples are read, never mapped); with the context's ``cache_dir`` set, whole
    shards are staged there and read from it (docs/REMOTE.md, "The dataset cache").
    """

    def __init__(self, path, *, mmap: bool = True, context=None):
        np = _numpy()
        opts = context.options() if context is not None else None
        self._ds = _ferry.Dataset(_os.fspath(path), opts)
        self.path = path
        self.format: str = self._ds.format
        self.dtype = np.dtype(_elem_numpy(self._ds.dtype_name))
        self.itemsize = self.dtype.itemsize
        self.shards: int = self._ds.shards
        self.copies: int = self._ds.copies  # pre-shuffled copies (Loader(copies=True)), 0: none
        self.nbytes: int = self._ds.nbytes
        self._n = len(self._ds)
        self._bytes = np.empty(self._n, dtype=np.int64)
        self._ds.sizes_into(self._bytes)
        # a URL's shards are objects: nothing to map (their staged copies may be evicted); shards
        # written by ferry pack --compress are read (decompressed) through the C library
        self._mmap = bool(mmap) and not _is_url(_os.fspath(path)) and not any(
            _is_compressed(self._ds.shard_path(k)) for k in range(self.shards))
        self._maps = None
        if self._mmap:
            self._shard = np.empty(self._n, dtype=np.uint32)
            self._off = np.empty(self._n, dtype=np.uint64)
            self._ds.locate_into(self._shard, self._off)
            self._maps = [None] * self.shards

    @property
    def sizes(self):
        """Each sample's length in elements (``int64``), as Megatron's ``sizes``."""
        return self._bytes // self.itemsize

    def __len__(self) -> int:
        return self._n

    def _map(self, k: int):
        m = self._maps[k]
        if m is None:
            path = self._ds.shard_path(k)
            with open(path, "rb") as f:
                size = _os.fstat(f.fileno()).st_size
                m = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ) if size else b""
            self._maps[k] = m
        return m

    def _get(self, i: int):
        np = _numpy()
        nbytes = int(self._bytes[i])
        count = nbytes // self.itemsize
        if self._mmap:
            if not nbytes:
                return np.empty(0, dtype=self.dtype)
            return np.frombuffer(self._map(int(self._shard[i])), dtype=self.dtype, count=count,
                                 offset=int(self._off[i]))
        out = np.empty(count, dtype=self.dtype)
        if nbytes:
            self._ds.read_into(i, out)
        return out

    def _index(self, i) -> int:
        i = int(i)  # operator.index semantics for NumPy integers too
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"sample index out of range ({self._n} samples)")
        return i

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self._get(i) for i in range(*idx.indices(self._n))]
        if hasattr(idx, "__index__"):
            return self._get(self._index(idx.__index__()))
        raise TypeError(f"dataset indices are integers or slices, not {type(idx).__name__}")

    def get(self, idx: int, offset: int = 0, length: int | None = None):
        """Part of sample ``idx``: ``length`` elements from element ``offset`` (Megatron's ``get``)."""
        a = self[idx]
        return a[offset:] if length is None else a[offset:offset + length]

    def __iter__(self):
        for i in range(self._n):
            yield self._get(i)

    def key(self, i: int) -> bytes | None:
        """Sample ``i``'s key (``ferry pack --keys``), or None."""
        return self._ds.key(self._index(i))

    def verify(self) -> None:
        """Re-read every shard and compare its CRC-32C with the index (ferry datasets)."""
        self._ds.verify()

    def cache_stats(self) -> dict:
        """What the local cache of a dataset of URLs did (``cache_dir``): ``{}`` without one."""
        import json
        return json.loads(self._ds.cache_stats())

    def close(self) -> None:
        if self._maps:
            for m in self._maps:
                if isinstance(m, _mmap.mmap):
                    try:
                        m.close()
                    except BufferError:  # an array still views it: it unmaps when that goes
                        pass
            self._maps = [None] * self.shards
        self._ds.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"IndexedDataset({self.path!r}, format={self.format!r}, samples={self._n}, "
                f"dtype={self.dtype.name}, shards={self.shards}, bytes={self.nbytes})")


_CHECK_CHUNK = 1 << 22  # elements per vectorised min/max: a few MiB, so the check stays in cache


def _value_error(i: int, what: str) -> ValueError:
    return ValueError(f"write_dataset: sample {i}: {what} (cast=True converts with NumPy's casting, "
                      f"wrapping out-of-range values)")


def _first(np, a, bad):
    """The first value of a where bad is true, as a Python number."""
    return a.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])].item()


def _check_values(np, arrays, src, target, idx) -> None:
    """Raises ValueError naming the first sample (``idx[k]`` for ``arrays[k]``) and value that
    ``target`` cannot hold: out of its range (negative ids for unsigned types), floats for an
    integer type, non-numbers.
    Vectorised: the samples of each run of one source dtype are checked a few MiB at a time."""
    tk = target.kind
    if tk in "iu":
        info = np.iinfo(target)
        lo, hi = info.min, info.max
    elif tk == "f":
        hi = float(np.finfo(target).max)
        lo = -hi
    else:  # pragma: no cover (datasets hold ints, floats and bytes)
        return
    i = 0
    while i < len(arrays):
        dt = src[i]
        if dt == target or (dt.kind == "b" and tk in "iuf"):
            i += 1
            continue
        if dt.kind not in "iuf":
            raise _value_error(idx[i], f"{dt} values cannot be stored as {target}")
        if tk in "iu" and dt.kind == "f":
            a = arrays[i]
            v = a.reshape(-1)[0].item() if a.size else "(empty)"
            raise _value_error(idx[i], f"float value {v!r} ({dt}) for the integer dtype {target}")
        # a run of samples of this source dtype, in chunks of about _CHECK_CHUNK elements
        j, size = i, 0
        while j < len(arrays) and src[j] == dt and size < _CHECK_CHUNK:
            size += arrays[j].size
            j += 1
        flat = [a.reshape(-1) for a in arrays[i:j] if a.size]
        if flat:
            cat = flat[0] if len(flat) == 1 else np.concatenate(flat)
            if dt.kind == "f":  # to a narrower float: finite values past its largest (inf, nan pass)
                ok = bool(cat.min() >= lo and cat.max() <= hi)
            else:
                ok = (dt.kind == "u" or int(cat.min()) >= lo) and int(cat.max()) <= hi
            if not ok:
                for k in range(i, j):
                    a = arrays[k]
                    if not a.size:
                        continue
                    bad = (a < lo) | (a > hi)
                    if dt.kind == "f":
                        bad &= np.isfinite(a)
                    if bad.any():
                        v = _first(np, a, bad)
                        why = "negative id" if tk == "u" and dt.kind != "f" and v < 0 else "value"
                        raise _value_error(idx[k], f"{why} {v!r} is out of {target}'s range [{lo}, {hi}]")
        i = j


def write_dataset(path, samples, *, dtype=None, format: str = "ferry", shard_size: int = 0,
                  keys=None, cast: bool = False, shuffled_copies: int = 0, seed: int = 0,
                  progress=None) -> int:
    """Writes a packed dataset: ``format="ferry"`` (a directory of shards and ``ferry.idx``) or
    ``"megatron"`` (``path.bin`` + ``path.idx``, MMIDIDX version 1, each sample a document).

    ``samples`` are array-likes of ``dtype`` (a NumPy dtype or name; default the first sample's)
    or ``bytes``/``str`` (``dtype="bytes"``). Values are checked on the way in: a value ``dtype``
    cannot hold (out of its range, a negative id for an unsigned type, a float for an integer
    type) and samples of different dtypes (arrays whose dtypes differ; lists take the dtype NumPy
    gives them) raise ``ValueError`` naming the sample and the value, before anything is written.
    ``cast=True`` converts instead, as NumPy's ``astype`` does (out-of-range values wrap).
    ``shard_size`` in bytes (0: 1 GiB). ``keys``: one ``bytes``/``str`` per sample (ferry format).
    ``shuffled_copies=N`` (ferry format): also writes N pre-shuffled copies, copy c in the order
    ``order_indices(n, "shuffle", seed=seed, epoch=c)``, for ``Loader(copies=True, seed=seed)``
    (``ferry pack --shuffled-copies``; N times the data's bytes more; docs/DATA.md).
    The write is durable (data, then index renamed into place). Returns the number of shards.
    ``progress``: None (default), a callable ``progress(done_bytes, total_bytes)`` (the bytes of
    the samples' data, times 1 + ``shuffled_copies``; done counts the bytes on disk) called from
    this thread at most every 0.1 s and once at the end with done == total, or True for a tqdm
    bar (docs/PYTHON.md, "Progress").
    """
    np = _numpy()
    samples = list(samples)
    if dtype is None:
        first = samples[0] if samples else b""
        dtype = "bytes" if isinstance(first, (bytes, bytearray, memoryview, str)) else \
            np.asarray(first).dtype.name
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    elem = _ferry.elem_from_name(name)
    elem_name = _ferry.elem_name(elem)
    target = np.dtype(_elem_numpy(elem_name))
    bufs = []
    rest = []  # (sample, array) left to the vectorised NumPy check: float datasets, float values
    typed = None  # (sample, dtype) of the first sample that carries its own dtype
    ints, is_bytes = target.kind in "iu", elem_name == "bytes"
    asarray, contiguous, empty, narrow = np.asarray, np.ascontiguousarray, np.empty, _ferry.narrow_into
    for i, s in enumerate(samples):
        if isinstance(s, str):
            s = s.encode()
        if is_bytes and isinstance(s, (bytes, bytearray, memoryview)):
            bufs.append(s)
            continue
        a = asarray(s)
        dt = a.dtype
        if not cast and (a is s or hasattr(s, "dtype")):
            if typed is None:
                typed = (i, dt)
            elif dt != typed[1]:
                v = a.reshape(-1)[0].item() if a.size else "(empty)"
                raise _value_error(i, f"mixed dtypes: it is {dt} (first value {v!r}), sample "
                                      f"{typed[0]} is {typed[1]}; the dataset is {target}")
        if dt == target or cast:
            bufs.append(contiguous(a.astype(target, copy=False)).reshape(-1))
        elif ints and dt.kind in "iu":
            # integers to another integer type: converted and range-checked in one pass of C
            out = empty(a.size, dtype=target)
            bad = narrow(contiguous(a).reshape(-1), out)
            if bad is not None:
                why = "negative id" if target.kind == "u" and bad[1] < 0 else "value"
                info = np.iinfo(target)
                raise _value_error(i, f"{why} {bad[1]} is out of {target}'s range [{info.min}, {info.max}]")
            bufs.append(out)
        else:
            bufs.append(None)
            rest.append((i, a))
    if rest:
        _check_values(np, [a for _, a in rest], [a.dtype for _, a in rest], target, [i for i, _ in rest])
        for i, a in rest:
            bufs[i] = contiguous(a.astype(target, copy=False)).reshape(-1)
    if keys is not None:
        keys = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    kinds = {"ferry": _ferry.WRITE_FERRY, "megatron": _ferry.WRITE_MEGATRON}
    if format not in kinds:
        raise ValueError(f"format must be 'ferry' or 'megatron', not {format!r}")
    if shuffled_copies and format != "ferry":
        raise ValueError("shuffled_copies is for the ferry format")
    if not 0 <= shuffled_copies <= 999:
        raise ValueError(f"shuffled_copies must be 0 to 999, not {shuffled_copies}")
    if progress is None:
        return _ferry.write_dataset(_os.fspath(path), kinds[format], elem, shard_size, bufs, keys,
                                    shuffled_copies, seed % _U64)
    from . import _progress
    p = _os.fspath(path)
    if format == "ferry":
        where = lambda: [p]  # noqa: E731
    else:
        d, base = _os.path.dirname(p) or ".", _os.path.basename(p)
        where = lambda: [_os.path.join(d, f) for f in _os.listdir(d) if f.startswith(base)]  # noqa: E731
    disk = _progress.disk_counter(where)
    before = disk()
    total = sum(memoryview(b).nbytes for b in bufs) * (1 + shuffled_copies)
    return _progress.run(lambda: _ferry.write_dataset(p, kinds[format], elem, shard_size, bufs, keys,
                                                      shuffled_copies, seed % _U64),
                         progress, total, lambda: disk() - before, _os.path.basename(p))


# ------------------------------------------------------------------------------------- loader


def _env_int(name: str, default: int) -> int:
    v = _os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


class Loader:
    """Batches of a packed dataset as ``torch.Tensor``s already on ``device``, read by the C loader's
    threads (batched io_uring reads, merged neighbours, pinned staging, host-to-device copies on
    their own stream), ``prefetch`` batches ahead.

    ``seq_len=L``: items are windows of ``L`` tokens over all samples concatenated (LLM
    pre-training; pass the context length + 1 for inputs and shifted labels); each batch is a
    ``[batch, L]`` tensor. ``seq_len=None``: items are the dataset's samples and each batch is
    ``(data, offsets)``: the samples back to back (1-D) and ``int64`` element offsets
    ``[batch + 1]``, both on ``device``.

    The order is ``DistributedSampler``'s (``shuffle``, ``seed``, ``drop_last``, set_epoch),
    index for index, over this ``rank`` of ``world_size`` (from ``RANK`` and ``WORLD_SIZE`` in the
    environment, as torchrun sets them, when not given; else 0 of 1). ``order="block"`` (with
    ``block``) is the locality-aware shuffle. ``drop_last_batch`` drops a short last batch.

    ``device``: ``"cuda"``, ``"cuda:N"``, a ``torch.device``, an int, or ``"cpu"``; None picks
    ``"cuda"`` when torch sees a GPU, else ``"cpu"`` (``loader.device`` says which).
    ``dtype``: the tensors' dtype (default the dataset's; a conversion is done in the copy).
    ``documents=True``: each batch is a dict ``{"input_ids", "position_ids", "cu_seqlens",
    "max_seqlen"}`` (plus ``"offsets"`` without ``seq_len``): ``int64`` position_ids restarting at 0
    at each row and each document start, ``int32`` cu_seqlens of those sequences over the flattened
    batch (FlashAttention's varlen form) and the longest; docs/DATA.md, "Documents in packed sequences".

    Each ``iter(loader)`` runs to the end of the current epoch, then moves to the next one; an
    iteration left early continues where it stopped. ``set_epoch(e)`` (as DistributedSampler's)
    keeps the position when ``e`` is the current epoch, else starts ``e`` at batch 0. ``state_dict()``/``load_state_dict()`` give the exact continuation;
    ``stats()`` the starvation metrics.

    ``copies=True`` (``order="shuffle"``, ``seed`` the one the copies were written with): epoch e is
    read sequentially from the dataset's pre-shuffled copy e mod N (``write_dataset(...,
    shuffled_copies=N)``, ``ferry pack --shuffled-copies N``), so its order is ``order_indices``' for
    epoch e mod N; indices, padding and striding are ``distributed_indices``' for that epoch.

    Over compressed shards (``ferry pack --compress``) ``order="shuffle"`` is by default the chunk
    window (``chunk_window=-1``; docs/DATA.md, "Sample orders"): runs of 1 MiB of chunks permuted,
    taken about half of ``chunk_cache`` (bytes of decoded chunks a pipeline thread keeps, 64 MiB) at
    a time, their items shuffled together, so each chunk is decoded about once an epoch;
    ``chunk_window=0`` gives the full shuffle, each sample decoding its chunk. On a CUDA device
    (``cz_decode="auto"``) zstd chunks are decoded by nvCOMP into ``chunk_cache`` bytes of device
    memory per pipeline thread and the samples copied out on the GPU, so the pipeline's CPU reads and
    checks frames instead of decoding them; ``cz_decode="cpu"`` decodes on the pipeline threads,
    ``"gpu"`` requires nvCOMP (LZ4 too). ``stats()["gpu_chunk_decodes"]`` says what ran.

    Memory: on the GPU each batch's tensor is the device memory the loader uploaded it into, no
    copy: the loader takes other memory for its next batches, and gets this memory back when the
    tensor is freed, for uploads ordered after the work queued on the then current stream (the
    semantics of memory torch allocates on the current stream; ``record_stream`` has no effect on
    memory torch did not allocate, so a tensor used on another stream must be kept until that
    stream's work on it is done). With a ``dtype`` conversion, and on the CPU, batches are copied out
    of the loader's slot into memory torch owns. Tensors can be kept as long as wanted, after
    ``close()`` too.
    """

    def __init__(self, path, batch_size: int, seq_len: int | None = None, *, rank: int | None = None,
                 world_size: int | None = None, seed: int = 0, shuffle: bool = True,
                 order: str | None = None, block: int = 256, drop_last: bool = False,
                 drop_last_batch: bool = False, device=None, prefetch: int = 4, threads: int = 1,
                 dtype=None, merge_gap: int = 0, pin_memory: bool = False, epoch: int = 0,
                 documents: bool = False, copies: bool = False, shard_window: int | None = None,
                 chunk_window: int | None = None, chunk_cache=None, cz_decode: str | None = None,
                 context=None):
        torch = _torch()
        self._torch = torch
        self.dataset = path if isinstance(path, IndexedDataset) else \
            IndexedDataset(path, mmap=False, context=context)
        if world_size is None:
            world_size = _env_int("WORLD_SIZE", 1)
        if rank is None:
            rank = _env_int("RANK", 0)
        _check_replicas(world_size, rank)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if seq_len is not None and seq_len < 1:
            raise ValueError("seq_len must be at least 1 (or None for whole samples)")
        if order is None:
            order = "shuffle" if shuffle else "sequential"
        if order not in _ORDERS:
            raise ValueError(f"order must be one of {sorted(_ORDERS)}, not {order!r}")
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.seed, self.order, self.block = seed, order, block
        self.drop_last, self.drop_last_batch = bool(drop_last), bool(drop_last_batch)
        self.prefetch, self.threads = prefetch, threads
        self.pin_memory = bool(pin_memory)
        self.documents = bool(documents)

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("ferry.Loader(device=%r): torch sees no CUDA device" % (device,))
            # torchrun: plain "cuda" is this rank's own GPU (LOCAL_RANK), not the host's first
            local = _os.environ.get("LOCAL_RANK", "")
            dev = torch.device("cuda", dev.index if dev.index is not None else
                               int(local) if local.isdigit() else torch.cuda.current_device())
            self._cdev = dev.index
        elif dev.type == "cpu":
            self._cdev = -1
        else:
            raise ValueError(f"device must be cuda[:N] or cpu, not {device!r}")
        self.device = dev

        src = getattr(torch, self.dataset.dtype.name, None)
        if src is None:  # pragma: no cover (torch < 2.3 has no uint16)
            raise TypeError(f"this torch has no {self.dataset.dtype.name} dtype for the dataset's samples")
        self._src_dtype = src
        if dtype is None:
            self.dtype = src
        elif isinstance(dtype, str):
            self.dtype = getattr(torch, dtype)
        else:
            self.dtype = dtype
        self._knobs = {"batch_size": batch_size, "seq_len": seq_len or 0, "world_size": world_size,
                       "rank": rank, "seed": seed % _U64, "order": order, "block": block,
                       "drop_last": int(self.drop_last), "drop_last_batch": int(self.drop_last_batch),
                       "prefetch": prefetch, "threads": threads, "merge_gap": merge_gap,
                       "documents": int(self.documents), "copies": int(bool(copies))}
        if shard_window is not None:  # None: the C default (-1: on only under a smaller cache)
            self._knobs["shard_window"] = int(shard_window)
        if chunk_window is not None:  # None: the C default (-1: on for compressed shards)
            self._knobs["chunk_window"] = int(chunk_window)
        if chunk_cache is not None:  # bytes (an int or "64m"); None: the C default or its variable
            self._knobs["chunk_cache"] = chunk_cache
        if cz_decode is not None:  # "auto", "cpu", "gpu"; None: the C default or its variable
            self._knobs["cz_decode"] = str(cz_decode)
        self._epoch, self._batch = int(epoch), 0
        self._cl = None          # the C loader, positioned at (_epoch, _batch)
        self._pending = []       # (batch, event): slots whose device copy is in flight
        self._copy_stream = None
        self._last_idx = None    # the last batch's indices, int64 bytes
        # On the GPU without a dtype conversion each batch's device memory becomes the tensor
        # (no copy, no per-batch torch stream work in Python).
        self._direct = self._cdev >= 0 and self.dtype == self._src_dtype
        self._itemsize = self.dataset.itemsize
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
            (lambda d: torch.cuda.current_stream(d).cuda_stream)
        self._from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack

    # -- the C loader --------------------------------------------------------------------------

    def _make(self, state: str | None = None):
        knobs = dict(self._knobs, epoch=self._epoch)
        cl = _ferry.Loader(self.dataset._ds, knobs, self._cdev)
        if state is not None:
            cl.set("state", state)
        return cl

    def _ensure(self):
        if self._cl is None:
            self._cl = self._make()
        return self._cl

    def _drain(self) -> None:
        for b, ev in self._pending:
            ev.synchronize()
            b.release()
        self._pending.clear()

    def _reset(self, cl=None) -> None:
        self._drain()
        if self._cl is not None:
            self._cl.close()
        self._cl = cl

    def close(self) -> None:
        """Stops the pipeline threads and frees the slots (tensors already returned stay valid)."""
        self._reset()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover (interpreter shutdown)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- DataLoader-like surface ---------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self._ensure().batches_per_epoch()

    @property
    def samples_per_epoch(self) -> int:
        """Items (samples or seq_len windows) per epoch on this rank, padding included."""
        return self._ensure().samples_per_epoch()

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the loader's epoch (as DistributedSampler.set_epoch). On the current
        epoch it is a no-op: the position is kept, mid-epoch too (after ``load_state_dict`` the
        next batch is still the resumed one, and prefetched batches are kept); on any other epoch
        the next iteration starts that epoch at its batch 0."""
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, not {epoch}")
        if epoch == self._epoch:
            return
        self._reset()
        self._epoch, self._batch = epoch, 0

    def __iter__(self):
        cl = self._ensure()
        bpe = cl.batches_per_epoch()
        for _ in range(bpe - self._batch):
            out = self._next(cl)
            self._batch += 1
            if self._batch == bpe:
                self._epoch, self._batch = self._epoch + 1, 0
            yield out

    def _reap(self) -> None:
        p = self._pending
        while p and p[0][1].query():
            p.pop(0)[0].release()
        if len(p) >= max(1, self.prefetch - 1):
            b, ev = p.pop(0)
            ev.synchronize()
            b.release()

    def _next(self, cl):
        torch = self._torch
        if self._pending:
            self._reap()
        b = cl.next()
        if b is None:  # pragma: no cover (the C loader runs without an epoch limit)
            raise RuntimeError("ferry.Loader: the pipeline ended early")
        if (b.epoch, b.step) != (self._epoch, self._batch):  # pragma: no cover
            b.release()
            raise RuntimeError(f"ferry.Loader: got batch {b.step} of epoch {b.epoch}, "
                               f"expected {self._batch} of {self._epoch}")
        n = b.samples
        offsets = None if self.seq_len else b.offsets()
        self._last_idx = b.indices()
        if not self.documents:
            return self._data(b, n, offsets)
        if self._direct:
            # the batch's device memory holds its position_ids and cu_seqlens too (uploaded with
            # the data by the pipeline): three views, no copy
            max_seqlen = b.max_seqlen
            data, pos, cu = b.take(self._raw_stream(self._cdev), self.seq_len or 0, True)
            data, pos, cu = (self._from_dlpack(x) for x in (data, pos, cu))
            if self.seq_len:
                return {"input_ids": data, "position_ids": pos, "cu_seqlens": cu,
                        "max_seqlen": max_seqlen}
            offs = torch.frombuffer(bytearray(offsets), dtype=torch.int64) // self._itemsize
            return {"input_ids": data, "offsets": offs.to(self.device), "position_ids": pos,
                    "cu_seqlens": cu, "max_seqlen": max_seqlen}
        # (a dtype conversion) pinned for the GPU: both copies are asynchronous on the current stream
        elems = b.nbytes // self._itemsize
        pin = self._cdev >= 0
        pos = torch.empty((n, self.seq_len) if self.seq_len else (elems,), dtype=torch.int64,
                          pin_memory=pin)
        # at most a sequence per token, plus empty samples (seq_len=None)
        cu = torch.empty(elems + n + 1, dtype=torch.int32, pin_memory=pin)
        ncu, max_seqlen = b.documents(pos.numpy(), cu.numpy())  # before the batch is taken
        out = self._data(b, n, offsets)
        if pin:
            pos = pos.to(self.device, non_blocking=True)
            cu = cu[:ncu].to(self.device, non_blocking=True)
        else:
            cu = cu[:ncu].clone()
        if self.seq_len:
            return {"input_ids": out, "position_ids": pos, "cu_seqlens": cu, "max_seqlen": max_seqlen}
        return {"input_ids": out[0], "offsets": out[1], "position_ids": pos, "cu_seqlens": cu,
                "max_seqlen": max_seqlen}

    def _data(self, b, n, offsets):
        """The batch's data (and offsets without seq_len) as tensors; the batch is taken or released."""
        torch = self._torch
        if self._direct:
            # the batch's device memory itself, given back when the tensor is freed, after the
            # work queued by then on the current stream (as memory torch allocated on it)
            out = self._from_dlpack(b.take(self._raw_stream(self._cdev), self.seq_len or 0))
            if self.seq_len:
                return out
            offs = torch.frombuffer(bytearray(offsets), dtype=torch.int64) // self._itemsize
            return out, offs.to(self.device)
        view = torch.from_dlpack(b.dlpack())
        if self.seq_len:
            view = view.view(n, self.seq_len)
        if self._cdev >= 0:
            consumer = torch.cuda.current_stream(self.device)
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(self.device)
            with torch.cuda.stream(self._copy_stream):
                out = torch.empty(view.shape, dtype=self.dtype, device=self.device)
                out.copy_(view, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self._copy_stream)
            consumer.wait_event(ev)
            out.record_stream(consumer)
            del view
            self._pending.append((b, ev))
        else:
            out = torch.empty(view.shape, dtype=self.dtype, pin_memory=self.pin_memory)
            out.copy_(view)
            del view
            b.release()
        if self.seq_len:
            return out
        offs = torch.frombuffer(bytearray(offsets), dtype=torch.int64) // self.dataset.itemsize
        if self._cdev >= 0:
            offs = offs.to(self.device)
        return out, offs

    @property
    def last_indices(self):
        """The items (dataset samples, or token windows with ``seq_len``) of the batch returned last,
        as an ``int64`` NumPy array; None before the first."""
        b = self._last_idx
        return None if b is None else _numpy().frombuffer(b, dtype="int64")

    # -- resume and metrics --------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where the next batch starts: ``{"epoch", "batch", "world_size", "rank", "batch_size",
        "seed", "state"}`` (``state`` is the C loader's line, which also pins the rest of the
        configuration and the dataset's samples and bytes; the other keys are for reading). Save it
        with the model's checkpoint, one per rank."""
        return {"epoch": self._epoch, "batch": self._batch, "world_size": self.world_size,
                "rank": self.rank, "batch_size": self.batch_size, "seed": self.seed,
                "state": self._ensure().state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the batches a ``state_dict()`` had counted: the next ``iter()``
        starts there, and ``set_epoch`` of that epoch keeps it. The configuration (world_size,
        rank, seed, order, block, batch_size, seq_len, drop_last, the dataset's samples and bytes)
        must match; a mismatch raises ``ferry.Error`` (``FERRY_EBADOPT``) naming the field. A state
        saved at another world size resumes where that is exact: the samples all ranks had taken
        (batch x batch_size x old world size) are a whole number of this world size's steps, and
        the next batch is the one after them; otherwise it raises, naming both world sizes."""
        line = state["state"]
        self._reset()
        try:
            self._cl = self._make(line)
        except BaseException:
            self._cl = None
            raise
        # where the C loader resumes (at another world size, the remapped batch)
        fields = dict(kv.split("=", 1) for kv in self._cl.state().split()[2:] if "=" in kv)
        self._epoch, self._batch = int(fields["epoch"]), int(fields["batch"])

    def stats(self) -> dict:
        """Starvation and throughput since the pipeline (re)started: ``steps``, ``wait_total_ns``,
        ``wait_mean_ns``, ``wait_p50_ns``/``p90``/``p99``/``max``, ``bytes``, ``samples``,
        ``elapsed_ns``, ``samples_per_s``, ``bytes_per_s``, ``reads``, ``merged``, ``inline_reads``
        (reads of page-cache-resident data done by the pipeline thread itself, not the I/O engine),
        ``mapped_reads`` (of those, the ones copied from a mapping of the shard), ``mapped_faults``
        (batches whose mapped copies faulted or found the shard cut short, then read again),
        ``device_buffers`` (on the GPU: batch-sized device buffers that exist, the loader's and
        those the returned tensors still hold), ``chunk_decodes`` and ``chunk_decoded_bytes``
        (compressed shards: chunks, or chunk heads, the pipeline threads decoded, and their bytes),
        ``gpu_chunk_decodes`` and ``gpu_decode_batches`` (of those, the chunks nvCOMP decoded, in
        how many batches: ``cz_decode``), ``lent_maps`` (shards of an ``s3://`` dataset read through
        the mapping the cache's stager made of the staged file, every page in),
        ``cpu_ns`` (the pipeline threads' CPU time), and derived ``wait_fraction`` (waited / elapsed) and
        ``cpu_cores`` (pipeline CPU time / elapsed)."""
        m = self._ensure().metrics()
        out = {k: (v if k.endswith("_per_s") else int(v)) for k, v in m.items()}
        el = m.get("elapsed_ns", 0.0)
        out["wait_fraction"] = m["wait_total_ns"] / el if el > 0 else 0.0
        out["cpu_cores"] = m["cpu_ns"] / el if el > 0 else 0.0
        return out

    def waits(self):
        """Each step's wait in nanoseconds, as a ``uint64`` NumPy array."""
        np = _numpy()
        return np.frombuffer(self._ensure().waits(), dtype=np.uint64).copy()

    def __repr__(self) -> str:
        return (f"Loader({self.dataset.path!r}, batch_size={self.batch_size}, seq_len={self.seq_len}, "
                f"rank={self.rank}, world_size={self.world_size}, order={self.order!r}, "
                f"device={str(self.device)!r}, epoch={self._epoch}, batch={self._batch})")
