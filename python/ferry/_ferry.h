/*
 * Shared by the C files of the _ferry extension (not installed, not public): the shapes every
 * binding repeats (a blocking call with the GIL released whose error becomes the matching
 * exception, the closed and busy checks, buffers taken zero-copy, DLPack), implemented once in
 * _util.c. Hidden, so that the module exports PyInit__ferry only.
 */
#ifndef FERRY_PY_FERRY_H
#define FERRY_PY_FERRY_H

#include <Python.h>

#include <stdint.h>

#include "ferry/ferry.h"

#define FERRY_PY_HIDDEN __attribute__((visibility("hidden")))

/* ------------------------------------------------------------------------------------- errors */

/* Creates ferry.Error (a subclass of OSError) and adds it to the module. */
FERRY_PY_HIDDEN int ferry__py_errors_init(PyObject *m);
/*
 * Sets the exception for err (negative): an OSError subclass picked by errno, or ferry.Error for
 * ferry's own codes, with ferry_last_error()'s detail (call, file, offset). Returns NULL.
 */
FERRY_PY_HIDDEN PyObject *ferry__py_raise(int err, PyObject *filename);
/* The same with a detail of the caller's instead of ferry_last_error()'s. */
FERRY_PY_HIDDEN PyObject *ferry__py_raise_detail(int err, PyObject *filename, const char *detail);
/* 1 with the exception for r set when r is negative (ferry__py_raise), else 0. */
FERRY_PY_HIDDEN int ferry__py_failed(int64_t r, PyObject *filename);

/* ------------------------------------------------------------------------------- blocking calls */

/*
 * `lhs = call` with the GIL released. busy (a Py_ssize_t *, or NULL) counts the call while it
 * runs, so that another thread sees the object in use (ferry__py_busy) instead of racing in C.
 */
#define FERRY_PY_NOGIL(busy, lhs, call)                                                             \
	do {                                                                                        \
		Py_ssize_t *ferry_py_busy_ = (busy);                                                \
		if (ferry_py_busy_)                                                                 \
			++*ferry_py_busy_;                                                          \
		Py_BEGIN_ALLOW_THREADS                                                              \
		(lhs) = (call);                                                                     \
		Py_END_ALLOW_THREADS                                                                \
		if (ferry_py_busy_)                                                                 \
			--*ferry_py_busy_;                                                          \
	} while (0)

/* A call on a path: fn(ctx, path, arg), made with the GIL released by ferry__py_path_call. */
typedef int64_t (*ferry__py_path_fn)(ferry_ctx *ctx, const char *path, void *arg);
/*
 * The open shape: ctxo (a ferry.Context, or NULL for calls without one) and pathobj (str, bytes
 * or os.PathLike) become ctx and a file-system path for fn, run with the GIL released; a negative
 * result raises its exception naming pathobj. Returns the result (>= 0) or -1 with an exception.
 */
FERRY_PY_HIDDEN int64_t ferry__py_path_call(PyObject *ctxo, PyObject *pathobj, ferry__py_path_fn fn,
					    void *arg);

/* ---------------------------------------------------------------------- closed and busy checks */

/* 0 when handle is set; else ValueError with the PyUnicode_FromFormat message, and -1. */
FERRY_PY_HIDDEN int ferry__py_closed(const void *handle, const char *fmt, ...);
/* 0 when busy is 0; else RuntimeError with the PyUnicode_FromFormat message, and -1. */
FERRY_PY_HIDDEN int ferry__py_busy(Py_ssize_t busy, const char *fmt, ...);

/* ------------------------------------------------------------------------ arguments and values */

/* A non-negative int below 2**64 (ValueError naming what otherwise). */
FERRY_PY_HIDDEN int ferry__py_u64(PyObject *o, const char *what, uint64_t *out);
/* Seconds as nanoseconds: None (or NULL) and more than 9e9 s wait forever (-1); <= 0 polls (0). */
FERRY_PY_HIDDEN int ferry__py_timeout(PyObject *o, int64_t *ns);
/* A tuple of item(0, arg) ... item(n - 1, arg) (n < 0: empty), or NULL. */
typedef PyObject *(*ferry__py_item_fn)(Py_ssize_t i, const void *arg);
FERRY_PY_HIDDEN PyObject *ferry__py_tuple(Py_ssize_t n, ferry__py_item_fn item, const void *arg);
/* The same as a list. */
FERRY_PY_HIDDEN PyObject *ferry__py_list(Py_ssize_t n, ferry__py_item_fn item, const void *arg);
/* One entry of a dict being built: its value (a new reference; NULL on error) and *key. */
typedef PyObject *(*ferry__py_entry_fn)(Py_ssize_t i, const void *arg, const char **key);
/* A dict of the entries entry(0, arg, &key) ... entry(n - 1, arg, &key), or NULL. */
FERRY_PY_HIDDEN PyObject *ferry__py_dict(Py_ssize_t n, ferry__py_entry_fn entry, const void *arg);
/* A tuple of n unsigned ints (n < 0: empty). */
FERRY_PY_HIDDEN PyObject *ferry__py_u64_tuple(const uint64_t *v, int n);

/* --------------------------------------------------------------------- DLPack (ABI, by hand) */

/* dlpack.h v0.8 and v1.x; only the fields used. https://dmlc.github.io/dlpack/latest/c_api.html */
enum {
	DL_CPU = 1,
	DL_CUDA = 2,
	DL_CUDA_HOST = 3,
	DL_CUDA_MANAGED = 13,
};

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} dl_device;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} dl_dtype;

typedef struct {
	void *data;
	dl_device device;
	int32_t ndim;
	dl_dtype dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
	dl_tensor t;
	void *manager_ctx;
	void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct dl_managed_versioned {
	uint32_t major, minor;
	void *manager_ctx;
	void (*deleter)(struct dl_managed_versioned *self);
	uint64_t flags;
	dl_tensor t;
} dl_managed_versioned;

#define DL_FLAG_READ_ONLY (1ull << 0)
#define DL_FLAG_IS_COPIED (1ull << 1)

/*
 * Exports m (its t.shape, dtype and deleter filled in) as an unversioned "dltensor" capsule, which
 * every torch since 1.10 takes: data on the host (device < 0) or on CUDA device `device`, compact.
 * On failure m's deleter has run. Returns the capsule or NULL.
 */
FERRY_PY_HIDDEN PyObject *ferry__py_dl_export(dl_managed *m, void *data, int device, int ndim);

/* ------------------------------------------------------------------------------------ buffers */

enum { FERRY_PY_BUF_NONE, FERRY_PY_BUF_VIEW, FERRY_PY_BUF_DLPACK, FERRY_PY_BUF_DLPACK_V1, FERRY_PY_BUF_CAI };

/* A resolved buffer: address and length, and what keeps it alive until ferry__py_buf_release(). */
struct ferry__py_buf {
	void *ptr;
	size_t len;
	int cuda; /* 1: CUDA device or managed memory */
	int device;
	int how;
	Py_buffer view;
	void *managed; /* dl_managed or dl_managed_versioned */
	PyObject *owner;
};

/* Interned names and the module's constants the buffer path uses; once, at import. */
FERRY_PY_HIDDEN int ferry__py_buf_init(void);
/*
 * Resolves obj into an address and a length, zero-copy: the buffer protocol (NumPy, bytearray,
 * memoryview, mmap), DLPack (__dlpack__ or a bare "dltensor" capsule), __cuda_array_interface__.
 * writable: the buffer is a read's destination. stream: passed to __dlpack__ for CUDA producers
 * (NULL: -1, no synchronization). Returns 0 or -1 with an exception.
 */
FERRY_PY_HIDDEN int ferry__py_buf_get(PyObject *obj, struct ferry__py_buf *b, int writable, PyObject *stream);
/*
 * The same for memory the CPU itself reads or writes: host memory of at least need bytes
 * (ValueError naming what otherwise).
 */
FERRY_PY_HIDDEN int ferry__py_host_buf(PyObject *obj, struct ferry__py_buf *b, int writable, size_t need,
				       const char *what);
FERRY_PY_HIDDEN void ferry__py_buf_release(struct ferry__py_buf *b);

/* The head of each of the extension's static type objects. */
#define FERRY_PY_TYPE(name, type, flags, doc)                                                       \
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = (name), .tp_basicsize = sizeof(type), .tp_flags = (flags), \
	.tp_doc = (doc)

/* ------------------------------------------------------------------ the extension's other parts */

/* The ferry_ctx of a ferry.Context, or NULL with TypeError set (_ferry.c). */
FERRY_PY_HIDDEN ferry_ctx *ferry__py_ctx(PyObject *obj);
/* _ckpt.c: adds the safetensors and checkpoint types and functions to the module. */
FERRY_PY_HIDDEN int ferry__py_ckpt_init(PyObject *m);
/* _data.c: adds the dataset, loader and sample-order types and functions. */
FERRY_PY_HIDDEN int ferry__py_data_init(PyObject *m);
/* _pack.c: adds PackWriter, the dataset writer in phases (ferry.pack). */
FERRY_PY_HIDDEN int ferry__py_pack_init(PyObject *m);
/* _cz.c: adds CompressedFile, compress_file and cz_is_compressed (compressed files, issue 26). */
FERRY_PY_HIDDEN int ferry__py_cz_init(PyObject *m);

#endif
