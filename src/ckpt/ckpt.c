/* Checkpoint directories: shards, markers, manifest, `latest`, pruning (see include/ferry/ckpt.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "base/durable.h"
#include "base/knob.h"
#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "engine/export.h"
#include "base/json.h"
#include "base/sbuf.h"

/* Where the newest pruned step's shards wait to be written over by the next save (recycle=1) */
#define RECYCLE_DIR "recycle"

/*
 * A writer's lock on one rank of a checkpoint directory: DIR/.ferry-lock-rank-R, flock()ed for the
 * handle's lifetime (the kernel drops it when the process dies), holding "pid P host H". One per
 * rank, not per directory: the ranks of a job are separate processes writing one directory. Handles
 * of one process share it (Python keeps one per directory, rank and world, and renews it): the lock
 * is against another process, as a second job started on the same directory.
 */
struct held_lock {
	dev_t dev;
	ino_t ino;
	int fd, refs;
	struct held_lock *next;
};
static pthread_mutex_t locks_mu = PTHREAD_MUTEX_INITIALIZER;
static struct held_lock *locks;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/*
 * A child made by fork() without exec (a DataLoader worker, multiprocessing's fork start method)
 * would otherwise share the parent's locks (flock belongs to the open file, which fork shares) and
 * keep them after the parent dies: the job restarted on the directory would find its ranks "held"
 * by workers. The child closes its copies; its handles refuse to save (save()).
 */
static void locks_prepare(void)
{
	pthread_mutex_lock(&locks_mu);
}

static void locks_parent(void)
{
	pthread_mutex_unlock(&locks_mu);
}

static void locks_child(void)
{
	for (struct held_lock *h = locks; h; h = h->next)
		if (h->fd >= 0) {
			close(h->fd);
			h->fd = -1;
		}
	pthread_mutex_unlock(&locks_mu);
}

static void locks_atfork(void)
{
	(void)pthread_atfork(locks_prepare, locks_parent, locks_child);
}

struct ferry_ckpt {
	ferry_ctx *ctx;
	char *dir;
	int rank, world;
	int keep, refuse, checksum, recycle;
	int compress; /* compress_choices: 0 off, FERRY_CZ_LZ4, FERRY_CZ_ZSTD, 3 auto (zstd) */
	int64_t timeout_ms;
	char run[128];
	ferry_st_writer *w;
	struct held_lock *lock;
	char lock_name[32];
	int url; /* dir is an s3:// prefix (docs/REMOTE.md): no lock, no directories, no pruning */
	/* the step being saved and its shard's codec (read by the writer thread's hook) */
	int64_t step;
	int saving_codec;
};

static const char *const busy_choices[] = {"wait", "refuse", NULL};
/* indexed as FERRY_CZ_LZ4 (1) and FERRY_CZ_ZSTD (2) number the codecs */
static const char *const compress_choices[] = {"off", "lz4", "zstd", "auto", NULL};
_Static_assert(FERRY_CZ_LZ4 == 1 && FERRY_CZ_ZSTD == 2, "compress_choices lists the codecs at their numbers");

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
	{.name = "compress", .type = FERRY__KNOB_ENUM, FERRY__KNOB_AT(struct ferry_ckpt, compress), .max = 3,
	 .choices = compress_choices,
	 .doc = "each shard written compressed (docs/FORMATS.md): off, lz4, zstd, auto (zstd)"},
	{.name = "run", .type = FERRY__KNOB_TEXT, FERRY__KNOB_AT(struct ferry_ckpt, run),
	 .doc = "an id shared by the ranks of one run"},
};

static const char *ckpt_keys[sizeof(ckpt_rows) / sizeof(ckpt_rows[0]) + 1];
static const struct ferry__knobs ckpt_knobs = {"checkpoint", ckpt_rows, sizeof(ckpt_rows) / sizeof(ckpt_rows[0]),
					       ckpt_keys};

/* ------------------------------------------------------------------------ objects of a URL */

int ferry__url_get(ferry_ctx *ctx, const char *url, size_t max, char **buf, size_t *len)
{
	ferry_ctx *own = NULL;
	ferry_file *f = NULL;
	*buf = NULL;
	*len = 0;
	int r = ctx ? 0 : ferry_ctx_create(&own);
	if (!r)
		r = ferry_file_open(ctx ? ctx : own, url, FERRY_O_RDONLY, &f);
	int64_t size = r ? 0 : ferry_file_size(f);
	if (!r && (size < 0 || (uint64_t)size > max))
		r = size < 0 ? (int)size : ferry__error(-EFBIG, "%s: %lld bytes, more than %zu", url, (long long)size, max);
	if (!r && !(*buf = malloc((size_t)size + 1)))
		r = ferry__error(-ENOMEM, "%s: out of memory", url);
	ssize_t got = r || !size ? 0 : ferry_pread(f, *buf, (size_t)size, 0);
	if (!r && got != (ssize_t)size)
		r = got < 0 ? (int)got : ferry__error(-EIO, "%s: short read", url);
	ferry_file_destroy(f);
	ferry_ctx_destroy(own);
	if (r) {
		free(*buf);
		*buf = NULL;
		return r;
	}
	(*buf)[size] = '\0';
	*len = (size_t)size;
	return 0;
}

static int64_t parse_step_name(const char *s);

/* ferry__url_put with the commit conditional on cond (ferry__file_put_condition), NULL for none. */
static int url_put_cond(ferry_ctx *ctx, const char *url, const void *buf, size_t len, const char *cond)
{
	ferry_ctx *own = NULL;
	ferry_file *f = NULL;
	int r = ctx ? 0 : ferry_ctx_create(&own);
	if (!r)
		r = ferry_file_open(ctx ? ctx : own, url, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &f);
	if (!r && cond && !strncasecmp(url, "s3://", 5)) {
		int c = ferry__file_put_condition(f, cond);
		r = c < 0 ? c : 0;
	}
	ssize_t got = r || !len ? 0 : ferry_pwrite(f, buf, len, 0);
	if (!r && got != (ssize_t)len)
		r = got < 0 ? (int)got : ferry__error(-EIO, "%s: short write", url);
	if (!r)
		r = ferry_file_sync(f, 0); /* the commit; without it the destroy below drops the upload */
	ferry_file_destroy(f);
	ferry_ctx_destroy(own);
	return r;
}

int ferry__url_put(ferry_ctx *ctx, const char *url, const void *buf, size_t len)
{
	return url_put_cond(ctx, url, buf, len, NULL);
}

/*
 * `latest` under an s3:// prefix, as a compare-and-swap: written only if it is still the object read
 * here (If-Match its ETag; If-None-Match: * when there is none) and names a step before this one, so
 * that of two writers committing to one prefix at once the second is refused, not silently lost.
 */
static int put_latest_url(ferry_ctx *ctx, const char *url, int64_t step, const char *text, size_t len)
{
	ferry_file *f = NULL;
	char cond[300] = "If-None-Match: *", buf[128];
	int r = ferry_file_open(ctx, url, FERRY_O_RDONLY, &f);
	if (r == -ENOENT) {
		ferry__error_clear();
	} else if (r) {
		return r;
	} else {
		int64_t size = ferry_file_size(f);
		ssize_t n = size > 0 && size < (int64_t)sizeof(buf) ? ferry_pread(f, buf, (size_t)size, 0) : 0;
		const char *etag = ferry__file_etag(f);
		if (etag && etag[0])
			snprintf(cond, sizeof(cond), "If-Match: %s", etag);
		else
			cond[0] = 0;
		ferry_file_destroy(f);
		if (n < 0)
			return (int)n;
		buf[n] = 0;
		if (n && buf[n - 1] == '\n')
			buf[n - 1] = 0;
		int64_t have = parse_step_name(buf);
		if (have >= step)
			return ferry__error(-EEXIST, "%s names step %lld, not before step %lld: another writer committed to "
					    "this prefix meanwhile", url, (long long)have, (long long)step);
	}
	return url_put_cond(ctx, url, text, len, cond[0] ? cond : NULL);
}

int ferry_ckpt_step_path(const char *dir, int64_t step, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld", dir, (long long)step);
	return n < 0 || (size_t)n >= len ? ferry__error(-ENAMETOOLONG, "%s: path too long", dir) : n;
}

/* The suffix of a compressed shard's name, after ".safetensors": it is no safetensors file, and
 * tools that take *.safetensors leave it alone. */
#define CZ_SUFFIX ".fz"

int ferry_ckpt_shard_path(const char *dir, int64_t step, int rank, int world, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld/rank-%05d-of-%05d.safetensors", dir, (long long)step, rank, world);
	if (n < 0 || (size_t)n >= len)
		return ferry__error(-ENAMETOOLONG, "%s: path too long", dir);
	/* A compressed shard (saved with compress=): the plain name is absent, the .fz one present */
	struct stat sb;
	if (!strstr(dir, "://") && (size_t)n + sizeof(CZ_SUFFIX) <= len && lstat(buf, &sb) && errno == ENOENT) {
		memcpy(buf + n, CZ_SUFFIX, sizeof(CZ_SUFFIX));
		if (!lstat(buf, &sb))
			return n + (int)sizeof(CZ_SUFFIX) - 1;
		buf[n] = 0;
	}
	return n;
}

static int marker_path(const ferry_ckpt *ck, int64_t step, int rank, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/step-%012lld/rank-%05d-of-%05d.done", ck->dir, (long long)step, rank, ck->world);
	return n < 0 || (size_t)n >= len ? ferry__error(-ENAMETOOLONG, "%s: path too long", ck->dir) : 0;
}

/* 1 when dfd/name is the file open as fd (not removed or replaced since), else 0. */
static int same_file(int dfd, const char *name, int fd)
{
	struct stat a, b;
	return !fstat(fd, &a) && !fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) && a.st_dev == b.st_dev &&
	       a.st_ino == b.st_ino;
}

/*
 * The lock file is removed by its last holder (a checkpoint directory holds no more than it did),
 * so a writer that got the lock checks that the file it locked is still the one at its name, and
 * starts again if a holder removed it meanwhile (the usual lock-file protocol).
 */
static int take_lock(ferry_ckpt *ck)
{
	char who[256];
	snprintf(ck->lock_name, sizeof(ck->lock_name), ".ferry-lock-rank-%05d", ck->rank);
	const char *name = ck->lock_name;
	pthread_once(&atfork_once, locks_atfork);
	int dfd = ferry__dir_open(ck->dir, FERRY__DIR_FOLLOW);
	if (dfd < 0)
		return dfd;
	int r = 0, fd = -1;
	struct held_lock *h = NULL;
	for (;;) {
		fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
		int e = errno;
		struct stat st;
		if (fd < 0) {
			r = ferry__error(-e, "ckpt %s: lock file %s: %s", ck->dir, name, strerror(e));
			break;
		}
		if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
			r = ferry__error(-EINVAL, "ckpt %s: lock file %s is not a plain file", ck->dir, name);
			break;
		}
		pthread_mutex_lock(&locks_mu);
		for (h = locks; h && (h->fd < 0 || h->dev != st.st_dev || h->ino != st.st_ino);) /* fd < 0: a fork's */
			h = h->next;
		if (h) {
			h->refs++;
			pthread_mutex_unlock(&locks_mu);
			break;
		}
		if (flock(fd, LOCK_EX | LOCK_NB)) {
			e = errno;
			pthread_mutex_unlock(&locks_mu);
			ssize_t n = pread(fd, who, sizeof(who) - 1, 0);
			who[n > 0 ? n : 0] = '\0';
			who[strcspn(who, "\n")] = '\0';
			r = e == EWOULDBLOCK ? ferry__error(FERRY_EBUSY, "ckpt %s: rank %d has another writer: %s holds %s/%s",
							     ck->dir, ck->rank, *who ? who : "a process", ck->dir, name)
					     : ferry__error(-e, "ckpt %s: flock(%s): %s", ck->dir, name, strerror(e));
			break;
		}
		if (!same_file(dfd, name, fd)) {
			pthread_mutex_unlock(&locks_mu);
			close(fd);
			continue;
		}
		char host[128] = "?";
		gethostname(host, sizeof(host) - 1);
		host[sizeof(host) - 1] = '\0';
		int n = snprintf(who, sizeof(who), "pid %d host %s\n", (int)getpid(), host);
		if (ftruncate(fd, 0) || pwrite(fd, who, (size_t)n, 0) != n)
			r = ferry__error(-errno, "ckpt %s: writing %s: %s", ck->dir, name, strerror(errno));
		else if (!(h = calloc(1, sizeof(*h))))
			r = ferry__error(-ENOMEM, "ckpt: out of memory");
		if (!r) {
			*h = (struct held_lock){st.st_dev, st.st_ino, fd, 1, locks};
			locks = h;
			fd = -1;
		}
		pthread_mutex_unlock(&locks_mu);
		break;
	}
	if (fd >= 0)
		close(fd);
	close(dfd);
	ck->lock = r ? NULL : h;
	return r;
}

static void drop_lock(ferry_ckpt *ck)
{
	struct held_lock *h = ck->lock;
	if (!h)
		return;
	pthread_mutex_lock(&locks_mu);
	if (--h->refs == 0) {
		struct held_lock **pp = &locks;
		while (*pp != h)
			pp = &(*pp)->next;
		*pp = h->next;
		int dfd = open(ck->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* no error recorded: destroy's */
		if (dfd >= 0 && h->fd >= 0 && same_file(dfd, ck->lock_name, h->fd))
			(void)unlinkat(dfd, ck->lock_name, 0);
		if (dfd >= 0)
			close(dfd);
		if (h->fd >= 0)
			close(h->fd);
		free(h);
	}
	pthread_mutex_unlock(&locks_mu);
	ck->lock = NULL;
}

int ferry_ckpt_open(ferry_ctx *ctx, const char *dir, int rank, int world, ferry_ckpt **out)
{
	*out = NULL;
	if (world < 1 || rank < 0 || rank >= world)
		return ferry__error(-EINVAL, "ckpt %s: rank %d of world %d", dir, rank, world);
	int url = strstr(dir, "://") != NULL; /* an s3:// prefix: objects, made by the saves */
	if (!url && mkdir(dir, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", dir, strerror(errno));
	ferry_ckpt *ck = calloc(1, sizeof(*ck));
	if (!ck || !(ck->dir = strdup(dir))) {
		free(ck);
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	ck->ctx = ctx;
	ck->rank = rank;
	ck->world = world;
	ck->url = url;
	int r = ferry__knobs_init(&ckpt_knobs, ck);
	if (!r && !url) /* S3 has no lock: a second writer of one prefix is not refused */
		r = take_lock(ck);
	if (!r)
		r = ferry_st_writer_create(ctx, &ck->w);
	if (r) {
		drop_lock(ck);
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
	drop_lock(ck);
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
	size_t n;
	snprintf(p, sizeof(p), "%s/latest", dir);
	if (strstr(dir, "://")) { /* the object `latest` under an s3:// prefix */
		char *t;
		int r = ferry__url_get(NULL, p, sizeof(buf) - 1, &t, &n);
		if (r)
			return r == -EFBIG ? ferry__error(FERRY_ECORRUPT, "%s: does not name a step", p) : r;
		memcpy(buf, t, n + 1);
		free(t);
	} else {
		FILE *f = fopen(p, "r");
		if (!f)
			return ferry__error(-errno, "%s: %s", p, strerror(errno));
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = '\0';
	}
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
static int read_marker(ferry_ckpt *ck, int64_t step, int rank, uint64_t *bytes, int *codec)
{
	char p[PATH_MAX], buf[1024], *k, *v;
	size_t len = 0, kl, vl, kpos;
	if (marker_path(ck, step, rank, p, sizeof(p)))
		return -ENAMETOOLONG;
	int r;
	if (ck->url) { /* an absent object (404) reads as -ENOENT, a marker not there yet */
		char *t;
		char saved[1024];
		snprintf(saved, sizeof(saved), "%s", ferry_last_error());
		r = ferry__url_get(ck->ctx, p, sizeof(buf) - 1, &t, &len);
		if (r == -ENOENT) { /* waited for: not an error to leave behind */
			ferry__error_clear();
			if (*saved)
				(void)ferry__error(0, "%s", saved);
		}
		if (!r) {
			memcpy(buf, t, len + 1);
			free(t);
		}
	} else {
		r = read_small(p, buf, sizeof(buf), &len);
	}
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
		} else if (!strcmp(k, "codec")) {
			if (ferry__json_string(&j, &v, &vl) || (*codec = ferry_cz_codec_from_name(v)) < 0)
				break;
		} else if (ferry__json_skip(&j)) {
			break;
		}
	}
	if (m != 0 || ferry__json_end(&j) || !have_bytes)
		return ferry__error(FERRY_ECORRUPT, "%s: not a marker", p);
	return run_ok;
}

static int prune(const char *dir, int keep, int recycle);
static int url_prune(ferry_ctx *ctx, const char *dir, int keep);
static int open_subdir(int dfd, const char *name);
static int rm_tree(int dfd, const char *name);

/*
 * Removes from the step's directory (never followed) the entries whose names begin with prefix.
 * Errors are not reported: this runs after a save failed (its error is the one to report). The
 * directory stays, even when empty: another rank may have just made it for its own shard (an
 * empty step older than latest is pruned as debris).
 */
static void drop_prefixed(int dfd, const char *step_name, const char *prefix)
{
	int fd = open_subdir(dfd, step_name);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	size_t n = strlen(prefix);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, n))
			continue;
		/* emptied first: the unlink alone frees the blocks only with the file's last
		 * reference, which the kernel may still hold after the save's writes completed (an
		 * io_uring request that went through io-wq is freed by its submitting worker's task
		 * work, which an idle worker runs at its next I/O); the failed save's space would
		 * stay in use until then */
		int f = openat(fd, e->d_name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		struct stat sb;
		if (f >= 0) {
			if (!fstat(f, &sb) && S_ISREG(sb.st_mode) && sb.st_nlink == 1) /* no copy kept */
				(void)!ftruncate(f, 0);
			close(f);
		}
		(void)unlinkat(fd, e->d_name, 0);
	}
	closedir(d);
}

/*
 * A save of this rank that failed gives its space back: its shard, temporaries and marker in the
 * step's directory are emptied and go (the rank's lock says they are this process's, and the step
 * never committed: no reader holds them). A full disk after the shard's rename (at the marker) no
 * longer leaves the whole shard behind for later saves to fail on.
 */
static void drop_own(ferry_ckpt *ck, int64_t step)
{
	char name[64], prefix[64];
	if (ck->url) /* objects are not deleted yet (no DeleteObject in the remote backend) */
		return;
	int dfd = ferry__dir_open(ck->dir, FERRY__DIR_FOLLOW);
	if (dfd < 0)
		return;
	snprintf(name, sizeof(name), "step-%012lld", (long long)step);
	snprintf(prefix, sizeof(prefix), "rank-%05d-of-%05d.", ck->rank, ck->world);
	drop_prefixed(dfd, name, prefix);
	close(dfd);
}

/* 1 when DIR/latest names step (a commit whose last fsync failed still committed the step). */
static int latest_is(const char *dir, int64_t step)
{
	char saved[1024]; /* the failed save's error is the one to report, not this lookup's */
	snprintf(saved, sizeof(saved), "%s", ferry_last_error());
	int64_t l = ferry_ckpt_latest(dir);
	ferry__error_clear();
	if (*saved)
		(void)ferry__error(0, "%s", saved);
	return l == step;
}

/* A temporary this rank's writer makes (durable.h names them "<final>.tmp-<16 hex>"): its shard and
 * marker; for rank 0 also the manifest's, and `latest`'s in DIR (in_step 0). */
static int own_temporary(const ferry_ckpt *ck, const char *name, int in_step)
{
	char prefix[32];
	const char *t = strstr(name, ".tmp-");
	if (!t || strlen(t) != 5 + 16)
		return 0;
	if (!in_step)
		return ck->rank == 0 && !strncmp(name, "latest.tmp-", 11);
	snprintf(prefix, sizeof(prefix), "rank-%05d-of-", ck->rank);
	return !strncmp(name, prefix, strlen(prefix)) || (ck->rank == 0 && !strncmp(name, "manifest.json.tmp-", 18));
}

/*
 * Temporaries of this rank's files in steps that did not commit, left by a writer that died
 * (SIGKILL during a save leaves a preallocated shard-sized *.tmp-*): the rank's lock says no live
 * process writes this rank, and none of this handle's saves is in flight, so they are debris. Only
 * temporaries go; a renamed shard of an uncommitted step may still be awaited by rank 0's commit.
 */
static void sweep_debris(ferry_ckpt *ck)
{
	char p[300];
	/* A step with a manifest but newer than latest did not commit (killed between the two): a
	 * save of it again finds earlier attempts' temporaries there. */
	int64_t latest = ferry_ckpt_latest(ck->dir); /* < 0 when none: every step is swept */
	ferry__error_clear();
	int dfd = ferry__dir_open(ck->dir, FERRY__DIR_FOLLOW);
	if (dfd < 0)
		return;
	int lfd = dup(dfd);
	DIR *d = lfd < 0 ? NULL : fdopendir(lfd);
	if (!d) {
		if (lfd >= 0)
			close(lfd);
		close(dfd);
		return;
	}
	struct dirent *e;
	struct stat st;
	while ((e = readdir(d))) {
		if (own_temporary(ck, e->d_name, 0) && !fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISREG(st.st_mode)) {
			(void)unlinkat(dfd, e->d_name, 0);
			continue;
		}
		if (parse_step_name(e->d_name) < 0 || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(st.st_mode))
			continue;
		snprintf(p, sizeof(p), "%s/manifest.json", e->d_name);
		if (parse_step_name(e->d_name) <= latest && !fstatat(dfd, p, &st, AT_SYMLINK_NOFOLLOW))
			continue; /* committed by a save that swept it first: no temporaries in it */
		int fd = open_subdir(dfd, e->d_name);
		DIR *sd = fd < 0 ? NULL : fdopendir(fd);
		if (!sd) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		struct dirent *f;
		while ((f = readdir(sd)))
			if (own_temporary(ck, f->d_name, 1))
				(void)unlinkat(fd, f->d_name, 0);
		closedir(sd); /* the directory stays: another rank may be about to write into it */
	}
	closedir(d);
	close(dfd);
}

/* name in step's directory, durably; the step directory is never followed if it is a symlink.
 * Under an s3:// prefix: the object <dir>/step-N/<name>, one PUT through ctx. */
static int step_write(ferry_ctx *ctx, const char *dir, int64_t step, const char *name, const char *text, size_t len)
{
	char sp[PATH_MAX];
	int r = ferry_ckpt_step_path(dir, step, sp, sizeof(sp));
	if (r < 0)
		return r;
	if (strstr(dir, "://")) {
		char p[PATH_MAX + 64];
		snprintf(p, sizeof(p), "%s/%s", sp, name);
		/* a manifest is written once per step: a second writer's is refused (remote_lock) */
		return url_put_cond(ctx, p, text, len, !strcmp(name, "manifest.json") ? "If-None-Match: *" : NULL);
	}
	int fd = ferry__dir_open(sp, 0);
	if (fd < 0)
		return fd;
	r = ferry__durable_write(fd, name, text, len, 0644, 0);
	close(fd);
	return r;
}

static int commit(ferry_ckpt *ck, int64_t step)
{
	char p[PATH_MAX + 32];
	uint64_t *bytes = calloc((size_t)ck->world, sizeof(*bytes));
	int *codec = calloc((size_t)ck->world, sizeof(*codec));
	if (!bytes || !codec) {
		free(bytes);
		free(codec);
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	uint64_t t0 = ferry__now_ns();
	int r = 0;
	for (int rank = 0; rank < ck->world && !r;) {
		int m = read_marker(ck, step, rank, &bytes[rank], &codec[rank]);
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
		for (int i = 0; i < ck->world; i++) {
			ferry__sbuf_printf(&m, "%s{\"file\":\"rank-%05d-of-%05d.safetensors%s\",\"bytes\":%llu",
					   i ? "," : "", i, ck->world, codec[i] ? CZ_SUFFIX : "",
					   (unsigned long long)bytes[i]);
			if (codec[i]) /* a compressed shard: ferry's format, holding the safetensors bytes */
				ferry__sbuf_printf(&m, ",\"codec\":\"%s\"", ferry_cz_codec_name(codec[i]));
			ferry__sbuf_puts(&m, "}");
		}
		ferry__sbuf_puts(&m, "]}\n");
		if (m.oom)
			r = ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	if (!r)
		r = step_write(ck->ctx, ck->dir, step, "manifest.json", m.data, m.len);
	if (!r) {
		char text[64];
		int n = snprintf(text, sizeof(text), "step-%012lld\n", (long long)step);
		snprintf(p, sizeof(p), "%s/latest", ck->dir);
		/* S3: one PUT, which replaces the object atomically: `latest` names the old step or this one */
		r = ck->url ? put_latest_url(ck->ctx, p, step, text, (size_t)n) : ferry__write_durable(p, text, (size_t)n);
	}
	ferry__sbuf_free(&m);
	free(bytes);
	free(codec);
	/* A commit that failed once every rank's shard was in (a full disk at the manifest or at
	 * `latest`) gives the step's space back: the step cannot commit any more, and later saves must
	 * not find the disk full of it. After a timeout other ranks may still be writing: only this
	 * rank's files go (after_shard's caller). */
	if (r && r != -ETIMEDOUT && !ck->url && !latest_is(ck->dir, step)) {
		drop_own(ck, step); /* this rank's files emptied first, as after any failed save */
		int dfd = ferry__dir_open(ck->dir, FERRY__DIR_FOLLOW);
		char name[64];
		snprintf(name, sizeof(name), "step-%012lld", (long long)step);
		if (dfd >= 0) {
			(void)rm_tree(dfd, name);
			close(dfd);
		}
	}
	if (!r && ck->keep) {
		int pr = ck->url ? url_prune(ck->ctx, ck->dir, ck->keep) : prune(ck->dir, ck->keep, ck->recycle);
		r = pr < 0 ? pr : 0;
	}
	return r;
}

static int64_t after_shard(void *arg, int64_t result)
{
	ferry_ckpt *ck = arg;
	char p[PATH_MAX];
	if (result < 0) {
		drop_own(ck, ck->step);
		return result;
	}
	/* The step directory's entry in DIR, durable before this rank's marker says the shard is in.
	 * Here rather than on the caller's thread: an asynchronous save returns before it. */
	int r = ferry_ckpt_step_path(ck->dir, ck->step, p, sizeof(p));
	r = r < 0 || ck->url ? (r < 0 ? r : 0) : ferry__fsync_parent(p);
	if (!r) {
		char name[64];
		snprintf(name, sizeof(name), "rank-%05d-of-%05d.done", ck->rank, ck->world);
		struct ferry__sbuf text = {0};
		ferry__sbuf_puts(&text, "{\"run\":");
		ferry__sbuf_json(&text, ck->run);
		ferry__sbuf_printf(&text, ",\"step\":%lld,\"rank\":%d,\"world\":%d,\"bytes\":%lld", (long long)ck->step,
				   ck->rank, ck->world, (long long)result);
		if (ck->saving_codec)
			ferry__sbuf_printf(&text, ",\"codec\":\"%s\"", ferry_cz_codec_name(ck->saving_codec));
		ferry__sbuf_puts(&text, "}\n");
		r = text.oom ? ferry__error(-ENOMEM, "ckpt: out of memory")
			     : step_write(ck->ctx, ck->dir, ck->step, name, text.data, text.len);
		ferry__sbuf_free(&text);
	}
	if (!r && ck->rank == 0)
		r = commit(ck, ck->step);
	if (r && !latest_is(ck->dir, ck->step))
		drop_own(ck, ck->step);
	return r;
}

static int save(ferry_ckpt *ck, int64_t step, int async)
{
	char sp[PATH_MAX], p[PATH_MAX];
	int r;
	if (step < 0)
		return ferry__error(-EINVAL, "ckpt %s: step %lld", ck->dir, (long long)step);
	if (ck->compress && ck->url) /* the compressed writer makes a local file; an object is not one yet */
		return ferry__error(-EOPNOTSUPP, "ckpt %s: compressed checkpoints under a URL are not supported yet "
				    "(compress=off, or a local directory)", ck->dir);
	if (!ferry_st_writer_done(ck->w) && ck->refuse)
		return ferry__error(FERRY_EBUSY, "ckpt %s: step %lld refused: a save is in flight (busy=refuse)",
				    ck->dir, (long long)step);
	if ((r = ferry_ckpt_wait(ck, -1)))
		(void)r; /* the previous save's error was reported by its own wait; this save goes on */
	if (ck->lock && ck->lock->fd < 0)
		return ferry__error(-EPERM, "ckpt %s: this handle was opened before a fork(): the child does not "
				    "hold the rank's lock; open the checkpoint again in the child", ck->dir);
	if (!ck->url)
		sweep_debris(ck);
	uint64_t t0 = ferry__now_ns();
	int64_t latest = ferry_ckpt_latest(ck->dir);
	if (latest >= step)
		return ferry__error(-EEXIST, "ckpt %s: step %lld is not after the latest, %lld", ck->dir,
				    (long long)step, (long long)latest);
	if (ck->url && latest < 0 && latest != -ENOENT) /* S3 unreachable, refused: said now, not at the commit */
		return (int)latest;
	if (ck->url)
		ferry__error_clear();
	if ((r = ferry_ckpt_step_path(ck->dir, step, sp, sizeof(sp))) < 0)
		return r;
	if (ck->url) /* objects under the prefix: no directories to make; a stale marker of this rank at
		      * this step (an earlier attempt) is replaced by this save's before the commit reads it */
		goto shard;
	/* the directory again: it may have been removed since the handle was opened (a long-lived
	 * handle, as Python keeps one per directory, outlives a test's or a benchmark's rm -r) */
	if (mkdir(ck->dir, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", ck->dir, strerror(errno));
	/* The step directory is made here or by another rank, never a symlink planted in its place
	 * (the shard and marker would land in its target): opened without following, refused if not
	 * a directory of its own. */
	if (mkdir(sp, 0755) && errno != EEXIST)
		return ferry__error(-errno, "mkdir(%s): %s", sp, strerror(errno));
	int sfd = open(sp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0) {
		int e = errno;
		return ferry__error(e == ELOOP || e == ENOTDIR ? -ELOOP : -e, "ckpt %s: step directory %s: %s", ck->dir,
				    sp, e == ELOOP || e == ENOTDIR ? "a symlink or not a directory: refused" : strerror(e));
	}
	/* A marker of this rank from an earlier attempt at this step must not count for this one. */
	snprintf(p, sizeof(p), "rank-%05d-of-%05d.done", ck->rank, ck->world);
	(void)unlinkat(sfd, p, 0);
	close(sfd);
shard:
	r = snprintf(p, sizeof(p), "%s/step-%012lld/rank-%05d-of-%05d.safetensors%s", ck->dir, (long long)step, ck->rank,
		     ck->world, ck->compress ? CZ_SUFFIX : "");
	if (r < 0 || (size_t)r >= sizeof(p))
		return ferry__error(-ENAMETOOLONG, "%s: path too long", ck->dir);
	ck->step = step;
	ck->saving_codec = ck->compress == 3 ? FERRY_CZ_ZSTD : ck->compress;
	/* The shard says whose it is: ferry_ckpt_verify (verify.c) checks these against its step
	 * directory, the manifest and its name, so a shard moved from another step or run fails. */
	char tv[3][24];
	snprintf(tv[0], sizeof(tv[0]), "%lld", (long long)step);
	snprintf(tv[1], sizeof(tv[1]), "%d", ck->rank);
	snprintf(tv[2], sizeof(tv[2]), "%d", ck->world);
	const char *tie[4][2] = {{"ferry.step", tv[0]}, {"ferry.run", ck->run}, {"ferry.rank", tv[1]}, {"ferry.world", tv[2]}};
	for (int i = 0; i < 4; i++)
		if ((r = ferry_st_writer_metadata(ck->w, tie[i][0], tie[i][1])))
			return r == -EEXIST ? ferry__error(-EINVAL, "ckpt %s: metadata key \"%s\" is the save's own", ck->dir,
							   tie[i][0])
					    : r;
	int flags = ck->checksum ? FERRY_SAVE_CHECKSUM : 0;
	/* This rank's shard of a pruned step, written over rather than a new file made (prune) */
	char rp[PATH_MAX];
	int rn = snprintf(rp, sizeof(rp), "%s/" RECYCLE_DIR "/rank-%05d-of-%05d.safetensors", ck->dir, ck->rank,
			  ck->world);
	const char *reuse = ck->recycle && rn > 0 && (size_t)rn < sizeof(rp) ? rp : NULL;
	uint64_t prep = ferry__now_ns() - t0;
	ferry__st_writer_compress(ck->w, ck->saving_codec);
	int64_t res = ferry__st_writer_save_hooked(ck->w, p, flags, async, after_shard, ck, reuse);
	ferry__st_writer_phase(ck->w, FERRY_PHASE_CKPT_PREPARE, prep);
	int reset = ferry_st_writer_reset(ck->w);
	(void)reset;
	if (res < 0 && !async)
		drop_own(ck, step); /* a save refused before its hook ran leaves no empty step behind */
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

/*
 * Everything below goes through the checkpoint directory's descriptor (the directory the user named
 * may be a symlink, and is followed once), and never follows a symlink found in it: a step or
 * recycle/ that is a symlink is skipped, neither followed nor removed (ferry made neither), and a
 * symlink inside a step is unlinked itself, never its target.
 */

/* Opens dfd/name as a directory without following it: fd, or -ELOOP for a symlink or non-directory. */
static int open_subdir(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd >= 0 ? fd : errno == ENOTDIR ? -ELOOP : -errno;
}

/* Unlinks the entries of the open directory fd (all, or only what keep() refuses); closes fd. */
static int empty_dir(int fd, int (*keep)(const char *name))
{
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct dirent *e;
	int r = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (keep && keep(e->d_name)))
			continue;
		if (unlinkat(fd, e->d_name, 0) && errno != ENOENT && !r) /* ENOENT: a save took its recycled shard */
			r = -errno;
	}
	closedir(d);
	return r;
}

/* Removes dfd/name, a directory of plain files that ferry made; refuses (-ELOOP) a symlink there. */
static int rm_tree(int dfd, const char *name)
{
	int fd = open_subdir(dfd, name);
	if (fd < 0)
		return fd;
	int r = empty_dir(fd, NULL);
	if (unlinkat(dfd, name, AT_REMOVEDIR) && !r)
		r = -errno;
	return r;
}

static int is_shard(const char *name)
{
	size_t n = strlen(name);
	return name[0] == '.' || (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

/*
 * Moves a pruned step's directory to DIR/recycle, keeping only its shards: the step leaves the
 * directory's namespace in one rename, as removing it would. Returns 1 when it did, 0 when the
 * caller is to remove the step instead. Shards left in an older recycle directory (a rank that did
 * not save since, another world size) are removed first. Another rank may be taking its shard out
 * of the old directory meanwhile (its save renames it): either it gets the file or makes a new one.
 * A recycle/ that is a symlink stays as it is, and the step is removed instead (the rename over it
 * fails).
 */
static int recycle_step(int dfd, const char *dir, const char *step)
{
	int r = rm_tree(dfd, RECYCLE_DIR);
	if (r && r != -ENOENT)
		FERRY__LOG(FERRY__LOG_INFO, "%s/" RECYCLE_DIR ": cannot remove (%s)", dir, strerror(-r));
	if (r == -ELOOP || renameat(dfd, step, dfd, RECYCLE_DIR))
		return 0;
	int fd = open_subdir(dfd, RECYCLE_DIR);
	if (fd >= 0)
		(void)empty_dir(fd, is_shard); /* markers and the manifest: the shards alone are recycled */
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
	int dfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (dfd < 0)
		return dfd;
	int lfd = dup(dfd);
	DIR *d = lfd < 0 ? NULL : fdopendir(lfd);
	if (!d) {
		int e = errno;
		if (lfd >= 0)
			close(lfd);
		close(dfd);
		return ferry__error(-e, "opendir(%s): %s", dir, strerror(e));
	}
	int64_t *committed = NULL, *debris = NULL;
	size_t nc = 0, nd = 0, cc = 0, cd = 0;
	struct dirent *e;
	char p[PATH_MAX];
	int r = 0;
	while ((e = readdir(d))) {
		int64_t s = parse_step_name(e->d_name);
		if (s < 0)
			continue;
		struct stat st;
		if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
			continue; /* not a step ferry made (a symlink): neither followed nor removed */
		snprintf(p, sizeof(p), "%s/manifest.json", e->d_name);
		int has = fstatat(dfd, p, &st, AT_SYMLINK_NOFOLLOW) == 0;
		if (!has && s >= latest)
			continue; /* maybe being written */
		int64_t **arr = has ? &committed : &debris;
		size_t *n = has ? &nc : &nd, *c = has ? &cc : &cd;
		if (ferry__grow((void **)arr, c, *n + 1, sizeof(**arr))) {
			r = -ENOMEM;
			break;
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
			snprintf(p, sizeof(p), "step-%012lld", (long long)committed[i]);
			if (recycle && !recycled && recycle_step(dfd, dir, p)) {
				recycled = 1;
				removed++;
			} else if (!rm_tree(dfd, p)) {
				removed++;
			}
		}
		for (size_t i = 0; i < nd; i++) {
			snprintf(p, sizeof(p), "step-%012lld", (long long)debris[i]);
			if (!rm_tree(dfd, p))
				removed++;
		}
		/* Without recycling (recycle=0, or an explicit prune) a recycled step's space goes back */
		if (!recycle && !rm_tree(dfd, RECYCLE_DIR))
			removed++;
		if (removed)
			r = ferry__fsync_dirfd(dfd, dir);
	}
	close(dfd);
	free(committed);
	free(debris);
	return r < 0 ? r : removed;
}

/* ---------------------------------------------------------------- pruning an s3:// prefix */

struct url_objs {
	char **url;
	int64_t *step;
	unsigned char *manifest;
	size_t n, cap;
	size_t plen; /* of "<dir>/" */
};

static int url_collect(void *arg, const char *url, uint64_t size, const char *etag)
{
	struct url_objs *o = arg;
	(void)size;
	(void)etag;
	const char *rest = url + o->plen, *slash = strchr(rest, '/');
	char name[64];
	if (!slash || (size_t)(slash - rest) >= sizeof(name))
		return 0; /* `latest`, or not under a step */
	snprintf(name, sizeof(name), "%.*s", (int)(slash - rest), rest);
	int64_t s = parse_step_name(name);
	if (s < 0 || strchr(slash + 1, '/'))
		return 0; /* not a step ferry made, or deeper than its objects */
	if (o->n == o->cap) {
		size_t c = o->cap ? o->cap * 2 : 64;
		char **u = realloc(o->url, c * sizeof(*u));
		if (u)
			o->url = u;
		int64_t *st = realloc(o->step, c * sizeof(*st));
		if (st)
			o->step = st;
		unsigned char *m = realloc(o->manifest, c);
		if (m)
			o->manifest = m;
		if (!u || !st || !m)
			return ferry__error(-ENOMEM, "ckpt: out of memory");
		o->cap = c;
	}
	if (!(o->url[o->n] = strdup(url)))
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	o->step[o->n] = s;
	o->manifest[o->n] = !strcmp(slash + 1, "manifest.json");
	o->n++;
	return 0;
}

/*
 * prune() of an s3:// prefix: the objects under <dir>/step- listed (ListObjectsV2); the newest
 * `keep` committed steps (a manifest.json) stay, and latest's and anything newer; every other step
 * older than latest goes, its manifest first (a step half deleted is no longer committed), then its
 * other objects. No recycling (S3 has no blocks to reuse). Returns the steps removed.
 */
static int url_prune(ferry_ctx *ctx, const char *dir, int keep)
{
	int64_t latest = ferry_ckpt_latest(dir);
	ferry__error_clear();
	if (latest < 0)
		return 0;
	ferry_ctx *own = NULL;
	int r = ctx ? 0 : ferry_ctx_create(&own);
	if (r)
		return r;
	ctx = ctx ? ctx : own;
	struct url_objs o = {.plen = strlen(dir) + 1};
	char prefix[PATH_MAX];
	snprintf(prefix, sizeof(prefix), "%s/step-", dir);
	r = ferry__remote_list(ctx, prefix, url_collect, &o);
	int64_t *committed = calloc(o.n + 1, sizeof(*committed));
	size_t nc = 0;
	if (!r && !committed)
		r = ferry__error(-ENOMEM, "ckpt: out of memory");
	for (size_t i = 0; !r && i < o.n; i++)
		if (o.manifest[i])
			committed[nc++] = o.step[i];
	if (nc > 1)
		qsort(committed, nc, sizeof(int64_t), cmp_i64_desc);
	/* steps older than this go: the oldest kept committed step (keep 0: none go but debris) */
	int64_t floor_step = latest;
	for (size_t i = 0; i < nc; i++)
		if (committed[i] <= latest && (!keep || i < (size_t)keep))
			floor_step = committed[i];
	int removed = 0;
	for (int pass = 0; !r && pass < 2; pass++) /* manifests first, then the rest */
		for (size_t i = 0; !r && i < o.n; i++) {
			if (o.step[i] >= floor_step || o.manifest[i] != (pass == 0))
				continue;
			int committed_step = 0;
			for (size_t k = 0; k < nc; k++)
				committed_step |= committed[k] == o.step[i];
			if (!keep && committed_step)
				continue;
			r = ferry__remote_delete(ctx, o.url[i]);
			removed += pass == 0;
		}
	for (size_t i = 0; i < o.n; i++)
		free(o.url[i]);
	free(o.url);
	free(o.step);
	free(o.manifest);
	free(committed);
	ferry_ctx_destroy(own);
	return r < 0 ? r : removed;
}

int64_t ferry_ckpt_steps(const char *dir, int64_t *steps, size_t cap)
{
	int64_t *all = NULL;
	size_t n = 0, c = 0;
	int r = 0;
	if (strstr(dir, "://")) {
		ferry_ctx *ctx = NULL;
		struct url_objs o = {.plen = strlen(dir) + 1};
		char prefix[PATH_MAX];
		snprintf(prefix, sizeof(prefix), "%s/step-", dir);
		r = ferry_ctx_create(&ctx);
		if (!r)
			r = ferry__remote_list(ctx, prefix, url_collect, &o);
		ferry_ctx_destroy(ctx);
		if (!r && !(all = calloc(o.n + 1, sizeof(*all))))
			r = ferry__error(-ENOMEM, "ckpt: out of memory");
		for (size_t i = 0; !r && i < o.n; i++)
			if (o.manifest[i])
				all[n++] = o.step[i];
		for (size_t i = 0; i < o.n; i++)
			free(o.url[i]);
		free(o.url);
		free(o.step);
		free(o.manifest);
	} else {
		DIR *d = opendir(dir);
		if (!d)
			return ferry__error(-errno, "opendir(%s): %s", dir, strerror(errno));
		struct dirent *e;
		while (!r && (e = readdir(d))) {
			char canon[64], p[PATH_MAX];
			struct stat st;
			int64_t s = parse_step_name(e->d_name);
			snprintf(canon, sizeof(canon), "step-%012lld", (long long)s);
			snprintf(p, sizeof(p), "%s/%s", e->d_name, "manifest.json");
			/* ferry's own step directories only: its name, not a symlink, a manifest file */
			if (s < 0 || strcmp(canon, e->d_name) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
			    !S_ISDIR(st.st_mode) || fstatat(dirfd(d), p, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
				continue;
			if (ferry__grow((void **)&all, &c, n + 1, sizeof(*all))) {
				r = ferry__error(-ENOMEM, "ckpt: out of memory");
				break;
			}
			all[n++] = s;
		}
		closedir(d);
	}
	if (!r && n > 1)
		qsort(all, n, sizeof(int64_t), cmp_i64_desc);
	for (size_t i = 0; !r && i < n && i < cap; i++)
		steps[i] = all[i];
	free(all);
	return r ? r : (int64_t)n;
}

int ferry_ckpt_prune(const char *dir, int keep)
{
	if (strstr(dir, "://"))
		return url_prune(NULL, dir, keep);
	return prune(dir, keep, 0);
}
