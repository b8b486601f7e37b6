"""progress= for ferry's long Python calls (issue 25): a callback or a tqdm bar.

``progress=None`` (the default) costs nothing: the call runs as before. Otherwise the call runs on
a worker thread (the C call inside releases the GIL for its I/O) while the calling thread polls a
byte counter (the context's ``bytes_read``/``bytes_written``, or the bytes on disk) every
``INTERVAL`` seconds and reports ``progress(done_bytes, total_bytes)``: ``done`` never decreases,
stays below ``total`` while the work runs, and the last call, once the work is done, has
``done == total``. Calls
come at most every ``INTERVAL`` seconds, plus that last one. ``progress=True`` draws a tqdm bar
(bytes, rate, time left) on standard error; ImportError when tqdm is not installed.
"""
import os as _os
import sys as _sys
import threading as _threading
import time as _time

INTERVAL = 0.1  # seconds between calls: often enough for a bar, rare enough to cost nothing


def _tqdm_callback(total, desc):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress=True draws a tqdm bar, and tqdm is not installed (pip install tqdm); "
                          "or pass a callable progress(done_bytes, total_bytes)") from None
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=_sys.stderr)
    state = {"n": 0}

    def cb(done, total_):
        bar.update(done - state["n"])
        state["n"] = done
        if done >= total_:
            bar.close()
    cb.close = bar.close
    return cb


def callback(progress, total, desc):
    """The callable for ``progress`` (None: no reporting); raises before any work starts."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return _tqdm_callback(total, desc)
    if not callable(progress):
        raise TypeError("progress= takes None, True (a tqdm bar) or a callable progress(done_bytes, "
                        "total_bytes); got %r" % (progress,))
    return progress


def ctx_counter(ctx, key):
    """A poll function: bytes of ``ctx.stats()[key]`` since now."""
    base = ctx.stats().get(key, 0)
    return lambda: ctx.stats().get(key, 0) - base


def disk_counter(paths):
    """A poll function: bytes of the regular files under each of ``paths()`` (files or directories)."""
    def poll():
        n = 0
        for p in paths():
            try:
                if _os.path.isdir(p):
                    for root, _dirs, files in _os.walk(p):
                        for f in files:
                            try:
                                n += _os.stat(_os.path.join(root, f), follow_symlinks=False).st_size
                            except OSError:
                                pass
                else:
                    n += _os.stat(p, follow_symlinks=False).st_size
            except OSError:
                pass
        return n
    return poll


def load_total(path):
    """Bytes a load of ``path`` reads at most: the file, an index's or manifest's files, or a
    directory's ``*.safetensors`` files."""
    import json
    p = _os.fspath(path)
    if _os.path.isdir(p):
        names = [_os.path.join(p, f) for f in _os.listdir(p) if f.endswith(".safetensors")]
        return sum(_os.path.getsize(f) for f in names)
    if p.endswith(".json"):
        try:
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
            files = set((doc.get("weight_map") or {}).values()) or set(doc.get("files") or ())
            d = _os.path.dirname(p)
            return sum(_os.path.getsize(_os.path.join(d, f)) for f in files if isinstance(f, str)
                       and _os.path.exists(_os.path.join(d, f)))
        except (OSError, ValueError, AttributeError):
            return 0
    try:
        return _os.path.getsize(p)
    except OSError:
        return 0


def tensor_bytes(obj):
    """Bytes of the tensors and arrays in a nested dict/list/tuple (what a save writes)."""
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    n = getattr(obj, "nbytes", None)
    return n if isinstance(n, int) else 0


def _cuda_device():
    """The caller's current CUDA device when torch has CUDA initialised, so that the worker thread
    uses the same one (the current device is per thread)."""
    torch = _sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
    except Exception:
        pass
    return None


class Reporter:
    """Reports ``poll()`` to ``cb`` at most every INTERVAL seconds (``tick``), monotonic and
    clamped to ``total``; ``finish()`` makes the last call, done == total, once."""

    def __init__(self, cb, total, poll):
        self.cb, self.total, self.poll = cb, max(int(total), 0), poll
        self.done, self.last, self.ended = 0, _time.monotonic(), False

    def due(self):
        """Seconds until the next tick may report."""
        return max(0.0, self.last + INTERVAL - _time.monotonic())

    def tick(self):
        now = _time.monotonic()
        if self.ended or now - self.last < INTERVAL:
            return
        self.last = now
        try:
            # total only once the work has ended: a counter that runs ahead (other I/O on the
            # context) stops one byte short
            d = min(max(int(self.poll()), self.done), max(self.total - 1, 0))
        except Exception:
            d = self.done
        if d != self.done:
            self.done = d
            self.cb(d, self.total)

    def finish(self):
        if not self.ended:
            self.ended = True
            self.done = self.total
            self.cb(self.total, self.total)

    def close(self):
        """Ends a bar without the last call (the work failed)."""
        if not self.ended:
            self.ended = True
            if hasattr(self.cb, "close"):
                self.cb.close()


def run(fn, progress, total, poll, desc=None, finish=True):
    """``fn()``, reporting to ``progress`` (see the module): poll() gives the bytes done so far
    (clamped to [previous, total]). Returns fn's result or raises its exception. With
    ``finish=False`` the last call is left to the caller: returns (result, Reporter)."""
    cb = callback(progress, total, desc)
    if cb is None:
        return fn() if finish else (fn(), None)
    rep = Reporter(cb, total, poll)
    out = {}
    dev = _cuda_device()

    def work():
        try:
            if dev is not None:
                _sys.modules["torch"].cuda.set_device(dev)
            out["r"] = fn()
        except BaseException as e:  # handed to the caller's thread
            out["e"] = e

    t = _threading.Thread(target=work, name="ferry-progress", daemon=True)
    try:
        t.start()
        while True:
            t.join(rep.due())
            if not t.is_alive():
                break
            rep.tick()
    except BaseException:
        rep.close()
        raise
    if "e" in out:
        rep.close()
        raise out["e"]
    if not finish:
        return out.get("r"), rep
    rep.finish()
    return out.get("r")
