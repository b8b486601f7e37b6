/* ferry's kernels: their module per device, loaded in the background, and their launches
 * (gpu/scatter.h): the scatter kernel and the LZ4 walk. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"

/* the PTX declares the argument as .b8 ferry_scatter_param_0[1544]: the fake driver and the GPU
 * test check the text against this size */
_Static_assert(sizeof(struct ferry__scatter_args) == 8 + 24 * FERRY__SCATTER_MAX,
	       "struct ferry__scatter_args must match struct ferry_scatter_args in scatter.cu");

#define MAX_DEVICES 64
#define THREADS 256             /* the kernel's __launch_bounds__ */
#define BYTES_PER_BLOCK (16u << 10) /* a block's share of a piece: 256 threads x 16 B x 4 loads */
#define MAX_BLOCKS 16           /* per piece: a 256 KiB piece (the gather's largest) in one pass */

enum { S_UNLOADED, S_LOADING, S_READY, S_NONE, S_OFF };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t launched_pieces;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct {
	_Atomic int state;
	ferry__CUfunction fn;
	ferry__CUfunction walk; /* set with fn, never cleared: a refused scatter launch leaves it */
	char why[320];
} mods[MAX_DEVICES];

static bool turned_off(void)
{
	const char *e = getenv("FERRY_SCATTER");
	return e && (!strcmp(e, "0") || !strcmp(e, "off"));
}

static void publish(int dev, int state, ferry__CUfunction fn, ferry__CUfunction walk, const char *why)
{
	pthread_mutex_lock(&mu);
	mods[dev].fn = fn;
	mods[dev].walk = walk;
	snprintf(mods[dev].why, sizeof(mods[dev].why), "%s", why);
	atomic_store_explicit(&mods[dev].state, state, memory_order_release);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void load(int dev)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUmodule m = NULL;
	ferry__CUfunction fn = NULL, walk = NULL;
	ferry__CUresult r;
	char why[320] = "";
	uint64_t t0 = ferry__now_ns();

	if (turned_off()) {
		publish(dev, S_OFF, NULL, NULL, "turned off by FERRY_SCATTER=0");
		return;
	}
	if (!cu) {
		snprintf(why, sizeof(why), "%s", ferry__cuda_unavailable_reason());
	} else if (!cu->ModuleLoadData || !cu->ModuleGetFunction || !cu->LaunchKernel) {
		snprintf(why, sizeof(why), "libcuda.so.1 lacks cuModuleLoadData, cuModuleGetFunction or cuLaunchKernel");
	} else if (!cu->MemHostGetDevicePointer) {
		snprintf(why, sizeof(why), "libcuda.so.1 lacks cuMemHostGetDevicePointer");
	} else if (ferry__cuda_set_device(dev) != 0) {
		snprintf(why, sizeof(why), "device %d: %s", dev, ferry_last_error());
	} else if ((r = cu->ModuleLoadData(&m, ferry__scatter_ptx)) != FERRY__CUDA_SUCCESS) {
		snprintf(why, sizeof(why), "cuModuleLoadData of the scatter kernel's PTX on device %d: %s (%d)", dev,
			 ferry__cuda_err_name(r), (int)r);
	} else if ((r = cu->ModuleGetFunction(&fn, m, FERRY__SCATTER_ENTRY)) != FERRY__CUDA_SUCCESS) {
		snprintf(why, sizeof(why), "cuModuleGetFunction(%s) on device %d: %s (%d)", FERRY__SCATTER_ENTRY, dev,
			 ferry__cuda_err_name(r), (int)r);
		fn = NULL;
	} else if ((r = cu->ModuleGetFunction(&walk, m, FERRY__LZ4_WALK_ENTRY)) != FERRY__CUDA_SUCCESS) {
		snprintf(why, sizeof(why), "cuModuleGetFunction(%s) on device %d: %s (%d)", FERRY__LZ4_WALK_ENTRY, dev,
			 ferry__cuda_err_name(r), (int)r);
		fn = NULL, walk = NULL;
	}
	/* the module stays loaded for the process, like the primary context it lives in */
	if (fn)
		FERRY__LOG(FERRY__LOG_INFO, "ferry's kernels loaded on device %d in %.1f ms", dev,
			   (double)(ferry__now_ns() - t0) / 1e6);
	else
		FERRY__LOG(FERRY__LOG_INFO, "ferry's kernels unavailable on device %d: %s; gathers copy "
			   "piece by piece, LZ4 blocks for nvCOMP are walked on the host", dev, why);
	publish(dev, fn ? S_READY : S_NONE, fn, walk, why);
}

static void *load_thread(void *arg)
{
	load((int)(intptr_t)arg);
	return NULL;
}

void ferry__scatter_prepare(int dev)
{
	int expect = S_UNLOADED;
	pthread_attr_t attr;
	pthread_t t;

	if (dev < 0 || dev >= MAX_DEVICES ||
	    atomic_load_explicit(&mods[dev].state, memory_order_acquire) != S_UNLOADED ||
	    !atomic_compare_exchange_strong(&mods[dev].state, &expect, S_LOADING))
		return;
	/* the driver's JIT takes tens of milliseconds: not on the thread of the request that asked */
	if (pthread_attr_init(&attr) == 0) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		int err = pthread_create(&t, &attr, load_thread, (void *)(intptr_t)dev);
		pthread_attr_destroy(&attr);
		if (err == 0)
			return;
	}
	load(dev);
}

int ferry__scatter_state(int dev, bool wait)
{
	if (dev < 0 || dev >= MAX_DEVICES)
		return FERRY__SCATTER_NONE;
	int s = atomic_load_explicit(&mods[dev].state, memory_order_acquire);
	if (wait && (s == S_UNLOADED || s == S_LOADING)) {
		ferry__scatter_prepare(dev);
		pthread_mutex_lock(&mu);
		while ((s = atomic_load_explicit(&mods[dev].state, memory_order_acquire)) == S_LOADING)
			pthread_cond_wait(&cv, &mu);
		pthread_mutex_unlock(&mu);
	}
	switch (s) {
	case S_READY:
		return FERRY__SCATTER_READY;
	case S_OFF:
		return FERRY__SCATTER_OFF;
	case S_NONE:
		return FERRY__SCATTER_NONE;
	default:
		return FERRY__SCATTER_LOADING;
	}
}

const char *ferry__scatter_reason(int dev)
{
	if (dev < 0 || dev >= MAX_DEVICES)
		return "no such device";
	int s = atomic_load_explicit(&mods[dev].state, memory_order_acquire);
	return s == S_NONE || s == S_OFF ? mods[dev].why : "";
}

/* Once: workers that meet a refusal together leave the first reason (read without the lock by
 * ferry__scatter_reason once the state says NONE) and the function (read by launches) as they are. */
void ferry__scatter_refuse(int dev, const char *why)
{
	if (dev < 0 || dev >= MAX_DEVICES)
		return;
	pthread_mutex_lock(&mu);
	bool first = atomic_load_explicit(&mods[dev].state, memory_order_relaxed) == S_READY;
	if (first) {
		snprintf(mods[dev].why, sizeof(mods[dev].why), "%s", why);
		atomic_store_explicit(&mods[dev].state, S_NONE, memory_order_release);
	}
	pthread_mutex_unlock(&mu);
	if (first)
		FERRY__LOG(FERRY__LOG_WARN, "scatter kernel refused on device %d: %s; gathers copy piece by "
			   "piece from now on", dev, why);
}

int ferry__scatter_launch(int dev, void *stream, const struct ferry__scatter_piece *p, size_t n,
			  unsigned *launches)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct ferry__scatter_args a;
	unsigned made = 0;
	int err;

	if (launches)
		*launches = 0;
	if (dev < 0 || dev >= MAX_DEVICES || atomic_load_explicit(&mods[dev].state, memory_order_acquire) != S_READY)
		return ferry__error(-EINVAL, "the scatter kernel is not loaded on device %d", dev);
	if ((err = ferry__cuda_set_device(dev)) != 0)
		return err;
	ferry__CUfunction fn = mods[dev].fn;
	size_t i = 0;
	while (i < n) {
		uint64_t longest = 0;
		a.n = 0;
		a.pad = 0;
		for (; i < n && a.n < FERRY__SCATTER_MAX; i++) {
			if (!p[i].len)
				continue;
			a.p[a.n++] = p[i];
			if (p[i].len > longest)
				longest = p[i].len;
		}
		if (!a.n)
			break;
		uint64_t blocks = (longest + BYTES_PER_BLOCK - 1) / BYTES_PER_BLOCK;
		unsigned gx = blocks > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)blocks;
		void *params[] = {&a};
		ferry__CUresult r = cu->LaunchKernel(fn, gx, a.n, 1, THREADS, 1, 1, 0, (ferry__CUstream)stream,
						     params, NULL);
		if (r != FERRY__CUDA_SUCCESS) {
			if (launches)
				*launches = made;
			return ferry__cuda_fail(r, "cuLaunchKernel(%s, %u pieces) on device %d", FERRY__SCATTER_ENTRY,
						a.n, dev);
		}
		made++;
		atomic_fetch_add_explicit(&launched_pieces, a.n, memory_order_relaxed);
	}
	if (launches)
		*launches = made;
	return 0;
}

uint64_t ferry__scatter_pieces(void)
{
	return atomic_load_explicit(&launched_pieces, memory_order_relaxed);
}

int ferry__scatter_host_ptr(int dev, void *host, uint64_t *out)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUdeviceptr d = 0;
	int err;

	*out = 0;
	if (!cu)
		return ferry__cuda_require();
	if (!cu->MemHostGetDevicePointer)
		return ferry__error(-ENOTSUP, "libcuda.so.1 lacks cuMemHostGetDevicePointer");
	if ((err = ferry__cuda_set_device(dev)) != 0)
		return err;
	ferry__CUresult r = cu->MemHostGetDevicePointer(&d, host, 0);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuMemHostGetDevicePointer(%p) on device %d", host, dev);
	*out = (uint64_t)d;
	return 0;
}

/* The walk's function on dev once the module's load is over (waiting for it), or NULL. */
static ferry__CUfunction walk_fn(int dev)
{
	if (dev < 0 || dev >= MAX_DEVICES)
		return NULL;
	(void)ferry__scatter_state(dev, true);
	pthread_mutex_lock(&mu);
	ferry__CUfunction fn = mods[dev].walk;
	pthread_mutex_unlock(&mu);
	return fn;
}

bool ferry__lz4_walk_ready(int dev)
{
	return walk_fn(dev) != NULL;
}

int ferry__lz4_walk_launch(int dev, void *stream, uint64_t n, uint64_t src, uint64_t len, uint64_t cap,
			   uint64_t verdict, uint64_t dummy)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	enum { WALK_WARPS = 4 }; /* chunks a block: a warp each (the kernel's __launch_bounds__ / 32) */
	ferry__CUfunction fn = walk_fn(dev);
	if (!fn)
		return ferry__error(-ENOTSUP, "the LZ4 walk kernel is not loaded on device %d: %s", dev,
				    ferry__scatter_reason(dev));
	if (!n)
		return 0;
	void *params[] = {&n, &src, &len, &cap, &verdict, &dummy};
	uint64_t blocks = (n + WALK_WARPS - 1) / WALK_WARPS;
	ferry__CUresult r = cu->LaunchKernel(fn, (unsigned)blocks, 1, 1, 32 * WALK_WARPS, 1, 1, 0,
					     (ferry__CUstream)stream, params, NULL);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuLaunchKernel(%s, %llu chunks) on device %d", FERRY__LZ4_WALK_ENTRY,
					(unsigned long long)n, dev);
	return 0;
}
