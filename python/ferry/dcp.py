"""torch.distributed.checkpoint storage by ferry (docs/PYTHON.md, "torch.distributed.checkpoint").

    import torch.distributed.checkpoint as dcp, ferry.dcp
    dcp.save(state, storage_writer=ferry.dcp.Writer(path))      # was FileSystemWriter(path)
    dcp.load(state, storage_reader=ferry.dcp.Reader(path))      # was FileSystemReader(path)
    dcp.load(state, storage_reader=ferry.dcp.Reader(path),      # DTensor targets: ferry's planner
             planner=ferry.dcp.LoadPlanner())                   # (LoadPlanner's docstring)

The on-disk format is FileSystemWriter's: the same planning (``__<rank>_<n>.distcp`` files, the
same items at the same offsets, each tensor item a torch.save zip as DCP frames it, the
``.metadata`` pickle), so the stock FileSystemReader loads what ferry wrote and the other way
round, resharded loads included. Only the data movement differs: tensor bytes go between memory
(host or GPU) and the files through ferry's engine; the zip framing around each tensor is laid out
by torch's own writer (``torch.serialization.skip_data``) so no torch.save serialisation copy of
tensor bytes is made. Durability: each data file is written under a temporary name, fsynced and
renamed, the directory fsynced, and ``.metadata`` written last the same way; a save over an
existing checkpoint first removes its ``.metadata`` (durably), so a save killed midway never
leaves a directory that a reader takes as complete.
"""
from __future__ import annotations

import copy as _copy
import io as _io
import os as _os
import pickle as _pickle
import sys as _sys
import threading as _threading
import time as _time
from concurrent.futures import ThreadPoolExecutor as _Pool

import torch as _torch
from torch.distributed._shard._utils import narrow_tensor_by_index as _narrow
from torch.distributed.checkpoint import default_planner as _dcp_planner
from torch.distributed.checkpoint import filesystem as _fs
from torch.distributed.checkpoint.planner import LoadItemType as _LoadItemType
from torch.distributed.checkpoint.planner import WriteItemType as _WriteItemType
from torch.distributed.checkpoint.storage import WriteResult as _WriteResult
from torch.futures import Future as _Future

import ferry as _ferry
from . import torch as _ft

__all__ = ["Writer", "Reader", "LoadPlanner"]


def _is_url(path):
    return isinstance(path, str) and "://" in path


class _UrlFS:
    """FileSystem's interface (the parts the stock writer and reader call) over an ``s3://``
    prefix: objects read and written by ferry's remote backend (docs/REMOTE.md)."""

    def __init__(self, owner):
        self._owner = owner

    def _ctx(self):
        ctx = self._owner._ctx
        return ctx if ctx is not None else _ferry.default_context()

    def init_path(self, path):
        return _os.fspath(path).rstrip("/")

    def concat_path(self, path, suffix):
        return "%s/%s" % (path, suffix)

    def mkdir(self, path):
        pass  # a prefix exists once an object under it does

    def exists(self, path):
        try:
            with _ferry.open(path, "r", context=self._ctx()):
                return True
        except FileNotFoundError:
            return False

    def read(self, path):
        with _ferry.open(path, "r", context=self._ctx()) as f:
            buf = bytearray(f.size)
            if f.size and f.pread_into(buf, 0) != f.size:
                raise OSError("%s: short read of %d bytes" % (path, f.size))
        return bytes(buf)

    def put(self, path, blob):
        """One object, whole or not at all: it appears at the commit (sync)."""
        with _ferry.open(path, "w", context=self._ctx()) as f:
            if blob and f.pwrite_from(blob, 0) != len(blob):
                raise OSError("%s: short write" % path)
            f.sync()

    def create_stream(self, path, mode):
        if "r" not in mode:
            raise NotImplementedError("%s: the stock writer's streams do not write to s3:// "
                                      "(ferry.dcp.Writer writes the objects itself)" % path)
        return _io.BytesIO(self.read(path))


def _unlink_durably(path, fs=None):
    if isinstance(fs, _UrlFS):
        # No delete through the public API: an empty .metadata is what a reader takes for "no
        # checkpoint" (unpickling fails), and it is replaced by the real one at the end.
        if fs.exists(path):
            fs.put(path, b"")
        return
    try:
        _os.unlink(path)
    except FileNotFoundError:
        return
    _ft._fsync_dir(_os.path.dirname(_os.path.abspath(path)))


_MARGIN = 1 << 30  # free device memory kept beyond the snapshot: 1 GiB and 1/8 of its size
# A load reads each tensor item's zip framing from its first and last _FRAME bytes (a torch.save
# zip of one tensor keeps data.pkl and the local headers before the data, the central directory
# after it: a few hundred bytes each); regions that are not one run of bytes in the file go
# through host memory, _HOST_BATCH bytes at most at a time.
_FRAME = 4096
_HOST_BATCH = 256 << 20
# A checkpoint of at most _PREFETCH_ITEMS items has every item's framing read while DCP plans
# (Reader.set_up_storage_reader): 8 KiB an item at most.
_PREFETCH_ITEMS = 4096


def _free_bytes(dev):
    """Device memory a new allocation can take: the driver's free memory and what PyTorch holds
    unused."""
    free, _total = _torch.cuda.mem_get_info(dev)
    return free + _torch.cuda.memory_reserved(dev) - _torch.cuda.memory_allocated(dev)


def _device_snapshot(state_dict, times, device_type="cuda"):
    """A copy of state_dict whose GPU tensors lie in one new allocation per device (copied
    there on the current stream, which is then synchronised), CPU tensors cloned, other values
    as the stock staging keeps them; None (and times["why"]) where it cannot: a ShardedTensor,
    no GPU tensor, or not enough free device memory. DTensors keep their mesh and placements
    around a snapshot of their local tensor."""
    from torch.distributed.tensor import DTensor
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover
        ShardedTensor = ()
    t0 = _time.perf_counter()
    need = {}  # device -> bytes
    found = []

    def plan(o):
        if isinstance(o, ShardedTensor):
            raise LookupError("a ShardedTensor")
        if isinstance(o, DTensor):
            plan(o._local_tensor)
        elif isinstance(o, _torch.Tensor):
            if o.device.type == device_type and o.is_contiguous():
                need[o.device] = need.get(o.device, 0) + (o.nbytes + 255) // 256 * 256
                found.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                plan(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                plan(v)

    try:
        plan(state_dict)
    except LookupError as e:
        times["why"] = str(e)
        return None
    if not need:
        times["why"] = "no GPU tensor"
        return None
    for dev, n in need.items():
        free = _free_bytes(dev)
        if free < n + _MARGIN + n // 8:
            times["why"] = "%s: %d bytes free, the snapshot needs %d and %d spare" % (
                dev, free, n, _MARGIN + n // 8)
            return None
    times["plan"] = _time.perf_counter() - t0
    t0 = _time.perf_counter()
    flat = {dev: _torch.empty(n, dtype=_torch.uint8, device=dev) for dev, n in need.items()}
    at = dict.fromkeys(need, 0)
    times["alloc"] = _time.perf_counter() - t0
    t0 = _time.perf_counter()

    def snap(t):
        if t.device.type == device_type and t.is_contiguous():
            o = at[t.device]
            at[t.device] = o + (t.nbytes + 255) // 256 * 256
            out = flat[t.device][o:o + t.nbytes].view(t.dtype).view(t.size())
            out.copy_(t.detach(), non_blocking=True)
            return out
        return t.detach().clone()

    def walk(o):
        if isinstance(o, DTensor):
            return DTensor.from_local(snap(o._local_tensor), o.device_mesh, o.placements,
                                      run_check=False, shape=o.size(), stride=o.stride())
        if isinstance(o, _torch.Tensor):
            return snap(o)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple):
            return tuple(walk(v) for v in o)
        if isinstance(o, (int, float, str, bytes, _io.BytesIO)) or o is None:
            return o  # as the stock staging keeps them
        return _copy.deepcopy(o)

    out = walk(state_dict)
    times["copy"] = _time.perf_counter() - t0
    t0 = _time.perf_counter()
    for dev in need:
        if dev.type == "cuda":
            _torch.cuda.current_stream(dev).synchronize()
    times["sync"] = _time.perf_counter() - t0
    times["path"] = "device snapshot (%d bytes)" % sum(need.values())
    times["_ptrs"] = {f.data_ptr() for f in flat.values()}
    return out


def _layout_for(tpl, data):
    """A copy of the zip layout tpl of one tensor, with its own bytes (the crc32s are written
    into them) and data as the storage of its one hole."""
    out = _copy.copy(tpl)
    out.blob = _copy.copy(tpl.blob)
    out.blob.runs = [[at, bytearray(b)] for at, b in tpl.blob.runs]
    out.holes = [(off, data, rec) for off, _s, rec in tpl.holes]
    return out


class Writer(_fs.FileSystemWriter):
    """A ``StorageWriter`` for ``dcp.save`` and ``dcp.async_save``, FileSystemWriter's format.

    Takes FileSystemWriter's arguments (``thread_count`` sets the number of files per rank, as
    there) plus ``context`` (a ferry.Context). ``sync_files=False`` skips the fsyncs (not
    crash-safe). Extensions (``_extensions``) and the SAFETENSORS serialization format are
    written by the stock code path.
    """

    def __init__(self, path, *args, context=None, **kwargs):
        super().__init__(str(path) if _is_url(path) else path, *args, **kwargs)
        self._ctx = context
        self._pinning = None
        self.stage_times = {}
        self._snap_ptrs = set()  # the allocations of the last device snapshot
        if _is_url(path):
            self.fs = _UrlFS(self)
            self.path = self.fs.init_path(path)

    def stage(self, state_dict):
        """``dcp.async_save``'s staging, on the caller's thread: a snapshot of the state the
        caller may change once this returns. GPU tensors are copied inside the GPU into one
        allocation per device (a device-to-device copy per tensor, no pinning), and the save's
        thread writes them out through ferry's pinned buffers, as ``ferry.checkpoint``'s
        ``save_snapshot=device`` does: the stock staging pins (``cache_staged_state_dict``) or
        fills pageable memory on the caller's thread, 7.13 s for 8 GB on the H100 against 0.20 s
        for the device-to-host copy (issue 24). Taken where every device has the snapshot's size
        free plus 1 GiB and 1/8 of it (``torch.cuda.mem_get_info`` and what PyTorch holds
        unused), else the stock staging. With ``cache_staged_state_dict=True`` the pinned copy
        of the stock writer is made on a thread of its own after the first call; a call that
        finds it made takes it (a device-to-host copy into memory already pinned). The phases'
        times of the last call are in ``self.stage_times``."""
        t0 = _time.perf_counter()
        if self.cache_staged_state_dict and self.state_dict_cache is not None:
            out = super().stage(state_dict)
            self.stage_times = {"path": "pinned (cached)", "total": _time.perf_counter() - t0}
            return out
        times = {}
        out = _device_snapshot(state_dict, times)
        self._snap_ptrs = times.pop("_ptrs", set())
        if out is None:
            out = super().stage(state_dict)
            times["path"] = "stock (%s)" % times.get("why", "")
        elif self.cache_staged_state_dict and self._pinning is None:
            self._pinning = _threading.Thread(target=self._pin_cache, args=(state_dict,),
                                              name="ferry-dcp-pin", daemon=True)
            self._pinning.start()
        times["total"] = _time.perf_counter() - t0
        self.stage_times = times
        return out

    def _pin_cache(self, state_dict):
        from torch.distributed._state_dict_utils import _create_cpu_state_dict
        try:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=True)
        except Exception:  # the device snapshot stays the path; the error is the stock one's
            self._pinning = False

    def _stock(self):
        return (self.transforms.extensions or
                self.serialization_format != _fs.SerializationFormat.TORCH_SAVE)

    def prepare_local_plan(self, plan):
        plan = super().prepare_local_plan(plan)
        if not self.use_collectives and self.rank is not None:
            _unlink_durably(str(self._get_metadata_path(self.rank)), self.fs)
        return plan

    def prepare_global_plan(self, plans):
        # Every rank has checked for an existing checkpoint (prepare_local_plan) and none writes
        # data before the plans come back: the old .metadata goes first, so that a save killed
        # midway leaves no directory that reads as complete.
        _unlink_durably(str(self._get_metadata_path()), self.fs)
        return super().prepare_global_plan(plans)

    def _write_data(self, planner, file_queue):
        if self._stock():
            if isinstance(self.fs, _UrlFS):
                raise NotImplementedError("ferry.dcp.Writer: extensions and the SAFETENSORS format "
                                          "are written by the stock code, which has no s3:// path")
            return super()._write_data(planner, file_queue)
        ctx = self._ctx if self._ctx is not None else _ferry.default_context()
        jobs = []
        while not file_queue.empty():
            jobs.append(file_queue.get_nowait())
        if len(jobs) > 1 and self.thread_count > 1:
            with _Pool(min(self.thread_count, len(jobs))) as pool:
                parts = list(pool.map(lambda j: self._write_file(ctx, planner, *j), jobs))
        else:
            parts = [self._write_file(ctx, planner, *j) for j in jobs]
        # each file's commit fsynced the directory after its rename (ferry_durable_commit)
        fut = _Future()
        fut.set_result([r for part in parts for r in part])
        return fut

    def _overlapping(self):
        # Where the stock writer takes _OverlappingCpuLoader (its _write_files_from_queue), it
        # writes the tensors smallest first; the same order keeps the files the same.
        custom = getattr(_torch, _torch._C._get_privateuse1_backend_name(), None)
        return (self.thread_count == 1 and self.per_thread_copy_ahead > 0 and
                (_torch.cuda.is_available() or bool(custom and custom.is_available())))

    def _tensor_items(self, items):
        tensor_items = [wi for wi in items if wi.type != _WriteItemType.BYTE_IO]
        if self._overlapping():
            tensor_items.sort(key=_fs._item_size)  # _OverlappingCpuLoader's order
        return tensor_items

    def _write_url(self, ctx, planner, url, storage_key, items):
        """One object, written in order (an upload takes no other): the byte items, then each
        tensor's zip, its storage's crc32 computed from the host bytes before the data descriptor
        after them is written; the object appears whole at the commit, or not at all."""
        results = []
        crc_on = _torch.serialization.get_crc32_options()
        with _ferry.open(url, "w", context=ctx) as f:
            at = 0

            def put(b):
                nonlocal at
                if len(b) and f.pwrite_from(b, at) != len(b):
                    raise OSError("%s: short write at offset %d" % (url, at))
                at += len(b)

            for wi in items:
                if wi.type != _WriteItemType.BYTE_IO:
                    continue
                data = planner.resolve_data(wi)
                b = data.getbuffer() if isinstance(data, _io.BytesIO) else memoryview(data)
                results.append(_WriteResult(index=wi.index, size_in_bytes=len(b),
                                            storage_data=_fs._StorageInfo(storage_key, at, len(b))))
                put(b)
            for wi in self._tensor_items(items):
                t = planner.resolve_data(wi).detach()
                if t.untyped_storage().nbytes() != t.nbytes:
                    t = t.clone()
                if t.device.type != "cpu":
                    t = t.cpu()  # remote writes are from host memory (docs/REMOTE.md)
                layout = _ft._Layout(t, url)
                base, pos = at, 0
                for off, s, rec in layout.holes:
                    data = _ft._byte_view(s).numpy()
                    if crc_on:
                        layout.set_crc(rec, off, _ft._crc32(data) if len(data) else 0)
                    put(layout.blob.view(pos, off))
                    put(data)
                    pos = off + len(data)
                put(layout.blob.view(pos, layout.size))
                results.append(_WriteResult(index=wi.index, size_in_bytes=layout.size,
                                            storage_data=_fs._StorageInfo(storage_key, base,
                                                                          layout.size)))
            f.sync()
        return results

    def _write_file(self, ctx, planner, path, storage_key, items):
        if isinstance(self.fs, _UrlFS):
            return self._write_url(ctx, planner, str(path), storage_key, items)
        out = _ft._Durable(str(path), ctx)
        writes = None
        try:
            results = []
            at = 0
            f = out.file
            # The stock writer's order: byte items first, then the tensors.
            for wi in items:
                if wi.type != _WriteItemType.BYTE_IO:
                    continue
                data = planner.resolve_data(wi)
                b = data.getbuffer() if isinstance(data, _io.BytesIO) else memoryview(data)
                n = f.pwrite_from(b, at) if len(b) else 0
                if n != len(b):
                    raise OSError("%s: short write at offset %d" % (path, at))
                results.append(_WriteResult(index=wi.index, size_in_bytes=len(b),
                                            storage_data=_fs._StorageInfo(storage_key, at, len(b))))
                at += len(b)
            writes = _ft._Writes(f)
            templates = {}  # (dtype, size, stride) -> _Layout
            for wi in self._tensor_items(items):
                t = planner.resolve_data(wi).detach()
                if t.device.type not in ("cpu", "cuda"):
                    t = t.cpu()
                if t.untyped_storage().nbytes() == t.nbytes:
                    data = t.untyped_storage()
                elif t.is_contiguous():
                    # a run of bytes inside a larger storage (the device snapshot's tensors): the
                    # stock writer's clone would hold the same bytes
                    data = _ft._byte_view(t.untyped_storage())[
                        t.storage_offset() * t.element_size():][:t.nbytes]
                else:
                    t = t.clone()  # as the stock writer does: minimal storage, same strides
                    data = t.untyped_storage()
                # The zip is laid out for a CPU tensor of the same dtype, shape and strides
                # (the stock writer saves CPU tensors: the pickle says "cpu"); its storage's
                # bytes then come from t, wherever t lives.
                # Tensors of one dtype, shape and strides have the same zip but for the crc32s:
                # it is laid out once per file (torch's writer, ~0.5 ms an item, was a quarter of
                # a 512 MB save's writing time on the development VM for 256 items).
                key = (t.dtype, tuple(t.size()), tuple(t.stride()))
                tpl = templates.get(key)
                if tpl is None:
                    shadow = _torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
                    tpl = templates[key] = _ft._Layout(shadow, str(path))
                layout = _layout_for(tpl, data)
                n = writes.add(at, layout, wait_current=t.untyped_storage().data_ptr() not in
                               self._snap_ptrs)
                results.append(_WriteResult(index=wi.index, size_in_bytes=n,
                                            storage_data=_fs._StorageInfo(storage_key, at, n)))
                at += n
            writes.finish()
            writes = None
        except BaseException:
            if writes is not None:
                try:
                    writes.finish()  # the writes in flight end before the file goes
                except BaseException:
                    pass
            out.abort()
            raise
        out.commit(self.sync_files)
        return results

    def finish(self, metadata, results):
        self._snap_ptrs = set()  # written: a later save's tensors may reuse the addresses
        metadata.version = _fs.CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        if not self.use_collectives and self.rank is not None:
            final = str(self._get_metadata_path(self.rank))
        else:
            final = str(self._get_metadata_path())
        blob = _pickle.dumps(metadata)
        if isinstance(self.fs, _UrlFS):
            self.fs.put(final, blob)  # last, after every data object is committed
            return
        ctx = self._ctx if self._ctx is not None else _ferry.default_context()
        out = _ft._Durable(final, ctx)
        try:
            if out.file.pwrite_from(blob, 0) != len(blob):
                raise OSError("%s: short write" % out.tmp)
        except BaseException:
            out.abort()
            raise
        out.commit(self.sync_files)


def _read_async(f, off, buf):
    """One item's read, submitted to the engine at once (a Future)."""
    return f.pread_into_async(buf, off)


def _wait_all(futs):
    """Waits for every future of futs ((future, ...) tuples), errors or not: the reads write
    into the targets, and the files close only after their reads."""
    for e in futs:
        e[0].wait()


def _frame_bufs(n, whole):
    """The windows of an item of n bytes that a load reads first: [(at, bytearray)]."""
    if whole or n <= 2 * _FRAME:
        return [(0, bytearray(n))]
    return [(0, bytearray(_FRAME)), (n - _FRAME, bytearray(_FRAME))]


class _Prefetch:
    """Every item's framing (_frame_bufs) read on a thread of its own, one batch, from the
    moment DCP hands the reader its metadata, while DCP plans the load: the framing batch was
    the step before any tensor byte moved (16 ms of a 256-item load on the development VM).
    The files it opened go to read_data; any failure leaves read_data to read (and report) as
    without it."""

    def __init__(self, ctx, base, fs, storage_data):
        self.files = {}  # relative path -> File
        self.frames = {}  # MetadataIndex -> windows read in full
        self._thread = _threading.Thread(target=self._run, name="ferry-dcp-frames",
                                         args=(ctx, base, fs, storage_data), daemon=True)
        self._thread.start()

    def _run(self, ctx, base, fs, storage_data):
        try:
            entries, owners = [], []
            for index, md in storage_data.items():
                if md.transform_descriptors:
                    continue
                f = self.files.get(md.relative_path)
                if f is None:
                    f = self.files[md.relative_path] = _ferry.open(
                        str(fs.concat_path(base, md.relative_path)), "r", context=ctx)
                bufs = _frame_bufs(md.length, False)
                for at, b in bufs:
                    if len(b):
                        entries.append((f, md.offset + at, b))
                owners.append((index, bufs))
            got = iter(ctx.read_batch(entries) if entries else ())
            for index, bufs in owners:
                if all(not len(b) or next(got) == len(b) for _at, b in bufs):
                    self.frames[index] = bufs
        except BaseException:  # noqa: BLE001 - read_data reads them again and reports
            self.frames = {}

    def take(self):
        """(files, frames) once the thread is done."""
        self._thread.join()
        return self.files, self.frames


class Reader(_fs.FileSystemReader):
    """A ``StorageReader`` for ``dcp.load``: FileSystemReader's format, tensors read by ferry.

    A tensor item whose requested region is contiguous in the file is read straight into the
    destination tensor (GPU memory included); others are read into host memory and copied.
    Items with stream-transform extensions are read by the stock code path.
    """

    def __init__(self, path, *args, context=None, **kwargs):
        super().__init__(str(path) if _is_url(path) else path, *args, **kwargs)
        self._ctx = context
        self._layouts = {}  # item length -> [_ItemLayout] parsed before (_item)
        self._pickles = {}  # data.pkl bytes -> what unpickling it gave (_item_parse)
        if _is_url(path):
            self.fs = _UrlFS(self)
            self.path = self.fs.init_path(path)

    def read_metadata(self, *args, **kwargs):
        # dcp.load's first call: the context's workers (threads, rings; in a process that uses
        # the GPU, their streams and the pinned copy units) start in the background while DCP
        # reads the metadata and plans, instead of inside the first read (issue 24).
        self.trace = {}
        self._t0 = _time.perf_counter()
        _ft._start_workers(self._ctx if self._ctx is not None else _ferry.default_context(),
                           self.trace)
        if isinstance(self.fs, _UrlFS):
            p = str(self._get_metadata_path(kwargs.get("rank")))
            blob = self.fs.read(p)
            if not blob:
                raise _ft.FormatError("%s: empty: a save over this checkpoint did not finish, so "
                                      "there is no complete checkpoint here" % p)
        return super().read_metadata(*args, **kwargs)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._prefetch = None
        if not isinstance(self.fs, _UrlFS) and 0 < len(self.storage_data) <= _PREFETCH_ITEMS:
            ctx = self._ctx if self._ctx is not None else _ferry.default_context()
            self._prefetch = _Prefetch(ctx, self.path, self.fs, self.storage_data)

    def read_data(self, plan, planner):
        """Every item of the plan in three steps across all the files: the zip framing of every
        item (its first and last 4 KiB, or all of a small item) in one submission to ferry's
        engine, then each contiguous item's tensor bytes straight into its destination, its read
        submitted (a Future) as soon as the item is parsed so that the reads run while the rest
        are, then the non-contiguous regions through host memory. A read per item (and a zip
        parsed with a read per record, a pickle per item) was most of a warm load: 0.43 ms an
        item, 0.11 s of a 0.23 s load of 256 items on the development VM (docs/CHECKPOINTS.md).
        The framing was read while DCP planned, where the checkpoint has at most
        _PREFETCH_ITEMS items (set_up_storage_reader, _Prefetch); read_data reads what that did
        not. The phases' times of the last load are in ``self.trace`` (seconds; FERRY_TRACE=1
        prints them): ``plan`` from read_metadata to read_data (DCP's metadata, planning and
        collectives), then from read_data's start ``prefetched`` (the framing's thread joined),
        ``frames``, ``first_read`` (the first tensor read submitted), ``submitted`` (the last),
        ``wait``, ``host`` (the non-contiguous items) and ``read_data``; ``workers_start`` (its
        own duration) where this load started the context's workers."""
        t0 = _time.perf_counter()
        trace = getattr(self, "trace", None)
        if trace is None:
            trace = self.trace = {}
        t_meta = self.__dict__.pop("_t0", None)  # this load's read_metadata, where it ran here
        if t_meta is not None:
            trace["plan"] = t0 - t_meta
        ctx = self._ctx if self._ctx is not None else _ferry.default_context()
        per_file = {}
        stock = []
        for req in plan.items:
            md = self.storage_data[req.storage_index]
            if md.transform_descriptors:
                stock.append(req)
            else:
                per_file.setdefault(md.relative_path, []).append(req)
        pre, self._prefetch = getattr(self, "_prefetch", None), None
        opened, known = pre.take() if pre is not None else ({}, {})
        trace["prefetched"] = _time.perf_counter() - t0
        files = []
        try:
            items = []  # (file, path, req, md)
            for rel, reqs in per_file.items():
                path = str(self.fs.concat_path(self.path, rel))
                f = opened.pop(rel, None)
                if f is None:
                    f = _ferry.open(path, "r", context=ctx)
                files.append(f)
                reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)
                items.extend((f, path, r, self.storage_data[r.storage_index]) for r in reqs)
            if items:
                self._read_items(ctx, items, planner, trace, t0, known)
        finally:
            for f in files + list(opened.values()):
                f.close()
        if stock:
            if isinstance(self.fs, _UrlFS):
                raise NotImplementedError("ferry.dcp.Reader: items with extensions are read by the "
                                          "stock code, which has no s3:// path")
            from torch.distributed.checkpoint.planner import LoadPlan
            super().read_data(LoadPlan(stock), planner)
        trace["read_data"] = _time.perf_counter() - t0
        if _os.environ.get("FERRY_TRACE", "") not in ("", "0"):
            _sys.stderr.write("ferry.dcp.Reader.read_data: %s\n" % " ".join(
                "%s=%.3fms" % (k, v * 1e3) for k, v in trace.items()))
        fut = _Future()
        fut.set_result(None)
        return fut

    def _read_items(self, ctx, items, planner, trace, t0, known):
        # 1. The framing of every item (byte items whole) not prefetched (known), one batch.
        frames = []  # per item: [(at, bytes), ...] windows of the item
        entries, fresh = [], []
        for f, path, req, md in items:
            whole = req.type == _LoadItemType.BYTE_IO
            bufs = known.get(req.storage_index)
            if bufs is None or (whole and len(bufs) != 1):
                bufs = _frame_bufs(md.length, whole)
                entries.extend((f, md.offset + at, b) for at, b in bufs if len(b))
                fresh.append((path, req, md, bufs))
            frames.append(bufs)
        got = iter(ctx.read_batch(entries) if entries else ())
        for path, req, md, bufs in fresh:
            for at, b in bufs:
                if len(b) and next(got) != len(b):
                    raise _ft.FormatError("%s: item %s: %d bytes at offset %d run past the end"
                                          % (path, req.storage_index.fqn, md.length, md.offset))
        trace["frames"] = _time.perf_counter() - t0
        # 2. Each item's saved tensor and destination; a contiguous one's read is submitted at
        # once and runs while the rest are parsed.
        reads, spans = [], []  # reads: (future, path, req, target, nbytes, offset)
        try:
            self._plan_items(items, frames, planner, reads, spans, trace, t0)
        except BaseException:
            _wait_all(reads)  # the reads write into the targets: ended first
            raise
        trace["submitted"] = _time.perf_counter() - t0
        try:
            for fu, path, req, target, nbytes, off in reads:
                n = fu.result()
                if n != nbytes:
                    raise _ft.FormatError("%s: item %s: read %d of %d bytes at offset %d"
                                          % (path, req.storage_index.fqn, n, nbytes, off))
        finally:
            _wait_all(reads)
        trace["wait"] = _time.perf_counter() - t0
        for _fu, _path, req, target, _n, _off in reads:
            planner.commit_tensor(req, target)
        self._read_spans(ctx, spans, planner)
        trace["host"] = _time.perf_counter() - t0

    def _plan_items(self, items, frames, planner, reads, spans, trace, t0):
        synced = set()
        for (f, path, req, md), bufs in zip(items, frames):
            if req.type == _LoadItemType.BYTE_IO:
                planner.load_bytes(req, _io.BytesIO(bytes(bufs[0][1])))
                continue
            saved, data_at = self._item(f, path, md, bufs)
            region = _narrow(saved, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != region.size():
                raise AssertionError("req %s mismatch sizes %s vs %s"
                                     % (req.storage_index, target.size(), region.size()))
            esize = region.element_size()
            if target.device.type == "cuda" and target.device not in synced:
                # ferry copies on its own streams; the allocator's memory may still be in use
                # by work queued on the current stream.
                _torch.cuda.current_stream(target.device).synchronize()
                synced.add(target.device)
            if (region.is_contiguous() and target.is_contiguous() and target.dtype == region.dtype
                    and target.device.type in ("cpu", "cuda")):
                nbytes = region.numel() * esize
                if nbytes:
                    buf = target.view(-1).view(_torch.uint8) if target.dim() else \
                        target.reshape(1).view(_torch.uint8)
                    off = data_at + region.storage_offset() * esize
                    if not reads:
                        trace["first_read"] = _time.perf_counter() - t0
                    reads.append((_read_async(f, off, buf), path, req, target, nbytes, off))
                else:
                    planner.commit_tensor(req, target)
                continue
            # Not one run of bytes: the saved storage's span the region touches, then a copy.
            lo = region.storage_offset()
            hi = lo + 1 + sum((s - 1) * st for s, st in zip(region.size(), region.stride()))
            if region.numel() == 0:
                hi = lo
            spans.append((f, path, req, region, target, data_at + lo * esize, (hi - lo) * esize))

    def _read_spans(self, ctx, spans, planner):
        # 3. The others through host memory, in batches of at most _HOST_BATCH bytes.
        i = 0
        while i < len(spans):
            j, total = i, 0
            while j < len(spans) and (j == i or total + spans[j][6] <= _HOST_BATCH):
                total += spans[j][6]
                j += 1
            group = spans[i:j]
            hosts = [_torch.empty(s[6], dtype=_torch.uint8) for s in group]
            todo = [(s[0], s[5], h) for s, h in zip(group, hosts) if s[6]]
            got = iter(ctx.read_batch(todo) if todo else ())
            for (f, path, req, region, target, off, nbytes), host in zip(group, hosts):
                if nbytes and next(got) != nbytes:
                    raise _ft.FormatError("%s: item %s: short read at offset %d"
                                          % (path, req.storage_index.fqn, off))
                src = _torch.empty(0, dtype=region.dtype).set_(host.untyped_storage(), 0,
                                                               region.size(), region.stride())
                target.copy_(src)
                planner.commit_tensor(req, target)
            i = j

    def _item(self, f, path, md, frames):
        """The saved tensor of one item (on the meta device) and where its bytes start. frames:
        [(at, bytes)] windows of the item already read; a read outside them goes to the file.
        Items of one dtype, shape and strides have the same zip but for the crc32s: an item
        whose bytes outside its data equal (crc32 fields aside) those of an item parsed before
        in this reader, at the same length, takes that item's answer (_ItemLayout): 52 us an
        item parsed against a few for the comparison, on the development VM."""
        base, length = md.offset, md.length

        def window(off, n):
            for at, b in frames:
                if at <= off and off + n <= at + len(b):
                    return b[off - at:off - at + n]
            return None

        seen = self._layouts
        for lay in seen.get(length, ()):
            if lay.matches(window):
                return lay.t, base + lay.data_at
        t, zf, pkl_rec, bo_rec, rec = self._item_parse(f, path, md, window)
        lays = seen.setdefault(length, [])
        if len(lays) < 8:
            lays.append(_ItemLayout(t, zf, length, window, (pkl_rec, bo_rec, rec)))
        return t, base + rec.data

    def _item_parse(self, f, path, md, window):
        base, length = md.offset, md.length

        def read(off, n):
            n = max(0, min(n, length - off))
            b = window(off, n)
            if b is not None:
                return bytes(b)
            buf = bytearray(n)
            got = f.pread_into(buf, base + off) if n else 0
            return bytes(buf[:got])

        zf = _ft._Zip("%s (item at offset %d)" % (path, base), read, base, length)
        pkl_rec = zf.find("data.pkl")
        if pkl_rec is None:
            raise _ft.FormatError("%s: item at offset %d: no data.pkl record" % (path, base))
        pkl = zf.get("data.pkl")
        bo_rec = zf.find("byteorder")
        bo = zf.get("byteorder")
        if bo is not None and bo.decode("ascii", "replace") != _sys.byteorder:
            raise _ft.FormatError("%s: item at offset %d: byteorder %r; this reader reads %s"
                                  % (path, base, bo, _sys.byteorder))
        memo = self._pickles
        hit = memo.get(pkl)
        if hit is None:
            keys = []

            def persistent_load(saved_id):
                storage_type, key, _location, numel = saved_id[1:]
                dtype = _torch.uint8 if storage_type is _torch.UntypedStorage else storage_type.dtype
                keys.append(key)
                s = _torch.UntypedStorage(numel * _torch._utils._element_size(dtype), device="meta")
                return _torch.storage.TypedStorage(wrap_storage=s, dtype=dtype, _internal=True)

            u = _ft._unpickler_class(True, None)(_io.BytesIO(pkl), encoding="utf-8")
            u.persistent_load = persistent_load
            t = u.load()
            if not isinstance(t, _torch.Tensor) or len(keys) != 1:
                raise _ft.FormatError("%s: item at offset %d: not one tensor" % (path, base))
            hit = memo[pkl] = (t, keys[0])
        t, key = hit
        rec = zf.find("data/%s" % key)
        if rec is None:
            raise _ft.FormatError("%s: item at offset %d: record data/%s missing"
                                  % (path, base, key))
        zf.offset(rec)
        if rec.size < t.untyped_storage().nbytes():
            raise _ft.FormatError("%s: item at offset %d: record data/%s holds %d bytes, the "
                                  "tensor needs %d" % (path, base, key, rec.size,
                                                       t.untyped_storage().nbytes()))
        return t, zf, pkl_rec, bo_rec, rec


class _ItemLayout:
    """What _item_parse found in one item, and the bytes it read to find it: the central
    directory to the end and the local headers and contents of the records it used, each with
    its crc32 fields zeroed. Another item of the same length whose same bytes are equal (crc32
    fields aside) has the same records at the same offsets, the same data.pkl and byteorder, so
    the same tensor and data offset; its crc32s are not read by the reader (ferry ckpt verify
    checks them)."""

    def __init__(self, t, zf, length, window, recs):
        self.t = t
        pkl_rec, bo_rec, rec = recs
        self.data_at = rec.data
        cd_off = min(r.cd_at for r in zf.records.values()) - 16  # the first entry's crc32 at +16
        self.checks = [(cd_off, length - cd_off,
                        [r.cd_at - cd_off for r in zf.records.values()])]
        for r in (pkl_rec, bo_rec, rec):
            if r is None:
                continue
            self.checks.append((r.header, r.data - r.header, [14]))  # local header, crc32 at 14
        for r in (pkl_rec, bo_rec):
            if r is not None:
                self.checks.append((r.data, r.size, []))
        self.want = []
        for off, n, crcs in self.checks:
            b = window(off, n)
            self.want.append(None if b is None else self._masked(b, crcs))

    @staticmethod
    def _masked(b, crcs):
        b = bytearray(b)
        for c in crcs:
            b[c:c + 4] = b"\0\0\0\0"
        return b

    def matches(self, window):
        for (off, n, crcs), want in zip(self.checks, self.want):
            if want is None:
                return False
            b = window(off, n)
            if b is None or (self._masked(b, crcs) if crcs else b) != want:
                return False
        return True


# ------------------------------------------------------------------ the load planner

def _dtensor_chunk(obj):
    """The ChunkStorageMetadata that ``obj.__create_chunk_list__()`` gives for a DTensor whose
    placements are all plain ``Shard(dim)`` or ``Replicate()``, by arithmetic; None for anything
    else (the caller then takes torch's path). torch's ``compute_local_shape_and_global_offset``
    gives the same answer through a ``torch.arange`` over each shard's length (torch 2.15):
    0.54 s of a 0.75 s load of 256 MB a rank on the development VM (issue 24). The split is
    ``Shard.local_shard_size_and_offset``'s (torch.chunk's): ``n`` over ``k`` ranks in chunks of
    ``ceil(n / k)``, the trailing ones smaller or empty; shards of one dim nest (mesh dims left
    to right), and a dim whose local length is 0 has the global length as its offset, as
    torch 2.15 gives it (an empty chunk overlaps no saved chunk, so it makes no read item
    whatever its offset)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    if getattr(type(obj), "__create_chunk_list__", None) is not DTensor.__create_chunk_list__:
        return None  # a subclass with its own chunks
    local = obj._local_tensor
    if hasattr(local, "__create_chunk_list__") or not isinstance(local, _torch.Tensor):
        return None  # torch asks the local tensor
    mesh = obj.device_mesh
    placements = obj.placements
    mesh_shape = tuple(mesh.shape)
    coord = mesh.get_coordinate()
    if coord is None or len(placements) != len(mesh_shape) or len(coord) != len(mesh_shape):
        return None
    shape = tuple(obj.shape)
    sizes, start, empty = list(shape), [0] * len(shape), set()
    for mdim, p in enumerate(placements):
        if type(p) is Replicate:
            continue
        if type(p) is not Shard or not 0 <= p.dim < len(shape):
            return None  # _StridedShard, Partial, others: torch's own path (and errors)
        d, n, k, r = p.dim, sizes[p.dim], mesh_shape[mdim], coord[mdim]
        if n % k == 0:
            size, off = n // k, n // k * r
        else:
            full = -(-n // k)
            size, off = max(0, min(n, full * r + full) - full * r), min(n, full * r)
        if size == 0:
            empty.add(d)
        else:
            start[d] += off
        sizes[d] = size
    offsets = [shape[d] if d in empty else start[d] for d in range(len(shape))]
    return ChunkStorageMetadata(offsets=_torch.Size(offsets), sizes=_torch.Size(sizes))


def _read_items(torch_read_items):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    from torch.distributed.tensor import DTensor

    def read_items(fqn, md, obj):
        if isinstance(obj, DTensor) and not isinstance(md, BytesStorageMetadata):
            chunk = _dtensor_chunk(obj)
            if chunk is not None:
                return create_read_items_for_chunk_list(fqn, md, [chunk])
        return torch_read_items(fqn, md, obj)
    return read_items


def _with_globals(fn, **names):
    """fn's code with some of the globals it reads replaced (its module left as it is)."""
    import types
    g = dict(fn.__globals__)
    g.update(names)
    out = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


class LoadPlanner(_dcp_planner.DefaultLoadPlanner):
    """torch's ``DefaultLoadPlanner`` (same arguments, same plan: the same ReadItems in the same
    order, the same errors) whose DTensors with plain ``Shard``/``Replicate`` placements have
    their local chunk computed by arithmetic instead of torch's ``torch.arange`` over each
    shard (``_dtensor_chunk``); other placements take torch's path. The plan is made by torch's
    own ``DefaultLoadPlanner.create_local_plan`` and ``create_default_local_load_plan`` code,
    run with ``_create_read_items`` swapped for one that builds the items of such a DTensor with
    torch's ``create_read_items_for_chunk_list``. Where this torch's code is not laid out that
    way, the plan is torch's, made the slow way. ``dcp.load`` takes a planner of its own
    (``DefaultLoadPlanner`` when given none), which a StorageReader cannot change: pass
    ``planner=ferry.dcp.LoadPlanner()`` (docs/PYTHON.md)."""

    def create_local_plan(self):
        base = _dcp_planner.DefaultLoadPlanner.create_local_plan
        inner = _dcp_planner.create_default_local_load_plan
        if ("create_default_local_load_plan" not in base.__code__.co_names or
                "_create_read_items" not in inner.__code__.co_names):
            return base(self)
        inner = _with_globals(inner, _create_read_items=_read_items(
            inner.__globals__["_create_read_items"]))
        return _with_globals(base, create_default_local_load_plan=inner)(self)
