/* ferry bench --verify: checksummed blocks that carry their own file offset. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

/*
 * Block header, little-endian as written by the host (layout documented in docs/BENCH.md):
 *   0 magic "FERRYVB1", 8 file offset, 16 seed, 24 block length (u32), 28 algorithm (u32: 1 xxh3,
 *   2 crc32c), 32 checksum (u64) of the whole block computed with this field zero.
 */
static const char verify_magic[8] = {'F', 'E', 'R', 'R', 'Y', 'V', 'B', '1'};
#define CSUM_AT 32

const char *bench_verify_name(enum bench_verify v)
{
	switch (v) {
	case BENCH_VERIFY_XXH3:
		return "xxh3";
	case BENCH_VERIFY_CRC32C:
		return "crc32c";
	default:
		return "off";
	}
}

static uint64_t checksum(enum bench_verify v, const void *block, size_t len)
{
	uint64_t h;
	if (v == BENCH_VERIFY_XXH3) /* fails only on a NULL argument */
		return ferry_xxh3(block, len, &h) ? 0 : h;
	return ferry_tools_crc32c(0, block, len);
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

void bench_verify_fill(enum bench_verify v, void *block, size_t len, uint64_t off, uint64_t seed)
{
	uint8_t *b = block;
	uint64_t s = seed ^ (off * 0xD6E8FEB86659FD93ull);
	size_t i = BENCH_VERIFY_HEADER;
	for (; i + 8 <= len; i += 8)
		put64(b + i, splitmix64(&s));
	if (i < len) {
		uint64_t w = splitmix64(&s);
		memcpy(b + i, &w, len - i);
	}
	memcpy(b, verify_magic, 8);
	put64(b + 8, off);
	put64(b + 16, seed);
	put32(b + 24, (uint32_t)len);
	put32(b + 28, (uint32_t)v);
	put64(b + CSUM_AT, 0);
	put64(b + CSUM_AT, checksum(v, b, len));
}

int bench_verify_check(enum bench_verify v, void *block, size_t len, uint64_t off, const char *path,
		       char *msg, size_t msglen)
{
	uint8_t *b = block;
	if (memcmp(b, verify_magic, 8)) {
		snprintf(msg, msglen,
			 "verify failed at offset %" PRIu64 " of %s: the block has no ferry verify header "
			 "(the file was not written by 'ferry bench --verify', or the header is corrupt)",
			 off, path);
		return -1;
	}
	uint32_t blen = get32(b + 24), algo = get32(b + 28);
	if (blen != len) {
		snprintf(msg, msglen,
			 "verify failed at offset %" PRIu64 " of %s: the block was written with --bs %" PRIu32
			 " but is read with --bs %zu",
			 off, path, blen, len);
		return -1;
	}
	if (algo != (uint32_t)v) {
		snprintf(msg, msglen,
			 "verify failed at offset %" PRIu64 " of %s: the block was written with --verify=%s, "
			 "not --verify=%s",
			 off, path, bench_verify_name((enum bench_verify)algo), bench_verify_name(v));
		return -1;
	}
	uint64_t stored = get64(b + CSUM_AT);
	put64(b + CSUM_AT, 0);
	uint64_t computed = checksum(v, b, len);
	put64(b + CSUM_AT, stored);
	if (stored != computed) {
		snprintf(msg, msglen,
			 "verify failed: checksum mismatch in the %zu-byte block at offset %" PRIu64
			 " of %s (%s stored 0x%" PRIx64 ", computed 0x%" PRIx64 ")",
			 len, off, path, bench_verify_name(v), stored, computed);
		return -1;
	}
	uint64_t found = get64(b + 8);
	if (found != off) {
		snprintf(msg, msglen,
			 "verify failed: misplaced data at offset %" PRIu64 " of %s: expected the block "
			 "for offset %" PRIu64 ", found the block written for offset %" PRIu64,
			 off, path, off, found);
		return -1;
	}
	return 0;
}
