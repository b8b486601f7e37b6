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
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "_ferry.h"

/* -------------------------------------------------------------------------------- arguments */

/*
 * (buf, offset=0, *, stream=None) from a vectorcall. Written out by hand: the 4 KiB call's cost
 * is mostly argument handling (+0.4 us over the same ferry_pread from C's 1.2 us).
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
	return ooff ? ferry__py_u64(ooff, "offset", off) : 0;
}

/* ---------------------------------------------------------------------------- torch tensors */

/*
 * torch.Tensor without DLPack: torch's __dlpack__ (Python code) took 11-12 us a tensor on the
 * 2-core VM where NumPy's buffer protocol takes 0.6: most of a per-piece future's or a batch
 * entry's cost (issue 22). data_ptr(), nbytes and the checks DLPack makes (no grad, no conj or
 * neg bit, contiguous, CPU or CUDA) take about 1 us. Anything else (a subclass, a stream to
 * order with, a tensor DLPack would refuse) goes the general way, which says why.
 */
static PyTypeObject *torch_tensor; /* torch.Tensor, once one was seen */
static PyObject *s_requires_grad, *s_is_contiguous, *s_is_conj, *s_is_neg, *s_is_cuda, *s_is_cpu,
	*s_get_device, *s_data_ptr, *s_nbytes;

static int is_torch_tensor(PyObject *obj)
{
	PyTypeObject *t = Py_TYPE(obj);

	if (torch_tensor)
		return t == torch_tensor;
	if (strcmp(t->tp_name, "Tensor") || !t->tp_base || strcmp(t->tp_base->tp_name, "torch._C.TensorBase"))
		return 0;
	if (!s_requires_grad) {
		s_requires_grad = PyUnicode_InternFromString("requires_grad");
		s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
		s_is_conj = PyUnicode_InternFromString("is_conj");
		s_is_neg = PyUnicode_InternFromString("is_neg");
		s_is_cuda = PyUnicode_InternFromString("is_cuda");
		s_is_cpu = PyUnicode_InternFromString("is_cpu");
		s_get_device = PyUnicode_InternFromString("get_device");
		s_data_ptr = PyUnicode_InternFromString("data_ptr");
		s_nbytes = PyUnicode_InternFromString("nbytes");
		if (!s_requires_grad || !s_is_contiguous || !s_is_conj || !s_is_neg || !s_is_cuda ||
		    !s_is_cpu || !s_get_device || !s_data_ptr || !s_nbytes) {
			PyErr_Clear();
			return 0;
		}
	}
	torch_tensor = (PyTypeObject *)Py_NewRef((PyObject *)t);
	return 1;
}

/* 1 when obj's attribute (call: method) is True, 0 False, -1 anything else. */
static int torch_flag(PyObject *obj, PyObject *name, int call)
{
	PyObject *v = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
	int r = v == Py_True ? 1 : v == Py_False ? 0 : -1;

	Py_XDECREF(v);
	return r;
}

/* 1 with b set, 0 when obj is not a tensor this path takes (no error set). */
static int torch_buf(PyObject *obj, struct ferry__py_buf *b)
{
	int cuda, cpu;
	long long dev = -1;
	unsigned long long ptr;
	Py_ssize_t n;
	PyObject *v;

	if (!is_torch_tensor(obj))
		return 0;
	if (torch_flag(obj, s_requires_grad, 0) != 0 || torch_flag(obj, s_is_conj, 1) != 0 ||
	    torch_flag(obj, s_is_neg, 1) != 0 || torch_flag(obj, s_is_contiguous, 1) != 1)
		goto other;
	cuda = torch_flag(obj, s_is_cuda, 0);
	cpu = torch_flag(obj, s_is_cpu, 0);
	if (cuda < 0 || cpu < 0 || cuda == cpu)
		goto other;
	if (cuda) {
		if (!(v = PyObject_CallMethodNoArgs(obj, s_get_device)))
			goto other;
		dev = PyLong_AsLongLong(v);
		Py_DECREF(v);
		if (dev < 0 || dev > INT_MAX)
			goto other;
	}
	if (!(v = PyObject_CallMethodNoArgs(obj, s_data_ptr)))
		goto other;
	ptr = PyLong_AsUnsignedLongLong(v);
	Py_DECREF(v);
	if (!(v = PyObject_GetAttr(obj, s_nbytes)))
		goto other;
	n = PyLong_AsSsize_t(v);
	Py_DECREF(v);
	if (PyErr_Occurred() || n < 0)
		goto other;
	memset(b, 0, sizeof(*b));
	b->ptr = (void *)(uintptr_t)ptr;
	b->len = (size_t)n;
	b->cuda = cuda;
	b->device = cuda ? (int)dev : -1;
	b->how = FERRY_PY_BUF_CAI; /* nothing to release but the reference */
	b->owner = Py_NewRef(obj);
	return 1;
other:
	PyErr_Clear();
	return 0;
}

/* ferry__py_buf_get, torch tensors first (stream: a stream-ordered call's, for __dlpack__). */
static int buf_get(PyObject *obj, struct ferry__py_buf *b, int writable, PyObject *stream)
{
	if (!stream && torch_buf(obj, b))
		return 0;
	return ferry__py_buf_get(obj, b, writable, stream);
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
		return ferry__py_raise(ret, NULL);
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
		return ferry__py_raise(ret, NULL);
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
		return ferry__py_raise(ret, NULL);
	return PyUnicode_FromString(buf);
}

static PyObject *context_start(ContextObject *self, PyObject *unused)
{
	int ret;

	FERRY_PY_NOGIL(NULL, ret, ferry_ctx_start(self->ctx));
	if (ferry__py_failed(ret, NULL))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *stat_at(Py_ssize_t i, const void *ctx, const char **key)
{
	*key = ferry_stat_name((enum ferry_stat)i);
	return PyLong_FromUnsignedLongLong(ferry_ctx_stat((ferry_ctx *)ctx, (enum ferry_stat)i));
}

static PyObject *context_stats(ContextObject *self, PyObject *unused)
{
	return ferry__py_dict(FERRY_STAT__COUNT, stat_at, self->ctx);
}

static PyObject *context_backend(ContextObject *self, void *closure)
{
	const char *name;

	FERRY_PY_NOGIL(NULL, name, ferry_ctx_backend(self->ctx));
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
	FERRY_PY_TYPE("ferry._ferry.Context", ContextObject, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
		      "A ferry context: knobs, workers, buffers and statistics (ferry_ctx)."),
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
	return ferry__py_closed(self->f, "I/O operation on closed file %R", self->name);
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
	if (ferry__py_busy(self->inflight, "cannot close %R: %zd operation(s) in flight (wait for "
			   "its futures first)", self->name, self->inflight) < 0)
		return NULL;
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
	struct ferry__py_buf b;
	ssize_t n;

	PyObject *stream;

	if (parse_io(is_write ? "pwrite_from" : "pread_into", args, nargs, kwnames, &obj, &off,
		     &stream) < 0 || file_check(self) < 0)
		return NULL;
	if (stream)
		return file_transfer_stream(self, obj, off, stream, is_write);
	if (buf_get(obj, &b, !is_write, NULL) < 0)
		return NULL;
	FERRY_PY_NOGIL(&self->inflight, n, is_write ? ferry_pwrite(self->f, b.ptr, b.len, off)
						    : ferry_pread(self->f, b.ptr, b.len, off));
	ferry__py_buf_release(&b);
	if (ferry__py_failed(n, self->name))
		return NULL;
	return PyLong_FromSsize_t(n);
}

/* The read and the write method of one transfer function. */
#define FILE_IO_METHODS(read, write, transfer)                                                      \
	static PyObject *read(FileObject *self, PyObject *const *args, Py_ssize_t nargs,             \
			      PyObject *kwnames)                                                    \
	{                                                                                           \
		return transfer(self, args, nargs, kwnames, 0);                                     \
	}                                                                                           \
	static PyObject *write(FileObject *self, PyObject *const *args, Py_ssize_t nargs,            \
			       PyObject *kwnames)                                                   \
	{                                                                                           \
		return transfer(self, args, nargs, kwnames, 1);                                     \
	}

FILE_IO_METHODS(file_pread_into, file_pwrite_from, file_transfer)

/* ------------------------------------------------------------------------------ Request/Future */

typedef struct {
	PyObject_HEAD
	ferry_req *req; /* NULL once freed */
	FileObject *file;
	struct ferry__py_buf buf;
	uint64_t offset;
	int is_write;
	Py_ssize_t waiters; /* threads inside ferry_req_wait with the GIL released */
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
	ferry__py_buf_release(&r->buf);
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

			ferry__py_raise((int)res, r->file->name);
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
		FERRY_PY_NOGIL(&r->waiters, res, ferry_req_wait(r->req, timeout_ns));
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
	return ferry__py_timeout(t, ns);
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

/* result(timeout) and exception(timeout): 0 once finished, else -1 with TimeoutError or another error. */
static int req_finish(RequestObject *r, PyObject *args, PyObject *kwds, const char *fmt)
{
	int64_t ns;

	if (get_timeout(args, kwds, fmt, &ns) < 0)
		return -1;
	if (!req_wait(r, ns)) {
		req_timeout(r);
		return -1;
	}
	return 0;
}

static PyObject *req_result(RequestObject *r, PyObject *args, PyObject *kwds)
{
	if (req_finish(r, args, kwds, "|O:result") < 0)
		return NULL;
	if (r->exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(r->exc), r->exc);
		return NULL;
	}
	return PyLong_FromSsize_t(r->result);
}

static PyObject *req_exception(RequestObject *r, PyObject *args, PyObject *kwds)
{
	if (req_finish(r, args, kwds, "|O:exception") < 0)
		return NULL;
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
		ferry__py_buf_release(&r->buf);
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
	FERRY_PY_TYPE("ferry._ferry.Request", RequestObject, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
		      "An asynchronous transfer in flight (ferry_req); ferry.Future extends it."),
	.tp_dealloc = (destructor)req_dealloc,
	.tp_repr = (reprfunc)req_repr,
	.tp_methods = req_methods,
	.tp_getset = req_getset,
};

/* A Future for a transfer of obj at off, its buffer taken (stream: for __dlpack__), not submitted. */
static RequestObject *req_new(FileObject *self, PyObject *obj, uint64_t off, int is_write, PyObject *stream)
{
	RequestObject *r = (RequestObject *)future_type->tp_alloc(future_type, 0);

	if (!r)
		return NULL;
	if (buf_get(obj, &r->buf, !is_write, stream) < 0) {
		Py_DECREF(r);
		return NULL;
	}
	r->file = (FileObject *)Py_NewRef((PyObject *)self);
	r->offset = off;
	r->is_write = is_write;
	return r;
}

/* After the submission: r, now in flight on its file; or NULL with its error raised (r dropped). */
static RequestObject *req_submitted(RequestObject *r, int ret)
{
	if (ret < 0) {
		r->req = NULL;
		ferry__py_buf_release(&r->buf);
		ferry__py_raise(ret, r->file->name);
		Py_DECREF(r);
		return NULL;
	}
	r->file->inflight++;
	return r;
}

static PyObject *file_transfer_async(FileObject *self, PyObject *const *args, Py_ssize_t nargs,
				     PyObject *kwnames, int is_write)
{
	RequestObject *r;
	PyObject *obj;
	uint64_t off;
	int ret;

	if (parse_io(is_write ? "pwrite_from_async" : "pread_into_async", args, nargs, kwnames, &obj,
		     &off, NULL) < 0 || file_check(self) < 0 || !(r = req_new(self, obj, off, is_write, NULL)))
		return NULL;
	/* Submission only queues work to the workers: it does not block, the GIL stays held. */
	if (is_write)
		ret = ferry_pwrite_async(self->f, r->buf.ptr, r->buf.len, off, &r->req);
	else
		ret = ferry_pread_async(self->f, r->buf.ptr, r->buf.len, off, &r->req);
	return (PyObject *)req_submitted(r, ret);
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
	r = req_new(self, obj, off, is_write, dl_stream);
	Py_DECREF(dl_stream);
	if (!r)
		return NULL;
	if (is_write)
		ret = ferry_pwrite_stream(self->f, r->buf.ptr, r->buf.len, off, cu, &r->req);
	else
		ret = ferry_pread_stream(self->f, r->buf.ptr, r->buf.len, off, cu, &r->req);
	if (!req_submitted(r, ret))
		return NULL;
	if (keep_until_done(r) < 0) {
		Py_DECREF(r);
		return NULL;
	}
	return (PyObject *)r;
}

FILE_IO_METHODS(file_pread_into_async, file_pwrite_from_async, file_transfer_async)

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
	return ferry__py_u64(PyTuple_GET_ITEM(item, want - 2), "offset", off);
}

/*
 * A batch goes to the engine in parts as its entries are converted, so that the workers read the
 * first pieces while the rest are: a first part of BATCH_PART_FIRST entries, the next ones twice
 * as long up to BATCH_PART_MAX (16 + 32 + 64 + 64 + 64 + 16 for 256 entries). Submitted whole,
 * the workers stood idle while every entry was converted (1-3 us each on the H200: 0.3-0.7 ms of a
 * 256-entry batch, 5-10% of one of 1 MiB pieces), and a list of 256 x 1 MiB was taken in shares
 * of a twelfth of it (ferry__take_share: 16 pieces, the queue's depth, of which a worker copies 4
 * at a time into GPU memory, cached_depth), so the batch ended with the slowest worker's backlog;
 * parts keep the list short and the shares a few pieces. The call still returns when every part
 * is done, with each entry's count, and raises the first failing entry's error, numbered in the
 * call.
 */
#define BATCH_PART_FIRST 16
#define BATCH_PART_MAX 64

struct batch_parts {
	ferry_batch **b;
	Py_ssize_t *base; /* the call's index of each part's first entry */
	int n, cap, submitted, waited;
};

static int parts_submit(struct batch_parts *ps)
{
	int ret;

	FERRY_PY_NOGIL(NULL, ret, ferry_batch_submit(ps->b[ps->n - 1]));
	if (ret == 0)
		ps->submitted = ps->n;
	return ret;
}

/* Waits for every submitted part (without the GIL); the first failure in entry order, its
 * detail in the thread's ferry_last_error(), or 0. */
static int parts_wait(struct batch_parts *ps, int *failed_part)
{
	int first = 0;

	*failed_part = -1;
	Py_BEGIN_ALLOW_THREADS
	for (int k = ps->waited; k < ps->submitted; k++) {
		int r = ferry_batch_wait(ps->b[k], -1);
		if (r < 0 && !first) {
			first = r;
			*failed_part = k;
		}
	}
	ps->waited = ps->submitted;
	if (first)
		ferry_batch_wait(ps->b[*failed_part], -1); /* done: only its detail, again */
	Py_END_ALLOW_THREADS
	return first;
}

/* The detail of a part's failure ends "; batch entry I", I within the part: the call's index. */
static void parts_raise(int err, const struct batch_parts *ps, int k)
{
	const char *d = ferry_last_error(), *tag = "; batch entry ", *at = NULL;
	char buf[4096];
	size_t i = 0;

	for (const char *p = d; (p = strstr(p, tag)); p++)
		at = p;
	if (at && (size_t)(at - d) < sizeof(buf) - 64) {
		i = strtoul(at + strlen(tag), NULL, 10);
		snprintf(buf, sizeof(buf), "%.*s%s%zd", (int)(at - d), d, tag, ps->base[k] + (Py_ssize_t)i);
		d = buf;
	}
	ferry__py_raise_detail(err, NULL, d);
}

static PyObject *run_batch(ContextObject *ctx, PyObject *deffile, PyObject *entries, int is_write)
{
	PyObject *seq, *out = NULL;
	struct ferry__py_buf *bufs = NULL;
	FileObject **files = NULL;
	struct batch_parts ps = {.n = 0};
	Py_ssize_t n, got = 0, i, part_len = BATCH_PART_FIRST;
	int ret, failed;

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
	for (got = 0; got < n; got++) {
		PyObject *obj;
		uint64_t off;
		FileObject *fo;

		if (!ps.n || (Py_ssize_t)ferry_batch_count(ps.b[ps.n - 1]) == part_len) {
			if (ps.n) {
				if ((ret = parts_submit(&ps)) < 0) {
					ferry__py_raise(ret, NULL);
					goto out;
				}
				part_len = part_len * 2 > BATCH_PART_MAX ? BATCH_PART_MAX : part_len * 2;
			}
			if (ps.n == ps.cap) {
				int cap = ps.cap ? ps.cap * 2 : 8;
				ferry_batch **nb = PyMem_Realloc(ps.b, (size_t)cap * sizeof(*nb));
				if (nb)
					ps.b = nb;
				Py_ssize_t *nbase = nb ? PyMem_Realloc(ps.base, (size_t)cap * sizeof(*nbase)) : NULL;
				if (!nb || !nbase) {
					PyErr_NoMemory();
					goto out;
				}
				ps.base = nbase;
				ps.cap = cap;
			}
			ret = ferry_batch_create(ctx->ctx, &ps.b[ps.n]);
			if (ret < 0) {
				ferry__py_raise(ret, NULL);
				goto out;
			}
			ps.base[ps.n++] = got;
		}
		if (batch_entry(PySequence_Fast_GET_ITEM(seq, got), deffile, ctx, &fo, &off, &obj) < 0 ||
		    buf_get(obj, &bufs[got], !is_write, NULL) < 0) {
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
		ferry_batch *b = ps.b[ps.n - 1];
		ret = is_write ? ferry_batch_add_write(b, fo->f, off, bufs[got].len, bufs[got].ptr)
			       : ferry_batch_add_read(b, fo->f, off, bufs[got].len, bufs[got].ptr);
		if (ret < 0) {
			got++;
			ferry__py_raise(ret, fo->name);
			goto out;
		}
	}
	if (ps.n > ps.submitted && (ret = parts_submit(&ps)) < 0) {
		ferry__py_raise(ret, NULL);
		goto out;
	}
	if ((ret = parts_wait(&ps, &failed)) < 0) {
		parts_raise(ret, &ps, failed);
		goto out;
	}
	out = PyList_New(n);
	if (!out)
		goto out;
	for (int k = 0; k < ps.n; k++) {
		Py_ssize_t m = (Py_ssize_t)ferry_batch_count(ps.b[k]);
		for (i = 0; i < m; i++) {
			PyObject *v = PyLong_FromSsize_t(ferry_batch_result(ps.b[k], (size_t)i));
			if (!v) {
				Py_CLEAR(out);
				goto out;
			}
			PyList_SET_ITEM(out, ps.base[k] + i, v);
		}
	}
out:
	/* parts still running (an entry after them failed to convert) write into the buffers that
	 * are released below: waited first, their errors dropped for the one raised */
	if (ps.waited < ps.submitted) {
		PyObject *type, *value, *tb;
		PyErr_Fetch(&type, &value, &tb);
		parts_wait(&ps, &failed);
		PyErr_Restore(type, value, tb);
	}
	for (int k = 0; k < ps.n; k++)
		ferry_batch_destroy(ps.b[k]);
	PyMem_Free(ps.b);
	PyMem_Free(ps.base);
	for (i = 0; i < got; i++) {
		ferry__py_buf_release(&bufs[i]);
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
	FERRY_PY_NOGIL(&self->inflight, ret, ferry_file_sync(self->f, full));
	if (ferry__py_failed(ret, self->name))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *file_truncate(FileObject *self, PyObject *arg)
{
	uint64_t size;
	int ret;

	if (ferry__py_u64(arg, "size", &size) < 0 || file_check(self) < 0)
		return NULL;
	ret = ferry_file_truncate(self->f, size);
	if (ret < 0)
		return ferry__py_raise(ret, self->name);
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
		return ferry__py_raise((int)n, self->name);
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
	FERRY_PY_TYPE("ferry.File", FileObject, Py_TPFLAGS_DEFAULT,
		      "A file opened by ferry.open(): positional, zero-copy reads and writes."),
	.tp_dealloc = (destructor)file_dealloc,
	.tp_repr = (reprfunc)file_repr,
	.tp_methods = file_methods,
	.tp_getset = file_getset,
};

/* -------------------------------------------------------------------------------- DurableFile */

/*
 * ferry_durable (ferry.h) for the Python writers that lay files out themselves (ferry.torch.save,
 * ferry.dcp): the temporary is written through `file` (a ferry.File: the engine's asynchronous and
 * GPU paths) or pwrite/write (host buffers), then committed or aborted.
 */
typedef struct {
	PyObject_HEAD
	ferry_durable *d;
	ContextObject *ctx;
	PyObject *path;
	PyObject *tmp;
	FileObject *file; /* opened on first use of .file */
	uint64_t pos;     /* write()'s offset */
	int committed;
} DurableObject;

static PyTypeObject DurableType;

struct durable_args {
	ferry_durable *d;
};

static int64_t durable_create(ferry_ctx *ctx, const char *path, void *arg)
{
	return ferry_durable_create(path, &((struct durable_args *)arg)->d);
}

static PyObject *durable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"path", "context", NULL};
	PyObject *path;
	ContextObject *ctx;
	struct durable_args a = {NULL};
	DurableObject *self;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!:DurableFile", kwlist, &path, &ContextType, &ctx) ||
	    ferry__py_path_call(NULL, path, durable_create, &a) < 0)
		return NULL;
	self = (DurableObject *)type->tp_alloc(type, 0);
	if (!self) {
		ferry_durable_destroy(a.d);
		return NULL;
	}
	self->d = a.d;
	self->ctx = (ContextObject *)Py_NewRef((PyObject *)ctx);
	self->path = PyOS_FSPath(path);
	self->tmp = PyUnicode_DecodeFSDefault(ferry_durable_tmp_path(a.d));
	if (!self->path || !self->tmp) {
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

/* Closes .file; 0, or -1 with RuntimeError while an operation is in flight on it. */
static int durable_close_file(DurableObject *self)
{
	PyObject *r;

	if (!self->file || !self->file->f)
		return 0;
	r = file_close(self->file, NULL);
	Py_XDECREF(r);
	return r ? 0 : -1;
}

static void durable_dealloc(DurableObject *self)
{
	if (self->file && self->file->f && !self->file->inflight) {
		ferry_file_destroy(self->file->f);
		self->file->f = NULL;
	}
	ferry_durable_destroy(self->d); /* not committed: its temporary goes */
	Py_XDECREF(self->file);
	Py_XDECREF(self->ctx);
	Py_XDECREF(self->path);
	Py_XDECREF(self->tmp);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int durable_check(DurableObject *self)
{
	return ferry__py_closed(self->d, "durable file %R already committed or aborted", self->path);
}

static PyObject *durable_file(DurableObject *self, void *closure)
{
	ferry_file *f;
	int r;

	if (self->file)
		return Py_NewRef((PyObject *)self->file);
	if (durable_check(self) < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, r, ferry_durable_open(self->d, self->ctx->ctx, FERRY_O_WRONLY, &f));
	if (r < 0)
		return ferry__py_raise(r, self->tmp);
	FileObject *fo = PyObject_New(FileObject, &FileType);
	if (!fo) {
		ferry_file_destroy(f);
		return NULL;
	}
	fo->f = f;
	fo->ctx = (ContextObject *)Py_NewRef((PyObject *)self->ctx);
	fo->name = Py_NewRef(self->tmp);
	fo->mode = PyUnicode_FromString("x");
	fo->inflight = 0;
	if (!fo->mode) {
		Py_DECREF(fo);
		return NULL;
	}
	self->file = fo;
	return Py_NewRef((PyObject *)fo);
}

static PyObject *durable_pwrite_at(DurableObject *self, PyObject *obj, uint64_t off, int advance)
{
	struct ferry__py_buf b;
	int64_t n;

	if (durable_check(self) < 0 || buf_get(obj, &b, 0, NULL) < 0)
		return NULL;
	if (b.cuda) {
		ferry__py_buf_release(&b);
		PyErr_SetString(PyExc_TypeError, "DurableFile.pwrite/write take host memory; write "
						 "device memory through .file");
		return NULL;
	}
	FERRY_PY_NOGIL(NULL, n, ferry_durable_pwrite(self->d, b.ptr, b.len, off));
	ferry__py_buf_release(&b);
	if (ferry__py_failed(n, self->tmp))
		return NULL;
	if (advance)
		self->pos = off + (uint64_t)n;
	return PyLong_FromLongLong(n);
}

static PyObject *durable_pwrite(DurableObject *self, PyObject *args)
{
	PyObject *obj, *offo;
	uint64_t off;

	if (!PyArg_ParseTuple(args, "OO:pwrite", &obj, &offo) || ferry__py_u64(offo, "offset", &off) < 0)
		return NULL;
	return durable_pwrite_at(self, obj, off, 0);
}

static PyObject *durable_write(DurableObject *self, PyObject *obj)
{
	return durable_pwrite_at(self, obj, self->pos, 1);
}

static PyObject *durable_commit(DurableObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"durable", "replace", NULL};
	int durable = 1, replace = 1, r;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pp:commit", kwlist, &durable, &replace) ||
	    durable_check(self) < 0 || durable_close_file(self) < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, r, ferry_durable_commit(self->d, (durable ? 0 : FERRY_DURABLE_NOSYNC) |
							      (replace ? 0 : FERRY_DURABLE_NOREPLACE)));
	ferry_durable_destroy(self->d); /* committed, or its temporary removed by the failure */
	self->d = NULL;
	self->committed = r == 0;
	if (ferry__py_failed(r, self->path))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *durable_abort(DurableObject *self, PyObject *unused)
{
	/* With writes still in flight on .file the temporary is unlinked all the same: they land in a
	 * file no name leads to, and the File closes when its last request is waited. */
	if (durable_close_file(self) < 0)
		PyErr_Clear();
	ferry_durable_destroy(self->d);
	self->d = NULL;
	Py_RETURN_NONE;
}

static PyObject *durable_enter(DurableObject *self, PyObject *unused)
{
	return Py_NewRef((PyObject *)self);
}

static PyObject *durable_exit(DurableObject *self, PyObject *args)
{
	return durable_abort(self, NULL); /* after a commit: nothing left to remove */
}

static PyObject *durable_get_path(DurableObject *self, void *closure)
{
	return Py_NewRef(self->path);
}

static PyObject *durable_get_tmp(DurableObject *self, void *closure)
{
	return Py_NewRef(self->tmp);
}

static PyObject *durable_closed(DurableObject *self, void *closure)
{
	return PyBool_FromLong(self->d == NULL);
}

static PyObject *durable_get_committed(DurableObject *self, void *closure)
{
	return PyBool_FromLong(self->committed);
}

static PyObject *durable_repr(DurableObject *self)
{
	return PyUnicode_FromFormat("<ferry._ferry.DurableFile %R%s>", self->path,
				    self->committed ? " committed" : self->d ? "" : " aborted");
}

static PyMethodDef durable_methods[] = {
	{"pwrite", (PyCFunction)durable_pwrite, METH_VARARGS,
	 "pwrite(buf, offset) -> int: writes all of buf (host memory) at offset of the temporary."},
	{"write", (PyCFunction)durable_write, METH_O,
	 "write(buf) -> int: writes buf (host memory) after the last write()."},
	{"commit", (PyCFunction)(void (*)(void))durable_commit, METH_VARARGS | METH_KEYWORDS,
	 "commit(durable=True, replace=True): closes .file, fsyncs, renames the temporary to path "
	 "and fsyncs the directory (durable=False: no fsyncs). replace=False: FileExistsError if "
	 "path exists, which is left as it is. A failed commit removes the temporary."},
	{"abort", (PyCFunction)durable_abort, METH_NOARGS,
	 "abort(): removes the temporary (nothing else); after a commit it does nothing."},
	{"__enter__", (PyCFunction)durable_enter, METH_NOARGS, NULL},
	{"__exit__", (PyCFunction)durable_exit, METH_VARARGS, "aborts unless committed"},
	{NULL},
};

static PyGetSetDef durable_getset[] = {
	{"file", (getter)durable_file, NULL, "The temporary as a ferry.File (opened on first use).", NULL},
	{"path", (getter)durable_get_path, NULL, "The path the file appears at when committed.", NULL},
	{"tmp", (getter)durable_get_tmp, NULL, "The temporary's path (.NAME.ferry-tmp-<random>).", NULL},
	{"closed", (getter)durable_closed, NULL, "True once committed or aborted.", NULL},
	{"committed", (getter)durable_get_committed, NULL, "True once committed.", NULL},
	{NULL},
};

static PyTypeObject DurableType = {
	FERRY_PY_TYPE("ferry._ferry.DurableFile", DurableObject, Py_TPFLAGS_DEFAULT,
		      "DurableFile(path, context): a new file that appears at path only complete "
		      "(ferry_durable_create: an exclusive, flocked temporary beside it; temporaries of "
		      "path's name left by killed writers are removed first)."),
	.tp_new = durable_new,
	.tp_dealloc = (destructor)durable_dealloc,
	.tp_repr = (reprfunc)durable_repr,
	.tp_methods = durable_methods,
	.tp_getset = durable_getset,
};

/* ------------------------------------------------------------------------------------- module */

struct file_open_args {
	int flags;
	ferry_file *f;
};

static int64_t file_open(ferry_ctx *ctx, const char *path, void *arg)
{
	struct file_open_args *a = arg;

	return ferry_file_open(ctx, path, a->flags, &a->f);
}

static PyObject *mod_open(PyObject *mod, PyObject *args)
{
	ContextObject *ctx;
	PyObject *name, *mode;
	FileObject *self;
	struct file_open_args a = {0, NULL};

	if (!PyArg_ParseTuple(args, "O!OiU:open", &ContextType, &ctx, &name, &a.flags, &mode) ||
	    ferry__py_path_call((PyObject *)ctx, name, file_open, &a) < 0)
		return NULL;
	ferry_file *f = a.f;
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
	struct ferry__py_buf b;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:buffer_info", kwlist, &obj, &writable) ||
	    ferry__py_buf_get(obj, &b, writable, NULL) < 0)
		return NULL;
	static const char *const how[] = {"none", "buffer", "dlpack", "dlpack", "cuda_array_interface"};
	d = Py_BuildValue("{s:K,s:n,s:s,s:i,s:s}", "ptr", (unsigned long long)(uintptr_t)b.ptr,
			  "nbytes", (Py_ssize_t)b.len, "memory", b.cuda ? "cuda" : "host", "device",
			  b.device, "protocol", how[b.how]);
	ferry__py_buf_release(&b);
	return d;
}

static PyObject *mod_gpu_available(PyObject *mod, PyObject *unused)
{
	char why[1024] = "";
	int ok;

	FERRY_PY_NOGIL(NULL, ok, ferry_gpu_available(why, sizeof(why)));
	return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why);
}

static PyObject *mod_gpu_count(PyObject *mod, PyObject *unused)
{
	int n;

	FERRY_PY_NOGIL(NULL, n, ferry_gpu_count());
	if (ferry__py_failed(n, NULL))
		return NULL;
	return PyLong_FromLong(n);
}

enum { WHY_LEN = 1024 };

static int64_t gds_status(ferry_ctx *unused, const char *path, void *why)
{
	return ferry_gds_status(path, why, WHY_LEN);
}

static PyObject *mod_gds_status(PyObject *mod, PyObject *arg)
{
	char why[WHY_LEN] = "";
	int64_t ret = ferry__py_path_call(NULL, arg, gds_status, why);

	if (ret < 0)
		return NULL;
	return Py_BuildValue("(Ls)", (long long)ret, why);
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

static PyObject *key_at(Py_ssize_t i, const void *keys)
{
	return PyUnicode_FromString(((const char *const *)keys)[i]);
}

static PyObject *mod_keys(PyObject *mod, PyObject *unused)
{
	const char *const *k = ferry_ctx_keys();
	Py_ssize_t n = 0;

	while (k[n])
		n++;
	return ferry__py_tuple(n, key_at, k);
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

PyMODINIT_FUNC PyInit__ferry(void)
{
	PyObject *m, *codes;

	if (PyType_Ready(&ContextType) < 0 || PyType_Ready(&FileType) < 0 ||
	    PyType_Ready(&RequestType) < 0 || PyType_Ready(&DurableType) < 0)
		return NULL;
	if (ferry__py_buf_init() < 0)
		return NULL;
	m = PyModule_Create(&moddef);
	if (!m)
		return NULL;
	codes = PyDict_New();
	if (!codes || ferry__py_errors_init(m) < 0 ||
	    PyModule_AddObjectRef(m, "Context", (PyObject *)&ContextType) < 0 ||
	    PyModule_AddObjectRef(m, "File", (PyObject *)&FileType) < 0 ||
	    PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
	    PyModule_AddObjectRef(m, "DurableFile", (PyObject *)&DurableType) < 0 ||
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
	if (ferry__py_data_init(m) < 0 || ferry__py_pack_init(m) < 0) /* data (issue 6), pack (21) */
		goto fail;
	if (ferry__py_cz_init(m) < 0) /* compressed files (issue 26): _cz.c */
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
