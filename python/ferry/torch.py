"""torch.save files read and written by ferry (docs/PYTHON.md, "torch.load and torch.save").

    import ferry.torch
    sd = ferry.torch.load("pytorch_model.bin", map_location="cuda")   # was torch.load(...)
    ferry.torch.save(sd, "model.pt")                                  # was torch.save(...)

``load`` parses the zip itself and reads each storage record with ferry straight into memory on
its destination device (GPU memory included); the pickle is read by torch's own weights-only
unpickler, so objects and structure are those of ``torch.load(path, map_location=...,
weights_only=True)``. ``save`` lets torch lay the zip out (``torch.serialization.skip_data``: the
same records, order and 64-byte alignment as ``torch.save``) and writes the storage bytes with
ferry, durably: a temporary name created exclusively, fsync, rename, directory fsync.
"""
from __future__ import annotations

import bisect as _bisect
import io as _io
import os as _os
import pickle as _pickle
import re as _re
import struct as _struct
import sys as _sys
import threading as _threading
import time as _time
import zlib as _zlib

import torch as _torch

import ferry as _ferry
from .safetensors import _start_workers  # noqa: F401 (ferry.dcp's too)

__all__ = ["load", "save", "FormatError"]


class FormatError(RuntimeError):
    """A torch.save file that cannot be read: "<path>: <what>: <why>"."""


# ------------------------------------------------------------------------------------ the zip

_EOCD = b"PK\x05\x06"
_EOCD64_LOC = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CDH = b"PK\x01\x02"
_LFH = b"PK\x03\x04"


def _pread(fd, n, off):
    out = bytearray()
    while len(out) < n:
        b = _os.pread(fd, n - len(out), off + len(out))
        if not b:
            break
        out += b
    return bytes(out)


class _Record:
    __slots__ = ("name", "method", "size", "csize", "crc", "header", "cd_at", "data")

    def __init__(self, name, method, size, csize, crc, header, cd_at):
        self.name, self.method, self.size, self.csize = name, method, size, csize
        self.crc, self.header, self.cd_at, self.data = crc, header, cd_at, None


class _Zip:
    """The records of one zip archive lying at [base, base + length) of a file (or a bytes)."""

    def __init__(self, path, reader, base, length):
        self.path, self._read, self.base, self.length = path, reader, base, length
        self.records = {}
        self.prefix = ""
        self._parse()

    def _bad(self, what, why):
        where = self.path if not self.base else "%s (the zip at offset %d)" % (self.path, self.base)
        return FormatError("%s: %s: %s" % (where, what, why))

    def _parse(self):
        n = self.length
        if n < 22:
            raise self._bad("zip", "%d bytes: too short for a zip file (truncated?)" % n)
        # torch's zips carry no comment: the end records are in the last 98 bytes; a zip with a
        # comment (up to 64 KiB) is searched in a second read.
        for tail_n in (min(n, 4096), min(n, 65557 + 20 + 56)):
            tail = self._read(n - tail_n, tail_n)
            at = tail.rfind(_EOCD)
            if at >= 0 or tail_n == n:
                break
        if at < 0 or at + 22 > len(tail):
            raise self._bad("end of central directory", "not found in the last %d bytes "
                            "(truncated or not a zip file)" % tail_n)
        (_, _, _, count, _, cd_size, cd_off, _) = _struct.unpack_from("<IHHHHIIH", tail, at)
        eocd_at = n - tail_n + at
        if count == 0xFFFF or cd_off == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
            loc = at - 20
            if loc < 0 or tail[loc:loc + 4] != _EOCD64_LOC:
                raise self._bad("zip64 end of central directory locator", "missing")
            (rec_off,) = _struct.unpack_from("<Q", tail, loc + 8)
            rec = self._read(rec_off, 56)
            if len(rec) < 56 or rec[:4] != _EOCD64:
                raise self._bad("zip64 end of central directory", "not at offset %d" % rec_off)
            count, cd_size, cd_off = _struct.unpack_from("<QQQ", rec, 32)
            eocd_at = rec_off
        if cd_off + cd_size > eocd_at:
            raise self._bad("central directory", "offset %d + size %d runs past the end "
                            "records at %d (truncated?)" % (cd_off, cd_size, eocd_at))
        cd = self._read(cd_off, cd_size)
        p = 0
        for i in range(count):
            if cd[p:p + 4] != _CDH:
                raise self._bad("central directory entry %d" % i, "bad signature at offset %d"
                                % (cd_off + p))
            (flag, method, crc, csize, size, nlen, xlen, clen, hdr) = _struct.unpack_from(
                "<8xHH4xIIIHHH8xI", cd, p)
            crc_at = p + 16
            name = cd[p + 46:p + 46 + nlen].decode("utf-8", "replace")
            extra = cd[p + 46 + nlen:p + 46 + nlen + xlen]
            if 0xFFFFFFFF in (size, csize, hdr):
                x = 0
                while x + 4 <= len(extra):
                    tag, ln = _struct.unpack_from("<HH", extra, x)
                    if tag == 1:
                        vals = list(_struct.unpack_from("<%dQ" % (ln // 8), extra, x + 4))
                        if size == 0xFFFFFFFF:
                            size = vals.pop(0)
                        if csize == 0xFFFFFFFF:
                            csize = vals.pop(0)
                        if hdr == 0xFFFFFFFF:
                            hdr = vals.pop(0)
                        break
                    x += 4 + ln
            self.records[name] = _Record(name, method, size, csize, crc, hdr, cd_off + crc_at)
            p += 46 + nlen + xlen + clen
        if not self.records:
            raise self._bad("zip", "no records")
        first = next(iter(self.records))
        self.prefix = first.split("/", 1)[0] + "/" if "/" in first else ""

    def find(self, name):
        return self.records.get(self.prefix + name)

    def offset(self, rec):
        """Where rec's data starts, from its local header; checks it lies inside the archive."""
        if rec.data is None:
            lh = self._read(rec.header, 30)
            if len(lh) < 30 or lh[:4] != _LFH:
                raise self._bad("record %s" % rec.name, "no local header at offset %d"
                                % rec.header)
            nlen, xlen = _struct.unpack_from("<HH", lh, 26)
            rec.data = rec.header + 30 + nlen + xlen
        if rec.method != 0:
            raise self._bad("record %s" % rec.name, "compressed (method %d); torch.save "
                            "records are stored" % rec.method)
        if rec.data + rec.size > self.length:
            raise self._bad("record %s" % rec.name, "data at offset %d + %d bytes runs past "
                            "the end of the file (%d bytes)" % (rec.data, rec.size, self.length))
        return rec.data

    def get(self, name):
        rec = self.find(name)
        if rec is None:
            return None
        return self._read(self.offset(rec), rec.size)


def _file_zip(path, fd, base=0, length=None):
    if length is None:
        length = _os.fstat(fd).st_size
    return _Zip(path, lambda off, n: _pread(fd, n, base + off), base, length)


def _bytes_zip(path, blob):
    return _Zip(path, lambda off, n: bytes(blob[off:off + n]), 0, len(blob))


# ------------------------------------------------------------------------------------ loading

def _byte_view(storage):
    """A 1-D uint8 tensor over all of an UntypedStorage (a buffer ferry takes through DLPack)."""
    return _torch.empty(0, dtype=_torch.uint8, device=storage.device).set_(storage)


def _cuda_location(location):
    # the locations torch's "cuda" deserializer takes (torch.serialization._deserialize)
    return location == "cuda" or _re.match("cuda(:|[0-9]+)", location) is not None


class _Loader:
    def __init__(self, path, fd, zf, map_location, ctx):
        self.path, self.fd, self.zf, self.map_location = path, fd, zf, map_location
        self.ctx = ctx
        self.file = None
        self.pending = []
        self.synced = set()
        self.restore = _torch.serialization._get_restore_location(map_location)
        bo = zf.get("byteorder")
        if bo is not None and bo not in (b"little", b"big"):
            raise FormatError("%s: record byteorder: %r is neither little nor big" % (path, bo))
        self.byteorder = (bo or b"little").decode()
        self.early = {}  # key -> storage being read since start()
        self.early_swap = {}  # key -> the dtype to byteswap it by, once read
        self.thread = None
        self.got = None

    def start(self):
        """Where every storage goes to one device named by map_location (a str or
        torch.device: "cuda", "cpu", ...), the storages are allocated from the zip's data/
        records and their reads start now, on a thread, while the pickle is read: its
        weights-only unpickler (pure Python, 4-8 ms for 64 tensors on the development VM) was
        time before the first byte moved. Taken where the pickle names only globals that build
        without reading a storage (_plain_globals). Elsewhere (map_location None, a dict, a
        callable) the device of each storage is known only from the pickle: the reads wait for
        it (finish())."""
        m = self.map_location
        if isinstance(m, bytes):
            m = m.decode()
        if not isinstance(m, (str, _torch.device)):
            return
        target = str(m)
        if target != "cpu" and not _cuda_location(target):
            return
        dev = (_torch.device("cpu") if target == "cpu"
               else _torch.serialization._validate_device(target, "cuda"))
        prefix = self.zf.prefix + "data/"
        entries = []
        for name, rec in self.zf.records.items():
            if not name.startswith(prefix) or "/" in name[len(prefix):]:
                continue
            storage = _torch.UntypedStorage(rec.size, device=dev)
            self.early[name[len(prefix):]] = storage
            if rec.size:
                buf = _byte_view(storage)
                self._sync(buf)
                entries.append((self.zf.offset(rec), buf))
        if not entries:
            return
        if self.file is None:
            self.file = _ferry.open(self.path, "r", context=self.ctx)
        self.early_entries = entries

        def run():
            try:
                if dev.type == "cuda":
                    _torch.cuda.set_device(dev)  # current on this thread, as on the caller's
                self.got = self.file.read_batch(entries)
            except BaseException as e:  # raised by finish(), on the caller's thread
                self.got = e

        self.thread = _threading.Thread(target=run, name="ferry-torch-load", daemon=True)
        self.thread.start()

    def _target(self, location):
        """The location string the storage lands on, or None where only map_location knows."""
        m = self.map_location
        if m is None:
            return location
        if isinstance(m, dict):
            return m.get(location, location)
        if isinstance(m, (str, bytes)):
            return m.decode() if isinstance(m, bytes) else m
        if isinstance(m, _torch.device):
            return str(m)
        return None

    def _read_into(self, storage, off, nbytes, wait, swap=None):
        """Reads the storage's bytes now (wait) or in finish()'s one batch with every other
        storage's: the storages are all allocated before the first read (an allocation of device
        memory between reads no longer waits behind the copies in flight), and the engine sees
        every read at once. swap: the dtype to byteswap by after the read."""
        if self.file is None:
            self.file = _ferry.open(self.path, "r", context=self.ctx)
        buf = _byte_view(storage)
        if wait:
            self._sync(buf)
            n = self.file.pread_into(buf, off)
            self._check(n, nbytes, off)
            if swap is not None:
                storage.byteswap(swap)
        else:
            self.pending.append((buf, nbytes, off, storage, swap))

    def _sync(self, buf):
        if buf.device.type == "cuda" and buf.device not in self.synced:
            # ferry copies on its own streams; the allocator's memory may still be in use by
            # work queued on the current stream.
            _torch.cuda.current_stream(buf.device).synchronize()
            self.synced.add(buf.device)

    def _check(self, n, nbytes, off):
        if n != nbytes:
            raise FormatError("%s: storage at offset %d: read %d of %d bytes (file shrank?)"
                              % (self.path, off, n, nbytes))

    def finish(self, ok=True):
        try:
            if self.thread is not None:
                self.thread.join()  # on error too: the reads write into the storages
                self.thread = None
                if isinstance(self.got, BaseException):
                    if ok:
                        raise self.got
                elif ok:
                    for (off, buf), n in zip(self.early_entries, self.got):
                        self._check(n, buf.numel(), off)
                    for key, dtype in self.early_swap.items():
                        self.early[key].byteswap(dtype)
            if ok and self.pending:
                for buf, _n, _off, _s, _sw in self.pending:
                    self._sync(buf)
                got = self.file.read_batch([(off, buf) for buf, _n, off, _s, _sw in self.pending])
                for (buf, nbytes, off, storage, swap), n in zip(self.pending, got):
                    self._check(n, nbytes, off)
                    if swap is not None:
                        storage.byteswap(swap)
        finally:
            self.pending = []
            if self.file is not None:
                self.file.close()

    def load_storage(self, dtype, nbytes, key, location):
        rec = self.zf.find("data/%s" % key)
        if rec is None:
            raise FormatError("%s: record data/%s: missing (named by the pickle)" % (self.path, key))
        off = self.zf.offset(rec)
        if rec.size != nbytes:
            raise FormatError("%s: record data/%s: %d bytes where the pickle says %d"
                              % (self.path, key, rec.size, nbytes))
        target = self._target(location)
        swap = self.byteorder != _sys.byteorder
        early = self.early.get(key)
        if early is not None:  # read since start(); swapped in finish()
            if swap and nbytes and key not in self.early_swap:
                self.early_swap[key] = dtype
            storage = early
        elif target == "meta":
            storage = _torch.UntypedStorage(nbytes, device="meta")
        elif target is not None and (target == "cpu" or _cuda_location(target)):
            dev = (_torch.device("cpu") if target == "cpu"
                   else _torch.serialization._validate_device(target, "cuda"))
            storage = _torch.UntypedStorage(nbytes, device=dev)
            if nbytes:
                self._read_into(storage, off, nbytes, wait=False, swap=dtype if swap else None)
        else:
            # map_location is a callable, or the location another backend's: torch's own
            # restore_location moves a host copy, as torch.load does.
            storage = _torch.UntypedStorage(nbytes)
            if nbytes:
                self._read_into(storage, off, nbytes, wait=True, swap=dtype if swap else None)
            elif swap:
                storage.byteswap(dtype)
            storage = self.restore(storage, location)
        return _torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


# Globals whose call builds a tensor, a parameter or a container without reading a storage's
# bytes: a pickle that names only these may be read while the storages are (_Loader.start).
_PLAIN = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
          ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_parameter_with_state"),
          ("torch._tensor", "_rebuild_from_type_v2"), ("torch", "Tensor"), ("torch", "Size"),
          ("torch.nn.parameter", "Parameter"), ("torch", "device"), ("builtins", "set"),
          ("builtins", "frozenset"), ("builtins", "tuple"), ("builtins", "list"),
          ("builtins", "dict")}


class _Any:
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


def _plain_globals(pkl):
    """True where every global the pickle names is in _PLAIN (or a storage type or a dtype):
    found by the C unpickler with every global replaced by an inert class (nothing of the file
    runs; 0.3 ms for 64 tensors, a twentieth of the weights-only unpickler's pass). Anything
    else (a quantized tensor's scales, a sparse tensor, a subclass) may read a storage while
    being built: its storages are read before the pickle is."""
    seen = set()

    class Scan(_pickle.Unpickler):
        def find_class(self, mod_name, name):
            seen.add((mod_name, name))
            return _Any

        def persistent_load(self, pid):
            return None

    try:
        Scan(_io.BytesIO(pkl), encoding="utf-8").load()
    except Exception:
        return False
    for mod_name, name in seen:
        if (mod_name, name) in _PLAIN:
            continue
        if mod_name == "torch" and (name.endswith("Storage") or
                                    isinstance(getattr(_torch, name, None), _torch.dtype)):
            continue
        return False
    return True


def _unpickler_class(weights_only, pickle_module):
    base = _torch._weights_only_unpickler if weights_only else (pickle_module or _pickle)

    class Unpickler(base.Unpickler):
        def find_class(self, mod_name, name):  # what torch.serialization._load maps
            if type(name) is str and "Storage" in name:
                try:
                    return _torch.serialization.StorageType(name)
                except KeyError:
                    pass
            mod_name = {"torch.tensor": "torch._tensor"}.get(mod_name, mod_name)
            return super().find_class(mod_name, name)

    return Unpickler


def _validate_sparse(weights_only):
    f = _torch._utils._validate_loaded_sparse_tensors
    import inspect
    if "weights_only" in inspect.signature(f).parameters:  # torch >= 2.12 or so
        f(weights_only=weights_only)
    else:
        f()


_last_trace = None


def last_trace():
    """The phases of this process's last ``load`` of a zip file, in seconds from its start:
    ``zip`` (the zip's directory and data.pkl read), ``submitted`` (where the reads start
    before the pickle is read: every storage allocated, their reads started), ``unpickled``,
    ``total``; ``workers_start`` (its own duration) where that load started the context's
    workers. None before the first. FERRY_TRACE=1 prints them to stderr after each load."""
    return dict(_last_trace) if _last_trace is not None else None


def load(path, map_location=None, *, weights_only=True, pickle_module=None, context=None,
         **pickle_load_args):
    """``torch.load(path, map_location, weights_only=True)`` with the storages read by ferry.

    Each storage is read from the file straight into memory on its destination ("cuda" or
    "cuda:N" map locations included; a dict, str or torch.device map_location is resolved before
    reading, a callable gets a host storage as torch.load gives it). The pickle is read by
    torch's weights-only unpickler unless ``weights_only=False`` (then ``pickle_module``, default
    pickle: only for files you trust). Files in torch's legacy (pre-1.6, non-zip) format are
    handed to ``torch.load`` itself (no ferry reads). Raises FormatError (a RuntimeError) naming
    the file and record for a malformed zip, pickle.UnpicklingError for a pickle that
    weights_only refuses. The phases' times of the process's last load: ``last_trace()``.
    """
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    clock = _time.perf_counter
    t0 = clock()
    trace = {}
    p = _os.fspath(path)
    ctx = context if context is not None else _ferry.default_context()
    # the context's workers start in the background while the zip and pickle are looked at
    _start_workers(ctx, trace)
    fd = _os.open(p, _os.O_RDONLY | getattr(_os, "O_CLOEXEC", 0))
    try:
        magic = _pread(fd, 4, 0)
        if magic != _LFH:
            _os.close(fd)
            fd = -1
            return _torch.load(p, map_location=map_location, weights_only=weights_only,
                               pickle_module=pickle_module, **pickle_load_args)
        zf = _file_zip(p, fd)
        if zf.find("data.pkl") is None:
            if zf.find("constants.pkl") is not None:
                raise FormatError("%s: a TorchScript archive: use torch.jit.load" % p)
            raise FormatError("%s: record data.pkl: missing (not a torch.save file)" % p)
        pkl = zf.get("data.pkl")
        loader = _Loader(p, fd, zf, map_location, ctx)
        trace["zip"] = clock() - t0
        try:
            if weights_only and _plain_globals(pkl):
                loader.start()
        except BaseException:
            loader.finish(False)
            raise
        trace["submitted"] = clock() - t0
        cache = {}

        def persistent_load(saved_id):
            if not isinstance(saved_id, tuple) or not saved_id:
                raise _pickle.UnpicklingError("%s: data.pkl: persistent id %r is not a storage"
                                              % (p, saved_id))
            typename = saved_id[0].decode("ascii") if isinstance(saved_id[0], bytes) else saved_id[0]
            if typename != "storage" or len(saved_id) != 5:
                raise _pickle.UnpicklingError("%s: data.pkl: unknown persistent id %r"
                                              % (p, typename))
            storage_type, key, location, numel = saved_id[1:]
            if isinstance(location, bytes):
                location = location.decode("ascii")
            dtype = _torch.uint8 if storage_type is _torch.UntypedStorage else storage_type.dtype
            nbytes = numel * _torch._utils._element_size(dtype)
            ts = cache.get(key)
            if ts is None:
                ts = cache[key] = loader.load_storage(dtype, nbytes, key, location)
            elif ts.dtype != dtype:
                if ts._untyped_storage.nbytes() == nbytes:
                    ts = _torch.storage.TypedStorage(wrap_storage=ts._untyped_storage, dtype=dtype,
                                                     _internal=True)
                else:
                    ts = loader.load_storage(dtype, nbytes, key, location)
            return ts

        pickle_load_args.setdefault("encoding", "utf-8")
        unpickler = _unpickler_class(weights_only, pickle_module)(_io.BytesIO(pkl),
                                                                  **pickle_load_args)
        unpickler.persistent_load = persistent_load
        tls = _torch.serialization._serialization_tls
        tls.map_location = map_location
        ok = False
        try:
            result = unpickler.load()
            ok = True
            trace["unpickled"] = clock() - t0
        except _pickle.UnpicklingError as e:
            if weights_only:
                raise _pickle.UnpicklingError(
                    "%s: weights_only load refused (pass weights_only=False only for a file "
                    "you trust): %s" % (p, e)) from None
            raise
        finally:
            tls.map_location = None
            loader.finish(ok)  # the storages' reads, in one batch
        _validate_sparse(weights_only)
        trace["total"] = clock() - t0
        global _last_trace
        _last_trace = trace
        if _os.environ.get("FERRY_TRACE", "") not in ("", "0"):
            _sys.stderr.write("ferry.torch.load: %s\n" % " ".join(
                "%s=%.3fms" % (k, v * 1e3) for k, v in trace.items()))
        return result
    finally:
        if fd >= 0:
            _os.close(fd)


# ------------------------------------------------------------------------------------ saving

class _Sink:
    """What torch's zip writer writes, with the storages' data left as holes (skip_data): the
    written runs alone are kept (a 4 GB file's image was a 4 GB zeroed bytearray before, made
    and held before its first byte was written)."""

    def __init__(self):
        self.pos = 0
        self.runs = []  # [start, bytearray], in the order written

    def write(self, b):
        b = bytes(b)
        last = self.runs[-1] if self.runs else None
        if last is not None and last[0] + len(last[1]) == self.pos:
            last[1] += b
        else:
            self.runs.append([self.pos, bytearray(b)])
        self.pos += len(b)
        return len(b)

    def seek(self, off, whence=0):
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else self.pos
        return self.pos

    def tell(self):
        return self.pos

    def flush(self):
        pass

    def blob(self):
        return _Sparse(self.pos, self.runs)


class _Sparse:
    """A file image of which only the written runs are held; bytes in the holes read as zeros."""

    def __init__(self, size, runs):
        self.size = size
        merged = []  # disjoint, sorted; runs applied in the order written (a later one wins)
        for at, b in runs:
            end = at + len(b)
            if not merged or at > merged[-1][0] + len(merged[-1][1]):
                merged.append([at, bytearray(b)])
                continue
            near = [r for r in merged if r[0] <= end and at <= r[0] + len(r[1])]
            lo = min([at] + [r[0] for r in near])
            hi = max([end] + [r[0] + len(r[1]) for r in near])
            buf = bytearray(hi - lo)
            for r in near:
                buf[r[0] - lo:r[0] - lo + len(r[1])] = r[1]
            buf[at - lo:end - lo] = b
            gone = {id(r) for r in near}
            merged = sorted([r for r in merged if id(r) not in gone] + [[lo, buf]],
                            key=lambda r: r[0])
        self.runs = merged
        self.starts = [r[0] for r in merged]

    def __len__(self):
        return self.size

    def _run(self, at):
        i = _bisect.bisect_right(self.starts, at) - 1
        return self.runs[i] if i >= 0 else None

    def view(self, a, b):
        """A memoryview of [a, b), which lies inside one written run; else a copy."""
        r = self._run(a)
        if r is not None and b <= r[0] + len(r[1]):
            return memoryview(r[1])[a - r[0]:b - r[0]]
        return memoryview(self[a:b])

    def __getitem__(self, sl):
        a, b = max(0, sl.start or 0), min(self.size, self.size if sl.stop is None else sl.stop)
        out = bytearray(max(0, b - a))
        i = max(0, _bisect.bisect_right(self.starts, a) - 1)
        while i < len(self.runs) and self.runs[i][0] < b:
            at, run = self.runs[i]
            lo, hi = max(a, at), min(b, at + len(run))
            if lo < hi:
                out[lo - a:hi - a] = run[lo - at:hi - at]
            i += 1
        return bytes(out)

    def pack_into(self, fmt, at, *values):
        r = self._run(at)
        n = _struct.calcsize(fmt)
        if r is None or at + n > r[0] + len(r[1]):
            raise FormatError("zip image: %d bytes at offset %d lie outside what torch's writer "
                              "wrote" % (n, at))
        _struct.pack_into(fmt, r[1], at - r[0], *values)


def _storages(obj, pickle_module, protocol):
    """The storages torch.save would write, by key: the same persistent_id walk, in order."""
    found = {}
    ids = {}

    class P(pickle_module.Pickler):
        def persistent_id(self, o):
            if isinstance(o, _torch.storage.TypedStorage) or _torch.is_storage(o):
                s = o._untyped_storage if isinstance(o, _torch.storage.TypedStorage) else o
                key = ids.setdefault(s._cdata, str(len(ids)))
                found[key] = s
                return ("storage", key)
            return None

    P(_io.BytesIO(), protocol=protocol).dump(obj)
    return found


class _Layout:
    """One torch.save zip: its bytes with holes, and where each storage's bytes go."""

    def __init__(self, obj, name, pickle_module=_pickle, protocol=2):
        storages = _storages(obj, pickle_module, protocol)
        sink = _Sink()
        with _torch.serialization.skip_data():
            _torch.save(obj, sink, pickle_module=pickle_module, pickle_protocol=protocol)
        self.size = sink.pos
        self.blob = sink.blob()
        zf = _bytes_zip(name, self.blob)
        self.holes = []  # (offset, storage, record)
        for key, s in storages.items():
            rec = zf.find("data/%s" % key)
            if rec is None or rec.size != s.nbytes():
                raise FormatError("%s: torch's zip writer laid out no record data/%s of %d bytes"
                                  % (name, key, s.nbytes()))
            self.holes.append((zf.offset(rec), s, rec))
        self.holes.sort(key=lambda h: h[0])

    def segments(self):
        """(offset, bytes) of everything that is not storage data."""
        out, at = [], 0
        for off, s, _rec in self.holes:
            if off > at:
                out.append((at, self.blob.view(at, off)))
            at = off + (s.numel() if isinstance(s, _torch.Tensor) else s.nbytes())
        if at < self.size:
            out.append((at, self.blob.view(at, self.size)))
        return out

    def set_crc(self, rec, data_at, crc):
        """Writes rec's crc32 where torch's writer puts it: the data descriptor and the
        central directory (the local header carries 0: miniz streams with flag bit 3)."""
        end = data_at + rec.size
        if self.blob[end:end + 4] == b"PK\x07\x08":
            self.blob.pack_into("<I", end + 4, crc)
        self.blob.pack_into("<I", rec.cd_at, crc)


_crc_pool_ = None


def _crc_pool():
    # zlib.crc32 releases the GIL: the checksums of several storages run in parallel, beside
    # ferry's writes of the same bytes.
    global _crc_pool_
    if _crc_pool_ is None:
        from concurrent.futures import ThreadPoolExecutor
        _crc_pool_ = ThreadPoolExecutor(max_workers=min(8, _os.cpu_count() or 1),
                                        thread_name_prefix="ferry-crc32")
    return _crc_pool_


# A storage's crc32 is computed in pieces of this many bytes, each on a thread of the pool, and
# combined (crc32_combine): one large tensor no longer checksums on one core.
_CRC_PIECE = 16 << 20
# GPU storages pass through pinned buffers of _STAGE_PIECE bytes, _STAGE_BUFFERS of them per file
# being written (_Stager): each piece copied device-to-host, then written by ferry and checksummed
# on a pool thread while the next pieces copy, across storages (no drain at a storage's end: a
# file of 50 MB storages kept one write in flight at a time, 0.73-0.78x of the disk, issue 24).
_STAGE_PIECE = 16 << 20
_STAGE_BUFFERS = 16

try:  # ISA-L's crc32 (the `isal` package): 4.6 GB/s per core on the development VM, zlib's 0.9
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    _crc32 = _zlib.crc32


class _Done:
    """A finished future."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _gf2_times(mat, vec):
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat):
    return [_gf2_times(mat, mat[n]) for n in range(32)]


_shift_ops = {}


def _shift_op(n):
    """The GF(2) operator that appends n zero bytes to a crc32 (zlib's crc32_combine)."""
    odd = [0xEDB88320] + [1 << k for k in range(31)]  # one zero bit
    even = _gf2_square(odd)  # two
    odd = _gf2_square(even)  # four
    op = [1 << k for k in range(32)]  # identity
    while True:
        even = _gf2_square(odd)  # one zero byte, then powers of two of them
        if n & 1:
            op = [_gf2_times(even, v) for v in op]
        n >>= 1
        if not n:
            return op
        odd = _gf2_square(even)
        if n & 1:
            op = [_gf2_times(odd, v) for v in op]
        n >>= 1
        if not n:
            return op


def _crc32_combine(crc1, crc2, len2):
    """crc32(a + b) from crc1 = crc32(a), crc2 = crc32(b), len2 = len(b) (zlib's crc32_combine).
    The operator is cached by length: pieces share one, so a combine is one 32-step product."""
    if len2 <= 0:
        return crc1
    op = _shift_ops.get(len2)
    if op is None:
        op = _shift_ops[len2] = _shift_op(len2)
    return _gf2_times(op, crc1) ^ crc2


class _Combined:
    """The crc32 of consecutive pieces whose crc32s are futures."""

    def __init__(self, parts):
        self.parts = parts  # (future, length)

    def result(self):
        crc = 0
        for fu, n in self.parts:
            crc = _crc32_combine(crc, fu.result(), n)
        return crc


def _crc_async(arr):
    """The crc32 of a host array (numpy uint8), in pieces on the pool's threads."""
    n = arr.nbytes
    if n <= _CRC_PIECE:
        return _crc_pool().submit(_crc32, arr)
    return _Combined([(_crc_pool().submit(_crc32, arr[o:o + _CRC_PIECE]),
                       min(_CRC_PIECE, n - o)) for o in range(0, n, _CRC_PIECE)])


_stagers = {}  # device -> [(buffers, stream)] not in use
_stagers_lock = _threading.Lock()


def _stager_take(device):
    """_STAGE_BUFFERS pinned buffers of _STAGE_PIECE bytes and a copy stream for device, for one
    file's writes; kept for the process (pinning costs milliseconds per save otherwise). DCP's
    writer threads each take a set of their own."""
    key = (str(device), _STAGE_PIECE)
    with _stagers_lock:
        free = _stagers.setdefault(key, [])
        if free:
            return free.pop()
    bufs = [_torch.empty(_STAGE_PIECE + _ALIGN, dtype=_torch.uint8, pin_memory=True)
            for _ in range(_STAGE_BUFFERS)]
    return (bufs, _torch.cuda.Stream(device))


def _stager_give(device, got):
    with _stagers_lock:
        _stagers.setdefault((str(device), _STAGE_PIECE), []).append(got)


_ALIGN = 4096  # the file offsets the engine writes with O_DIRECT: whole blocks of this size


class _Parts:
    """The writes of one range split by _pwrite; result() is the bytes written in all."""
    __slots__ = ("futs",)

    def __init__(self, futs):
        self.futs = futs

    def result(self):
        return sum(fu.result() for fu in self.futs)


def _pwrite(f, buf, at):
    """Writes the 1-D byte tensor (or buffer) buf at offset `at` of f: the part between the first
    and last _ALIGN boundaries in one request, the head and tail (under _ALIGN bytes each) in
    their own. The engine writes a request's chunks of unaligned file range through the page
    cache (a read-modify-write would race with the neighbours' writers), so a storage at a zip's
    64-byte offset put a chunk at each end into the page cache, left for the fsync at the commit
    (about one chunk per storage: 1 s of a 2.5 s save of 512 MB in 64 storages on the development
    VM). Split, only the two partial blocks go through the page cache."""
    n = len(buf) if not isinstance(buf, _torch.Tensor) else buf.numel()
    lo = -(-at // _ALIGN) * _ALIGN
    hi = (at + n) // _ALIGN * _ALIGN
    if hi - lo < _ALIGN or (lo == at and hi == at + n):
        return f.pwrite_from_async(buf, at)
    futs = []
    if lo > at:
        futs.append(f.pwrite_from_async(buf[:lo - at], at))
    futs.append(f.pwrite_from_async(buf[lo - at:hi - at], lo))
    if at + n > hi:
        futs.append(f.pwrite_from_async(buf[hi - at:], hi))
    return _Parts(futs)


def _stage_piece(f, dst, at, ev, crc_on):
    """A pool thread: once the piece is in its pinned buffer, ferry writes it and the crc32 is
    computed from the same buffer meanwhile. Returns (crc32, the write's future)."""
    ev.synchronize()
    w = _pwrite(f, dst, at)
    return (_crc32(dst.numpy()) if crc_on else 0), w


# The device side of staging, apart so that tests/python can stage host tensors through it.
def _staged_device(buf):
    return buf.device.type == "cuda"


def _after_current(stream, device):
    stream.wait_stream(_torch.cuda.current_stream(device))


def _copy_out(stream, dst, src):
    """dst (pinned) <- src (device memory) on stream; returns the event that says it is done."""
    with _torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
        ev = _torch.cuda.Event()
        ev.record(stream)
    return ev


class _Piece:
    """One staged piece: (crc32, write future) by a pool thread; result() is the bytes written."""
    __slots__ = ("fu", "n", "at")

    def __init__(self, fu, n, at):
        self.fu, self.n, self.at = fu, n, at

    def result(self):
        return self.fu.result()[1].result()

    def crc(self):
        return self.fu.result()[0]


class _PiecesCrc:
    """The crc32 of a storage staged in pieces."""

    def __init__(self, pieces):
        self.pieces = pieces

    def result(self):
        crc = 0
        for pc in self.pieces:
            crc = _crc32_combine(crc, pc.crc(), pc.n)
        return crc


class _Writes:
    """Writes _Layouts into one file: each storage's bytes by ferry (host or GPU memory) as soon
    as it is added, its crc32 (when torch.serialization.get_crc32_options()) computed meanwhile
    in pieces on threads, the zip around it once the crc32s are known; at most about `limit`
    storage bytes of host memory in flight. With crc32s on, a GPU storage goes through this
    file's pinned buffers (_stager_take) and is checksummed there, pieces of successive storages
    in flight together. A hole's storage is an UntypedStorage or a 1-D uint8 tensor (a
    contiguous run of bytes inside a larger storage: DCP's device snapshot)."""

    def __init__(self, f, limit=1 << 30):
        self.f, self.limit = f, limit
        self.queue = []
        self.inflight = 0
        self.stager = None  # (device, (buffers, stream))
        self.busy = []  # per buffer: the _Piece last staged through it
        self.turn = 0

    def _stage(self, buf, at, crc_on, wait_current):
        """Copies GPU bytes `buf` out through the pinned buffers, each piece written at `at` +
        its offset; returns the _Pieces."""
        if self.stager is None:
            self.stager = (buf.device, _stager_take(buf.device))
            self.busy = [None] * _STAGE_BUFFERS
        dev, (bufs, stream) = self.stager
        if dev != buf.device:
            raise ValueError("%s: storages on %s and %s in one file" % (self.f.name, dev, buf.device))
        if wait_current:
            _after_current(stream, buf.device)
        pieces = []
        n = buf.numel()
        # pieces end at file offsets that are multiples of _STAGE_PIECE (whole blocks: _pwrite)
        cuts = list(range(_STAGE_PIECE - at % _STAGE_PIECE, n, _STAGE_PIECE))
        for o, e in zip([0] + cuts, cuts + [n]):
            k = self.turn % len(bufs)
            self.turn += 1
            if self.busy[k] is not None:
                self.busy[k].result()  # the buffer's last write and crc32 are done
                self.busy[k] = None
            p = e - o
            # placed in its (page-aligned) buffer at the file offset's place in a block, so that
            # the whole blocks are written with O_DIRECT from where they lie (no bounce copy)
            sh = (at + o) % _ALIGN
            dst = bufs[k][sh:sh + p]
            ev = _copy_out(stream, dst, buf[o:o + p])
            pc = _Piece(_crc_pool().submit(_stage_piece, self.f, dst, at + o, ev, crc_on), p, at + o)
            self.busy[k] = pc
            pieces.append(pc)
        return pieces  # the source outlives its copies: the layout in the queue holds it

    def add(self, base, layout, wait_current=True):
        """wait_current=False: the GPU storages' producers are known done (DCP's snapshot, made
        and synchronised by Writer.stage), so the copies need not wait for the current stream:
        in dcp.async_save's thread that is the training's stream."""
        crc_on = _torch.serialization.get_crc32_options()
        data, crcs = [], []
        try:
            for off, s, rec in layout.holes:
                buf = s if isinstance(s, _torch.Tensor) else _byte_view(s)
                n = buf.numel()
                if not n:
                    if crc_on:
                        layout.set_crc(rec, off, 0)
                    continue
                if _staged_device(buf):
                    if crc_on:
                        pieces = self._stage(buf, base + off, True, wait_current)
                        crcs.append((rec, off, _PiecesCrc(pieces)))
                        data.extend((pc, pc.n, pc.at) for pc in pieces)
                        continue
                    # ferry copies on its own streams: the tensor's producers must be done.
                    if wait_current:
                        _torch.cuda.current_stream(buf.device).synchronize()
                data.append((_pwrite(self.f, buf, base + off), n, base + off))
                if crc_on:
                    crcs.append((rec, off, _crc_async(buf.numpy())))
                self.inflight += n
        finally:
            self.queue.append((base, layout, data, crcs,
                               sum(n for f, n, _a in data if not isinstance(f, _Piece))))
        while self.inflight > self.limit and len(self.queue) > 1:
            self._drain()
        return layout.size

    def _drain(self):
        base, layout, data, crcs, nbytes = self.queue.pop(0)
        err = None
        try:
            for rec, off, fu in crcs:
                layout.set_crc(rec, off, fu.result())
            for off, seg in layout.segments():
                data.append((self.f.pwrite_from_async(seg, base + off), len(seg), base + off))
        except BaseException as e:  # the writes in flight are still waited for
            err = e
        for fut, n, at in data:
            try:
                got = fut.result()
            except BaseException as e:
                err = err or e
                continue
            if got != n and err is None:
                err = OSError("%s: short write at offset %d: %d of %d bytes"
                              % (self.f.name, at, got, n))
        self.inflight -= nbytes
        if err is not None:
            raise err

    def finish(self):
        err = None
        while self.queue:
            try:
                self._drain()
            except BaseException as e:
                err = err or e
        if self.stager is not None:
            for pc in self.busy:  # every staged piece has ended before the buffers go back
                if pc is not None:
                    try:
                        pc.result()
                    except BaseException as e:
                        err = err or e
            dev, got = self.stager
            self.stager, self.busy = None, []
            _stager_give(dev, got)
        if err is not None:
            raise err


def _fsync_dir(d):
    fd = _os.open(d or ".", _os.O_RDONLY | getattr(_os, "O_DIRECTORY", 0))
    try:
        _os.fsync(fd)
    finally:
        _os.close(fd)


# A new file at a random temporary name beside path (exclusive create), flocked while written,
# renamed over path on commit(durable) with the fsyncs, removed by abort(): the durable-file module
# of the C library (ferry_durable_*), which also removes the temporaries of path's name that a
# killed writer left (their flock died with it). Attributes file (a ferry.File), tmp, path.
_Durable = _ferry._ferry.DurableFile


def save(obj, path, *, pickle_module=_pickle, pickle_protocol=2, durable=True, context=None):
    """``torch.save(obj, path)``, with the storages written by ferry and the file durable.

    The zip is laid out by torch's own writer (records, order, 64-byte storage alignment, the
    crc32s when ``torch.serialization.get_crc32_options()``): ``torch.load`` and
    ``ferry.torch.load`` read it. GPU storages are written from GPU memory through ferry's pinned
    path (with crc32s on, they pass through pinned buffers and are checksummed there). The file appears
    at ``path`` only complete: temporary name (exclusive create), fsync, rename, directory fsync;
    ``durable=False`` skips the fsyncs. On error ``path`` is untouched.
    """
    p = _os.fspath(path)
    layout = _Layout(obj, p, pickle_module, pickle_protocol)
    ctx = context if context is not None else _ferry.default_context()
    out = _Durable(p, ctx)
    try:
        w = _Writes(out.file)
        try:
            w.add(0, layout)
        finally:
            w.finish()
    except BaseException:
        out.abort()
        raise
    out.commit(durable)


