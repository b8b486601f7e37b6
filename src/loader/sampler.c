/*
 * Sample orders. The shuffle reproduces torch.utils.data.DistributedSampler exactly: torch's CPU
 * generator is std::mt19937 seeded with the low 32 bits of manual_seed's value
 * (aten/src/ATen/core/MT19937RNGEngine.h), and randperm_cpu (aten/src/ATen/native/TensorFactories.cpp)
 * swaps forward with random() % (n - i) while n < UINT32_MAX / 20, and above that runs the
 * inside-out Fisher-Yates with random64() % (i + 1), random64 being two draws, high half first.
 */
#include <errno.h>
#include <stdlib.h>

#include "base/base.h"
#include "ferry/data.h"
#include "loader/sampler.h"

#define MT_N 624
#define MT_M 397

void ferry__mt_seed(struct ferry__mt19937 *mt, uint64_t seed)
{
	mt->s[0] = (uint32_t)seed;
	for (int i = 1; i < MT_N; i++)
		mt->s[i] = 1812433253u * (mt->s[i - 1] ^ (mt->s[i - 1] >> 30)) + (uint32_t)i;
	mt->next = MT_N;
}

static void twist(struct ferry__mt19937 *mt)
{
	uint32_t *s = mt->s;
	for (int i = 0; i < MT_N; i++) {
		uint32_t y = (s[i] & 0x80000000u) | (s[(i + 1) % MT_N] & 0x7fffffffu);
		s[i] = s[(i + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
	}
	mt->next = 0;
}

uint32_t ferry__mt_u32(struct ferry__mt19937 *mt)
{
	if (mt->next >= MT_N)
		twist(mt);
	uint32_t y = mt->s[mt->next++];
	y ^= y >> 11;
	y ^= (y << 7) & 0x9d2c5680u;
	y ^= (y << 15) & 0xefc60000u;
	y ^= y >> 18;
	return y;
}

uint64_t ferry__mt_u64(struct ferry__mt19937 *mt)
{
	uint64_t hi = ferry__mt_u32(mt);
	uint64_t lo = ferry__mt_u32(mt);
	return hi << 32 | lo;
}

static void randperm_gen(struct ferry__mt19937 *mt, uint64_t n, int64_t *r)
{
	if (n < UINT32_MAX / 20) {
		for (uint64_t i = 0; i < n; i++)
			r[i] = (int64_t)i;
		for (uint64_t i = 0; i + 1 < n; i++) {
			uint64_t z = ferry__mt_u32(mt) % (n - i);
			int64_t t = r[i];
			r[i] = r[z + i];
			r[z + i] = t;
		}
		return;
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t z = ferry__mt_u64(mt) % (i + 1);
		r[i] = r[z];
		r[z] = (int64_t)i;
	}
}

void ferry__randperm(uint64_t n, uint64_t seed, int64_t *out)
{
	struct ferry__mt19937 mt;
	ferry__mt_seed(&mt, seed);
	randperm_gen(&mt, n, out);
}

int ferry_randperm(uint64_t n, uint64_t seed, int64_t *out)
{
	if (n && !out)
		return ferry__error(-EINVAL, "ferry_randperm: out is NULL");
	if (n > (uint64_t)INT64_MAX)
		return ferry__error(-EINVAL, "ferry_randperm: n %llu too large", (unsigned long long)n);
	ferry__randperm(n, seed, out);
	return 0;
}

uint64_t ferry_distributed_num_samples(uint64_t n, uint32_t num_replicas, int drop_last)
{
	if (!num_replicas)
		return 0;
	if (drop_last && n % num_replicas) {
		if (n < num_replicas)
			return 0;
		return (n - num_replicas + num_replicas - 1) / num_replicas;
	}
	return (n + num_replicas - 1) / num_replicas;
}

int ferry_order_indices(uint64_t n, enum ferry_order order, uint64_t block, uint64_t seed, uint64_t epoch,
			int64_t *out)
{
	if (n && !out)
		return ferry__error(-EINVAL, "ferry_order_indices: out is NULL");
	switch (order) {
	case FERRY_ORDER_SEQUENTIAL:
		for (uint64_t i = 0; i < n; i++)
			out[i] = (int64_t)i;
		return 0;
	case FERRY_ORDER_SHUFFLE:
		ferry__randperm(n, seed + epoch, out);
		return 0;
	case FERRY_ORDER_BLOCK:
		break;
	default:
		return ferry__error(-EINVAL, "ferry_order_indices: unknown order %d", (int)order);
	}
	if (!block)
		return ferry__error(-EINVAL, "ferry_order_indices: block size 0");
	uint64_t nb = (n + block - 1) / block;
	int64_t *perm = malloc((nb ? nb : 1) * sizeof(*perm));
	if (!perm)
		return ferry__error(-ENOMEM, "ferry_order_indices: %llu blocks", (unsigned long long)nb);
	struct ferry__mt19937 mt;
	ferry__mt_seed(&mt, seed + epoch);
	randperm_gen(&mt, nb, perm);
	/* The same generator goes on to shuffle each block in its output position (Fisher-Yates, as
	 * randperm's small-n loop), so one seed fixes the whole order. */
	uint64_t k = 0;
	for (uint64_t j = 0; j < nb; j++) {
		uint64_t first = (uint64_t)perm[j] * block;
		uint64_t len = first + block <= n ? block : n - first;
		int64_t *r = out + k;
		for (uint64_t i = 0; i < len; i++)
			r[i] = (int64_t)(first + i);
		for (uint64_t i = 0; i + 1 < len; i++) {
			uint64_t z = ferry__mt_u32(&mt) % (len - i);
			int64_t t = r[i];
			r[i] = r[z + i];
			r[z + i] = t;
		}
		k += len;
	}
	free(perm);
	return 0;
}

/* Rank r's j-th index is the padded global order at r + j * replicas; padding repeats the order
 * from its start (DistributedSampler's `indices += indices[:padding_size]`, repeated as needed). */
int ferry__distributed_from_order(const int64_t *order, uint64_t n, uint32_t num_replicas,
				  uint32_t rank, uint64_t count, int64_t *out)
{
	for (uint64_t j = 0; j < count; j++)
		out[j] = order[(rank + j * num_replicas) % n];
	return 0;
}

int64_t ferry_distributed_indices(uint64_t n, uint32_t num_replicas, uint32_t rank, int shuffle,
				  uint64_t seed, uint64_t epoch, int drop_last, int64_t *out,
				  size_t out_len)
{
	if (!num_replicas || rank >= num_replicas)
		return ferry__error(-EINVAL, "ferry_distributed_indices: rank %u of %u replicas", rank,
				    num_replicas);
	uint64_t count = ferry_distributed_num_samples(n, num_replicas, drop_last);
	if (out_len < count)
		return ferry__error(-EINVAL, "ferry_distributed_indices: out holds %zu, %llu needed",
				    out_len, (unsigned long long)count);
	if (!count)
		return 0;
	int64_t *order = malloc(n * sizeof(*order));
	if (!order)
		return ferry__error(-ENOMEM, "ferry_distributed_indices: %llu samples", (unsigned long long)n);
	int err = ferry_order_indices(n, shuffle ? FERRY_ORDER_SHUFFLE : FERRY_ORDER_SEQUENTIAL, 0, seed,
				      epoch, order);
	if (!err)
		ferry__distributed_from_order(order, n, num_replicas, rank, count, out);
	free(order);
	return err ? err : (int64_t)count;
}

/* The epoch's shard order (the generator seeded with seed + epoch, its first draws) into
 * shards[nshards]; mt is left where the draws ended, for what follows them. */
static int shard_draws(struct ferry__mt19937 *mt, uint32_t nshards, uint64_t seed, uint64_t epoch, uint32_t *shards)
{
	int64_t *perm = malloc((nshards ? nshards : 1) * sizeof(*perm));
	if (!perm)
		return ferry__error(-ENOMEM, "shard window order: %u shards", nshards);
	ferry__mt_seed(mt, seed + epoch);
	randperm_gen(mt, nshards, perm);
	for (uint32_t j = 0; j < nshards; j++)
		shards[j] = (uint32_t)perm[j];
	free(perm);
	return 0;
}

int ferry__window_order(uint64_t n, const uint64_t *bound, uint32_t nshards, uint32_t window, uint64_t seed,
			uint64_t epoch, int64_t *out, uint32_t *shards)
{
	if (!window || !nshards)
		return ferry__error(-EINVAL, "shard window order: window %u over %u shards", window, nshards);
	struct ferry__mt19937 mt;
	int err = shard_draws(&mt, nshards, seed, epoch, shards);
	if (err)
		return err;
	/* The same generator goes on to shuffle each window's items in their output positions
	 * (Fisher-Yates, as the block order), so one seed fixes the whole order. */
	uint64_t k = 0;
	for (uint32_t w0 = 0; w0 < nshards; w0 += window) {
		uint64_t k0 = k;
		for (uint32_t j = w0; j < nshards && j < w0 + window; j++) {
			uint32_t s = shards[j];
			for (uint64_t i = bound[s]; i < bound[s + 1]; i++)
				out[k++] = (int64_t)i;
		}
		uint64_t len = k - k0;
		int64_t *r = out + k0;
		for (uint64_t i = 0; i + 1 < len; i++) {
			uint64_t z = (len - i <= UINT32_MAX ? ferry__mt_u32(&mt) : ferry__mt_u64(&mt)) % (len - i);
			int64_t t = r[i];
			r[i] = r[z + i];
			r[z + i] = t;
		}
	}
	return k == n ? 0 : ferry__error(-EINVAL, "shard window order: %llu items in the shards, %llu expected",
					 (unsigned long long)k, (unsigned long long)n);
}

int ferry__window_shards(uint32_t nshards, uint64_t seed, uint64_t epoch, uint32_t *shards)
{
	struct ferry__mt19937 mt;
	return shard_draws(&mt, nshards, seed, epoch, shards);
}
