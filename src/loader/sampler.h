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

#endif
