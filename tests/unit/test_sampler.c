/* Sample orders without PyTorch: mt19937 reference values, randperm properties, DistributedSampler
 * arithmetic and padding, block order, the shard-window order's shards.
 * tests/python/test_sampler_torch.py compares with torch. */
#include "ferry_test.h"
#include "ferry/data.h"
#include "loader/sampler.h"

static int is_perm(const int64_t *p, uint64_t n)
{
	uint8_t *seen = calloc(n ? n : 1, 1);
	int ok = 1;
	for (uint64_t i = 0; i < n; i++) {
		if (p[i] < 0 || (uint64_t)p[i] >= n || seen[p[i]])
			ok = 0;
		else
			seen[p[i]] = 1;
	}
	free(seen);
	return ok;
}

int main(void)
{
	/* std::mt19937 with its default seed 5489: the 10000th output is 4123659995 (C++11 [rand.predef]) */
	struct ferry__mt19937 mt;
	ferry__mt_seed(&mt, 5489);
	uint32_t v = 0;
	for (int i = 0; i < 10000; i++)
		v = ferry__mt_u32(&mt);
	T_EQ_INT(v, 4123659995u);
	/* torch seeds with the low 32 bits */
	struct ferry__mt19937 a, b;
	ferry__mt_seed(&a, 7);
	ferry__mt_seed(&b, 7 + (1ull << 32));
	T_EQ_INT(ferry__mt_u32(&a), ferry__mt_u32(&b));
	/* torch.randperm(5, generator=torch.Generator().manual_seed(0)) == [4, 0, 1, 3, 2] (torch 2.15) */
	int64_t p5[5], want5[5] = {4, 0, 1, 3, 2};
	T_ASSERT(ferry_randperm(5, 0, p5) == 0);
	T_CHECK(memcmp(p5, want5, sizeof(p5)) == 0);

	for (uint64_t n = 0; n < 300; n += 7) {
		int64_t *p = malloc((n + 1) * 8);
		T_ASSERT(ferry_randperm(n, n * 3, p) == 0);
		T_CHECK(is_perm(p, n));
		for (uint64_t block = 1; block < 40; block += 13) {
			T_ASSERT(ferry_order_indices(n, FERRY_ORDER_BLOCK, block, 1, 2, p) == 0);
			T_CHECK(is_perm(p, n));
		}
		T_ASSERT(ferry_order_indices(n, FERRY_ORDER_SEQUENTIAL, 0, 0, 0, p) == 0);
		for (uint64_t i = 0; i < n; i++)
			T_EQ_INT(p[i], i);
		free(p);
	}
	/* block order keeps neighbours together: the first `block` outputs span at most block ids */
	{
		int64_t p[1000];
		T_ASSERT(ferry_order_indices(1000, FERRY_ORDER_BLOCK, 100, 4, 0, p) == 0);
		for (int j = 0; j < 10; j++) {
			int64_t lo = p[j * 100], hi = p[j * 100];
			for (int i = 0; i < 100; i++) {
				lo = p[j * 100 + i] < lo ? p[j * 100 + i] : lo;
				hi = p[j * 100 + i] > hi ? p[j * 100 + i] : hi;
			}
			T_EQ_INT(hi - lo, 99);
			T_EQ_INT(lo % 100, 0);
		}
		int64_t q[1000];
		T_ASSERT(ferry_order_indices(1000, FERRY_ORDER_BLOCK, 100, 4, 1, q) == 0);
		T_CHECK(memcmp(p, q, sizeof(p)) != 0); /* epochs differ */
	}
	/* DistributedSampler's sizes: ceil(n / R), or with drop_last ceil((n - R) / R) */
	T_EQ_INT(ferry_distributed_num_samples(10, 3, 0), 4);
	T_EQ_INT(ferry_distributed_num_samples(10, 3, 1), 3);
	T_EQ_INT(ferry_distributed_num_samples(9, 3, 1), 3);
	T_EQ_INT(ferry_distributed_num_samples(2, 3, 1), 0);
	T_EQ_INT(ferry_distributed_num_samples(2, 3, 0), 1);
	/* padding repeats the order's start: n=2, R=5 gives 0 1 0 1 0 unshuffled */
	int64_t out[8];
	for (uint32_t r = 0; r < 5; r++) {
		T_EQ_INT(ferry_distributed_indices(2, 5, r, 0, 0, 0, 0, out, 8), 1);
		T_EQ_INT(out[0], r % 2);
	}
	T_EQ_INT(ferry_distributed_indices(10, 3, 3, 1, 0, 0, 0, out, 8), -EINVAL);
	T_EQ_INT(ferry_distributed_indices(10, 3, 0, 1, 0, 0, 0, out, 2), -EINVAL);
	T_EQ_INT(ferry_distributed_indices(0, 3, 0, 1, 0, 0, 0, out, 0), 0);
	/* every index once across ranks (with padding) for many shapes */
	for (uint64_t n = 1; n < 200; n += 11)
		for (uint32_t R = 1; R < 9; R++)
			for (int dl = 0; dl < 2; dl++) {
				uint64_t per = ferry_distributed_num_samples(n, R, dl);
				uint32_t *seen = calloc(n, 4);
				int64_t *ix = malloc((per + 1) * 8);
				for (uint32_t r = 0; r < R; r++) {
					T_EQ_INT(ferry_distributed_indices(n, R, r, 1, 11, 2, dl, ix, per), per);
					for (uint64_t j = 0; j < per; j++)
						seen[ix[j]]++;
				}
				uint64_t tot = 0, maxc = 0;
				for (uint64_t i = 0; i < n; i++) {
					tot += seen[i];
					maxc = seen[i] > maxc ? seen[i] : maxc;
				}
				T_EQ_INT(tot, per * R);
				if (dl)
					T_CHECK(maxc <= 1);
				else
					T_CHECK(maxc <= (R + n - 1) / n + 1);
				free(seen);
				free(ix);
			}
	/* the shard-window order's shards alone (the dataset cache's plan of the next epoch) are the
	 * ones the full order takes, epoch by epoch */
	{
		uint64_t bound[8] = {0, 3, 3, 7, 12, 13, 20, 26}; /* 7 shards, one empty */
		int64_t items[26];
		uint32_t wa[7], wb[7];
		for (uint64_t ep = 0; ep < 5; ep++) {
			T_EQ_INT(ferry__window_order(26, bound, 7, 2, 9, ep, items, wa), 0);
			T_EQ_INT(ferry__window_shards(7, 9, ep, wb), 0);
			T_CHECK(memcmp(wa, wb, sizeof(wa)) == 0);
		}
	}
	return t_result();
}
