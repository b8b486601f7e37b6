/* libFuzzer target: the ferry index and Megatron index parsers on arbitrary bytes. The first byte
 * picks the parser; for the ferry index the footer checksum is skipped so the fuzzer reaches the
 * table checks behind it. */
#include <stdint.h>
#include <stdlib.h>

#include "format/shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!size)
		return 0;
	struct ferry__index x;
	int err = data[0] & 1 ? ferry__megatron_index_parse(data + 1, size - 1, "fuzz", &x)
			      : ferry__shard_index_parse(data + 1, size - 1, 0, "fuzz", &x);
	if (!err) {
		/* every sample the parser accepted lies inside its shard */
		for (uint64_t i = 0; i < x.n; i++) {
			uint32_t s = ferry__index_shard_of(&x, i);
			if (x.off[i] + x.len[i] > x.file_bytes[s] || x.off[i] + x.len[i] < x.off[i])
				abort();
		}
		ferry__index_free(&x);
	}
	return 0;
}
