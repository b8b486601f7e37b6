/*
 * ferry stage SRC DST (and its other name, ferry cp): copies objects to local storage and back
 * (docs/REMOTE.md, "Staging"). s3://bucket/prefix -> a local directory (every object under the
 * prefix, its key below the prefix as the path), one s3:// or http(s):// object -> a local file,
 * a local file or directory -> an s3:// object or prefix. Objects go --jobs at a time, each through
 * the remote backend (parallel ranged GETs, multipart uploads). Resumable: a download records each
 * finished object's ETag and size in DST's .ferry-stage file and skips an object whose local file
 * has that size and whose record has that ETag (size alone where the server gives no ETag); an
 * upload skips a file whose object already has its size.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "commands.h"
#include "ferry/ferry.h"
#include "ferry_tools.h"
#include "progress.h"

/* Paths and URLs are formatted into PATH_MAX buffers on purpose: a longer one is cut, and a cut
 * path fails to open, which is reported. GCC's truncation warning is noise here (as in tools/sys.h). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#define BLOCK (8u << 20) /* bytes per read or write call: the remote backend cuts it into parts */
#define SIDECAR ".ferry-stage"

struct item {
	char *src, *dst, *rel; /* rel: the path below DST recorded in the sidecar (downloads) */
	uint64_t size;
	char etag[128];
};

struct stage {
	ferry_ctx *ctx;
	int download;
	struct item *it;
	size_t n, cap;
	atomic_size_t next;
	atomic_uint_fast64_t bytes;
	atomic_size_t copied, skipped, failed;
	pthread_mutex_t mu; /* sidecar, first error */
	FILE *sidecar;
	char err[2048];
	struct cli_progress prog;
	/* the sidecar's records: rel, size, ETag */
	char **rrel, **retag;
	uint64_t *rsize;
	size_t nr;
};

static int is_url(const char *s)
{
	return strstr(s, "://") != NULL;
}

static int add(struct stage *st, const char *src, const char *dst, const char *rel, uint64_t size, const char *etag)
{
	if (st->n == st->cap) {
		size_t c = st->cap ? st->cap * 2 : 64;
		struct item *p = realloc(st->it, c * sizeof(*p));
		if (!p)
			return -ENOMEM;
		st->it = p;
		st->cap = c;
	}
	struct item *i = &st->it[st->n];
	memset(i, 0, sizeof(*i));
	i->src = strdup(src);
	i->dst = strdup(dst);
	i->rel = strdup(rel);
	i->size = size;
	snprintf(i->etag, sizeof(i->etag), "%s", etag ? etag : "");
	if (!i->src || !i->dst || !i->rel)
		return -ENOMEM;
	st->n++;
	return 0;
}

static void fail(struct stage *st, const char *fmt, const char *a, const char *why)
{
	pthread_mutex_lock(&st->mu);
	if (!st->err[0])
		snprintf(st->err, sizeof(st->err), fmt, a, why);
	pthread_mutex_unlock(&st->mu);
	atomic_fetch_add(&st->failed, 1);
}

/* mkdir -p of path's parent directories. */
static int make_parents(char *path)
{
	for (char *s = strchr(path + 1, '/'); s; s = strchr(s + 1, '/')) {
		*s = 0;
		int r = mkdir(path, 0755);
		int e = errno;
		*s = '/';
		if (r && e != EEXIST)
			return -e;
	}
	return 0;
}

/* ---------------------------------------------------------------------------------- listing */

struct list_arg {
	struct stage *st;
	const char *src, *dst;
	int err;
};

/* A key below the prefix as a relative path: no empty, "." or ".." component, no leading '/'. */
static int safe_rel(const char *rel)
{
	if (!*rel || *rel == '/')
		return 0;
	for (const char *c = rel; *c;) {
		size_t n = strcspn(c, "/");
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		c += n + (c[n] == '/');
		if (c[-1] == '/' && !*c)
			return 0; /* a "directory" key ending in '/' */
	}
	return 1;
}

static int on_object(void *arg, const char *url, uint64_t size, const char *etag)
{
	struct list_arg *a = arg;
	const char *rel = url + strlen(a->src);
	while (*rel == '/')
		rel++;
	if (!*rel) { /* the prefix is the object itself: DST/<its name> */
		const char *slash = strrchr(url, '/');
		rel = slash ? slash + 1 : url;
	}
	if (!safe_rel(rel)) {
		fprintf(stderr, "ferry stage: %s: skipped (its key is not a safe relative path: %s)\n", url, rel);
		atomic_fetch_add(&a->st->skipped, 1);
		return 0;
	}
	char dst[PATH_MAX];
	snprintf(dst, sizeof(dst), "%s/%s", a->dst, rel);
	return add(a->st, url, dst, rel, size, etag) ? -ENOMEM : 0;
}

static void load_sidecar(struct stage *st, const char *dir)
{
	char p[PATH_MAX], line[PATH_MAX + 300];
	snprintf(p, sizeof(p), "%s/" SIDECAR, dir);
	FILE *f = fopen(p, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
		if (!t2)
			continue;
		*t1 = *t2 = 0;
		line[strcspn(line, "\n")] = 0;
		t2[1 + strcspn(t2 + 1, "\n")] = 0;
		char **a = realloc(st->rrel, (st->nr + 1) * sizeof(*a)), **b = a ? realloc(st->retag, (st->nr + 1) * sizeof(*b)) : NULL;
		uint64_t *c = b ? realloc(st->rsize, (st->nr + 1) * sizeof(*c)) : NULL;
		if (a)
			st->rrel = a;
		if (b)
			st->retag = b;
		if (!c)
			break;
		st->rsize = c;
		st->retag[st->nr] = strdup(line);
		st->rsize[st->nr] = strtoull(t1 + 1, NULL, 10);
		st->rrel[st->nr] = strdup(t2 + 1);
		st->nr++;
	}
	fclose(f);
}

/* 1 when the local file dst already holds the object: its size, and the recorded ETag if any. */
static int up_to_date(const struct stage *st, const struct item *i)
{
	struct stat sb;
	if (stat(i->dst, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != i->size)
		return 0;
	if (!i->etag[0])
		return 1; /* plain HTTP without an ETag: by size */
	for (size_t k = st->nr; k-- > 0;) /* the last record wins */
		if (st->rrel[k] && !strcmp(st->rrel[k], i->rel))
			return st->retag[k] && !strcmp(st->retag[k], i->etag) && st->rsize[k] == i->size;
	return 0;
}

/* ------------------------------------------------------------------------------------ copies */

static void download(struct stage *st, struct item *i, char *buf)
{
	ferry_file *f = NULL;
	char tmp[PATH_MAX + 64];
	snprintf(tmp, sizeof(tmp), "%s.ferry-part-%d-%zu", i->dst, (int)getpid(), (size_t)(i - st->it));
	if (make_parents(tmp)) {
		fail(st, "%s: %s", i->dst, strerror(errno));
		return;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		fail(st, "%s: %s", tmp, strerror(errno));
		return;
	}
	int r = ferry_file_open(st->ctx, i->src, FERRY_O_RDONLY, &f);
	uint64_t off = 0, size = r ? 0 : (uint64_t)ferry_file_size(f);
	while (!r && off < size) {
		size_t n = size - off < BLOCK ? (size_t)(size - off) : BLOCK;
		ssize_t got = ferry_pread(f, buf, n, off);
		if (got <= 0) {
			r = got < 0 ? (int)got : -EIO;
			break;
		}
		if (write(fd, buf, (size_t)got) != got) {
			r = -errno;
			break;
		}
		off += (uint64_t)got;
		atomic_fetch_add(&st->bytes, (uint64_t)got);
	}
	char why[1024];
	snprintf(why, sizeof(why), "%s", r ? ferry_last_error() : "");
	ferry_file_destroy(f);
	if (close(fd) && !r)
		r = -errno;
	if (!r && rename(tmp, i->dst))
		r = -errno;
	if (r) {
		unlink(tmp);
		fail(st, "%s: %s", i->src, why[0] ? why : strerror(-r));
		return;
	}
	pthread_mutex_lock(&st->mu);
	if (st->sidecar && i->etag[0]) {
		fprintf(st->sidecar, "%s\t%llu\t%s\n", i->etag, (unsigned long long)size, i->rel);
		fflush(st->sidecar);
	}
	pthread_mutex_unlock(&st->mu);
	atomic_fetch_add(&st->copied, 1);
}

static void upload(struct stage *st, struct item *i, char *buf)
{
	ferry_file *f = NULL;
	int fd = open(i->src, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fail(st, "%s: %s", i->src, strerror(errno));
		return;
	}
	int r = ferry_file_open(st->ctx, i->dst, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &f);
	uint64_t off = 0;
	while (!r) {
		ssize_t n = read(fd, buf, BLOCK);
		if (n < 0) {
			r = -errno;
			break;
		}
		if (!n)
			break;
		ssize_t put = ferry_pwrite(f, buf, (size_t)n, off);
		if (put != n) {
			r = put < 0 ? (int)put : -EIO;
			break;
		}
		off += (uint64_t)n;
		atomic_fetch_add(&st->bytes, (uint64_t)n);
	}
	if (!r)
		r = ferry_file_sync(f, 0); /* the commit: the object appears whole */
	char why[1024];
	snprintf(why, sizeof(why), "%s", r ? ferry_last_error() : "");
	ferry_file_destroy(f); /* uncommitted: the upload is aborted */
	close(fd);
	if (r)
		fail(st, "%s: %s", i->dst, why[0] ? why : strerror(-r));
	else
		atomic_fetch_add(&st->copied, 1);
}

static void *worker(void *arg)
{
	struct stage *st = arg;
	char *buf = malloc(BLOCK);
	for (size_t k; buf && (k = atomic_fetch_add(&st->next, 1)) < st->n;) {
		if (st->download)
			download(st, &st->it[k], buf);
		else
			upload(st, &st->it[k], buf);
	}
	if (!buf)
		fail(st, "%s: %s", "ferry stage", "out of memory");
	free(buf);
	return NULL;
}

static uint64_t poll_bytes(void *arg)
{
	return atomic_load(&((struct stage *)arg)->bytes);
}

/* ---------------------------------------------------------------------------------- planning */

/* The files under a local directory (recursively) -> objects under the prefix dst. */
static int walk(struct stage *st, const char *dir, const char *rel, const char *dst)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s%s%s", dir, *rel ? "/" : "", rel);
	DIR *d = opendir(p);
	if (!d)
		return -errno;
	struct dirent *e;
	int r = 0;
	while (!r && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, SIDECAR))
			continue;
		char sub[PATH_MAX], path[PATH_MAX], url[PATH_MAX + 1024];
		struct stat sb;
		snprintf(sub, sizeof(sub), "%s%s%s", rel, *rel ? "/" : "", e->d_name);
		snprintf(path, sizeof(path), "%s/%s", dir, sub);
		if (lstat(path, &sb))
			continue;
		if (S_ISDIR(sb.st_mode))
			r = walk(st, dir, sub, dst);
		else if (S_ISREG(sb.st_mode)) {
			size_t dl = strlen(dst);
			snprintf(url, sizeof(url), "%s%s%s", dst, dl && dst[dl - 1] == '/' ? "" : "/", sub);
			r = add(st, path, url, sub, (uint64_t)sb.st_size, NULL);
		}
	}
	closedir(d);
	return r;
}

struct sized {
	const char *url;
	uint64_t size;
	int found;
};

static int on_exact(void *arg, const char *url, uint64_t size, const char *etag)
{
	struct sized *s = arg;
	(void)etag;
	if (!strcmp(url, s->url)) {
		s->size = size;
		s->found = 1;
	}
	return 0;
}

/* An upload's object already there with the file's size (listed by its own key). */
static int object_has_size(ferry_ctx *ctx, const char *url, uint64_t size)
{
	struct sized s = {url, 0, 0};
	return ferry_tools_list(ctx, url, on_exact, &s) == 0 && s.found && s.size == size;
}

static int usage(void)
{
	fprintf(stderr, "usage: ferry stage [--jobs N] [--json] [--quiet] SRC DST   (also: ferry cp)\n"
			"  SRC, DST: s3://bucket/prefix, http(s)://host/path (a source only), or a local path\n");
	return 2;
}

int ferry_cmd_stage(int argc, char **argv)
{
	int jobs = 4, json = 0, quiet = 0;
	const char *src = NULL, *dst = NULL;
	for (int a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "--json"))
			json = 1;
		else if (!strcmp(argv[a], "--quiet") || !strcmp(argv[a], "-q"))
			quiet = 1;
		else if (!strcmp(argv[a], "--jobs") || !strncmp(argv[a], "--jobs=", 7)) {
			const char *v = argv[a][6] == '=' ? argv[a] + 7 : (a + 1 < argc ? argv[++a] : "");
			char *end;
			long n = strtol(v, &end, 10);
			if (!*v || *end || n < 1 || n > 256) {
				fprintf(stderr, "ferry stage: --jobs: expected an integer from 1 to 256, not \"%s\"\n", v);
				return 2;
			}
			jobs = (int)n;
		} else if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
			usage();
			return 0;
		} else if (argv[a][0] == '-' && argv[a][1]) {
			fprintf(stderr, "ferry stage: unknown option %s\n", argv[a]);
			return usage();
		} else if (!src)
			src = argv[a];
		else if (!dst)
			dst = argv[a];
		else
			return usage();
	}
	if (!src || !dst)
		return usage();
	if (is_url(src) == is_url(dst)) {
		fprintf(stderr, "ferry stage: one of SRC and DST is a URL, the other a local path\n");
		return 2;
	}
	struct stage st = {0};
	pthread_mutex_init(&st.mu, NULL);
	st.download = is_url(src);
	if (ferry_ctx_create(&st.ctx)) {
		fprintf(stderr, "ferry stage: %s\n", ferry_last_error());
		return 1;
	}
	int r = 0, rc = 0;
	char root[PATH_MAX]; /* downloads: the directory of the sidecar */
	struct stat sb;
	if (st.download) {
		int dst_dir = (!stat(dst, &sb) && S_ISDIR(sb.st_mode)) || dst[strlen(dst) - 1] == '/';
		if (!strncasecmp(src, "s3://", 5)) {
			struct list_arg la = {&st, src, dst, 0};
			r = ferry_tools_list(st.ctx, src, on_object, &la);
			/* one object named exactly, to a file name: that file */
			if (!r && st.n == 1 && !dst_dir && !strcmp(st.it[0].src, src)) {
				free(st.it[0].dst);
				st.it[0].dst = strdup(dst);
			}
		} else { /* http(s)://: one object, by size (its ETag, where sent, is not listed) */
			ferry_file *f;
			r = ferry_file_open(st.ctx, src, FERRY_O_RDONLY, &f);
			if (!r) {
				const char *slash = strrchr(src, '/');
				char d[PATH_MAX];
				snprintf(d, sizeof(d), "%s%s%s", dst, dst_dir ? "/" : "", dst_dir ? slash + 1 : "");
				r = add(&st, src, d, slash + 1, (uint64_t)ferry_file_size(f), NULL);
				ferry_file_destroy(f);
			}
		}
		if (!r && st.n == 0) {
			fprintf(stderr, "ferry stage: %s: no object under this prefix\n", src);
			rc = 1;
		}
		snprintf(root, sizeof(root), "%s", dst);
		if (!r && st.n == 1 && !dst_dir) { /* a file: its directory holds the sidecar */
			char *slash = strrchr(root, '/');
			if (slash)
				*slash = 0;
			else
				snprintf(root, sizeof(root), ".");
			const char *base = strrchr(st.it[0].dst, '/');
			free(st.it[0].rel);
			st.it[0].rel = strdup(base ? base + 1 : st.it[0].dst);
		}
	} else {
		if (stat(src, &sb)) {
			fprintf(stderr, "ferry stage: %s: %s\n", src, strerror(errno));
			ferry_ctx_destroy(st.ctx);
			return 1;
		}
		if (S_ISDIR(sb.st_mode)) {
			r = walk(&st, src, "", dst);
		} else {
			size_t dl = strlen(dst);
			const char *base = strrchr(src, '/');
			char url[PATH_MAX + 1024];
			snprintf(url, sizeof(url), "%s%s", dst, dl && dst[dl - 1] == '/' ? (base ? base + 1 : src) : "");
			r = add(&st, src, url, base ? base + 1 : src, (uint64_t)sb.st_size, NULL);
		}
	}
	if (r) {
		fprintf(stderr, "ferry stage: %s\n", r == -ENOMEM ? "out of memory" : ferry_last_error());
		rc = 1;
	}
	/* what is there already: skipped */
	uint64_t total = 0;
	size_t todo = 0;
	if (!rc && st.download) {
		load_sidecar(&st, root);
		mkdir(root, 0755);
		char p[PATH_MAX + 16];
		snprintf(p, sizeof(p), "%s/" SIDECAR, root);
		st.sidecar = fopen(p, "a");
	}
	for (size_t k = 0; !rc && k < st.n; k++) {
		struct item *i = &st.it[k];
		int skip = st.download ? up_to_date(&st, i) : object_has_size(st.ctx, i->dst, i->size);
		if (skip) {
			free(i->src);
			free(i->dst);
			free(i->rel);
			atomic_fetch_add(&st.skipped, 1);
			continue;
		}
		st.it[todo++] = *i;
		total += i->size;
	}
	size_t listed = st.n;
	st.n = todo;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!rc && todo) {
		pthread_t th[256];
		int nt = jobs < (int)todo ? jobs : (int)todo, started = 0;
		cli_progress_start(&st.prog, st.download ? "ferry stage (download)" : "ferry stage (upload)", NULL, total,
				   quiet || json, poll_bytes, &st);
		for (; started < nt; started++)
			if (pthread_create(&th[started], NULL, worker, &st))
				break;
		if (!started)
			worker(&st);
		for (int k = 0; k < started; k++)
			pthread_join(th[k], NULL);
		cli_progress_stop(&st.prog, atomic_load(&st.failed) == 0);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	uint64_t bytes = atomic_load(&st.bytes);
	size_t failed = atomic_load(&st.failed);
	if (failed) {
		fprintf(stderr, "ferry stage: %zu of %zu failed; the first: %s\n", failed, todo, st.err);
		rc = 1;
	}
	if (json)
		printf("{\"src\":\"%s\",\"dst\":\"%s\",\"objects\":%zu,\"copied\":%zu,\"skipped\":%zu,\"failed\":%zu,"
		       "\"bytes\":%llu,\"seconds\":%.3f,\"bytes_per_s\":%.0f}\n",
		       src, dst, listed, atomic_load(&st.copied), atomic_load(&st.skipped), failed,
		       (unsigned long long)bytes, secs, secs > 0 ? (double)bytes / secs : 0.0);
	else if (!quiet && !rc)
		printf("ferry stage: %zu copied, %zu skipped (already there), %llu bytes in %.2f s\n",
		       atomic_load(&st.copied), atomic_load(&st.skipped), (unsigned long long)bytes, secs);
	if (st.sidecar)
		fclose(st.sidecar);
	for (size_t k = 0; k < st.n; k++) {
		free(st.it[k].src);
		free(st.it[k].dst);
		free(st.it[k].rel);
	}
	free(st.it);
	for (size_t k = 0; k < st.nr; k++) {
		free(st.rrel[k]);
		free(st.retag[k]);
	}
	free(st.rrel);
	free(st.retag);
	free(st.rsize);
	ferry_ctx_destroy(st.ctx);
	pthread_mutex_destroy(&st.mu);
	return rc;
}
