/* The public GPU API (include/ferry/gpu.h) and memory kinds. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "ferry/gpu.h"
#include "gpu/shim.h"

_Static_assert((int)FERRY_MEM_HOST == FERRY__MEM_HOST && (int)FERRY_MEM_PINNED == FERRY__MEM_PINNED &&
		       (int)FERRY_MEM_DEVICE == FERRY__MEM_DEVICE &&
		       (int)FERRY_MEM_MANAGED == FERRY__MEM_MANAGED,
	       "public and internal memory kinds agree");
_Static_assert((int)FERRY_GDS_REFUSED == FERRY__GDS_REFUSED && (int)FERRY_GDS_NATIVE == FERRY__GDS_NATIVE &&
		       (int)FERRY_GDS_COMPAT == FERRY__GDS_COMPAT,
	       "public and internal GDS states agree");

static ferry__CUdeviceptr dptr(const void *p)
{
	return (ferry__CUdeviceptr)(uintptr_t)p;
}

int ferry__mem_kind(const void *ptr, int *device)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	unsigned int type = 0, managed = 0;
	int ordinal = -1, kind = FERRY__MEM_HOST;

	if (device)
		*device = -1;
	if (!cu || !ptr)
		return FERRY__MEM_HOST;
	if (cu->PointerGetAttributes) {
		/* One call; an address CUDA does not know comes back as memory type 0, not an error. */
		ferry__CUpointer_attribute attrs[3] = { FERRY__CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
							FERRY__CU_POINTER_ATTRIBUTE_IS_MANAGED,
							FERRY__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL };
		void *data[3] = { &type, &managed, &ordinal };
		if (cu->PointerGetAttributes(3, attrs, data, dptr(ptr)) != FERRY__CUDA_SUCCESS)
			return FERRY__MEM_HOST;
	} else {
		/* CUDA_ERROR_INVALID_VALUE here means plain host memory CUDA never saw. */
		if (cu->PointerGetAttribute(&type, FERRY__CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr(ptr)) !=
		    FERRY__CUDA_SUCCESS)
			return FERRY__MEM_HOST;
		if (cu->PointerGetAttribute(&managed, FERRY__CU_POINTER_ATTRIBUTE_IS_MANAGED, dptr(ptr)) !=
		    FERRY__CUDA_SUCCESS)
			managed = 0;
		if (cu->PointerGetAttribute(&ordinal, FERRY__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr(ptr)) !=
		    FERRY__CUDA_SUCCESS)
			ordinal = -1;
	}
	if (managed)
		kind = FERRY__MEM_MANAGED;
	else if (type == FERRY__CU_MEMORYTYPE_HOST)
		kind = FERRY__MEM_PINNED;
	else if (type == FERRY__CU_MEMORYTYPE_DEVICE || type == FERRY__CU_MEMORYTYPE_UNIFIED)
		kind = FERRY__MEM_DEVICE;
	else
		return FERRY__MEM_HOST;
	if (device)
		*device = ordinal >= 0 && ordinal < cu->device_count ? ordinal : -1;
	return kind;
}

enum ferry_mem_kind ferry_mem_kind(const void *ptr, int *device)
{
	return ferry__mem_kind(ptr, device);
}

int ferry_gpu_available(char *why, size_t len)
{
	int ok = ferry__cuda() != NULL;

	if (why && len)
		snprintf(why, len, "%s", ok ? "" : ferry__cuda_unavailable_reason());
	return ok;
}

int ferry_gpu_count(void)
{
	int err = ferry__cuda_require();

	return err ? err : ferry__cuda()->device_count;
}

int ferry_gpu_name(int dev, char *buf, size_t len)
{
	const struct ferry__cuda_api *cu;
	ferry__CUdevice d;
	ferry__CUresult r;
	int err = ferry__cuda_require();

	if (err)
		return err;
	cu = ferry__cuda();
	if (!buf || len == 0)
		return ferry__error(-EINVAL, "ferry_gpu_name: no buffer");
	if (dev < 0 || dev >= cu->device_count)
		return ferry__error(-EINVAL, "CUDA device %d does not exist (%d visible)", dev,
				    cu->device_count);
	r = cu->DeviceGet(&d, dev);
	if (r == FERRY__CUDA_SUCCESS)
		r = cu->DeviceGetName(buf, len > INT_MAX ? INT_MAX : (int)len, d);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuDeviceGetName(device %d)", dev);
	buf[len - 1] = '\0';
	return (int)strlen(buf);
}

int ferry_gpu_malloc(int dev, size_t len, void **out)
{
	ferry__CUdeviceptr p = 0;
	ferry__CUresult r;
	int err = ferry__cuda_require();

	if (err)
		return err;
	if (!out || len == 0)
		return ferry__error(-EINVAL, "ferry_gpu_malloc(device %d, %zu bytes): nothing to allocate",
				    dev, len);
	err = ferry__cuda_set_device(dev);
	if (err)
		return err;
	r = ferry__cuda()->MemAlloc(&p, len);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuMemAlloc(%zu bytes) on device %d", len, dev);
	*out = (void *)(uintptr_t)p;
	return 0;
}

/* Makes the context owning device pointer p current; -EINVAL if p is not device memory. */
static int enter_device_of(const void *p, const char *call)
{
	int dev, kind = ferry__mem_kind(p, &dev);

	if ((kind != FERRY__MEM_DEVICE && kind != FERRY__MEM_MANAGED) || dev < 0)
		return ferry__error(-EINVAL, "%s: %p is not CUDA device memory", call, p);
	return ferry__cuda_set_device(dev);
}

int ferry_gpu_free(void *dev_ptr)
{
	ferry__CUresult r;
	int err = ferry__cuda_require();

	if (err || !dev_ptr)
		return err;
	err = enter_device_of(dev_ptr, "ferry_gpu_free");
	if (err)
		return err;
	r = ferry__cuda()->MemFree(dptr(dev_ptr));
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuMemFree(%p)", dev_ptr);
	return 0;
}

int ferry_gpu_memcpy_htod(void *dst_dev, const void *src_host, size_t len)
{
	ferry__CUresult r;
	int err = ferry__cuda_require();

	if (err || len == 0)
		return err;
	err = enter_device_of(dst_dev, "ferry_gpu_memcpy_htod");
	if (err)
		return err;
	r = ferry__cuda()->MemcpyHtoD(dptr(dst_dev), src_host, len);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuMemcpyHtoD(%p, %zu bytes)", dst_dev, len);
	return 0;
}

int ferry_gpu_memcpy_dtoh(void *dst_host, const void *src_dev, size_t len)
{
	ferry__CUresult r;
	int err = ferry__cuda_require();

	if (err || len == 0)
		return err;
	err = enter_device_of(src_dev, "ferry_gpu_memcpy_dtoh");
	if (err)
		return err;
	r = ferry__cuda()->MemcpyDtoH(dst_host, dptr(src_dev), len);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuMemcpyDtoH(%p, %zu bytes)", src_dev, len);
	return 0;
}

int ferry_gds_status(const char *path, char *why, size_t len)
{
	char buf[512];
	int fd, state, err = ferry__cuda_require();

	if (err) {
		if (why && len)
			snprintf(why, len, "%s", ferry__cuda_unavailable_reason());
		return err;
	}
	if (!why || !len) {
		why = buf;
		len = sizeof(buf);
	}
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0 && errno == EINVAL) {
		snprintf(why, len, "%s: the file system refuses O_DIRECT, which GPUDirect Storage needs",
			 path);
		return FERRY__GDS_REFUSED;
	}
	if (fd < 0) {
		err = -errno;
		snprintf(why, len, "open(%s, O_DIRECT): %s", path, strerror(-err));
		return ferry__error(err, "ferry_gds_status: open(%s, O_DIRECT)", path);
	}
	state = ferry__gds_probe_fd(fd, why, len);
	close(fd);
	return state;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int ferry_gpu_copy_ceiling(int dev, size_t bytes, unsigned reps, double *htod, double *dtoh)
{
	const struct ferry__cuda_api *cu;
	ferry__CUcontext prev = NULL;
	ferry__CUdeviceptr d = 0;
	void *h = NULL;
	double *t;
	ferry__CUresult r = FERRY__CUDA_SUCCESS;
	int err = ferry__cuda_require();

	if (err)
		return err;
	if (!bytes || !reps || reps > 1000 || !htod || !dtoh)
		return ferry__error(-EINVAL, "ferry_gpu_copy_ceiling: %zu bytes, %u repetitions", bytes, reps);
	cu = ferry__cuda();
	if ((err = ferry__cuda_enter_device(dev, &prev)))
		return err;
	t = calloc(2 * (size_t)reps, sizeof(*t));
	if (!t) {
		ferry__cuda_leave_device(prev);
		return ferry__error(-ENOMEM, "ferry_gpu_copy_ceiling");
	}
	if ((r = cu->MemHostAlloc(&h, bytes, FERRY__CU_MEMHOSTALLOC_PORTABLE)) ||
	    (r = cu->MemAlloc(&d, bytes))) {
		err = ferry__cuda_fail(r, "ferry_gpu_copy_ceiling: allocating 2 x %zu bytes on device %d", bytes, dev);
		goto out;
	}
	memset(h, 0x5a, bytes);
	/* the first copy of each direction warms the path and is not counted */
	for (unsigned i = 0; i <= reps && !r; i++) {
		uint64_t a = ferry__now_ns();
		if ((r = cu->MemcpyHtoD(d, h, bytes)))
			break;
		uint64_t b = ferry__now_ns();
		if ((r = cu->MemcpyDtoH(h, d, bytes)))
			break;
		uint64_t c = ferry__now_ns();
		if (i) {
			t[i - 1] = (double)bytes / ((double)(b - a) / 1e9);
			t[reps + i - 1] = (double)bytes / ((double)(c - b) / 1e9);
		}
	}
	if (r) {
		err = ferry__cuda_fail(r, "ferry_gpu_copy_ceiling: copying %zu bytes on device %d", bytes, dev);
		goto out;
	}
	qsort(t, reps, sizeof(*t), cmp_double);
	qsort(t + reps, reps, sizeof(*t), cmp_double);
	*htod = t[reps / 2];
	*dtoh = t[reps + reps / 2];
out:
	if (d)
		cu->MemFree(d);
	if (h)
		cu->MemFreeHost(h);
	free(t);
	ferry__cuda_leave_device(prev);
	return err;
}

/* ferry_gpu_copy_ceiling_all: one thread per device, each copying between its own pinned buffer and
 * its device; a barrier starts every repetition on all of them at once and the time is taken from
 * the barrier to the last copy's end, so the figure is what the host's memory and PCIe links carry
 * together (one GPU's ceiling times n is what they would carry if nothing were shared). */
struct ceil_all {
	const int *devs;
	unsigned n, reps;
	size_t bytes;
	pthread_barrier_t bar;
	int err;              /* first failure, under mu, and its message */
	char msg[512];
	pthread_mutex_t mu;
	pthread_cond_t open;
	int gate;             /* 0 closed, 1 run, -1 leave (not every thread could start) */
	double *t;            /* [0, reps): htod, [reps, 2 reps): dtoh, bytes/s of all devices together */
};

struct ceil_thread {
	struct ceil_all *a;
	unsigned idx;
};

static void ceil_fail(struct ceil_all *a, int err)
{
	pthread_mutex_lock(&a->mu);
	if (!a->err) {
		a->err = err;
		/* the message is this thread's: the caller's thread gets a copy */
		snprintf(a->msg, sizeof(a->msg), "%s", ferry_last_error());
	}
	pthread_mutex_unlock(&a->mu);
}

static int ceil_failed(struct ceil_all *a)
{
	pthread_mutex_lock(&a->mu);
	int err = a->err;
	pthread_mutex_unlock(&a->mu);
	return err;
}

static void *ceil_main(void *arg)
{
	struct ceil_thread *th = arg;
	struct ceil_all *a = th->a;
	const struct ferry__cuda_api *cu = ferry__cuda();
	int dev = a->devs[th->idx];
	ferry__CUcontext prev = NULL;
	ferry__CUdeviceptr d = 0;
	ferry__CUresult r = FERRY__CUDA_SUCCESS;
	void *h = NULL;
	int err, entered;

	pthread_mutex_lock(&a->mu);
	while (!a->gate)
		pthread_cond_wait(&a->open, &a->mu);
	int gate = a->gate;
	pthread_mutex_unlock(&a->mu);
	if (gate < 0)
		return NULL;
	err = ferry__cuda_enter_device(dev, &prev);
	entered = !err;
	if (!err && ((r = cu->MemHostAlloc(&h, a->bytes, FERRY__CU_MEMHOSTALLOC_PORTABLE)) ||
		     (r = cu->MemAlloc(&d, a->bytes))))
		err = ferry__cuda_fail(r, "ferry_gpu_copy_ceiling_all: allocating 2 x %zu bytes on device %d",
				       a->bytes, dev);
	if (!err) {
		memset(h, 0x5a, a->bytes);
		/* the first copy of each direction warms the path and is not counted */
		if ((r = cu->MemcpyHtoD(d, h, a->bytes)) || (r = cu->MemcpyDtoH(h, d, a->bytes)))
			err = ferry__cuda_fail(r, "ferry_gpu_copy_ceiling_all: copying %zu bytes on device %d",
					       a->bytes, dev);
	}
	if (err)
		ceil_fail(a, err);
	pthread_barrier_wait(&a->bar);
	/* every thread reads the same answer after the barrier, so all leave together or none */
	for (unsigned i = 0; i < a->reps && !ceil_failed(a); i++) {
		uint64_t t0 = 0, t1 = 0, t2 = 0;
		pthread_barrier_wait(&a->bar);
		t0 = ferry__now_ns();
		if ((r = cu->MemcpyHtoD(d, h, a->bytes)))
			ceil_fail(a, ferry__cuda_fail(r, "ferry_gpu_copy_ceiling_all: copying %zu bytes to device %d",
						      a->bytes, dev));
		pthread_barrier_wait(&a->bar);
		t1 = ferry__now_ns();
		if (!r && (r = cu->MemcpyDtoH(h, d, a->bytes)))
			ceil_fail(a, ferry__cuda_fail(r, "ferry_gpu_copy_ceiling_all: copying %zu bytes from device %d",
						      a->bytes, dev));
		pthread_barrier_wait(&a->bar);
		t2 = ferry__now_ns();
		if (th->idx == 0) {
			double all = (double)a->bytes * a->n;
			a->t[i] = all / ((double)(t1 - t0 ? t1 - t0 : 1) / 1e9);
			a->t[a->reps + i] = all / ((double)(t2 - t1 ? t2 - t1 : 1) / 1e9);
		}
		pthread_barrier_wait(&a->bar); /* nobody reads the failure flag of the next round early */
	}
	if (d)
		cu->MemFree(d);
	if (h)
		cu->MemFreeHost(h);
	if (entered)
		ferry__cuda_leave_device(prev);
	return NULL;
}

int ferry_gpu_copy_ceiling_all(const int *devs, unsigned n, size_t bytes, unsigned reps, double *htod,
			       double *dtoh)
{
	struct ceil_all a = {.devs = devs, .n = n, .reps = reps, .bytes = bytes};
	struct ceil_thread *th;
	pthread_t *tid;
	unsigned started = 0;
	int err = ferry__cuda_require();

	if (err)
		return err;
	if (!devs || !n || n > 64 || !bytes || !reps || reps > 1000 || !htod || !dtoh)
		return ferry__error(-EINVAL, "ferry_gpu_copy_ceiling_all: %u devices, %zu bytes, %u repetitions",
				    n, bytes, reps);
	for (unsigned i = 0; i < n; i++) {
		if (devs[i] < 0 || devs[i] >= ferry__cuda()->device_count)
			return ferry__error(-EINVAL, "ferry_gpu_copy_ceiling_all: CUDA device %d does not exist "
					    "(%d visible)", devs[i], ferry__cuda()->device_count);
		for (unsigned k = 0; k < i; k++)
			if (devs[k] == devs[i])
				return ferry__error(-EINVAL, "ferry_gpu_copy_ceiling_all: device %d is listed twice",
						    devs[i]);
	}
	a.t = calloc(2 * (size_t)reps, sizeof(*a.t));
	th = calloc(n, sizeof(*th));
	tid = calloc(n, sizeof(*tid));
	if (!a.t || !th || !tid) {
		free(a.t);
		free(th);
		free(tid);
		return ferry__error(-ENOMEM, "ferry_gpu_copy_ceiling_all");
	}
	pthread_mutex_init(&a.mu, NULL);
	pthread_cond_init(&a.open, NULL);
	pthread_barrier_init(&a.bar, NULL, n);
	for (; started < n; started++) {
		th[started] = (struct ceil_thread){&a, started};
		if (pthread_create(&tid[started], NULL, ceil_main, &th[started]))
			break;
	}
	/* the threads wait at the gate until all exist: the barrier counts n of them */
	pthread_mutex_lock(&a.mu);
	a.gate = started < n ? -1 : 1;
	pthread_cond_broadcast(&a.open);
	pthread_mutex_unlock(&a.mu);
	if (started < n)
		err = ferry__error(-EAGAIN, "ferry_gpu_copy_ceiling_all: cannot start thread %u of %u", started, n);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	pthread_barrier_destroy(&a.bar);
	if (!err && a.err)
		err = ferry__error_raise(a.err, a.msg);
	else if (!err) {
		qsort(a.t, reps, sizeof(*a.t), cmp_double);
		qsort(a.t + reps, reps, sizeof(*a.t), cmp_double);
		*htod = a.t[reps / 2];
		*dtoh = a.t[reps + reps / 2];
	}
	pthread_cond_destroy(&a.open);
	pthread_mutex_destroy(&a.mu);
	free(a.t);
	free(th);
	free(tid);
	return err;
}
