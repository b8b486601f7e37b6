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
#include "_ferry.h"

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

/* The last reference joins the pipeline threads: not while holding the GIL. */
static void lshare_put_nogil(struct lshare *h)
{
	if (h) {
		Py_BEGIN_ALLOW_THREADS
		lshare_put(h);
		Py_END_ALLOW_THREADS
	}
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
	return ferry__py_closed(self->d, "the dataset is closed");
}

static int64_t dataset_open(ferry_ctx *unused, const char *path, void *arg)
{
	struct dshare *d = arg;
	return ferry_dataset_open(d->ctx, path, &d->ds);
}

static PyObject *ds_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"path", "options", NULL};
	PyObject *path, *options = NULL;
	struct dshare *d;
	int err;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:Dataset", kwlist, &path, &options))
		return NULL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return PyErr_NoMemory();
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
	if (ferry__py_failed(err, path) || ferry__py_path_call(NULL, path, dataset_open, d) < 0)
		goto fail;
	DatasetObject *self = (DatasetObject *)type->tp_alloc(type, 0);
	if (!self) {
		dshare_put(d);
		return NULL;
	}
	self->d = d;
	self->path = Py_NewRef(path);
	return (PyObject *)self;
fail:
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
	struct dshare *d = self->d;
	self->d = NULL;
	/* without the GIL: closing a dataset with a cache waits for the stages in flight, whose
	 * server may be a Python thread of this process (the tests' proxy) */
	Py_BEGIN_ALLOW_THREADS
	dshare_put(d);
	Py_END_ALLOW_THREADS
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
	if (ds_check(self) < 0 || ferry__py_u64(o, "sample index", i) < 0)
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
	struct ferry__py_buf v;
	ssize_t n;

	if (!PyArg_ParseTuple(args, "OO:read_into", &io, &buf) || get_index(self, io, &i) < 0 ||
	    ferry__py_host_buf(buf, &v, 1, (size_t)ferry_dataset_sample_bytes(self->d->ds, i), "read_into") < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, n, ferry_dataset_read(self->d->ds, i, v.ptr, v.len));
	ferry__py_buf_release(&v);
	if (ferry__py_failed(n, self->path))
		return NULL;
	return PyLong_FromSsize_t(n);
}

/* Every sample's length in bytes into an int64 buffer of count entries. */
static PyObject *ds_sizes_into(DatasetObject *self, PyObject *buf)
{
	struct ferry__py_buf v;

	if (ds_check(self) < 0)
		return NULL;
	uint64_t n = ferry_dataset_count(self->d->ds);
	if (ferry__py_host_buf(buf, &v, 1, n * sizeof(int64_t), "sizes_into") < 0)
		return NULL;
	int64_t *out = v.ptr;
	for (uint64_t i = 0; i < n; i++)
		out[i] = ferry_dataset_sample_bytes(self->d->ds, i);
	ferry__py_buf_release(&v);
	Py_RETURN_NONE;
}

/* Every sample's (shard, offset) into a uint32 and a uint64 buffer. */
static PyObject *ds_locate_into(DatasetObject *self, PyObject *args)
{
	PyObject *so, *oo;
	struct ferry__py_buf sv, ov;

	if (!PyArg_ParseTuple(args, "OO:locate_into", &so, &oo) || ds_check(self) < 0)
		return NULL;
	uint64_t n = ferry_dataset_count(self->d->ds);
	if (ferry__py_host_buf(so, &sv, 1, n * sizeof(uint32_t), "locate_into") < 0)
		return NULL;
	if (ferry__py_host_buf(oo, &ov, 1, n * sizeof(uint64_t), "locate_into") < 0) {
		ferry__py_buf_release(&sv);
		return NULL;
	}
	uint32_t *s = sv.ptr;
	uint64_t *o = ov.ptr;
	int err = 0;
	for (uint64_t i = 0; i < n && !err; i++)
		err = ferry_dataset_locate(self->d->ds, i, &s[i], &o[i]);
	ferry__py_buf_release(&sv);
	ferry__py_buf_release(&ov);
	if (ferry__py_failed(err, self->path))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *ds_shard_path(DatasetObject *self, PyObject *arg)
{
	uint64_t k;

	if (ds_check(self) < 0 || ferry__py_u64(arg, "shard", &k) < 0)
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

static PyObject *ds_cache_stats(DatasetObject *self, PyObject *unused)
{
	char buf[2048];

	if (ds_check(self) < 0)
		return NULL;
	int n = ferry_dataset_cache_stats(self->d->ds, buf, sizeof(buf));
	if (ferry__py_failed(n < 0 ? n : 0, self->path))
		return NULL;
	return PyUnicode_FromString(buf);
}

static PyObject *ds_verify(DatasetObject *self, PyObject *unused)
{
	int err;

	if (ds_check(self) < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, err, ferry_dataset_verify(self->d->ds));
	if (ferry__py_failed(err, self->path))
		return NULL;
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
DS_GETTER(dtype_name, PyUnicode_FromString(ferry_dtype_numpy_name(ferry_dataset_dtype(ds))))
DS_GETTER(format, PyUnicode_FromString(ferry_dataset_format(ds)))
DS_GETTER(nbytes, PyLong_FromUnsignedLongLong(ferry_dataset_bytes(ds)))
DS_GETTER(shards, PyLong_FromUnsignedLong(ferry_dataset_shards(ds)))
DS_GETTER(copies, PyLong_FromUnsignedLong(ferry_dataset_copies(ds, NULL)))
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
	{"cache_stats", (PyCFunction)ds_cache_stats, METH_NOARGS,
	 "cache_stats() -> str: JSON of what the cache_dir of a dataset of URLs did ({} without one)."},
	{"verify", (PyCFunction)ds_verify, METH_NOARGS,
	 "verify(): re-read every shard and check its CRC-32C (ferry datasets)."},
	{"close", (PyCFunction)ds_close, METH_NOARGS, "close()"},
	{NULL},
};

static PyGetSetDef ds_getset[] = {
	{"count", (getter)ds_get_count, NULL, "samples", NULL},
	{"dtype", (getter)ds_get_dtype, NULL, "element type (enum ferry_dtype)", NULL},
	{"dtype_name", (getter)ds_get_dtype_name, NULL, "element type name (NumPy's)", NULL},
	{"format", (getter)ds_get_format, NULL, "'ferry' or 'megatron'", NULL},
	{"nbytes", (getter)ds_get_nbytes, NULL, "bytes of all samples", NULL},
	{"shards", (getter)ds_get_shards, NULL, "data files", NULL},
	{"copies", (getter)ds_get_copies, NULL, "pre-shuffled copies (ferry.copies), 0: none", NULL},
	{"closed", (getter)ds_get_closed, NULL, NULL, NULL},
	{"path", (getter)ds_get_path, NULL, NULL, NULL},
	{NULL},
};

static PySequenceMethods ds_as_sequence = {
	.sq_length = (lenfunc)ds_len,
};

static PyTypeObject DatasetType = {
	FERRY_PY_TYPE("ferry._ferry.Dataset", DatasetObject, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
		      "Dataset(path, options=None): a packed dataset (use ferry.IndexedDataset)."),
	.tp_new = ds_new,
	.tp_dealloc = (destructor)ds_dealloc,
	.tp_methods = ds_methods,
	.tp_getset = ds_getset,
	.tp_as_sequence = &ds_as_sequence,
};

/* ------------------------------------------------------------------------------- DLPack views */

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

/* The DLPack type of a dataset element code (bytes as uint8), or -1 with TypeError. */
static int dl_type(int elem, dl_dtype *t)
{
	static const struct {
		int elem;
		uint8_t code, bits;
	} map[] = {
		{FERRY_DT_BYTES, DL_UINT, 8}, {FERRY_DT_U8, DL_UINT, 8},   {FERRY_DT_I8, DL_INT, 8},
		{FERRY_DT_I16, DL_INT, 16},   {FERRY_DT_U16, DL_UINT, 16}, {FERRY_DT_I32, DL_INT, 32},
		{FERRY_DT_I64, DL_INT, 64},   {FERRY_DT_F32, DL_FLOAT, 32}, {FERRY_DT_F64, DL_FLOAT, 64},
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		if (map[i].elem == elem) {
			*t = (dl_dtype){map[i].code, map[i].bits, 1};
			return 0;
		}
	}
	PyErr_Format(PyExc_TypeError, "element type %d has no DLPack type", elem);
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
	return ferry__py_closed(self->h, "the loader is closed");
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
	lshare_put_nogil(h);
	Py_XDECREF(self->dataset);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ld_close(LoaderObject *self, PyObject *unused)
{
	struct lshare *h = self->h;
	self->h = NULL;
	lshare_put_nogil(h);
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
	FERRY_PY_NOGIL(NULL, err, ferry_loader_start(self->h->l));
	if (ferry__py_failed(err, NULL))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *ld_next(LoaderObject *self, PyObject *unused)
{
	ferry_loader_batch *b = NULL;
	int r;

	if (ld_check(self) < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, r, ferry_loader_next(self->h->l, &b));
	if (ferry__py_failed(r, NULL))
		return NULL;
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

static PyObject *metric_at(Py_ssize_t i, const void *l, const char **key)
{
	double m;
	*key = ferry_loader_metric_names()[i];
	int e = ferry_loader_metric((ferry_loader *)l, *key, &m);
	return e < 0 ? ferry__py_raise(e, NULL) : PyFloat_FromDouble(m);
}

static PyObject *ld_metrics(LoaderObject *self, PyObject *unused)
{
	if (ld_check(self) < 0)
		return NULL;
	Py_ssize_t n = 0;
	while (ferry_loader_metric_names()[n])
		n++;
	return ferry__py_dict(n, metric_at, self->h->l);
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
	FERRY_PY_TYPE("ferry._ferry.Loader", LoaderObject, Py_TPFLAGS_DEFAULT,
		      "Loader(dataset, knobs=None, device=-1): the C loader (use ferry.Loader)."),
	.tp_new = ld_new,
	.tp_dealloc = (destructor)ld_dealloc,
	.tp_methods = ld_methods,
};

/* ------------------------------------------------------------------------------------- Batch */

static int bt_check(BatchObject *self)
{
	return ferry__py_closed(self->b, "the batch was released");
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
	lshare_put_nogil(h);
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
	dl_dtype dt;

	if (bt_check(self) < 0 || dl_type(self->elem, &dt) < 0)
		return NULL;
	struct view *v = calloc(1, sizeof(*v));
	if (!v)
		return PyErr_NoMemory();
	v->shape[0] = (int64_t)(ferry_loader_batch_bytes(self->b) / (dt.bits / 8));
	v->m.t.dtype = dt;
	v->m.t.shape = v->shape;
	v->m.manager_ctx = v;
	v->m.deleter = view_delete;
	v->h = self->h;
	atomic_fetch_add(&self->h->refs, 1);
	return ferry__py_dl_export(&v->m, ferry_loader_batch_data(self->b), self->device, 1);
}

/* A batch's device memory taken from the loader (Batch.take), as DLPack tensors (the data, and
 * with documents its position_ids and cu_seqlens) whose last deleter gives it back in the order
 * of the stream it was taken for. */
struct taken_buf {
	ferry_loader_buffer *buf;
	void *stream;
	atomic_int refs;
};

struct taken {
	dl_managed m;
	int64_t shape[2];
	struct taken_buf *tb;
};

static void taken_put(struct taken_buf *tb)
{
	/* any thread, GIL or not; an error cannot be reported here (the memory is freed instead) */
	if (atomic_fetch_sub(&tb->refs, 1) == 1) {
		(void)ferry_loader_buffer_destroy(tb->buf, tb->stream);
		free(tb);
	}
}

static void taken_delete(dl_managed *m)
{
	struct taken *t = (struct taken *)m;
	struct taken_buf *tb = t->tb;
	free(t);
	taken_put(tb);
}

/* A view of n (or n / cols x cols) elements of type dt at offset bytes of the taken memory. */
static PyObject *taken_view(struct taken_buf *tb, int device, size_t offset, dl_dtype dt, int64_t n,
			    int64_t cols)
{
	struct taken *t = calloc(1, sizeof(*t));
	if (!t) {
		taken_put(tb); /* the reference this view was to hold */
		return PyErr_NoMemory();
	}
	t->tb = tb;
	if (cols) {
		t->shape[0] = n / cols;
		t->shape[1] = cols;
	} else {
		t->shape[0] = n;
	}
	t->m.t.dtype = dt;
	t->m.t.shape = t->shape;
	t->m.manager_ctx = t;
	t->m.deleter = taken_delete;
	return ferry__py_dl_export(&t->m, (uint8_t *)ferry_loader_buffer_data(tb->buf) + offset, device,
				   cols ? 2 : 1);
}

/*
 * take(stream, cols, documents=False) -> "dltensor" capsule: the batch's device memory itself, no
 * copy (ferry_loader_take), shaped (nbytes / itemsize / cols, cols), or 1-D when cols is 0. The
 * memory belongs to the capsule's consumer and goes back to the loader when the consumer drops
 * it, ordered after the work queued on `stream` (an int CUstream, the consumer's current one)
 * by then: as memory allocated on that stream. With documents (the loader's documents knob):
 * (data, position_ids, cu_seqlens) capsules over the same memory, given back once all three are
 * dropped. The batch is released in every case.
 */
static PyObject *bt_take(BatchObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	dl_dtype dt;

	if (nargs != 2 && nargs != 3) {
		PyErr_SetString(PyExc_TypeError, "take(stream, cols, documents=False) takes 2 or 3 arguments");
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
	int docs = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
	if (docs < 0 || dl_type(self->elem, &dt) < 0)
		return NULL;
	size_t pos_off = 0, cu_off = 0;
	uint32_t ncu = 0;
	if (docs && (!ferry_loader_batch_cu_seqlens(self->b, &ncu, NULL) ||
		     ferry__py_failed(ferry_loader_documents_layout(self->h->l, &pos_off, &cu_off), NULL))) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "take: the loader's documents knob is off");
		return NULL;
	}
	struct taken_buf *tb = calloc(1, sizeof(*tb));
	if (!tb)
		return PyErr_NoMemory();
	ferry_loader_batch *b = self->b;
	self->b = NULL;
	int64_t n = (int64_t)(ferry_loader_batch_bytes(b) / (dt.bits / 8));
	int err = ferry_loader_take(self->h->l, b, &tb->buf);
	if (ferry__py_failed(err, NULL)) {
		free(tb);
		return NULL;
	}
	tb->stream = stream;
	atomic_init(&tb->refs, docs ? 3 : 1);
	PyObject *data = taken_view(tb, self->device, 0, dt, n, cols);
	if (!docs)
		return data;
	PyObject *pos = taken_view(tb, self->device, pos_off, (dl_dtype){DL_INT, 64, 1}, n, cols);
	PyObject *cu = taken_view(tb, self->device, cu_off, (dl_dtype){DL_INT, 32, 1}, ncu, 0);
	if (!data || !pos || !cu) {
		Py_XDECREF(data);
		Py_XDECREF(pos);
		Py_XDECREF(cu);
		return NULL;
	}
	return Py_BuildValue("(NNN)", data, pos, cu);
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

/*
 * documents(pos, cu) -> (count, max_seqlen): with the loader's documents knob, copies the batch's
 * int64 position_ids (one per element) into the writable host buffer pos and its int32 cu_seqlens
 * (count of them, at most elements + 1) into cu; (0, 0) when documents is off. Before take().
 */
static PyObject *bt_documents(BatchObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	dl_dtype dt;

	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "documents(pos, cu) takes 2 arguments");
		return NULL;
	}
	if (bt_check(self) < 0 || dl_type(self->elem, &dt) < 0)
		return NULL;
	uint32_t ncu = 0, maxlen = 0;
	const int32_t *cu = ferry_loader_batch_cu_seqlens(self->b, &ncu, &maxlen);
	const int64_t *pos = ferry_loader_batch_position_ids(self->b);
	if (!cu || !pos)
		return Py_BuildValue("(II)", 0u, 0u);
	size_t elems = ferry_loader_batch_bytes(self->b) / (dt.bits / 8);
	struct ferry__py_buf v, c;
	if (ferry__py_host_buf(args[0], &v, 1, elems * sizeof(int64_t), "documents: position_ids") < 0)
		return NULL;
	if (ferry__py_host_buf(args[1], &c, 1, ncu * sizeof(int32_t), "documents: cu_seqlens") < 0) {
		ferry__py_buf_release(&v);
		return NULL;
	}
	memcpy(v.ptr, pos, elems * sizeof(int64_t));
	memcpy(c.ptr, cu, ncu * sizeof(int32_t));
	ferry__py_buf_release(&v);
	ferry__py_buf_release(&c);
	return Py_BuildValue("(II)", ncu, maxlen);
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
static PyObject *bt_max_seqlen(const ferry_loader_batch *b)
{
	uint32_t m = 0;
	(void)ferry_loader_batch_cu_seqlens(b, NULL, &m);
	return PyLong_FromUnsignedLong(m);
}
BT_GETTER(max_seqlen, bt_max_seqlen(self->b))
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
	{"documents", (PyCFunction)(void (*)(void))bt_documents, METH_FASTCALL,
	 "documents(pos, cu) -> (count, max_seqlen): int64 position_ids (one per element) and the "
	 "count int32 sequence boundaries copied into pos and cu, with the loader's documents knob."},
	{"release", (PyCFunction)bt_release, METH_NOARGS, "release(): hand the slot back to the pipeline."},
	{"take", (PyCFunction)(void (*)(void))bt_take, METH_FASTCALL,
	 "take(stream, cols, documents=False) -> capsule (with documents: data, position_ids and "
	 "cu_seqlens capsules): the batch's device memory itself (no copy), given back after the work "
	 "on stream (a CUstream as int) once dropped; the batch is released."},
	{NULL},
};

static PyGetSetDef bt_getset[] = {
	{"nbytes", (getter)bt_get_nbytes, NULL, NULL, NULL},
	{"samples", (getter)bt_get_samples, NULL, NULL, NULL},
	{"epoch", (getter)bt_get_epoch, NULL, NULL, NULL},
	{"step", (getter)bt_get_step, NULL, NULL, NULL},
	{"ptr", (getter)bt_get_ptr, NULL, NULL, NULL},
	{"max_seqlen", (getter)bt_get_max_seqlen, NULL, NULL, NULL},
	{"device", (getter)bt_get_device, NULL, NULL, NULL},
	{NULL},
};

static PyTypeObject BatchType = {
	FERRY_PY_TYPE("ferry._ferry.Batch", BatchObject, Py_TPFLAGS_DEFAULT,
		      "One batch held from the C loader until release()."),
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
	struct ferry__py_buf v;
	int64_t r;

	if (!PyArg_ParseTuple(args, "KIIpKKpO:distributed_indices_into", &n, &replicas, &rank, &shuffle,
			      &seed, &epoch, &drop_last, &out) ||
	    ferry__py_host_buf(out, &v, 1, 0, "distributed_indices_into") < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, r, ferry_distributed_indices(n, replicas, rank, shuffle, seed, epoch, drop_last,
							  v.ptr, v.len / sizeof(int64_t)));
	ferry__py_buf_release(&v);
	if (ferry__py_failed(r, NULL))
		return NULL;
	return PyLong_FromLongLong(r);
}

static PyObject *mod_order_indices_into(PyObject *mod, PyObject *args)
{
	unsigned long long n, block, seed, epoch;
	int order, err;
	PyObject *out;
	struct ferry__py_buf v;

	if (!PyArg_ParseTuple(args, "KiKKKO:order_indices_into", &n, &order, &block, &seed, &epoch, &out) ||
	    ferry__py_host_buf(out, &v, 1, n * sizeof(int64_t), "order_indices_into") < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, err, n ? ferry_order_indices(n, order, block, seed, epoch, v.ptr) : 0);
	ferry__py_buf_release(&v);
	if (ferry__py_failed(err, NULL))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *mod_randperm_into(PyObject *mod, PyObject *args)
{
	unsigned long long n, seed;
	PyObject *out;
	struct ferry__py_buf v;
	int err;

	if (!PyArg_ParseTuple(args, "KKO:randperm_into", &n, &seed, &out) ||
	    ferry__py_host_buf(out, &v, 1, n * sizeof(int64_t), "randperm_into") < 0)
		return NULL;
	FERRY_PY_NOGIL(NULL, err, n ? ferry_randperm(n, seed, v.ptr) : 0);
	ferry__py_buf_release(&v);
	if (ferry__py_failed(err, NULL))
		return NULL;
	Py_RETURN_NONE;
}

/*
 * Integer kinds for narrow_into: signedness and size from a buffer's struct format (native or
 * little-endian: '@', '=', '<' prefixes). 0: not an integer type this handles.
 */
enum { I8 = 1, I16, I32, I64, U8, U16, U32, U64 };

static int int_kind(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";
	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	if (!f[0] || f[1])
		return 0;
	int sgn = strchr("bhilqn", f[0]) != NULL, uns = strchr("BHILQN", f[0]) != NULL;
	if (!sgn && !uns)
		return 0;
	switch (v->itemsize) {
	case 1: return sgn ? I8 : U8;
	case 2: return sgn ? I16 : U16;
	case 4: return sgn ? I32 : U32;
	case 8: return sgn ? I64 : U64;
	}
	return 0;
}

/*
 * Copies n values of type S at src to D at dst and says whether one does not fit D: with x as a
 * 64-bit pattern (sign-extended), x + bias has no bit outside mask for exactly the values that fit
 * (narrow_limits). ORs and ANDs, unlike 64-bit compares, vectorize with plain SSE2.
 */
#define NARROW(S, D)                                                                               \
	do {                                                                                       \
		const S *p = src;                                                                  \
		D *q = dst;                                                                        \
		uint64_t acc = 0;                                                                  \
		for (size_t i = 0; i < n; i++) {                                                   \
			S x = p[i];                                                                \
			acc |= ((uint64_t)(int64_t)x + bias) & ~mask;                              \
			q[i] = (D)x;                                                               \
		}                                                                                  \
		return acc != 0;                                                                   \
	} while (0)

#define NARROW_TO(S)                                                                               \
	switch (dk) {                                                                              \
	case I8: NARROW(S, int8_t);                                                                \
	case I16: NARROW(S, int16_t);                                                              \
	case I32: NARROW(S, int32_t);                                                              \
	case I64: NARROW(S, int64_t);                                                              \
	case U8: NARROW(S, uint8_t);                                                               \
	case U16: NARROW(S, uint16_t);                                                             \
	case U32: NARROW(S, uint32_t);                                                             \
	case U64: NARROW(S, uint64_t);                                                             \
	}                                                                                          \
	return 0

/* GCC vectorizes these loops only from -O3 (at -O2 its "very cheap" cost model declines loops of
 * unknown length); clang does at -O2. Vectorized, the checked copy runs near NumPy's astype. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* and with AVX2 where the CPU has it (an ifunc picks at load time), as NumPy's own casts do */
#define VECTORIZE __attribute__((optimize("O3"), target_clones("avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__)
#define VECTORIZE __attribute__((optimize("O3")))
#else
#define VECTORIZE
#endif

#define NARROW_FN(name, S)                                                                         \
	VECTORIZE static int name(int dk, const void *src, void *dst, size_t n, uint64_t bias,     \
				  uint64_t mask)                                                   \
	{                                                                                          \
		NARROW_TO(S);                                                                      \
	}
NARROW_FN(narrow_i8, int8_t)
NARROW_FN(narrow_i16, int16_t)
NARROW_FN(narrow_i32, int32_t)
NARROW_FN(narrow_i64, int64_t)
NARROW_FN(narrow_u8, uint8_t)
NARROW_FN(narrow_u16, uint16_t)
NARROW_FN(narrow_u32, uint32_t)
NARROW_FN(narrow_u64, uint64_t)
#undef NARROW_FN
#undef NARROW_TO
#undef NARROW

static int (*const narrow_fns[])(int, const void *, void *, size_t, uint64_t, uint64_t) = {
	NULL, narrow_i8, narrow_i16, narrow_i32, narrow_i64, narrow_u8, narrow_u16, narrow_u32, narrow_u64,
};

/* bias and mask for NARROW from integer kind sk to dk (kinds are I8..U64 above). */
static void narrow_limits(int sk, int dk, uint64_t *bias, uint64_t *mask)
{
	int ssig = sk <= I64, dsig = dk <= I64;
	int bits = 8 << ((dk - 1) % 4);
	*bias = 0;
	if (bits == 64) {
		*mask = ssig == dsig ? UINT64_MAX : (uint64_t)INT64_MAX; /* the sign bit must be clear */
	} else if (!dsig) {
		*mask = (UINT64_C(1) << bits) - 1; /* negative values have the high bits set */
	} else if (ssig) {
		*bias = UINT64_C(1) << (bits - 1);
		*mask = (UINT64_C(1) << bits) - 1;
	} else {
		*mask = (UINT64_C(1) << (bits - 1)) - 1;
	}
}

/*
 * narrow_into(src, dst) -> None | (k, value): copies the integers of the C-contiguous buffer src
 * into the integer buffer dst of as many elements (another integer type), checking in the same
 * pass that every value fits dst's type. Returns None when all do, else the first element that
 * does not and its value (dst is then partly written). One pass of C over the sample: the check
 * write_dataset makes costs no more than the conversion it replaces (docs/PERFORMANCE.md).
 */
static PyObject *mod_narrow_into(PyObject *mod, PyObject *args)
{
	PyObject *so, *dobj, *ret = NULL;
	Py_buffer sv, dv;

	if (!PyArg_ParseTuple(args, "OO:narrow_into", &so, &dobj))
		return NULL;
	if (PyObject_GetBuffer(so, &sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
		return NULL;
	if (PyObject_GetBuffer(dobj, &dv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
		PyBuffer_Release(&sv);
		return NULL;
	}
	int sk = int_kind(&sv), dk = int_kind(&dv);
	size_t n = sv.itemsize ? (size_t)(sv.len / sv.itemsize) : 0;
	if (!sk || !dk || (size_t)(dv.len / (dv.itemsize ? dv.itemsize : 1)) != n) {
		PyErr_Format(PyExc_ValueError, "narrow_into: integer buffers of as many elements, not '%s' "
			     "(%zd bytes) and '%s' (%zd bytes)", sv.format ? sv.format : "B", sv.len,
			     dv.format ? dv.format : "B", dv.len);
		goto out;
	}
	uint64_t bias, mask;
	narrow_limits(sk, dk, &bias, &mask);
	int bad;
	Py_BEGIN_ALLOW_THREADS
	bad = narrow_fns[sk](dk, sv.buf, dv.buf, n, bias, mask);
	Py_END_ALLOW_THREADS
	/* the first value that does not fit: a second pass, on the error path only */
	for (size_t i = 0; bad && i < n; i++) {
		int64_t v = 0;
		switch (sk) {
		case I8: v = ((const int8_t *)sv.buf)[i]; break;
		case I16: v = ((const int16_t *)sv.buf)[i]; break;
		case I32: v = ((const int32_t *)sv.buf)[i]; break;
		case I64: v = ((const int64_t *)sv.buf)[i]; break;
		case U8: v = ((const uint8_t *)sv.buf)[i]; break;
		case U16: v = ((const uint16_t *)sv.buf)[i]; break;
		case U32: v = ((const uint32_t *)sv.buf)[i]; break;
		case U64: v = (int64_t)((const uint64_t *)sv.buf)[i]; break;
		}
		if (((uint64_t)v + bias) & ~mask) {
			ret = Py_BuildValue("(nN)", (Py_ssize_t)i,
					    sk == U64 ? PyLong_FromUnsignedLongLong((uint64_t)v) : PyLong_FromLongLong(v));
			goto out;
		}
	}
	ret = Py_NewRef(Py_None);
out:
	PyBuffer_Release(&sv);
	PyBuffer_Release(&dv);
	return ret;
}

static PyObject *mod_elem_from_name(PyObject *mod, PyObject *arg)
{
	const char *s = PyUnicode_AsUTF8(arg);
	if (!s)
		return NULL;
	enum ferry_dtype code;
	int err = ferry_dtype_from_numpy_name(s, &code);
	if (err < 0)
		return ferry__py_raise(err, NULL);
	return PyLong_FromLong(code);
}

static PyObject *mod_elem_name(PyObject *mod, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	const char *name = ferry_dtype_numpy_name((enum ferry_dtype)code);
	return PyUnicode_FromString(name ? name : "unknown");
}

static PyObject *mod_elem_size(PyObject *mod, PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyLong_FromSize_t((size_t)ferry_dtype_bits((enum ferry_dtype)code) / 8);
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
	unsigned long long shard_size, seed = 0;
	unsigned int copies = 0;
	ferry_dataset_writer *w = NULL;
	ferry_ctx *ctx = NULL;

	if (!PyArg_ParseTuple(args, "OiiKOO|IK:write_dataset", &path, &kind, &elem, &shard_size, &samples,
			      &keys, &copies, &seed) ||
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
		struct ferry__py_buf v;
		char *k = NULL;
		Py_ssize_t kl = 0;

		if (ferry__py_host_buf(PySequence_Fast_GET_ITEM(seq, i), &v, 0, 0, "write_dataset") < 0)
			goto out;
		size_t len = v.len;
		ferry__py_buf_release(&v);
		if (kseq && PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(kseq, i), &k, &kl) < 0)
			goto out;
		int64_t r = ferry_dataset_writer_add(w, (uint64_t)len, k, (size_t)kl, 1);
		if (r < 0)
			err = (int)r;
	}
	if (!err && (shards = ferry_dataset_writer_layout(w)) < 0)
		err = shards;
	for (Py_ssize_t i = 0; i < n && !err; i++) {
		struct ferry__py_buf v;
		if (ferry__py_host_buf(PySequence_Fast_GET_ITEM(seq, i), &v, 0, 0, "write_dataset") < 0)
			goto out;
		FERRY_PY_NOGIL(NULL, err, ferry_dataset_writer_put(w, (uint64_t)i, v.ptr, v.len));
		ferry__py_buf_release(&v);
	}
	if (!err)
		err = ferry_dataset_writer_set_copies(w, copies, seed);
	if (!err)
		FERRY_PY_NOGIL(NULL, err, ferry_dataset_writer_finish(w));
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
	{"narrow_into", mod_narrow_into, METH_VARARGS,
	 "narrow_into(src, dst) -> None | (index, value): integers copied to another integer type, "
	 "checked to fit in the same pass"},
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
