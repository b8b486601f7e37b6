"""ferry ckpt verify draws a progress line (bar, bytes, rate) when stderr is a terminal, and nothing
extra when it is not or with --quiet."""
import json
import os
import pty
import re
import select
import struct
import subprocess

from _bench import FERRY, check, finish, scratch


def run_on_pty(args):
    """Runs args with stderr on a pseudo-terminal; returns (rc, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    got = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        got += chunk
    out, _ = p.communicate(timeout=60)
    os.close(master)
    return p.returncode, out, got.decode(errors="replace")


# The fixture of test_ckpt_verify.py: two tensors with the xxh3 digests ferry's writer stores.
A = bytes((i * 7 + 3) % 256 for i in range(1024))
B = struct.pack("<64f", *range(64))
SUMS = {"a": "9b81661c641c72b1", "b": "7aa04f063757b005"}


def write_shard(path, step, rank, world):
    meta = {"ferry.step": str(step), "ferry.run": "runA", "ferry.rank": str(rank), "ferry.world": str(world)}
    meta.update({"ferry.xxh3:" + k: v for k, v in SUMS.items()})
    head = {"__metadata__": meta,
            "b": {"dtype": "F32", "shape": [64], "data_offsets": [0, len(B)]},
            "a": {"dtype": "U8", "shape": [1024], "data_offsets": [len(B), len(B) + len(A)]}}
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + B + A)


def make_step(d, world=2, step=1):
    sd = os.path.join(d, "step-%012d" % step)
    os.makedirs(sd)
    shards = []
    for r in range(world):
        name = "rank-%05d-of-%05d.safetensors" % (r, world)
        write_shard(os.path.join(sd, name), step, r, world)
        shards.append({"file": name, "bytes": os.path.getsize(os.path.join(sd, name))})
    with open(os.path.join(sd, "manifest.json"), "w") as f:
        json.dump({"format": "ferry-checkpoint-1", "step": step, "world": world, "run": "runA", "shards": shards}, f)
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("step-%012d\n" % step)
    return sd


def main():
    d = scratch()
    sd = make_step(d)
    path = os.path.join(sd, "rank-00000-of-00002.safetensors")

    for what, target in (("a checkpoint step", d), ("a plain file", path)):
        rc, out, term = run_on_pty([FERRY, "ckpt", "verify", target])
        check(rc == 0 and "verified" in out, f"{what}: verify passes on a terminal", (rc, out))
        check("ferry ckpt verify: [" in term and "100%" in term, f"{what}: a progress bar on the terminal", term)
        # bytes done of total; the rate and time left need 0.1 s of work, more than these files take
        m = re.search(r"100% ([0-9.]+ KiB)/([0-9.]+ KiB)", term)
        check(m and m.group(1) == m.group(2), f"{what}: the progress line gives bytes of total", term)
        check(term.endswith("\n"), f"{what}: the last progress line ends with a newline", term[-80:])

    rc, out, term = run_on_pty([FERRY, "ckpt", "verify", "--quiet", d])
    check(rc == 0 and term == "", "--quiet draws nothing on the terminal", (rc, term))

    p = subprocess.run([FERRY, "ckpt", "verify", d], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and p.stderr == "", "nothing on stderr when it is not a terminal", (p.returncode, p.stderr))
    finish()


main()
