/*
 * The engine's GPU side: device memory staged through pinned slots with asynchronous copies and
 * events (the pipelined bounce path), and cuFile (GDS) where it works. DESIGN.md decisions 3 and 4.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/ring.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"
#include "engine/engine.h"
#include "engine/publish.h"

/*
 * Small reads into device memory are gathered (issue 22): their copies are queued together, in
 * one launch of the scatter kernel (gpu/scatter.h), which reads every piece from its slot through
 * the slots' mapping on the device and writes it to its place; where the kernel is not loaded
 * (yet), in one cuMemcpyBatchAsync where the driver has it, else in one cuMemcpyHtoDAsync per run
 * of pieces whose destinations follow on (packed into the run's first slot); one ticket for all. A
 * gathered chunk sits in the GPU list with ticket GATHERING until the gather is flushed: when the
 * queue has no resident chunk left to copy in this thread, when a blocking wait comes, when another
 * chunk's copy is recorded, or when it is full.
 */
#define GATHER_PIECE_MAX ((size_t)256 << 10) /* larger pieces are copied at once, one by one */
/*
 * With the scatter kernel, a gather goes out once it holds this many bytes, while the worker
 * still reads the rest of its round: the copies of the first pieces cross PCIe while the next are
 * read, and the round ends waiting for the last gather only. A batch's rounds are in lockstep
 * across the workers (all read, then all copy): 12 workers x 16 pieces of 64 KiB put 12 MiB on
 * the link at once, about 240 us at 50 GB/s that every worker waited, which is what made 64 KiB
 * batches into GPU memory 1.44 ms per 256 pieces against 1.0 into pinned host memory (H200,
 * bench/small-reads.py, docs/CONFIG.md "FERRY_SCATTER"). A launch costs a few microseconds, so
 * 4 KiB pieces (16 a round, 64 KiB) still go in one; cuMemcpyBatchAsync costs 80-110 us a call,
 * so without the kernel a gather still waits for the round's end.
 */
#define GATHER_FLUSH_BYTES ((size_t)256 << 10)
/*
 * The kernel takes gathers of small pieces only: those whose mean piece is under this size. At 64
 * KiB the copy engine won in both H200 runs (batch of 256: 298k against 217k IOPS, and 206k against
 * 178k; futures equal), while at 4 KiB the kernel won three of four (futures 146k against 129k and
 * 150k against 145k; batch 337k against 318k, one run 412k against 475k): reading mapped host
 * memory from a kernel moves large pieces over PCIe less well than DMA, and saves a call's cost
 * where the pieces are small (docs/CONFIG.md, FERRY_SCATTER).
 */
#define SCATTER_PIECE_MAX ((size_t)32 << 10)
#define TICKET_GATHERING UINT_MAX             /* copy not issued yet */
#define TICKET_NONE (UINT_MAX - 1)            /* finished without a copy in flight (failed) */

struct ferry__ioq_gpu {
	bool pin_tried;
	bool pinned;
	/* a copy ring per device, a ticket per chunk of the queue (the chunk's index) */
	struct ferry__ring_gpu *ring[FERRY__MAX_GPUS];
	/* per chunk index: the ticket its copy completes with (its own, or its gather's last) */
	unsigned *ticket;
	/* the chunks gathered, in order, all bound for device gather_dev */
	struct ferry__chunk **gather;
	unsigned ngather;
	size_t gather_bytes;
	int gather_dev;
	struct ferry__ring_piece *pieces;
	struct ferry__scatter_piece *scatter;
	/* the slots' address in each device's kernels (cuMemHostGetDevicePointer); 0: not asked yet,
	 * SLOTS_UNMAPPED: the driver gave none */
	uint64_t slot_dptr[FERRY__MAX_GPUS];
	bool scatter_fallback_counted;
};
#define SLOTS_UNMAPPED UINT64_MAX

static const char *const path_names[] = {
	[FERRY__P_HOST] = "host",
	[FERRY__P_PIPE] = "cpu-async-gpu (pipelined bounce: O_DIRECT into pinned slots, async copies)",
	[FERRY__P_PIPE_SYNC] = "cpu-gpu (pinned slots, synchronous copies)",
	[FERRY__P_PAGECACHE] = "pagecache-gpu (buffered reads into pinned slots, async copies)",
	[FERRY__P_GDS] = "gds (cuFileRead/cuFileWrite)",
	[FERRY__P_GDS_ASYNC] = "gds-async (cuFile stream API)",
	[FERRY__P_GDS_BATCH] = "gds-batch (cuFile batch API)",
};

const char *ferry__path_name(int path)
{
	return path >= 0 && path <= FERRY__P_GDS_BATCH ? path_names[path] : "unknown";
}

/* ------------------------------------------------------------------------------ path decisions */

/* Probes GDS for f once; returns its state. for_auto: only native GDS would be used, so a machine
 * where it cannot exist is answered without loading cuFile. */
static int gds_state(struct ferry_file *f, bool for_auto)
{
	/* path=auto on a machine where GDS cannot be native: answered without the file's lock, once
	 * the note is written (every request into device memory asks) */
	if (for_auto && atomic_load_explicit(&f->gds_auto_refused, memory_order_acquire))
		return FERRY__GDS_REFUSED;
	pthread_mutex_lock(&f->gds_mu);
	if (f->gds_state == FERRY__GDS_UNPROBED) {
		char why[320] = "";
		if (for_auto && !ferry__gds_native_possible(why, sizeof(why))) {
			/* not cached as the file's state: an explicit gds mode still asks cuFile */
			snprintf(f->gds_note, sizeof(f->gds_note), "GDS: %s", why);
			atomic_store_explicit(&f->gds_auto_refused, true, memory_order_release);
			pthread_mutex_unlock(&f->gds_mu);
			return FERRY__GDS_REFUSED;
		}
		if (f->fd_direct < 0) {
			f->gds_state = FERRY__GDS_REFUSED;
			snprintf(f->gds_note, sizeof(f->gds_note),
				 "GDS: cuFile needs an O_DIRECT descriptor and this file has none (%s)",
				 f->direct_note);
		} else {
			int st = ferry__gds_probe_fd(f->fd_direct, why, sizeof(why));
			ferry__CUfileHandle_t h = NULL;
			if (st != FERRY__GDS_REFUSED &&
			    ferry__gds_handle_register(f->fd_direct, &h, NULL, why, sizeof(why)) != 0)
				st = FERRY__GDS_REFUSED;
			f->gds_state = st;
			f->gds_handle = h;
			snprintf(f->gds_note, sizeof(f->gds_note), "GDS: %s", why);
		}
		if (f->gds_state == FERRY__GDS_REFUSED)
			FERRY__LOG(FERRY__LOG_INFO, "%s: %s", f->path, f->gds_note);
	}
	int st = f->gds_state;
	pthread_mutex_unlock(&f->gds_mu);
	return st;
}

void ferry__file_gds_close(struct ferry_file *f)
{
	if (f->gds_handle)
		ferry__gds_handle_deregister(f->gds_handle);
	f->gds_handle = NULL;
}

static int resolve_path(ferry_ctx *ctx, struct ferry_file *f, const void *buf, size_t len,
			bool is_write, int *dev, int *path)
{
	/* the `path` knob's values, in ctx.c's order */
	enum { K_AUTO, K_GDS, K_CPU, K_CPU_GPU, K_CPU_ASYNC_GPU, K_PAGECACHE_GPU, K_GDS_ASYNC, K_GDS_BATCH };
	static const char *const knob_names[] = {"auto", "gds", "cpu", "cpu-gpu", "cpu-async-gpu",
						 "pagecache-gpu", "gds-async", "gds-batch"};
	int mode = (int)ctx->cfg.path, kind, d = -1;
	const char *op = is_write ? "pwrite" : "pread";

	*dev = -1;
	*path = FERRY__P_HOST;
	/* memory=host: the caller vouches for host memory; one CUDA pointer query per request saved */
	kind = ctx->cfg.memory ? FERRY__MEM_HOST : ferry__mem_kind(buf, &d);
	if (kind != FERRY__MEM_DEVICE) {
		if (mode == K_GDS || mode == K_GDS_ASYNC || mode == K_GDS_BATCH)
			return ferry__error(-EINVAL, "%s(%s): path=%s moves data to and from device memory, "
					    "and this buffer is host memory", op, f->path, knob_names[mode]);
		return 0;
	}
	if (d < 0 || d >= FERRY__MAX_GPUS)
		return ferry__error(-EINVAL, "%s(%s): device %d is beyond the %d that ferry handles", op,
				    f->path, d, FERRY__MAX_GPUS);
	*dev = d;
	switch (mode) {
	case K_CPU:
		return ferry__error(-EINVAL, "%s(%s): path=cpu moves data to host memory only, and this "
				    "buffer is device memory (use cpu-gpu or cpu-async-gpu)", op, f->path);
	case K_CPU_GPU:
		*path = FERRY__P_PIPE_SYNC;
		return 0;
	case K_CPU_ASYNC_GPU:
		*path = FERRY__P_PIPE;
		return 0;
	case K_PAGECACHE_GPU:
		*path = FERRY__P_PAGECACHE;
		return 0;
	case K_GDS:
	case K_GDS_ASYNC:
	case K_GDS_BATCH: {
		const struct ferry__cufile_api *cf;
		if (gds_state(f, false) == FERRY__GDS_REFUSED)
			return ferry__error(FERRY_ENOGDS, "%s(%s): path=%s was asked for: %s", op, f->path,
					    knob_names[mode], f->gds_note);
		cf = ferry__cufile();
		if (mode == K_GDS_ASYNC && !(cf->has & FERRY__CUFILE_HAS_STREAM))
			return ferry__error(FERRY_ENOGDS, "%s(%s): path=gds-async needs cuFile's stream API "
					    "(cuFileReadAsync), which this libcufile lacks", op, f->path);
		if (mode == K_GDS_BATCH && !(cf->has & FERRY__CUFILE_HAS_BATCH))
			return ferry__error(FERRY_ENOGDS, "%s(%s): path=gds-batch needs cuFile's batch API "
					    "(cuFileBatchIOSetUp), which this libcufile lacks", op, f->path);
		*path = mode == K_GDS ? FERRY__P_GDS : mode == K_GDS_ASYNC ? FERRY__P_GDS_ASYNC
									 : FERRY__P_GDS_BATCH;
		return 0;
	}
	default: /* auto: GDS only where it is native; compatibility mode is cuFile doing our job slower */
		if (gds_state(f, true) == FERRY__GDS_NATIVE) {
			*path = FERRY__P_GDS;
			return 0;
		}
		if (!atomic_exchange(&f->gds_fallback_counted, 1))
			ferry__stat_add(ctx, FERRY_STAT_FALLBACKS, 1); /* why: ferry_file_path_info() */
		*path = FERRY__P_PIPE;
		return 0;
	}
}

int ferry__resolve_path(ferry_ctx *ctx, struct ferry_file *f, const void *buf, size_t len,
			bool is_write, int *dev, int *path)
{
	int ret = resolve_path(ctx, f, buf, len, is_write, dev, path);

	if (!ret && ctx->pub) {
		/* the path `ferry top` shows: the mode's short name, written when it changes (each
		 * write was a formatted copy and two atomic updates of a shared line: a third of
		 * the instructions of a 4 KiB read from tmpfs, callgrind) */
		static const char *const short_names[] = {"host", "cpu-async-gpu", "cpu-gpu", "pagecache-gpu",
							  "gds", "gds-async", "gds-batch"};
		const char *name = short_names[*path];
		if (atomic_load_explicit(&ctx->pub_path, memory_order_relaxed) != name) {
			atomic_store_explicit(&ctx->pub_path, name, memory_order_relaxed);
			ferry__publish_set_path(ctx->pub, name);
		}
	}
	return ret;
}

/* ------------------------------------------------------------------------------- GPU per queue */

static int chunk_index(struct ferry__ioq *q, struct ferry__chunk *c)
{
	return (int)(c - q->chunks);
}

/* Makes dev current on this thread and sets up its copy ring once. */
static struct ferry__ring_gpu *use_dev(struct ferry__ioq *q, int dev, struct ferry__chunk *c)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct ferry__ioq_gpu *g = q->gpu;
	int ret;

	if (!cu) {
		c->result = ferry__cuda_require();
		return NULL;
	}
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (g) {
			g->ticket = calloc(q->depth, sizeof(*g->ticket));
			g->gather = calloc(q->depth, sizeof(*g->gather));
			g->pieces = calloc(q->depth, sizeof(*g->pieces));
			g->scatter = calloc(q->depth, sizeof(*g->scatter));
		}
		if (!g || !g->ticket || !g->gather || !g->pieces || !g->scatter) {
			if (g) {
				free(g->ticket);
				free(g->gather);
				free(g->pieces);
				free(g->scatter);
				free(g);
			}
			c->result = ferry__error(-ENOMEM, "GPU queue state");
			return NULL;
		}
		q->gpu = g;
	}
	if ((ret = ferry__cuda_set_device(dev)) != 0) {
		c->result = ret;
		return NULL;
	}
	/* gpu_sync=block: a worker waiting for its oldest copy sleeps instead of spinning a core;
	 * slower (docs/CONFIG.md), so spin is the default */
	if (!g->ring[dev] && (ret = ferry__ring_create(dev, q->depth, q->ctx->cfg.gpu_sync ? FERRY__RING_SPIN : 0,
						       &g->ring[dev]))) {
		c->result = ret;
		return NULL;
	}
	return g->ring[dev];
}

/*
 * The queue's slots page-locked, the first time one of them carries a copy (dev current): not when
 * the queue first meets the GPU, since reads through copy units (units.c) never copy from them,
 * and registering every worker's slots (12 x 18 MiB) at the first chunk of a fresh process held
 * the driver while the unit copies waited (issue 22). Returns whether they are pinned.
 */
static bool slots_pinned(struct ferry__ioq *q)
{
	struct ferry__ioq_gpu *g = q->gpu;

	if (!g->pin_tried && q->slot_mem) {
		uint64_t t0 = FERRY__SPAN_T0();
		g->pin_tried = true;
		/* mapped too, for the scatter kernel to read the slots; without the mapping (a device
		 * that cannot map host memory) they are pinned all the same */
		ferry__CUresult r = ferry__cuda()->MemHostRegister(q->slot_mem, q->slot_size * q->nslots,
								   FERRY__CU_MEMHOSTREGISTER_PORTABLE |
								   FERRY__CU_MEMHOSTREGISTER_DEVICEMAP);
		if (r != FERRY__CUDA_SUCCESS)
			r = ferry__cuda()->MemHostRegister(q->slot_mem, q->slot_size * q->nslots,
						   FERRY__CU_MEMHOSTREGISTER_PORTABLE);
		g->pinned = r == FERRY__CUDA_SUCCESS;
		if (!g->pinned) {
			/* Copies from pageable memory still work, synchronously and slower: count it. */
			ferry__stat_add(q->ctx, FERRY_STAT_FALLBACKS, 1);
			FERRY__LOG(FERRY__LOG_WARN, "cuMemHostRegister of %zu bytes of slots failed: %s "
				   "(ulimit -l?); copies will be from pageable memory",
				   q->slot_size * q->nslots, ferry__cuda_err_name(r));
		}
		FERRY__MARK("slots_pinned", ferry__worker_index, t0);
	}
	return g->pinned;
}

static void gpu_list_add(struct ferry__ioq *q, struct ferry__chunk *c)
{
	c->gpu_busy = true;
	ferry__chunk_append(&q->gpu_head, &q->gpu_tail, c);
}

/* Packs the pieces of runs (destinations that follow on) into the run's first slot, where it has
 * room, so that each run is one copy: for a driver without cuMemcpyBatchAsync, where a copy call
 * costs microseconds and copying a small piece on the host a fraction of one. */
static void gather_pack(struct ferry__ioq *q, struct ferry__ring_piece *p, unsigned n)
{
	struct ferry__ioq_gpu *g = q->gpu;
	unsigned first = 0;
	size_t used = 0; /* bytes of the run in its first slot */

	for (unsigned i = 0; i < n; i++) {
		struct ferry__chunk *f = g->gather[first];
		size_t room = q->slot_size - f->bounce.copy_off;
		if (i && p[i].dst == p[first].dst + used && used + p[i].len <= room) {
			memcpy((char *)p[first].src + used, p[i].src, p[i].len);
			p[i].src = (const char *)p[first].src + used;
			used += p[i].len;
			continue;
		}
		first = i;
		used = p[i].len;
	}
}

/* The kernel cannot serve this queue's gathers on dev: counted once per queue (DESIGN.md
 * decision 3), the reason logged. */
static void scatter_fallback(struct ferry__ioq *q, int dev, const char *why)
{
	struct ferry__ioq_gpu *g = q->gpu;

	if (g->scatter_fallback_counted)
		return;
	g->scatter_fallback_counted = true;
	ferry__stat_add(q->ctx, FERRY_STAT_FALLBACKS, 1);
	FERRY__LOG(FERRY__LOG_INFO, "gathered copies to device %d go without the scatter kernel: %s", dev, why);
}

/*
 * The gather's copies in launches of the scatter kernel, reading the slots through their mapping.
 * Returns true when it took them (*err: 0, or the failure with the copies not made), false when
 * they are to be copied (the kernel not loaded yet, not available here, or refused).
 */
static bool gather_scatter(struct ferry__ioq *q, struct ferry__ring_gpu *ring, unsigned n, int *err)
{
	struct ferry__ioq_gpu *g = q->gpu;
	int dev = g->gather_dev;
	int st = ferry__scatter_state(dev, false);

	if (st == FERRY__SCATTER_LOADING) {
		ferry__scatter_prepare(dev); /* in the background: this gather copies */
		return false;
	}
	if (st == FERRY__SCATTER_NONE)
		scatter_fallback(q, dev, ferry__scatter_reason(dev));
	if (st != FERRY__SCATTER_READY)
		return false;
	if (!g->slot_dptr[dev] && ferry__scatter_host_ptr(dev, q->slot_mem, &g->slot_dptr[dev]) != 0) {
		g->slot_dptr[dev] = SLOTS_UNMAPPED;
		scatter_fallback(q, dev, ferry_last_error());
	}
	if (g->slot_dptr[dev] == SLOTS_UNMAPPED)
		return false;
	const char *lo = q->slot_mem, *hi = q->slot_mem + q->slot_size * q->nslots;
	for (unsigned i = 0; i < n; i++) {
		struct ferry__chunk *c = g->gather[i];
		const char *src = c->bounce.slot + c->bounce.copy_off;
		size_t len = (size_t)c->result;
		if (src < lo || src + len > hi)
			return false; /* not one of the queue's slots: copied */
		g->scatter[i] = (struct ferry__scatter_piece){g->slot_dptr[dev] + (uint64_t)(src - lo),
							      (uint64_t)(uintptr_t)c->buf, len};
	}
	int r = ferry__scatter_launch(dev, ferry__ring_stream(ring), g->scatter, n, NULL);
	if (r == FERRY_ECUDA) {
		/* refused (a driver that will not take the launch): copied, as every gather from now
		 * on; if the copies fail too, theirs is the error */
		ferry__scatter_refuse(dev, ferry_last_error());
		scatter_fallback(q, dev, ferry__scatter_reason(dev));
		return false;
	}
	*err = r;
	return true;
}

/* Queues the gathered chunks' copies and their ticket, and puts them in the GPU list. */
static void gather_flush(struct ferry__ioq *q)
{
	struct ferry__ioq_gpu *g = q->gpu;
	unsigned n = g->ngather;
	struct ferry__ring_gpu *ring = g->ring[g->gather_dev];
	int r = 0;

	if (!n)
		return;
	uint64_t t0 = FERRY__SPAN_T0();
	bool small = g->gather_bytes < (size_t)n * SCATTER_PIECE_MAX;
	g->ngather = 0;
	g->gather_bytes = 0;
	unsigned last = (unsigned)chunk_index(q, g->gather[n - 1]);
	/* one piece: one copy call either way, and on the copy engine; large pieces too */
	if (n == 1 || !small || !gather_scatter(q, ring, n, &r)) {
		for (unsigned i = 0; i < n; i++) {
			struct ferry__chunk *c = g->gather[i];
			g->pieces[i] = (struct ferry__ring_piece){(uint64_t)(uintptr_t)c->buf,
								  c->bounce.slot + c->bounce.copy_off, (size_t)c->result};
		}
		if (n > 1 && !ferry__ring_can_batch())
			gather_pack(q, g->pieces, n);
		r = ferry__ring_h2d_gather(ring, g->pieces, n, NULL);
	}
	if (r == 0 && (r = ferry__ring_record(ring, last)))
		ferry__error_append("after a gathered copy");
	for (unsigned i = 0; i < n; i++) {
		struct ferry__chunk *c = g->gather[i];
		if (r) {
			if (i == 0)
				ferry__error_append("copying %u pieces from %s", n, c->f->path);
			c->result = r;
		}
		g->ticket[chunk_index(q, c)] = r ? TICKET_NONE : last;
	}
	FERRY__SPAN_ADD(q, FERRY__SPAN_GATHER, t0);
}

/* Records the chunk's ticket after what was just queued on the ring. */
static bool record(struct ferry__ioq *q, struct ferry__ring_gpu *ring, struct ferry__chunk *c, const char *what)
{
	int r = ferry__ring_record(ring, (unsigned)chunk_index(q, c));

	if (r) {
		ferry__error_append("after %s", what);
		c->result = r;
		return false;
	}
	q->gpu->ticket[chunk_index(q, c)] = (unsigned)chunk_index(q, c);
	gpu_list_add(q, c);
	return true;
}

/* For copy units (src/engine/units.c): the device current and the queue's GPU state ready for c. */
bool ferry__gpu_use(struct ferry__ioq *q, struct ferry__chunk *c)
{
	return use_dev(q, c->dev, c) != NULL;
}

/* For copy units: c's ticket recorded on the device's unit ring and c in the GPU list. */
bool ferry__gpu_record_on(struct ferry__ioq *q, struct ferry__chunk *c, struct ferry__ring_gpu *units)
{
	int r = ferry__ring_record_on(q->gpu->ring[c->dev], (unsigned)chunk_index(q, c), units);
	if (r) {
		ferry__error_append("after a unit copy");
		c->result = r;
		return false;
	}
	q->gpu->ticket[chunk_index(q, c)] = (unsigned)chunk_index(q, c);
	gpu_list_add(q, c);
	return true;
}

/* Stream-ordered requests: nothing touches the caller's buffer before the work queued ahead of
 * the request on the caller's stream (engine.h says why this asks and never waits). */
int ferry__gpu_started(struct ferry__chunk *c)
{
	struct ferry__entry *e = c->entry;

	if (!e || !e->start_ev || atomic_load_explicit(&e->started, memory_order_acquire))
		return 1;
	int r = ferry__fence_query(e->start_ev);
	if (r == 1)
		atomic_store_explicit(&e->started, true, memory_order_release);
	else if (r < 0)
		ferry__error_append("asking whether the caller's stream reached the request");
	return r;
}

/* 1: go on; 0: c waits in the start list (the caller returns true: not finished); <0: failed */
static int wait_start(struct ferry__ioq *q, struct ferry__chunk *c)
{
	int r = ferry__gpu_started(c);

	if (r == 0)
		ferry__ioq_defer_start(q, c);
	else if (r < 0)
		c->result = r;
	return r;
}

bool ferry__gpu_chunk_start(struct ferry__ioq *q, struct ferry__chunk *c)
{
	struct ferry__ring_gpu *ring = use_dev(q, c->dev, c);
	int r;

	if (!ring)
		return false;
	if (c->path == FERRY__P_GDS_ASYNC) {
		const struct ferry__cufile_api *cf = ferry__cufile();
		ferry__CUfileError_t e;
		ferry__CUstream stream = ferry__ring_stream(ring);
		if ((r = wait_start(q, c)) <= 0)
			return r == 0;
		c->gds.size = c->len;
		c->gds.foff = (off_t)c->off;
		c->gds.boff = 0;
		c->gds.bytes = 0;
		e = c->is_write ? cf->WriteAsync(c->f->gds_handle, c->buf, &c->gds.size, &c->gds.foff,
						 &c->gds.boff, &c->gds.bytes, stream)
				: cf->ReadAsync(c->f->gds_handle, c->buf, &c->gds.size, &c->gds.foff,
						&c->gds.boff, &c->gds.bytes, stream);
		if (e.err) {
			char why[256];
			c->result = ferry__error(FERRY_ECUFILE, "cuFile%sAsync(%s, offset %llu): %s",
						 c->is_write ? "Write" : "Read", c->f->path,
						 (unsigned long long)c->off,
						 ferry__cufile_explain(e, why, sizeof(why)));
			return false;
		}
		return record(q, ring, c, "cuFile stream op");
	}
	/* a device write: its bytes come to the slot first, after the caller's stream work */
	if ((r = wait_start(q, c)) <= 0)
		return r == 0;
	bool async = c->path != FERRY__P_PIPE_SYNC && slots_pinned(q);
	if ((r = ferry__ring_d2h(ring, c->bounce.slot, (uint64_t)(uintptr_t)c->buf, c->len, async))) {
		ferry__error_append("for %s", c->f->path);
		c->result = r;
		return false;
	}
	return async && record(q, ring, c, "cuMemcpyDtoHAsync");
}

bool ferry__gpu_chunk_stored(struct ferry__ioq *q, struct ferry__chunk *c)
{
	struct ferry__ring_gpu *ring = use_dev(q, c->dev, c);
	size_t n = (size_t)c->result;
	int r;

	if (!ring)
		return false;
	if ((r = wait_start(q, c)) <= 0)
		return r == 0;
	bool async = c->path != FERRY__P_PIPE_SYNC && slots_pinned(q);
	struct ferry__ioq_gpu *g = q->gpu;
	if (async && n <= GATHER_PIECE_MAX) {
		if (g->ngather && g->gather_dev != c->dev)
			gather_flush(q);
		g->gather_dev = c->dev;
		g->gather[g->ngather++] = c;
		g->gather_bytes += n;
		g->ticket[chunk_index(q, c)] = TICKET_GATHERING;
		gpu_list_add(q, c);
		if (g->gather_bytes >= GATHER_FLUSH_BYTES && q->sync_head &&
		    g->gather_bytes < (size_t)g->ngather * SCATTER_PIECE_MAX &&
		    ferry__scatter_state(c->dev, false) == FERRY__SCATTER_READY)
			gather_flush(q);
		return true;
	}
	uint64_t t0 = FERRY__SPAN_T0();
	if ((r = ferry__ring_h2d(ring, (uint64_t)(uintptr_t)c->buf, c->bounce.slot + c->bounce.copy_off, n, async))) {
		ferry__error_append("from %s", c->f->path);
		c->result = r;
		return false;
	}
	bool ok = async && record(q, ring, c, "cuMemcpyHtoDAsync");
	FERRY__SPAN_ADD(q, FERRY__SPAN_H2D, t0);
	return ok;
}

void ferry__gpu_poll(struct ferry__ioq *q, bool block,
		     void (*done)(struct ferry__ioq *q, struct ferry__chunk *c))
{
	struct ferry__ioq_gpu *g = q->gpu;

	/* gathered copies go out unless more resident chunks are about to join them */
	if (g && g->ngather && (block || !q->sync_head || g->ngather == q->depth))
		gather_flush(q);
	while (q->gpu_head) {
		struct ferry__chunk *c = q->gpu_head;
		struct ferry__ring_gpu *ring = g->ring[c->dev];
		unsigned t = g->ticket[chunk_index(q, c)];
		if (t == TICKET_GATHERING)
			return; /* the gather is not out yet: nothing after it is done either */
		/* both: 1 when done, negative on failure; query: 0 while running */
		uint64_t t0 = FERRY__SPAN_T0();
		int r = t == TICKET_NONE ? 1 : block ? ferry__ring_sync(ring, t) : ferry__ring_query(ring, t);
		FERRY__SPAN_ADD(q, block ? FERRY__SPAN_GPU_WAIT : FERRY__SPAN_GPU_QUERY, t0);

		block = false;
		if (r == 0)
			return;
		q->gpu_head = c->next;
		if (!q->gpu_head)
			q->gpu_tail = NULL;
		c->gpu_busy = false;
		if (r < 0) {
			ferry__error_append("copy for %s at offset %llu", c->f->path, (unsigned long long)c->off);
			c->result = r;
		} else if (c->path == FERRY__P_GDS_ASYNC) {
			ferry__gds_complete(c, ferry__gds_result(c->gds.bytes, "cuFile stream I/O"));
		}
		done(q, c);
	}
}

void ferry__ioq_gpu_exit(struct ferry__ioq *q)
{
	struct ferry__ioq_gpu *g = q->gpu;

	if (!g)
		return;
	/* the rings drain what the GPU still holds: its copies write into slots we are about to free */
	q->gpu_head = q->gpu_tail = NULL;
	for (int d = 0; d < FERRY__MAX_GPUS; d++)
		ferry__ring_destroy(g->ring[d]);
	if (g->pinned)
		ferry__cuda()->MemHostUnregister(q->slot_mem);
	free(g->ticket);
	free(g->gather);
	free(g->pieces);
	free(g->scatter);
	free(g);
	q->gpu = NULL;
}

/* ----------------------------------------------------------------------------- stream ordering */

int ferry__stream_begin(int dev, void *stream, void **start_ev)
{
	void *prev = NULL;
	int err = ferry__gpu_enter(dev, &prev);

	if (err)
		return err;
	if (!(err = ferry__fence_create(dev, start_ev)) && (err = ferry__fence_record(*start_ev, stream))) {
		ferry__fence_destroy(*start_ev);
		*start_ev = NULL;
	}
	ferry__gpu_leave(prev);
	if (err)
		ferry__error_append("device %d", dev);
	return err;
}

int ferry__stream_hold(int dev, void *stream, void (*fn)(void *), void *arg)
{
	ferry__CUcontext prev = NULL;
	int err = ferry__cuda_enter_device(dev, &prev);

	if (err)
		return err;
	ferry__CUresult r = ferry__cuda()->LaunchHostFunc((ferry__CUstream)stream, fn, arg);
	ferry__cuda_leave_device(prev);
	if (r)
		return ferry__cuda_fail(r, "cuLaunchHostFunc on the caller's stream %p", stream);
	return 0;
}

void ferry__stream_end(int dev, void *start_ev)
{
	void *prev = NULL;

	if (!start_ev || ferry__gpu_enter(dev, &prev))
		return;
	ferry__fence_destroy(start_ev);
	ferry__gpu_leave(prev);
}
