/*
 * Loading safetensors files (one, a Hugging Face sharded set, or a ferry checkpoint step) into host
 * or device memory. Whole files read as one transfer into one allocation where the selection
 * covers most of the file (tensors are views at their file offsets): one long sequential read per
 * file through the engine's pipelined path. Every file's reads are submitted in one batch, so
 * reading one file overlaps copying another.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "base/json.h"
#include "format/safetensors.h"
#include "engine/export.h"

#define VIEW_ALIGN 256 /* cudaMalloc's alignment, so views keep every dtype aligned */
#define INDEX_MAX (64u << 20)

struct lsel {
	size_t file, idx;
	int sliced, dim;
	uint64_t start, stop, nbytes;
	void *dest;
	size_t dest_len;
	void *ptr;
	int hash_after; /* verified: read by the batch into host memory, hashed there once it is in */
};

struct lalloc {
	void *p;
	size_t len;
	int dev;
};

struct ferry_st_load {
	ferry_ctx *ctx;
	char *path;
	ferry_st **files;
	size_t nfiles;
	struct lsel *sel;
	size_t nsel, cap;
	int explicit_sel;
	struct lalloc *allocs;
	size_t nallocs;
	uint64_t bytes, ns;
	char cz_path[160]; /* ferry_cz_path_info of the last compressed file the last run read */
	/* ferry_st_load_place's file region and running offset, so that asking for every entry in
	 * order is linear (it was quadratic: 44 ms of a 4,000-tensor load, issue 22) */
	struct {
		int valid, flags, span;
		size_t file, next;
		uint64_t lo, hi, packed, at;
	} pl;
};


static void free_allocs(ferry_st_load *ld)
{
	for (size_t i = 0; i < ld->nallocs; i++) {
		if (ld->allocs[i].dev >= 0)
			(void)ferry_gpu_free(ld->allocs[i].p);
		else
			ferry_free_aligned(ld->allocs[i].p, ld->allocs[i].len);
	}
	free(ld->allocs);
	ld->allocs = NULL;
	ld->nallocs = 0;
}

void ferry_st_load_destroy(ferry_st_load *ld)
{
	if (!ld)
		return;
	free_allocs(ld);
	for (size_t i = 0; i < ld->nfiles; i++)
		ferry_st_destroy(ld->files[i]);
	free(ld->files);
	free(ld->sel);
	free(ld->path);
	free(ld);
}

static int add_file(ferry_st_load *ld, const char *dir, const char *name)
{
	char p[PATH_MAX];
	if (dir && snprintf(p, sizeof(p), "%s/%s", dir, name) >= (int)sizeof(p))
		return ferry__error(-ENAMETOOLONG, "%s/%s: path too long", dir, name);
	for (size_t i = 0; i < ld->nfiles; i++)
		if (!strcmp(ferry_st_path(ld->files[i]), dir ? p : name))
			return 0; /* an index names each shard many times */
	ferry_st **f = realloc(ld->files, (ld->nfiles + 1) * sizeof(*f));
	if (!f)
		return ferry__error(-ENOMEM, "load: out of memory");
	ld->files = f;
	int r = ferry_st_open(ld->ctx, dir ? p : name, &ld->files[ld->nfiles]);
	if (!r)
		ld->nfiles++;
	return r;
}

/* A shard named by an index or manifest must be a plain file name in the index's directory. */
int ferry__check_shard_name(const char *index, const char *name, size_t len, size_t pos)
{
	if (!len || memchr(name, '/', len) || memchr(name, '\\', len) || !strcmp(name, ".") ||
	    !strcmp(name, "..") || strlen(name) != len)
		return ferry__error(FERRY_ECORRUPT, "%s: byte %zu: shard file name \"%.64s\" is not a plain file name",
				    index, pos, name);
	return 0;
}

int ferry__json_shard_files(struct ferry__json *j, const char *index, int (*fn)(void *arg, const char *name),
			    void *arg)
{
	char *k, *v;
	size_t kl, vl, kpos;
	int m, r = 0;

	if (ferry__json_array_begin(j))
		return 1;
	while (!r && (m = ferry__json_array_next(j)) == 1) {
		if (ferry__json_object_begin(j))
			return 1;
		while (!r && (m = ferry__json_object_next(j, &k, &kl, &kpos)) == 1) {
			if (strcmp(k, "file")) {
				if (ferry__json_skip(j))
					return 1;
				continue;
			}
			size_t vpos = j->pos;
			if (ferry__json_string(j, &v, &vl))
				return 1;
			r = ferry__check_shard_name(index, v, vl, vpos);
			if (!r)
				r = fn(arg, v);
		}
		if (!r && m < 0)
			return 1;
	}
	return r ? r : m < 0;
}

struct add_files {
	ferry_st_load *ld;
	const char *dir;
};

static int add_shard_file(void *arg, const char *name)
{
	struct add_files *a = arg;
	return add_file(a->ld, a->dir, name);
}

/* The whole object at url (at most INDEX_MAX bytes) into a new buffer *buf of *len bytes. */
static int read_url(ferry_ctx *ctx, const char *url, char **buf, size_t *len)
{
	ferry_file *f;
	int r = ferry_file_open(ctx, url, FERRY_O_RDONLY, &f);
	if (r)
		return r;
	int64_t size = ferry_file_size(f);
	if (size < 0 || size > INDEX_MAX) {
		ferry_file_destroy(f);
		return size < 0 ? (int)size : ferry__error(FERRY_ECORRUPT, "%s: index larger than %u bytes", url, INDEX_MAX);
	}
	*len = (size_t)size;
	if (!(*buf = malloc(*len + 1))) {
		ferry_file_destroy(f);
		return ferry__error(-ENOMEM, "%s: index", url);
	}
	ssize_t got = *len ? ferry_pread(f, *buf, *len, 0) : 0;
	ferry_file_destroy(f);
	if (got != (ssize_t)*len) {
		free(*buf);
		return got < 0 ? (int)got : ferry__error(-EIO, "%s: short read", url);
	}
	return 0;
}

static int read_local(const char *path, char **bufp, size_t *lenp)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return ferry__error(-errno, "open(%s): %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fileno(fp), &sb) || sb.st_size > INDEX_MAX) {
		fclose(fp);
		return ferry__error(FERRY_ECORRUPT, "%s: index larger than %u bytes", path, INDEX_MAX);
	}
	size_t len = (size_t)sb.st_size;
	char *buf = malloc(len + 1);
	if (!buf) {
		fclose(fp);
		return ferry__error(-ENOMEM, "%s: index", path);
	}
	size_t got = fread(buf, 1, len, fp);
	fclose(fp);
	if (got != len) {
		free(buf);
		return ferry__error(-EIO, "%s: short read", path);
	}
	*bufp = buf;
	*lenp = len;
	return 0;
}

/*
 * model.safetensors.index.json: {"metadata": {...}, "weight_map": {"tensor": "file", ...}}
 * manifest.json (ferry checkpoints): {..., "shards": [{"file": "...", ...}, ...]}
 */
static int open_index(ferry_st_load *ld, const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	size_t len = 0;
	char *buf = NULL;
	int rr = strstr(path, "://") ? read_url(ld->ctx, path, &buf, &len) /* through the remote backend */
				     : read_local(path, &buf, &len);
	if (rr)
		return rr;
	struct ferry__json j;
	char *k, *v;
	size_t kl, vl, kpos;
	int r = 0, m, found = 0;
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		goto bad;
	while (!r && (m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "weight_map")) {
			found = 1;
			if (ferry__json_object_begin(&j))
				goto bad;
			while (!r && (m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
				size_t vpos = j.pos;
				if (ferry__json_string(&j, &v, &vl))
					goto bad;
				r = ferry__check_shard_name(path, v, vl, vpos);
				if (!r)
					r = add_file(ld, dir, v);
			}
		} else if (!strcmp(k, "shards")) {
			found = 1;
			struct add_files a = {ld, dir};
			if ((r = ferry__json_shard_files(&j, path, add_shard_file, &a)) == 1)
				goto bad;
		} else if (ferry__json_skip(&j)) {
			goto bad;
		}
		if (m < 0)
			goto bad;
	}
	if (r)
		goto out;
	if (m < 0 || ferry__json_end(&j))
		goto bad;
	if (!found)
		r = ferry__error(FERRY_ECORRUPT, "%s: neither \"weight_map\" nor \"shards\"", path);
	goto out;
bad:
	r = ferry__error(FERRY_ECORRUPT, "%s: byte %zu: %s", path, j.err_pos, j.err ? j.err : "unexpected JSON");
out:
	free(buf);
	return r;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && !strcmp(s + a - b, suffix);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int open_dir(ferry_st_load *ld, const char *path)
{
	char p[PATH_MAX];
	static const char *const indexes[] = {"manifest.json", "model.safetensors.index.json"};
	for (size_t i = 0; i < 2; i++) {
		snprintf(p, sizeof(p), "%s/%s", path, indexes[i]);
		if (access(p, F_OK) == 0)
			return open_index(ld, p);
	}
	DIR *d = opendir(path);
	if (!d)
		return ferry__error(-errno, "opendir(%s): %s", path, strerror(errno));
	char **names = NULL;
	size_t n = 0, cap = 0;
	int r = 0;
	struct dirent *e;
	while (!r && (e = readdir(d))) {
		if (!ends_with(e->d_name, ".safetensors"))
			continue;
		if (ferry__grow((void **)&names, &cap, n + 1, sizeof(*names)) || !(names[n] = strdup(e->d_name)))
			r = ferry__error(-ENOMEM, "load: out of memory");
		else
			n++;
	}
	closedir(d);
	if (n > 1)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		if (!r)
			r = add_file(ld, path, names[i]);
		free(names[i]);
	}
	free(names);
	if (!r && !n)
		r = ferry__error(-ENOENT, "%s: no manifest.json, model.safetensors.index.json or *.safetensors", path);
	return r;
}

int ferry_st_load_open(ferry_ctx *ctx, const char *path, ferry_st_load **out)
{
	struct stat sb;
	*out = NULL;
	ferry_st_load *ld = calloc(1, sizeof(*ld));
	if (!ld || !(ld->path = strdup(path))) {
		free(ld);
		return ferry__error(-ENOMEM, "load: out of memory");
	}
	ld->ctx = ctx;
	int r;
	if (strstr(path, "://") && ends_with(path, ".json")) /* a sharded set's index behind a URL */
		r = open_index(ld, path);
	else if (strstr(path, "://")) /* s3://, http(s)://: one object, read by the remote backend (docs/REMOTE.md) */
		r = add_file(ld, NULL, path);
	else if (stat(path, &sb))
		r = ferry__error(-errno, "stat(%s): %s", path, strerror(errno));
	else if (S_ISDIR(sb.st_mode))
		r = open_dir(ld, path);
	else if (ends_with(path, ".json"))
		r = open_index(ld, path);
	else
		r = add_file(ld, NULL, path);
	/* A name in two files is ambiguous. */
	for (size_t f = 0; !r && f < ld->nfiles; f++)
		for (size_t i = 0; !r && i < ferry_st_count(ld->files[f]); i++)
			for (size_t g = f + 1; !r && g < ld->nfiles; g++)
				if (ferry_st_find(ld->files[g], ferry_st_name(ld->files[f], i)) >= 0)
					r = ferry__error(FERRY_ECORRUPT, "%s: tensor \"%s\" is in both %s and %s", path,
							 ferry_st_name(ld->files[f], i), ferry_st_path(ld->files[f]),
							 ferry_st_path(ld->files[g]));
	if (r) {
		ferry_st_load_destroy(ld);
		return r;
	}
	*out = ld;
	return 0;
}

size_t ferry_st_load_files(const ferry_st_load *ld)
{
	return ld->nfiles;
}

ferry_st *ferry_st_load_file(ferry_st_load *ld, size_t f)
{
	return f < ld->nfiles ? ld->files[f] : NULL;
}

static int find(const ferry_st_load *ld, const char *name, size_t *file, size_t *idx)
{
	for (size_t f = 0; f < ld->nfiles; f++) {
		int i = ferry_st_find(ld->files[f], name);
		if (i >= 0) {
			*file = f;
			*idx = (size_t)i;
			return 0;
		}
	}
	return ferry__error(-ENOENT, "%s: no tensor \"%s\"", ld->path, name);
}

static void select_all(ferry_st_load *ld)
{
	if (ld->explicit_sel || ld->nsel)
		return;
	size_t n = 0;
	for (size_t f = 0; f < ld->nfiles; f++)
		n += ferry_st_count(ld->files[f]);
	if (ferry__grow((void **)&ld->sel, &ld->cap, n, sizeof(*ld->sel)))
		return;
	for (size_t f = 0; f < ld->nfiles; f++)
		for (size_t i = 0; i < ferry_st_count(ld->files[f]); i++)
			ld->sel[ld->nsel++] = (struct lsel){.file = f, .idx = i,
							     .nbytes = ferry_st_nbytes(ld->files[f], i)};
}

static int select_one(ferry_st_load *ld, const char *name, int sliced, int dim, uint64_t start, uint64_t stop)
{
	size_t f = 0, i = 0;
	int r = find(ld, name, &f, &i);
	if (r)
		return r;
	if (!ld->explicit_sel)
		ld->nsel = 0;
	ld->explicit_sel = 1;
	ld->pl.valid = 0;
	struct lsel s = {.file = f, .idx = i, .sliced = sliced, .dim = dim, .start = start, .stop = stop,
			 .nbytes = ferry_st_nbytes(ld->files[f], i)};
	if (sliced && (r = ferry__st_slice_shape(ld->files[f], i, dim, start, stop, &s.nbytes)))
		return r;
	for (size_t k = 0; k < ld->nsel; k++)
		if (ld->sel[k].file == f && ld->sel[k].idx == i)
			return ferry__error(-EEXIST, "%s: tensor \"%s\" selected twice", ld->path, name);
	if (ferry__grow((void **)&ld->sel, &ld->cap, ld->nsel + 1, sizeof(*ld->sel)))
		return ferry__error(-ENOMEM, "load: out of memory");
	ld->sel[ld->nsel++] = s;
	return 0;
}

int ferry_st_load_select(ferry_st_load *ld, const char *name)
{
	return select_one(ld, name, 0, 0, 0, 0);
}

int ferry_st_load_select_slice(ferry_st_load *ld, const char *name, int dim, uint64_t start, uint64_t stop)
{
	return select_one(ld, name, 1, dim, start, stop);
}

size_t ferry_st_load_count(ferry_st_load *ld)
{
	select_all(ld);
	return ld->nsel;
}

const char *ferry_st_load_name(ferry_st_load *ld, size_t i)
{
	select_all(ld);
	return i < ld->nsel ? ferry_st_name(ld->files[ld->sel[i].file], ld->sel[i].idx) : NULL;
}

enum ferry_dtype ferry_st_load_dtype(ferry_st_load *ld, size_t i)
{
	select_all(ld);
	return i < ld->nsel ? ferry_st_dtype(ld->files[ld->sel[i].file], ld->sel[i].idx) : FERRY_DT_INVALID;
}

int ferry_st_load_shape(ferry_st_load *ld, size_t i, uint64_t *dims, int max)
{
	select_all(ld);
	if (i >= ld->nsel)
		return -1;
	struct lsel *s = &ld->sel[i];
	int nd = ferry_st_shape(ld->files[s->file], s->idx, dims, max);
	if (s->sliced && dims && s->dim < max)
		dims[s->dim] = s->stop - s->start;
	return nd;
}

uint64_t ferry_st_load_nbytes(ferry_st_load *ld, size_t i)
{
	select_all(ld);
	return i < ld->nsel ? ld->sel[i].nbytes : 0;
}

int ferry_st_load_set_dest(ferry_st_load *ld, size_t i, void *ptr, size_t len)
{
	select_all(ld);
	if (i >= ld->nsel || len < ld->sel[i].nbytes)
		return ferry__error(-EINVAL, "%s: destination %zu: too small or no such tensor", ld->path, i);
	ld->sel[i].dest = ptr;
	ld->sel[i].dest_len = len;
	ld->pl.valid = 0;
	return 0;
}

void *ferry_st_load_ptr(ferry_st_load *ld, size_t i)
{
	return i < ld->nsel ? ld->sel[i].ptr : NULL;
}

uint64_t ferry_st_load_bytes(const ferry_st_load *ld)
{
	return ld->bytes;
}

uint64_t ferry_st_load_ns(const ferry_st_load *ld)
{
	return ld->ns;
}

static int alloc_mem(ferry_st_load *ld, int device, size_t len, void **out)
{
	struct lalloc *a = realloc(ld->allocs, (ld->nallocs + 1) * sizeof(*a));
	if (!a)
		return ferry__error(-ENOMEM, "load: out of memory");
	ld->allocs = a;
	void *p = NULL;
	size_t n = len ? len : 1;
	if (device >= 0) {
		int r = ferry_gpu_malloc(device, n, &p);
		if (r)
			return r;
	} else if (!(p = ferry_alloc_aligned(n))) {
		return ferry__error(-ENOMEM, "load: %zu bytes of host memory", n);
	}
	ld->allocs[ld->nallocs++] = (struct lalloc){p, n, device};
	*out = p;
	return 0;
}

/* A tensor's stored checksum: 0, FERRY_EVERIFY when it has none, FERRY_ECORRUPT when unreadable. */
static int stored_sum(ferry_st *st, size_t idx, uint64_t *want)
{
	char key[4096];
	const char *name = ferry_st_name(st, idx);
	snprintf(key, sizeof(key), "%s%s", FERRY_ST_CHECKSUM_PREFIX, name);
	const char *v = ferry_st_metadata_get(st, key);
	if (!v)
		return ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\" has no stored checksum", ferry_st_path(st), name);
	if (ferry__hex64(v, want))
		return ferry__error(FERRY_ECORRUPT, "%s: __metadata__ \"%s\" is not 16 hex digits", ferry_st_path(st), key);
	return 0;
}

static int sum_mismatch(ferry_st *st, size_t idx, uint64_t got, uint64_t want)
{
	return ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\": xxh3 %016llx, stored %016llx", ferry_st_path(st),
			    ferry_st_name(st, idx), (unsigned long long)got, (unsigned long long)want);
}

/* Reads a whole tensor through host staging, hashing as it goes; FERRY_EVERIFY on mismatch. */
static int read_verified(ferry_st_load *ld, struct lsel *s, void *dst, int on_dev, char *stage, size_t cap)
{
	ferry_st *st = ld->files[s->file];
	uint64_t want, nb = ferry_st_nbytes(st, s->idx), off = ferry_st_offset(st, s->idx);
	int sr = stored_sum(st, s->idx, &want);
	if (sr)
		return sr;
	struct ferry__xxh3 *h = ferry__xxh3_create();
	if (!h)
		return ferry__error(-ENOMEM, "%s: verify: out of memory", ferry_st_path(st));
	int r = 0;
	for (uint64_t done = 0; done < nb && !r;) {
		size_t n = nb - done < cap ? (size_t)(nb - done) : cap;
		ssize_t got = ferry_pread(ferry_st_file(st), stage, n, off + done);
		if (got != (ssize_t)n) {
			r = got < 0 ? (int)got : ferry__error(FERRY_ECORRUPT, "%s: file ends early", ferry_st_path(st));
			break;
		}
		ferry__xxh3_update(h, stage, n);
		if (on_dev)
			r = ferry_gpu_memcpy_htod((char *)dst + done, stage, n);
		else
			memcpy((char *)dst + done, stage, n);
		done += n;
	}
	uint64_t got = ferry__xxh3_digest(h);
	ferry__xxh3_destroy(h);
	if (!r && got != want)
		r = sum_mismatch(st, s->idx, got, want);
	return r;
}

/*
 * Verified loads, on several threads: a tensor read into host memory by the batch (hash_after) is
 * hashed where it landed, one pass at memory speed; one bound for device memory is read through
 * the thread's own staging, hashed and copied (read_verified). The error reported is the one of the
 * first tensor in selection order that failed, whichever thread found it.
 */
struct vwork {
	ferry_st_load *ld;
	size_t cap, next, err_k;
	int err;
	char msg[1024];
	pthread_mutex_t mu;
};

static void *verify_worker(void *arg)
{
	struct vwork *w = arg;
	char *stage = NULL;
	for (;;) {
		pthread_mutex_lock(&w->mu);
		size_t k = w->next;
		while (k < w->ld->nsel && w->ld->sel[k].sliced)
			k++;
		w->next = k + 1;
		int stop = k >= w->ld->nsel || (w->err && w->err_k < k);
		pthread_mutex_unlock(&w->mu);
		if (stop)
			break;
		struct lsel *s = &w->ld->sel[k];
		ferry_st *st = w->ld->files[s->file];
		int r = 0;
		if (ferry__st_cz(st)) {
			/* checked chunk by chunk as it was read (add_read) */
		} else if (s->hash_after) {
			uint64_t want;
			r = stored_sum(st, s->idx, &want);
			uint64_t got = r ? 0 : ferry__xxh3_64(s->ptr, (size_t)s->nbytes);
			if (!r && got != want)
				r = sum_mismatch(st, s->idx, got, want);
		} else if (!stage && !(stage = ferry_alloc_aligned(w->cap))) {
			r = ferry__error(-ENOMEM, "load: staging of %zu bytes", w->cap);
		} else {
			int on_dev = s->ptr && ferry_mem_kind(s->ptr, NULL) == FERRY_MEM_DEVICE;
			r = read_verified(w->ld, s, s->ptr, on_dev, stage, w->cap);
		}
		if (r) {
			pthread_mutex_lock(&w->mu);
			if (!w->err || k < w->err_k) {
				w->err = r;
				w->err_k = k;
				snprintf(w->msg, sizeof(w->msg), "%s", ferry_last_error());
			}
			pthread_mutex_unlock(&w->mu);
		}
	}
	ferry_free_aligned(stage, w->cap);
	return NULL;
}

/* Verifies every whole tensor of the selection on up to 8 threads; staging_budget split among them. */
static int verify_all(ferry_st_load *ld, uint64_t staging_budget)
{
	size_t n = 0;
	for (size_t k = 0; k < ld->nsel; k++)
		n += !ld->sel[k].sliced;
	if (!n)
		return 0;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t t = cpus < 1 ? 1 : cpus > 8 ? 8 : (size_t)cpus;
	t = t > n ? n : t;
	struct vwork w = {.ld = ld};
	w.cap = (size_t)(staging_budget / t);
	w.cap = w.cap < (1u << 20) ? (1u << 20) : w.cap;
	pthread_mutex_init(&w.mu, NULL);
	pthread_t th[8];
	size_t started = 0;
	for (; started + 1 < t; started++)
		if (pthread_create(&th[started], NULL, verify_worker, &w))
			break;
	verify_worker(&w); /* this thread works too */
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&w.mu);
	if (w.err)
		(void)ferry__error(0, "%s", w.msg); /* the worker's message, already with its reason */
	return w.err;
}

/*
 * The placement rule, per file: what loads whole (not sliced, no destination given) shares one
 * allocation: laid out like the file from the first byte to the last (*span) when it covers at
 * least 3/4 of that range, so that one read fills it; else packed in selection order, each tensor
 * VIEW_ALIGN-aligned (*packed bytes). FERRY_LOAD_PER_TENSOR: an allocation per tensor.
 */
static void file_region(const ferry_st_load *ld, size_t f, int flags, uint64_t *lo_out, uint64_t *hi_out,
			int *span, uint64_t *packed)
{
	ferry_st *st = ld->files[f];
	uint64_t lo = UINT64_MAX, hi = 0, want = 0, compact = 0;
	for (size_t k = 0; k < ld->nsel; k++) {
		const struct lsel *s = &ld->sel[k];
		if (s->file != f || s->sliced || s->dest)
			continue;
		uint64_t off = ferry_st_offset(st, s->idx);
		lo = off < lo ? off : lo;
		hi = off + s->nbytes > hi ? off + s->nbytes : hi;
		want += s->nbytes;
		compact += (s->nbytes + VIEW_ALIGN - 1) / VIEW_ALIGN * VIEW_ALIGN;
	}
	*span = !(flags & FERRY_LOAD_PER_TENSOR) && hi > lo && want >= (hi - lo) / 4 * 3;
	*lo_out = lo;
	*hi_out = hi;
	*packed = flags & FERRY_LOAD_PER_TENSOR ? 0 : compact;
}

int ferry_st_load_place(ferry_st_load *ld, size_t i, int flags, size_t *file, uint64_t *offset, uint64_t *region_len)
{
	select_all(ld);
	if (i >= ld->nsel)
		return ferry__error(-EINVAL, "%s: no entry %zu", ld->path, i);
	const struct lsel *s = &ld->sel[i];
	uint64_t lo, hi, packed, at = 0;
	int span;
	*file = s->file;
	*offset = 0;
	*region_len = 0;
	if (s->sliced || s->dest || (flags & FERRY_LOAD_PER_TENSOR))
		return 0;
	if (!ld->pl.valid || ld->pl.file != s->file || ld->pl.flags != flags) {
		file_region(ld, s->file, flags, &lo, &hi, &span, &packed);
		ld->pl.valid = 1;
		ld->pl.file = s->file;
		ld->pl.flags = flags;
		ld->pl.span = span;
		ld->pl.lo = lo;
		ld->pl.hi = hi;
		ld->pl.packed = packed;
		ld->pl.next = 0;
		ld->pl.at = 0;
	}
	if (ld->pl.span) {
		*offset = ferry_st_offset(ld->files[s->file], s->idx) - ld->pl.lo;
		*region_len = ld->pl.hi - ld->pl.lo;
		return 1;
	}
	size_t k = 0;
	if (i >= ld->pl.next) { /* go on from the last entry asked for */
		k = ld->pl.next;
		at = ld->pl.at;
	}
	for (; k < i; k++) {
		const struct lsel *o = &ld->sel[k];
		if (o->file == s->file && !o->sliced && !o->dest)
			at += (o->nbytes + VIEW_ALIGN - 1) / VIEW_ALIGN * VIEW_ALIGN;
	}
	ld->pl.next = i;
	ld->pl.at = at;
	*offset = at;
	*region_len = ld->pl.packed;
	return 1;
}

/*
 * One read of a file into ptr: through the batch for a plain file; for a compressed one
 * (docs/FORMATS.md), ferry_cz_pread now, which decodes the chunks the range covers in parallel, on
 * the GPU (nvCOMP) or the CPU for device memory, and checks each chunk's checksums.
 */
static int add_read(ferry_batch *b, ferry_st *st, uint64_t off, size_t len, void *ptr)
{
	ferry_cz *z = ferry__st_cz(st);
	if (!z)
		return ferry_batch_add_read(b, ferry_st_file(st), off, len, ptr);
	ssize_t got = ferry_cz_pread(z, ptr, len, off);
	if (got >= 0 && (size_t)got != len)
		return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte %llu: file ends early", ferry_st_path(st),
				    (unsigned long long)(off + (uint64_t)got));
	return got < 0 ? (int)got : 0;
}

int ferry_st_load_path_info(const ferry_st_load *ld, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s", ld->cz_path);
	return n < 0 ? 0 : n;
}

int ferry_st_load_run(ferry_st_load *ld, int device, int flags, uint64_t staging_budget)
{
	uint64_t t0 = ferry__now_ns();
	int r = 0;
	select_all(ld);
	free_allocs(ld);
	ld->bytes = 0;
	ld->cz_path[0] = 0;
	if (!staging_budget)
		staging_budget = 256u << 20;
	ferry_batch *b = NULL;
	if ((r = ferry_batch_create(ld->ctx, &b)))
		return r;
	struct ferry__activity *act = ferry__activity_begin(ld->ctx, FERRY__ACTIVITY_LOAD, ld->path);
	for (size_t k = 0; act && k < ld->nsel; k++)
		ferry__activity_add(act, FERRY__ACT_TOTAL, ld->sel[k].nbytes);
	ferry__activity_set(act, FERRY__ACT_PHASE, FERRY__PHASE_MOVE);
	/* Placement: per file, one allocation for the span of what loads whole, or one per tensor. */
	for (size_t f = 0; f < ld->nfiles && !r; f++) {
		ferry_st *st = ld->files[f];
		uint64_t lo, hi, compact;
		int span;
		file_region(ld, f, flags, &lo, &hi, &span, &compact);
		char *base = NULL;
		if (span && (r = alloc_mem(ld, device, (size_t)(hi - lo), (void **)&base)))
			break;
		if (!span && compact && (r = alloc_mem(ld, device, (size_t)compact, (void **)&base)))
			break;
		uint64_t at = 0;
		for (size_t k = 0; k < ld->nsel && !r; k++) {
			struct lsel *s = &ld->sel[k];
			if (s->file != f)
				continue;
			if (s->dest) {
				s->ptr = s->dest;
			} else if (span && !s->sliced) {
				s->ptr = base + (ferry_st_offset(st, s->idx) - lo);
			} else if (!(flags & FERRY_LOAD_PER_TENSOR) && !s->sliced) {
				s->ptr = base + at;
				at += (s->nbytes + VIEW_ALIGN - 1) / VIEW_ALIGN * VIEW_ALIGN;
			} else {
				r = alloc_mem(ld, device, (size_t)s->nbytes, &s->ptr);
			}
		}
		if (r)
			break;
		/* Verifying into host memory: the batch reads as without verifying, and the tensors are
		 * hashed where they landed (verify_all). A file with a tensor bound for device memory is
		 * read tensor by tensor through staging instead, hashed on the way. */
		ferry_cz *z = ferry__st_cz(st);
		if (z && (flags & FERRY_LOAD_VERIFY)) { /* each chunk's checksums, checked as it is read */
			r = ferry_cz_set(z, "cz_verify", "1");
			for (size_t k = 0; k < ld->nsel; k++)
				if (ld->sel[k].file == f)
					ld->sel[k].hash_after = 0;
		} else if (flags & FERRY_LOAD_VERIFY) {
			int dev = 0;
			for (size_t k = 0; k < ld->nsel && !dev; k++)
				dev = ld->sel[k].file == f && !ld->sel[k].sliced && ld->sel[k].ptr &&
				      ferry_mem_kind(ld->sel[k].ptr, NULL) == FERRY_MEM_DEVICE;
			for (size_t k = 0; k < ld->nsel; k++)
				if (ld->sel[k].file == f)
					ld->sel[k].hash_after = !dev && !ld->sel[k].sliced;
			if (dev)
				continue;
		}
		/*
		 * The reads: one for the span, one per other whole tensor, except that tensors that
		 * follow each other both in the file and in memory (destinations the caller laid out
		 * like the file, e.g. views of one torch allocation) are read as one transfer.
		 */
		if (span && !r)
			r = add_read(b, st, lo, (size_t)(hi - lo), base);
		uint64_t run_off = 0, run_len = 0;
		char *run_ptr = NULL;
		for (size_t k = 0; k <= ld->nsel && r >= 0; k++) {
			struct lsel *s = k < ld->nsel ? &ld->sel[k] : NULL;
			if (s && (s->file != f || s->sliced || !s->nbytes || (span && !s->dest)))
				continue;
			uint64_t off = s ? ferry_st_offset(st, s->idx) : 0;
			if (s && run_len && off == run_off + run_len && (char *)s->ptr == run_ptr + run_len) {
				run_len += s->nbytes;
				continue;
			}
			if (run_len)
				r = add_read(b, st, run_off, (size_t)run_len, run_ptr);
			if (s) {
				run_off = off;
				run_len = s->nbytes;
				run_ptr = s->ptr;
			}
		}
		r = r < 0 ? r : 0;
		if (z) {
			char info[160];
			(void)ferry_cz_path_info(z, info, sizeof(info));
			snprintf(ld->cz_path, sizeof(ld->cz_path), "%s", info);
		}
	}
	if (!r && ferry_batch_count(b))
		r = ferry_batch_submit(b);
	int submitted = !r && ferry_batch_count(b);
	/* Slices run on this thread while the batch is in flight (verified: the whole tensor is
	 * checked first); whole tensors are verified once the batch is in (verify_all). */
	for (size_t k = 0; k < ld->nsel && !r; k++) {
		struct lsel *s = &ld->sel[k];
		ferry_st *st = ld->files[s->file];
		if (!s->sliced)
			continue; /* read by the batch, or verified below */
		if (flags & FERRY_LOAD_VERIFY) {
			int v = ferry_st_verify(st, s->idx);
			r = v == 0 ? ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\" has no stored checksum",
						  ferry_st_path(st), ferry_st_name(st, s->idx))
				   : v < 0 ? v : 0;
		}
		if (!r && s->sliced) {
			ssize_t got = ferry_st_read_slice(st, s->idx, s->dim, s->start, s->stop, s->ptr,
							  (size_t)s->nbytes);
			r = got < 0 ? (int)got : 0;
		}
	}
	if (submitted) {
		int w = ferry_batch_wait(b, -1);
		if (w > 0)
			w = ferry__error(FERRY_ECORRUPT, "%s: a file ends before its header says", ld->path);
		if (!r)
			r = w;
	}
	if (!r && (flags & FERRY_LOAD_VERIFY))
		r = verify_all(ld, staging_budget);
	ferry_batch_destroy(b);
	for (size_t k = 0; k < ld->nsel; k++)
		ld->bytes += ld->sel[k].nbytes;
	ld->ns = ferry__now_ns() - t0;
	ferry__activity_set(act, FERRY__ACT_ITEMS, r ? 0 : ld->nsel);
	ferry__activity_set(act, FERRY__ACT_BYTES, r ? 0 : ld->bytes);
	ferry__activity_end(act, r ? FERRY__PHASE_FAILED : FERRY__PHASE_DONE);
	if (r) {
		free_allocs(ld);
		for (size_t k = 0; k < ld->nsel; k++)
			ld->sel[k].ptr = NULL;
	}
	return r;
}
