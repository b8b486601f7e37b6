/*
 * Issue 26's figures for compressed files read into GPU memory through ferry_cz_pread (the whole
 * read path: storage, pinned windows, nvCOMP or the CPU, the copy ring), run by
 * bench/gpu-cz-read.sh as `test_cz_bench bench WARM_DIR COLD_DIR MIB [TOKENS]`; as a plain test it
 * says skipped. For uint16 token data (TOKENS: a real tokenizer's ids from bench/cz-tokens.py; else
 * tests/nvcomp_check.h's synthetic ones) and bf16 weights, each codec, chunks of 256 KiB and 1 MiB:
 *  - warm (WARM_DIR, tmpfs): effective GB/s (uncompressed bytes per second into GPU memory) with
 *    cz_gpu=on (nvCOMP for every chunk, LZ4 too) and cz_gpu=off (the CPU, cz_threads = every
 *    core), the median of 3 reads on one open reader after an untimed first (whose rate, open and set-up
 *    included, is printed too); target: the GPU path at least 3x the CPU path; both results are
 *    compared with the data; the path info gives the pipeline's phase times;
 *  - cold (COLD_DIR, a disk; pages dropped with posix_fadvise after an fsync): CZ_COLD_MIB
 *    (default 2048) of the data set, repeated; the plain file read into GPU memory (the disk's
 *    rate through ferry: the ceiling, median of 3) and the compressed file with cz_gpu=auto, open
 *    included; target: effective rate at least 0.9 x ceiling x ratio; the median of 3 on the
 *    slots an earlier reader left, then once as the process's first reader (ferry__cz_release_idle: its pinned
 *    buffers registered on the way); the bytes compared with the data; the path info says when
 *    the first and the last window's reads were done and what followed the last;
 *  - tokens, zstd, 256 KiB and 1 MiB: reads of 1-128 chunks on nvCOMP and on the CPU, the
 *    crossover (cz_gpu_min's measurement); zstd: nvCOMP's warm rate at cz_window 16m-512m (its
 *    measurement).
 * Rows run in the order of what they decide (tokens zstd 256 KiB and 1 MiB, tokens LZ4, then
 * bf16), each only while CZ_BENCH_BUDGET_S (default 100 s) has room for another row as long as
 * the longest so far; a row left out prints a `skipped` TABLE row. Each row prints its seconds.
 * First (outside the budget, ~10 s): every chunk stored (bf16 LZ4) against a plain read of the
 * same bytes, into GPU and host memory: what the host side costs where nothing is decoded.
 * CZ_BENCH_COLD_ONLY=1: the cold rows alone. Prints "TABLE name | figure | note" rows.
 */
#pragma GCC diagnostic ignored "-Wunused-function"
#include <fcntl.h>
#include <time.h>

#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "format/cz.h"
#include "cz_files.h"
#include "nvcomp_check.h"

/* A reader with every core's threads and the GPU choice gpu ("on": nvCOMP for every read). */
static ferry_cz *cz_open(ferry_ctx *ctx, const char *path, const char *gpu)
{
	ferry_cz *z;
	if (ferry_cz_open(ctx, path, &z)) {
		fprintf(stderr, "%s: %s\n", path, ferry_last_error());
		return NULL;
	}
	char th[16];
	snprintf(th, sizeof(th), "%ld", sysconf(_SC_NPROCESSORS_ONLN));
	T_ASSERT(ferry_cz_set(z, "cz_gpu", gpu) == 0 && ferry_cz_set(z, "cz_threads", th) == 0);
	if (!strcmp(gpu, "on"))
		T_ASSERT(ferry_cz_set(z, "cz_gpu_min", "1") == 0);
	return z;
}

/* Seconds for one read of len bytes at off into dev, or -1; info gets the path that ran. */
static double cz_time(ferry_cz *z, void *dev, size_t len, uint64_t off, char *info, size_t ilen)
{
	double t = now();
	ssize_t r = ferry_cz_pread(z, dev, len, off);
	t = now() - t;
	ferry_cz_path_info(z, info, ilen);
	if (r != (ssize_t)len)
		fprintf(stderr, "read of %zu at %llu: %zd: %s\n", len, (unsigned long long)off, r, ferry_last_error());
	return r == (ssize_t)len ? t : -1;
}

/* The median of reps (at most 8) whole reads on one open reader, after one untimed read (its
 * setup: pinned slots, device scratch, nvCOMP's decoders); *first gets that first read's time
 * (open included). window: its cz_window (NULL: the default). */
static double steady(ferry_ctx *ctx, const char *path, void *dev, const char *gpu, const char *window, int reps,
		     double *first, char *info, size_t ilen)
{
	double t0 = now(), v[8];
	ferry_cz *z = cz_open(ctx, path, gpu);
	if (!z)
		return -1;
	T_ASSERT(!window || ferry_cz_set(z, "cz_window", window) == 0);
	size_t n = (size_t)ferry_cz_size(z);
	*first = cz_time(z, dev, n, 0, info, ilen) < 0 ? -1 : now() - t0;
	reps = reps < 8 ? reps : 8;
	for (int k = 0; k < reps; k++)
		v[k] = cz_time(z, dev, n, 0, info, ilen);
	ferry_cz_destroy(z);
	return t_median(v, reps);
}

/* Reads of k chunks (k = 1, 2, 4, ... 128) of path, nvCOMP against the CPU threads, best of 5
 * each: the smallest k from which nvCOMP is faster (cz_gpu_min's measurement). */
static void small_batches(ferry_ctx *ctx, const char *path, const char *name, void *dev)
{
	ferry_cz *g = cz_open(ctx, path, "on"), *c = cz_open(ctx, path, "off");
	T_ASSERT(g && c);
	size_t cs = (size_t)ferry_cz_chunk_size(g), n = (size_t)ferry_cz_size(g);
	char info[640];
	(void)cz_time(g, dev, n, 0, info, sizeof(info)); /* set-up, untimed */
	(void)cz_time(c, dev, n, 0, info, sizeof(info));
	long cross = -1;
	for (size_t k = 1; k <= 128 && k * cs <= n; k *= 2) {
		double tg = 1e99, tc = 1e99;
		for (int rep = 0; rep < 5; rep++) {
			uint64_t off = (uint64_t)((rep * 7 + k) % (n / cs - k + 1)) * cs;
			double a = cz_time(g, dev, k * cs, off, info, sizeof(info));
			double b = cz_time(c, dev, k * cs, off, info, sizeof(info));
			if (a > 0 && a < tg)
				tg = a;
			if (b > 0 && b < tc)
				tc = b;
		}
		if (cross < 0 && tg < tc)
			cross = (long)k;
		printf("TABLE cz small-batch %s %zu chunks | nvcomp %.3f ms, cpu %.3f ms: %.2fx | %s faster\n", name, k,
		       tg * 1e3, tc * 1e3, tc / tg, tg < tc ? "nvcomp" : "cpu");
	}
	printf("TABLE cz small-batch %s crossover | %ld chunks | the smallest read nvCOMP wins (-1: none up to 128); cz_gpu_min default 64\n",
	       name, cross);
	ferry_cz_destroy(g);
	ferry_cz_destroy(c);
}

/* A path's warm rate, GB/s of the file's n bytes, at cz_window window: steady's median of 3. */
static double window_rate(ferry_ctx *ctx, const char *path, void *dev, const char *gpu, const char *window, size_t n)
{
	char info[640];
	double first, t = steady(ctx, path, dev, gpu, window, 3, &first, info, sizeof(info));
	return t > 0 ? (double)n / t / 1e9 : 0;
}

/* cz_window's question: each window size read warm whole by nvCOMP and by the CPU threads (whose
 * windows double up to it), medians of 3, and the two paths' ratio (the 3x target's at that size) */
static void window_sweep(ferry_ctx *ctx, const char *path, const char *name, void *dev, size_t n)
{
	static const char *const windows[] = {"16m", "64m", "128m", "256m", "512m"};
	char row[768] = "";
	size_t at = 0;
	for (int w = 0; w < 5; w++) {
		double g = window_rate(ctx, path, dev, "on", windows[w], n);
		double c = w < 2 ? 0 : window_rate(ctx, path, dev, "off", windows[w], n); /* (small windows: nvCOMP's alone) */
		if (c > 0)
			at += (size_t)snprintf(row + at, sizeof(row) - at, "%s%s %.2f GB/s (cpu %.2f, %.2fx)", w ? ", " : "",
					       windows[w], g, c, g / c);
		else
			at += (size_t)snprintf(row + at, sizeof(row) - at, "%s%s %.2f GB/s", w ? ", " : "", windows[w], g);
	}
	printf("TABLE cz window %s | %s | warm rate by cz_window, nvCOMP (and the CPU path), medians of 3 (default: 128m, or an eighth of a larger read in memory up to 256m)\n",
	       name, row);
}

/* Best of 3 timed reads (after an untimed one) of n bytes of a plain file into buf: ferry_pread. */
static double plain_best(ferry_ctx *ctx, const char *path, void *buf, size_t n)
{
	double best = 1e99;
	for (int k = 0; k < 4; k++) {
		double t = plain_read(ctx, path, buf, n, 0);
		if (k && t > 0 && t < best)
			best = t;
	}
	return best < 1e98 ? best : -1;
}

/*
 * The host side's bound, first: bf16 weights in LZ4 chunks of 1 MiB, where every chunk is stored
 * (LZ4 cannot shrink them: no decoding at all), read warm from WARM_DIR beside a plain read of the
 * same bytes. Into GPU memory: the plain file (ferry_pread: the ceiling), as many of the cz file's
 * own bytes (ferry_pread), ferry_cz_pread on the CPU path (cz_gpu=off) and the nvCOMP path (cz_gpu=on: the
 * stored chunks are copied, nvCOMP decodes nothing); into host memory: the plain file against
 * ferry_cz_pread. Best of 3 on one open reader after an untimed read; ratios to the plain read.
 */
static void stored_row(ferry_ctx *ctx, const char *warm, void *dev, uint8_t *data, uint8_t *back, size_t n)
{
	double t0 = now();
	char plain[1024], czp[1024], gi[640], ci[640], hi[640];
	snprintf(plain, sizeof(plain), "%s/cz-bench-stored.bin", warm);
	snprintf(czp, sizeof(czp), "%s/cz-bench-stored.lz4", warm);
	t_gen_bf16(data, n, 27);
	put(plain, data, n);
	compress(czp, FERRY_CZ_LZ4, "1m", data, n);
	ferry_cz *z = cz_open(ctx, czp, "off");
	T_ASSERT(z);
	long long stored = (long long)ferry_cz_stored_chunks(z), chunks = (long long)ferry_cz_chunks(z);
	size_t cn = (size_t)ferry_cz_compressed_size(z);
	ferry_cz_destroy(z);
	uint8_t *host = malloc(cn > n ? cn : n);
	T_ASSERT(host);
	double pd = plain_best(ctx, plain, dev, n), pr = plain_best(ctx, czp, dev, n), ph = plain_best(ctx, plain, host, n);
	double f, tc = steady(ctx, czp, dev, "off", NULL, 3, &f, ci, sizeof(ci));
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dev, n), 0);
	T_CHECK(memcmp(back, data, n) == 0);
	double tg = steady(ctx, czp, dev, "on", NULL, 3, &f, gi, sizeof(gi));
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dev, n), 0);
	T_CHECK(memcmp(back, data, n) == 0);
	double th = steady(ctx, czp, host, "off", NULL, 3, &f, hi, sizeof(hi));
	T_CHECK(memcmp(host, data, n) == 0);
	double gb = (double)n / 1e9;
	printf("TABLE cz stored warm into GPU | plain %.2f GB/s; the cz file's first bytes %.2f; cz_pread cpu path %.2f (%.2fx plain), "
	       "nvcomp path %.2f (%.2fx) | bf16 LZ4 1 MiB, %lld of %lld chunks stored (nothing to decode): the host side's cost against a plain read\n",
	       gb / pd, gb / pr, gb / tc, pd / tc, gb / tg, pd / tg, stored, chunks);
	printf("TABLE cz stored warm into host | plain %.2f GB/s; cz_pread %.2f (%.2fx plain) | same file, host memory\n", gb / ph,
	       gb / th, ph / th);
	const char *gp = strstr(gi, "); "), *cp = strstr(ci, "); ");
	printf("TABLE cz stored warm phases | nvcomp%s | cpu%s\n", gp ? gp + 1 : gi, cp ? cp + 1 : ci);
	printf("  stored, nvcomp: %s\n  stored, cpu: %s\n  stored, host: %s\n  row stored: %.1f s\n", gi, ci, hi, now() - t0);
	fflush(stdout);
	free(host);
	unlink(plain);
	unlink(czp);
}

/* Warm, from WARM_DIR: nvCOMP for every chunk (cz_gpu=on: LZ4 too) against the CPU threads, the
 * median of 3 on one open reader; both paths' bytes compared with the data. */
static void warm_row(ferry_ctx *ctx, const char *wpath, const char *name, void *dev, const uint8_t *data, uint8_t *back,
		     size_t n, double ratio)
{
	char ginfo[640], cinfo[640], kinfo[640];
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	ferry_cz *z;
	double fg, fc, tg = steady(ctx, wpath, dev, "on", NULL, 3, &fg, ginfo, sizeof(ginfo));
	double tc = steady(ctx, wpath, dev, "off", NULL, 3, &fc, cinfo, sizeof(cinfo));
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dev, n), 0); /* the CPU path's bytes */
	T_CHECK(memcmp(back, data, n) == 0);
	memset(back, 0xEE, n); /* poisoned, so the CPU path's bytes cannot pass for nvCOMP's */
	T_EQ_INT(ferry_gpu_memcpy_htod(dev, back, n), 0);
	z = cz_open(ctx, wpath, "on");
	T_ASSERT(z && cz_time(z, dev, n, 0, kinfo, sizeof(kinfo)) > 0);
	ferry_cz_destroy(z);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dev, n), 0); /* nvCOMP's bytes */
	T_CHECK(memcmp(back, data, n) == 0);
	double g = (double)n / tg / 1e9, c = (double)n / tc / 1e9;
	printf("TABLE cz warm %s | nvcomp %.2f GB/s, cpu %.2f GB/s (%ld threads): %.2fx | target 3x %s; ratio %.2f; "
	       "first read of a fresh open: nvcomp %.2f, cpu %.2f GB/s\n",
	       name, g, c, cores, g / c, tg > 0 && tc > 0 && g >= 3 * c ? "met" : "not met", ratio,
	       (double)n / fg / 1e9, (double)n / fc / 1e9);
	const char *gp = strstr(ginfo, "); "), *cp = strstr(cinfo, "); ");
	printf("TABLE cz warm phases %s | nvcomp%s | cpu%s\n", name, gp ? gp + 1 : ginfo, cp ? cp + 1 : cinfo);
	printf("  nvcomp: %s\n  cpu: %s\n", ginfo, cinfo);
}

/*
 * Cold, from cpath (nc bytes) on the disk, what cz_gpu=auto picks, a fresh open each time: the
 * median of 3 taking the slots an earlier reader left (a process's reads after its first), then
 * once with none left (the first reader of a process: it registers its windows' pinned buffers on
 * the way), against the plain read's ceiling times the ratio; the bytes compared with cdata.
 */
static void cold_row(ferry_ctx *ctx, const char *cpath, const char *name, void *dev, const uint8_t *cdata,
		     uint8_t *back, size_t n, size_t nc, double ceil_gbs, double ratio)
{
	double tf = -1, kt[3];
	char kinfo[640], finfo[640];
	for (int rep = 0; rep < 4; rep++) { /* 3 on kept slots (the path info: the last's), then a first reader */
		drop(cpath);
		if (rep == 3)
			ferry__cz_release_idle();
		double f;
		(void)steady(ctx, cpath, dev, "auto", NULL, 0, &f, rep == 3 ? finfo : kinfo, sizeof(kinfo));
		if (rep == 3)
			tf = f;
		else
			kt[rep] = f;
	}
	double tk = t_median(kt, 3);
	for (size_t at = 0; at < nc; at += n) { /* the cold reads' bytes (the last read's) */
		size_t m = nc - at < n ? nc - at : n;
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, (uint8_t *)dev + at, m), 0);
		T_CHECK(memcmp(back, cdata + at, m) == 0);
	}
	double k = tk > 0 ? (double)nc / tk / 1e9 : 0, kf = tf > 0 ? (double)nc / tf / 1e9 : 0;
	printf("TABLE cz cold %s | %.2f GB/s effective | ceiling %.2f x ratio %.2f = %.2f GB/s: %.2fx of it, target 0.9x %s; "
	       "the process's first reader %.2f GB/s (%.2fx)\n",
	       name, k, ceil_gbs, ratio, ceil_gbs * ratio, k / (ceil_gbs * ratio),
	       k >= 0.9 * ceil_gbs * ratio ? "met" : "not met", kf, kf / (ceil_gbs * ratio));
	printf("  auto, cold: %s\n  auto, cold, first reader: %s\n", kinfo, finfo);
}

static int load_tokens(const char *path, uint8_t *data, size_t n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	size_t got = fread(data, 1, n, f);
	fclose(f);
	for (size_t at = got; got && at < n; at += got) /* shorter than asked: repeated */
		memcpy(data + at, data, n - at < got ? n - at : got);
	return got ? 0 : -1;
}

int main(int argc, char **argv)
{
	if (argc < 5 || strcmp(argv[1], "bench"))
		T_SKIP("a benchmark: bench/gpu-cz-read.sh runs it (test_cz_bench bench WARM_DIR COLD_DIR MIB [TOKENS])");
	char why[256];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no GPU: %s", why);
	const char *warm = argv[2], *cold = argv[3], *tokens = argc > 5 ? argv[5] : NULL;
	size_t n = (size_t)atol(argv[4]) << 20;
	/* Cold reads of CZ_COLD_MIB (default 2048): the data set repeated. A read of the disk has
	 * costs of its own at each end (its first window waits for a whole queue's bytes; the work
	 * after its last bytes), which a read of a few hundred MiB does not hide; a checkpoint's
	 * shard or a model's weights are gigabytes. CZ_BENCH_COLD_ONLY=1: the cold rows alone. */
	const char *cm = getenv("CZ_COLD_MIB"), *co = getenv("CZ_BENCH_COLD_ONLY"), *wo = getenv("CZ_BENCH_WARM_ONLY");
	size_t nc = (size_t)(cm && *cm ? atol(cm) : 2048) << 20;
	int cold_only = co && *co == '1', warm_only = !cold_only && wo && *wo == '1';
	nc = nc < n ? n : nc;
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	uint8_t *data = malloc(n), *back = malloc(n), *cdata = malloc(nc);
	void *dev;
	T_ASSERT(data && back && cdata && ferry_gpu_malloc(0, nc, &dev) == 0);
	/* The rows in the order of what they decide (zstd is what cz_gpu=auto sends to nvCOMP; 256 KiB
	 * against 1 MiB is cz_chunk's question), each run only while the time budget
	 * (CZ_BENCH_BUDGET_S, default 100 s) has room for it: a row left out says so. */
	static const struct {
		int set, codec, ch;
	} rows[] = {
		{0, FERRY_CZ_ZSTD, 0}, {0, FERRY_CZ_ZSTD, 1}, {0, FERRY_CZ_LZ4, 0}, {0, FERRY_CZ_LZ4, 1},
		{1, FERRY_CZ_ZSTD, 0}, {1, FERRY_CZ_ZSTD, 1}, {1, FERRY_CZ_LZ4, 0}, {1, FERRY_CZ_LZ4, 1},
	};
	const char *sets[] = {"tokens", "bf16"};
	const char *chunks[] = {"256k", "1m"};
	const char *budget_env = getenv("CZ_BENCH_BUDGET_S");
	double t_start = now(), budget = budget_env && *budget_env ? atof(budget_env) : 100, row_cost = 0;
	double ceil_gbs = 0;
	int loaded = -1, ceil_set = -1;
	if (!cold_only)
		stored_row(ctx, warm, dev, data, back, n);
	t_start = now(); /* the rows' budget is theirs */
	for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
		int s = rows[ri].set, codec = rows[ri].codec, ch = rows[ri].ch;
		const char *cn = ferry_cz_codec_name(codec);
		char name[64];
		snprintf(name, sizeof(name), "%s %s %s", sets[s], cn, chunks[ch]);
		double t_row = now();
		if (t_row - t_start + row_cost > budget) {
			printf("TABLE cz %s | skipped | the time budget (CZ_BENCH_BUDGET_S=%.0f s): %.0f s spent, the longest row took %.0f s\n",
			       name, budget, t_row - t_start, row_cost);
			continue;
		}
		if (loaded != s) {
			if (s == 0 && tokens) {
				T_ASSERT(load_tokens(tokens, data, n) == 0);
				printf("tokens: %s (a real tokenizer's ids, bench/cz-tokens.py)\n", tokens);
			} else if (s == 0) {
				t_gen_tokens(data, n, 26);
				printf("tokens: synthetic (tests/nvcomp_check.h: Zipf ids, no tokenizer)\n");
			} else
				t_gen_bf16(data, n, 26);
			loaded = s;
			for (size_t at = 0; at < nc; at += n)
				memcpy(cdata + at, data, nc - at < n ? nc - at : n);
		}
		if (!warm_only && ceil_set != s) { /* the disk's ceiling, once a data set */
			ceil_set = s;
			char plain_cold[1024];
			snprintf(plain_cold, sizeof(plain_cold), "%s/cz-bench-%s.bin", cold, sets[s]);
			put(plain_cold, cdata, nc);
			double pt[3]; /* the disk's rate through ferry, median of 3 */
			for (int k = 0; k < 3; k++)
				pt[k] = plain_read(ctx, plain_cold, dev, nc, 1);
			double ceiling = t_median(pt, 3);
			ceil_gbs = ceiling > 0 ? (double)nc / ceiling / 1e9 : 0;
			printf("TABLE cz cold %s plain | %.2f GB/s | the disk into GPU memory (ferry_pread, cold, %zu MiB): the ceiling\n",
			       sets[s], ceil_gbs, nc >> 20);
			unlink(plain_cold);
		}
		char wpath[1024], cpath[1024];
		snprintf(wpath, sizeof(wpath), "%s/cz-bench-%s.%s.%s", warm, sets[s], cn, chunks[ch]);
		snprintf(cpath, sizeof(cpath), "%s/cz-bench-%s.%s.%s", cold, sets[s], cn, chunks[ch]);
		if (!cold_only)
			compress(wpath, codec, chunks[ch], data, n);
		if (!warm_only)
			compress(cpath, codec, chunks[ch], cdata, nc);
		ferry_cz *z = cz_open(ctx, warm_only ? wpath : cpath, "off");
		T_ASSERT(z);
		double ratio = (double)(warm_only ? n : nc) / (double)ferry_cz_compressed_size(z);
		ferry_cz_destroy(z);
		if (!cold_only)
			warm_row(ctx, wpath, name, dev, data, back, n, ratio);
		if (!warm_only) /* (CZ_BENCH_WARM_ONLY=1: the warm rows and window sweeps alone) */
			cold_row(ctx, cpath, name, dev, cdata, back, n, nc, ceil_gbs, ratio);
		if (s == 0 && codec == FERRY_CZ_ZSTD && !cold_only && !warm_only)
			small_batches(ctx, wpath, name, dev);
		if (codec == FERRY_CZ_ZSTD && !cold_only)
			window_sweep(ctx, wpath, name, dev, n);
		fflush(stdout);
		if (!cold_only)
			unlink(wpath);
		if (!warm_only)
			unlink(cpath);
		double took = now() - t_row;
		row_cost = took > row_cost ? took : row_cost;
		printf("  row %s: %.1f s (%.1f s since the start)\n", name, took, now() - t_start);
		fflush(stdout);
	}
	T_EQ_INT(ferry_gpu_free(dev), 0);
	free(data), free(back), free(cdata);
	ferry_ctx_destroy(ctx);
	return t_result();
}
