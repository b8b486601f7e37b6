/*
 * Copy units: page-cache-resident reads into device memory in few, large copies from a small set
 * of pinned buffers (docs/PAGECACHE.md has the measurement that chose this).
 *
 * A unit is copy_unit bytes of one request (an entry), cut at chunk boundaries. The workers take
 * a unit entry's chunks one at a time, so a unit's chunks are read by several workers at once,
 * each into its place in the unit's buffer (pread: the data is in RAM). Whichever worker lands the
 * last chunk of the unit copies the whole unit to the GPU with one cuMemcpyHtoDAsync on the
 * device's unit stream, records the buffer's event there, and carries its own chunk until that
 * copy is done; the other chunks are finished as soon as they are read, so a request completes
 * only after the copy that holds its last unit's data. Unit seq uses buffer seq % n in round
 * seq / n; a chunk of round r waits before its read until round r - 1 was copied out of the
 * buffer. Every piece of a unit arrives exactly once, whatever its result, so no round waits for
 * ever; a unit with a failed or short piece copies only its good pieces.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu/ring.h"
#include "gpu/shim.h"
#include "engine/engine.h"

#define MAX_PIECES 64 /* chunks per unit */

struct unit {
	atomic_long issued;  /* last round whose copy was issued, -1 for none */
	atomic_uint arrived; /* pieces of the current round that are read (or failed) */
	/* the current round's pieces, written by their readers before they arrive */
	uint32_t len[MAX_PIECES];
	size_t off[MAX_PIECES]; /* in the unit */
	bool ok[MAX_PIECES];
	/* its pinned buffer, made at its first use (unit_mem); registered: ferry's memory pinned with
	 * cuMemHostRegister, else cuMemHostAlloc's */
	_Atomic(char *) mem;
	bool registered;
	pthread_mutex_t mu;
};

struct ferry__units {
	int dev;
	atomic_bool failed; /* could not be made, or the device failed a worker: unit chunks fail with err */
	atomic_bool copied; /* a unit was copied (the timeline's first_unit_copy) */
	int64_t err;
	size_t unit_size;
	unsigned n;
	/* the device's unit copies, shared by the workers: ticket i is recorded after each round's
	 * copy of unit i */
	struct ferry__ring_gpu *ring;
	struct unit *u;
};

static unsigned pieces_per_unit(const ferry_ctx *ctx)
{
	uint64_t p = ctx->cfg.copy_unit / ctx->cfg.chunk_size;
	return p > MAX_PIECES ? MAX_PIECES : (unsigned)p;
}

bool ferry__units_eligible(ferry_ctx *ctx, const struct ferry__entry *e)
{
	unsigned ppu = pieces_per_unit(ctx);
	struct stat st;

	if (ppu < 2 || !ctx->cfg.copy_units || e->dev < 0 || e->is_write || e->path != FERRY__P_PIPE ||
	    e->start_ev || ctx->cfg.direct != FERRY__DIRECT_AUTO || ctx->cfg.cached_io != FERRY__CACHED_IO_THREAD ||
	    e->len < 2 * ctx->cfg.chunk_size)
		return false;
	/* the device's units were made for this unit size (chunk_size may change between requests) */
	pthread_mutex_lock(&ctx->units_mu);
	struct ferry__units *us = ctx->units[e->dev];
	bool fits = !us || us->unit_size == (size_t)ppu * ctx->cfg.chunk_size;
	pthread_mutex_unlock(&ctx->units_mu);
	if (!fits)
		return false;
	/* a unit is copied whole: never past the end of the file into the caller's memory */
	if (fstat(e->f->fd_buf, &st) || (uint64_t)st.st_size < e->off + e->len)
		return false;
	/* resident: three chunks sampled (start, middle, end). cachestat walks every page of its
	 * range, and for a whole GiB that cost about as long as copying a tenth of it, on the
	 * submitting thread before any worker starts; the chunk path checks each chunk, in parallel.
	 * A range that is resident at both ends and the middle but not in between is still read
	 * correctly, through the page cache. */
	uint64_t cs = ctx->cfg.chunk_size, end = e->off + e->len; /* len >= 2 chunks */
	uint64_t mid = e->off + e->len / 2;
	mid -= mid % cs;
	if (mid < e->off)
		mid = e->off;
	return ferry__range_resident(e->f, e->off, cs) &&
	       ferry__range_resident(e->f, mid, end - mid < cs ? end - mid : cs) &&
	       ferry__range_resident(e->f, end - cs, cs);
}

void ferry__units_assign(ferry_ctx *ctx, struct ferry__entry *e, struct ferry__chunk *c)
{
	uint64_t end = e->off + e->len;

	if (!e->unit_left) {
		/* a new unit from here: its pieces are the next ppu chunks of the entry */
		unsigned ppu = pieces_per_unit(ctx), np = 0;
		uint64_t cur = c->off;
		while (np < ppu && cur < end) {
			cur = ferry__chunk_end(cur, end, ctx->cfg.chunk_size);
			np++;
		}
		e->unit_seq = ctx->unit_next[e->dev]++; /* e->dev < FERRY__MAX_GPUS: eligible */
		e->unit_left = e->unit_np = np;
		e->unit_first = c->off;
		e->unit_bytes = (size_t)(cur - c->off);
	}
	c->unit.in = true;
	c->unit.ready = false;
	c->unit.seq = e->unit_seq;
	c->unit.np = e->unit_np;
	c->unit.idx = e->unit_np - e->unit_left;
	c->unit.off = (size_t)(c->off - e->unit_first);
	c->unit.bytes = e->unit_bytes;
	c->unit.base = c->buf - c->unit.off;
	e->unit_left--;
}

static struct ferry__units *units_make(ferry_ctx *ctx, int dev)
{
	struct ferry__units *us = calloc(1, sizeof(*us));

	if (!us)
		return NULL;
	us->dev = dev;
	us->n = (unsigned)ctx->cfg.copy_units;
	us->unit_size = (size_t)pieces_per_unit(ctx) * ctx->cfg.chunk_size;
	us->u = calloc(us->n, sizeof(*us->u));
	if (!us->u) {
		us->err = ferry__error(-ENOMEM, "copy units of device %d", dev);
		atomic_store(&us->failed, true);
		return us;
	}
	for (unsigned i = 0; i < us->n; i++) {
		atomic_init(&us->u[i].issued, -1);
		atomic_init(&us->u[i].arrived, 0);
		atomic_init(&us->u[i].mem, NULL);
		pthread_mutex_init(&us->u[i].mu, NULL);
	}
	/* a reader waiting for a round's copy spins (ferry__units_wait) */
	us->err = ferry__ring_create(dev, us->n, FERRY__RING_SPIN, &us->ring);
	if (us->err) {
		ferry__error_append("making %u copy units of %zu bytes on device %d", us->n, us->unit_size, dev);
		atomic_store(&us->failed, true);
	}
	return us;
}

/*
 * Unit i's pinned buffer, made by the first chunk that needs it (dev current): the first round of
 * a fresh process's first read waits for its own unit's copy_unit bytes, not for all the units'
 * (one cuMemHostAlloc of 32 MiB before, under the units' lock, which the submitting thread and
 * every worker waited for: 12.5-17.5 ms of a fresh load on the H200, issue 22). The memory is
 * ferry's, huge-page advised and untouched, pinned by cuMemHostRegister, which faults it in:
 * 6.7 ms for 32 MiB in a fresh process on the H200 against 14.9 for cuMemHostAlloc
 * (bench/pin-cost.py); cuMemHostAlloc where registering is refused. NULL, with us->failed and
 * us->err set, when it cannot be made.
 */
static char *unit_mem(ferry_ctx *ctx, struct ferry__units *us, unsigned i)
{
	struct unit *u = &us->u[i];
	char *m = atomic_load_explicit(&u->mem, memory_order_acquire);

	if (m)
		return m;
	pthread_mutex_lock(&u->mu);
	m = atomic_load_explicit(&u->mem, memory_order_relaxed);
	if (!m && !atomic_load(&us->failed)) {
		uint64_t t0 = FERRY__SPAN_T0();
		const struct ferry__cuda_api *cu = ferry__cuda();
		ferry__CUresult r = FERRY__CUDA_ERROR_INVALID_VALUE;
		if ((m = ferry_alloc_aligned(us->unit_size)) &&
		    (r = cu->MemHostRegister(m, us->unit_size, FERRY__CU_MEMHOSTREGISTER_PORTABLE))) {
			ferry_free_aligned(m, us->unit_size);
			m = NULL;
		}
		u->registered = m != NULL;
		if (!m)
			r = cu->MemHostAlloc((void **)&m, us->unit_size, FERRY__CU_MEMHOSTALLOC_PORTABLE);
		if (r) {
			m = NULL;
			pthread_mutex_lock(&ctx->units_mu);
			if (!atomic_load(&us->failed)) {
				us->err = ferry__cuda_fail(r, "cuMemHostAlloc of copy unit %u (%zu bytes) on device %d",
							   i, us->unit_size, us->dev);
				atomic_store(&us->failed, true);
			}
			pthread_mutex_unlock(&ctx->units_mu);
		} else {
			atomic_store_explicit(&u->mem, m, memory_order_release);
		}
		FERRY__MARK("unit_pinned", ferry__worker_index, t0);
	}
	pthread_mutex_unlock(&u->mu);
	return m;
}

void ferry__units_prepare(ferry_ctx *ctx, int dev)
{
	if (pieces_per_unit(ctx) < 2 || !ctx->cfg.copy_units || ctx->cfg.direct != FERRY__DIRECT_AUTO ||
	    ctx->cfg.cached_io != FERRY__CACHED_IO_THREAD || dev < 0 || dev >= FERRY__MAX_GPUS)
		return;
	pthread_mutex_lock(&ctx->units_mu);
	if (!ctx->units[dev]) {
		uint64_t t0 = FERRY__SPAN_T0();
		ctx->units[dev] = units_make(ctx, dev); /* a failure is the first unit chunk's error */
		FERRY__MARK("units_made", ferry__worker_index, t0);
	}
	struct ferry__units *us = ctx->units[dev];
	pthread_mutex_unlock(&ctx->units_mu);
	/* one at a time, in the order a read uses them: each is there for readers as soon as it is
	 * made (a read that comes meanwhile makes the unit it needs itself) */
	for (unsigned i = 0; us && i < us->n && !atomic_load(&us->failed); i++)
		(void)unit_mem(ctx, us, i);
}

bool ferry__units_slot(struct ferry__ioq *q, struct ferry__chunk *c)
{
	ferry_ctx *ctx = q->ctx;
	struct ferry__units *us;

	static _Thread_local bool gpu_marked; /* the timeline's worker_gpu: this thread's first */
	uint64_t t0 = gpu_marked ? 0 : FERRY__SPAN_T0();
	bool usable = ferry__gpu_use(q, c); /* the device current, and this worker's stream and events */
	if (!gpu_marked) {
		gpu_marked = true;
		FERRY__MARK("worker_gpu", ferry__worker_index, t0);
	}
	pthread_mutex_lock(&ctx->units_mu);
	us = ctx->units[c->dev];
	if (!us && usable) {
		t0 = FERRY__SPAN_T0();
		us = ctx->units[c->dev] = units_make(ctx, c->dev);
		FERRY__MARK("units_made", ferry__worker_index, t0);
	}
	if (us && !usable && !atomic_load(&us->failed)) {
		/* this chunk will never arrive at its unit: nobody may wait for the unit again */
		us->err = c->result;
		atomic_store(&us->failed, true);
	}
	pthread_mutex_unlock(&ctx->units_mu);
	if (!usable)
		return false;
	if (!us) {
		c->result = ferry__error(-ENOMEM, "copy units of device %d", c->dev);
		return false;
	}
	if (atomic_load(&us->failed)) {
		c->result = us->err;
		return false;
	}
	char *mem = unit_mem(ctx, us, (unsigned)(c->unit.seq % us->n));
	if (!mem) {
		c->result = us->err;
		return false;
	}
	c->bounce.slot = mem + c->unit.off;
	c->bounce.index = -1;
	return true;
}

static struct unit *unit_of(const struct ferry__ioq *q, const struct ferry__chunk *c, long *round)
{
	struct ferry__units *us = q->ctx->units[c->dev]; /* made before the chunk got its slot */

	*round = (long)(c->unit.seq / us->n);
	return &us->u[c->unit.seq % us->n];
}

void ferry__units_wait(struct ferry__ioq *q, struct ferry__chunk *c)
{
	struct ferry__units *us = q->ctx->units[c->dev];
	long round;
	struct unit *u = unit_of(q, c, &round);

	if (c->unit.ready)
		return;
	c->unit.ready = true;
	if (round == 0)
		return;
	/* the previous round's pieces are all read (by workers that took them before this one) */
	while (atomic_load_explicit(&u->issued, memory_order_acquire) < round - 1) {
		if (atomic_load(&us->failed))
			return; /* a piece of it will never come; arrive fails this chunk */
		sched_yield();
	}
	/* and its copy is out of the buffer: issued is round - 1 until this round's copy, so the
	 * ticket is that copy's; an error belongs to that copy, whose carrier reports it */
	while (ferry__ring_query(us->ring, (unsigned)(c->unit.seq % us->n)) == 0)
		;
}

bool ferry__units_arrive(struct ferry__ioq *q, struct ferry__chunk *c)
{
	struct ferry__units *us = q->ctx->units[c->dev];
	long round;
	struct unit *u = unit_of(q, c, &round);
	int r;

	if (atomic_load(&us->failed)) {
		if (c->result >= 0)
			c->result = us->err;
		return false;
	}
	u->len[c->unit.idx] = (uint32_t)c->len;
	u->off[c->unit.idx] = c->unit.off;
	u->ok[c->unit.idx] = c->result == (int64_t)c->len;
	if (atomic_fetch_add_explicit(&u->arrived, 1, memory_order_acq_rel) + 1 != c->unit.np)
		return false; /* read; the unit's last reader copies it */
	/* the last piece: copy the unit (its good pieces, if one failed or came short) */
	atomic_store_explicit(&u->arrived, 0, memory_order_relaxed);
	bool all = true;
	for (unsigned i = 0; i < c->unit.np; i++)
		all &= u->ok[i];
	const char *base = c->bounce.slot - c->unit.off;
	uint64_t dst = (uint64_t)(uintptr_t)c->unit.base;
	if (all) {
		r = ferry__ring_h2d(us->ring, dst, base, c->unit.bytes, true);
	} else {
		r = 0;
		for (unsigned i = 0; i < c->unit.np && !r; i++)
			if (u->ok[i])
				r = ferry__ring_h2d(us->ring, dst + u->off[i], base + u->off[i], u->len[i], true);
	}
	if (!r)
		r = ferry__ring_record(us->ring, (unsigned)(c->unit.seq % us->n));
	/* the next round may start even after a failure: its readers wait for issued, then the event */
	atomic_store_explicit(&u->issued, round, memory_order_release);
	q->stats[FERRY_STAT_UNIT_COPIES]++;
	if (FERRY__UNLIKELY(ferry__span_on) && !atomic_exchange(&us->copied, true))
		ferry__mark("first_unit_copy", ferry__worker_index, 0);
	if (r) {
		if (c->result >= 0) {
			ferry__error_append("copy of a %zu-byte unit from %s (offset %llu)", c->unit.bytes,
					    c->f->path, (unsigned long long)(c->off - c->unit.off));
			c->result = r;
		}
		return false;
	}
	return ferry__gpu_record_on(q, c, us->ring);
}

void ferry__units_free(ferry_ctx *ctx)
{
	const struct ferry__cuda_api *cu = ferry__cuda();

	for (int d = 0; d < FERRY__MAX_GPUS; d++) {
		struct ferry__units *us = ctx->units[d];
		if (!us)
			continue;
		ferry__ring_destroy(us->ring); /* after the copies out of the units' buffers */
		bool current = cu && ferry__cuda_set_device(d) == 0;
		for (unsigned i = 0; us->u && i < us->n; i++) {
			char *m = atomic_load(&us->u[i].mem);
			if (m && us->u[i].registered) {
				if (current)
					cu->MemHostUnregister(m);
				ferry_free_aligned(m, us->unit_size);
			} else if (m && current) {
				cu->MemFreeHost(m);
			}
			pthread_mutex_destroy(&us->u[i].mu);
		}
		free(us->u);
		free(us);
		ctx->units[d] = NULL;
	}
}
