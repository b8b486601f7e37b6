/* Requests: synchronous, asynchronous and batched transfers split into chunks for the workers;
 * and caller-owned queues. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/remote.h"
#include "engine/publish.h"

struct ferry_req {
	struct ferry__group g;
	struct ferry__entry e;
	/* stream-ordered: a host function on the caller's stream holds it until the request is done */
	atomic_int hold_pending;
	pthread_mutex_t hold_mu;
	pthread_cond_t hold_cv;
};

struct ferry_batch {
	ferry_ctx *ctx;
	struct ferry__group g;
	struct ferry__entry *entries;
	size_t count, cap;
	bool running;
};

struct ferry_queue {
	ferry_ctx *ctx;
	struct ferry__ioq q;
	struct ferry__chunk **done;
};

static const char *mode_name(int mode)
{
	return mode == FERRY__CH_DIRECT ? "O_DIRECT" : mode == FERRY__CH_BOUNCE ? "O_DIRECT via bounce slot"
										: "buffered";
}

/* --------------------------------------------------------------------------------------- groups */

static void group_init(struct ferry__group *g, uint64_t entries)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	atomic_init(&g->entries_left, entries);
	atomic_init(&g->done, entries == 0);
}

static void group_destroy(struct ferry__group *g)
{
	/* The last worker sets done, broadcasts and unlocks under g->mu: taking it here makes sure
	 * that worker has let go before the memory goes away (requests live on callers' stacks). */
	pthread_mutex_lock(&g->mu);
	pthread_mutex_unlock(&g->mu);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
}

static void group_entry_done(struct ferry__group *g)
{
	if (atomic_fetch_sub(&g->entries_left, 1) == 1) {
		pthread_mutex_lock(&g->mu);
		atomic_store(&g->done, 1);
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
	}
}

static int group_wait_ctx(ferry_ctx *ctx, struct ferry__group *g, int64_t timeout_ns);
#define group_wait(g, t) group_wait_ctx(NULL, (g), (t))

static int group_wait_ctx(ferry_ctx *ctx, struct ferry__group *g, int64_t timeout_ns)
{
	struct timespec ts;
	int ret = 0;

	if (atomic_load(&g->done))
		return 0;
	uint64_t t0 = ctx && ctx->pub ? ferry__now_ns() : 0;
	if (timeout_ns >= 0) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ns;
		ts.tv_sec += (time_t)(ns / 1000000000u);
		ts.tv_nsec = (long)(ns % 1000000000u);
	}
	pthread_mutex_lock(&g->mu);
	while (!atomic_load(&g->done) && ret == 0)
		ret = timeout_ns >= 0 ? pthread_cond_timedwait(&g->cv, &g->mu, &ts)
				      : pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
	if (t0) /* how long a consumer waited for its data, for `ferry top` */
		FERRY__PUBLISH_ADD(ctx->pub, consumer_wait_ns, ferry__now_ns() - t0);
	return atomic_load(&g->done) ? 0 : -ETIMEDOUT;
}

/* -------------------------------------------------------------------------------------- entries */

static void entry_init(struct ferry__entry *e, struct ferry__group *g, ferry_file *f, void *buf,
		       uint64_t off, uint64_t len, bool is_write, uint64_t chunk_size, int dev, int path)
{
	memset(e, 0, sizeof(*e));
	e->dev = dev;
	e->path = path;
	e->f = f;
	e->buf = buf;
	e->off = off;
	e->len = len;
	e->is_write = is_write;
	e->cursor = off;
	e->group = g;
	atomic_init(&e->chunks_left, ferry__chunk_count(off, len, chunk_size));
	atomic_init(&e->short_end, (int_fast64_t)len);
	atomic_init(&e->error, 0);
}

static void account_into(ferry_ctx *ctx, uint64_t *local, bool is_write, int64_t result)
{
	if (result < 0) {
		ferry__count(ctx, local, FERRY_STAT_ERRORS, 1);
		return;
	}
	ferry__count(ctx, local, is_write ? FERRY_STAT_WRITES : FERRY_STAT_READS, 1);
	ferry__count(ctx, local, is_write ? FERRY_STAT_BYTES_WRITTEN : FERRY_STAT_BYTES_READ, (uint64_t)result);
}

static void account(ferry_ctx *ctx, bool is_write, int64_t result)
{
	account_into(ctx, NULL, is_write, result);
}

void ferry__stats_flush(ferry_ctx *ctx, uint64_t *local)
{
	for (int s = 0; s < FERRY_STAT__COUNT; s++)
		if (local[s]) {
			ferry__stat_add(ctx, (enum ferry_stat)s, local[s]);
			local[s] = 0;
		}
}

/* ------------------------------------------------------------------------------------- spans */

int ferry__span_on;
static pthread_once_t span_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t span_total[FERRY__SPAN__COUNT][2];
static _Atomic uint64_t span_logged_at;

static void span_at_exit(void);

static void span_read_env(void)
{
	const char *v = getenv("FERRY_ENGINE_TRACE");
	ferry__span_on = v && *v && strcmp(v, "0") != 0;
	if (ferry__span_on)
		atexit(span_at_exit); /* what the last 2 s gathered, in a process that never ends its context */
}

void ferry__span_init(void)
{
	pthread_once(&span_once, span_read_env);
}

void ferry__span_flush(uint64_t (*spans)[2], int force)
{
	static const char *const names[FERRY__SPAN__COUNT] = {
		"take", "queue", "sync_read", "gather", "h2d", "gpu_query", "gpu_wait", "ring", "done", "idle",
		"submit"};

	if (!ferry__span_on)
		return;
	for (int k = 0; k < FERRY__SPAN__COUNT; k++) {
		if (spans[k][1]) {
			atomic_fetch_add(&span_total[k][0], spans[k][0]);
			atomic_fetch_add(&span_total[k][1], spans[k][1]);
		}
		spans[k][0] = spans[k][1] = 0;
	}
	uint64_t now = ferry__now_ns(), last = atomic_load(&span_logged_at);
	if (!last) {
		atomic_compare_exchange_strong(&span_logged_at, &last, now);
		return;
	}
	if ((!force && now - last < 2000000000ull) || !atomic_compare_exchange_strong(&span_logged_at, &last, now))
		return;
	char line[1024];
	int n = snprintf(line, sizeof(line), "engine spans over %.2f s (all workers):", (double)(now - last) / 1e9);
	for (int k = 0; k < FERRY__SPAN__COUNT && n > 0 && (size_t)n < sizeof(line); k++) {
		uint64_t ns = atomic_exchange(&span_total[k][0], 0), cnt = atomic_exchange(&span_total[k][1], 0);
		if (cnt)
			n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %.3f s / %llu = %.2f us;", names[k],
				      (double)ns / 1e9, (unsigned long long)cnt, (double)ns / 1e3 / (double)cnt);
	}
	ferry__log(FERRY__LOG_INFO, "%s", line); /* asked for by FERRY_ENGINE_TRACE, whatever log_level says */
}

/* ----------------------------------------------------------------------------------- timeline */

#define MARKS 1024 /* later marks are dropped (counted) */

struct mark {
	uint64_t t0, t1;
	const char *what;
	int who;
};
static struct mark marks[MARKS];
static unsigned nmarks;
static pthread_mutex_t marks_mu = PTHREAD_MUTEX_INITIALIZER; /* a few hundred marks a process */
_Thread_local int ferry__worker_index = -1;

void ferry__mark(const char *what, int who, uint64_t t0)
{
	uint64_t now = ferry__now_ns();
	pthread_mutex_lock(&marks_mu);
	if (nmarks < MARKS)
		marks[nmarks] = (struct mark){t0 ? t0 : now, now, what, who};
	nmarks++;
	pthread_mutex_unlock(&marks_mu);
}

/* One line per kind of mark, in the order of their first start: "what xN +first..+last_end ms,
 * busy B ms (longest L)"; workers marked name how many distinct workers did it. */
static void timeline_log(void)
{
	pthread_mutex_lock(&marks_mu);
	unsigned n = nmarks, kept = n < MARKS ? n : MARKS;
	if (!kept) {
		pthread_mutex_unlock(&marks_mu);
		return;
	}
	uint64_t origin = UINT64_MAX;
	for (unsigned i = 0; i < kept; i++)
		if (marks[i].t0 < origin)
			origin = marks[i].t0;
	static bool shown[MARKS];
	memset(shown, 0, sizeof(shown));
	char line[8192];
	int len = snprintf(line, sizeof(line), "engine timeline (ms from CLOCK_MONOTONIC %.3f ms, %u marks%s):",
			   (double)origin / 1e6, n, n > kept ? ", later ones dropped" : "");
	for (;;) {
		/* the kind not shown yet whose first mark started earliest */
		int first = -1;
		for (unsigned i = 0; i < kept; i++)
			if (!shown[i] && (first < 0 || marks[i].t0 < marks[first].t0))
				first = (int)i;
		if (first < 0 || len <= 0 || (size_t)len >= sizeof(line))
			break;
		const char *what = marks[first].what;
		uint64_t lo = UINT64_MAX, hi = 0, busy = 0, longest = 0;
		unsigned cnt = 0;
		for (unsigned i = 0; i < kept; i++) {
			if (shown[i] || strcmp(marks[i].what, what))
				continue;
			shown[i] = true;
			cnt++;
			lo = marks[i].t0 < lo ? marks[i].t0 : lo;
			hi = marks[i].t1 > hi ? marks[i].t1 : hi;
			uint64_t d = marks[i].t1 - marks[i].t0;
			busy += d;
			longest = d > longest ? d : longest;
		}
		if (busy)
			len += snprintf(line + len, sizeof(line) - (size_t)len, " %s x%u +%.3f..+%.3f busy %.3f (longest %.3f);",
					what, cnt, (double)(lo - origin) / 1e6, (double)(hi - origin) / 1e6,
					(double)busy / 1e6, (double)longest / 1e6);
		else
			len += snprintf(line + len, sizeof(line) - (size_t)len, " %s x%u +%.3f..+%.3f;", what, cnt,
					(double)(lo - origin) / 1e6, (double)(hi - origin) / 1e6);
	}
	pthread_mutex_unlock(&marks_mu);
	ferry__log(FERRY__LOG_INFO, "%s", line); /* asked for by FERRY_ENGINE_TRACE */
}

static void span_at_exit(void)
{
	uint64_t none[FERRY__SPAN__COUNT][2] = {{0}};
	ferry__span_flush(none, 1);
	timeline_log();
}

void ferry__span_add1(int span, uint64_t t0)
{
	if (!ferry__span_on)
		return;
	atomic_fetch_add(&span_total[span][0], ferry__now_ns() - t0);
	atomic_fetch_add(&span_total[span][1], 1);
}

static void entry_finish(ferry_ctx *ctx, struct ferry__entry *e)
{
	int err = atomic_load(&e->error);

	e->result = err ? err : (int64_t)atomic_load(&e->short_end);
	FERRY__MARK(e->units ? "request_done(units)" : "request_done", ferry__worker_index, 0);
	account(ctx, e->is_write, e->result);
	group_entry_done(e->group);
}

/* Called by the workers for every finished chunk. */
void ferry__entry_chunk_done(ferry_ctx *ctx, struct ferry__entry *e, uint64_t chunk_off,
			     size_t chunk_len, int64_t result)
{
	if (result < 0) {
		int expected = 0;
		if (atomic_compare_exchange_strong(&e->error, &expected, (int)result))
			e->err_off = chunk_off; /* read by the waiter once the group is done */
	} else if ((size_t)result < chunk_len) {
		int_fast64_t end = (int_fast64_t)(chunk_off - e->off) + result;
		int_fast64_t cur = atomic_load(&e->short_end);
		while (end < cur && !atomic_compare_exchange_weak(&e->short_end, &cur, end))
			;
	}
	if (atomic_fetch_sub(&e->chunks_left, 1) == 1)
		entry_finish(ctx, e);
}

static int entry_error_detail(const struct ferry__entry *e)
{
	ferry_ctx *ctx = e->f->ctx;
	if (e->f->remote) { /* the worker's detail: URL, range, HTTP status, S3 Code */
		char why[1536];
		ferry__remote_last_error(e->f->remote, why, sizeof(why));
		return ferry__error((int)e->result, "pread(%s, offset %llu, %llu bytes): %s", e->f->path,
				    (unsigned long long)e->err_off, (unsigned long long)e->len, why);
	}
	return ferry__error((int)e->result, "%s(%s, offset %llu, %llu bytes) on %s, %s",
			    e->is_write ? "pwrite" : "pread", e->f->path, (unsigned long long)e->err_off,
			    (unsigned long long)e->len, ferry__backend_name(ctx),
			    e->f->fd_direct >= 0 ? "O_DIRECT descriptor" : "buffered descriptor");
}

static int check_args(ferry_file *f, const void *buf, size_t len, uint64_t off, bool is_write)
{
	if (!f)
		return ferry__error(-EINVAL, "%s: NULL file", is_write ? "pwrite" : "pread");
	if (!buf && len)
		return ferry__error(-EFAULT, "%s(%s): NULL buffer for %zu bytes",
				    is_write ? "pwrite" : "pread", f->path, len);
	if (len > (size_t)SSIZE_MAX || off > (uint64_t)INT64_MAX - len)
		return ferry__error(-EINVAL, "%s(%s): offset %llu + length %zu overflows",
				    is_write ? "pwrite" : "pread", f->path, (unsigned long long)off, len);
	if (is_write && !f->writable)
		return ferry__error(-EBADF, "pwrite(%s): the file was opened read-only", f->path);
	return 0;
}

/* The bytes one worker takes off the work list at a time: an even share of what is listed, at
 * least TAKE_MIN (below it, handing pieces to another worker costs more than copying them). */
#define TAKE_MIN ((uint64_t)2 << 20)

uint64_t ferry__take_share(const ferry_ctx *ctx, uint64_t listed)
{
	uint64_t share = ctx->nworkers ? listed / ctx->nworkers : listed;
	return share < TAKE_MIN ? TAKE_MIN : share;
}

/* Queues entries on the work list (they must have length; their groups initialised). */
static int submit_entries(ferry_ctx *ctx, struct ferry__entry *es, size_t n, size_t stride)
{
	uint64_t t0 = FERRY__SPAN_T0();
	int ret = ferry__ctx_start(ctx);
	if (ret)
		return ret;
	for (size_t i = 0; i < n; i++) {
		struct ferry__entry *e = (struct ferry__entry *)((char *)es + i * stride);
		e->units = e->len && ferry__units_eligible(ctx, e);
		e->unit_left = 0;
	}
	uint64_t chunks = 0, bytes = 0;
	pthread_mutex_lock(&ctx->mu);
	for (size_t i = 0; i < n; i++) {
		struct ferry__entry *e = (struct ferry__entry *)((char *)es + i * stride);
		if (!e->len)
			continue;
		chunks += atomic_load_explicit(&e->chunks_left, memory_order_relaxed);
		bytes += e->len;
		e->next_work = NULL;
		if (ctx->work_tail)
			ctx->work_tail->next_work = e;
		else
			ctx->work_head = e;
		ctx->work_tail = e;
	}
	/* As many workers as the chunks fill at queue_depth each (a worker also wakes an idle sibling
	 * when it leaves work behind, ctx.c): one for a small request. Waking every worker for each
	 * request had them all take the lock to find one chunk; waking one for a batch of 32 4 KiB
	 * reads and letting it wake the next cost 40% of read_batch's IOPS (bench/small-reads.py,
	 * the 2-core VM, threads=2, queue_depth 16). */
	uint64_t wake = (chunks + ctx->cfg.queue_depth - 1) / ctx->cfg.queue_depth;
	/* and as many as take a share of the bytes each: 32 pieces of 1 MiB woke 2 workers, which
	 * took 16 each and copied them one by one (6.9 GB/s into GPU memory against 18.5 for the
	 * same pieces as 32 requests, H100, bench/small-reads.py) */
	ctx->work_bytes += bytes;
	uint64_t share = ferry__take_share(ctx, ctx->work_bytes);
	uint64_t by_bytes = (ctx->work_bytes + share - 1) / share;
	if (by_bytes > wake)
		wake = by_bytes;
	if (wake >= ctx->nworkers)
		pthread_cond_broadcast(&ctx->work_cv);
	else
		while (wake--)
			pthread_cond_signal(&ctx->work_cv);
	pthread_mutex_unlock(&ctx->mu);
	ferry__span_add1(FERRY__SPAN_SUBMIT, t0);
	FERRY__MARK("submit", -1, t0);
	return 0;
}

/* -------------------------------------------------------------------------------- synchronous */

static char *slot_take(ferry_ctx *ctx)
{
	char *s = NULL;

	pthread_mutex_lock(&ctx->slot_mu);
	if (ctx->nslot_cache)
		s = ctx->slot_cache[--ctx->nslot_cache];
	pthread_mutex_unlock(&ctx->slot_mu);
	return s ? s : ferry_alloc_aligned(ferry__slot_size(ctx));
}

static void slot_give(ferry_ctx *ctx, char *s)
{
	pthread_mutex_lock(&ctx->slot_mu);
	if (ctx->nslot_cache == ctx->slot_cache_cap) {
		unsigned cap = ctx->slot_cache_cap ? ctx->slot_cache_cap * 2 : 8;
		char **n = cap <= 64 ? realloc(ctx->slot_cache, cap * sizeof(*n)) : NULL;
		if (n) {
			ctx->slot_cache = n;
			ctx->slot_cache_cap = cap;
		}
	}
	if (ctx->nslot_cache < ctx->slot_cache_cap) {
		ctx->slot_cache[ctx->nslot_cache++] = s;
		s = NULL;
	}
	pthread_mutex_unlock(&ctx->slot_mu);
	ferry_free_aligned(s, ferry__slot_size(ctx));
}

/* One chunk's worth, done in the calling thread: a handoff to a worker costs more than it saves. */
static ssize_t transfer_inline(ferry_file *f, void *buf, size_t len, uint64_t off, bool is_write)
{
	ferry_ctx *ctx = f->ctx;
	struct ferry__chunk c = {0};

	ferry__chunk_set(&c, f, buf, off, len, is_write, -1, FERRY__P_HOST);

	if (ferry__chunk_begin(ctx, NULL, &c, ferry__slot_size(ctx))) {
		c.bounce.slot = slot_take(ctx);
		if (!c.bounce.slot)
			return ferry__error(-ENOMEM, "%s(%s): allocating a bounce slot",
					    is_write ? "pwrite" : "pread", f->path);
		if (is_write)
			memcpy(c.bounce.slot, buf, len);
	}
	ferry__chunk_run_sync(ctx, &c);
	if (c.bounce.slot)
		slot_give(ctx, c.bounce.slot);
	account(ctx, is_write, c.result);
	if (c.result < 0)
		return ferry__error((int)c.result, "%s(%s, offset %llu, %zu bytes, %s) in the calling thread",
				    is_write ? "pwrite" : "pread", f->path, (unsigned long long)off, len,
				    mode_name(c.plan.mode));
	return (ssize_t)c.result;
}

static ssize_t transfer(ferry_file *f, void *buf, size_t len, uint64_t off, bool is_write)
{
	ferry_ctx *ctx;
	struct ferry_req r;
	int ret = check_args(f, buf, len, off, is_write);

	if (ret)
		return ret;
	if (len == 0)
		return 0;
	ctx = f->ctx;
	int dev, path;
	ret = ferry__resolve_path(ctx, f, buf, len, is_write, &dev, &path);
	if (ret)
		return ret;
	/* a remote object: a write goes in order from this thread (remote.c buffers its parts), and so
	 * does a read of one part or one chunk (its error keeps remote.c's detail: URL, range, status);
	 * a larger read is cut into chunks that the workers GET in parallel straight into buf, as reads
	 * into GPU memory are: one thread receives at about 1-2 GB/s (docs/REMOTE.md) */
	if (f->remote && path == FERRY__P_HOST &&
	    (is_write || len <= ctx->cfg.remote_part_size || ferry__chunk_count(off, len, ctx->cfg.chunk_size) == 1)) {
		int64_t n = is_write ? ferry__remote_write(f->remote, buf, len, off)
				     : ferry__remote_read(f->remote, buf, len, off);
		account(ctx, is_write, n);
		return (ssize_t)n;
	}
	if (path == FERRY__P_HOST && ferry__chunk_count(off, len, ctx->cfg.chunk_size) == 1)
		return transfer_inline(f, buf, len, off, is_write);
	group_init(&r.g, 1);
	entry_init(&r.e, &r.g, f, buf, off, len, is_write, ctx->cfg.chunk_size, dev, path);
	ret = submit_entries(ctx, &r.e, 1, sizeof(r.e));
	if (ret) {
		group_destroy(&r.g);
		return ret;
	}
	group_wait(&r.g, -1);
	group_destroy(&r.g);
	if (r.e.result < 0)
		return entry_error_detail(&r.e);
	return (ssize_t)r.e.result;
}

ssize_t ferry_pread(ferry_file *f, void *buf, size_t len, uint64_t offset)
{
	return transfer(f, buf, len, offset, false);
}

ssize_t ferry_pwrite(ferry_file *f, const void *buf, size_t len, uint64_t offset)
{
	return transfer(f, (void *)buf, len, offset, true);
}

/* ------------------------------------------------------------------------------- asynchronous */

/*
 * Requests are kept for reuse by the thread that destroyed them, their mutex and condition
 * variable still initialised: a future then costs no calloc and no pthread init/destroy (issue 22).
 * Freed when the thread exits.
 */
#define REQ_CACHE 256

struct req_cache {
	unsigned n;
	struct ferry_req *r[REQ_CACHE];
};

static pthread_key_t req_key; /* its destructor frees a thread's cache when the thread exits */
static bool req_key_ok;
static pthread_once_t req_once = PTHREAD_ONCE_INIT;
static _Thread_local struct req_cache *req_tl;

static void req_free(struct ferry_req *r)
{
	group_destroy(&r->g);
	free(r);
}

static void req_cache_free(void *p)
{
	struct req_cache *c = p;
	while (c->n)
		req_free(c->r[--c->n]);
	free(c);
	req_tl = NULL;
}

static void req_key_make(void)
{
	req_key_ok = pthread_key_create(&req_key, req_cache_free) == 0;
}

static struct req_cache *req_cache(bool make)
{
	struct req_cache *c = req_tl;
	if (c || !make)
		return c;
	pthread_once(&req_once, req_key_make);
	if (!req_key_ok || !(c = malloc(sizeof(*c))))
		return NULL;
	c->n = 0;
	if (pthread_setspecific(req_key, c)) {
		free(c);
		return NULL;
	}
	return req_tl = c;
}

/* A request whose group counts `entries` entries. */
static struct ferry_req *req_new(uint64_t entries)
{
	struct req_cache *c = req_cache(false);
	struct ferry_req *r;

	if (c && c->n) {
		r = c->r[--c->n];
		atomic_store(&r->g.entries_left, entries);
		atomic_store(&r->g.done, entries == 0);
		atomic_store(&r->hold_pending, 0);
		return r;
	}
	if (!(r = calloc(1, sizeof(*r))))
		return NULL;
	group_init(&r->g, entries);
	return r;
}

/* r's group is done and nothing else refers to r. */
static void req_put(struct ferry_req *r)
{
	struct req_cache *c = req_cache(true);

	if (!c || c->n == REQ_CACHE) {
		req_free(r);
		return;
	}
	/* the last worker broadcasts and unlocks under g.mu: it has let go once this returns */
	pthread_mutex_lock(&r->g.mu);
	pthread_mutex_unlock(&r->g.mu);
	c->r[c->n++] = r;
}

static int transfer_async(ferry_file *f, void *buf, size_t len, uint64_t off, bool is_write,
			  ferry_req **out)
{
	struct ferry_req *r;
	int ret;

	*out = NULL;
	int dev = -1, path = FERRY__P_HOST;
	ret = check_args(f, buf, len, off, is_write);
	if (!ret && len)
		ret = ferry__resolve_path(f->ctx, f, buf, len, is_write, &dev, &path);
	if (ret)
		return ret;
	r = req_new(len ? 1 : 0);
	if (!r)
		return ferry__error(-ENOMEM, "allocating a request");
	entry_init(&r->e, &r->g, f, buf, off, len, is_write, f->ctx->cfg.chunk_size, dev, path);
	if (len) {
		ret = submit_entries(f->ctx, &r->e, 1, sizeof(r->e));
		if (ret) {
			req_put(r);
			return ret;
		}
	} else {
		r->e.result = 0;
	}
	*out = r;
	return 0;
}

int ferry_pread_async(ferry_file *f, void *buf, size_t len, uint64_t offset, ferry_req **out)
{
	return transfer_async(f, buf, len, offset, false, out);
}

int ferry_pwrite_async(ferry_file *f, const void *buf, size_t len, uint64_t offset, ferry_req **out)
{
	return transfer_async(f, (void *)buf, len, offset, true, out);
}

int ferry_req_done(const ferry_req *r)
{
	return atomic_load(&((ferry_req *)r)->g.done);
}

ssize_t ferry_req_wait(ferry_req *r, int64_t timeout_ns)
{
	if (group_wait_ctx(r->e.f->ctx, &r->g, timeout_ns))
		return ferry__error(-ETIMEDOUT, "waiting for %s(%s, offset %llu)",
				    r->e.is_write ? "pwrite" : "pread", r->e.f->path,
				    (unsigned long long)r->e.off);
	if (r->e.result < 0)
		return entry_error_detail(&r->e);
	return (ssize_t)r->e.result;
}

void ferry_req_destroy(ferry_req *r)
{
	if (!r)
		return;
	group_wait(&r->g, -1);
	if (r->e.start_ev) {
		/* the host function on the caller's stream still points at r until it has run */
		pthread_mutex_lock(&r->hold_mu);
		while (atomic_load(&r->hold_pending))
			pthread_cond_wait(&r->hold_cv, &r->hold_mu);
		pthread_mutex_unlock(&r->hold_mu);
		pthread_mutex_destroy(&r->hold_mu);
		pthread_cond_destroy(&r->hold_cv);
		ferry__stream_end(r->e.dev, r->e.start_ev);
	}
	req_put(r);
}

/* Runs on CUDA's host-function thread, in order on the caller's stream: later work on the stream
 * starts only once the request is done. It makes no CUDA call, as host functions must not. */
static void stream_hold(void *arg)
{
	struct ferry_req *r = arg;

	group_wait(&r->g, -1);
	pthread_mutex_lock(&r->hold_mu);
	atomic_store(&r->hold_pending, 0);
	pthread_cond_broadcast(&r->hold_cv);
	pthread_mutex_unlock(&r->hold_mu);
}

static int transfer_stream(ferry_file *f, void *buf, size_t len, uint64_t off, bool is_write,
			   void *stream, ferry_req **out)
{
	const char *op = is_write ? "ferry_pwrite_stream" : "ferry_pread_stream";
	int dev = -1, path = FERRY__P_HOST, ret;
	struct ferry_req *r;

	if (!out)
		return ferry__error(-EINVAL, "%s: a request handle is needed (out is NULL)", op);
	*out = NULL;
	ret = check_args(f, buf, len, off, is_write);
	if (!ret && len)
		ret = ferry__resolve_path(f->ctx, f, buf, len, is_write, &dev, &path);
	if (ret)
		return ret;
	if (len && dev < 0)
		return ferry__error(-EINVAL, "%s(%s): the buffer is host memory; stream ordering is for device "
				    "memory (use ferry_%s_async)", op, f->path, is_write ? "pwrite" : "pread");
	r = req_new(len ? 1 : 0);
	if (!r)
		return ferry__error(-ENOMEM, "allocating a request");
	entry_init(&r->e, &r->g, f, buf, off, len, is_write, f->ctx->cfg.chunk_size, dev, path);
	if (!len) {
		*out = r;
		return 0;
	}
	pthread_mutex_init(&r->hold_mu, NULL);
	pthread_cond_init(&r->hold_cv, NULL);
	ret = ferry__stream_begin(dev, stream, &r->e.start_ev);
	if (ret)
		goto fail;
	ret = submit_entries(f->ctx, &r->e, 1, sizeof(r->e));
	if (ret)
		goto fail_ev;
	atomic_store(&r->hold_pending, 1);
	ret = ferry__stream_hold(dev, stream, stream_hold, r);
	if (ret) {
		/* the request runs, but the stream cannot be made to wait: report, after it finished */
		atomic_store(&r->hold_pending, 0);
		group_wait(&r->g, -1);
		goto fail_ev;
	}
	*out = r;
	return 0;
fail_ev:
	ferry__stream_end(dev, r->e.start_ev);
fail:
	pthread_mutex_destroy(&r->hold_mu);
	pthread_cond_destroy(&r->hold_cv);
	r->e.start_ev = NULL;
	req_put(r);
	return ret;
}

int ferry_pread_stream(ferry_file *f, void *dev_buf, size_t len, uint64_t offset, void *stream,
		       ferry_req **out)
{
	return transfer_stream(f, dev_buf, len, offset, false, stream, out);
}

int ferry_pwrite_stream(ferry_file *f, const void *dev_buf, size_t len, uint64_t offset, void *stream,
			ferry_req **out)
{
	return transfer_stream(f, (void *)dev_buf, len, offset, true, stream, out);
}

/* -------------------------------------------------------------------------------------- batches */

int ferry_batch_create(ferry_ctx *ctx, ferry_batch **out)
{
	struct ferry_batch *b = calloc(1, sizeof(*b));

	*out = NULL;
	if (!b)
		return ferry__error(-ENOMEM, "allocating a batch");
	b->ctx = ctx;
	group_init(&b->g, 0);
	*out = b;
	return 0;
}

void ferry_batch_destroy(ferry_batch *b)
{
	if (!b)
		return;
	if (b->running)
		group_wait(&b->g, -1);
	group_destroy(&b->g);
	free(b->entries);
	free(b);
}

static int batch_add(ferry_batch *b, ferry_file *f, uint64_t off, size_t len, void *buf, bool is_write)
{
	int ret;

	int dev = -1, path = FERRY__P_HOST;
	if (b->running)
		return ferry__error(FERRY_EBUSY, "ferry_batch_add: the batch is running");
	ret = check_args(f, buf, len, off, is_write);
	if (!ret && len)
		ret = ferry__resolve_path(b->ctx, f, buf, len, is_write, &dev, &path);
	if (ret)
		return ret;
	if (f->ctx != b->ctx)
		return ferry__error(-EINVAL, "ferry_batch_add(%s): the file belongs to another context", f->path);
	if (b->count == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 16;
		struct ferry__entry *n = realloc(b->entries, cap * sizeof(*n));
		if (!n)
			return ferry__error(-ENOMEM, "growing a batch to %zu entries", cap);
		b->entries = n;
		b->cap = cap;
	}
	if (b->count >= INT_MAX)
		return ferry__error(-E2BIG, "a batch holds at most %d entries", INT_MAX);
	entry_init(&b->entries[b->count], &b->g, f, buf, off, len, is_write, b->ctx->cfg.chunk_size,
		   dev, path);
	return (int)b->count++;
}

int ferry_batch_add_read(ferry_batch *b, ferry_file *f, uint64_t offset, size_t len, void *buf)
{
	return batch_add(b, f, offset, len, buf, false);
}

int ferry_batch_add_write(ferry_batch *b, ferry_file *f, uint64_t offset, size_t len, const void *buf)
{
	return batch_add(b, f, offset, len, (void *)buf, true);
}

size_t ferry_batch_count(const ferry_batch *b)
{
	return b->count;
}

int ferry_batch_submit(ferry_batch *b)
{
	size_t live = 0;
	int ret;

	if (b->running)
		return ferry__error(FERRY_EBUSY, "ferry_batch_submit: the batch is already running");
	for (size_t i = 0; i < b->count; i++) {
		struct ferry__entry *e = &b->entries[i];
		/* chunk counts depend on the chunk size now, not when the entry was added */
		atomic_store(&e->chunks_left, ferry__chunk_count(e->off, e->len, b->ctx->cfg.chunk_size));
		atomic_store(&e->short_end, (int_fast64_t)e->len);
		atomic_store(&e->error, 0);
		e->cursor = e->off;
		e->result = 0;
		live += e->len != 0;
	}
	group_destroy(&b->g);
	group_init(&b->g, live);
	if (!live)
		return 0;
	b->running = true;
	ret = submit_entries(b->ctx, b->entries, b->count, sizeof(*b->entries));
	if (ret)
		b->running = false;
	return ret;
}

int ferry_batch_wait(ferry_batch *b, int64_t timeout_ns)
{
	int shorts = 0;

	if (group_wait_ctx(b->ctx, &b->g, timeout_ns))
		return ferry__error(-ETIMEDOUT, "waiting for a batch of %zu entries", b->count);
	b->running = false;
	for (size_t i = 0; i < b->count; i++) {
		struct ferry__entry *e = &b->entries[i];
		if (e->result < 0) {
			entry_error_detail(e);
			ferry__error_append("batch entry %zu", i);
			return (int)e->result;
		}
		shorts += (uint64_t)e->result < e->len;
	}
	return shorts;
}

ssize_t ferry_batch_result(const ferry_batch *b, size_t index)
{
	if (index >= b->count)
		return ferry__error(-EINVAL, "ferry_batch_result: index %zu of %zu entries", index, b->count);
	return (ssize_t)b->entries[index].result;
}

void ferry_batch_reset(ferry_batch *b)
{
	if (b->running)
		group_wait(&b->g, -1);
	b->running = false;
	b->count = 0;
}

/* --------------------------------------------------------------------------------------- queues */


int ferry_queue_create(ferry_ctx *ctx, unsigned depth, ferry_queue **out)
{
	struct ferry_queue *q;
	int ret;

	*out = NULL;
	if (!ctx || depth == 0 || depth > 65536)
		return ferry__error(-EINVAL, "ferry_queue_create: depth %u (expected 1 to 65536)", depth);
	ret = ferry__ctx_choose_backend(ctx);
	if (ret)
		return ret;
	q = calloc(1, sizeof(*q));
	if (!q)
		return ferry__error(-ENOMEM, "allocating a queue");
	q->ctx = ctx;
	q->done = calloc(depth, sizeof(*q->done));
	/* A slot per I/O in flight, up to 64: unaligned I/Os on O_DIRECT files and I/Os to device
	 * memory need them. Their memory is touched only when used. */
	ret = q->done ? ferry__ioq_init(&q->q, ctx, depth, depth < 64 ? depth : 64, FERRY__IOQ_OWNER) : -ENOMEM;
	if (ret) {
		free(q->done);
		free(q);
		return ret == -ENOMEM ? ferry__error(ret, "allocating a queue") : ret;
	}
	*out = q;
	return 0;
}

void ferry_queue_destroy(ferry_queue *q)
{
	struct ferry__chunk *tmp[64];

	if (!q)
		return;
	/* The kernel may still write into the caller's buffers: drain first. */
	while (q->q.pending) {
		int n = ferry__ioq_reap(&q->q, 1, tmp, 64);
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++)
			ferry__ioq_put(&q->q, tmp[i]);
	}
	ferry__ioq_exit(&q->q);
	free(q->done);
	free(q);
}

/* A queue's ring takes work from the thread that made it only (io_uring: SINGLE_ISSUER). */
static int wrong_thread(const char *call)
{
	return ferry__error(-EINVAL, "%s: the queue belongs to the thread that created it; use one "
			    "queue per thread (this is another thread)", call);
}
#define OWNER_CHECK(q, call)                                         \
	do {                                                         \
		if (!pthread_equal((q)->q.owner, pthread_self()))    \
			return wrong_thread(call);                  \
	} while (0)

static int queue_add(ferry_queue *q, ferry_file *f, void *buf, size_t len, uint64_t off,
		     bool is_write, void *user_data)
{
	OWNER_CHECK(q, is_write ? "ferry_queue_write" : "ferry_queue_read");
	int ret = check_args(f, buf, len, off, is_write);
	int dev = -1, path = FERRY__P_HOST;
	struct ferry__chunk *c;

	ferry__ioq_check_files(&q->q); /* files opened or closed by other threads since */
	if (!ret && len)
		ret = ferry__resolve_path(q->ctx, f, buf, len, is_write, &dev, &path);
	if (ret)
		return ret;
	if (dev >= 0 && path < FERRY__P_GDS && len > q->q.slot_size)
		return ferry__error(-EINVAL, "queue: %s of %zu bytes to device memory is larger than a "
				    "slot (%zu bytes; use ferry_pread, which splits)", is_write ? "write" : "read",
				    len, q->q.slot_size);
	c = ferry__ioq_get(&q->q);
	if (!c)
		return ferry__error(-EBUSY, "queue: %u I/Os already in flight", q->q.depth);
	ferry__chunk_set(c, f, buf, off, len, is_write, dev, path);
	c->user_data = user_data;
	c->entry = NULL;
	ferry__ioq_queue(&q->q, c);
	return 0;
}

int ferry_queue_read(ferry_queue *q, ferry_file *f, void *buf, size_t len, uint64_t offset, void *user_data)
{
	return queue_add(q, f, buf, len, offset, false, user_data);
}

int ferry_queue_write(ferry_queue *q, ferry_file *f, const void *buf, size_t len, uint64_t offset,
		      void *user_data)
{
	return queue_add(q, f, (void *)buf, len, offset, true, user_data);
}

int ferry_queue_submit(ferry_queue *q)
{
	OWNER_CHECK(q, "ferry_queue_submit");
	int ret = ferry__ioq_submit(&q->q);

	if (ret < 0)
		return ferry__error(ret, "queue submit on %s", q->q.ops->name);
	return ret;
}

int ferry_queue_reap(ferry_queue *q, unsigned min_complete, unsigned max, void **user_data, int64_t *result)
{
	int n;

	OWNER_CHECK(q, "ferry_queue_reap");
	if (max > q->q.depth)
		max = q->q.depth;
	if (min_complete > max)
		min_complete = max;
	n = ferry__ioq_reap(&q->q, min_complete, q->done, max);
	if (n < 0)
		return ferry__error(n, "queue reap on %s", q->q.ops->name);
	for (int i = 0; i < n; i++) {
		struct ferry__chunk *c = q->done[i];
		user_data[i] = c->user_data;
		result[i] = c->result;
		account_into(q->ctx, q->q.stats, c->is_write, c->result);
		if (c->result < 0)
			ferry__error((int)c->result, "%s(%s, offset %llu, %zu bytes, %s) on %s",
				     c->is_write ? "pwrite" : "pread", c->f->path,
				     (unsigned long long)c->off, c->len, mode_name(c->plan.mode),
				     q->q.ops->name);
		ferry__ioq_put(&q->q, c);
	}
	ferry__stats_flush(q->ctx, q->q.stats);
	return n;
}

unsigned ferry_queue_pending(const ferry_queue *q)
{
	return q->q.pending;
}
