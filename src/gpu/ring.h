/*
 * The pinned copy ring: the one way bytes move between host memory and a GPU inside ferry (the
 * engine's bounce path and copy units, the checkpoint writer, the loader). DESIGN.md decision 4.
 *
 * A ring is one CUDA stream on one device and a set of tickets: one event per place its user tracks
 * (a chunk, a slot, a batch), numbered 0..n-1. Copies queued on the ring run in order on its stream;
 * host memory that is not pinned is copied synchronously instead (a copy from pageable memory with
 * the async call would be synchronous anyway, and slower: the caller says which it has), so a user
 * never writes a second path. Tickets say when a copy is over: ferry__ring_record(r, t) records
 * ticket t after everything queued so far (several small copies, then one ticket: a batch), and
 * ferry__ring_query / ferry__ring_sync ask about it. The order in which tickets are waited for is
 * the user's (the engine keeps its chunks in issue order). Once made, a ring's calls only read it:
 * several threads may share one (the copy units of a device do).
 * Every call makes the ring's device current on the calling thread; a caller's thread that must
 * keep its own context (the checkpoint writer runs on the user's thread) brackets its calls with
 * ferry__gpu_enter / ferry__gpu_leave.
 *
 * Without a GPU every call that needs one returns FERRY_ENOGPU with the reason.
 */
#ifndef FERRY_GPU_RING_H
#define FERRY_GPU_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ferry__ring_gpu;

/* ferry__ring_create flags */
#define FERRY__RING_SPIN 1u /* a thread waiting on a ticket spins instead of sleeping (lower latency,
			     * a core busy: the engine's gpu_sync=spin) */

/* A ring on device dev with ntickets tickets. Returns 0 or a negative code (FERRY_ENOGPU, -ENOMEM,
 * a CUDA failure) with ferry_last_error() set. */
int ferry__ring_create(int dev, unsigned ntickets, unsigned flags, struct ferry__ring_gpu **out);
/* Waits for everything queued, then frees the stream and events. NULL is accepted. */
void ferry__ring_destroy(struct ferry__ring_gpu *r);
/* At least n tickets (existing tickets keep their numbers). */
int ferry__ring_reserve(struct ferry__ring_gpu *r, unsigned n);
/* The ring's stream (a CUstream), for work that must be ordered with its copies (cuFile's stream
 * API). */
void *ferry__ring_stream(const struct ferry__ring_gpu *r);

/* Copies n bytes to device address dst from host memory src (async when pinned, else synchronous
 * before returning), queued after everything before it on the ring. */
int ferry__ring_h2d(struct ferry__ring_gpu *r, uint64_t dst, const void *src, size_t n, bool pinned);
/* One piece of a gathered copy: len bytes from pinned host memory src to device address dst. */
struct ferry__ring_piece {
	uint64_t dst;
	const void *src;
	size_t len;
};
/*
 * Queues the n pieces' copies (src pinned) with the fewest driver calls: pieces whose sources and
 * destinations both follow on from the previous piece's are merged into one copy, and the copies
 * go in one cuMemcpyBatchAsync where the driver has it (CUDA 12.8+), else one cuMemcpyHtoDAsync
 * each. Pieces of length 0 are left out (a caller leaves out a failed piece that way). *calls
 * (may be NULL) gets the number of driver calls made. 0 or a negative code; on failure the pieces'
 * data may be partly copied.
 */
int ferry__ring_h2d_gather(struct ferry__ring_gpu *r, const struct ferry__ring_piece *p, size_t n,
			   unsigned *calls);
/* Whether gathers go in cuMemcpyBatchAsync calls: the driver has it and has not refused one
 * (CUDA_ERROR_INVALID_VALUE or NOT_SUPPORTED: then the copies went one by one, as from then on). */
bool ferry__ring_can_batch(void);
/* Copies n bytes from device address src to host memory dst, likewise. */
int ferry__ring_d2h(struct ferry__ring_gpu *r, void *dst, uint64_t src, size_t n, bool pinned);
/* Work queued on the ring from now on waits (on the GPU) for a fence: work of another stream (the
 * start of a stream-ordered request, a consumer's use of a buffer). */
int ferry__ring_after(struct ferry__ring_gpu *r, void *fence);

/* Records ticket t after everything queued so far. */
int ferry__ring_record(struct ferry__ring_gpu *r, unsigned t);
/* Records ticket t after everything queued so far on another ring's stream (a copy unit's copy,
 * done on the device's unit ring, that ticket t of this ring must wait for). */
int ferry__ring_record_on(struct ferry__ring_gpu *r, unsigned t, const struct ferry__ring_gpu *on);
/* 1 when ticket t's work is done (or t was never recorded), 0 while it runs, or a negative code
 * when the GPU reported a failure for it. */
int ferry__ring_query(struct ferry__ring_gpu *r, unsigned t);
/* Waits for ticket t's work. 1 when done (as ferry__ring_query says it), or a negative code. */
int ferry__ring_sync(struct ferry__ring_gpu *r, unsigned t);
/* Waits for everything queued on the ring. */
int ferry__ring_drain(struct ferry__ring_gpu *r);

/* A fence: an event recorded on a stream that is not a ring's (the caller's stream), which a ring
 * can wait for (ferry__ring_after) and the host can query. */
int ferry__fence_create(int dev, void **out);
void ferry__fence_destroy(void *fence);
int ferry__fence_record(void *fence, void *stream);
/* 1 done (or never recorded), 0 running, negative on failure. */
int ferry__fence_query(void *fence);
/* Waits for the fence: 1 when done, or a negative code (the convention of ferry__fence_query). */
int ferry__fence_sync(void *fence);

/* Device memory for the features (loaders' batch buffers). */
int ferry__gpu_alloc(int dev, size_t n, uint64_t *out);
void ferry__gpu_release(int dev, uint64_t ptr);
/* Free and total bytes of device dev (cuMemGetInfo; -ENOTSUP where the driver lacks it). */
int ferry__gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes);
/* Copies n bytes between device addresses on ring r's stream (dev: r's device), queued after
 * everything before it; -ENOTSUP where the driver lacks cuMemcpyDtoDAsync (ferry__ring_can_d2d). */
int ferry__ring_d2d(struct ferry__ring_gpu *r, int dev, uint64_t dst, uint64_t src, size_t n);
bool ferry__ring_can_d2d(void);
/* One device-to-device copy of a gather: len bytes from device address src to device address dst. */
struct ferry__ring_dpiece {
	uint64_t src, dst, len;
};
/*
 * Queues the n pieces' copies on ring r's stream (dev: r's device): in launches of the scatter kernel
 * (64 pieces each) where it is loaded on dev, else one cuMemcpyDtoDAsync a piece (the kernel's load
 * is started in the background for the next call). *kernel (may be NULL): whether the kernel took
 * them. 0 or a negative code.
 */
int ferry__ring_d2d_gather(struct ferry__ring_gpu *r, int dev, const struct ferry__ring_dpiece *p, size_t n,
			   bool *kernel);

/* Whether the process already uses device dev: the driver library was loaded by someone (ferry or
 * the application, e.g. torch) and dev's primary context is active. Asks without loading the
 * driver or making a context (false where the driver cannot say: cuDevicePrimaryCtxGetState
 * missing). */
bool ferry__gpu_in_use(int dev);

/* Makes dev current on the calling thread, keeping the context that was current in *prev for
 * ferry__gpu_leave to put back. */
int ferry__gpu_enter(int dev, void **prev);
void ferry__gpu_leave(void *prev);

/* ------------------------------------------------------------------------- pinned slot pool */

/*
 * Page-aligned host memory for bounce slots, page-locked with cuMemHostRegister (portable, so
 * every context can use it) when CUDA is usable, plain aligned memory otherwise (the O_DIRECT
 * bounce path uses the same slots). Freed slots are kept for reuse since registration costs
 * milliseconds per GiB; a slot of the same size is reused first. Thread-safe.
 */
struct ferry__pinned_pool;
/*
 * budget: bytes the pool may hold (in use and cached) at once, 0 for no limit. device: the CUDA
 * device whose context registers the memory, or -1 for plain memory even when a GPU exists.
 * Returns 0 or -ENOMEM.
 */
int ferry__pinned_pool_create(uint64_t budget, int device, struct ferry__pinned_pool **out);
/* Unregisters and frees every slot, including ones not given back. NULL is accepted. */
void ferry__pinned_pool_destroy(struct ferry__pinned_pool *pool);
/*
 * A slot of at least size bytes (rounded up to the page size), page aligned. *is_pinned is 1
 * when it is page-locked for the GPU. Returns 0, FERRY_EBUDGET (the budget would be exceeded even
 * after dropping cached slots) or -ENOMEM.
 */
int ferry__pinned_alloc(struct ferry__pinned_pool *pool, size_t size, void **out, int *is_pinned);
/* Gives a slot back to the pool (kept for reuse). NULL is accepted. */
void ferry__pinned_free(struct ferry__pinned_pool *pool, void *ptr);
/*
 * Like ferry__pinned_alloc, except that a new slot is not page-locked yet (*is_pinned 0; a slot
 * of the size kept in the pool comes as it is): ferry__pinned_pin locks it before its first copy.
 * For a caller that reads storage into the memory first, so that the registration (milliseconds
 * per 100 MiB) runs while other reads are in flight, not before the first one starts (a fresh
 * process's first compressed read, cz_file.c). ferry__pinned_pin: 0 and *is_pinned (1 once
 * locked; 0 where the pool cannot pin, as ferry__pinned_alloc says), or -EINVAL for a foreign ptr.
 */
int ferry__pinned_alloc_unpinned(struct ferry__pinned_pool *pool, size_t size, void **out, int *is_pinned);
int ferry__pinned_pin(struct ferry__pinned_pool *pool, void *ptr, int *is_pinned);
/* Bytes held by the pool (in use + cached). */
uint64_t ferry__pinned_held(struct ferry__pinned_pool *pool);
/* Why slots are not pinned ("" when they are or no slot was made yet). */
const char *ferry__pinned_unpinned_reason(struct ferry__pinned_pool *pool);

#endif
