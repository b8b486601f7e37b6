/* io_uring backend (liburing). Rings are per owner thread; registered files and buffers where the
 * kernel allows, plain descriptors and buffers otherwise. Probed once at run time. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#ifdef FERRY_HAVE_LIBURING
#include <liburing.h>

struct ferry__ring {
	struct io_uring ring;
	bool fixed_files;
	bool fixed_bufs;
	bool owner_only;
	/* sparse buffer table: slot i is registered the first time an op uses it (lazy[i]: its
	 * iovec, len 0 once registered or refused; refused[i]: plain I/O for it) */
	struct iovec *lazy;
	bool *refused;
	unsigned nlazy;
};

static struct {
	pthread_once_t once;
	int err;
	char why[256];
} probe_state = {PTHREAD_ONCE_INIT};

static void probe_once(void)
{
	struct io_uring ring;
	FILE *f;
	int v = 0, ret;

	/* kernel.io_uring_disabled: 0 enabled, 1 only for io_uring_group, 2 disabled (6.6+) */
	f = fopen("/proc/sys/kernel/io_uring_disabled", "r");
	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = 0;
		fclose(f);
	}
	ret = io_uring_queue_init(4, &ring, 0);
	if (ret < 0) {
		probe_state.err = FERRY_EBACKEND;
		if (v)
			snprintf(probe_state.why, sizeof(probe_state.why),
				 "io_uring: io_uring_setup failed (%s); kernel.io_uring_disabled=%d",
				 strerror(-ret), v);
		else if (ret == -ENOSYS)
			snprintf(probe_state.why, sizeof(probe_state.why),
				 "io_uring: the kernel has no io_uring (io_uring_setup: ENOSYS)");
		else
			snprintf(probe_state.why, sizeof(probe_state.why),
				 "io_uring: io_uring_setup failed: %s (seccomp or container policy?)",
				 strerror(-ret));
		return;
	}
	io_uring_queue_exit(&ring);
}

static int uring_probe(char *why, size_t len)
{
	pthread_once(&probe_state.once, probe_once);
	if (probe_state.err && why)
		snprintf(why, len, "%s", probe_state.why);
	return probe_state.err;
}

static int uring_init(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o)
{
	struct io_uring_params p;
	struct ferry__ring *r = calloc(1, sizeof(*r));
	int ret;

	if (!r)
		return -ENOMEM;
	memset(&p, 0, sizeof(p));
	if (o->sqpoll) {
		p.flags |= IORING_SETUP_SQPOLL;
		p.sq_thread_idle = 50; /* ms before the poller sleeps */
	}
	/* COOP_TASKRUN (5.19) avoids interrupting the submitter for completion work; retry without
	 * it on older kernels, liburing's habit for optional setup flags. */
	if (!o->no_coop) /* the uring_no_coop knob, for comparison */
		p.flags |= IORING_SETUP_COOP_TASKRUN;
	/*
	 * A ring only its creating thread touches (a ferry_queue) defers completion work to that
	 * thread's next io_uring_enter with GETEVENTS (DEFER_TASKRUN, 6.1; needs SINGLE_ISSUER), as
	 * fio 3.33 does: on /dev/shm, where every I/O goes to io-wq and its completion comes back
	 * as task work, it took ferry bench's 4 KiB QD64 rows from 0.80-1.09x fio to 1.02-1.34x,
	 * with less CPU per GB than fio (5 rounds on the GPU machine). TASKRUN_FLAG lets a
	 * peek see that completions wait to be run. uring_defer=0 leaves it off (for comparison).
	 */
	bool defer = o->owner_only && !o->sqpoll && !o->no_defer;
	r->owner_only = o->owner_only;
	if (defer)
		p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
	ret = io_uring_queue_init_params(depth, &r->ring, &p);
	if (ret == -EINVAL && defer) { /* before 6.1 */
		p.flags = IORING_SETUP_COOP_TASKRUN;
		ret = io_uring_queue_init_params(depth, &r->ring, &p);
	}
	if (ret == -EINVAL) {
		p.flags &= ~IORING_SETUP_COOP_TASKRUN;
		ret = io_uring_queue_init_params(depth, &r->ring, &p);
	}
	if (ret < 0) {
		free(r);
		return ret;
	}
	/*
	 * Registered buffers pin their pages: registering a worker's 16 slots at once faulted in and
	 * pinned 18 MiB per worker at the context's start (12 workers: 216 MiB before the first
	 * byte of a fresh process, issue 22), although reads of resident data into GPU memory go
	 * through copy units and never touch the slots. A sparse table (5.19) is filled slot by slot
	 * as ops first use them; a kernel without it registers them all here, as before.
	 */
	if (o->reg && o->nbufs) {
		r->lazy = malloc(o->nbufs * sizeof(*r->lazy));
		r->refused = calloc(o->nbufs, sizeof(*r->refused));
		if (r->lazy && r->refused && io_uring_register_buffers_sparse(&r->ring, o->nbufs) == 0) {
			memcpy(r->lazy, o->bufs, o->nbufs * sizeof(*r->lazy));
			r->nlazy = o->nbufs;
			r->fixed_bufs = true;
		} else {
			free(r->lazy);
			free(r->refused);
			r->lazy = NULL;
			r->refused = NULL;
			r->fixed_bufs = io_uring_register_buffers(&r->ring, o->bufs, o->nbufs) == 0;
		}
	}
	*out = r;
	return 0;
}

static void uring_exit(struct ferry__ring *r)
{
	if (!r)
		return;
	io_uring_queue_exit(&r->ring);
	free(r->lazy);
	free(r->refused);
	free(r);
}

/* Whether op's buffer is a registered one, registering its slot on first use. */
static bool fixed_buf(struct ferry__ring *r, const struct ferry__op *op)
{
	if (!r->fixed_bufs || op->buf_index < 0)
		return false;
	unsigned i = (unsigned)op->buf_index;
	if (!r->lazy || i >= r->nlazy)
		return !r->lazy; /* registered at setup */
	if (r->lazy[i].iov_len) {
		uint64_t t0 = FERRY__SPAN_T0();
		r->refused[i] = io_uring_register_buffers_update_tag(&r->ring, i, &r->lazy[i], NULL, 1) != 1;
		r->lazy[i].iov_len = 0;
		FERRY__MARK("uring_buf_registered", ferry__worker_index, t0);
	}
	return !r->refused[i];
}

static int uring_files_init(struct ferry__ring *r, unsigned n)
{
	int ret = io_uring_register_files_sparse(&r->ring, n);

	r->fixed_files = ret == 0;
	return ret;
}

static int uring_files_update(struct ferry__ring *r, unsigned slot, int fd)
{
	if (!r->fixed_files)
		return -ENXIO;
	int ret = io_uring_register_files_update(&r->ring, slot, &fd, 1);
	/* an owner ring's slot that could not be set would be stale: plain descriptors from now on
	 * (only the owner updates and uses such a ring, so this is not a race) */
	if (ret < 0 && r->owner_only)
		r->fixed_files = false;
	return ret < 0 ? ret : 0;
}

static int uring_prep(struct ferry__ring *r, const struct ferry__op *op)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	int fd = op->fd;

	if (!sqe)
		return -EBUSY;
	if (r->fixed_files && op->fixed_file >= 0)
		fd = op->fixed_file;
	if (fixed_buf(r, op)) {
		if (op->is_write)
			io_uring_prep_write_fixed(sqe, fd, op->addr, (unsigned)op->len, op->off,
						  op->buf_index);
		else
			io_uring_prep_read_fixed(sqe, fd, op->addr, (unsigned)op->len, op->off,
						 op->buf_index);
	} else if (op->is_write) {
		io_uring_prep_write(sqe, fd, op->addr, (unsigned)op->len, op->off);
	} else {
		io_uring_prep_read(sqe, fd, op->addr, (unsigned)op->len, op->off);
	}
	if (fd != op->fd)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, op->tag);
	return 0;
}

static int uring_submit(struct ferry__ring *r)
{
	int ret;

	do {
		ret = io_uring_submit(&r->ring);
	} while (ret == -EINTR);
	return ret;
}

static int uring_reap(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max)
{
	struct io_uring_cqe *cqes[64];
	unsigned got = 0;

	for (;;) {
		unsigned want = max - got < 64 ? max - got : 64;
		unsigned n = io_uring_peek_batch_cqe(&r->ring, cqes, want);
		for (unsigned i = 0; i < n; i++) {
			tags[got + i] = io_uring_cqe_get_data(cqes[i]);
			res[got + i] = cqes[i]->res;
		}
		io_uring_cq_advance(&r->ring, n);
		got += n;
		if (got >= min || got >= max)
			return (int)got;
		struct io_uring_cqe *cqe;
		int ret = io_uring_wait_cqe(&r->ring, &cqe);
		if (ret < 0 && ret != -EINTR && ret != -ETIME)
			return got ? (int)got : ret;
	}
}

/*
 * A submit followed by a wait costs two io_uring_enter calls; one with GETEVENTS does both, and
 * returns at once when a completion is already there. For 262,144 reads of 4 KiB from tmpfs at
 * QD64 in batches, 183K io_uring_enter calls instead of 322K (ferry bench).
 */
static int uring_submit_reap(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max)
{
	int ret;

	do {
		ret = io_uring_submit_and_wait(&r->ring, min ? 1 : 0);
	} while (ret == -EINTR);
	if (ret < 0)
		return ret;
	return uring_reap(r, min, tags, res, max);
}

const struct ferry__backend_ops ferry__backend_uring = {
	.name = "io_uring",
	.caps = FERRY__CAP_HOST,
	.probe = uring_probe,
	.ring_init = uring_init,
	.ring_exit = uring_exit,
	.files_init = uring_files_init,
	.files_update = uring_files_update,
	.prep = uring_prep,
	.submit = uring_submit,
	.reap = uring_reap,
	.submit_reap = uring_submit_reap,
};

#else /* !FERRY_HAVE_LIBURING */

static int uring_probe(char *why, size_t len)
{
	if (why)
		snprintf(why, len, "io_uring: ferry was built without liburing (install liburing-dev "
				   "and rebuild)");
	return FERRY_EBACKEND;
}

static int uring_init(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o)
{
	return FERRY_EBACKEND;
}

const struct ferry__backend_ops ferry__backend_uring = {
	.name = "io_uring",
	.caps = FERRY__CAP_HOST,
	.probe = uring_probe,
	.ring_init = uring_init,
};
#endif

const struct ferry__backend_ops *const ferry__backends[] = {&ferry__backend_uring, &ferry__backend_psync,
							   &ferry__backend_cufile, &ferry__backend_remote, NULL};
