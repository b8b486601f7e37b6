/*
 * ferry._ferry.CompressedFile, compress_file and cz_is_compressed: a thin layer over
 * include/ferry/compress.h (docs/FORMATS.md). Reads go into any buffer ferry.File takes (host or
 * CUDA); the C library decides how they decode and says so in path_info().
 */
#include "_ferry.h"

#include <errno.h>
#include <stdlib.h>

#include "ferry/compress.h"

typedef struct {
	PyObject_HEAD
	ferry_cz *z; /* NULL once closed */
	PyObject *ctx, *path;
	Py_ssize_t inflight;
} CzObject;

static PyTypeObject CzType;

static int64_t cz_open(ferry_ctx *ctx, const char *path, void *arg)
{
	return ferry_cz_open(ctx, path, (ferry_cz **)arg);
}

static PyObject *cz_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"context", "path", NULL};
	PyObject *ctx, *path;
	ferry_cz *z = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:CompressedFile", kwlist, &ctx, &path) ||
	    ferry__py_path_call(ctx, path, cz_open, &z) < 0)
		return NULL;
	CzObject *self = (CzObject *)type->tp_alloc(type, 0);
	if (!self) {
		ferry_cz_destroy(z);
		return NULL;
	}
	self->z = z;
	self->ctx = Py_NewRef(ctx);
	self->path = PyOS_FSPath(path);
	if (!self->path) {
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

static void cz_dealloc(CzObject *self)
{
	ferry_cz_destroy(self->z);
	Py_XDECREF(self->ctx);
	Py_XDECREF(self->path);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int cz_check(CzObject *self)
{
	return ferry__py_closed(self->z, "compressed file %R is closed", self->path);
}

static PyObject *cz_close(CzObject *self, PyObject *unused)
{
	if (self->z && ferry__py_busy(self->inflight, "compressed file %R has a read in flight", self->path) < 0)
		return NULL;
	ferry_cz_destroy(self->z);
	self->z = NULL;
	Py_RETURN_NONE;
}

static PyObject *cz_enter(CzObject *self, PyObject *unused)
{
	if (cz_check(self) < 0)
		return NULL;
	return Py_NewRef((PyObject *)self);
}

static PyObject *cz_exit(CzObject *self, PyObject *args)
{
	return cz_close(self, NULL);
}

static PyObject *cz_pread_into(CzObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"buf", "offset", NULL};
	PyObject *obj, *offo = NULL;
	uint64_t off = 0;
	struct ferry__py_buf b;
	ssize_t n;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:pread_into", kwlist, &obj, &offo) ||
	    (offo && ferry__py_u64(offo, "offset", &off) < 0) || cz_check(self) < 0 ||
	    ferry__py_buf_get(obj, &b, 1, NULL) < 0)
		return NULL;
	FERRY_PY_NOGIL(&self->inflight, n, ferry_cz_pread(self->z, b.ptr, b.len, off));
	ferry__py_buf_release(&b);
	if (ferry__py_failed(n, self->path))
		return NULL;
	return PyLong_FromSsize_t(n);
}

static PyObject *cz_set(CzObject *self, PyObject *args)
{
	const char *key, *value;
	if (!PyArg_ParseTuple(args, "ss:set", &key, &value) || cz_check(self) < 0)
		return NULL;
	if (ferry__py_failed(ferry_cz_set(self->z, key, value), self->path))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *cz_path_info(CzObject *self, PyObject *unused)
{
	char buf[512];
	if (cz_check(self) < 0)
		return NULL;
	ferry_cz_path_info(self->z, buf, sizeof(buf));
	return PyUnicode_FromString(buf);
}

static PyObject *cz_get(CzObject *self, void *which)
{
	if (cz_check(self) < 0)
		return NULL;
	switch ((intptr_t)which) {
	case 0: return PyLong_FromLongLong(ferry_cz_size(self->z));
	case 1: return PyLong_FromLongLong(ferry_cz_compressed_size(self->z));
	case 2: return PyUnicode_FromString(ferry_cz_codec_name(ferry_cz_codec(self->z)));
	case 3: return PyLong_FromLongLong(ferry_cz_chunk_size(self->z));
	case 4: return PyLong_FromLongLong(ferry_cz_chunks(self->z));
	case 5: return PyLong_FromLongLong(ferry_cz_stored_chunks(self->z));
	default: return Py_NewRef(self->path);
	}
}

static PyObject *cz_closed(CzObject *self, void *unused)
{
	return PyBool_FromLong(self->z == NULL);
}

static PyObject *cz_repr(CzObject *self)
{
	if (!self->z)
		return PyUnicode_FromFormat("<ferry.CompressedFile %R (closed)>", self->path);
	return PyUnicode_FromFormat("<ferry.CompressedFile %R %s, %lld bytes in %lld>", self->path,
				    ferry_cz_codec_name(ferry_cz_codec(self->z)), (long long)ferry_cz_size(self->z),
				    (long long)ferry_cz_compressed_size(self->z));
}

static PyMethodDef cz_methods[] = {
	{"pread_into", (PyCFunction)(void (*)(void))cz_pread_into, METH_VARARGS | METH_KEYWORDS,
	 "pread_into(buf, offset=0) -> int: reads uncompressed bytes into buf (host or CUDA memory), decoding "
	 "only the chunks covered; fewer bytes only at the end."},
	{"set", (PyCFunction)cz_set, METH_VARARGS, "set(key, value): a reader knob (cz_threads, cz_verify, cz_gpu)."},
	{"path_info", (PyCFunction)cz_path_info, METH_NOARGS,
	 "path_info() -> str: how the last read decoded: cpu, or nvcomp, and why not nvcomp."},
	{"close", (PyCFunction)cz_close, METH_NOARGS, "close(): closes the file (again: nothing)."},
	{"__enter__", (PyCFunction)cz_enter, METH_NOARGS, NULL},
	{"__exit__", (PyCFunction)cz_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef cz_getset[] = {
	{"size", (getter)cz_get, NULL, "uncompressed bytes", (void *)0},
	{"compressed_size", (getter)cz_get, NULL, "bytes of the chunks' frames", (void *)1},
	{"codec", (getter)cz_get, NULL, "'zstd' or 'lz4'", (void *)2},
	{"chunk_size", (getter)cz_get, NULL, "uncompressed bytes per chunk", (void *)3},
	{"chunks", (getter)cz_get, NULL, "number of chunks", (void *)4},
	{"stored_chunks", (getter)cz_get, NULL, "chunks stored uncompressed", (void *)5},
	{"name", (getter)cz_get, NULL, "the path it was opened with", (void *)6},
	{"closed", (getter)cz_closed, NULL, "True once closed", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CzType = {
	FERRY_PY_TYPE("ferry._ferry.CompressedFile", CzObject, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
		      "CompressedFile(context, path): a ferry compressed file opened for reading "
		      "(ferry_cz_open: the trailer and index checked)."),
	.tp_new = cz_new,
	.tp_dealloc = (destructor)cz_dealloc,
	.tp_repr = (reprfunc)cz_repr,
	.tp_methods = cz_methods,
	.tp_getset = cz_getset,
};

/* ------------------------------------------------------------------------------- functions */

struct compress_args {
	int codec;
	const char *dst, *level, *chunk, *threads;
	int excl;
};

/* src (through ctx: a path or a URL) into a new compressed file dst; its size, or an error. */
static int64_t compress(ferry_ctx *ctx, const char *src, void *arg)
{
	struct compress_args *a = arg;
	ferry_file *f = NULL;
	ferry_cz_writer *w = NULL;
	const size_t block = 64u << 20;
	char *buf = malloc(block);
	int64_t r = buf ? ferry_file_open(ctx, src, FERRY_O_RDONLY, &f) : -ENOMEM;
	int64_t size = r ? 0 : ferry_file_size(f);
	if (!r && size < 0)
		r = size;
	if (!r)
		r = ferry_cz_writer_create(a->dst, a->codec, a->excl ? FERRY_CZ_EXCL : 0, &w);
	if (!r && a->level)
		r = ferry_cz_writer_set(w, "cz_level", a->level);
	if (!r && a->chunk)
		r = ferry_cz_writer_set(w, "cz_chunk", a->chunk);
	if (!r && a->threads)
		r = ferry_cz_writer_set(w, "cz_threads", a->threads);
	for (uint64_t off = 0; !r && off < (uint64_t)size;) {
		ssize_t k = ferry_pread(f, buf, block, off);
		if (k <= 0)
			r = k < 0 ? k : -EIO;
		else
			r = ferry_cz_writer_write(w, buf, (size_t)k);
		off += k > 0 ? (uint64_t)k : 0;
	}
	if (!r)
		r = ferry_cz_writer_commit(w);
	ferry_cz_writer_destroy(w);
	ferry_file_destroy(f);
	free(buf);
	return r;
}

static int text_arg(PyObject *o, char *buf, size_t len, const char **out)
{
	*out = NULL;
	if (!o || o == Py_None)
		return 0;
	PyObject *s = PyObject_Str(o);
	if (!s)
		return -1;
	const char *t = PyUnicode_AsUTF8(s);
	if (t)
		snprintf(buf, len, "%s", t);
	Py_DECREF(s);
	*out = t ? buf : NULL;
	return t ? 0 : -1;
}

static PyObject *py_compress_file(PyObject *mod, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"context", "src", "dst", "codec", "level", "chunk", "threads", "exclusive", NULL};
	PyObject *ctx, *src, *dst, *level = NULL, *chunk = NULL, *threads = NULL, *bdst = NULL;
	const char *codec;
	int excl = 0;
	char lb[32], cb[64], tb[32];
	struct compress_args a = {0};

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOs|OOOp:compress_file", kwlist, &ctx, &src, &dst, &codec,
					 &level, &chunk, &threads, &excl) ||
	    text_arg(level, lb, sizeof(lb), &a.level) < 0 || text_arg(chunk, cb, sizeof(cb), &a.chunk) < 0 ||
	    text_arg(threads, tb, sizeof(tb), &a.threads) < 0 || !PyUnicode_FSConverter(dst, &bdst))
		return NULL;
	if ((a.codec = ferry_cz_codec_from_name(codec)) < 0) {
		Py_DECREF(bdst);
		PyErr_Format(PyExc_ValueError, "codec must be 'zstd' or 'lz4', not '%s'", codec);
		return NULL;
	}
	a.dst = PyBytes_AS_STRING(bdst);
	a.excl = excl;
	int64_t r = ferry__py_path_call(ctx, src, compress, &a);
	Py_DECREF(bdst);
	return r < 0 ? NULL : PyLong_FromLongLong(r);
}

static int64_t is_compressed(ferry_ctx *ctx, const char *path, void *arg)
{
	return ferry_cz_is_compressed(ctx, path);
}

static PyObject *py_cz_is_compressed(PyObject *mod, PyObject *args)
{
	PyObject *ctx, *path;
	if (!PyArg_ParseTuple(args, "OO:cz_is_compressed", &ctx, &path))
		return NULL;
	int64_t r = ferry__py_path_call(ctx, path, is_compressed, NULL);
	return r < 0 ? NULL : PyBool_FromLong(r == 1);
}

static PyMethodDef cz_functions[] = {
	{"compress_file", (PyCFunction)(void (*)(void))py_compress_file, METH_VARARGS | METH_KEYWORDS,
	 "compress_file(context, src, dst, codec, level=None, chunk=None, threads=None, exclusive=False) -> int: "
	 "writes src as a ferry compressed file at dst; returns dst's size."},
	{"cz_is_compressed", py_cz_is_compressed, METH_VARARGS,
	 "cz_is_compressed(context, path) -> bool: path ends in a compressed file's trailer."},
	{NULL, NULL, 0, NULL},
};

int ferry__py_cz_init(PyObject *m)
{
	if (PyType_Ready(&CzType) < 0 || PyModule_AddObjectRef(m, "CompressedFile", (PyObject *)&CzType) < 0 ||
	    PyModule_AddFunctions(m, cz_functions) < 0)
		return -1;
	return 0;
}
