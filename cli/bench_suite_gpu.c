/*
 * ferry bench --suite, the GPU rows: storage into GPU memory by transfer mode beside the pinned copy
 * ceiling, a safetensors model loaded into GPU memory beside pread + cudaMemcpy, a checkpoint saved
 * from GPU memory (synchronous and asynchronous), and the loader feeding a GPU. All through the
 * public API (the library's dlopen'ed CUDA shim): the CLI links no CUDA. Without a usable GPU each
 * section says skipped and why.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench_suite.h"
#include "ferry/data.h"
#include "ferry/gpu.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

#define MiB (1024ull * 1024)

struct grow {
	char label[96];
	double gbps;
	char note[160];
	char skipped[1024];
	int ran;
};

enum { G_XFER, G_ST, G_CKPT, G_LOADER, G_N };

struct gsection {
	const char *title;
	const char *ceiling_label; /* the ceiling drawn on the chart */
	double ceiling;            /* GB/s; 0: none */
	struct grow rows[6];
	unsigned nrows;
	char reading[640];
	char skipped[1024];
};

static struct gsection gs[G_N] = {
	[G_XFER] = {"GPU: storage into GPU memory by transfer mode (-x)", "pinned host-to-device copy"},
	[G_ST] = {"GPU: a safetensors model loaded into GPU memory", "pinned host-to-device copy"},
	[G_CKPT] = {"GPU: a checkpoint saved from GPU memory", "pinned device-to-host copy"},
	[G_LOADER] = {"GPU: the loader feeding GPU memory", "pinned host-to-device copy"},
};

static char skip_line[1024];
static char model_path[4200], dataset_dir[4200]; /* removed by suite_gpu_cleanup on a signal */

/* Every row, declared before anything runs so that a skipped one is listed with its reason. */
static const char *const row_labels[G_N][6] = {
	[G_XFER] = {"gds (GPUDirect Storage)", "cpu-gpu (bounce buffers)", "pagecache-gpu (page cache)",
		    "storage to host memory (host rows)"},
	[G_ST] = {"ferry (ferry_st_load_run)", "pread + cudaMemcpy, pageable"},
	[G_CKPT] = {"save, synchronous (durable, xxh3)", "save_async, until durable", "save_async, caller blocked"},
	[G_LOADER] = {"loader, peak (no step)", "loader, step at 80% of peak"},
};

static void declare_rows(const char *why)
{
	for (int i = 0; i < G_N; i++) {
		struct gsection *s = &gs[i];
		for (s->nrows = 0; row_labels[i][s->nrows]; s->nrows++) {
			struct grow *r = &s->rows[s->nrows];
			memset(r, 0, sizeof(*r));
			snprintf(r->label, sizeof(r->label), "%s", row_labels[i][s->nrows]);
			if (why)
				snprintf(r->skipped, sizeof(r->skipped), "%s", why);
		}
	}
}

static void row_failed(struct grow *r, int err)
{
	snprintf(r->skipped, sizeof(r->skipped), "%s: %s", ferry_strerror(err), ferry_last_error());
}

static double pct(double a, double b)
{
	return b > 0 ? 100 * a / b : 0;
}

/* ------------------------------------------------------------------------------ transfer modes */

static void run_xfer(const struct suite_gpu_in *in, double htod)
{
	struct gsection *s = &gs[G_XFER];
	const struct {
		int x;
		const char *label;
	} modes[] = {{BENCH_X(0), row_labels[G_XFER][0]}, {BENCH_X(2), row_labels[G_XFER][1]},
		     {BENCH_X(4), row_labels[G_XFER][2]}};
	char why[512];
	int gds = ferry_gds_status(in->file, why, sizeof(why));
	struct grow *best = NULL;
	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		struct grow *r = &s->rows[m];
		if (in->tick)
			in->tick(in->arg, modes[m].label);
		if (modes[m].x == BENCH_X(0) && gds == FERRY_GDS_REFUSED) {
			snprintf(r->skipped, sizeof(r->skipped), "cuFile refused the file: %s", why);
			continue;
		}
		if (modes[m].x == BENCH_X(0) && gds < 0) {
			snprintf(r->skipped, sizeof(r->skipped), "cuFile: %s: %s", ferry_strerror(gds), why);
			continue;
		}
		struct bench_job_opts o = {
			.name = r->label,
			.filename = in->file,
			.rw = BENCH_READ,
			.bs = 4 * MiB,
			.size = in->size,
			.numjobs = 1,
			.iodepth = 8,
			.direct = BENCH_DIRECT_AUTO,
			.ioengine = "auto",
			.runtime = in->runtime,
			.randseed = 0x6665727279ull,
			.quiet = 1,
			.xmode = modes[m].x,
			.gpu = 0,
		};
		struct bench_result *res = calloc(1, sizeof(*res));
		if (!res) {
			snprintf(r->skipped, sizeof(r->skipped), "out of memory");
			continue;
		}
		bench_error_sink = r->skipped;
		bench_error_sink_len = sizeof(r->skipped);
		int bad = bench_run(&o, res);
		bench_error_sink = NULL;
		if (!bad) {
			r->ran = 1;
			r->gbps = bench_gbps(res);
			snprintf(r->note, sizeof(r->note), "%.0f%% of the copy ceiling%s", pct(r->gbps, htod),
				 modes[m].x == BENCH_X(0) && gds == FERRY_GDS_COMPAT ? "; cuFile in compatibility mode" : "");
			if (!best || r->gbps > best->gbps)
				best = r;
		} else if (!r->skipped[0]) {
			snprintf(r->skipped, sizeof(r->skipped), "the run failed");
		}
		free(res);
	}
	if (in->storage_gbps > 0) {
		struct grow *r = &s->rows[3];
		r->ran = 1;
		r->gbps = in->storage_gbps;
		snprintf(r->note, sizeof(r->note), "read 1 MiB QD16 direct, the storage's own rate");
	} else {
		snprintf(s->rows[3].skipped, sizeof(s->rows[3].skipped), "the host row did not run");
	}
	if (best)
		snprintf(s->reading, sizeof(s->reading),
			 "best into GPU memory: %s at %.3f GB/s, %.0f%% of the pinned copy ceiling (%.3f GB/s)%s%.0f%% "
			 "of storage to host memory: %s",
			 best->label, best->gbps, pct(best->gbps, htod), htod, in->storage_gbps > 0 ? " and " : "",
			 in->storage_gbps > 0 ? pct(best->gbps, in->storage_gbps) : 0,
			 in->storage_gbps > 0 && best->gbps >= 0.8 * in->storage_gbps
				 ? "storage is the limit, not the copy to the GPU; ferry's path costs little here."
			 : best->gbps >= 0.8 * htod ? "the PCIe copy is the limit: only GDS or faster links go further."
						   : "neither storage nor the copy ceiling is reached: try larger requests or more depth (ferry bench -x all).");
	else
		snprintf(s->skipped, sizeof(s->skipped), "no transfer mode could run here");
}

/* --------------------------------------------------------------------------------- the model */

struct model {
	size_t n, each;
	void *host;           /* each bytes of pattern, shared by every tensor */
	void **dev;           /* device copies (checkpoint) */
};

static int model_write(ferry_ctx *ctx, const struct model *m, void *const *ptrs, const char *path, int flags,
		       ferry_st_writer **wout)
{
	ferry_st_writer *w;
	int r = ferry_st_writer_create(ctx, &w);
	if (r)
		return r;
	for (size_t i = 0; i < m->n && !r; i++) {
		char nm[64];
		uint64_t shape[2] = {m->each / 2 / 1024, 1024};
		snprintf(nm, sizeof(nm), "model.layers.%zu.weight", i);
		int64_t k = ferry_st_writer_add(w, nm, FERRY_DT_BF16, 2, shape, ptrs ? ptrs[i] : m->host, m->each);
		r = k < 0 ? (int)k : 0;
	}
	if (!r && !wout) {
		int64_t s = ferry_st_writer_save(w, path, flags);
		r = s < 0 ? (int)s : 0;
	}
	if (wout && !r)
		*wout = w;
	else
		ferry_st_writer_destroy(w);
	return r;
}

/* pread into pageable host memory, then a synchronous copy, tensor by tensor: what a plain loader does. */
static int baseline_load(ferry_st_load *ld, const char *path, double *secs, char *why, size_t whylen)
{
	ferry_st *st = ferry_st_load_file(ld, 0);
	size_t n = ferry_st_count(st), maxb = 0;
	for (size_t i = 0; i < n; i++)
		if (ferry_st_nbytes(st, i) > maxb)
			maxb = ferry_st_nbytes(st, i);
	void **dev = calloc(n, sizeof(*dev));
	char *buf = malloc(maxb ? maxb : 1);
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = 0;
	if (!dev || !buf || fd < 0) {
		r = fd < 0 ? -errno : -ENOMEM;
		snprintf(why, whylen, "%.600s: %s", path, strerror(-r));
	}
	double t0 = ferry_tools_now_s();
	for (size_t i = 0; i < n && !r; i++) {
		size_t len = ferry_st_nbytes(st, i), got = 0;
		uint64_t off = ferry_st_offset(st, i);
		while (got < len) {
			ssize_t k = pread(fd, buf + got, len - got, (off_t)(off + got));
			if (k <= 0) {
				r = k < 0 ? -errno : -EIO;
				snprintf(why, whylen, "pread(%.600s) at offset %" PRIu64 ": %s", path, off + got,
					 k < 0 ? strerror(-r) : "end of file");
				break;
			}
			got += (size_t)k;
		}
		if (!r)
			r = ferry_gpu_malloc(0, len, &dev[i]);
		if (!r)
			r = ferry_gpu_memcpy_htod(dev[i], buf, len);
		if (r && !why[0])
			snprintf(why, whylen, "%s: %s", ferry_strerror(r), ferry_last_error());
	}
	*secs = ferry_tools_now_s() - t0;
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; dev && i < n; i++)
		(void)ferry_gpu_free(dev[i]);
	free(dev);
	free(buf);
	return r;
}

static void run_st(ferry_ctx *ctx, const struct suite_gpu_in *in, const struct model *m, const char *path,
		   double htod)
{
	struct gsection *s = &gs[G_ST];
	double gb = (double)(m->n * m->each) / 1e9;
	struct grow *rf = &s->rows[0], *rb = &s->rows[1];
	if (in->tick)
		in->tick(in->arg, "safetensors load");
	int r = model_write(ctx, m, NULL, path, 0, NULL);
	ferry_st_load *ld = NULL;
	if (!r)
		r = ferry_st_load_open(ctx, path, &ld);
	if (r) {
		row_failed(rf, r);
		snprintf(rb->skipped, sizeof(rb->skipped), "%s", rf->skipped);
		snprintf(s->skipped, sizeof(s->skipped), "writing the model failed: %.900s", rf->skipped);
		ferry_st_load_destroy(ld);
		return;
	}
	double tb = 0, tf = 0;
	ferry_tools_drop_cache(path);
	char bwhy[900] = "";
	int rb_err = baseline_load(ld, path, &tb, bwhy, sizeof(bwhy));
	ferry_tools_drop_cache(path);
	double t0 = ferry_tools_now_s();
	int rf_err = ferry_st_load_run(ld, 0, 0, 0);
	tf = ferry_tools_now_s() - t0;
	if (rf_err)
		row_failed(rf, rf_err);
	else {
		rf->ran = 1;
		rf->gbps = gb / tf;
		snprintf(rf->note, sizeof(rf->note), "%.2f GB in %.3f s, %.0f%% of the copy ceiling", gb, tf,
			 pct(rf->gbps, htod));
	}
	if (rb_err)
		snprintf(rb->skipped, sizeof(rb->skipped), "%s", bwhy);
	else {
		rb->ran = 1;
		rb->gbps = gb / tb;
		snprintf(rb->note, sizeof(rb->note), "%.2f GB in %.3f s", gb, tb);
	}
	ferry_st_load_destroy(ld);
	if (rf->ran && rb->ran)
		snprintf(s->reading, sizeof(s->reading),
			 "ferry loaded %zu tensors (%.2f GB, cache dropped before each) at %.3f GB/s, %.1fx the plain "
			 "read-then-copy (%.3f GB/s): %s",
			 m->n, gb, rf->gbps, rf->gbps / rb->gbps, rb->gbps,
			 rf->gbps >= 1.2 * rb->gbps ? "reading and copying overlap in pinned buffers, so a model load is "
						     "bounded by storage or PCIe, not by their sum."
						   : "little gain here: the storage (or the page cache) is the limit for both.");
	else
		snprintf(s->skipped, sizeof(s->skipped), "a row failed: %.900s", rf->ran ? rb->skipped : rf->skipped);
}

static void run_ckpt(ferry_ctx *ctx, const struct suite_gpu_in *in, const struct model *m, const char *path,
		     double dtoh)
{
	struct gsection *s = &gs[G_CKPT];
	double gb = (double)(m->n * m->each) / 1e9;
	struct grow *rs = &s->rows[0], *ra = &s->rows[1], *rk = &s->rows[2];
	if (in->tick)
		in->tick(in->arg, "checkpoint save");
	void **dev = calloc(m->n, sizeof(*dev));
	int r = dev ? 0 : -ENOMEM;
	for (size_t i = 0; i < m->n && !r; i++) {
		r = ferry_gpu_malloc(0, m->each, &dev[i]);
		if (!r)
			r = ferry_gpu_memcpy_htod(dev[i], m->host, m->each);
	}
	ferry_st_writer *w = NULL;
	if (!r)
		r = model_write(ctx, m, dev, path, 0, &w);
	double ts = 0, ta = 0, tk = 0, tk_first = 0;
	if (!r) {
		double t0 = ferry_tools_now_s();
		int64_t k = ferry_st_writer_save(w, path, FERRY_SAVE_CHECKSUM);
		ts = ferry_tools_now_s() - t0;
		r = k < 0 ? (int)k : 0;
	}
	/* Twice: the first also allocates and pins the snapshot's memory, which later saves reuse. */
	for (int rep = 0; rep < 2 && !r; rep++) {
		double t0 = ferry_tools_now_s();
		r = ferry_st_writer_save_async(w, path, FERRY_SAVE_CHECKSUM);
		tk = ferry_tools_now_s() - t0;
		int64_t k = r ? r : ferry_st_writer_wait(w, -1);
		ta = ferry_tools_now_s() - t0;
		r = k < 0 ? (int)k : 0;
		if (!rep)
			tk_first = tk;
	}
	ferry_st_writer_destroy(w);
	for (size_t i = 0; dev && i < m->n; i++)
		(void)ferry_gpu_free(dev[i]);
	free(dev);
	if (r) {
		row_failed(rs, r);
		snprintf(ra->skipped, sizeof(ra->skipped), "%s", rs->skipped);
		snprintf(rk->skipped, sizeof(rk->skipped), "%s", rs->skipped);
		snprintf(s->skipped, sizeof(s->skipped), "the save failed: %.900s", rs->skipped);
		return;
	}
	rs->ran = ra->ran = rk->ran = 1;
	rs->gbps = gb / ts;
	snprintf(rs->note, sizeof(rs->note), "%.3f s, %.0f%% of the device-to-host ceiling", ts, pct(rs->gbps, dtoh));
	ra->gbps = gb / ta;
	snprintf(ra->note, sizeof(ra->note), "%.3f s (second save: snapshot memory kept)", ta);
	rk->gbps = tk > 0 ? gb / tk : 0;
	snprintf(rk->note, sizeof(rk->note), "blocked %.3f s (first save %.3f s): the snapshot to host", tk, tk_first);
	snprintf(s->reading, sizeof(s->reading),
		 "a %.2f GB checkpoint from GPU memory: a synchronous save blocked training %.3f s; save_async blocked "
		 "it %.3f s (%.0f%% of that) and was durable %.3f s later: %s",
		 gb, ts, tk, pct(tk, ts), ta - tk,
		 tk < 0.5 * ts ? "save asynchronously; training waits only for the copy out of GPU memory."
			       : "the snapshot costs most of the save here (storage as fast as the copy): async gains little.");
}

/* ------------------------------------------------------------------------------------- loader */

static void rm_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(dir);
}

static double metric(ferry_loader *l, const char *name)
{
	double v = 0;
	return ferry_loader_metric(l, name, &v) < 0 ? 0 : v;
}

/* One run for `seconds`; a step of step_s (busy wait: the "GPU" computing) after each batch. */
static int loader_run(ferry_dataset *ds, double seconds, double step_s, double *sps, double *bps, double *wait)
{
	ferry_loader *l;
	int r = ferry_loader_create(ds, &l);
	if (r)
		return r;
	if (!(r = ferry_loader_set(l, "device", "0")) && !(r = ferry_loader_set(l, "batch_size", "32")) &&
	    !(r = ferry_loader_set(l, "order", "shuffle")) && !(r = ferry_loader_set(l, "threads", "2")))
		r = ferry_loader_start(l);
	double t0 = ferry_tools_now_s();
	ferry_loader_batch *b;
	while (!r && (r = ferry_loader_next(l, &b)) == 1) {
		r = 0;
		double s = ferry_tools_now_s();
		while (step_s > 0 && ferry_tools_now_s() - s < step_s)
			;
		ferry_loader_batch_destroy(b);
		if (ferry_tools_now_s() - t0 >= seconds)
			break;
	}
	double el = ferry_tools_now_s() - t0;
	if (r == 0 || r == 1) {
		r = 0;
		*sps = metric(l, "samples_per_s");
		*bps = metric(l, "bytes_per_s");
		*wait = el > 0 ? metric(l, "wait_total_ns") / 1e9 / el : 0;
	}
	ferry_loader_destroy(l);
	return r;
}

static void run_loader(ferry_ctx *ctx, const struct suite_gpu_in *in, uint64_t bytes, double htod)
{
	struct gsection *s = &gs[G_LOADER];
	struct grow *rp = &s->rows[0], *rf = &s->rows[1];
	if (in->tick)
		in->tick(in->arg, "loader");
	char *dir = dataset_dir;
	snprintf(dataset_dir, sizeof(dataset_dir), "%s/ferry-suite-ds-%d", in->dir, (int)getpid());
	const size_t sample = 64 * 1024;
	uint64_t n = bytes / sample;
	ferry_dataset_writer *w = NULL;
	ferry_dataset *ds = NULL;
	char *buf = malloc(sample);
	int r = buf ? ferry_dataset_writer_create(ctx, dir, FERRY_WRITE_FERRY, FERRY_DT_BYTES, 0, &w) : -ENOMEM;
	for (uint64_t i = 0; i < n && !r; i++) {
		int64_t k = ferry_dataset_writer_add(w, sample, NULL, 0, 0);
		r = k < 0 ? (int)k : 0;
	}
	if (!r) {
		int k = ferry_dataset_writer_layout(w);
		r = k < 0 ? k : 0;
	}
	for (uint64_t i = 0; i < n && !r; i++) {
		memset(buf, (int)(i & 0xff), sample);
		r = ferry_dataset_writer_put(w, i, buf, sample);
	}
	if (!r)
		r = ferry_dataset_writer_finish(w);
	ferry_dataset_writer_destroy(w);
	free(buf);
	if (!r)
		r = ferry_dataset_open(ctx, dir, &ds);
	double sps = 0, bps = 0, wait = 0, fsps = 0, fbps = 0, fwait = 0, step = 0;
	if (!r)
		r = loader_run(ds, in->runtime / 2, 0, &sps, &bps, &wait);
	if (!r && sps > 0) {
		step = 32 / (0.8 * sps);
		r = loader_run(ds, in->runtime / 2, step, &fsps, &fbps, &fwait);
	}
	ferry_dataset_destroy(ds);
	rm_tree(dir);
	dataset_dir[0] = 0;
	if (r) {
		row_failed(rp, r);
		snprintf(rf->skipped, sizeof(rf->skipped), "%s", rp->skipped);
		snprintf(s->skipped, sizeof(s->skipped), "the loader failed: %.900s", rp->skipped);
		return;
	}
	rp->ran = rf->ran = 1;
	rp->gbps = bps / 1e9;
	snprintf(rp->note, sizeof(rp->note), "%.0f samples/s of 64 KiB, batches of 32; consumer waited %.0f%%", sps,
		 100 * wait);
	rf->gbps = fbps / 1e9;
	snprintf(rf->note, sizeof(rf->note), "%.0f samples/s; step %.2f ms; GPU waited %.1f%% of the time", fsps,
		 step * 1e3, 100 * fwait);
	snprintf(s->reading, sizeof(s->reading),
		 "the loader put %.0f samples/s (%.3f GB/s, %.0f%% of the copy ceiling) into GPU memory; a training step "
		 "needing 80%% of that rate waited for data %.1f%% of the time: %s",
		 sps, bps / 1e9, pct(bps / 1e9, htod), 100 * fwait,
		 fwait < 0.05 ? "the loader keeps the GPU fed; the step, not the data, sets the pace."
			      : "the GPU starves at this rate: more loader threads, more prefetch, or faster storage.");
}

/* ---------------------------------------------------------------------------------------- run */

unsigned suite_gpu_steps(void)
{
	/* the ceiling, the transfer modes, the model, the checkpoint, the loader; none without a GPU */
	return ferry_gpu_available(NULL, 0) ? 1 + 3 + 3 : 0;
}

/* What ferry doctor's check `id` found ("" if it has none): the machine's side of a missing GPU. */
static void doctor_value(const char *id, char *buf, size_t len)
{
	ferry_report *r = NULL;
	buf[0] = 0;
	if (ferry_doctor_run(NULL, 0, &r))
		return;
	for (size_t i = 0; i < ferry_report_count(r); i++)
		if (!strcmp(ferry_report_field(r, i, "id"), id))
			snprintf(buf, len, "%s", ferry_report_field(r, i, "value"));
	ferry_report_destroy(r);
}

void suite_gpu_run(const struct suite_gpu_in *in)
{
	char why[512] = "";
	if (!ferry_gpu_available(why, sizeof(why))) {
		char pci[256];
		doctor_value("gpu.present", pci, sizeof(pci));
		snprintf(skip_line, sizeof(skip_line),
			 "GPU rows skipped (storage into GPU memory by -x mode, safetensors load, checkpoint save, "
			 "loader): no usable GPU: %s%s%s", why[0] ? why : "ferry_gpu_available said no",
			 pci[0] ? "; ferry doctor's gpu.present: " : "", pci);
		char w[600];
		snprintf(w, sizeof(w), "no usable GPU: %s", why[0] ? why : "?");
		declare_rows(w);
		for (int i = 0; i < G_N; i++)
			snprintf(gs[i].skipped, sizeof(gs[i].skipped), "%s", w);
		return;
	}
	double htod = 0, dtoh = 0;
	if (in->tick)
		in->tick(in->arg, "pinned copy ceiling");
	int err = ferry_gpu_copy_ceiling(0, 256u << 20, 5, &htod, &dtoh);
	if (err < 0) {
		snprintf(skip_line, sizeof(skip_line), "GPU rows skipped: measuring the pinned copy ceiling failed: %s: %s",
			 ferry_strerror(err), ferry_last_error());
		declare_rows(skip_line + strlen("GPU rows skipped: "));
		for (int i = 0; i < G_N; i++)
			snprintf(gs[i].skipped, sizeof(gs[i].skipped), "%s", skip_line + strlen("GPU rows skipped: "));
		return;
	}
	htod /= 1e9;
	dtoh /= 1e9;
	declare_rows(NULL);
	for (int i = 0; i < G_N; i++)
		gs[i].ceiling = i == G_CKPT ? dtoh : htod;
	run_xfer(in, htod);

	ferry_ctx *ctx = NULL;
	err = ferry_ctx_create(&ctx);
	uint64_t bytes = in->size < 256 * MiB ? in->size : 256 * MiB;
	struct model m = {.n = 16};
	m.each = (size_t)(bytes / m.n) & ~(size_t)(2 * 1024 * 2 - 1);
	if (m.each < 4096)
		m.each = 4096;
	m.host = err ? NULL : ferry_alloc_aligned(m.each);
	char *path = model_path;
	snprintf(model_path, sizeof(model_path), "%s/ferry-suite-model-%d.safetensors", in->dir, (int)getpid());
	if (!m.host) {
		const char *w = err ? ferry_last_error() : "out of memory";
		for (int i = G_ST; i < G_N; i++) {
			snprintf(gs[i].skipped, sizeof(gs[i].skipped), "%s", w);
			for (unsigned k = 0; k < gs[i].nrows; k++)
				snprintf(gs[i].rows[k].skipped, sizeof(gs[i].rows[k].skipped), "%s", w);
		}
	} else {
		for (size_t b = 0; b < m.each; b++)
			((unsigned char *)m.host)[b] = (unsigned char)(b * 131 + 7);
		run_st(ctx, in, &m, path, htod);
		unlink(path);
		run_ckpt(ctx, in, &m, path, dtoh);
		unlink(path);
		model_path[0] = 0;
		run_loader(ctx, in, bytes, htod);
		ferry_free_aligned(m.host, m.each);
	}
	ferry_ctx_destroy(ctx);
}

void suite_gpu_cleanup(void)
{
	if (model_path[0])
		unlink(model_path);
	if (dataset_dir[0])
		rm_tree(dataset_dir);
}

/* ------------------------------------------------------------------------------------- output */

void suite_gpu_print(FILE *out)
{
	if (skip_line[0]) {
		fprintf(out, "\n%s\n", skip_line);
		return;
	}
	for (int i = 0; i < G_N; i++) {
		struct gsection *s = &gs[i];
		fprintf(out, "\n%s\n", s->title);
		if (s->ceiling > 0)
			fprintf(out, "  %-40s %9.3f  ceiling, measured in this run\n", s->ceiling_label, s->ceiling);
		for (unsigned k = 0; k < s->nrows; k++) {
			struct grow *r = &s->rows[k];
			if (!r->ran)
				fprintf(out, "  %-40s skipped: %s\n", r->label, r->skipped[0] ? r->skipped : "?");
			else
				fprintf(out, "  %-40s %9.3f  %s\n", r->label, r->gbps, r->note);
		}
		if (s->reading[0])
			fprintf(out, "  -> %s\n", s->reading);
		else
			fprintf(out, "  skipped: %s\n", s->skipped[0] ? s->skipped : "?");
	}
}

/* Bars in GB/s with the ceiling as a dashed line across the chart. */
static void chart(FILE *f, const struct gsection *s)
{
	double max = s->ceiling;
	for (unsigned k = 0; k < s->nrows; k++)
		if (s->rows[k].ran && s->rows[k].gbps > max)
			max = s->rows[k].gbps;
	const int bar_h = 26, label_w = 300, chart_w = 400, top = 22;
	int h = top + (int)s->nrows * (bar_h + 8) + 8;
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\">\n",
		label_w + chart_w + 130, h);
	for (unsigned k = 0; k < s->nrows; k++) {
		const struct grow *r = &s->rows[k];
		int y = top + (int)k * (bar_h + 8);
		int w = r->ran && max > 0 ? (int)(r->gbps / max * chart_w) : 0;
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" class=\"l\">", label_w - 8, y + bar_h / 2 + 5);
		suite_html_esc(f, r->label);
		fprintf(f, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"%s\"/>\n", label_w, y,
			w > 1 ? w : 1, bar_h, r->ran ? "b" : "s");
		if (r->ran)
			fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"v\">%.3f GB/s</text>\n", label_w + w + 6,
				y + bar_h / 2 + 5, r->gbps);
		else
			fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"v\">skipped</text>\n", label_w + 6, y + bar_h / 2 + 5);
	}
	if (s->ceiling > 0 && max > 0) {
		int x = label_w + (int)(s->ceiling / max * chart_w);
		fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"ceil\"/>\n", x, top - 4, x, h - 4);
		fprintf(f, "<text x=\"%d\" y=\"14\" text-anchor=\"end\" class=\"ceil-t\">ceiling: ", x + 4);
		suite_html_esc(f, s->ceiling_label);
		fprintf(f, " %.3f GB/s</text>\n", s->ceiling);
	}
	fprintf(f, "</svg>\n");
}

void suite_gpu_html(FILE *f)
{
	if (skip_line[0]) {
		fprintf(f, "<h2>GPU</h2>\n<p class=\"skip\">");
		suite_html_esc(f, skip_line);
		fprintf(f, "</p>\n");
		return;
	}
	for (int i = 0; i < G_N; i++) {
		struct gsection *s = &gs[i];
		fprintf(f, "<h2>");
		suite_html_esc(f, s->title);
		fprintf(f, "</h2>\n<table>\n<tr><th>case</th><th>GB/s</th><th>note</th></tr>\n");
		if (s->ceiling > 0) {
			fprintf(f, "<tr><td>");
			suite_html_esc(f, s->ceiling_label);
			fprintf(f, " (ceiling)</td><td>%.3f</td><td>measured in this run</td></tr>\n", s->ceiling);
		}
		for (unsigned k = 0; k < s->nrows; k++) {
			struct grow *r = &s->rows[k];
			fprintf(f, "<tr><td>");
			suite_html_esc(f, r->label);
			if (r->ran) {
				fprintf(f, "</td><td>%.3f</td><td>", r->gbps);
				suite_html_esc(f, r->note);
			} else {
				fprintf(f, "</td><td colspan=\"2\" class=\"skip\">skipped: ");
				suite_html_esc(f, r->skipped[0] ? r->skipped : "?");
			}
			fprintf(f, "</td></tr>\n");
		}
		fprintf(f, "</table>\n");
		if (s->reading[0]) {
			chart(f, s);
			fprintf(f, "<p class=\"reading\">");
			suite_html_esc(f, s->reading);
		} else {
			fprintf(f, "<p class=\"skip\">skipped: ");
			suite_html_esc(f, s->skipped[0] ? s->skipped : "?");
		}
		fprintf(f, "</p>\n");
	}
}

void suite_gpu_json(struct bench_json *j)
{
	if (skip_line[0])
		bench_json_str(j, "gpu_skipped", skip_line);
	bench_json_arr(j, "gpu");
	for (int i = 0; i < G_N; i++) {
		struct gsection *s = &gs[i];
		bench_json_obj(j, NULL);
		bench_json_str(j, "section", s->title);
		bench_json_str(j, "metric", "GB/s");
		if (s->ceiling > 0) {
			bench_json_str(j, "ceiling", s->ceiling_label);
			bench_json_dbl(j, "ceiling_gbps", s->ceiling);
		}
		if (s->reading[0])
			bench_json_str(j, "reading", s->reading);
		else
			bench_json_str(j, "skipped", s->skipped[0] ? s->skipped : "?");
		bench_json_arr(j, "rows");
		for (unsigned k = 0; k < s->nrows; k++) {
			struct grow *r = &s->rows[k];
			bench_json_obj(j, NULL);
			bench_json_str(j, "case", r->label);
			if (r->ran) {
				bench_json_dbl(j, "gbps", r->gbps);
				bench_json_str(j, "note", r->note);
			} else {
				bench_json_str(j, "skipped", r->skipped[0] ? r->skipped : "?");
			}
			bench_json_close_obj(j);
		}
		bench_json_close_arr(j);
		bench_json_close_obj(j);
	}
	bench_json_close_arr(j);
}
