/*
 * cufile: GPUDirect Storage as a backend ops set, beside psync and io_uring. An op moves bytes
 * between a file registered with cuFile (op->handle) and device memory (op->addr on op->dev).
 * A ring is one of two kinds, chosen at ring_init (ferry__ring_opts.gds_batch):
 *   - synchronous (the gds mode): each op is a cuFileRead/cuFileWrite done at submit, like psync;
 *   - batch (gds-batch): ops go to cuFile's batch API, cuFileBatchIOSubmit at submit and
 *     cuFileBatchIOGetStatus at reap, like io_uring.
 * cuFile's stream API (gds-async) is ordered on a CUDA stream and runs on the copy ring
 * (gpu_io.c). A failed op completes with a negative result: -errno, or FERRY_ECUFILE with
 * cuFile's explanation in ferry_last_error() of the thread that reaps it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "gpu/shim.h"

struct ferry__ring {
	bool batch;
	unsigned depth;
	unsigned nq, ndone, inflight;
	struct ferry__op *q;
	void **done_tags;
	int64_t *done_res;
	/* batch */
	ferry__CUfileBatchHandle_t handle;
	ferry__CUfileIOParams_t *params;
	ferry__CUfileIOEvents_t *events;
};

static int cufile_probe(char *why, size_t len)
{
	return ferry__cufile_driver(why, len) ? 0 : FERRY_ENOGDS;
}

static void cufile_exit(struct ferry__ring *r)
{
	if (!r)
		return;
	if (r->handle)
		ferry__cufile()->BatchIODestroy(r->handle);
	free(r->q);
	free(r->done_tags);
	free(r->done_res);
	free(r->params);
	free(r->events);
	free(r);
}

static int cufile_init(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	struct ferry__ring *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->batch = o && o->gds_batch;
	r->depth = depth;
	r->q = calloc(depth, sizeof(*r->q));
	r->done_tags = calloc(depth, sizeof(*r->done_tags));
	r->done_res = calloc(depth, sizeof(*r->done_res));
	if (r->batch) {
		r->params = calloc(depth, sizeof(*r->params));
		r->events = calloc(depth, sizeof(*r->events));
	}
	if (!r->q || !r->done_tags || !r->done_res || (r->batch && (!r->params || !r->events))) {
		cufile_exit(r);
		return -ENOMEM;
	}
	if (r->batch) {
		ferry__CUfileError_t e = cf->BatchIOSetUp(&r->handle, depth);
		if (e.err) {
			char why[256];
			r->handle = NULL;
			cufile_exit(r);
			return ferry__error(FERRY_ECUFILE, "cuFileBatchIOSetUp(%u): %s", depth,
					    ferry__cufile_explain(e, why, sizeof(why)));
		}
	}
	*out = r;
	return 0;
}

static int cufile_prep(struct ferry__ring *r, const struct ferry__op *op)
{
	if (r->nq + r->ndone + r->inflight >= r->depth)
		return -EBUSY;
	r->q[r->nq++] = *op;
	return 0;
}

static void done(struct ferry__ring *r, void *tag, int64_t res)
{
	r->done_tags[r->ndone] = tag;
	r->done_res[r->ndone] = res;
	r->ndone++;
}

int64_t ferry__gds_result(ssize_t n, const char *call)
{
	if (n >= 0)
		return n;
	if (n == -1)
		return -errno;
	char why[256];
	ferry__CUfileError_t e = {.err = (int)-n};
	return ferry__error(FERRY_ECUFILE, "%s: %s", call, ferry__cufile_explain(e, why, sizeof(why)));
}

static int cufile_submit(struct ferry__ring *r)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	unsigned n = r->nq;

	if (!r->batch) {
		for (unsigned i = 0; i < n; i++) {
			const struct ferry__op *op = &r->q[i];
			int err = ferry__cuda_set_device(op->dev);
			ssize_t got = err ? err
				: op->is_write ? cf->Write(op->handle, op->addr, op->len, (off_t)op->off, 0)
					       : cf->Read(op->handle, op->addr, op->len, (off_t)op->off, 0);
			done(r, op->tag, err ? err : ferry__gds_result(got, op->is_write ? "cuFileWrite" : "cuFileRead"));
		}
		r->nq = 0;
		return (int)n;
	}
	if (!n)
		return 0;
	for (unsigned i = 0; i < n; i++) {
		const struct ferry__op *op = &r->q[i];
		ferry__CUfileIOParams_t *p = &r->params[i];
		memset(p, 0, sizeof(*p));
		p->mode = FERRY__CUFILE_BATCH;
		p->u.batch.devPtr_base = op->addr;
		p->u.batch.file_offset = (off_t)op->off;
		p->u.batch.devPtr_offset = 0;
		p->u.batch.size = op->len;
		p->fh = op->handle;
		p->opcode = op->is_write ? FERRY__CUFILE_WRITE : FERRY__CUFILE_READ;
		p->cookie = op->tag;
	}
	ferry__CUfileError_t e = cf->BatchIOSubmit(r->handle, n, r->params, 0);
	r->nq = 0;
	if (e.err) {
		/* nothing was started: the ops complete now, failed */
		char why[256];
		int err = ferry__error(FERRY_ECUFILE, "cuFileBatchIOSubmit(%u): %s", n,
				       ferry__cufile_explain(e, why, sizeof(why)));
		for (unsigned i = 0; i < n; i++)
			done(r, r->q[i].tag, err);
		return (int)n;
	}
	r->inflight += n;
	return (int)n;
}

/* Moves up to max completions from the done list out. */
static unsigned take_done(struct ferry__ring *r, void **tags, int64_t *res, unsigned max)
{
	unsigned n = r->ndone < max ? r->ndone : max;

	for (unsigned i = 0; i < n; i++) {
		tags[i] = r->done_tags[i];
		res[i] = r->done_res[i];
	}
	memmove(r->done_tags, r->done_tags + n, (r->ndone - n) * sizeof(*r->done_tags));
	memmove(r->done_res, r->done_res + n, (r->ndone - n) * sizeof(*r->done_res));
	r->ndone -= n;
	return n;
}

static int cufile_reap(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max)
{
	unsigned got = take_done(r, tags, res, max);

	if (!r->batch || !r->inflight || got >= max)
		return (int)got;
	const struct ferry__cufile_api *cf = ferry__cufile();
	struct timespec zero = {0, 0};
	unsigned want = min > got ? min - got : 0, nr = r->depth;
	ferry__CUfileError_t e = cf->BatchIOGetStatus(r->handle, want, &nr, r->events, want ? NULL : &zero);
	if (e.err) {
		char why[256];
		return got ? (int)got : ferry__error(FERRY_ECUFILE, "cuFileBatchIOGetStatus: %s",
						     ferry__cufile_explain(e, why, sizeof(why)));
	}
	for (unsigned i = 0; i < nr; i++) {
		const ferry__CUfileIOEvents_t *ev = &r->events[i];
		int64_t v;
		if (!ev->cookie)
			continue;
		if (ev->status == FERRY__CUFILE_COMPLETE)
			v = ferry__gds_result((ssize_t)ev->ret, "cuFile batch I/O");
		else if (ev->status & (FERRY__CUFILE_FAILED | FERRY__CUFILE_CANCELED | FERRY__CUFILE_INVALID |
				       FERRY__CUFILE_TIMEOUT))
			v = ferry__error(FERRY_ECUFILE, "cuFile batch I/O: status 0x%x", ev->status);
		else
			continue;
		r->inflight--;
		done(r, ev->cookie, v);
	}
	return (int)(got + take_done(r, tags + got, res + got, max - got));
}

const struct ferry__backend_ops ferry__backend_cufile = {
	.name = "cufile",
	.caps = FERRY__CAP_DEVICE,
	.probe = cufile_probe,
	.ring_init = cufile_init,
	.ring_exit = cufile_exit,
	.prep = cufile_prep,
	.submit = cufile_submit,
	.reap = cufile_reap,
};

void ferry__gds_complete(struct ferry__chunk *c, int64_t res)
{
	const char *call = c->is_write ? "cuFileWrite" : "cuFileRead";

	if (res >= 0)
		c->result = res;
	else if (res == FERRY_ECUFILE) { /* the backend said why */
		ferry__error_append("%s(%s, offset %llu, %zu bytes)", call, c->f->path,
				    (unsigned long long)c->off, c->len);
		c->result = res;
	} else {
		c->result = ferry__error((int)res, "%s(%s, offset %llu, %zu bytes)", call, c->f->path,
					 (unsigned long long)c->off, c->len);
	}
}
