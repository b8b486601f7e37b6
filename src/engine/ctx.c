/* The context: knobs (rows of the knob engine, base/knob.h), the worker pool, the file table and statistics. */
#include <sched.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/knob.h"
#include "engine/engine.h"
#include "engine/publish.h"
#include "gpu/ring.h"
#include "gpu/shim.h"

static const char *const direct_choices[] = {"auto", "on", "off", NULL};
static const char *const backend_choices[] = {"auto", "psync", "io_uring", NULL};
static const char *const gpu_sync_choices[] = {"block", "spin", NULL};
static const char *const memory_choices[] = {"auto", "host", NULL};
static const char *const cached_io_choices[] = {"thread", "ring", NULL};
static const char *const path_choices[] = {"auto", "gds", "cpu", "cpu-gpu", "cpu-async-gpu",
					   "pagecache-gpu", "gds-async", "gds-batch", NULL};

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

static uint64_t default_threads(void);

/* A row of the context's table: name, the config field, type, default, range; the rest named. */
#define CTX(n, f, t, d, lo, hi, ...)                                                                 \
	{.name = n, .type = FERRY__KNOB_##t, FERRY__KNOB_AT(struct ferry__config, f), .def = d,     \
	 .min = lo, .max = hi, __VA_ARGS__}
#define NUM FERRY__KNOB_NUMBERED
#define FIXED FERRY__KNOB_FIXED

/*
 * Defaults: docs/CONFIG.md records the measurements behind each one. threads (3/4 of the CPUs,
 * 4 to 16; default_threads below): 12 of 16 cores read tmpfs into GPU memory fastest with copy
 * units, 8 fell to 40-43 GB/s; 1 MiB chunks beat 256k to 16m. 16 chunks in flight with a slot each
 * per worker matched fio's disk read and write ceilings. gpu_sync=spin: blocking event waits cost
 * half the throughput to and from the GPU, the wake-up latency idling the copy pipeline.
 * cached_depth=4: more page-cache chunks in flight per worker fell from 44 to 23 GB/s, while disk
 * chunks need the full depth 16. copy_unit=8m x copy_units=4: resident reads into GPU memory in
 * few large copies (docs/PAGECACHE.md). FIXED: shapes the workers or their rings, so it cannot
 * change once they run.
 */
static const struct ferry__knob ctx_rows[] = {
	CTX("threads", threads, UINT, 8, 1, 256, .env = "FERRY_THREADS", .flags = FIXED,
	    .def_fn = default_threads, .doc = "worker threads of the context"),
	CTX("chunk_size", chunk_size, SIZE, 1 * MiB, 4 * KiB, 1 * GiB, .align = 4 * KiB,
	    .env = "FERRY_CHUNK_SIZE", .doc = "bytes of one I/O a request is cut into"),
	CTX("queue_depth", queue_depth, UINT, 16, 1, 4096, .env = "FERRY_QUEUE_DEPTH", .flags = FIXED,
	    .doc = "I/Os in flight per worker"),
	CTX("slots", slots, UINT, 16, 1, 1024, .env = "FERRY_SLOTS", .flags = FIXED,
	    .doc = "bounce slots (aligned, pinned when a GPU is used) per worker"),
	CTX("direct", direct, ENUM, FERRY__DIRECT_AUTO, 0, 2, .choices = direct_choices,
	    .env = "FERRY_DIRECT", .flags = NUM, .doc = "O_DIRECT: auto reads page-cache-resident data buffered"),
	CTX("backend", backend, ENUM, FERRY__BACKEND_AUTO, 0, 2, .choices = backend_choices,
	    .env = "FERRY_BACKEND", .flags = NUM | FIXED, .doc = "the I/O backend of the workers and queues"),
	CTX("sqpoll", sqpoll, BOOL, 0, 0, 1, .env = "FERRY_SQPOLL", .flags = FIXED,
	    .doc = "io_uring submission-queue polling thread"),
	CTX("register", reg, BOOL, 1, 0, 1, .env = "FERRY_REGISTER", .flags = FIXED,
	    .doc = "registered files and buffers with io_uring"),
	CTX("path", path, ENUM, 0, 0, 7, .choices = path_choices, .env = "FERRY_PATH",
	    .flags = FERRY__KNOB_NUMBERED_FROM_1, .doc = "transfer mode to and from GPU memory (gdsio's -x)"),
	CTX("device", device, UINT, 0, 0, 1024, .env = "FERRY_DEVICE", .doc = "CUDA device of the context"),
	CTX("host_budget", host_budget, SIZE, 4 * GiB, 0, UINT64_MAX, .env = "FERRY_HOST_BUDGET",
	    .doc = "pinned host memory the context and its writers may hold"),
	CTX("device_budget", device_budget, SIZE, 1 * GiB, 0, UINT64_MAX, .env = "FERRY_DEVICE_BUDGET",
	    .doc = "device staging memory the context may hold"),
	/* process-wide: the log is the process's stderr, so one level for every context */
	{.name = "log_level", .type = FERRY__KNOB_UINT, .width = sizeof(ferry__log_level), .max = 4,
	 .global = &ferry__log_level, .env = "FERRY_LOG_LEVEL",
	 .doc = "process-wide diagnostics on stderr (0: none)"},
	CTX("gpu_sync", gpu_sync, ENUM, 1, 0, 1, .choices = gpu_sync_choices, .env = "FERRY_GPU_SYNC",
	    .flags = NUM | FIXED, .doc = "how a worker waits for a copy: block or spin"),
	CTX("publish", publish, BOOL, 0, 0, 1, .env = "FERRY_PUBLISH", .flags = FIXED,
	    .doc = "publish live counters for ferry top"),
	CTX("memory", memory, ENUM, 0, 0, 1, .choices = memory_choices, .env = "FERRY_MEMORY", .flags = NUM,
	    .doc = "host: every buffer is host memory (CUDA is not asked)"),
	CTX("cached_depth", cached_depth, UINT, 4, 1, 1024, .env = "FERRY_CACHED_DEPTH",
	    .doc = "page-cache-resident chunks in flight per worker"),
	CTX("cached_io", cached_io, ENUM, FERRY__CACHED_IO_THREAD, 0, 1, .choices = cached_io_choices,
	    .env = "FERRY_CACHED_IO", .flags = NUM, .doc = "who reads resident chunks into GPU slots"),
	CTX("copy_unit", copy_unit, SIZE, 8 * MiB, 0, 1 * GiB, .env = "FERRY_COPY_UNIT", .flags = FIXED,
	    .doc = "bytes of a copy unit for resident reads into GPU memory (< 2 chunks: off)"),
	CTX("copy_units", copy_units, UINT, 4, 1, 64, .env = "FERRY_COPY_UNITS", .flags = FIXED,
	    .doc = "copy units per device"),
	CTX("uring_no_coop", uring_no_coop, BOOL, 0, 0, 1, .env = "FERRY_URING_NO_COOP", .flags = FIXED,
	    .doc = "worker rings without IORING_SETUP_COOP_TASKRUN (for comparison)"),
	CTX("uring_defer", uring_defer, BOOL, 1, 0, 1, .env = "FERRY_URING_DEFER", .flags = FIXED,
	    .doc = "queue rings with IORING_SETUP_DEFER_TASKRUN (0: off, for comparison)"),
	/* remote backend (docs/REMOTE.md, docs/CONFIG.md for the defaults' reasons) */
	CTX("remote_connections", remote_connections, UINT, 16, 1, 1024, .env = "FERRY_REMOTE_CONNECTIONS",
	    .doc = "ranged GETs in flight per read of a remote object (connections kept alive)"),
	CTX("remote_part_size", remote_part_size, SIZE, 8 * MiB, 64 * KiB, 1 * GiB,
	    .env = "FERRY_REMOTE_PART_SIZE", .doc = "bytes of one ranged GET of a remote object"),
	CTX("remote_retries", remote_retries, UINT, 5, 0, 100, .env = "FERRY_REMOTE_RETRIES",
	    .doc = "retries of a GET on 5xx, SlowDown, timeouts and resets (exponential backoff, jitter)"),
	CTX("remote_timeout", remote_timeout, UINT, 30, 1, 3600, .env = "FERRY_REMOTE_TIMEOUT",
	    .doc = "seconds a remote transfer may stall (under 1 KiB/s) before it is cut and retried"),
	CTX("remote_lock", remote_lock, BOOL, 1, 0, 1, .env = "FERRY_REMOTE_LOCK",
	    .doc = "checkpoint manifests and latest on s3:// are conditional writes (a second writer is refused)"),
	/* the local cache of datasets read from URLs (src/format/cache.c, docs/REMOTE.md) */
	{.name = "cache_dir", .type = FERRY__KNOB_TEXT, FERRY__KNOB_AT(struct ferry__config, cache_dir),
	 .env = "FERRY_CACHE_DIR", .doc = "directory of the local cache of datasets read from URLs (\"\": none)"},
	CTX("cache_bytes", cache_bytes, SIZE, 0, 0, UINT64_MAX, .env = "FERRY_CACHE_BYTES",
	    .doc = "byte budget of cache_dir, least recently used shards evicted (0: no limit)"),
	CTX("cache_jobs", cache_jobs, UINT, 4, 1, 64, .env = "FERRY_CACHE_JOBS",
	    .doc = "shards of a dataset staged into cache_dir at once"),
};
#undef CTX
#undef NUM
#undef FIXED

static const char *ctx_keys[sizeof(ctx_rows) / sizeof(ctx_rows[0]) + 1];
static const struct ferry__knobs ctx_knobs = {"context", ctx_rows, sizeof(ctx_rows) / sizeof(ctx_rows[0]),
					      ctx_keys};

/*
 * threads: three quarters of the CPUs this process may run on, 4 to 16. On the GPU machine (16
 * cores) 12 threads read tmpfs into GPU memory at 51.7 GB/s against 41.5 with 8 and 45.7 with 16
 * (docs/PAGECACHE.md): the page-cache copies need the cores, and the rest are left to the copies'
 * completions and to the application. Disks are not worse for it (docs/CONFIG.md).
 */
static uint64_t default_threads(void)
{
	cpu_set_t set;
	long n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		n = CPU_COUNT(&set);
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	n = n * 3 / 4;
	return (uint64_t)(n < 4 ? 4 : n > 16 ? 16 : n);
}

const char *const *ferry_ctx_keys(void)
{
	return ferry__knobs_keys(&ctx_knobs);
}

int ferry_ctx_create(ferry_ctx **out)
{
	ferry_ctx *ctx = calloc(1, sizeof(*ctx));
	pthread_condattr_t ca;
	int ret;

	*out = NULL;
	if (!ctx)
		return ferry__error(-ENOMEM, "allocating a context");
	ferry__span_init();
	ctx->pid = getpid();
	pthread_mutex_init(&ctx->mu, NULL);
	pthread_mutex_init(&ctx->slot_mu, NULL);
	pthread_mutex_init(&ctx->units_mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ctx->work_cv, &ca);
	pthread_condattr_destroy(&ca);
	if ((ret = ferry__knobs_init(&ctx_knobs, &ctx->cfg)) < 0) {
		ferry_ctx_destroy(ctx);
		return ret;
	}
	*out = ctx;
	return 0;
}

void ferry__publish_stat(struct ferry__publish_counters *pub, enum ferry_stat s, uint64_t n)
{
	switch (s) {
	case FERRY_STAT_BYTES_READ:
		FERRY__PUBLISH_ADD(pub, bytes_read, n);
		break;
	case FERRY_STAT_BYTES_WRITTEN:
		FERRY__PUBLISH_ADD(pub, bytes_written, n);
		break;
	case FERRY_STAT_READS:
		FERRY__PUBLISH_ADD(pub, reads, n);
		break;
	case FERRY_STAT_WRITES:
		FERRY__PUBLISH_ADD(pub, writes, n);
		break;
	case FERRY_STAT_ERRORS:
		FERRY__PUBLISH_ADD(pub, errors, n);
		break;
	case FERRY_STAT_FALLBACKS:
		FERRY__PUBLISH_ADD(pub, fallbacks, n);
		break;
	default:
		break;
	}
}

int ferry_ctx_set(ferry_ctx *ctx, const char *key, const char *value)
{
	const struct ferry__knob *k;
	uint64_t v;
	int ret;

	if (!ctx || !key)
		return ferry__error(-EINVAL, "ferry_ctx_set: NULL context or key");
	if ((ret = ferry__knobs_parse(&ctx_knobs, key, value, "ferry_ctx_set", &k, &v)))
		return ret;
	pthread_mutex_lock(&ctx->mu);
	if ((k->flags & FERRY__KNOB_FIXED) && (ctx->started || ctx->backend) &&
	    ferry__knob_load(k, &ctx->cfg) != v) {
		pthread_mutex_unlock(&ctx->mu);
		return ferry__error(FERRY_EBUSY, "ferry_ctx_set: %s cannot change once I/O has started", key);
	}
	ferry__knob_store(k, &ctx->cfg, v, value);
	pthread_mutex_unlock(&ctx->mu);
	return 0;
}

int ferry_ctx_get(const ferry_ctx *ctx, const char *key, char *buf, size_t len)
{
	if (!ctx)
		return ferry__error(-EINVAL, "ferry_ctx_get: NULL context");
	return ferry__knobs_get(&ctx_knobs, &ctx->cfg, key, buf, len, "ferry_ctx_get");
}

uint64_t ferry__ctx_host_budget(const ferry_ctx *ctx)
{
	return ctx->cfg.host_budget;
}

const char *ferry__ctx_cache(const ferry_ctx *ctx, uint64_t *bytes, unsigned *jobs)
{
	*bytes = ctx->cfg.cache_bytes;
	*jobs = (unsigned)ctx->cfg.cache_jobs;
	return ctx->cfg.cache_dir;
}

size_t ferry__slot_size(const ferry_ctx *ctx)
{
	/* room for the aligned head and tail blocks of an unaligned chunk (blocks up to 64 KiB) */
	return (size_t)ctx->cfg.chunk_size + 128 * KiB;
}

/* ------------------------------------------------------------------------------------- backends */

const struct ferry__backend_ops *ferry__backend_by_name(const char *name)
{
	for (size_t i = 0; ferry__backends[i]; i++)
		if (!strcmp(ferry__backends[i]->name, name))
			return ferry__backends[i];
	return NULL;
}

const char *ferry_backend_unavailable_reason(const char *backend)
{
	static _Thread_local char why[256];
	const struct ferry__backend_ops *b = backend ? ferry__backend_by_name(backend) : NULL;

	if (!b) {
		snprintf(why, sizeof(why), "unknown backend '%s' (psync, io_uring, cufile)",
			 backend ? backend : "(null)");
		return why;
	}
	why[0] = '\0';
	if (b->probe(why, sizeof(why)) == 0)
		why[0] = '\0';
	return why;
}

static void *worker_main(void *arg);

static int choose_backend(ferry_ctx *ctx)
{
	char why[256] = "";

	switch (ctx->cfg.backend) {
	case FERRY__BACKEND_PSYNC:
		ctx->backend = &ferry__backend_psync;
		return 0;
	case FERRY__BACKEND_URING:
		if (ferry__backend_uring.probe(why, sizeof(why)))
			return ferry__error(FERRY_EBACKEND, "backend=io_uring was asked for: %s", why);
		ctx->backend = &ferry__backend_uring;
		return 0;
	default:
		for (size_t i = 0; ferry__backends[i]; i++) {
			if (!(ferry__backends[i]->caps & FERRY__CAP_HOST))
				continue; /* cufile moves device memory only: the GPU paths use it per request */
			if (ferry__backends[i]->probe(why, sizeof(why)) == 0) {
				ctx->backend = ferry__backends[i];
				if (i > 0) {
					ferry__stat_add(ctx, FERRY_STAT_FALLBACKS, 1);
					FERRY__LOG(FERRY__LOG_INFO, "backend auto: %s; using %s", why,
						   ctx->backend->name);
				}
				return 0;
			}
		}
		return ferry__error(FERRY_EBACKEND, "no I/O backend works here: %s", why);
	}
}

/* Opens the context's publication once it publishes and moves data (its I/O starts, or a loader,
 * save or load begins on it); ctx->mu held. Best effort: a context that cannot publish still works. */
static void publish_open_locked(ferry_ctx *ctx)
{
	if (!ctx->cfg.publish || ctx->pub)
		return;
	ctx->pub = ferry__publish_open(program_invocation_short_name);
	if (ctx->pub) {
		ferry__publish_set_path(ctx->pub, "host");
		atomic_store_explicit(&ctx->pub_path, "host", memory_order_relaxed);
	}
}

struct ferry__activity *ferry__activity_begin(ferry_ctx *ctx, enum ferry__activity_kind kind, const char *name)
{
	if (!ctx)
		return NULL;
	pthread_mutex_lock(&ctx->mu);
	publish_open_locked(ctx);
	struct ferry__activity *a = ctx->pub ? ferry__publish_activity(ctx->pub, kind, name) : NULL;
	pthread_mutex_unlock(&ctx->mu);
	return a;
}

int ferry__ctx_choose_backend(ferry_ctx *ctx)
{
	int ret = 0;

	pthread_mutex_lock(&ctx->mu);
	if (!ctx->backend)
		publish_open_locked(ctx);
	if (!ctx->backend)
		ret = choose_backend(ctx);
	pthread_mutex_unlock(&ctx->mu);
	return ret;
}

const char *ferry__backend_name(const ferry_ctx *ctx)
{
	if (ctx->backend)
		return ctx->backend->name;
	return backend_choices[ctx->cfg.backend];
}

/*
 * The workers set up their own queues (ring, slots, registered buffers), all at once: one after
 * the other in the starting thread, 4 workers took 10-64 ms on the 2-core VM, the first call's
 * critical path (issue 22). A gate in front of the
 * workers' array counts them in; the start returns when every one is ready or one failed.
 */
struct start_gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned arrived, n;
	int err;
	char msg[512];
	_Alignas(max_align_t) char workers[];
};

static struct start_gate *gate_of(struct ferry__worker *w)
{
	return (struct start_gate *)((char *)(w - w->index) - offsetof(struct start_gate, workers));
}

static void gate_free(struct ferry__worker *w)
{
	if (!w)
		return;
	struct start_gate *g = gate_of(w);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	free(g);
}

/*
 * In a process that already uses the context's device (torch made its context), a worker readies
 * its GPU side as soon as it is up, instead of at its first chunk: the device current on its
 * thread, its copy stream and events, and (worker 0) the device's copy units, pinned. A fresh
 * process's first load into GPU memory paid them inside its read, each worker's first chunk
 * waiting on them (issue 22); now they are made while the caller parses the header and allocates
 * the result. Only for a start asked for ahead of the requests (ferry_ctx_start: the safetensors
 * loader starts its context in the background): a start made by a request leaves it to the
 * request's chunks, which make what they use, and nothing happens behind a caller's back after
 * its first request. A ferry_ctx_start called after the workers were started by requests (host
 * writes, say: a job that saved before it loads into GPU memory) asks the running workers the
 * same, each between its takes (w->gpu_asked: once per worker). Elsewhere nothing is asked of
 * the driver (a context that never meets a GPU loads none). After the start gate: the start does
 * not wait for it.
 */
static void worker_ready_gpu(struct ferry__worker *w)
{
	ferry_ctx *ctx = w->ctx;
	int dev = (int)ctx->cfg.device;

	if (w->gpu_asked || !atomic_load(&ctx->ready_gpu))
		return;
	w->gpu_asked = true;
	if (ctx->cfg.memory || dev >= FERRY__MAX_GPUS || !ferry__gpu_in_use(dev))
		return;
	uint64_t t0 = FERRY__SPAN_T0();
	struct ferry__chunk c;
	memset(&c, 0, sizeof(c));
	c.dev = dev;
	bool ok = ferry__gpu_use(&w->q, &c); /* a failure comes back to the first chunk that asks */
	FERRY__MARK("worker_gpu_ready", (int)w->index, t0);
	if (ok && w->index == 0) {
		ferry__units_prepare(ctx, dev);
		(void)ferry__gds_native_possible(NULL, 0); /* path=auto's question, asked once a process */
	}
}

/* ferry_ctx_start asked for the GPU side after this worker's start (worker_ready_gpu) */
static bool gpu_news(const struct ferry__worker *w)
{
	return !w->gpu_asked && atomic_load(&w->ctx->ready_gpu);
}

/* In a new worker: its queue, then the news at the gate. 0 when it may work. */
static int worker_setup(struct ferry__worker *w)
{
	ferry_ctx *ctx = w->ctx;
	struct start_gate *g = gate_of(w);
	uint64_t t0 = FERRY__SPAN_T0();
	int ret = ferry__ioq_init(&w->q, ctx, (unsigned)ctx->cfg.queue_depth, (unsigned)ctx->cfg.slots,
				  FERRY__IOQ_REG_BUFS);
	FERRY__MARK("worker_setup", (int)w->index, t0);

	pthread_mutex_lock(&g->mu);
	if (ret && !g->err) {
		g->err = ret;
		snprintf(g->msg, sizeof(g->msg), "worker %u: %s", w->index, ferry_last_error());
	}
	g->arrived++;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return ret;
}

int ferry__ctx_start(ferry_ctx *ctx)
{
	int ret = 0;
	uint64_t t0 = FERRY__SPAN_T0();

	pthread_mutex_lock(&ctx->mu);
	if (ctx->started) {
		ret = ctx->start_error;
		pthread_mutex_unlock(&ctx->mu);
		return ret;
	}
	pthread_mutex_unlock(&ctx->mu);

	ret = ferry__ctx_choose_backend(ctx);
	unsigned n = (unsigned)ctx->cfg.threads;
	struct start_gate *g = ret ? NULL : calloc(1, sizeof(*g) + n * sizeof(struct ferry__worker));
	struct ferry__worker *w = g ? (struct ferry__worker *)g->workers : NULL;
	if (!ret && !g)
		ret = ferry__error(-ENOMEM, "allocating %u workers", n);
	if (g) {
		pthread_mutex_init(&g->mu, NULL);
		pthread_cond_init(&g->cv, NULL);
		g->n = n;
	}
	pthread_mutex_lock(&ctx->mu);
	if (ctx->started || ctx->workers) { /* another thread started them, or is starting them */
		while (!ctx->started)
			pthread_cond_wait(&ctx->work_cv, &ctx->mu);
		ret = ctx->start_error;
		pthread_mutex_unlock(&ctx->mu);
		gate_free(w);
		return ret;
	}
	/* Rings are set up outside ctx->mu (they register themselves): the workers wait for the
	 * start to be decided (started, under ctx->mu) before they take work. */
	unsigned made = 0;
	if (!ret) {
		ctx->workers = w;
		for (; made < n; made++) {
			w[made].ctx = ctx;
			w[made].index = made;
			int e = pthread_create(&w[made].thread, NULL, worker_main, &w[made]);
			if (e) {
				ret = ferry__error(-e, "starting worker thread %u", made);
				break;
			}
		}
		ctx->nworkers = made;
	}
	pthread_mutex_unlock(&ctx->mu);
	if (g) {
		pthread_mutex_lock(&g->mu);
		while (g->arrived < made)
			pthread_cond_wait(&g->cv, &g->mu);
		if (!ret && g->err)
			ret = ferry__error_raise(g->err, g->msg);
		pthread_mutex_unlock(&g->mu);
	}
	pthread_mutex_lock(&ctx->mu);
	if (ret && ctx->workers)
		ctx->stopping = true; /* the workers that started leave */
	ctx->started = true;
	ctx->start_error = ret;
	pthread_cond_broadcast(&ctx->work_cv);
	pthread_mutex_unlock(&ctx->mu);
	FERRY__MARK("ctx_start", -1, t0);
	return ret;
}

int ferry_ctx_start(ferry_ctx *ctx)
{
	if (ctx && !atomic_exchange(&ctx->ready_gpu, true)) {
		/* workers started by a request wait for work: woken to ready their GPU side */
		pthread_mutex_lock(&ctx->mu);
		pthread_cond_broadcast(&ctx->work_cv);
		pthread_mutex_unlock(&ctx->mu);
	}
	return ferry__ctx_start(ctx);
}

const char *ferry_ctx_backend(ferry_ctx *ctx)
{
	/* The probe decides the name; the workers (threads, rings, pinned slots) wait for work. */
	if (!ctx->backend && ferry__ctx_choose_backend(ctx))
		return "none";
	return ctx->backend->name;
}

void ferry_ctx_destroy(ferry_ctx *ctx)
{
	/* In a child made by fork() without exec the workers are the parent's and do not exist, and
	 * the context's locks may have been held by one of them at the fork: joining or locking would
	 * hang the child's exit. Its copy is left to the process's end. */
	if (!ctx || ctx->pid != getpid())
		return;
	pthread_mutex_lock(&ctx->mu);
	ctx->stopping = true;
	pthread_cond_broadcast(&ctx->work_cv);
	unsigned n = ctx->nworkers;
	pthread_mutex_unlock(&ctx->mu);
	for (unsigned i = 0; i < n; i++)
		pthread_join(ctx->workers[i].thread, NULL);
	if (ctx->workers)
		for (unsigned i = 0; i < n; i++) /* the rest never started */
			if (ctx->workers[i].q.chunks)
				ferry__ioq_exit(&ctx->workers[i].q);
	gate_free(ctx->workers);
	ferry__units_free(ctx);
	for (unsigned i = 0; i < ctx->nslot_cache; i++)
		ferry_free_aligned(ctx->slot_cache[i], ferry__slot_size(ctx));
	free(ctx->slot_cache);
	ferry__publish_close(ctx->pub);
	pthread_mutex_destroy(&ctx->mu);
	pthread_mutex_destroy(&ctx->slot_mu);
	pthread_mutex_destroy(&ctx->units_mu);
	pthread_cond_destroy(&ctx->work_cv);
	free(ctx);
}

/* ----------------------------------------------------------------------------------- statistics */

static const char *const stat_names[FERRY_STAT__COUNT] = {
	"bytes_read",      "bytes_written",  "reads",    "writes",  "chunks",    "direct_chunks",
	"bounced_chunks",  "buffered_chunks", "retries", "errors",  "fallbacks", "cached_chunks",
	"unit_copies",
};

uint64_t ferry_ctx_stat(const ferry_ctx *ctx, enum ferry_stat which)
{
	if ((unsigned)which >= FERRY_STAT__COUNT)
		return 0;
	return atomic_load_explicit(&((ferry_ctx *)ctx)->stats[which], memory_order_relaxed);
}

const char *ferry_stat_name(enum ferry_stat which)
{
	return (unsigned)which < FERRY_STAT__COUNT ? stat_names[which] : "unknown";
}

/* ------------------------------------------------------------------ registered files and rings */

/*
 * An owner ring's catch-up (under ctx->mu, from its owner): each slot whose file changed since the
 * ring last looked is set to the file now there, or emptied. reg_id, not the descriptor, says
 * whether it changed: a closed file's descriptor number may come back for another file. If the
 * kernel refuses an update, the ring stops using registered files (the backend turns them off)
 * and plain descriptors serve.
 */
static void sync_files_locked(struct ferry__ioq *q)
{
	ferry_ctx *ctx = q->ctx;

	for (unsigned i = 0; i < FERRY__MAX_FILES / 2; i++) {
		struct ferry_file *f = ctx->files[i];
		uint64_t id = f ? f->reg_id : 0;
		if (id == q->files_seen[i])
			continue;
		q->ops->files_update(q->ring, 2 * i, f ? f->fd_buf : -1);
		q->ops->files_update(q->ring, 2 * i + 1, f ? f->fd_direct : -1);
		q->files_seen[i] = id;
	}
	q->files_gen = atomic_load_explicit(&ctx->files_gen, memory_order_relaxed);
}

/* Under ctx->mu, from the thread creating q. */
void ferry__ring_register(ferry_ctx *ctx, struct ferry__ioq *q)
{
	q->reg_next = ctx->rings;
	ctx->rings = q;
	if (!ctx->cfg.reg || !q->ops->files_init)
		return;
	if (q->owner_only && !(q->files_seen = calloc(FERRY__MAX_FILES / 2, sizeof(*q->files_seen))))
		return; /* plain descriptors then */
	if (q->ops->files_init(q->ring, FERRY__MAX_FILES) < 0)
		return; /* plain descriptors then; nothing else changes */
	q->files_registered = true;
	if (q->files_seen) { /* nothing seen yet: the catch-up sets every open file */
		sync_files_locked(q);
		return;
	}
	for (unsigned i = 0; i < FERRY__MAX_FILES / 2; i++) {
		struct ferry_file *f = ctx->files[i];
		if (!f)
			continue;
		q->ops->files_update(q->ring, 2 * i, f->fd_buf);
		if (f->fd_direct >= 0)
			q->ops->files_update(q->ring, 2 * i + 1, f->fd_direct);
	}
}

void ferry__ioq_sync_files(struct ferry__ioq *q)
{
	pthread_mutex_lock(&q->ctx->mu);
	sync_files_locked(q);
	pthread_mutex_unlock(&q->ctx->mu);
}

void ferry__ring_unregister(ferry_ctx *ctx, struct ferry__ioq *q)
{
	for (struct ferry__ioq **p = &ctx->rings; *p; p = &(*p)->reg_next)
		if (*p == q) {
			*p = q->reg_next;
			return;
		}
}

int ferry__file_register(ferry_ctx *ctx, struct ferry_file *f)
{
	f->slot = -1;
	if (!ctx->cfg.reg)
		return 0;
	pthread_mutex_lock(&ctx->mu);
	for (unsigned i = 0; i < FERRY__MAX_FILES / 2; i++) {
		if (ctx->files[i])
			continue;
		ctx->files[i] = f;
		f->slot = (int)i;
		f->reg_id = ++ctx->reg_ids;
		for (struct ferry__ioq *q = ctx->rings; q; q = q->reg_next) {
			/* an owner ring catches up itself (ferry__ioq_sync_files): its kernel table takes
			 * updates from its owner thread only */
			if (q->owner_only || !q->files_registered)
				continue;
			/* A ring whose update fails keeps a stale slot: never use fixed files there. */
			if (q->ops->files_update(q->ring, 2 * i, f->fd_buf) < 0 ||
			    (f->fd_direct >= 0 &&
			     q->ops->files_update(q->ring, 2 * i + 1, f->fd_direct) < 0)) {
				ctx->files[i] = NULL;
				f->slot = -1;
				f->reg_id = 0;
				break;
			}
		}
		atomic_fetch_add_explicit(&ctx->files_gen, 1, memory_order_relaxed);
		break;
	}
	pthread_mutex_unlock(&ctx->mu);
	return 0;
}

void ferry__file_unregister(ferry_ctx *ctx, struct ferry_file *f)
{
	if (f->slot < 0)
		return;
	pthread_mutex_lock(&ctx->mu);
	for (struct ferry__ioq *q = ctx->rings; q; q = q->reg_next) {
		if (q->owner_only || !q->files_registered)
			continue;
		q->ops->files_update(q->ring, 2 * (unsigned)f->slot, -1);
		q->ops->files_update(q->ring, 2 * (unsigned)f->slot + 1, -1);
	}
	ctx->files[f->slot] = NULL;
	f->slot = -1;
	f->reg_id = 0;
	atomic_fetch_add_explicit(&ctx->files_gen, 1, memory_order_relaxed);
	pthread_mutex_unlock(&ctx->mu);
}

/* --------------------------------------------------------------------------------- the workers */

static void entry_chunk_done(ferry_ctx *ctx, struct ferry__chunk *c);

static void *worker_main(void *arg)
{
	struct ferry__worker *w = arg;
	ferry_ctx *ctx = w->ctx;
	struct ferry__ioq *q = &w->q;
	ferry__worker_index = (int)w->index;
	if (worker_setup(w))
		return NULL; /* the start fails: the others stop */
	worker_ready_gpu(w);
	struct ferry__chunk **done = calloc(q->depth, sizeof(*done));
	bool took_any = false; /* the timeline's first_take */

	if (!done)
		return NULL; /* the other workers carry on; nothing was taken */
	for (;;) {
		worker_ready_gpu(w); /* a ferry_ctx_start after requests started the workers */
		uint64_t t0 = FERRY__SPAN_T0();
		pthread_mutex_lock(&ctx->mu);
		if (!ctx->stopping && (!ctx->started || (!ctx->work_head && q->pending == 0 && !gpu_news(w)))) {
			uint64_t ti = FERRY__SPAN_T0();
			while (!ctx->stopping &&
			       (!ctx->started || (!ctx->work_head && q->pending == 0 && !gpu_news(w))))
				pthread_cond_wait(&ctx->work_cv, &ctx->mu);
			FERRY__SPAN_ADD(q, FERRY__SPAN_IDLE, ti);
			t0 = FERRY__SPAN_T0();
		}
		if (ctx->stopping && !ctx->work_head && q->pending == 0) {
			pthread_mutex_unlock(&ctx->mu);
			break;
		}
		unsigned took = 0;
		bool took_unit = false;
		struct ferry__chunk *batch = NULL, **tail = &batch;
		/* a fair share of the list's bytes per take, so that a batch of large pieces is spread
		 * over the workers (a worker copies resident pieces one by one) while small pieces stay
		 * with one worker (ferry__take_share) */
		uint64_t share = ferry__take_share(ctx, ctx->work_bytes), taken = 0;
		/* and none while chunks this worker took wait for a slot: it cannot start them, and a
		 * sibling that could is left idle at the end of a batch (small reads, issue 22) */
		while (ctx->work_head && taken < share && !q->slot_wait) {
			struct ferry__entry *e = ctx->work_head;
			/* chunks of more than 256 KiB into device memory: at most cached_depth a take,
			 * what a worker copies from the page cache at once (ioq.c, counts_cached). A
			 * read_batch of 256 x 1 MiB had each worker take 16 and copy 4 at a time, and
			 * ended with the slowest one's backlog: 36.9k IOPS against 44.8k for the same
			 * pieces as futures (H200, bench/small-reads.py) */
			if (took >= ctx->cfg.cached_depth && e->dev >= 0 && !e->is_write && !e->units &&
			    ferry__chunk_end(e->cursor, e->off + e->len, ctx->cfg.chunk_size) - e->cursor >
				    ((uint64_t)256 << 10))
				break;
			struct ferry__chunk *c = ferry__ioq_get(q);
			if (!c)
				break;
			uint64_t end = ferry__chunk_end(e->cursor, e->off + e->len, ctx->cfg.chunk_size);
			ferry__chunk_set(c, e->f, e->buf + (e->cursor - e->off), e->cursor,
					 (size_t)(end - e->cursor), e->is_write, e->dev, e->path);
			c->entry = e;
			c->unit.in = false;
			if (e->units)
				ferry__units_assign(ctx, e, c);
			taken += c->len;
			ctx->work_bytes -= c->len < ctx->work_bytes ? c->len : ctx->work_bytes;
			e->cursor = end;
			if (end == e->off + e->len) {
				ctx->work_head = e->next_work;
				if (!ctx->work_head)
					ctx->work_tail = NULL;
			}
			*tail = c;
			tail = &c->next;
			took++;
			/* a unit's chunks go one per take, so that several workers fill it at once */
			if (c->unit.in) {
				took_unit = true;
				break;
			}
		}
		bool more = ctx->work_head != NULL;
		if (took && !took_any) {
			took_any = true;
			FERRY__MARK("first_take", (int)w->index, 0);
		}
		if (more && (took || q->slot_wait))
			pthread_cond_signal(&ctx->work_cv); /* more for an idle sibling */
		pthread_mutex_unlock(&ctx->mu);
		FERRY__SPAN_ADD(q, FERRY__SPAN_TAKE, t0);

		t0 = FERRY__SPAN_T0();
		while (batch) {
			struct ferry__chunk *c = batch;
			batch = c->next;
			ferry__ioq_queue(q, c);
		}
		FERRY__SPAN_ADD(q, FERRY__SPAN_QUEUE, t0);
		/* wait for a completion only when there is nothing more to take: a unit chunk that is
		 * read is finished at once, and the worker goes on to the next one */
		int n = ferry__ioq_reap(q, q->pending && !(took_unit && more && q->free_chunks) ? 1 : 0, done,
					q->depth);
		if (n < 0) {
			/* Submitting or waiting on the ring itself failed (not one I/O: those complete
			 * with their own error). Chunks are still owned by the kernel, so they can be
			 * neither failed nor reused: back off and try again. */
			FERRY__LOG(FERRY__LOG_WARN, "worker %u: %s ring: %s", w->index, q->ops->name,
				   ferry_strerror(n));
			usleep(1000);
			continue;
		}
		/* counted before the requests complete, so that a waiter sees its chunks counted */
		ferry__stats_flush(ctx, q->stats);
		t0 = FERRY__SPAN_T0();
		for (int i = 0; i < n; i++) {
			entry_chunk_done(ctx, done[i]);
			done[i]->entry = NULL;
			ferry__ioq_put(q, done[i]);
		}
		FERRY__SPAN_ADD(q, FERRY__SPAN_DONE, t0);
		ferry__span_flush(q->spans, 0);
	}
	free(done);
	return NULL;
}

/* Defined in src/engine/engine.c: accounts one finished chunk of an entry. */
void ferry__entry_chunk_done(ferry_ctx *ctx, struct ferry__entry *e, uint64_t chunk_off,
			     size_t chunk_len, int64_t result);

static void entry_chunk_done(ferry_ctx *ctx, struct ferry__chunk *c)
{
	ferry__entry_chunk_done(ctx, c->entry, c->off, c->len, c->result);
}
