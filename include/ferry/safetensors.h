/*
 * ferry: safetensors files to and from any memory (host or CUDA device), strictly.
 *
 * Reading validates the whole header before anything is trusted (docs/CHECKPOINTS.md lists the
 * rules): a header of at most 100,000,000 bytes holding one JSON object in valid UTF-8, known
 * dtypes, shapes whose byte size does not overflow, data offsets sorted, contiguous, without holes
 * and ending exactly at the end of the file, no duplicate names, __metadata__ of strings only, and
 * no tensor name that is empty or holds '/', '\\' or a control character. Every rejection returns
 * FERRY_ECORRUPT with ferry_last_error() naming the file, the byte offset and the field.
 * Nothing is allocated beyond what the file's own size justifies.
 *
 * Writing produces files that Hugging Face's safetensors loads, with the header padded with
 * spaces so that the data section starts 4 KiB-aligned (for O_DIRECT and GPUDirect Storage).
 * Saves are durable: written to a temporary name, fsynced, renamed into place, directory fsynced.
 */
#ifndef FERRY_SAFETENSORS_H
#define FERRY_SAFETENSORS_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensors' element types are enum ferry_dtype (ferry.h), every one but FERRY_DT_BYTES. */

/* Tensors have at most this many dimensions here (the format sets no limit; real files use <= 8). */
#define FERRY_ST_MAX_DIMS 32
/* The __metadata__ key under which a tensor's xxh3-64 checksum (16 hex digits) is stored. */
#define FERRY_ST_CHECKSUM_PREFIX "ferry.xxh3:"

/* ------------------------------------------------------------------------------------- reading */

typedef struct ferry_st ferry_st;

/*
 * Opens a safetensors file and validates its header. Tensors are listed in file order.
 * Returns 0, -errno, FERRY_ECORRUPT (with the rule broken) or -ENOMEM.
 */
FERRY_API FERRY_WUR int ferry_st_open(ferry_ctx *ctx, const char *path, ferry_st **out);
/* NULL is accepted. */
FERRY_API void ferry_st_destroy(ferry_st *st);

FERRY_API const char *ferry_st_path(const ferry_st *st);
/* The open file, for ferry_pread and batches. */
FERRY_API ferry_file *ferry_st_file(ferry_st *st);
/* Byte offset of the data section (8 + header length). */
FERRY_API uint64_t ferry_st_data_start(const ferry_st *st);
FERRY_API size_t ferry_st_count(const ferry_st *st);
/* Index of the tensor named name, or -ENOENT. */
FERRY_API int ferry_st_find(const ferry_st *st, const char *name);
/* Tensor i (0 <= i < count, in file order); out-of-range i gives NULL / FERRY_DT_INVALID / -1 / 0. */
FERRY_API const char *ferry_st_name(const ferry_st *st, size_t i);
FERRY_API enum ferry_dtype ferry_st_dtype(const ferry_st *st, size_t i);
/* Number of dimensions; copies up to max of them into dims (which may be NULL). */
FERRY_API int ferry_st_shape(const ferry_st *st, size_t i, uint64_t *dims, int max);
/* Absolute file offset of the tensor's first byte, and its length in bytes. */
FERRY_API uint64_t ferry_st_offset(const ferry_st *st, size_t i);
FERRY_API uint64_t ferry_st_nbytes(const ferry_st *st, size_t i);
/* __metadata__ entries, in file order; value of key or NULL. */
FERRY_API size_t ferry_st_metadata_count(const ferry_st *st);
FERRY_API const char *ferry_st_metadata_key(const ferry_st *st, size_t i);
FERRY_API const char *ferry_st_metadata_value(const ferry_st *st, size_t i);
FERRY_API const char *ferry_st_metadata_get(const ferry_st *st, const char *key);

/*
 * Reads tensor i whole into buf (host or device memory, len >= its byte size). Returns the bytes
 * read or a negative error (a file shorter than its header says gives FERRY_ECORRUPT).
 */
FERRY_API FERRY_WUR ssize_t ferry_st_read(ferry_st *st, size_t i, void *buf, size_t len);
/*
 * Reads the slice [start, stop) of tensor i along dimension dim (what a tensor-parallel rank
 * needs), packed contiguously into buf (host or device memory). The slice's bytes per row must
 * be whole bytes (sub-byte dtypes). Returns the bytes read, -EINVAL for a bad range, or an error.
 */
FERRY_API FERRY_WUR ssize_t ferry_st_read_slice(ferry_st *st, size_t i, int dim, uint64_t start,
						uint64_t stop, void *buf, size_t len);
/*
 * Checks tensor i against its stored checksum (reads it through host memory).
 * Returns 1 when it matches, 0 when the file holds no checksum for it, FERRY_EVERIFY when it
 * differs, or an I/O error.
 */
FERRY_API FERRY_WUR int ferry_st_verify(ferry_st *st, size_t i);
/* xxh3-64 of len bytes of host memory, as ferry stores it. */
FERRY_API FERRY_WUR int ferry_xxh3(const void *buf, size_t len, uint64_t *out);

/* ------------------------------------------------------------------------------------- writing */

typedef struct ferry_st_writer ferry_st_writer;

#define FERRY_SAVE_CHECKSUM 0x1 /* store each tensor's xxh3 in __metadata__ */
#define FERRY_SAVE_NOSYNC 0x2   /* skip fsyncs (benchmarks of the non-durable cost only) */
#define FERRY_SAVE_EXCL 0x4     /* fail with -EEXIST if path exists */

FERRY_API FERRY_WUR int ferry_st_writer_create(ferry_ctx *ctx, ferry_st_writer **out);
/* NULL is accepted. Waits for an asynchronous save in flight first. */
FERRY_API void ferry_st_writer_destroy(ferry_st_writer *w);
/*
 * Sets a writer knob by name (docs/CONFIG.md): save_prealloc (auto|on|off: the temporary file laid
 * out with fallocate, ftruncate, or fallocate except on tmpfs), save_chunk_mib (MiB per piece, 16),
 * save_inflight (pieces being written, 8), save_hold (0|1). Each starts at its FERRY_<KEY>
 * environment variable when set. Not while a save is in flight. Returns 0, FERRY_EBADOPT or FERRY_EBUSY.
 */
FERRY_API FERRY_WUR int ferry_st_writer_set(ferry_st_writer *w, const char *key, const char *value);
/* The writer's knob names, NULL-terminated. */
FERRY_API const char *const *ferry_st_writer_keys(void);
/*
 * Adds a tensor. data is host or device memory of nbytes (which must match dtype and shape) and
 * must stay valid and unchanged until the save returns (ferry_st_writer_save) or the snapshot is
 * taken (ferry_st_writer_save_async returns). Returns its index, -EINVAL (bad name, dtype, shape
 * or size), -EEXIST (duplicate name) or -ENOMEM.
 */
FERRY_API FERRY_WUR int ferry_st_writer_add(ferry_st_writer *w, const char *name, enum ferry_dtype dtype, int ndim,
					    const uint64_t *shape, const void *data, size_t nbytes);
/* Adds a __metadata__ string. Returns 0, -EINVAL or -ENOMEM. */
FERRY_API FERRY_WUR int ferry_st_writer_metadata(ferry_st_writer *w, const char *key, const char *value);
/* Forgets the tensors and metadata added (not while a save is in flight: FERRY_EBUSY). */
FERRY_API FERRY_WUR int ferry_st_writer_reset(ferry_st_writer *w);
/*
 * Writes the file durably at path (flags FERRY_SAVE_*). Tensors are laid out like the reference
 * writer (by decreasing dtype alignment, then name). Returns the file's size or an error; on
 * error path is untouched and no temporary file is left.
 */
FERRY_API FERRY_WUR int64_t ferry_st_writer_save(ferry_st_writer *w, const char *path, int flags);
/*
 * Asynchronous save: copies every tensor into pinned host memory (device tensors by
 * device-to-host copies), within the context's host_budget knob, then returns while a
 * background thread writes the file as ferry_st_writer_save would. When the state exceeds the
 * budget the call blocks until written parts free memory. Returns 0 or an error (nothing runs).
 */
FERRY_API FERRY_WUR int ferry_st_writer_save_async(ferry_st_writer *w, const char *path, int flags);
/* 1 if no save is in flight, 0 if one is. */
FERRY_API int ferry_st_writer_done(const ferry_st_writer *w);
/* Waits for the save in flight (timeout_ns < 0: forever): its result, or -ETIMEDOUT. 0 if none. */
FERRY_API int64_t ferry_st_writer_wait(ferry_st_writer *w, int64_t timeout_ns);

/* What the last save did, read with ferry_st_writer_stat (ferry_ckpt_stat for checkpoints). */
enum ferry_save_stat {
	FERRY_SAVE_STAT_BYTES,            /* "bytes": bytes of tensors saved */
	FERRY_SAVE_STAT_SLOTS,            /* "slots": pinned slots it used */
	FERRY_SAVE_STAT_PINNED_NEW_BYTES, /* "pinned_new_bytes": pinned by it (0: the slots were reused) */
	FERRY_SAVE_STAT_FALLOCATED,       /* "fallocated": 1 when its file was laid out with fallocate */
	FERRY_SAVE_STAT_RECYCLED,         /* "recycled": 1 when a checkpoint wrote over a recycled shard */
	FERRY_SAVE_STAT_DEVICE_SNAPSHOT_BYTES, /* "device_snapshot_bytes": the state's bytes when an
						* asynchronous save took its snapshot in device memory
						* (save_snapshot), 0 when in pinned host memory */
	FERRY_SAVE_STAT__COUNT
};
/*
 * Where the last save's time went, read with ferry_st_writer_phase_ns (ferry_ckpt_phase_ns).
 * "call.*" phases run on the caller's thread ("call.total" is what an asynchronous save blocked
 * for), "writer.*" on the writer thread (complete once the save has ended).
 */
enum ferry_save_phase {
	FERRY_PHASE_CALL_CHECK,         /* "call.check": busy check, join of the previous save, EXCL */
	FERRY_PHASE_CALL_HEADER,        /* "call.header": layout and header text */
	FERRY_PHASE_CALL_SLOTS,         /* "call.slots": pinned slots (allocated when new), events */
	FERRY_PHASE_CALL_START,         /* "call.start": the writer thread's creation */
	FERRY_PHASE_CALL_COPY,          /* "call.copy": issuing the copies into the slots */
	FERRY_PHASE_CALL_SLOT_WAIT,     /* "call.slot_wait": waiting for a slot the writer still writes */
	FERRY_PHASE_CALL_SYNC,          /* "call.sync": waiting for the last device-to-host copy */
	FERRY_PHASE_CALL_TOTAL,         /* "call.total": the whole call (a synchronous save: to the end) */
	FERRY_PHASE_CKPT_PREPARE,       /* "ckpt.prepare": checkpoints: latest, the step's mkdir */
	FERRY_PHASE_WRITER_LAYOUT,      /* "writer.layout": create and lay out the temporary file */
	FERRY_PHASE_WRITER_OPEN,        /* "writer.open" */
	FERRY_PHASE_WRITER_READY_WAIT,  /* "writer.ready_wait": waiting for a slot to be filled */
	FERRY_PHASE_WRITER_EVENT_WAIT,  /* "writer.event_wait": waiting for a slot's device-to-host copy */
	FERRY_PHASE_WRITER_HASH,        /* "writer.hash" */
	FERRY_PHASE_WRITER_SUBMIT,      /* "writer.submit" */
	FERRY_PHASE_WRITER_WRITE_WAIT,  /* "writer.write_wait": waiting for the oldest write in flight */
	FERRY_PHASE_WRITER_HEADER,      /* "writer.header" */
	FERRY_PHASE_WRITER_FSYNC,       /* "writer.fsync" */
	FERRY_PHASE_WRITER_RENAME,      /* "writer.rename" */
	FERRY_PHASE_WRITER_DIRSYNC,     /* "writer.dirsync" */
	FERRY_PHASE_WRITER_AFTER,       /* "writer.after": checkpoints: marker, commit, prune */
	FERRY_PHASE_WRITER_TOTAL,       /* "writer.total" */
	FERRY_SAVE_PHASE__COUNT
};
/* The last save's value of a statistic; 0 for a value out of range. */
FERRY_API uint64_t ferry_st_writer_stat(const ferry_st_writer *w, enum ferry_save_stat which);
/* Nanoseconds the last save spent in a phase; 0 for a value out of range. */
FERRY_API uint64_t ferry_st_writer_phase_ns(const ferry_st_writer *w, enum ferry_save_phase which);
/* The names quoted above ("pinned_new_bytes", "writer.fsync"), or NULL for a value out of range. */
FERRY_API const char *ferry_save_stat_name(enum ferry_save_stat which);
FERRY_API const char *ferry_save_phase_name(enum ferry_save_phase which);
/*
 * Pins ahead the host memory that an asynchronous save of bytes of tensors on device (-1: host
 * memory) will snapshot into, within host_budget, so that the first save does not pay for it
 * (the first asynchronous save of 8.6 GB on the GPU machine blocked 3.2 s longer than the next).
 * The slots are the writer's until it is destroyed, reused by every later save. Returns the bytes
 * of pinned memory the writer holds, FERRY_EBUSY while a save is in flight, or an error.
 */
FERRY_API FERRY_WUR int64_t ferry_st_writer_reserve(ferry_st_writer *w, uint64_t bytes, int device);

/* ------------------------------------------------------------------------------------- loading */

/*
 * A load: tensors of one safetensors file, of a Hugging Face sharded set
 * (model.safetensors.index.json), or of a ferry checkpoint step (manifest.json), into host or
 * device memory. Create from the path (a file, an index, or a directory holding one of them),
 * optionally choose tensors and slices, run, then take the pointers.
 */
typedef struct ferry_st_load ferry_st_load;

#define FERRY_LOAD_PER_TENSOR 0x1 /* one allocation per tensor, not one per file with views */
#define FERRY_LOAD_VERIFY 0x2     /* check stored checksums (tensors without one are an error) */

FERRY_API FERRY_WUR int ferry_st_load_open(ferry_ctx *ctx, const char *path, ferry_st_load **out);
/* Frees what the load allocated (not memory given with ferry_st_load_set_dest). NULL is accepted. */
FERRY_API void ferry_st_load_destroy(ferry_st_load *ld);
/* Number of files, and each file's parsed header. */
FERRY_API size_t ferry_st_load_files(const ferry_st_load *ld);
FERRY_API ferry_st *ferry_st_load_file(ferry_st_load *ld, size_t f);
/*
 * Selects a tensor (whole) or the slice [start, stop) of dimension dim of it. Once anything is
 * selected only the selection loads; otherwise everything does. Returns 0, -ENOENT, -EINVAL.
 */
FERRY_API FERRY_WUR int ferry_st_load_select(ferry_st_load *ld, const char *name);
FERRY_API FERRY_WUR int ferry_st_load_select_slice(ferry_st_load *ld, const char *name, int dim,
						   uint64_t start, uint64_t stop);
/* The tensors that will load (the selection, or all), in file order across files. */
FERRY_API size_t ferry_st_load_count(ferry_st_load *ld);
FERRY_API const char *ferry_st_load_name(ferry_st_load *ld, size_t i);
/* FERRY_DT_INVALID for an out-of-range i. */
FERRY_API enum ferry_dtype ferry_st_load_dtype(ferry_st_load *ld, size_t i);
/* Shape after slicing. */
FERRY_API int ferry_st_load_shape(ferry_st_load *ld, size_t i, uint64_t *dims, int max);
FERRY_API uint64_t ferry_st_load_nbytes(ferry_st_load *ld, size_t i);
/* Memory of the caller's for tensor i (e.g. a torch tensor's data_ptr()); nothing is allocated for it. */
FERRY_API FERRY_WUR int ferry_st_load_set_dest(ferry_st_load *ld, size_t i, void *ptr, size_t len);
/*
 * Loads into device `device` (or host memory when device < 0), flags FERRY_LOAD_*. Reads of all
 * files are submitted together so that reading one file overlaps copying another. The
 * staging_budget bounds host memory used for slices and verification (0: 256 MiB).
 * Returns 0 or an error.
 */
FERRY_API FERRY_WUR int ferry_st_load_run(ferry_st_load *ld, int device, int flags,
					  uint64_t staging_budget);
/*
 * Where ferry_st_load_run(ld, device, flags, ...) puts entry i when no destination is set for
 * it, for a caller that allocates the destinations itself and wants the same layout (one read
 * per file): entries of one file that load whole share a region of *region_len bytes, and entry
 * i lies at *offset in it; *file is the file. Returns 1 (in the region), 0 (an allocation of its
 * own: a slice, or FERRY_LOAD_PER_TENSOR) or -EINVAL when there is no entry i.
 */
FERRY_API FERRY_WUR int ferry_st_load_place(ferry_st_load *ld, size_t i, int flags, size_t *file,
					    uint64_t *offset, uint64_t *region_len);
/* Where tensor i is after ferry_st_load_run (device address or host pointer). */
FERRY_API void *ferry_st_load_ptr(ferry_st_load *ld, size_t i);
/* Bytes read by the last run and its wall time in nanoseconds. */
FERRY_API uint64_t ferry_st_load_bytes(const ferry_st_load *ld);
FERRY_API uint64_t ferry_st_load_ns(const ferry_st_load *ld);
/*
 * How the last run decoded the compressed files it read (ferry_st_open takes ferry's compressed
 * format, docs/FORMATS.md): ferry_cz_path_info of the last one ("nvcomp (N chunks on the GPU, M on
 * the CPU)", "cpu (host memory)", ...), or "" when it read none. Writes at most len bytes
 * (NUL-terminated); returns the length.
 */
FERRY_API int ferry_st_load_path_info(const ferry_st_load *ld, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SAFETENSORS_H */
