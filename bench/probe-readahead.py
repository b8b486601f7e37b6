#!/usr/bin/env python3
"""Buffered random reads of fio and ferry bench, and what the kernel's read-ahead did for each.

Each variant runs after `sync; echo 3 > /proc/sys/vm/drop_caches`, alternating order between
rounds, under `perf stat -a` counting tracepoints: page_cache_sync_ra (a read that missed the page
cache: miss/io), page_cache_async_ra (a read that hit a read-ahead marker), and
mm_filemap_add_to_page_cache (folios added: folios/io). Needs root and perf. On a shared machine it
waits for the disk to be free of others' writes and redoes a run that saw them (DEV's write sectors).

  bench/probe-readahead.py ROUNDS VARIANT...      a variant: "fio" or "ferry", then extra options;
                                                  a leading VAR=value word goes to the environment
  F=/var/tmp/x/rand.dat SIZE=1g RT=2 QD=64 RW=randread BS=4k DIRECT=0 IOSIZE= DEV=vda
  FIO=/work/main/.deb/fio FERRY=build/ferry
IOSIZE set: a fixed number of bytes per run instead of RT seconds. The file must exist (1 GiB, e.g.
`ferry bench --filename F --size 1g --bs 4m --rw write --direct 1`).
"""
import json, os, statistics, subprocess, sys, tempfile, time

E = os.environ
F = E.get("F", "/var/tmp/ferry-probe/rand.dat")
RT, SIZE, QD = E.get("RT", "2"), E.get("SIZE", "1g"), E.get("QD", "64")
RW, BS, DIRECT, IOSIZE = E.get("RW", "randread"), E.get("BS", "4k"), E.get("DIRECT", "0"), E.get("IOSIZE")
FIO, FERRY, DEV = E.get("FIO", "fio"), E.get("FERRY", "build/ferry"), E.get("DEV", "vda")
EV = ["readahead:page_cache_sync_ra", "readahead:page_cache_async_ra", "filemap:mm_filemap_add_to_page_cache",
      "io_uring:io_uring_queue_async_work", "syscalls:sys_enter_io_uring_enter"]


def vm(key):
    for line in open("/proc/vmstat"):
        k, v = line.split()
        if k == key:
            return int(v)
    return 0


def written():
    return int(open(f"/sys/block/{DEV}/stat").read().split()[6]) * 512


def wait_quiet(limit=90):
    t0 = time.time()
    while time.time() - t0 < limit:
        a = written()
        time.sleep(3)
        if written() - a < 12e6:
            return


def run1(v):
    tool, *args = v.split()
    env = dict(E)
    while args and "=" in args[0] and not args[0].startswith("--"):
        k, val = args.pop(0).split("=", 1)
        env[k] = val
    c = ["--name=p", f"--filename={F}", f"--size={SIZE}", f"--rw={RW}", f"--bs={BS}", f"--iodepth={QD}",
         f"--direct={DIRECT}", "--ioengine=io_uring", "--output-format=json"]
    c += [f"--io_size={IOSIZE}"] if IOSIZE else [f"--runtime={RT}", "--time_based"]
    if tool == "fio":
        cmd = [FIO, "--fadvise_hint=0"] + c + args
    else:
        cmd = [FERRY, "bench"] + ([] if DIRECT == "1" else ["--cold"]) + c + args
    subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True)
    d0 = vm("drop_pagecache")
    with tempfile.NamedTemporaryFile("r") as st:
        p = subprocess.run(["perf", "stat", "-a", "-x,", "-e", ",".join(EV), "-o", st.name, "--"] + cmd,
                           capture_output=True, text=True, env=env)
        ev = {}
        for line in open(st.name):
            q = line.strip().split(",")
            if len(q) > 3 and q[0].replace(".", "").isdigit():
                ev[q[2].split(":")[1]] = int(float(q[0]))
    t = p.stdout
    j = json.loads(t[t.index("{"):])["jobs"][0]
    ios = max(j["read"]["total_ios"] + j["write"]["total_ios"], 1)
    return {"gbps": (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e9, "ios": ios,
            "wbytes": j["write"]["io_bytes"], "ext_drop": vm("drop_pagecache") - d0,
            "miss": ev.get("page_cache_sync_ra", 0) / ios, "async": ev.get("page_cache_async_ra", 0),
            "folios": ev.get("mm_filemap_add_to_page_cache", 0) / ios, "punts": ev.get("io_uring_queue_async_work", 0),
            "enters": ev.get("sys_enter_io_uring_enter", 0) / ios}


def run(v):
    for _ in range(4):
        wait_quiet()
        w0 = written()
        x = run1(v)
        foreign = (written() - w0 - x["wbytes"]) / 1e6
        if foreign < 16 and not x["ext_drop"]:
            return x
        print(f"   (redo {v}: {foreign:.0f} MB written by others, or a foreign cache drop)", flush=True)
    return x


def main():
    rounds, vs = int(sys.argv[1]), sys.argv[2:]
    res = {v: [] for v in vs}
    for r in range(rounds):
        for v in (vs if r % 2 == 0 else vs[::-1]):
            x = run(v)
            res[v].append(x)
            print(f"r{r + 1} {v:40} {x['gbps']:.3f} GB/s ios {x['ios']:7d} miss/io {x['miss']:.2f} async_ra "
                  f"{x['async']:6d} folios/io {x['folios']:.2f} punts {x['punts']:5d} enters/io {x['enters']:.2f}",
                  flush=True)
    print()
    for v in vs:
        m = lambda k: statistics.median(x[k] for x in res[v])
        print(f"median {v:40} {m('gbps'):.3f} GB/s  miss/io {m('miss'):.2f}  folios/io {m('folios'):.2f}  "
              f"async_ra {m('async'):.0f}  (n={len(res[v])})")


main()
