/* The pinned copy ring (gpu/ring.h). */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gpu/ring.h"
#include "gpu/shim.h"

struct ferry__ring_gpu {
	int dev;
	unsigned flags;
	ferry__CUstream stream;
	ferry__CUevent *ev;
	unsigned nev;
};

/* The driver API with dev current on this thread, or NULL with the failure in *err. */
static const struct ferry__cuda_api *device_err(int dev, int *err)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	*err = cu ? ferry__cuda_set_device(dev) : ferry__cuda_require();
	return *err ? NULL : cu;
}

/* In functions that return an int: `USE(dev);` leaves cu set, or returns the failure. */
#define USE(dev)                                                                \
	int use_err_;                                                           \
	const struct ferry__cuda_api *cu = device_err((dev), &use_err_);        \
	if (!cu)                                                                \
		return use_err_

/* The CUDA error a call returned, as ferry's code. */
#define CU_CALL(r, ...) ((r) == FERRY__CUDA_SUCCESS ? 0 : ferry__cuda_fail((r), __VA_ARGS__))

int ferry__ring_reserve(struct ferry__ring_gpu *r, unsigned n)
{
	if (n <= r->nev)
		return 0;
	USE(r->dev);
	ferry__CUevent *ev = realloc(r->ev, n * sizeof(*ev));
	if (!ev)
		return ferry__error(-ENOMEM, "copy ring: %u events", n);
	r->ev = ev;
	/* spin: no BLOCKING_SYNC, so a synchronize polls; else the waiting thread sleeps */
	unsigned flags = FERRY__CU_EVENT_DISABLE_TIMING | (r->flags & FERRY__RING_SPIN ? 0 : FERRY__CU_EVENT_BLOCKING_SYNC);
	while (r->nev < n) {
		ferry__CUresult e = cu->EventCreate(&r->ev[r->nev], flags);
		if (e)
			return ferry__cuda_fail(e, "cuEventCreate on device %d", r->dev);
		r->nev++;
	}
	return 0;
}

int ferry__ring_create(int dev, unsigned ntickets, unsigned flags, struct ferry__ring_gpu **out)
{
	struct ferry__ring_gpu *r;
	int err;

	*out = NULL;
	USE(dev);
	if (!(r = calloc(1, sizeof(*r))))
		return ferry__error(-ENOMEM, "copy ring");
	r->dev = dev;
	r->flags = flags;
	ferry__CUresult e = cu->StreamCreate(&r->stream, FERRY__CU_STREAM_NON_BLOCKING);
	if (e) {
		free(r);
		return ferry__cuda_fail(e, "cuStreamCreate on device %d", dev);
	}
	if ((err = ferry__ring_reserve(r, ntickets ? ntickets : 1))) {
		ferry__ring_destroy(r);
		return err;
	}
	*out = r;
	return 0;
}

void ferry__ring_destroy(struct ferry__ring_gpu *r)
{
	int err;
	const struct ferry__cuda_api *cu;
	if (!r)
		return;
	if ((cu = device_err(r->dev, &err))) {
		/* the stream's copies may still write into memory the caller frees next */
		cu->StreamSynchronize(r->stream);
		for (unsigned i = 0; i < r->nev; i++)
			cu->EventDestroy(r->ev[i]);
		cu->StreamDestroy(r->stream);
	}
	free(r->ev);
	free(r);
}

void *ferry__ring_stream(const struct ferry__ring_gpu *r)
{
	return r->stream;
}

int ferry__ring_h2d(struct ferry__ring_gpu *r, uint64_t dst, const void *src, size_t n, bool pinned)
{
	USE(r->dev);
	if (!pinned)
		return CU_CALL(cu->MemcpyHtoD((ferry__CUdeviceptr)dst, src, n), "cuMemcpyHtoD of %zu bytes", n);
	return CU_CALL(cu->MemcpyHtoDAsync((ferry__CUdeviceptr)dst, src, n, r->stream),
		       "cuMemcpyHtoDAsync of %zu bytes", n);
}

#define GATHER_STACK 64 /* copies described on the stack; more go in several batch calls */

/* Set once a driver refused a batch copy: every gather copies run by run from then on. */
static atomic_bool batch_refused;

bool ferry__ring_can_batch(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	return cu && (cu->MemcpyBatchAsync_v2 || cu->MemcpyBatchAsync) && !atomic_load(&batch_refused);
}

static int copy_each(const struct ferry__cuda_api *cu, struct ferry__ring_gpu *r, ferry__CUdeviceptr *dsts,
		     ferry__CUdeviceptr *srcs, size_t *sizes, size_t k)
{
	int err = 0;
	for (size_t i = 0; i < k && !err; i++)
		err = CU_CALL(cu->MemcpyHtoDAsync(dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i], r->stream),
			      "cuMemcpyHtoDAsync of %zu bytes", sizes[i]);
	return err;
}

/* k copies in one call: cuMemcpyBatchAsync when there are several and the driver has it. */
static int gather_flush(const struct ferry__cuda_api *cu, struct ferry__ring_gpu *r, ferry__CUdeviceptr *dsts,
			ferry__CUdeviceptr *srcs, size_t *sizes, size_t k)
{
	if (k == 1 || !ferry__ring_can_batch())
		return copy_each(cu, r, dsts, srcs, sizes, k);
	/* every copy reads its source in stream order: slots are reused only after the ticket that
	 * follows the copies */
	ferry__CUmemcpyAttributes attr;
	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = FERRY__CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	attr.srcLocHint.type = FERRY__CU_MEM_LOCATION_TYPE_HOST;
	attr.dstLocHint.type = FERRY__CU_MEM_LOCATION_TYPE_DEVICE;
	attr.dstLocHint.id = r->dev;
	size_t idx = 0, fail = 0;
	ferry__CUresult e = cu->MemcpyBatchAsync_v2
		? cu->MemcpyBatchAsync_v2(dsts, srcs, sizes, k, &attr, &idx, 1, r->stream)
		: cu->MemcpyBatchAsync(dsts, srcs, sizes, k, &attr, &idx, 1, &fail, r->stream);
	if (e == FERRY__CUDA_ERROR_INVALID_VALUE || e == FERRY__CUDA_ERROR_NOT_SUPPORTED) {
		/* declined: the plain calls. If they take the same copies, the batch call is what
		 * this driver refuses, and gathers go without it from now on; if not, a copy itself
		 * was wrong and its call's failure is the error. */
		int err = copy_each(cu, r, dsts, srcs, sizes, k);
		if (!err && !atomic_exchange(&batch_refused, true))
			FERRY__LOG(FERRY__LOG_WARN, "cuMemcpyBatchAsync refused %zu host-to-device copies (%s) that "
				   "cuMemcpyHtoDAsync took: small copies go one call per run from now on", k,
				   ferry__cuda_err_name(e));
		return err;
	}
	return CU_CALL(e, "cuMemcpyBatchAsync of %zu copies", k);
}

int ferry__ring_h2d_gather(struct ferry__ring_gpu *r, const struct ferry__ring_piece *p, size_t n,
			   unsigned *calls)
{
	ferry__CUdeviceptr dsts[GATHER_STACK], srcs[GATHER_STACK];
	size_t sizes[GATHER_STACK], k = 0, i = 0;
	unsigned made = 0;
	int err = 0;

	if (calls)
		*calls = 0;
	USE(r->dev);
	size_t per_call = ferry__ring_can_batch() ? GATHER_STACK : 1;
	while (!err) {
		while (i < n && !p[i].len)
			i++;
		if (i == n)
			break;
		/* a run: the pieces whose source and destination follow on from the previous one's */
		uint64_t dst = p[i].dst;
		const char *src = p[i].src;
		size_t len = p[i].len;
		for (i++; i < n && (!p[i].len || (p[i].dst == dst + len && (const char *)p[i].src == src + len)); i++)
			len += p[i].len;
		dsts[k] = (ferry__CUdeviceptr)dst;
		srcs[k] = (ferry__CUdeviceptr)(uintptr_t)src;
		sizes[k++] = len;
		if (k == per_call) {
			made++;
			err = gather_flush(cu, r, dsts, srcs, sizes, k);
			k = 0;
		}
	}
	if (k && !err) {
		made++;
		err = gather_flush(cu, r, dsts, srcs, sizes, k);
	}
	if (calls)
		*calls = made;
	return err;
}

int ferry__ring_d2h(struct ferry__ring_gpu *r, void *dst, uint64_t src, size_t n, bool pinned)
{
	USE(r->dev);
	if (!pinned)
		return CU_CALL(cu->MemcpyDtoH(dst, (ferry__CUdeviceptr)src, n), "cuMemcpyDtoH of %zu bytes", n);
	return CU_CALL(cu->MemcpyDtoHAsync(dst, (ferry__CUdeviceptr)src, n, r->stream),
		       "cuMemcpyDtoHAsync of %zu bytes", n);
}

static int record_on(struct ferry__ring_gpu *r, unsigned t, ferry__CUstream s)
{
	USE(r->dev);
	if (t >= r->nev)
		return ferry__error(-EINVAL, "copy ring: ticket %u of %u", t, r->nev);
	return CU_CALL(cu->EventRecord(r->ev[t], s), "cuEventRecord");
}

int ferry__ring_record(struct ferry__ring_gpu *r, unsigned t)
{
	return record_on(r, t, r->stream);
}

int ferry__ring_record_on(struct ferry__ring_gpu *r, unsigned t, const struct ferry__ring_gpu *on)
{
	return record_on(r, t, on->stream);
}

static int event_state(ferry__CUresult e)
{
	if (e == FERRY__CUDA_ERROR_NOT_READY)
		return 0;
	return e ? ferry__cuda_fail(e, "a copy on the GPU") : 1;
}

int ferry__ring_query(struct ferry__ring_gpu *r, unsigned t)
{
	USE(r->dev);
	return event_state(cu->EventQuery(r->ev[t]));
}

int ferry__ring_sync(struct ferry__ring_gpu *r, unsigned t)
{
	USE(r->dev);
	int err = CU_CALL(cu->EventSynchronize(r->ev[t]), "a copy on the GPU");
	return err ? err : 1;
}

int ferry__ring_drain(struct ferry__ring_gpu *r)
{
	USE(r->dev);
	return CU_CALL(cu->StreamSynchronize(r->stream), "cuStreamSynchronize");
}

/* ----------------------------------------------------------------------------------- fences */

struct fence {
	int dev;
	ferry__CUevent ev;
};

int ferry__fence_create(int dev, void **out)
{
	struct fence *f;
	*out = NULL;
	USE(dev);
	if (!(f = calloc(1, sizeof(*f))))
		return ferry__error(-ENOMEM, "fence");
	f->dev = dev;
	ferry__CUresult e = cu->EventCreate(&f->ev, FERRY__CU_EVENT_DISABLE_TIMING);
	if (e) {
		free(f);
		return ferry__cuda_fail(e, "cuEventCreate on device %d", dev);
	}
	*out = f;
	return 0;
}

void ferry__fence_destroy(void *fence)
{
	struct fence *f = fence;
	const struct ferry__cuda_api *cu;
	int err;
	if (!f)
		return;
	if ((cu = device_err(f->dev, &err))) {
		cu->EventSynchronize(f->ev);
		cu->EventDestroy(f->ev);
	}
	free(f);
}

int ferry__fence_record(void *fence, void *stream)
{
	struct fence *f = fence;
	USE(f->dev);
	return CU_CALL(cu->EventRecord(f->ev, (ferry__CUstream)stream), "cuEventRecord on stream %p", stream);
}

int ferry__fence_query(void *fence)
{
	struct fence *f = fence;
	USE(f->dev);
	return event_state(cu->EventQuery(f->ev));
}

int ferry__fence_sync(void *fence)
{
	struct fence *f = fence;
	USE(f->dev);
	int err = CU_CALL(cu->EventSynchronize(f->ev), "waiting for a fence");
	return err ? err : 1;
}

int ferry__ring_after(struct ferry__ring_gpu *r, void *fence)
{
	USE(r->dev);
	return CU_CALL(cu->StreamWaitEvent(r->stream, ((struct fence *)fence)->ev, 0), "cuStreamWaitEvent");
}

/* ---------------------------------------------------------------------------- device memory */

int ferry__gpu_alloc(int dev, size_t n, uint64_t *out)
{
	ferry__CUdeviceptr p = 0;
	USE(dev);
	ferry__CUresult e = cu->MemAlloc(&p, n);
	if (e)
		return ferry__cuda_fail(e, "cuMemAlloc of %zu bytes on device %d", n, dev);
	*out = (uint64_t)p;
	return 0;
}

void ferry__gpu_release(int dev, uint64_t ptr)
{
	int err;
	const struct ferry__cuda_api *cu = device_err(dev, &err);
	if (cu && ptr)
		cu->MemFree((ferry__CUdeviceptr)ptr);
}

bool ferry__gpu_in_use(int dev)
{
	/* the library ferry__cuda() would load, asked for only if the process has it already: a
	 * context that never meets a GPU must not pay the driver's load (cuInit: tens of ms) */
	const char *lib = getenv("FERRY_CUDA_LIBRARY");
	void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return false;
	dlclose(h);
	const struct ferry__cuda_api *cu = ferry__cuda();
	unsigned flags = 0;
	int active = 0;
	return cu && cu->DevicePrimaryCtxGetState && dev >= 0 && dev < cu->device_count &&
	       cu->DevicePrimaryCtxGetState(dev, &flags, &active) == FERRY__CUDA_SUCCESS && active;
}

int ferry__gpu_enter(int dev, void **prev)
{
	return ferry__cuda_enter_device(dev, (ferry__CUcontext *)prev);
}

void ferry__gpu_leave(void *prev)
{
	ferry__cuda_leave_device((ferry__CUcontext)prev);
}
