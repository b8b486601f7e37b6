/* libFuzzer target: a compressed file's trailer and index parsers (src/format/cz.c) on arbitrary
 * bytes taken as a whole file, then every chunk the index accepted decoded on the CPU. The first
 * byte is flags: bit 0 reseals the input (recomputes the index's and the trailer's checksums, so
 * the fuzzer reaches the field checks behind them), bit 1 turns chunk verification off (so it
 * reaches the decoders with frames whose checksums do not match). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/byteorder.h"
#include "base/xxh.h"
#include "format/cz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 + FERRY__CZ_TRAILER_LEN)
		return 0;
	uint8_t flags = data[0];
	size_t n = size - 1;
	uint8_t *b = malloc(n);
	memcpy(b, data + 1, n);
	uint8_t *t = b + n - FERRY__CZ_TRAILER_LEN;
	if (flags & 1) {
		uint64_t ioff = ferry__rd64(t + 32), ilen = ferry__rd64(t + 40);
		if (ioff <= n && ilen <= n - ioff)
			ferry__wr64(t + 64, ferry__xxh3_64(b + ioff, ilen));
		ferry__wr64(t + 72, ferry__xxh3_64(t, 72));
	}
	struct ferry__cz_meta m;
	if (!ferry__cz_parse_trailer(t, n, "fuzz", &m) && !ferry__cz_parse_index(b + m.index_off, "fuzz", &m)) {
		uint8_t *dst = malloc(m.chunk_size);
		for (uint64_t i = 0; i < m.nchunks; i++) {
			const struct ferry__cz_chunk *e = &m.chunks[i];
			/* what the parser accepted lies inside the chunks' part of the file */
			if (e->c_off + e->c_size > m.index_off || e->u_size > m.chunk_size || e->u_off + e->u_size > m.total)
				abort();
			(void)ferry__cz_decode(&m, i, b + e->c_off, dst, !(flags & 2), "fuzz");
		}
		free(dst);
		ferry__cz_meta_free(&m);
	}
	free(b);
	return 0;
}
