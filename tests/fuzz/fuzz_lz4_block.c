/* libFuzzer target: the walk that bounds a raw LZ4 block before nvCOMP decodes it
 * (ferry__lz4_walk, src/base/lz4_walk.h) on arbitrary bytes. The first two bytes are the size the
 * block must decode to (1 to 65536), the rest the block. Whatever the walk accepts, liblz4's safe
 * decoder must decode to exactly that size: the walk is never looser than the CPU path, so a
 * block it lets through to the GPU cannot write past its chunk there. The same bytes are also
 * decoded by a decoder that trusts them as nvCOMP does (no checks of its own), into a buffer of
 * exactly that size, under ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>

#include "base/lz4_walk.h"

/* Sequences taken as they come: what a decoder that relies on the walk does. */
static void trusting_decode(const uint8_t *p, size_t n, uint8_t *dst)
{
	const uint8_t *end = p + n;
	uint8_t *o = dst;
	for (;;) {
		unsigned tok = *p++;
		size_t lit = tok >> 4, ml;
		if (lit == 15)
			for (unsigned b = 255; b == 255; lit += (b = *p++))
				;
		memcpy(o, p, lit);
		o += lit;
		p += lit;
		if (p == end)
			return;
		size_t off = (size_t)p[0] | (size_t)p[1] << 8;
		p += 2;
		ml = (tok & 15u) + 4;
		if ((tok & 15u) == 15)
			for (unsigned b = 255; b == 255; ml += (b = *p++))
				;
		for (size_t k = 0; k < ml; k++, o++)
			*o = o[-(ptrdiff_t)off];
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	size_t want = ((size_t)data[0] | (size_t)data[1] << 8) + 1;
	const uint8_t *blk = data + 2;
	size_t n = size - 2;
	if (ferry__lz4_walk(blk, n, want))
		return 0;
	uint8_t *a = malloc(want), *b = malloc(want);
	int got = LZ4_decompress_safe((const char *)blk, (char *)a, (int)n, (int)want);
	if (got != (int)want)
		abort(); /* the walk took a block the CPU path refuses, or sizes it otherwise */
	trusting_decode(blk, n, b);
	if (memcmp(a, b, want))
		abort();
	free(a);
	free(b);
	return 0;
}
