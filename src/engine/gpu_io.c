/*
 * The engine's GPU side: device memory staged through pinned slots with asynchronous copies and
 * events (the pipelined bounce path), and cuFile (GDS) where it works. DESIGN.md decisions 3 and 4.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/shim.h"
#include "engine/engine.h"
#include "engine/publish.h"

struct gpu_dev {
	bool ready;
	ferry__CUstream stream;
	ferry__CUevent *ev; /* one per chunk of the queue */
};

struct ferry__ioq_gpu {
	bool pin_tried;
	bool pinned;
	struct gpu_dev dev[FERRY__MAX_GPUS];
	ferry__CUfileBatchHandle_t batch;
	bool batch_ready;
	ferry__CUfileIOParams_t *params;
	ferry__CUfileIOEvents_t *events;
};

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
	pthread_mutex_lock(&f->gds_mu);
	if (f->gds_state == FERRY__GDS_UNPROBED) {
		char why[320] = "";
		if (for_auto && !ferry__gds_native_possible(why, sizeof(why))) {
			/* not cached as the file's state: an explicit gds mode still asks cuFile */
			snprintf(f->gds_note, sizeof(f->gds_note), "GDS: %s", why);
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

/* Makes dev current on this thread and sets up its stream, events and pinned slots once. */
static struct gpu_dev *use_dev(struct ferry__ioq *q, int dev, struct ferry__chunk *c)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct ferry__ioq_gpu *g = q->gpu;
	ferry__CUresult r;
	int ret;

	if (!cu) {
		c->result = ferry__cuda_require();
		return NULL;
	}
	if (!g) {
		g = q->gpu = calloc(1, sizeof(*g));
		if (!g) {
			c->result = ferry__error(-ENOMEM, "GPU queue state");
			return NULL;
		}
	}
	if ((ret = ferry__cuda_set_device(dev)) != 0) {
		c->result = ret;
		return NULL;
	}
	if (!g->pin_tried && q->slot_mem) {
		g->pin_tried = true;
		r = cu->MemHostRegister(q->slot_mem, q->slot_size * q->nslots,
					FERRY__CU_MEMHOSTREGISTER_PORTABLE);
		g->pinned = r == FERRY__CUDA_SUCCESS;
		if (!g->pinned) {
			/* Copies from pageable memory still work, synchronously and slower: count it. */
			ferry__stat_add(q->ctx, FERRY_STAT_FALLBACKS, 1);
			FERRY__LOG(FERRY__LOG_WARN, "cuMemHostRegister of %zu bytes of slots failed: %s "
				   "(ulimit -l?); copies will be from pageable memory",
				   q->slot_size * q->nslots, ferry__cuda_err_name(r));
		}
	}
	struct gpu_dev *gd = &g->dev[dev];
	if (!gd->ready) {
		gd->ev = calloc(q->depth, sizeof(*gd->ev));
		if (!gd->ev) {
			c->result = ferry__error(-ENOMEM, "GPU events");
			return NULL;
		}
		r = cu->StreamCreate(&gd->stream, FERRY__CU_STREAM_NON_BLOCKING);
		if (r) {
			c->result = ferry__cuda_fail(r, "cuStreamCreate on device %d", dev);
			free(gd->ev);
			gd->ev = NULL;
			return NULL;
		}
		for (unsigned i = 0; i < q->depth; i++) {
			/* block: a worker waiting for its oldest copy sleeps instead of spinning a core;
			 * slower (docs/CONFIG.md), so spin is the default */
			r = cu->EventCreate(&gd->ev[i], FERRY__CU_EVENT_DISABLE_TIMING |
								(q->ctx->cfg.gpu_sync ? 0 : FERRY__CU_EVENT_BLOCKING_SYNC));
			if (r) {
				c->result = ferry__cuda_fail(r, "cuEventCreate on device %d", dev);
				for (unsigned j = 0; j < i; j++)
					cu->EventDestroy(gd->ev[j]);
				cu->StreamDestroy(gd->stream);
				free(gd->ev);
				gd->ev = NULL;
				return NULL;
			}
		}
		gd->ready = true;
	}
	return gd;
}

static void gpu_list_add(struct ferry__ioq *q, struct ferry__chunk *c)
{
	c->gpu_busy = true;
	ferry__chunk_append(&q->gpu_head, &q->gpu_tail, c);
}

/* Records the chunk's event after what was just queued on the stream. */
static bool record(struct ferry__ioq *q, struct gpu_dev *gd, struct ferry__chunk *c, const char *what)
{
	ferry__CUresult r = ferry__cuda()->EventRecord(gd->ev[chunk_index(q, c)], gd->stream);

	if (r) {
		c->result = ferry__cuda_fail(r, "cuEventRecord after %s", what);
		return false;
	}
	gpu_list_add(q, c);
	return true;
}

/* For copy units (src/engine/units.c): the device current and the queue's GPU state ready for c. */
bool ferry__gpu_use(struct ferry__ioq *q, struct ferry__chunk *c)
{
	return use_dev(q, c->dev, c) != NULL;
}

/* For copy units: c's event recorded on stream (the device's unit stream) and c in the GPU list. */
bool ferry__gpu_record_on(struct ferry__ioq *q, struct ferry__chunk *c, void *stream)
{
	ferry__CUresult r = ferry__cuda()->EventRecord(q->gpu->dev[c->dev].ev[chunk_index(q, c)],
						       (ferry__CUstream)stream);
	if (r) {
		c->result = ferry__cuda_fail(r, "cuEventRecord after a unit copy");
		return false;
	}
	gpu_list_add(q, c);
	return true;
}

static int64_t gds_result(ssize_t r, const struct ferry__chunk *c)
{
	if (r >= 0)
		return r;
	if (r == -1)
		return ferry__error(-errno, "cuFile%s(%s, offset %llu, %zu bytes)", c->is_write ? "Write" : "Read",
				    c->f->path, (unsigned long long)c->off, c->len);
	char why[256];
	ferry__CUfileError_t e = {.err = (int)-r};
	return ferry__error(FERRY_ECUFILE, "cuFile%s(%s, offset %llu, %zu bytes): %s",
			    c->is_write ? "Write" : "Read", c->f->path, (unsigned long long)c->off, c->len,
			    ferry__cufile_explain(e, why, sizeof(why)));
}

/* Stream-ordered requests: nothing touches the caller's buffer before the work queued ahead of
 * the request on the caller's stream; the worker's stream waits for it on the GPU, not the host. */
static bool wait_start(struct gpu_dev *gd, struct ferry__chunk *c)
{
	if (!c->entry || !c->entry->start_ev)
		return true;
	ferry__CUresult r = ferry__cuda()->StreamWaitEvent(gd->stream, (ferry__CUevent)c->entry->start_ev, 0);
	if (r) {
		c->result = ferry__cuda_fail(r, "cuStreamWaitEvent on the caller's stream event");
		return false;
	}
	return true;
}

bool ferry__gpu_chunk_start(struct ferry__ioq *q, struct ferry__chunk *c)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct gpu_dev *gd = use_dev(q, c->dev, c);
	ferry__CUresult r;

	if (!gd)
		return false;
	if (c->path == FERRY__P_GDS_ASYNC) {
		const struct ferry__cufile_api *cf = ferry__cufile();
		ferry__CUfileError_t e;
		if (!wait_start(gd, c))
			return false;
		c->g_size = c->len;
		c->g_foff = (off_t)c->off;
		c->g_boff = 0;
		c->g_bytes = 0;
		e = c->is_write ? cf->WriteAsync(c->f->gds_handle, c->buf, &c->g_size, &c->g_foff,
						 &c->g_boff, &c->g_bytes, gd->stream)
				: cf->ReadAsync(c->f->gds_handle, c->buf, &c->g_size, &c->g_foff,
						&c->g_boff, &c->g_bytes, gd->stream);
		if (e.err) {
			char why[256];
			c->result = ferry__error(FERRY_ECUFILE, "cuFile%sAsync(%s, offset %llu): %s",
						 c->is_write ? "Write" : "Read", c->f->path,
						 (unsigned long long)c->off,
						 ferry__cufile_explain(e, why, sizeof(why)));
			return false;
		}
		return record(q, gd, c, "cuFile stream op");
	}
	/* a device write: its bytes come to the slot first, after the caller's stream work */
	if (!wait_start(gd, c))
		return false;
	if (c->path == FERRY__P_PIPE_SYNC || !q->gpu->pinned) {
		r = cu->MemcpyDtoH(c->slot, (ferry__CUdeviceptr)(uintptr_t)c->buf, c->len);
		if (r)
			c->result = ferry__cuda_fail(r, "cuMemcpyDtoH of %zu bytes for %s", c->len, c->f->path);
		return false;
	}
	r = cu->MemcpyDtoHAsync(c->slot, (ferry__CUdeviceptr)(uintptr_t)c->buf, c->len, gd->stream);
	if (r) {
		c->result = ferry__cuda_fail(r, "cuMemcpyDtoHAsync of %zu bytes for %s", c->len, c->f->path);
		return false;
	}
	return record(q, gd, c, "cuMemcpyDtoHAsync");
}

bool ferry__gpu_chunk_stored(struct ferry__ioq *q, struct ferry__chunk *c)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct gpu_dev *gd = use_dev(q, c->dev, c);
	size_t n = (size_t)c->result;
	ferry__CUresult r;

	if (!gd || !wait_start(gd, c))
		return false;
	if (c->path == FERRY__P_PIPE_SYNC || !q->gpu->pinned) {
		r = cu->MemcpyHtoD((ferry__CUdeviceptr)(uintptr_t)c->buf, c->slot + c->copy_off, n);
		if (r)
			c->result = ferry__cuda_fail(r, "cuMemcpyHtoD of %zu bytes from %s", n, c->f->path);
		return false;
	}
	r = cu->MemcpyHtoDAsync((ferry__CUdeviceptr)(uintptr_t)c->buf, c->slot + c->copy_off, n, gd->stream);
	if (r) {
		c->result = ferry__cuda_fail(r, "cuMemcpyHtoDAsync of %zu bytes from %s", n, c->f->path);
		return false;
	}
	return record(q, gd, c, "cuMemcpyHtoDAsync");
}

void ferry__gpu_poll(struct ferry__ioq *q, bool block,
		     void (*done)(struct ferry__ioq *q, struct ferry__chunk *c))
{
	const struct ferry__cuda_api *cu = ferry__cuda();

	while (q->gpu_head) {
		struct ferry__chunk *c = q->gpu_head;
		ferry__CUevent ev = q->gpu->dev[c->dev].ev[chunk_index(q, c)];
		ferry__CUresult r;

		ferry__cuda_set_device(c->dev);
		r = block ? cu->EventSynchronize(ev) : cu->EventQuery(ev);
		block = false;
		if (r == FERRY__CUDA_ERROR_NOT_READY)
			return;
		q->gpu_head = c->next;
		if (!q->gpu_head)
			q->gpu_tail = NULL;
		c->gpu_busy = false;
		if (r)
			c->result = ferry__cuda_fail(r, "copy for %s at offset %llu", c->f->path,
						     (unsigned long long)c->off);
		else if (c->path == FERRY__P_GDS_ASYNC)
			c->result = gds_result(c->g_bytes, c);
		done(q, c);
	}
}

/* ------------------------------------------------------------------------------------- cuFile */

void ferry__gds_chunk_sync(struct ferry__ioq *q, struct ferry__chunk *c)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	ssize_t r;

	(void)q;
	if (ferry__cuda_set_device(c->dev)) {
		c->result = FERRY_ENOGPU;
		return;
	}
	/* cuFileRead is synchronous: the host waits for the caller's stream work first */
	if (c->entry && c->entry->start_ev && (r = ferry__cuda()->EventSynchronize(c->entry->start_ev))) {
		c->result = ferry__cuda_fail((ferry__CUresult)r, "waiting for the caller's stream before cuFile");
		return;
	}
	r = c->is_write ? cf->Write(c->f->gds_handle, c->buf, c->len, (off_t)c->off, 0)
			: cf->Read(c->f->gds_handle, c->buf, c->len, (off_t)c->off, 0);
	c->result = gds_result(r, c);
}

int ferry__gds_batch_submit(struct ferry__ioq *q)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	struct ferry__ioq_gpu *g = q->gpu;
	ferry__CUfileError_t e;
	unsigned n = 0;

	if (!g && !(g = q->gpu = calloc(1, sizeof(*g))))
		return -ENOMEM;
	if (!g->batch_ready) {
		g->params = calloc(q->depth, sizeof(*g->params));
		g->events = calloc(q->depth, sizeof(*g->events));
		if (!g->params || !g->events)
			return -ENOMEM;
		e = cf->BatchIOSetUp(&g->batch, q->depth);
		if (e.err) {
			char why[256];
			return ferry__error(FERRY_ECUFILE, "cuFileBatchIOSetUp(%u): %s", q->depth,
					    ferry__cufile_explain(e, why, sizeof(why)));
		}
		g->batch_ready = true;
	}
	for (struct ferry__chunk *c = q->gds_batch; c; c = c->next, n++) {
		ferry__CUfileIOParams_t *p = &g->params[n];
		memset(p, 0, sizeof(*p));
		p->mode = FERRY__CUFILE_BATCH;
		p->u.batch.devPtr_base = c->buf;
		p->u.batch.file_offset = (off_t)c->off;
		p->u.batch.devPtr_offset = 0;
		p->u.batch.size = c->len;
		p->fh = c->f->gds_handle;
		p->opcode = c->is_write ? FERRY__CUFILE_WRITE : FERRY__CUFILE_READ;
		p->cookie = c;
	}
	e = cf->BatchIOSubmit(g->batch, n, g->params, 0);
	if (e.err) {
		char why[256];
		int err = ferry__error(FERRY_ECUFILE, "cuFileBatchIOSubmit(%u): %s", n,
				       ferry__cufile_explain(e, why, sizeof(why)));
		/* nothing was started: fail the chunks, they complete now */
		while (q->gds_batch) {
			struct ferry__chunk *c = q->gds_batch;
			q->gds_batch = c->next;
			c->result = err;
			ferry__ioq_push_finished(q, c);
		}
		return 0;
	}
	q->gds_batch = NULL;
	q->gds_inflight += n;
	return (int)n;
}

int ferry__gds_batch_reap(struct ferry__ioq *q, bool block,
			  void (*done)(struct ferry__ioq *q, struct ferry__chunk *c))
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	struct ferry__ioq_gpu *g = q->gpu;
	struct timespec zero = {0, 0};
	unsigned nr = q->depth;
	ferry__CUfileError_t e;

	e = cf->BatchIOGetStatus(g->batch, block ? 1 : 0, &nr, g->events, block ? NULL : &zero);
	if (e.err)
		return FERRY_ECUFILE;
	for (unsigned i = 0; i < nr; i++) {
		struct ferry__chunk *c = g->events[i].cookie;
		if (!c)
			continue;
		if (g->events[i].status == FERRY__CUFILE_COMPLETE)
			c->result = gds_result((ssize_t)g->events[i].ret, c);
		else if (g->events[i].status & (FERRY__CUFILE_FAILED | FERRY__CUFILE_CANCELED |
						FERRY__CUFILE_INVALID | FERRY__CUFILE_TIMEOUT))
			c->result = ferry__error(FERRY_ECUFILE, "cuFile batch %s of %s at offset %llu: status 0x%x",
						 c->is_write ? "write" : "read", c->f->path,
						 (unsigned long long)c->off, g->events[i].status);
		else
			continue;
		q->gds_inflight--;
		done(q, c);
	}
	return (int)nr;
}

void ferry__ioq_gpu_exit(struct ferry__ioq *q)
{
	const struct ferry__cuda_api *cu = q->gpu ? ferry__cuda() : NULL;
	struct ferry__ioq_gpu *g = q->gpu;

	if (!g)
		return;
	/* drain what the GPU still holds: its copies write into slots we are about to free */
	while (q->gpu_head) {
		struct ferry__chunk *c = q->gpu_head;
		ferry__cuda_set_device(c->dev);
		cu->EventSynchronize(g->dev[c->dev].ev[chunk_index(q, c)]);
		q->gpu_head = c->next;
	}
	q->gpu_tail = NULL;
	for (int d = 0; d < FERRY__MAX_GPUS; d++) {
		struct gpu_dev *gd = &g->dev[d];
		if (!gd->ready)
			continue;
		ferry__cuda_set_device(d);
		for (unsigned i = 0; i < q->depth; i++)
			cu->EventDestroy(gd->ev[i]);
		cu->StreamDestroy(gd->stream);
		free(gd->ev);
	}
	if (g->pinned)
		cu->MemHostUnregister(q->slot_mem);
	if (g->batch_ready)
		ferry__cufile()->BatchIODestroy(g->batch);
	free(g->params);
	free(g->events);
	free(g);
	q->gpu = NULL;
}

/* ----------------------------------------------------------------------------- stream ordering */

int ferry__stream_begin(int dev, void *stream, void **start_ev)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUcontext prev = NULL;
	ferry__CUevent ev = NULL;
	ferry__CUresult r;
	int err = ferry__cuda_enter_device(dev, &prev);

	if (err)
		return err;
	r = cu->EventCreate(&ev, FERRY__CU_EVENT_DISABLE_TIMING);
	if (!r && (r = cu->EventRecord(ev, (ferry__CUstream)stream)))
		cu->EventDestroy(ev);
	ferry__cuda_leave_device(prev);
	if (r)
		return ferry__cuda_fail(r, "recording an event on the caller's stream %p (device %d)", stream, dev);
	*start_ev = ev;
	return 0;
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
	ferry__CUcontext prev = NULL;

	if (!start_ev || ferry__cuda_enter_device(dev, &prev))
		return;
	ferry__cuda()->EventDestroy((ferry__CUevent)start_ev);
	ferry__cuda_leave_device(prev);
}
