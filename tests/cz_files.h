/* Helpers of the compressed-file tests and bench (tests/unit/test_cz_read.c, tests/gpu/test_cz_bench.c,
 * tests/unit/test_compress_device.c): a monotonic clock, whether a file is in the page cache, a
 * file read into it and dropped from it, a file written durably, a file compressed by ferry's
 * writer, and a plain file's timed read. */
#ifndef FERRY_TEST_CZ_FILES_H
#define FERRY_TEST_CZ_FILES_H

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "ferry/compress.h"
#include "ferry_test.h"

static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Whether every page of the file is in the page cache (mincore). */
static inline int resident(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	T_ASSERT(fd >= 0 && fstat(fd, &st) == 0);
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = ((size_t)st.st_size + pg - 1) / pg;
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	unsigned char *v = malloc(np);
	T_ASSERT(m != MAP_FAILED && v && mincore(m, (size_t)st.st_size, v) == 0);
	size_t in = 0;
	for (size_t k = 0; k < np; k++)
		in += v[k] & 1;
	munmap(m, (size_t)st.st_size);
	free(v);
	close(fd);
	return in == np;
}

/* The file read through the page cache (it stays there). */
static inline void load(const char *path)
{
	char buf[1 << 16];
	int fd = open(path, O_RDONLY);
	T_ASSERT(fd >= 0);
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
}

/* The file's pages out of the page cache (written back first). */
static inline void drop(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd >= 0) {
		fdatasync(fd);
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

static inline void put(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f && fwrite(data, 1, n, f) == n);
	fflush(f);
	fsync(fileno(f));
	fclose(f);
}

static inline void compress(const char *path, int codec, const char *chunk, const void *data, size_t n)
{
	ferry_cz_writer *w;
	T_ASSERT(ferry_cz_writer_create(path, codec, 0, &w) == 0);
	T_ASSERT(ferry_cz_writer_set(w, "cz_chunk", chunk) == 0);
	T_ASSERT(ferry_cz_writer_write(w, data, n) == 0);
	T_ASSERT(ferry_cz_writer_commit(w) > 0);
	ferry_cz_writer_destroy(w);
}

/* Seconds of one ferry_pread of n bytes of path into buf (host or device memory), pages dropped
 * first when cold; -1 when it came back short. */
static inline double plain_read(ferry_ctx *ctx, const char *path, void *buf, size_t n, int cold)
{
	ferry_file *f;
	if (cold)
		drop(path);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	double t = now();
	ssize_t r = ferry_pread(f, buf, n, 0);
	t = now() - t;
	ferry_file_destroy(f);
	return r == (ssize_t)n ? t : -1;
}

#endif
