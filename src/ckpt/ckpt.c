/* Checkpoint directories: shards, markers, manifest, `latest`, pruning (see include/ferry/ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "base/knob.h"
#include "ferry/ckpt.h"
#include "base/json.h"
#include "base/sbuf.h"

/* Where the newest pruned step's shards wait to be written over by the next save (recycle=1) */
#define RECYCLE_DIR "recycle"

struct ferry_ckpt {
	ferry_ctx *ctx;
	char *dir;
	int rank, world;
	int keep, refuse, checksum, recycle;
	int64_t timeout_ms;
	char run[128];
	ferry_st_writer *w;
	/* the step being saved (read by the writer thread's hook) */
	int64_t step;
};

static const char *const busy_choices[] = {"wait", "refuse", NULL};

/*
 * Only the speed knobs take the environment: what a checkpoint keeps, checks and calls its run is
 * the program's to say (docs/CONFIG.md).
 */
static const struct ferry__knob ckpt_rows[] = {
	{.name = "keep", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct ferry_ckpt, keep), .def = 2,
	 .max = INT32_MAX, .doc = "committed steps kept by pruning (0: all)"},
	{.name = "busy", .type = FERRY__KNOB_ENUM, FERRY__KNOB_AT(struct ferry_ckpt, refuse), .max = 1,
	 .choices = busy_choices, .doc = "what a save does while another is in flight"},
	{.name = "checksum", .type = FERRY__KNOB_BOOL, FERRY__KNOB_AT(struct ferry_ckpt, checksum), .def = 1,
	 .max = 1, .doc = "xxh3 checksum of every tensor in the shard's header"},
	{.name = "recycle", .type = FERRY__KNOB_BOOL, FERRY__KNOB_AT(struct ferry_ckpt, recycle), .def = 1,
	 .max = 1, .env = "FERRY_CKPT_RECYCLE", .doc = "a save writes over the newest pruned step's shard"},
	{.name = "timeout_ms", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct ferry_ckpt, timeout_ms),
	 .def = 600000, .max = INT64_MAX, .env = "FERRY_CKPT_TIMEOUT_MS",
	 .doc = "how long rank 0 waits for the other ranks' markers"},
	{.name = "run", .type = FERRY__KNOB_TEXT, FERRY__KNOB_AT(struct ferry_ckpt, run),
	 .doc = "an id shared by the ranks of one run"},
};

static const char *ckpt_keys[sizeof(ckpt_rows) / sizeof(ckpt_rows[0]) + 1];
static const struct ferry__knobs ckpt_knobs = {"checkpoint", ckpt_rows, sizeof(ckpt_rows) / sizeof(ckpt_rows[0]),
					       ckpt_keys};

int ferry_ckpt_step_path(const char *dir, int64_t step, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld", dir, (long long)step);
	return n < 0 || (size_t)n >= len ? ferry__error(-ENAMETOOLONG, "%s: path too long", dir) : n;
}

int ferry_ckpt_shard_path(const char *dir, int64_t step, int rank, int world, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld/rank-%05d-of-%05d.safetensors", dir, (long long)step, rank, world);
	return n < 0 || (size_t)n >= len ? ferry__error(-ENAMETOOLONG, "%s: path too long", dir) : n;
}

static int marker_path(const ferry_ckpt *ck, int64_t step, int rank, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld/rank-%05d-of-%05d.done", ck->dir, (long long)step, rank, ck->world);
	return n < 0 || (size_t)n >= len ? ferry__error(-ENAMETOOLONG, "%s: path too long", ck->dir) : 0;
}

int ferry_ckpt_open(ferry_ctx *ctx, const char *dir, int rank, int world, ferry_ckpt **out)
{
	*out = NULL;
	if (world < 1 || rank < 0 || rank >= world)
		return ferry__error(-EINVAL, "ckpt %s: rank %d of world %d", dir, rank, world);
	if (mkdir(dir, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", dir, strerror(errno));
	ferry_ckpt *ck = calloc(1, sizeof(*ck));
	if (!ck || !(ck->dir = strdup(dir))) {
		free(ck);
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	ck->ctx = ctx;
	ck->rank = rank;
	ck->world = world;
	int r = ferry__knobs_init(&ckpt_knobs, ck);
	if (!r)
		r = ferry_st_writer_create(ctx, &ck->w);
	if (r) {
		free(ck->dir);
		free(ck);
		return r;
	}
	*out = ck;
	return 0;
}

void ferry_ckpt_destroy(ferry_ckpt *ck)
{
	if (!ck)
		return;
	ferry_st_writer_destroy(ck->w);
	free(ck->dir);
	free(ck);
}

const char *const *ferry_ckpt_keys(void)
{
	return ferry__knobs_keys(&ckpt_knobs);
}

int ferry_ckpt_set(ferry_ckpt *ck, const char *key, const char *value)
{
	if (!ck || !key)
		return ferry__error(-EINVAL, "ferry_ckpt_set: NULL checkpoint or key");
	if (!ferry__knobs_find(&ckpt_knobs, key) && ferry__knobs_find(&ferry__st_writer_knobs, key))
		return ferry_st_writer_set(ck->w, key, value); /* its saves are the writer's */
	return ferry__knobs_set(&ckpt_knobs, ck, key, value, "ferry_ckpt_set");
}

int ferry_ckpt_add(ferry_ckpt *ck, const char *name, enum ferry_dtype dtype, int ndim, const uint64_t *shape,
		   const void *data, size_t nbytes)
{
	int r = ferry_st_writer_add(ck->w, name, dtype, ndim, shape, data, nbytes);
	return r < 0 ? r : 0;
}

int ferry_ckpt_metadata(ferry_ckpt *ck, const char *key, const char *value)
{
	return ferry_st_writer_metadata(ck->w, key, value);
}

int ferry_ckpt_done(ferry_ckpt *ck)
{
	return ferry_st_writer_done(ck->w);
}

int ferry_ckpt_wait(ferry_ckpt *ck, int64_t timeout_ns)
{
	int64_t r = ferry_st_writer_wait(ck->w, timeout_ns);
	return r < 0 ? (int)r : 0;
}

int64_t ferry_ckpt_reserve(ferry_ckpt *ck, uint64_t bytes, int device)
{
	return ferry_st_writer_reserve(ck->w, bytes, device);
}

uint64_t ferry_ckpt_stat(const ferry_ckpt *ck, enum ferry_save_stat which)
{
	return ck ? ferry_st_writer_stat(ck->w, which) : 0;
}

uint64_t ferry_ckpt_phase_ns(const ferry_ckpt *ck, enum ferry_save_phase which)
{
	return ck ? ferry_st_writer_phase_ns(ck->w, which) : 0;
}

/* ------------------------------------------------------------------------------------- latest */

static int64_t parse_step_name(const char *s)
{
	if (strncmp(s, "step-", 5))
		return -1;
	int64_t v = 0;
	const char *p = s + 5;
	if (!*p)
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*p - '0');
	}
	return *p ? -1 : v;
}

int64_t ferry_ckpt_latest(const char *dir)
{
	char p[PATH_MAX], buf[128];
	snprintf(p, sizeof(p), "%s/latest", dir);
	FILE *f = fopen(p, "r");
	if (!f)
		return ferry__error(-errno, "%s: %s", p, strerror(errno));
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	int64_t s = parse_step_name(buf);
	if (s < 0)
		return ferry__error(FERRY_ECORRUPT, "%s: \"%.64s\" does not name a step", p, buf);
	return s;
}

/* -------------------------------------------------------------------------------------- commit */

static int read_small(const char *path, char *buf, size_t cap, size_t *len)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	*len = fread(buf, 1, cap - 1, f);
	int full = !feof(f) && fgetc(f) != EOF;
	fclose(f);
	buf[*len] = '\0';
	return full ? -EFBIG : 0;
}

/* Reads rank's marker: 1 when present and of this run (bytes in *bytes), 0 when absent or stale. */
static int read_marker(ferry_ckpt *ck, int64_t step, int rank, uint64_t *bytes)
{
	char p[PATH_MAX], buf[1024], *k, *v;
	size_t len = 0, kl, vl, kpos;
	if (marker_path(ck, step, rank, p, sizeof(p)))
		return -ENAMETOOLONG;
	int r = read_small(p, buf, sizeof(buf), &len);
	if (r == -ENOENT)
		return 0;
	if (r)
		return ferry__error(r, "%s: %s", p, strerror(-r));
	struct ferry__json j;
	int m, run_ok = 0, have_bytes = 0;
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		return ferry__error(FERRY_ECORRUPT, "%s: not a marker", p);
	while ((m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "run")) {
			if (ferry__json_string(&j, &v, &vl))
				break;
			run_ok = !strcmp(v, ck->run);
		} else if (!strcmp(k, "bytes")) {
			if (ferry__json_uint(&j, bytes))
				break;
			have_bytes = 1;
		} else if (ferry__json_skip(&j)) {
			break;
		}
	}
	if (m != 0 || ferry__json_end(&j) || !have_bytes)
		return ferry__error(FERRY_ECORRUPT, "%s: not a marker", p);
	return run_ok;
}

static int prune(const char *dir, int keep, int recycle);

static int commit(ferry_ckpt *ck, int64_t step)
{
	char p[PATH_MAX + 32], sp[PATH_MAX];
	uint64_t *bytes = calloc((size_t)ck->world, sizeof(*bytes));
	if (!bytes)
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	uint64_t t0 = ferry__now_ns();
	int r = 0;
	for (int rank = 0; rank < ck->world && !r;) {
		int m = read_marker(ck, step, rank, &bytes[rank]);
		if (m < 0) {
			r = m;
		} else if (m) {
			rank++;
		} else if ((int64_t)((ferry__now_ns() - t0) / 1000000) > ck->timeout_ms) {
			r = ferry__error(-ETIMEDOUT, "ckpt %s step %lld: rank %d's marker missing after %lld ms", ck->dir,
					 (long long)step, rank, (long long)ck->timeout_ms);
		} else {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	struct ferry__sbuf m = {0};
	if (!r) {
		ferry__sbuf_printf(&m, "{\"format\":\"ferry-checkpoint-1\",\"step\":%lld,\"world\":%d,\"run\":",
				   (long long)step, ck->world);
		ferry__sbuf_json(&m, ck->run);
		ferry__sbuf_puts(&m, ",\"shards\":[");
		for (int i = 0; i < ck->world; i++)
			ferry__sbuf_printf(&m, "%s{\"file\":\"rank-%05d-of-%05d.safetensors\",\"bytes\":%llu}",
					   i ? "," : "", i, ck->world, (unsigned long long)bytes[i]);
		ferry__sbuf_puts(&m, "]}\n");
		if (m.oom)
			r = ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	if (!r) {
		r = ferry_ckpt_step_path(ck->dir, step, sp, sizeof(sp) - 16);
		if (r >= 0) {
			snprintf(p, sizeof(p), "%s/manifest.json", sp);
			r = ferry__write_durable(p, m.data, m.len);
		}
	}
	if (!r) {
		char text[64];
		int n = snprintf(text, sizeof(text), "step-%012lld\n", (long long)step);
		snprintf(p, sizeof(p), "%s/latest", ck->dir);
		r = ferry__write_durable(p, text, (size_t)n);
	}
	ferry__sbuf_free(&m);
	free(bytes);
	if (!r && ck->keep) {
		int pr = prune(ck->dir, ck->keep, ck->recycle);
		r = pr < 0 ? pr : 0;
	}
	return r;
}

static int64_t after_shard(void *arg, int64_t result)
{
	ferry_ckpt *ck = arg;
	char p[PATH_MAX];
	if (result < 0)
		return result;
	/* The step directory's entry in DIR, durable before this rank's marker says the shard is in.
	 * Here rather than on the caller's thread: an asynchronous save returns before it. */
	int r = ferry_ckpt_step_path(ck->dir, ck->step, p, sizeof(p));
	r = r < 0 ? r : ferry__fsync_parent(p);
	if (!r)
		r = marker_path(ck, ck->step, ck->rank, p, sizeof(p));
	if (!r) {
		struct ferry__sbuf text = {0};
		ferry__sbuf_puts(&text, "{\"run\":");
		ferry__sbuf_json(&text, ck->run);
		ferry__sbuf_printf(&text, ",\"step\":%lld,\"rank\":%d,\"world\":%d,\"bytes\":%lld}\n", (long long)ck->step,
				   ck->rank, ck->world, (long long)result);
		r = text.oom ? ferry__error(-ENOMEM, "ckpt: out of memory") : ferry__write_durable(p, text.data, text.len);
		ferry__sbuf_free(&text);
	}
	if (!r && ck->rank == 0)
		r = commit(ck, ck->step);
	return r;
}

static int save(ferry_ckpt *ck, int64_t step, int async)
{
	char sp[PATH_MAX], p[PATH_MAX];
	int r;
	if (step < 0)
		return ferry__error(-EINVAL, "ckpt %s: step %lld", ck->dir, (long long)step);
	if (!ferry_st_writer_done(ck->w) && ck->refuse)
		return ferry__error(FERRY_EBUSY, "ckpt %s: step %lld refused: a save is in flight (busy=refuse)",
				    ck->dir, (long long)step);
	if ((r = ferry_ckpt_wait(ck, -1)))
		(void)r; /* the previous save's error was reported by its own wait; this save goes on */
	uint64_t t0 = ferry__now_ns();
	int64_t latest = ferry_ckpt_latest(ck->dir);
	if (latest >= step)
		return ferry__error(-EEXIST, "ckpt %s: step %lld is not after the latest, %lld", ck->dir,
				    (long long)step, (long long)latest);
	if ((r = ferry_ckpt_step_path(ck->dir, step, sp, sizeof(sp))) < 0)
		return r;
	/* the directory again: it may have been removed since the handle was opened (a long-lived
	 * handle, as Python keeps one per directory, outlives a test's or a benchmark's rm -r) */
	if (mkdir(ck->dir, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", ck->dir, strerror(errno));
	if (mkdir(sp, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", sp, strerror(errno));
	/* A marker of this rank from an earlier attempt at this step must not count for this one. */
	if (!marker_path(ck, step, ck->rank, p, sizeof(p)))
		unlink(p);
	if ((r = ferry_ckpt_shard_path(ck->dir, step, ck->rank, ck->world, p, sizeof(p))) < 0)
		return r;
	ck->step = step;
	int flags = ck->checksum ? FERRY_SAVE_CHECKSUM : 0;
	/* This rank's shard of a pruned step, written over rather than a new file made (prune) */
	char rp[PATH_MAX];
	int rn = snprintf(rp, sizeof(rp), "%s/" RECYCLE_DIR "/rank-%05d-of-%05d.safetensors", ck->dir, ck->rank,
			  ck->world);
	const char *reuse = ck->recycle && rn > 0 && (size_t)rn < sizeof(rp) ? rp : NULL;
	uint64_t prep = ferry__now_ns() - t0;
	int64_t res = ferry__st_writer_save_hooked(ck->w, p, flags, async, after_shard, ck, reuse);
	ferry__st_writer_phase(ck->w, FERRY_PHASE_CKPT_PREPARE, prep);
	int reset = ferry_st_writer_reset(ck->w);
	(void)reset;
	return res < 0 ? (int)res : 0;
}

/*
 * The tensors and metadata added belong to this attempt, whatever its outcome: a refused or failed
 * save must not hand them to the next one.
 */
int ferry_ckpt_save(ferry_ckpt *ck, int64_t step)
{
	int r = save(ck, step, 0);
	int reset = ferry_st_writer_reset(ck->w);
	(void)reset;
	return r;
}

int ferry_ckpt_save_async(ferry_ckpt *ck, int64_t step)
{
	int r = save(ck, step, 1);
	int reset = ferry_st_writer_reset(ck->w);
	(void)reset;
	return r;
}

/* --------------------------------------------------------------------------------------- prune */

static int rm_tree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	struct dirent *e;
	char p[PATH_MAX];
	int r = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
		if (unlink(p) && errno != ENOENT && !r) /* ENOENT: a save took its recycled shard */
			r = -errno;
	}
	closedir(d);
	if (rmdir(path) && !r)
		r = -errno;
	return r;
}

/*
 * Moves a pruned step's directory to DIR/recycle, keeping only its shards: the step leaves the
 * directory's namespace in one rename, as removing it would. Returns 1 when it did, 0 when the
 * caller is to remove the step instead. Shards left in an older recycle directory (a rank that did
 * not save since, another world size) are removed first. Another rank may be taking its shard out
 * of the old directory meanwhile (its save renames it): either it gets the file or makes a new one.
 */
static int recycle_step(const char *dir, const char *step)
{
	char rp[PATH_MAX], p[PATH_MAX + 256];
	if (snprintf(rp, sizeof(rp), "%s/" RECYCLE_DIR, dir) >= (int)sizeof(rp))
		return 0;
	int r = rm_tree(rp);
	if (r && r != -ENOENT)
		FERRY__LOG(FERRY__LOG_INFO, "%s: cannot remove (%s)", rp, strerror(-r));
	if (rename(step, rp))
		return 0;
	DIR *d = opendir(rp);
	struct dirent *e;
	size_t n;
	while (d && (e = readdir(d))) {
		n = strlen(e->d_name);
		if (e->d_name[0] == '.' || (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")))
			continue;
		snprintf(p, sizeof(p), "%s/%s", rp, e->d_name);
		unlink(p); /* markers and the manifest: the shards alone are recycled */
	}
	if (d)
		closedir(d);
	return 1;
}

static int cmp_i64_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

static int prune(const char *dir, int keep, int recycle)
{
	int64_t latest = ferry_ckpt_latest(dir);
	ferry__error_clear();
	if (latest < 0)
		return 0;
	DIR *d = opendir(dir);
	if (!d)
		return ferry__error(-errno, "opendir(%s): %s", dir, strerror(errno));
	int64_t *committed = NULL, *debris = NULL;
	size_t nc = 0, nd = 0, cc = 0, cd = 0;
	struct dirent *e;
	char p[PATH_MAX];
	int r = 0;
	while ((e = readdir(d))) {
		int64_t s = parse_step_name(e->d_name);
		if (s < 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s/manifest.json", dir, e->d_name);
		int has = access(p, F_OK) == 0;
		if (!has && s >= latest)
			continue; /* maybe being written */
		int64_t **arr = has ? &committed : &debris;
		size_t *n = has ? &nc : &nd, *c = has ? &cc : &cd;
		if (*n == *c) {
			size_t nc2 = *c ? *c * 2 : 16;
			int64_t *q = realloc(*arr, nc2 * sizeof(int64_t));
			if (!q) {
				r = -ENOMEM;
				break;
			}
			*arr = q;
			*c = nc2;
		}
		(*arr)[(*n)++] = s;
	}
	closedir(d);
	int removed = 0;
	if (!r) {
		if (nc > 1)
			qsort(committed, nc, sizeof(int64_t), cmp_i64_desc);
		/* The newest `keep` committed steps stay; so does latest's, and anything newer than it.
		 * With recycle, the newest step pruned becomes DIR/recycle (the one before it removed),
		 * whose shards the ranks' next saves write over instead of making new files. */
		int recycled = 0;
		for (size_t i = 0; i < nc; i++) {
			if (committed[i] >= latest || (keep && i < (size_t)keep) || !keep)
				continue;
			if (ferry_ckpt_step_path(dir, committed[i], p, sizeof(p)) <= 0)
				continue;
			if (recycle && !recycled && recycle_step(dir, p)) {
				recycled = 1;
				removed++;
			} else if (!rm_tree(p)) {
				removed++;
			}
		}
		for (size_t i = 0; i < nd; i++) {
			if (ferry_ckpt_step_path(dir, debris[i], p, sizeof(p)) > 0 && !rm_tree(p))
				removed++;
		}
		/* Without recycling (recycle=0, or an explicit prune) a recycled step's space goes back */
		if (!recycle && snprintf(p, sizeof(p), "%s/" RECYCLE_DIR, dir) < (int)sizeof(p) && !rm_tree(p))
			removed++;
		if (removed)
			r = ferry__fsync_dir(dir);
	}
	free(committed);
	free(debris);
	return r < 0 ? r : removed;
}

int ferry_ckpt_prune(const char *dir, int keep)
{
	return prune(dir, keep, 0);
}

/* -------------------------------------------------------------------------------------- verify */

/* Checks one shard file: structure (ferry_st_open) and every tensor's checksum. */
static int verify_shard(ferry_ctx *ctx, const char *path, int require_sums)
{
	ferry_st *st;
	int r = ferry_st_open(ctx, path, &st);
	for (size_t i = 0; !r && i < ferry_st_count(st); i++) {
		int v = ferry_st_verify(st, i);
		if (v == 0 && require_sums)
			r = ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\" has no checksum", path, ferry_st_name(st, i));
		else if (v < 0)
			r = v;
	}
	ferry_st_destroy(st);
	return r;
}

struct verify_files {
	ferry_ctx *ctx;
	const char *step_dir;
	int require_sums;
	int shards;
};

static int verify_shard_file(void *arg, const char *name)
{
	struct verify_files *vf = arg;
	char fp[PATH_MAX + 300];
	snprintf(fp, sizeof(fp), "%s/%s", vf->step_dir, name);
	vf->shards++;
	return vf->ctx ? verify_shard(vf->ctx, fp, vf->require_sums) : 0;
}

/*
 * Reads a committed step's manifest: its world, and as many shards listed; with ctx, each shard
 * verified on its own (the ranks of a step usually hold tensors of the same names, replicas or
 * tensor-parallel pieces, which one load of the whole manifest refuses as ambiguous). missing:
 * the error for a step without a manifest.
 */
static int read_manifest(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums, int missing,
			 uint64_t *world_out)
{
	char sp[PATH_MAX], p[PATH_MAX + 32];
	int r = ferry_ckpt_step_path(dir, step, sp, sizeof(sp) - 16);
	if (r < 0)
		return r;
	snprintf(p, sizeof(p), "%s/manifest.json", sp);
	if (access(p, F_OK))
		return ferry__error(missing, "%s: no manifest.json: step %lld is not committed", sp, (long long)step);
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	if ((r = read_small(p, buf, cap, &len))) {
		free(buf);
		return ferry__error(r, "%s: %s", p, strerror(-r));
	}
	struct ferry__json j;
	char *k;
	size_t kl, kpos;
	int m = 0, shards = 0;
	uint64_t world = 0;
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		goto bad;
	while (!r && (m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "world")) {
			if (ferry__json_uint(&j, &world))
				goto bad;
		} else if (!strcmp(k, "shards")) {
			struct verify_files vf = {ctx, sp, require_sums, 0};
			r = ferry__json_shard_files(&j, p, verify_shard_file, &vf);
			shards = vf.shards;
			if (r == 1)
				goto bad;
		} else if (ferry__json_skip(&j)) {
			goto bad;
		}
		if (m < 0)
			goto bad;
	}
	if (!r && (m < 0 || ferry__json_end(&j)))
		goto bad;
	if (!r && (!shards || (uint64_t)shards != world || world > INT_MAX))
		r = ferry__error(FERRY_ECORRUPT, "%s: %d shards listed for a world of %llu", p, shards,
				 (unsigned long long)world);
	free(buf);
	*world_out = world;
	return r;
bad:
	free(buf);
	return ferry__error(FERRY_ECORRUPT, "%s: byte %zu: %s", p, j.err_pos, j.err ? j.err : "unexpected JSON");
}

int ferry_ckpt_verify(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums)
{
	uint64_t world;
	return read_manifest(ctx, dir, step, require_sums, FERRY_ECORRUPT, &world);
}

int ferry_ckpt_world(const char *dir, int64_t step)
{
	uint64_t world;
	int r = read_manifest(NULL, dir, step, 0, -ENOENT, &world);
	return r < 0 ? r : (int)world;
}
