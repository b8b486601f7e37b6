/* Sample orders: torch's CPU generator (mt19937) and randperm, DistributedSampler, block shuffle. */
#ifndef FERRY_LOADER_SAMPLER_H
#define FERRY_LOADER_SAMPLER_H

#include <stdint.h>

/* at::mt19937 as torch's CPUGeneratorImpl holds it: seeded with the low 32 bits of the seed. */
struct ferry__mt19937 {
	uint32_t s[624];
	int next;
};
void ferry__mt_seed(struct ferry__mt19937 *mt, uint64_t seed);
uint32_t ferry__mt_u32(struct ferry__mt19937 *mt);
/* CPUGeneratorImpl::random64: two draws, the first one the high half. */
uint64_t ferry__mt_u64(struct ferry__mt19937 *mt);

/* randperm_cpu on a fresh generator: out[n]. */
void ferry__randperm(uint64_t n, uint64_t seed, int64_t *out);

/*
 * The window shuffle (the loader's shard_window, and chunk_window over compressed shards): units
 * (shards, or runs of a compressed shard's chunks) permuted (randperm of nshards units, seed +
 * epoch), taken `window` at a time, and each window's items (unit s holds items
 * bound[s] .. bound[s + 1] - 1, bound[nshards] = n) shuffled together, the same generator going on.
 * out: n items; shards: the permuted units (nshards). 0 or -errno.
 */
int ferry__window_order(uint64_t n, const uint64_t *bound, uint32_t nshards, uint32_t window, uint64_t seed,
			uint64_t epoch, int64_t *out, uint32_t *shards);
/* Only the shards' order of ferry__window_order (for a later epoch's, ahead: the dataset cache's
 * plan). 0 or -ENOMEM. */
int ferry__window_shards(uint32_t nshards, uint64_t seed, uint64_t epoch, uint32_t *shards);

#endif
