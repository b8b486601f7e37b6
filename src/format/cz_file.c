/*
 * Compressed files (include/ferry/compress.h, docs/FORMATS.md): the writer (chunks compressed in
 * parallel, a durable temporary renamed into place) and the reader (the index checked at open, any
 * range decoded from the chunks it covers, into host memory or into device memory through nvCOMP
 * or the CPU and the copy ring).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/durable.h"
#include "base/knob.h"
#include "engine/export.h"
#include "format/cz.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "gpu/nvcomp.h"
#include "gpu/ring.h"

/* ------------------------------------------------------------------------------------- knobs */

enum { GPU_AUTO, GPU_ON, GPU_OFF };
static const char *const gpu_choices[] = {"auto", "on", "off", NULL};

struct cz_knobs {
	uint64_t chunk, level, threads, verify, gpu, window, gpu_min;
};

static uint64_t default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 16 ? 16 : (uint64_t)n;
}

#define ROW(n, f, t, d, lo, hi, ...) \
	{.name = n, .type = FERRY__KNOB_##t, FERRY__KNOB_AT(struct cz_knobs, f), .def = d, .min = lo, .max = hi, __VA_ARGS__}
/* The defaults' reasons are in docs/CONFIG.md ("Compressed files"): measured there. */
static const struct ferry__knob cz_rows[] = {
	ROW("cz_chunk", chunk, SIZE, 1u << 20, FERRY__CZ_CHUNK_MIN, FERRY__CZ_CHUNK_MAX, .align = 4096,
	    .env = "FERRY_CZ_CHUNK", .doc = "uncompressed bytes of one chunk of a new compressed file"),
	ROW("cz_level", level, UINT, 0, 0, 22, .env = "FERRY_CZ_LEVEL",
	    .doc = "compression level (0: the codec's default, zstd 3, lz4 fast)"),
	ROW("cz_threads", threads, UINT, 8, 1, 256, .def_fn = default_threads, .env = "FERRY_CZ_THREADS",
	    .doc = "threads that compress or decompress chunks at once"),
	ROW("cz_verify", verify, BOOL, 1, 0, 1, .doc = "check each chunk's checksums when it is read"),
	ROW("cz_gpu", gpu, ENUM, GPU_AUTO, 0, 2, .choices = gpu_choices, .env = "FERRY_CZ_GPU",
	    .doc = "decode into device memory with nvCOMP: auto (zstd where loaded; LZ4 on the CPU), on (required, LZ4 too), off"),
	ROW("cz_window", window, SIZE, 0, 0, 1ull << 30, .env = "FERRY_CZ_WINDOW",
	    .doc = "largest batch of a read into device memory (uncompressed bytes): one nvCOMP call, one window of the pipeline; "
		   "0: 128 MiB, or for a read from memory an eighth of it past 1 GiB, up to 256 MiB"),
	ROW("cz_gpu_min", gpu_min, UINT, 64, 1, 1u << 20, .env = "FERRY_CZ_GPU_MIN",
	    .doc = "cz_gpu=auto: fewest chunks a read into device memory must cover for nvCOMP (fewer decode on the CPU)"),
};
#undef ROW
static const char *cz_keys[sizeof(cz_rows) / sizeof(cz_rows[0]) + 1];
static const struct ferry__knobs cz_knob_table = {"compressed file", cz_rows, sizeof(cz_rows) / sizeof(cz_rows[0]),
						  cz_keys};

const char *const *ferry_cz_keys(void)
{
	return ferry__knobs_keys(&cz_knob_table);
}

const char *ferry_cz_codec_name(int codec)
{
	return codec == FERRY_CZ_LZ4 ? "lz4" : codec == FERRY_CZ_ZSTD ? "zstd" : NULL;
}

int ferry_cz_codec_from_name(const char *name)
{
	if (name && !strcmp(name, "lz4"))
		return FERRY_CZ_LZ4;
	if (name && !strcmp(name, "zstd"))
		return FERRY_CZ_ZSTD;
	return ferry__error(FERRY_EBADOPT, "codec '%s': expected lz4 or zstd", name ? name : "(null)");
}

/* ------------------------------------------------------------------------------------ writer */

struct ferry_cz_writer {
	struct cz_knobs knobs;
	int codec, flags, dirfd;
	struct ferry__tmpfile t; /* a local path's temporary */
	ferry_ctx *own;          /* a URL's (s3://): the object written in order, visible at the commit */
	ferry_file *uf;
	char *path;
	int state; /* 0 new, 1 writing, 2 committed, -1 failed */
	uint8_t *in;
	size_t in_len, in_cap; /* in_cap: threads chunks */
	struct wslot {
		struct ferry__cz_cctx *cctx;
		uint8_t *out;
		struct ferry__cz_chunk e;
	} *slots;
	unsigned nslots;
	struct ferry__cz_meta m;
	size_t chunks_cap;
	uint64_t file_off;
};

int ferry_cz_writer_create(const char *path, int codec, int flags, ferry_cz_writer **out)
{
	*out = NULL;
	if (!ferry_cz_codec_name(codec))
		return ferry__error(FERRY_EBADOPT, "%s: codec %d: expected FERRY_CZ_LZ4 or FERRY_CZ_ZSTD", path, codec);
	ferry_cz_writer *w = calloc(1, sizeof(*w));
	if (!w || !(w->path = strdup(path))) {
		free(w);
		return ferry__error(-ENOMEM, "%s: compressed writer", path);
	}
	w->codec = codec;
	w->flags = flags;
	w->t.fd = -1;
	w->dirfd = -1;
	int r = ferry__knobs_init(&cz_knob_table, &w->knobs);
	const char *name = NULL;
	if (!r && strstr(path, "://")) {
		/* an object: the format is written strictly in order (chunks, index, trailer), which is
		 * what an s3:// URL opened for writing takes (a multipart upload, committed by the sync) */
		if (flags & FERRY_CZ_EXCL)
			r = ferry__error(-EOPNOTSUPP, "%s: compressed writer: FERRY_CZ_EXCL is for local paths (an object store has no exclusive create here)", path);
		else if (!(r = ferry_ctx_create(&w->own)) &&
			 (r = ferry_file_open(w->own, path, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &w->uf)))
			ferry__error_append("%s: compressed writer", path);
		if (r) {
			ferry_ctx_destroy(w->own);
			free(w->path);
			free(w);
			return r;
		}
		*out = w;
		return 0;
	}
	if (!r && (w->dirfd = ferry__dir_open_parent(path, FERRY__DIR_FOLLOW, &name)) < 0)
		r = w->dirfd;
	else if (!r && (r = ferry__tmp_create(w->dirfd, name, 0644, 0, &w->t)) < 0)
		ferry__error_append("%s: compressed writer", path);
	if (r) {
		if (w->dirfd > 0)
			close(w->dirfd);
		free(w->path);
		free(w);
		return r;
	}
	*out = w;
	return 0;
}

int ferry_cz_writer_set(ferry_cz_writer *w, const char *key, const char *value)
{
	if (w->state != 0)
		return ferry__error(FERRY_EBUSY, "ferry_cz_writer_set(%s): %s: the writer has started", key, w->path);
	return ferry__knobs_set(&cz_knob_table, &w->knobs, key, value, "ferry_cz_writer_set");
}

static int writer_start(ferry_cz_writer *w)
{
	w->nslots = (unsigned)w->knobs.threads;
	w->m.codec = w->codec;
	w->m.chunk_size = (uint32_t)w->knobs.chunk;
	w->m.level = (uint32_t)w->knobs.level;
	w->in_cap = (size_t)w->nslots * w->m.chunk_size;
	w->in = malloc(w->in_cap);
	w->slots = calloc(w->nslots, sizeof(*w->slots));
	if (!w->in || !w->slots)
		return ferry__error(-ENOMEM, "%s: compressed writer: %zu bytes of buffers", w->path, w->in_cap);
	for (unsigned i = 0; i < w->nslots; i++) {
		int r = ferry__cz_cctx_create(w->codec, &w->slots[i].cctx);
		if (r)
			return r;
		if (!(w->slots[i].out = malloc(ferry__cz_bound(w->codec, w->m.chunk_size))))
			return ferry__error(-ENOMEM, "%s: compressed writer", w->path);
	}
	w->state = 1;
	return 0;
}

static int encode_slot(void *arg, size_t i)
{
	ferry_cz_writer *w = arg;
	size_t off = i * w->m.chunk_size;
	size_t n = w->in_len - off < w->m.chunk_size ? w->in_len - off : w->m.chunk_size;
	int r = ferry__cz_encode(w->slots[i].cctx, w->codec, (int)w->m.level, w->m.chunk_size, w->in + off, n,
				 w->slots[i].out, &w->slots[i].e);
	if (r)
		ferry__error_append("%s: chunk %llu", w->path, (unsigned long long)(w->m.nchunks + i));
	return r;
}

static int write_all(ferry_cz_writer *w, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	if (w->uf) {
		ssize_t k = ferry_pwrite(w->uf, buf, n, w->file_off);
		if (k >= 0 && (size_t)k != n)
			k = ferry__error(-EIO, "%s: %zd of %zu bytes written at offset %llu", w->path, k, n,
					 (unsigned long long)w->file_off);
		if (k < 0) {
			ferry__error_append("%s: compressed writer", w->path);
			return (int)k;
		}
		w->file_off += n;
		return 0;
	}
	while (n) {
		ssize_t k = pwrite(w->t.fd, p, n, (off_t)w->file_off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return ferry__error(-errno, "pwrite(%s, offset %llu, %zu bytes): %s", w->t.name,
					    (unsigned long long)w->file_off, n, strerror(errno));
		p += k, n -= (size_t)k, w->file_off += (uint64_t)k;
	}
	return 0;
}

/* Compresses and writes what is in w->in (full chunks, and a short last one when closing). */
static int flush(ferry_cz_writer *w)
{
	size_t n = (w->in_len + w->m.chunk_size - 1) / w->m.chunk_size;
	if (!n)
		return 0;
	int r = ferry__cz_parallel(n, w->nslots, encode_slot, w);
	if (!r && (r = ferry__grow((void **)&w->m.chunks, &w->chunks_cap, w->m.nchunks + n, sizeof(*w->m.chunks))))
		ferry__error(r, "%s: compressed writer's index", w->path);
	for (size_t i = 0; i < n && !r; i++) {
		struct ferry__cz_chunk *e = &w->m.chunks[w->m.nchunks];
		*e = w->slots[i].e;
		e->c_off = w->file_off;
		e->u_off = w->m.total;
		if (!(r = write_all(w, w->slots[i].out, e->c_size))) {
			w->m.nchunks++;
			w->m.total += e->u_size;
		}
	}
	w->in_len = 0;
	return r;
}

int ferry_cz_writer_write(ferry_cz_writer *w, const void *buf, size_t len)
{
	if (w->state < 0 || w->state == 2)
		return ferry__error(-EINVAL, "%s: compressed writer: %s", w->path, w->state < 0 ? "failed before" : "committed");
	int r = w->state == 0 ? writer_start(w) : 0;
	const uint8_t *p = buf;
	while (!r && len) {
		size_t k = w->in_cap - w->in_len < len ? w->in_cap - w->in_len : len;
		memcpy(w->in + w->in_len, p, k);
		w->in_len += k, p += k, len -= k;
		if (w->in_len == w->in_cap)
			r = flush(w);
	}
	if (r)
		w->state = -1;
	return r;
}

int64_t ferry_cz_writer_commit(ferry_cz_writer *w)
{
	int r = 0;
	if (w->state == 0)
		r = writer_start(w);
	else if (w->state != 1)
		return ferry__error(-EINVAL, "%s: compressed writer: %s", w->path, w->state < 0 ? "failed before" : "committed");
	if (!r)
		r = flush(w);
	uint8_t *idx = NULL;
	if (!r) {
		w->m.index_off = w->file_off;
		size_t ilen = ferry__cz_index_len(w->m.nchunks);
		if (!(idx = malloc(ilen + FERRY__CZ_TRAILER_LEN)))
			r = ferry__error(-ENOMEM, "%s: index of %llu chunks", w->path, (unsigned long long)w->m.nchunks);
		else {
			ferry__cz_write_index(&w->m, idx, idx + ilen);
			r = write_all(w, idx, ilen + FERRY__CZ_TRAILER_LEN);
		}
	}
	free(idx);
	if (!r && w->uf && (r = ferry_file_sync(w->uf, 1))) /* the object appears, whole */
		ferry__error_append("%s: compressed writer: committing the object", w->path);
	else if (!r && !w->uf && (r = ferry__tmp_commit(&w->t, (w->flags & FERRY_CZ_EXCL) ? FERRY__DURABLE_NOREPLACE : 0)))
		ferry__error_append("%s: compressed writer", w->path);
	if (r) {
		w->state = -1;
		if (!w->uf)
			ferry__tmp_abort(&w->t);
		return r;
	}
	w->state = 2;
	return (int64_t)w->file_off;
}

void ferry_cz_writer_destroy(ferry_cz_writer *w)
{
	if (!w)
		return;
	if (w->state != 2 && !w->uf)
		ferry__tmp_abort(&w->t);
	ferry_file_destroy(w->uf); /* not committed: the upload is aborted, no object appears */
	ferry_ctx_destroy(w->own);
	if (w->dirfd >= 0)
		close(w->dirfd);
	for (unsigned i = 0; w->slots && i < w->nslots; i++) {
		ferry__cz_cctx_destroy(w->slots[i].cctx);
		free(w->slots[i].out);
	}
	free(w->slots);
	free(w->in);
	ferry__cz_meta_free(&w->m);
	free(w->path);
	free(w);
}

/* ------------------------------------------------------------------------------------ reader */

struct ferry_cz {
	ferry_ctx *ctx;
	ferry_file *f;
	char *path;
	struct ferry__cz_meta m;
	struct cz_knobs knobs;
	uint64_t stored;
	pthread_mutex_t lock; /* the device path's state and info */
	char info[640];
	int dev; /* the device of pool and slots; -1 none yet */
	struct ferry__pinned_pool *pool;
	struct cz_set *set;    /* the device path's slots (CZ_DEV_SLOTS) and pool, kept between reads */
	struct cz_slot *slots; /* set's */
	uint64_t ahead;        /* bytes of reads the pipeline keeps in flight (the engine's queue) */
	struct ferry__cz_phases last; /* the last read's (ferry__cz_last_phases) */
};

static void device_release(ferry_cz *z);

static int read_exact(ferry_file *f, void *buf, size_t n, uint64_t off, const char *path, const char *what)
{
	ssize_t k = ferry_pread(f, buf, n, off);
	if (k < 0) {
		ferry__error_append("%s: reading %s", path, what);
		return (int)k;
	}
	if ((size_t)k != n)
		return ferry__error(FERRY_ECORRUPT, "%s: %s at offset %llu: %zd of %zu bytes before the end of the file (truncated?)",
				    path, what, (unsigned long long)off, k, n);
	return 0;
}

int ferry_cz_is_compressed(ferry_ctx *ctx, const char *path)
{
	if (!strstr(path, "://")) { /* a local file: 80 bytes with pread, none of the engine's set-up */
		uint8_t t[FERRY__CZ_TRAILER_LEN];
		struct stat st;
		int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO's open must not block */
		if (fd < 0)
			return ferry__error(-errno, "open(%s, read): %s", path, strerror(errno));
		int r = 0; /* not a regular file, or too short: not compressed (an open for I/O says the rest) */
		if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= (off_t)sizeof(t)) {
			ssize_t k = pread(fd, t, sizeof(t), st.st_size - (off_t)sizeof(t));
			r = k == (ssize_t)sizeof(t) ? ferry__cz_is_trailer(t, (uint64_t)st.st_size)
			    : ferry__error(k < 0 ? -errno : -EIO, "pread(%s, offset %lld, 80 bytes): %s", path,
					   (long long)(st.st_size - (off_t)sizeof(t)), k < 0 ? strerror(errno) : "short");
		}
		close(fd);
		return r;
	}
	ferry_file *f;
	int r = ferry_file_open(ctx, path, FERRY_O_RDONLY | FERRY_O_BUFFERED, &f);
	if (r)
		return r;
	int64_t size = ferry_file_size(f);
	uint8_t t[FERRY__CZ_TRAILER_LEN];
	if (size < 0)
		r = (int)size;
	else if (size < FERRY__CZ_TRAILER_LEN)
		r = 0;
	else if (!(r = read_exact(f, t, sizeof(t), (uint64_t)size - sizeof(t), path, "the trailer")))
		r = ferry__cz_is_trailer(t, (uint64_t)size);
	ferry_file_destroy(f);
	return r;
}

/* The bytes the engine's workers keep in flight for one large read: threads x queue_depth x
 * chunk_size (what the read pipeline reads ahead: a plain ferry_pread's queue). */
static uint64_t engine_queue(const ferry_ctx *ctx)
{
	static const char *const keys[] = {"threads", "queue_depth", "chunk_size"};
	uint64_t q = 1;
	for (int k = 0; k < 3; k++) {
		char v[32];
		uint64_t x = ferry_ctx_get(ctx, keys[k], v, sizeof(v)) > 0 ? strtoull(v, NULL, 10) : 0;
		if (!x)
			return 128u << 20; /* (not expected: each has a value) */
		q *= x;
	}
	return q;
}

int ferry_cz_open(ferry_ctx *ctx, const char *path, ferry_cz **out)
{
	*out = NULL;
	ferry_cz *z = calloc(1, sizeof(*z));
	if (!z || !(z->path = strdup(path))) {
		free(z);
		return ferry__error(-ENOMEM, "%s: compressed reader", path);
	}
	z->dev = -1;
	z->ctx = ctx;
	pthread_mutex_init(&z->lock, NULL);
	snprintf(z->info, sizeof(z->info), "none (no read yet)");
	uint8_t t[FERRY__CZ_TRAILER_LEN], *idx = NULL;
	int r = ferry__knobs_init(&cz_knob_table, &z->knobs);
	if (!r)
		r = ferry_file_open(ctx, path, FERRY_O_RDONLY, &z->f);
	int64_t size = r ? 0 : ferry_file_size(z->f);
	if (!r && size < 0)
		r = (int)size;
	if (!r && size < FERRY__CZ_TRAILER_LEN)
		r = ferry__error(FERRY_ECORRUPT, "%s: %lld bytes: too short for a compressed file's %u-byte trailer", path,
				 (long long)size, FERRY__CZ_TRAILER_LEN);
	if (!r)
		r = read_exact(z->f, t, sizeof(t), (uint64_t)size - sizeof(t), path, "the trailer");
	if (!r)
		r = ferry__cz_parse_trailer(t, (uint64_t)size, path, &z->m);
	if (!r && !(idx = malloc(z->m.index_len)))
		r = ferry__error(-ENOMEM, "%s: index of %llu bytes", path, (unsigned long long)z->m.index_len);
	if (!r)
		r = read_exact(z->f, idx, z->m.index_len, z->m.index_off, path, "the index");
	if (!r)
		r = ferry__cz_parse_index(idx, path, &z->m);
	free(idx);
	if (r) {
		ferry_cz_destroy(z);
		return r;
	}
	for (uint64_t i = 0; i < z->m.nchunks; i++)
		z->stored += !!(z->m.chunks[i].flags & FERRY__CZ_STORED);
	z->ahead = engine_queue(ctx);
	*out = z;
	return 0;
}

void ferry_cz_destroy(ferry_cz *z)
{
	if (!z)
		return;
	device_release(z);
	ferry_file_destroy(z->f);
	ferry__cz_meta_free(&z->m);
	pthread_mutex_destroy(&z->lock);
	free(z->path);
	free(z);
}

int ferry_cz_set(ferry_cz *z, const char *key, const char *value)
{
	const struct ferry__knob *k = ferry__knobs_find(&cz_knob_table, key);
	if (k && (!strcmp(key, "cz_chunk") || !strcmp(key, "cz_level")))
		return ferry__error(FERRY_EBADOPT, "ferry_cz_set: %s: %s is the writer's (the file's is fixed)", z->path, key);
	return ferry__knobs_set(&cz_knob_table, &z->knobs, key, value, "ferry_cz_set");
}

int64_t ferry_cz_size(const ferry_cz *z) { return (int64_t)z->m.total; }
int64_t ferry_cz_compressed_size(const ferry_cz *z) { return (int64_t)z->m.compressed; }
int ferry_cz_codec(const ferry_cz *z) { return z->m.codec; }
int64_t ferry_cz_chunk_size(const ferry_cz *z) { return z->m.chunk_size; }
int64_t ferry_cz_chunks(const ferry_cz *z) { return (int64_t)z->m.nchunks; }
int64_t ferry_cz_stored_chunks(const ferry_cz *z) { return (int64_t)z->stored; }

int ferry_cz_path_info(ferry_cz *z, char *buf, size_t len)
{
	pthread_mutex_lock(&z->lock);
	int n = snprintf(buf, len, "%s", z->info);
	pthread_mutex_unlock(&z->lock);
	return n;
}

static void set_info(ferry_cz *z, const char *fmt, ...) FERRY__PRINTF(2, 3);
static void set_info(ferry_cz *z, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pthread_mutex_lock(&z->lock);
	vsnprintf(z->info, sizeof(z->info), fmt, ap);
	pthread_mutex_unlock(&z->lock);
	va_end(ap);
}

/* One window of a read: chunks first..first+n-1, their frames at cbuf (the file's bytes from
 * cbase), decoded into the part of [off, off + len) that each covers, at dst + (byte - off). */
struct window {
	ferry_cz *z;
	const uint8_t *cbuf;
	uint64_t cbase, first, off, len;
	uint8_t *dst;
	const uint64_t *list; /* chunk numbers (device path), or NULL for first + k */
};

static int decode_one(void *arg, size_t k)
{
	struct window *w = arg;
	const struct ferry__cz_meta *m = &w->z->m;
	uint64_t i = w->list ? w->list[k] : w->first + k;
	const struct ferry__cz_chunk *e = &m->chunks[i];
	const uint8_t *frame = w->cbuf + (e->c_off - w->cbase);
	uint64_t lo = e->u_off > w->off ? e->u_off : w->off;
	uint64_t hi = e->u_off + e->u_size < w->off + w->len ? e->u_off + e->u_size : w->off + w->len;
	int verify = (int)w->z->knobs.verify;
	if (lo == e->u_off && hi == e->u_off + e->u_size)
		return ferry__cz_decode(m, i, frame, w->dst + (e->u_off - w->off), verify, w->z->path);
	uint8_t *tmp = malloc(e->u_size);
	if (!tmp)
		return ferry__error(-ENOMEM, "%s: chunk %llu: %u bytes", w->z->path, (unsigned long long)i, e->u_size);
	int r = ferry__cz_decode(m, i, frame, tmp, verify, w->z->path);
	if (!r)
		memcpy(w->dst + (lo - w->off), tmp + (lo - e->u_off), hi - lo);
	free(tmp);
	return r;
}

/* Chunks of one window: enough for every thread several times, within 256 MiB of data. */
static uint64_t window_chunks(const ferry_cz *z)
{
	uint64_t n = z->knobs.threads * 4;
	uint64_t cap = (256u << 20) / z->m.chunk_size;
	return n > cap ? cap : n < 1 ? 1 : n;
}

/*
 * The largest window of a read of len bytes into device memory: cz_window, or with cz_window 0
 * (the default) 128 MiB, or for a read whose frames are all in memory (resident) an eighth of it
 * past 1 GiB, up to 256 MiB. nvCOMP decodes a window's chunks side by side, so a larger window is
 * faster until the GPU is full, but the pipeline overlaps a window's checks and copies with the
 * one before's decoding only across windows, and each slot holds a window's frames in pinned and
 * device memory. Warm on the H200 (bench/gpu-cz-read.sh, zstd, nvCOMP against 16 CPU threads):
 * reads of 512 MiB ran as fast at 128 MiB as at 256 and 512 (tokens at 256 KiB chunks 19.71 GB/s
 * at 128, 16.64 at 256); reads of 2 GiB ran 12.65-19.31 GB/s at 128 MiB and 16.97-28.73 at 256.
 * From storage the disk sets the rate: cold 2 GiB reads at 256 MiB met 0.9x the disk times the
 * ratio in 6 of 8 rows (0.86-0.98x, the frames of tokens zstd 256 KiB arriving at 1.56 GB/s against
 * the plain read's 1.78), at 128 MiB in 8 of 8 (docs/CONFIG.md, cz_window).
 */
#define CZ_WINDOW_AUTO_MIN (128ull << 20)
#define CZ_WINDOW_AUTO_MAX (256ull << 20)
uint64_t ferry__cz_window_bytes(const ferry_cz *z, uint64_t len, int resident)
{
	if (z->knobs.window)
		return z->knobs.window;
	if (!resident)
		return CZ_WINDOW_AUTO_MIN;
	uint64_t w = len / 8;
	return w < CZ_WINDOW_AUTO_MIN ? CZ_WINDOW_AUTO_MIN : w > CZ_WINDOW_AUTO_MAX ? CZ_WINDOW_AUTO_MAX : w;
}

/* The chunks [a, b) that [off, off + len) covers; len is clipped to the data. */
static void cover(const ferry_cz *z, uint64_t off, size_t *len, uint64_t *a, uint64_t *b)
{
	if (off >= z->m.total)
		*len = 0;
	else if (*len > z->m.total - off)
		*len = (size_t)(z->m.total - off);
	*a = *len ? off / z->m.chunk_size : 0;
	*b = *len ? (off + *len - 1) / z->m.chunk_size + 1 : 0;
}

/*
 * The read pipeline. A read's chunks go in windows, each read into a slot of its own: while one
 * window is processed (decoded on the CPU threads; or, into device memory, its frames checked on
 * the CPU threads and its copies and nvCOMP batch queued on the slot's own stream), the
 * compressed bytes of the next windows are read by the engine's workers, and the GPU still runs
 * the batch of the window before, side by side with this one's copies and batch. Reads are started
 * ahead while fewer than the engine's own queue of bytes (its workers x queue_depth x chunk_size,
 * what a plain ferry_pread keeps in flight) are outstanding, and always the next window's: a cold
 * disk serves at its rate only with that many bytes asked for at once (docs/CONFIG.md, queue_depth:
 * 32 MiB in flight read at 1.29 GB/s where 128 MiB read at 1.92 on the H200's disk). A slot's
 * buffers are reused only once its queued work has been retired (its ticket waited for, nvCOMP's
 * results checked); the slot of the window just queued is left to the GPU (pipe.keep), so its
 * retirement never waits for work queued a moment before. CPU windows start small, so the first
 * read is short, and double up to the window cap; nvCOMP's are the cap (cz_window) from the first
 * (pread_device says why). One synchronisation per window, never per chunk.
 *
 * The slots and their buffers (pinned for device reads, registered with CUDA at first use: about
 * 20 ms for a 128 MiB window's frames on the H200, CONFIG.md) outlive the reader: a reader's set
 * goes back to an idle set of its device when it is destroyed (host reads: when the read ends),
 * which the next reader of the process takes, so a fresh open does not register its windows'
 * buffers again before its first read can start (the cold reads of issue 26 spent a third of their
 * time there). One idle set per device is kept (cz_sets).
 */
#define CZ_DEV_SLOTS 4   /* device reads: two windows read ahead, one processed, one on the GPU */
#define CZ_HOST_SLOTS 16 /* host reads: windows are smaller (window_chunks); the bytes bound them */
#define CZ_ALIGN 4096u   /* a window's read: offset and buffer (slot_start) */

struct cz_slot {
	void *buf; /* the window's frames: pinned (device reads, from z->pool) or malloc'd */
	size_t cap, span;
	int pin; /* device reads: 0 until buf (from ferry__pinned_alloc_unpinned) is locked before its copy */
	uint64_t i, n, c_off; /* c_off: where the read starts, the first frame's offset rounded down */
	size_t need;          /* the bytes from c_off to the last frame's end (span: those rounded up) */
	size_t rbytes;        /* the bytes its read asked for (struct cz_times' in flight) */
	size_t full, full_u;  /* the frames' and the data's bytes of the largest window from i */
	ferry_req *req;
	/* host reads: a window of whole stored chunks is read straight into the destination, their
	 * payloads (LZ4: one piece a chunk; zstd: its raw blocks) one entry each of one batch (of
	 * batch_ctx's: made again for a reader of another context, dropped when the set is idle) */
	ferry_batch *batch;
	ferry_ctx *batch_ctx;
	bool direct, batch_running;
	bool queued; /* GPU work that reads buf and ubuf is queued on the ring: retire first */
	/* device reads only */
	struct ferry__ring_gpu *ring; /* the slot's own stream: its copies, nvCOMP batch and ticket 0 */
	void *ubuf; /* bytes decoded on the CPU, bound for the GPU (ucap bytes, kept between reads) */
	size_t ucap;
	int upin; /* 0 until ubuf is locked: after the CPU threads have faulted its pages in by decoding */
	uint64_t scratch; /* device: the frames nvCOMP reads, then outputs when not aligned */
	size_t scratch_len;
	struct ferry__nvc *nvc; /* one decoder per slot: a batch's arrays live until it is retired */
	int nvc_codec;          /* the codec nvc decodes (a set is reused by readers of either) */
	uint64_t *gl;           /* the chunks of nvCOMP's batch (ng), for the sizes it reports */
	size_t *glen;
	size_t ng, gcap;
	double queue_s; /* seconds of this read spent queuing copies and nvCOMP batches (driver calls) */
	uint64_t frame_copies; /* this read's copies of frames for nvCOMP (one a window, or one a frame) */
};

struct cz_times {
	double read_wait, host, gpu_wait; /* seconds the caller's thread spent on each */
	uint64_t windows, inflight, max_inflight; /* windows read; compressed bytes being read (most at once) */
	uint64_t read_bytes; /* compressed bytes read from storage (direct windows' included) */
	double t0, first_read, last_read; /* the pipeline's start; when its first and last window's reads
					   * were found done (seconds from t0): the reads' span and the
					   * work after the last byte came (cold reads' fixed costs) */
};

static double mono(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct pipe {
	ferry_cz *z;
	struct cz_slot *s;
	unsigned nslots, keep; /* s[nslots]; keep: slots left to queued GPU work (1 device, 0 host) */
	bool pinned;
	uint8_t *dst; /* host reads: the destination of [off, off + len), for stored chunks' payloads */
	uint64_t off, len;
	bool to_slot; /* device reads: stored chunks' payloads into the slot's pinned buffer instead */
	uint64_t step, max_step;
	uint64_t taper; /* the read's last windows halve down to this many chunks (0: they do not) */
	int (*process)(void *arg, struct cz_slot *s);
	int (*retire)(void *arg, struct cz_slot *s); /* waits for s's queued work; NULL: none queued */
	void *arg;
	struct cz_times t;
};

static struct ferry__cz_phases phases(const struct pipe *p, double total)
{
	return (struct ferry__cz_phases){total, p->t.read_wait, p->t.host, p->t.gpu_wait, p->t.windows,
					 p->t.max_inflight, p->nslots};
}

void ferry__cz_last_phases(struct ferry_cz *z, struct ferry__cz_phases *out)
{
	pthread_mutex_lock(&z->lock);
	*out = z->last;
	pthread_mutex_unlock(&z->lock);
}

/* The size a kept buffer grows to for need bytes: a quarter more, in whole MiB, so that windows of
 * the same number of chunks (whose compressed sizes differ a little) do not grow it again: a new
 * size of pinned memory is a new cuMemHostRegister, of device memory a new cuMemAlloc. */
static size_t grown(size_t need)
{
	size_t want = need + need / 4;
	return want < need ? need : ((want + (1u << 20) - 1) & ~(size_t)((1u << 20) - 1));
}

/* The payload pieces of stored chunk e: LZ4's one block, zstd's raw blocks (FERRY__CZ_ZSTD_RAW_BLOCK
 * each, a 3-byte header before each); piece k: *at in the file, *len bytes, at u_off + *u. */
static uint32_t stored_pieces(int codec, const struct ferry__cz_chunk *e)
{
	return codec == FERRY__CZ_LZ4 ? 1 : (e->u_size + FERRY__CZ_ZSTD_RAW_BLOCK - 1) / FERRY__CZ_ZSTD_RAW_BLOCK;
}

static void stored_piece(int codec, const struct ferry__cz_chunk *e, uint32_t k, uint64_t *at, uint32_t *len,
			 uint32_t *u)
{
	if (codec == FERRY__CZ_LZ4) {
		*at = e->c_off + FERRY__CZ_LZ4_PAYLOAD, *len = e->u_size, *u = 0;
		return;
	}
	*u = k * FERRY__CZ_ZSTD_RAW_BLOCK;
	*len = e->u_size - *u < FERRY__CZ_ZSTD_RAW_BLOCK ? e->u_size - *u : FERRY__CZ_ZSTD_RAW_BLOCK;
	*at = e->c_off + FERRY__CZ_ZSTD_RAW_HEAD + (uint64_t)k * (FERRY__CZ_ZSTD_RAW_BLOCK + 3) + 3;
}

/*
 * A window whose chunks are all stored and wholly inside the read: their payloads are read by the
 * engine's workers straight into the destination (a host read's) or into the slot's pinned buffer
 * (a device read's, where the frames would go; then one copy to the GPU), one entry of the slot's batch each, instead of the
 * frames into s->buf and a copy out (bf16 LZ4, every chunk stored: one copy of the bytes and one
 * checksum where the frames' way made two copies and two checksums). What this skips are the
 * frames' headers and end marks (nothing of the data); cz_verify checks the bytes' XXH3.
 * 1: started; 0: not such a window; negative: an error.
 */
static int slot_start_direct(struct pipe *p, struct cz_slot *s)
{
	const struct ferry__cz_meta *m = &p->z->m;
	if (!p->dst && !p->to_slot)
		return 0;
	for (uint64_t k = 0; k < s->n; k++) {
		const struct ferry__cz_chunk *e = &m->chunks[s->i + k];
		if (!(e->flags & FERRY__CZ_STORED) || e->u_off < p->off || e->u_off + e->u_size > p->off + p->len)
			return 0;
	}
	uint8_t *base = p->dst;
	uint64_t boff = p->off;
	if (!base) { /* the slot's pinned buffer for frames (no larger than the frames would need) */
		const struct ferry__cz_chunk *e0 = &m->chunks[s->i], *e1 = &m->chunks[s->i + s->n - 1];
		size_t total = (size_t)(e1->u_off + e1->u_size - e0->u_off);
		if (total > s->cap) {
			size_t want = grown(total > s->full_u ? total : s->full_u);
			ferry__pinned_free(p->z->pool, s->buf);
			s->buf = NULL, s->cap = 0;
			/* locked before its copy, as slot_start's */
			int r = ferry__pinned_alloc_unpinned(p->z->pool, want, &s->buf, &s->pin);
			if (r)
				return ferry__error(r, "%s: %zu bytes for stored chunks", p->z->path, want);
			s->cap = want;
		}
		base = s->buf, boff = e0->u_off;
	}
	if (s->batch && s->batch_ctx != p->z->ctx) {
		ferry_batch_destroy(s->batch);
		s->batch = NULL;
	}
	int r = s->batch ? 0 : ferry_batch_create(p->z->ctx, &s->batch);
	if (r)
		return r;
	s->batch_ctx = p->z->ctx;
	ferry_batch_reset(s->batch);
	for (uint64_t k = 0; k < s->n && r >= 0; k++) {
		const struct ferry__cz_chunk *e = &m->chunks[s->i + k];
		for (uint32_t q = 0, np = stored_pieces(m->codec, e); q < np && r >= 0; q++) {
			uint64_t at;
			uint32_t len, u;
			stored_piece(m->codec, e, q, &at, &len, &u);
			r = ferry_batch_add_read(s->batch, p->z->f, at, len, base + (e->u_off - boff) + u);
		}
	}
	if (r >= 0)
		r = ferry_batch_submit(s->batch);
	if (r < 0) {
		ferry__error_append("%s: reading stored chunks %llu to %llu", p->z->path, (unsigned long long)s->i,
				    (unsigned long long)(s->i + s->n - 1));
		return r;
	}
	s->direct = s->batch_running = true;
	return 1;
}

/* Waits for a direct window's batch; a short or failed entry names its chunk. */
static int slot_wait_direct(struct pipe *p, struct cz_slot *s)
{
	const struct ferry__cz_meta *m = &p->z->m;
	int r = ferry_batch_wait(s->batch, -1);
	s->batch_running = false;
	if (r == 0)
		return 0;
	size_t at = 0;
	for (uint64_t k = 0; k < s->n; k++) {
		const struct ferry__cz_chunk *e = &m->chunks[s->i + k];
		for (uint32_t q = 0, np = stored_pieces(m->codec, e); q < np; q++, at++) {
			uint64_t off;
			uint32_t len, u;
			stored_piece(m->codec, e, q, &off, &len, &u);
			ssize_t got = ferry_batch_result(s->batch, at);
			if (got < 0) {
				ferry__error_append("%s: chunk %llu (compressed offset %llu): reading its stored bytes",
						    p->z->path, (unsigned long long)(s->i + k), (unsigned long long)e->c_off);
				return (int)got;
			}
			if ((size_t)got != len)
				return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): %zd of %u stored bytes at offset %llu before the end of the file (truncated?)",
						    p->z->path, (unsigned long long)(s->i + k), (unsigned long long)e->c_off,
						    got, len, (unsigned long long)off);
		}
	}
	return r < 0 ? r : ferry__error(FERRY_ECORRUPT, "%s: chunks %llu to %llu: a read came back short", p->z->path,
					(unsigned long long)s->i, (unsigned long long)(s->i + s->n - 1));
}

static void read_started(struct pipe *p, struct cz_slot *s, size_t bytes)
{
	s->rbytes = bytes;
	p->t.windows++;
	p->t.inflight += bytes;
	p->t.read_bytes += bytes;
	if (p->t.inflight > p->t.max_inflight)
		p->t.max_inflight = p->t.inflight;
}

static int slot_start(struct pipe *p, struct cz_slot *s, uint64_t i, uint64_t b)
{
	const struct ferry__cz_meta *m = &p->z->m;
	s->i = i;
	s->n = b - i < p->step ? b - i : p->step;
	if (p->taper && b - i < 2 * s->n) {
		/* the read's end, from storage: windows halve, so that what is left once the last
		 * bytes come is a small window's checks, copy and decoding, not a whole one's */
		uint64_t half = (b - i + 1) / 2;
		s->n = half > p->taper ? half : b - i < p->taper ? b - i : p->taper;
	}
	/* The read in whole blocks of CZ_ALIGN at a buffer aligned as much, so that an O_DIRECT file
	 * (a cold read) takes it straight: frames start anywhere, and a read at an unaligned offset
	 * goes through the engine's bounce slots, one more copy of every byte. */
	s->c_off = m->chunks[i].c_off & ~(uint64_t)(CZ_ALIGN - 1);
	s->need = (size_t)(m->chunks[i + s->n - 1].c_off + m->chunks[i + s->n - 1].c_size - s->c_off);
	s->span = (s->need + CZ_ALIGN - 1) & ~(size_t)(CZ_ALIGN - 1);
	/* Buffers are made for the largest window from here (the window cap, within the read), not
	 * for this one: CPU windows double from a few chunks, and each larger buffer would be made
	 * again (pinned memory: registered again, the smaller one kept in the pool) */
	const struct ferry__cz_chunk *ef = &m->chunks[i + (b - i < p->max_step ? b - i : p->max_step) - 1];
	s->full = (size_t)(ef->c_off + ef->c_size - s->c_off) + CZ_ALIGN;
	s->full_u = (size_t)(ef->u_off + ef->u_size - m->chunks[i].u_off);
	s->direct = false;
	int d = slot_start_direct(p, s);
	if (d) {
		p->step = p->step * 2 < p->max_step ? p->step * 2 : p->max_step;
		if (d > 0)
			read_started(p, s, (size_t)(m->chunks[i + s->n - 1].u_off + m->chunks[i + s->n - 1].u_size -
						    m->chunks[i].u_off));
		return d < 0 ? d : 0;
	}
	if (s->cap < s->span) {
		if (p->pinned)
			ferry__pinned_free(p->z->pool, s->buf);
		else
			free(s->buf);
		s->buf = NULL, s->cap = 0;
		size_t want = grown(s->span > s->full ? s->span : s->full);
		/* device reads: locked before the window's copy (device_enqueue), while later windows'
		 * reads are in flight, so a process's first reader does not register its windows
		 * before its first read starts */
		int r = p->pinned ? ferry__pinned_alloc_unpinned(p->z->pool, want, &s->buf, &s->pin) /* mmap'd: aligned */
				  : -posix_memalign(&s->buf, CZ_ALIGN, want);
		if (r)
			return ferry__error(r, "%s: %zu bytes for compressed chunks", p->z->path, want);
		s->cap = want;
	}
	int r = ferry_pread_async(p->z->f, s->buf, s->span, s->c_off, &s->req);
	if (r)
		ferry__error_append("%s: reading chunks %llu to %llu", p->z->path, (unsigned long long)i,
				    (unsigned long long)(i + s->n - 1));
	else
		read_started(p, s, s->span);
	p->step = p->step * 2 < p->max_step ? p->step * 2 : p->max_step;
	return r;
}

static int slot_wait(struct pipe *p, struct cz_slot *s)
{
	p->t.inflight -= s->rbytes;
	s->rbytes = 0;
	if (s->batch_running)
		return slot_wait_direct(p, s);
	if (!s->req)
		return 0;
	ssize_t got = ferry_req_wait(s->req, -1);
	ferry_req_destroy(s->req);
	s->req = NULL;
	if (got < 0) {
		ferry__error_append("%s: reading chunks %llu to %llu", p->z->path, (unsigned long long)s->i,
				    (unsigned long long)(s->i + s->n - 1));
		return (int)got;
	}
	if ((size_t)got < s->need) /* (past need: the rounding, which may pass the end of the file) */
		return ferry__error(FERRY_ECORRUPT, "%s: chunks %llu to %llu at offset %llu: %zd of %zu bytes before the end of the file (truncated?)",
				    p->z->path, (unsigned long long)s->i, (unsigned long long)(s->i + s->n - 1),
				    (unsigned long long)s->c_off, got, s->need);
	return 0;
}

static int slot_retire(struct pipe *p, struct cz_slot *s)
{
	if (!s->queued)
		return 0;
	double t = mono();
	s->queued = false;
	int r = p->retire(p->arg, s);
	p->t.gpu_wait += mono() - t;
	return r;
}

/*
 * Slot sets (the read pipeline's comment says why they outlive a reader): one idle set per device
 * (-1: host reads) at most, kept for the process; a set given back while one is idle is freed.
 */
struct cz_set {
	int dev; /* -1: host memory */
	unsigned n;
	struct ferry__pinned_pool *pool; /* device sets' */
	struct cz_slot s[];
};

#define CZ_IDLE_SETS 8
static pthread_mutex_t sets_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cz_set *idle_sets[CZ_IDLE_SETS];

static void set_free(struct cz_set *st)
{
	for (unsigned k = 0; k < st->n; k++)
		if (st->s[k].ring)
			(void)ferry__ring_drain(st->s[k].ring);
	for (unsigned k = 0; k < st->n; k++) {
		struct cz_slot *s = &st->s[k];
		ferry__ring_destroy(s->ring);
		if (s->scratch)
			ferry__gpu_release(st->dev, s->scratch);
		ferry__nvc_close(s->nvc);
		if (st->pool) {
			ferry__pinned_free(st->pool, s->buf);
			ferry__pinned_free(st->pool, s->ubuf);
		} else {
			free(s->buf);
		}
		free(s->gl), free(s->glen);
		ferry_batch_destroy(s->batch);
	}
	ferry__pinned_pool_destroy(st->pool);
	free(st);
}

/* dev's idle set, or a new one (NULL: out of memory, the error set). */
static struct cz_set *set_take(int dev)
{
	pthread_mutex_lock(&sets_mu);
	for (int k = 0; k < CZ_IDLE_SETS; k++) {
		struct cz_set *st = idle_sets[k];
		if (st && st->dev == dev) {
			idle_sets[k] = NULL;
			pthread_mutex_unlock(&sets_mu);
			return st;
		}
	}
	pthread_mutex_unlock(&sets_mu);
	unsigned n = dev < 0 ? CZ_HOST_SLOTS : CZ_DEV_SLOTS;
	struct cz_set *st = calloc(1, sizeof(*st) + n * sizeof(st->s[0]));
	if (!st) {
		ferry__error(-ENOMEM, "compressed read slots");
		return NULL;
	}
	st->dev = dev, st->n = n;
	if (dev < 0)
		return st;
	/* A stream per slot: the copies of one window run while the GPU decodes the window before
	 * (one stream would run them one after the other), and the nvCOMP batches of two windows
	 * overlap (a batch takes at least one chunk's decoding, its chunks running side by side:
	 * docs/GPU.md). Windows write disjoint parts of the destination, so nothing orders them. */
	int r = 0;
	for (unsigned k = 0; k < n && !r; k++)
		r = ferry__ring_create(dev, 1, 0, &st->s[k].ring);
	if (!r)
		r = ferry__pinned_pool_create(0, dev, &st->pool);
	if (r) {
		set_free(st);
		ferry__error(r, "compressed read slots on device %d", dev);
		return NULL;
	}
	return st;
}

/* st back to the idle sets (its queued work drained; its batches dropped: they are a context's). */
static void set_give(struct cz_set *st)
{
	for (unsigned k = 0; k < st->n; k++) {
		struct cz_slot *s = &st->s[k];
		if (s->ring)
			(void)ferry__ring_drain(s->ring);
		if (s->ng) {
			(void)ferry__nvc_finish(s->nvc, NULL);
			s->ng = 0;
		}
		s->queued = false;
		ferry_batch_destroy(s->batch);
		s->batch = NULL, s->batch_ctx = NULL;
	}
	pthread_mutex_lock(&sets_mu);
	int free_at = -1;
	bool dup = false;
	for (int k = 0; k < CZ_IDLE_SETS; k++) {
		if (!idle_sets[k])
			free_at = free_at < 0 ? k : free_at;
		else if (idle_sets[k]->dev == st->dev)
			dup = true;
	}
	if (!dup && free_at >= 0) {
		idle_sets[free_at] = st;
		st = NULL;
	}
	pthread_mutex_unlock(&sets_mu);
	if (st)
		set_free(st);
}

void ferry__cz_release_idle(void)
{
	struct cz_set *all[CZ_IDLE_SETS];
	pthread_mutex_lock(&sets_mu);
	memcpy(all, idle_sets, sizeof(all));
	memset(idle_sets, 0, sizeof(idle_sets));
	pthread_mutex_unlock(&sets_mu);
	for (int k = 0; k < CZ_IDLE_SETS; k++)
		if (all[k])
			set_free(all[k]);
}

/* 1 when the frames of chunks [a, b) are all in memory (a warm read: nothing waits for storage) */
static int frames_resident(const ferry_cz *z, uint64_t a, uint64_t b)
{
	if (a >= b)
		return 1;
	const struct ferry__cz_chunk *e = &z->m.chunks[b - 1];
	return ferry__range_resident(z->f, z->m.chunks[a].c_off, e->c_off + e->c_size - z->m.chunks[a].c_off);
}

/* p->taper for a read of chunks [a, b): where their frames are not all in memory (a read from
 * storage, whose last window's work would follow its last bytes), an eighth of the window cap,
 * at least cz_threads chunks; 0 for a resident file (nothing waits for storage: fewer, larger
 * windows are cheaper, nvCOMP's above all). */
static uint64_t taper_for(const ferry_cz *z, int resident, uint64_t max_step)
{
	if (resident)
		return 0;
	uint64_t t = max_step / 8;
	return t > z->knobs.threads ? t : z->knobs.threads;
}

/* The slots a read uses, of the have its set holds: enough for the engine's queue of bytes in
 * windows of max_step chunks (their compressed size estimated by the file's ratio), the one being
 * processed and keep, at least 3 + keep. Each slot used gets a buffer for a whole window, so a
 * set of small windows does not get 16 of them. */
static unsigned slots_for(const ferry_cz *z, uint64_t max_step, unsigned have, unsigned keep)
{
	uint64_t est = z->m.total ? (uint64_t)((double)max_step * z->m.chunk_size * ((double)z->m.compressed / (double)z->m.total)) : 0;
	uint64_t n = (est ? (z->ahead + est - 1) / est : have) + 1 + keep;
	n = n < 3 + keep ? 3 + keep : n;
	return n < have ? (unsigned)n : have;
}

/* Runs p->process on each window of [a, b) in order; the slots' buffers stay in p->s. */
static int pipe_run(struct pipe *p, uint64_t a, uint64_t b)
{
	uint64_t next = a, w_read = 0, w_done = 0;
	int r = 0;
	p->t.t0 = mono();
	while (!r && (next < b || w_done < w_read)) {
		/* the next window always; more while the bytes outstanding are fewer than ahead */
		while (!r && next < b && w_read < w_done + p->nslots - p->keep &&
		       (w_read < w_done + 2 || p->t.inflight < p->z->ahead)) {
			struct cz_slot *s = &p->s[w_read % p->nslots];
			if (!(r = slot_retire(p, s)) && !(r = slot_start(p, s, next, b))) {
				next += s->n;
				w_read++;
			}
		}
		if (r || w_done == w_read)
			break;
		struct cz_slot *s = &p->s[w_done % p->nslots];
		double t = mono();
		r = slot_wait(p, s);
		double t2 = mono();
		p->t.read_wait += t2 - t;
		if (!w_done)
			p->t.first_read = t2 - p->t.t0;
		p->t.last_read = t2 - p->t.t0;
		if (!r)
			r = p->process(p->arg, s);
		p->t.host += mono() - t2;
		w_done++;
	}
	/* what is still in flight, oldest first: reads, then queued work (errors after the first dropped) */
	for (uint64_t w = w_done; w < w_read; w++) {
		struct cz_slot *s = &p->s[w % p->nslots];
		if (s->req) {
			(void)ferry_req_wait(s->req, -1);
			ferry_req_destroy(s->req);
			s->req = NULL;
		}
		if (s->batch_running) {
			(void)ferry_batch_wait(s->batch, -1);
			s->batch_running = false;
		}
	}
	for (uint64_t k = 0; k < p->nslots; k++) {
		struct cz_slot *s = &p->s[(w_done + k) % p->nslots];
		int q = slot_retire(p, s);
		r = r ? r : q;
	}
	return r;
}

struct host_read {
	ferry_cz *z;
	uint8_t *buf;
	uint64_t off;
	size_t len;
};

struct check_bytes_job {
	ferry_cz *z;
	uint64_t first, off;
	const uint8_t *dst;
};

static int check_bytes_one(void *arg, size_t k)
{
	struct check_bytes_job *j = arg;
	const struct ferry__cz_chunk *e = &j->z->m.chunks[j->first + k];
	return ferry__cz_check_bytes(&j->z->m, j->first + k, j->dst + (e->u_off - j->off), j->z->path);
}

static int host_window(void *arg, struct cz_slot *s)
{
	struct host_read *h = arg;
	if (s->direct) {
		struct check_bytes_job j = {h->z, s->i, h->off, h->buf};
		return h->z->knobs.verify ? ferry__cz_parallel(s->n, (unsigned)h->z->knobs.threads, check_bytes_one, &j) : 0;
	}
	struct window w = {h->z, s->buf, s->c_off, s->i, h->off, h->len, h->buf, NULL};
	return ferry__cz_parallel(s->n, (unsigned)h->z->knobs.threads, decode_one, &w);
}

static ssize_t pread_host(ferry_cz *z, uint8_t *buf, size_t len, uint64_t off)
{
	uint64_t a, b;
	cover(z, off, &len, &a, &b);
	struct host_read h = {z, buf, off, len};
	double t0 = mono();
	struct cz_set *set = set_take(-1);
	if (!set)
		return ferry__error(-ENOMEM, "%s: read slots", z->path);
	uint64_t max = window_chunks(z);
	struct pipe p = {.z = z, .s = set->s, .nslots = set->n, .dst = buf, .off = off, .len = len,
			 .step = z->knobs.threads < max ? z->knobs.threads : max, .max_step = max,
			 .process = host_window, .arg = &h};
	p.taper = taper_for(z, frames_resident(z, a, b), max);
	p.nslots = slots_for(z, max, set->n, 0);
	int r = pipe_run(&p, a, b);
	set_give(set);
	if (!r)
		set_info(z, "cpu (host memory)");
	pthread_mutex_lock(&z->lock);
	z->last = phases(&p, mono() - t0);
	pthread_mutex_unlock(&z->lock);
	return r ? r : (ssize_t)len;
}

/* z's device set back to the idle ones (its rings drained first). Under z->lock. */
static void device_release(ferry_cz *z)
{
	if (z->set)
		set_give(z->set);
	z->set = NULL, z->slots = NULL, z->pool = NULL;
}

/* The device path's resources on device dev: an idle set of dev's, or a new one. Under z->lock. */
static int device_setup(ferry_cz *z, int dev)
{
	if (z->dev == dev && z->set) /* made last */
		return 0;
	device_release(z);
	z->dev = dev;
	if (!(z->set = set_take(dev)))
		return ferry__error(-ENOMEM, "%s: device read slots", z->path);
	z->slots = z->set->s, z->pool = z->set->pool;
	return 0;
}

/* The pieces' copies in few driver calls from pinned memory, one by one (synchronous) where the
 * pool could not pin (cuMemHostRegister refused). */
static int copy_pieces(struct ferry__ring_gpu *ring, const struct ferry__ring_piece *p, size_t n, bool pinned)
{
	if (pinned)
		return n ? ferry__ring_h2d_gather(ring, p, n, NULL) : 0;
	int r = 0;
	for (size_t k = 0; k < n && !r; k++)
		if (p[k].len)
			r = ferry__ring_h2d(ring, p[k].dst, p[k].src, p[k].len, false);
	return r;
}

struct check_job {
	ferry_cz *z;
	const uint8_t *cbuf;
	uint64_t cbase;
	const uint64_t *list;
	bool walked_on_gpu; /* LZ4: nvCOMP's decoder walks the blocks on the GPU (ferry__nvc_walks_lz4) */
};

/* A frame nvCOMP will decode, checked first whatever cz_verify says (ferry__cz_check_gpu_frame). */
static int check_one(void *arg, size_t k)
{
	struct check_job *j = arg;
	const struct ferry__cz_chunk *e = &j->z->m.chunks[j->list[k]];
	return ferry__cz_check_gpu_frame(&j->z->m, j->list[k], j->cbuf + (e->c_off - j->cbase), j->z->path,
					 j->walked_on_gpu);
}

/* Device memory of at least need bytes at *at (grown, kept). */
static int scratch_grow(ferry_cz *z, uint64_t *at, size_t *len, size_t need)
{
	if (*len >= need)
		return 0;
	if (*at)
		ferry__gpu_release(z->dev, *at);
	*at = 0, *len = 0;
	need = grown(need);
	int r = ferry__gpu_alloc(z->dev, need, at);
	if (!r)
		*len = need;
	return r;
}

/*
 * One window into device memory at dptr (the bytes from off), queued on the slot's ring, its
 * ticket 0 recorded after; nothing waited for. The frames are in pinned memory (s->buf); with nvCOMP, the
 * chunks inside the range decoded on the GPU from a device copy of the frames, stored ones copied
 * straight from their payload, the partial ones at the range's ends decoded on the CPU; without
 * it, every chunk decoded on the CPU threads into pinned memory and copied.
 */
static int device_enqueue(ferry_cz *z, struct cz_slot *s, uint64_t dptr, uint64_t off,
			  size_t len, bool gpu, uint64_t *on_gpu, uint64_t *on_cpu, int *refused)
{
	const struct ferry__cz_meta *m = &z->m;
	const uint64_t i0 = s->i, n = s->n;
	const struct ferry__cz_chunk *e0 = &m->chunks[i0], *e1 = &m->chunks[i0 + n - 1];
	const uint8_t *cbuf = (const uint8_t *)s->buf + (e0->c_off - s->c_off); /* the first frame */
	uint64_t wlo = e0->u_off > off ? e0->u_off : off;
	uint64_t whi = e1->u_off + e1->u_size < off + len ? e1->u_off + e1->u_size : off + len;
	int r;
	s->ng = 0;
	/* its read is over: locked now, other windows' reads in flight (a no-op where the pool could not
	 * lock it: ferry__pinned_pin tries a slot once) */
	if (!s->pin && (r = ferry__pinned_pin(z->pool, s->buf, &s->pin)))
		return r;
	if (s->direct) { /* stored chunks' bytes in buf (slot_start_direct): checked, one copy */
		struct check_bytes_job j = {z, i0, e0->u_off, s->buf};
		struct ferry__ring_piece piece = {dptr + (e0->u_off - off), s->buf, (size_t)(whi - wlo)};
		r = z->knobs.verify ? ferry__cz_parallel(n, (unsigned)z->knobs.threads, check_bytes_one, &j) : 0;
		double tq = mono();
		if (!r)
			r = copy_pieces(s->ring, &piece, 1, s->pin);
		if (!r)
			r = ferry__ring_record(s->ring, 0);
		s->queue_s += mono() - tq;
		if (r) {
			(void)ferry__ring_drain(s->ring);
			return r;
		}
		s->queued = true;
		*on_cpu += n;
		return 0;
	}
	if (s->gcap < n) {
		free(s->gl), free(s->glen);
		s->gl = malloc(n * sizeof(*s->gl) * 2);
		s->glen = malloc(n * sizeof(*s->glen) * 3);
		s->gcap = s->gl && s->glen ? n : 0;
	}
	uint64_t *cl = s->gl ? s->gl + n : NULL; /* chunks the CPU decodes */
	struct ferry__ring_piece *pieces = calloc(n * (FERRY__CZ_CHUNK_MAX / FERRY__CZ_ZSTD_RAW_BLOCK + 2) + n, sizeof(*pieces));
	if (!s->gcap || !pieces) {
		free(pieces);
		return ferry__error(-ENOMEM, "%s: device read of %llu chunks", z->path, (unsigned long long)n);
	}
	uint64_t *gl = s->gl;
	size_t ng = 0, nc = 0, np = 0;
	for (uint64_t k = 0; k < n; k++) {
		const struct ferry__cz_chunk *e = &m->chunks[i0 + k];
		bool whole = e->u_off >= off && e->u_off + e->u_size <= off + len;
		if (gpu && whole && !(e->flags & FERRY__CZ_STORED))
			gl[ng++] = i0 + k;
		else if (gpu && whole) {
			const uint8_t *f = cbuf + (e->c_off - e0->c_off);
			uint64_t d = dptr + (e->u_off - off);
			if (m->codec == FERRY__CZ_LZ4) {
				pieces[np++] = (struct ferry__ring_piece){d, f + FERRY__CZ_LZ4_PAYLOAD, e->u_size};
			} else {
				for (uint32_t done = 0; done < e->u_size; done += FERRY__CZ_ZSTD_RAW_BLOCK) {
					uint32_t b = e->u_size - done < FERRY__CZ_ZSTD_RAW_BLOCK ? e->u_size - done : FERRY__CZ_ZSTD_RAW_BLOCK;
					const uint8_t *p = f + FERRY__CZ_ZSTD_RAW_HEAD + (done / FERRY__CZ_ZSTD_RAW_BLOCK) * (FERRY__CZ_ZSTD_RAW_BLOCK + 3);
					pieces[np++] = (struct ferry__ring_piece){d + done, p + 3, b};
				}
			}
			cl[nc++] = i0 + k; /* checked below like the GPU's; decoded by the copy */
		} else
			cl[nc++] = i0 + k;
	}
	if (gpu) { /* nvCOMP's frames, always (check_one says why), and the stored ones the copy decodes
		    * (when cz_verify), on the CPU threads: the GPU cannot check the bytes */
		size_t k = 0, nchk = ng;
		for (size_t q = 0; q < nc; q++) {
			const struct ferry__cz_chunk *e = &m->chunks[cl[q]];
			bool whole = e->u_off >= off && e->u_off + e->u_size <= off + len;
			if (whole && z->knobs.verify)
				gl[nchk++] = cl[q]; /* after nvCOMP's list, in gl's room (ng + nc <= n) */
			if (!whole)
				cl[k++] = cl[q];
		}
		nc = k;
		struct check_job cj = {z, cbuf, e0->c_off, gl, m->codec == FERRY__CZ_LZ4 && ferry__nvc_walks_lz4(z->dev)};
		if ((r = ferry__cz_parallel(nchk, (unsigned)z->knobs.threads, check_one, &cj)))
			goto out;
	}
	/* CPU-decoded bytes into pinned memory: with nvCOMP, only the partial chunks at the read's
	 * ends (at most two), each in its own piece of ubuf; without, the whole window */
	size_t total = 0;
	if (nc && gpu) {
		for (size_t q = 0; q < nc; q++) {
			const struct ferry__cz_chunk *e = &m->chunks[cl[q]];
			uint64_t lo = e->u_off > off ? e->u_off : off;
			uint64_t hi = e->u_off + e->u_size < off + len ? e->u_off + e->u_size : off + len;
			total += (size_t)(hi - lo);
		}
	} else if (nc)
		total = (size_t)(whi - wlo);
	if (total > s->ucap) { /* kept: the pool reuses only a slot of the same size, and each new
				* size is a new cuMemHostRegister, so a read's partial ends would pin anew */
		/* <= 2 chunks with nvCOMP; the CPU's, the largest window's from here (slot_start) */
		size_t cs = m->chunk_size, want = (total + cs - 1) / cs * cs;
		if (!gpu && s->full_u > want)
			want = (s->full_u + cs - 1) / cs * cs;
		ferry__pinned_free(z->pool, s->ubuf);
		s->ubuf = NULL, s->ucap = 0;
		if ((r = ferry__pinned_alloc_unpinned(z->pool, want, &s->ubuf, &s->upin)))
			goto out;
		s->ucap = want;
	}
	if (nc && gpu) {
		size_t at = 0;
		for (size_t q = 0; q < nc; q++) {
			const struct ferry__cz_chunk *e = &m->chunks[cl[q]];
			uint64_t lo = e->u_off > off ? e->u_off : off;
			uint64_t hi = e->u_off + e->u_size < off + len ? e->u_off + e->u_size : off + len;
			struct window w = {z, cbuf, e0->c_off, 0, lo, (size_t)(hi - lo), (uint8_t *)s->ubuf + at, &cl[q]};
			if ((r = decode_one(&w, 0)))
				goto out;
			pieces[np++] = (struct ferry__ring_piece){dptr + (lo - off), (uint8_t *)s->ubuf + at, hi - lo};
			at += (size_t)(hi - lo);
		}
	} else if (nc) {
		struct window w = {z, cbuf, e0->c_off, 0, wlo, (size_t)(whi - wlo), s->ubuf, cl};
		if ((r = ferry__cz_parallel(nc, (unsigned)z->knobs.threads, decode_one, &w)))
			goto out;
		pieces[np++] = (struct ferry__ring_piece){dptr + (wlo - off), s->ubuf, (size_t)(whi - wlo)};
	}
	/* decoded into (its pages faulted in by the threads): locked now */
	if (total && !s->upin && (r = ferry__pinned_pin(z->pool, s->ubuf, &s->upin)))
		goto out;
	bool upinned = s->pin && (s->upin || !total);
	double tq = mono();
	if (ng) {
		/* nvCOMP wants each input and output aligned (as it says: ferry__nvc_input_align).
		 * Where every frame's payload lies at a multiple of that from the first's, the frames
		 * from the first GPU chunk's to the last's go to the scratch in ONE copy, as they lie
		 * in the file (a gathered copy costs the driver 5-7 us a piece: 4,096 pieces a GiB of
		 * 256 KiB chunks); else each goes at a 256-byte boundary, one piece each. Where the
		 * destination's chunks are not 16-byte aligned (a read from an unaligned offset) they
		 * are decoded into the scratch and copied device to device. */
		if (s->nvc && s->nvc_codec != m->codec) { /* the set's last reader's codec */
			ferry__nvc_close(s->nvc);
			s->nvc = NULL;
		}
		if (!s->nvc && (r = ferry__nvc_open(z->dev, m->codec, &s->nvc))) {
			*refused = 1;
			goto out;
		}
		s->nvc_codec = m->codec;
		bool direct = (dptr - off) % 16 == 0, contig = true;
		const size_t ia = ferry__nvc_input_align(s->nvc);
		const uint64_t sbase = m->chunks[gl[0]].c_off + m->chunks[gl[0]].payload_off;
		const uint64_t send = m->chunks[gl[ng - 1]].c_off + m->chunks[gl[ng - 1]].c_size;
		size_t need_in = 0, need_out = 0;
		for (size_t q = 0; q < ng; q++) {
			const struct ferry__cz_chunk *e = &m->chunks[gl[q]];
			contig = contig && (e->c_off + e->payload_off - sbase) % ia == 0;
			need_in += ((size_t)e->c_size + 255) & ~(size_t)255;
			if (!direct)
				need_out += ((size_t)e->u_size + 255) & ~(size_t)255;
		}
		if (contig) /* the span, stored and partial chunks' frames inside it included */
			need_in = ((size_t)(send - sbase) + 255) & ~(size_t)255;
		size_t need = need_in + need_out;
		if (!direct && !ferry__ring_can_d2d()) {
			r = ferry__error(-ENOTSUP, "the destination is not 16-byte aligned for nvCOMP's outputs, and the driver has no cuMemcpyDtoDAsync");
			*refused = 1;
			goto out;
		}
		if ((r = scratch_grow(z, &s->scratch, &s->scratch_len, need)))
			goto out;
		uint64_t *src = calloc(ng, sizeof(*src) * 3);
		struct ferry__ring_piece *in = calloc(ng, sizeof(*in));
		if (!src || !in) {
			free(src), free(in);
			r = ferry__error(-ENOMEM, "%s: nvCOMP batch of %zu chunks", z->path, ng);
			goto out;
		}
		uint64_t *dst = src + ng, *out_at = src + 2 * ng;
		size_t *slen = s->glen, *cap = s->glen + ng;
		uint64_t at = s->scratch;
		size_t nin = contig ? 1 : ng;
		if (contig) {
			in[0] = (struct ferry__ring_piece){at, cbuf + (sbase - e0->c_off), (size_t)(send - sbase)};
			at += ((size_t)(send - sbase) + 255) & ~(size_t)255;
		}
		for (size_t q = 0; q < ng; q++) {
			const struct ferry__cz_chunk *e = &m->chunks[gl[q]];
			slen[q] = m->codec == FERRY__CZ_LZ4 ? e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4 : e->c_size;
			if (contig) {
				src[q] = s->scratch + (e->c_off + e->payload_off - sbase);
			} else {
				in[q] = (struct ferry__ring_piece){at, cbuf + (e->c_off - e0->c_off) + e->payload_off, slen[q]};
				src[q] = at;
				at += (slen[q] + 255) & ~(size_t)255;
			}
			dst[q] = dptr + (e->u_off - off);
			cap[q] = e->u_size;
		}
		for (size_t q = 0; q < ng; q++) {
			out_at[q] = direct ? dst[q] : at;
			if (!direct)
				at += (cap[q] + 255) & ~(size_t)255;
		}
		r = copy_pieces(s->ring, in, nin, s->pin);
		s->frame_copies += nin;
		if (!r) {
			r = ferry__nvc_decompress(s->nvc, ferry__ring_stream(s->ring), ng, src, slen, out_at, cap);
			if (r == -EINVAL || r == -ENOTSUP) /* refused before anything ran: the CPU does it */
				*refused = 1;
		}
		for (size_t q = 0; q < ng && !r && !direct; q++)
			r = ferry__ring_d2d(s->ring, z->dev, dst[q], out_at[q], cap[q]);
		free(src), free(in);
		if (!r)
			s->ng = ng;
	}
	if (!r)
		r = copy_pieces(s->ring, pieces, np, upinned);
	if (!r)
		r = ferry__ring_record(s->ring, 0);
	if (!r) {
		s->queued = true;
		*on_gpu += ng;
		*on_cpu += n - ng;
	}
	s->queue_s += mono() - tq;
out:
	if (r) {
		(void)ferry__ring_drain(s->ring); /* nothing may still read buf or ubuf */
		if (s->ng) {
			(void)ferry__nvc_finish(s->nvc, NULL);
			s->ng = 0;
		}
	}
	free(pieces);
	return r;
}

/* Waits for slot s's queued work (its ring's ticket 0), then checks what nvCOMP reported for its
 * batch. */
static int device_retire(ferry_cz *z, struct cz_slot *s)
{
	int r = ferry__ring_sync(s->ring, 0);
	r = r < 0 ? r : 0;
	if (s->ng) {
		size_t ng = s->ng, *slen = s->glen, *cap = s->glen + ng;
		int q = ferry__nvc_finish(s->nvc, slen);
		const size_t bad = ferry__nvc_failed(s->nvc);
		for (size_t k = 0; k < ng && !q && !r; k++)
			if (slen[k] != cap[k])
				q = ferry__error(FERRY_ECORRUPT, "%s: chunk %llu: nvCOMP decoded %zu bytes, the index says %zu",
						 z->path, (unsigned long long)s->gl[k], slen[k], cap[k]);
		if (q && !r) {
			if (bad < ng) /* nvCOMP's status or the walk's verdict, by its index in the batch */
				ferry__error_append("%s: chunk %llu (compressed offset %llu)", z->path,
						    (unsigned long long)s->gl[bad],
						    (unsigned long long)z->m.chunks[s->gl[bad]].c_off);
			else
				ferry__error_append("%s: chunks %llu to %llu on the GPU", z->path,
						    (unsigned long long)s->gl[0], (unsigned long long)s->gl[ng - 1]);
			r = q;
		}
		s->ng = 0;
	}
	return r;
}

struct dev_read {
	ferry_cz *z;
	uint64_t dptr, off;
	size_t len;
	bool gpu;
	uint64_t on_gpu, on_cpu;
	char *whybuf;
	size_t whylen;
	const char *why; /* set when nvCOMP refused a batch */
};

static int dev_window(void *arg, struct cz_slot *s)
{
	struct dev_read *d = arg;
	int refused = 0;
	int r = device_enqueue(d->z, s, d->dptr, d->off, d->len, d->gpu, &d->on_gpu, &d->on_cpu, &refused);
	if (r && refused) { /* nvCOMP turned the batch down before it ran: the CPU decodes */
		snprintf(d->whybuf, d->whylen, "refused: %s", ferry_last_error());
		d->why = d->whybuf;
		d->gpu = false;
		r = device_enqueue(d->z, s, d->dptr, d->off, d->len, false, &d->on_gpu, &d->on_cpu, &refused);
	}
	return r;
}

static int dev_retire(void *arg, struct cz_slot *s)
{
	struct dev_read *d = arg;
	return device_retire(d->z, s);
}

static ssize_t pread_device(ferry_cz *z, uint64_t dptr, int dev, size_t len, uint64_t off)
{
	uint64_t a, b;
	cover(z, off, &len, &a, &b);
	const char *why = NULL;
	char whybuf[200], smallbuf[120];
	bool gpu = false;
	uint64_t on_gpu = 0, on_cpu = 0;
	if (z->knobs.gpu == GPU_OFF)
		why = "cz_gpu=off";
	else if (z->m.codec == FERRY__CZ_LZ4 && z->knobs.gpu == GPU_AUTO)
		/* nvCOMP's LZ4 (each block walked first, on the GPU where ferry's kernels load) beat
		 * the CPU path only on large reads from memory: 1.45-1.86x on warm 2 GiB token reads,
		 * a fresh reader's first read 0.96x at 1 MiB chunks (CONFIG.md, cz_gpu) */
		why = "LZ4 decodes on the CPU unless cz_gpu=on (nvCOMP's LZ4 pays only on large reads from memory)";
	else
		gpu = ferry__nvc_available(z->m.codec, &why) == 1; /* the same numbers */
	if (!gpu && z->knobs.gpu == GPU_ON)
		return ferry__error(FERRY_EBACKEND, "%s: cz_gpu=on, but nvCOMP cannot decode %s here: %s", z->path,
				    ferry_cz_codec_name(z->m.codec), why ? why : "unknown");
	if (gpu && z->knobs.gpu == GPU_AUTO && b - a < z->knobs.gpu_min) {
		/* a small batch: one nvCOMP launch and its synchronisation cost more than the CPU
		 * threads take for a few chunks (docs/CONFIG.md, cz_gpu_min: measured) */
		snprintf(smallbuf, sizeof(smallbuf), "%llu chunks, fewer than cz_gpu_min=%llu", (unsigned long long)(b - a),
			 (unsigned long long)z->knobs.gpu_min);
		why = smallbuf;
		gpu = false;
	}
	pthread_mutex_lock(&z->lock);
	void *prev = NULL; /* the caller's thread keeps its own current context */
	double t0 = mono(), setup = 0;
	const int resident = frames_resident(z, a, b);
	uint64_t max = ferry__cz_window_bytes(z, len, resident) / z->m.chunk_size;
	max = max ? max : 1;
	/* nvCOMP's windows are cz_window from the first: a batch takes at least one chunk's decoding
	 * (its chunks run side by side, each at about 100 MB/s: docs/GPU.md), so windows doubling from
	 * a few chunks cost that time again for each small one; the CPU threads' windows double.
	 * From storage too: smaller first windows were done sooner, but the read took as long
	 * (CONFIG.md, cz_window). */
	uint64_t step = gpu ? max : z->knobs.threads < max ? z->knobs.threads : max;
	struct pipe p = {.z = z, .nslots = CZ_DEV_SLOTS, .keep = 1, .pinned = true, .off = off, .len = len,
			 .to_slot = true, .step = step, .max_step = max, .process = dev_window, .retire = dev_retire};
	int r = ferry__gpu_enter(dev, &prev);
	double queue = 0;
	uint64_t frame_copies = 0;
	if (!r) {
		r = device_setup(z, dev);
		setup = mono() - t0;
		for (int k = 0; !r && k < CZ_DEV_SLOTS; k++)
			z->slots[k].queue_s = 0, z->slots[k].frame_copies = 0;
		struct dev_read d = {z, dptr, off, len, gpu, 0, 0, whybuf, sizeof(whybuf), NULL};
		p.s = z->slots, p.arg = &d;
		p.taper = taper_for(z, resident, max);
		p.nslots = slots_for(z, max, CZ_DEV_SLOTS, 1);
		if (!r)
			r = pipe_run(&p, a, b);
		gpu = d.gpu, on_gpu = d.on_gpu, on_cpu = d.on_cpu;
		for (int k = 0; z->slots && k < CZ_DEV_SLOTS; k++)
			queue += z->slots[k].queue_s, frame_copies += z->slots[k].frame_copies;
		if (d.why)
			why = d.why;
		ferry__gpu_leave(prev);
	}
	char times[360];
	double t_end = mono();
	z->last = phases(&p, t_end - t0); /* (under z->lock) */
	snprintf(times, sizeof(times), "; %.1f ms: setup %.1f, read wait %.1f, host %.1f (threads %.1f, queue %.1f), gpu wait %.1f; "
		 "%llu windows, at most %.0f MiB read at once; reads: the first window's done at %.1f ms, the last's at %.1f "
		 "(%.0f MiB, %.2f GB/s), then %.1f ms",
		 (t_end - t0) * 1e3, setup * 1e3, p.t.read_wait * 1e3, p.t.host * 1e3, (p.t.host - queue) * 1e3,
		 queue * 1e3, p.t.gpu_wait * 1e3, (unsigned long long)p.t.windows, (double)p.t.max_inflight / 1048576,
		 p.t.first_read * 1e3, p.t.last_read * 1e3, (double)p.t.read_bytes / 1048576,
		 p.t.last_read > 0 ? (double)p.t.read_bytes / p.t.last_read / 1e9 : 0.0,
		 p.t.t0 > 0 ? (t_end - p.t.t0 - p.t.last_read) * 1e3 : 0.0);
	if (!r && gpu)
		snprintf(z->info, sizeof(z->info), "nvcomp (%llu chunks on the GPU, %llu copied or decoded on the CPU: stored or partial; "
			 "frames in %llu copies)%s", (unsigned long long)on_gpu, (unsigned long long)on_cpu,
			 (unsigned long long)frame_copies, times);
	else if (!r)
		snprintf(z->info, sizeof(z->info), "cpu (nvcomp: %s)%s", why && *why ? why : "not available", times);
	pthread_mutex_unlock(&z->lock);
	return r ? r : (ssize_t)len;
}

ssize_t ferry_cz_pread(ferry_cz *z, void *buf, size_t len, uint64_t offset)
{
	int dev = -1;
	if (len && ferry_mem_kind(buf, &dev) == FERRY_MEM_DEVICE)
		return pread_device(z, (uint64_t)(uintptr_t)buf, dev, len, offset);
	return pread_host(z, buf, len, offset);
}

/* ------------------------------------------------------------------- decoded chunks kept (loader) */

/*
 * A reader's decoded chunks, kept between its reads (issue 26): a window of a few KiB that falls in
 * a chunk decoded before copies from it instead of decoding the chunk again, and the buffers (the
 * frame's, each entry's, zstd's context) are reused, so a decode allocates nothing once the cache
 * is full. One per thread (no lock). Entries are evicted least recently used first once their
 * bytes pass the budget. A read that crosses into a chunk from the one before and ends near its
 * start decodes only that head, into a buffer of its own (not kept: a head kept in an entry
 * evicted a chunk of the window being read, 16 MiB caches decoding 2.4x the floor, issue 26).
 */
struct cz_entry {
	const ferry_cz *z;
	uint64_t i, used;
	uint8_t *buf;
	size_t cap;
	uint32_t have; /* bytes decoded from the chunk's start (u_size: the whole chunk) */
};

struct ferry__cz_cache {
	uint64_t budget, bytes, tick;
	struct cz_entry *e;
	size_t n, cap;
	uint8_t *frame, *head;
	size_t frame_cap, head_cap;
	struct ferry__cz_dctx *dctx;
	struct ferry__cz_cache_stats st;
};

int ferry__cz_cache_create(uint64_t budget, struct ferry__cz_cache **out)
{
	struct ferry__cz_cache *c = calloc(1, sizeof(*c));
	*out = NULL;
	if (!c)
		return ferry__error(-ENOMEM, "decoded chunk cache");
	int r = ferry__cz_dctx_create(&c->dctx);
	if (r) {
		free(c);
		return r;
	}
	c->budget = budget;
	*out = c;
	return 0;
}

void ferry__cz_cache_destroy(struct ferry__cz_cache *c)
{
	if (!c)
		return;
	for (size_t k = 0; k < c->n; k++)
		free(c->e[k].buf);
	free(c->e);
	free(c->frame);
	free(c->head);
	ferry__cz_dctx_destroy(c->dctx);
	free(c);
}

void ferry__cz_cache_stats(const struct ferry__cz_cache *c, struct ferry__cz_cache_stats *out)
{
	if (c)
		*out = c->st;
	else
		memset(out, 0, sizeof(*out));
}

const struct ferry__cz_meta *ferry__cz_meta_of(const ferry_cz *z) { return &z->m; }
const char *ferry__cz_name(const ferry_cz *z) { return z->path; }
int ferry__cz_verifies(const ferry_cz *z) { return (int)z->knobs.verify; }

int ferry__cz_read_raw(ferry_cz *z, void *buf, size_t n, uint64_t off, uint64_t i)
{
	int fd = ferry__file_fd(z->f);
	if (fd < 0)
		return read_exact(z->f, buf, n, off, z->path, "a chunk");
	/* the buffered descriptor, no engine hand-off: a frame is one pread (the loader's reads of
	 * resident plain shards go the same way, read_inline) */
	for (size_t done = 0; done < n;) {
		ssize_t k = pread(fd, (uint8_t *)buf + done, n - done, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return ferry__error(-errno, "pread(%s, offset %llu, %zu bytes): chunk %llu: %s", z->path,
					    (unsigned long long)(off + done), n, (unsigned long long)i, strerror(errno));
		if (!k)
			return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu at offset %llu: %zu of %zu bytes before the end of the file (truncated?)",
					    z->path, (unsigned long long)i, (unsigned long long)off, done, n);
		done += (size_t)k;
	}
	return 0;
}

/* Chunk i's frame into c->frame (grown, kept), read on this thread. */
static int read_frame(ferry_cz *z, struct ferry__cz_cache *c, uint64_t i)
{
	const struct ferry__cz_chunk *e = &z->m.chunks[i];
	if (c->frame_cap < e->c_size) {
		free(c->frame);
		c->frame_cap = 0;
		if (!(c->frame = malloc(grown(e->c_size))))
			return ferry__error(-ENOMEM, "%s: chunk %llu: %u bytes", z->path, (unsigned long long)i, e->c_size);
		c->frame_cap = grown(e->c_size);
	}
	return ferry__cz_read_raw(z, c->frame, e->c_size, e->c_off, i);
}

/* At least the first need bytes of chunk i of z at *out: an entry's, or decoded into the least
 * recently used entry (or a new one while the budget allows). head: the read only crosses into
 * this chunk, so a head of need bytes will do (decoded into c->head unless an entry has them). */
static int cache_get(ferry_cz *z, struct ferry__cz_cache *c, uint64_t i, uint32_t need, bool head,
		     const uint8_t **out)
{
	const struct ferry__cz_chunk *e = &z->m.chunks[i];
	struct cz_entry *hit = NULL, *lru = NULL;
	for (size_t k = 0; k < c->n; k++) {
		struct cz_entry *x = &c->e[k];
		if (x->z == z && x->i == i) {
			hit = x;
			break;
		}
		if (!lru || x->used < lru->used)
			lru = x;
	}
	c->tick++;
	if (hit && hit->have >= need) {
		hit->used = c->tick;
		c->st.hits++;
		*out = hit->buf;
		return 0;
	}
	int r;
	uint32_t have = 0;
	if (head) {
		if (c->head_cap < e->u_size) {
			free(c->head);
			c->head_cap = 0;
			if (!(c->head = malloc(e->u_size)))
				return ferry__error(-ENOMEM, "%s: chunk %llu: %u bytes", z->path, (unsigned long long)i, e->u_size);
			c->head_cap = e->u_size;
		}
		if ((r = read_frame(z, c, i)) ||
		    (r = ferry__cz_decode_with(c->dctx, &z->m, i, c->frame, c->head, need, (int)z->knobs.verify, &have, z->path)))
			return r;
		c->st.decodes++;
		c->st.decoded += have;
		*out = c->head;
		return 0;
	}
	struct cz_entry *x = hit;
	if (!x && (c->bytes + e->u_size > c->budget && lru)) {
		x = lru; /* evicted */
	} else if (!x) {
		if (c->n == c->cap) {
			size_t nc = c->cap ? c->cap * 2 : 16;
			struct cz_entry *ne = realloc(c->e, nc * sizeof(*ne));
			if (!ne)
				return ferry__error(-ENOMEM, "%s: decoded chunk cache of %zu entries", z->path, nc);
			c->e = ne;
			c->cap = nc;
		}
		x = &c->e[c->n++];
		memset(x, 0, sizeof(*x));
	}
	x->z = NULL;
	x->have = 0;
	if (x->cap < e->u_size) {
		c->bytes -= x->cap;
		free(x->buf);
		x->cap = 0;
		if (!(x->buf = malloc(e->u_size)))
			return ferry__error(-ENOMEM, "%s: chunk %llu: %u bytes", z->path, (unsigned long long)i, e->u_size);
		x->cap = e->u_size;
		c->bytes += x->cap;
	}
	r = read_frame(z, c, i);
	if (!r)
		r = ferry__cz_decode_with(c->dctx, &z->m, i, c->frame, x->buf, e->u_size, (int)z->knobs.verify, &have,
					  z->path);
	if (r)
		return r;
	c->st.decodes++;
	c->st.decoded += have;
	x->z = z;
	x->i = i;
	x->have = have;
	x->used = c->tick;
	*out = x->buf;
	return 0;
}

ssize_t ferry__cz_pread_cached(ferry_cz *z, struct ferry__cz_cache *c, void *buf, size_t len, uint64_t off)
{
	uint64_t a, b;
	cover(z, off, &len, &a, &b);
	uint8_t *dst = buf;
	for (uint64_t i = a; i < b; i++) {
		const struct ferry__cz_chunk *e = &z->m.chunks[i];
		uint64_t lo = e->u_off > off ? e->u_off : off;
		uint64_t hi = e->u_off + e->u_size < off + len ? e->u_off + e->u_size : off + len;
		const uint8_t *x = NULL;
		/* a head when a short read (a sample crossing out of the chunks a window holds) comes
		 * from the chunk before and ends in this one's first eighth; a long one (a sequential
		 * read's batch) takes the chunk whole, which the next read goes on in */
		bool head = i > a && len < e->u_size / 8 && hi - e->u_off < e->u_size / 8;
		int r = cache_get(z, c, i, (uint32_t)(hi - e->u_off), head, &x);
		if (r) {
			ferry__error_append("%s: reading bytes %llu to %llu", z->path, (unsigned long long)off,
					    (unsigned long long)(off + len));
			return r;
		}
		memcpy(dst + (lo - off), x + (lo - e->u_off), hi - lo);
	}
	return (ssize_t)len;
}
