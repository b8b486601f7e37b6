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

static int get_dtype(const char *name)
{
	enum ferry_dtype dt;
	if (ferry_dtype_from_name(name, &dt) < 0 || dt == FERRY_DT_BYTES) {
		PyErr_Format(PyExc_ValueError, "unknown safetensors dtype '%s'", name);
		return -1;
	}
	return (int)dt;
}

static PyObject *metadata_at(Py_ssize_t i, const void *st, const char **key)
{
	*key = ferry_st_metadata_key(st, (size_t)i);
	return PyUnicode_FromString(ferry_st_metadata_value(st, (size_t)i));
}

static PyObject *metadata_dict(const ferry_st *st)
{
	return ferry__py_dict((Py_ssize_t)ferry_st_metadata_count(st), metadata_at, st);
}

/* The busy check: one object is used by one thread at a time. */
#define BUSY_CHECK(self, what)                                                                      \
	do {                                                                                        \
		if (ferry__py_busy((self)->busy, what " is in use by another thread") < 0)          \
			return NULL;                                                                \
	} while (0)

/*
 * A St or a Load: a C handle opened on a path, and the context it was opened in, kept alive.
 * busy counts the calls running without the GIL.
 */
typedef struct {
	PyObject_HEAD
	union {
		ferry_st *st;
		ferry_st_load *ld;
	};
	PyObject *ctx;
	Py_ssize_t busy;
} HandleObject;

typedef HandleObject StObject;
typedef HandleObject LoadObject;

static PyTypeObject StType, LoadType;

static int64_t st_open(ferry_ctx *ctx, const char *path, void *out)
{
	return ferry_st_open(ctx, path, out);
}

static int64_t load_open(ferry_ctx *ctx, const char *path, void *out)
{
	return ferry_st_load_open(ctx, path, out);
}

/* open(ctx, path, &handle) with the GIL released, in a new St or Load. */
static PyObject *handle_open(PyTypeObject *type, PyObject *args, const char *fmt)
{
	PyObject *ctxo, *name;
	void *h = NULL;

	if (!PyArg_ParseTuple(args, fmt, &ctxo, &name) ||
	    ferry__py_path_call(ctxo, name, type == &StType ? st_open : load_open, &h) < 0)
		return NULL;
	HandleObject *self = PyObject_New(HandleObject, type);
	if (!self) {
		if (type == &StType)
			ferry_st_destroy(h);
		else
			ferry_st_load_destroy(h);
		return NULL;
	}
	self->st = NULL;
	if (type == &StType)
		self->st = h;
	else
		self->ld = h;
	self->ctx = Py_NewRef(ctxo);
	self->busy = 0;
	return (PyObject *)self;
}

/* ------------------------------------------------------------------ St: one file, read lazily */

static PyObject *st_check(StObject *self)
{
	if (ferry__py_busy(self->busy, "this safetensors file is in use by another thread") < 0 ||
	    ferry__py_closed(self->st, "I/O operation on a closed safetensors file") < 0)
		return NULL;
	return Py_None;
}

/* Tensor i of an open file, or NULL with IndexError. */
static PyObject *st_index(StObject *self, Py_ssize_t i)
{
	if (i < 0 || (size_t)i >= ferry_st_count(self->st)) {
		PyErr_SetString(PyExc_IndexError, "tensor index out of range");
		return NULL;
	}
	return Py_None;
}

static PyObject *mod_st_open(PyObject *mod, PyObject *args)
{
	return handle_open(&StType, args, "OO:st_open");
}

static void handle_dealloc(HandleObject *self)
{
	if (Py_TYPE(self) == &StType)
		ferry_st_destroy(self->st);
	else
		ferry_st_load_destroy(self->ld);
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
	PyObject *shape = ferry__py_u64_tuple(dims, nd);
	if (!shape)
		return NULL;
	return Py_BuildValue("(ssNKK)", ferry_st_name(st, i), ferry_dtype_name(ferry_st_dtype(st, i)), shape,
			     (unsigned long long)ferry_st_offset(st, i), (unsigned long long)ferry_st_nbytes(st, i));
}

static PyObject *tensor_at(Py_ssize_t i, const void *st)
{
	return st_info_at((ferry_st *)st, (size_t)i);
}

/* [(name, dtype, shape, offset, nbytes)] of a file, in file order */
static PyObject *tensor_list(ferry_st *st)
{
	return ferry__py_list((Py_ssize_t)ferry_st_count(st), tensor_at, st);
}

static PyObject *st_tensors(StObject *self, PyObject *unused)
{
	if (!st_check(self))
		return NULL;
	return tensor_list(self->st);
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
	if (!st_check(self) || !PyArg_ParseTuple(args, "nKK:read", &i, &ptr, &len) || !st_index(self, i))
		return NULL;
	ssize_t r;
	FERRY_PY_NOGIL(&self->busy, r, ferry_st_read(self->st, (size_t)i, (void *)(uintptr_t)ptr, (size_t)len));
	if (ferry__py_failed(r, NULL))
		return NULL;
	return PyLong_FromSsize_t(r);
}

/* read_slice(i, dim, start, stop, ptr, len) -> bytes read */
static PyObject *st_read_slice(StObject *self, PyObject *args)
{
	Py_ssize_t i;
	int dim;
	unsigned long long start, stop, ptr, len;
	if (!st_check(self) ||
	    !PyArg_ParseTuple(args, "niKKKK:read_slice", &i, &dim, &start, &stop, &ptr, &len) ||
	    !st_index(self, i))
		return NULL;
	ssize_t r;
	FERRY_PY_NOGIL(&self->busy, r, ferry_st_read_slice(self->st, (size_t)i, dim, start, stop,
							  (void *)(uintptr_t)ptr, (size_t)len));
	if (ferry__py_failed(r, NULL))
		return NULL;
	return PyLong_FromSsize_t(r);
}

/* verify(i) -> 1 match, 0 no checksum stored; raises ferry.Error (FERRY_EVERIFY) on mismatch */
static PyObject *st_verify(StObject *self, PyObject *arg)
{
	Py_ssize_t i = PyLong_AsSsize_t(arg);
	if ((i == -1 && PyErr_Occurred()) || !st_check(self) || !st_index(self, i))
		return NULL;
	int r;
	FERRY_PY_NOGIL(&self->busy, r, ferry_st_verify(self->st, (size_t)i));
	if (ferry__py_failed(r, NULL))
		return NULL;
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
	FERRY_PY_TYPE("ferry._ferry.St", StObject, Py_TPFLAGS_DEFAULT,
		      "A validated safetensors file (ferry_st): header, metadata, tensor reads."),
	.tp_dealloc = (destructor)handle_dealloc,
	.tp_methods = st_methods,
	.tp_getset = st_getset,
};

/* ------------------------------------------------- Load: a file, a sharded set or a checkpoint */

static PyObject *mod_load_open(PyObject *mod, PyObject *args)
{
	return handle_open(&LoadType, args, "OO:load_open");
}

static PyObject *load_file_at(Py_ssize_t f, const void *ld)
{
	ferry_st *st = ferry_st_load_file((ferry_st_load *)ld, (size_t)f);
	PyObject *tl = tensor_list(st);
	PyObject *md = tl ? metadata_dict(st) : NULL;
	if (!md) {
		Py_XDECREF(tl);
		return NULL;
	}
	return Py_BuildValue("(NNN)", PyUnicode_DecodeFSDefault(ferry_st_path(st)), md, tl);
}

/* files() -> [(path, metadata dict, [(name, dtype, shape, offset, nbytes)])] */
static PyObject *load_files(LoadObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this load");
	return ferry__py_list((Py_ssize_t)ferry_st_load_files(self->ld), load_file_at, self->ld);
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
		return ferry__py_raise(r, NULL);
	Py_RETURN_NONE;
}

static PyObject *load_entry_at(Py_ssize_t i, const void *arg)
{
	ferry_st_load *ld = (ferry_st_load *)arg;
	uint64_t dims[FERRY_ST_MAX_DIMS];
	int nd = ferry_st_load_shape(ld, (size_t)i, dims, FERRY_ST_MAX_DIMS);
	PyObject *shape = ferry__py_u64_tuple(dims, nd);
	if (!shape)
		return NULL;
	return Py_BuildValue("(ssNK)", ferry_st_load_name(ld, (size_t)i),
			     ferry_dtype_name(ferry_st_load_dtype(ld, (size_t)i)), shape,
			     (unsigned long long)ferry_st_load_nbytes(ld, (size_t)i));
}

/* entries() -> [(name, dtype, shape after slicing, nbytes)] of what will load */
static PyObject *load_entries(LoadObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this load");
	return ferry__py_list((Py_ssize_t)ferry_st_load_count(self->ld), load_entry_at, self->ld);
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
		return ferry__py_raise(r, NULL);
	Py_RETURN_NONE;
}

/* place(i, flags) -> (placed, file, offset, region_len): ferry_st_load_place */
static PyObject *load_place(LoadObject *self, PyObject *args)
{
	Py_ssize_t i;
	int flags;
	size_t file;
	uint64_t off, len;
	BUSY_CHECK(self, "this load");
	if (!PyArg_ParseTuple(args, "ni:place", &i, &flags))
		return NULL;
	int r = i < 0 ? -EINVAL : ferry_st_load_place(self->ld, (size_t)i, flags, &file, &off, &len);
	if (ferry__py_failed(r, NULL))
		return NULL;
	return Py_BuildValue("(OnKK)", r ? Py_True : Py_False, (Py_ssize_t)file, (unsigned long long)off,
			     (unsigned long long)len);
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
	FERRY_PY_NOGIL(&self->busy, r, ferry_st_load_run(self->ld, device, flags, budget));
	if (ferry__py_failed(r, NULL))
		return NULL;
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
	{"place", (PyCFunction)load_place, METH_VARARGS,
	 "place(i, flags) -> (placed, file, offset, region_len): where run() would put entry i"},
	{"run", (PyCFunction)load_run, METH_VARARGS, "run(device, flags, staging_budget) -> (bytes, seconds)"},
	{NULL},
};

static PyTypeObject LoadType = {
	FERRY_PY_TYPE("ferry._ferry.Load", LoadObject, Py_TPFLAGS_DEFAULT,
		      "A load of safetensors tensors (ferry_st_load) into memory the caller gives."),
	.tp_dealloc = (destructor)handle_dealloc,
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
	Py_ssize_t busy;
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
	if (ferry__py_failed(r, NULL)) {
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

struct ckpt_open_args {
	int rank, world;
	ferry_ckpt *ck;
};

static int64_t ckpt_open(ferry_ctx *ctx, const char *dir, void *arg)
{
	struct ckpt_open_args *a = arg;
	return ferry_ckpt_open(ctx, dir, a->rank, a->world, &a->ck);
}

static PyObject *mod_ckpt_open(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *name;
	struct ckpt_open_args a = {0, 0, NULL};
	if (!PyArg_ParseTuple(args, "OOii:ckpt_open", &ctxo, &name, &a.rank, &a.world) ||
	    ferry__py_path_call(ctxo, name, ckpt_open, &a) < 0)
		return NULL;
	WriterObject *self = writer_new(ctxo);
	if (!self) {
		ferry_ckpt_destroy(a.ck);
		return NULL;
	}
	self->ck = a.ck;
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
		return ferry__py_raise(r, NULL);
	Py_RETURN_NONE;
}

/* metadata(key, value) on either handle; set(key, value), a checkpoint's option. */
static PyObject *writer_pair(WriterObject *self, PyObject *args, int option)
{
	const char *k, *v;
	int r;
	if (ferry__py_busy(self->busy, "this %s is in use by another thread",
			   option ? "checkpoint" : "writer") < 0 ||
	    !PyArg_ParseTuple(args, option ? "ss:set" : "ss:metadata", &k, &v))
		return NULL;
	if (option && !self->ck) {
		PyErr_SetString(PyExc_TypeError, "set() is for checkpoint directories");
		return NULL;
	}
	if (option)
		r = ferry_ckpt_set(self->ck, k, v);
	else
		r = self->ck ? ferry_ckpt_metadata(self->ck, k, v) : ferry_st_writer_metadata(self->w, k, v);
	if (ferry__py_failed(r, NULL))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *writer_metadata(WriterObject *self, PyObject *args)
{
	return writer_pair(self, args, 0);
}

static PyObject *writer_set(WriterObject *self, PyObject *args)
{
	return writer_pair(self, args, 1);
}

static PyObject *writer_reset(WriterObject *self, PyObject *unused)
{
	BUSY_CHECK(self, "this writer");
	if (self->w) {
		int r = ferry_st_writer_reset(self->w);
		if (r < 0)
			return ferry__py_raise(r, NULL);
	}
	Py_RETURN_NONE;
}

static int64_t writer_save_call(WriterObject *self, const char *path, int64_t step, int flags, int async)
{
	if (self->ck)
		return async ? ferry_ckpt_save_async(self->ck, step) : ferry_ckpt_save(self->ck, step);
	return async ? ferry_st_writer_save_async(self->w, path, flags) : ferry_st_writer_save(self->w, path, flags);
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
		if ((step == -1 && PyErr_Occurred()) || step < 0) {
			/* Refused before the C save, which is what forgets the tensors added for it: a
			 * save of step -1 refuses (-EINVAL) and forgets them, so that the next save does
			 * not find them "added twice" (issue 20, save(step=2**63) then save(step=2)). */
			int forget = ferry_ckpt_save(self->ck, -1);
			(void)forget;
			if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
				PyErr_Clear();
				PyErr_Format(PyExc_ValueError, "checkpoint step %R: a step is an int from 0 to 2**63-1",
					     target);
			}
			return NULL;
		}
	} else if (!PyUnicode_FSConverter(target, &bpath)) {
		return NULL;
	}
	const char *path = bpath ? PyBytes_AS_STRING(bpath) : NULL;
	FERRY_PY_NOGIL(&self->busy, r, writer_save_call(self, path, step, flags, async));
	Py_XDECREF(bpath);
	if (ferry__py_failed(r, self->ck ? NULL : target))
		return NULL;
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
	if (!PyArg_ParseTuple(args, "|O:wait", &to) || ferry__py_timeout(to, &ns) < 0)
		return NULL;
	FERRY_PY_NOGIL(&self->busy, r, self->ck ? ferry_ckpt_wait(self->ck, ns) : ferry_st_writer_wait(self->w, ns));
	/* -ETIMEDOUT is this wait's timeout only while the save still runs (rank 0's commit can fail so too). */
	if (r == -ETIMEDOUT && !(self->ck ? ferry_ckpt_done(self->ck) : ferry_st_writer_done(self->w)))
		return Py_BuildValue("(OL)", Py_False, 0LL);
	if (ferry__py_failed(r, NULL))
		return NULL;
	return Py_BuildValue("(OL)", Py_True, (long long)r);
}

/* stats() -> dict: the last save's statistics, and seconds per phase (ferry_st_writer_stat, _phase_ns). */
static PyObject *save_stat_at(Py_ssize_t i, const void *arg, const char **key)
{
	const WriterObject *self = arg;
	int ph = (int)i - FERRY_SAVE_STAT__COUNT;
	if (ph < 0) {
		*key = ferry_save_stat_name((int)i);
		return PyLong_FromUnsignedLongLong(self->ck ? ferry_ckpt_stat(self->ck, (int)i)
							    : ferry_st_writer_stat(self->w, (int)i));
	}
	*key = ferry_save_phase_name(ph);
	return PyFloat_FromDouble(1e-9 * (double)(self->ck ? ferry_ckpt_phase_ns(self->ck, ph)
							   : ferry_st_writer_phase_ns(self->w, ph)));
}

static PyObject *writer_stats(WriterObject *self, PyObject *unused)
{
	return ferry__py_dict(FERRY_SAVE_STAT__COUNT + FERRY_SAVE_PHASE__COUNT, save_stat_at, self);
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
	FERRY_PY_NOGIL(&self->busy, r, self->ck ? ferry_ckpt_reserve(self->ck, bytes, device)
						  : ferry_st_writer_reserve(self->w, bytes, device));
	if (ferry__py_failed(r, NULL))
		return NULL;
	return PyLong_FromLongLong(r);
}

static PyMethodDef writer_methods[] = {
	{"stats", (PyCFunction)writer_stats, METH_NOARGS, "stats() -> dict: the last save's statistics and seconds per phase"},
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
	FERRY_PY_TYPE("ferry._ferry.Writer", WriterObject, Py_TPFLAGS_DEFAULT,
		      "A safetensors writer (ferry_st_writer) or a checkpoint directory (ferry_ckpt)."),
	.tp_dealloc = (destructor)writer_dealloc,
	.tp_methods = writer_methods,
};

/* ------------------------------------------------------------------------------ module functions */

static int64_t ckpt_latest(ferry_ctx *unused, const char *dir, void *arg)
{
	return ferry_ckpt_latest(dir);
}

/* ckpt_latest(dir) -> step or None (no `latest`) */
static PyObject *mod_ckpt_latest(PyObject *mod, PyObject *arg)
{
	int64_t r = ferry__py_path_call(NULL, arg, ckpt_latest, NULL);
	if (r < 0) {
		/* -ENOENT: no committed step (FileNotFoundError) */
		if (!PyErr_ExceptionMatches(PyExc_FileNotFoundError))
			return NULL;
		PyErr_Clear();
		Py_RETURN_NONE;
	}
	return PyLong_FromLongLong(r);
}

struct steps_args {
	int64_t *steps;
	size_t cap;
};

static int64_t ckpt_steps(ferry_ctx *unused, const char *dir, void *arg)
{
	struct steps_args *a = arg;
	return ferry_ckpt_steps(dir, a->steps, a->cap);
}

/* ckpt_steps(dir) -> the committed steps, newest first (an s3:// prefix is listed) */
static PyObject *mod_ckpt_steps(PyObject *mod, PyObject *arg)
{
	struct steps_args a = {NULL, 0};
	for (;;) {
		int64_t n = ferry__py_path_call(NULL, arg, ckpt_steps, &a);
		if (n < 0) {
			PyMem_Free(a.steps);
			return NULL;
		}
		if ((size_t)n <= a.cap) {
			PyObject *list = PyList_New((Py_ssize_t)n);
			for (int64_t i = 0; list && i < n; i++) {
				PyObject *v = PyLong_FromLongLong(a.steps[i]);
				if (!v) {
					Py_CLEAR(list);
					break;
				}
				PyList_SET_ITEM(list, (Py_ssize_t)i, v);
			}
			PyMem_Free(a.steps);
			return list;
		}
		PyMem_Free(a.steps);
		a.cap = (size_t)n + 16; /* steps committed meanwhile */
		if (!(a.steps = PyMem_Malloc(a.cap * sizeof(int64_t))))
			return PyErr_NoMemory();
	}
}

/* What the step-level calls take besides the directory. */
struct step_args {
	int64_t step;
	int rank, world; /* ckpt_path */
	int require_sums; /* ckpt_verify */
	char *buf;        /* ckpt_path: PATH_LEN bytes */
};

enum { PATH_LEN = 4096 };

static int64_t ckpt_path(ferry_ctx *unused, const char *dir, void *arg)
{
	struct step_args *a = arg;
	return a->rank < 0 ? ferry_ckpt_step_path(dir, a->step, a->buf, PATH_LEN)
			   : ferry_ckpt_shard_path(dir, a->step, a->rank, a->world, a->buf, PATH_LEN);
}

/* ckpt_path(dir, step, rank=-1, world=0) -> the step's directory (rank < 0) or a shard's path */
static PyObject *mod_ckpt_path(PyObject *mod, PyObject *args)
{
	PyObject *diro;
	long long step;
	char buf[PATH_LEN];
	struct step_args a = {0, -1, 0, 0, buf};
	if (!PyArg_ParseTuple(args, "OL|ii:ckpt_path", &diro, &step, &a.rank, &a.world))
		return NULL;
	a.step = step;
	if (ferry__py_path_call(NULL, diro, ckpt_path, &a) < 0)
		return NULL;
	return PyUnicode_DecodeFSDefault(buf);
}

static int64_t ckpt_verify(ferry_ctx *ctx, const char *dir, void *arg)
{
	struct step_args *a = arg;
	return ferry_ckpt_verify(ctx, dir, a->step, a->require_sums);
}

/* ckpt_verify(ctx, dir, step, require_sums) */
static PyObject *mod_ckpt_verify(PyObject *mod, PyObject *args)
{
	PyObject *ctxo, *diro;
	long long step;
	struct step_args a = {0, -1, 0, 0, NULL};
	if (!PyArg_ParseTuple(args, "OOL|p:ckpt_verify", &ctxo, &diro, &step, &a.require_sums))
		return NULL;
	a.step = step;
	if (ferry__py_path_call(ctxo, diro, ckpt_verify, &a) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static int64_t ckpt_world(ferry_ctx *unused, const char *dir, void *arg)
{
	return ferry_ckpt_world(dir, ((struct step_args *)arg)->step);
}

/* ckpt_world(dir, step) -> the ranks that saved a committed step (its manifest's world) */
static PyObject *mod_ckpt_world(PyObject *mod, PyObject *args)
{
	PyObject *diro;
	long long step;
	struct step_args a = {0, -1, 0, 0, NULL};
	if (!PyArg_ParseTuple(args, "OL:ckpt_world", &diro, &step))
		return NULL;
	a.step = step;
	int64_t r = ferry__py_path_call(NULL, diro, ckpt_world, &a);
	return r < 0 ? NULL : PyLong_FromLongLong(r);
}

static int64_t ckpt_prune(ferry_ctx *unused, const char *dir, void *keep)
{
	return ferry_ckpt_prune(dir, *(int *)keep);
}

/* ckpt_prune(dir, keep) -> steps removed */
static PyObject *mod_ckpt_prune(PyObject *mod, PyObject *args)
{
	PyObject *diro;
	int keep;
	int64_t r;
	if (!PyArg_ParseTuple(args, "Oi:ckpt_prune", &diro, &keep) ||
	    (r = ferry__py_path_call(NULL, diro, ckpt_prune, &keep)) < 0)
		return NULL;
	return PyLong_FromLongLong(r);
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

/*
 * xxh3(ptr, nbytes) -> int: xxh3-64 of host memory (ferry_xxh3, the shards' checksum), with the
 * GIL released: ferry.checkpoint hashes replicated state at memory speed to find what every rank
 * holds alike.
 */
static PyObject *mod_xxh3(PyObject *mod, PyObject *args)
{
	unsigned long long ptr, len;
	uint64_t h = 0;
	int r;
	if (!PyArg_ParseTuple(args, "KK:xxh3", &ptr, &len))
		return NULL;
	if (!len)
		ptr = (uintptr_t)&h; /* ferry_xxh3 refuses NULL, an empty tensor has no address */
	FERRY_PY_NOGIL(NULL, r, ferry_xxh3((const void *)(uintptr_t)ptr, (size_t)len, &h));
	if (ferry__py_failed(r, NULL))
		return NULL;
	return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef ckpt_functions[] = {
	{"xxh3", mod_xxh3, METH_VARARGS, "xxh3(ptr, nbytes) -> xxh3-64 of host memory (GIL released)"},
	{"st_open", mod_st_open, METH_VARARGS, "st_open(ctx, path) -> St"},
	{"load_open", mod_load_open, METH_VARARGS, "load_open(ctx, path) -> Load (file, index, manifest or directory)"},
	{"writer_create", mod_writer_create, METH_O, "writer_create(ctx) -> Writer"},
	{"ckpt_open", mod_ckpt_open, METH_VARARGS, "ckpt_open(ctx, dir, rank, world) -> Writer"},
	{"ckpt_latest", mod_ckpt_latest, METH_O, "ckpt_latest(dir) -> step or None"},
	{"ckpt_path", mod_ckpt_path, METH_VARARGS, "ckpt_path(dir, step, rank=-1, world=0) -> str"},
	{"ckpt_verify", mod_ckpt_verify, METH_VARARGS, "ckpt_verify(ctx, dir, step, require_sums=False)"},
	{"ckpt_world", mod_ckpt_world, METH_VARARGS, "ckpt_world(dir, step) -> ranks that saved the step"},
	{"ckpt_steps", mod_ckpt_steps, METH_O, "ckpt_steps(dir) -> committed steps, newest first"},
	{"ckpt_prune", mod_ckpt_prune, METH_VARARGS, "ckpt_prune(dir, keep) -> steps removed"},
	{"dtype_bits", mod_dtype_bits, METH_O, "dtype_bits(name) -> bits per element"},
	{"have_xxh3", mod_have_xxh3, METH_NOARGS, "True (checksums are in every build)"},
	{NULL},
};

/* The i-th of safetensors' dtypes in enum order: every value but FERRY_DT_BYTES. */
static PyObject *dtype_name_at(Py_ssize_t i, const void *unused)
{
	return PyUnicode_FromString(ferry_dtype_name((int)(i < FERRY_DT_BYTES ? i : i + 1)));
}

int ferry__py_ckpt_init(PyObject *m)
{
	if (PyType_Ready(&StType) < 0 || PyType_Ready(&LoadType) < 0 || PyType_Ready(&WriterType) < 0 ||
	    PyModule_AddFunctions(m, ckpt_functions) < 0)
		return -1;
	PyObject *names = ferry__py_tuple(FERRY_DT__COUNT - 1, dtype_name_at, NULL); /* safetensors' dtypes */
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
