/* The engine's own declarations: context, files, chunks, backends, queues and workers. Private to
 * src/engine/ (the layers above see engine/export.h). */
#ifndef FERRY_IO_IO_H
#define FERRY_IO_IO_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/base.h"
#include "engine/export.h"

/* ------------------------------------------------------------------------------- configuration */

enum { FERRY__DIRECT_AUTO, FERRY__DIRECT_ON, FERRY__DIRECT_OFF };
enum { FERRY__BACKEND_AUTO, FERRY__BACKEND_PSYNC, FERRY__BACKEND_URING };

struct ferry__config {
	uint64_t threads;
	uint64_t chunk_size;
	uint64_t queue_depth;
	uint64_t slots;
	uint64_t direct;  /* FERRY__DIRECT_* */
	uint64_t backend; /* FERRY__BACKEND_* */
	uint64_t sqpoll;
	uint64_t reg;     /* registered files and buffers with io_uring */
	uint64_t path;    /* transfer mode index (DESIGN.md), used by the GPU layer */
	uint64_t device;
	uint64_t host_budget;
	uint64_t device_budget;
	uint64_t gpu_sync; /* 0: block (the waiting worker sleeps), 1: spin */
	uint64_t publish;  /* publish live counters for `ferry top` (src/engine/publish.h) */
	uint64_t memory;   /* 0 auto: ask CUDA what each buffer is; 1 host: every buffer is host memory */
	uint64_t cached_depth; /* slots a worker gives to page-cache-resident chunks at once */
	uint64_t cached_io;    /* FERRY__CACHED_IO_*: who copies resident chunks into GPU slots */
	uint64_t copy_unit;    /* bytes of a copy unit (resident reads into GPU memory); < 2 chunks: off */
	uint64_t copy_units;   /* copy units per device */
	uint64_t uring_no_coop; /* worker rings without IORING_SETUP_COOP_TASKRUN */
	uint64_t uring_defer;   /* queue rings with IORING_SETUP_DEFER_TASKRUN */
	uint64_t remote_connections; /* remote backend: ranged GETs in flight per read (docs/REMOTE.md) */
	uint64_t remote_part_size;   /* remote backend: bytes of one ranged GET */
	uint64_t remote_retries;     /* remote backend: retries of a failed GET before the error */
	uint64_t remote_timeout;     /* remote backend: seconds a transfer may stall before a retry */
	uint64_t remote_lock;        /* conditional writes of checkpoint manifests and `latest` on s3 */
	char cache_dir[1024];        /* datasets of URLs: the local cache's directory, "" for none */
	uint64_t cache_bytes;        /* its byte budget (0: no limit but the disk's) */
	uint64_t cache_jobs;         /* shards staged into it at once per dataset */
};

enum { FERRY__CACHED_IO_THREAD, FERRY__CACHED_IO_RING };

/* --------------------------------------------------------------------------------------- files */

#define FERRY__MAX_FILES 4096 /* registered-file slots: two per open file */

struct ferry_file {
	ferry_ctx *ctx;
	char *path;
	int fd_buf;    /* always open */
	int fd_direct; /* -1 when O_DIRECT is off or refused */
	int slot;      /* index in the ctx file table (registered slots 2*slot, 2*slot+1), or -1 */
	uint64_t reg_id; /* this registration's number in the context (never reused), 0 when none */
	int writable;
	uint32_t block_size;
	uint32_t mem_align;
	bool in_memory; /* on tmpfs or ramfs: every page resident, no cachestat asked */
	char direct_note[192]; /* why there is no O_DIRECT descriptor, if there is none */
	/* GPUDirect Storage, probed at the first transfer to or from device memory (under gds_mu) */
	pthread_mutex_t gds_mu;
	int gds_state; /* FERRY__GDS_UNPROBED, or shim.h's FERRY__GDS_REFUSED/NATIVE/COMPAT */
	void *gds_handle;
	atomic_int gds_fallback_counted; /* auto's fallback from GDS counted once per file */
	atomic_bool gds_auto_refused;    /* path=auto found GDS cannot be native here (gds_note says why) */
	char gds_note[384];
	struct ferry__remote *remote; /* a remote object (src/engine/remote.c): no descriptors, or NULL */
};
#define FERRY__GDS_UNPROBED (-1)

/*
 * The path a transfer takes, resolved per request from the `path` knob, the memory kind and the
 * file (DESIGN.md's transfer modes; FERRY__P_HOST is host memory, any mode).
 */
enum ferry__path {
	FERRY__P_HOST,      /* host memory: the storage engine alone */
	FERRY__P_PIPE,      /* 3 cpu-async-gpu: pinned slots, async copies, events */
	FERRY__P_PIPE_SYNC, /* 2 cpu-gpu: pinned slots, a synchronous copy per chunk */
	FERRY__P_PAGECACHE, /* 4 pagecache-gpu: buffered reads into pinned slots, async copies */
	FERRY__P_GDS,       /* 0 gds: cuFileRead/cuFileWrite */
	FERRY__P_GDS_ASYNC, /* 5 gds-async: cuFileReadAsync/WriteAsync on the worker's stream */
	FERRY__P_GDS_BATCH, /* 6 gds-batch: cuFileBatchIO* */
};
const char *ferry__path_name(int path);
#define FERRY__MAX_GPUS 16

/* -------------------------------------------------------------------------------------- chunks */

enum ferry__chunk_mode {
	FERRY__CH_DIRECT,   /* O_DIRECT descriptor, straight into/out of the caller's buffer */
	FERRY__CH_BOUNCE,   /* O_DIRECT descriptor through an aligned slot, copied to/from the caller */
	FERRY__CH_BUFFERED, /* buffered descriptor, caller's buffer */
};

/* A plan for one piece of I/O: which descriptor, and the range actually transferred. */
struct ferry__plan {
	int mode;
	uint64_t io_off; /* file offset of the transfer (aligned superset for BOUNCE) */
	size_t io_len;
};

/*
 * Decides how to transfer [off, off+len) to/from addr (pure arithmetic, unit-tested):
 * aligned requests go direct; unaligned ones through a slot of slot_size bytes when the aligned
 * superset fits (reads) or only the address is unaligned (writes); everything else buffered.
 */
void ferry__plan_chunk(uint64_t off, size_t len, uintptr_t addr, uint32_t bs, uint32_t mem_align,
		       bool have_direct, bool is_write, size_t slot_size, struct ferry__plan *out);

/* Number of chunk_size windows that [off, off+len) touches (chunks are cut at multiples). */
uint64_t ferry__chunk_count(uint64_t off, uint64_t len, uint64_t chunk_size);
/* End of the chunk that starts at cur, for a request ending at end. */
uint64_t ferry__chunk_end(uint64_t cur, uint64_t end, uint64_t chunk_size);

struct ferry__entry;

/* The bounce slot of a chunk: pinned host memory its storage transfer lands in or leaves from. */
struct ferry__chunk_bounce {
	char *slot;      /* NULL when the chunk holds none */
	int index;       /* registered buffer index, -1 if none */
	size_t copy_off; /* offset in the slot of the caller's first byte (reads) */
	bool staged;     /* the transfer goes through the slot whatever the plan's mode */
	bool cached;     /* read from the page cache because the data was resident (direct=auto) */
};

/* A chunk's place in a copy unit (src/engine/units.c). */
struct ferry__chunk_unit {
	bool in;     /* the chunk is a piece of a unit */
	bool ready;  /* the unit's previous round is copied: its memory may be written */
	unsigned idx, np;
	uint64_t seq;
	size_t off, bytes;
	char *base;  /* device address of the unit's first byte */
};

/* cuFile's asynchronous API reads its arguments when the stream gets there: they live here. */
struct ferry__chunk_gds {
	size_t size;
	off_t foff, boff;
	ssize_t bytes;
};

/* A piece of a request (or a queue's I/O), with the state of each path it may take in its own
 * struct: the plan and its progress (storage), the bounce slot, the GPU copy, the copy unit, cuFile. */
struct ferry__chunk {
	struct ferry_file *f;
	char *buf; /* caller's memory */
	size_t len;
	uint64_t off;
	bool is_write;
	int dev;  /* device of buf, -1 for host memory */
	int path; /* enum ferry__path */
	int64_t result;
	void *user_data;
	struct ferry__entry *entry; /* worker chunks: the request entry it belongs to */
	struct ferry__chunk *next;
	/* storage */
	struct ferry__plan plan;
	size_t done; /* bytes of plan.io_len transferred so far */
	unsigned retries;
	struct ferry__chunk_bounce bounce;
	bool gpu_busy; /* an asynchronous copy (or cuFile stream op) is in flight on the copy ring */
	struct ferry__chunk_unit unit;
	struct ferry__chunk_gds gds;
};

/* One operation handed to a backend. */
struct ferry__op {
	int fd;
	void *handle; /* cufile: the file's cuFile handle (addr is device memory of dev) */
	int dev;
	int fixed_file; /* registered file index, or -1 */
	int buf_index;  /* registered buffer index, or -1 */
	bool is_write;
	void *addr;
	size_t len;
	uint64_t off;
	void *tag;
	struct ferry__remote *remote; /* a read of a remote object: ferry__psync_do does ranged GETs */
};

enum { FERRY__CH_FINISHED, FERRY__CH_AGAIN };

/* Appends c to a singly linked list kept with its tail. */
static inline void ferry__chunk_append(struct ferry__chunk **head, struct ferry__chunk **tail,
				       struct ferry__chunk *c)
{
	c->next = NULL;
	if (*tail)
		(*tail)->next = c;
	else
		*head = c;
	*tail = c;
}

/* Sets what a chunk transfers (a piece of a request entry, or a queue's I/O). */
static inline void ferry__chunk_set(struct ferry__chunk *c, struct ferry_file *f, void *buf, uint64_t off,
				    size_t len, bool is_write, int dev, int path)
{
	c->f = f;
	c->buf = buf;
	c->off = off;
	c->len = len;
	c->is_write = is_write;
	c->dev = dev;
	c->path = path;
}

/* Plans c (c->f, buf, len, off, is_write set) and counts it. Returns true if it needs a slot. */
bool ferry__chunk_begin(ferry_ctx *ctx, uint64_t *local, struct ferry__chunk *c, size_t slot_size);
/* Fills op with the next transfer of c. */
void ferry__chunk_op(const struct ferry__chunk *c, struct ferry__op *op);
/* Accounts a backend result: FERRY__CH_AGAIN to resubmit, FERRY__CH_FINISHED (c->result set). */
int ferry__chunk_complete(ferry_ctx *ctx, uint64_t *local, struct ferry__chunk *c, int64_t res);
/* Runs c to completion with pread/pwrite in the calling thread (slot given if needed). */
void ferry__chunk_run_sync(ferry_ctx *ctx, struct ferry__chunk *c);
/* Test hook: rewrites a result per FERRY_FAULT_INJECT ("short=N,eintr=N,eagain=N"). */
int64_t ferry__fault(const struct ferry__chunk *c, int64_t res);

/* ------------------------------------------------------------------------------------ backends */

struct ferry__ring;

struct ferry__ring_opts {
	bool sqpoll;
	bool reg;
	const struct iovec *bufs; /* slots to register as fixed buffers (reg only) */
	unsigned nbufs;
	bool owner_only; /* used only by the thread that creates it (ferry_queue) */
	bool gds_batch;  /* cufile: cuFile's batch API instead of a synchronous call per op */
	bool no_coop;    /* io_uring workers without COOP_TASKRUN (the uring_no_coop knob) */
	bool no_defer;   /* io_uring queues without DEFER_TASKRUN (uring_defer=0) */
};

/* What a backend moves (ferry__backend_ops.caps). */
#define FERRY__CAP_HOST 1u   /* storage and host memory: a context's storage backend (auto tries these) */
#define FERRY__CAP_DEVICE 2u /* storage and device memory directly (GPUDirect Storage) */
#define FERRY__CAP_REMOTE 4u /* object storage and HTTP(S) URLs into host memory (src/engine/remote.c) */

/* A backend: psync, io_uring, cufile (and the remote backends to come) are each one of these. */
struct ferry__backend_ops {
	const char *name;
	unsigned caps; /* FERRY__CAP_* */
	/* 0 if usable here; otherwise a negative code and a sentence in why. Cached by the caller. */
	int (*probe)(char *why, size_t len);
	int (*ring_init)(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o);
	void (*ring_exit)(struct ferry__ring *r);
	/* Optional: registered-file table of n slots, and updates to it. */
	int (*files_init)(struct ferry__ring *r, unsigned n);
	int (*files_update)(struct ferry__ring *r, unsigned slot, int fd);
	/* Queues one op; -EBUSY when the ring is full. */
	int (*prep)(struct ferry__ring *r, const struct ferry__op *op);
	/* Submits queued ops; returns how many, or a negative error. */
	int (*submit)(struct ferry__ring *r);
	/* Waits for at least min completions; returns up to max (tag, result) pairs. */
	int (*reap)(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max);
	/* Optional: submit and reap in one system call (as reap, after a submit of everything
	 * queued); a negative error means nothing was submitted. */
	int (*submit_reap)(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max);
};

extern const struct ferry__backend_ops ferry__backend_psync;
extern const struct ferry__backend_ops ferry__backend_uring;
extern const struct ferry__backend_ops ferry__backend_cufile;
extern const struct ferry__backend_ops ferry__backend_remote;
/* Every backend; `auto` tries those with FERRY__CAP_HOST in this order. */
extern const struct ferry__backend_ops *const ferry__backends[];

/* One pread/pwrite, restarted on nothing: the caller's completion logic handles it. */
int64_t ferry__psync_do(const struct ferry__op *op);

/* --------------------------------------------------------------------------------------- queues */

/*
 * Engine spans (FERRY_ENGINE_TRACE=1, read once per process): where a worker's time goes, per
 * phase, summed over the workers and logged every 2 s of activity and when the context ends. A
 * diagnostic (issue 22: the per-piece cost of small reads into device memory), not a counter of the
 * API: off, each span costs one predictable branch.
 */
enum ferry__span {
	FERRY__SPAN_TAKE,      /* taking work off the context's list, the lock included */
	FERRY__SPAN_QUEUE,     /* planning and queueing the taken chunks */
	FERRY__SPAN_SYNC_READ, /* a resident chunk copied by the worker itself */
	FERRY__SPAN_GATHER,    /* gathered small copies queued on the ring, and their ticket */
	FERRY__SPAN_H2D,       /* a single copy to the GPU queued, and its ticket */
	FERRY__SPAN_GPU_QUERY, /* asking whether a copy is over */
	FERRY__SPAN_GPU_WAIT,  /* blocked on the oldest copy */
	FERRY__SPAN_RING,      /* the storage ring's submit and reap */
	FERRY__SPAN_DONE,      /* finished chunks accounted to their requests (waking waiters) */
	FERRY__SPAN_IDLE,      /* waiting for work */
	FERRY__SPAN_SUBMIT,    /* a caller's requests put on the work list, workers woken */
	FERRY__SPAN__COUNT
};
extern int ferry__span_on; /* 1 when tracing; set once by ferry__span_init */
void ferry__span_init(void);
/* Folds a queue's spans into the process's and logs them when due (force: now). */
void ferry__span_flush(uint64_t (*spans)[2], int force);
/* One span of a thread that has no queue (a caller's), folded in at once. */
void ferry__span_add1(int span, uint64_t t0);
/*
 * The engine's timeline (FERRY_ENGINE_TRACE=1, issue 22): when the once-per-process things happened
 * (the context's start, each worker's queue, its GPU ring, pinned memory made, the copy units, the
 * first chunk a worker took, the first unit copy, requests submitted and done), so that a fresh
 * process's first load shows what it waited for. Logged at the process's exit, grouped by event:
 * count, first start, last end, busy time, in ms from the first mark (its CLOCK_MONOTONIC time
 * is printed too: Python's perf_counter is the same clock). what: a string literal; who: a worker's
 * index or -1; t0: the start of a span, 0 for an instant.
 */
void ferry__mark(const char *what, int who, uint64_t t0);
#define FERRY__MARK(what, who, t0)                                          \
	do {                                                                \
		if (FERRY__UNLIKELY(ferry__span_on))                        \
			ferry__mark((what), (who), (t0));                   \
	} while (0)
/* The index of the worker this thread is, or -1 (a caller's thread). */
extern _Thread_local int ferry__worker_index;
#define FERRY__SPAN_T0() (FERRY__UNLIKELY(ferry__span_on) ? ferry__now_ns() : 0)
#define FERRY__SPAN_ADD(q, k, t0)                                            \
	do {                                                                 \
		if (FERRY__UNLIKELY(ferry__span_on)) {                       \
			(q)->spans[k][0] += ferry__now_ns() - (t0);          \
			(q)->spans[k][1]++;                                  \
		}                                                            \
	} while (0)

/* A ring plus the chunk logic over it: bounce slots, resubmission, completion. One thread. */
struct ferry__ioq {
	ferry_ctx *ctx;
	const struct ferry__backend_ops *ops;
	struct ferry__ring *ring;
	unsigned depth;
	unsigned pending; /* chunks taken and not yet returned finished */
	unsigned inflight; /* ops in the backend */
	unsigned queued;   /* ops prepared, not yet submitted */
	struct ferry__chunk *chunks;
	struct ferry__chunk *free_chunks;
	struct ferry__chunk *finished;      /* finished, not yet returned */
	struct ferry__chunk *finished_tail;
	struct ferry__chunk *slot_wait;     /* waiting for a bounce slot */
	char *slot_mem;
	size_t slot_size;
	unsigned nslots;
	int *free_slots;
	unsigned nfree_slots;
	unsigned cached_slots; /* slots held by chunks copied out of the page cache */
	/* resident chunks bound for GPU memory that this thread copies itself (cached_io=thread),
	 * one at a time between the ring's work, each copy to the GPU started as soon as it lands */
	struct ferry__chunk *sync_head, *sync_tail;
	void **tags;
	int64_t *res;
	/* counters kept here and folded into the context's once per reap (ferry__stats_flush): one
	 * atomic add per counter per reap instead of several per I/O on shared cache lines */
	uint64_t stats[FERRY_STAT__COUNT];
	uint64_t spans[FERRY__SPAN__COUNT][2]; /* ns and count per span, when tracing */
	struct ferry__ioq *reg_next; /* ctx registry of rings, for registered files */
	bool files_registered;
	/* FERRY__IOQ_OWNER: a ring only its creating thread may touch (io_uring SINGLE_ISSUER), so
	 * other threads' file opens and closes are not applied to its table: the owner applies them
	 * itself before its next I/O (ferry__ioq_sync_files), seeing ctx->files_gen move */
	bool owner_only;
	pthread_t owner;
	uint64_t files_gen;    /* ctx->files_gen when the table was last brought up to date */
	uint64_t *files_seen;  /* reg_id per file slot in the ring's table (owner rings) */
	/* GPU state, made at the first chunk for device memory (src/engine/gpu_io.c) */
	struct ferry__ioq_gpu *gpu;
	struct ferry__chunk *gpu_head, *gpu_tail; /* chunks with copies in flight, in issue order */
	/* stream-ordered chunks whose caller's stream has not reached their request's start yet
	 * (ferry__gpu_started): held, slot and all, and asked again at each reap */
	struct ferry__chunk *start_head, *start_tail;
	unsigned start_nap_us; /* the reap's sleep when only those are left, doubled up to a cap */
	/* GPUDirect Storage: a ring of the cufile backend, made at the first gds or gds-batch chunk */
	struct ferry__ring *gds;
	bool gds_batch; /* its kind: cuFile's batch API, or a synchronous call per op */
	unsigned gds_queued, gds_inflight;
};

/* ferry__ioq_init flags */
#define FERRY__IOQ_REG_BUFS 1u /* register the slots as io_uring fixed buffers, each at its first
				* I/O (pins it): workers only */
#define FERRY__IOQ_OWNER 2u    /* only the creating thread uses the ring (ferry_queue) */
int ferry__ioq_init(struct ferry__ioq *q, ferry_ctx *ctx, unsigned depth, unsigned nslots, unsigned flags);
void ferry__ioq_exit(struct ferry__ioq *q);
struct ferry__chunk *ferry__ioq_get(struct ferry__ioq *q);
void ferry__ioq_put(struct ferry__ioq *q, struct ferry__chunk *c);
/* Hands c back as finished at the next reap. */
void ferry__ioq_push_finished(struct ferry__ioq *q, struct ferry__chunk *c);
/* Plans and prepares c (taken with ferry__ioq_get). Finished-at-once chunks go to the finished list. */
void ferry__ioq_queue(struct ferry__ioq *q, struct ferry__chunk *c);
int ferry__ioq_submit(struct ferry__ioq *q);
/* Returns up to max finished chunks, waiting until at least min are (or none is pending). */
int ferry__ioq_reap(struct ferry__ioq *q, unsigned min, struct ferry__chunk **out, unsigned max);

/* ------------------------------------------------------------------------------------ GPU paths */

/*
 * Decides the path of a transfer of buf on f: host memory takes FERRY__P_HOST; device memory the
 * mode the `path` knob names, where `auto` takes GDS only when cuFile registers the file natively
 * and the pipelined bounce path otherwise (a counted fallback, explained in the file's path info).
 * An explicit mode that cannot run is an error naming the reason.
 */
int ferry__resolve_path(ferry_ctx *ctx, struct ferry_file *f, const void *buf, size_t len,
			bool is_write, int *dev, int *path);
/*
 * Stream-ordered chunks: 1 when c's request has no start fence or the caller's stream has passed
 * it, 0 while it has not, a negative code when the driver fails. Never waits: a worker that waited
 * for the caller's stream (on the host, or on its own copy stream, where every later copy would wait
 * too) could hold an earlier request's chunk, and the caller's stream may itself be held for that
 * request (ferry__stream_hold): each would wait for the other. A chunk that has to wait goes to the
 * queue's start list (ferry__ioq_defer_start), and the reap asks again.
 */
int ferry__gpu_started(struct ferry__chunk *c);
void ferry__ioq_defer_start(struct ferry__ioq *q, struct ferry__chunk *c);
/* Starts the GPU side of a device chunk that holds its slot (or needs none). Returns true when
 * the chunk is now waiting on the GPU (a device-to-host copy before a write, a cuFile stream op)
 * or on its caller's stream (the start list). */
bool ferry__gpu_chunk_start(struct ferry__ioq *q, struct ferry__chunk *c);
/* A device read finished its storage part: copies the slot to the device (async or not). Returns
 * true when the copy is in flight (the chunk joins the GPU list) or waits for its caller's stream
 * (the start list), false when c is finished. */
bool ferry__gpu_chunk_stored(struct ferry__ioq *q, struct ferry__chunk *c);
/* Checks the oldest GPU operations (waits for the oldest when block). Chunks whose copy is done
 * are passed to done(q, c, read_done): finished reads, or writes ready for their storage part. */
void ferry__gpu_poll(struct ferry__ioq *q, bool block,
		     void (*done)(struct ferry__ioq *q, struct ferry__chunk *c));
/* A gds or gds-batch chunk's result from the cufile backend: c->result, with the call and the
 * file named when it failed. */
void ferry__gds_complete(struct ferry__chunk *c, int64_t res);
/* A cuFile call's return (bytes; -1 with errno; -(a cuFile error)) as bytes, -errno, or
 * FERRY_ECUFILE with cuFile's reason recorded. */
int64_t ferry__gds_result(ssize_t n, const char *call);
void ferry__ioq_gpu_exit(struct ferry__ioq *q);
bool ferry__gpu_use(struct ferry__ioq *q, struct ferry__chunk *c);
struct ferry__ring_gpu;
bool ferry__gpu_record_on(struct ferry__ioq *q, struct ferry__chunk *c, struct ferry__ring_gpu *units);
/* Stream-ordered requests: records the start event on the caller's stream and, once the request
 * is queued, a host function there that holds the stream until the request is done. */
int ferry__stream_begin(int dev, void *stream, void **start_ev);
int ferry__stream_hold(int dev, void *stream, void (*fn)(void *), void *arg);
void ferry__stream_end(int dev, void *start_ev);
void ferry__file_gds_close(struct ferry_file *f);

/* ---------------------------------------------------------------------------------- copy units */

/*
 * Copy units (docs/PAGECACHE.md): a resident read into device memory is cut into units of
 * copy_unit bytes; the workers read a unit's chunks into one of copy_units pinned buffers of the
 * device, one chunk each, and the worker that lands a unit's last chunk copies the whole unit to
 * the GPU in one cuMemcpyHtoDAsync on the device's unit stream. Unit seq lives in buffer
 * seq % copy_units, round seq / copy_units: a round's chunks are read only after the previous
 * round's copy from that buffer is done.
 */
struct ferry__units;
struct ferry__entry;
/* Should e (set up, not yet submitted) go through copy units? */
bool ferry__units_eligible(ferry_ctx *ctx, const struct ferry__entry *e);
/* Under ctx->mu: makes c (just cut from e at e->cursor, of length len) a piece of e's current unit. */
void ferry__units_assign(ferry_ctx *ctx, struct ferry__entry *e, struct ferry__chunk *c);
/* Points c's slot at its place in the unit buffer (making the device's units at first use).
 * false with c->result set when they cannot be made. */
bool ferry__units_slot(struct ferry__ioq *q, struct ferry__chunk *c);
/* Before c's first read: waits until the unit's previous round is copied out of its buffer. */
void ferry__units_wait(struct ferry__ioq *q, struct ferry__chunk *c);
/* c's read is over (any result): true when c landed the unit's last piece and now carries the
 * unit's copy (it joined the GPU list), false when c is finished. */
bool ferry__units_arrive(struct ferry__ioq *q, struct ferry__chunk *c);
void ferry__units_free(ferry_ctx *ctx);
/* Makes dev's units now, if the context would use them and they are not made yet (a worker at the
 * start, in a process that already uses dev: worker_ready_gpu in ctx.c). dev current. */
void ferry__units_prepare(ferry_ctx *ctx, int dev);

/* ------------------------------------------------------------------------------------- context */

struct ferry__worker {
	ferry_ctx *ctx;
	pthread_t thread;
	struct ferry__ioq q;
	unsigned index;
	bool gpu_asked; /* worker_ready_gpu ran after ferry_ctx_start (its thread's only) */
};

/* One (file, offset, length, buffer) transfer of a request or a batch. */
struct ferry__group;
struct ferry__entry {
	struct ferry_file *f;
	char *buf;
	uint64_t off;
	uint64_t len;
	bool is_write;
	uint64_t cursor; /* next offset to hand to a worker (under ctx->mu) */
	atomic_uint_fast64_t chunks_left;
	atomic_int_fast64_t short_end; /* smallest end of a short chunk, relative; len if none */
	atomic_int error;
	uint64_t err_off; /* offset of the chunk that failed first */
	int dev;          /* device of buf, -1 for host memory */
	int path;         /* enum ferry__path */
	void *start_ev;   /* stream-ordered: a fence (gpu/ring.h) on the caller's stream; copies to or from buf wait for it */
	atomic_bool started; /* start_ev seen passed by a worker (asked once more per chunk until then) */
	bool units;       /* resident, read into device memory through copy units (decided at submission) */
	uint64_t unit_seq;       /* the unit being handed out (under ctx->mu) */
	unsigned unit_left, unit_np;
	uint64_t unit_first;     /* file offset of its first byte */
	size_t unit_bytes;
	int64_t result;
	struct ferry__group *group;
	struct ferry__entry *next_work;
};

struct ferry__group {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_uint_fast64_t entries_left;
	atomic_int done;
};

struct ferry_ctx {
	pid_t pid; /* the process that made it: a fork()ed child's copy is never torn down (ctx.c) */
	struct ferry__config cfg;
	pthread_mutex_t mu; /* work list, workers, file table, ring registry */
	pthread_cond_t work_cv;
	struct ferry__entry *work_head, *work_tail;
	uint64_t work_bytes; /* bytes of the work list not yet taken (under mu): balances the takes */
	bool started, stopping;
	/* ferry_ctx_start was called (ahead of the requests): workers in a process that uses the GPU
	 * ready their GPU side at once (ctx.c); a start by a request leaves that to its chunks */
	atomic_bool ready_gpu;
	int start_error;
	const struct ferry__backend_ops *backend;
	struct ferry__worker *workers;
	unsigned nworkers;
	struct ferry_file *files[FERRY__MAX_FILES / 2];
	struct ferry__ioq *rings; /* every ring of this context, for registered-file updates */
	uint64_t reg_ids;         /* registrations so far (file reg_id), under mu */
	atomic_uint_fast64_t files_gen; /* moves, under mu, whenever the file table changes */
	/* slots for synchronous unaligned requests done inline */
	pthread_mutex_t slot_mu;
	char **slot_cache;
	unsigned nslot_cache, slot_cache_cap;
	atomic_uint_fast64_t stats[FERRY_STAT__COUNT];
	struct ferry__publish_counters *pub; /* NULL unless publish=1 */
	const char *_Atomic pub_path;         /* the path name last published (a static string) */
	/* copy units (src/engine/units.c): a few large pinned buffers per device that the workers fill
	 * together, each copied to the GPU in one piece on one stream */
	pthread_mutex_t units_mu;
	struct ferry__units *units[FERRY__MAX_GPUS];
	/* sequence of units handed out per device, under mu: a device's units and their rounds are
	 * its own, so one counter shared by two devices left rounds of a unit never issued there (a
	 * read into two GPUs at once waited for ever) */
	uint64_t unit_next[FERRY__MAX_GPUS];
};

/* Counts into local counters (a queue's, folded in by ferry__stats_flush) or, with local NULL,
 * straight into the context's. */
#define ferry__count(ctx, local, s, n)                            \
	do {                                                      \
		if (local)                                        \
			(local)[s] += (n);                        \
		else                                              \
			ferry__stat_add((ctx), (s), (n));         \
	} while (0)
/* The bytes a worker takes off the work list at once, listed bytes being there (engine.c). */
uint64_t ferry__take_share(const ferry_ctx *ctx, uint64_t listed);
void ferry__stats_flush(ferry_ctx *ctx, uint64_t *local);

/* Mirrors the counters `ferry top` shows into the context's publication, when there is one. */
void ferry__publish_stat(struct ferry__publish_counters *pub, enum ferry_stat s, uint64_t n);

static inline void ferry__stat_add(ferry_ctx *ctx, enum ferry_stat s, uint64_t n)
{
	atomic_fetch_add_explicit(&ctx->stats[s], n, memory_order_relaxed);
	if (ctx->pub)
		ferry__publish_stat(ctx->pub, s, n);
}

const struct ferry__backend_ops *ferry__backend_by_name(const char *name);
/* Slot size for a context: chunk size plus room for the aligned head and tail. */
size_t ferry__slot_size(const ferry_ctx *ctx);
int ferry__ctx_start(ferry_ctx *ctx);
int ferry__ctx_choose_backend(ferry_ctx *ctx);
/* Registered-file bookkeeping, called with ctx->mu held. */
void ferry__ring_register(ferry_ctx *ctx, struct ferry__ioq *q);
void ferry__ring_unregister(ferry_ctx *ctx, struct ferry__ioq *q);
/* An owner ring's table brought up to date with the context's files (called by its owner). */
void ferry__ioq_sync_files(struct ferry__ioq *q);
static inline void ferry__ioq_check_files(struct ferry__ioq *q)
{
	if (q->owner_only && q->files_registered &&
	    atomic_load_explicit(&q->ctx->files_gen, memory_order_relaxed) != q->files_gen)
		ferry__ioq_sync_files(q);
}
int ferry__file_register(ferry_ctx *ctx, struct ferry_file *f);
void ferry__file_unregister(ferry_ctx *ctx, struct ferry_file *f);
/* Which backend name the context uses, for error messages (does not start workers). */
const char *ferry__backend_name(const ferry_ctx *ctx);

#endif
