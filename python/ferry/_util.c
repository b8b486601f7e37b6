/*
 * _ferry's shared helpers (declared in _ferry.h): errors as exceptions, blocking calls on paths,
 * the closed and busy checks, DLPack export, and the one path by which every part of the
 * extension takes a buffer zero-copy. docs/PYTHON.md has the buffer rules.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "_ferry.h"

/* ------------------------------------------------------------------------------------- errors */

static PyObject *ferry_error_type; /* ferry.Error, a subclass of OSError */

/*
 * Raises the exception for err (negative): an OSError subclass picked by errno (OSError's
 * constructor does that), or ferry.Error for ferry's own codes. The message is the thread's
 * ferry_last_error() detail, which names the call, file and offset.
 */
PyObject *ferry__py_raise(int err, PyObject *filename)
{
	return ferry__py_raise_detail(err, filename, ferry_last_error());
}

PyObject *ferry__py_raise_detail(int err, PyObject *filename, const char *detail)
{
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

int ferry__py_failed(int64_t r, PyObject *filename)
{
	if (r >= 0)
		return 0;
	ferry__py_raise((int)r, filename);
	return 1;
}

int ferry__py_errors_init(PyObject *m)
{
	ferry_error_type = PyErr_NewExceptionWithDoc(
		"ferry.Error",
		"A failure that errno cannot name (no GPU, GDS refused, corrupt data, a CUDA or cuFile "
		"call failed, a bad option, ...). A subclass of OSError; .code is ferry's negative code, "
		".name its symbol (FERRY_ENOGDS), .strerror the detail naming file, offset and call.",
		PyExc_OSError, NULL);
	if (!ferry_error_type || PyModule_AddObjectRef(m, "Error", ferry_error_type) < 0)
		return -1;
	return 0;
}

/* ------------------------------------------------------------------------------ calls on paths */

int64_t ferry__py_path_call(PyObject *ctxo, PyObject *pathobj, ferry__py_path_fn fn, void *arg)
{
	ferry_ctx *ctx = NULL;
	PyObject *bpath = NULL;
	int64_t r;

	if ((ctxo && !(ctx = ferry__py_ctx(ctxo))) || !PyUnicode_FSConverter(pathobj, &bpath))
		return -1;
	const char *path = PyBytes_AS_STRING(bpath);
	FERRY_PY_NOGIL(NULL, r, fn(ctx, path, arg));
	Py_DECREF(bpath);
	return ferry__py_failed(r, pathobj) ? -1 : r;
}

/* ---------------------------------------------------------------------- closed and busy checks */

static int refuse(PyObject *type, const char *fmt, va_list ap)
{
	PyObject *msg = PyUnicode_FromFormatV(fmt, ap);

	if (msg) {
		PyErr_SetObject(type, msg);
		Py_DECREF(msg);
	}
	return -1;
}

int ferry__py_closed(const void *handle, const char *fmt, ...)
{
	va_list ap;
	int r;

	if (handle)
		return 0;
	va_start(ap, fmt);
	r = refuse(PyExc_ValueError, fmt, ap);
	va_end(ap);
	return r;
}

int ferry__py_busy(Py_ssize_t busy, const char *fmt, ...)
{
	va_list ap;
	int r;

	if (!busy)
		return 0;
	va_start(ap, fmt);
	r = refuse(PyExc_RuntimeError, fmt, ap);
	va_end(ap);
	return r;
}

/* ------------------------------------------------------------------------ arguments and values */

int ferry__py_u64(PyObject *o, const char *what, uint64_t *out)
{
	unsigned long long v;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(o)->tp_name);
		return -1;
	}
	if (_PyLong_Sign(o) < 0) {
		PyErr_Format(PyExc_ValueError, "%s must not be negative", what);
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(o);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "%s must be below 2**64", what);
		}
		return -1;
	}
	*out = v;
	return 0;
}

int ferry__py_timeout(PyObject *o, int64_t *ns)
{
	if (!o || o == Py_None) {
		*ns = -1;
		return 0;
	}
	double s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	*ns = s <= 0 ? 0 : s > 9e9 ? -1 : (int64_t)(s * 1e9);
	return 0;
}

static PyObject *sequence(int list, Py_ssize_t n, ferry__py_item_fn item, const void *arg)
{
	n = n < 0 ? 0 : n;
	PyObject *t = list ? PyList_New(n) : PyTuple_New(n);

	for (Py_ssize_t k = 0; t && k < n; k++) {
		PyObject *x = item(k, arg);
		if (!x)
			Py_CLEAR(t);
		else if (list)
			PyList_SET_ITEM(t, k, x);
		else
			PyTuple_SET_ITEM(t, k, x);
	}
	return t;
}

PyObject *ferry__py_tuple(Py_ssize_t n, ferry__py_item_fn item, const void *arg)
{
	return sequence(0, n, item, arg);
}

PyObject *ferry__py_list(Py_ssize_t n, ferry__py_item_fn item, const void *arg)
{
	return sequence(1, n, item, arg);
}

PyObject *ferry__py_dict(Py_ssize_t n, ferry__py_entry_fn entry, const void *arg)
{
	PyObject *d = PyDict_New();

	for (Py_ssize_t i = 0; d && i < n; i++) {
		const char *key = NULL;
		PyObject *v = entry(i, arg, &key);
		if (!v || PyDict_SetItemString(d, key, v) < 0)
			Py_CLEAR(d);
		Py_XDECREF(v);
	}
	return d;
}

static PyObject *u64_at(Py_ssize_t i, const void *v)
{
	return PyLong_FromUnsignedLongLong(((const uint64_t *)v)[i]);
}

PyObject *ferry__py_u64_tuple(const uint64_t *v, int n)
{
	return ferry__py_tuple(n, u64_at, v);
}

/* ------------------------------------------------------------------------------ DLPack export */

static void capsule_destructor(PyObject *cap)
{
	/* Consumed capsules are renamed "used_dltensor" and belong to the consumer. */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
		if (m && m->deleter)
			m->deleter(m);
	}
}

PyObject *ferry__py_dl_export(dl_managed *m, void *data, int device, int ndim)
{
	m->t.data = data;
	m->t.device.device_type = device >= 0 ? DL_CUDA : DL_CPU;
	m->t.device.device_id = device >= 0 ? device : 0;
	m->t.ndim = ndim;
	m->t.strides = NULL;
	m->t.byte_offset = 0;
	PyObject *cap = PyCapsule_New(m, "dltensor", capsule_destructor);
	if (!cap)
		m->deleter(m);
	return cap;
}

/* ------------------------------------------------------------------------------------ buffers */

void ferry__py_buf_release(struct ferry__py_buf *b)
{
	switch (b->how) {
	case FERRY_PY_BUF_VIEW:
		PyBuffer_Release(&b->view);
		break;
	case FERRY_PY_BUF_DLPACK: {
		dl_managed *m = b->managed;
		if (m->deleter)
			m->deleter(m);
		break;
	}
	case FERRY_PY_BUF_DLPACK_V1: {
		dl_managed_versioned *m = b->managed;
		if (m->deleter)
			m->deleter(m);
		break;
	}
	}
	b->how = FERRY_PY_BUF_NONE;
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

static int from_view(PyObject *obj, struct ferry__py_buf *b, int writable)
{
	int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);

	if (PyObject_GetBuffer(obj, &b->view, flags) == 0) {
		b->ptr = b->view.buf;
		b->len = (size_t)b->view.len;
		b->how = FERRY_PY_BUF_VIEW;
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

static int dl_check(const dl_tensor *t, PyObject *obj, struct ferry__py_buf *b, int writable)
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
static int from_capsule(PyObject *cap, PyObject *obj, struct ferry__py_buf *b, int writable)
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
	b->how = v1 ? FERRY_PY_BUF_DLPACK_V1 : FERRY_PY_BUF_DLPACK;
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
static int from_dlpack(PyObject *obj, PyObject *meth, struct ferry__py_buf *b, int writable, PyObject *stream)
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

static int from_cai(PyObject *obj, PyObject *cai, struct ferry__py_buf *b, int writable)
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
	b->how = FERRY_PY_BUF_CAI;
	return 0;
bad:
	PyErr_Format(PyExc_TypeError, "%.100s.__cuda_array_interface__ is malformed",
		     Py_TYPE(obj)->tp_name);
	return -1;
}

/*
 * Resolves obj into an address and a length, zero-copy, and keeps it alive (b->owner) until
 * ferry__py_buf_release(). writable: the buffer is a read's destination. stream: passed to __dlpack__
 * for CUDA producers (NULL: -1, no synchronization).
 */
int ferry__py_buf_get(PyObject *obj, struct ferry__py_buf *b, int writable, PyObject *stream)
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

int ferry__py_host_buf(PyObject *obj, struct ferry__py_buf *b, int writable, size_t need, const char *what)
{
	if (ferry__py_buf_get(obj, b, writable, NULL) < 0)
		return -1;
	if (b->cuda) {
		PyErr_Format(PyExc_TypeError, "%s: the buffer (%.100s) is in CUDA memory; host memory is "
			     "needed", what, Py_TYPE(obj)->tp_name);
	} else if (b->len < need) {
		PyErr_Format(PyExc_ValueError, "%s: the buffer holds %zu bytes, %zu are needed", what,
			     b->len, need);
	} else {
		return 0;
	}
	ferry__py_buf_release(b);
	return -1;
}

int ferry__py_buf_init(void)
{
	str_dlpack = PyUnicode_InternFromString("__dlpack__");
	str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
	str_cai = PyUnicode_InternFromString("__cuda_array_interface__");
	str_stream = PyUnicode_InternFromString("stream");
	str_max_version = PyUnicode_InternFromString("max_version");
	max_version_1 = Py_BuildValue("(ii)", 1, 0);
	return str_dlpack && str_dlpack_device && str_cai && str_stream && str_max_version &&
	       max_version_1 ? 0 : -1;
}
