/*
 * A stand-in for libcuda.so.1, built by tests/unit/test_gpu_shim.c at test time (cc -shared). It
 * keeps "device memory" in host memory so that the shim's logic runs without a GPU. Knobs:
 * -DFAKE_INIT_RESULT=n (cuInit's result), -DFAKE_DEVICES=n, -DFAKE_ATTRIBUTES (export
 * cuPointerGetAttributes), -DFAKE_MEMINFO (export cuMemGetInfo), -DFAKE_CHECKPOINT (export the
 * checkpoint API, below), -DFAKE_BATCH
 * (export cuMemcpyBatchAsync_v2, CUDA 13's form), -DFAKE_BATCH12 (export cuMemcpyBatchAsync, the
 * 12.8 form with failIdx), -DFAKE_BATCH_REFUSE (with FAKE_BATCH: every batch returns
 * CUDA_ERROR_NOT_SUPPORTED), -DFAKE_CTX_STATE (export cuDevicePrimaryCtxGetState), and
 * -D<symbol>=renamed_<symbol> to leave a symbol out.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FAKE_INIT_RESULT
#define FAKE_INIT_RESULT 0
#endif
#ifndef FAKE_DEVICES
#define FAKE_DEVICES 1
#endif
#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

enum { HOSTMEM = 1, DEVMEM = 2 };
struct range {
	uintptr_t base;
	size_t size;
	int type, device, owned;
};
static struct range ranges[256];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_calls;
static char ctxs[FAKE_DEVICES + 1];
static __thread char *current;

API int fake_init_calls(void) { return __atomic_load_n(&init_calls, __ATOMIC_SEQ_CST); }
API int fake_ranges(int type)
{
	int n = 0;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < 256; i++)
		n += ranges[i].size && ranges[i].type == type;
	pthread_mutex_unlock(&lock);
	return n;
}

static struct range *find(uintptr_t p, size_t n)
{
	for (int i = 0; i < 256; i++)
		if (ranges[i].size && p >= ranges[i].base && p + n <= ranges[i].base + ranges[i].size)
			return &ranges[i];
	return NULL;
}

static int add(void *p, size_t size, int type, int owned)
{
	pthread_mutex_lock(&lock);
	if (find((uintptr_t)p, 1)) {
		pthread_mutex_unlock(&lock);
		return 712;
	}
	for (int i = 0; i < 256; i++) {
		if (!ranges[i].size) {
			ranges[i] = (struct range){ (uintptr_t)p, size, type, current ? (int)(current - ctxs) : 0, owned };
			pthread_mutex_unlock(&lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&lock);
	return 2;
}

static int del(uintptr_t p, int type, int owned)
{
	int r = 1;
	pthread_mutex_lock(&lock);
	struct range *x = find(p, 1);
	if (x && x->base == p && x->type == type && x->owned == owned) {
		if (owned)
			free((void *)x->base);
		memset(x, 0, sizeof(*x));
		r = 0;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

static int check(uintptr_t p, size_t n, int type)
{
	pthread_mutex_lock(&lock);
	struct range *x = find(p, n);
	int ok = x && x->type == type;
	pthread_mutex_unlock(&lock);
	return ok ? 0 : 1;
}

API CUresult cuInit(unsigned int flags) { __atomic_add_fetch(&init_calls, 1, __ATOMIC_SEQ_CST); (void)flags; return FAKE_INIT_RESULT; }
API CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
API CUresult cuGetErrorName(CUresult e, const char **s) { *s = e == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_FAKE"; return 0; }
API CUresult cuGetErrorString(CUresult e, const char **s) { *s = e == 100 ? "no CUDA-capable device is detected" : "fake error"; return 0; }
API CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= FAKE_DEVICES) return 101; *d = ordinal; return 0; }
API CUresult cuDeviceGetCount(int *n) { *n = FAKE_DEVICES; return 0; }
API CUresult cuDeviceGetName(char *name, int len, int dev) { snprintf(name, (size_t)len, "Fake GPU %d", dev); return 0; }
API CUresult cuDeviceGetAttribute(int *v, int attr, int dev) { (void)attr; (void)dev; *v = 0; return 0; }
static int retained[FAKE_DEVICES + 1];
API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { __atomic_add_fetch(&retained[dev], 1, __ATOMIC_SEQ_CST); *ctx = &ctxs[dev]; return 0; }
#ifdef FAKE_CTX_STATE
/* -DFAKE_CTX_STATE: cuDevicePrimaryCtxGetState, active once the device's context was retained */
API CUresult cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
	if (dev < 0 || dev >= FAKE_DEVICES)
		return 101;
	*flags = 0;
	*active = __atomic_load_n(&retained[dev], __ATOMIC_SEQ_CST) > 0;
	return 0;
}
#endif
API CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
API CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
API CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
API CUresult cuCtxGetDevice(int *dev) { if (!current) return 201; *dev = (int)(current - ctxs); return 0; }
/* allocations of device memory, pinned host memory and host registrations, for the tests that a
 * path keeps its buffers (test_compress_device: a second read allocates nothing) */
static int mem_allocs;
API int fake_mem_allocs(void) { return __atomic_load_n(&mem_allocs, __ATOMIC_SEQ_CST); }
API CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n)
{
	void *p;
	__atomic_add_fetch(&mem_allocs, 1, __ATOMIC_SEQ_CST);
	if (!current)
		return 201;
	if (n > 4096 && getenv("FAKE_ALLOC_FAIL")) /* $FAKE_ALLOC_FAIL: allocations beyond a page fail */
		return 2;
	if (!n || !(p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095)))
		return n ? 2 : 1;
	if (add(p, n, DEVMEM, 1)) {
		free(p);
		return 2;
	}
	*d = (uintptr_t)p;
	return 0;
}
API CUresult cuMemFree_v2(CUdeviceptr d) { return current ? del((uintptr_t)d, DEVMEM, 1) : 201; }
API CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags)
{
	void *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	(void)flags;
	__atomic_add_fetch(&mem_allocs, 1, __ATOMIC_SEQ_CST);
	if (!p)
		return 2;
	add(p, n, HOSTMEM, 1);
	*pp = p;
	return 0;
}
API CUresult cuMemFreeHost(void *p) { return del((uintptr_t)p, HOSTMEM, 1); }
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) { (void)flags; __atomic_add_fetch(&mem_allocs, 1, __ATOMIC_SEQ_CST); return current ? add(p, n, HOSTMEM, 0) : 201; }
API CUresult cuMemHostUnregister(void *p) { return del((uintptr_t)p, HOSTMEM, 0) ? 713 : 0; }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { if (!current || check(d, n, DEVMEM)) return current ? 1 : 201; memcpy((void *)(uintptr_t)d, s, n); return 0; }
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { if (!current || check(s, n, DEVMEM)) return current ? 1 : 201; memcpy(d, (void *)(uintptr_t)s, n); return 0; }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { if (check(d, n, DEVMEM) || check(s, n, DEVMEM)) return 1; memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return 0; }
/* asynchronous host-to-device copies, counted for the gather's tests */
static int htod_async_calls, batch_calls, batch_copies, batch_attempts;
API int fake_batch_attempts(void) { return __atomic_load_n(&batch_attempts, __ATOMIC_SEQ_CST); }
static long long async_bytes;
API int fake_htod_async_calls(void) { return __atomic_load_n(&htod_async_calls, __ATOMIC_SEQ_CST); }
API int fake_batch_calls(void) { return __atomic_load_n(&batch_calls, __ATOMIC_SEQ_CST); }
API int fake_batch_copies(void) { return __atomic_load_n(&batch_copies, __ATOMIC_SEQ_CST); }
API int fake_async_bytes(void) { return (int)__atomic_load_n(&async_bytes, __ATOMIC_SEQ_CST); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st)
{
	(void)st;
	__atomic_add_fetch(&htod_async_calls, 1, __ATOMIC_SEQ_CST);
	CUresult r = cuMemcpyHtoD_v2(d, s, n);
	if (!r)
		__atomic_add_fetch(&async_bytes, (long long)n, __ATOMIC_SEQ_CST);
	return r;
}
#if defined(FAKE_BATCH) || defined(FAKE_BATCH12)
struct memcpy_attrs { int order; int loc[4]; unsigned flags; };
/* cuda.h's rules: attrsIdxs[0] is 0, increasing, below count; numAttrs <= count; an order is set */
static CUresult batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, struct memcpy_attrs *a,
		      size_t *ai, size_t na, size_t *fail, void *st)
{
	(void)st;
	__atomic_add_fetch(&batch_attempts, 1, __ATOMIC_SEQ_CST);
#ifdef FAKE_BATCH_REFUSE
	return 801;
#endif
	if (!current)
		return 201;
	if (a && (a[0].loc[0] != 2 || a[0].loc[2] != 1)) /* the hints ring.c gives: host to device */
		return 1;
	if (!count || !na || na > count || ai[0] != 0 || !a || a[0].order < 1 || a[0].order > 3)
		return 1;
	for (size_t k = 1; k < na; k++)
		if (ai[k] <= ai[k - 1] || ai[k] >= count || a[k].order < 1 || a[k].order > 3)
			return 1;
	__atomic_add_fetch(&batch_calls, 1, __ATOMIC_SEQ_CST);
	for (size_t i = 0; i < count; i++) {
		if (check(d[i], n[i], DEVMEM)) {
			if (fail)
				*fail = i;
			return 1;
		}
		memcpy((void *)(uintptr_t)d[i], (const void *)(uintptr_t)s[i], n[i]);
		__atomic_add_fetch(&batch_copies, 1, __ATOMIC_SEQ_CST);
		__atomic_add_fetch(&async_bytes, (long long)n[i], __ATOMIC_SEQ_CST);
	}
	return 0;
}
#endif
#ifdef FAKE_BATCH
API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, struct memcpy_attrs *a,
				   size_t *ai, size_t na, void *st)
{
	return batch(d, s, n, count, a, ai, na, NULL, st);
}
#endif
#ifdef FAKE_BATCH12
API CUresult cuMemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, struct memcpy_attrs *a,
				size_t *ai, size_t na, size_t *fail, void *st)
{
	return fail ? batch(d, s, n, count, a, ai, na, fail, st) : 1;
}
#endif
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
static int dtod_async_calls;
API int fake_dtod_async_calls(void) { return __atomic_load_n(&dtod_async_calls, __ATOMIC_SEQ_CST); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st)
{
	(void)st;
	__atomic_add_fetch(&dtod_async_calls, 1, __ATOMIC_SEQ_CST);
	return current ? cuMemcpyDtoD_v2(d, s, n) : 201;
}
#ifdef FAKE_MEMINFO
/* -DFAKE_MEMINFO: cuMemGetInfo says $FAKE_MEM_FREE bytes are free (read at each call; default 64 GiB) of 80 GiB. */
API CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot)
{
	const char *e = getenv("FAKE_MEM_FREE");
	*fr = e ? (size_t)strtoull(e, NULL, 10) : (size_t)64 << 30;
	*tot = (size_t)80 << 30;
	return current ? 0 : 201;
}
#endif
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { if (check(d, n, DEVMEM)) return 1; memset((void *)(uintptr_t)d, v, n); return 0; }
API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	struct range r;
	pthread_mutex_lock(&lock);
	struct range *x = find((uintptr_t)p, 1);
	if (x)
		r = *x;
	pthread_mutex_unlock(&lock);
	if (!x)
		return 1; /* CUDA_ERROR_INVALID_VALUE: a pointer CUDA never saw */
	if (attr == 2)
		*(unsigned *)data = (unsigned)r.type;
	else if (attr == 8)
		*(unsigned char *)data = 0; /* a bool, as the driver writes it */
	else if (attr == 9)
		*(int *)data = r.device;
	else
		return 1;
	return 0;
}
#ifdef FAKE_ATTRIBUTES
API CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
	for (unsigned i = 0; i < n; i++) {
		if (cuPointerGetAttribute(data[i], attrs[i], p) != 0) {
			if (attrs[i] == 9)
				*(int *)data[i] = -2;
			else if (attrs[i] == 8)
				*(unsigned char *)data[i] = 0;
			else
				*(unsigned *)data[i] = 0;
		}
	}
	return 0;
}
#endif
/*
 * Stream order, as far as test_gpu_shim's stream test needs it. Work runs at once (copies are
 * memcpy) except on a stream the test holds (fake_hold_stream): an event recorded there has not
 * fired, a host function queued there waits, and a stream that waits for such an event
 * (cuStreamWaitEvent) is held with it, so events recorded on it after the wait have not fired
 * either. fake_release_stream lets it all run (each waiting host function on a thread of its own).
 */
#define FAKE_STREAM_MAGIC 0x5f5ea3u
struct fake_stream {
	unsigned magic;
	int held_gen; /* waits for an event of that hold */
};
struct fake_event {
	int gen; /* recorded under that hold and not fired, or 0 */
};
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static void *held_stream;
static int hold_gen, holding;
static struct {
	CUhostFn fn;
	void *u;
} held_fns[16];
static int nheld_fns;
static int stream_held(void *s) /* under hold_mu */
{
	struct fake_stream *fs = s;
	return holding && s && (s == held_stream || (fs->magic == FAKE_STREAM_MAGIC && fs->held_gen == hold_gen));
}
static int event_unfired(void *e)
{
	pthread_mutex_lock(&hold_mu);
	int r = holding && ((struct fake_event *)e)->gen == hold_gen;
	pthread_mutex_unlock(&hold_mu);
	return r;
}
API void fake_hold_stream(void *s)
{
	pthread_mutex_lock(&hold_mu);
	held_stream = s;
	hold_gen++;
	holding = 1;
	pthread_mutex_unlock(&hold_mu);
}
static void *run_held_fn(void *arg)
{
	int i = (int)(intptr_t)arg;
	held_fns[i].fn(held_fns[i].u);
	return NULL;
}
API void fake_release_stream(void)
{
	pthread_mutex_lock(&hold_mu);
	holding = 0;
	int n = nheld_fns;
	nheld_fns = 0;
	pthread_mutex_unlock(&hold_mu);
	for (int i = 0; i < n; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, run_held_fn, (void *)(intptr_t)i) == 0)
			pthread_detach(t);
	}
}
static int streams_made;
API int fake_streams_made(void) { return __atomic_load_n(&streams_made, __ATOMIC_SEQ_CST); }
API CUresult cuStreamCreate(void **s, unsigned flags)
{
	(void)flags;
	__atomic_add_fetch(&streams_made, 1, __ATOMIC_SEQ_CST);
	struct fake_stream *fs = calloc(1, sizeof(*fs));
	if (fs)
		fs->magic = FAKE_STREAM_MAGIC;
	*s = fs;
	return fs ? 0 : 2;
}
API CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
API CUresult cuStreamSynchronize(void *s)
{
	for (;;) {
		pthread_mutex_lock(&hold_mu);
		int held = stream_held(s);
		pthread_mutex_unlock(&hold_mu);
		if (!held)
			return 0;
		usleep(100);
	}
}
/* cuStreamQuery's and cuEventQuery's answer (600: CUDA_ERROR_NOT_READY, work still running), for test_nvcomp */
static int stream_query_result;
API void fake_set_stream_query(int r) { stream_query_result = r; }
API CUresult cuStreamQuery(void *s) { (void)s; return stream_query_result; }
API CUresult cuStreamWaitEvent(void *s, void *e, unsigned f)
{
	(void)f;
	pthread_mutex_lock(&hold_mu);
	struct fake_stream *fs = s;
	if (holding && ((struct fake_event *)e)->gen == hold_gen && s && fs->magic == FAKE_STREAM_MAGIC)
		fs->held_gen = hold_gen;
	pthread_mutex_unlock(&hold_mu);
	return 0;
}
static int events_made;
API int fake_events_made(void) { return __atomic_load_n(&events_made, __ATOMIC_SEQ_CST); }
API CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; __atomic_add_fetch(&events_made, 1, __ATOMIC_SEQ_CST); *e = calloc(1, sizeof(struct fake_event)); return *e ? 0 : 2; }
API CUresult cuEventRecord(void *e, void *s)
{
	pthread_mutex_lock(&hold_mu);
	((struct fake_event *)e)->gen = stream_held(s) ? hold_gen : 0;
	pthread_mutex_unlock(&hold_mu);
	return 0;
}
API CUresult cuEventQuery(void *e) { return event_unfired(e) ? 600 : stream_query_result; }
API CUresult cuEventSynchronize(void *e)
{
	while (event_unfired(e))
		usleep(100);
	return 0;
}
API CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
API CUresult cuLaunchHostFunc(void *s, CUhostFn fn, void *u)
{
	pthread_mutex_lock(&hold_mu);
	if (stream_held(s) && nheld_fns < 16) {
		held_fns[nheld_fns].fn = fn;
		held_fns[nheld_fns++].u = u;
		pthread_mutex_unlock(&hold_mu);
		return 0;
	}
	pthread_mutex_unlock(&hold_mu);
	fn(u);
	return 0;
}

#ifdef FAKE_CHECKPOINT
/*
 * The checkpoint API for one fake CUDA process, the pid in $FAKE_CKPT_PID (read at each call), with
 * (any pid when it is "any") with the state machine cuda.h documents: Lock RUNNING -> LOCKED, Checkpoint LOCKED -> CHECKPOINTED,
 * Restore CHECKPOINTED -> LOCKED, Unlock LOCKED -> RUNNING; a call in the wrong state returns
 * CUDA_ERROR_ILLEGAL_STATE (401), another pid CUDA_ERROR_INVALID_VALUE. $FAKE_CKPT_FAIL (a comma
 * list of lock, checkpoint, restore, unlock) makes those calls fail: lock with CUDA_ERROR_NOT_READY
 * (600, the timeout: still RUNNING), checkpoint and unlock with CUDA_ERROR_NOT_SUPPORTED (801, state
 * kept), restore with CUDA_ERROR_UNKNOWN (999, state FAILED). fake_ckpt_trace() lists the calls.
 */
static int ck_state;
static char ck_trace[512];
API const char *fake_ckpt_trace(void) { return ck_trace; }
static int ck_call(int pid, const char *op)
{
	const char *e = getenv("FAKE_CKPT_PID"), *f = getenv("FAKE_CKPT_FAIL");
	size_t n = strlen(ck_trace);
	snprintf(ck_trace + n, sizeof(ck_trace) - n, "%s%s", n ? "," : "", op);
	if (!e || (strcmp(e, "any") && pid != atoi(e)))
		return 1;
	if (f) {
		char list[128];
		snprintf(list, sizeof(list), ",%s,", f);
		char want[32];
		snprintf(want, sizeof(want), ",%s,", op);
		if (strstr(list, want))
			return -1;
	}
	return 0;
}
API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) { int r = ck_call(pid, "tid"); if (r > 0) return 1; *tid = pid + 1; return 0; }
API CUresult cuCheckpointProcessGetState(int pid, int *state) { int r = ck_call(pid, "state"); if (r > 0) return 1; *state = ck_state; return 0; }
API CUresult cuCheckpointProcessLock(int pid, void *args)
{
	int r = ck_call(pid, "lock");
	if (!args) return 1;
	if (r > 0) return 1;
	if (ck_state != 0) return 401;
	if (r < 0) return 600;
	ck_state = 1;
	return 0;
}
API CUresult cuCheckpointProcessCheckpoint(int pid, void *args)
{
	int r = ck_call(pid, "checkpoint");
	(void)args;
	if (r > 0) return 1;
	if (ck_state != 1) return 401;
	if (r < 0) return 801;
	ck_state = 2;
	return 0;
}
API CUresult cuCheckpointProcessRestore(int pid, void *args)
{
	int r = ck_call(pid, "restore");
	(void)args;
	if (r > 0) return 1;
	if (ck_state != 2) return 401;
	if (r < 0) { ck_state = 3; return 999; }
	ck_state = 1;
	return 0;
}
API CUresult cuCheckpointProcessUnlock(int pid, void *args)
{
	int r = ck_call(pid, "unlock");
	(void)args;
	if (r > 0) return 1;
	if (ck_state != 1) return 401;
	if (r < 0) return 801;
	ck_state = 0;
	return 0;
}
#endif

#ifdef FAKE_KERNEL
/*
 * -DFAKE_KERNEL: cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel and cuMemHostGetDevicePointer_v2
 * for the kernels ferry launches, ferry_scatter and ferry_lz4_walk (src/gpu/scatter.cu; the walk
 * is src/base/lz4_walk.h's, run here on the CPU); -DFAKE_LAUNCH_REFUSE as well: every launch
 * returns CUDA_ERROR_NOT_SUPPORTED. The module is accepted only when its PTX
 * text declares that entry with the argument size the library passes (1544 bytes: struct
 * ferry__scatter_args, 64 pieces), and a launch does the kernel's copies at once. Mapped host
 * memory has device addresses of its own here (MAPPED + the host address), so a launch whose
 * sources are plain host pointers, not the mapping, fails like a kernel reading a wild address.
 */
#define MAPPED 0x8000000000000000ull /* above any user address: mmap can place device memory past 2^44 */
struct scatter_piece { unsigned long long src, dst, len; };
struct scatter_args { unsigned n, pad; struct scatter_piece p[64]; };
#include "../../../src/base/lz4_walk.h"
static char module_token, function_token, walk_token;
static int module_loads, launches, launch_pieces, launch_attempts, walk_launches, walk_refused, module_walk;
API int fake_walk_launches(void) { return __atomic_load_n(&walk_launches, __ATOMIC_SEQ_CST); }
API int fake_walk_refused(void) { return __atomic_load_n(&walk_refused, __ATOMIC_SEQ_CST); }
API int fake_module_loads(void) { return __atomic_load_n(&module_loads, __ATOMIC_SEQ_CST); }
API int fake_launches(void) { return __atomic_load_n(&launches, __ATOMIC_SEQ_CST); }
API int fake_launch_pieces(void) { return __atomic_load_n(&launch_pieces, __ATOMIC_SEQ_CST); }
API int fake_launch_attempts(void) { return __atomic_load_n(&launch_attempts, __ATOMIC_SEQ_CST); }
API CUresult cuModuleLoadData(void **m, const void *image)
{
	const char *ptx = image;
	if (!current)
		return 201;
	__atomic_add_fetch(&module_loads, 1, __ATOMIC_SEQ_CST);
	if (!strstr(ptx, ".version ") || !strstr(ptx, ".entry ferry_scatter(") ||
	    !strstr(ptx, ".param .align 8 .b8 ferry_scatter_param_0[1544]"))
		return 218; /* CUDA_ERROR_INVALID_PTX */
	module_walk = strstr(ptx, ".entry ferry_lz4_walk(") != NULL;
	*m = &module_token;
	return 0;
}
API CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
	if (m != &module_token)
		return 400; /* CUDA_ERROR_INVALID_HANDLE */
	if (!strcmp(name, "ferry_lz4_walk") && module_walk) {
		*f = &walk_token;
		return 0;
	}
	if (strcmp(name, "ferry_scatter"))
		return 500; /* CUDA_ERROR_NOT_FOUND */
	*f = &function_token;
	return 0;
}
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
	if (!current)
		return 201;
	if (flags || check((uintptr_t)p, 1, HOSTMEM))
		return 1;
	*d = MAPPED + (uintptr_t)p;
	return 0;
}
API CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			    unsigned shm, void *st, void **params, void **extra)
{
	(void)st;
	__atomic_add_fetch(&launch_attempts, 1, __ATOMIC_SEQ_CST);
	if (!current)
		return 201;
#ifdef FAKE_LAUNCH_REFUSE
	return 801;
#endif
	if (f == &walk_token) { /* ferry_lz4_walk(n, src, len, cap, verdict, dummy): a warp a chunk, 4 a block */
		if (!params || extra || shm || gy != 1 || gz != 1 || bx != 128 || by != 1 || bz != 1)
			return 1;
		unsigned long long n = *(unsigned long long *)params[0];
		unsigned long long *src = (unsigned long long *)(uintptr_t)*(unsigned long long *)params[1];
		unsigned long long *len = (unsigned long long *)(uintptr_t)*(unsigned long long *)params[2];
		const unsigned long long *cap = (const unsigned long long *)(uintptr_t)*(unsigned long long *)params[3];
		int *verdict = (int *)(uintptr_t)*(unsigned long long *)params[4];
		unsigned long long dummy = *(unsigned long long *)params[5];
		if ((unsigned long long)gx * 4 < n || check((uintptr_t)src, n * 8, DEVMEM) ||
		    check((uintptr_t)len, n * 8, DEVMEM) || check((uintptr_t)cap, n * 8, DEVMEM) ||
		    check((uintptr_t)verdict, n * 4, DEVMEM) || check((uintptr_t)dummy, 2, DEVMEM))
			return 700;
		for (unsigned long long i = 0; i < n; i++) {
			if (check((uintptr_t)src[i], len[i], DEVMEM))
				return 700;
			verdict[i] = ferry__lz4_walk((const unsigned char *)(uintptr_t)src[i], len[i], cap[i]) != 0;
			if (verdict[i]) {
				src[i] = dummy;
				len[i] = 2;
				__atomic_add_fetch(&walk_refused, 1, __ATOMIC_SEQ_CST);
			}
		}
		__atomic_add_fetch(&walk_launches, 1, __ATOMIC_SEQ_CST);
		return 0;
	}
	if (f != &function_token || !params || extra || shm || !gx || gz != 1 || bx != 256 || by != 1 || bz != 1)
		return 1;
	const struct scatter_args *a = params[0];
	if (!a->n || a->n > 64 || gy != a->n)
		return 1;
	for (unsigned i = 0; i < a->n; i++) {
		const struct scatter_piece *p = &a->p[i];
		if (!p->len || check((uintptr_t)p->dst, p->len, DEVMEM))
			return 700; /* CUDA_ERROR_ILLEGAL_ADDRESS */
		if (!(p->src >= MAPPED && !check((uintptr_t)(p->src - MAPPED), p->len, HOSTMEM)) &&
		    check((uintptr_t)p->src, p->len, DEVMEM))
			return 700;
	}
	for (unsigned i = 0; i < a->n; i++) {
		const struct scatter_piece *p = &a->p[i];
		uintptr_t src = (uintptr_t)(p->src >= MAPPED ? p->src - MAPPED : p->src);
		memcpy((void *)(uintptr_t)p->dst, (const void *)src, p->len);
		__atomic_add_fetch(&async_bytes, (long long)p->len, __ATOMIC_SEQ_CST);
	}
	__atomic_add_fetch(&launch_pieces, (int)a->n, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&launches, 1, __ATOMIC_SEQ_CST);
	return 0;
}
#endif
