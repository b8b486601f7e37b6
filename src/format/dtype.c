/*
 * Element types: one enum for tensors and samples (ferry.h), the spellings of safetensors and of
 * NumPy, and the codes the dataset formats store (never the enum's own numbers).
 */
#include <strings.h>
#include <string.h>

#include "base/base.h"
#include "format/dtype.h"

static const struct {
	const char *st, *np, *np_code; /* NULL where NumPy has no such type */
	int bits;
	int megatron; /* Megatron's DType code (0: ferry.idx's bytes), -1 for none */
	int rank;     /* the place in safetensors' Dtype enum (layouts sort by it), -1 for none */
} dtypes[FERRY_DT__COUNT] = {
	[FERRY_DT_BOOL] = {"BOOL", "bool", "?", 8, -1, 0},
	[FERRY_DT_F4] = {"F4", NULL, NULL, 4, -1, 1},
	[FERRY_DT_F6_E2M3] = {"F6_E2M3", NULL, NULL, 6, -1, 2},
	[FERRY_DT_F6_E3M2] = {"F6_E3M2", NULL, NULL, 6, -1, 3},
	[FERRY_DT_U8] = {"U8", "uint8", "u1", 8, 1, 4},
	[FERRY_DT_I8] = {"I8", "int8", "i1", 8, 2, 5},
	[FERRY_DT_F8_E5M2] = {"F8_E5M2", NULL, NULL, 8, -1, 6},
	[FERRY_DT_F8_E4M3] = {"F8_E4M3", NULL, NULL, 8, -1, 7},
	[FERRY_DT_F8_E8M0] = {"F8_E8M0", NULL, NULL, 8, -1, 8},
	[FERRY_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", NULL, NULL, 8, -1, 9},
	[FERRY_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", NULL, NULL, 8, -1, 10},
	[FERRY_DT_I16] = {"I16", "int16", "i2", 16, 3, 11},
	[FERRY_DT_U16] = {"U16", "uint16", "u2", 16, 8, 12},
	[FERRY_DT_F16] = {"F16", "float16", "f2", 16, -1, 13},
	[FERRY_DT_BF16] = {"BF16", NULL, NULL, 16, -1, 14},
	[FERRY_DT_I32] = {"I32", "int32", "i4", 32, 4, 15},
	[FERRY_DT_U32] = {"U32", "uint32", "u4", 32, -1, 16},
	[FERRY_DT_F32] = {"F32", "float32", "f4", 32, 7, 17},
	[FERRY_DT_C64] = {"C64", "complex64", "c8", 64, -1, 18},
	[FERRY_DT_F64] = {"F64", "float64", "f8", 64, 6, 19},
	[FERRY_DT_I64] = {"I64", "int64", "i8", 64, 5, 20},
	[FERRY_DT_U64] = {"U64", "uint64", "u8", 64, -1, 21},
	[FERRY_DT_BYTES] = {"BYTES", "bytes", "b", 8, 0, -1},
};

static int valid(enum ferry_dtype dt) { return (unsigned)dt < FERRY_DT__COUNT; }

const char *ferry_dtype_name(enum ferry_dtype dt) { return valid(dt) ? dtypes[dt].st : NULL; }

const char *ferry_dtype_numpy_name(enum ferry_dtype dt) { return valid(dt) ? dtypes[dt].np : NULL; }

int ferry_dtype_bits(enum ferry_dtype dt) { return valid(dt) ? dtypes[dt].bits : 0; }

int ferry_dtype_from_name(const char *name, enum ferry_dtype *out)
{
	for (int d = 0; name && out && d < FERRY_DT__COUNT; d++)
		if (!strcmp(name, dtypes[d].st)) {
			*out = (enum ferry_dtype)d;
			return 0;
		}
	return ferry__error(FERRY_EBADOPT, "unknown dtype \"%s\"", name ? name : "(null)");
}

int ferry_dtype_from_numpy_name(const char *name, enum ferry_dtype *out)
{
	for (int d = 0; name && out && d < FERRY_DT__COUNT; d++)
		if (dtypes[d].np && (!strcasecmp(name, dtypes[d].np) || !strcasecmp(name, dtypes[d].np_code))) {
			*out = (enum ferry_dtype)d;
			return 0;
		}
	return ferry__error(FERRY_EBADOPT, "unknown dtype '%s' (uint8, int8, int16, uint16, int32, "
			    "int64, float32, float64, bytes, ...)", name ? name : "(null)");
}

size_t ferry__dtype_size(enum ferry_dtype dt)
{
	return valid(dt) && dtypes[dt].bits % 8 == 0 ? (size_t)dtypes[dt].bits / 8 : 0;
}

int ferry__dtype_in_safetensors(enum ferry_dtype dt) { return valid(dt) && dt != FERRY_DT_BYTES; }

int ferry__dtype_layout_rank(enum ferry_dtype dt) { return valid(dt) ? dtypes[dt].rank : -1; }

int ferry__dtype_megatron_code(enum ferry_dtype dt) { return valid(dt) ? dtypes[dt].megatron : -1; }

int ferry__dtype_from_megatron_code(unsigned code, enum ferry_dtype *out)
{
	for (int d = 0; d < FERRY_DT__COUNT; d++)
		if (dtypes[d].megatron >= 0 && (unsigned)dtypes[d].megatron == code) {
			*out = (enum ferry_dtype)d;
			return 0;
		}
	return -1;
}
