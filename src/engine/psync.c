/* psync: each operation is a pread/pwrite done at submit, like fio's psync engine. Parallelism
 * comes from the workers (threads), not from queue depth. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/remote.h"

struct ferry__ring {
	unsigned depth;
	unsigned nq, ndone;
	struct ferry__op *q;
	void **done_tags;
	int64_t *done_res;
};

int64_t ferry__psync_do(const struct ferry__op *op)
{
	if (op->remote) /* a remote object (no descriptor): ranged GETs or parts of an upload (remote.c) */
		return op->is_write ? ferry__remote_write(op->remote, op->addr, op->len, op->off)
				    : ferry__remote_read(op->remote, op->addr, op->len, op->off);
	ssize_t n = op->is_write ? pwrite(op->fd, op->addr, op->len, (off_t)op->off)
				 : pread(op->fd, op->addr, op->len, (off_t)op->off);
	return n < 0 ? -errno : n;
}

static int psync_probe(char *why, size_t len)
{
	(void)why;
	(void)len;
	return 0;
}

static int psync_init(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o)
{
	struct ferry__ring *r = calloc(1, sizeof(*r));

	(void)o;
	if (!r)
		return -ENOMEM;
	r->depth = depth;
	r->q = calloc(depth, sizeof(*r->q));
	r->done_tags = calloc(depth, sizeof(*r->done_tags));
	r->done_res = calloc(depth, sizeof(*r->done_res));
	if (!r->q || !r->done_tags || !r->done_res) {
		free(r->q);
		free(r->done_tags);
		free(r->done_res);
		free(r);
		return -ENOMEM;
	}
	*out = r;
	return 0;
}

static void psync_exit(struct ferry__ring *r)
{
	if (!r)
		return;
	free(r->q);
	free(r->done_tags);
	free(r->done_res);
	free(r);
}

static int psync_prep(struct ferry__ring *r, const struct ferry__op *op)
{
	if (r->nq + r->ndone >= r->depth)
		return -EBUSY;
	r->q[r->nq++] = *op;
	return 0;
}

static int psync_submit(struct ferry__ring *r)
{
	unsigned n = r->nq;

	for (unsigned i = 0; i < n; i++) {
		r->done_tags[r->ndone] = r->q[i].tag;
		r->done_res[r->ndone] = ferry__psync_do(&r->q[i]);
		r->ndone++;
	}
	r->nq = 0;
	return (int)n;
}

static int psync_reap(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max)
{
	unsigned n = r->ndone < max ? r->ndone : max;

	(void)min; /* everything submitted is already complete */
	for (unsigned i = 0; i < n; i++) {
		tags[i] = r->done_tags[i];
		res[i] = r->done_res[i];
	}
	for (unsigned i = n; i < r->ndone; i++) {
		r->done_tags[i - n] = r->done_tags[i];
		r->done_res[i - n] = r->done_res[i];
	}
	r->ndone -= n;
	return (int)n;
}

const struct ferry__backend_ops ferry__backend_psync = {
	.name = "psync",
	.caps = FERRY__CAP_HOST,
	.probe = psync_probe,
	.ring_init = psync_init,
	.ring_exit = psync_exit,
	.prep = psync_prep,
	.submit = psync_submit,
	.reap = psync_reap,
};
