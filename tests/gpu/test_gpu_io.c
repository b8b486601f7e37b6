/*
 * Storage <-> device memory through every transfer mode (GPU machine only): random data, what lands
 * in device memory compared with the file, unaligned offsets, lengths and device addresses, sizes
 * that are not a multiple of the chunk, many concurrent requests, forced fallbacks, 0 and 1 byte,
 * and a file of several GiB. GDS modes must either work or fail with FERRY_ENOGDS and a reason.
 *   test_gpu_io [big-file-GiB [big]]   (default 3; 0 skips the big case; "big": only the big case,
 *   with the knobs from FERRY_* variables, to compare settings)
 */
#include <fcntl.h>
#include <time.h>

#include "ferry_test.h"
#include "ferry/ferry.h"
#include "ferry/gpu.h"

#define SIZE ((48u << 20) + 12345u)

static unsigned char *expect;
static uint64_t seed = 7;
static const char *cached_io = "thread"; /* who copies page-cache-resident chunks */
static const char *copy_unit = "8m", *copy_units = "4"; /* copy units of resident reads */

static ferry_ctx *make_ctx(const char *path, const char *direct)
{
	ferry_ctx *ctx;

	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "path", path) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "direct", direct) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "chunk_size", "1m") == 0);
	T_ASSERT(ferry_ctx_set(ctx, "cached_io", cached_io) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "copy_unit", copy_unit) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "copy_units", copy_units) == 0);
	return ctx;
}

static void make_file(const char *p)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	T_ASSERT(write(fd, expect, SIZE) == (ssize_t)SIZE);
	fsync(fd);
	close(fd);
}

/* Copies device memory back and compares with the file's bytes at off. */
static int dev_equals(const unsigned char *dev, size_t len, uint64_t off, const char *what)
{
	unsigned char *h = malloc(len ? len : 1);
	T_ASSERT(h);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(h, dev, len), 0);
	int ok = memcmp(h, expect + off, len) == 0;
	if (!ok) {
		size_t i = 0;
		while (h[i] == expect[off + i])
			i++;
		fprintf(stderr, "%s: device data differs from the file at byte %zu of %zu (file offset %llu)\n",
			what, i, len, (unsigned long long)(off + i));
		t_failures++;
	}
	free(h);
	return ok;
}

static void reads(const char *file, const char *path, const char *direct)
{
	ferry_ctx *ctx = make_ctx(path, direct);
	ferry_file *f;
	unsigned char *dev;
	char info[1024];

	T_ASSERT(ferry_file_open(ctx, file, FERRY_O_RDONLY, &f) == 0);
	T_ASSERT(ferry_gpu_malloc(0, SIZE + 8192, (void **)&dev) == 0);
	/* the whole file, at an odd device address */
	ssize_t n = ferry_pread(f, dev + 3, SIZE, 0);
	if (n < 0 && !strncmp(path, "gds", 3)) {
		/* GDS may be refused here: it must say why, as an ENOGDS error */
		T_EQ_INT(n, FERRY_ENOGDS);
		T_CHECK(strstr(ferry_last_error(), "GDS") || strstr(ferry_last_error(), "cuFile"));
		printf("  path=%-14s direct=%-4s %s: refused as expected here: %s\n", path, direct, file,
		       ferry_last_error());
		goto out;
	}
	T_EQ_INT(n, SIZE);
	dev_equals(dev + 3, SIZE, 0, path);
	ferry_file_path_info(f, info, sizeof(info));
	printf("  path=%-14s direct=%-4s %s\n    %s\n", path, direct, file, info);
	/* random unaligned ranges, 0 and 1 byte, past the end */
	for (int i = 0; i < 40; i++) {
		uint64_t off = t_rand(&seed) % SIZE;
		size_t len = i == 0 ? 0 : i == 1 ? 1 : (size_t)(t_rand(&seed) % (5u << 20));
		size_t skew = (size_t)(t_rand(&seed) % 4096);
		size_t want = off + len > SIZE ? SIZE - off : len;
		T_EQ_INT(ferry_pread(f, dev + skew, len, off), want);
		dev_equals(dev + skew, want, off, path);
	}
	/* many concurrent requests */
	enum { N = 64 };
	ferry_req *r[N];
	uint64_t offs[N];
	size_t lens[N];
	unsigned char *bufs;
	T_ASSERT(ferry_gpu_malloc(0, (size_t)N << 20, (void **)&bufs) == 0);
	for (int i = 0; i < N; i++) {
		offs[i] = t_rand(&seed) % (SIZE - (1u << 20));
		lens[i] = (size_t)(t_rand(&seed) % (1u << 20)) + 1;
		T_ASSERT(ferry_pread_async(f, bufs + ((size_t)i << 20), lens[i], offs[i], &r[i]) == 0);
	}
	for (int i = 0; i < N; i++) {
		T_EQ_INT(ferry_req_wait(r[i], -1), lens[i]);
		ferry_req_destroy(r[i]);
		dev_equals(bufs + ((size_t)i << 20), lens[i], offs[i], "concurrent");
	}
	ferry_gpu_free(bufs);
	/* concurrent requests of several chunks each: copy units of several requests in flight */
	enum { NB = 16 };
	T_ASSERT(ferry_gpu_malloc(0, (size_t)NB * (7u << 20), (void **)&bufs) == 0);
	for (int i = 0; i < NB; i++) {
		lens[i] = (size_t)(t_rand(&seed) % (6u << 20)) + (1u << 20) + 1;
		offs[i] = t_rand(&seed) % (SIZE - lens[i]);
		T_ASSERT(ferry_pread_async(f, bufs + (size_t)i * (7u << 20), lens[i], offs[i], &r[i]) == 0);
	}
	for (int i = 0; i < NB; i++) {
		T_EQ_INT(ferry_req_wait(r[i], -1), lens[i]);
		ferry_req_destroy(r[i]);
		dev_equals(bufs + (size_t)i * (7u << 20), lens[i], offs[i], "concurrent, several chunks");
	}
	ferry_gpu_free(bufs);
	/* a batch */
	ferry_batch *b;
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	for (int i = 0; i < 16; i++)
		T_EQ_INT(ferry_batch_add_read(b, f, (uint64_t)i * 3000001u, 1000003, dev + (size_t)i * 1000003), i);
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), 0);
	for (int i = 0; i < 16; i++)
		dev_equals(dev + (size_t)i * 1000003, 1000003, (uint64_t)i * 3000001u, "batch");
	ferry_batch_destroy(b);
	/* the file was just written, so direct=auto finds it resident and reads it from the cache */
	if (!strcmp(direct, "auto") && (!strcmp(path, "auto") || !strncmp(path, "cpu", 3))) {
		uint64_t cached = ferry_ctx_stat(ctx, FERRY_STAT_CACHED_CHUNKS);
		uint64_t units = ferry_ctx_stat(ctx, FERRY_STAT_UNIT_COPIES);
		printf("    cached_io=%s copy_unit=%s copy_units=%s: %llu chunks read from the page cache, "
		       "%llu unit copies\n", cached_io, copy_unit, copy_units, (unsigned long long)cached,
		       (unsigned long long)units);
		T_CHECK(cached > 0);
		/* copy units take the resident reads of two chunks or more, unless turned off */
		if ((!strcmp(path, "auto") || !strcmp(path, "cpu-async-gpu")) && !strcmp(cached_io, "thread") &&
		    strcmp(copy_unit, "0"))
			T_CHECK(units > 0);
		else
			T_CHECK(units == 0);
	}
out:
	ferry_gpu_free(dev);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
}

static void writes(const char *dir, const char *path)
{
	ferry_ctx *ctx = make_ctx(path, "auto");
	ferry_file *f;
	unsigned char *dev, *back = malloc(SIZE);
	char file[512];

	snprintf(file, sizeof(file), "%s/ferry-gpu-write.%d", dir, (int)getpid());
	T_ASSERT(back);
	T_ASSERT(ferry_file_open(ctx, file, FERRY_O_RDWR | FERRY_O_CREAT | FERRY_O_TRUNC, &f) == 0);
	T_ASSERT(ferry_gpu_malloc(0, SIZE + 4096, (void **)&dev) == 0);
	T_EQ_INT(ferry_gpu_memcpy_htod(dev + 5, expect, SIZE), 0);
	ssize_t n = ferry_pwrite(f, dev + 5, SIZE, 0);
	if (n < 0 && !strncmp(path, "gds", 3)) {
		T_EQ_INT(n, FERRY_ENOGDS);
		printf("  write path=%-14s refused as expected here: %s\n", path, ferry_last_error());
		goto out;
	}
	T_EQ_INT(n, SIZE);
	/* unaligned rewrites of pieces, from device memory */
	for (int i = 0; i < 20; i++) {
		uint64_t off = t_rand(&seed) % SIZE;
		size_t len = i == 0 ? 0 : i == 1 ? 1 : (size_t)(t_rand(&seed) % (3u << 20));
		if (off + len > SIZE)
			len = SIZE - off;
		T_EQ_INT(ferry_pwrite(f, dev + 5 + off, len, off), len);
	}
	T_EQ_INT(ferry_file_sync(f, 0), 0);
	int fd = open(file, O_RDONLY);
	T_ASSERT(fd >= 0);
	T_EQ_INT(pread(fd, back, SIZE, 0), SIZE);
	close(fd);
	if (memcmp(back, expect, SIZE)) {
		fprintf(stderr, "write path=%s: the file differs from the device data\n", path);
		t_failures++;
	} else {
		printf("  write path=%-14s %s: ok\n", path, dir);
	}
out:
	ferry_gpu_free(dev);
	ferry_file_destroy(f);
	unlink(file);
	ferry_ctx_destroy(ctx);
	free(back);
}

static void big(const char *dir, unsigned gib)
{
	char file[512];
	size_t size = ((size_t)gib << 30) + 4097;
	size_t piece = 64u << 20;
	unsigned char *dev, *h = malloc(piece), *chk = malloc(piece);
	ferry_ctx *ctx;
	ferry_file *f;

	T_ASSERT(ferry_ctx_create(&ctx) == 0); /* knobs from the environment */
	snprintf(file, sizeof(file), "%s/ferry-gpu-big.%d", dir, (int)getpid());
	T_ASSERT(h && chk);
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	for (size_t off = 0; off < size; off += piece) {
		size_t n = size - off < piece ? size - off : piece;
		t_fill_pattern(h, n, off, 99);
		T_ASSERT(pwrite(fd, h, n, (off_t)off) == (ssize_t)n);
	}
	close(fd);
	T_ASSERT(ferry_file_open(ctx, file, FERRY_O_RDONLY, &f) == 0);
	T_ASSERT(ferry_gpu_malloc(0, size, (void **)&dev) == 0);
	uint64_t t0 = 0;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	T_EQ_INT(ferry_pread(f, dev, size, 0), size);
	clock_gettime(CLOCK_MONOTONIC, &b);
	t0 = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)(b.tv_nsec - a.tv_nsec);
	printf("  big: %zu bytes from %s into device memory in %.3f s (%.2f GB/s, warm cache; not a benchmark)\n",
	       size, dir, t0 / 1e9, size / (double)t0);
	for (size_t off = 0; off < size; off += piece) {
		size_t n = size - off < piece ? size - off : piece;
		T_EQ_INT(ferry_gpu_memcpy_dtoh(h, dev + off, n), 0);
		t_fill_pattern(chk, n, off, 99);
		if (memcmp(h, chk, n)) {
			fprintf(stderr, "big: device data differs in the piece at %zu\n", off);
			t_failures++;
			break;
		}
	}
	ferry_gpu_free(dev);
	ferry_file_destroy(f);
	unlink(file);
	ferry_ctx_destroy(ctx);
	free(h);
	free(chk);
}

int main(int argc, char **argv)
{
	char why[512], file[512];
	unsigned gib = argc > 1 ? (unsigned)atoi(argv[1]) : 3;
	const char *dirs[] = {"/dev/shm", t_tmpdir()};
	const char *paths[] = {"auto", "cpu-gpu", "cpu-async-gpu", "pagecache-gpu", "gds", "gds-async", "gds-batch"};

	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no usable GPU: %s", why);
	if (argc > 2 && !strcmp(argv[2], "big")) {
		big("/dev/shm", gib);
		return t_result();
	}
	expect = malloc(SIZE);
	T_ASSERT(expect);
	t_fill_pattern(expect, SIZE, 0, 1234);
	for (int d = 0; d < 2; d++) {
		snprintf(file, sizeof(file), "%s/ferry-gpu-read.%d", dirs[d], (int)getpid());
		make_file(file);
		for (size_t p = 0; p < sizeof(paths) / sizeof(paths[0]); p++)
			reads(file, paths[p], "auto");
		/* resident chunks through the ring instead of the worker's own copy; copy units off;
		 * small units, few of them, reused all the time */
		static const char *const variants[][3] = {
			{"ring", "8m", "4"}, {"thread", "0", "4"}, {"thread", "2m", "1"}, {"thread", "3m", "2"}};
		for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
			cached_io = variants[v][0];
			copy_unit = variants[v][1];
			copy_units = variants[v][2];
			reads(file, "auto", "auto");
		}
		cached_io = "thread";
		copy_unit = "8m";
		copy_units = "4";
		/* forced fallbacks: no O_DIRECT descriptor at all; GDS then refuses with that reason */
		reads(file, "auto", "off");
		reads(file, "gds", "off");
		unlink(file);
		for (size_t p = 0; p < sizeof(paths) / sizeof(paths[0]); p++)
			writes(dirs[d], paths[p]);
	}
	/* the explicit cpu mode refuses device memory, with a reason */
	{
		ferry_ctx *ctx = make_ctx("cpu", "auto");
		ferry_file *f;
		void *dev;
		snprintf(file, sizeof(file), "/dev/shm/ferry-gpu-cpu.%d", (int)getpid());
		make_file(file);
		T_ASSERT(ferry_file_open(ctx, file, FERRY_O_RDONLY, &f) == 0);
		T_ASSERT(ferry_gpu_malloc(0, 4096, &dev) == 0);
		T_EQ_INT(ferry_pread(f, dev, 4096, 0), -EINVAL);
		T_CHECK(strstr(ferry_last_error(), "path=cpu") != NULL);
		ferry_gpu_free(dev);
		ferry_file_destroy(f);
		unlink(file);
		ferry_ctx_destroy(ctx);
	}
	if (gib)
		big("/dev/shm", gib);
	free(expect);
	return t_result();
}
