"""Datasets over s3:// and their local cache (issue 23, docs/REMOTE.md "Datasets and the cache"):
ferry.IndexedDataset and ferry.Loader over an s3:// prefix (the same samples, and each rank the same
indices, as over the local directory); with cache_dir, whole shards staged once and the second
epoch served from the cache with no GET of shard data (counted at a proxy of the test's own in
front of moto), a reopened dataset reusing the staged shards, a changed object fetched again
(never mixed), a byte budget kept by evicting the least recently used shards (plain reads) or
the shard used farthest ahead (a loader's order), and two processes sharing one cache_dir.
moto's S3 server on 127.0.0.1, started and stopped here."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("moto", reason="moto is not installed (pip install 'moto[server]')")
pytest.importorskip("boto3", reason="boto3 is not installed (moto[server] brings it)")
torch = pytest.importorskip("torch", reason="torch is not installed (ferry.Loader returns torch tensors)")
import ferry  # noqa: E402
import _moto  # noqa: E402

N = 64
SHARD = 4096  # bytes per shard: 64 samples of 16-200 uint16 -> several shards


class CountingProxy(_moto.Proxy):
    """Passes every request to moto and records (method, path, Range) of each."""

    def __init__(self, upstream_port):
        self.requests = []
        self.lock = threading.Lock()
        self.delay = 0.0  # seconds each ranged GET of a shard waits (a slow store)
        super().__init__(upstream_port)

    def handle(self, h, method, payload):
        with self.lock:
            self.requests.append((method, h.path.split("?")[0], h.headers.get("Range")))
        if self.delay and method == "GET" and "/shard-" in h.path:
            time.sleep(self.delay)
        status, hdrs, body = self.forward(h, method, payload)
        h.send_response(status)
        for k, v in hdrs:
            if k.lower() not in _moto.HOP_HEADERS:
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if method != "HEAD" else
                                           dict((k.lower(), v) for k, v in hdrs).get("content-length", "0")))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)

    def gets(self, part):
        """GETs of objects whose path contains part."""
        with self.lock:
            return [r for r in self.requests if r[0] == "GET" and part in r[1]]

    def clear(self):
        with self.lock:
            self.requests.clear()


@pytest.fixture
def proxy(s3_server):
    p = CountingProxy(s3_server.port)
    yield p
    p.stop()


@pytest.fixture
def env(monkeypatch, s3_env, proxy):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    monkeypatch.delenv("FERRY_CACHE_DIR", raising=False)
    monkeypatch.delenv("FERRY_CACHE_BYTES", raising=False)


def _samples(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 65535, size=int(rng.integers(16, 200)), dtype=np.uint16) for _ in range(N)]


def _upload(s3_server, tmp_path, prefix, seed=1, shard=SHARD):
    """write_dataset into a local directory, its files put under prefix. (local dir, samples, url)."""
    samples = _samples(seed)
    d = tmp_path / ("local-%s-%d" % (prefix.strip("/").replace("/", "-"), seed))
    ferry.write_dataset(d, samples, shard_size=shard)
    names = sorted(os.listdir(d))
    assert sum(n.endswith(".fsh") for n in names) >= 4, names
    for n in names:
        s3_server.put("%s/%s" % (prefix, n), (d / n).read_bytes())
    return d, samples, s3_server.url(prefix)


def _ctx(cache=None, budget=None, **kw):
    args = dict(threads=2, remote_retries=1)
    if cache is not None:
        args["cache_dir"] = str(cache)
    if budget is not None:
        args["cache_bytes"] = budget
    args.update(kw)
    return ferry.Context(**args)


def _epoch(loader):
    out = []
    for flat, offs in loader:
        out.append((loader.last_indices.copy(), flat.numpy().copy(), offs.numpy().copy()))
    return out


def _check(batches, samples):
    for idx, flat, offs in batches:
        for k, i in enumerate(idx):
            assert np.array_equal(flat[offs[k]:offs[k + 1]], samples[i]), (i, k)


def _entries(cache):
    return sorted(n for n in os.listdir(cache) if n.endswith(".fcache"))


def _used(cache):
    """Bytes of the cache's entries; one evicted by a stager between the listing and its stat
    counts 0 (it is gone)."""
    used = 0
    for n in _entries(cache):
        try:
            used += os.path.getsize(cache / n)
        except FileNotFoundError:
            pass
    return used


def test_dataset_and_loader_over_s3(s3_server, env, proxy, tmp_path):
    d, samples, url = _upload(s3_server, tmp_path, "plain")
    ds = ferry.IndexedDataset(url, context=_ctx())
    assert len(ds) == N and ds.shards >= 4 and ds.cache_stats() == {}
    for i in (0, 1, N // 2, N - 1):
        assert np.array_equal(ds[i], samples[i]), i
    ds.close()
    # each rank's indices and bytes as over the local directory (the loader's exact accounting)
    for world, rank in ((1, 0), (3, 2)):
        got = _epoch(ferry.Loader(url, batch_size=5, rank=rank, world_size=world, seed=7, device="cpu",
                                  context=_ctx()))
        want = _epoch(ferry.Loader(d, batch_size=5, rank=rank, world_size=world, seed=7, device="cpu"))
        assert [b[0].tolist() for b in got] == [b[0].tolist() for b in want]
        assert np.array_equal(np.concatenate([b[0] for b in got]),
                              ferry.distributed_indices(N, world, rank, seed=7, epoch=0))
        _check(got, samples)
    assert proxy.gets("/plain/shard-"), "the shards were not read from the server"
    with pytest.raises(FileNotFoundError) as e:
        ferry.IndexedDataset(s3_server.url("no-such-dataset"), context=_ctx())
    assert "no-such-dataset" in str(e.value), str(e.value)


def test_cache_second_epoch_no_gets(s3_server, env, proxy, tmp_path):
    d, samples, url = _upload(s3_server, tmp_path, "cached")
    cache = tmp_path / "cache"
    cache.mkdir()
    ctx = _ctx(cache)
    loader = ferry.Loader(url, batch_size=8, seed=3, device="cpu", context=ctx)
    shards = loader.dataset.shards
    proxy.clear()
    e0 = _epoch(loader)
    _check(e0, samples)
    st = loader.dataset.cache_stats()
    assert st["fetched"] == shards and st["staged"] == shards and st["remote_reads"] == 0, st
    assert len(proxy.gets("/cached/shard-")) >= shards  # each shard fetched whole (ranged GETs)
    # the shards and the index (read through the cache too)
    assert len(_entries(cache)) == shards + 1 and len([n for n in os.listdir(cache) if n.endswith(".json")]) == shards + 1
    proxy.clear()
    loader.set_epoch(1)
    before = loader.stats()
    e1 = _epoch(loader)
    _check(e1, samples)
    assert np.array_equal(np.concatenate([b[0] for b in e1]), ferry.distributed_indices(N, 1, 0, seed=3, epoch=1))
    assert proxy.gets("/cached/") == [], proxy.requests
    # the staged shards are read as local files are: copied out of the pipeline's mappings of them
    # (they went through pread and a cachestat a read, and two getpid(2) calls a read in the cache:
    # 0.38-0.41x local files' samples/s on the H200)
    after = loader.stats()
    reads = after["reads"] - (before["reads"] if after["reads"] >= before["reads"] else 0)
    mapped = after["mapped_reads"] - (before["mapped_reads"] if after["reads"] >= before["reads"] else 0)
    assert reads > 0 and mapped >= 0.9 * reads, (before, after)
    # through the mappings the stagers made (every page in): those staged once the loader existed
    # (its first epoch's, at the latest; the pipeline restarted for epoch 1)
    assert after["lent_maps"] >= 1, (before, after)
    loader.close()

    # a new process's view: the dataset opened again reuses what is staged, its index too (HEADs only)
    proxy.clear()
    ds = ferry.IndexedDataset(url, context=_ctx(cache))
    assert [np.array_equal(ds[i], samples[i]) for i in range(N)] == [True] * N
    st = ds.cache_stats()
    assert st["reused"] == shards and st["fetched"] == 0, st
    # (ferry.copies is absent: its HEAD's 404 is followed by one GET for S3's error code)
    assert [g for g in proxy.gets("/cached/") if not g[1].endswith("/ferry.copies")] == [], proxy.requests
    ds.close()

    # the objects replaced (another dataset under the same names): fetched again, never mixed
    _, samples2, _ = _upload(s3_server, tmp_path, "cached", seed=2)
    proxy.clear()
    ds = ferry.IndexedDataset(url, context=_ctx(cache))
    assert all(np.array_equal(ds[i], samples2[i]) for i in range(N))
    st = ds.cache_stats()
    assert st["fetched"] == ds.shards and st["reused"] == 0, st
    ds.close()


def test_cache_budget_evicts_lru(s3_server, env, proxy, tmp_path):
    _, samples, url = _upload(s3_server, tmp_path, "budget")
    cache = tmp_path / "cache"
    cache.mkdir()
    sizes = [s["Size"] for s in s3_server.s3.list_objects_v2(Bucket=_moto.BUCKET, Prefix="budget/shard-")["Contents"]]
    budget = max(sizes) * 2 + 1  # two shards at a time
    ds = ferry.IndexedDataset(url, context=_ctx(cache, budget, cache_jobs=1))
    for i in range(N):  # in order: shard after shard, each evicting the least recently used
        assert np.array_equal(ds[i], samples[i]), i
        used = _used(cache)
        assert used <= budget, (i, used, budget)
    st = ds.cache_stats()
    assert st["evicted"] >= ds.shards - 2 and st["fetched"] >= ds.shards, st
    ds.close()
    # what is left is the most recently used: the last shards
    left = _entries(cache)
    assert 1 <= len(left) <= 2
    # a budget smaller than one shard: nothing staged, every read goes to the object
    small = tmp_path / "small"
    small.mkdir()
    ds = ferry.IndexedDataset(url, context=_ctx(small, 16))
    assert np.array_equal(ds[3], samples[3])
    st = ds.cache_stats()
    assert st["fetched"] == 0 and st["remote_reads"] >= 1 and _entries(small) == [], st
    ds.close()


def _stale_mapped(cache):
    """This process's mappings of cache entries that were unlinked (evicted)."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            n += len(parts) == 6 and str(cache) in parts[5] and parts[5].rstrip().endswith("(deleted)")
    return n


def test_loader_shuffle_under_a_smaller_cache(s3_server, env, proxy, tmp_path):
    """A shuffled loader over a cache smaller than the dataset visits the shards a window at a
    time (shard_window's default: a sixteenth of what the budget holds, at least 1; 2 here, given),
    the stagers fetch in the loader's
    order ahead of it and evict the shard used farthest ahead: no read goes to the object in any
    epoch (before, with the order over all shards, half of every epoch's reads did and the cache
    stopped evicting), every
    batch's bytes right, the directory within its budget, and no mapping of an evicted entry
    kept past the loader's next batch."""
    d, samples, url = _upload(s3_server, tmp_path, "window", shard=SHARD // 4)
    cache = tmp_path / "cache"
    cache.mkdir()
    sizes = [s["Size"] for s in s3_server.s3.list_objects_v2(Bucket=_moto.BUCKET, Prefix="window/shard-")["Contents"]]
    assert len(sizes) >= 6, len(sizes)
    budget = max(sizes) * 6 + 1  # 6 shards: windows of 2 (and room for the index's entry)
    # the default for this budget: windows of one shard (the window being read and the next in an
    # eighth of the budget, the rest kept from one epoch to the next)
    (tmp_path / "cache-default").mkdir()
    dl = ferry.Loader(url, batch_size=2, seed=5, device="cpu", context=_ctx(tmp_path / "cache-default", budget))
    assert "order=shuffle-window-1" in dl.state_dict()["state"], dl.state_dict()
    # a state saved with another order (here a plain shuffle of the local copy) resumes that order:
    # a loader left at the default takes the state's windows, or none
    p = ferry.Loader(d, batch_size=2, seed=5, device="cpu", shard_window=0)
    plain = [p.last_indices.tolist() for _ in p]
    p.close()
    p = ferry.Loader(d, batch_size=2, seed=5, device="cpu", shard_window=0)
    for _ in zip(range(3), p):
        pass
    dl.load_state_dict(p.state_dict())
    assert [dl.last_indices.tolist() for _ in dl] == plain[3:]
    p.close()
    dl.close()
    dl.dataset.close()
    # (a shard holds ~4 samples here: the batches the pipeline fills ahead stay within a window)
    loader = ferry.Loader(url, batch_size=2, seed=5, device="cpu", threads=1, prefetch=1, shard_window=2,
                          context=_ctx(cache, budget, cache_jobs=2))
    assert "order=shuffle-window-2" in loader.state_dict()["state"], loader.state_dict()
    remote = []
    for e in range(3):
        loader.set_epoch(e)
        got = _epoch(loader)
        assert sorted(np.concatenate([b[0] for b in got]).tolist()) == list(range(N)), e
        _check(got, samples)
        st = loader.dataset.cache_stats()
        remote.append(st["remote_reads"])
        assert _used(cache) <= budget, (e, _used(cache), budget)
        # (the entries evicted since the pipeline's last batch at most; 15 shards a epoch were
        # evicted and would all stay mapped otherwise)
        assert _stale_mapped(cache) <= 4, (e, _stale_mapped(cache))
        # the shards the stagers staged anew were read through their mappings, every page in
        assert e == 0 or loader.stats()["lent_maps"] > 0, (e, loader.stats())
    # No read of the object in any epoch: the loader tells the cache where its reads are (the
    # window of each batch), a shard of that window or the next not staged yet is staged while the
    # read waits (it evicts the farthest next use outside the window being read: a budget of 6
    # shards always has room for it), and nothing else goes to the object. Before, the reads
    # moved the cache's window themselves, a shard still in flight could be read from the object
    # (up to a shard's samples, ~4, an epoch after the first), and with the order over all shards
    # about half of the 64 reads an epoch went to it.
    assert remote == [0, 0, 0], (remote, st)
    assert st["evicted"] >= len(sizes), st
    loader.close()
    # (the pipeline went on into the next epoch: its first windows are being staged; the close
    # waits for them, without the GIL that the proxy's thread needs to serve them)
    t0 = time.time()
    loader.dataset.close()
    assert time.time() - t0 < 20
    assert _stale_mapped(cache) == 0


def _model_fetches(orders, sizes, budget, window, other):
    """The dataset cache's design with a plan (src/format/cache.c), played out on the loader's shard
    orders (orders[e]: epoch e's shards, each window at a time; one more epoch than is read, the
    last epoch's plan's second half): fetches per epoch. The reads reach a window; its shards not
    staged are staged (a read waits), evicting the farthest next use outside it; then the stagers
    stage in plan order, this epoch's then the next one's, while there is room or a shard to evict
    for it: one used later, for the next window any, further ahead only one used in a later epoch
    (read already this epoch). other: the bytes of another entry in the directory (the index),
    evicted first. Staging is never behind the reads here (the test reads slowly)."""
    n = len(sizes)
    cache, out = set(), []
    for e in range(len(orders) - 1):
        plan = list(orders[e]) + list(orders[e + 1])
        pos = {s: i for i, s in enumerate(orders[e])}
        pos2 = {s: n + i for i, s in enumerate(orders[e + 1])}
        fetched = 0
        for lo in range(0, n, window):
            win = set(orders[e][lo:lo + window])

            def nu(s):
                return pos[s] if pos[s] >= lo else pos2[s]

            def stage(s, limit):
                nonlocal fetched, other
                free = budget - other - sum(sizes[x] for x in cache)
                cand = sorted((x for x in cache if x not in win and nu(x) > limit and
                               (limit < lo + 2 * window or nu(x) // n > limit // n)), key=nu, reverse=True)
                victims = []
                if free < sizes[s] and other:
                    free += other
                    victims.append(None)
                for x in cand:
                    if free >= sizes[s]:
                        break
                    victims.append(x)
                    free += sizes[x]
                if free < sizes[s]:
                    return False
                for x in victims:
                    if x is None:
                        other = 0
                    else:
                        cache.discard(x)
                cache.add(s)
                fetched += 1
                return True

            for s in orders[e][lo:lo + window]:
                if s not in cache:
                    assert stage(s, -1)
            for q in range(lo, 2 * n):
                s = plan[q]
                if nu(s) == q and s not in cache and not stage(s, q):
                    break
        out.append(fetched)
    return out


def test_cache_stages_in_the_loaders_order_and_evicts_by_next_use(s3_server, env, proxy, tmp_path):
    """With a cache of 7 of 15 shards and windows of one shard, a loader read slowly (the stagers
    keep ahead): the shards are fetched in the order the loader reads them (this epoch's, then the
    next epoch's: each fetch later in it than the one before), no read goes to the object, and the
    epochs after the first fetch what the design's model fetches (farthest next use evicted, the
    shards kept from an epoch read again when their turn comes): 26 shards over the 3 later epochs
    here (15 shards, so at least 3 x (15 - 7) = 24 with any policy). Before (the window being read
    and the next one staged, the least recently used evicted) they fetched 14, 10 and 14."""
    d, samples, url = _upload(s3_server, tmp_path, "plan", shard=SHARD // 4)
    local = ferry.IndexedDataset(d)
    nshards = local.shards
    shard_of = np.empty(N, dtype=np.uint32)
    local._ds.locate_into(shard_of, np.empty(N, dtype=np.uint64))
    local.close()
    sizes = [os.path.getsize(d / ("shard-%05d.fsh" % k)) for k in range(nshards)]
    idx_size = os.path.getsize(d / "ferry.idx")
    assert nshards >= 12, nshards
    budget = max(sizes) * 7 + 1
    cache = tmp_path / "cache"
    cache.mkdir()
    epochs = 4
    proxy.clear()
    loader = ferry.Loader(url, batch_size=2, seed=11, device="cpu", threads=1, prefetch=1, shard_window=1,
                          context=_ctx(cache, budget, cache_jobs=1))
    assert "order=shuffle-window-1" in loader.state_dict()["state"], loader.state_dict()
    orders, fetched, remote = [], [], []
    for e in range(epochs):
        loader.set_epoch(e)
        order = []
        for flat, offs in loader:
            for i in loader.last_indices:
                k = int(shard_of[i])
                if k not in order:
                    order.append(k)
            time.sleep(0.03)
        assert sorted(order) == list(range(nshards)), order  # windows of one shard: its samples together
        orders.append(order)
        st = loader.dataset.cache_stats()
        fetched.append(st["fetched"])
        remote.append(st["remote_reads"])
    loader.close()
    # the epoch after the last (the stagers' plan had it): a loader over the local directory
    nxt = ferry.Loader(d, batch_size=2, seed=11, device="cpu", shard_window=1)
    nxt.set_epoch(epochs)
    order = []
    for _ in nxt:
        for i in nxt.last_indices:
            if int(shard_of[i]) not in order:
                order.append(int(shard_of[i]))
    orders.append(order)
    nxt.close()
    gets = [int(g[1].rsplit("shard-", 1)[1].split(".")[0]) for g in proxy.gets("/plan/shard-")]
    loader.dataset.close()
    # every read from the cache: each shard staged before its window is read (or while it waits)
    assert remote[-1] == 0, (remote, st)
    # The fetches follow the plan: matched in order to places in the epochs' orders one after the
    # other, each fetch at a later place than the one before. The first fetches may come before
    # the loader gave its order (the stagers start with the dataset, in index order, while the
    # budget holds): skipped until one is at its place in epoch 0's order.
    seq = [k for o in orders for k in o]
    at = 0
    while at < len(gets) and gets[at] != orders[0][0]:
        at += 1
    assert at <= budget // min(sizes), (at, gets)
    place = -1
    for g in gets[at:]:
        nxt_place = seq.index(g, place + 1) if g in seq[place + 1:] else None
        assert nxt_place is not None, ("fetched out of the loader's order", gets, orders)
        place = nxt_place
    # ... and never more than an epoch ahead of the reads (the plan holds two epochs)
    assert place < len(seq), place
    # what the design fetches, epoch after epoch (the first epoch's count depends on what the
    # stagers had fetched before the order came)
    # (over the later epochs together: the counters are read when the consumer ends an epoch, and
    # the pipeline is a batch into the next one by then, its stagers a fetch or so further; 2 of
    # slack for a stage that fell behind the reads on a loaded machine and was staged as a read
    # waited, which evicts by the same rule but at another moment)
    model = _model_fetches(orders, sizes, budget, 1, idx_size)
    got = [fetched[e] - fetched[e - 1] for e in range(1, epochs)]
    assert abs(sum(got) - sum(model[1:epochs])) <= 2, (got, model)
    assert len(gets) >= fetched[-1], (len(gets), fetched)  # (a fetch is a GET: shards under a part)


def test_cache_budget_with_stagers_at_once(s3_server, env, proxy, tmp_path):
    """cache_jobs stagers fetching at once count each other's shards against the budget: before,
    each saw the directory without the others' and 4 of them held 4 shards under a 2-shard budget,
    and a full cache then never evicted again."""
    _, samples, url = _upload(s3_server, tmp_path, "jobs")
    cache = tmp_path / "cache"
    cache.mkdir()
    sizes = [s["Size"] for s in s3_server.s3.list_objects_v2(Bucket=_moto.BUCKET, Prefix="jobs/shard-")["Contents"]]
    budget = max(sizes) * 2 + 1
    proxy.delay = 0.3  # the stagers' fetches overlap
    ds = ferry.IndexedDataset(url, context=_ctx(cache, budget, cache_jobs=4))
    for i in range(N):
        assert np.array_equal(ds[i], samples[i]), i
        assert _used(cache) <= budget, (i, _used(cache), budget)
    st = ds.cache_stats()
    ds.close()
    assert _used(cache) <= budget, (_used(cache), budget, st)
    assert st["fetched"] >= 2 and st["remote_reads"] + st["fetched"] >= ds.shards, st


def test_forked_child_reads_without_the_stagers(s3_server, env, proxy, tmp_path):
    """A fork()ed child (DataLoader workers) has none of the stagers' threads: it reads what is
    staged from the cache and the rest from the object, and never waits for a stage."""
    _, samples, url = _upload(s3_server, tmp_path, "forked")
    cache = tmp_path / "cache"
    cache.mkdir()
    proxy.delay = 1.0  # staging takes seconds: the child starts while every shard is in flight
    ds = ferry.IndexedDataset(url, context=_ctx(cache, cache_jobs=1))
    pid = os.fork()
    if pid == 0:  # the child: a hang becomes a failure after 30 s
        import signal
        signal.alarm(30)
        ok = all(np.array_equal(ds[i], samples[i]) for i in range(0, N, 7))
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    proxy.delay = 0.0
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert all(np.array_equal(ds[i], samples[i]) for i in range(N))  # the parent's cache still works
    assert ds.cache_stats()["staged"] == ds.shards
    ds.close()


_READER = r"""
import sys, zlib, numpy as np, ferry
url, cache = sys.argv[1], sys.argv[2]
ds = ferry.IndexedDataset(url, context=ferry.Context(threads=2, cache_dir=cache))
crc = 0
for i in range(len(ds)):
    crc = zlib.crc32(ds[i].tobytes(), crc)
print("crc", crc, "stats", ds.cache_stats()["fetched"] + ds.cache_stats()["reused"])
"""


def test_two_processes_share_a_cache(s3_server, env, proxy, tmp_path):
    _, samples, url = _upload(s3_server, tmp_path, "shared")
    cache = tmp_path / "cache"
    cache.mkdir()
    want = 0
    import zlib
    for s in samples:
        want = zlib.crc32(s.tobytes(), want)
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    procs = [subprocess.Popen([sys.executable, str(script), url, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(os.environ)) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and ("crc %d " % want) in out, out
    names = os.listdir(cache)
    assert not [n for n in names if ".tmp-" in n], names  # no half file left, none shown
    entries = _entries(cache)
    ds = ferry.IndexedDataset(url, context=_ctx(cache))
    assert len(entries) == ds.shards + 1, entries  # and the index
    urls = []
    for n in entries:
        meta = json.loads((cache / (n + ".json")).read_text())
        assert meta["etag"] and meta["size"] == os.path.getsize(cache / n), meta
        urls.append(meta["url"])
    assert sorted(urls) == sorted([url + "/ferry.idx"] + [url + "/shard-%05d.fsh" % s for s in range(ds.shards)]), urls
    ds.close()
