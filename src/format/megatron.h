/* Megatron-LM / NeMo indexed datasets (.bin + .idx, MMIDIDX version 1). */
#ifndef FERRY_FORMAT_MEGATRON_H
#define FERRY_FORMAT_MEGATRON_H

#include <stddef.h>
#include <stdint.h>
#include "ferry/ferry.h"

/* Builds an MMIDIDX index: sizes (elements), pointers (bytes), document indices from doc_end. */
int ferry__megatron_build_index(enum ferry_dtype dtype, uint64_t n, const uint64_t *len, const uint64_t *off,
				const uint8_t *doc_end, uint8_t **out, size_t *out_len);

#endif
