/* libFuzzer target: the safetensors header parser (and the JSON parser under it) on untrusted bytes.
 * The input is a whole file: its size is the file size, so the data-section rules run too. */
#include <stdint.h>
#include <string.h>
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ferry_st *st = NULL;
	if (ferry__st_parse(data, size, size, "fuzz", &st) == 0) {
		size_t n = ferry_st_count(st);
		uint64_t dims[FERRY_ST_MAX_DIMS], end = ferry_st_data_start(st);
		for (size_t i = 0; i < n; i++) {
			const char *name = ferry_st_name(st, i);
			if (ferry_st_find(st, name) != (int)i || ferry_st_offset(st, i) != end)
				__builtin_trap(); /* lookup must agree and offsets must be contiguous */
			end += ferry_st_nbytes(st, i);
			(void)ferry_st_shape(st, i, dims, FERRY_ST_MAX_DIMS);
		}
		if (end != size)
			__builtin_trap();
		for (size_t i = 0; i < ferry_st_metadata_count(st); i++)
			(void)ferry_st_metadata_get(st, ferry_st_metadata_key(st, i));
	}
	ferry_st_destroy(st);
	return 0;
}
