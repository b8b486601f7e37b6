/*
 * _ferry's part for `python -m ferry.pack` (issue 21): the dataset writer of include/ferry/data.h
 * taken in its three phases, so that a caller holding millions of documents in a few large arrays
 * never makes a Python object per document: add() declares a whole array of sample lengths,
 * layout() fixes the shards, put() writes consecutive samples out of one contiguous buffer with
 * the GIL released, finish() publishes the index (data.h describes the durable order).
 * (_data.c's write_dataset takes one buffer per sample, all at once: fine for a list of samples,
 * not for a corpus.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "ferry/data.h"
#include "ferry/ferry.h"
#include "_ferry.h"

typedef struct {
	PyObject_HEAD
	ferry_ctx *ctx;
	ferry_dataset_writer *w;
	PyObject *path;
	uint64_t n;
	Py_ssize_t busy;
} PackWriterObject;

static int pw_check(PackWriterObject *self)
{
	return ferry__py_closed(self->w, "the writer is closed") ||
	       ferry__py_busy(self->busy, "the writer is in use by another thread");
}

static void pw_close_handles(PackWriterObject *self)
{
	ferry_dataset_writer_destroy(self->w); /* unfinished: its data files are removed */
	ferry_ctx_destroy(self->ctx);
	self->w = NULL;
	self->ctx = NULL;
}

struct pw_args {
	PackWriterObject *self;
	int kind, elem;
	uint64_t shard_size;
};

static int64_t pw_create(ferry_ctx *ctx, const char *path, void *arg)
{
	struct pw_args *a = arg;
	return ferry_dataset_writer_create(a->self->ctx, path, a->kind, a->elem, a->shard_size, &a->self->w);
}

static PyObject *pw_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"path", "kind", "elem", "shard_size", NULL};
	PyObject *path;
	struct pw_args a = {0};
	unsigned long long shard_size = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oii|K:PackWriter", kwlist, &path, &a.kind, &a.elem,
					 &shard_size))
		return NULL;
	PackWriterObject *self = (PackWriterObject *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	a.self = self;
	a.shard_size = shard_size;
	int err = ferry_ctx_create(&self->ctx);
	if (ferry__py_failed(err, path) || ferry__py_path_call(NULL, path, pw_create, &a) < 0) {
		Py_DECREF(self);
		return NULL;
	}
	Py_INCREF(path);
	self->path = path;
	return (PyObject *)self;
}

static void pw_dealloc(PackWriterObject *self)
{
	Py_BEGIN_ALLOW_THREADS
	pw_close_handles(self);
	Py_END_ALLOW_THREADS
	Py_XDECREF(self->path);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A host buffer of uint64 values (NumPy uint64/int64 arrays qualify): its address and count. */
static int u64_buf(PyObject *obj, struct ferry__py_buf *b, const char *what, Py_ssize_t *count)
{
	if (ferry__py_host_buf(obj, b, 0, 0, what) < 0)
		return -1;
	if (b->len % 8) {
		ferry__py_buf_release(b);
		PyErr_Format(PyExc_ValueError, "%s: %zu bytes is not a whole number of uint64 lengths", what,
			     b->len);
		return -1;
	}
	*count = (Py_ssize_t)(b->len / 8);
	return 0;
}

/* add(lengths): declares len(lengths) samples (bytes each, uint64), each one document. */
static PyObject *pw_add(PackWriterObject *self, PyObject *arg)
{
	struct ferry__py_buf b;
	Py_ssize_t n;
	int64_t r = 0;

	if (pw_check(self) || u64_buf(arg, &b, "add", &n) < 0)
		return NULL;
	const uint64_t *len = b.ptr;
	for (Py_ssize_t i = 0; i < n && r >= 0; i++) {
		uint64_t v;
		memcpy(&v, len + i, 8); /* the buffer need not be aligned */
		r = ferry_dataset_writer_add(self->w, v, NULL, 0, 1);
	}
	ferry__py_buf_release(&b);
	if (r < 0)
		return ferry__py_raise((int)r, self->path);
	self->n += (uint64_t)n;
	return PyLong_FromUnsignedLongLong(self->n);
}

/* layout() -> shards */
static PyObject *pw_layout(PackWriterObject *self, PyObject *unused)
{
	int r;

	if (pw_check(self))
		return NULL;
	FERRY_PY_NOGIL(&self->busy, r, ferry_dataset_writer_layout(self->w));
	if (r < 0)
		return ferry__py_raise(r, self->path);
	return PyLong_FromLong(r);
}

static int put_run(ferry_dataset_writer *w, uint64_t first, const uint64_t *lens, Py_ssize_t n, const uint8_t *data)
{
	for (Py_ssize_t i = 0; i < n; i++) {
		uint64_t l;
		memcpy(&l, lens + i, 8);
		int err = ferry_dataset_writer_put(w, first + (uint64_t)i, data, (size_t)l);
		if (err)
			return err;
		data += l;
	}
	return 0;
}

/*
 * put(first, lengths, data): writes samples first, first + 1, ... whose lengths (bytes, uint64)
 * are `lengths`, one after another out of `data`, which must hold exactly their sum.
 */
static PyObject *pw_put(PackWriterObject *self, PyObject *args)
{
	unsigned long long first;
	PyObject *lo, *dobj;
	struct ferry__py_buf lb, db;
	Py_ssize_t n;
	int err;

	if (!PyArg_ParseTuple(args, "KOO:put", &first, &lo, &dobj) || pw_check(self))
		return NULL;
	if (u64_buf(lo, &lb, "put: lengths", &n) < 0)
		return NULL;
	if (ferry__py_host_buf(dobj, &db, 0, 0, "put: data") < 0) {
		ferry__py_buf_release(&lb);
		return NULL;
	}
	uint64_t sum = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		uint64_t l;
		memcpy(&l, (const uint64_t *)lb.ptr + i, 8);
		sum += l;
	}
	if (sum != db.len || first > self->n || (uint64_t)n > self->n - first) {
		PyErr_Format(PyExc_ValueError,
			     "put: samples %llu..%llu of %llu, lengths summing to %llu bytes, data of %zu bytes",
			     first, first + (unsigned long long)n, (unsigned long long)self->n,
			     (unsigned long long)sum, db.len);
		ferry__py_buf_release(&lb);
		ferry__py_buf_release(&db);
		return NULL;
	}
	FERRY_PY_NOGIL(&self->busy, err, put_run(self->w, first, lb.ptr, n, db.ptr));
	ferry__py_buf_release(&lb);
	ferry__py_buf_release(&db);
	if (err)
		return ferry__py_raise(err, self->path);
	Py_RETURN_NONE;
}

/* finish(): syncs the data files and publishes the index; the writer is closed afterwards. */
static PyObject *pw_finish(PackWriterObject *self, PyObject *unused)
{
	int err;

	if (pw_check(self))
		return NULL;
	FERRY_PY_NOGIL(&self->busy, err, ferry_dataset_writer_finish(self->w));
	if (err)
		return ferry__py_raise(err, self->path);
	Py_BEGIN_ALLOW_THREADS
	pw_close_handles(self);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

/* abort(): an unfinished writer's data files are removed and no index is written. */
static PyObject *pw_abort(PackWriterObject *self, PyObject *unused)
{
	if (ferry__py_busy(self->busy, "the writer is in use by another thread"))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	pw_close_handles(self);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyMethodDef pw_methods[] = {
	{"add", (PyCFunction)pw_add, METH_O, "add(lengths: uint64 buffer) -> samples declared so far"},
	{"layout", (PyCFunction)pw_layout, METH_NOARGS, "layout() -> shards: after the last add"},
	{"put", (PyCFunction)pw_put, METH_VARARGS,
	 "put(first, lengths: uint64 buffer, data: buffer): consecutive samples out of one buffer"},
	{"finish", (PyCFunction)pw_finish, METH_NOARGS, "finish(): sync and publish the index"},
	{"abort", (PyCFunction)pw_abort, METH_NOARGS, "abort(): remove the data files, no index"},
	{NULL},
};

static PyTypeObject PackWriterType = {
	FERRY_PY_TYPE("ferry._ferry.PackWriter", PackWriterObject, Py_TPFLAGS_DEFAULT,
		      "PackWriter(path, kind, elem, shard_size=0): the dataset writer in phases "
		      "(used by ferry.pack)."),
	.tp_new = pw_new,
	.tp_dealloc = (destructor)pw_dealloc,
	.tp_methods = pw_methods,
};

int ferry__py_pack_init(PyObject *m)
{
	if (PyType_Ready(&PackWriterType) < 0 ||
	    PyModule_AddObjectRef(m, "PackWriter", (PyObject *)&PackWriterType) < 0)
		return -1;
	return 0;
}
