/*
 * XXH3-64 with xxhash's AVX2 code (xxh.h), for xxh.c to call where the CPU has AVX2 (a run-time
 * check): the rest of ferry is built for baseline x86-64, where xxhash.h takes its SSE2 code. On a
 * 256 KiB buffer that hashed at 9.2 GB/s against 30 with AVX2 (development VM), and a frame's XXH3
 * was a fifth to a quarter of the loader's pipeline thread with compressed shards on the GPU
 * (PERFORMANCE.md, "The loader over compressed shards on the GPU machine").
 */
#include <stddef.h>
#include <stdint.h>

#include "base/xxh.h"

#if FERRY__XXH_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#include <immintrin.h> /* xxhash.h includes it only where __AVX2__ is defined, as GCC's pragma does and clang's does not */
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

uint64_t ferry__xxh3_64_avx2(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}

void ferry__xxh3_update_avx2(void *state, const void *p, size_t len)
{
	XXH3_64bits_update(state, p, len);
}

uint64_t ferry__xxh3_digest_avx2(const void *state)
{
	return XXH3_64bits_digest(state);
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
