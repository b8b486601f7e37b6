/*
 * Megatron-LM's indexed dataset, as megatron/core/datasets/indexed_dataset.py writes it:
 *   "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 sequence count S, u64 document count D,
 *   int32 sizes[S] (elements), int64 pointers[S] (byte offsets in .bin), int64 documents[D].
 * Multimodal indexes append int8 modes[S]; bytes after the documents are ignored, as Megatron does.
 * Megatron writes each pointer as the running sum of the sizes before it: a pointer before the end
 * of the previous sequence (out of order, or overlapping it) is refused as corrupt, naming both byte
 * ranges; gaps between sequences are allowed.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "base/byteorder.h"
#include "format/dtype.h"
#include "format/megatron.h"
#include "format/shards.h"

#define CORRUPT(...) ferry__error(FERRY_ECORRUPT, __VA_ARGS__)

int ferry__megatron_index_parse(const uint8_t *buf, size_t len, const char *name,
				struct ferry__index *out)
{
	memset(out, 0, sizeof(*out));
	if (len < FERRY__MEGATRON_HEADER)
		return CORRUPT("%s: %zu bytes, too short for a Megatron index (%d at least)", name, len,
			       FERRY__MEGATRON_HEADER);
	if (memcmp(buf, FERRY__MEGATRON_MAGIC, 9))
		return CORRUPT("%s: not a Megatron index (magic is not MMIDIDX\\0\\0)", name);
	uint64_t version = ferry__rd64(buf + 9);
	if (version != 1)
		return CORRUPT("%s: Megatron index version %llu, only version 1 exists", name,
			       (unsigned long long)version);
	enum ferry_dtype dtype;
	if (buf[17] == 0 || ferry__dtype_from_megatron_code(buf[17], &dtype)) /* 0 is ferry.idx's bytes */
		return CORRUPT("%s: unknown dtype code %d", name, buf[17]);
	uint64_t S = ferry__rd64(buf + 18), D = ferry__rd64(buf + 26);
	uint64_t avail = len - FERRY__MEGATRON_HEADER;
	if (S > avail / 12 || D > (avail - S * 12) / 8)
		return CORRUPT("%s: %llu sequences and %llu documents need more than the index's %zu bytes "
			       "(truncated index)", name, (unsigned long long)S, (unsigned long long)D, len);
	size_t esize = ferry__dtype_size(dtype);
	out->format = 1;
	out->dtype = dtype;
	out->n = S;
	out->nfiles = 1;
	out->file_bytes = calloc(1, 8);
	out->file_first = calloc(2, 8);
	out->off = malloc((S ? S : 1) * 8);
	out->len = malloc((S ? S : 1) * 8);
	out->doc_idx = malloc((D ? D : 1) * 8);
	if (!out->file_bytes || !out->file_first || !out->off || !out->len || !out->doc_idx) {
		ferry__index_free(out);
		return ferry__error(-ENOMEM, "%s: index of %llu sequences", name, (unsigned long long)S);
	}
	out->file_first[1] = S;
	out->ndocs = D;
	const uint8_t *sizes = buf + FERRY__MEGATRON_HEADER, *ptrs = sizes + S * 4, *docs = ptrs + S * 8;
	uint64_t end = 0;
	for (uint64_t i = 0; i < S; i++) {
		int32_t sz = (int32_t)ferry__rd32(sizes + i * 4);
		int64_t ptr = (int64_t)ferry__rd64(ptrs + i * 8);
		if (sz < 0 || ptr < 0 || (uint64_t)ptr > (UINT64_MAX >> 1) - (uint64_t)sz * esize) {
			ferry__index_free(out);
			return CORRUPT("%s: sequence %llu: size %d, pointer %lld out of range", name,
				       (unsigned long long)i, sz, (long long)ptr);
		}
		out->off[i] = (uint64_t)ptr;
		out->len[i] = (uint64_t)sz * esize;
		if (i && out->off[i] < out->off[i - 1] + out->len[i - 1]) {
			uint64_t a = out->off[i - 1], b = a + out->len[i - 1];
			ferry__index_free(out);
			return CORRUPT("%s: sequence %llu: bytes [%lld, %llu) %s sequence %llu's [%llu, %llu) "
				       "(Megatron's pointers increase: each starts where the previous ends)",
				       name, (unsigned long long)i, (long long)ptr,
				       (unsigned long long)((uint64_t)ptr + (uint64_t)sz * esize),
				       (uint64_t)ptr < a ? "lie before" : "overlap", (unsigned long long)(i - 1),
				       (unsigned long long)a, (unsigned long long)b);
		}
		out->bytes += out->len[i];
		if (out->off[i] + out->len[i] > end)
			end = out->off[i] + out->len[i];
	}
	out->file_bytes[0] = end;
	for (uint64_t d = 0; d < D; d++) {
		int64_t v = (int64_t)ferry__rd64(docs + d * 8);
		if (v < 0 || (uint64_t)v > S || (d && v < out->doc_idx[d - 1])) {
			ferry__index_free(out);
			return CORRUPT("%s: document index %llu is %lld: out of order or past the %llu "
				       "sequences", name, (unsigned long long)d, (long long)v,
				       (unsigned long long)S);
		}
		out->doc_idx[d] = v;
	}
	return 0;
}

int ferry__megatron_open(struct ferry_dataset *ds, const char *prefix)
{
	size_t l = strlen(prefix) + 8;
	char *idx = malloc(l);
	ds->paths = calloc(1, sizeof(char *));
	if (!idx || !ds->paths || !(ds->paths[0] = malloc(l))) {
		free(idx);
		return ferry__error(-ENOMEM, "%s", prefix);
	}
	snprintf(idx, l, "%s.idx", prefix);
	snprintf(ds->paths[0], l, "%s.bin", prefix);
	uint8_t *buf;
	size_t len;
	int err = ferry__read_whole_at(ds->ctx, idx, &buf, &len);
	if (err == -ENOENT)
		ferry__error_append("neither a ferry dataset directory nor a Megatron prefix");
	if (!err) {
		err = ferry__megatron_index_parse(buf, len, idx, &ds->x);
		free(buf);
	}
	free(idx);
	if (err) {
		/* nfiles stays 0 on failure, so close frees paths[0] only through this */
		free(ds->paths[0]);
		ds->paths[0] = NULL;
	}
	return err;
}

int ferry__megatron_build_index(enum ferry_dtype dtype, uint64_t n, const uint64_t *len, const uint64_t *off,
				const uint8_t *doc_end, uint8_t **out, size_t *out_len)
{
	uint64_t docs = 1;
	for (uint64_t i = 0; i < n; i++)
		docs += doc_end[i] ? 1 : 0;
	size_t esize = ferry__dtype_size(dtype);
	size_t total = FERRY__MEGATRON_HEADER + n * 12 + docs * 8;
	uint8_t *b = calloc(1, total);
	if (!b)
		return ferry__error(-ENOMEM, "Megatron index of %llu sequences", (unsigned long long)n);
	memcpy(b, FERRY__MEGATRON_MAGIC, 9);
	ferry__wr64(b + 9, 1);
	b[17] = (uint8_t)ferry__dtype_megatron_code(dtype); /* the writer took only types Megatron codes */
	ferry__wr64(b + 18, n);
	ferry__wr64(b + 26, docs);
	uint8_t *sizes = b + FERRY__MEGATRON_HEADER, *ptrs = sizes + n * 4, *d = ptrs + n * 8;
	for (uint64_t i = 0; i < n; i++) {
		ferry__wr32(sizes + i * 4, (uint32_t)(len[i] / esize));
		ferry__wr64(ptrs + i * 8, off[i]);
	}
	uint64_t k = 0;
	ferry__wr64(d + 8 * k++, 0);
	for (uint64_t i = 0; i < n; i++)
		if (doc_end[i])
			ferry__wr64(d + 8 * k++, i + 1);
	*out = b;
	*out_len = total;
	return 0;
}
