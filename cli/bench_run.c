/*
 * ferry bench: one run. Each job is a thread with its own ferry_queue keeping iodepth I/Os of bs
 * bytes in flight (queue, submit, reap, requeue), the way fio's jobs drive io_uring.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"

struct bench_slot {
	uint8_t *buf;
	uint64_t off;
	uint64_t t_queue, t_submit;
	int write;
};

struct bench_shared {
	const struct bench_job_opts *o;
	struct bench_result *res;
	unsigned depth;
	uint64_t region, nblocks;
	pthread_barrier_t start, end;
	atomic_int setup_failed;
	atomic_int stop;
	ferry_ctx *ctx;
};

struct bench_job {
	struct bench_shared *sh;
	unsigned index;
	pthread_t thread;
	ferry_file *file;
	ferry_queue *q;
	uint8_t *mem;
	size_t memlen;
	struct bench_slot *slots;
	uint64_t rng;
	struct bench_dir dir[2];
	uint64_t t_start, t_end;
	struct rusage ru0, ru1;
	uint64_t verified;
	int cold_fd;            /* --cold: the file's pages are dropped at each pass, as fio's invalidate */
	int direct;
	int failed;
	uint8_t *dev_mem;       /* -x: the I/O buffers in device memory */
	char msg[1024];
	ferry_cz *cz; /* the file read through ferry_cz_pread (a compressed file), or NULL */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double tv_s(struct timeval tv)
{
	return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

const char *bench_rw_name(enum bench_rw rw)
{
	static const char *const names[] = {"read", "write", "randread", "randwrite", "randrw"};
	return names[rw];
}

int bench_rw_reads(enum bench_rw rw)
{
	return rw == BENCH_READ || rw == BENCH_RANDREAD || rw == BENCH_RANDRW;
}

int bench_rw_writes(enum bench_rw rw)
{
	return rw == BENCH_WRITE || rw == BENCH_RANDWRITE || rw == BENCH_RANDRW;
}

static const char *detail(void)
{
	const char *d = ferry_last_error();
	return d && *d ? d : "no detail";
}

static void fill_random(uint8_t *p, size_t len, uint64_t seed)
{
	size_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t w = splitmix64(&seed);
		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)splitmix64(&seed);
}

static void job_fail(struct bench_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(struct bench_job *j, const char *fmt, ...)
{
	if (j->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
	va_end(ap);
	j->failed = 1;
	atomic_store(&j->sh->stop, 1);
}

static int job_setup(struct bench_job *j)
{
	const struct bench_job_opts *o = j->sh->o;
	int flags = bench_rw_writes(o->rw) ? FERRY_O_RDWR : FERRY_O_RDONLY;
	if (o->direct == 0)
		flags |= FERRY_O_BUFFERED;
	int err = ferry_file_open(j->sh->ctx, o->filename, flags, &j->file);
	if (err < 0) {
		job_fail(j, "cannot open %s%s: %s (%s)", o->filename, o->direct ? " with O_DIRECT" : "",
			 ferry_strerror(err), detail());
		return -1;
	}
	if (j->sh->res->cz_codec && (err = ferry_cz_open(j->sh->ctx, o->filename, &j->cz)) < 0) {
		job_fail(j, "cannot open %s as a compressed file: %s (%s)", o->filename, ferry_strerror(err), detail());
		return -1;
	}
	j->direct = ferry_file_is_direct(j->file);
	uint32_t lbs = ferry_file_block_size(j->file);
	if (o->direct == 1 && j->direct && lbs && o->bs % lbs) {
		job_fail(j, "--bs %" PRIu64 " is not a multiple of %s's logical block size, %u bytes, which --direct 1 "
			 "(O_DIRECT) needs", o->bs, o->filename, lbs);
		return -1;
	}
	if (o->cold == BENCH_COLD_FILE && (j->cold_fd = open(o->filename, O_RDONLY)) < 0) {
		job_fail(j, "cannot open %s to drop its cached pages: %s", o->filename, strerror(errno));
		return -1;
	}
	err = ferry_queue_create(j->sh->ctx, j->sh->depth, &j->q);
	if (err < 0) {
		job_fail(j, "cannot create an I/O queue of depth %u: %s (%s)", j->sh->depth,
			 ferry_strerror(err), detail());
		return -1;
	}
	j->memlen = (size_t)o->bs * j->sh->depth;
	j->mem = ferry_alloc_aligned(j->memlen);
	j->slots = calloc(j->sh->depth, sizeof(*j->slots));
	if (!j->mem || !j->slots) {
		job_fail(j, "cannot allocate %zu bytes of I/O buffers", j->memlen);
		return -1;
	}
	/* Random bytes, not zeros: compressing or deduplicating storage would flatter zeros. */
	fill_random(j->mem, j->memlen, o->randseed ^ j->index);
	if (bench_x_on_gpu(o->xmode)) {
		/* the I/O buffers live in device memory; the host copy only seeds them */
		void *dev = NULL;
		int gpu = bench_job_gpu(o, j->index);
		err = ferry_gpu_malloc(gpu, j->memlen, &dev);
		if (!err)
			err = ferry_gpu_memcpy_htod(dev, j->mem, j->memlen);
		ferry_free_aligned(j->mem, j->memlen);
		j->mem = NULL;
		if (err < 0) {
			if (dev)
				ferry_gpu_free(dev);
			job_fail(j, "cannot set up %zu bytes of GPU %d memory: %s (%s)", j->memlen, gpu,
				 ferry_strerror(err), detail());
			return -1;
		}
		j->dev_mem = dev;
	}
	uint8_t *base = j->dev_mem ? j->dev_mem : j->mem;
	if (j->dev_mem) {
		/* One untimed transfer first: CUDA's and cuFile's initialisation, the GDS probe and the
		 * pinning of the workers' slots are one-time costs, left out as fio and gdsio do. */
		size_t n = o->bs < (16u << 20) ? (size_t)o->bs : (16u << 20);
		ssize_t r = j->cz ? ferry_cz_pread(j->cz, base, n, o->offset)
			    : bench_rw_reads(o->rw) ? ferry_pread(j->file, base, n, o->offset)
						    : ferry_pwrite(j->file, base, n, o->offset);
		if (r < 0) {
			job_fail(j, "%s of %zu bytes at offset %" PRIu64 " of %s failed: %s (%s)",
				 bench_rw_reads(o->rw) ? "read" : "write", n, o->offset, o->filename,
				 ferry_strerror((int)r), detail());
			return -1;
		}
	}
	for (unsigned i = 0; i < j->sh->depth; i++)
		j->slots[i].buf = base + (size_t)i * o->bs;
	for (int d = 0; d < 2; d++) {
		bench_hist_init(&j->dir[d].clat);
		bench_hist_init(&j->dir[d].lat);
	}
	uint64_t s = o->randseed + 0x9E3779B97F4A7C15ull * (j->index + 1);
	j->rng = splitmix64(&s) | 1;
	return 0;
}

static void job_complete(struct bench_job *j, struct bench_slot *s, int64_t result, uint64_t now)
{
	const struct bench_job_opts *o = j->sh->o;
	const char *what = s->write ? "write" : "read";
	if (result < 0) {
		job_fail(j, "%s of %" PRIu64 " bytes at offset %" PRIu64 " of %s failed: %s (%s)", what,
			 o->bs, s->off, o->filename, ferry_strerror((int)result), detail());
		return;
	}
	if ((uint64_t)result != o->bs) {
		job_fail(j, "short %s at offset %" PRIu64 " of %s: %" PRId64 " of %" PRIu64
			 " bytes (did the file shrink during the run?)",
			 what, s->off, o->filename, result, o->bs);
		return;
	}
	struct bench_dir *d = &j->dir[s->write];
	d->bytes += o->bs;
	d->ios++;
	bench_hist_add(&d->clat, now - s->t_submit);
	bench_hist_add(&d->lat, now - s->t_queue);
	if (!s->write && o->verify) {
		char msg[512];
		if (bench_verify_check(o->verify, s->buf, o->bs, s->off, o->filename, msg, sizeof(msg)))
			job_fail(j, "%s", msg);
		else
			j->verified++;
	}
}

/* Stamps the I/Os queued since the last submit with the time they go in (the reap that follows
 * submits whatever is still queued). */
static void stamp_queued(struct bench_slot **just, unsigned *nq)
{
	uint64_t ts = now_ns();
	for (unsigned i = 0; i < *nq; i++)
		just[i]->t_submit = ts;
	*nq = 0;
}

/* Submits the I/Os queued since the last submit (stamped now); 0, or -1 once the job failed. */
static int submit_queued(struct bench_job *j, struct bench_slot **just, unsigned *nq)
{
	unsigned n = *nq;
	stamp_queued(just, nq);
	int err = ferry_queue_submit(j->q);
	if (err < 0)
		job_fail(j, "submitting %u I/Os on %s failed: %s (%s)", n, j->sh->o->filename,
			 ferry_strerror(err), detail());
	return err < 0 ? -1 : 0;
}

static void job_loop(struct bench_job *j)
{
	struct bench_shared *sh = j->sh;
	const struct bench_job_opts *o = sh->o;
	unsigned depth = sh->depth, nfree = depth, nq;
	struct bench_slot **freel = calloc(depth, sizeof(*freel)), **just = calloc(depth, sizeof(*just));
	void **ud = calloc(depth, sizeof(*ud));
	int64_t *resv = calloc(depth, sizeof(*resv));
	if (!freel || !just || !ud || !resv) {
		job_fail(j, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < depth; i++)
		freel[i] = &j->slots[depth - 1 - i];

	int random = o->rw == BENCH_RANDREAD || o->rw == BENCH_RANDWRITE || o->rw == BENCH_RANDRW;
	uint64_t target = UINT64_MAX, deadline = UINT64_MAX, issued = 0, seq = 0;
	if (o->runtime > 0)
		deadline = j->t_start + (uint64_t)(o->runtime * 1e9);
	else
		target = (o->io_size ? o->io_size : sh->region) / o->bs;
	uint64_t now = j->t_start, base = o->offset + (uint64_t)j->index * o->offset_increment;
	int stop = 0, new_pass = 0;
	struct bench_offsets gen = {0};
	if (random && bench_offsets_init(&gen, sh->nblocks, o->randgen, o->norandommap, &j->rng) < 0) {
		job_fail(j, "cannot allocate the random map of %" PRIu64 " blocks (%" PRIu64 " bytes; "
			 "--norandommap or --random_generator=lfsr need none)",
			 sh->nblocks, sh->nblocks / 8);
		goto out;
	}
	for (;;) {
		nq = 0;
		while (!stop && nfree && issued < target) {
			/* --iodepth_batch_submit N: a submit per N queued, as fio's (1 by default). A group
			 * goes in once the next I/O is to be queued, so that the last goes in with the
			 * reap's wait below, in one system call: at QD1, one io_uring_enter per I/O. */
			if (o->iodepth_batch_submit && nq >= o->iodepth_batch_submit && submit_queued(j, just, &nq)) {
				stop = 1;
				break;
			}
			struct bench_slot *s = freel[--nfree];
			uint64_t blk;
			if (random) {
				blk = bench_offsets_next(&gen, &j->rng, &new_pass);
			} else {
				blk = seq++ % sh->nblocks;
				new_pass = blk == 0 && seq > 1;
			}
			if (new_pass && j->cold_fd >= 0)
				posix_fadvise(j->cold_fd, (off_t)base, (off_t)sh->region, POSIX_FADV_DONTNEED);
			new_pass = 0;
			s->off = base + blk * o->bs;
			if (o->rw == BENCH_RANDRW)
				s->write = bench_rng_below(&j->rng, 100) >= o->rwmixread;
			else
				s->write = bench_rw_writes(o->rw);
			if (s->write && o->verify)
				bench_verify_fill(o->verify, s->buf, o->bs, s->off, o->randseed);
			s->t_queue = now;
			if (o->api_pread) {
				/* one call through the worker pool; depth is 1 */
				s->t_submit = now_ns();
				ssize_t r = s->write ? ferry_pwrite(j->file, s->buf, o->bs, s->off)
					    : j->cz  ? ferry_cz_pread(j->cz, s->buf, o->bs, s->off)
						     : ferry_pread(j->file, s->buf, o->bs, s->off);
				now = now_ns();
				issued++;
				job_complete(j, s, r, now);
				freel[nfree++] = s;
				if (j->failed || now >= deadline ||
				    atomic_load_explicit(&sh->stop, memory_order_relaxed))
					stop = 1;
				continue;
			}
			int err = s->write ? ferry_queue_write(j->q, j->file, s->buf, o->bs, s->off, s)
					   : ferry_queue_read(j->q, j->file, s->buf, o->bs, s->off, s);
			if (err < 0) {
				job_fail(j, "cannot queue a %s at offset %" PRIu64 " of %s: %s (%s)",
					 s->write ? "write" : "read", s->off, o->filename,
					 ferry_strerror(err), detail());
				freel[nfree++] = s;
				stop = 1;
				break;
			}
			just[nq++] = s;
			issued++;
		}
		stamp_queued(just, &nq);
		if (!ferry_queue_pending(j->q) && (!o->api_pread || stop || issued >= target))
			break;
		if (o->api_pread)
			continue;
		/* the reap submits what is queued, in the same system call as its wait */
		int n = ferry_queue_reap(j->q, 1, depth, ud, resv);
		if (n < 0) {
			job_fail(j, "waiting for I/O on %s failed: %s (%s)", o->filename, ferry_strerror(n),
				 detail());
			break;
		}
		now = now_ns();
		for (int i = 0; i < n; i++) {
			struct bench_slot *s = ud[i];
			if (!j->failed)
				job_complete(j, s, resv[i], now);
			freel[nfree++] = s;
		}
		if (j->failed || now >= deadline || atomic_load_explicit(&sh->stop, memory_order_relaxed))
			stop = 1;
	}
	bench_offsets_free(&gen);
out:
	free(freel);
	free(just);
	free(ud);
	free(resv);
}

static void *job_main(void *arg)
{
	struct bench_job *j = arg;
	struct bench_shared *sh = j->sh;
	if (job_setup(j))
		atomic_store(&sh->setup_failed, 1);
	pthread_barrier_wait(&sh->start);
	if (!atomic_load(&sh->setup_failed)) {
		getrusage(RUSAGE_THREAD, &j->ru0);
		j->t_start = now_ns();
		job_loop(j);
		if (sh->o->end_fsync && !j->failed) {
			int err = ferry_file_sync(j->file, 0);
			if (err < 0)
				job_fail(j, "--end_fsync: fsync of %s failed: %s (%s)", sh->o->filename,
					 ferry_strerror(err), detail());
		}
		j->t_end = now_ns();
		getrusage(RUSAGE_THREAD, &j->ru1);
	}
	pthread_barrier_wait(&sh->end);
	ferry_queue_destroy(j->q);
	if (j->index == 0 && j->file)
		ferry_file_path_info(j->file, sh->res->path_info, sizeof(sh->res->path_info));
	ferry_file_destroy(j->file);
	if (j->index == 0 && j->cz)
		ferry_cz_path_info(j->cz, sh->res->cz_info, sizeof(sh->res->cz_info));
	ferry_cz_destroy(j->cz);
	if (j->dev_mem)
		ferry_gpu_free(j->dev_mem);
	if (j->cold_fd >= 0)
		close(j->cold_fd);
	if (j->mem)
		ferry_free_aligned(j->mem, j->memlen);
	free(j->slots);
	return NULL;
}

/* ------------------------------------------------------------------------------------ file setup */

static int err1(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *bench_error_sink;
size_t bench_error_sink_len;

static int err1(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (bench_error_sink) {
		/* -x all collects why a mode cannot run instead of failing */
		vsnprintf(bench_error_sink, bench_error_sink_len, fmt, ap);
		bench_error_sink = NULL;
	} else {
		fprintf(stderr, "ferry bench: ");
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, "\n");
	}
	va_end(ap);
	return 1;
}

/* Writes [0, end) of a file this run created: verify blocks (or random data) of bs in the region. */
static int lay_out(ferry_file *f, const struct bench_job_opts *o, uint64_t end)
{
	size_t chunk = o->bs >= (1u << 20) ? o->bs : (size_t)((1u << 20) / o->bs * o->bs);
	uint8_t *buf = ferry_alloc_aligned(chunk);
	if (!buf)
		return err1("cannot allocate %zu bytes to lay out %s", chunk, o->filename);
	fill_random(buf, chunk, o->randseed);
	uint64_t pos = 0;
	int ret = 0;
	while (pos < end) {
		size_t len = chunk;
		if (pos < o->offset && pos + len > o->offset)
			len = o->offset - pos;
		if (pos + len > end)
			len = end - pos;
		if (o->verify && pos >= o->offset)
			for (size_t b = 0; b + o->bs <= len; b += o->bs)
				bench_verify_fill(o->verify, buf + b, o->bs, pos + b, o->randseed);
		ssize_t n = ferry_pwrite(f, buf, len, pos);
		if (n < 0 || (size_t)n != len) {
			ret = err1("laying out %s failed at offset %" PRIu64 ": %s (%s); removed the "
				   "partial file",
				   o->filename, pos, n < 0 ? ferry_strerror((int)n) : "short write", detail());
			break;
		}
		pos += len;
	}
	if (!ret) {
		int err = ferry_file_sync(f, 0);
		if (err < 0)
			ret = err1("fdatasync of %s failed: %s (%s); removed the partial file",
				   o->filename, ferry_strerror(err), detail());
	}
	ferry_free_aligned(buf, chunk);
	return ret;
}

/* Where the last job's region ends: with --offset_increment each job has its own. */
static uint64_t regions_end(const struct bench_job_opts *o)
{
	return o->offset + (uint64_t)(o->numjobs ? o->numjobs - 1 : 0) * o->offset_increment + o->size;
}

/*
 * Makes sure the file exists and holds the region. A read never changes an existing file; a write
 * creates a missing file but never truncates one. Returns 0 or 1 (message printed).
 */
static int prepare_file(ferry_ctx *ctx, const struct bench_job_opts *o, uint64_t *region,
			int *created, int64_t cz_size)
{
	struct stat st;
	*created = 0;
	/* an object (s3://, http(s)://): read where it is, never created or written (docs/REMOTE.md) */
	int url = !strncasecmp(o->filename, "s3://", 5) || !strncasecmp(o->filename, "http://", 7) ||
		  !strncasecmp(o->filename, "https://", 8);
	if (url && bench_rw_writes(o->rw))
		return err1("%s: a URL is benchmarked for reads only (--rw read or randread)", o->filename);
	if (url || stat(o->filename, &st) == 0) {
		if (url)
			; /* no local file to check */
		else if (S_ISDIR(st.st_mode))
			return err1("%s is a directory; --filename needs a file", o->filename);
		/* opening a FIFO blocks until a writer comes; a socket cannot be opened. Block
		 * devices stay allowed (raw-device benches, as fio's). */
		if (!url && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
			return err1("%s is a %s; --filename needs a regular file or a block device", o->filename,
				    S_ISFIFO(st.st_mode) ? "FIFO (named pipe)" : "socket");
		ferry_file *f;
		int flags = bench_rw_writes(o->rw) ? FERRY_O_RDWR : FERRY_O_RDONLY;
		if (!url)
			flags |= FERRY_O_BUFFERED;
		int err = ferry_file_open(ctx, o->filename, flags, &f);
		if (err < 0)
			return err1("cannot open %s for %s: %s (%s)", o->filename,
				    bench_rw_writes(o->rw) ? "writing" : "reading", ferry_strerror(err),
				    detail());
		int64_t size = cz_size >= 0 ? cz_size : ferry_file_size(f); /* a compressed file: its data's */
		ferry_file_destroy(f);
		if (size < 0)
			return err1("cannot get the size of %s: %s (%s)", o->filename,
				    ferry_strerror((int)size), detail());
		if (bench_rw_reads(o->rw)) {
			if (o->size && (uint64_t)size < regions_end(o)) {
				if (o->offset_increment)
					return err1("file %s is %" PRId64 " bytes, smaller than the regions of %u jobs "
						    "(--offset %" PRIu64 " + %u x --offset_increment %" PRIu64
						    " + --size %" PRIu64 ")",
						    o->filename, size, o->numjobs, o->offset, o->numjobs - 1,
						    o->offset_increment, o->size);
				if (o->offset)
					return err1("file %s is %" PRId64 " bytes, smaller than --offset %" PRIu64
						    " + --size %" PRIu64,
						    o->filename, size, o->offset, o->size);
				return err1("file %s is %" PRId64 " bytes, smaller than --size %" PRIu64,
					    o->filename, size, o->size);
			}
		}
		if (o->size)
			*region = o->size;
		else if ((uint64_t)size > o->offset)
			*region = (uint64_t)size - o->offset;
		else
			return err1("file %s is %" PRId64 " bytes, nothing to do past --offset %" PRIu64
				    "; give --size",
				    o->filename, size, o->offset);
		return 0;
	}
	if (errno != ENOENT)
		return err1("cannot use %s: %s", o->filename, strerror(errno));
	if (!o->size)
		return err1("%s does not exist; give --size to have it created", o->filename);
	ferry_file *f;
	int err = ferry_file_open(ctx, o->filename,
				  FERRY_O_RDWR | FERRY_O_CREAT | FERRY_O_EXCL | FERRY_O_BUFFERED, &f);
	if (err < 0)
		return err1("cannot create %s: %s (%s)", o->filename, ferry_strerror(err), detail());
	*created = 1;
	*region = o->size;
	if (bench_rw_reads(o->rw)) {
		if (!o->quiet) {
			char sz[32];
			fprintf(stderr, "ferry bench: laying out %s (%s)\n", o->filename,
				bench_fmt_size(sz, sizeof(sz), regions_end(o)));
		}
		if (lay_out(f, o, regions_end(o))) {
			ferry_file_destroy(f);
			unlink(o->filename);
			return 1;
		}
	}
	ferry_file_destroy(f);
	return 0;
}

/* Drops the file's cached pages, or all caches with --cold=system as root; without --cold, writes
 * an O_DIRECT run's dirty pages back. Says what it did in done. */
static int make_cold(const struct bench_job_opts *o, char *done, size_t len)
{
	const char *why = NULL;
	if (o->cold == BENCH_COLD_NONE) {
		snprintf(done, len, "none");
		/*
		 * O_DIRECT runs write the file's dirty pages back first, untimed, as fio's default
		 * invalidate=1 does: an O_DIRECT read of a block with a dirty page cannot start at
		 * once, so io_uring hands it to a worker that writes the page first. On a file just
		 * written buffered, that halved a 4 KiB QD1 read (docs/CONFIG.md).
		 */
		int fd = o->direct ? open(o->filename, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
		if (fd >= 0) {
			if (!sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
						       SYNC_FILE_RANGE_WAIT_AFTER))
				snprintf(done, len, "none (O_DIRECT: the file's dirty pages written back first)");
			close(fd);
		}
		return 0;
	}
	if (o->cold == BENCH_COLD_SYSTEM) {
		if (geteuid() != 0) {
			why = "drop_caches needs root";
		} else {
			sync();
			int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
			if (fd >= 0 && write(fd, "3", 1) == 1) {
				close(fd);
				snprintf(done, len, "drop_caches (sync; echo 3 > /proc/sys/vm/drop_caches)");
				return 0;
			}
			why = strerror(errno);
			if (fd >= 0)
				close(fd);
		}
	}
	int fd = open(o->filename, O_RDONLY);
	if (fd < 0)
		return err1("cannot open %s to drop its cached pages: %s", o->filename, strerror(errno));
	/* Dirty pages are not dropped, so write them back first. */
	fdatasync(fd);
	int err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	if (err)
		return err1("posix_fadvise(DONTNEED) on %s failed: %s", o->filename, strerror(err));
	if (why)
		snprintf(done, len, "posix_fadvise(DONTNEED) on the file (system drop failed: %s)", why);
	else
		snprintf(done, len, "posix_fadvise(DONTNEED) on the file");
	return 0;
}

/* ------------------------------------------------------------------------------------------ run */

static int setup_ctx(ferry_ctx **ctxp, const struct bench_job_opts *o)
{
	int err = ferry_ctx_create(ctxp);
	if (err < 0)
		return err1("cannot create a ferry context: %s (%s)", ferry_strerror(err), detail());
	ferry_ctx *ctx = *ctxp;
	err = ferry_ctx_set(ctx, "backend", o->ioengine);
	if (!err)
		err = ferry_ctx_set(ctx, "direct", o->direct == BENCH_DIRECT_AUTO ? "auto" : o->direct ? "on" : "off");
	if (!err) /* `ferry top` shows running benchmarks; a ferry that cannot publish still runs */
		err = ferry_ctx_set(ctx, "publish", "1");
	if (!err && !bench_x_on_gpu(o->xmode)) /* the buffers are ours, and host memory */
		err = ferry_ctx_set(ctx, "memory", "host");
	if (!err && o->xmode != BENCH_X_NONE) {
		err = ferry_ctx_set(ctx, "path", bench_x_names[o->xmode]);
		char dev[16];
		snprintf(dev, sizeof(dev), "%d", bench_job_gpu(o, 0));
		if (!err)
			err = ferry_ctx_set(ctx, "device", dev);
		/* a transfer to device memory goes through one slot: chunks must hold an I/O */
		if (!err && o->bs > (1u << 20) && !o->api_pread) {
			char cs[32];
			snprintf(cs, sizeof(cs), "%llu", (unsigned long long)((o->bs + 4095) / 4096 * 4096));
			err = ferry_ctx_set(ctx, "chunk_size", cs);
		}
	}
	if (err < 0)
		return err1("cannot configure the ferry context (--ioengine %s, --direct %d): %s (%s)",
			    o->ioengine, o->direct, ferry_strerror(err), detail());
	/*
	 * Only --api pread and transfers to GPU memory use the context's workers. A queue job needs
	 * just the backend: starting the workers would make a thread, a ring and pinned slots each
	 * (192 MiB on a 16-core machine) before a run that never uses them
	 * (docs/BENCH.md, "What runs before the timer").
	 */
	const char *start = getenv("FERRY_BENCH_START_WORKERS");
	if (o->api_pread || o->xmode != BENCH_X_NONE || (start && !strcmp(start, "1")))
		err = ferry_ctx_start(ctx);
	else
		err = strcmp(ferry_ctx_backend(ctx), "none") ? 0 : FERRY_EBACKEND;
	if (err < 0) {
		const char *why = ferry_backend_unavailable_reason(o->ioengine);
		return err1("the %s backend cannot run here: %s (%s)", o->ioengine,
			    why && *why ? why : ferry_strerror(err), detail());
	}
	return 0;
}

int bench_run(const struct bench_job_opts *o, struct bench_result *res)
{
	ferry_ctx *ctx = NULL;
	struct bench_shared sh = {.o = o, .res = res};
	struct bench_job *jobs = NULL;
	int ret = 1, created = 0;
	uint64_t region = 0;

	res->opts = *o;
	for (int d = 0; d < 2; d++) {
		bench_hist_init(&res->dir[d].clat);
		bench_hist_init(&res->dir[d].lat);
	}
	if (setup_ctx(&ctx, o))
		goto out;
	snprintf(res->backend, sizeof(res->backend), "%s", ferry_ctx_backend(ctx));
	/* A ferry compressed file read (not --raw): through ferry_cz_pread, one call per I/O (--api
	 * pread's loop), over its uncompressed bytes; the ratio and where it decoded are reported. */
	struct bench_job_opts oc = *o;
	int64_t cz_size = -1;
	if (!o->raw && bench_rw_reads(o->rw) && !bench_rw_writes(o->rw) && !strstr(o->filename, "://") &&
	    ferry_cz_is_compressed(ctx, o->filename) == 1) {
		ferry_cz *z = NULL;
		int err = ferry_cz_open(ctx, o->filename, &z);
		if (err < 0) {
			err1("%s: %s", o->filename, ferry_last_error());
			goto out;
		}
		res->cz_codec = ferry_cz_codec(z);
		res->cz_bytes = cz_size = ferry_cz_size(z);
		res->cz_compressed = ferry_cz_compressed_size(z);
		ferry_cz_destroy(z);
		oc.api_pread = 1;
		res->opts = oc;
		sh.o = o = &oc;
	}
	if (prepare_file(ctx, o, &region, &created, cz_size))
		goto out;
	if (region < o->bs) {
		err1("the region to use of %s (%" PRIu64 " bytes) is smaller than --bs %" PRIu64,
		     o->filename, region, o->bs);
		goto out;
	}
	sh.region = region;
	res->region = region;
	sh.nblocks = region / o->bs;
	sh.depth = o->iodepth;
	if (!strcmp(res->backend, "psync") && sh.depth > 1) {
		static int noted;
		if (!o->quiet && !noted++)
			fprintf(stderr, "ferry bench: note: the psync backend does one I/O at a time per job; "
					"--iodepth %u acts as 1 (as with fio's psync)\n",
				o->iodepth);
		sh.depth = 1;
	}
	res->iodepth = sh.depth;
	if (make_cold(o, res->cold_done, sizeof(res->cold_done)))
		goto out;

	sh.ctx = ctx;
	uint64_t stats0[FERRY_STAT__COUNT];
	for (int k = 0; k < FERRY_STAT__COUNT; k++)
		stats0[k] = ferry_ctx_stat(ctx, (enum ferry_stat)k);
	jobs = calloc(o->numjobs, sizeof(*jobs));
	if (!jobs || pthread_barrier_init(&sh.start, NULL, o->numjobs + 1) ||
	    pthread_barrier_init(&sh.end, NULL, o->numjobs + 1)) {
		err1("out of memory");
		goto out;
	}
	unsigned started = 0;
	for (; started < o->numjobs; started++) {
		jobs[started].sh = &sh;
		jobs[started].index = started;
		jobs[started].cold_fd = -1;
		if (pthread_create(&jobs[started].thread, NULL, job_main, &jobs[started]))
			break;
	}
	if (started < o->numjobs) {
		/* The barriers count every job: without all threads nothing can run. */
		err1("cannot start job thread %u: %s", started, strerror(errno));
		exit(1);
	}
	struct rusage ru0, ru1;
	struct timespec rt;
	pthread_barrier_wait(&sh.start);
	getrusage(RUSAGE_SELF, &ru0);
	clock_gettime(CLOCK_REALTIME, &rt);
	res->timestamp_ms = (int64_t)rt.tv_sec * 1000 + rt.tv_nsec / 1000000;
	pthread_barrier_wait(&sh.end);
	getrusage(RUSAGE_SELF, &ru1);
	for (int k = 0; k < FERRY_STAT__COUNT; k++)
		res->stats[k] = ferry_ctx_stat(ctx, (enum ferry_stat)k) - stats0[k];
	for (unsigned i = 0; i < o->numjobs; i++)
		pthread_join(jobs[i].thread, NULL);
	pthread_barrier_destroy(&sh.start);
	pthread_barrier_destroy(&sh.end);

	ret = 0;
	uint64_t first = UINT64_MAX, last = 0;
	for (unsigned i = 0; i < o->numjobs; i++) {
		struct bench_job *j = &jobs[i];
		if (j->failed) {
			if (!ret)
				err1("%s", j->msg);
			ret = 1;
			continue;
		}
		if (ret)
			continue;
		for (int d = 0; d < 2; d++) {
			res->dir[d].bytes += j->dir[d].bytes;
			res->dir[d].ios += j->dir[d].ios;
			bench_hist_merge(&res->dir[d].clat, &j->dir[d].clat);
			bench_hist_merge(&res->dir[d].lat, &j->dir[d].lat);
		}
		if (j->t_start < first)
			first = j->t_start;
		if (j->t_end > last)
			last = j->t_end;
		res->job_runtime_ns += j->t_end - j->t_start;
		res->usr_s += tv_s(j->ru1.ru_utime) - tv_s(j->ru0.ru_utime);
		res->sys_s += tv_s(j->ru1.ru_stime) - tv_s(j->ru0.ru_stime);
		res->ctxsw += (uint64_t)(j->ru1.ru_nvcsw - j->ru0.ru_nvcsw + j->ru1.ru_nivcsw - j->ru0.ru_nivcsw);
		res->majf += (uint64_t)(j->ru1.ru_majflt - j->ru0.ru_majflt);
		res->minf += (uint64_t)(j->ru1.ru_minflt - j->ru0.ru_minflt);
		res->verified += j->verified;
		if (i == 0)
			res->direct = j->direct;
	}
	res->wall_ns = last > first ? last - first : 0;
	for (unsigned g = 0; !ret && g < o->ngpus; g++) {
		uint64_t f = UINT64_MAX, l = 0;
		struct bench_gpu_part *p = &res->part[g];
		for (unsigned i = g; i < o->numjobs; i += o->ngpus) {
			p->bytes += jobs[i].dir[0].bytes + jobs[i].dir[1].bytes;
			p->ios += jobs[i].dir[0].ios + jobs[i].dir[1].ios;
			if (jobs[i].t_start < f)
				f = jobs[i].t_start;
			if (jobs[i].t_end > l)
				l = jobs[i].t_end;
		}
		p->wall_ns = l > f ? l - f : 0;
	}
	res->self_cpu_s = tv_s(ru1.ru_utime) + tv_s(ru1.ru_stime) - tv_s(ru0.ru_utime) - tv_s(ru0.ru_stime);
out:
	free(jobs);
	ferry_ctx_destroy(ctx);
	/* A write run that failed leaves no file it created itself; reads keep their laid-out file. */
	if (ret && created && bench_rw_writes(o->rw) && !bench_rw_reads(o->rw))
		unlink(o->filename);
	return ret;
}

int bench_job_gpu(const struct bench_job_opts *o, unsigned job)
{
	return o->ngpus ? o->gpus[job % o->ngpus] : o->gpu;
}

const char *const bench_x_names[BENCH_X_COUNT] = {"none", "gds", "cpu", "cpu-gpu", "cpu-async-gpu",
						   "pagecache-gpu", "gds-async", "gds-batch", "auto"};

int bench_x_on_gpu(int xmode)
{
	return xmode != BENCH_X_NONE && xmode != BENCH_X_CPU;
}
