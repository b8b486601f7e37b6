/* Internals of the safetensors format shared by the reader (src/format) and the writer, loader
 * and checkpoints (src/ckpt). */
#ifndef FERRY_FORMAT_SAFETENSORS_H
#define FERRY_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "base/xxh.h" /* the checksum stored under FERRY_ST_CHECKSUM_PREFIX */
#include "ferry/safetensors.h"

#define FERRY__ST_MAX_HEADER 100000000ull
#define FERRY__ST_ALIGN 4096u

/* NULL if name is acceptable as a tensor name, else why not. */
const char *ferry__st_name_problem(const char *name, size_t len);
/* Byte size of a tensor: 0, -EOVERFLOW, or -EINVAL (sub-byte total, bad dtype). */
int ferry__st_nbytes(int dtype, int ndim, const uint64_t *shape, uint64_t *out);
/* Writes name into buf for an error message, escaped and shortened. */
const char *ferry__st_printable(const char *name, size_t len, char *buf, size_t size);

/* Byte size of the slice [start, stop) of dimension dim of tensor i, or -EINVAL (with detail). */
int ferry__st_slice_shape(const ferry_st *st, size_t i, int dim, uint64_t start, uint64_t stop,
			  uint64_t *nbytes);


/*
 * Validates a file held in memory (the fuzzer's entry): buf holds at least its first 8 +
 * header-length bytes (or fewer, then the header is truncated) and file_size is the whole file's
 * size. Tensor data cannot be read from the result (ferry_st_file gives NULL).
 */
int ferry__st_parse(const void *buf, size_t len, uint64_t file_size, const char *name, ferry_st **out);

/* The compressed file a safetensors file was opened from (ferry_st_open takes ferry's compressed
 * format, docs/FORMATS.md, holding a safetensors file's bytes), or NULL for a plain file; ferry_st_file
 * is then NULL. */
struct ferry_cz;
struct ferry_cz *ferry__st_cz(ferry_st *st);

/* Parses "0123456789abcdef" (exactly 16 lower- or upper-case hex digits). 0 or -1. */
int ferry__hex64(const char *s, uint64_t *out);

#endif
