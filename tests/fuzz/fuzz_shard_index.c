/* libFuzzer target: the ferry index and Megatron index parsers on arbitrary bytes. The first byte
 * picks the parser; for the ferry index the footer checksum is skipped so the fuzzer reaches the
 * table checks behind it. A ferry index whose header (its length at byte 40) ends before the input
 * does is followed by a ferry.copies sidecar: it is parsed against the index the first part gave. */
#include <stdint.h>
#include <stdlib.h>

#include "base/byteorder.h"
#include "format/shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!size)
		return 0;
	struct ferry__index x;
	const uint8_t *b = data + 1;
	size_t len = size - 1, idx_len = len;
	if (!(data[0] & 1) && len >= FERRY__IDX_HEADER + 8 && ferry__rd64(b + 40) >= FERRY__IDX_HEADER + 8 &&
	    ferry__rd64(b + 40) < len)
		idx_len = (size_t)ferry__rd64(b + 40);
	int err = data[0] & 1 ? ferry__megatron_index_parse(b, len, "fuzz", &x)
			      : ferry__shard_index_parse(b, idx_len, 0, "fuzz", &x);
	if (!err) {
		/* every sample the parser accepted lies inside its shard */
		for (uint64_t i = 0; i < x.n; i++) {
			uint32_t s = ferry__index_shard_of(&x, i);
			if (x.off[i] + x.len[i] > x.file_bytes[s] || x.off[i] + x.len[i] < x.off[i])
				abort();
		}
		struct ferry__copies c;
		if (idx_len < len &&
		    !ferry__copies_parse(b + idx_len, len - idx_len, 0, "fuzz", &x, ferry__rd32(b + idx_len - 8), &c)) {
			/* every position of every copy: a sample once, inside its copy's shard */
			for (size_t k = 0; k < (size_t)c.ncopies * c.n; k++) {
				uint64_t i = (uint64_t)c.sample[k];
				if (i >= x.n || c.file[k] >= c.nfiles || c.off[k] + x.len[i] > c.file_bytes[c.file[k]] ||
				    c.file[k] < c.copy_file[k / c.n] || c.file[k] >= c.copy_file[k / c.n + 1])
					abort();
			}
			ferry__copies_free(&c);
		}
		ferry__index_free(&x);
	}
	return 0;
}
