/*
 * ferry: compressed files (docs/FORMATS.md). A compressed file is a sequence of independently
 * compressed chunks, each a standard zstd frame or an LZ4 frame of one block, followed by an index
 * and a trailer in skippable frames: `zstd -d` and `lz4 -d` of the stock tools give the original
 * bytes back, and ferry reads any range by decoding only the chunks it covers, in parallel, on the
 * CPU or (into device memory, where nvCOMP is loaded) on the GPU.
 *
 * Knobs (docs/CONFIG.md, "Compressed files"), set by name on a writer or a reader: cz_chunk,
 * cz_level, cz_threads (both); cz_verify, cz_gpu (the reader).
 */
#ifndef FERRY_COMPRESS_H
#define FERRY_COMPRESS_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Codecs, as the file's trailer numbers them. */
#define FERRY_CZ_LZ4 1
#define FERRY_CZ_ZSTD 2

/* "lz4" or "zstd", or NULL for another value. */
FERRY_API const char *ferry_cz_codec_name(int codec);
/* The codec called name ("lz4", "zstd"): FERRY_CZ_LZ4 or FERRY_CZ_ZSTD, or FERRY_EBADOPT. */
FERRY_API FERRY_WUR int ferry_cz_codec_from_name(const char *name);
/* The knob names of writers and readers, NULL-terminated. */
FERRY_API const char *const *ferry_cz_keys(void);

typedef struct ferry_cz_writer ferry_cz_writer;

/* ferry_cz_writer_create flags */
#define FERRY_CZ_EXCL 0x1 /* the commit fails with -EEXIST where path exists */

/*
 * A writer of a new compressed file at path with codec (FERRY_CZ_*): the data goes into a temporary
 * file created exclusively beside path (docs/ARCHITECTURE.md, "Files ferry creates"), which
 * ferry_cz_writer_commit renames into place; or path is an s3:// URL, written in order into the
 * object (a multipart upload) that the commit makes visible whole (a failure aborts it; FERRY_CZ_EXCL
 * is refused with -EOPNOTSUPP). Knobs are read from the environment here and may be
 * set until the first write. Returns 0, FERRY_EBADOPT (codec, or an environment value) or -errno.
 */
FERRY_API FERRY_WUR int ferry_cz_writer_create(const char *path, int codec, int flags, ferry_cz_writer **out);
/* Sets a knob (cz_chunk, cz_level, cz_threads). 0, FERRY_EBADOPT, or FERRY_EBUSY after the first write. */
FERRY_API FERRY_WUR int ferry_cz_writer_set(ferry_cz_writer *w, const char *key, const char *value);
/*
 * Appends len bytes. Full chunks are compressed cz_threads at a time in parallel and written in
 * order. Returns 0 or a negative code; after a failure every call but destroy fails.
 */
FERRY_API FERRY_WUR int ferry_cz_writer_write(ferry_cz_writer *w, const void *buf, size_t len);
/*
 * Compresses what is left, writes the index and trailer, fsyncs and renames the file into place,
 * then fsyncs the directory. Returns the file's size in bytes, or a negative code (then nothing is
 * left at path that was not there before).
 */
FERRY_API FERRY_WUR int64_t ferry_cz_writer_commit(ferry_cz_writer *w);
/* Frees the writer; one that was not committed removes its temporary file. NULL is accepted. */
FERRY_API void ferry_cz_writer_destroy(ferry_cz_writer *w);

typedef struct ferry_cz ferry_cz;

/*
 * 1 when path (a local path or a URL ferry_file_open takes) ends in a compressed file's trailer,
 * 0 when it does not, or a negative code when it cannot be read.
 */
FERRY_API FERRY_WUR int ferry_cz_is_compressed(ferry_ctx *ctx, const char *path);
/*
 * Opens a compressed file: reads and checks the trailer and the index, every field of every
 * chunk. Returns 0, -errno, or FERRY_ECORRUPT naming the file, the chunk and the field.
 */
FERRY_API FERRY_WUR int ferry_cz_open(ferry_ctx *ctx, const char *path, ferry_cz **out);
/* Closes the file. NULL is accepted. */
FERRY_API void ferry_cz_destroy(ferry_cz *z);
/* Sets a knob of the reader (cz_threads, cz_verify, cz_gpu). 0 or FERRY_EBADOPT. */
FERRY_API FERRY_WUR int ferry_cz_set(ferry_cz *z, const char *key, const char *value);
/* The uncompressed size in bytes. */
FERRY_API int64_t ferry_cz_size(const ferry_cz *z);
/* The bytes of the chunks' frames (the file less its index and trailer). */
FERRY_API int64_t ferry_cz_compressed_size(const ferry_cz *z);
/* FERRY_CZ_LZ4 or FERRY_CZ_ZSTD. */
FERRY_API int ferry_cz_codec(const ferry_cz *z);
/* The uncompressed bytes per chunk (the last may hold fewer). */
FERRY_API int64_t ferry_cz_chunk_size(const ferry_cz *z);
/* The number of chunks, and of those stored uncompressed (compression did not pay). */
FERRY_API int64_t ferry_cz_chunks(const ferry_cz *z);
FERRY_API int64_t ferry_cz_stored_chunks(const ferry_cz *z);
/*
 * Reads len uncompressed bytes at offset into buf: host memory, or device memory (a CUDA device
 * address). Only the chunks the range covers are read and decoded, cz_threads at a time; each
 * chunk's checksums are verified unless cz_verify is 0. Into device memory the chunks are decoded
 * by nvCOMP on the GPU where it is loaded and cz_gpu allows, on the CPU otherwise;
 * ferry_cz_path_info says which ran and why. Returns the bytes read (fewer only at the end of the
 * data), or a negative code: FERRY_ECORRUPT names the chunk and what disagrees.
 */
FERRY_API FERRY_WUR ssize_t ferry_cz_pread(ferry_cz *z, void *buf, size_t len, uint64_t offset);
/*
 * How the last ferry_cz_pread decoded, one line: "cpu (host memory)", "nvcomp (N chunks on the GPU,
 * M on the CPU)" or "cpu (nvcomp: <why not>)". Writes at most len bytes (NUL-terminated); returns
 * the length.
 */
FERRY_API int ferry_cz_path_info(ferry_cz *z, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_COMPRESS_H */
