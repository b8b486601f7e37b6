/* A queue: one backend ring plus the chunk logic over it (bounce slots, resubmission of short and
 * interrupted transfers). Used by the workers and, as ferry_queue, by callers' own threads. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "gpu/ring.h"

int ferry__ioq_init(struct ferry__ioq *q, ferry_ctx *ctx, unsigned depth, unsigned nslots, unsigned flags)
{
	struct ferry__ring_opts o = {0};
	struct iovec *iov = NULL;
	int ret;

	memset(q, 0, sizeof(*q));
	q->ctx = ctx;
	q->ops = ctx->backend;
	q->depth = depth;
	q->nslots = nslots;
	q->slot_size = ferry__slot_size(ctx);
	q->chunks = calloc(depth, sizeof(*q->chunks));
	q->tags = calloc(depth, sizeof(*q->tags));
	q->res = calloc(depth, sizeof(*q->res));
	q->free_slots = calloc(nslots ? nslots : 1, sizeof(*q->free_slots));
	if (!q->chunks || !q->tags || !q->res || !q->free_slots)
		goto nomem;
	for (unsigned i = 0; i < depth; i++) {
		q->chunks[i].next = q->free_chunks;
		q->free_chunks = &q->chunks[i];
	}
	if (nslots) {
		q->slot_mem = ferry_alloc_aligned(q->slot_size * nslots);
		iov = calloc(nslots, sizeof(*iov));
		if (!q->slot_mem || !iov)
			goto nomem;
		for (unsigned i = 0; i < nslots; i++) {
			q->free_slots[q->nfree_slots++] = (int)(nslots - 1 - i);
			iov[i].iov_base = q->slot_mem + q->slot_size * i;
			iov[i].iov_len = q->slot_size;
		}
	}
	o.sqpoll = ctx->cfg.sqpoll;
	o.reg = ctx->cfg.reg;
	o.bufs = flags & FERRY__IOQ_REG_BUFS ? iov : NULL;
	o.nbufs = flags & FERRY__IOQ_REG_BUFS ? nslots : 0;
	o.owner_only = flags & FERRY__IOQ_OWNER;
	o.no_coop = ctx->cfg.uring_no_coop;
	o.no_defer = !ctx->cfg.uring_defer;
	q->owner_only = o.owner_only;
	q->owner = pthread_self();
	ret = q->ops->ring_init(&q->ring, depth, &o);
	free(iov);
	if (ret < 0) {
		ferry__ioq_exit(q);
		return ferry__error(ret, "%s: ring setup (depth %u)", q->ops->name, depth);
	}
	pthread_mutex_lock(&ctx->mu);
	ferry__ring_register(ctx, q);
	pthread_mutex_unlock(&ctx->mu);
	return 0;
nomem:
	free(iov);
	ferry__ioq_exit(q);
	return ferry__error(-ENOMEM, "allocating a queue of depth %u with %u slots", depth, nslots);
}

void ferry__ioq_exit(struct ferry__ioq *q)
{
	ferry__span_flush(q->spans, 1);
	ferry__ioq_gpu_exit(q);
	if (q->gds)
		ferry__backend_cufile.ring_exit(q->gds);
	q->gds = NULL;
	if (q->ctx)
		ferry__stats_flush(q->ctx, q->stats);
	if (q->ring) {
		pthread_mutex_lock(&q->ctx->mu);
		ferry__ring_unregister(q->ctx, q);
		pthread_mutex_unlock(&q->ctx->mu);
		q->ops->ring_exit(q->ring);
		q->ring = NULL;
	}
	free(q->files_seen);
	q->files_seen = NULL;
	ferry_free_aligned(q->slot_mem, q->slot_size * q->nslots);
	free(q->chunks);
	free(q->tags);
	free(q->res);
	free(q->free_slots);
	q->chunks = NULL;
	q->tags = NULL;
	q->res = NULL;
	q->free_slots = NULL;
	q->slot_mem = NULL;
}

struct ferry__chunk *ferry__ioq_get(struct ferry__ioq *q)
{
	struct ferry__chunk *c = q->free_chunks;

	if (c) {
		q->free_chunks = c->next;
		c->next = NULL;
		q->pending++;
	}
	return c;
}

void ferry__ioq_put(struct ferry__ioq *q, struct ferry__chunk *c)
{
	c->next = q->free_chunks;
	q->free_chunks = c;
	q->pending--;
}

void ferry__ioq_push_finished(struct ferry__ioq *q, struct ferry__chunk *c)
{
	ferry__chunk_append(&q->finished, &q->finished_tail, c);
}


/*
 * Resident chunks bound for GPU memory are memory copies. Through io_uring they were slower (31.6
 * against 43.6 GB/s from tmpfs with psync, docs/PAGECACHE.md): the ring runs each queued read in
 * io_uring_enter or punts it to a kernel worker, and every copy to the GPU waits for the whole
 * submission. With cached_io=thread the worker copies them itself, one at a time, and starts each
 * one's copy to the GPU as soon as it lands.
 */
/*
 * Small resident reads into host memory are copied by the worker too. tmpfs (and other files
 * without FMODE_NOWAIT) makes io_uring punt every read to an io-wq kernel thread: a wakeup and a
 * context switch per piece. 4 KiB random reads from /dev/shm, read_batch of 32 (bench/small-reads.py,
 * the 2-core VM, 2026-11-25): 14.1 -> 6.6 us of CPU per piece, 0.31 -> 0.25 voluntary switches per
 * piece, and no iou-wrk thread left. Large chunks stay on the ring, where io-wq copies them in parallel.
 */
#define HOST_THREAD_MAX ((size_t)256 << 10)

static bool copied_by_thread(const struct ferry__ioq *q, const struct ferry__chunk *c)
{
	if (c->unit.in)
		return true;
	if (!c->bounce.cached || c->is_write || q->ops == &ferry__backend_psync)
		return false;
	if (c->bounce.staged)
		return q->ctx->cfg.cached_io == FERRY__CACHED_IO_THREAD;
	return c->len <= HOST_THREAD_MAX;
}

static void prep(struct ferry__ioq *q, struct ferry__chunk *c)
{
	struct ferry__op op;
	int ret;

	if (c->f->remote || copied_by_thread(q, c)) { /* remote: ranged GETs in this thread (remote.c) */
		ferry__chunk_append(&q->sync_head, &q->sync_tail, c);
		return;
	}
	ferry__chunk_op(c, &op);
	ret = q->ops->prep(q->ring, &op);
	if (ret < 0) {
		/* Cannot happen while pending <= depth; finish the chunk with the error rather than lose it. */
		c->result = ret;
		ferry__ioq_push_finished(q, c);
		return;
	}
	q->queued++;
}

/* Page-cache copies bound for the GPU hold at most cached_depth slots (docs/CONFIG.md), except
 * small ones: their copies are gathered into one call per round, and four per round made 4 KiB
 * reads into GPU memory pay a gathered copy call (about 30 us) per four pieces. */
static bool counts_cached(const struct ferry__chunk *c)
{
	return c->bounce.cached && c->bounce.staged && c->len > HOST_THREAD_MAX;
}

/* A slot for c now? */
static bool can_take_slot(const struct ferry__ioq *q, const struct ferry__chunk *c)
{
	return q->nfree_slots > 0 && (!counts_cached(c) || q->cached_slots < q->ctx->cfg.cached_depth);
}

static void give_slot(struct ferry__ioq *q, struct ferry__chunk *c)
{
	int idx = q->free_slots[--q->nfree_slots];

	if (counts_cached(c))
		q->cached_slots++;
	c->bounce.slot = q->slot_mem + q->slot_size * (size_t)idx;
	c->bounce.index = idx;
	if (c->is_write && c->dev < 0)
		memcpy(c->bounce.slot, c->buf, c->len);
}

/* A chunk that holds what it needs starts: device writes first copy into their slot. */
static void start(struct ferry__ioq *q, struct ferry__chunk *c)
{
	if (c->dev >= 0 && c->is_write && ferry__gpu_chunk_start(q, c))
		return;
	if (c->dev >= 0 && c->is_write && c->result < 0) {
		ferry__ioq_push_finished(q, c);
		return;
	}
	prep(q, c);
}

static void release_slot(struct ferry__ioq *q, struct ferry__chunk *c)
{
	if (!c->bounce.slot)
		return;
	if (c->unit.in) { /* its place in a copy unit, not one of the queue's slots */
		c->bounce.slot = NULL;
		return;
	}
	q->free_slots[q->nfree_slots++] = c->bounce.index;
	c->bounce.slot = NULL;
	if (counts_cached(c))
		q->cached_slots--;
	/* the oldest waiting chunk that may take a slot now */
	struct ferry__chunk **pw = &q->slot_wait, **pick = NULL;
	for (; *pw; pw = &(*pw)->next)
		if (can_take_slot(q, *pw))
			pick = pw;
	if (pick) {
		struct ferry__chunk *w = *pick;
		*pick = w->next;
		give_slot(q, w);
		start(q, w);
	}
}

/* A gds or gds-batch chunk goes to the queue's cufile ring, made at the first one (again when the
 * path switches between the two with nothing in flight). */
static void gds_prep(struct ferry__ioq *q, struct ferry__chunk *c)
{
	const struct ferry__backend_ops *cf = &ferry__backend_cufile;
	bool batch = c->path == FERRY__P_GDS_BATCH;
	struct ferry__op op = {.fd = -1, .fixed_file = -1, .buf_index = -1, .handle = c->f->gds_handle,
			       .dev = c->dev, .is_write = c->is_write, .addr = c->buf, .len = c->len,
			       .off = c->off, .tag = c};
	int ret = 0;

	if (q->gds && q->gds_batch != batch && !q->gds_queued && !q->gds_inflight) {
		cf->ring_exit(q->gds);
		q->gds = NULL;
	}
	if (!q->gds) {
		struct ferry__ring_opts o = {.gds_batch = batch};
		if (!(ret = cf->ring_init(&q->gds, q->depth, &o)))
			q->gds_batch = batch;
	}
	if (!ret && q->gds_batch != batch)
		ret = ferry__error(-EBUSY, "%s: gds and gds-batch transfers at once in one queue", c->f->path);
	/* cuFile's calls are not ordered on the caller's stream: they wait until it has passed */
	if (!ret && (ret = ferry__gpu_started(c)) == 0) {
		ferry__ioq_defer_start(q, c);
		return;
	}
	if (ret > 0)
		ret = 0;
	if (!ret)
		ret = cf->prep(q->gds, &op);
	if (ret) {
		c->result = ret;
		ferry__ioq_push_finished(q, c);
		return;
	}
	q->gds_queued++;
}

void ferry__ioq_queue(struct ferry__ioq *q, struct ferry__chunk *c)
{
	c->gpu_busy = false;
	if (c->len == 0) {
		c->result = 0;
		c->plan.mode = FERRY__CH_BUFFERED;
		c->bounce.slot = NULL;
		ferry__ioq_push_finished(q, c);
		return;
	}
	if (c->dev >= 0 && c->path >= FERRY__P_GDS) {
		q->stats[FERRY_STAT_CHUNKS]++;
		c->bounce.slot = NULL;
		c->result = 0;
		if (c->path == FERRY__P_GDS_ASYNC) {
			if (!ferry__gpu_chunk_start(q, c))
				ferry__ioq_push_finished(q, c);
		} else {
			gds_prep(q, c);
		}
		return;
	}
	if (ferry__chunk_begin(q->ctx, q->stats, c, q->nslots ? q->slot_size : 0)) {
		if (c->unit.in) {
			if (!ferry__units_slot(q, c)) /* no unit buffers: c->result says why */
				ferry__ioq_push_finished(q, c);
			else
				start(q, c);
			return;
		}
		if (!can_take_slot(q, c)) {
			c->next = q->slot_wait; /* newest first: the list is scanned for the oldest */
			q->slot_wait = c;
			return;
		}
		give_slot(q, c);
	}
	start(q, c);
}

int ferry__ioq_submit(struct ferry__ioq *q)
{
	int ret;

	if (q->gds_queued) {
		if ((ret = ferry__backend_cufile.submit(q->gds)) < 0)
			return ret;
		q->gds_inflight += q->gds_queued;
		q->gds_queued = 0;
	}
	if (!q->queued)
		return 0;
	ret = q->ops->submit(q->ring);
	if (ret < 0)
		return ret;
	q->inflight += q->queued;
	q->queued = 0;
	return ret;
}

/* A chunk's GPU operation is over: a device write goes on to storage, anything else is finished. */
static void gpu_done(struct ferry__ioq *q, struct ferry__chunk *c)
{
	if (c->result >= 0 && c->is_write && c->path < FERRY__P_GDS) {
		prep(q, c);
		return;
	}
	release_slot(q, c);
	ferry__ioq_push_finished(q, c);
}

/* Takes the cufile ring's completions (waiting for at least min). */
static void gds_reap(struct ferry__ioq *q, unsigned min)
{
	/* a failed status call leaves the ops in flight: the next reap asks again */
	int n = ferry__backend_cufile.reap(q->gds, min, q->tags, q->res, q->depth);

	for (int i = 0; i < n; i++) {
		struct ferry__chunk *c = q->tags[i];
		q->gds_inflight--;
		ferry__gds_complete(c, q->res[i]);
		gpu_done(q, c);
	}
}

static void stored(struct ferry__ioq *q, struct ferry__chunk *c)
{
	if (c->unit.in) {
		/* every piece arrives once, whatever its result; the last one carries the copy */
		if (ferry__units_arrive(q, c))
			return;
		release_slot(q, c);
		ferry__ioq_push_finished(q, c);
		return;
	}
	if (c->dev >= 0 && !c->is_write && c->result > 0 && ferry__gpu_chunk_stored(q, c))
		return;
	release_slot(q, c);
	ferry__ioq_push_finished(q, c);
}

void ferry__ioq_defer_start(struct ferry__ioq *q, struct ferry__chunk *c)
{
	ferry__chunk_append(&q->start_head, &q->start_tail, c);
}

/* A chunk of the start list whose caller's stream has passed: on from where it waited. */
static void resume_started(struct ferry__ioq *q, struct ferry__chunk *c)
{
	if (c->path == FERRY__P_GDS || c->path == FERRY__P_GDS_BATCH)
		gds_prep(q, c);
	else if (c->path == FERRY__P_GDS_ASYNC) {
		if (!ferry__gpu_chunk_start(q, c))
			ferry__ioq_push_finished(q, c);
	} else if (c->is_write)
		start(q, c);
	else
		stored(q, c);
}

/* Asks each chunk of the start list again; returns whether any went on. */
static bool start_poll(struct ferry__ioq *q)
{
	struct ferry__chunk *c = q->start_head;
	bool moved = false;

	q->start_head = q->start_tail = NULL;
	while (c) {
		struct ferry__chunk *next = c->next;
		c->next = NULL;
		int r = ferry__gpu_started(c);
		if (r == 0) {
			ferry__chunk_append(&q->start_head, &q->start_tail, c);
		} else if (r < 0) {
			c->result = r;
			release_slot(q, c);
			ferry__ioq_push_finished(q, c);
			moved = true;
		} else {
			resume_started(q, c);
			moved = true;
		}
		c = next;
	}
	if (moved)
		q->start_nap_us = 0;
	return moved;
}

/* Only chunks waiting for their callers' streams are left: sleep a little before asking again
 * (from 10 us, doubling up to 200 us: a stream's work ahead of a read is usually milliseconds). */
static void start_nap(struct ferry__ioq *q)
{
	q->start_nap_us = q->start_nap_us ? q->start_nap_us * 2 : 10;
	if (q->start_nap_us > 200)
		q->start_nap_us = 200;
	struct timespec ts = {0, (long)q->start_nap_us * 1000};
	nanosleep(&ts, NULL);
}

/* Does the oldest chunk of the thread's own list: one pread (resubmitted like a ring's result). */
static void run_one_sync(struct ferry__ioq *q)
{
	struct ferry__chunk *c = q->sync_head;
	struct ferry__op op;

	q->sync_head = c->next;
	if (!q->sync_head)
		q->sync_tail = NULL;
	c->next = NULL;
	if (c->unit.in)
		ferry__units_wait(q, c); /* the buffer's previous round is copied out */
	/* to the end here: a short read sent to the back of the list could wait behind a later
	 * round of its own unit buffer, which waits for it */
	int64_t res;
	uint64_t t0 = FERRY__SPAN_T0();
	do {
		ferry__chunk_op(c, &op);
		res = ferry__fault(c, ferry__psync_do(&op));
	} while (ferry__chunk_complete(q->ctx, q->stats, c, res) == FERRY__CH_AGAIN);
	FERRY__SPAN_ADD(q, FERRY__SPAN_SYNC_READ, t0);
	stored(q, c);
}

int ferry__ioq_reap(struct ferry__ioq *q, unsigned min, struct ferry__chunk **out, unsigned max)
{
	unsigned got = 0;
	bool polled = false;

	for (;;) {
		while (q->finished && got < max) {
			struct ferry__chunk *c = q->finished;
			q->finished = c->next;
			if (!q->finished)
				q->finished_tail = NULL;
			out[got++] = c;
		}
		if (got >= max || (got >= min && polled))
			return (int)got;
		if (q->gpu_head) {
			ferry__gpu_poll(q, false, gpu_done);
			if (q->finished)
				continue;
		}
		if (q->gds_inflight) {
			gds_reap(q, 0);
			if (q->finished)
				continue;
		}
		if (q->start_head && start_poll(q))
			continue;
		/* The ring's queued ops go in with the reap below, in one call, when nothing runs in
		 * between (no resident chunk to copy, no GDS batch) */
		unsigned merged = 0;
		if (q->queued && !q->gds_queued && !q->sync_head && q->ops->submit_reap) {
			merged = q->queued;
			q->inflight += merged;
			q->queued = 0;
		} else if (q->queued || q->gds_queued) {
			int ret = ferry__ioq_submit(q);
			if (ret < 0)
				return got ? (int)got : ret;
		}
		if (q->sync_head) {
			/* the ring's I/O is submitted: copy one resident chunk while it runs */
			run_one_sync(q);
			polled = true;
			continue;
		}
		bool other = q->gpu_head || q->gds_inflight;
		bool block = got < min && !q->finished;
		if (!q->inflight && !other) {
			/* only chunks waiting for their callers' streams: back to the worker after a
			 * nap, which takes more work meanwhile (a later request, on another stream,
			 * must not wait behind them) */
			if (q->start_head && block)
				start_nap(q);
			return (int)got;
		}
		polled = true;
		if (!q->inflight) {
			/* only GPU work is pending: wait for its oldest */
			if (block) {
				if (q->gpu_head)
					ferry__gpu_poll(q, true, gpu_done);
				else
					gds_reap(q, 1);
			}
			continue;
		}
		unsigned wait = block && !other ? 1 : 0;
		uint64_t t0 = FERRY__SPAN_T0();
		int n = merged ? q->ops->submit_reap(q->ring, wait, q->tags, q->res, q->depth)
			       : q->ops->reap(q->ring, wait, q->tags, q->res, q->depth);
		FERRY__SPAN_ADD(q, FERRY__SPAN_RING, t0);
		if (n < 0 && merged) { /* nothing went in: queued again, as after a failed submit */
			q->inflight -= merged;
			q->queued = merged;
		}
		if (n < 0)
			return got ? (int)got : n;
		q->inflight -= (unsigned)n;
		for (int i = 0; i < n; i++) {
			struct ferry__chunk *c = q->tags[i];
			int64_t res = ferry__fault(c, q->res[i]);
			if (ferry__chunk_complete(q->ctx, q->stats, c, res) == FERRY__CH_AGAIN) {
				prep(q, c);
				continue;
			}
			stored(q, c);
		}
		/* storage had nothing yet and the GPU has work: wait on the GPU's oldest, which is
		 * short next to a storage transfer, rather than spin */
		if (n == 0 && block && other && !q->finished) {
			if (q->gpu_head)
				ferry__gpu_poll(q, true, gpu_done);
			else
				gds_reap(q, 1);
		}
	}
}
