/* Internals of the safetensors format shared by the reader (src/format) and the writer, loader
 * and checkpoints (src/ckpt). */
#ifndef FERRY_FORMAT_SAFETENSORS_H
#define FERRY_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
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

/* Streaming xxh3-64; create returns NULL without xxhash (or out of memory). */
struct ferry__xxh3;
struct ferry__xxh3 *ferry__xxh3_create(void);
void ferry__xxh3_reset(struct ferry__xxh3 *h);
void ferry__xxh3_update(struct ferry__xxh3 *h, const void *p, size_t len);
uint64_t ferry__xxh3_digest(struct ferry__xxh3 *h);
void ferry__xxh3_destroy(struct ferry__xxh3 *h);
int ferry__have_xxh3(void);

/* Parses "0123456789abcdef" (exactly 16 lower- or upper-case hex digits). 0 or -1. */
int ferry__hex64(const char *s, uint64_t *out);

#endif
