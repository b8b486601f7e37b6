/*
 * Minimal test helpers for standalone test programs: exit 0 pass, 1 fail, 77 skip (liburing's
 * convention). Failed checks print both sides (libuv's test/task.h).
 */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

static int t_failures;

/* Makes a raw LZ4 block (liblz4's output, at blk) decode to one byte more: its first sequence's
 * match one longer (its token's nibble, or its first extra length byte). A crafted block for the
 * tests of the walk that bounds a block before nvCOMP. */
static inline void t_lz4_longer(unsigned char *blk)
{
	unsigned char *tok = blk, *p = blk + 1;
	size_t lit = *tok >> 4;
	if (lit == 15)
		for (unsigned char x = 255; x == 255; lit += (x = *p++))
			;
	p += lit + 2;
	if ((*tok & 15) < 15)
		*tok += 1;
	else
		*p += 1;
}

static inline int t_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p) && errno != ENOENT ? -1 : 0;
}

/* Removes path and everything under it, never following a symlink: rm -rf without a shell. 0
 * (a missing path too), or -1 with errno. */
static inline int t_rmtree(const char *path)
{
	struct stat st;
	if (lstat(path, &st))
		return errno == ENOENT ? 0 : -1;
	return nftw(path, t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

#define T_CHECK(cond)                                                                  \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			t_failures++;                                                  \
		}                                                                      \
	} while (0)

#define T_EQ_INT(a, b)                                                                          \
	do {                                                                                    \
		long long t_a_ = (long long)(a), t_b_ = (long long)(b);                         \
		if (t_a_ != t_b_) {                                                             \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, \
				#a, #b, t_a_, t_b_);                                            \
			t_failures++;                                                           \
		}                                                                               \
	} while (0)

#define T_EQ_STR(a, b)                                                                          \
	do {                                                                                    \
		const char *t_a_ = (a), *t_b_ = (b);                                            \
		if (strcmp(t_a_, t_b_) != 0) {                                                  \
			fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, \
				__LINE__, #a, #b, t_a_, t_b_);                                  \
			t_failures++;                                                           \
		}                                                                               \
	} while (0)

/* Fatal: stop the test now. */
#define T_ASSERT(cond)                                                                 \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(T_EXIT_FAIL);                                             \
		}                                                                      \
	} while (0)

#define T_SKIP(...)                                       \
	do {                                              \
		fprintf(stdout, "skipped: " __VA_ARGS__); \
		fprintf(stdout, "\n");                    \
		exit(T_EXIT_SKIP);                        \
	} while (0)

static inline int t_result(void)
{
	if (t_failures) {
		fprintf(stderr, "%d check(s) failed\n", t_failures);
		return T_EXIT_FAIL;
	}
	return T_EXIT_PASS;
}

/* A scratch directory for this test: $FERRY_TEST_TMPDIR (made if missing) or /tmp. */
static inline const char *t_tmpdir(void)
{
	const char *d = getenv("FERRY_TEST_TMPDIR");
	if (!d || !*d)
		return "/tmp";
	mkdir(d, 0755);
	return d;
}

/* Fills buf with a reproducible pattern depending on the absolute file offset of each byte. */
static inline void t_fill_pattern(unsigned char *buf, size_t len, uint64_t offset, uint32_t seed)
{
	for (size_t i = 0; i < len; i++) {
		uint64_t x = (offset + i) * 0x9E3779B97F4A7C15ull ^ seed;
		x ^= x >> 29;
		buf[i] = (unsigned char)(x ^ (x >> 17));
	}
}

/* Simple xorshift PRNG for property tests. */
/* qsort's comparison of doubles */
static inline int t_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorted in place); -1 when n is 0 or a value is negative (a run that
 * failed). The benchmarks' targets are judged on medians of rounds. */
static inline double t_median(double *v, int n)
{
	for (int i = 0; i < n; i++)
		if (v[i] < 0)
			return -1;
	if (n <= 0)
		return -1;
	qsort(v, (size_t)n, sizeof(*v), t_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static inline uint64_t t_rand(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

#endif
