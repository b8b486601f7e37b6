/* ferry bench's random offsets (cli/bench_rand.c) against fio's semantics: with the random map a
 * uniform pick, replaced when already done this pass by the next block not done after it
 * (wrapping); each block once per pass; lfsr a permutation per pass; norandommap no passes. */
#include "ferry_test.h"

#include "../../cli/bench_rand.c"

/* The map: every pick is the raw uniform draw, or the next block not done after it. */
static void check_map(uint64_t n, unsigned passes)
{
	struct bench_offsets g;
	uint64_t rng = 0x9E3779B97F4A7C15ull ^ n, shadow;
	uint8_t *done = calloc(n, 1);
	uint64_t collisions = 0;

	T_ASSERT(done);
	T_EQ_INT(bench_offsets_init(&g, n, BENCH_RANDGEN_MAP, 0, &rng), 0);
	for (unsigned p = 0; p < passes; p++) {
		for (uint64_t k = 0; k < n; k++) {
			int new_pass = 0;
			shadow = rng;
			uint64_t raw = bench_rng_below(&shadow, n), want = raw;
			if (done[raw]) {
				collisions++;
				do
					want = (want + 1) % n;
				while (done[want]);
			}
			uint64_t b = bench_offsets_next(&g, &rng, &new_pass);
			T_EQ_INT(new_pass, p > 0 && k == 0);
			if (b != want) {
				T_EQ_INT(b, want);
				goto out;
			}
			done[b] = 1;
		}
		for (uint64_t k = 0; k < n; k++)
			T_EQ_INT(done[k], 1);
		memset(done, 0, n);
	}
	/* a uniform draw hits a done block about half the time over a pass (n > 1) */
	if (n >= 1000)
		T_CHECK(collisions > (uint64_t)passes * n / 4 && collisions < (uint64_t)passes * n * 3 / 4);
out:
	bench_offsets_free(&g);
	free(done);
}

static void check_perm(uint64_t n)
{
	struct bench_offsets g;
	uint64_t rng = 12345 + n;
	uint8_t *seen = calloc(n, 1);

	T_ASSERT(seen);
	T_EQ_INT(bench_offsets_init(&g, n, BENCH_RANDGEN_PERM, 1 /* ignored, as fio's lfsr */, &rng), 0);
	for (unsigned p = 0; p < 2; p++) {
		memset(seen, 0, n);
		for (uint64_t k = 0; k < n; k++) {
			int new_pass = 0;
			uint64_t b = bench_offsets_next(&g, &rng, &new_pass);
			T_EQ_INT(new_pass, p > 0 && k == 0);
			T_ASSERT(b < n);
			T_EQ_INT(seen[b], 0);
			seen[b] = 1;
		}
	}
	bench_offsets_free(&g);
	free(seen);
}

static void check_norandommap(void)
{
	struct bench_offsets g;
	uint64_t rng = 7, n = 1000, distinct = 0;
	uint8_t seen[1000] = {0};

	T_EQ_INT(bench_offsets_init(&g, n, BENCH_RANDGEN_MAP, 1, &rng), 0);
	T_CHECK(g.bits == NULL);
	for (unsigned k = 0; k < 3 * n; k++) {
		int new_pass = 0;
		uint64_t b = bench_offsets_next(&g, &rng, &new_pass);
		T_EQ_INT(new_pass, 0);
		T_ASSERT(b < n);
		distinct += !seen[b];
		seen[b] = 1;
	}
	/* 3n uniform draws leave about n/e^3 (5%) of the blocks unread */
	T_CHECK(distinct < n && distinct > n * 9 / 10);
	bench_offsets_free(&g);
}

int main(void)
{
	static const uint64_t sizes[] = {1, 2, 3, 63, 64, 65, 127, 128, 1000, 4095, 4096, 4097, 262144 + 17};
	struct bench_offsets g;
	uint64_t rng = 1;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		check_map(sizes[i], sizes[i] > 100000 ? 2 : 3);
		check_perm(sizes[i]);
	}
	check_norandommap();
	T_EQ_INT(bench_offsets_init(&g, 0, BENCH_RANDGEN_MAP, 0, &rng), -EINVAL);
	bench_offsets_free(&g);
	T_EQ_STR(bench_randgen_name(BENCH_RANDGEN_MAP), "tausworthe");
	T_EQ_STR(bench_randgen_name(BENCH_RANDGEN_PERM), "lfsr");
	return t_result();
}
