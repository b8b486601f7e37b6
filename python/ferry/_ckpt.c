/*
 * _ferry, part two: safetensors files, loads, writers and checkpoint directories, over the public
 * C API only (ferry/safetensors.h, ferry/ckpt.h). The Python layer (ferry/safetensors.py,
 * ferry/checkpoint.py) allocates destinations with torch or NumPy and passes their addresses as
 * ints (tensor.data_ptr()); it keeps those objects alive across each call. Every call that reads,
 * writes or waits runs with the GIL released.
 *
 * One object is used by one thread at a time: a call made while another thread's call on the same
 * object runs without the GIL raises RuntimeError instead of racing in C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "ferry/ckpt.h"
#include "ferry/safetensors.h"
#include "_ferry.h"

#define raise_ferry ferry__py_raise

/* ------------------------------------------------------------------------------------ helpers */

static int get_shape(PyObject *o, uint64_t *dims, int *ndim)
{
	PyObject *seq = PySequence_Fast(o, "shape must be a sequence of ints");
	if (!seq)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	if (n > FERRY_ST_MAX_DIMS) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "%zd dimensions: at most %d", n, FERRY_ST_MAX_DIMS);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
		if (v == (unsigned long long)-1 && PyErr_Occurred()) {
			Py_DECREF(seq);
			return -1;
		}
		dims[i] = v;
	}
	Py_DECREF(seq);
	*ndim = (int)n;
	return 0;
}

static PyObject *shape_tuple(const uint64_t *dims, int nd)
{
	PyObject *t = PyTuple_New(nd < 0 ? 0 : nd);
	for (int k = 0; t && k < nd; k++) {
		PyObject *v = PyLong_FromUnsignedLongLong(dims[k]);
		if (!v) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, k, v);
	}
	return t;
}

static int get_dtype(const char *name)
{
	int dt = ferry_dtype_from_name(name);
	if (dt < 0)
		PyErr_Format(PyExc_ValueError, "unknown safetensors dtype '%s'", name);
	return dt;
}

/* Timeout in seconds (None: forever) as nanoseconds. */
static int get_timeout(PyObject *o, int64_t *ns)
{
	if (!o || o == Py_None) {
		*ns = -1;
		return 0;
	}
	double s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	*ns = s <= 0 ? 0 : s > 9e9 ? INT64_MAX : (int64_t)(s * 1e9);
	return 0;
}

static PyObject *metadata_dict(const ferry_st *st)
{
	PyObject *d = PyDict_New();
	for (size_t i = 0; d && i < ferry_st_metadata_count(st); i++) {
		PyObject *v = PyUnicode_FromString(ferry_st_metadata_value(st, i));
		if (!v || PyDict_SetItemString(d, ferry_st_metadata_key(st, i), v) < 0)
			Py_CLEAR(d);
		Py_XDECREF(v);
	}
	return d;
}

#define BUSY_CHECK(self, what)                                                                          \
	do {                                                                                            \
		if ((self)->busy) {                                                                     \
			PyErr_SetString(PyExc_RuntimeError, what " is in use by another thread");       \
			return NULL;                                                                    \
		}                                                                                       \
	} while (0)

/* ------------------------------------------------------------------ St: one file, read lazily */

typedef struct {
	PyObject_HEAD
	ferry_st *st;
	PyObject *ctx; /* keeps the ferry_ctx alive */
	int busy;
} StObject;

static PyTypeObject StType;

static PyObject *st_check(StObject *self)
{
	BUSY_CHECK(self, "this safetensors file");
	if (!self->st) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on a closed safetensors file");
		return NULL;
	}
	return Py_None;
}

static PyObject *mod_st_open(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *name, *bpath = NULL;
	ferry_st *st = NULL;
	if (!PyArg_ParseTuple(args, "OO:st_open", &ctxo, &name))
		return NULL;
	ferry_ctx *ctx = ferry__py_ctx(ctxo);
	if (!ctx || !PyUnicode_FSConverter(name, &bpath))
		return NULL;
	const char *path = PyBytes_AS_STRING(bpath);
	int r;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_open(ctx, path, &st);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (r < 0)
		return raise_ferry(r, name);
	StObject *self = PyObject_New(StObject, &StType);
	if (!self) {
		ferry_st_destroy(st);
		return NULL;
	}
	self->st = st;
	self->ctx = Py_NewRef(ctxo);
	self->busy = 0;
	return (PyObject *)self;
}

static void st_dealloc(StObject *self)
{
	ferry_st_destroy(self->st);
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

static PyObject *st_close(StObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this safetensors file");
	ferry_st_destroy(self->st);
	self->st = NULL;
	Py_RETURN_NONE;
}

/* (name, dtype, shape, offset, nbytes) of tensor i */
static PyObject *st_info_at(ferry_st *st, size_t i)
{
	uint64_t dims[FERRY_ST_MAX_DIMS];
	int nd = ferry_st_shape(st, i, dims, FERRY_ST_MAX_DIMS);
	PyObject *shape = shape_tuple(dims, nd);
	if (!shape)
		return NULL;
	return Py_BuildValue("(ssNKK)", ferry_st_name(st, i), ferry_dtype_name(ferry_st_dtype(st, i)), shape,
			     (unsigned long long)ferry_st_offset(st, i), (unsigned long long)ferry_st_nbytes(st, i));
}

static PyObject *st_tensors(StObject *self, PyObject *unused)
{
	if (!st_check(self))
		return NULL;
	size_t n = ferry_st_count(self->st);
	PyObject *l = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; l && i < n; i++) {
		PyObject *t = st_info_at(self->st, i);
		if (!t) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, t);
	}
	return l;
}

static PyObject *st_metadata(StObject *self, PyObject *unused)
{
	if (!st_check(self))
		return NULL;
	return metadata_dict(self->st);
}

static PyObject *st_find(StObject *self, PyObject *arg)
{
	if (!st_check(self))
		return NULL;
	const char *name = PyUnicode_AsUTF8(arg);
	if (!name)
		return NULL;
	int i = ferry_st_find(self->st, name);
	if (i < 0) {
		PyErr_SetObject(PyExc_KeyError, arg);
		return NULL;
	}
	return PyLong_FromLong(i);
}

/* read(i, ptr, len) -> bytes read */
static PyObject *st_read(StObject *self, PyObject *args)
{
	Py_ssize_t i;
	unsigned long long ptr, len;
	if (!st_check(self) || !PyArg_ParseTuple(args, "nKK:read", &i, &ptr, &len))
		return NULL;
	if (i < 0 || (size_t)i >= ferry_st_count(self->st)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	ssize_t r;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_read(self->st, (size_t)i, (void *)(uintptr_t)ptr, (size_t)len);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	if (r < 0)
		return raise_ferry((int)r, NULL);
	return PyLong_FromSsize_t(r);
}

/* read_slice(i, dim, start, stop, ptr, len) -> bytes read */
static PyObject *st_read_slice(StObject *self, PyObject *args)
{
	Py_ssize_t i;
	int dim;
	unsigned long long start, stop, ptr, len;
	if (!st_check(self) || !PyArg_ParseTuple(args, "niKKKK:read_slice", &i, &dim, &start, &stop, &ptr, &len))
		return NULL;
	if (i < 0 || (size_t)i >= ferry_st_count(self->st)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	ssize_t r;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_read_slice(self->st, (size_t)i, dim, start, stop, (void *)(uintptr_t)ptr, (size_t)len);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	if (r < 0)
		return raise_ferry((int)r, NULL);
	return PyLong_FromSsize_t(r);
}

/* verify(i) -> 1 match, 0 no checksum stored; raises ferry.Error (FERRY_EVERIFY) on mismatch */
static PyObject *st_verify(StObject *self, PyObject *arg)
{
	Py_ssize_t i = PyLong_AsSsize_t(arg);
	if (!st_check(self) || (i == -1 && PyErr_Occurred()))
		return NULL;
	if (i < 0 || (size_t)i >= ferry_st_count(self->st)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	int r;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_verify(self->st, (size_t)i);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	if (r < 0)
		return raise_ferry(r, NULL);
	return PyLong_FromLong(r);
}

static PyObject *st_path(StObject *self, void *closure)
{
	if (!st_check(self))
		return NULL;
	return PyUnicode_DecodeFSDefault(ferry_st_path(self->st));
}

static PyObject *st_data_start(StObject *self, void *closure)
{
	if (!st_check(self))
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_st_data_start(self->st));
}

static PyMethodDef st_methods[] = {
	{"tensors", (PyCFunction)st_tensors, METH_NOARGS, "[(name, dtype, shape, offset, nbytes)] in file order"},
	{"metadata", (PyCFunction)st_metadata, METH_NOARGS, "__metadata__ as a dict"},
	{"find", (PyCFunction)st_find, METH_O, "index of a tensor by name (KeyError)"},
	{"read", (PyCFunction)st_read, METH_VARARGS, "read(i, ptr, len) -> bytes read"},
	{"read_slice", (PyCFunction)st_read_slice, METH_VARARGS,
	 "read_slice(i, dim, start, stop, ptr, len) -> bytes read"},
	{"verify", (PyCFunction)st_verify, METH_O, "verify(i) -> 1 (matches) or 0 (no checksum stored)"},
	{"close", (PyCFunction)st_close, METH_NOARGS, NULL},
	{NULL},
};

static PyGetSetDef st_getset[] = {
	{"path", (getter)st_path, NULL, NULL, NULL},
	{"data_start", (getter)st_data_start, NULL, NULL, NULL},
	{NULL},
};

static PyTypeObject StType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.St",
	.tp_basicsize = sizeof(StObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A validated safetensors file (ferry_st): header, metadata, tensor reads.",
	.tp_dealloc = (destructor)st_dealloc,
	.tp_methods = st_methods,
	.tp_getset = st_getset,
};

/* ------------------------------------------------- Load: a file, a sharded set or a checkpoint */

typedef struct {
	PyObject_HEAD
	ferry_st_load *ld;
	PyObject *ctx;
	int busy;
} LoadObject;

static PyTypeObject LoadType;

static PyObject *mod_load_open(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *name, *bpath = NULL;
	ferry_st_load *ld = NULL;
	if (!PyArg_ParseTuple(args, "OO:load_open", &ctxo, &name))
		return NULL;
	ferry_ctx *ctx = ferry__py_ctx(ctxo);
	if (!ctx || !PyUnicode_FSConverter(name, &bpath))
		return NULL;
	const char *path = PyBytes_AS_STRING(bpath);
	int r;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_load_open(ctx, path, &ld);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (r < 0)
		return raise_ferry(r, name);
	LoadObject *self = PyObject_New(LoadObject, &LoadType);
	if (!self) {
		ferry_st_load_destroy(ld);
		return NULL;
	}
	self->ld = ld;
	self->ctx = Py_NewRef(ctxo);
	self->busy = 0;
	return (PyObject *)self;
}

static void load_dealloc(LoadObject *self)
{
	ferry_st_load_destroy(self->ld);
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

/* files() -> [(path, metadata dict, [(name, dtype, shape, offset, nbytes)])] */
static PyObject *load_files(LoadObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this load");
	size_t n = ferry_st_load_files(self->ld);
	PyObject *l = PyList_New((Py_ssize_t)n);
	for (size_t f = 0; l && f < n; f++) {
		ferry_st *st = ferry_st_load_file(self->ld, f);
		PyObject *tl = PyList_New((Py_ssize_t)ferry_st_count(st)), *item = NULL;
		for (size_t i = 0; tl && i < ferry_st_count(st); i++) {
			PyObject *t = st_info_at(st, i);
			if (!t) {
				Py_CLEAR(tl);
				break;
			}
			PyList_SET_ITEM(tl, (Py_ssize_t)i, t);
		}
		PyObject *md = tl ? metadata_dict(st) : NULL;
		if (md)
			item = Py_BuildValue("(NNN)", PyUnicode_DecodeFSDefault(ferry_st_path(st)), md, tl);
		else
			Py_XDECREF(tl);
		if (!item) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)f, item);
	}
	return l;
}

static PyObject *load_select(LoadObject *self, PyObject *args)
{
	const char *name;
	int dim = -1;
	unsigned long long start = 0, stop = 0;
	BUSY_CHECK(self, "this load");
	if (!PyArg_ParseTuple(args, "s|iKK:select", &name, &dim, &start, &stop))
		return NULL;
	int r = dim < 0 && PyTuple_GET_SIZE(args) == 1 ? ferry_st_load_select(self->ld, name)
						       : ferry_st_load_select_slice(self->ld, name, dim, start, stop);
	if (r == -ENOENT) {
		PyErr_Format(PyExc_KeyError, "%s", ferry_last_error());
		return NULL;
	}
	if (r < 0)
		return raise_ferry(r, NULL);
	Py_RETURN_NONE;
}

/* entries() -> [(name, dtype, shape after slicing, nbytes)] of what will load */
static PyObject *load_entries(LoadObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this load");
	size_t n = ferry_st_load_count(self->ld);
	PyObject *l = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; l && i < n; i++) {
		uint64_t dims[FERRY_ST_MAX_DIMS];
		int nd = ferry_st_load_shape(self->ld, i, dims, FERRY_ST_MAX_DIMS);
		PyObject *shape = shape_tuple(dims, nd), *t = NULL;
		if (shape)
			t = Py_BuildValue("(ssNK)", ferry_st_load_name(self->ld, i),
					  ferry_dtype_name(ferry_st_load_dtype(self->ld, i)), shape,
					  (unsigned long long)ferry_st_load_nbytes(self->ld, i));
		if (!t) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, (Py_ssize_t)i, t);
	}
	return l;
}

static PyObject *load_set_dest(LoadObject *self, PyObject *args)
{
	Py_ssize_t i;
	unsigned long long ptr, len;
	BUSY_CHECK(self, "this load");
	if (!PyArg_ParseTuple(args, "nKK:set_dest", &i, &ptr, &len))
		return NULL;
	int r = i < 0 ? -EINVAL : ferry_st_load_set_dest(self->ld, (size_t)i, (void *)(uintptr_t)ptr, (size_t)len);
	if (r < 0)
		return raise_ferry(r, NULL);
	Py_RETURN_NONE;
}

/* run(device, flags, staging_budget) -> (bytes, seconds) */
static PyObject *load_run(LoadObject *self, PyObject *args)
{
	int device, flags;
	unsigned long long budget;
	BUSY_CHECK(self, "this load");
	if (!PyArg_ParseTuple(args, "iiK:run", &device, &flags, &budget))
		return NULL;
	int r;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_st_load_run(self->ld, device, flags, budget);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	if (r < 0)
		return raise_ferry(r, NULL);
	return Py_BuildValue("(Kd)", (unsigned long long)ferry_st_load_bytes(self->ld),
			     (double)ferry_st_load_ns(self->ld) / 1e9);
}

static PyMethodDef load_methods[] = {
	{"files", (PyCFunction)load_files, METH_NOARGS,
	 "[(path, metadata, [(name, dtype, shape, offset, nbytes)])] per file"},
	{"select", (PyCFunction)load_select, METH_VARARGS,
	 "select(name) or select(name, dim, start, stop): load only these (KeyError if absent)"},
	{"entries", (PyCFunction)load_entries, METH_NOARGS, "[(name, dtype, shape, nbytes)] of what loads"},
	{"set_dest", (PyCFunction)load_set_dest, METH_VARARGS, "set_dest(i, ptr, len): entry i goes there"},
	{"run", (PyCFunction)load_run, METH_VARARGS, "run(device, flags, staging_budget) -> (bytes, seconds)"},
	{NULL},
};

static PyTypeObject LoadType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Load",
	.tp_basicsize = sizeof(LoadObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A load of safetensors tensors (ferry_st_load) into memory the caller gives.",
	.tp_dealloc = (destructor)load_dealloc,
	.tp_methods = load_methods,
};

/* ------------------------------------------- Writer (one file) and Ckpt (a checkpoint directory) */

/*
 * Both take tensors as (name, dtype, shape, ptr, nbytes), then save synchronously or
 * asynchronously; one type serves both, `ck` set for a checkpoint directory.
 */
typedef struct {
	PyObject_HEAD
	ferry_st_writer *w;
	ferry_ckpt *ck;
	PyObject *ctx;
	int busy;
} WriterObject;

static PyTypeObject WriterType;

static WriterObject *writer_new(PyObject *ctxo)
{
	WriterObject *self = PyObject_New(WriterObject, &WriterType);
	if (!self)
		return NULL;
	self->w = NULL;
	self->ck = NULL;
	self->ctx = Py_NewRef(ctxo);
	self->busy = 0;
	return self;
}

static PyObject *mod_writer_create(PyObject *mod, PyObject *ctxo)
{
	ferry_ctx *ctx = ferry__py_ctx(ctxo);
	if (!ctx)
		return NULL;
	WriterObject *self = writer_new(ctxo);
	if (!self)
		return NULL;
	int r = ferry_st_writer_create(ctx, &self->w);
	if (r < 0) {
		Py_DECREF(self);
		return raise_ferry(r, NULL);
	}
	return (PyObject *)self;
}

static PyObject *mod_ckpt_open(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *name, *bpath = NULL;
	int rank, world;
	if (!PyArg_ParseTuple(args, "OOii:ckpt_open", &ctxo, &name, &rank, &world))
		return NULL;
	ferry_ctx *ctx = ferry__py_ctx(ctxo);
	if (!ctx || !PyUnicode_FSConverter(name, &bpath))
		return NULL;
	WriterObject *self = writer_new(ctxo);
	if (!self) {
		Py_DECREF(bpath);
		return NULL;
	}
	int r = ferry_ckpt_open(ctx, PyBytes_AS_STRING(bpath), rank, world, &self->ck);
	Py_DECREF(bpath);
	if (r < 0) {
		Py_DECREF(self);
		return raise_ferry(r, name);
	}
	return (PyObject *)self;
}

static void writer_dealloc(WriterObject *self)
{
	/* Both wait for a save in flight: its pinned snapshot and thread belong to the handle. */
	Py_BEGIN_ALLOW_THREADS
	ferry_st_writer_destroy(self->w);
	ferry_ckpt_destroy(self->ck);
	Py_END_ALLOW_THREADS
	Py_XDECREF(self->ctx);
	PyObject_Free(self);
}

static PyObject *writer_add(WriterObject *self, PyObject *args)
{
	const char *name, *dtname;
	PyObject *shapeo;
	unsigned long long ptr, nbytes;
	uint64_t dims[FERRY_ST_MAX_DIMS];
	int ndim, dt;
	BUSY_CHECK(self, "this writer");
	if (!PyArg_ParseTuple(args, "ssOKK:add", &name, &dtname, &shapeo, &ptr, &nbytes) ||
	    get_shape(shapeo, dims, &ndim) < 0 || (dt = get_dtype(dtname)) < 0)
		return NULL;
	const void *data = (const void *)(uintptr_t)ptr;
	int r = self->ck ? ferry_ckpt_add(self->ck, name, dt, ndim, dims, data, (size_t)nbytes)
			 : ferry_st_writer_add(self->w, name, dt, ndim, dims, data, (size_t)nbytes);
	if (r < 0)
		return raise_ferry(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *writer_metadata(WriterObject *self, PyObject *args)
{
	const char *k, *v;
	BUSY_CHECK(self, "this writer");
	if (!PyArg_ParseTuple(args, "ss:metadata", &k, &v))
		return NULL;
	int r = self->ck ? ferry_ckpt_metadata(self->ck, k, v) : ferry_st_writer_metadata(self->w, k, v);
	if (r < 0)
		return raise_ferry(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *writer_set(WriterObject *self, PyObject *args)
{
	const char *k, *v;
	BUSY_CHECK(self, "this checkpoint");
	if (!PyArg_ParseTuple(args, "ss:set", &k, &v))
		return NULL;
	if (!self->ck) {
		PyErr_SetString(PyExc_TypeError, "set() is for checkpoint directories");
		return NULL;
	}
	int r = ferry_ckpt_set(self->ck, k, v);
	if (r < 0)
		return raise_ferry(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *writer_reset(WriterObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this writer");
	if (self->w) {
		int r = ferry_st_writer_reset(self->w);
		if (r < 0)
			return raise_ferry(r, NULL);
	}
	Py_RETURN_NONE;
}

/*
 * save(target, flags, async) -> int. target: the file's path (writer; flags FERRY_SAVE_*) or the
 * step (checkpoint). The file's size (writer, synchronous) or 0.
 */
static PyObject *writer_save(WriterObject *self, PyObject *args)
{
	PyObject *target, *bpath = NULL;
	int flags = 0, async = 0;
	long long step = 0;
	int64_t r;
	BUSY_CHECK(self, "this writer");
	if (!PyArg_ParseTuple(args, "O|ip:save", &target, &flags, &async))
		return NULL;
	if (self->ck) {
		step = PyLong_AsLongLong(target);
		if (step == -1 && PyErr_Occurred())
			return NULL;
	} else if (!PyUnicode_FSConverter(target, &bpath)) {
		return NULL;
	}
	const char *path = bpath ? PyBytes_AS_STRING(bpath) : NULL;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	if (self->ck)
		r = async ? ferry_ckpt_save_async(self->ck, step) : ferry_ckpt_save(self->ck, step);
	else
		r = async ? ferry_st_writer_save_async(self->w, path, flags) : ferry_st_writer_save(self->w, path, flags);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	Py_XDECREF(bpath);
	if (r < 0)
		return raise_ferry((int)r, self->ck ? NULL : target);
	return PyLong_FromLongLong(r);
}

static PyObject *writer_done(WriterObject *self, PyObject *unused)
{
	return PyBool_FromLong(self->ck ? ferry_ckpt_done(self->ck) : ferry_st_writer_done(self->w));
}

/* wait(timeout=None) -> (finished, result): the save in flight's result; raises its error. */
static PyObject *writer_wait(WriterObject *self, PyObject *args)
{
	PyObject *to = Py_None;
	int64_t ns, r;
	BUSY_CHECK(self, "this writer");
	if (!PyArg_ParseTuple(args, "|O:wait", &to) || get_timeout(to, &ns) < 0)
		return NULL;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = self->ck ? ferry_ckpt_wait(self->ck, ns) : ferry_st_writer_wait(self->w, ns);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	/* -ETIMEDOUT is this wait's timeout only while the save still runs (rank 0's commit can fail so too). */
	if (r == -ETIMEDOUT && !(self->ck ? ferry_ckpt_done(self->ck) : ferry_st_writer_done(self->w)))
		return Py_BuildValue("(OL)", Py_False, 0LL);
	if (r < 0)
		return raise_ferry((int)r, NULL);
	return Py_BuildValue("(OL)", Py_True, (long long)r);
}

/* stats() -> str: the last save's phases as JSON (ferry_st_writer_stats). */
static PyObject *writer_stats(WriterObject *self, PyObject *unused)
{
	char buf[4096];
	int n = self->ck ? ferry_ckpt_stats(self->ck, buf, sizeof(buf)) : ferry_st_writer_stats(self->w, buf, sizeof(buf));
	if (n < 0)
		return raise_ferry(n, NULL);
	return PyUnicode_FromString(buf);
}

/* reserve(bytes, device) -> int: pins the snapshot's memory ahead (ferry_st_writer_reserve). */
static PyObject *writer_reserve(WriterObject *self, PyObject *args)
{
	unsigned long long bytes;
	int device;
	int64_t r;
	BUSY_CHECK(self, "this writer");
	if (!PyArg_ParseTuple(args, "Ki:reserve", &bytes, &device))
		return NULL;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	r = self->ck ? ferry_ckpt_reserve(self->ck, bytes, device) : ferry_st_writer_reserve(self->w, bytes, device);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	if (r < 0)
		return raise_ferry((int)r, NULL);
	return PyLong_FromLongLong(r);
}

static PyMethodDef writer_methods[] = {
	{"stats", (PyCFunction)writer_stats, METH_NOARGS, "stats() -> JSON text: the last save's phases"},
	{"reserve", (PyCFunction)writer_reserve, METH_VARARGS, "reserve(bytes, device) -> pinned bytes held"},
	{"add", (PyCFunction)writer_add, METH_VARARGS, "add(name, dtype, shape, ptr, nbytes)"},
	{"metadata", (PyCFunction)writer_metadata, METH_VARARGS, "metadata(key, value)"},
	{"set", (PyCFunction)writer_set, METH_VARARGS, "set(key, value): a checkpoint option"},
	{"reset", (PyCFunction)writer_reset, METH_NOARGS, "forget the tensors and metadata added"},
	{"save", (PyCFunction)writer_save, METH_VARARGS, "save(path_or_step, flags=0, async=False) -> int"},
	{"done", (PyCFunction)writer_done, METH_NOARGS, "True when no save is in flight"},
	{"wait", (PyCFunction)writer_wait, METH_VARARGS, "wait(timeout=None) -> (finished, result)"},
	{NULL},
};

static PyTypeObject WriterType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Writer",
	.tp_basicsize = sizeof(WriterObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A safetensors writer (ferry_st_writer) or a checkpoint directory (ferry_ckpt).",
	.tp_dealloc = (destructor)writer_dealloc,
	.tp_methods = writer_methods,
};

/* ------------------------------------------------------------------------------ module functions */

static PyObject *path_arg(PyObject *arg, PyObject **bpath)
{
	return PyUnicode_FSConverter(arg, bpath) ? *bpath : NULL;
}

/* ckpt_latest(dir) -> step or None (no `latest`) */
static PyObject *mod_ckpt_latest(PyObject *mod, PyObject *arg)
{
	PyObject *bpath = NULL;
	if (!path_arg(arg, &bpath))
		return NULL;
	int64_t r;
	const char *dir = PyBytes_AS_STRING(bpath);
	Py_BEGIN_ALLOW_THREADS
	r = ferry_ckpt_latest(dir);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (r == -ENOENT)
		Py_RETURN_NONE;
	if (r < 0)
		return raise_ferry((int)r, arg);
	return PyLong_FromLongLong(r);
}

/* ckpt_shard_path(dir, step, rank=-1, world=0) -> the step's directory (rank < 0) or a shard's path */
static PyObject *mod_ckpt_path(PyObject *mod, PyObject *args)
{
	PyObject *diro, *bpath = NULL;
	long long step;
	int rank = -1, world = 0;
	char buf[4096];
	if (!PyArg_ParseTuple(args, "OL|ii:ckpt_path", &diro, &step, &rank, &world) || !path_arg(diro, &bpath))
		return NULL;
	const char *dir = PyBytes_AS_STRING(bpath);
	int r = rank < 0 ? ferry_ckpt_step_path(dir, step, buf, sizeof(buf))
			 : ferry_ckpt_shard_path(dir, step, rank, world, buf, sizeof(buf));
	Py_DECREF(bpath);
	if (r < 0)
		return raise_ferry(r, diro);
	return PyUnicode_DecodeFSDefault(buf);
}

/* ckpt_verify(ctx, dir, step, require_sums) */
static PyObject *mod_ckpt_verify(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *diro, *bpath = NULL;
	long long step;
	int req = 0;
	if (!PyArg_ParseTuple(args, "OOL|p:ckpt_verify", &ctxo, &diro, &step, &req))
		return NULL;
	ferry_ctx *ctx = ferry__py_ctx(ctxo);
	if (!ctx || !path_arg(diro, &bpath))
		return NULL;
	const char *dir = PyBytes_AS_STRING(bpath);
	int r;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_ckpt_verify(ctx, dir, step, req);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (r < 0)
		return raise_ferry(r, diro);
	Py_RETURN_NONE;
}

/* ckpt_prune(dir, keep) -> steps removed */
static PyObject *mod_ckpt_prune(PyObject *mod, PyObject *args)
{
	PyObject *diro, *bpath = NULL;
	int keep;
	if (!PyArg_ParseTuple(args, "Oi:ckpt_prune", &diro, &keep) || !path_arg(diro, &bpath))
		return NULL;
	const char *dir = PyBytes_AS_STRING(bpath);
	int r;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_ckpt_prune(dir, keep);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (r < 0)
		return raise_ferry(r, diro);
	return PyLong_FromLong(r);
}

static PyObject *mod_dtype_bits(PyObject *mod, PyObject *arg)
{
	const char *name = PyUnicode_AsUTF8(arg);
	int dt;
	if (!name || (dt = get_dtype(name)) < 0)
		return NULL;
	return PyLong_FromLong(ferry_dtype_bits(dt));
}

/* xxh3 is part of every build now; kept so that have_checksums() keeps its meaning. */
static PyObject *mod_have_xxh3(PyObject *mod, PyObject *unused)
{
	Py_RETURN_TRUE;
}

static PyMethodDef ckpt_functions[] = {
	{"st_open", mod_st_open, METH_VARARGS, "st_open(ctx, path) -> St"},
	{"load_open", mod_load_open, METH_VARARGS, "load_open(ctx, path) -> Load (file, index, manifest or directory)"},
	{"writer_create", mod_writer_create, METH_O, "writer_create(ctx) -> Writer"},
	{"ckpt_open", mod_ckpt_open, METH_VARARGS, "ckpt_open(ctx, dir, rank, world) -> Writer"},
	{"ckpt_latest", mod_ckpt_latest, METH_O, "ckpt_latest(dir) -> step or None"},
	{"ckpt_path", mod_ckpt_path, METH_VARARGS, "ckpt_path(dir, step, rank=-1, world=0) -> str"},
	{"ckpt_verify", mod_ckpt_verify, METH_VARARGS, "ckpt_verify(ctx, dir, step, require_sums=False)"},
	{"ckpt_prune", mod_ckpt_prune, METH_VARARGS, "ckpt_prune(dir, keep) -> steps removed"},
	{"dtype_bits", mod_dtype_bits, METH_O, "dtype_bits(name) -> bits per element"},
	{"have_xxh3", mod_have_xxh3, METH_NOARGS, "True (checksums are in every build)"},
	{NULL},
};

int ferry__py_ckpt_init(PyObject *m)
{
	if (PyType_Ready(&StType) < 0 || PyType_Ready(&LoadType) < 0 || PyType_Ready(&WriterType) < 0 ||
	    PyModule_AddFunctions(m, ckpt_functions) < 0)
		return -1;
	PyObject *names = PyTuple_New(FERRY_DT__COUNT);
	for (int i = 0; names && i < FERRY_DT__COUNT; i++) {
		PyObject *s = PyUnicode_FromString(ferry_dtype_name(i));
		if (!s) {
			Py_CLEAR(names);
			break;
		}
		PyTuple_SET_ITEM(names, i, s);
	}
	if (!names || PyModule_AddObjectRef(m, "DTYPES", names) < 0) {
		Py_XDECREF(names);
		return -1;
	}
	Py_DECREF(names);
	static const struct {
		const char *name;
		long v;
	} ints[] = {
		{"SAVE_CHECKSUM", FERRY_SAVE_CHECKSUM}, {"SAVE_NOSYNC", FERRY_SAVE_NOSYNC},
		{"SAVE_EXCL", FERRY_SAVE_EXCL},         {"LOAD_PER_TENSOR", FERRY_LOAD_PER_TENSOR},
		{"LOAD_VERIFY", FERRY_LOAD_VERIFY},
	};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		if (PyModule_AddIntConstant(m, ints[i].name, ints[i].v) < 0)
			return -1;
	return 0;
}
