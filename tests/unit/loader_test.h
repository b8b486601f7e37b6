/* Helpers of the loader's unit tests (test_loader.c, test_loader_cz.c). */
#ifndef FERRY_LOADER_TEST_H
#define FERRY_LOADER_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ferry/data.h"
#include "ferry_test.h"

/* A metric, or -1 when ferry_loader_metric fails. */
static inline double metric(ferry_loader *l, const char *name)
{
	double v;
	return ferry_loader_metric(l, name, &v) ? -1 : v;
}

/* A loader over ds with the knobs kv (key, value, ..., NULL); a knob refused ends the test. */
static inline ferry_loader *make_loader(ferry_dataset *ds, const char *const *kv)
{
	ferry_loader *l;
	T_ASSERT(ferry_loader_create(ds, &l) == 0);
	for (; kv && kv[0]; kv += 2)
		if (ferry_loader_set(l, kv[0], kv[1])) {
			fprintf(stderr, "set %s=%s: %s\n", kv[0], kv[1], ferry_last_error());
			exit(T_EXIT_FAIL);
		}
	return l;
}

/*
 * Writes n uint16 samples of len(i) bytes each to the dataset at path (shards of shard_size bytes):
 * *soff gets each sample's offset in the concatenation (n + 1 entries), *stream the concatenation
 * (filled by fill), both malloc'd. Returns the number of shards the writer laid out.
 */
static inline int write_samples(ferry_ctx *ctx, const char *path, uint64_t shard_size, uint64_t n,
				size_t (*len)(uint64_t), void (*fill)(uint8_t *p, uint64_t n), uint8_t **stream,
				uint64_t **soff)
{
	ferry_dataset_writer *w;
	T_ASSERT(ferry_dataset_writer_create(ctx, path, FERRY_WRITE_FERRY, FERRY_DT_U16, shard_size, &w) == 0);
	uint64_t total = 0, *off = malloc((n + 1) * sizeof(*off));
	T_ASSERT(off);
	for (uint64_t i = 0; i < n; i++) {
		off[i] = total;
		total += len(i);
		T_ASSERT(ferry_dataset_writer_add(w, len(i), NULL, 0, 1) >= 0);
	}
	off[n] = total;
	uint8_t *all = malloc(total);
	T_ASSERT(all);
	fill(all, total);
	int shards = ferry_dataset_writer_layout(w);
	for (uint64_t i = 0; i < n; i++)
		T_ASSERT(ferry_dataset_writer_put(w, i, all + off[i], len(i)) == 0);
	T_ASSERT(ferry_dataset_writer_finish(w) == 0);
	ferry_dataset_writer_destroy(w);
	*stream = all;
	*soff = off;
	return shards;
}

#endif
