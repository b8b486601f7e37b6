/*
 * ferry_cz_pread into host memory over many windows of the read pipeline (src/format/cz_file.c):
 * the bytes of whole and partial reads of a file several windows long, read cold (pages dropped
 * with posix_fadvise, so the engine reads with O_DIRECT where the file system allows) and warm, for
 * zstd and LZ4, every chunk stored (LZ4 of random bytes) and mixed; a damaged chunk in a later
 * window named; and the path info's phase times.
 *
 * Bench mode, `test_cz_read bench DIR MIB [WARM_DIR]` (issue 26's cold rows, host side, no GPU):
 * token data (tests/nvcomp_check.h) and bf16 weights written plain and compressed (zstd, LZ4;
 * chunks of 256 KiB and 1 MiB) under DIR (a real disk). Cold: the plain file read by ferry_pread
 * into host memory (the disk's rate through ferry: the ceiling), then each compressed file read
 * whole by ferry_cz_pread on a fresh open, pages dropped before each, best of 2: the effective rate
 * (uncompressed bytes per second) against ceiling x ratio (issue 26's target: 0.9x). Warm (WARM_DIR,
 * default /dev/shm): plain against compressed, best of 3 on one open reader after an untimed read.
 * Prints "TABLE name | figure | note" rows and each read's phase times.
 */
#pragma GCC diagnostic ignored "-Wunused-function"
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ferry/compress.h"
#include "format/cz.h"
#include "cz_files.h"
#include "nvcomp_check.h"

/* weak: the bench also builds against a library from before it (its phases then left out) */
#pragma weak ferry__cz_last_phases

/* The last read's phases on z as text. */
static void phases(ferry_cz *z, char *buf, size_t len)
{
	struct ferry__cz_phases ph;
	if (!ferry__cz_last_phases) {
		snprintf(buf, len, "(phases not recorded by this library)");
		return;
	}
	ferry__cz_last_phases(z, &ph);
	snprintf(buf, len, "%.1f ms: read wait %.1f, host %.1f, gpu wait %.1f; %llu windows in %u slots, at most %.1f MiB read at once",
		 ph.total * 1e3, ph.read_wait * 1e3, ph.host * 1e3, ph.gpu_wait * 1e3, (unsigned long long)ph.windows,
		 ph.slots, (double)ph.max_inflight / 1048576);
}

/* ------------------------------------------------------------------------------------ bench */

/* One whole read of a compressed file on a fresh open (open included); info: its path info. */
static double cz_read(ferry_ctx *ctx, const char *path, void *buf, size_t n, int cold, char *info, size_t ilen)
{
	ferry_cz *z;
	if (cold)
		drop(path);
	double t = now();
	T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
	ssize_t r = ferry_cz_pread(z, buf, n, 0);
	t = now() - t;
	phases(z, info, ilen);
	ferry_cz_destroy(z);
	if (r != (ssize_t)n)
		fprintf(stderr, "%s: %zd: %s\n", path, r, ferry_last_error());
	return r == (ssize_t)n ? t : -1;
}

/* Whether row name ("tokens lz4 1m") is among $CZ_READ_ROWS (comma-separated; unset: every row). */
static int wanted(const char *name)
{
	const char *rows = getenv("CZ_READ_ROWS");
	if (!rows || !*rows)
		return 1;
	size_t n = strlen(name);
	for (const char *p = rows; (p = strstr(p, name)); p += n)
		if ((p == rows || p[-1] == ',') && (p[n] == ',' || !p[n]))
			return 1;
	return 0;
}

static int bench(const char *dir, size_t n, const char *warm)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	uint8_t *data = malloc(n), *back = malloc(n);
	T_ASSERT(data && back);
	memset(back, 0, n); /* faulted in: no read pays for the destination's first touch */
	const char *reps_env = getenv("CZ_READ_REPS");
	int reps = reps_env && atoi(reps_env) > 0 ? atoi(reps_env) : 3;
	static const char *const sets[] = {"tokens", "bf16"}, *const chunks[] = {"256k", "1m"};
	for (int s = 0; s < 2; s++) {
		int any = 0;
		for (int codec = 0; codec < 2; codec++)
			for (int ch = 0; ch < 2; ch++) {
				char name[64];
				snprintf(name, sizeof(name), "%s %s %s", sets[s], codec ? "lz4" : "zstd", chunks[ch]);
				any |= wanted(name);
			}
		if (!any)
			continue;
		if (s == 0)
			t_gen_tokens(data, n, 26);
		else
			t_gen_bf16(data, n, 26);
		char plain[1024], wplain[1024];
		snprintf(plain, sizeof(plain), "%s/cz-read-%s.bin", dir, sets[s]);
		snprintf(wplain, sizeof(wplain), "%s/cz-read-%d-%s.bin", warm, (int)getpid(), sets[s]);
		put(plain, data, n);
		put(wplain, data, n);
		for (int codec = 0; codec < 2; codec++)
			for (int ch = 0; ch < 2; ch++) {
				int c = codec ? FERRY_CZ_LZ4 : FERRY_CZ_ZSTD;
				const char *cn = ferry_cz_codec_name(c);
				char name[64], cpath[1024], wpath[1024], info[320], tinfo[320], winfo[320];
				snprintf(name, sizeof(name), "%s %s %s", sets[s], cn, chunks[ch]);
				if (!wanted(name))
					continue;
				snprintf(cpath, sizeof(cpath), "%s/cz-read-%s.%s.%s", dir, sets[s], cn, chunks[ch]);
				snprintf(wpath, sizeof(wpath), "%s/cz-read-%d-%s.%s.%s", warm, (int)getpid(), sets[s], cn,
					 chunks[ch]);
				compress(cpath, c, chunks[ch], data, n);
				compress(wpath, c, chunks[ch], data, n);
				struct stat st;
				T_ASSERT(stat(cpath, &st) == 0);
				double ratio = (double)n / (double)st.st_size;
				/* cold: the plain file and the compressed one in turn, pages dropped before each,
				 * best of reps each (the disk's rate drifts: side by side) */
				double tp = 1e99, tk = 1e99;
				for (int k = 0; k < reps; k++) {
					double t = plain_read(ctx, plain, back, n, 1);
					if (t > 0 && t < tp)
						tp = t;
					memset(back, 0xEE, 4096);
					t = cz_read(ctx, cpath, back, n, 1, tinfo, sizeof(tinfo));
					T_CHECK(memcmp(back, data, n) == 0);
					if (t > 0 && t < tk) {
						tk = t;
						memcpy(info, tinfo, sizeof(info));
					}
				}
				/* warm: the plain file, then one open reader, best of reps after an untimed read */
				double twp = 1e99, tw = 1e99;
				for (int k = 0; k <= reps; k++) {
					double t = plain_read(ctx, wplain, back, n, 0);
					if (k && t > 0 && t < twp)
						twp = t;
				}
				ferry_cz *z;
				T_ASSERT(ferry_cz_open(ctx, wpath, &z) == 0);
				for (int k = 0; k <= reps; k++) {
					double t = now();
					ssize_t r = ferry_cz_pread(z, back, n, 0);
					t = now() - t;
					T_CHECK(r == (ssize_t)n);
					if (k && t < tw)
						tw = t;
				}
				phases(z, winfo, sizeof(winfo));
				ferry_cz_destroy(z);
				T_CHECK(memcmp(back, data, n) == 0);
				double cg = (double)n / tp / 1e9, k = (double)n / tk / 1e9;
				double wg = (double)n / twp / 1e9, w = (double)n / tw / 1e9;
				printf("TABLE cz-host cold %s | %.2f GB/s effective (%.2f compressed) | plain %.2f x ratio %.2f = %.2f: %.2fx, target 0.9x %s\n",
				       name, k, k / ratio, cg, ratio, cg * ratio, k / (cg * ratio),
				       k >= 0.9 * cg * ratio ? "met" : "not met");
				printf("  cold: %s\n", info);
				printf("TABLE cz-host warm %s | %.2f GB/s effective | plain %.2f: %.2fx\n", name, w, wg, w / wg);
				printf("  warm: %s\n", winfo);
				fflush(stdout);
				unlink(cpath);
				unlink(wpath);
			}
		unlink(plain);
		unlink(wplain);
	}
	free(data), free(back);
	ferry_ctx_destroy(ctx);
	return t_result();
}

/* ------------------------------------------------------------------------------------- tests */

enum { CS = 64 << 10, NCHUNKS = 150, CZ_ALIGN_T = 4096 /* a window's read is rounded to it at both ends */ };

/* Chunks alternating in runs: compressible tokens, then random bytes (stored chunks under LZ4 and
 * zstd alike), so windows hold both kinds and some hold stored chunks only. */
static void fill(uint8_t *d, size_t n)
{
	t_gen_tokens(d, n, 5);
	uint64_t x = 99;
	for (size_t c = 0; c * CS < n; c++)
		if ((c / 9) % 3 == 2)
			for (size_t i = c * CS; i < (c + 1) * CS && i < n; i++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				d[i] = (uint8_t)(x >> 24);
			}
}

static ferry_cz *open_cz(ferry_ctx *ctx, const char *path)
{
	ferry_cz *z;
	T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
	T_ASSERT(ferry_cz_set(z, "cz_threads", "2") == 0); /* windows of 2, 4, then 8 chunks */
	return z;
}

/* [off, off + len) of z into a buffer, compared with data; cold: the file's pages dropped first. */
static void check_range(ferry_cz *z, const char *path, const uint8_t *data, uint64_t off, size_t len, int cold,
			const char *what)
{
	uint8_t *buf = malloc(len + 1);
	T_ASSERT(buf);
	memset(buf, 0xEE, len + 1);
	if (cold)
		drop(path);
	ssize_t r = ferry_cz_pread(z, buf, len, off);
	if (r != (ssize_t)len)
		fprintf(stderr, "%s: %zd: %s\n", what, r, ferry_last_error());
	T_CHECK(r == (ssize_t)len);
	T_CHECK(memcmp(buf, data + off, len) == 0);
	T_CHECK(buf[len] == 0xEE);
	free(buf);
}

struct conc {
	ferry_cz *z;
	const uint8_t *data;
	size_t n;
	int ok;
};

static void *conc_read(void *arg)
{
	struct conc *c = arg;
	uint8_t *buf = malloc(c->n);
	c->ok = buf && ferry_cz_pread(c->z, buf, c->n, 0) == (ssize_t)c->n && !memcmp(buf, c->data, c->n);
	free(buf);
	return NULL;
}

/* A flipped byte in the frames 70% into the file: a whole read fails naming a chunk, and the
 * reader's next read (of the chunks before the damage) still works. */
static void damaged(ferry_ctx *ctx, const char *path, const uint8_t *data, size_t n)
{
	char bad[600];
	snprintf(bad, sizeof(bad), "%s.damaged", path);
	FILE *in = fopen(path, "rb"), *out = fopen(bad, "wb");
	T_ASSERT(in && out);
	ferry_cz *z = open_cz(ctx, path);
	long at = (long)(ferry_cz_compressed_size(z) * 7 / 10);
	ferry_cz_destroy(z);
	int ch;
	for (long k = 0; (ch = fgetc(in)) != EOF; k++)
		fputc(k == at ? ch ^ 0x40 : ch, out);
	fclose(in);
	fclose(out);
	z = open_cz(ctx, bad);
	uint8_t *buf = malloc(n);
	drop(bad);
	ssize_t r = ferry_cz_pread(z, buf, n, 0);
	printf("damaged at byte %ld: %zd: %s\n", at, r, ferry_last_error());
	T_EQ_INT((int)r, FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "chunk ") != NULL);
	T_CHECK(ferry_cz_pread(z, buf, 10 * CS, 0) == 10 * CS && !memcmp(buf, data, 10 * CS));
	free(buf);
	ferry_cz_destroy(z);
	unlink(bad);
}

static int main_tests(void)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "threads", "2") == 0 && ferry_ctx_set(ctx, "queue_depth", "16") == 0 &&
		 ferry_ctx_set(ctx, "chunk_size", "1m") == 0); /* the engine's queue: 32 MiB */
	const size_t n = (size_t)NCHUNKS * CS - 1000;
	uint8_t *data = malloc(n);
	T_ASSERT(data);
	fill(data, n);
	for (int codec = 0; codec < 2; codec++) {
		int c = codec ? FERRY_CZ_LZ4 : FERRY_CZ_ZSTD;
		char path[512];
		snprintf(path, sizeof(path), "%s/test_cz_read.%d.%s", t_tmpdir(), (int)getpid(), ferry_cz_codec_name(c));
		compress(path, c, "64k", data, n);
		ferry_cz *z = open_cz(ctx, path);
		T_CHECK(ferry_cz_stored_chunks(z) > 0 && ferry_cz_stored_chunks(z) < ferry_cz_chunks(z));
		/* whole, cold then warm; ranges with partial ends, starting in later windows */
		for (int cold = 1; cold >= 0; cold--) {
			check_range(z, path, data, 0, n, cold, "whole");
			check_range(z, path, data, 1, n - 1, cold, "from byte 1");
			check_range(z, path, data, 37 * CS + 5, 90 * CS + 17, cold, "partial ends");
			check_range(z, path, data, 18 * CS, 9 * CS, cold, "stored chunks only");
			check_range(z, path, data, n - 3, 3, cold, "the last bytes");
		}
		/* read ahead by bytes: a whole read started more than the next window at once (the
		 * engine's queue, 32 MiB, is more than the file: the slots bound it) */
		struct ferry__cz_phases ph;
		check_range(z, path, data, 0, n, 1, "whole, cold");
		ferry__cz_last_phases(z, &ph);
		printf("%s: whole read: %llu windows, at most %llu bytes read at once (file %lld compressed)\n",
		       ferry_cz_codec_name(c), (unsigned long long)ph.windows, (unsigned long long)ph.max_inflight,
		       (long long)ferry_cz_compressed_size(z));
		/* windows of 2, 4, then 8 chunks, and from storage the last ones halving (4, 2, 2): 150
		 * chunks in 22 windows (20 where the file system keeps the file in memory, tmpfs); 16
		 * slots hold the first 16 (2 + 4 + 14 x 8 = 118 chunks) at once, far past the 2 the
		 * pipeline read ahead before */
		int on_disk = !resident(path);
		T_EQ_INT((long long)ph.windows, on_disk ? 22 : 20);
		/* a read into device memory: 128 MiB windows, or for one in memory an eighth of a read
		 * past 1 GiB up to 256 MiB, unless cz_window names one */
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 512ull << 20, 1), 128ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 1ull << 30, 1), 128ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 3ull << 29, 1), 192ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 2ull << 30, 1), 256ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 64ull << 30, 1), 256ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 2ull << 30, 0), 128ll << 20); /* from storage */
		T_EQ_INT(ferry_cz_set(z, "cz_window", "512m"), 0);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 2ull << 30, 1), 512ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 2ull << 30, 0), 512ll << 20);
		T_EQ_INT((long long)ferry__cz_window_bytes(z, 1ull << 20, 1), 512ll << 20);
		T_EQ_INT(ferry_cz_set(z, "cz_window", "0"), 0);
		T_EQ_INT((int)ph.slots, 16);
		T_CHECK(ph.max_inflight > (uint64_t)ferry_cz_compressed_size(z) / 2);
		T_CHECK(ph.max_inflight <= (uint64_t)ferry_cz_compressed_size(z) + 32 * CZ_ALIGN_T);
		/* two reads at once on one reader: one takes the idle slots, the other its own */
		struct conc cc[2] = {{z, data, n, 0}, {z, data, n, 0}};
		pthread_t tid[2];
		for (int k = 0; k < 2; k++)
			T_ASSERT(pthread_create(&tid[k], NULL, conc_read, &cc[k]) == 0);
		for (int k = 0; k < 2; k++)
			pthread_join(tid[k], NULL);
		T_CHECK(cc[0].ok && cc[1].ok);
		ferry_cz_destroy(z);
		damaged(ctx, path, data, n);
		/* a context whose queue is one chunk: only the next window is read ahead */
		ferry_ctx *small;
		T_ASSERT(ferry_ctx_create(&small) == 0);
		T_ASSERT(ferry_ctx_set(small, "threads", "1") == 0 && ferry_ctx_set(small, "queue_depth", "1") == 0 &&
			 ferry_ctx_set(small, "chunk_size", "64k") == 0);
		z = open_cz(small, path);
		check_range(z, path, data, 0, n, 1, "whole, cold, a queue of 64 KiB");
		ferry__cz_last_phases(z, &ph);
		printf("%s: queue of 64 KiB: %llu windows, at most %llu bytes read at once\n", ferry_cz_codec_name(c),
		       (unsigned long long)ph.windows, (unsigned long long)ph.max_inflight);
		T_EQ_INT((long long)ph.windows, on_disk ? 22 : 20);
		T_CHECK(ph.max_inflight <= 2 * (8 * (uint64_t)CS + 64 * 8 + 2 * CZ_ALIGN_T)); /* two windows at most */
		T_EQ_INT((int)ph.slots, 3); /* and only three window buffers made */
		/* the file in the page cache: nothing waits for storage, the windows do not halve */
		load(path);
		T_CHECK(resident(path));
		check_range(z, path, data, 0, n, 0, "whole, resident");
		ferry__cz_last_phases(z, &ph);
		T_EQ_INT((long long)ph.windows, 20);
		ferry_cz_destroy(z);
		ferry_ctx_destroy(small);
		unlink(path);
	}
	free(data);
	ferry_ctx_destroy(ctx);
	return t_result();
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "bench"))
		return bench(argv[2], (size_t)atol(argv[3]) << 20, argc > 4 ? argv[4] : "/dev/shm");
	return main_tests();
}
