/*
 * ferry: training data. Packed datasets (ferry shards, Megatron/NeMo .bin/.idx), the sample orders
 * (PyTorch's DistributedSampler, index for index; sequential; a locality-aware block shuffle) and
 * the loader: pipeline threads that read batches with batched I/O, assemble them in pinned memory,
 * copy them to the GPU on their own stream and keep a number of them ready.
 *
 * Conventions as in ferry.h: 0 or a count on success, a negative code on failure with
 * ferry_last_error() naming the file, the shard and the sample; opaque handles; NULL accepted by
 * every _destroy. docs/DATA.md describes the formats and the orders.
 */
#ifndef FERRY_DATA_H
#define FERRY_DATA_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Samples' element types are enum ferry_dtype (ferry.h): the ones Megatron's index can name
 * (U8, I8, I16, U16, I32, I64, F32, F64) and FERRY_DT_BYTES; NumPy names them
 * (ferry_dtype_numpy_name, ferry_dtype_from_numpy_name).
 */

/* -------------------------------------------------------------------------------------- samplers */

/*
 * The number of indices each rank gets from torch.utils.data.DistributedSampler over n samples:
 * ceil(n / replicas), or with drop_last (and n not a multiple) ceil((n - replicas) / replicas).
 */
FERRY_API uint64_t ferry_distributed_num_samples(uint64_t n, uint32_t num_replicas, int drop_last);

/*
 * Rank `rank`'s indices for `epoch`, equal index for index to
 *   s = DistributedSampler(ds, num_replicas, rank, shuffle, seed, drop_last); s.set_epoch(epoch);
 *   list(s)
 * where len(ds) == n: torch.randperm(n) from a CPU generator seeded with seed + epoch (mt19937
 * reimplemented here), padded by repeating the start when not drop_last, strided by rank.
 * out must hold ferry_distributed_num_samples() entries. Returns that count, -EINVAL (rank >=
 * replicas, replicas 0, out_len too small) or -ENOMEM.
 */
FERRY_API FERRY_WUR int64_t ferry_distributed_indices(uint64_t n, uint32_t num_replicas, uint32_t rank,
						      int shuffle, uint64_t seed, uint64_t epoch,
						      int drop_last, int64_t *out, size_t out_len);

/* torch.randperm(n, generator=torch.Generator().manual_seed(seed)) into out[n]. Returns 0 or -EINVAL. */
FERRY_API FERRY_WUR int ferry_randperm(uint64_t n, uint64_t seed, int64_t *out);

/* Orders a loader can draw samples in (the loader knob `order`). */
enum ferry_order {
	FERRY_ORDER_SEQUENTIAL = 0, /* DistributedSampler(shuffle=False) */
	FERRY_ORDER_SHUFFLE = 1,    /* DistributedSampler(shuffle=True), index for index */
	FERRY_ORDER_BLOCK = 2,      /* blocks of `block` neighbouring samples shuffled, then within each */
};

/*
 * The global order of an epoch before the split across ranks, for any ferry_order: out[n].
 * FERRY_ORDER_BLOCK permutes the ceil(n / block) blocks with randperm(seed + epoch), then each
 * block's members with randperm(len, seed + epoch + 1 + block index). Returns 0 or -EINVAL.
 */
FERRY_API FERRY_WUR int ferry_order_indices(uint64_t n, enum ferry_order order, uint64_t block, uint64_t seed,
					    uint64_t epoch, int64_t *out);

/* --------------------------------------------------------------------------------------- datasets */

typedef struct ferry_dataset ferry_dataset;

/*
 * Opens a dataset: a directory written by `ferry pack` (holding ferry.idx), a ferry index file,
 * or a Megatron/NeMo prefix (path.idx + path.bin; a path ending in .idx or .bin is taken as
 * its prefix). The whole index is read and checked: magic, version, checksum, bounds of every
 * sample, and each shard's size. A corrupt index or a truncated shard fails with FERRY_ECORRUPT
 * and a detail naming the file, the shard and the first sample affected. Returns 0, -errno or
 * FERRY_ECORRUPT.
 */
FERRY_API FERRY_WUR int ferry_dataset_open(ferry_ctx *ctx, const char *path, ferry_dataset **out);
FERRY_API void ferry_dataset_destroy(ferry_dataset *ds);
/* Samples (Megatron: sequences). */
FERRY_API uint64_t ferry_dataset_count(const ferry_dataset *ds);
/* Element type of the samples. */
FERRY_API enum ferry_dtype ferry_dataset_dtype(const ferry_dataset *ds);
/* "ferry" or "megatron". */
FERRY_API const char *ferry_dataset_format(const ferry_dataset *ds);
/* Bytes of all samples together. */
FERRY_API uint64_t ferry_dataset_bytes(const ferry_dataset *ds);
/* Number of data files (shards; 1 for Megatron). */
FERRY_API uint32_t ferry_dataset_shards(const ferry_dataset *ds);
/* Sample i's length in bytes, or -EINVAL when i is out of range. */
FERRY_API int64_t ferry_dataset_sample_bytes(const ferry_dataset *ds, uint64_t i);
/*
 * Reads sample i into buf (len >= its length). Returns its length, -EINVAL, -ENOSPC (buf too
 * small) or an I/O error; a sample that ends past its shard's end is FERRY_ECORRUPT naming both.
 */
FERRY_API FERRY_WUR ssize_t ferry_dataset_read(ferry_dataset *ds, uint64_t i, void *buf, size_t len);
/*
 * Where sample i lies: *shard, its data file (0-based), and *offset, its first byte in that file;
 * for readers that map the files themselves (the Python IndexedDataset). Returns 0 or -EINVAL.
 */
FERRY_API FERRY_WUR int ferry_dataset_locate(const ferry_dataset *ds, uint64_t i, uint32_t *shard,
					     uint64_t *offset);
/* Data file k's path (a shard, or the Megatron .bin); NULL when k is out of range. Valid until close. */
FERRY_API const char *ferry_dataset_shard_path(const ferry_dataset *ds, uint32_t k);
/* Sample i's key (NULL with *len 0 when the dataset has no keys). Valid until close. */
FERRY_API const char *ferry_dataset_key(const ferry_dataset *ds, uint64_t i, size_t *len);
/*
 * Reads every shard whole and compares its CRC-32C with the index (ferry datasets; Megatron ones
 * have no checksums and return 0), the pre-shuffled copies' shards too. Returns 0 or FERRY_ECORRUPT
 * naming the shard.
 */
FERRY_API FERRY_WUR int ferry_dataset_verify(ferry_dataset *ds);
/*
 * What the local cache of a dataset of URLs did (the context's cache_dir, docs/REMOTE.md), as one
 * JSON object written into buf: {"dir", "budget", "shards", "staged" (held now), "reused" (found
 * staged, by anyone), "fetched", "fetched_bytes", "evicted", "remote_reads" (reads that went to the
 * object: no room), "error" (the first staging failure, "")}; "{}" without a cache. Returns what
 * snprintf returns (the length it needed) or a negative code.
 */
FERRY_API FERRY_WUR int ferry_dataset_cache_stats(ferry_dataset *ds, char *buf, size_t len);

/* ----------------------------------------------------------------------------------------- writer */

typedef struct ferry_dataset_writer ferry_dataset_writer;

/* What a dataset writer writes. */
enum ferry_dataset_kind {
	FERRY_WRITE_FERRY = 0,    /* shards + ferry.idx in a directory */
	FERRY_WRITE_MEGATRON = 1, /* prefix.bin + prefix.idx (MMIDIDX version 1) */
};

/*
 * A writer of a packed dataset. The caller first declares every sample's length (and key) with
 * ferry_dataset_writer_add, which also assigns it its place; then ferry_dataset_writer_layout
 * fixes the shards; then any threads call ferry_dataset_writer_put for any samples, in any order,
 * each sample once; ferry_dataset_writer_finish syncs the data files, the directory, then writes
 * the index under a temporary name, syncs it and renames it into place (then syncs the directory
 * again). Until finish has returned 0 no index exists, so a crash leaves no half dataset that
 * opens. shard_size: bytes per shard (0: 1 GiB); samples are never split across shards.
 * Returns 0, -EINVAL, FERRY_EBADOPT (a dtype the format cannot hold; Megatron stores BYTES as U8),
 * -ENOMEM or -errno.
 */
FERRY_API FERRY_WUR int ferry_dataset_writer_create(ferry_ctx *ctx, const char *path,
						    enum ferry_dataset_kind kind, enum ferry_dtype dtype,
						    uint64_t shard_size, ferry_dataset_writer **out);
/* Aborts an unfinished writer (its files stay; no index is written). */
FERRY_API void ferry_dataset_writer_destroy(ferry_dataset_writer *w);
/*
 * Declares the next sample (index = number added before). key may be NULL. document_end (Megatron
 * only): 1 when this sample ends a document (ferry pack makes each sample a document).
 * Returns the sample's index or an error.
 */
FERRY_API FERRY_WUR int64_t ferry_dataset_writer_add(ferry_dataset_writer *w, uint64_t bytes,
						     const char *key, size_t key_len, int document_end);
/* Fixes the layout after the last add and creates the data files. Returns the number of shards. */
FERRY_API FERRY_WUR int ferry_dataset_writer_layout(ferry_dataset_writer *w);
/* Which shard sample i goes to (after layout), so callers can give each thread whole shards. */
FERRY_API int64_t ferry_dataset_writer_shard_of(const ferry_dataset_writer *w, uint64_t i);
/* Writes sample i's bytes (len must equal its declared length). Thread-safe. */
FERRY_API FERRY_WUR int ferry_dataset_writer_put(ferry_dataset_writer *w, uint64_t i, const void *data,
						 size_t len);
/* Syncs and publishes the index as described above. Returns 0 or an error (then no index). */
FERRY_API FERRY_WUR int ferry_dataset_writer_finish(ferry_dataset_writer *w);
/*
 * Before finish (ferry format only): also write ncopies pre-shuffled copies of the dataset, copy c
 * in the order ferry_order_indices(n, FERRY_ORDER_SHUFFLE, 0, seed, c) gives, each in its own
 * shards, described by the sidecar ferry.copies (docs/DATA.md, "Pre-shuffled copies"); the
 * loader's copies=1 reads epoch e from copy e mod ncopies sequentially. Costs ncopies times the
 * data's bytes on top of the dataset. 0: none (the default). Returns 0, -EINVAL or FERRY_EBUSY.
 */
FERRY_API FERRY_WUR int ferry_dataset_writer_set_copies(ferry_dataset_writer *w, uint32_t ncopies,
							uint64_t seed);
/* The number of pre-shuffled copies an opened dataset has (0: none) and their seed (may be NULL). */
FERRY_API uint32_t ferry_dataset_copies(const ferry_dataset *ds, uint64_t *seed);

/* ----------------------------------------------------------------------------------------- loader */

typedef struct ferry_loader ferry_loader;
typedef struct ferry_loader_batch ferry_loader_batch;

/*
 * A loader over ds (which must outlive it). Configure with ferry_loader_set, then iterate with
 * ferry_loader_next. Knobs (text values):
 *   batch_size (samples per batch, default 1), seq_len (0: one sample per dataset sample, the
 *   batch carries offsets; N: samples are windows of N tokens over the concatenation of all
 *   samples, LLM pre-training style), world_size (1), rank (0), seed (0), epoch (first epoch, 0),
 *   epochs (0: run until destroyed), order (sequential|shuffle|block), block (samples per block,
 *   256), drop_last (0|1, the sampler's), drop_last_batch (0|1: drop a short last batch),
 *   documents (0|1: each batch also has position_ids and cu_seqlens, below),
 *   prefetch (batches kept ready, 4), threads (pipeline threads, 1), merge_gap (bytes between two
 *   reads that are still merged into one, 0), device (-1: host memory; N: CUDA device N), state
 *   (a string from ferry_loader_state: resume there).
 * Returns 0, -ENOMEM.
 */
FERRY_API FERRY_WUR int ferry_loader_create(ferry_dataset *ds, ferry_loader **out);
/* Stops the pipeline (waits for its threads) and frees everything, batches not released too. */
FERRY_API void ferry_loader_destroy(ferry_loader *l);
/* Returns 0, FERRY_EBADOPT (detail names key and value) or FERRY_EBUSY once started. */
FERRY_API FERRY_WUR int ferry_loader_set(ferry_loader *l, const char *key, const char *value);
/* The loader's knob names, NULL-terminated (state is not one: it is where to resume). */
FERRY_API const char *const *ferry_loader_keys(void);
/* Starts the pipeline threads (otherwise the first next does). Returns 0 or an error (ENOGPU, ...). */
FERRY_API FERRY_WUR int ferry_loader_start(ferry_loader *l);
/* Samples per epoch for this rank, and batches per epoch. */
FERRY_API uint64_t ferry_loader_samples_per_epoch(const ferry_loader *l);
FERRY_API uint64_t ferry_loader_batches_per_epoch(const ferry_loader *l);
/*
 * The next batch, in order. Blocks until it is ready (on the device when device >= 0: its copy has
 * completed); the time blocked is the step's wait. Returns 1 with *out, 0 when the last epoch is
 * done, or the error the pipeline met (it stops then). The batch stays valid until released;
 * at most `prefetch` batches can be held at once (the next call then fails with FERRY_EBUSY).
 */
FERRY_API FERRY_WUR int ferry_loader_next(ferry_loader *l, ferry_loader_batch **out);
/* Hands a batch's buffers back to the pipeline. NULL is accepted. */
FERRY_API void ferry_loader_batch_destroy(ferry_loader_batch *b);
/*
 * Zero-copy hand-over for loaders on a CUDA device. ferry_loader_take gives the caller the device
 * memory holding held batch b's data (ferry_loader_batch_bytes(b) at ferry_loader_buffer_data)
 * and hands the rest of b back to the pipeline, which puts other memory in its slot. Read b's
 * offsets and indices first: b must not be used afterwards. Returns 0 or -EINVAL (host loader or
 * batch not held; b is released all the same).
 *
 * ferry_loader_buffer_destroy gives the memory back once the work queued on `stream` (the caller's
 * CUstream or cudaStream_t, NULL for the legacy default stream) up to this call is done: the next upload into it waits on
 * the GPU, nobody waits on the host. Like memory from a stream-ordered allocator, it may be used
 * on `stream` (or on streams ordered before this call) only. Any thread may call it, also after
 * ferry_loader_destroy (the memory is freed then, and the loader's last remains with it). Returns
 * 0 or a CUDA error (the memory is freed after the device's work, not reused).
 */
typedef struct ferry_loader_buffer ferry_loader_buffer;
FERRY_API FERRY_WUR int ferry_loader_take(ferry_loader *l, ferry_loader_batch *b, ferry_loader_buffer **out);
FERRY_API void *ferry_loader_buffer_data(const ferry_loader_buffer *buf);
FERRY_API int ferry_loader_buffer_destroy(ferry_loader_buffer *buf, void *stream);

/* The batch's data: a host pointer (device -1) or a CUDA device address. */
FERRY_API void *ferry_loader_batch_data(const ferry_loader_batch *b);
/* Bytes of data. */
FERRY_API size_t ferry_loader_batch_bytes(const ferry_loader_batch *b);
/* Samples in the batch (batch_size, fewer for a short last batch). */
FERRY_API uint32_t ferry_loader_batch_samples(const ferry_loader_batch *b);
/* count + 1 byte offsets of the samples in data (host memory); offsets[count] == bytes. */
FERRY_API const uint64_t *ferry_loader_batch_offsets(const ferry_loader_batch *b);
/* The samples' indices (dataset samples, or token windows when seq_len > 0), host memory. */
FERRY_API const int64_t *ferry_loader_batch_indices(const ferry_loader_batch *b);
FERRY_API uint64_t ferry_loader_batch_epoch(const ferry_loader_batch *b);
/* Position of the batch in its epoch (0-based). */
FERRY_API uint64_t ferry_loader_batch_step(const ferry_loader_batch *b);
/*
 * With the knob documents=1, where documents start inside the batch (host memory, valid while the
 * batch is held; read them before ferry_loader_take). The batch's elements form sequences: each
 * row (seq_len > 0) or sample (seq_len 0) starts one, and so does each document start inside a
 * row (ferry datasets: every sample is a document; Megatron: each document index). position_ids
 * has one entry per element: its distance from its sequence's first element. cu_seqlens are the
 * *count sequence boundaries in elements (0, ..., elements), as FlashAttention's varlen kernels
 * take them; *max_seqlen the longest sequence. NULL (and 0s) when documents is off.
 */
FERRY_API const int64_t *ferry_loader_batch_position_ids(const ferry_loader_batch *b);
FERRY_API const int32_t *ferry_loader_batch_cu_seqlens(const ferry_loader_batch *b, uint32_t *count,
						       uint32_t *max_seqlen);
/*
 * With documents=1, a batch's memory holds its position_ids at *pos_offset bytes from its data
 * (ferry_loader_batch_data, or ferry_loader_buffer_data of a taken buffer: on a device they are
 * uploaded with the data) and its cu_seqlens at *cu_offset. Returns 0, or -EINVAL when documents
 * is off or the loader has not started.
 */
FERRY_API FERRY_WUR int ferry_loader_documents_layout(const ferry_loader *l, size_t *pos_offset,
						      size_t *cu_offset);

/*
 * The resume point after the batches returned so far, as a NUL-terminated line
 * ("ferry-loader-state 1 epoch=E batch=K samples=N world_size=W rank=R seed=S order=O ...").
 * Setting it as the `state` knob of a loader with the same configuration continues exactly
 * there; a different configuration is FERRY_EBADOPT naming the field. At another world_size it
 * resumes where that is exact (the samples all ranks had taken are whole steps of the new world
 * size: docs/DATA.md), else FERRY_EBADOPT naming both. Returns its length, or -ENOSPC when len is
 * too small.
 */
FERRY_API FERRY_WUR int ferry_loader_state(const ferry_loader *l, char *buf, size_t len);

/*
 * Starvation and throughput metrics since start, by name: steps, wait_total_ns, wait_mean_ns,
 * wait_p50_ns, wait_p90_ns, wait_p99_ns, wait_max_ns, bytes, samples, elapsed_ns, samples_per_s,
 * bytes_per_s, reads (read I/Os submitted), merged (samples read as part of a merged read),
 * cpu_ns (CPU time of the pipeline threads), inline_reads (reads of page-cache-resident data done by
 * the pipeline thread itself), mapped_reads (of those, the ones copied from a mapping of the shard,
 * knob mapped), mapped_faults (batches whose copies from a mapping faulted or found the shard cut
 * short, then read again), device_buffers (device memory buffers of one batch that exist: in
 * slots, spare, or taken and not yet freed), chunk_decodes and chunk_decoded_bytes (compressed
 * shards: chunks, or chunk heads, the pipeline threads decoded, and their bytes). Writes the value to *out and returns 0, or returns
 * FERRY_EBADOPT (an unknown name, which ferry_last_error() quotes) or -EINVAL.
 */
FERRY_API FERRY_WUR int ferry_loader_metric(ferry_loader *l, const char *name, double *out);
/* The metric names, NULL-terminated. */
FERRY_API const char *const *ferry_loader_metric_names(void);
/* Per step waits in nanoseconds: copies up to len of them into out; returns the number of steps. */
FERRY_API uint64_t ferry_loader_waits(ferry_loader *l, uint64_t *out, uint64_t len);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_DATA_H */
