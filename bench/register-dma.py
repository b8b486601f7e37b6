#!/usr/bin/env python3
# The zero-copy alternative to copying the page cache into pinned memory (issue 28): map a
# /dev/shm file, register the mapping with cuMemHostRegister (read-only, portable) and let the
# GPUs' copy engines read it. Prints the registration's rate and CPU, the copy's rate from the
# registered pages, and both pipelined (register chunk i+1 while chunk i copies) into one GPU and
# into every GPU at once. Needs libcuda and numpy; not part of gpu-check.
#   python3 bench/register-dma.py [GiB]     (default 4)
import ctypes, mmap, os, time, threading, sys
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: CUresult {r}")
ck(cu.cuInit(0), "init")
ndev = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(ndev))
ctxs = []
for d in range(ndev.value):
    dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), d), "dev")
    ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx")
    ctxs.append(ctx)
    v = ctypes.c_int(); cu.cuDeviceGetAttribute(ctypes.byref(v), 113, dev)  # READ_ONLY_HOST_REGISTER_SUPPORTED
    print(f"dev {d}: read-only host register supported={v.value}")
cu.cuCtxSetCurrent(ctxs[0])
SZ = int(sys.argv[1]) << 30 if len(sys.argv) > 1 else 4 << 30
path = "/dev/shm/regexp.bin"
with open(path, "wb") as f:
    blk = os.urandom(64 << 20)
    for i in range(SZ // len(blk)): f.write(blk)
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, SZ, mmap.MAP_SHARED, mmap.PROT_READ)
import numpy as np  # only for the mapping's address
arr = np.frombuffer(m, dtype=np.uint8)
addr = arr.ctypes.data
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
FLAGS = 0x01 | 0x08  # PORTABLE | READ_ONLY
def reg_chunks(chunk, nthreads):
    n = SZ // chunk
    idx = list(range(n)); lock = threading.Lock(); errs = []
    def w():
        cu.cuCtxSetCurrent(ctxs[0])
        while True:
            with lock:
                if not idx: return
                i = idx.pop()
            r = cu.cuMemHostRegister_v2(addr + i * chunk, chunk, FLAGS)
            if r: errs.append(r)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=w) for _ in range(nthreads)]
    [t.start() for t in ts]; [t.join() for t in ts]
    t1 = time.perf_counter()
    if errs: print("register errors", errs[:3]); return None
    return t1 - t0
def unreg_chunks(chunk):
    t0 = time.perf_counter()
    for i in range(SZ // chunk): ck(cu.cuMemHostUnregister(addr + i * chunk), "unreg")
    return time.perf_counter() - t0
dptrs = []
for d, ctx in enumerate(ctxs):
    cu.cuCtxSetCurrent(ctx); p = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(SZ)), "alloc"); dptrs.append(p.value)
cu.cuCtxSetCurrent(ctxs[0])
# plain (pageable) copy for reference
t0 = time.perf_counter(); ck(cu.cuMemcpyHtoD_v2(dptrs[0], addr, SZ), "pageable"); t = time.perf_counter() - t0
print(f"pageable cuMemcpyHtoD from the mapping: {SZ/t/1e9:.2f} GB/s")
for chunk_mb, nt in [(4096, 1), (64, 1), (64, 4), (64, 8), (64, 16), (16, 16), (256, 8)]:
    chunk = min(chunk_mb << 20, SZ)
    ru = os.times()
    t = reg_chunks(chunk, nt)
    ru2 = os.times()
    if t is None: continue
    cpu = (ru2.user - ru.user) + (ru2.system - ru.system)
    t0 = time.perf_counter()
    for i in range(SZ // chunk): ck(cu.cuMemcpyHtoD_v2(dptrs[0] + i * chunk, addr + i * chunk, chunk), "copy")
    tc = time.perf_counter() - t0
    tu = unreg_chunks(chunk)
    print(f"register {chunk_mb} MiB x {nt} threads: {SZ/t/1e9:.2f} GB/s ({t*1e3:.0f} ms, {cpu:.2f} cpu s); copy from it {SZ/tc/1e9:.2f} GB/s; unregister {tu*1e3:.0f} ms")
# pipelined: register chunk i (threads) while copying; whole thing timed, one GPU and two
def pipeline(devs, chunk=64 << 20, nt=8):
    n = SZ // chunk
    done = [threading.Event() for _ in range(n)]
    nxt = [0]; lock = threading.Lock()
    def w():
        cu.cuCtxSetCurrent(ctxs[0])
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= n: return
            ck(cu.cuMemHostRegister_v2(addr + i * chunk, chunk, FLAGS), "reg"); done[i].set()
    def copier(d, lo, hi):
        cu.cuCtxSetCurrent(ctxs[d]); s = ctypes.c_void_p(); cu.cuStreamCreate(ctypes.byref(s), 1)
        for i in range(lo, hi):
            done[i].wait(); ck(cu.cuMemcpyHtoDAsync_v2(dptrs[d] + i * chunk, addr + i * chunk, chunk, s), "cp")
        ck(cu.cuStreamSynchronize(s), "sync")
    ru = os.times(); t0 = time.perf_counter()
    ts = [threading.Thread(target=w) for _ in range(nt)]
    per = n // len(devs)
    cs = [threading.Thread(target=copier, args=(d, k * per, (k + 1) * per)) for k, d in enumerate(devs)]
    [t.start() for t in ts + cs]; [t.join() for t in ts + cs]
    t = time.perf_counter() - t0; ru2 = os.times()
    cpu = (ru2.user - ru.user) + (ru2.system - ru.system)
    unreg_chunks(chunk)
    print(f"pipeline register+copy into GPUs {devs}, {chunk>>20} MiB, {nt} reg threads: {SZ/t/1e9:.2f} GB/s, {cpu/t:.2f} cores")
for nt in (4, 8, 16):
    pipeline([0], nt=nt)
if len(ctxs) > 1:
    for nt in (4, 8, 16):
        pipeline([0, 1], nt=nt)

# Does the copy engines' reading add to the CPUs' page-cache copy, or do both share one memory
# bandwidth? K threads copy a second tmpfs file's mapping into private memory (what the engine's
# workers do into pinned slots), alone and while the registration pipeline runs into every GPU.
path2 = "/dev/shm/regexp2.bin"
with open(path2, "wb") as f:
    for i in range(SZ // len(blk)): f.write(blk)
fd2 = os.open(path2, os.O_RDONLY)
m2 = mmap.mmap(fd2, SZ, mmap.MAP_SHARED, mmap.PROT_READ)
addr2 = np.frombuffer(m2, dtype=np.uint8).ctypes.data
def cpu_copy(k, secs, out):
    piece = 8 << 20
    bufs = [ctypes.create_string_buffer(piece) for _ in range(k)]
    stop = time.perf_counter() + secs; moved = [0] * k
    def w(j):
        off = (j * SZ // k) // piece * piece
        while time.perf_counter() < stop:
            ctypes.memmove(bufs[j], addr2 + off, piece); moved[j] += piece
            off = (off + piece) % SZ
    ts = [threading.Thread(target=w, args=(j,)) for j in range(k)]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    out.append(sum(moved) / (time.perf_counter() - t0) / 1e9)
K = int(os.environ.get("REGEXP_COPY_THREADS", "16"))
r = []; cpu_copy(K, 2.0, r); print(f"CPU page-cache copy alone, {K} threads: {r[0]:.2f} GB/s")
r = []; th = threading.Thread(target=cpu_copy, args=(K, 2.0, r)); th.start()
while th.is_alive():
    pipeline(list(range(len(ctxs))), nt=8)  # prints each round's rate
th.join()
print(f"CPU page-cache copy, {K} threads, while the pipeline ran over and over: {r[0]:.2f} GB/s")
os.unlink(path); os.unlink(path2)
