/*
 * What `ferry top` sees of a process's loader, save and load (issue 21 item 7): with publish=1, a
 * loader whose reads all come from the page cache (its context never starts its I/O workers)
 * still publishes, as an activity whose samples and batches grow; a checkpoint shard's save shows
 * its step and bytes once done; a safetensors load its tensors and bytes. Read back through the
 * sampler, as `ferry top --json` does.
 */
#include <sys/stat.h>
#include "ferry_test.h"
#include "ferry_tools.h"
#include "ferry/data.h"
#include "ferry/safetensors.h"
#include "engine/publish.h"

static ferry_ctx *publishing_ctx(void)
{
	ferry_ctx *c;
	T_ASSERT(ferry_ctx_create(&c) == 0);
	T_ASSERT(ferry_ctx_set(c, "publish", "1") == 0);
	return c;
}

/* The row of this process's activity of kind, or -1. */
static long find_activity(ferry_sampler *s, const char *kind)
{
	char pid[16];
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	for (size_t i = 0; i < ferry_sampler_rows(s); i++) {
		const char *k = ferry_sampler_row_text(s, i, "kind");
		if (!strcmp(ferry_sampler_row_kind(s, i), "activity") && !strcmp(ferry_sampler_row_name(s, i), pid) && k &&
		    !strcmp(k, kind))
			return (long)i;
	}
	return -1;
}

static double value(ferry_sampler *s, long i, const char *m)
{
	double v;
	return i >= 0 && ferry_sampler_row_value(s, (size_t)i, m, &v) == 0 ? v : -1;
}

int main(void)
{
	const char *tmp = t_tmpdir();
	char rundir[512], path[600], st_path[700];
	snprintf(rundir, sizeof(rundir), "%s/activity-run-%d", tmp, (int)getpid());
	T_ASSERT(mkdir(rundir, 0700) == 0);
	setenv("FERRY_RUN_DIR", rundir, 1);
	snprintf(path, sizeof(path), "%s/activity-ds-%d", tmp, (int)getpid());

	/* A small dataset, written with a context that does not publish. */
	ferry_ctx *wctx;
	T_ASSERT(ferry_ctx_create(&wctx) == 0);
	ferry_dataset_writer *w;
	T_ASSERT(ferry_dataset_writer_create(wctx, path, FERRY_WRITE_FERRY, FERRY_DT_U8, 32768, &w) == 0);
	uint8_t sample[256];
	memset(sample, 7, sizeof(sample));
	for (int i = 0; i < 64; i++)
		T_ASSERT(ferry_dataset_writer_add(w, sizeof(sample), NULL, 0, 1) >= 0);
	T_ASSERT(ferry_dataset_writer_layout(w) > 0);
	for (int i = 0; i < 64; i++)
		T_ASSERT(ferry_dataset_writer_put(w, (uint64_t)i, sample, sizeof(sample)) == 0);
	T_ASSERT(ferry_dataset_writer_finish(w) == 0);
	ferry_dataset_writer_destroy(w);
	ferry_ctx_destroy(wctx);

	ferry_sampler *s;
	T_ASSERT(ferry_sampler_create(&s) == 0);

	/* The loader. */
	ferry_ctx *ctx = publishing_ctx();
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, path, &ds) == 0);
	ferry_loader *l;
	T_ASSERT(ferry_loader_create(ds, &l) == 0);
	T_ASSERT(ferry_loader_set(l, "batch_size", "4") == 0);
	T_ASSERT(ferry_loader_set(l, "threads", "2") == 0);
	ferry_loader_batch *b;
	for (int i = 0; i < 3; i++) {
		T_ASSERT(ferry_loader_next(l, &b) == 1);
		ferry_loader_batch_destroy(b);
	}
	int sr = ferry_sampler_sample(s); /* diskstats may be missing in a container: the scan still runs */
	long a = find_activity(s, "loader");
	T_CHECK(a >= 0);
	T_EQ_INT((int)value(s, a, "samples_total"), 12);
	T_EQ_INT((int)value(s, a, "batches_total"), 3);
	T_EQ_INT((int)value(s, a, "bytes_total"), 12 * 256);
	T_EQ_INT((int)value(s, a, "threads"), 2);
	const char *name = a >= 0 ? ferry_sampler_row_text(s, (size_t)a, "name") : NULL;
	T_CHECK(name && strstr(path, name) != NULL); /* the dataset (its path's end) */
	for (int i = 0; i < 5; i++) {
		T_ASSERT(ferry_loader_next(l, &b) == 1);
		ferry_loader_batch_destroy(b);
	}
	sr = ferry_sampler_sample(s);
	a = find_activity(s, "loader");
	T_EQ_INT((int)value(s, a, "samples_total"), 32);
	T_CHECK(value(s, a, "samples_per_s") > 0);
	ferry_loader_destroy(l);
	sr = ferry_sampler_sample(s);
	T_EQ_INT((int)find_activity(s, "loader"), -1); /* a destroyed loader is not shown */
	ferry_dataset_destroy(ds);

	/* A save with a checkpoint's step, and a load of it. */
	snprintf(st_path, sizeof(st_path), "%s/activity-%d.safetensors", tmp, (int)getpid());
	ferry_st_writer *sw;
	T_ASSERT(ferry_st_writer_create(ctx, &sw) == 0);
	static float t[2][4096];
	uint64_t shape[1] = {4096};
	T_ASSERT(ferry_st_writer_add(sw, "a", FERRY_DT_F32, 1, shape, t[0], sizeof(t[0])) >= 0);
	T_ASSERT(ferry_st_writer_add(sw, "b", FERRY_DT_F32, 1, shape, t[1], sizeof(t[1])) >= 0);
	T_ASSERT(ferry_st_writer_metadata(sw, "ferry.step", "25") == 0);
	int64_t size = ferry_st_writer_save(sw, st_path, 0);
	T_ASSERT(size > (int64_t)sizeof(t));
	ferry_st_writer_destroy(sw);
	sr = ferry_sampler_sample(s);
	a = find_activity(s, "save");
	T_CHECK(a >= 0);
	T_EQ_INT((int)value(s, a, "step"), 25);
	T_EQ_INT((int)value(s, a, "tensors"), 2);
	T_EQ_INT((int)value(s, a, "bytes_total"), (int)size);
	T_EQ_INT((int)value(s, a, "total_bytes"), (int)size);
	const char *phase = a >= 0 ? ferry_sampler_row_text(s, (size_t)a, "phase") : NULL;
	T_CHECK(phase && !strcmp(phase, "done"));

	ferry_st_load *ld;
	T_ASSERT(ferry_st_load_open(ctx, st_path, &ld) == 0);
	T_ASSERT(ferry_st_load_run(ld, -1, 0, 0) == 0);
	ferry_st_load_destroy(ld);
	sr = ferry_sampler_sample(s);
	a = find_activity(s, "load");
	T_CHECK(a >= 0);
	T_EQ_INT((int)value(s, a, "tensors"), 2);
	T_EQ_INT((int)value(s, a, "bytes_total"), (int)sizeof(t));
	T_CHECK(find_activity(s, "save") >= 0); /* the last save stays shown */

	/* --json nests them under the process. */
	const char *json;
	T_ASSERT(ferry_sampler_json(s, &json) == 0);
	T_CHECK(strstr(json, "\"activities\": [{\"kind\": \"save\"") != NULL ||
		strstr(json, "\"activities\": [{\"kind\": \"load\"") != NULL);

	/* A publication of a newer layout is not misread: skipped, with a note naming it. */
	char newer[700];
	snprintf(newer, sizeof(newer), "%s/ferry-%d-fedcba9876543210.stats", rundir, (int)getpid());
	struct ferry__publish p;
	memset(&p, 0, sizeof(p));
	p.magic = FERRY__PUBLISH_MAGIC;
	p.version = FERRY__PUBLISH_VERSION + 1;
	p.size = sizeof(p);
	p.pid = (int32_t)getpid();
	FILE *f = fopen(newer, "w");
	T_ASSERT(f && fwrite(&p, sizeof(p), 1, f) == 1);
	fclose(f);
	sr = ferry_sampler_sample(s);
	int noted = 0;
	for (size_t k = 0; ferry_sampler_note(s, k); k++)
		noted |= strstr(ferry_sampler_note(s, k), "fedcba9876543210.stats: publication layout version 2 is newer") != NULL;
	T_CHECK(noted);
	(void)sr;
	ferry_sampler_destroy(s);
	ferry_ctx_destroy(ctx);
	unlink(st_path);
	T_CHECK(t_rmtree(path) == 0 && t_rmtree(rundir) == 0);
	return t_result();
}
