/*
 * XXH3-64, the checksum ferry stores per tensor (safetensors' __metadata__, docs/CHECKPOINTS.md).
 * Always built in: xxhash.h is required at build time and compiled into xxh.c alone (header-only,
 * XXH_INLINE_ALL), so every build reads and writes the same files and nothing links libxxhash.
 */
#ifndef FERRY_BASE_XXH_H
#define FERRY_BASE_XXH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 (seed 0) of len bytes. */
uint64_t ferry__xxh3_64(const void *buf, size_t len);

/* Streaming XXH3-64 (seed 0); create returns NULL only when out of memory; destroy(NULL) does nothing. */
struct ferry__xxh3;
struct ferry__xxh3 *ferry__xxh3_create(void);
void ferry__xxh3_reset(struct ferry__xxh3 *h);
void ferry__xxh3_update(struct ferry__xxh3 *h, const void *p, size_t len);
uint64_t ferry__xxh3_digest(struct ferry__xxh3 *h);
void ferry__xxh3_destroy(struct ferry__xxh3 *h);

/* xxh_avx2.c: the same with xxhash's AVX2 code, where x86-64 builds have it; xxh.c calls them
 * only where the CPU has AVX2. state is xxh.c's XXH3_state_t. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FERRY__XXH_AVX2 1
uint64_t ferry__xxh3_64_avx2(const void *buf, size_t len);
void ferry__xxh3_update_avx2(void *state, const void *p, size_t len);
uint64_t ferry__xxh3_digest_avx2(const void *state);
#else
#define FERRY__XXH_AVX2 0
#endif

#endif
