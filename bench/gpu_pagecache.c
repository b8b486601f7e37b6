/*
 * Which design reads page-cache-resident data into GPU memory fastest (DESIGN.md decision 5)?
 * Measured on one warm file, in one run, beside the machine's pinned copy ceiling:
 *   ceiling   cuMemcpyHtoD from a pinned buffer (and DtoH into it)
 *   pageable  cuMemcpyHtoD straight from an mmap of the file (the driver stages it)
 *   A         ferry's engine: parallel reads into pinned slots, async copies (threads x chunk x direct)
 *   B         mmap the range, cuMemHostRegister it (read-only), copy directly, unregister; pieces
 *             spread over threads, each with its own stream
 * and what bounds design A, each half alone (limits):
 *   dma       T threads, each copying chunk-sized pieces of its own pinned slots on its own stream
 *             (no reads): the chunked DMA ceiling
 *   cpu       T threads pread-ing chunks of the file into pinned slots (no copies to the GPU)
 *   B-par     registering pieces with T threads at once, each piece copied as soon as it is
 *             registered, every unregistration after the last copy (timed apart)
 * Usage: gpu_pagecache FILE [GiB] [limits]   (FILE is created if missing; put it on tmpfs for a
 * warm cache; "limits": only the ceiling and the limits above)
 * Prints "TABLE name | GB/s | note" rows (scripts/gpu-check.sh collects them).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "gpu/shim.h"

static const struct ferry__cuda_api *cu;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

#define CK(call)                                                                     \
	do {                                                                         \
		ferry__CUresult r_ = (call);                                         \
		if (r_) {                                                            \
			fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
				ferry__cuda_err_name(r_));                           \
			exit(1);                                                     \
		}                                                                    \
	} while (0)

static void ceiling(size_t size)
{
	void *h;
	ferry__CUdeviceptr d;
	double t[5], u[5];

	CK(cu->MemHostAlloc(&h, size, FERRY__CU_MEMHOSTALLOC_PORTABLE));
	CK(cu->MemAlloc(&d, size));
	memset(h, 1, size);
	CK(cu->MemcpyHtoD(d, h, size));
	for (int i = 0; i < 5; i++) {
		double a = now();
		CK(cu->MemcpyHtoD(d, h, size));
		t[i] = now() - a;
		a = now();
		CK(cu->MemcpyDtoH(h, d, size));
		u[i] = now() - a;
	}
	qsort(t, 5, sizeof(double), cmp);
	qsort(u, 5, sizeof(double), cmp);
	printf("TABLE ceiling pinned HtoD %zu MiB | %.1f GB/s | median of 5\n", size >> 20, size / t[2] / 1e9);
	printf("TABLE ceiling pinned DtoH %zu MiB | %.1f GB/s | median of 5\n", size >> 20, size / u[2] / 1e9);
	CK(cu->MemFree(d));
	CK(cu->MemFreeHost(h));
}

static void pageable(const char *path, size_t size, ferry__CUdeviceptr d)
{
	int fd = open(path, O_RDONLY);
	void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	double t[3];

	for (int i = 0; i < 3; i++) {
		double a = now();
		CK(cu->MemcpyHtoD(d, m, size));
		t[i] = now() - a;
	}
	qsort(t, 3, sizeof(double), cmp);
	printf("TABLE pagecache pageable cuMemcpyHtoD(mmap) | %.1f GB/s | median of 3\n", size / t[1] / 1e9);
	munmap(m, size);
	close(fd);
}

static void design_a(const char *path, size_t size, void *dev, const char *threads, const char *chunk,
		     const char *direct)
{
	ferry_ctx *ctx;
	ferry_file *f;
	double t[3], c[3];

	if (ferry_ctx_create(&ctx) || ferry_ctx_set(ctx, "threads", threads) ||
	    ferry_ctx_set(ctx, "chunk_size", chunk) || ferry_ctx_set(ctx, "direct", direct) ||
	    ferry_ctx_set(ctx, "slots", "8") || ferry_file_open(ctx, path, FERRY_O_RDONLY, &f)) {
		fprintf(stderr, "design A setup: %s\n", ferry_last_error());
		exit(1);
	}
	/* warm up: workers, rings, slot registration, streams */
	if (ferry_pread(f, dev, 64u << 20, 0) != (ssize_t)(64u << 20)) {
		fprintf(stderr, "design A warm-up: %s\n", ferry_last_error());
		exit(1);
	}
	for (int i = 0; i < 3; i++) {
		double a = now(), ca = cpu_seconds();
		ssize_t n = ferry_pread(f, dev, size, 0);
		t[i] = now() - a;
		c[i] = cpu_seconds() - ca;
		if (n != (ssize_t)size) {
			fprintf(stderr, "design A read: %zd: %s\n", n, ferry_last_error());
			exit(1);
		}
	}
	qsort(t, 3, sizeof(double), cmp);
	qsort(c, 3, sizeof(double), cmp);
	printf("TABLE A ferry threads=%s chunk=%s direct=%s | %.1f GB/s | %.2f cores\n", threads, chunk,
	       direct, size / t[1] / 1e9, c[1] / t[1]);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
}

struct b_job {
	const char *map;
	size_t size, piece;
	ferry__CUdeviceptr dev;
	size_t next; /* shared cursor */
	pthread_mutex_t mu;
	double reg, copy, unreg; /* summed seconds */
	int flags;
};

static void *b_worker(void *arg)
{
	struct b_job *j = arg;
	ferry__CUstream s;

	ferry__cuda_set_device(0);
	CK(cu->StreamCreate(&s, FERRY__CU_STREAM_NON_BLOCKING));
	for (;;) {
		pthread_mutex_lock(&j->mu);
		size_t off = j->next;
		j->next += j->piece;
		pthread_mutex_unlock(&j->mu);
		if (off >= j->size)
			break;
		size_t n = j->size - off < j->piece ? j->size - off : j->piece;
		double a = now();
		CK(cu->MemHostRegister((void *)(j->map + off), n, j->flags));
		double b = now();
		CK(cu->MemcpyHtoDAsync(j->dev + off, j->map + off, n, s));
		CK(cu->StreamSynchronize(s));
		double c = now();
		CK(cu->MemHostUnregister((void *)(j->map + off)));
		double d = now();
		pthread_mutex_lock(&j->mu);
		j->reg += b - a;
		j->copy += c - b;
		j->unreg += d - c;
		pthread_mutex_unlock(&j->mu);
	}
	cu->StreamDestroy(s);
	return NULL;
}

static void design_b(const char *path, size_t size, ferry__CUdeviceptr dev, size_t piece, int threads)
{
	int fd = open(path, O_RDONLY);
	char *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	double t[3], c[3];
	struct b_job j;
	pthread_t th[32];

	for (int r = 0; r < 3; r++) {
		memset(&j, 0, sizeof(j));
		pthread_mutex_init(&j.mu, NULL);
		j.map = m;
		j.size = size;
		j.piece = piece;
		j.dev = dev;
		j.flags = FERRY__CU_MEMHOSTREGISTER_READ_ONLY | FERRY__CU_MEMHOSTREGISTER_PORTABLE;
		double a = now(), ca = cpu_seconds();
		for (int i = 0; i < threads; i++)
			pthread_create(&th[i], NULL, b_worker, &j);
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		t[r] = now() - a;
		c[r] = cpu_seconds() - ca;
	}
	qsort(t, 3, sizeof(double), cmp);
	qsort(c, 3, sizeof(double), cmp);
	printf("TABLE B mmap+register piece=%zuM threads=%d | %.1f GB/s | %.2f cores; last run: register %.0f ms, copy %.0f ms, unregister %.0f ms (summed over threads)\n",
	       piece >> 20, threads, size / t[1] / 1e9, c[1] / t[1], j.reg * 1e3, j.copy * 1e3, j.unreg * 1e3);
	munmap(m, size);
	close(fd);
}

/* ------------------------------------------------------------------------------------- limits */

struct lim_job {
	int fd;
	const char *map;
	size_t size, chunk;
	ferry__CUdeviceptr dev;
	size_t next; /* shared cursor */
	pthread_mutex_t mu;
	int mode;    /* 0 dma, 1 cpu, 2 register+copy */
	double reg;  /* summed register seconds (mode 2) */
	pthread_barrier_t go; /* the threads' set-up is not timed */
	int nstreams;         /* mode 0: streams shared by the threads (0: one each) */
	int wait;             /* mode 0: 0 spin in cuEventSynchronize, 1 blocking-sync events, 2 query + 5 us sleeps */
	ferry__CUstream shared[4];
};

static size_t lim_take(struct lim_job *j)
{
	pthread_mutex_lock(&j->mu);
	size_t off = j->next;
	j->next += j->chunk;
	pthread_mutex_unlock(&j->mu);
	return off;
}

static void *lim_worker(void *arg)
{
	struct lim_job *j = arg;
	enum { SLOTS = 4 };
	ferry__CUstream s;
	ferry__CUevent ev[SLOTS];
	char *slot;
	unsigned k = 0;

	ferry__cuda_set_device(0);
	CK(cu->StreamCreate(&s, FERRY__CU_STREAM_NON_BLOCKING));
	ferry__CUstream cs = s;
	if (j->nstreams) {
		pthread_mutex_lock(&j->mu);
		cs = j->shared[j->next++ % (size_t)j->nstreams]; /* next is 0 again after the barrier */
		pthread_mutex_unlock(&j->mu);
	}
	CK(cu->MemHostAlloc((void **)&slot, j->chunk * SLOTS, FERRY__CU_MEMHOSTALLOC_PORTABLE));
	memset(slot, 1, j->chunk * SLOTS);
	for (int i = 0; i < SLOTS; i++)
		CK(cu->EventCreate(&ev[i], FERRY__CU_EVENT_DISABLE_TIMING |
						   (j->wait == 1 ? FERRY__CU_EVENT_BLOCKING_SYNC : 0)));
	pthread_barrier_wait(&j->go);
	pthread_barrier_wait(&j->go);
	for (size_t off; (off = lim_take(j)) < j->size; k++) {
		size_t n = j->size - off < j->chunk ? j->size - off : j->chunk;
		char *b = slot + (k % SLOTS) * j->chunk;
		if (j->mode == 1) {
			if (pread(j->fd, b, n, (off_t)off) != (ssize_t)n)
				exit(1);
			continue;
		}
		if (j->mode == 2) {
			double a = now();
			CK(cu->MemHostRegister((void *)(j->map + off), n, FERRY__CU_MEMHOSTREGISTER_READ_ONLY |
										FERRY__CU_MEMHOSTREGISTER_PORTABLE));
			double r = now() - a;
			pthread_mutex_lock(&j->mu);
			j->reg += r;
			pthread_mutex_unlock(&j->mu);
			CK(cu->MemcpyHtoDAsync(j->dev + off, j->map + off, n, s));
			continue;
		}
		if (k >= SLOTS && j->wait == 2) {
			ferry__CUresult q;
			while ((q = cu->EventQuery(ev[k % SLOTS])) == FERRY__CUDA_ERROR_NOT_READY)
				usleep(5);
			CK(q);
		} else if (k >= SLOTS) {
			CK(cu->EventSynchronize(ev[k % SLOTS]));
		}
		CK(cu->MemcpyHtoDAsync(j->dev + off, b, n, cs));
		CK(cu->EventRecord(ev[k % SLOTS], cs));
	}
	CK(cu->StreamSynchronize(cs));
	for (int i = 0; i < SLOTS; i++)
		cu->EventDestroy(ev[i]);
	cu->MemFreeHost(slot);
	cu->StreamDestroy(s);
	return NULL;
}

static void limit_w(const char *path, size_t size, ferry__CUdeviceptr dev, int mode, int threads, size_t chunk,
		    int nstreams, int wait)
{
	static const char *const names[] = {"dma (pinned slots -> GPU, no reads)",
					    "cpu (pread into pinned slots, no copies)",
					    "B-par (register pieces in parallel, copy each, unregister at the end)"};
	int fd = open(path, O_RDONLY);
	char *m = mode == 2 ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	double t[3], c[3], un = 0, reg = 0;
	pthread_t th[64];

	for (int r = 0; r < 3; r++) {
		struct lim_job j = {.fd = fd, .map = m, .size = size, .chunk = chunk, .dev = dev, .mode = mode,
				    .nstreams = nstreams, .wait = wait};
		for (int i = 0; i < nstreams; i++)
			CK(cu->StreamCreate(&j.shared[i], FERRY__CU_STREAM_NON_BLOCKING));
		pthread_mutex_init(&j.mu, NULL);
		pthread_barrier_init(&j.go, NULL, (unsigned)threads + 1);
		for (int i = 0; i < threads; i++)
			pthread_create(&th[i], NULL, lim_worker, &j);
		pthread_barrier_wait(&j.go);
		j.next = 0;
		pthread_barrier_wait(&j.go);
		double a = now(), ca = cpu_seconds();
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		t[r] = now() - a;
		if (mode == 2) {
			double u = now();
			for (size_t off = 0; off < size; off += chunk)
				CK(cu->MemHostUnregister((void *)(m + off)));
			un = now() - u;
			reg = j.reg;
		}
		c[r] = cpu_seconds() - ca;
		for (int i = 0; i < nstreams; i++)
			cu->StreamDestroy(j.shared[i]);
		pthread_mutex_destroy(&j.mu);
		pthread_barrier_destroy(&j.go);
	}
	qsort(t, 3, sizeof(double), cmp);
	qsort(c, 3, sizeof(double), cmp);
	if (mode == 2)
		printf("TABLE limit %s threads=%d piece=%zuM | %.1f GB/s | without the unregistering; last run: "
		       "register %.0f ms summed over threads, unregister %.0f ms after (%.1f GB/s with it)\n",
		       names[mode], threads, chunk >> 20, size / t[1] / 1e9, reg * 1e3, un * 1e3,
		       size / (t[1] + un) / 1e9);
	else
		printf("TABLE limit %s threads=%d chunk=%zuK streams=%s%d%s | %.1f GB/s | %.2f cores\n", names[mode],
		       threads, chunk >> 10, nstreams ? "shared " : "", nstreams ? nstreams : threads,
		       mode ? "" : wait == 1 ? " wait=blocking" : wait == 2 ? " wait=query+sleep" : " wait=spin",
		       size / t[1] / 1e9, c[1] / t[1]);
	if (m)
		munmap(m, size);
	close(fd);
}

/*
 * Design A with copy units: the threads pread 1 MiB pieces of the file into a small ring of
 * pinned units (nunits x unit bytes); the thread that lands a unit's last piece copies the whole
 * unit to the GPU (one copy per unit, on one shared stream or its own). Compared with the same
 * threads each copying their own 1 MiB slots (mode own), in the same process.
 */
struct unit {
	char *buf;
	ferry__CUevent ev;
	atomic_int left;         /* pieces not yet read in this round */
	atomic_long issued;      /* last round whose copy was issued */
};

struct unit_job {
	int fd;
	size_t size, unit, piece;
	int nunits, own_streams;
	ferry__CUdeviceptr dev;
	struct unit *u;
	ferry__CUstream shared;
	pthread_mutex_t mu;
	size_t next;
	pthread_barrier_t go;
};

static void *unit_worker(void *arg)
{
	struct unit_job *j = arg;
	size_t ppu = j->unit / j->piece;
	ferry__CUstream s;

	ferry__cuda_set_device(0);
	CK(cu->StreamCreate(&s, FERRY__CU_STREAM_NON_BLOCKING));
	ferry__CUstream cs = j->own_streams ? s : j->shared;
	pthread_barrier_wait(&j->go);
	for (;;) {
		pthread_mutex_lock(&j->mu);
		size_t p = j->next++;
		pthread_mutex_unlock(&j->mu);
		size_t off = p * j->piece;
		if (off >= j->size)
			break;
		size_t ui = p / ppu; /* unit number over the file */
		struct unit *u = &j->u[ui % (size_t)j->nunits];
		long round = (long)(ui / (size_t)j->nunits);
		while (atomic_load(&u->issued) < round - 1) /* the unit's previous round still being read */
			sched_yield();
		if (round > 0)
			CK(cu->EventSynchronize(u->ev)); /* and its copy done */
		size_t n = j->size - off < j->piece ? j->size - off : j->piece;
		if (pread(j->fd, u->buf + (p % ppu) * j->piece, n, (off_t)off) != (ssize_t)n)
			exit(1);
		size_t uoff = ui * j->unit;
		int pieces = (int)((j->size - uoff < j->unit ? j->size - uoff : j->unit) + j->piece - 1) / (int)j->piece;
		if (atomic_fetch_add(&u->left, 1) + 1 == pieces) {
			size_t un = j->size - uoff < j->unit ? j->size - uoff : j->unit;
			CK(cu->MemcpyHtoDAsync(j->dev + uoff, u->buf, un, cs));
			CK(cu->EventRecord(u->ev, cs));
			atomic_store(&u->left, 0);
			atomic_store(&u->issued, round);
		}
	}
	CK(cu->StreamSynchronize(s));
	CK(cu->StreamSynchronize(j->shared));
	cu->StreamDestroy(s);
	return NULL;
}

static void units(const char *path, size_t size, ferry__CUdeviceptr dev, int threads, size_t unit, int nunits,
		  int own_streams)
{
	int fd = open(path, O_RDONLY);
	double t[3], c[3];
	pthread_t th[64];
	struct unit u[64];

	for (int i = 0; i < nunits; i++) {
		CK(cu->MemHostAlloc((void **)&u[i].buf, unit, FERRY__CU_MEMHOSTALLOC_PORTABLE));
		memset(u[i].buf, 0, unit);
		CK(cu->EventCreate(&u[i].ev, FERRY__CU_EVENT_DISABLE_TIMING));
	}
	for (int r = 0; r < 3; r++) {
		struct unit_job j = {.fd = fd, .size = size, .unit = unit, .piece = 1u << 20, .nunits = nunits,
				     .own_streams = own_streams, .dev = dev, .u = u};
		for (int i = 0; i < nunits; i++) {
			atomic_store(&u[i].left, 0);
			atomic_store(&u[i].issued, -1);
		}
		CK(cu->StreamCreate(&j.shared, FERRY__CU_STREAM_NON_BLOCKING));
		pthread_mutex_init(&j.mu, NULL);
		pthread_barrier_init(&j.go, NULL, (unsigned)threads + 1);
		for (int i = 0; i < threads; i++)
			pthread_create(&th[i], NULL, unit_worker, &j);
		pthread_barrier_wait(&j.go);
		double a = now(), ca = cpu_seconds();
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		t[r] = now() - a;
		c[r] = cpu_seconds() - ca;
		cu->StreamDestroy(j.shared);
		pthread_mutex_destroy(&j.mu);
		pthread_barrier_destroy(&j.go);
	}
	qsort(t, 3, sizeof(double), cmp);
	qsort(c, 3, sizeof(double), cmp);
	printf("TABLE units: threads=%d read 1 MiB pieces into %d x %zu MiB pinned units, one copy per unit on %s | "
	       "%.1f GB/s | %.2f cores\n", threads, nunits, unit >> 20, own_streams ? "the last reader's stream" :
	       "one shared stream", size / t[1] / 1e9, c[1] / t[1]);
	for (int i = 0; i < nunits; i++) {
		cu->EventDestroy(u[i].ev);
		cu->MemFreeHost(u[i].buf);
	}
	close(fd);
}

static void limit_s(const char *path, size_t size, ferry__CUdeviceptr dev, int mode, int threads, size_t chunk,
		    int nstreams)
{
	limit_w(path, size, dev, mode, threads, chunk, nstreams, 0);
}

static void limit(const char *path, size_t size, ferry__CUdeviceptr dev, int mode, int threads, size_t chunk)
{
	limit_s(path, size, dev, mode, threads, chunk, 0);
}

int main(int argc, char **argv)
{
	char why[512];
	const char *path = argc > 1 ? argv[1] : "/dev/shm/ferry-pagecache-probe";
	size_t size = (size_t)(argc > 2 ? atof(argv[2]) : 4) * (1u << 30);
	struct stat st;
	void *dev;

	if (!ferry_gpu_available(why, sizeof(why))) {
		printf("skipped: no usable GPU: %s\n", why);
		return 77;
	}
	cu = ferry__cuda();
	ferry__cuda_set_device(0);
	if (stat(path, &st) || (size_t)st.st_size < size) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		size_t piece = 64u << 20;
		char *buf = malloc(piece);
		for (size_t i = 0; i < piece; i++)
			buf[i] = (char)(i * 2654435761u >> 13);
		for (size_t off = 0; off < size; off += piece)
			if (pwrite(fd, buf, piece, (off_t)off) != (ssize_t)piece)
				return 1;
		close(fd);
		free(buf);
	}
	if (ferry_gpu_malloc(0, size, &dev)) {
		fprintf(stderr, "%s\n", ferry_last_error());
		return 1;
	}
	ceiling(1u << 30);
	if (argc > 3 && !strcmp(argv[3], "limits")) {
		ferry__CUdeviceptr d = (ferry__CUdeviceptr)(uintptr_t)dev;
		int th[] = {4, 8, 12, 16};
		for (int i = 0; i < 4; i++)
			limit(path, size, d, 0, th[i], 1u << 20);
		limit(path, size, d, 0, 8, 4u << 20);
		limit(path, size, d, 0, 8, 256u << 10);
		/* fewer streams: one thread's, or the threads sharing one or two */
		size_t ch[] = {1u << 20, 4u << 20, 16u << 20};
		for (int i = 0; i < 3; i++)
			limit(path, size, d, 0, 1, ch[i]);
		limit(path, size, d, 0, 2, 1u << 20);
		limit(path, size, d, 0, 2, 4u << 20);
		limit_s(path, size, d, 0, 8, 1u << 20, 1);
		limit_s(path, size, d, 0, 8, 1u << 20, 2);
		limit_s(path, size, d, 0, 8, 4u << 20, 1);
		limit_s(path, size, d, 0, 12, 1u << 20, 1);
		/* copy units, against design A's own-slot pipeline (ferry, same file) */
		units(path, size, d, 12, 4u << 20, 8, 0);
		units(path, size, d, 12, 4u << 20, 8, 1);
		units(path, size, d, 12, 4u << 20, 4, 0);
		units(path, size, d, 12, 8u << 20, 4, 0);
		units(path, size, d, 16, 4u << 20, 8, 0);
		units(path, size, d, 8, 4u << 20, 8, 0);
		units(path, size, d, 12, 2u << 20, 16, 0);
		design_a(path, size, dev, "12", "1m", "auto");
		design_a(path, size, dev, "8", "1m", "auto");
		/* how the threads wait for their copies */
		limit_w(path, size, d, 0, 8, 1u << 20, 0, 1);
		limit_w(path, size, d, 0, 8, 1u << 20, 0, 2);
		limit_w(path, size, d, 0, 8, 4u << 20, 0, 1);
		limit_w(path, size, d, 0, 12, 1u << 20, 0, 2);
		for (int i = 0; i < 4; i++)
			limit(path, size, d, 1, th[i], 1u << 20);
		limit(path, size, d, 2, 4, 64u << 20);
		limit(path, size, d, 2, 8, 64u << 20);
		limit(path, size, d, 2, 8, 16u << 20);
		ferry_gpu_free(dev);
		return 0;
	}
	pageable(path, size, (ferry__CUdeviceptr)(uintptr_t)dev);
	const char *threads[] = {"4", "8", "16"}, *chunks[] = {"1m", "4m"}, *directs[] = {"off", "on"};
	for (int d = 0; d < 2; d++)
		for (int t = 0; t < 3; t++)
			for (int c = 0; c < 2; c++)
				design_a(path, size, dev, threads[t], chunks[c], directs[d]);
	size_t pieces[] = {16u << 20, 64u << 20, 256u << 20};
	int bthreads[] = {1, 4, 8};
	for (int p = 0; p < 3; p++)
		for (int t = 0; t < 3; t++)
			design_b(path, size, (ferry__CUdeviceptr)(uintptr_t)dev, pieces[p], bthreads[t]);
	ferry_gpu_free(dev);
	return 0;
}
