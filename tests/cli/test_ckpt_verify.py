#!/usr/bin/env python3
"""ferry ckpt verify / inspect on checkpoint steps (issue 20 finding 7, issue 21 item 4): valid
1- and 2-rank steps pass (inspect lists every shard of a multi-rank step), and every damage of the
table fails with exit 1 and a problem naming the file and what is wrong; --json, --step,
--require-checksums; plain files keep their per-file checks; inspect cuts long metadata in text.

The steps are laid out here as ferry's saves lay them out (include/ferry/ckpt.h): shards with the
ferry.step/run/rank/world metadata and xxh3 checksums of fixed tensor data (the digests below were
computed by ferry's writer for exactly these bytes), manifest.json, `latest`. The same cases on
steps that ferry.checkpoint.save wrote, checked by the CLI and by Python alike:
tests/python/test_ckpt_verify_agree.py."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ferry = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="cli-ckpt-verify.", dir=os.environ.get("FERRY_TEST_TMPDIR", "/tmp"))
failures = 0

A = bytes((i * 7 + 3) % 256 for i in range(1024))  # "a", U8 [1024]
B = struct.pack("<64f", *range(64))  # "b", F32 [64]
SUMS = {"a": "9b81661c641c72b1", "b": "7aa04f063757b005"}


def check(what, cond, detail=""):
    global failures
    if cond:
        print("ok: %s" % what)
    else:
        failures += 1
        print("FAILED: %s\n  %s" % (what, detail))


def write_shard(path, step, run, rank, world, tie=True, sums=True, extra=None):
    meta = {}
    if tie:
        meta.update({"ferry.step": str(step), "ferry.run": run, "ferry.rank": str(rank), "ferry.world": str(world)})
    if sums:
        meta.update({"ferry.xxh3:" + k: v for k, v in SUMS.items()})
    meta.update(extra or {})
    head = {"__metadata__": meta,
            "b": {"dtype": "F32", "shape": [64], "data_offsets": [0, len(B)]},
            "a": {"dtype": "U8", "shape": [1024], "data_offsets": [len(B), len(B) + len(A)]}}
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + B + A)


def shard_name(rank, world):
    return "rank-%05d-of-%05d.safetensors" % (rank, world)


def make(name, world=1, step=1, run="runA", **kw):
    """A checkpoint directory with one committed step: its path."""
    d = os.path.join(tmp, name)
    sd = os.path.join(d, "step-%012d" % step)
    os.makedirs(sd)
    shards = []
    for r in range(world):
        p = os.path.join(sd, shard_name(r, world))
        write_shard(p, step, run, r, world, **kw)
        shards.append({"file": shard_name(r, world), "bytes": os.path.getsize(p)})
    with open(os.path.join(sd, "manifest.json"), "w") as f:
        json.dump({"format": "ferry-checkpoint-1", "step": step, "world": world, "run": run, "shards": shards}, f)
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("step-%012d\n" % step)
    return d


def step_dir(d, step=1):
    return os.path.join(d, "step-%012d" % step)


def edit_manifest(d, fn, step=1):
    p = os.path.join(step_dir(d, step), "manifest.json")
    with open(p) as f:
        m = json.load(f)
    fn(m)
    with open(p, "w") as f:
        json.dump(m, f)


def run(*args):
    p = subprocess.run([ferry, "ckpt"] + list(args), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def verify_json(*args):
    rc, out, err = run("verify", "--json", *args)
    try:
        return rc, json.loads(out), err
    except ValueError:
        return rc, {"unparsable": out}, err


try:
    # --- valid steps
    one = make("one")
    rc, out, err = run("verify", one)
    check("valid 1-rank step: exit 0", rc == 0, (rc, out, err))
    check("valid 1-rank step: summary", "1 files, " in out and "2 tensors verified, 0 without checksum, 0 failed" in out
          and out.rstrip().endswith("OK"), out)
    two = make("two", world=2)
    rc, out, err = run("verify", two)
    check("valid 2-rank step: exit 0", rc == 0, (rc, out, err))
    check("valid 2-rank step: a line per shard", shard_name(0, 2) in out and shard_name(1, 2) in out
          and "4 tensors verified" in out, out)
    rc, j, err = verify_json(two)
    check("--json: one object with the counts and every shard",
          rc == 0 and j.get("ok") is True and j.get("world") == 2 and j.get("files") == 2 and j.get("tensors") == 4
          and j.get("verified") == 4 and j.get("failed") == 0 and j.get("untied") == 0 and j.get("problems") == []
          and [s["file"] for s in j.get("shards", [])] == [shard_name(0, 2), shard_name(1, 2)], (rc, j, err))
    rc, j, err = verify_json(step_dir(two) + "/")
    check("a step directory (trailing /) is verified as a step", rc == 0 and j.get("step") == 1 and j.get("world") == 2,
          (rc, j, err))
    rc, out, err = run("inspect", two)
    check("inspect of a 2-rank step lists both shards", rc == 0 and out.count("2 tensors, data at byte") == 2
          and "metadata ferry.rank = 1" in out, (rc, out, err))
    rc, out, err = run("inspect", "--json", step_dir(two))
    try:
        j = json.loads(out)
    except ValueError:
        j = {}
    check("inspect --json of a 2-rank step: world and a rank per file",
          rc == 0 and j.get("world") == 2 and [f.get("rank") for f in j.get("files", [])] == [0, 1], (rc, out, err))

    # --- untied shards (saved before ferry wrote ferry.step/run/rank/world): pass, with a note
    old = make("old", tie=False)
    rc, out, err = run("verify", old)
    check("untied shard: passes with a note", rc == 0 and "not tied" in out and ", untied" in out, (rc, out, err))

    # --- damage: exit 1 and the problem named
    def damaged(what, d, says, *args, code="data is corrupt or malformed"):
        rc, out, err = run("verify", *args, d)
        check("%s: exit 1, says %r" % (what, says), rc == 1 and says in err and "FAILED" in out, (rc, out, err))
        rc, j, err = verify_json(*args, d)
        probs = j.get("problems") or [{}]
        check("%s: --json ok false, first problem %r" % (what, says),
              rc == 1 and j.get("ok") is False and says in probs[0].get("message", "") and probs[0].get("error", "").startswith(code),
              (rc, j, err))

    d = make("nomanifest")
    os.remove(os.path.join(step_dir(d), "manifest.json"))
    damaged("manifest deleted", d, "no manifest.json: step 1 is not committed")

    d = make("world2")
    edit_manifest(d, lambda m: m.update(world=2))
    damaged("world=2 beside one shard", d, "manifest.json: 1 shards listed for a world of 2")

    d = make("bytes", world=2)
    edit_manifest(d, lambda m: m["shards"][1].update(bytes=m["shards"][1]["bytes"] + 8))
    damaged("wrong bytes in the manifest", d, shard_name(1, 2) + ": %d bytes, manifest.json says %d"
            % (os.path.getsize(os.path.join(step_dir(d), shard_name(1, 2))),
               os.path.getsize(os.path.join(step_dir(d), shard_name(1, 2))) + 8))

    d = make("missing", world=2)
    os.remove(os.path.join(step_dir(d), shard_name(1, 2)))
    damaged("a listed shard missing", d, shard_name(1, 2) + ": listed in manifest.json but missing")

    d = make("extra")
    write_shard(os.path.join(step_dir(d), shard_name(0, 2)), 1, "runA", 0, 2)
    damaged("a shard not in the manifest", d, shard_name(0, 2) + ": in the step directory but not in manifest.json")

    d = make("otherstep", step=2)
    write_shard(os.path.join(step_dir(d, 2), shard_name(0, 1)), 1, "runA", 0, 1)
    damaged("a shard from another step", d, shard_name(0, 1) + ': metadata ferry.step is "1", expected "2"')

    d = make("otherrun")
    write_shard(os.path.join(step_dir(d), shard_name(0, 1)), 1, "runB", 0, 1)
    damaged("a shard from another run", d, shard_name(0, 1) + ': metadata ferry.run is "runB", expected "runA"')

    d = make("otherrank", world=2)
    shutil.copyfile(os.path.join(step_dir(d), shard_name(0, 2)), os.path.join(step_dir(d), shard_name(1, 2)))
    damaged("rank 0's shard in rank 1's place", d, shard_name(1, 2) + ': metadata ferry.rank is "0", expected "1"')

    d = make("flip", world=2)
    with open(os.path.join(step_dir(d), shard_name(1, 2)), "r+b") as f:
        f.seek(-1, 2)
        c = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([c[0] ^ 1]))
    damaged("a flipped data bit", d, 'tensor "a"', code="verification failed")

    d = make("notjson")
    with open(os.path.join(step_dir(d), "manifest.json"), "w") as f:
        f.write('{"world": 1, "shards": [}')
    damaged("a manifest that is not JSON", d, "manifest.json: byte 24")

    d = make("trunc")
    p = os.path.join(step_dir(d), shard_name(0, 1))
    os.truncate(p, os.path.getsize(p) - 10)
    damaged("a truncated shard", d, shard_name(0, 1) + ": %d bytes, manifest.json says %d"
            % (os.path.getsize(p), os.path.getsize(p) + 10))

    # every problem reported, not only the first
    d = make("many", world=2)
    edit_manifest(d, lambda m: m["shards"][0].update(bytes=1))
    write_shard(os.path.join(step_dir(d), shard_name(1, 2)), 1, "runB", 1, 2)
    rc, j, err = verify_json(d)
    msgs = [p.get("message", "") for p in j.get("problems", [])]
    check("two problems in one step: both reported, in order", rc == 1 and len(msgs) == 2 and j.get("problem_count") == 2
          and "manifest.json says 1" in msgs[0] and "ferry.run" in msgs[1], (rc, j, err))

    # --step
    d = make("steps", step=3)
    rc, out, err = run("verify", "--step", "2", d)
    check("--step of a step that is not there: exit 1, not committed", rc == 1 and "step 2 is not committed" in err,
          (rc, out, err))
    rc, out, err = run("verify", "--step", "3", d)
    check("--step 3: exit 0", rc == 0 and "step 3" in out, (rc, out, err))
    rc, out, err = run("verify", "--step", "2", step_dir(d, 3))
    check("--step against a step directory of another step: usage error", rc == 2, (rc, out, err))

    os.remove(os.path.join(d, "latest"))
    rc, out, err = run("verify", d)
    check("a checkpoint directory without latest: exit 1, says so", rc == 1 and "without `latest`" in err,
          (rc, out, err))

    # --require-checksums
    d = make("nosum", sums=False)
    rc, out, err = run("verify", d)
    check("no checksums: passes, counted", rc == 0 and "0 tensors verified, 2 without checksum, 0 failed" in out,
          (rc, out, err))
    damaged("no checksums with --require-checksums", d, 'tensor "b" has no checksum', "--require-checksums",
            code="verification failed")

    # plain files: the per-file checks, as before
    f = os.path.join(step_dir(one), shard_name(0, 1))
    rc, out, err = run("verify", f)
    check("a plain .safetensors: exit 0", rc == 0 and "1 files: 2 tensors verified, 0 without checksum, 0 failed" in out,
          (rc, out, err))
    rc, j, err = verify_json(f)
    check("a plain .safetensors --json", rc == 0 and j.get("ok") is True and j.get("verified") == 2, (rc, j, err))

    # inspect: long metadata cut in text, whole in --json
    d = make("longmeta", extra={"ferry.tree": "x" * 5000})
    rc, out, err = run("inspect", d)
    line = [l for l in out.splitlines() if "ferry.tree" in l]
    check("inspect cuts a 5000-byte metadata value and says so", rc == 0 and len(line) == 1 and len(line[0]) < 300
          and "4880 of 5000 bytes cut" in line[0], (rc, out[:2000], err))
    rc, out, err = run("inspect", "--json", d)
    try:
        meta = json.loads(out)["files"][0]["metadata"]
    except (ValueError, KeyError, IndexError):
        meta = {}
    check("inspect --json prints it whole", rc == 0 and meta.get("ferry.tree") == "x" * 5000, (rc, out[:300], err))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

sys.exit(1 if failures else 0)
