/*
 * Issue 26's figures for compressed files read into GPU memory through ferry_cz_pread (the whole
 * read path: storage, pinned windows, nvCOMP or the CPU, the copy ring), run by
 * bench/gpu-cz-read.sh as `test_cz_bench bench WARM_DIR COLD_DIR MIB`; as a plain test it says
 * skipped. For uint16 token data and bf16 weights (tests/nvcomp_check.h's generators), each codec:
 *  - warm (WARM_DIR, tmpfs): effective GB/s (uncompressed bytes per second into GPU memory) with
 *    cz_gpu=auto (nvCOMP) and cz_gpu=off (the CPU, cz_threads = every core), best of 3; target:
 *    the GPU path at least 3x the CPU path;
 *  - cold (COLD_DIR, a disk; pages dropped with posix_fadvise after an fsync): the plain file read
 *    into GPU memory (the disk's rate through ferry: the ceiling) and the compressed file with
 *    cz_gpu=auto; target: effective rate at least 0.9 x ceiling x ratio.
 * Prints "TABLE name | figure | note" rows.
 */
#pragma GCC diagnostic ignored "-Wunused-function"
#include <fcntl.h>
#include <time.h>

#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "nvcomp_check.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void drop(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd >= 0) {
		fdatasync(fd);
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

static void put(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f && fwrite(data, 1, n, f) == n);
	fflush(f);
	fsync(fileno(f));
	fclose(f);
}

static void compress(const char *path, int codec, const void *data, size_t n)
{
	ferry_cz_writer *w;
	T_ASSERT(ferry_cz_writer_create(path, codec, 0, &w) == 0);
	T_ASSERT(ferry_cz_writer_write(w, data, n) == 0);
	T_ASSERT(ferry_cz_writer_commit(w) > 0);
	ferry_cz_writer_destroy(w);
}

/* Seconds for one read of the whole compressed file into dev (gpu: the cz_gpu value), or -1. */
static double cz_read(ferry_ctx *ctx, const char *path, void *dev, const char *gpu, int cold, char *info,
		      size_t ilen, double *ratio)
{
	ferry_cz *z;
	if (cold)
		drop(path);
	if (ferry_cz_open(ctx, path, &z)) {
		fprintf(stderr, "%s: %s\n", path, ferry_last_error());
		return -1;
	}
	char th[16];
	snprintf(th, sizeof(th), "%ld", sysconf(_SC_NPROCESSORS_ONLN));
	T_ASSERT(ferry_cz_set(z, "cz_gpu", gpu) == 0 && ferry_cz_set(z, "cz_threads", th) == 0);
	size_t n = (size_t)ferry_cz_size(z);
	*ratio = (double)n / (double)ferry_cz_compressed_size(z);
	double t = now();
	ssize_t r = ferry_cz_pread(z, dev, n, 0);
	t = now() - t;
	ferry_cz_path_info(z, info, ilen);
	if (r != (ssize_t)n)
		fprintf(stderr, "%s: %zd: %s\n", path, r, ferry_last_error());
	ferry_cz_destroy(z);
	return r == (ssize_t)n ? t : -1;
}

static double plain_read(ferry_ctx *ctx, const char *path, void *dev, size_t n, int cold)
{
	ferry_file *f;
	if (cold)
		drop(path);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	double t = now();
	ssize_t r = ferry_pread(f, dev, n, 0);
	t = now() - t;
	ferry_file_destroy(f);
	return r == (ssize_t)n ? t : -1;
}

int main(int argc, char **argv)
{
	if (argc < 5 || strcmp(argv[1], "bench"))
		T_SKIP("a benchmark: bench/gpu-cz-read.sh runs it (test_cz_bench bench WARM_DIR COLD_DIR MIB)");
	char why[256];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no GPU: %s", why);
	const char *warm = argv[2], *cold = argv[3];
	size_t n = (size_t)atol(argv[4]) << 20;
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	uint8_t *data = malloc(n);
	void *dev;
	T_ASSERT(data && ferry_gpu_malloc(0, n, &dev) == 0);
	const char *sets[] = {"tokens", "bf16"};
	for (int s = 0; s < 2; s++) {
		if (s == 0)
			t_gen_tokens(data, n, 26);
		else
			t_gen_bf16(data, n, 26);
		char plain_cold[1024];
		snprintf(plain_cold, sizeof(plain_cold), "%s/cz-bench-%s.bin", cold, sets[s]);
		put(plain_cold, data, n);
		double ceiling = 1e99;
		for (int k = 0; k < 2; k++) { /* the disk's rate through ferry, best of 2 */
			double t = plain_read(ctx, plain_cold, dev, n, 1);
			if (t > 0 && t < ceiling)
				ceiling = t;
		}
		double ceil_gbs = (double)n / ceiling / 1e9;
		printf("TABLE cz cold %s plain | %.2f GB/s | the disk into GPU memory (ferry_pread, cold): the ceiling\n",
		       sets[s], ceil_gbs);
		for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
			const char *cn = ferry_cz_codec_name(codec);
			char wpath[1024], cpath[1024], info[256], ginfo[256];
			snprintf(wpath, sizeof(wpath), "%s/cz-bench-%s.%s", warm, sets[s], cn);
			snprintf(cpath, sizeof(cpath), "%s/cz-bench-%s.%s", cold, sets[s], cn);
			compress(wpath, codec, data, n);
			compress(cpath, codec, data, n);
			double ratio = 0, tg = 1e99, tc = 1e99, tk = 1e99;
			for (int rep = 0; rep < 3; rep++) {
				double a = cz_read(ctx, wpath, dev, "auto", 0, ginfo, sizeof(ginfo), &ratio);
				double b = cz_read(ctx, wpath, dev, "off", 0, info, sizeof(info), &ratio);
				if (a > 0 && a < tg)
					tg = a;
				if (b > 0 && b < tc)
					tc = b;
			}
			for (int rep = 0; rep < 2; rep++) {
				double c = cz_read(ctx, cpath, dev, "auto", 1, info, sizeof(info), &ratio);
				if (c > 0 && c < tk)
					tk = c;
			}
			/* the bytes are right: one more read, compared */
			uint8_t *back = malloc(n);
			T_ASSERT(back && cz_read(ctx, wpath, dev, "auto", 0, info, sizeof(info), &ratio) > 0);
			T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dev, n), 0);
			T_CHECK(memcmp(back, data, n) == 0);
			free(back);
			double g = (double)n / tg / 1e9, c = (double)n / tc / 1e9, k = (double)n / tk / 1e9;
			printf("TABLE cz warm %s %s | nvcomp path %.2f GB/s, cpu path %.2f GB/s (%ld cores): %.2fx | target 3x %s; ratio %.2f; %s\n",
			       sets[s], cn, g, c, sysconf(_SC_NPROCESSORS_ONLN), g / c, g >= 3 * c ? "met" : "not met", ratio,
			       ginfo);
			printf("TABLE cz cold %s %s | %.2f GB/s effective | ceiling %.2f x ratio %.2f = %.2f GB/s: %.2fx of it, target 0.9x %s\n",
			       sets[s], cn, k, ceil_gbs, ratio, ceil_gbs * ratio, k / (ceil_gbs * ratio),
			       k >= 0.9 * ceil_gbs * ratio ? "met" : "not met");
			fflush(stdout);
			unlink(wpath);
			unlink(cpath);
		}
		unlink(plain_cold);
	}
	T_EQ_INT(ferry_gpu_free(dev), 0);
	free(data);
	ferry_ctx_destroy(ctx);
	return t_result();
}
