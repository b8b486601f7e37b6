/* Chunk arithmetic and the completion logic shared by every backend and by the inline path. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/engine.h"

#define MAX_RETRIES 1000 /* consecutive EINTR/EAGAIN before giving up on a chunk */

static inline uint64_t round_down(uint64_t x, uint64_t a)
{
	return x - x % a;
}

static inline uint64_t round_up(uint64_t x, uint64_t a)
{
	return round_down(x + a - 1, a);
}

void ferry__plan_chunk(uint64_t off, size_t len, uintptr_t addr, uint32_t bs, uint32_t mem_align,
		       bool have_direct, bool is_write, size_t slot_size, struct ferry__plan *p)
{
	bool off_ok = off % bs == 0 && len % bs == 0;

	p->io_off = off;
	p->io_len = len;
	p->mode = FERRY__CH_BUFFERED;
	if (!have_direct || len == 0)
		return;
	if (off_ok && addr % mem_align == 0) {
		p->mode = FERRY__CH_DIRECT;
		return;
	}
	if (is_write) {
		/* Only the address is off: copy into an aligned slot and write direct. Unaligned file
		 * ranges are written through the page cache rather than read-modify-written, which
		 * would race with writers of the neighbouring bytes of the same block. */
		if (off_ok && len <= slot_size)
			p->mode = FERRY__CH_BOUNCE;
		return;
	}
	uint64_t a0 = round_down(off, bs), a1 = round_up(off + len, bs);
	if (a1 - a0 <= slot_size) {
		p->mode = FERRY__CH_BOUNCE;
		p->io_off = a0;
		p->io_len = (size_t)(a1 - a0);
	}
}

uint64_t ferry__chunk_count(uint64_t off, uint64_t len, uint64_t chunk_size)
{
	if (len == 0)
		return 0;
	return (off + len - 1) / chunk_size - off / chunk_size + 1;
}

uint64_t ferry__chunk_end(uint64_t cur, uint64_t end, uint64_t chunk_size)
{
	uint64_t next = round_down(cur, chunk_size) + chunk_size;
	return next < end ? next : end;
}

/* cachestat(2), Linux 6.5: page-cache residency of a file range, without side effects (a
 * RWF_NOWAIT read would start read-ahead of what is missing, and then O_DIRECT would read it again). */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cachestat_range {
	uint64_t off, len;
};
struct cachestat_result {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static atomic_int cachestat_missing;

bool ferry__range_resident(const ferry_file *f, uint64_t off, uint64_t len)
{
	struct cachestat_range r = {off, len};
	struct cachestat_result cs;
	long page = 4096;

	if (f->in_memory) /* a syscall less a read: 4 KiB QD1 reads from /dev/shm pay it on each */
		return len > 0;
	if (atomic_load_explicit(&cachestat_missing, memory_order_relaxed) || !len)
		return false;
	if (syscall(__NR_cachestat, f->fd_buf, &r, &cs, 0) < 0) {
		if (errno == ENOSYS || errno == EPERM) /* old kernel, or a seccomp filter */
			atomic_store(&cachestat_missing, 1);
		return false;
	}
	/* pages of the range, counting the partial ones at both ends */
	uint64_t pages = (off + len + (uint64_t)page - 1) / (uint64_t)page - off / (uint64_t)page;
	return cs.nr_cache >= pages;
}

bool ferry__chunk_begin(ferry_ctx *ctx, uint64_t *local, struct ferry__chunk *c, size_t slot_size)
{
	struct ferry_file *f = c->f;
	bool direct = f->fd_direct >= 0 && c->path != FERRY__P_PAGECACHE;

	/* DESIGN.md decision 5: data already in RAM is read from it; O_DIRECT would go to the device. */
	c->bounce.cached = false;
	if (c->unit.in) { /* resident when its request was submitted (ferry__units_eligible) */
		direct = false;
		c->bounce.cached = true;
		ferry__count(ctx, local, FERRY_STAT_CACHED_CHUNKS, 1);
	} else if (direct && !c->is_write && ctx->cfg.direct == FERRY__DIRECT_AUTO &&
		   ferry__range_resident(f, c->off, c->len)) {
		direct = false;
		c->bounce.cached = true;
		ferry__count(ctx, local, FERRY_STAT_CACHED_CHUNKS, 1);
	}

	/* Device memory is always staged through a slot, whose address is aligned. */
	c->bounce.staged = c->dev >= 0;
	ferry__plan_chunk(c->off, c->len, c->bounce.staged ? 0 : (uintptr_t)c->buf, f->block_size, f->mem_align,
			  direct, c->is_write, slot_size, &c->plan);
	c->done = 0;
	c->retries = 0;
	c->result = 0;
	c->bounce.slot = NULL;
	c->bounce.index = -1;
	ferry__count(ctx, local, FERRY_STAT_CHUNKS, 1);
	switch (c->plan.mode) {
	case FERRY__CH_DIRECT:
		ferry__count(ctx, local, FERRY_STAT_DIRECT_CHUNKS, 1);
		return c->bounce.staged;
	case FERRY__CH_BOUNCE:
		ferry__count(ctx, local, FERRY_STAT_BOUNCED_CHUNKS, 1);
		return true;
	default:
		ferry__count(ctx, local, FERRY_STAT_BUFFERED_CHUNKS, 1);
		if (direct && c->len)
			ferry__count(ctx, local, FERRY_STAT_FALLBACKS, 1);
		return c->bounce.staged;
	}
}

void ferry__chunk_op(const struct ferry__chunk *c, struct ferry__op *op)
{
	const struct ferry_file *f = c->f;
	bool direct = c->plan.mode != FERRY__CH_BUFFERED;

	op->fd = direct ? f->fd_direct : f->fd_buf;
	op->fixed_file = f->slot >= 0 ? 2 * f->slot + (direct ? 1 : 0) : -1;
	op->is_write = c->is_write;
	bool slot = c->bounce.staged || c->plan.mode == FERRY__CH_BOUNCE;
	op->addr = (slot ? c->bounce.slot : c->buf) + c->done;
	op->buf_index = slot ? c->bounce.index : -1;
	op->len = c->plan.io_len - c->done;
	op->off = c->plan.io_off + c->done;
	op->tag = (void *)c;
	op->remote = f->remote;
}

static void finish(struct ferry__chunk *c)
{
	if (c->is_write) {
		c->result = (int64_t)(c->done < c->len ? c->done : c->len);
		return;
	}
	if (c->plan.mode == FERRY__CH_BOUNCE || c->bounce.staged) {
		size_t head = (size_t)(c->off - c->plan.io_off);
		size_t valid = c->done > head ? c->done - head : 0;
		size_t n = valid < c->len ? valid : c->len;
		c->bounce.copy_off = head;
		if (!c->bounce.staged) /* device memory is copied by the GPU layer */
			memcpy(c->buf, c->bounce.slot + head, n);
		c->result = (int64_t)n;
		return;
	}
	c->result = (int64_t)c->done;
}

int ferry__chunk_complete(ferry_ctx *ctx, uint64_t *local, struct ferry__chunk *c, int64_t res)
{
	if (res == -EINTR || res == -EAGAIN) {
		ferry__count(ctx, local, FERRY_STAT_RETRIES, 1);
		if (++c->retries <= MAX_RETRIES)
			return FERRY__CH_AGAIN;
	}
	if (res == -EINVAL && c->plan.mode != FERRY__CH_BUFFERED && c->done == 0) {
		/* The file system opened O_DIRECT but refuses this transfer (some FUSE and network
		 * file systems do): finish it through the page cache, and count the fallback. */
		c->plan.mode = FERRY__CH_BUFFERED;
		c->plan.io_off = c->off;
		c->plan.io_len = c->len;
		ferry__count(ctx, local, FERRY_STAT_FALLBACKS, 1);
		ferry__count(ctx, local, FERRY_STAT_BUFFERED_CHUNKS, 1);
		return FERRY__CH_AGAIN;
	}
	if (res < 0) {
		c->result = res;
		return FERRY__CH_FINISHED;
	}
	c->retries = 0;
	if (res == 0) {
		if (c->is_write) {
			c->result = -EIO; /* a write that makes no progress would loop forever */
			return FERRY__CH_FINISHED;
		}
		finish(c); /* end of file */
		return FERRY__CH_FINISHED;
	}
	c->done += (size_t)res;
	if (c->done >= c->plan.io_len) {
		finish(c);
		return FERRY__CH_FINISHED;
	}
	/* A direct read that ends inside a block has reached end of file. */
	if (!c->is_write && c->plan.mode != FERRY__CH_BUFFERED && c->done % c->f->block_size) {
		finish(c);
		return FERRY__CH_FINISHED;
	}
	ferry__count(ctx, local, FERRY_STAT_RETRIES, 1);
	return FERRY__CH_AGAIN;
}

void ferry__chunk_run_sync(ferry_ctx *ctx, struct ferry__chunk *c)
{
	struct ferry__op op;

	for (;;) {
		ferry__chunk_op(c, &op);
		int64_t res = ferry__fault(c, ferry__psync_do(&op));
		if (ferry__chunk_complete(ctx, NULL, c, res) == FERRY__CH_FINISHED)
			return;
	}
}

/* ------------------------------------------------------------------------------ fault injection */

/* Only in builds for the tests (CMake's FERRY_TESTING): a release library or wheel ignores
 * FERRY_FAULT_INJECT. */
#ifndef FERRY_TESTING
int64_t ferry__fault(const struct ferry__chunk *c, int64_t res)
{
	(void)c;
	return res;
}
#else
static struct {
	pthread_once_t once;
	unsigned every_short, every_eintr, every_eagain;
	atomic_uint count;
} fault = {PTHREAD_ONCE_INIT};

static void fault_init(void)
{
	const char *s = getenv("FERRY_FAULT_INJECT");

	while (s && *s) {
		unsigned n = 0;
		const char *eq = strchr(s, '=');
		if (!eq)
			break;
		n = (unsigned)strtoul(eq + 1, NULL, 10);
		if (!strncmp(s, "short", 5))
			fault.every_short = n;
		else if (!strncmp(s, "eintr", 5))
			fault.every_eintr = n;
		else if (!strncmp(s, "eagain", 6))
			fault.every_eagain = n;
		s = strchr(eq, ',');
		if (s)
			s++;
	}
}

int64_t ferry__fault(const struct ferry__chunk *c, int64_t res)
{
	unsigned n;

	pthread_once(&fault.once, fault_init);
	if (!fault.every_short && !fault.every_eintr && !fault.every_eagain)
		return res;
	n = atomic_fetch_add_explicit(&fault.count, 1, memory_order_relaxed) + 1;
	if (fault.every_eintr && n % fault.every_eintr == 0)
		return -EINTR;
	if (fault.every_eagain && n % fault.every_eagain == 0)
		return -EAGAIN;
	if (fault.every_short && n % fault.every_short == 0 && res > 1) {
		/* Shorten as the kernel would: whole blocks for O_DIRECT, any count otherwise. */
		int64_t unit = c->plan.mode == FERRY__CH_BUFFERED ? 1 : c->f->block_size;
		int64_t half = res / 2 / unit * unit;
		if (half > 0)
			return half;
	}
	return res;
}
#endif /* FERRY_TESTING */
