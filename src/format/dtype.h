/* Element types (enum ferry_dtype, ferry.h) and the codes the formats store for them. */
#ifndef FERRY_FORMAT_DTYPE_H
#define FERRY_FORMAT_DTYPE_H

#include <stddef.h>
#include "ferry/ferry.h"

/* Bytes per element, or 0 for a sub-byte type (F4, F6_*) or a value out of range. */
size_t ferry__dtype_size(enum ferry_dtype dt);
/*
 * The type's place in safetensors' own order of dtypes (its Dtype enum: BOOL, F4, ..., F8_E8M0,
 * F8_E4M3FNUZ, F8_E5M2FNUZ, I16, ...), which its writer lays tensors out by (decreasing, then name);
 * -1 for FERRY_DT_BYTES or a value out of range.
 */
int ferry__dtype_layout_rank(enum ferry_dtype dt);
/* 1 if safetensors has the type (every type but FERRY_DT_BYTES), else 0. */
int ferry__dtype_in_safetensors(enum ferry_dtype dt);
/*
 * Megatron's indexed_dataset.py DType code (1 uint8 ... 8 uint16), which ferry.idx stores too
 * (with 0 for bytes), or -1 for a type neither can hold.
 */
int ferry__dtype_megatron_code(enum ferry_dtype dt);
/* The type of a Megatron / ferry.idx code: 0 with *out, or -1 for an unknown code. */
int ferry__dtype_from_megatron_code(unsigned code, enum ferry_dtype *out);

#endif
