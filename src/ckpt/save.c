/*
 * The safetensors writer: one pipeline for synchronous and asynchronous saves.
 *
 * The data section is cut into chunks of CHUNK bytes (16 MiB) at 4 KiB-aligned file offsets. The caller's
 * thread (the producer) copies tensor bytes into a ring of pinned slots (device tensors with
 * cuMemcpyDtoHAsync and an event per slot, host tensors with memcpy); a writer thread (the
 * consumer) hashes each slot in file order and writes it with O_DIRECT through the engine. So every
 * write is aligned and no two writes share a block, checksums cost no extra pass, and an
 * asynchronous save returns as soon as the ring holds the whole state (the snapshot). The header,
 * whose checksums are known last, is written last; then fsync, rename, directory fsync.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "base/knob.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "base/byteorder.h"
#include "base/json.h"
#include "base/sbuf.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "gpu/ring.h"
#include "engine/export.h"

/*
 * Writes in flight: 8 x 16 MiB (the engine cuts each into chunk_size pieces for its workers).
 * The raw write ceiling (ferry bench: 4 MiB x QD16 x 4 jobs) keeps 256 MiB in flight; at 3.2 GB/s
 * 64 MiB (4 in flight) leaves each piece only 20 ms of latency (Little's law), so 8. Not
 * measurable on a 2-core build machine with a 1.5 GB/s disk (docs/CHECKPOINTS.md, "Save
 * throughput"); bench/gpu-ckpt.sh's save target line is where it shows.
 */
#define CHUNK (16u << 20)
#define MAX_INFLIGHT 8
#define MAX_INFLIGHT_CAP 64

enum { PREALLOC_AUTO, PREALLOC_ON, PREALLOC_OFF }; /* the save_prealloc knob */
enum { SNAP_AUTO, SNAP_DEVICE, SNAP_PINNED };        /* the save_snapshot knob */
struct writer_knobs { uint64_t prealloc, chunk_mib, inflight, hold, snapshot; }; /* ferry__st_writer_knobs */

struct wtensor {
	char *name;
	int dtype, ndim;
	uint64_t shape[FERRY_ST_MAX_DIMS];
	const void *data;
	uint64_t nbytes;
	int dev; /* CUDA device, -1 for host memory */
};

/* What the writer thread needs of a tensor once the snapshot is taken. */
struct jtensor {
	uint64_t begin, end;
	size_t sum_pos; /* of the 16 hex digits in the header, or 0 */
};

enum { S_FREE, S_READY };

/*
 * Where a save's time goes (ferry_st_writer_phase_ns). The caller's phases are what an asynchronous
 * save blocks for; the writer's run on its thread. Seconds are summed over the save.
 */
#define PHASES(X)                                                                                  \
	X(CALL_CHECK, "call.check")       /* busy check, join of the previous thread, EXCL */      \
	X(CALL_HEADER, "call.header")     /* layout and header text */                            \
	X(CALL_SLOTS, "call.slots")       /* pinned slots (allocation and pinning when new), events */ \
	X(CALL_START, "call.start")       /* the writer thread's creation */                       \
	X(CALL_COPY, "call.copy")         /* issuing the copies into the slots (memcpy for host) */ \
	X(CALL_SLOT_WAIT, "call.slot_wait") /* waiting for a slot the writer still writes */       \
	X(CALL_SYNC, "call.sync")         /* waiting for the last device-to-host copy */           \
	X(CALL_TOTAL, "call.total")       /* the whole call (a synchronous save: to the end) */     \
	X(CKPT_PREPARE, "ckpt.prepare")   /* checkpoint: latest, mkdir of the step (caller) */     \
	X(W_LAYOUT, "writer.layout")      /* create and fallocate the temporary file */            \
	X(W_OPEN, "writer.open")                                                                   \
	X(W_READY_WAIT, "writer.ready_wait") /* waiting for the producer to fill a slot */          \
	X(W_EVENT_WAIT, "writer.event_wait") /* waiting for a slot's device-to-host copy */         \
	X(W_HASH, "writer.hash")                                                                   \
	X(W_SUBMIT, "writer.submit")                                                               \
	X(W_WRITE_WAIT, "writer.write_wait") /* waiting for the oldest write in flight */           \
	X(W_HEADER, "writer.header")                                                               \
	X(W_FSYNC, "writer.fsync")                                                                 \
	X(W_RENAME, "writer.rename")                                                               \
	X(W_DIRSYNC, "writer.dirsync")                                                             \
	X(W_HOOK, "writer.after")         /* checkpoint: marker, commit, prune */                  \
	X(W_TOTAL, "writer.total")
#define PH_ENUM(e, s) PH_##e,
enum { PHASES(PH_ENUM) PH__COUNT, PH__FIRST_WRITER = PH_W_LAYOUT };
#define PH_NAME(e, s) s,
static const char *const ph_names[] = {PHASES(PH_NAME)};
_Static_assert((int)PH__COUNT == (int)FERRY_SAVE_PHASE__COUNT && (int)PH_CKPT_PREPARE == (int)FERRY_PHASE_CKPT_PREPARE &&
		       (int)PH_W_LAYOUT == (int)FERRY_PHASE_WRITER_LAYOUT && (int)PH_W_TOTAL == (int)FERRY_PHASE_WRITER_TOTAL,
	       "enum ferry_save_phase (safetensors.h) lists PHASES in order");

struct save_stats {
	uint64_t ns[PH__COUNT];
	uint64_t bytes, slots, pinned_new; /* pinned_new: bytes pinned by this save */
	uint64_t devsnap; /* bytes of the device-side snapshot (0: the pinned path) */
	int prealloc, recycled;
};

struct slot {
	char *buf;
	int state;
	int pinned;
	int copied; /* a device-to-host copy into buf is on the ring: its ticket is the slot's index */
};

struct job {
	ferry_st_writer *w;
	ferry_ctx *ctx;
	ferry_file *f;
	char *path;
	const char *name; /* path's last component (inside path) */
	int dfd;          /* path's directory, opened once: the file is made and renamed in it */
	struct ferry__tmpfile t; /* the temporary, under an unpredictable name, until the commit */
	char *tmp;        /* its path, for the engine's open and for messages */
	char *stage; /* a URL's save (path is s3://...): the local directory of the temporary, else NULL */
	char *reuse; /* a pruned file to write over instead of a new one (checkpoints), or NULL */
	int flags;
	char *hdr; /* data_start - 8 bytes of header, then spaces */
	uint64_t data_start, total;
	struct jtensor *jt;
	size_t *order;
	size_t n;
	struct slot *slots;
	size_t k, nchunks;
	int64_t err;
	int cuda_dev;
	struct ferry__ring_gpu *ring;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ferry__save_hook hook;
	void *arg;
	uint64_t ph[PH__COUNT]; /* caller's entries by the caller, writer's by the writer thread */
	uint64_t pinned_new;
	size_t chunk, inflight;
	int hold, snapshot_done; /* hold: the writer starts once the snapshot is taken */
	int prealloc_mode, prealloc; /* PREALLOC_*; whether this save's file was fallocated */
	int recycled; /* 1: this save writes over j->reuse's blocks */
	int codec;    /* FERRY_CZ_*: the file is written compressed (consume_cz), 0: plain */
	struct ferry__activity *act; /* what `ferry top` shows of this save (NULL: not publishing) */
	/* The device-side snapshot (save_snapshot): the state copied into devbuf on the device; the
	 * filler thread copies it out into the slots, pinning them as it goes, then frees devbuf. */
	uint64_t devbuf;
	int devsnap; /* this save takes the device-side snapshot */
	pthread_t filler;
	int filler_started;
	uint64_t filler_pinned; /* bytes the filler pinned, read once it is joined */
};

struct ferry_st_writer {
	ferry_ctx *ctx;
	struct wtensor *t;
	size_t n, cap;
	char **mk, **mv;
	size_t nm, mcap;
	/* Kept from save to save, for the device of the last one (-1: host memory): the pinned slots,
	 * and the copy ring (a ticket per slot) for device-to-host copies. */
	struct ferry__pinned_pool *pool;
	int pool_dev;
	struct ferry__ring_gpu *ring;
	/* the save in flight */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running, joined;
	int64_t result;
	char errmsg[1024]; /* the writer thread's ferry_last_error(), handed to wait()'s caller */
	pthread_t thr;
	struct job *job;
	struct save_stats stats; /* of the last save, under mu */
	struct writer_knobs knobs;
	int codec; /* ferry__st_writer_compress: the next save's codec (0: plain) */
};


int ferry_st_writer_create(ferry_ctx *ctx, ferry_st_writer **out)
{
	ferry_st_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	int r = ferry__knobs_init(&ferry__st_writer_knobs, &w->knobs);
	if (r) {
		free(w);
		return r;
	}
	w->ctx = ctx;
	w->pool_dev = -2;
	w->joined = 1;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	*out = w;
	return 0;
}

static void clear_entries(ferry_st_writer *w)
{
	for (size_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	for (size_t i = 0; i < w->nm; i++) {
		free(w->mk[i]);
		free(w->mv[i]);
	}
	w->n = w->nm = 0;
}

static void release_device(ferry_st_writer *w);

void ferry_st_writer_destroy(ferry_st_writer *w)
{
	if (!w)
		return;
	(void)ferry_st_writer_wait(w, -1);
	clear_entries(w);
	free(w->t);
	free(w->mk);
	free(w->mv);
	release_device(w);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	free(w);
}

int ferry_st_writer_reset(ferry_st_writer *w)
{
	clear_entries(w);
	return 0;
}


int ferry_st_writer_add(ferry_st_writer *w, const char *name, enum ferry_dtype dtype, int ndim, const uint64_t *shape,
			const void *data, size_t nbytes)
{
	uint64_t nb;
	const char *why;
	if (!name)
		return ferry__error(-EINVAL, "safetensors writer: NULL name");
	size_t len = strlen(name);
	if ((why = ferry__st_name_problem(name, len)) || !ferry__utf8_valid(name, len))
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%.64s\": %s", name, why ? why : "name is not valid UTF-8");
	if (!ferry_dtype_name(dtype) || dtype == FERRY_DT_BYTES)
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%s\": no safetensors dtype %d", name, (int)dtype);
	if (ndim < 0 || ndim > FERRY_ST_MAX_DIMS || (ndim && !shape))
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%s\": %d dimensions", name, ndim);
	int r = ferry__st_nbytes(dtype, ndim, shape, &nb);
	if (r)
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%s\": %s", name,
				    r == -EOVERFLOW ? "byte size overflows" : "not a whole number of bytes");
	if (nb != nbytes)
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%s\": %zu bytes given, dtype and shape make %llu",
				    name, nbytes, (unsigned long long)nb);
	if (nbytes && !data)
		return ferry__error(-EINVAL, "safetensors writer: tensor \"%s\": NULL data", name);
	if (ferry__grow((void **)&w->t, &w->cap, w->n + 1, sizeof(*w->t)))
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	struct wtensor *t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	t->dtype = dtype;
	t->ndim = ndim;
	if (ndim)
		memcpy(t->shape, shape, (size_t)ndim * sizeof(*shape));
	t->data = data;
	t->nbytes = nb;
	t->dev = -1;
	if (nbytes && ferry_mem_kind(data, &t->dev) != FERRY_MEM_DEVICE)
		t->dev = -1;
	return (int)w->n++;
}

int ferry_st_writer_metadata(ferry_st_writer *w, const char *key, const char *value)
{
	if (!key || !value || !ferry__utf8_valid(key, strlen(key)) || !ferry__utf8_valid(value, strlen(value)))
		return ferry__error(-EINVAL, "safetensors writer: metadata key and value must be UTF-8 strings");
	if (!strncmp(key, FERRY_ST_CHECKSUM_PREFIX, strlen(FERRY_ST_CHECKSUM_PREFIX)))
		return ferry__error(-EINVAL, "safetensors writer: metadata key \"%s\" is reserved for checksums", key);
	for (size_t i = 0; i < w->nm; i++)
		if (!strcmp(w->mk[i], key))
			return ferry__error(-EEXIST, "safetensors writer: metadata key \"%s\" given twice", key);
	size_t c = w->mcap;
	if (ferry__grow((void **)&w->mk, &c, w->nm + 1, sizeof(char *)) ||
	    ferry__grow((void **)&w->mv, &w->mcap, w->nm + 1, sizeof(char *)))
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	w->mk[w->nm] = strdup(key);
	w->mv[w->nm] = strdup(value);
	if (!w->mk[w->nm] || !w->mv[w->nm]) {
		free(w->mk[w->nm]);
		free(w->mv[w->nm]);
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	}
	w->nm++;
	return 0;
}

/* ------------------------------------------------------------------------------------- header */

/* The reference writer's order: decreasing dtype (alignment), then name. arg: the writer. */
static int cmp_layout(const void *a, const void *b, void *arg)
{
	const ferry_st_writer *sort_w = arg;
	const struct wtensor *x = &sort_w->t[*(const size_t *)a], *y = &sort_w->t[*(const size_t *)b];
	int rx = ferry__dtype_layout_rank(x->dtype), ry = ferry__dtype_layout_rank(y->dtype);
	if (rx != ry)
		return rx > ry ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b, void *arg)
{
	const ferry_st_writer *sort_w = arg;
	return strcmp(sort_w->t[*(const size_t *)a].name, sort_w->t[*(const size_t *)b].name);
}

/* Builds the header of job j (order, offsets, checksum placeholders). */
static int build_header(ferry_st_writer *w, struct job *j)
{
	struct ferry__sbuf b = {0};
	char num[64];
	size_t *byname = malloc((w->n ? w->n : 1) * sizeof(size_t));
	j->order = malloc((w->n ? w->n : 1) * sizeof(size_t));
	j->jt = calloc(w->n ? w->n : 1, sizeof(*j->jt));
	if (!byname || !j->order || !j->jt) {
		free(byname);
		return ferry__error(-ENOMEM, "safetensors writer: out of memory");
	}
	for (size_t i = 0; i < w->n; i++)
		j->order[i] = byname[i] = i;
	qsort_r(j->order, w->n, sizeof(size_t), cmp_layout, w);
	qsort_r(byname, w->n, sizeof(size_t), cmp_name, w);
	for (size_t i = 1; i < w->n; i++)
		if (!strcmp(w->t[byname[i - 1]].name, w->t[byname[i]].name)) {
			int r = ferry__error(-EEXIST, "safetensors writer: tensor \"%s\" added twice", w->t[byname[i]].name);
			free(byname);
			return r;
		}
	free(byname);
	j->n = w->n;

	int sums = j->flags & FERRY_SAVE_CHECKSUM;
	ferry__sbuf_puts(&b, "{");
	int first = 1;
	if (w->nm || (sums && w->n)) {
		ferry__sbuf_puts(&b, "\"__metadata__\":{");
		for (size_t i = 0; i < w->nm; i++) {
			if (i)
				ferry__sbuf_puts(&b, ",");
			ferry__sbuf_json(&b, w->mk[i]);
			ferry__sbuf_puts(&b, ":");
			ferry__sbuf_json(&b, w->mv[i]);
		}
		for (size_t i = 0; sums && i < w->n; i++) {
			struct wtensor *t = &w->t[j->order[i]];
			if (i || w->nm)
				ferry__sbuf_puts(&b, ",");
			ferry__sbuf_puts(&b, "\"" FERRY_ST_CHECKSUM_PREFIX);
			ferry__sbuf_json_body(&b, t->name);
			ferry__sbuf_puts(&b, "\":\"");
			j->jt[i].sum_pos = b.len;
			ferry__sbuf_puts(&b, "0000000000000000\"");
		}
		ferry__sbuf_puts(&b, "}");
		first = 0;
	}
	uint64_t off = 0;
	for (size_t i = 0; i < w->n; i++) {
		struct wtensor *t = &w->t[j->order[i]];
		if (!first)
			ferry__sbuf_puts(&b, ",");
		first = 0;
		ferry__sbuf_json(&b, t->name);
		ferry__sbuf_puts(&b, ":{\"dtype\":\"");
		ferry__sbuf_puts(&b, ferry_dtype_name(t->dtype));
		ferry__sbuf_puts(&b, "\",\"shape\":[");
		for (int d = 0; d < t->ndim; d++) {
			snprintf(num, sizeof(num), "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
			ferry__sbuf_puts(&b, num);
		}
		snprintf(num, sizeof(num), "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			 (unsigned long long)(off + t->nbytes));
		ferry__sbuf_puts(&b, num);
		j->jt[i].begin = off;
		j->jt[i].end = off + t->nbytes;
		off += t->nbytes;
	}
	ferry__sbuf_puts(&b, "}");
	if (b.oom) {
		ferry__sbuf_free(&b);
		return ferry__error(-ENOMEM, "safetensors writer: header");
	}
	if (b.len > FERRY__ST_MAX_HEADER - FERRY__ST_ALIGN) {
		ferry__sbuf_free(&b);
		return ferry__error(-E2BIG, "safetensors writer: header of %zu bytes exceeds the format's limit", b.len);
	}
	j->total = off;
	j->data_start = (8 + b.len + FERRY__ST_ALIGN - 1) / FERRY__ST_ALIGN * FERRY__ST_ALIGN;
	j->hdr = ferry_alloc_aligned((size_t)j->data_start);
	if (!j->hdr) {
		ferry__sbuf_free(&b);
		return ferry__error(-ENOMEM, "safetensors writer: header");
	}
	uint64_t hl = j->data_start - 8;
	ferry__wr64((uint8_t *)j->hdr, hl);
	memcpy(j->hdr + 8, b.data, b.len);
	memset(j->hdr + 8 + b.len, ' ', (size_t)(hl - b.len));
	for (size_t i = 0; i < w->n; i++)
		if (j->jt[i].sum_pos)
			j->jt[i].sum_pos += 8;
	ferry__sbuf_free(&b);
	return 0;
}

/* ------------------------------------------------------------------------------------- pipeline */

int (*ferry__save_fallocate)(int fd, int mode, off_t offset, off_t len) = fallocate;

/* Whether save_prealloc (mode) asks for fallocate on fd's file system. */
static int want_prealloc(int fd, int mode)
{
	struct statfs sf;
	/* tmpfs has no extents to convert nor locks to spare: fallocate there only allocates and
	 * zeroes the file's memory before the writes fill it (0.3 s per 2.2 GB on the build machine,
	 * on the writer's path). */
	return mode == PREALLOC_ON ||
	       (mode == PREALLOC_AUTO && !(fstatfs(fd, &sf) == 0 && sf.f_type == TMPFS_MAGIC));
}

/*
 * Lays out [from, size) of fd as mode says: fallocated (*prealloc = 1), or sized by ftruncate where
 * the mode says so or the file system refuses fallocate (EOPNOTSUPP and the like, logged); only a
 * refusal that a write would meet too (no space, quota, too big, EIO) is an error.
 */
static int lay_out(int fd, const char *tmp, uint64_t from, uint64_t size, int mode, int *prealloc)
{
	*prealloc = 0;
	if (size <= from)
		return 0;
	if (want_prealloc(fd, mode)) {
		if (ferry__save_fallocate(fd, 0, (off_t)from, (off_t)(size - from)) == 0) {
			*prealloc = 1;
			return 0;
		}
		int e = errno;
		if (e == ENOSPC || e == EDQUOT || e == EFBIG || e == EIO)
			return ferry__error(-e, "fallocate(%s, %llu bytes): %s", tmp, (unsigned long long)size, strerror(e));
		FERRY__LOG(FERRY__LOG_INFO, "%s: fallocate refused (%s); ftruncate instead", tmp, strerror(e));
	}
	if (ftruncate(fd, (off_t)size))
		return ferry__error(-errno, "ftruncate(%s, %llu): %s", tmp, (unsigned long long)size, strerror(errno));
	return 0;
}

/*
 * Creates the temporary file at its final size with its blocks allocated. ext4 (and XFS) run an
 * O_DIRECT write that is not a pure overwrite of allocated blocks (a hole, or past i_size) under
 * the inode's exclusive lock, and a synchronous one holds it until the data is on the device
 * (fs/ext4/file.c, ext4_dio_write_checks: "extending I/O, any form of non-overwrite I/O"): the
 * engine's parallel chunks into a sparse file wrote one at a time. Into fallocated (unwritten)
 * extents they are overwrites, under the shared lock, in parallel. A file system that cannot
 * preallocate (EOPNOTSUPP: NFS before 4.2, some FUSE) gets ftruncate instead, as before; only a
 * refusal that a write would meet too (no space, quota, too big) is an error, and an early one.
 */
static int create_laid_out(struct job *j, uint64_t size)
{
	int r = ferry__tmp_create(j->dfd, j->name, 0644, 0, &j->t);
	if (!r)
		r = lay_out(j->t.fd, j->t.name, 0, size, j->prealloc_mode, &j->prealloc);
	if (r)
		ferry__tmp_abort(&j->t);
	return r;
}

/*
 * Takes the pruned file `from` (a checkpoint's recycled shard) as the temporary file tmp and sizes
 * it for this save, so that the save overwrites blocks the file system has already allocated and
 * written: no block allocation and no unwritten-extent conversion, the cost that separates writing
 * a new file from overwriting one (docs/CHECKPOINTS.md, "Recycled shards"). Returns 1 when it did,
 * 0 when the file is not to be reused (absent, not a plain file, linked elsewhere, or open in
 * another process: the caller then makes a new file), or an error that a new file would meet too.
 */
static int reuse_laid_out(struct job *j, uint64_t size)
{
	const char *from, *why = NULL;
	int rdfd = ferry__dir_open_parent(j->reuse, 0, &from); /* ferry made recycle/: never a symlink */
	if (rdfd < 0)
		return 0; /* no recycle directory: nothing to recycle */
	int r = ferry__tmp_adopt(j->dfd, rdfd, from, j->name, 0, &j->t);
	close(rdfd);
	if (r < 0) /* a symlink planted there, another file system, ...: a new file instead */
		FERRY__LOG(FERRY__LOG_INFO, "%s: not recycled (%s); a new file instead", j->reuse, ferry_last_error());
	if (r <= 0) /* 0: absent, or another save took it first */
		return 0;
	int fd = j->t.fd;
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		why = "not a plain file";
	else if (st.st_nlink != 1)
		why = "it has other links"; /* e.g. `cp -al` kept a copy of the pruned step */
	else if (fcntl(fd, F_SETLEASE, F_WRLCK))
		/* A write lease is granted only while no other process has the file open: a reader
		 * still loading the pruned step keeps its data (as with an unlinked file). EAGAIN is
		 * that case; EINVAL, EACCES (NFS, another owner) mean it cannot be known: not reused. */
		why = errno == EAGAIN ? "another process has it open" : "no lease to prove it unused";
	if (why) {
		FERRY__LOG(FERRY__LOG_INFO, "%s: not recycled (%s); a new file instead", j->reuse, why);
		ferry__tmp_abort(&j->t);
		return 0;
	}
	(void)fcntl(fd, F_SETLEASE, F_UNLCK);
	r = 0;
	j->prealloc = 0;
	if ((uint64_t)st.st_size > size) {
		if (ftruncate(fd, (off_t)size))
			r = ferry__error(-errno, "ftruncate(%s, %llu): %s", j->t.name, (unsigned long long)size,
					 strerror(errno));
	} else { /* the new part, as a new file's */
		r = lay_out(fd, j->t.name, (uint64_t)st.st_size, size, j->prealloc_mode, &j->prealloc);
	}
	if (r)
		ferry__tmp_abort(&j->t);
	return r ? r : 1;
}

/* The temporary's path (beside the final name), for the engine's open and for messages. */
static int tmp_path(struct job *j)
{
	size_t dl = j->stage ? strlen(j->stage) + 1 : (size_t)(j->name - j->path);
	free(j->tmp);
	j->tmp = malloc(dl + strlen(j->t.name) + 1);
	if (!j->tmp)
		return ferry__error(-ENOMEM, "%s: save", j->path);
	if (j->stage)
		snprintf(j->tmp, dl + 1, "%s/", j->stage);
	else
		memcpy(j->tmp, j->path, dl);
	strcpy(j->tmp + dl, j->t.name);
	return 0;
}

static void job_fail(struct job *j, int64_t err)
{
	pthread_mutex_lock(&j->mu);
	if (!j->err)
		j->err = err;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->filler_started)
		pthread_join(j->filler, NULL);
	if (j->devbuf)
		ferry__gpu_release(j->cuda_dev, j->devbuf);
	for (size_t i = 0; i < j->k; i++)
		ferry__pinned_free(j->w->pool, j->slots[i].buf);
	free(j->slots);
	ferry_file_destroy(j->f);
	ferry__tmp_abort(&j->t); /* the temporary this save made, if not committed; nothing else */
	ferry__activity_end(j->act, FERRY__PHASE_FAILED); /* never started: its thread ends it */
	if (j->dfd >= 0)
		close(j->dfd);
	free(j->tmp);
	free(j->stage);
	free(j->path);
	free(j->reuse);
	ferry_free_aligned(j->hdr, (size_t)j->data_start);
	free(j->jt);
	free(j->order);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
}

static size_t chunk_len(struct job *j, size_t c)
{
	uint64_t a = (uint64_t)c * j->chunk;
	return (size_t)(j->total - a < j->chunk ? j->total - a : j->chunk);
}

/* Adds the time since *t0 to phase ph and moves *t0 to now. */
static void lap(struct job *j, int ph, uint64_t *t0)
{
	uint64_t t = ferry__now_ns();
	j->ph[ph] += t - *t0;
	*t0 = t;
}

/*
 * A URL's commit: the finished temporary is written to the object in order (a multipart upload
 * through the remote backend, docs/REMOTE.md) and ferry_file_sync makes it visible whole; on any
 * failure the upload is aborted and nothing appears under the key. The header, written last
 * locally because its checksums are known last, would otherwise need the object's first bytes
 * held back to the end: S3 objects cannot be written out of order.
 */
static int upload(struct job *j, uint64_t size)
{
	int fd = openat(j->dfd, j->t.name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return ferry__error(-errno, "%s: reopening %s: %s", j->path, j->tmp, strerror(errno));
	void *map = size ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (map == MAP_FAILED)
		return ferry__error(-errno, "%s: mmap(%s): %s", j->path, j->tmp, strerror(errno));
	if (map)
		(void)madvise(map, (size_t)size, MADV_SEQUENTIAL);
	ferry_file *u = NULL;
	int r = ferry_file_open(j->ctx, j->path, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &u);
	for (uint64_t off = 0; !r && off < size;) {
		size_t n = size - off < (1u << 30) ? (size_t)(size - off) : (1u << 30);
		ssize_t got = ferry_pwrite(u, (const char *)map + off, n, off);
		if (got < 0)
			r = (int)got;
		else if (got == 0)
			r = ferry__error(-EIO, "%s: short upload at %llu", j->path, (unsigned long long)off);
		off += got > 0 ? (uint64_t)got : 0;
	}
	if (!r)
		r = ferry_file_sync(u, 0);
	ferry_file_destroy(u); /* without the commit above: the upload is aborted */
	if (map)
		munmap(map, (size_t)size);
	return r;
}

/* With save_hold, the writer waits for the snapshot before its first write. */
static void hold_for_snapshot(struct job *j, uint64_t *t)
{
	pthread_mutex_lock(&j->mu);
	while (!j->snapshot_done && !j->err)
		pthread_cond_wait(&j->cv, &j->mu);
	pthread_mutex_unlock(&j->mu);
	lap(j, PH_W_READY_WAIT, t);
}

/* Waits for chunk c's slot to be filled (and its device-to-host copy done): the slot, or NULL with
 * *err set (the job's error, or the copy's). */
static struct slot *slot_ready(struct job *j, size_t c, uint64_t *t, int64_t *err)
{
	struct slot *s = &j->slots[c % j->k];
	pthread_mutex_lock(&j->mu);
	while (s->state != S_READY && !j->err)
		pthread_cond_wait(&j->cv, &j->mu);
	*err = j->err;
	pthread_mutex_unlock(&j->mu);
	lap(j, PH_W_READY_WAIT, t);
	if (*err)
		return NULL;
	if (s->copied) {
		int cr = ferry__ring_sync(j->ring, (unsigned)(c % j->k));
		lap(j, PH_W_EVENT_WAIT, t);
		if (cr < 0) {
			ferry__error_append("%s: device-to-host copy of chunk %zu", j->path, c);
			*err = cr;
			return NULL;
		}
	}
	return s;
}

/*
 * The writer thread's part for a compressed file (docs/FORMATS.md): the header, then every chunk
 * in order, into a compressed file's writer, which compresses cz_threads of its chunks at once and
 * commits through the durable module (temporary beside the path, fsync, rename, directory fsync).
 * The header goes first, so it holds no per-tensor checksums (they are known last): every
 * compressed chunk holds the XXH3 of its bytes, header included, checked on every read.
 */
static int64_t consume_cz(struct job *j)
{
	ferry_cz_writer *cz = NULL;
	uint64_t t = ferry__now_ns();
	int64_t err = ferry_cz_writer_create(j->path, j->codec, j->flags & FERRY_SAVE_EXCL ? FERRY_CZ_EXCL : 0, &cz);
	lap(j, PH_W_OPEN, &t);
	if (!err)
		err = ferry_cz_writer_write(cz, j->hdr, (size_t)j->data_start);
	if (!err && j->hold)
		hold_for_snapshot(j, &t);
	ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_MOVE);
	for (size_t c = 0; c < j->nchunks && !err; c++) {
		struct slot *s = slot_ready(j, c, &t, &err);
		if (!s)
			break;
		err = ferry_cz_writer_write(cz, s->buf, chunk_len(j, c));
		lap(j, PH_W_SUBMIT, &t);
		ferry__activity_add(j->act, FERRY__ACT_BYTES, chunk_len(j, c));
		pthread_mutex_lock(&j->mu);
		s->state = S_FREE;
		pthread_cond_broadcast(&j->cv);
		pthread_mutex_unlock(&j->mu);
	}
	if (err) {
		job_fail(j, err);
		ferry_cz_writer_destroy(cz); /* removes its temporary */
		return err;
	}
	ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_COMMIT);
	int64_t size = ferry_cz_writer_commit(cz);
	lap(j, PH_W_FSYNC, &t);
	ferry_cz_writer_destroy(cz);
	return size;
}

/* The writer thread's part: hash and write every chunk in order, then the header, then commit. */
static int64_t consume(struct job *j)
{
	if (j->codec)
		return consume_cz(j);
	struct ferry__xxh3 *h = (j->flags & FERRY_SAVE_CHECKSUM) ? ferry__xxh3_create() : NULL;
	ferry_req *req[MAX_INFLIGHT_CAP];
	size_t inflight_first = 0, ninflight = 0, ti = 0;
	size_t q = j->k > 1 ? j->k - 1 : 1;
	int64_t err = 0;
	uint64_t t = ferry__now_ns();

	if (q > j->inflight)
		q = j->inflight;
	if ((j->flags & FERRY_SAVE_CHECKSUM) && !h)
		err = ferry__error(-ENOMEM, "%s: checksum state", j->path);
	/* The file is made here, not by the caller: an asynchronous save returns once the snapshot
	 * is taken, and laying out a file of the state's size (fallocate; on tmpfs that allocates
	 * its memory) is the writer's work. Its errors are reported like a write's. */
	if (!err) {
		int r = j->reuse ? reuse_laid_out(j, j->data_start + j->total) : 0;
		j->recycled = r == 1;
		if (r == 0)
			r = create_laid_out(j, j->data_start + j->total);
		else if (r == 1)
			r = 0;
		if (!r)
			r = tmp_path(j);
		lap(j, PH_W_LAYOUT, &t);
		if (!r)
			r = ferry__file_open_made(j->ctx, j->dfd, j->t.name, j->t.fd, j->tmp, FERRY_O_WRONLY, &j->f);
		lap(j, PH_W_OPEN, &t);
		err = r;
	}
	if (err)
		job_fail(j, err);
	if (!err && j->hold)
		hold_for_snapshot(j, &t);
	ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_MOVE);
	for (size_t c = 0; c < j->nchunks && !err; c++) {
		struct slot *s = slot_ready(j, c, &t, &err);
		if (!s)
			break;
		uint64_t a = (uint64_t)c * j->chunk, b = a + chunk_len(j, c);
		while (h && ti < j->n) {
			struct jtensor *jt = &j->jt[ti];
			if (jt->begin > b || (jt->begin == b && jt->end > jt->begin))
				break;
			uint64_t lo = jt->begin > a ? jt->begin : a, hi = jt->end < b ? jt->end : b;
			if (hi > lo)
				ferry__xxh3_update(h, s->buf + (lo - a), (size_t)(hi - lo));
			if (jt->end > b)
				break;
			char hex[17];
			snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)ferry__xxh3_digest(h));
			memcpy(j->hdr + jt->sum_pos, hex, 16);
			ferry__xxh3_reset(h);
			ti++;
		}
		if (h)
			lap(j, PH_W_HASH, &t);
		int r = ferry_pwrite_async(j->f, s->buf, chunk_len(j, c), j->data_start + a,
					   &req[(inflight_first + ninflight) % MAX_INFLIGHT_CAP]);
		lap(j, PH_W_SUBMIT, &t);
		if (r) {
			err = r;
			break;
		}
		ninflight++;
		while (ninflight && (ninflight >= q || c + 1 == j->nchunks)) {
			size_t oc = c + 1 - ninflight;
			ferry_req *rq = req[inflight_first];
			ssize_t got = ferry_req_wait(rq, -1);
			ferry_req_destroy(rq);
			inflight_first = (inflight_first + 1) % MAX_INFLIGHT_CAP;
			ninflight--;
			ferry__activity_add(j->act, FERRY__ACT_BYTES, got > 0 ? (uint64_t)got : 0);
			if (got != (ssize_t)chunk_len(j, oc) && !err)
				err = got < 0 ? got : ferry__error(-EIO, "%s: short write at %llu", j->tmp,
								   (unsigned long long)(j->data_start + (uint64_t)oc * j->chunk));
			pthread_mutex_lock(&j->mu);
			j->slots[oc % j->k].state = S_FREE;
			pthread_cond_broadcast(&j->cv);
			pthread_mutex_unlock(&j->mu);
		}
		lap(j, PH_W_WRITE_WAIT, &t);
	}
	while (ninflight) { /* after an error: the buffers stay busy until their writes end */
		ferry_req_wait(req[inflight_first], -1);
		ferry_req_destroy(req[inflight_first]);
		inflight_first = (inflight_first + 1) % MAX_INFLIGHT_CAP;
		ninflight--;
	}
	if (err) {
		job_fail(j, err);
		ferry__xxh3_destroy(h);
		return err;
	}
	for (; h && ti < j->n; ti++) { /* empty tensors at the end */
		char hex[17];
		ferry__xxh3_reset(h);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)ferry__xxh3_digest(h));
		memcpy(j->hdr + j->jt[ti].sum_pos, hex, 16);
	}
	ferry__xxh3_destroy(h);
	ssize_t got = ferry_pwrite(j->f, j->hdr, (size_t)j->data_start, 0);
	lap(j, PH_W_HEADER, &t);
	if (got != (ssize_t)j->data_start)
		return got < 0 ? got : ferry__error(-EIO, "%s: short header write", j->tmp);
	ferry__activity_add(j->act, FERRY__ACT_BYTES, j->data_start);
	if (j->stage) { /* a URL: the object is the durable copy; the local temporary only stages it */
		ferry_file_destroy(j->f);
		j->f = NULL;
		ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_COMMIT);
		int r = upload(j, j->data_start + j->total);
		lap(j, PH_W_RENAME, &t);
		ferry__tmp_abort(&j->t);
		return r ? r : (int64_t)(j->data_start + j->total);
	}
	ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_SYNC);
	if (!(j->flags & FERRY_SAVE_NOSYNC)) {
		int r = ferry_file_sync(j->f, 1);
		lap(j, PH_W_FSYNC, &t);
		if (r)
			return r;
	}
	ferry_file_destroy(j->f);
	j->f = NULL;
	ferry__activity_set(j->act, FERRY__ACT_PHASE, FERRY__PHASE_COMMIT);
	/* the data is fsynced above; the rename never replaces a file with FERRY_SAVE_EXCL */
	int r = ferry__tmp_commit(&j->t, FERRY__DURABLE_NOSYNC | FERRY__DURABLE_NODIRSYNC |
						 (j->flags & FERRY_SAVE_EXCL ? FERRY__DURABLE_NOREPLACE : 0));
	if (r)
		return r;
	lap(j, PH_W_RENAME, &t);
	if (!(j->flags & FERRY_SAVE_NOSYNC)) {
		r = ferry__fsync_dirfd(j->dfd, j->path);
		lap(j, PH_W_DIRSYNC, &t);
		if (r)
			return r;
	}
	return (int64_t)(j->data_start + j->total);
}

static void *writer_thread(void *arg)
{
	struct job *j = arg;
	ferry_st_writer *w = j->w;
	uint64_t t0 = ferry__now_ns(), t = t0;
	int64_t res = consume(j);
	if (j->devsnap) { /* the filler ends once every chunk is out of the device snapshot, or on j->err */
		pthread_mutex_lock(&j->mu);
		while (!j->snapshot_done) /* the caller has made it (or failed to) by then */
			pthread_cond_wait(&j->cv, &j->mu);
		int started = j->filler_started;
		j->filler_started = 0;
		pthread_mutex_unlock(&j->mu);
		if (started)
			pthread_join(j->filler, NULL);
	}
	if (j->hook) {
		t = ferry__now_ns();
		res = j->hook(j->arg, res);
		lap(j, PH_W_HOOK, &t);
	}
	j->ph[PH_W_TOTAL] = ferry__now_ns() - t0;
	ferry__activity_end(j->act, res < 0 ? FERRY__PHASE_FAILED : FERRY__PHASE_DONE);
	j->act = NULL;
	pthread_mutex_lock(&w->mu);
	for (int i = PH__FIRST_WRITER; i < PH__COUNT; i++)
		w->stats.ns[i] = j->ph[i];
	w->stats.prealloc = j->prealloc;
	w->stats.recycled = j->recycled;
	w->stats.pinned_new += j->filler_pinned;
	w->result = res;
	if (res < 0)
		snprintf(w->errmsg, sizeof(w->errmsg), "%s", ferry_last_error());
	w->running = 0;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* The size of every slot of job j (one slot: the state's, rounded up to a page). */
static size_t slot_size(const struct job *j)
{
	return j->nchunks == 1 ? (size_t)((j->total + 4095) / 4096 * 4096) : j->chunk;
}

/*
 * The device-side snapshot's filler thread: copies chunk after chunk of devbuf into the slots
 * (allocating and pinning each slot the first time, off the caller's path), as the writer frees
 * them; then frees devbuf. The slots stay in the writer's pool, so the next save finds them pinned.
 */
static void *filler_thread(void *arg)
{
	struct job *j = arg;
	int r = 0;
	for (size_t c = 0; c < j->nchunks && !r; c++) {
		struct slot *s = &j->slots[c % j->k];
		pthread_mutex_lock(&j->mu);
		while (s->state != S_FREE && !j->err)
			pthread_cond_wait(&j->cv, &j->mu);
		r = (int)j->err;
		pthread_mutex_unlock(&j->mu);
		if (r)
			break;
		if (!s->buf) {
			int pinned = 0;
			uint64_t held = ferry__pinned_held(j->w->pool);
			r = ferry__pinned_alloc(j->w->pool, slot_size(j), (void **)&s->buf, &pinned);
			if (r) {
				ferry__error_append("%s: a slot for the device snapshot's chunk %zu", j->path, c);
				break;
			}
			s->pinned = pinned;
			if (ferry__pinned_held(j->w->pool) > held)
				j->filler_pinned += slot_size(j);
		}
		r = ferry__ring_d2h(j->ring, s->buf, j->devbuf + (uint64_t)c * j->chunk, chunk_len(j, c), s->pinned);
		if (!r)
			r = ferry__ring_record(j->ring, (unsigned)(c % j->k));
		if (r) {
			ferry__error_append("%s: copying chunk %zu out of the device snapshot", j->path, c);
			break;
		}
		s->copied = 1;
		pthread_mutex_lock(&j->mu);
		s->state = S_READY;
		pthread_cond_broadcast(&j->cv);
		pthread_mutex_unlock(&j->mu);
	}
	/* Every copy out of devbuf has landed (or the save failed): its memory goes back at once,
	 * not when the writes end. */
	int dr = ferry__ring_drain(j->ring);
	if (!r && dr < 0)
		r = dr;
	ferry__gpu_release(j->cuda_dev, j->devbuf);
	j->devbuf = 0;
	if (r)
		job_fail(j, r);
	return NULL;
}

/*
 * The caller's part of a device-side snapshot: every tensor copied into devbuf at the offset the
 * file gives it (device tensors device to device, host tensors from host memory), then the filler
 * thread started. Returns once the copies have landed: the caller may change its tensors then.
 */
static int produce_device(struct job *j, ferry_st_writer *w)
{
	void *prev = NULL;
	int r;
	uint64_t tp = ferry__now_ns();
	if ((r = ferry__gpu_enter(j->cuda_dev, &prev)))
		return r;
	for (size_t ti = 0; ti < j->n && !r; ti++) {
		const struct wtensor *t = &w->t[j->order[ti]];
		uint64_t dst = j->devbuf + j->jt[ti].begin;
		if (!t->nbytes)
			continue;
		r = t->dev >= 0 ? ferry__ring_d2d(j->ring, j->cuda_dev, dst, (uint64_t)(uintptr_t)t->data, (size_t)t->nbytes)
				: ferry__ring_h2d(j->ring, dst, t->data, (size_t)t->nbytes, false);
		if (r)
			ferry__error_append("%s: copying tensor \"%s\" into the device snapshot", j->path, t->name);
	}
	lap(j, PH_CALL_COPY, &tp);
	if (!r && (r = ferry__ring_drain(j->ring)))
		ferry__error_append("%s: the device snapshot", j->path);
	lap(j, PH_CALL_SYNC, &tp);
	ferry__gpu_leave(prev);
	int started = 0;
	if (!r) {
		int e = pthread_create(&j->filler, NULL, filler_thread, j);
		if (e)
			r = ferry__error(-e, "%s: pthread_create: %s", j->path, strerror(e));
		else
			started = 1;
	}
	if (r)
		job_fail(j, r);
	pthread_mutex_lock(&j->mu);
	j->filler_started = started;
	j->snapshot_done = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	return r;
}

/* The caller's part: copy every tensor into the ring of slots, in file order. */
static int produce(ferry_st_writer *w, struct job *j)
{
	void *prev = NULL;
	size_t ti = 0;
	int r = 0;

	if (j->devsnap)
		return produce_device(j, w);
	uint64_t tp = ferry__now_ns();
	if (j->ring && (r = ferry__gpu_enter(j->cuda_dev, &prev)))
		return r;
	for (size_t c = 0; c < j->nchunks && !r; c++) {
		struct slot *s = &j->slots[c % j->k];
		lap(j, PH_CALL_COPY, &tp);
		pthread_mutex_lock(&j->mu);
		while (s->state != S_FREE && !j->err)
			pthread_cond_wait(&j->cv, &j->mu);
		r = (int)j->err;
		pthread_mutex_unlock(&j->mu);
		lap(j, PH_CALL_SLOT_WAIT, &tp);
		if (r)
			break;
		uint64_t a = (uint64_t)c * j->chunk, b = a + chunk_len(j, c);
		s->copied = 0;
		while (ti < j->n) {
			struct jtensor *jt = &j->jt[ti];
			struct wtensor *t = &w->t[j->order[ti]];
			if (jt->begin >= b)
				break;
			uint64_t lo = jt->begin > a ? jt->begin : a, hi = jt->end < b ? jt->end : b;
			if (hi > lo) {
				const char *src = (const char *)t->data + (lo - jt->begin);
				if (t->dev >= 0) {
					r = ferry__ring_d2h(j->ring, s->buf + (lo - a), (uint64_t)(uintptr_t)src,
							    (size_t)(hi - lo), s->pinned);
					if (r) {
						ferry__error_append("%s: copying tensor \"%s\" from the device",
								    j->path, t->name);
						break;
					}
					s->copied = 1;
				} else {
					memcpy(s->buf + (lo - a), src, (size_t)(hi - lo));
				}
			}
			if (jt->end > b)
				break;
			ti++;
		}
		if (!r && s->copied && (r = ferry__ring_record(j->ring, (unsigned)(c % j->k))))
			ferry__error_append("%s", j->path);
		if (r)
			break;
		pthread_mutex_lock(&j->mu);
		s->state = S_READY;
		pthread_cond_broadcast(&j->cv);
		pthread_mutex_unlock(&j->mu);
	}
	lap(j, PH_CALL_COPY, &tp);
	/* The snapshot is complete only when the last copy has landed. */
	if (!r && j->ring) {
		r = ferry__ring_drain(j->ring);
		lap(j, PH_CALL_SYNC, &tp);
		if (r)
			ferry__error_append("%s", j->path);
	}
	if (j->ring)
		ferry__gpu_leave(prev);
	if (r)
		job_fail(j, r);
	pthread_mutex_lock(&j->mu);
	j->snapshot_done = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	return r;
}

static const char *const prealloc_choices[] = {"auto", "on", "off", NULL}; /* PREALLOC_* */
static const char *const snapshot_choices[] = {"auto", "device", "pinned", NULL}; /* SNAP_* */

#define WRITER(n, f, t, d, lo, hi, ...)                                                           \
	{.name = n, .type = FERRY__KNOB_##t, FERRY__KNOB_AT(struct writer_knobs, f), .def = d, .min = lo, \
	 .max = hi, __VA_ARGS__}
/* The pipeline's shape (CHUNK, MAX_INFLIGHT above say why) is a knob for measurements on other
 * machines without a rebuild; save_hold is for measurements only. */
static const struct ferry__knob writer_rows[] = {
	WRITER("save_prealloc", prealloc, ENUM, PREALLOC_AUTO, 0, 2, .choices = prealloc_choices,
	       .flags = FERRY__KNOB_NUMBERED, .env = "FERRY_SAVE_PREALLOC",
	       .doc = "how a save lays out its temporary file: fallocate (on), ftruncate (off), auto"),
	WRITER("save_chunk_mib", chunk_mib, UINT, CHUNK >> 20, 1, 1024, .env = "FERRY_SAVE_CHUNK_MIB",
	       .doc = "MiB of one piece of the data section (a pinned slot, one write)"),
	WRITER("save_inflight", inflight, UINT, MAX_INFLIGHT, 1, MAX_INFLIGHT_CAP, .env = "FERRY_SAVE_INFLIGHT",
	       .doc = "pieces being written at once"),
	WRITER("save_hold", hold, BOOL, 0, 0, 1, .env = "FERRY_SAVE_HOLD",
	       .doc = "an asynchronous save writes only once its snapshot is taken (measurements)"),
	WRITER("save_snapshot", snapshot, ENUM, SNAP_AUTO, 0, 2, .choices = snapshot_choices,
	       .flags = FERRY__KNOB_NUMBERED, .env = "FERRY_SAVE_SNAPSHOT",
	       .doc = "where an asynchronous save of GPU tensors takes its snapshot: device, pinned, auto"),
};
#undef WRITER

static const char *writer_keys[sizeof(writer_rows) / sizeof(writer_rows[0]) + 1];
const struct ferry__knobs ferry__st_writer_knobs = {"safetensors writer", writer_rows,
						    sizeof(writer_rows) / sizeof(writer_rows[0]), writer_keys};

const char *const *ferry_st_writer_keys(void)
{
	return ferry__knobs_keys(&ferry__st_writer_knobs);
}

int ferry_st_writer_set(ferry_st_writer *w, const char *key, const char *value)
{
	if (!w || !key)
		return ferry__error(-EINVAL, "ferry_st_writer_set: NULL writer or key");
	pthread_mutex_lock(&w->mu);
	int busy = w->running;
	pthread_mutex_unlock(&w->mu);
	if (busy)
		return ferry__error(FERRY_EBUSY, "ferry_st_writer_set(%s): a save is in flight", key);
	return ferry__knobs_set(&ferry__st_writer_knobs, &w->knobs, key, value, "ferry_st_writer_set");
}

static uint64_t host_budget(ferry_ctx *ctx)
{
	return ferry__ctx_host_budget(ctx);
}

static size_t save_chunk(const ferry_st_writer *w)
{
	return (size_t)w->knobs.chunk_mib << 20;
}

static void release_device(ferry_st_writer *w)
{
	void *prev = NULL;
	if (w->ring && ferry__gpu_enter(w->pool_dev, &prev) == 0) {
		ferry__ring_destroy(w->ring);
		ferry__gpu_leave(prev);
	}
	w->ring = NULL;
	ferry__pinned_pool_destroy(w->pool);
	w->pool = NULL;
	w->pool_dev = -2;
}

/* The pool (and for a device, the copy ring) of device dev (-1: host memory). */
static int use_device(ferry_st_writer *w, int dev)
{
	void *prev = NULL;
	int r;
	if (w->pool_dev == dev && w->pool)
		return 0;
	release_device(w);
	if ((r = ferry__pinned_pool_create(host_budget(w->ctx), dev, &w->pool)))
		return r;
	w->pool_dev = dev;
	if (dev < 0)
		return 0;
	if ((r = ferry__gpu_enter(dev, &prev))) {
		ferry__error_append("safetensors writer: device %d", dev);
		return r;
	}
	/* the writer thread waits for one slot's copy at a time, right before writing it: spin */
	r = ferry__ring_create(dev, 1, FERRY__RING_SPIN, &w->ring);
	ferry__gpu_leave(prev);
	return r;
}

/* At least n tickets on the writer's ring (made once, reused by every later save). */
static int have_tickets(ferry_st_writer *w, size_t n)
{
	void *prev = NULL;
	int r;
	if (!w->ring)
		return 0;
	if ((r = ferry__gpu_enter(w->pool_dev, &prev)))
		return r;
	r = ferry__ring_reserve(w->ring, (unsigned)n);
	ferry__gpu_leave(prev);
	return r;
}

/*
 * Whether an asynchronous save takes its snapshot on the device (save_snapshot): 1 with j->devbuf
 * allocated, 0 for the pinned slots, or an error (save_snapshot=device that cannot be had). auto
 * takes the device unless slots for the whole state are pinned already (an earlier save, or
 * prepare()): the first save of a writer would otherwise pin them on the caller's thread (about
 * 0.25 s per GB on the GPU machine, docs/PERFORMANCE.md), and a state larger than host_budget
 * would wait for writes to free slots. Only when the device has the state's size free beyond a
 * margin (HEADROOM), so that training's own allocations keep their room.
 */
#define HEADROOM(total) (((uint64_t)1 << 30) + (total) / 8)
static int device_snapshot(ferry_st_writer *w, struct job *j, size_t want)
{
	int mode = (int)w->knobs.snapshot, r;
	uint64_t fr = 0, tot = 0;
	if (j->cuda_dev < 0 || !j->total || mode == SNAP_PINNED)
		return 0;
	if (!ferry__ring_can_d2d()) {
		if (mode == SNAP_AUTO)
			return 0;
		return ferry__error(-ENOTSUP, "%s: save_snapshot=device: the CUDA driver has no cuMemcpyDtoDAsync", j->path);
	}
	if (mode == SNAP_AUTO) {
		if (want >= j->nchunks && ferry__pinned_held(w->pool) >= (uint64_t)want * slot_size(j))
			return 0; /* the whole state's slots, pinned already: by an earlier save, or prepare() */
		if (ferry__gpu_mem_info(j->cuda_dev, &fr, &tot) || fr < j->total + HEADROOM(j->total))
			return 0;
	}
	void *prev = NULL;
	if ((r = ferry__gpu_enter(j->cuda_dev, &prev)) == 0) {
		r = ferry__gpu_alloc(j->cuda_dev, (size_t)j->total, &j->devbuf);
		ferry__gpu_leave(prev);
	}
	if (!r)
		return j->devsnap = 1;
	j->devbuf = 0;
	if (mode == SNAP_AUTO) {
		FERRY__LOG(FERRY__LOG_INFO, "%s: no device snapshot (%s); pinned slots instead", j->path, ferry_last_error());
		return 0;
	}
	ferry__error_append("%s: save_snapshot=device", j->path);
	return r;
}

static int job_setup(ferry_st_writer *w, struct job *j, int async)
{
	int r;
	j->cuda_dev = -1;
	for (size_t i = 0; i < w->n; i++)
		if (w->t[i].dev >= 0 && w->t[i].nbytes) {
			j->cuda_dev = w->t[i].dev;
			break;
		}
	if ((r = use_device(w, j->cuda_dev)))
		return r;
	j->ring = w->ring;
	j->nchunks = (size_t)((j->total + j->chunk - 1) / j->chunk);
	uint64_t budget = host_budget(w->ctx);
	/* A synchronous save needs only a few slots in flight; a snapshot wants the whole state. */
	size_t want = async ? j->nchunks : j->inflight + 2; /* writing, and 2 being filled */
	if (budget && want > budget / j->chunk)
		want = (size_t)(budget / j->chunk);
	if (want > j->nchunks)
		want = j->nchunks;
	if (want == 0 && j->nchunks)
		want = 1;
	j->slots = calloc(want ? want : 1, sizeof(*j->slots));
	if (!j->slots)
		return ferry__error(-ENOMEM, "%s: slots", j->path);
	if (async && (r = device_snapshot(w, j, want)) != 0) {
		if (r < 0)
			return r;
		j->k = want; /* the filler thread allocates them */
		return have_tickets(w, j->k);
	}
	for (size_t i = 0; i < want; i++) {
		int pinned;
		size_t sz = slot_size(j);
		uint64_t held = ferry__pinned_held(w->pool);
		r = ferry__pinned_alloc(w->pool, sz, (void **)&j->slots[i].buf, &pinned);
		j->slots[i].pinned = pinned;
		if (!r && ferry__pinned_held(w->pool) > held)
			j->pinned_new += sz;
		if (r == FERRY_EBUDGET && i > 0)
			break; /* fewer slots than hoped: the snapshot blocks on writes */
		if (r)
			break;
		j->k++;
	}
	if (r == FERRY_EBUDGET && j->k > 0)
		r = 0;
	if (!r && j->cuda_dev >= 0)
		r = have_tickets(w, j->k);
	return r;
}

int64_t ferry_st_writer_reserve(ferry_st_writer *w, uint64_t bytes, int device)
{
	pthread_mutex_lock(&w->mu);
	int busy = w->running;
	pthread_mutex_unlock(&w->mu);
	if (busy)
		return ferry__error(FERRY_EBUSY, "safetensors writer: reserve: a save is in flight");
	if (device < -1)
		return ferry__error(-EINVAL, "safetensors writer: reserve: device %d", device);
	(void)ferry_st_writer_wait(w, -1);
	int r = use_device(w, device);
	if (r)
		return r;
	size_t chunk = save_chunk(w), n = (size_t)((bytes + chunk - 1) / chunk), k = 0;
	if (n == 1) /* as job_setup sizes the one slot of a save that fits in one */
		chunk = (size_t)((bytes + 4095) / 4096 * 4096);
	uint64_t budget = host_budget(w->ctx);
	if (budget && n > budget / chunk)
		n = (size_t)(budget / chunk);
	void **p = calloc(n ? n : 1, sizeof(*p));
	if (!p)
		return ferry__error(-ENOMEM, "safetensors writer: reserve");
	for (; k < n && !r; k++) {
		int pinned = 0;
		if ((r = ferry__pinned_alloc(w->pool, chunk, &p[k], &pinned)))
			break;
		/* Pinning faults the pages in; pageable slots (host tensors, or pinning refused) are
		 * touched here, else the first save's copies into them would fault each page. */
		for (size_t off = 0; !pinned && off < chunk; off += 4096)
			((volatile char *)p[k])[off] = 0;
	}
	if (r == FERRY_EBUDGET) /* held by slots of another size, in use: what fits is reserved */
		r = 0;
	for (size_t i = 0; i < k; i++)
		ferry__pinned_free(w->pool, p[i]);
	free(p);
	if (!r)
		r = have_tickets(w, k);
	return r ? r : (int64_t)ferry__pinned_held(w->pool);
}

int64_t ferry__st_writer_save_hooked(ferry_st_writer *w, const char *path, int flags, int async,
				     ferry__save_hook hook, void *arg, const char *reuse)
{
	int r;
	uint64_t t0 = ferry__now_ns(), t = t0;
	pthread_mutex_lock(&w->mu);
	int busy = w->running;
	pthread_mutex_unlock(&w->mu);
	if (busy)
		return ferry__error(FERRY_EBUSY, "%s: a save of this writer is in flight", path);
	(void)ferry_st_writer_wait(w, -1); /* joins the finished thread */
	pthread_mutex_lock(&w->mu);
	memset(&w->stats, 0, sizeof(w->stats));
	pthread_mutex_unlock(&w->mu);
	int url = strstr(path, "://") != NULL; /* s3:// (docs/REMOTE.md): staged locally, then uploaded */
	if (url && (flags & FERRY_SAVE_EXCL))
		return ferry__error(-EOPNOTSUPP, "%s: an exclusive save (FERRY_SAVE_EXCL) of a URL is not supported", path);
	if ((flags & FERRY_SAVE_EXCL) && access(path, F_OK) == 0)
		return ferry__error(-EEXIST, "%s: exists", path);

	if (url && w->codec) {
		w->codec = 0;
		return ferry__error(-EOPNOTSUPP, "%s: compressed saves to a URL are not supported (save locally, "
				    "or without compression)", path);
	}
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return ferry__error(-ENOMEM, "%s: save", path);
	j->w = w;
	j->ctx = w->ctx;
	j->flags = flags;
	j->hook = hook;
	j->arg = arg;
	j->cuda_dev = -1;
	j->chunk = save_chunk(w);
	j->inflight = (size_t)w->knobs.inflight;
	j->prealloc_mode = (int)w->knobs.prealloc;
	j->codec = w->codec;
	w->codec = 0;
	if (j->codec) { /* chunk checksums instead of per-tensor ones (consume_cz); no file to write over */
		j->flags &= ~FERRY_SAVE_CHECKSUM;
		reuse = NULL;
	}
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->path = strdup(path);
	j->reuse = reuse && !url ? strdup(reuse) : NULL;
	j->t.fd = -1;
	j->dfd = -1;
	if (!j->path || (reuse && !url && !j->reuse)) {
		job_free(j);
		return ferry__error(-ENOMEM, "%s: save", path);
	}
	if (url) { /* the temporary goes to $TMPDIR, else /var/tmp (a disk, where /tmp may be memory) */
		const char *td = getenv("TMPDIR");
		const char *slash = strrchr(j->path, '/');
		j->name = slash && slash[1] ? slash + 1 : "";
		if (!*j->name || !strchr(strstr(j->path, "://") + 3, '/')) {
			job_free(j);
			return ferry__error(-EINVAL, "%s: no object name to save to", path);
		}
		if (!(j->stage = strdup(td && *td ? td : "/var/tmp"))) {
			job_free(j);
			return ferry__error(-ENOMEM, "%s: save", path);
		}
		if ((j->dfd = ferry__dir_open(j->stage, FERRY__DIR_FOLLOW)) < 0) {
			r = j->dfd;
			ferry__error_append("%s: the local directory that stages the upload", path);
			job_free(j);
			return r;
		}
	} else if ((j->dfd = ferry__dir_open_parent(j->path, FERRY__DIR_FOLLOW, &j->name)) < 0) {
		/* the directory the user named may be a symlink; the file itself never is */
		r = j->dfd;
		job_free(j);
		return r;
	}
	j->ph[PH_CALL_CHECK] = ferry__now_ns() - t;
	t = ferry__now_ns();
	if ((r = build_header(w, j)) == 0) {
		lap(j, PH_CALL_HEADER, &t);
		r = job_setup(w, j, async);
		lap(j, PH_CALL_SLOTS, &t);
	}
	if (r) {
		job_free(j);
		return r;
	}
	/* save_hold=1 (FERRY_SAVE_HOLD, measurements): an asynchronous save whose slots hold the whole state
	 * starts writing only once the snapshot is taken, so that the writes cannot slow the copies
	 * the caller waits for. Never with fewer slots: the snapshot then needs written slots back. */
	j->hold = async && j->k >= j->nchunks && w->knobs.hold;
	if ((j->act = ferry__activity_begin(j->ctx, FERRY__ACTIVITY_SAVE, j->path))) {
		ferry__activity_set(j->act, FERRY__ACT_TOTAL, j->data_start + j->total);
		ferry__activity_set(j->act, FERRY__ACT_ITEMS, j->n);
		for (size_t i = 0; i < w->nm; i++) /* a checkpoint's shard says its step */
			if (!strcmp(w->mk[i], "ferry.step"))
				ferry__activity_set(j->act, FERRY__ACT_STEP, strtoull(w->mv[i], NULL, 10));
	}
	pthread_mutex_lock(&w->mu);
	w->running = 1;
	w->joined = 0;
	w->result = 0;
	w->job = j;
	pthread_mutex_unlock(&w->mu);
	if ((r = pthread_create(&w->thr, NULL, writer_thread, j))) {
		w->running = 0;
		w->joined = 1;
		w->job = NULL;
		job_free(j);
		return ferry__error(-r, "%s: pthread_create: %s", path, strerror(r));
	}
	lap(j, PH_CALL_START, &t);
	r = produce(w, j);
	j->ph[PH_CALL_TOTAL] = ferry__now_ns() - t0;
	pthread_mutex_lock(&w->mu);
	for (int i = 0; i < PH__FIRST_WRITER; i++)
		w->stats.ns[i] = j->ph[i];
	w->stats.bytes = j->total;
	w->stats.slots = j->k;
	w->stats.pinned_new += j->pinned_new; /* the writer thread adds what its filler pinned */
	w->stats.devsnap = j->devsnap ? j->total : 0;
	pthread_mutex_unlock(&w->mu);
	if (async && !r)
		return 0;
	int64_t res = ferry_st_writer_wait(w, -1);
	pthread_mutex_lock(&w->mu);
	w->stats.ns[PH_CALL_TOTAL] = ferry__now_ns() - t0;
	pthread_mutex_unlock(&w->mu);
	return r ? r : res;
}

void ferry__st_writer_compress(ferry_st_writer *w, int codec)
{
	w->codec = codec;
}

void ferry__st_writer_phase(ferry_st_writer *w, enum ferry_save_phase phase, uint64_t ns)
{
	if ((unsigned)phase >= PH__COUNT)
		return;
	pthread_mutex_lock(&w->mu);
	w->stats.ns[phase] += ns;
	pthread_mutex_unlock(&w->mu);
}

static struct save_stats last_stats(const ferry_st_writer *w)
{
	ferry_st_writer *mw = (ferry_st_writer *)w;
	pthread_mutex_lock(&mw->mu);
	struct save_stats st = mw->stats;
	pthread_mutex_unlock(&mw->mu);
	return st;
}

uint64_t ferry_st_writer_stat(const ferry_st_writer *w, enum ferry_save_stat which)
{
	if (!w)
		return 0;
	struct save_stats st = last_stats(w);
	switch (which) {
	case FERRY_SAVE_STAT_BYTES: return st.bytes;
	case FERRY_SAVE_STAT_SLOTS: return st.slots;
	case FERRY_SAVE_STAT_PINNED_NEW_BYTES: return st.pinned_new;
	case FERRY_SAVE_STAT_FALLOCATED: return (uint64_t)st.prealloc;
	case FERRY_SAVE_STAT_RECYCLED: return (uint64_t)st.recycled;
	case FERRY_SAVE_STAT_DEVICE_SNAPSHOT_BYTES: return st.devsnap;
	default: return 0;
	}
}

uint64_t ferry_st_writer_phase_ns(const ferry_st_writer *w, enum ferry_save_phase which)
{
	return w && (unsigned)which < PH__COUNT ? last_stats(w).ns[which] : 0;
}

const char *ferry_save_stat_name(enum ferry_save_stat which)
{
	static const char *const names[FERRY_SAVE_STAT__COUNT] = {"bytes", "slots", "pinned_new_bytes",
								   "fallocated", "recycled", "device_snapshot_bytes"};
	return (unsigned)which < FERRY_SAVE_STAT__COUNT ? names[which] : NULL;
}

const char *ferry_save_phase_name(enum ferry_save_phase which)
{
	return (unsigned)which < PH__COUNT ? ph_names[which] : NULL;
}

int64_t ferry_st_writer_save(ferry_st_writer *w, const char *path, int flags)
{
	return ferry__st_writer_save_hooked(w, path, flags, 0, NULL, NULL, NULL);
}

int ferry_st_writer_save_async(ferry_st_writer *w, const char *path, int flags)
{
	int64_t r = ferry__st_writer_save_hooked(w, path, flags, 1, NULL, NULL, NULL);
	return r < 0 ? (int)r : 0;
}

int ferry_st_writer_done(const ferry_st_writer *w)
{
	ferry_st_writer *mw = (ferry_st_writer *)w;
	pthread_mutex_lock(&mw->mu);
	int done = !mw->running;
	pthread_mutex_unlock(&mw->mu);
	return done;
}

int64_t ferry_st_writer_wait(ferry_st_writer *w, int64_t timeout_ns)
{
	pthread_mutex_lock(&w->mu);
	if (w->joined) {
		pthread_mutex_unlock(&w->mu);
		return 0;
	}
	if (timeout_ns >= 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ns;
		ts.tv_sec += (time_t)(ns / 1000000000u);
		ts.tv_nsec = (long)(ns % 1000000000u);
		while (w->running)
			if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && w->running) {
				pthread_mutex_unlock(&w->mu);
				return -ETIMEDOUT;
			}
	}
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thr, NULL);
	pthread_mutex_lock(&w->mu);
	int64_t res = w->result;
	struct job *j = w->job;
	w->job = NULL;
	w->joined = 1;
	pthread_mutex_unlock(&w->mu);
	job_free(j);
	if (res < 0)
		return ferry__error_raise((int)res, w->errmsg);
	return res;
}
