/*
 * _ferry: the CPython extension under `import ferry`. It uses the public C API only (ferry.h,
 * gpu.h). Every call that can block (open, I/O, waits) runs with the GIL released.
 *
 * Buffers are taken zero-copy from, in this order: the buffer protocol (NumPy, bytearray,
 * memoryview, mmap), DLPack (__dlpack__/__dlpack_device__: torch, CuPy, JAX; or a bare "dltensor"
 * capsule), __cuda_array_interface__ (CuPy, Numba). docs/PYTHON.md has the rules.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "_ferry.h"

/* --------------------------------------------------------------------- DLPack (ABI, by hand) */

/* dlpack.h v0.8 and v1.x; only the fields read here. https://dmlc.github.io/dlpack/latest/c_api.html */
enum {
	DL_CPU = 1,
	DL_CUDA = 2,
	DL_CUDA_HOST = 3,
	DL_CUDA_MANAGED = 13,
};

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

/* ------------------------------------------------------------------------------------- errors */

static PyObject *ferry_error_type; /* ferry.Error, a subclass of OSError */

/*
 * Raises the exception for err (negative): an OSError subclass picked by errno (OSError's
 * constructor does that), or ferry.Error for ferry's own codes. The message is the thread's
 * ferry_last_error() detail, which names the call, file and offset.
 */
static PyObject *raise_ferry(int err, PyObject *filename)
{
	const char *detail = ferry_last_error();
	PyObject *exc;

	if (!detail || !*detail)
		detail = ferry_strerror(err);
	if (err < 0 && err > -4096) {
		exc = PyObject_CallFunction(PyExc_OSError, "isO", -err, detail,
					    filename ? filename : Py_None);
	} else {
		exc = PyObject_CallFunction(ferry_error_type, "N",
					    PyUnicode_FromFormat("[%s] %s", ferry_err_name(err), detail));
		if (exc) {
			PyObject *code = PyLong_FromLong(err);
			PyObject *name = PyUnicode_FromString(ferry_err_name(err));
			PyObject *msg = PyUnicode_FromString(detail);

			if (!code || !name || !msg ||
			    PyObject_SetAttrString(exc, "code", code) < 0 ||
			    PyObject_SetAttrString(exc, "name", name) < 0 ||
			    PyObject_SetAttrString(exc, "strerror", msg) < 0)
				Py_CLEAR(exc);
			Py_XDECREF(code);
			Py_XDECREF(name);
			Py_XDECREF(msg);
		}
	}
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* ------------------------------------------------------------------------------------ buffers */

enum { BUF_NONE, BUF_VIEW, BUF_DLPACK, BUF_DLPACK_V1, BUF_CAI };

/* A resolved buffer: address and length, and what keeps it alive until fbuf_release(). */
struct fbuf {
	void *ptr;
	size_t len;
	int cuda; /* 1: CUDA device or managed memory */
	int device;
	int how;
	Py_buffer view;
	void *managed; /* dl_managed or dl_managed_versioned */
	PyObject *owner;
};

static void fbuf_release(struct fbuf *b)
{
	switch (b->how) {
	case BUF_VIEW:
		PyBuffer_Release(&b->view);
		break;
	case BUF_DLPACK: {
		dl_managed *m = b->managed;
		if (m->deleter)
			m->deleter(m);
		break;
	}
	case BUF_DLPACK_V1: {
		dl_managed_versioned *m = b->managed;
		if (m->deleter)
			m->deleter(m);
		break;
	}
	}
	b->how = BUF_NONE;
	b->managed = NULL;
	Py_CLEAR(b->owner);
}

static const char *what(int writable)
{
	return writable ? "destination" : "source";
}

/* shape/strides (in elements; strides NULL = compact) describe one C-contiguous block? */
static int compact(int ndim, const int64_t *shape, const int64_t *strides, int64_t *count)
{
	int64_t n = 1, expect = 1;

	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return 0;
		if (shape[i] == 0) {
			*count = 0;
			return 1;
		}
		if (n > INT64_MAX / shape[i])
			return 0;
		n *= shape[i];
	}
	*count = n;
	if (!strides)
		return 1;
	for (int i = ndim - 1; i >= 0; i--) {
		if (shape[i] != 1 && strides[i] != expect)
			return 0;
		expect *= shape[i];
	}
	return 1;
}

static int from_view(PyObject *obj, struct fbuf *b, int writable)
{
	int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);

	if (PyObject_GetBuffer(obj, &b->view, flags) == 0) {
		b->ptr = b->view.buf;
		b->len = (size_t)b->view.len;
		b->how = BUF_VIEW;
		return 0;
	}
	/* Say which rule the object broke, rather than the exporter's terse message. */
	PyObject *type, *value, *tb;
	PyErr_Fetch(&type, &value, &tb);
	Py_buffer v;
	if (PyObject_GetBuffer(obj, &v, PyBUF_FULL_RO) == 0) {
		int contiguous = PyBuffer_IsContiguous(&v, 'C'), ro = v.readonly;

		PyBuffer_Release(&v);
		if (!contiguous) {
			PyErr_Format(PyExc_ValueError, "the %s (%.100s) is not C-contiguous; ferry "
				     "moves one contiguous block of memory (use .copy() or "
				     ".contiguous() first)", what(writable), Py_TYPE(obj)->tp_name);
			goto out;
		}
		if (ro && writable) {
			PyErr_Format(PyExc_ValueError, "the destination (%.100s) is read-only",
				     Py_TYPE(obj)->tp_name);
			goto out;
		}
	}
	PyErr_Clear();
	PyErr_Restore(type, value, tb);
	return -1;
out:
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
	return -1;
}

static int dl_check(const dl_tensor *t, PyObject *obj, struct fbuf *b, int writable)
{
	int64_t count;
	size_t bits = (size_t)t->dtype.bits * (t->dtype.lanes ? t->dtype.lanes : 1);

	switch (t->device.device_type) {
	case DL_CPU:
	case DL_CUDA_HOST:
		b->cuda = 0;
		b->device = -1;
		break;
	case DL_CUDA:
	case DL_CUDA_MANAGED:
		b->cuda = 1;
		b->device = t->device.device_id;
		break;
	default:
		PyErr_Format(PyExc_TypeError, "the %s (%.100s) lives on DLPack device type %d; ferry "
			     "moves data to host and CUDA memory only", what(writable),
			     Py_TYPE(obj)->tp_name, (int)t->device.device_type);
		return -1;
	}
	if (bits % 8) {
		PyErr_Format(PyExc_TypeError, "the %s (%.100s) has %zu-bit elements; ferry needs "
			     "whole bytes", what(writable), Py_TYPE(obj)->tp_name, bits);
		return -1;
	}
	if (t->ndim < 0 || (t->ndim > 0 && !t->shape) ||
	    !compact(t->ndim, t->shape, t->strides, &count)) {
		PyErr_Format(PyExc_ValueError, "the %s (%.100s) is not C-contiguous; ferry moves one "
			     "contiguous block of memory (use .contiguous() first)", what(writable),
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	b->ptr = (char *)t->data + t->byte_offset;
	b->len = (size_t)count * (bits / 8);
	return 0;
}

/* Takes over a "dltensor" or "dltensor_versioned" capsule (renamed used_* so it is not freed twice). */
static int from_capsule(PyObject *cap, PyObject *obj, struct fbuf *b, int writable)
{
	const char *name = PyCapsule_GetName(cap);
	int v1;

	if (name && !strcmp(name, "dltensor_versioned"))
		v1 = 1;
	else if (name && !strcmp(name, "dltensor"))
		v1 = 0;
	else {
		PyErr_Format(PyExc_TypeError, "the %s is a capsule named '%s', not an unused DLPack "
			     "tensor ('dltensor')", what(writable), name ? name : "(null)");
		return -1;
	}
	void *m = PyCapsule_GetPointer(cap, name);
	if (!m)
		return -1;
	const dl_tensor *t;
	if (v1) {
		dl_managed_versioned *mv = m;
		if (mv->major != 1) {
			PyErr_Format(PyExc_TypeError, "DLPack version %u.%u is not supported",
				     mv->major, mv->minor);
			return -1;
		}
		if (writable && (mv->flags & DL_FLAG_READ_ONLY)) {
			PyErr_Format(PyExc_ValueError, "the destination (%.100s) is read-only "
				     "(DLPack flag)", Py_TYPE(obj)->tp_name);
			return -1;
		}
		if (writable && (mv->flags & DL_FLAG_IS_COPIED)) {
			PyErr_Format(PyExc_ValueError, "the destination (%.100s) was exported as a "
				     "copy; a read into it would be lost", Py_TYPE(obj)->tp_name);
			return -1;
		}
		t = &mv->t;
	} else {
		t = &((dl_managed *)m)->t;
	}
	if (dl_check(t, obj, b, writable) < 0)
		return -1;
	if (PyCapsule_SetName(cap, v1 ? "used_dltensor_versioned" : "used_dltensor") < 0)
		return -1;
	b->managed = m;
	b->how = v1 ? BUF_DLPACK_V1 : BUF_DLPACK;
	return 0;
}

/* getattr(obj, name, None) without raising: 1 found, 0 absent, -1 error. */
static int get_optional_attr(PyObject *obj, PyObject *name, PyObject **out)
{
#if PY_VERSION_HEX >= 0x030D0000
	return PyObject_GetOptionalAttr(obj, name, out);
#else
	*out = PyObject_GetAttr(obj, name);
	if (*out)
		return 1;
	if (!PyErr_ExceptionMatches(PyExc_AttributeError))
		return -1;
	PyErr_Clear();
	return 0;
#endif
}

static PyObject *str_dlpack, *str_dlpack_device, *str_cai, *str_stream, *str_max_version;
static PyObject *max_version_1;

/* obj.__dlpack__(stream=..., max_version=(1, 0)), falling back to the pre-1.0 signature. */
static int from_dlpack(PyObject *obj, PyObject *meth, struct fbuf *b, int writable, PyObject *stream)
{
	PyObject *dev, *kw = NULL, *cap = NULL;
	int type = 0, ret = -1;

	dev = PyObject_CallMethodNoArgs(obj, str_dlpack_device);
	if (!dev)
		return -1;
	if (!PyTuple_Check(dev) || PyTuple_GET_SIZE(dev) < 1 ||
	    (type = (int)PyLong_AsLong(PyTuple_GET_ITEM(dev, 0))) == -1) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_TypeError, "__dlpack_device__() must return (type, id)");
		Py_DECREF(dev);
		return -1;
	}
	Py_DECREF(dev);
	kw = PyDict_New();
	if (!kw)
		return -1;
	if (type == DL_CUDA || type == DL_CUDA_MANAGED) {
		/*
		 * -1: no synchronization by the producer. ferry's own copies run on its streams and
		 * the call returns only when the data has landed; ordering with the caller's GPU work
		 * is the caller's (docs/PYTHON.md), or a stream-ordered call's.
		 */
		PyObject *s = stream ? stream : PyLong_FromLong(-1);
		if (!s || PyDict_SetItem(kw, str_stream, s) < 0) {
			if (!stream)
				Py_XDECREF(s);
			goto out;
		}
		if (!stream)
			Py_DECREF(s);
	}
	if (PyDict_SetItem(kw, str_max_version, max_version_1) < 0)
		goto out;
	PyObject *empty = PyTuple_New(0);
	if (!empty)
		goto out;
	cap = PyObject_Call(meth, empty, kw);
	if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
		/* A producer from before DLPack 1.0 does not know max_version. */
		PyErr_Clear();
		PyDict_DelItem(kw, str_max_version);
		cap = PyObject_Call(meth, empty, kw);
	}
	Py_DECREF(empty);
	if (!cap)
		goto out;
	if (!PyCapsule_CheckExact(cap)) {
		PyErr_Format(PyExc_TypeError, "%.100s.__dlpack__() returned %.100s, not a capsule",
			     Py_TYPE(obj)->tp_name, Py_TYPE(cap)->tp_name);
		goto out;
	}
	ret = from_capsule(cap, obj, b, writable);
out:
	Py_XDECREF(cap);
	Py_XDECREF(kw);
	return ret;
}

static int from_cai(PyObject *obj, PyObject *cai, struct fbuf *b, int writable)
{
	PyObject *shape, *typestr, *data, *strides;
	int64_t sh[64], st[64], count;
	Py_ssize_t ndim;
	long itemsize;
	int ro;
	void *ptr;

	if (!PyDict_Check(cai))
		goto bad;
	shape = PyDict_GetItemString(cai, "shape");
	typestr = PyDict_GetItemString(cai, "typestr");
	data = PyDict_GetItemString(cai, "data");
	strides = PyDict_GetItemString(cai, "strides");
	if (!shape || !PyTuple_Check(shape) || !typestr || !PyUnicode_Check(typestr) || !data ||
	    !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2)
		goto bad;
	ndim = PyTuple_GET_SIZE(shape);
	if (ndim > 64)
		goto bad;
	const char *ts = PyUnicode_AsUTF8(typestr);
	if (!ts || strlen(ts) < 3 || (itemsize = strtol(ts + 2, NULL, 10)) <= 0)
		goto bad;
	ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
	if (PyErr_Occurred())
		return -1;
	ro = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
	if (ro < 0)
		return -1;
	for (Py_ssize_t i = 0; i < ndim; i++) {
		sh[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
		if (sh[i] == -1 && PyErr_Occurred())
			return -1;
	}
	if (strides && strides != Py_None) {
		if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != ndim)
			goto bad;
		for (Py_ssize_t i = 0; i < ndim; i++) {
			long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
			if (s == -1 && PyErr_Occurred())
				return -1;
			st[i] = s % itemsize ? -1 : s / itemsize;
		}
	}
	if (!compact((int)ndim, sh, strides && strides != Py_None ? st : NULL, &count)) {
		PyErr_Format(PyExc_ValueError, "the %s (%.100s) is not C-contiguous; ferry moves one "
			     "contiguous block of memory", what(writable), Py_TYPE(obj)->tp_name);
		return -1;
	}
	if (ro && writable) {
		PyErr_Format(PyExc_ValueError, "the destination (%.100s) is read-only",
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	b->ptr = ptr;
	b->len = (size_t)count * (size_t)itemsize;
	b->cuda = 1;
	b->device = -1;
	int kind = ferry_mem_kind(ptr, &b->device);
	if (kind == FERRY_MEM_HOST || kind == FERRY_MEM_PINNED)
		b->cuda = 0;
	b->how = BUF_CAI;
	return 0;
bad:
	PyErr_Format(PyExc_TypeError, "%.100s.__cuda_array_interface__ is malformed",
		     Py_TYPE(obj)->tp_name);
	return -1;
}

/*
 * Resolves obj into an address and a length, zero-copy, and keeps it alive (b->owner) until
 * fbuf_release(). writable: the buffer is a read's destination. stream: passed to __dlpack__
 * for CUDA producers (NULL: -1, no synchronization).
 */
static int fbuf_get(PyObject *obj, struct fbuf *b, int writable, PyObject *stream)
{
	PyObject *attr;
	int ret;

	memset(b, 0, sizeof(*b));
	b->device = -1;
	if (PyObject_CheckBuffer(obj)) {
		ret = from_view(obj, b, writable);
		if (ret == 0)
			goto done;
		/*
		 * CuPy arrays export the buffer protocol, and refuse it for device memory: fall
		 * through to DLPack or the CUDA array interface where the object has them.
		 */
		PyObject *type, *value, *tb;
		int has;
		PyErr_Fetch(&type, &value, &tb);
		/* ValueError: from_view named the rule the buffer broke (contiguity, read-only). */
		has = !PyErr_GivenExceptionMatches(type, PyExc_ValueError) &&
		      (PyObject_HasAttr(obj, str_dlpack) || PyObject_HasAttr(obj, str_cai));
		if (!has) {
			PyErr_Restore(type, value, tb);
			return -1;
		}
		Py_XDECREF(type);
		Py_XDECREF(value);
		Py_XDECREF(tb);
	}
	if (PyCapsule_CheckExact(obj)) {
		ret = from_capsule(obj, obj, b, writable);
		goto done;
	}
	if (get_optional_attr(obj, str_dlpack, &attr) < 0)
		return -1;
	if (attr) {
		ret = from_dlpack(obj, attr, b, writable, stream);
		Py_DECREF(attr);
		goto done;
	}
	if (get_optional_attr(obj, str_cai, &attr) < 0)
		return -1;
	if (attr) {
		ret = from_cai(obj, attr, b, writable);
		Py_DECREF(attr);
		goto done;
	}
	PyErr_Format(PyExc_TypeError, "a %s must support the buffer protocol (bytearray, "
		     "memoryview, numpy.ndarray), DLPack (torch.Tensor, cupy.ndarray) or "
		     "__cuda_array_interface__; got %.100s", what(writable), Py_TYPE(obj)->tp_name);
	return -1;
done:
	if (ret < 0)
		return -1;
	Py_INCREF(obj);
	b->owner = obj;
	return 0;
}

/* -------------------------------------------------------------------------------- arguments */

/* A non-negative int as a file offset. */
static int get_offset(PyObject *o, uint64_t *off)
{
	unsigned long long v;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "offset must be an int, not %.100s", Py_TYPE(o)->tp_name);
		return -1;
	}
	if (_PyLong_Sign(o) < 0) {
		PyErr_SetString(PyExc_ValueError, "offset must not be negative");
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(o);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	*off = v;
	return 0;
}

/*
 * (buf, offset=0, *, stream=None) from a vectorcall. Written out by hand: the 4 KiB call's cost
 * is mostly argument handling (docs/PERFORMANCE.md, "Python call overhead").
 */
static int parse_io(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
		    PyObject **buf, uint64_t *off, PyObject **stream)
{
	PyObject *ooff = NULL;

	*buf = NULL;
	*off = 0;
	if (stream)
		*stream = NULL;
	if (nargs > 2) {
		PyErr_Format(PyExc_TypeError, "%s() takes at most 2 positional arguments (%zd given)",
			     fn, nargs);
		return -1;
	}
	if (nargs > 0)
		*buf = args[0];
	if (nargs > 1)
		ooff = args[1];
	if (kwnames) {
		for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
			PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
			PyObject **slot;

			if (PyUnicode_CompareWithASCIIString(k, "offset") == 0)
				slot = &ooff;
			else if (PyUnicode_CompareWithASCIIString(k, "buf") == 0)
				slot = buf;
			else if (stream && PyUnicode_CompareWithASCIIString(k, "stream") == 0)
				slot = stream;
			else {
				PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
					     fn, k);
				return -1;
			}
			if (*slot) {
				PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'",
					     fn, k);
				return -1;
			}
			*slot = v;
		}
	}
	if (!*buf) {
		PyErr_Format(PyExc_TypeError, "%s() missing required argument 'buf'", fn);
		return -1;
	}
	if (stream && *stream == Py_None)
		*stream = NULL;
	return ooff ? get_offset(ooff, off) : 0;
}

/* ------------------------------------------------------------------------------------ Context */

typedef struct {
	PyObject_HEAD
	ferry_ctx *ctx;
} ContextObject;

static PyTypeObject ContextType;

static PyObject *context_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	ContextObject *self = (ContextObject *)type->tp_alloc(type, 0);
	int ret;

	if (!self)
		return NULL;
	ret = ferry_ctx_create(&self->ctx);
	if (ret < 0) {
		self->ctx = NULL;
		Py_DECREF(self);
		return raise_ferry(ret, NULL);
	}
	return (PyObject *)self;
}

static void context_dealloc(ContextObject *self)
{
	/* Files and requests hold a reference to their context: none is left by now. */
	ferry_ctx_destroy(self->ctx);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *context_set(ContextObject *self, PyObject *args)
{
	const char *key, *value;
	int ret;

	if (!PyArg_ParseTuple(args, "ss:set", &key, &value))
		return NULL;
	ret = ferry_ctx_set(self->ctx, key, value);
	if (ret < 0)
		return raise_ferry(ret, NULL);
	Py_RETURN_NONE;
}

static PyObject *context_get(ContextObject *self, PyObject *arg)
{
	char buf[256];
	const char *key = PyUnicode_AsUTF8(arg);
	int ret;

	if (!key)
		return NULL;
	ret = ferry_ctx_get(self->ctx, key, buf, sizeof(buf));
	if (ret < 0)
		return raise_ferry(ret, NULL);
	return PyUnicode_FromString(buf);
}

static PyObject *context_start(ContextObject *self, PyObject *unused)
{
	int ret;

	Py_BEGIN_ALLOW_THREADS
	ret = ferry_ctx_start(self->ctx);
	Py_END_ALLOW_THREADS
	if (ret < 0)
		return raise_ferry(ret, NULL);
	Py_RETURN_NONE;
}

static PyObject *context_stats(ContextObject *self, PyObject *unused)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	for (int i = 0; i < FERRY_STAT__COUNT; i++) {
		PyObject *v = PyLong_FromUnsignedLongLong(ferry_ctx_stat(self->ctx, (enum ferry_stat)i));
		if (!v || PyDict_SetItemString(d, ferry_stat_name((enum ferry_stat)i), v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

static PyObject *context_backend(ContextObject *self, void *closure)
{
	const char *name;

	Py_BEGIN_ALLOW_THREADS
	name = ferry_ctx_backend(self->ctx);
	Py_END_ALLOW_THREADS
	return PyUnicode_FromString(name ? name : "");
}

static PyObject *run_batch(ContextObject *ctx, PyObject *deffile, PyObject *entries, int is_write);

static PyObject *context_batch(ContextObject *self, PyObject *args)
{
	PyObject *entries;
	int is_write = 0;

	if (!PyArg_ParseTuple(args, "O|p:_batch", &entries, &is_write))
		return NULL;
	return run_batch(self, NULL, entries, is_write);
}

static PyMethodDef context_methods[] = {
	{"set", (PyCFunction)context_set, METH_VARARGS,
	 "set(key, value): sets a knob by name (value as text, e.g. '4', '1m', 'on')."},
	{"get", (PyCFunction)context_get, METH_O, "get(key) -> str: a knob's current value as text."},
	{"start", (PyCFunction)context_start, METH_NOARGS,
	 "start(): starts the workers now (otherwise the first I/O does)."},
	{"stats", (PyCFunction)context_stats, METH_NOARGS,
	 "stats() -> dict: the context's counters (bytes_read, reads, fallbacks, ...)."},
	{"_batch", (PyCFunction)context_batch, METH_VARARGS, NULL},
	{NULL},
};

static PyGetSetDef context_getset[] = {
	{"backend", (getter)context_backend, NULL,
	 "Name of the backend the workers and queues use ('io_uring' or 'psync'), probed if needed; "
	 "does not start the workers.", NULL},
	{NULL},
};

static PyTypeObject ContextType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry._ferry.Context",
	.tp_basicsize = sizeof(ContextObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "A ferry context: knobs, workers, buffers and statistics (ferry_ctx).",
	.tp_new = context_new,
	.tp_dealloc = (destructor)context_dealloc,
	.tp_methods = context_methods,
	.tp_getset = context_getset,
};

/* --------------------------------------------------------------------------------------- File */

typedef struct {
	PyObject_HEAD
	ferry_file *f;
	ContextObject *ctx;
	PyObject *name;
	PyObject *mode;
	Py_ssize_t inflight; /* calls and requests using f; changed with the GIL held */
} FileObject;

static PyTypeObject FileType;

static int file_check(FileObject *self)
{
	if (!self->f) {
		PyErr_Format(PyExc_ValueError, "I/O operation on closed file %R", self->name);
		return -1;
	}
	return 0;
}

static void file_dealloc(FileObject *self)
{
	/* Requests hold a reference to their file, so nothing is in flight here. */
	ferry_file_destroy(self->f);
	Py_XDECREF(self->ctx);
	Py_XDECREF(self->name);
	Py_XDECREF(self->mode);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *file_close(FileObject *self, PyObject *unused)
{
	if (self->inflight) {
		PyErr_Format(PyExc_RuntimeError, "cannot close %R: %zd operation(s) in flight (wait "
			     "for its futures first)", self->name, self->inflight);
		return NULL;
	}
	ferry_file_destroy(self->f);
	self->f = NULL;
	Py_RETURN_NONE;
}

static PyObject *file_transfer_stream(FileObject *self, PyObject *obj, uint64_t off,
				      PyObject *stream, int is_write);

static PyObject *file_transfer(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
			       PyObject *kwnames, int is_write)
{
	PyObject *obj;
	uint64_t off;
	struct fbuf b;
	ssize_t n;

	PyObject *stream;

	if (parse_io(is_write ? "pwrite_from" : "pread_into", args, nargs, kwnames, &obj, &off,
		     &stream) < 0 || file_check(self) < 0)
		return NULL;
	if (stream)
		return file_transfer_stream(self, obj, off, stream, is_write);
	if (fbuf_get(obj, &b, !is_write, NULL) < 0)
		return NULL;
	self->inflight++;
	Py_BEGIN_ALLOW_THREADS
	n = is_write ? ferry_pwrite(self->f, b.ptr, b.len, off) : ferry_pread(self->f, b.ptr, b.len, off);
	Py_END_ALLOW_THREADS
	self->inflight--;
	fbuf_release(&b);
	if (n < 0)
		return raise_ferry((int)n, self->name);
	return PyLong_FromSsize_t(n);
}

static PyObject *file_pread_into(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
				 PyObject *kwnames)
{
	return file_transfer(self, args, nargs, kwnames, 0);
}

static PyObject *file_pwrite_from(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
				  PyObject *kwnames)
{
	return file_transfer(self, args, nargs, kwnames, 1);
}

/* ------------------------------------------------------------------------------ Request/Future */

typedef struct {
	PyObject_HEAD
	ferry_req *req; /* NULL once freed */
	FileObject *file;
	struct fbuf buf;
	uint64_t offset;
	int is_write;
	int waiters;  /* threads inside ferry_req_wait with the GIL released */
	int finished; /* result or exc is set */
	Py_ssize_t result;
	PyObject *exc;
} RequestObject;

static PyTypeObject RequestType;
static PyTypeObject *future_type = &RequestType; /* ferry.Future, set by ferry/__init__.py */

/* Frees the request and lets go of the buffer once it is finished and nobody waits on it. */
static void req_release(RequestObject *r)
{
	if (!r->req || !r->finished || r->waiters)
		return;
	ferry_req_destroy(r->req); /* finished: does not block */
	r->req = NULL;
	fbuf_release(&r->buf);
	r->file->inflight--;
}

/* Records a finished request's result, in the thread whose wait returned it (for the detail). */
static void req_settle(RequestObject *r, ssize_t res)
{
	if (!r->finished) {
		r->finished = 1;
		r->result = res;
		if (res < 0) {
			PyObject *type, *value, *tb;

			raise_ferry((int)res, r->file->name);
			PyErr_Fetch(&type, &value, &tb);
			PyErr_NormalizeException(&type, &value, &tb);
			if (tb)
				PyException_SetTraceback(value, tb);
			r->exc = value;
			Py_XDECREF(type);
			Py_XDECREF(tb);
		}
	}
	req_release(r);
}

/* Waits up to timeout_ns (negative: forever). 1 finished, 0 timed out. */
static int req_wait(RequestObject *r, int64_t timeout_ns)
{
	ssize_t res;

	if (r->finished)
		return 1;
	if (timeout_ns == 0) {
		if (!ferry_req_done(r->req))
			return 0;
		res = ferry_req_wait(r->req, 0);
	} else {
		r->waiters++;
		Py_BEGIN_ALLOW_THREADS
		res = ferry_req_wait(r->req, timeout_ns);
		Py_END_ALLOW_THREADS
		r->waiters--;
		if (res == -ETIMEDOUT && !ferry_req_done(r->req))
			return 0;
	}
	req_settle(r, res);
	return 1;
}

static int get_timeout(PyObject *args, PyObject *kwds, const char *fmt, int64_t *ns)
{
	static char *kwlist[] = {"timeout", NULL};
	PyObject *t = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, &t))
		return -1;
	if (t == Py_None) {
		*ns = -1;
		return 0;
	}
	double s = PyFloat_AsDouble(t);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	*ns = s <= 0 ? 0 : s > 9e9 ? -1 : (int64_t)(s * 1e9);
	return 0;
}

static PyObject *req_wait_py(RequestObject *r, PyObject *args, PyObject *kwds)
{
	int64_t ns;

	if (get_timeout(args, kwds, "|O:wait", &ns) < 0)
		return NULL;
	return PyBool_FromLong(req_wait(r, ns));
}

static PyObject *req_timeout(RequestObject *r)
{
	PyErr_Format(PyExc_TimeoutError, "%s of %R at offset %llu is still running",
		     r->is_write ? "pwrite" : "pread", r->file->name, (unsigned long long)r->offset);
	return NULL;
}

static PyObject *req_result(RequestObject *r, PyObject *args, PyObject *kwds)
{
	int64_t ns;

	if (get_timeout(args, kwds, "|O:result", &ns) < 0)
		return NULL;
	if (!req_wait(r, ns))
		return req_timeout(r);
	if (r->exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(r->exc), r->exc);
		return NULL;
	}
	return PyLong_FromSsize_t(r->result);
}

static PyObject *req_exception(RequestObject *r, PyObject *args, PyObject *kwds)
{
	int64_t ns;

	if (get_timeout(args, kwds, "|O:exception", &ns) < 0)
		return NULL;
	if (!req_wait(r, ns))
		return req_timeout(r);
	return Py_NewRef(r->exc ? r->exc : Py_None);
}

static PyObject *req_done(RequestObject *r, PyObject *unused)
{
	return PyBool_FromLong(req_wait(r, 0));
}

static PyObject *req_running(RequestObject *r, PyObject *unused)
{
	return PyBool_FromLong(!req_wait(r, 0));
}

static PyObject *req_false(RequestObject *r, PyObject *unused)
{
	Py_RETURN_FALSE;
}

static void req_dealloc(RequestObject *r)
{
	if (r->req) {
		/* Dropped while running: the buffer must outlive the transfer, so wait for it. */
		Py_BEGIN_ALLOW_THREADS
		ferry_req_destroy(r->req);
		Py_END_ALLOW_THREADS
		r->req = NULL;
		fbuf_release(&r->buf);
		r->file->inflight--;
	}
	Py_XDECREF(r->exc);
	Py_XDECREF(r->file);
	Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *req_repr(RequestObject *r)
{
	const char *op = r->is_write ? "pwrite" : "pread";

	if (!r->finished)
		return PyUnicode_FromFormat("<ferry.Future %s %R offset=%llu %zu bytes running>", op,
					    r->file->name, (unsigned long long)r->offset, r->buf.len);
	if (r->exc)
		return PyUnicode_FromFormat("<ferry.Future %s %R offset=%llu raised %s>", op,
					    r->file->name, (unsigned long long)r->offset,
					    Py_TYPE(r->exc)->tp_name);
	return PyUnicode_FromFormat("<ferry.Future %s %R offset=%llu returned %zd>", op, r->file->name,
				    (unsigned long long)r->offset, r->result);
}

static PyMethodDef req_methods[] = {
	{"wait", (PyCFunction)(void (*)(void))req_wait_py, METH_VARARGS | METH_KEYWORDS,
	 "wait(timeout=None) -> bool: waits (GIL released) until finished; False on timeout."},
	{"result", (PyCFunction)(void (*)(void))req_result, METH_VARARGS | METH_KEYWORDS,
	 "result(timeout=None) -> int: bytes transferred; raises the transfer's error, or "
	 "TimeoutError."},
	{"exception", (PyCFunction)(void (*)(void))req_exception, METH_VARARGS | METH_KEYWORDS,
	 "exception(timeout=None): the transfer's exception, or None."},
	{"done", (PyCFunction)req_done, METH_NOARGS, "done() -> bool: finished? Never blocks."},
	{"running", (PyCFunction)req_running, METH_NOARGS, "running() -> bool: not finished yet."},
	{"cancel", (PyCFunction)req_false, METH_NOARGS,
	 "cancel() -> False: a submitted transfer cannot be cancelled."},
	{"cancelled", (PyCFunction)req_false, METH_NOARGS, "cancelled() -> False."},
	{NULL},
};

static PyObject *req_nbytes(RequestObject *r, void *closure)
{
	return PyLong_FromSize_t(r->buf.len);
}

static PyObject *req_offset(RequestObject *r, void *closure)
{
	return PyLong_FromUnsignedLongLong(r->offset);
}

static PyObject *req_file(RequestObject *r, void *closure)
{
	return Py_NewRef((PyObject *)r->file);
}

static PyGetSetDef req_getset[] = {
	{"nbytes", (getter)req_nbytes, NULL, "Length of the transfer in bytes.", NULL},
	{"offset", (getter)req_offset, NULL, "File offset of the transfer.", NULL},
	{"file", (getter)req_file, NULL, "The File the transfer is on.", NULL},
	{NULL},
};

static PyTypeObject RequestType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry._ferry.Request",
	.tp_basicsize = sizeof(RequestObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "An asynchronous transfer in flight (ferry_req); ferry.Future extends it.",
	.tp_dealloc = (destructor)req_dealloc,
	.tp_repr = (reprfunc)req_repr,
	.tp_methods = req_methods,
	.tp_getset = req_getset,
};

static PyObject *file_transfer_async(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
				     PyObject *kwnames, int is_write)
{
	RequestObject *r;
	PyObject *obj;
	uint64_t off;
	int ret;

	if (parse_io(is_write ? "pwrite_from_async" : "pread_into_async", args, nargs, kwnames, &obj,
		     &off, NULL) < 0 || file_check(self) < 0)
		return NULL;
	r = (RequestObject *)future_type->tp_alloc(future_type, 0);
	if (!r)
		return NULL;
	if (fbuf_get(obj, &r->buf, !is_write, NULL) < 0) {
		Py_DECREF(r);
		return NULL;
	}
	r->file = (FileObject *)Py_NewRef((PyObject *)self);
	r->offset = off;
	r->is_write = is_write;
	/* Submission only queues work to the workers: it does not block, the GIL stays held. */
	if (is_write)
		ret = ferry_pwrite_async(self->f, r->buf.ptr, r->buf.len, off, &r->req);
	else
		ret = ferry_pread_async(self->f, r->buf.ptr, r->buf.len, off, &r->req);
	if (ret < 0) {
		r->req = NULL;
		fbuf_release(&r->buf);
		Py_DECREF(r);
		return raise_ferry(ret, self->name);
	}
	self->inflight++;
	return (PyObject *)r;
}

/* A CUstream from an int, torch.cuda.Stream (.cuda_stream), CuPy (.ptr) or __cuda_stream__. */
static int get_stream(PyObject *o, void **out)
{
	PyObject *v = NULL;

	if (PyLong_Check(o)) {
		v = Py_NewRef(o);
	} else if (PyObject_HasAttrString(o, "__cuda_stream__")) {
		PyObject *t = PyObject_CallMethod(o, "__cuda_stream__", NULL);
		if (!t)
			return -1;
		if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 2)
			v = Py_NewRef(PyTuple_GET_ITEM(t, 1));
		Py_DECREF(t);
	} else if (PyObject_HasAttrString(o, "cuda_stream")) {
		v = PyObject_GetAttrString(o, "cuda_stream");
	} else if (PyObject_HasAttrString(o, "ptr")) {
		v = PyObject_GetAttrString(o, "ptr");
	}
	if (!v || !PyLong_Check(v)) {
		Py_XDECREF(v);
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "stream must be an int (a CUstream), a "
				     "torch.cuda.Stream or a cupy.cuda.Stream, not %.100s",
				     Py_TYPE(o)->tp_name);
		return -1;
	}
	*out = PyLong_AsVoidPtr(v);
	Py_DECREF(v);
	return PyErr_Occurred() ? -1 : 0;
}

/*
 * Stream-ordered futures the caller dropped: kept here until they finish, so that dropping one
 * neither blocks the host (a dealloc would wait) nor frees the buffer under the transfer.
 */
static PyObject *stream_pending;

static int keep_until_done(RequestObject *r)
{
	Py_ssize_t i, n;

	if (!stream_pending && !(stream_pending = PyList_New(0)))
		return -1;
	n = PyList_GET_SIZE(stream_pending);
	for (i = n - 1; i >= 0; i--) {
		RequestObject *p = (RequestObject *)PyList_GET_ITEM(stream_pending, i);
		if (req_wait(p, 0) && PySequence_DelItem(stream_pending, i) < 0)
			return -1;
	}
	return PyList_Append(stream_pending, (PyObject *)r);
}

static PyObject *file_transfer_stream(FileObject *self, PyObject *obj, uint64_t off,
				      PyObject *stream, int is_write)
{
	RequestObject *r;
	PyObject *dl_stream;
	void *cu;
	int ret;

	if (get_stream(stream, &cu) < 0)
		return NULL;
	/* DLPack's stream numbers: 1 is the legacy default stream (0 is ambiguous there). */
	dl_stream = PyLong_FromVoidPtr(cu ? cu : (void *)1);
	if (!dl_stream)
		return NULL;
	r = (RequestObject *)future_type->tp_alloc(future_type, 0);
	if (!r || fbuf_get(obj, &r->buf, !is_write, dl_stream) < 0) {
		Py_DECREF(dl_stream);
		Py_XDECREF(r);
		return NULL;
	}
	Py_DECREF(dl_stream);
	r->file = (FileObject *)Py_NewRef((PyObject *)self);
	r->offset = off;
	r->is_write = is_write;
	if (is_write)
		ret = ferry_pwrite_stream(self->f, r->buf.ptr, r->buf.len, off, cu, &r->req);
	else
		ret = ferry_pread_stream(self->f, r->buf.ptr, r->buf.len, off, cu, &r->req);
	if (ret < 0) {
		r->req = NULL;
		fbuf_release(&r->buf);
		Py_DECREF(r);
		return raise_ferry(ret, self->name);
	}
	self->inflight++;
	if (keep_until_done(r) < 0) {
		Py_DECREF(r);
		return NULL;
	}
	return (PyObject *)r;
}

static PyObject *file_pread_into_async(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
				       PyObject *kwnames)
{
	return file_transfer_async(self, args, nargs, kwnames, 0);
}

static PyObject *file_pwrite_from_async(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
					PyObject *kwnames)
{
	return file_transfer_async(self, args, nargs, kwnames, 1);
}

/* -------------------------------------------------------------------------------------- batches */

static int batch_entry(PyObject *item, PyObject *deffile, ContextObject *ctx, FileObject **fo,
		       uint64_t *off, PyObject **buf)
{
	Py_ssize_t want = deffile ? 2 : 3;

	if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != want) {
		PyErr_Format(PyExc_TypeError, "a batch entry must be a tuple %s, not %.100s",
			     deffile ? "(offset, buffer)" : "(file, offset, buffer)",
			     Py_TYPE(item)->tp_name);
		return -1;
	}
	*fo = (FileObject *)(deffile ? deffile : PyTuple_GET_ITEM(item, 0));
	if (!PyObject_TypeCheck((PyObject *)*fo, &FileType)) {
		PyErr_Format(PyExc_TypeError, "a batch entry's file must be a ferry.File, not %.100s",
			     Py_TYPE(*fo)->tp_name);
		return -1;
	}
	if (file_check(*fo) < 0)
		return -1;
	if ((*fo)->ctx != ctx) {
		PyErr_Format(PyExc_ValueError, "%R belongs to another context than the batch",
			     (*fo)->name);
		return -1;
	}
	*buf = PyTuple_GET_ITEM(item, want - 1);
	return get_offset(PyTuple_GET_ITEM(item, want - 2), off);
}

static PyObject *run_batch(ContextObject *ctx, PyObject *deffile, PyObject *entries, int is_write)
{
	PyObject *seq, *out = NULL;
	struct fbuf *bufs = NULL;
	FileObject **files = NULL;
	ferry_batch *b = NULL;
	Py_ssize_t n, got = 0, i;
	int ret;

	seq = PySequence_Fast(entries, "batch entries must be a sequence of tuples");
	if (!seq)
		return NULL;
	n = PySequence_Fast_GET_SIZE(seq);
	bufs = PyMem_Calloc((size_t)n + 1, sizeof(*bufs));
	files = PyMem_Calloc((size_t)n + 1, sizeof(*files));
	if (!bufs || !files) {
		PyErr_NoMemory();
		goto out;
	}
	ret = ferry_batch_create(ctx->ctx, &b);
	if (ret < 0) {
		raise_ferry(ret, NULL);
		goto out;
	}
	for (got = 0; got < n; got++) {
		PyObject *obj;
		uint64_t off;
		FileObject *fo;

		if (batch_entry(PySequence_Fast_GET_ITEM(seq, got), deffile, ctx, &fo, &off, &obj) < 0 ||
		    fbuf_get(obj, &bufs[got], !is_write, NULL) < 0) {
			PyObject *type, *value, *tb;
			PyErr_Fetch(&type, &value, &tb);
			PyErr_NormalizeException(&type, &value, &tb);
			PyObject *note = PyUnicode_FromFormat("batch entry %zd", got);
			if (note) {
				PyObject *r = PyObject_CallMethod(value, "add_note", "O", note);
				Py_XDECREF(r);
				PyErr_Clear();
				Py_DECREF(note);
			}
			PyErr_Restore(type, value, tb);
			goto out;
		}
		files[got] = fo;
		fo->inflight++;
		ret = is_write ? ferry_batch_add_write(b, fo->f, off, bufs[got].len, bufs[got].ptr)
			       : ferry_batch_add_read(b, fo->f, off, bufs[got].len, bufs[got].ptr);
		if (ret < 0) {
			got++;
			raise_ferry(ret, fo->name);
			goto out;
		}
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ferry_batch_submit(b);
	if (ret == 0)
		ret = ferry_batch_wait(b, -1);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		raise_ferry(ret, NULL);
		goto out;
	}
	out = PyList_New(n);
	if (!out)
		goto out;
	for (i = 0; i < n; i++) {
		PyObject *v = PyLong_FromSsize_t(ferry_batch_result(b, (size_t)i));
		if (!v) {
			Py_CLEAR(out);
			goto out;
		}
		PyList_SET_ITEM(out, i, v);
	}
out:
	ferry_batch_destroy(b);
	for (i = 0; i < got; i++) {
		fbuf_release(&bufs[i]);
		if (files[i])
			files[i]->inflight--;
	}
	PyMem_Free(bufs);
	PyMem_Free(files);
	Py_DECREF(seq);
	return out;
}

static PyObject *file_read_batch(FileObject *self, PyObject *entries)
{
	if (file_check(self) < 0)
		return NULL;
	return run_batch(self->ctx, (PyObject *)self, entries, 0);
}

static PyObject *file_write_batch(FileObject *self, PyObject *entries)
{
	if (file_check(self) < 0)
		return NULL;
	return run_batch(self->ctx, (PyObject *)self, entries, 1);
}

/* ------------------------------------------------------------------------------- File, the rest */

static PyObject *file_path_info(FileObject *self, PyObject *unused)
{
	char buf[2048];

	if (file_check(self) < 0)
		return NULL;
	ferry_file_path_info(self->f, buf, sizeof(buf));
	return PyUnicode_FromString(buf);
}

static PyObject *file_sync(FileObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"full", NULL};
	int full = 0, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:sync", kwlist, &full) || file_check(self) < 0)
		return NULL;
	self->inflight++;
	Py_BEGIN_ALLOW_THREADS
	ret = ferry_file_sync(self->f, full);
	Py_END_ALLOW_THREADS
	self->inflight--;
	if (ret < 0)
		return raise_ferry(ret, self->name);
	Py_RETURN_NONE;
}

static PyObject *file_truncate(FileObject *self, PyObject *arg)
{
	uint64_t size;
	int ret;

	if (get_offset(arg, &size) < 0 || file_check(self) < 0)
		return NULL;
	ret = ferry_file_truncate(self->f, size);
	if (ret < 0)
		return raise_ferry(ret, self->name);
	Py_RETURN_NONE;
}

static PyObject *file_enter(FileObject *self, PyObject *unused)
{
	if (file_check(self) < 0)
		return NULL;
	return Py_NewRef((PyObject *)self);
}

static PyObject *file_exit(FileObject *self, PyObject *args)
{
	return file_close(self, NULL);
}

static PyObject *file_size(FileObject *self, void *closure)
{
	int64_t n;

	if (file_check(self) < 0)
		return NULL;
	n = ferry_file_size(self->f);
	if (n < 0)
		return raise_ferry((int)n, self->name);
	return PyLong_FromLongLong(n);
}

static PyObject *file_block_size(FileObject *self, void *closure)
{
	if (file_check(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(ferry_file_block_size(self->f));
}

static PyObject *file_mem_align(FileObject *self, void *closure)
{
	if (file_check(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(ferry_file_mem_align(self->f));
}

static PyObject *file_is_direct(FileObject *self, void *closure)
{
	if (file_check(self) < 0)
		return NULL;
	return PyBool_FromLong(ferry_file_is_direct(self->f));
}

static PyObject *file_closed(FileObject *self, void *closure)
{
	return PyBool_FromLong(self->f == NULL);
}

static PyObject *file_name(FileObject *self, void *closure)
{
	return Py_NewRef(self->name);
}

static PyObject *file_mode(FileObject *self, void *closure)
{
	return Py_NewRef(self->mode);
}

static PyObject *file_context(FileObject *self, void *closure)
{
	return Py_NewRef((PyObject *)self->ctx);
}

static PyObject *file_repr(FileObject *self)
{
	return PyUnicode_FromFormat("<ferry.File %R mode=%R%s>", self->name, self->mode,
				    self->f ? "" : " closed");
}

#define FASTKW(fn) (PyCFunction)(void (*)(void))(fn), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef file_methods[] = {
	{"pread_into", FASTKW(file_pread_into),
	 "pread_into(buf, offset=0, *, stream=None) -> int: reads len(buf) bytes at offset into buf "
	 "(host or CUDA memory, zero-copy); returns the bytes read, fewer only at end of file.\n"
	 "With stream (torch.cuda.Stream, cupy Stream or a CUstream int) and device memory: the read "
	 "is ordered on that stream and a Future is returned at once."},
	{"pwrite_from", FASTKW(file_pwrite_from),
	 "pwrite_from(buf, offset=0, *, stream=None) -> int: writes all of buf at offset; returns "
	 "its length. With stream: ordered after the work queued on it; returns a Future."},
	{"pread_into_async", FASTKW(file_pread_into_async),
	 "pread_into_async(buf, offset=0) -> Future: starts the read and returns at once."},
	{"pwrite_from_async", FASTKW(file_pwrite_from_async),
	 "pwrite_from_async(buf, offset=0) -> Future: starts the write and returns at once."},
	{"read_batch", (PyCFunction)file_read_batch, METH_O,
	 "read_batch([(offset, buf), ...]) -> list[int]: reads every entry as one submission; "
	 "returns each entry's byte count."},
	{"pread_batch", (PyCFunction)file_read_batch, METH_O, "Same as read_batch."},
	{"write_batch", (PyCFunction)file_write_batch, METH_O,
	 "write_batch([(offset, buf), ...]) -> list[int]: writes every entry as one submission."},
	{"path_info", (PyCFunction)file_path_info, METH_NOARGS,
	 "path_info() -> str: how ferry reads this file (descriptors, alignment, backend, fallbacks)."},
	{"sync", (PyCFunction)(void (*)(void))file_sync, METH_VARARGS | METH_KEYWORDS,
	 "sync(full=False): fdatasync, or fsync with full=True."},
	{"truncate", (PyCFunction)file_truncate, METH_O, "truncate(size): ftruncate."},
	{"close", (PyCFunction)file_close, METH_NOARGS,
	 "close(): closes the file; fails while an operation is in flight. Idempotent."},
	{"__enter__", (PyCFunction)file_enter, METH_NOARGS, NULL},
	{"__exit__", (PyCFunction)file_exit, METH_VARARGS, NULL},
	{NULL},
};

static PyGetSetDef file_getset[] = {
	{"size", (getter)file_size, NULL, "Current size in bytes (fstat).", NULL},
	{"block_size", (getter)file_block_size, NULL, "Logical block size O_DIRECT must respect.", NULL},
	{"mem_align", (getter)file_mem_align, NULL, "Memory alignment O_DIRECT needs.", NULL},
	{"is_direct", (getter)file_is_direct, NULL, "True if an O_DIRECT descriptor is open.", NULL},
	{"closed", (getter)file_closed, NULL, "True once closed.", NULL},
	{"name", (getter)file_name, NULL, "The path the file was opened with.", NULL},
	{"mode", (getter)file_mode, NULL, "The mode the file was opened with.", NULL},
	{"context", (getter)file_context, NULL, "The Context the file belongs to.", NULL},
	{NULL},
};

static PyTypeObject FileType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry.File",
	.tp_basicsize = sizeof(FileObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A file opened by ferry.open(): positional, zero-copy reads and writes.",
	.tp_dealloc = (destructor)file_dealloc,
	.tp_repr = (reprfunc)file_repr,
	.tp_methods = file_methods,
	.tp_getset = file_getset,
};

/* ------------------------------------------------------------------------------------- module */

static PyObject *mod_open(PyObject *mod, PyObject *args)
{
	ContextObject *ctx;
	PyObject *name, *mode, *bpath = NULL;
	FileObject *self;
	ferry_file *f = NULL;
	int flags, ret;

	if (!PyArg_ParseTuple(args, "O!OiU:open", &ContextType, &ctx, &name, &flags, &mode) ||
	    !PyUnicode_FSConverter(name, &bpath))
		return NULL;
	const char *path = PyBytes_AS_STRING(bpath);
	Py_BEGIN_ALLOW_THREADS
	ret = ferry_file_open(ctx->ctx, path, flags, &f);
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (ret < 0)
		return raise_ferry(ret, name);
	self = PyObject_New(FileObject, &FileType);
	if (!self) {
		ferry_file_destroy(f);
		return NULL;
	}
	self->f = f;
	self->ctx = (ContextObject *)Py_NewRef((PyObject *)ctx);
	self->name = Py_NewRef(name);
	self->mode = Py_NewRef(mode);
	self->inflight = 0;
	return (PyObject *)self;
}

static PyObject *mod_set_future_type(PyObject *mod, PyObject *cls)
{
	if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &RequestType)) {
		PyErr_SetString(PyExc_TypeError, "the future type must subclass _ferry.Request");
		return NULL;
	}
	Py_INCREF(cls);
	if (future_type != &RequestType)
		Py_DECREF(future_type);
	future_type = (PyTypeObject *)cls;
	Py_RETURN_NONE;
}

static PyObject *mod_buffer_info(PyObject *mod, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"obj", "writable", NULL};
	PyObject *obj, *d;
	int writable = 0;
	struct fbuf b;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:buffer_info", kwlist, &obj, &writable) ||
	    fbuf_get(obj, &b, writable, NULL) < 0)
		return NULL;
	static const char *const how[] = {"none", "buffer", "dlpack", "dlpack", "cuda_array_interface"};
	d = Py_BuildValue("{s:K,s:n,s:s,s:i,s:s}", "ptr", (unsigned long long)(uintptr_t)b.ptr,
			  "nbytes", (Py_ssize_t)b.len, "memory", b.cuda ? "cuda" : "host", "device",
			  b.device, "protocol", how[b.how]);
	fbuf_release(&b);
	return d;
}

static PyObject *mod_gpu_available(PyObject *mod, PyObject *unused)
{
	char why[1024] = "";
	int ok;

	Py_BEGIN_ALLOW_THREADS
	ok = ferry_gpu_available(why, sizeof(why));
	Py_END_ALLOW_THREADS
	return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why);
}

static PyObject *mod_gpu_count(PyObject *mod, PyObject *unused)
{
	int n;

	Py_BEGIN_ALLOW_THREADS
	n = ferry_gpu_count();
	Py_END_ALLOW_THREADS
	if (n < 0)
		return raise_ferry(n, NULL);
	return PyLong_FromLong(n);
}

static PyObject *mod_gds_status(PyObject *mod, PyObject *arg)
{
	PyObject *bpath = NULL;
	char why[1024] = "";
	int ret;

	if (!PyUnicode_FSConverter(arg, &bpath))
		return NULL;
	const char *path = PyBytes_AS_STRING(bpath);
	Py_BEGIN_ALLOW_THREADS
	ret = ferry_gds_status(path, why, sizeof(why));
	Py_END_ALLOW_THREADS
	Py_DECREF(bpath);
	if (ret < 0)
		return raise_ferry(ret, arg);
	return Py_BuildValue("(is)", ret, why);
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
	int code = (int)PyLong_AsLong(arg);

	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ferry_strerror(code));
}

static PyObject *mod_err_name(PyObject *mod, PyObject *arg)
{
	int code = (int)PyLong_AsLong(arg);

	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ferry_err_name(code));
}

static PyObject *mod_keys(PyObject *mod, PyObject *unused)
{
	const char *const *k = ferry_ctx_keys();
	PyObject *t;
	Py_ssize_t n = 0;

	while (k[n])
		n++;
	t = PyTuple_New(n);
	for (Py_ssize_t i = 0; t && i < n; i++) {
		PyObject *s = PyUnicode_FromString(k[i]);
		if (!s) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, i, s);
	}
	return t;
}

static PyObject *mod_backend_unavailable_reason(PyObject *mod, PyObject *arg)
{
	const char *name = PyUnicode_AsUTF8(arg);

	if (!name)
		return NULL;
	return PyUnicode_FromString(ferry_backend_unavailable_reason(name));
}

static PyMethodDef mod_methods[] = {
	{"open", mod_open, METH_VARARGS, "open(context, path, flags, mode) -> File (use ferry.open)."},
	{"buffer_info", (PyCFunction)(void (*)(void))mod_buffer_info, METH_VARARGS | METH_KEYWORDS,
	 "buffer_info(obj, writable=False) -> dict: how ferry sees a buffer (ptr, nbytes, memory, "
	 "device, protocol), without copying it."},
	{"gpu_available", mod_gpu_available, METH_NOARGS,
	 "gpu_available() -> (bool, str): whether a CUDA device can be used, and why not."},
	{"gpu_count", mod_gpu_count, METH_NOARGS, "gpu_count() -> int: visible CUDA devices."},
	{"gds_status", mod_gds_status, METH_O,
	 "gds_status(path) -> (int, str): GDS_NATIVE, GDS_COMPAT or GDS_REFUSED, and why."},
	{"strerror", mod_strerror, METH_O, "strerror(code) -> str"},
	{"err_name", mod_err_name, METH_O, "err_name(code) -> str"},
	{"keys", mod_keys, METH_NOARGS, "keys() -> tuple[str, ...]: the knob names."},
	{"backend_unavailable_reason", mod_backend_unavailable_reason, METH_O,
	 "backend_unavailable_reason(name) -> str: why a backend cannot run here ('' if it can)."},
	{"_set_future_type", mod_set_future_type, METH_O, NULL},
	{NULL},
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT,
	.m_name = "ferry._ferry",
	.m_doc = "The C extension under the ferry package (public C API only).",
	.m_size = -1,
	.m_methods = mod_methods,
};

/* -------------------------------------------------- for the extension's other C files (_ferry.h) */

/* ferry__py_raise: defined in the data section below. */
ferry_ctx *ferry__py_ctx(PyObject *obj)
{
	if (!PyObject_TypeCheck(obj, &ContextType)) {
		PyErr_Format(PyExc_TypeError, "expected a ferry.Context, not %.100s", Py_TYPE(obj)->tp_name);
		return NULL;
	}
	return ((ContextObject *)obj)->ctx;
}

static const struct {
	const char *name;
	int code;
} error_codes[] = {
#define FERRY__XX(name, code, msg) {"FERRY_" #name, code},
	FERRY_ERRNO_MAP(FERRY__XX)
#undef FERRY__XX
};

static int add_int(PyObject *m, const char *name, long v)
{
	return PyModule_AddIntConstant(m, name, v);
}

/* --- data (issue 6): python/ferry/_data.c uses the error mapping and adds its types --- */
int ferry__py_data_init(PyObject *m);
PyObject *ferry__py_raise(int err, PyObject *filename) { return raise_ferry(err, filename); }
/* --- end data --- */

PyMODINIT_FUNC PyInit__ferry(void)
{
	PyObject *m, *codes;

	if (PyType_Ready(&ContextType) < 0 || PyType_Ready(&FileType) < 0 ||
	    PyType_Ready(&RequestType) < 0)
		return NULL;
	str_dlpack = PyUnicode_InternFromString("__dlpack__");
	str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
	str_cai = PyUnicode_InternFromString("__cuda_array_interface__");
	str_stream = PyUnicode_InternFromString("stream");
	str_max_version = PyUnicode_InternFromString("max_version");
	max_version_1 = Py_BuildValue("(ii)", 1, 0);
	if (!str_dlpack || !str_dlpack_device || !str_cai || !str_stream || !str_max_version ||
	    !max_version_1)
		return NULL;
	m = PyModule_Create(&moddef);
	if (!m)
		return NULL;
	ferry_error_type = PyErr_NewExceptionWithDoc(
		"ferry.Error",
		"A failure that errno cannot name (no GPU, GDS refused, corrupt data, a CUDA or cuFile "
		"call failed, a bad option, ...). A subclass of OSError; .code is ferry's negative code, "
		".name its symbol (FERRY_ENOGDS), .strerror the detail naming file, offset and call.",
		PyExc_OSError, NULL);
	codes = PyDict_New();
	if (!ferry_error_type || !codes || PyModule_AddObjectRef(m, "Error", ferry_error_type) < 0 ||
	    PyModule_AddObjectRef(m, "Context", (PyObject *)&ContextType) < 0 ||
	    PyModule_AddObjectRef(m, "File", (PyObject *)&FileType) < 0 ||
	    PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
	    PyModule_AddStringConstant(m, "version", ferry_version()) < 0)
		goto fail;
	for (size_t i = 0; i < sizeof(error_codes) / sizeof(error_codes[0]); i++) {
		PyObject *v = PyLong_FromLong(error_codes[i].code);
		int bad = !v || PyModule_AddObjectRef(m, error_codes[i].name + 6, v) < 0 ||
			  PyDict_SetItemString(codes, error_codes[i].name, v) < 0;

		Py_XDECREF(v);
		if (bad)
			goto fail;
	}
	if (PyModule_AddObjectRef(m, "ERROR_CODES", codes) < 0 ||
	    add_int(m, "O_RDONLY", FERRY_O_RDONLY) < 0 || add_int(m, "O_WRONLY", FERRY_O_WRONLY) < 0 ||
	    add_int(m, "O_RDWR", FERRY_O_RDWR) < 0 || add_int(m, "O_CREAT", FERRY_O_CREAT) < 0 ||
	    add_int(m, "O_TRUNC", FERRY_O_TRUNC) < 0 || add_int(m, "O_EXCL", FERRY_O_EXCL) < 0 ||
	    add_int(m, "O_BUFFERED", FERRY_O_BUFFERED) < 0 ||
	    add_int(m, "GDS_REFUSED", FERRY_GDS_REFUSED) < 0 ||
	    add_int(m, "GDS_NATIVE", FERRY_GDS_NATIVE) < 0 ||
	    add_int(m, "GDS_COMPAT", FERRY_GDS_COMPAT) < 0)
		goto fail;
	if (ferry__py_data_init(m) < 0) /* data (issue 6) */
		goto fail;
	Py_DECREF(codes);
	if (ferry__py_ckpt_init(m) < 0) /* safetensors and checkpoints: _ckpt.c */
		goto fail_m;
	return m;
fail:
	Py_XDECREF(codes);
fail_m:
	Py_DECREF(m);
	return NULL;
}
