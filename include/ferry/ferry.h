/*
 * ferry: move bytes between storage and (GPU) memory at the speed of the hardware.
 *
 * The whole public C API. Conventions (see docs/API.md):
 *  - functions return 0 or a count on success and a negative code on failure: -errno, or one of
 *    ferry's own codes below -4095 (FERRY_E*); ferry_strerror() names either;
 *  - after a failure, ferry_last_error() holds a sentence for the calling thread naming the file,
 *    the offset, the backend and the call that failed;
 *  - handles are opaque; every _destroy accepts NULL; the library never prints or exits.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#define FERRY_WUR __attribute__((warn_unused_result))
#else
#define FERRY_API
#define FERRY_WUR
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0

/* "0.1.0" */
FERRY_API const char *ferry_version(void);

/* ------------------------------------------------------------------------------------------ errors */

/* ferry's own error codes, all below -4095 so that they never collide with -errno. */
#define FERRY_ERRNO_MAP(XX)                                                                   \
	XX(ENOGPU, -5001, "no usable GPU (driver library missing or no device)")              \
	XX(ENOGDS, -5002, "GPUDirect Storage is not available for this file")                 \
	XX(ECORRUPT, -5003, "data is corrupt or malformed")                                   \
	XX(EBACKEND, -5004, "the requested I/O backend cannot run here")                       \
	XX(EBADOPT, -5005, "unknown option or invalid option value")                           \
	XX(EVERIFY, -5006, "verification failed: data read differs from data written")         \
	XX(ECUDA, -5007, "a CUDA driver call failed")                                          \
	XX(ECUFILE, -5008, "a cuFile call failed")                                             \
	XX(EBUSY, -5009, "the object is in use or already started")                            \
	XX(EBUDGET, -5010, "the memory budget is exhausted")

enum ferry_errno {
#define FERRY__XX(name, code, msg) FERRY_##name = (code),
	FERRY_ERRNO_MAP(FERRY__XX)
#undef FERRY__XX
};

/* Description of any negative code this library returns (ferry's own or -errno). Never NULL. */
FERRY_API const char *ferry_strerror(int err);
/* Short symbolic name: "ENOENT", "FERRY_ENOGPU", ... Never NULL. */
FERRY_API const char *ferry_err_name(int err);
/* Detail of the calling thread's last failure ("" if none): file, offset, backend, call. */
FERRY_API const char *ferry_last_error(void);

/* ---------------------------------------------------------------------------------- element types */

/*
 * Element types of tensors and of dataset samples (torch's dtypes), numbered in the safetensors
 * reference's order (increasing alignment), then BYTES. Files never hold these numbers: each
 * format maps them to its own spelling or code (safetensors' "BF16", Megatron's dtype byte).
 */
enum ferry_dtype {
	FERRY_DT_INVALID = -1, /* what a getter gives for an index out of range */
	FERRY_DT_BOOL, FERRY_DT_F4, FERRY_DT_F6_E2M3, FERRY_DT_F6_E3M2, FERRY_DT_U8, FERRY_DT_I8,
	FERRY_DT_F8_E5M2, FERRY_DT_F8_E4M3, FERRY_DT_F8_E8M0, FERRY_DT_I16, FERRY_DT_U16, FERRY_DT_F16,
	FERRY_DT_BF16, FERRY_DT_I32, FERRY_DT_U32, FERRY_DT_F32, FERRY_DT_C64, FERRY_DT_F64,
	FERRY_DT_I64, FERRY_DT_U64,
	FERRY_DT_BYTES, /* opaque bytes (files, JSON lines) of dataset samples; 8 bits; not a safetensors dtype */
	/* Added later, so at the end: the values above stay what they were (the ABI). Layouts order
	 * the types as safetensors does, which is not this order (the writer's dtype rank). */
	FERRY_DT_F8_E4M3FNUZ, FERRY_DT_F8_E5M2FNUZ,
	FERRY_DT__COUNT
};
/* The safetensors spelling ("BF16"; "BYTES" for FERRY_DT_BYTES), or NULL for a value out of range. */
FERRY_API const char *ferry_dtype_name(enum ferry_dtype dtype);
/* NumPy's name ("uint16"; "bytes" for FERRY_DT_BYTES), or NULL where NumPy has none (BF16, F8_*, ...). */
FERRY_API const char *ferry_dtype_numpy_name(enum ferry_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32 or 64), or 0 for a value out of range. */
FERRY_API int ferry_dtype_bits(enum ferry_dtype dtype);
/* The dtype safetensors spells name ("BF16", exactly): 0 with *out, or FERRY_EBADOPT. */
FERRY_API FERRY_WUR int ferry_dtype_from_name(const char *name, enum ferry_dtype *out);
/*
 * The dtype NumPy names name, in any case: "uint16" or "u2", "float32" or "f4", ..., and "bytes"
 * or "b". Returns 0 with *out, or FERRY_EBADOPT.
 */
FERRY_API FERRY_WUR int ferry_dtype_from_numpy_name(const char *name, enum ferry_dtype *out);

/* --------------------------------------------------------------------------------------- context */

typedef struct ferry_ctx ferry_ctx;

/*
 * Creates a context. Knobs start at their defaults, then each FERRY_<KEY> environment variable
 * (upper case) overrides them; an invalid environment value fails with FERRY_EBADOPT naming it.
 * Workers, rings and buffers start lazily at the first I/O that needs them.
 * Returns 0, -ENOMEM or FERRY_EBADOPT.
 */
FERRY_API FERRY_WUR int ferry_ctx_create(ferry_ctx **out);
/* Waits for nothing: every request must be finished (waited) and every file closed first. */
FERRY_API void ferry_ctx_destroy(ferry_ctx *ctx);

/*
 * Sets a knob by name. Keys (docs/CONFIG.md has the units and the measurements behind defaults).
 * direct=auto reads data already in the page cache through it and the rest with O_DIRECT:
 *   threads, chunk_size, queue_depth, slots, direct (auto|on|off), backend (auto|psync|io_uring),
 *   sqpoll (0|1), register (0|1: registered files and buffers with io_uring), path, device,
 *   host_budget, device_budget, log_level (process-wide: every context sets and reads the one
 *   level of the process), gpu_sync (block|spin: how a worker waits for a copy),
 *   publish (0|1: live counters for `ferry top`), memory (auto|host: host skips asking CUDA what
 *   each buffer is, for small host I/O at high rates on machines with a GPU), cached_depth,
 *   cached_io, copy_unit, copy_units, uring_no_coop, uring_defer (0|1: io_uring setup flags).
 * Sizes take suffixes k, m, g (powers of 1024). Keys that shape the workers or their rings
 * (threads, backend, queue_depth, slots, sqpoll, register, gpu_sync, publish, copy_unit,
 * copy_units, uring_no_coop, uring_defer) fail with FERRY_EBUSY once the workers have started.
 * Returns 0, FERRY_EBADOPT (unknown key or bad value) or FERRY_EBUSY.
 */
FERRY_API FERRY_WUR int ferry_ctx_set(ferry_ctx *ctx, const char *key, const char *value);
/* Writes the knob's current value as text into buf (NUL-terminated). Returns its length or an error. */
FERRY_API FERRY_WUR int ferry_ctx_get(const ferry_ctx *ctx, const char *key, char *buf, size_t len);
/* The knob names, NULL-terminated, for help texts and bindings. */
FERRY_API const char *const *ferry_ctx_keys(void);

/*
 * Starts the workers now (otherwise the first I/O does). Returns 0 or the error that prevented it;
 * a backend asked for explicitly that cannot run gives FERRY_EBACKEND.
 */
FERRY_API FERRY_WUR int ferry_ctx_start(ferry_ctx *ctx);
/*
 * Name of the backend the context's workers and queues use ("io_uring" or "psync"), probing it if
 * needed ("none" when none works: the error detail says why). Does not start the workers.
 */
FERRY_API const char *ferry_ctx_backend(ferry_ctx *ctx);
/* Why a backend (psync, io_uring, cufile) is not usable here ("" if it is), e.g.
 * "io_uring: kernel.io_uring_disabled=2". */
FERRY_API const char *ferry_backend_unavailable_reason(const char *backend);

/* Statistics counters, monotonically increasing over the context's life. */
enum ferry_stat {
	FERRY_STAT_BYTES_READ,
	FERRY_STAT_BYTES_WRITTEN,
	FERRY_STAT_READS,          /* read requests completed (sync, async, batch entries) */
	FERRY_STAT_WRITES,         /* write requests completed */
	FERRY_STAT_CHUNKS,         /* chunk I/Os issued to the backend */
	FERRY_STAT_DIRECT_CHUNKS,  /* of which through the O_DIRECT descriptor */
	FERRY_STAT_BOUNCED_CHUNKS, /* of which through an aligned bounce buffer */
	FERRY_STAT_BUFFERED_CHUNKS,/* of which through the buffered descriptor */
	FERRY_STAT_RETRIES,        /* short transfers, EINTR or EAGAIN resubmitted */
	FERRY_STAT_ERRORS,         /* requests that failed */
	FERRY_STAT_FALLBACKS,      /* automatic fallbacks (backend, O_DIRECT, GDS) taken */
	FERRY_STAT_CACHED_CHUNKS,  /* read through the page cache because the data was resident (direct=auto) */
	FERRY_STAT_UNIT_COPIES,    /* copy units sent to the GPU (resident reads into device memory) */
	FERRY_STAT__COUNT
};
FERRY_API uint64_t ferry_ctx_stat(const ferry_ctx *ctx, enum ferry_stat which);
FERRY_API const char *ferry_stat_name(enum ferry_stat which);

/* ----------------------------------------------------------------------------------------- files */

typedef struct ferry_file ferry_file;

#define FERRY_O_RDONLY 0x0
#define FERRY_O_WRONLY 0x1
#define FERRY_O_RDWR 0x2
#define FERRY_O_CREAT 0x10
#define FERRY_O_TRUNC 0x20
#define FERRY_O_EXCL 0x40
#define FERRY_O_BUFFERED 0x100 /* do not open an O_DIRECT descriptor even if the knob allows it */

/*
 * Opens path. Both a buffered descriptor and, where the file system accepts it and the `direct`
 * knob is not off, an O_DIRECT one are kept; the engine chooses per chunk. With direct=on a file
 * system that refuses O_DIRECT is an error (-EINVAL); with auto it is a counted fallback.
 * New files are created with mode 0644 (umask applies). Returns 0 or -errno.
 */
FERRY_API FERRY_WUR int ferry_file_open(ferry_ctx *ctx, const char *path, int flags, ferry_file **out);
/* Closes both descriptors. No request on the file may be in flight. */
FERRY_API void ferry_file_destroy(ferry_file *f);
/* Current size in bytes (fstat), or a negative error. */
FERRY_API int64_t ferry_file_size(ferry_file *f);
/* Logical block size that O_DIRECT offsets and lengths must respect (512 or 4096 typically). */
FERRY_API uint32_t ferry_file_block_size(const ferry_file *f);
/* Alignment O_DIRECT needs of memory addresses (statx dio_mem_align where known). */
FERRY_API uint32_t ferry_file_mem_align(const ferry_file *f);
/* 1 if an O_DIRECT descriptor is open, 0 if not. */
FERRY_API int ferry_file_is_direct(const ferry_file *f);
FERRY_API const char *ferry_file_path(const ferry_file *f);
/* fdatasync (fsync if full != 0) of the file. Returns 0 or -errno. */
FERRY_API FERRY_WUR int ferry_file_sync(ferry_file *f, int full);
/* ftruncate. Returns 0 or -errno. */
FERRY_API FERRY_WUR int ferry_file_truncate(ferry_file *f, uint64_t size);
/*
 * How ferry reads this file, as one line of text: descriptors open, alignment, backend, and each
 * fallback taken with its reason. Writes at most len bytes (NUL-terminated); returns the length.
 */
FERRY_API int ferry_file_path_info(ferry_file *f, char *buf, size_t len);

/*
 * Durable files: a new file that appears at its path only complete. ferry_durable_create makes
 * ".NAME.ferry-tmp-<16 hex digits>" beside path exclusively (O_EXCL|O_NOFOLLOW, through the
 * directory's descriptor, opened once) and holds an flock on it while it lives; it first removes
 * such temporaries of the same NAME whose flock it can take (left by a writer that was killed).
 * Write it with ferry_durable_pwrite or through the ferry_file of ferry_durable_open (the engine's
 * asynchronous and GPU paths); ferry_durable_commit fsyncs it, renames it to path (or refuses to
 * replace a file there) and fsyncs the directory; ferry_durable_destroy of one not committed
 * removes its temporary and nothing else.
 */
typedef struct ferry_durable ferry_durable;

#define FERRY_DURABLE_NOREPLACE 0x1 /* commit: -EEXIST when path exists (left as it is) */
#define FERRY_DURABLE_NOSYNC 0x2    /* commit: no fsync of the file or the directory */

/* Creates the temporary for path (mode 0644, umask applies). Returns 0 or -errno. */
FERRY_API FERRY_WUR int ferry_durable_create(const char *path, ferry_durable **out);
/*
 * Opens the temporary as a ferry_file of ctx (FERRY_O_WRONLY or FERRY_O_RDWR, FERRY_O_BUFFERED),
 * relative to the directory and checked to be the file made. The caller destroys it before the
 * commit, with no request in flight. Returns 0 or -errno.
 */
FERRY_API FERRY_WUR int ferry_durable_open(ferry_durable *d, ferry_ctx *ctx, int flags, ferry_file **out);
/* Writes all len bytes of host memory at offset. Returns len or -errno. */
FERRY_API FERRY_WUR int64_t ferry_durable_pwrite(ferry_durable *d, const void *buf, size_t len, uint64_t offset);
/* The temporary's path (for messages), "" once committed. */
FERRY_API const char *ferry_durable_tmp_path(const ferry_durable *d);
/*
 * fsync, rename over path (FERRY_DURABLE_NOREPLACE: refused with -EEXIST), fsync of the directory.
 * Returns 0 or a negative code. A failure before the rename removes the temporary (path is left
 * as it was); after it (the directory's fsync) the file is in place and the error says so.
 */
FERRY_API FERRY_WUR int ferry_durable_commit(ferry_durable *d, int flags);
/* Removes the temporary unless committed, releases the lock; accepts NULL. */
FERRY_API void ferry_durable_destroy(ferry_durable *d);

/* ------------------------------------------------------------------------- synchronous transfers */

/*
 * Reads len bytes at offset into buf (host memory). Any offset, length and address: unaligned
 * parts are read through an aligned bounce buffer internally. Large requests are split into
 * chunks spread over the workers. Returns the bytes read, fewer only at end of file, or a negative
 * error. Bytes of buf past the count are never stale: they are left as they were, or zeroed up to
 * the end of the last block where an O_DIRECT read ran into end of file.
 */
FERRY_API FERRY_WUR ssize_t ferry_pread(ferry_file *f, void *buf, size_t len, uint64_t offset);
/* Writes len bytes. Returns len or a negative error (then some chunks may have been written). */
FERRY_API FERRY_WUR ssize_t ferry_pwrite(ferry_file *f, const void *buf, size_t len, uint64_t offset);

/* ------------------------------------------------------------------------ asynchronous transfers */

typedef struct ferry_req ferry_req;

/*
 * Submits a read or write and returns at once with a handle. The buffer must stay valid until the
 * request is waited. If the submit fails, no handle is returned and nothing completes later.
 */
FERRY_API FERRY_WUR int ferry_pread_async(ferry_file *f, void *buf, size_t len, uint64_t offset,
					  ferry_req **out);
FERRY_API FERRY_WUR int ferry_pwrite_async(ferry_file *f, const void *buf, size_t len,
					   uint64_t offset, ferry_req **out);
/*
 * Stream-ordered transfers of device memory (cuda.h's CUstream or cudaStream_t as stream; NULL is
 * the legacy default stream): nothing lands in (or leaves) dev_buf before the work already queued
 * on stream, and work queued on stream afterwards sees the whole transfer done. The calling thread
 * does not block: storage reads start at once into pinned slots, the copies to or from dev_buf start
 * once the stream has passed the call's place on it (the workers ask its event and go on with other
 * requests meanwhile), and a host function on the stream holds later work until the data is there.
 * The request is waited and freed as any other (ferry_req_wait gives the count or the error).
 * Host memory is refused (-EINVAL): there is nothing to order.
 */
FERRY_API FERRY_WUR int ferry_pread_stream(ferry_file *f, void *dev_buf, size_t len, uint64_t offset,
					   void *stream, ferry_req **out);
FERRY_API FERRY_WUR int ferry_pwrite_stream(ferry_file *f, const void *dev_buf, size_t len,
					    uint64_t offset, void *stream, ferry_req **out);
/* 1 if finished, 0 if not. Never blocks. */
FERRY_API int ferry_req_done(const ferry_req *r);
/*
 * Waits up to timeout_ns (negative: forever) for the request. Returns its result (as ferry_pread /
 * ferry_pwrite would) once finished, or -ETIMEDOUT. The handle stays valid until freed.
 */
FERRY_API ssize_t ferry_req_wait(ferry_req *r, int64_t timeout_ns);
/* Frees a finished request; a request still running is waited first. NULL is accepted. */
FERRY_API void ferry_req_destroy(ferry_req *r);

/* ---------------------------------------------------------------------------------------- batches */

typedef struct ferry_batch ferry_batch;

/* A list of (file, offset, length, buffer) reads or writes done as one submission. */
FERRY_API FERRY_WUR int ferry_batch_create(ferry_ctx *ctx, ferry_batch **out);
FERRY_API void ferry_batch_destroy(ferry_batch *b);
/* Appends an entry; returns its index, or a negative error. The batch must not be running. */
FERRY_API FERRY_WUR int ferry_batch_add_read(ferry_batch *b, ferry_file *f, uint64_t offset,
					     size_t len, void *buf);
FERRY_API FERRY_WUR int ferry_batch_add_write(ferry_batch *b, ferry_file *f, uint64_t offset,
					      size_t len, const void *buf);
/* Entries added so far. */
FERRY_API size_t ferry_batch_count(const ferry_batch *b);
/* Starts every entry. Returns 0 or an error (then nothing was started). */
FERRY_API FERRY_WUR int ferry_batch_submit(ferry_batch *b);
/*
 * Waits for all entries (timeout as ferry_req_wait). Returns 0 if every entry transferred its whole
 * length, the number of entries that came back short (end of file) if any did, or the first
 * entry's error by index. ferry_batch_result() gives each entry's count or error.
 */
FERRY_API int ferry_batch_wait(ferry_batch *b, int64_t timeout_ns);
FERRY_API ssize_t ferry_batch_result(const ferry_batch *b, size_t index);
/* Forgets the entries so the batch can be filled again (it must not be running). */
FERRY_API void ferry_batch_reset(ferry_batch *b);

/* ---------------------------------------------------------------------------------------- queues */

/*
 * A queue is a caller-owned submission ring for one thread: the caller keeps up to `depth` I/Os
 * in flight itself, the way fio's jobs do, with no handoff to workers. It uses the context's
 * backend (io_uring: one ring; psync: each I/O done at submit). Unaligned I/Os on O_DIRECT files
 * are handled as in ferry_pread. A queue belongs to the thread that creates it: only that thread
 * may queue, submit, reap and destroy (the others get -EINVAL), which lets its io_uring ring run
 * completions in that thread's own calls (SINGLE_ISSUER, DEFER_TASKRUN where the kernel has
 * them). Files opened and closed by other threads may be used as usual; a file closed while a
 * queue exists stays open in the kernel until that queue's next queued I/O or its destruction.
 */
typedef struct ferry_queue ferry_queue;

FERRY_API FERRY_WUR int ferry_queue_create(ferry_ctx *ctx, unsigned depth, ferry_queue **out);
FERRY_API void ferry_queue_destroy(ferry_queue *q);
/* Queues a read/write tagged with user_data. Returns 0, or -EBUSY when `depth` are in flight. */
FERRY_API FERRY_WUR int ferry_queue_read(ferry_queue *q, ferry_file *f, void *buf, size_t len,
					 uint64_t offset, void *user_data);
FERRY_API FERRY_WUR int ferry_queue_write(ferry_queue *q, ferry_file *f, const void *buf,
					  size_t len, uint64_t offset, void *user_data);
/* Submits what was queued. Returns the number submitted or an error. */
FERRY_API FERRY_WUR int ferry_queue_submit(ferry_queue *q);
/*
 * Submits what is queued and not yet submitted (with the wait, in one system call where the
 * backend can), then waits for at least min_complete completions (0: never blocks) and returns
 * up to max of them: user_data[i] and result[i] (bytes transferred, short only at end of file, or
 * a negative error). Returns the number returned or an error.
 */
FERRY_API FERRY_WUR int ferry_queue_reap(ferry_queue *q, unsigned min_complete, unsigned max,
					 void **user_data, int64_t *result);
/* I/Os queued or in flight and not yet reaped. */
FERRY_API unsigned ferry_queue_pending(const ferry_queue *q);

/* ------------------------------------------------------------------------------- aligned buffers */

/* Page-aligned host allocation (huge-page advised when large). Free with ferry_free_aligned. */
FERRY_API void *ferry_alloc_aligned(size_t len);
FERRY_API void ferry_free_aligned(void *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_FERRY_H */
