/*
 * ferry's compressed files (docs/FORMATS.md, issue 26): independently compressed chunks, each a
 * standard zstd frame or an LZ4 frame of exactly one block, then the index in a skippable frame,
 * then a fixed trailer in a skippable frame. `zstd -d` and `lz4 -d` of the stock tools give the
 * original bytes back. This header is the parser and the per-chunk codec, kept apart from the
 * reader and writer (include/ferry/compress.h) so that the fuzzer reaches them on plain buffers.
 */
#ifndef FERRY_FORMAT_CZ_H
#define FERRY_FORMAT_CZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FERRY__CZ_INDEX_MAGIC 0x184D2A5Eu   /* skippable frame 14: the index */
#define FERRY__CZ_TRAILER_MAGIC 0x184D2A5Fu /* skippable frame 15: the trailer, last 80 bytes */
#define FERRY__CZ_TRAILER_LEN 80u
#define FERRY__CZ_INDEX_HEAD 24u  /* frame header 8, version 4, reserved 4, chunk count 8 */
#define FERRY__CZ_ENTRY_LEN 48u
#define FERRY__CZ_VERSION 1u
#define FERRY__CZ_CHUNK_MIN (64u << 10)
#define FERRY__CZ_CHUNK_MAX (4u << 20) /* an LZ4 frame's largest block */
#define FERRY__CZ_LZ4_PAYLOAD 19u      /* magic 4, FLG, BD, content size 8, HC; block size 4 */
#define FERRY__CZ_ZSTD_RAW_HEAD 13u    /* magic 4, descriptor, content size 8 */
#define FERRY__CZ_ZSTD_RAW_BLOCK (128u << 10)

#define FERRY__CZ_STORED 0x1u /* entry flag: the frame holds the bytes uncompressed */

/* Codec numbers, as in the trailer and in gpu/nvcomp.h's enum. */
#define FERRY__CZ_LZ4 1
#define FERRY__CZ_ZSTD 2

struct ferry__cz_chunk {
	uint64_t c_off, u_off; /* the frame's offset in the file; its bytes' offset in the data */
	uint64_t xxh_u, xxh_c; /* XXH3-64 of the uncompressed bytes and of the whole frame */
	uint32_t c_size, u_size;
	uint32_t payload_off; /* LZ4: the raw block's offset in the frame (19); zstd: 0 */
	uint32_t flags;       /* FERRY__CZ_STORED */
};

struct ferry__cz_meta {
	int codec;
	uint32_t chunk_size, level;
	uint64_t index_off, index_len, total, nchunks, index_xxh;
	uint64_t compressed; /* bytes of chunk frames (index_off) */
	struct ferry__cz_chunk *chunks; /* nchunks, malloc'd by ferry__cz_parse_index */
};

/* Whether the last 80 bytes of a file of file_size bytes look like a trailer (its two magics): 1 or 0. */
int ferry__cz_is_trailer(const uint8_t *t, uint64_t file_size);
/* Checks the trailer t (80 bytes) of a file of file_size bytes and fills m's scalar fields.
 * 0 or FERRY_ECORRUPT naming name and the field. */
int ferry__cz_parse_trailer(const uint8_t *t, uint64_t file_size, const char *name, struct ferry__cz_meta *m);
/* Checks the index frame (m->index_len bytes) against m and every entry's fields, then sets
 * m->chunks (free with ferry__cz_meta_free). 0, -ENOMEM or FERRY_ECORRUPT naming the chunk and field. */
int ferry__cz_parse_index(const uint8_t *idx, const char *name, struct ferry__cz_meta *m);
void ferry__cz_meta_free(struct ferry__cz_meta *m);

/* Decodes chunk i's frame (c_size bytes at frame) into dst (u_size bytes). verify: checks the
 * bytes' XXH3 after, and the frame's only where the decoder or that check fails (a damaged frame is
 * named by its compressed checksum). 0 or FERRY_ECORRUPT naming name, the chunk, the field. */
int ferry__cz_decode(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, uint8_t *dst,
		     int verify, const char *name);
/* A zstd decompression context kept between decodes (ZSTD_decompress makes and frees one a call). */
struct ferry__cz_dctx;
int ferry__cz_dctx_create(struct ferry__cz_dctx **out);
void ferry__cz_dctx_destroy(struct ferry__cz_dctx *d);
/* Decodes chunk i's frame into dst (room: u_size bytes) as ferry__cz_decode does with d's context,
 * or, when want < u_size and the chunk is not stored, only its first want bytes (streamed, zstd
 * block by block; LZ4_decompress_safe_partial), checking the frame's XXH3 when verify (the bytes'
 * covers the whole chunk). *have: the bytes decoded (u_size: whole, checked as ferry__cz_decode
 * does when verify). 0 or FERRY_ECORRUPT naming name, the chunk and the field. */
int ferry__cz_decode_with(struct ferry__cz_dctx *d, const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame,
			  uint8_t *dst, uint32_t want, int verify, uint32_t *have, const char *name);
/* Checks only the frame's XXH3 (before the frame goes to a GPU decoder). */
int ferry__cz_check_frame(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, const char *name);
/* Checks a frame before it goes to nvCOMP, whatever cz_verify says: its XXH3 and that it decodes to
 * no more than its entry's u_size (zstd: the frame's bound; LZ4: ferry__lz4_walk, unless
 * lz4_walked_on_gpu: nvCOMP's decoder walks it there), since nvCOMP 6 does not bound its output.
 * 0 or FERRY_ECORRUPT. */
int ferry__cz_check_gpu_frame(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, const char *name,
			       bool lz4_walked_on_gpu);
/* Checks only chunk i's bytes (u_size at dst) against the index's XXH3 (a stored chunk read
 * straight into its destination). 0 or FERRY_ECORRUPT naming name, the chunk and its bytes. */
int ferry__cz_check_bytes(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *dst, const char *name);

/* Encodes n bytes (1 <= n <= chunk_size) as one frame into out (room: ferry__cz_bound), filling
 * e's sizes, flags, payload_off and checksums (not the offsets). Returns 0 or a negative code. */
size_t ferry__cz_bound(int codec, size_t n);
struct ferry__cz_cctx;
int ferry__cz_cctx_create(int codec, struct ferry__cz_cctx **out);
void ferry__cz_cctx_destroy(struct ferry__cz_cctx *c);
int ferry__cz_encode(struct ferry__cz_cctx *c, int codec, int level, uint32_t chunk_size, const uint8_t *src,
		     size_t n, uint8_t *out, struct ferry__cz_chunk *e);

/* The index frame and trailer of a file whose chunks are m->chunks: writes ferry__cz_index_len
 * bytes into idx and FERRY__CZ_TRAILER_LEN into t; sets m->index_xxh. */
size_t ferry__cz_index_len(uint64_t nchunks);
void ferry__cz_write_index(struct ferry__cz_meta *m, uint8_t *idx, uint8_t *t);

/*
 * Decoded chunks kept between reads, for one thread (the loader's pipeline threads: one each):
 * ferry__cz_pread_cached reads [off, off + len) of z into host memory buf as ferry_cz_pread does,
 * on the calling thread alone, decoding each chunk it covers only when c does not hold it already
 * (entries evicted least recently used first past budget bytes; a chunk larger than the budget is
 * still decoded). Returns the bytes read or a negative code naming the chunk. Entries are keyed by
 * the ferry_cz handle's address and the chunk: a cache must not outlive a handle it has read (a
 * handle made later at the same address would find the old one's bytes). The loader's caches go
 * with the loader, which its dataset must outlive (data.h), and the dataset holds the handles.
 */
struct ferry__cz_cache;
struct ferry__cz_cache_stats {
	uint64_t decodes, decoded, hits; /* chunks (or heads) decoded, their bytes, reads served from c */
};
struct ferry_cz;
int ferry__cz_cache_create(uint64_t budget, struct ferry__cz_cache **out);
void ferry__cz_cache_destroy(struct ferry__cz_cache *c);
void ferry__cz_cache_stats(const struct ferry__cz_cache *c, struct ferry__cz_cache_stats *out);
ssize_t ferry__cz_pread_cached(struct ferry_cz *z, struct ferry__cz_cache *c, void *buf, size_t len, uint64_t off);

/* A reader's parsed index, its path and its cz_verify: for the decoded-chunk caches outside
 * cz_file.c (cz_dcache.c). */
const struct ferry__cz_meta *ferry__cz_meta_of(const struct ferry_cz *z);
const char *ferry__cz_name(const struct ferry_cz *z);
int ferry__cz_verifies(const struct ferry_cz *z);
/* n bytes of z's file at off into buf on the calling thread (one buffered pread where the file has
 * a descriptor, no engine hand-off), chunk i named in errors. 0 or a negative code. */
int ferry__cz_read_raw(struct ferry_cz *z, void *buf, size_t n, uint64_t off, uint64_t i);

/*
 * Decoded chunks kept in device memory, for one thread and one device (the loader's pipeline
 * threads on a device, issue 26): the device counterpart of ferry__cz_cache. A batch is built in
 * three steps:
 *  - ferry__cz_dcache_add for each range [off, off + len) of a compressed file bound for the
 *    batch at byte `at`: the chunks it covers that c does not hold get an entry (evicting the least
 *    recently used outside this batch past budget bytes; a batch that needs more still gets them);
 *  - ferry__cz_dcache_queue(ring, base): the frames of the chunks to decode are read (one pread
 *    each, on this thread) into pinned memory and checked (ferry__cz_check_gpu_frame), copied in one
 *    piece to device scratch and decoded by one nvCOMP batch per codec on the ring's stream (stored
 *    chunks: checked on the CPU, copied), then every range is copied from its entries to base + at
 *    (a gather: the scatter kernel where loaded). *pending: nvCOMP work to finish (1) or none (0);
 *  - with *pending, after the ring's work is done (a ticket recorded after the queue, synchronised):
 *    ferry__cz_dcache_finish, nvCOMP's statuses and sizes; a failure names the file and chunks.
 * Until finish, the batch's entries may not be used by another batch. ferry__cz_dcache_reset drops
 * a batch that failed before its queue (its entries are forgotten). Entries are keyed by the
 * handle's address, as ferry__cz_cache's are. The calls make dev current on the calling thread.
 */
struct ferry__cz_dcache;
struct ferry__ring_gpu;
struct ferry__pinned_pool;
struct ferry__cz_dcache_stats {
	uint64_t gpu_decodes, cpu_decodes, decoded, hits; /* chunks decoded by nvCOMP, stored ones copied; bytes; ranges' chunk hits */
	uint64_t batches; /* nvCOMP batches (one per codec of a loader batch that had chunks to decode) */
};
int ferry__cz_dcache_create(int dev, uint64_t budget, struct ferry__pinned_pool *pool, struct ferry__cz_dcache **out);
void ferry__cz_dcache_destroy(struct ferry__cz_dcache *c); /* its ring's work done first (the caller's) */
void ferry__cz_dcache_stats(const struct ferry__cz_dcache *c, struct ferry__cz_dcache_stats *out);
int ferry__cz_dcache_add(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t off, size_t len, uint64_t at);
/* Chunks covering [off, off + len) of z that a later batch reads, decoded with this batch's
 * (the loader's look-ahead): 0, 1 when the cache has no room left for them (stop), or a negative
 * code. ferry__cz_dcache_pending: the chunks this batch decodes so far. */
int ferry__cz_dcache_prefetch(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t off, size_t len);
size_t ferry__cz_dcache_pending(const struct ferry__cz_dcache *c);
int ferry__cz_dcache_queue(struct ferry__cz_dcache *c, struct ferry__ring_gpu *ring, uint64_t base, int *pending);
int ferry__cz_dcache_finish(struct ferry__cz_dcache *c);
void ferry__cz_dcache_reset(struct ferry__cz_dcache *c);

/* The phases of the last ferry_cz_pread on z, in seconds of the calling thread: the whole read,
 * waiting for the storage, the host work (decoding or checking, queuing the GPU's work), waiting for
 * the GPU; the windows of the read pipeline and the most compressed bytes its reads had in flight
 * at once (the storage's queue: a plain ferry_pread keeps the workers' queues full), and the slots
 * it used. */
struct ferry__cz_phases {
	double total, read_wait, host, gpu_wait;
	uint64_t windows, max_inflight;
	unsigned slots; /* the slots (window buffers) the read used */
};
void ferry__cz_last_phases(struct ferry_cz *z, struct ferry__cz_phases *out);

/* The largest window (uncompressed bytes) of a read of len bytes into device memory: cz_window,
 * or with cz_window 0 (the default) 128 MiB, or for a read whose frames are all in memory
 * (resident) an eighth of it past 1 GiB, up to 256 MiB (cz_file.c says why). */
uint64_t ferry__cz_window_bytes(const struct ferry_cz *z, uint64_t len, int resident);

/* Frees the read pipeline's idle slot sets (cz_file.c: a reader's slots, pinned buffers, streams,
 * device scratch and decoders, kept for the process's next reader of the same device), so that
 * the next read makes its own. */
void ferry__cz_release_idle(void);

/* Runs fn(arg, i) for i in [0, n) on up to threads threads (the caller's among them). Returns 0 or
 * the error of the lowest failed i, with that call's ferry_last_error() detail on this thread. */
int ferry__cz_parallel(size_t n, unsigned threads, int (*fn)(void *arg, size_t i), void *arg);

#endif
