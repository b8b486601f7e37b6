/* Property tests of the chunk arithmetic: planning of aligned/unaligned pieces and chunk cutting. */
#include "ferry_test.h"
#include "engine/engine.h"

static void check_plan(uint64_t off, size_t len, uintptr_t addr, uint32_t bs, uint32_t ma,
		       bool direct, bool wr, size_t slot)
{
	struct ferry__plan p;

	ferry__plan_chunk(off, len, addr, bs, ma, direct, wr, slot, &p);
	bool aligned = off % bs == 0 && len % bs == 0 && addr % ma == 0;
	if (!direct || len == 0) {
		T_EQ_INT(p.mode, FERRY__CH_BUFFERED);
		return;
	}
	if (aligned) {
		T_EQ_INT(p.mode, FERRY__CH_DIRECT);
		T_EQ_INT(p.io_off, off);
		T_EQ_INT(p.io_len, len);
		return;
	}
	switch (p.mode) {
	case FERRY__CH_BOUNCE:
		/* the transfer is aligned, covers the request and fits the slot */
		T_EQ_INT(p.io_off % bs, 0);
		T_EQ_INT(p.io_len % bs, 0);
		T_CHECK(p.io_off <= off);
		T_CHECK(p.io_off + p.io_len >= off + len);
		T_CHECK(p.io_off + p.io_len - (off + len) < bs);
		T_CHECK(off - p.io_off < bs);
		T_CHECK(p.io_len <= slot);
		if (wr) { /* writes never widen the range: no read-modify-write */
			T_EQ_INT(p.io_off, off);
			T_EQ_INT(p.io_len, len);
		}
		break;
	case FERRY__CH_BUFFERED:
		T_EQ_INT(p.io_off, off);
		T_EQ_INT(p.io_len, len);
		if (!wr) /* reads only go buffered when the aligned superset cannot fit */
			T_CHECK((off + len + bs - 1) / bs * bs - off / bs * bs > slot);
		else
			T_CHECK(off % bs || len % bs || len > slot);
		break;
	default:
		T_CHECK(!"unaligned request planned as DIRECT");
	}
}

/* A worker's share of the work list: an even split of the listed bytes over the workers, at least
 * 2 MiB, so that 32 pieces of 1 MiB reach 8 workers (4 MiB each) and small pieces stay together. */
static void test_take_share(void)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "threads", "8") == 0);
	T_ASSERT(ferry_ctx_start(ctx) == 0);
	T_EQ_INT((long long)ferry__take_share(ctx, 32ull << 20), 4ll << 20);
	T_EQ_INT((long long)ferry__take_share(ctx, 32ull << 12), 2ll << 20);
	T_EQ_INT((long long)ferry__take_share(ctx, 1ull << 30), 128ll << 20);
	ferry_ctx_destroy(ctx);
}

int main(void)
{
	uint64_t seed = 0x1234567;
	test_take_share();
	const uint32_t bss[] = {512, 4096};
	const uint64_t chunks[] = {4096, 65536, 1 << 20, 3 * 4096};

	for (int i = 0; i < 200000; i++) {
		uint32_t bs = bss[t_rand(&seed) % 2];
		uint32_t ma = t_rand(&seed) % 2 ? bs : 4096;
		uint64_t off = t_rand(&seed) % (1ull << 34);
		if (t_rand(&seed) % 3 == 0)
			off -= off % bs;
		size_t len = (size_t)(t_rand(&seed) % (3u << 20));
		if (t_rand(&seed) % 3 == 0)
			len -= len % bs;
		uintptr_t addr = (uintptr_t)(t_rand(&seed) % (1ull << 40));
		if (t_rand(&seed) % 2)
			addr -= addr % 4096;
		size_t slot = (size_t)(1 << 20) + 128 * 1024;
		check_plan(off, len, addr, bs, ma, t_rand(&seed) % 8 != 0, t_rand(&seed) % 2, slot);
		if (t_failures > 20)
			break;
	}

	/* chunk cutting: the pieces tile the request exactly, never cross a chunk boundary, and
	 * their number is ferry__chunk_count */
	for (int i = 0; i < 100000; i++) {
		uint64_t cs = chunks[t_rand(&seed) % 4];
		uint64_t off = t_rand(&seed) % (1ull << 36);
		uint64_t len = t_rand(&seed) % (cs * 5 + 2);
		uint64_t cur = off, end = off + len, n = 0;
		while (cur < end) {
			uint64_t e = ferry__chunk_end(cur, end, cs);
			T_CHECK(e > cur);
			T_CHECK(e <= end);
			T_EQ_INT(cur / cs, (e - 1) / cs); /* one window */
			cur = e;
			n++;
		}
		T_EQ_INT(cur, end);
		T_EQ_INT(n, ferry__chunk_count(off, len, cs));
		if (t_failures > 20)
			break;
	}
	T_EQ_INT(ferry__chunk_count(0, 0, 4096), 0);
	T_EQ_INT(ferry__chunk_count(4095, 2, 4096), 2);
	T_EQ_INT(ferry__chunk_count(4096, 4096, 4096), 1);
	return t_result();
}
