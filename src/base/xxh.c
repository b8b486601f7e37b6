/* XXH3-64 from xxhash.h, header-only (xxh.h); xxh_avx2.c's where the CPU has AVX2. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/xxh.h"

struct ferry__xxh3 {
	XXH3_state_t *s;
};

#if FERRY__XXH_AVX2
/* __builtin_cpu_supports reads what libgcc found once at start-up (as crc32c.c's check) */
#define AVX2() __builtin_cpu_supports("avx2")
#else
#define AVX2() 0
#define ferry__xxh3_64_avx2(b, n) 0
#define ferry__xxh3_update_avx2(s, p, n) ((void)0)
#define ferry__xxh3_digest_avx2(s) 0
#endif

uint64_t ferry__xxh3_64(const void *buf, size_t len)
{
	return AVX2() ? ferry__xxh3_64_avx2(buf, len) : XXH3_64bits(buf, len);
}

struct ferry__xxh3 *ferry__xxh3_create(void)
{
	struct ferry__xxh3 *h = malloc(sizeof(*h));
	if (!h)
		return NULL;
	if (!(h->s = XXH3_createState())) {
		free(h);
		return NULL;
	}
	XXH3_64bits_reset(h->s);
	return h;
}

void ferry__xxh3_reset(struct ferry__xxh3 *h)
{
	XXH3_64bits_reset(h->s);
}

void ferry__xxh3_update(struct ferry__xxh3 *h, const void *p, size_t len)
{
	if (AVX2())
		ferry__xxh3_update_avx2(h->s, p, len);
	else
		XXH3_64bits_update(h->s, p, len);
}

uint64_t ferry__xxh3_digest(struct ferry__xxh3 *h)
{
	return AVX2() ? ferry__xxh3_digest_avx2(h->s) : XXH3_64bits_digest(h->s);
}

void ferry__xxh3_destroy(struct ferry__xxh3 *h)
{
	if (h) {
		XXH3_freeState(h->s);
		free(h);
	}
}
