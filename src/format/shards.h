/*
 * Packed datasets: the in-memory index shared by the ferry shard format (shards.c) and Megatron's
 * .bin/.idx (megatron.c), their parsers of untrusted bytes, and CRC-32C.
 * docs/DATA.md specifies both file formats.
 */
#ifndef FERRY_FORMAT_SHARDS_H
#define FERRY_FORMAT_SHARDS_H

#include <stddef.h>
#include <stdint.h>
#include "ferry/compress.h" /* compressed shards (cz) */
#include "ferry/data.h"

#define FERRY__IDX_MAGIC "FERRYIDX"
#define FERRY__IDX_END "FEND"
#define FERRY__IDX_VERSION 1
#define FERRY__IDX_HEADER 64
#define FERRY__IDX_SHARD_ENTRY 32
#define FERRY__IDX_SAMPLE_ENTRY 16
#define FERRY__IDX_FLAG_KEYS 1u
#define FERRY__IDX_NAME "ferry.idx"
#define FERRY__MEGATRON_MAGIC "MMIDIDX\0\0"
#define FERRY__MEGATRON_HEADER 34

struct ferry__index {
	int format; /* 0 ferry, 1 megatron */
	enum ferry_dtype dtype; /* mapped from the index's code */
	uint64_t n;            /* samples */
	uint32_t nfiles;       /* shards (1 for Megatron) */
	uint64_t *file_bytes;  /* [nfiles]: the size each shard must have at least */
	uint64_t *file_first;  /* [nfiles + 1]: first sample of each shard, then n */
	uint64_t *off;         /* [n]: byte offset in its shard */
	uint64_t *len;         /* [n]: bytes */
	uint32_t *crc;         /* [n]: CRC-32C of the sample (ferry), NULL for Megatron */
	uint64_t *key_off;     /* [n + 1] or NULL */
	char *keys;
	uint64_t keys_len;
	uint64_t bytes;        /* sum of len */
	int64_t *doc_idx;      /* Megatron document indices */
	uint64_t ndocs;
};

void ferry__index_free(struct ferry__index *x);
/* Shard holding sample i (binary search over file_first). */
uint32_t ferry__index_shard_of(const struct ferry__index *x, uint64_t i);
/* The last s < n with first[s] <= i (first ascending, first[0] <= i): the shard of item i by its
 * shards' first items. */
uint32_t ferry__first_le(const uint64_t *first, uint32_t n, uint64_t i);

/*
 * Parses a ferry index from buf. check_crc 0 skips only the footer checksum (the fuzzer's way
 * past it); every other check runs. name is used in error details. Returns 0 or FERRY_ECORRUPT
 * (-ENOMEM) with the detail naming the field, the shard and the sample.
 */
int ferry__shard_index_parse(const uint8_t *buf, size_t len, int check_crc, const char *name,
			     struct ferry__index *out);
/* Parses a Megatron MMIDIDX version 1 index. Same contract. */
int ferry__megatron_index_parse(const uint8_t *buf, size_t len, const char *name,
				struct ferry__index *out);

/*
 * Pre-shuffled copies (the optional sidecar ferry.copies, docs/DATA.md): copy c holds every sample
 * once, in the order ferry_order_indices(n, FERRY_ORDER_SHUFFLE, 0, seed, c) gives, written
 * sequentially into its own shards copy-CCC-shard-NNNNN.fsh. Position p of copy c is entry
 * c * n + p of the flat tables.
 */
#define FERRY__CPY_MAGIC "FERRYCPY"
#define FERRY__CPY_VERSION 1
#define FERRY__CPY_HEADER 64
#define FERRY__CPY_COPY_HEADER 8
#define FERRY__CPY_POS_ENTRY 16
#define FERRY__CPY_NAME "ferry.copies"
struct ferry__copies {
	uint32_t ncopies;     /* 0: none */
	uint64_t seed;
	uint64_t n;           /* samples (the index's) */
	uint32_t nfiles;      /* shards of all copies */
	uint32_t *copy_file;  /* [ncopies + 1]: first shard of each copy, then nfiles */
	uint64_t *file_bytes; /* [nfiles] */
	int64_t *sample;      /* [ncopies * n]: the sample at each position */
	uint64_t *off;        /* [ncopies * n]: its offset in its shard */
	uint32_t *file;       /* [ncopies * n]: its shard, 0..nfiles-1 */
};
void ferry__copies_free(struct ferry__copies *c);
/*
 * Parses a ferry.copies sidecar against the parsed index x whose footer checksum is idx_crc.
 * Same contract as ferry__shard_index_parse.
 */
int ferry__copies_parse(const uint8_t *buf, size_t len, int check_crc, const char *name,
			const struct ferry__index *x, uint32_t idx_crc, struct ferry__copies *out);

/* The dataset handle (data.h). */
struct ferry_dataset {
	ferry_ctx *ctx;
	struct ferry__index x;
	/* files[x.nfiles + k] and paths[...] are shard k of the copies */
	struct ferry__copies copies;
	char *path;       /* what was opened */
	char **paths;     /* [nfiles] data files */
	ferry_file **files;
	struct ferry__dscache *cache; /* a dataset of URLs with the context's cache_dir set (cache.c) */
	ferry_cz **cz; /* [nfiles]: the reader of a compressed shard (ferry pack --compress), else NULL */
};

/* Shard s's compressed-file reader when it is one (ferry pack --compress), else NULL. */
ferry_cz *ferry__dataset_cz(const struct ferry_dataset *ds, uint32_t s);

/* Reads a whole small file (an index) into memory. Returns 0 or -errno (with detail). */
int ferry__read_whole(const char *path, uint8_t **buf, size_t *len);
/* The same for a path or a URL (s3://, http(s)://, read through ctx's remote backend). */
int ferry__read_whole_at(ferry_ctx *ctx, const char *path, uint8_t **buf, size_t *len);
/* s3://, http:// or https:// */
int ferry__path_is_url(const char *path);

/*
 * The dataset cache (cache.c, docs/REMOTE.md): with the context's cache_dir set, a dataset of URLs
 * stages whole shards into it. ferry__dataset_file_get gives the file to read shard s from (the
 * staged one, staging it first when it is not and there is room; else the object) and must be
 * paired with ferry__dataset_file_put once the reads from it are done. Without a cache: files[s].
 */
int ferry__dataset_cache_open(struct ferry_dataset *ds);
void ferry__dataset_cache_close(struct ferry_dataset *ds);
ferry_file *ferry__dataset_file_get(struct ferry_dataset *ds, uint32_t s);
void ferry__dataset_file_put(struct ferry_dataset *ds, uint32_t s, ferry_file *f);
/*
 * For readers that map what they read (the loader's mapped=1): which staging of shard s the file f
 * (held through ferry__dataset_file_get) is, 0 for the dataset's own file; a staged file's gen is
 * never reused, unlike its ferry_file's address. ferry__dataset_cache_drops counts the entries the
 * cache gave up (evicted) so far: when it moves, a reader checks its mappings with
 * ferry__dataset_file_current (1 while f is still shard s's staged file of that gen) and unmaps the
 * others, whose pages an unlinked entry's mapping would keep in memory past the budget.
 */
uint64_t ferry__dataset_file_gen(const struct ferry_dataset *ds, uint32_t s, const ferry_file *f);
int ferry__dataset_file_current(struct ferry_dataset *ds, uint32_t s, const ferry_file *f, uint64_t gen);
uint64_t ferry__dataset_cache_drops(struct ferry_dataset *ds);
/*
 * After ferry__dataset_cache_lend (a loader that reads mapped), the stagers map each shard they
 * stage read-only with every page in, on their own threads; ferry__dataset_file_map lends that
 * mapping (*len bytes) for f, shard s's staged file held through ferry__dataset_file_get, or
 * gives NULL (the reader maps f itself). The pointer stays valid while f's gen is current: an
 * entry is unmapped only when evicted, and never while a read holds it.
 */
void ferry__dataset_cache_lend(struct ferry_dataset *ds);
const uint8_t *ferry__dataset_file_map(const struct ferry_dataset *ds, uint32_t s, const ferry_file *f, uint64_t *len);
/* The cache's byte budget (0: none, or no limit). */
uint64_t ferry__dataset_cache_budget(const struct ferry_dataset *ds);
/*
 * The order the reads will visit the shards in (the loader's shard-window shuffle), window shards
 * at a time: seq this epoch's, next the next epoch's (NULL: unknown, this one's is used), n shards
 * each. The stagers then stage in that order from the window being read on, as far ahead as the
 * budget holds without evicting a shard needed sooner, and a full cache evicts the shard whose
 * next use is farthest, never one of the window being read (without a plan: index order, least
 * recently used). Set again each epoch (by every pipeline thread: the same plan is kept where its
 * reads are). ferry__dataset_cache_reading tells it where the reads are: a batch of that epoch
 * reads shard s's window (its first item's shard); a later window moves the reads on.
 */
void ferry__dataset_cache_plan(struct ferry_dataset *ds, uint64_t epoch, const uint32_t *seq, const uint32_t *next,
			       uint32_t n, uint32_t window);
void ferry__dataset_cache_reading(struct ferry_dataset *ds, uint64_t epoch, uint32_t s);
/* A small object (an index) through cache_dir: get gives 1 with *buf when an entry matches remote's
 * URL, ETag and size (no GET), put records what was just read (best effort). */
int ferry__cache_get_small(ferry_ctx *ctx, const char *url, ferry_file *remote, uint8_t **buf, size_t *len);
void ferry__cache_put_small(ferry_ctx *ctx, const char *url, ferry_file *remote, const uint8_t *buf, size_t len);
/* A new pass over the data (an epoch): shards that found no room are tried again. */
void ferry__dataset_cache_rewind(struct ferry_dataset *ds);
/* Checks each shard's size against the index: FERRY_ECORRUPT naming shard and first sample cut. */
int ferry__dataset_check_sizes(struct ferry_dataset *ds);

/* Megatron dataset open (megatron.c), for a prefix. */
int ferry__megatron_open(struct ferry_dataset *ds, const char *prefix);

#endif
