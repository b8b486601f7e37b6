/*
 * _ferry's training-data part (issue 6), over include/ferry/data.h only: datasets, the sample
 * orders, the dataset writer and the loader. The pure-Python face is ferry/data.py.
 *
 * Lifetimes. A dataset and a loader live in small C holders with atomic reference counts
 * (dshare, lshare) rather than in the Python objects, because a DLPack view of a batch may be
 * dropped by its consumer from any thread, without the GIL: its deleter only decrements a count.
 * The Python objects, each Batch and each view hold one reference; the last one closes.
 *
 * A Batch is one ferry_loader_batch, held (the pipeline will not refill its slot) until
 * release(). On a GPU, Batch.take() hands the batch's device memory itself to the consumer as a
 * DLPack tensor (ferry_loader_take; the slot gets other memory) whose deleter gives it back,
 * ordered after the consumer's stream. Views made by Batch.dlpack() point into the slot, so the
 * Python layer copies out of them (dtype conversions, host loaders) and releases the batch only
 * once that copy has completed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/data.h"
#include "ferry/ferry.h"

PyObject *ferry__py_raise(int err, PyObject *filename); /* _ferry.c */
int ferry__py_data_init(PyObject *m);

/* ------------------------------------------------------------------------------------ holders */

struct dshare {
	atomic_long refs;
	ferry_ctx *ctx;
	ferry_dataset *ds;
};

static void dshare_put(struct dshare *d)
{
	if (d && atomic_fetch_sub(&d->refs, 1) == 1) {
		ferry_dataset_destroy(d->ds);
		ferry_ctx_destroy(d->ctx);
		free(d);
	}
}

struct lshare {
	atomic_long refs;
	ferry_loader *l;
	struct dshare *d;
};

static void lshare_put(struct lshare *h)
{
	if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
		ferry_loader_destroy(h->l); /* joins the pipeline threads; touches no Python object */
		dshare_put(h->d);
		free(h);
	}
}

/* ------------------------------------------------------------------------------------ helpers */

static int get_u64(PyObject *o, const char *what, uint64_t *out)
{
	unsigned long long v = PyLong_AsUnsignedLongLong(o);

	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		if (PyErr_ExceptionMatches(PyExc_OverflowError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "%s must be a non-negative integer below 2**64", what);
		}
		return -1;
	}
	*out = v;
	return 0;
}

/* A writable C-contiguous buffer of at least need bytes. */
static int get_out(PyObject *o, Py_buffer *v, size_t need, const char *what)
{
	if (PyObject_GetBuffer(o, v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return -1;
	if ((size_t)v->len < need) {
		PyErr_Format(PyExc_ValueError, "%s: the buffer holds %zd bytes, %zu are needed", what,
			     v->len, need);
		PyBuffer_Release(v);
		return -1;
	}
	return 0;
}

/* ----------------------------------------------------------------------------------- Dataset */

typedef struct {
	PyObject_HEAD
	struct dshare *d;
	PyObject *path;
} DatasetObject;

static PyTypeObject DatasetType;

static int ds_check(DatasetObject *self)
{
	if (!self->d) {
		PyErr_SetString(PyExc_ValueError, "the dataset is closed");
		return -1;
	}
	return 0;
}

static PyObject *ds_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"path", "options", NULL};
	PyObject *path, *options = NULL, *bpath = NULL;
	struct dshare *d;
	int err;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:Dataset", kwlist, &path, &options) ||
	    !PyUnicode_FSConverter(path, &bpath))
		return NULL;
	d = calloc(1, sizeof(*d));
	if (!d) {
		Py_DECREF(bpath);
		return PyErr_NoMemory();
	}
	atomic_init(&d->refs, 1);
	err = ferry_ctx_create(&d->ctx);
	if (!err && options && options != Py_None) {
		PyObject *k, *v;
		Py_ssize_t pos = 0;

		if (!PyDict_Check(options)) {
			PyErr_SetString(PyExc_TypeError, "options must be a dict of knob name to text");
			goto fail;
		}
		while (!err && PyDict_Next(options, &pos, &k, &v)) {
			const char *ks = PyUnicode_AsUTF8(k), *vs = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
			if (!ks || !vs) {
				if (!PyErr_Occurred())
					PyErr_SetString(PyExc_TypeError, "options: values must be str");
				goto fail;
			}
			err = ferry_ctx_set(d->ctx, ks, vs);
		}
	}
	if (!err) {
		const char *p = PyBytes_AS_STRING(bpath);
		Py_BEGIN_ALLOW_THREADS
		err = ferry_dataset_open(d->ctx, p, &d->ds);
		Py_END_ALLOW_THREADS
	}
	if (err) {
		ferry__py_raise(err, path);
		goto fail;
	}
	Py_DECREF(bpath);
	DatasetObject *self = (DatasetObject *)type->tp_alloc(type, 0);
	if (!self) {
		dshare_put(d);
		return NULL;
	}
	self->d = d;
	self->path = Py_NewRef(path);
	return (PyObject *)self;
fail:
	Py_DECREF(bpath);
	dshare_put(d);
	return NULL;
}

static void ds_dealloc(DatasetObject *self)
{
	dshare_put(self->d);
	Py_XDECREF(self->path);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ds_close(DatasetObject *self, PyObject *unused)
{
	dshare_put(self->d);
	self->d = NULL;
	Py_RETURN_NONE;
}

static Py_ssize_t ds_len(DatasetObject *self)
{
	if (ds_check(self) < 0)
		return -1;
	return (Py_ssize_t)ferry_dataset_count(self->d->ds);
}

static int get_index(DatasetObject *self, PyObject *o, uint64_t *i)
{
	if (ds_check(self) < 0 || get_u64(o, "sample index", i) < 0)
		return -1;
	if (*i >= ferry_dataset_count(self->d->ds)) {
		PyErr_Format(PyExc_IndexError, "sample %llu out of range (%llu samples)",
			     (unsigned long long)*i, (unsigned long long)ferry_dataset_count(self->d->ds));
		return -1;
	}
	return 0;
}

static PyObject *ds_sample_bytes(DatasetObject *self, PyObject *arg)
{
	uint64_t i;

	if (get_index(self, arg, &i) < 0)
		return NULL;
	return PyLong_FromLongLong(ferry_dataset_sample_bytes(self->d->ds, i));
}

static PyObject *ds_read_into(DatasetObject *self, PyObject *args)
{
	PyObject *io, *buf;
	uint64_t i;
	Py_buffer v;
	ssize_t n;

	if (!PyArg_ParseTuple(args, "OO:read_into", &io, &buf) || get_index(self, io, &i) < 0)
		return NULL;
	if (get_out(buf, &v, (size_t)ferry_dataset_sample_bytes(self->d->ds, i), "read_into") < 0)
		return NULL;
	ferry_dataset *ds = self->d->ds;
	Py_BEGIN_ALLOW_THREADS
	n = ferry_dataset_read(ds, i, v.buf, (size_t)v.len);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&v);
	if (n < 0)
		return ferry__py_raise((int)n, self->path);
	return PyLong_FromSsize_t(n);
}

/* Every sample's length in bytes into an int64 buffer of count entries. */
static PyObject *ds_sizes_into(DatasetObject *self, PyObject *buf)
{
	Py_buffer v;

	if (ds_check(self) < 0)
		return NULL;
	uint64_t n = ferry_dataset_count(self->d->ds);
	if (get_out(buf, &v, n * sizeof(int64_t), "sizes_into") < 0)
		return NULL;
	int64_t *out = v.buf;
	for (uint64_t i = 0; i < n; i++)
		out[i] = ferry_dataset_sample_bytes(self->d->ds, i);
	PyBuffer_Release(&v);
	Py_RETURN_NONE;
}

/* Every sample's (shard, offset) into a uint32 and a uint64 buffer. */
static PyObject *ds_locate_into(DatasetObject *self, PyObject *args)
{
	PyObject *so, *oo;
	Py_buffer sv, ov;

	if (!PyArg_ParseTuple(args, "OO:locate_into", &so, &oo) || ds_check(self) < 0)
		return NULL;
	uint64_t n = ferry_dataset_count(self->d->ds);
	if (get_out(so, &sv, n * sizeof(uint32_t), "locate_into") < 0)
		return NULL;
	if (get_out(oo, &ov, n * sizeof(uint64_t), "locate_into") < 0) {
		PyBuffer_Release(&sv);
		return NULL;
	}
	uint32_t *s = sv.buf;
	uint64_t *o = ov.buf;
	int err = 0;
	for (uint64_t i = 0; i < n && !err; i++)
		err = ferry_dataset_locate(self->d->ds, i, &s[i], &o[i]);
	PyBuffer_Release(&sv);
	PyBuffer_Release(&ov);
	if (err)
		return ferry__py_raise(err, self->path);
	Py_RETURN_NONE;
}

static PyObject *ds_shard_path(DatasetObject *self, PyObject *arg)
{
	uint64_t k;

	if (ds_check(self) < 0 || get_u64(arg, "shard", &k) < 0)
		return NULL;
	const char *p = k <= UINT32_MAX ? ferry_dataset_shard_path(self->d->ds, (uint32_t)k) : NULL;
	if (!p) {
		PyErr_Format(PyExc_IndexError, "shard %llu out of range (%u shards)", (unsigned long long)k,
			     ferry_dataset_shards(self->d->ds));
		return NULL;
	}
	return PyUnicode_DecodeFSDefault(p);
}

static PyObject *ds_key(DatasetObject *self, PyObject *arg)
{
	uint64_t i;
	size_t len;

	if (get_index(self, arg, &i) < 0)
		return NULL;
	const char *k = ferry_dataset_key(self->d->ds, i, &len);
	if (!k)
		Py_RETURN_NONE;
	return PyBytes_FromStringAndSize(k, (Py_ssize_t)len);
}

static PyObject *ds_verify(DatasetObject *self, PyObject *unused)
{
	int err;

	if (ds_check(self) < 0)
		return NULL;
	ferry_dataset *ds = self->d->ds;
	Py_BEGIN_ALLOW_THREADS
	err = ferry_dataset_verify(ds);
	Py_END_ALLOW_THREADS
	if (err)
		return ferry__py_raise(err, self->path);
	Py_RETURN_NONE;
}

#define DS_GETTER(name, expr)                                                                 \
	static PyObject *ds_get_##name(DatasetObject *self, void *closure)                      \
	{                                                                                        \
		if (ds_check(self) < 0)                                                          \
			return NULL;                                                             \
		ferry_dataset *ds = self->d->ds;                                                 \
		return expr;                                                                     \
	}
DS_GETTER(count, PyLong_FromUnsignedLongLong(ferry_dataset_count(ds)))
DS_GETTER(dtype, PyLong_FromLong(ferry_dataset_dtype(ds)))
DS_GETTER(dtype_name, PyUnicode_FromString(ferry_elem_name(ferry_dataset_dtype(ds))))
DS_GETTER(format, PyUnicode_FromString(ferry_dataset_format(ds)))
DS_GETTER(nbytes, PyLong_FromUnsignedLongLong(ferry_dataset_bytes(ds)))
DS_GETTER(shards, PyLong_FromUnsignedLong(ferry_dataset_shards(ds)))
#undef DS_GETTER

static PyObject *ds_get_closed(DatasetObject *self, void *closure)
{
	return PyBool_FromLong(!self->d);
}

static PyObject *ds_get_path(DatasetObject *self, void *closure)
{
	return Py_NewRef(self->path);
}

static PyMethodDef ds_methods[] = {
	{"sample_bytes", (PyCFunction)ds_sample_bytes, METH_O, "sample_bytes(i) -> int"},
	{"read_into", (PyCFunction)ds_read_into, METH_VARARGS,
	 "read_into(i, buf) -> int: sample i's bytes into a writable buffer (GIL released)."},
	{"sizes_into", (PyCFunction)ds_sizes_into, METH_O, "sizes_into(int64 buffer[count]): bytes per sample."},
	{"locate_into", (PyCFunction)ds_locate_into, METH_VARARGS,
	 "locate_into(uint32 buffer[count], uint64 buffer[count]): each sample's shard and offset."},
	{"shard_path", (PyCFunction)ds_shard_path, METH_O, "shard_path(k) -> str"},
	{"key", (PyCFunction)ds_key, METH_O, "key(i) -> bytes | None"},
	{"verify", (PyCFunction)ds_verify, METH_NOARGS,
	 "verify(): re-read every shard and check its CRC-32C (ferry datasets)."},
	{"close", (PyCFunction)ds_close, METH_NOARGS, "close()"},
	{NULL},
};

static PyGetSetDef ds_getset[] = {
	{"count", (getter)ds_get_count, NULL, "samples", NULL},
	{"dtype", (getter)ds_get_dtype, NULL, "element type code (Megatron's numbering; 0 bytes)", NULL},
	{"dtype_name", (getter)ds_get_dtype_name, NULL, "element type name (NumPy's)", NULL},
	{"format", (getter)ds_get_format, NULL, "'ferry' or 'megatron'", NULL},
	{"nbytes", (getter)ds_get_nbytes, NULL, "bytes of all samples", NULL},
	{"shards", (getter)ds_get_shards, NULL, "data files", NULL},
	{"closed", (getter)ds_get_closed, NULL, NULL, NULL},
	{"path", (getter)ds_get_path, NULL, NULL, NULL},
	{NULL},
};

static PySequenceMethods ds_as_sequence = {
	.sq_length = (lenfunc)ds_len,
};

static PyTypeObject DatasetType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry._ferry.Dataset",
	.tp_basicsize = sizeof(DatasetObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "Dataset(path, options=None): a packed dataset (use ferry.IndexedDataset).",
	.tp_new = ds_new,
	.tp_dealloc = (destructor)ds_dealloc,
	.tp_methods = ds_methods,
	.tp_getset = ds_getset,
	.tp_as_sequence = &ds_as_sequence,
};

/* ------------------------------------------------------------------------------- DLPack views */

/* dlpack.h v0.8 (the unversioned capsule "dltensor", which every torch since 1.10 takes). */
typedef struct {
	void *data;
	struct {
		int32_t device_type, device_id;
	} device;
	int32_t ndim;
	struct {
		uint8_t code, bits;
		uint16_t lanes;
	} dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
	dl_tensor t;
	void *manager_ctx;
	void (*deleter)(struct dl_managed *self);
} dl_managed;

struct view {
	dl_managed m;
	int64_t shape[1];
	struct lshare *h;
};

static void view_delete(dl_managed *m)
{
	struct view *v = (struct view *)m;
	lshare_put(v->h);
	free(v);
}

static void capsule_destructor(PyObject *cap)
{
	/* Consumed capsules are renamed "used_dltensor" and belong to the consumer. */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
		if (m && m->deleter)
			m->deleter(m);
	}
}

/* DLPack type of a dataset element code. */
static int dl_type(int elem, uint8_t *code, uint8_t *bits)
{
	switch (elem) {
	case FERRY_ELEM_BYTES:
	case FERRY_ELEM_UINT8: *code = 1, *bits = 8; return 0;
	case FERRY_ELEM_INT8: *code = 0, *bits = 8; return 0;
	case FERRY_ELEM_INT16: *code = 0, *bits = 16; return 0;
	case FERRY_ELEM_UINT16: *code = 1, *bits = 16; return 0;
	case FERRY_ELEM_INT32: *code = 0, *bits = 32; return 0;
	case FERRY_ELEM_INT64: *code = 0, *bits = 64; return 0;
	case FERRY_ELEM_FLOAT32: *code = 2, *bits = 32; return 0;
	case FERRY_ELEM_FLOAT64: *code = 2, *bits = 64; return 0;
	}
	return -1;
}

/* ------------------------------------------------------------------------------------ Loader */

typedef struct {
	PyObject_HEAD
	struct lshare *h;
	PyObject *dataset;
	int device;
	int elem;
} LoaderObject;

typedef struct {
	PyObject_HEAD
	struct lshare *h;
	ferry_loader_batch *b;
	int device;
	int elem;
} BatchObject;

static PyTypeObject LoaderType, BatchType;

static int ld_check(LoaderObject *self)
{
	if (!self->h) {
		PyErr_SetString(PyExc_ValueError, "the loader is closed");
		return -1;
	}
	return 0;
}

static int ld_set1(LoaderObject *self, PyObject *k, PyObject *v)
{
	PyObject *vs = PyObject_Str(v);
	const char *ks = PyUnicode_AsUTF8(k), *vv = vs ? PyUnicode_AsUTF8(vs) : NULL;
	int err;

	if (ks && !strcmp(ks, "device")) {
		PyErr_SetString(PyExc_ValueError, "the device is the constructor's argument, not a knob");
		Py_XDECREF(vs);
		return -1;
	}
	if (!ks || !vv) {
		Py_XDECREF(vs);
		return -1;
	}
	err = ferry_loader_set(self->h->l, ks, vv);
	Py_DECREF(vs);
	if (err) {
		ferry__py_raise(err, NULL);
		return -1;
	}
	return 0;
}

static PyObject *ld_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"dataset", "knobs", "device", NULL};
	DatasetObject *ds;
	PyObject *knobs = NULL;
	int device = -1, err;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|Oi:Loader", kwlist, &DatasetType, &ds, &knobs,
					 &device) ||
	    ds_check(ds) < 0)
		return NULL;
	struct lshare *h = calloc(1, sizeof(*h));
	if (!h)
		return PyErr_NoMemory();
	atomic_init(&h->refs, 1);
	err = ferry_loader_create(ds->d->ds, &h->l);
	if (err) {
		free(h);
		return ferry__py_raise(err, NULL);
	}
	h->d = ds->d;
	atomic_fetch_add(&ds->d->refs, 1);
	LoaderObject *self = (LoaderObject *)type->tp_alloc(type, 0);
	if (!self) {
		lshare_put(h);
		return NULL;
	}
	self->h = h;
	self->dataset = Py_NewRef((PyObject *)ds);
	self->device = device;
	self->elem = ferry_dataset_dtype(ds->d->ds);
	if (device >= 0) {
		char dv[16];
		snprintf(dv, sizeof(dv), "%d", device);
		if ((err = ferry_loader_set(h->l, "device", dv))) {
			Py_DECREF(self);
			return ferry__py_raise(err, NULL);
		}
	}
	if (knobs && knobs != Py_None) {
		PyObject *k, *v;
		Py_ssize_t pos = 0;

		if (!PyDict_Check(knobs)) {
			Py_DECREF(self);
			PyErr_SetString(PyExc_TypeError, "knobs must be a dict");
			return NULL;
		}
		while (PyDict_Next(knobs, &pos, &k, &v)) {
			if (ld_set1(self, k, v) < 0) {
				Py_DECREF(self);
				return NULL;
			}
		}
	}
	return (PyObject *)self;
}

static void ld_dealloc(LoaderObject *self)
{
	struct lshare *h = self->h;
	self->h = NULL;
	if (h) {
		/* the last reference joins the pipeline threads: not while holding the GIL */
		Py_BEGIN_ALLOW_THREADS
		lshare_put(h);
		Py_END_ALLOW_THREADS
	}
	Py_XDECREF(self->dataset);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ld_close(LoaderObject *self, PyObject *unused)
{
	struct lshare *h = self->h;
	self->h = NULL;
	if (h) {
		Py_BEGIN_ALLOW_THREADS
		lshare_put(h);
		Py_END_ALLOW_THREADS
	}
	Py_RETURN_NONE;
}

static PyObject *ld_set(LoaderObject *self, PyObject *args)
{
	PyObject *k, *v;

	if (!PyArg_ParseTuple(args, "UO:set", &k, &v) || ld_check(self) < 0 || ld_set1(self, k, v) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *ld_start(LoaderObject *self, PyObject *unused)
{
	int err;

	if (ld_check(self) < 0)
		return NULL;
	ferry_loader *l = self->h->l;
	Py_BEGIN_ALLOW_THREADS
	err = ferry_loader_start(l);
	Py_END_ALLOW_THREADS
	if (err)
		return ferry__py_raise(err, NULL);
	Py_RETURN_NONE;
}

static PyObject *ld_next(LoaderObject *self, PyObject *unused)
{
	ferry_loader_batch *b = NULL;
	int r;

	if (ld_check(self) < 0)
		return NULL;
	ferry_loader *l = self->h->l;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_loader_next(l, &b);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return ferry__py_raise(r, NULL);
	if (r == 0)
		Py_RETURN_NONE;
	BatchObject *o = PyObject_New(BatchObject, &BatchType);
	if (!o) {
		ferry_loader_batch_destroy(b);
		return NULL;
	}
	o->h = self->h;
	atomic_fetch_add(&self->h->refs, 1);
	o->b = b;
	o->device = self->device;
	o->elem = self->elem;
	return (PyObject *)o;
}

static PyObject *ld_state(LoaderObject *self, PyObject *unused)
{
	char buf[1024];

	if (ld_check(self) < 0)
		return NULL;
	int n = ferry_loader_state(self->h->l, buf, sizeof(buf));
	if (n < 0)
		return ferry__py_raise(n, NULL);
	return PyUnicode_FromStringAndSize(buf, n);
}

static PyObject *ld_metrics(LoaderObject *self, PyObject *unused)
{
	if (ld_check(self) < 0)
		return NULL;
	PyObject *d = PyDict_New();
	for (const char *const *k = ferry_loader_metric_names(); d && *k; k++) {
		PyObject *v = PyFloat_FromDouble(ferry_loader_metric(self->h->l, *k));
		if (!v || PyDict_SetItemString(d, *k, v) < 0)
			Py_CLEAR(d);
		Py_XDECREF(v);
	}
	return d;
}

/* Per step waits (ns) as bytes of native uint64. */
static PyObject *ld_waits(LoaderObject *self, PyObject *unused)
{
	if (ld_check(self) < 0)
		return NULL;
	for (;;) {
		uint64_t n = ferry_loader_waits(self->h->l, NULL, 0);
		PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(uint64_t)));
		if (!b)
			return NULL;
		uint64_t got = ferry_loader_waits(self->h->l, (uint64_t *)PyBytes_AS_STRING(b), n);
		if (got <= n)
			return b; /* no step was added in between */
		Py_DECREF(b);
	}
}

static PyObject *ld_samples_per_epoch(LoaderObject *self, PyObject *unused)
{
	if (ld_check(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_loader_samples_per_epoch(self->h->l));
}

static PyObject *ld_batches_per_epoch(LoaderObject *self, PyObject *unused)
{
	if (ld_check(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_loader_batches_per_epoch(self->h->l));
}

static PyMethodDef ld_methods[] = {
	{"set", (PyCFunction)ld_set, METH_VARARGS, "set(key, value): a loader knob (before start)."},
	{"start", (PyCFunction)ld_start, METH_NOARGS, "start(): start the pipeline threads."},
	{"next", (PyCFunction)ld_next, METH_NOARGS,
	 "next() -> Batch | None: the next batch (blocks, GIL released), None after the last epoch."},
	{"state", (PyCFunction)ld_state, METH_NOARGS, "state() -> str: the resume line."},
	{"metrics", (PyCFunction)ld_metrics, METH_NOARGS, "metrics() -> dict[str, float]"},
	{"waits", (PyCFunction)ld_waits, METH_NOARGS, "waits() -> bytes: per step waits, uint64 ns."},
	{"samples_per_epoch", (PyCFunction)ld_samples_per_epoch, METH_NOARGS, NULL},
	{"batches_per_epoch", (PyCFunction)ld_batches_per_epoch, METH_NOARGS, NULL},
	{"close", (PyCFunction)ld_close, METH_NOARGS,
	 "close(): stop the pipeline (it finishes once no batch or view holds it)."},
	{NULL},
};

static PyTypeObject LoaderType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry._ferry.Loader",
	.tp_basicsize = sizeof(LoaderObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Loader(dataset, knobs=None, device=-1): the C loader (use ferry.Loader).",
	.tp_new = ld_new,
	.tp_dealloc = (destructor)ld_dealloc,
	.tp_methods = ld_methods,
};

/* ------------------------------------------------------------------------------------- Batch */

static int bt_check(BatchObject *self)
{
	if (!self->b) {
		PyErr_SetString(PyExc_ValueError, "the batch was released");
		return -1;
	}
	return 0;
}

static void bt_release_(BatchObject *self)
{
	if (self->b) {
		ferry_loader_batch_destroy(self->b);
		self->b = NULL;
	}
}

static void bt_dealloc(BatchObject *self)
{
	bt_release_(self);
	struct lshare *h = self->h;
	self->h = NULL;
	if (h) {
		Py_BEGIN_ALLOW_THREADS
		lshare_put(h);
		Py_END_ALLOW_THREADS
	}
	PyObject_Free(self);
}

static PyObject *bt_release(BatchObject *self, PyObject *unused)
{
	bt_release_(self);
	Py_RETURN_NONE;
}

/*
 * dlpack() -> a "dltensor" capsule: the batch's data as a 1-D tensor of the dataset's element type
 * (bytes as uint8), on the host or on the loader's CUDA device. It points into the slot: valid
 * until release(), whatever the capsule's consumer thinks (see the top of this file).
 */
static PyObject *bt_dlpack(BatchObject *self, PyObject *unused)
{
	uint8_t code, bits;

	if (bt_check(self) < 0)
		return NULL;
	if (dl_type(self->elem, &code, &bits) < 0) {
		PyErr_Format(PyExc_TypeError, "element type %d has no DLPack type", self->elem);
		return NULL;
	}
	struct view *v = calloc(1, sizeof(*v));
	if (!v)
		return PyErr_NoMemory();
	size_t esize = bits / 8;
	v->shape[0] = (int64_t)(ferry_loader_batch_bytes(self->b) / esize);
	v->m.t.data = ferry_loader_batch_data(self->b);
	v->m.t.device.device_type = self->device >= 0 ? 2 /* kDLCUDA */ : 1 /* kDLCPU */;
	v->m.t.device.device_id = self->device >= 0 ? self->device : 0;
	v->m.t.ndim = 1;
	v->m.t.dtype.code = code;
	v->m.t.dtype.bits = bits;
	v->m.t.dtype.lanes = 1;
	v->m.t.shape = v->shape;
	v->m.manager_ctx = v;
	v->m.deleter = view_delete;
	v->h = self->h;
	atomic_fetch_add(&self->h->refs, 1);
	PyObject *cap = PyCapsule_New(&v->m, "dltensor", capsule_destructor);
	if (!cap)
		view_delete(&v->m);
	return cap;
}

/* A batch's device memory taken from the loader (Batch.take), as a DLPack tensor whose deleter
 * gives it back in the order of the stream it was taken for. */
struct taken {
	dl_managed m;
	int64_t shape[2];
	ferry_loader_buffer *buf;
	uintptr_t stream;
};

static void taken_delete(dl_managed *m)
{
	struct taken *t = (struct taken *)m;
	/* any thread, GIL or not; an error cannot be reported here (the memory is freed instead) */
	(void)ferry_loader_buffer_destroy(t->buf, t->stream);
	free(t);
}

/*
 * take(stream, cols) -> "dltensor" capsule: the batch's device memory itself, no copy
 * (ferry_loader_take), shaped (nbytes / itemsize / cols, cols), or 1-D when cols is 0. The
 * memory belongs to the capsule's consumer and goes back to the loader when the consumer drops
 * it, ordered after the work queued on `stream` (an int CUstream, the consumer's current one)
 * by then: as memory allocated on that stream. The batch is released in every case.
 */
static PyObject *bt_take(BatchObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	uint8_t code, bits;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "take(stream, cols) takes 2 arguments");
		return NULL;
	}
	if (bt_check(self) < 0)
		return NULL;
	void *stream = PyLong_AsVoidPtr(args[0]);
	if (!stream && PyErr_Occurred())
		return NULL;
	Py_ssize_t cols = PyLong_AsSsize_t(args[1]);
	if (cols < 0) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "take: cols must be >= 0");
		return NULL;
	}
	if (dl_type(self->elem, &code, &bits) < 0) {
		PyErr_Format(PyExc_TypeError, "element type %d has no DLPack type", self->elem);
		return NULL;
	}
	struct taken *t = calloc(1, sizeof(*t));
	if (!t)
		return PyErr_NoMemory();
	ferry_loader_batch *b = self->b;
	self->b = NULL;
	int64_t n = (int64_t)(ferry_loader_batch_bytes(b) / (bits / 8));
	int err = ferry_loader_take(self->h->l, b, &t->buf);
	if (err) {
		free(t);
		return ferry__py_raise(err, NULL);
	}
	t->stream = (uintptr_t)stream;
	if (cols) {
		t->shape[0] = n / cols;
		t->shape[1] = cols;
	} else {
		t->shape[0] = n;
	}
	t->m.t.data = ferry_loader_buffer_data(t->buf);
	t->m.t.device.device_type = 2; /* kDLCUDA */
	t->m.t.device.device_id = self->device;
	t->m.t.ndim = cols ? 2 : 1;
	t->m.t.dtype.code = code;
	t->m.t.dtype.bits = bits;
	t->m.t.dtype.lanes = 1;
	t->m.t.shape = t->shape;
	t->m.manager_ctx = t;
	t->m.deleter = taken_delete;
	PyObject *cap = PyCapsule_New(&t->m, "dltensor", capsule_destructor);
	if (!cap)
		taken_delete(&t->m);
	return cap;
}

static PyObject *bt_offsets(BatchObject *self, PyObject *unused)
{
	if (bt_check(self) < 0)
		return NULL;
	return PyBytes_FromStringAndSize((const char *)ferry_loader_batch_offsets(self->b),
					 (Py_ssize_t)((ferry_loader_batch_samples(self->b) + 1) *
						      sizeof(uint64_t)));
}

static PyObject *bt_indices(BatchObject *self, PyObject *unused)
{
	if (bt_check(self) < 0)
		return NULL;
	return PyBytes_FromStringAndSize((const char *)ferry_loader_batch_indices(self->b),
					 (Py_ssize_t)(ferry_loader_batch_samples(self->b) * sizeof(int64_t)));
}

#define BT_GETTER(name, expr)                                                                 \
	static PyObject *bt_get_##name(BatchObject *self, void *closure)                        \
	{                                                                                        \
		if (bt_check(self) < 0)                                                          \
			return NULL;                                                             \
		return expr;                                                                     \
	}
BT_GETTER(nbytes, PyLong_FromSize_t(ferry_loader_batch_bytes(self->b)))
BT_GETTER(samples, PyLong_FromUnsignedLong(ferry_loader_batch_samples(self->b)))
BT_GETTER(epoch, PyLong_FromUnsignedLongLong(ferry_loader_batch_epoch(self->b)))
BT_GETTER(step, PyLong_FromUnsignedLongLong(ferry_loader_batch_step(self->b)))
BT_GETTER(ptr, PyLong_FromVoidPtr(ferry_loader_batch_data(self->b)))
#undef BT_GETTER

static PyObject *bt_get_device(BatchObject *self, void *closure)
{
	return PyLong_FromLong(self->device);
}

static PyMethodDef bt_methods[] = {
	{"dlpack", (PyCFunction)bt_dlpack, METH_NOARGS,
	 "dlpack() -> capsule: a view of the data, valid until release()."},
	{"offsets", (PyCFunction)bt_offsets, METH_NOARGS, "offsets() -> bytes: uint64 byte offsets [samples + 1]"},
	{"indices", (PyCFunction)bt_indices, METH_NOARGS, "indices() -> bytes: int64 item indices [samples]"},
	{"release", (PyCFunction)bt_release, METH_NOARGS, "release(): hand the slot back to the pipeline."},
	{"take", (PyCFunction)(void (*)(void))bt_take, METH_FASTCALL,
	 "take(stream, cols) -> capsule: the batch's device memory itself (no copy), given back after "
	 "the work on stream (a CUstream as int) once dropped; the batch is released."},
	{NULL},
};

static PyGetSetDef bt_getset[] = {
	{"nbytes", (getter)bt_get_nbytes, NULL, NULL, NULL},
	{"samples", (getter)bt_get_samples, NULL, NULL, NULL},
	{"epoch", (getter)bt_get_epoch, NULL, NULL, NULL},
	{"step", (getter)bt_get_step, NULL, NULL, NULL},
	{"ptr", (getter)bt_get_ptr, NULL, NULL, NULL},
	{"device", (getter)bt_get_device, NULL, NULL, NULL},
	{NULL},
};

static PyTypeObject BatchType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "ferry._ferry.Batch",
	.tp_basicsize = sizeof(BatchObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One batch held from the C loader until release().",
	.tp_dealloc = (destructor)bt_dealloc,
	.tp_methods = bt_methods,
	.tp_getset = bt_getset,
};

/* ------------------------------------------------------------------------ module functions */

static PyObject *mod_distributed_num_samples(PyObject *mod, PyObject *args)
{
	unsigned long long n;
	unsigned int replicas;
	int drop_last;

	if (!PyArg_ParseTuple(args, "KIp:distributed_num_samples", &n, &replicas, &drop_last))
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_distributed_num_samples(n, replicas, drop_last));
}

static PyObject *mod_distributed_indices_into(PyObject *mod, PyObject *args)
{
	unsigned long long n, seed, epoch;
	unsigned int replicas, rank;
	int shuffle, drop_last;
	PyObject *out;
	Py_buffer v;
	int64_t r;

	if (!PyArg_ParseTuple(args, "KIIpKKpO:distributed_indices_into", &n, &replicas, &rank, &shuffle,
			      &seed, &epoch, &drop_last, &out) ||
	    PyObject_GetBuffer(out, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = ferry_distributed_indices(n, replicas, rank, shuffle, seed, epoch, drop_last, v.buf,
				      (size_t)v.len / sizeof(int64_t));
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&v);
	if (r < 0)
		return ferry__py_raise((int)r, NULL);
	return PyLong_FromLongLong(r);
}

static PyObject *mod_order_indices_into(PyObject *mod, PyObject *args)
{
	unsigned long long n, block, seed, epoch;
	int order, err;
	PyObject *out;
	Py_buffer v;

	if (!PyArg_ParseTuple(args, "KiKKKO:order_indices_into", &n, &order, &block, &seed, &epoch, &out) ||
	    get_out(out, &v, n * sizeof(int64_t), "order_indices_into") < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	err = n ? ferry_order_indices(n, order, block, seed, epoch, v.buf) : 0;
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&v);
	if (err)
		return ferry__py_raise(err, NULL);
	Py_RETURN_NONE;
}

static PyObject *mod_randperm_into(PyObject *mod, PyObject *args)
{
	unsigned long long n, seed;
	PyObject *out;
	Py_buffer v;
	int err;

	if (!PyArg_ParseTuple(args, "KKO:randperm_into", &n, &seed, &out) ||
	    get_out(out, &v, n * sizeof(int64_t), "randperm_into") < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	err = n ? ferry_randperm(n, seed, v.buf) : 0;
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&v);
	if (err)
		return ferry__py_raise(err, NULL);
	Py_RETURN_NONE;
}

static PyObject *mod_elem_from_name(PyObject *mod, PyObject *arg)
{
	const char *s = PyUnicode_AsUTF8(arg);
	if (!s)
		return NULL;
	int code = ferry_elem_from_name(s);
	if (code < 0)
		return ferry__py_raise(code, NULL);
	return PyLong_FromLong(code);
}

static PyObject *mod_elem_name(PyObject *mod, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ferry_elem_name((int)code));
}

static PyObject *mod_elem_size(PyObject *mod, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyLong_FromSize_t(ferry_elem_size((int)code));
}

/*
 * write_dataset(path, kind, elem, shard_size, samples, keys) -> shards: samples is a sequence of
 * objects with the buffer protocol, keys None or a sequence of bytes. The writer's durable
 * protocol (data.h) applies; on failure no index exists.
 */
static PyObject *mod_write_dataset(PyObject *mod, PyObject *args)
{
	PyObject *path, *samples, *keys, *bpath = NULL, *seq = NULL, *kseq = NULL;
	int kind, elem, err = 0, shards = 0;
	unsigned long long shard_size;
	ferry_dataset_writer *w = NULL;
	ferry_ctx *ctx = NULL;

	if (!PyArg_ParseTuple(args, "OiiKOO:write_dataset", &path, &kind, &elem, &shard_size, &samples,
			      &keys) ||
	    !PyUnicode_FSConverter(path, &bpath))
		return NULL;
	seq = PySequence_Fast(samples, "samples must be a sequence of buffers");
	if (!seq)
		goto out;
	if (keys != Py_None) {
		kseq = PySequence_Fast(keys, "keys must be a sequence of bytes");
		if (!kseq)
			goto out;
		if (PySequence_Fast_GET_SIZE(kseq) != PySequence_Fast_GET_SIZE(seq)) {
			PyErr_SetString(PyExc_ValueError, "keys: one per sample");
			goto out;
		}
	}
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	if ((err = ferry_ctx_create(&ctx)) ||
	    (err = ferry_dataset_writer_create(ctx, PyBytes_AS_STRING(bpath), kind, elem, shard_size, &w)))
		goto out;
	for (Py_ssize_t i = 0; i < n && !err; i++) {
		Py_buffer v;
		char *k = NULL;
		Py_ssize_t kl = 0;

		if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &v, PyBUF_C_CONTIGUOUS) < 0)
			goto out;
		Py_ssize_t len = v.len;
		PyBuffer_Release(&v);
		if (kseq && PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(kseq, i), &k, &kl) < 0)
			goto out;
		int64_t r = ferry_dataset_writer_add(w, (uint64_t)len, k, (size_t)kl, 1);
		if (r < 0)
			err = (int)r;
	}
	if (!err && (shards = ferry_dataset_writer_layout(w)) < 0)
		err = shards;
	for (Py_ssize_t i = 0; i < n && !err; i++) {
		Py_buffer v;
		if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &v, PyBUF_C_CONTIGUOUS) < 0)
			goto out;
		Py_BEGIN_ALLOW_THREADS
		err = ferry_dataset_writer_put(w, (uint64_t)i, v.buf, (size_t)v.len);
		Py_END_ALLOW_THREADS
		PyBuffer_Release(&v);
	}
	if (!err) {
		Py_BEGIN_ALLOW_THREADS
		err = ferry_dataset_writer_finish(w);
		Py_END_ALLOW_THREADS
	}
out:
	if (err && !PyErr_Occurred())
		ferry__py_raise(err, path);
	ferry_dataset_writer_destroy(w);
	ferry_ctx_destroy(ctx);
	Py_XDECREF(bpath);
	Py_XDECREF(seq);
	Py_XDECREF(kseq);
	if (PyErr_Occurred())
		return NULL;
	return PyLong_FromLong(shards);
}

static PyMethodDef data_functions[] = {
	{"distributed_num_samples", mod_distributed_num_samples, METH_VARARGS,
	 "distributed_num_samples(n, num_replicas, drop_last) -> int"},
	{"distributed_indices_into", mod_distributed_indices_into, METH_VARARGS,
	 "distributed_indices_into(n, R, rank, shuffle, seed, epoch, drop_last, int64 buffer) -> count"},
	{"order_indices_into", mod_order_indices_into, METH_VARARGS,
	 "order_indices_into(n, order, block, seed, epoch, int64 buffer[n])"},
	{"randperm_into", mod_randperm_into, METH_VARARGS, "randperm_into(n, seed, int64 buffer[n])"},
	{"elem_from_name", mod_elem_from_name, METH_O, "elem_from_name(name) -> code"},
	{"elem_name", mod_elem_name, METH_O, "elem_name(code) -> str"},
	{"elem_size", mod_elem_size, METH_O, "elem_size(code) -> int"},
	{"write_dataset", mod_write_dataset, METH_VARARGS,
	 "write_dataset(path, kind, elem, shard_size, samples, keys) -> shards (use ferry.write_dataset)"},
	{NULL},
};

int ferry__py_data_init(PyObject *m)
{
	if (PyType_Ready(&DatasetType) < 0 || PyType_Ready(&LoaderType) < 0 ||
	    PyType_Ready(&BatchType) < 0 ||
	    PyModule_AddObjectRef(m, "Dataset", (PyObject *)&DatasetType) < 0 ||
	    PyModule_AddObjectRef(m, "Loader", (PyObject *)&LoaderType) < 0 ||
	    PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) < 0 ||
	    PyModule_AddFunctions(m, data_functions) < 0 ||
	    PyModule_AddIntConstant(m, "ORDER_SEQUENTIAL", FERRY_ORDER_SEQUENTIAL) < 0 ||
	    PyModule_AddIntConstant(m, "ORDER_SHUFFLE", FERRY_ORDER_SHUFFLE) < 0 ||
	    PyModule_AddIntConstant(m, "ORDER_BLOCK", FERRY_ORDER_BLOCK) < 0 ||
	    PyModule_AddIntConstant(m, "WRITE_FERRY", FERRY_WRITE_FERRY) < 0 ||
	    PyModule_AddIntConstant(m, "WRITE_MEGATRON", FERRY_WRITE_MEGATRON) < 0)
		return -1;
	return 0;
}
