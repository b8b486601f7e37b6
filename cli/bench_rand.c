/*
 * ferry bench: where each random I/O goes. The semantics are fio's, since `ferry bench` is read
 * next to fio (bench/vs-fio.sh) and the order of random offsets decides how much of a buffered run
 * the kernel's read-ahead serves from memory (half a pass of a 1 GiB file: fio's order missed the
 * page cache on 65% of its reads, a permutation on 91-93%).
 *
 *  - map (fio's default, random_generator=tausworthe): a uniform pick over the region; a block
 *    already done this pass is replaced by the next block not done after it, wrapping (fio's
 *    axmap_next_free). Each block once per pass.
 *  - perm (fio's random_generator=lfsr): a keyed bijection of the region walked by a counter.
 *    Each block once per pass, never a collision; not fio's LFSR, but the same property.
 *  - norandommap (with map): uniform picks with repeats and no passes, as fio's --norandommap.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* xorshift64*: cheap enough per I/O, and seeded per job so runs repeat (fio's randrepeat). */
uint64_t bench_rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

uint64_t bench_rng_below(uint64_t *s, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)bench_rng_next(s) * n) >> 64);
}

const char *bench_randgen_name(enum bench_randgen g)
{
	return g == BENCH_RANDGEN_PERM ? "lfsr" : "tausworthe";
}

/* ------------------------------------------------------------------------- perm: keyed bijection */

static void perm_key(struct bench_offsets *g, uint64_t *rng)
{
	g->i = 0;
	g->k1 = bench_rng_next(rng) & g->mask;
	g->k2 = bench_rng_next(rng) & g->mask;
}

/* Cycle walking: values >= n of the bijection of [0, 2^bits) are skipped. */
static uint64_t perm_next(struct bench_offsets *g, uint64_t *rng, int *new_pass)
{
	for (;;) {
		if (g->i > g->mask) {
			perm_key(g, rng);
			*new_pass = 1;
		}
		uint64_t x = (g->i++ ^ g->k1) & g->mask;
		x = (x * 0x9E3779B97F4A7C15ull) & g->mask;
		x ^= x >> g->shift;
		x = (x * 0xBF58476D1CE4E5B9ull) & g->mask;
		x ^= x >> g->shift;
		x = (x + g->k2) & g->mask;
		if (x < g->n)
			return x;
	}
}

/* ------------------------------------------------------------------- map: blocks done this pass */

/* Two levels: bit b of bits is block b; bit w of full says word w of bits is all ones, so that a
 * search near the end of a pass skips done words 64 at a time. Bits past n are set. */
static void map_clear(struct bench_offsets *g)
{
	memset(g->bits, 0, g->nwords * sizeof(*g->bits));
	memset(g->full, 0, g->nfull * sizeof(*g->full));
	if (g->n % 64)
		g->bits[g->nwords - 1] = ~0ull << (g->n % 64);
	if (g->nwords % 64)
		g->full[g->nfull - 1] = ~0ull << (g->nwords % 64);
	g->done = 0;
}

static void map_set(struct bench_offsets *g, uint64_t b)
{
	uint64_t w = b / 64;
	g->bits[w] |= 1ull << (b % 64);
	if (g->bits[w] == ~0ull)
		g->full[w / 64] |= 1ull << (w % 64);
	g->done++;
}

/* First block not done at or after b, or UINT64_MAX. */
static uint64_t map_find(const struct bench_offsets *g, uint64_t b)
{
	uint64_t w = b / 64;
	uint64_t m = ~g->bits[w] & (~0ull << (b % 64));
	if (m)
		return w * 64 + (uint64_t)__builtin_ctzll(m);
	for (uint64_t v = w + 1; v < g->nwords;) {
		uint64_t f = ~g->full[v / 64] & (~0ull << (v % 64));
		if (f) {
			v = v / 64 * 64 + (uint64_t)__builtin_ctzll(f);
			return v * 64 + (uint64_t)__builtin_ctzll(~g->bits[v]);
		}
		v = (v / 64 + 1) * 64;
	}
	return UINT64_MAX;
}

static uint64_t map_next(struct bench_offsets *g, uint64_t *rng, int *new_pass)
{
	if (g->done == g->n) {
		map_clear(g);
		*new_pass = 1;
	}
	uint64_t b = bench_rng_below(rng, g->n);
	if (g->bits[b / 64] & (1ull << (b % 64))) {
		/* fio's axmap_next_free: the next free block after b, from the start past the end */
		uint64_t nb = b + 1 < g->n ? map_find(g, b + 1) : UINT64_MAX;
		b = nb != UINT64_MAX ? nb : map_find(g, 0);
	}
	map_set(g, b);
	return b;
}

/* -------------------------------------------------------------------------------------------- api */

int bench_offsets_init(struct bench_offsets *g, uint64_t nblocks, enum bench_randgen gen, int norandommap,
		       uint64_t *rng)
{
	memset(g, 0, sizeof(*g));
	g->n = nblocks;
	g->gen = gen;
	g->norandommap = norandommap && gen == BENCH_RANDGEN_MAP;
	if (!nblocks)
		return -EINVAL;
	if (gen == BENCH_RANDGEN_PERM) {
		unsigned bits = 0;
		while (bits < 64 && (1ull << bits) < nblocks)
			bits++;
		g->mask = bits >= 64 ? UINT64_MAX : (1ull << bits) - 1;
		g->shift = bits / 2 + 1;
		perm_key(g, rng);
		return 0;
	}
	if (g->norandommap)
		return 0;
	g->nwords = (nblocks + 63) / 64;
	g->nfull = (g->nwords + 63) / 64;
	g->bits = malloc(g->nwords * sizeof(*g->bits));
	g->full = malloc(g->nfull * sizeof(*g->full));
	if (!g->bits || !g->full) {
		bench_offsets_free(g);
		return -ENOMEM;
	}
	map_clear(g);
	return 0;
}

uint64_t bench_offsets_next(struct bench_offsets *g, uint64_t *rng, int *new_pass)
{
	if (g->gen == BENCH_RANDGEN_PERM)
		return perm_next(g, rng, new_pass);
	if (g->norandommap)
		return bench_rng_below(rng, g->n);
	return map_next(g, rng, new_pass);
}

void bench_offsets_free(struct bench_offsets *g)
{
	free(g->bits);
	free(g->full);
	g->bits = NULL;
	g->full = NULL;
}
