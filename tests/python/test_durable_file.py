"""ferry._ferry.DurableFile (the C library's ferry_durable_*), which ferry.torch.save and ferry.dcp
write through: a file appears at its path only committed; an aborted or killed writer leaves
nothing once the next writer of the name has run; a file is never replaced where replace=False."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ferry
from ferry import _ferry


def _tmps(d, name):
    return sorted(n for n in os.listdir(d) if n.startswith(".%s.ferry-tmp-" % name))


def test_commit_write_and_file(tmp_path):
    p = tmp_path / "out.bin"
    with _ferry.DurableFile(str(p), ferry.default_context()) as f:
        assert os.path.basename(f.tmp).startswith(".out.bin.ferry-tmp-")
        assert _tmps(tmp_path, "out.bin") == [os.path.basename(f.tmp)]
        assert f.write(b"abc") == 3 and f.write(b"def") == 3
        assert f.file.pwrite_from(np.frombuffer(b"0123", np.uint8), 6) == 4
        assert not p.exists()
        f.commit()
        assert f.committed and f.closed and f.file.closed
    assert p.read_bytes() == b"abcdef0123"
    assert _tmps(tmp_path, "out.bin") == []
    with pytest.raises(ValueError, match="already committed"):
        f.write(b"x")


def test_abort_leaves_nothing(tmp_path):
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")
    f = _ferry.DurableFile(str(p), ferry.default_context())
    f.write(b"new bytes")
    f.file  # the engine's file open on the temporary too
    f.abort()
    assert p.read_bytes() == b"old" and _tmps(tmp_path, "out.bin") == []
    with _ferry.DurableFile(str(p), ferry.default_context()) as g:
        g.write(b"left by an exception")
    assert p.read_bytes() == b"old" and _tmps(tmp_path, "out.bin") == []
    _ferry.DurableFile(str(p), ferry.default_context()).write(b"dropped")  # garbage collected
    assert _tmps(tmp_path, "out.bin") == []


def test_replace_false_never_replaces(tmp_path):
    p = tmp_path / "keep.bin"
    p.write_bytes(b"precious")
    f = _ferry.DurableFile(str(p), ferry.default_context())
    f.write(b"intruder")
    with pytest.raises(FileExistsError, match="keep.bin"):
        f.commit(replace=False)
    assert p.read_bytes() == b"precious" and _tmps(tmp_path, "keep.bin") == []
    q = tmp_path / "fresh.bin"
    g = _ferry.DurableFile(str(q), ferry.default_context())
    g.write(b"first")
    g.commit(durable=False, replace=False)
    assert q.read_bytes() == b"first"


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nodir"):
        _ferry.DurableFile(str(tmp_path / "nodir" / "x"), ferry.default_context())


KILLED = textwrap.dedent('''
    import os, sys, time
    import ferry
    from ferry import _ferry
    f = _ferry.DurableFile(sys.argv[1], ferry.default_context())
    f.write(b"x" * 4096)
    print(f.tmp, flush=True)
    time.sleep(60)
''')


def test_killed_writer_is_swept_live_one_is_not(tmp_path):
    p = tmp_path / "model.pt"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        live_tmp = proc.stdout.readline().strip()
        assert os.path.exists(live_tmp), live_tmp
        # the other writer is alive: its temporary stays
        f = _ferry.DurableFile(str(p), ferry.default_context())
        assert os.path.basename(live_tmp) in _tmps(tmp_path, "model.pt")
        f.abort()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert _tmps(tmp_path, "model.pt") == [os.path.basename(live_tmp)]
    (tmp_path / ".other.pt.ferry-tmp-0123").write_bytes(b"another name's")
    with _ferry.DurableFile(str(p), ferry.default_context()) as f:
        assert _tmps(tmp_path, "model.pt") == [os.path.basename(f.tmp)]  # the dead one is gone
        f.commit()
    assert _tmps(tmp_path, "model.pt") == [] and _tmps(tmp_path, "other.pt") != []


def test_torch_save_failing_mid_write_leaves_the_old_file(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import ferry.torch as ftorch

    p = tmp_path / "m.pt"
    ftorch.save({"w": torch.arange(10)}, p)
    before = p.read_bytes()
    finish = ftorch._Writes.finish

    def fail_after_writing(self):
        finish(self)
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(ftorch._Writes, "finish", fail_after_writing)
    with pytest.raises(OSError, match="injected"):
        ftorch.save({"w": torch.arange(1 << 16)}, p)
    assert p.read_bytes() == before and _tmps(tmp_path, "m.pt") == []
    monkeypatch.setattr(ftorch._Writes, "finish", finish)
    ftorch.save({"w": torch.arange(1 << 16)}, p)
    assert torch.equal(ftorch.load(p)["w"], torch.arange(1 << 16))
