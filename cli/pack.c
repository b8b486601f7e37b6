/*
 * ferry pack: a directory of files, JSON Lines, or token arrays (.npy, raw) into ferry shards and
 * an index, or into Megatron's .bin/.idx. Two passes, each holding one input open at a time (per
 * copying thread) and a bounded window of it in memory, so that any number of inputs packs under
 * the usual open-file limit: the scan reads each input once (JSON Lines checked line by line,
 * sample lengths and places recorded: the writer lays out every shard before any data is written),
 * then threads copy whole ranges of samples; the index is published last (write, fsync, rename).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/compress.h" /* --compress */
#include "ferry/data.h"
#include "ferry/ferry.h"
#include "ferry_jsonl.h"
#include "ferry_tools.h"
#include "progress.h"

enum { IN_AUTO, IN_FILES, IN_JSONL, IN_NPY, IN_RAW };

/* Bytes of an input read at once, by the scan and by each copying thread. */
#define WINDOW (4u << 20)

struct src {
	char *path;
	uint64_t size;
	dev_t dev;
	ino_t ino;
	struct timespec mtime;
};

/* Sample bytes: at off in the source, as written (span 0), or a JSON value written in span bytes
 * at off that decodes to len bytes (a string with escapes, an array of token ids). */
struct sample {
	uint64_t off, len;
	uint32_t src, span;
};

struct pack {
	struct src *srcs;
	size_t nsrc, src_cap;
	struct sample *s;
	uint64_t n, cap;
	int in, dtype, keys, skip_bad, quiet, noted;
	long threads;
	const char *key; /* --json-key */
	int want;        /* 's': the member is a string, 'a': an array of token ids */
	uint64_t max;    /* the largest token id the dtype holds */
	size_t esize;    /* its bytes */
	uint64_t bytes, in_bytes;
	uint64_t skipped[FERRY_JSONL__COUNT], blank, skipped_out;
	/* the output, so that walking the inputs leaves it out: ferry's directory, Megatron's files
	 * and the directory that holds them (its temporaries there) */
	struct stat out_dir, out_bin, out_idx, out_parent;
	int has_out_dir, has_out_bin, has_out_idx, has_out_parent;
	const char *out_base;
	/* directories walked (device, inode): a hash set, so that a symlink loop or a second path to
	 * a directory does not pack its files again */
	struct dirid {
		dev_t dev;
		ino_t ino;
	} *seen;
	size_t nseen, seen_cap;
	ferry_dataset_writer *w;
	pthread_mutex_t *shard_mu; /* one per shard: a thread writes its batch under it */
	atomic_uint_fast64_t done, scanned, files_done;
	atomic_uint_fast64_t listed, total_in; /* n and in_bytes as the progress thread reads them */
	atomic_int phase, stop, failed;
	char err[1024];
	pthread_mutex_t mu;
};

/* Set while a progress line is drawn on a terminal: a message first clears it. */
static atomic_int progress_tty;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flockfile(stderr);
	if (atomic_load(&progress_tty))
		fputs("\r\033[K", stderr);
	vfprintf(stderr, fmt, ap);
	funlockfile(stderr);
	va_end(ap);
}

/* strerror(e), and for the open-file limit the limit and what to change. */
static const char *errtext(int e, char *buf, size_t len)
{
	struct rlimit rl;
	if ((e == EMFILE || e == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0)
		snprintf(buf, len, "%s (this process may hold %llu open files: ulimit -n; pack opens one input "
			 "per copying thread, --threads, and every shard, --shard-size)", strerror(e),
			 (unsigned long long)rl.rlim_cur);
	else
		snprintf(buf, len, "%s", strerror(e));
	return buf;
}

/* The library's last error, with errtext's hint when code is the open-file limit. */
static void lib_error(int code)
{
	char why[256];
	say("ferry pack: %s%s%s\n", ferry_last_error(), code == -EMFILE || code == -ENFILE ? ": " : "",
		code == -EMFILE || code == -ENFILE ? errtext(-code, why, sizeof(why)) : "");
}

static void open_error(const char *path, int e)
{
	char why[256];
	say("ferry pack: %s: %s\n", path, errtext(e, why, sizeof(why)));
}

static int add_src(struct pack *p, const char *path, const struct stat *st)
{
	if (p->nsrc == p->src_cap) {
		size_t c = p->src_cap ? p->src_cap * 2 : 64;
		struct src *g = realloc(p->srcs, c * sizeof(*p->srcs));
		if (!g)
			return -ENOMEM;
		p->srcs = g;
		p->src_cap = c;
	}
	if (!(p->srcs[p->nsrc].path = strdup(path)))
		return -ENOMEM;
	p->srcs[p->nsrc].size = (uint64_t)st->st_size;
	p->in_bytes += (uint64_t)st->st_size;
	return (int)p->nsrc++;
}

static int add_sample_span(struct pack *p, uint32_t src, uint64_t off, uint64_t len, uint32_t span)
{
	if (p->n == p->cap) {
		uint64_t c = p->cap ? p->cap * 2 : 1024;
		struct sample *g = realloc(p->s, c * sizeof(*p->s));
		if (!g) {
			say("ferry pack: out of memory listing %llu samples\n", (unsigned long long)c);
			return -ENOMEM;
		}
		p->s = g;
		p->cap = c;
	}
	p->s[p->n++] = (struct sample){off, len, src, span};
	p->bytes += len;
	return 0;
}

static int add_sample(struct pack *p, uint32_t src, uint64_t off, uint64_t len)
{
	return add_sample_span(p, src, off, len, 0);
}

static int same_file(const struct stat *a, const struct stat *b) { return a->st_dev == b->st_dev && a->st_ino == b->st_ino; }

/* 1 when walking should leave out path (st): the output of this run, or of an earlier one there. */
static int is_output(struct pack *p, const struct stat *dir, const char *name, const struct stat *st)
{
	if (p->has_out_dir && S_ISDIR(st->st_mode) && same_file(st, &p->out_dir))
		return 1;
	if ((p->has_out_bin && same_file(st, &p->out_bin)) || (p->has_out_idx && same_file(st, &p->out_idx)))
		return 1;
	if (p->has_out_parent && same_file(dir, &p->out_parent)) {
		size_t l = strlen(p->out_base);
		if (!strncmp(name, p->out_base, l) &&
		    (!strncmp(name + l, ".bin.tmp-", 9) || !strncmp(name + l, ".idx.tmp-", 9)))
			return 1;
	}
	return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* 1 when the directory was walked already, else records it: 0, or -1 out of memory. */
static int walked(struct pack *p, const struct stat *st)
{
	if (2 * (p->nseen + 1) > p->seen_cap) {
		size_t cap = p->seen_cap ? p->seen_cap * 2 : 256;
		struct dirid *t = calloc(cap, sizeof(*t));
		if (!t)
			return -1;
		for (size_t i = 0; i < p->seen_cap; i++) /* ino 0: an empty slot (no directory has it) */
			if (p->seen[i].ino) {
				size_t h = (size_t)(p->seen[i].ino * 0x9e3779b97f4a7c15ull ^ p->seen[i].dev) & (cap - 1);
				while (t[h].ino)
					h = (h + 1) & (cap - 1);
				t[h] = p->seen[i];
			}
		free(p->seen);
		p->seen = t;
		p->seen_cap = cap;
	}
	size_t h = (size_t)(st->st_ino * 0x9e3779b97f4a7c15ull ^ st->st_dev) & (p->seen_cap - 1);
	for (; p->seen[h].ino; h = (h + 1) & (p->seen_cap - 1))
		if (p->seen[h].ino == st->st_ino && p->seen[h].dev == st->st_dev)
			return 1;
	p->seen[h] = (struct dirid){st->st_dev, st->st_ino};
	p->nseen++;
	return 0;
}

/* Files of a directory tree, in name order so that packing is reproducible. 0, 1 when the
 * directory was walked already (a symlink loop, a second path to it: left out), or -1. */
static int walk(struct pack *p, const char *dir)
{
	DIR *d = opendir(dir);
	struct stat dst;
	if (!d || fstat(dirfd(d), &dst) < 0) {
		open_error(dir, errno);
		if (d)
			closedir(d);
		return -1;
	}
	int again = walked(p, &dst);
	if (again) {
		closedir(d);
		if (again < 0)
			say("ferry pack: %s: out of memory listing the inputs\n", dir);
		else if (!p->quiet)
			say("ferry pack: %s: left out, the directory was walked already (a symlink loop, or a second "
			    "path to it)\n", dir);
		return again;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **grown = realloc(names, cap * sizeof(char *));
			if (!grown)
				break;
			names = grown;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	int oom = e != NULL; /* the loop stopped before the end: out of memory */
	closedir(d);
	if (oom) {
		say("ferry pack: %s: out of memory listing it\n", dir);
		for (size_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return -1;
	}
	if (n) /* qsort's base may not be NULL, even for no elements */
		qsort(names, n, sizeof(char *), cmp_str);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		if (!rc && snprintf(path, sizeof(path), "%s/%s", dir, names[i]) >= (int)sizeof(path)) {
			say("ferry pack: %s/%s: path too long\n", dir, names[i]);
			rc = -1;
		}
		struct stat st;
		if (!rc && stat(path, &st) == 0) {
			if (is_output(p, &dst, names[i], &st)) {
				p->skipped_out++;
				if (!p->quiet)
					say("ferry pack: %s: left out, it is the output (-o)\n", path);
			} else if (S_ISDIR(st.st_mode)) {
				rc = walk(p, path) < 0 ? -1 : 0;
			} else if (S_ISREG(st.st_mode) && add_src(p, path, &st) < 0) {
				say("ferry pack: out of memory listing the inputs\n");
				rc = -1;
			}
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

static int npy_dtype(const char *descr)
{
	static const struct { const char *d; int t; } map[] = {
		{"u1", FERRY_DT_U8}, {"i1", FERRY_DT_I8}, {"i2", FERRY_DT_I16},
		{"u2", FERRY_DT_U16}, {"i4", FERRY_DT_I32}, {"i8", FERRY_DT_I64},
		{"f4", FERRY_DT_F32}, {"f8", FERRY_DT_F64},
	};
	if ((descr[0] != '<' && descr[0] != '|' && descr[0] != '=') )
		return -1;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(descr + 1, map[i].d))
			return map[i].t;
	return -1;
}

/* An .npy file: 1-D is one sample, 2-D (rows, n) is a sample per row. */
static int scan_npy(struct pack *p, uint32_t si, int fd, uint64_t size)
{
	char h[4096];
	ssize_t r = pread(fd, h, sizeof(h) - 1, 0);
	const char *path = p->srcs[si].path;
	if (r < 10 || memcmp(h, "\x93NUMPY", 6)) {
		say("ferry pack: %s: not an .npy file\n", path);
		return -1;
	}
	h[r] = 0;
	uint64_t hl, start;
	if (h[6] == 1) {
		hl = (uint8_t)h[8] | (uint64_t)(uint8_t)h[9] << 8;
		start = 10;
	} else {
		hl = (uint8_t)h[8] | (uint64_t)(uint8_t)h[9] << 8 | (uint64_t)(uint8_t)h[10] << 16 |
		     (uint64_t)(uint8_t)h[11] << 24;
		start = 12;
	}
	if (start + hl > (uint64_t)r) {
		say("ferry pack: %s: .npy header too long\n", path);
		return -1;
	}
	h[start + hl] = 0;
	char *descr = strstr(h + start, "'descr':"), *shape = strstr(h + start, "'shape':");
	char *fortran = strstr(h + start, "'fortran_order':");
	char d[16] = "";
	if (!descr || !shape || sscanf(descr, "'descr': '%15[^']'", d) != 1 || npy_dtype(d) < 0) {
		say("ferry pack: %s: unsupported .npy dtype '%s' (integers and floats, little-endian)\n",
			path, d);
		return -1;
	}
	if (fortran && strstr(fortran, "True") == fortran + 17) {
		say("ferry pack: %s: Fortran-ordered arrays are not supported\n", path);
		return -1;
	}
	int dt = npy_dtype(d);
	if (p->dtype >= 0 && p->dtype != dt) {
		say("ferry pack: %s: dtype %s differs from the other inputs' %s\n", path,
			ferry_dtype_numpy_name(dt), ferry_dtype_numpy_name(p->dtype));
		return -1;
	}
	p->dtype = dt;
	unsigned long long a = 0, b = 0;
	int dims = sscanf(shape, "'shape': (%llu, %llu", &a, &b);
	if (dims < 1 || (dims == 1 && strstr(shape, "(") && strchr(shape, ')') && sscanf(shape, "'shape': (%llu,)", &a) != 1)) {
		say("ferry pack: %s: unsupported shape\n", path);
		return -1;
	}
	uint64_t es = (uint64_t)ferry_dtype_bits(dt) / 8, data = start + hl;
	uint64_t rows = dims == 2 ? a : 1, cols = dims == 2 ? b : a;
	if (data + rows * cols * es > size) {
		say("ferry pack: %s: truncated .npy (%llu bytes of data expected)\n", path,
			(unsigned long long)(rows * cols * es));
		return -1;
	}
	for (uint64_t i = 0; i < rows; i++)
		if (add_sample(p, si, data + i * cols * es, cols * es))
			return -1;
	return 0;
}

/* A JSON Lines file bigger than this is scanned in parts of this size by --threads threads. */
#define PART (32u << 20)
#define NOTES 5

/*
 * The scan of the lines that start in [begin, end) of a JSON Lines file: its samples and counts,
 * merged in file order, and its refused lines with their line numbers counted from its start
 * (the merge knows how many lines the parts before it held).
 */
struct part {
	uint64_t begin, end;
	struct sample *s;
	uint64_t n, cap, bytes;
	uint64_t lines, blank, skipped[FERRY_JSONL__COUNT];
	int refused;  /* notes[0] is the line that fails the pack (no --skip-bad) */
	int nnotes;   /* the first NOTES lines refused or skipped */
	struct {
		uint64_t line;
		char why[320];
	} notes[NOTES];
	char err[600]; /* an I/O or memory failure, the whole message */
};

static int part_add(struct part *t, uint32_t src, uint64_t off, uint64_t len, uint32_t span)
{
	if (t->n == t->cap) {
		uint64_t c = t->cap ? t->cap * 2 : 1024;
		struct sample *g = realloc(t->s, c * sizeof(*t->s));
		if (!g) {
			snprintf(t->err, sizeof(t->err), "out of memory listing %llu samples", (unsigned long long)c);
			return -1;
		}
		t->s = g;
		t->cap = c;
	}
	t->s[t->n++] = (struct sample){off, len, src, span};
	t->bytes += len;
	return 0;
}

/* A line refused: noted (the first few), and counted with --skip-bad (0) or failing the scan (-1). */
static int bad_line(const struct pack *p, struct part *t, int status, const struct ferry_jsonl_value *v, size_t len)
{
	char why[320];
	switch (status) {
	case FERRY_JSONL_UTF8:
		snprintf(why, sizeof(why), "invalid UTF-8 at byte %zu of the line (JSON Lines are UTF-8)", v->pos + 1);
		break;
	case FERRY_JSONL_JSON:
		if (v->pos >= len)
			snprintf(why, sizeof(why), "not one JSON value (%s at the end of the line: a truncated line?)",
				 v->why);
		else
			snprintf(why, sizeof(why), "not one JSON value (%s at byte %zu of %zu)", v->why, v->pos + 1, len);
		break;
	case FERRY_JSONL_NO_KEY:
		snprintf(why, sizeof(why), "no member \"%s\"%s%s%s", p->key, v->why ? " (" : "", v->why ? v->why : "",
			 v->why ? ")" : "");
		break;
	case FERRY_JSONL_TYPE:
		snprintf(why, sizeof(why), "member \"%s\": %s", p->key, v->why);
		break;
	default:
		snprintf(why, sizeof(why), "member \"%s\": token id %s %s (%s holds 0 to %llu)", p->key, v->text, v->why,
			 ferry_dtype_numpy_name(p->dtype), (unsigned long long)p->max);
		break;
	}
	if (t->nnotes < NOTES) {
		t->notes[t->nnotes].line = t->lines;
		snprintf(t->notes[t->nnotes].why, sizeof(t->notes[0].why), "%s", why);
		t->nnotes++;
	}
	if (!p->skip_bad) {
		t->refused = 1;
		return -1;
	}
	t->skipped[status]++;
	return 0;
}

/* One line (len bytes at file offset off, parsed in place): a sample, blank, or bad. 0 or -1. */
static int jsonl_line(const struct pack *p, struct part *t, uint32_t si, char *b, size_t len, uint64_t off)
{
	struct ferry_jsonl_value v;
	t->lines++;
	int st = ferry_tools_jsonl_scan(b, len, p->key, p->want, p->max, &v);
	if (st == FERRY_JSONL_BLANK) {
		t->blank++;
		return 0;
	}
	if (st != FERRY_JSONL_OK)
		return bad_line(p, t, st, &v, len);
	if (!p->key)
		return part_add(t, si, off, len, 0);
	if (v.end - v.start > UINT32_MAX) {
		snprintf(t->err, sizeof(t->err), "the value of \"%s\" at byte %llu is longer than 4 GiB", p->key,
			 (unsigned long long)(off + v.start));
		return -1;
	}
	if (p->want == 's' && !v.escaped) /* copied as written, between the quotes */
		return part_add(t, si, off + v.start + 1, v.count, 0);
	return part_add(t, si, off + v.start, v.count * (p->want == 's' ? 1 : p->esize), (uint32_t)(v.end - v.start));
}

/* Reads the part a window at a time (a line longer than the window grows it). 0 or -1. */
static int scan_part(struct pack *p, uint32_t si, int fd, struct part *t)
{
	uint64_t size = p->srcs[si].size;
	size_t cap = WINDOW, have = 0;
	char *buf = malloc(cap);
	/* a part after the first starts at the line after the first newline at or after begin - 1 */
	int skip_first = t->begin > 0;
	uint64_t base = t->begin - (uint64_t)skip_first, got = base;
	int rc = 0;
	if (!buf) {
		snprintf(t->err, sizeof(t->err), "out of memory");
		return -1;
	}
	while (!rc) {
		int eof = got == size;
		if (!eof) {
			size_t want = cap - have;
			if (want > size - got)
				want = (size_t)(size - got);
			ssize_t r = pread(fd, buf + have, want, (off_t)got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				snprintf(t->err, sizeof(t->err), "read at %llu: %s", (unsigned long long)got,
					 r < 0 ? strerror(errno) : "the file shrank while it was read");
				rc = -1;
				break;
			}
			have += (size_t)r;
			got += (uint64_t)r;
			atomic_fetch_add(&p->scanned, (uint64_t)r);
			eof = got == size;
		}
		size_t pos = 0;
		int done = 0;
		for (char *nl; !rc && (nl = memchr(buf + pos, '\n', have - pos)); pos = (size_t)(nl - buf) + 1) {
			if (skip_first) {
				skip_first = 0;
				continue;
			}
			if (base + pos >= t->end) {
				done = 1;
				break;
			}
			rc = jsonl_line(p, t, si, buf + pos, (size_t)(nl - buf) - pos, base + pos);
		}
		if (rc || done)
			break;
		if (eof) {
			if (pos < have && !skip_first && base + pos < t->end)
				rc = jsonl_line(p, t, si, buf + pos, have - pos, base + pos);
			break;
		}
		memmove(buf, buf + pos, have - pos);
		base += pos;
		have -= pos;
		if (have == cap) {
			char *g = realloc(buf, cap * 2);
			if (!g) {
				snprintf(t->err, sizeof(t->err), "a line of more than %zu bytes: out of memory", cap);
				rc = -1;
				break;
			}
			buf = g;
			cap *= 2;
		}
	}
	free(buf);
	return rc;
}

struct scanner {
	struct pack *p;
	uint32_t si;
	struct part *parts;
	size_t nparts;
	atomic_size_t next, stop_at; /* parts after the first failed one are not scanned */
};

static void *scan_main(void *arg)
{
	struct scanner *c = arg;
	int fd = open(c->p->srcs[c->si].path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	for (size_t k; (k = atomic_fetch_add(&c->next, 1)) < c->nparts && k < atomic_load(&c->stop_at);) {
		struct part *t = &c->parts[k];
		if (fd < 0) {
			char why[256];
			snprintf(t->err, sizeof(t->err), "%s", errtext(errno, why, sizeof(why)));
		}
		if (fd < 0 || scan_part(c->p, c->si, fd, t)) {
			size_t cur = atomic_load(&c->stop_at);
			while (k < cur && !atomic_compare_exchange_weak(&c->stop_at, &cur, k))
				;
		}
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

/*
 * Reads the file once: in parts by up to --threads threads when it is big (each with its own
 * descriptor), then merges the parts in order: samples, counts, and the refused lines' numbers.
 */
static int scan_jsonl(struct pack *p, uint32_t si, int fd, uint64_t size)
{
	const char *path = p->srcs[si].path;
	size_t nparts = size > PART && p->threads > 1 ? (size_t)((size + PART - 1) / PART) : 1;
	struct scanner c = {.p = p, .si = si, .nparts = nparts, .parts = calloc(nparts, sizeof(struct part))};
	if (!c.parts) {
		say("ferry pack: %s: out of memory\n", path);
		return -1;
	}
	atomic_init(&c.next, 0);
	atomic_init(&c.stop_at, nparts);
	for (size_t k = 0; k < nparts; k++) {
		c.parts[k].begin = (uint64_t)k * PART;
		c.parts[k].end = k + 1 == nparts ? size : (uint64_t)(k + 1) * PART;
	}
	if (nparts == 1) {
		scan_part(p, si, fd, &c.parts[0]);
	} else {
		long nt = p->threads < (long)nparts ? p->threads : (long)nparts, started = 0;
		pthread_t *tids = calloc((size_t)nt, sizeof(*tids));
		for (long t = 0; tids && t < nt; t++)
			if (pthread_create(&tids[started], NULL, scan_main, &c) == 0)
				started++;
		if (!started) /* no threads to be had: this one scans them all */
			scan_main(&c);
		for (long t = 0; t < started; t++)
			pthread_join(tids[t], NULL);
		free(tids);
	}
	uint64_t lines = 0;
	int rc = 0;
	for (size_t k = 0; k < nparts; k++) {
		struct part *t = &c.parts[k];
		for (int j = 0; !rc && j < t->nnotes; j++) {
			unsigned long long line = (unsigned long long)(lines + t->notes[j].line);
			if (t->refused) {
				say("ferry pack: %s:%llu: %s; --skip-bad skips and counts such lines\n", path, line,
					t->notes[j].why);
				rc = -1;
			} else if (p->noted < NOTES && !p->quiet) {
				say("ferry pack: skipped %s:%llu: %s\n", path, line, t->notes[j].why);
				p->noted++;
			}
		}
		if (!rc && t->err[0]) {
			say("ferry pack: %s: %s\n", path, t->err);
			rc = -1;
		}
		for (uint64_t i = 0; !rc && i < t->n; i++)
			rc = add_sample_span(p, t->s[i].src, t->s[i].off, t->s[i].len, t->s[i].span);
		lines += t->lines;
		p->blank += t->blank;
		for (int r = 0; r < FERRY_JSONL__COUNT; r++)
			p->skipped[r] += t->skipped[r];
		free(t->s);
		if (rc) /* the parts after a failed one are freed, not merged */
			for (size_t q = k + 1; q < nparts; q++)
				free(c.parts[q].s);
		if (rc)
			break;
	}
	free(c.parts);
	return rc;
}

/* Pass 1: each input opened, scanned and closed in turn. */
static int scan(struct pack *p)
{
	for (size_t si = 0; si < p->nsrc; si++) {
		struct src *s = &p->srcs[si];
		/* O_NONBLOCK: a FIFO named as an input must not block the open; it is refused below */
		int fd = open(s->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0) {
			open_error(s->path, errno);
			if (fd >= 0)
				close(fd);
			return -1;
		}
		if (!S_ISREG(st.st_mode)) {
			say("ferry pack: %s: is a %s, not a regular file\n", s->path,
				S_ISFIFO(st.st_mode) ? "FIFO (named pipe)" : S_ISCHR(st.st_mode) ? "character device"
				: S_ISBLK(st.st_mode) ? "block device" : "special file");
			close(fd);
			return -1;
		}
		p->in_bytes += (uint64_t)st.st_size - s->size; /* what the walk saw may have changed */
		s->size = (uint64_t)st.st_size;
		s->dev = st.st_dev;
		s->ino = st.st_ino;
		s->mtime = st.st_mtim;
		uint64_t size = s->size;
		int in = p->in;
		if (in == IN_AUTO && p->key) {
			in = IN_JSONL; /* a .json or .ndjson file is not taken whole, silently, as one sample */
		} else if (in == IN_AUTO) {
			size_t l = strlen(s->path);
			in = l > 6 && !strcmp(s->path + l - 6, ".jsonl") ? IN_JSONL
			     : l > 4 && !strcmp(s->path + l - 4, ".npy") ? IN_NPY : IN_FILES;
		}
		int rc = 0;
		if (in == IN_JSONL) {
			rc = scan_jsonl(p, (uint32_t)si, fd, size);
		} else {
			if (in == IN_NPY)
				rc = scan_npy(p, (uint32_t)si, fd, size);
			else if (in == IN_RAW && size % ((uint64_t)ferry_dtype_bits(p->dtype) / 8)) {
				say("ferry pack: %s: %llu bytes is not a whole number of %s\n", s->path,
					(unsigned long long)size, ferry_dtype_numpy_name(p->dtype));
				rc = -1;
			} else {
				rc = add_sample(p, (uint32_t)si, 0, size);
			}
			atomic_fetch_add(&p->scanned, size);
		}
		close(fd);
		if (rc)
			return rc;
		atomic_store(&p->listed, p->n);
		atomic_store(&p->total_in, p->in_bytes);
		atomic_fetch_add(&p->files_done, 1);
	}
	return 0;
}

struct job {
	struct pack *p;
	uint64_t first, end;
};

/* A copying thread's view of one input: its descriptor and the window of it in memory. */
struct reader {
	int fd;
	uint32_t src;
	char *win;
	size_t cap;
	uint64_t woff, wlen;
};

/* The first failure of any thread: "path: at offset: why". */
static void job_fail(struct pack *p, const char *path, uint64_t off, const char *why)
{
	pthread_mutex_lock(&p->mu);
	if (!atomic_load(&p->failed))
		snprintf(p->err, sizeof(p->err), "%s: at byte %llu: %s", path, (unsigned long long)off, why);
	atomic_store(&p->failed, 1);
	pthread_mutex_unlock(&p->mu);
}

/* The need bytes at off of input src, read through the window; NULL on failure (recorded). */
static char *reader_get(struct pack *p, struct reader *r, uint32_t src, uint64_t off, uint64_t need)
{
	const struct src *s = &p->srcs[src];
	if (r->fd < 0 || r->src != src) {
		if (r->fd >= 0)
			close(r->fd);
		r->wlen = 0;
		r->src = src;
		r->fd = open(s->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		struct stat st;
		if (r->fd < 0 || fstat(r->fd, &st) < 0) {
			char why[256];
			job_fail(p, s->path, off, errtext(errno, why, sizeof(why)));
			return NULL;
		}
		if (st.st_dev != s->dev || st.st_ino != s->ino || (uint64_t)st.st_size != s->size ||
		    st.st_mtim.tv_sec != s->mtime.tv_sec || st.st_mtim.tv_nsec != s->mtime.tv_nsec) {
			job_fail(p, s->path, off, "the file changed since it was scanned (pack it again once nothing writes it)");
			return NULL;
		}
	}
	if (r->wlen && off >= r->woff && off + need <= r->woff + r->wlen)
		return r->win + (off - r->woff);
	uint64_t want = need > WINDOW ? need : WINDOW;
	if (want > s->size - off)
		want = need > s->size - off ? need : s->size - off;
	if (want > r->cap) {
		char *g = realloc(r->win, want ? want : 1);
		if (!g) {
			job_fail(p, s->path, off, "out of memory for a sample");
			return NULL;
		}
		r->win = g;
		r->cap = want;
	}
	r->wlen = 0;
	for (uint64_t got = 0; got < want;) {
		ssize_t n = pread(r->fd, r->win + got, want - got, (off_t)(off + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			job_fail(p, s->path, off + got, n < 0 ? strerror(errno) : "the file shrank");
			return NULL;
		}
		got += (uint64_t)n;
	}
	r->woff = off;
	r->wlen = want;
	return r->win;
}

/* Samples a copying thread has ready for one shard: consecutive indices, back to back in buf. */
struct batch {
	char *buf;
	size_t cap, used;
	uint64_t first, n;
	int64_t shard;
};

/* Bytes a thread gathers before it writes them, the shard's lock held, sample after sample. */
#define BATCH (1u << 20)

/*
 * Writes the batch under its shard's lock: buffered writes to one file take the file's lock in
 * the kernel anyway, and threads that each wrote their next small sample spun on it (on 16 CPUs,
 * 12 s of system time for 1 GB of JSON Lines, docs/PERFORMANCE.md); one thread at a time per shard,
 * a batch at a time, leaves the others reading and decoding.
 */
static int batch_flush(struct pack *p, struct batch *b)
{
	if (!b->n)
		return 0;
	pthread_mutex_t *mu = &p->shard_mu[b->shard];
	int err = 0;
	size_t off = 0;
	pthread_mutex_lock(mu);
	for (uint64_t k = 0; !err && k < b->n; k++) {
		uint64_t len = p->s[b->first + k].len;
		err = ferry_dataset_writer_put(p->w, b->first + k, b->buf + off, len);
		off += len;
	}
	pthread_mutex_unlock(mu);
	if (err) {
		char why[256];
		pthread_mutex_lock(&p->mu);
		if (!atomic_load(&p->failed))
			snprintf(p->err, sizeof(p->err), "%s%s%s", ferry_last_error(), err == -EMFILE ? ": " : "",
				 err == -EMFILE ? errtext(EMFILE, why, sizeof(why)) : "");
		atomic_store(&p->failed, 1);
		pthread_mutex_unlock(&p->mu);
	} else {
		atomic_fetch_add(&p->done, off);
	}
	b->n = 0;
	b->used = 0;
	return err;
}

/* Pass 2: a contiguous range of samples, each input opened when reached and closed after. */
static void *copy_main(void *arg)
{
	struct job *j = arg;
	struct pack *p = j->p;
	struct reader r = {.fd = -1};
	struct batch b = {.cap = BATCH, .buf = malloc(BATCH)};
	if (!b.buf)
		job_fail(p, "pack", 0, "out of memory");
	for (uint64_t i = j->first; b.buf && i < j->end && !atomic_load(&p->failed); i++) {
		struct sample *s = &p->s[i];
		const char *path = p->srcs[s->src].path;
		char *src = reader_get(p, &r, s->src, s->off, s->span ? s->span : s->len);
		if (!src)
			break;
		int64_t shard = ferry_dataset_writer_shard_of(p->w, i);
		/* a string is decoded in place, so in the batch: the window stays the file's bytes */
		uint64_t room = s->span && p->want == 's' ? s->span : s->len;
		if (b.n && (shard != b.shard || b.used + room > b.cap) && batch_flush(p, &b))
			break;
		if (room > b.cap) { /* a sample bigger than a batch is a batch of its own */
			char *g = realloc(b.buf, room);
			if (!g) {
				job_fail(p, path, s->off, "out of memory for a sample");
				break;
			}
			b.buf = g;
			b.cap = room;
		}
		if (!b.n) {
			b.first = i;
			b.shard = shard;
		}
		char *dst = b.buf + b.used;
		if (!s->span) {
			memcpy(dst, src, s->len);
		} else if (p->want == 's') {
			char *d;
			size_t dl;
			memcpy(dst, src, s->span);
			if (ferry_tools_jsonl_string(dst, s->span, &d, &dl) || dl != s->len) {
				job_fail(p, path, s->off, "the string changed since it was scanned");
				break;
			}
			memmove(dst, d, dl);
		} else if (ferry_tools_jsonl_ints(src, s->span, p->max, dst, p->esize, s->len / p->esize) !=
			   (int64_t)(s->len / p->esize)) {
			job_fail(p, path, s->off, "the token ids changed since they were scanned");
			break;
		}
		b.used += s->len;
		b.n++;
	}
	if (!atomic_load(&p->failed))
		batch_flush(p, &b);
	if (r.fd >= 0)
		close(r.fd);
	free(r.win);
	free(b.buf);
	return NULL;
}

enum { PHASE_SCAN, PHASE_COPY };

static void progress_line(struct pack *p, double t0, int tty)
{
	double el = ferry_tools_now_s() - t0;
	const char *end = tty ? "\033[K" : "\n", *start = tty ? "\r" : "";
	if (atomic_load(&p->phase) == PHASE_SCAN) {
		uint64_t sc = atomic_load(&p->scanned);
		fprintf(stderr, "%sferry pack: scanning: %llu/%zu files, %.1f/%.1f MiB, %llu samples, %.0f MiB/s%s", start,
			(unsigned long long)atomic_load(&p->files_done), p->nsrc, sc / 1048576.0,
			atomic_load(&p->total_in) / 1048576.0, (unsigned long long)atomic_load(&p->listed),
			el > 0 ? sc / 1048576.0 / el : 0, end);
	} else {
		static double copy_t0; /* rate and time left over the copy alone (only the progress thread draws) */
		if (!copy_t0)
			copy_t0 = ferry_tools_now_s();
		char line[400];
		cli_progress_format(line, sizeof(line), "ferry pack", NULL, atomic_load(&p->done), p->bytes,
				    ferry_tools_now_s() - copy_t0);
		fprintf(stderr, "%s%s of %llu samples%s", start, line, (unsigned long long)p->n, end);
	}
	fflush(stderr);
}

struct progress {
	struct pack *p;
	double t0;
	int tty;
};

/* On a terminal a line redrawn ten times a second; elsewhere (a log) a line every 5 seconds. */
static void *progress_main(void *arg)
{
	struct progress *g = arg;
	double last = ferry_tools_now_s();
	while (!atomic_load(&g->p->stop)) {
		for (int k = 0; k < 10 && !atomic_load(&g->p->stop); k++)
			usleep(10000); /* a short pack does not wait for the next redraw to end */
		double t = ferry_tools_now_s();
		if (atomic_load(&g->p->stop))
			break;
		if (g->tty || t - last >= 5) {
			progress_line(g->p, g->t0, g->tty);
			last = t;
		}
	}
	return NULL;
}

/* mkdir -p, a component at a time through directory descriptors (mkdirat, openat): an existing
 * directory, or a symlink to one, is used as it is; anything else in the way is an error. */
static int mkdir_p(const char *path)
{
	char buf[4096];
	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
		say("ferry pack: %s: path too long\n", path);
		return -1;
	}
	int dfd = open(buf[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *save = NULL;
	for (char *c = strtok_r(buf, "/", &save); c && dfd >= 0; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, "."))
			continue;
		if (mkdirat(dfd, c, 0755) < 0 && errno != EEXIST) {
			char why[256];
			errtext(errno, why, sizeof(why));
			close(dfd);
			say("ferry pack: creating the output's directory %s: %s: %s\n", path, c, why);
			return -1;
		}
		int next = openat(dfd, c, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		char why[256];
		errtext(errno, why, sizeof(why));
		close(dfd);
		if (next < 0) {
			say("ferry pack: creating the output's directory %s: %s: %s\n", path, c, why);
			return -1;
		}
		dfd = next;
	}
	if (dfd < 0) {
		open_error(path, errno);
		return -1;
	}
	close(dfd);
	return 0;
}

struct pack_opts {
	const char *out, *dtype, *json_key;
	int kind, in, keys, json, quiet, threads, skip_bad;
	uint64_t shard_size;
	unsigned copies; /* --shuffled-copies */
	uint64_t seed;
	int compress; /* --compress: 0 none, FERRY_CZ_LZ4, FERRY_CZ_ZSTD, or CZ_AUTO */
};

#define CZ_AUTO 3 /* --compress auto: zstd where it shrinks a shard by a tenth, else plain */
static const struct cli_choice cz_kinds[] = {
	{"none", 0, 0}, {"zstd", FERRY_CZ_ZSTD, 0}, {"lz4", FERRY_CZ_LZ4, 0}, {"auto", CZ_AUTO, 0}, {NULL, 0, 0}};

static const struct cli_choice formats[] = {
	{"ferry", FERRY_WRITE_FERRY, 0}, {"megatron", FERRY_WRITE_MEGATRON, 0}, {NULL, 0, 0}};
static const struct cli_choice input_kinds[] = {
	{"auto", IN_AUTO, 0}, {"files", IN_FILES, 0}, {"jsonl", IN_JSONL, 0},
	{"npy", IN_NPY, 0},   {"raw", IN_RAW, 0},     {NULL, 0, 0},
};

#define PO(f) offsetof(struct pack_opts, f)

static const struct cli_opt rows[] = {
	{.name = "output", .letter = 'o', .kind = CLI_STR, .off = PO(out), .arg = "PATH",
	 .help = "output directory (ferry) or prefix (megatron); missing directories are created"},
	{.name = "format", .kind = CLI_CHOICE, .off = PO(kind), .choices = formats, .help = "what to write (default ferry)"},
	{.name = "input", .kind = CLI_CHOICE, .off = PO(in), .choices = input_kinds,
	 .help = "how to read INPUTs (default auto: by extension)"},
	{.name = "json-key", .kind = CLI_STR, .off = PO(json_key), .arg = "KEY",
	 .help = "every input is JSON Lines, a sample the member KEY of each line's object: a string (its\n"
		 "UTF-8 bytes) or, with --dtype, an array of token ids"},
	{.name = "dtype", .kind = CLI_STR, .off = PO(dtype), .arg = "T",
	 .help = "element type: of raw inputs (uint16, int32, ...), or of --json-key's token ids (uint8, int8,\n"
		 "int16, uint16, int32, int64; each id range-checked)"},
	{.name = "skip-bad", .kind = CLI_FLAG, .off = PO(skip_bad),
	 .help = "skip JSON Lines lines that are refused otherwise (not UTF-8, not JSON, no KEY, wrong type,\n"
		 "token id out of range) and count them per reason in the summary"},
	{.name = "shard-size", .kind = CLI_SIZE, .off = PO(shard_size), .arg = "SIZE", .min = 1,
	 .help = "bytes per shard (default 256m; samples never straddle shards)"},
	{.name = "shuffled-copies", .kind = CLI_UINT, .off = PO(copies), .arg = "N", .min = 1, .max = 999,
	 .help = "also write N pre-shuffled copies (copy c in the order of epoch c of the loader's shuffle\n"
		 "with --seed), N times the data's bytes more, for the loader's copies=1 (ferry format)"},
	{.name = "seed", .kind = CLI_U64, .off = PO(seed), .arg = "S",
	 .help = "seed of --shuffled-copies' orders: the loader's seed (default 0)"},
	{.name = "compress", .kind = CLI_CHOICE, .off = PO(compress), .choices = cz_kinds,
	 .help = "write each shard as a ferry compressed file (docs/FORMATS.md; the loader and ferry_dataset_read\n"
		 "decode it on their threads): zstd, lz4, auto (zstd where it saves a tenth), none (default)"},
	{.name = "keys", .kind = CLI_FLAG, .off = PO(keys),
	 .help = "store each sample's source (file name, file@offset) as its key"},
	{.name = "threads", .kind = CLI_INT, .off = PO(threads), .arg = "N", .min = 1, .max = 1024,
	 .help = "copying threads (default: number of CPUs)"},
	{.name = "json", .kind = CLI_FLAG, .off = PO(json), .help = "print the summary as JSON"},
	{.name = "quiet", .letter = 'q', .kind = CLI_FLAG, .off = PO(quiet), .help = "no progress, no notes on stderr"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "pack",
	.synopsis = "ferry pack [options] -o OUT INPUT...",
	.about = "Packs files, directories (walked in name order), JSON Lines (.jsonl: a sample per line, or\n"
		 "its member --json-key KEY) or token arrays (.npy: 1-D one sample, 2-D a sample per row; raw:\n"
		 "--input raw --dtype T) into ferry shards + ferry.idx in directory OUT, or Megatron OUT.bin +\n"
		 "OUT.idx (--format megatron). Inputs are read one at a time (any number of them). Refused (exit\n"
		 "1, naming the file and line) unless --skip-bad: a .jsonl line that is not valid UTF-8 holding\n"
		 "one JSON value (blank lines are skipped), without KEY, of the wrong type, or with a token id\n"
		 "out of range. Always refused: an input that is not a regular file or directory, an empty\n"
		 "directory, inputs that hold no samples, and an input that is the output directory (an output\n"
		 "inside an input's tree is left out of the walk).",
	.opts = rows,
	.min_args = 1,
	.max_args = -1,
	.args = "INPUT",
};

static int pack_run(const struct pack_opts *o, int dtype, char **inputs, int ninputs);

/* The integer types a dataset holds (Megatron's codes), with their largest token id. */
static const struct { int dt; uint64_t max; } token_types[] = {
	{FERRY_DT_U8, 255}, {FERRY_DT_I8, 127}, {FERRY_DT_I16, 32767}, {FERRY_DT_U16, 65535},
	{FERRY_DT_I32, INT32_MAX}, {FERRY_DT_I64, INT64_MAX},
};

int ferry_cmd_pack(int argc, char **argv)
{
	/* 256 MiB shards: copying threads write different shards at once (one file's buffered writes
	 * serialize): 1 GB of JSON Lines in 0.69 s with 16 threads, 1.27 s in one 1 GiB shard
	 * (docs/PERFORMANCE.md) */
	struct pack_opts o = {.kind = FERRY_WRITE_FERRY, .in = IN_AUTO, .shard_size = 256ull << 20};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	o.threads = ncpu < 1 ? 1 : ncpu > 1024 ? 1024 : (int)ncpu;
	struct cli_args a = {0};
	int rc = cli_parse(&cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	if (!o.out)
		return cli_usage_error(&cmd, &a, "-o OUT is required");
	int dtype = -1;
	if (o.dtype) {
		enum ferry_dtype dt;
		if (ferry_dtype_from_numpy_name(o.dtype, &dt) < 0) {
			say("ferry pack: %s\n", ferry_last_error());
			return 2;
		}
		dtype = dt;
	} else if (o.in == IN_RAW) {
		return cli_usage_error(&cmd, &a, "--input raw needs --dtype");
	}
	if (o.json_key && (o.in == IN_RAW || o.in == IN_NPY))
		return cli_usage_error(&cmd, &a, "--json-key is for JSON Lines inputs");
	if (o.copies && o.kind != FERRY_WRITE_FERRY)
		return cli_usage_error(&cmd, &a, "--shuffled-copies is for the ferry format");
	if (o.compress && o.kind != FERRY_WRITE_FERRY)
		return cli_usage_error(&cmd, &a, "--compress is for the ferry format (Megatron's tools read plain .bin files)");
	if (o.json_key && dtype >= 0) {
		size_t k = 0, nt = sizeof(token_types) / sizeof(token_types[0]);
		while (k < nt && token_types[k].dt != dtype)
			k++;
		if (k == nt) {
			say("ferry pack: --dtype %s: token ids are stored as uint8, int8, int16, uint16, int32 "
					"or int64 (the integer types of ferry and Megatron datasets)\n", o.dtype);
			return 2;
		}
	}
	return pack_run(&o, dtype, a.argv, a.argc);
}

/* Ends the progress thread; on a terminal the last line stays (final) or is cleared. */
static void stop_progress(struct pack *p, pthread_t *tid, struct progress *g, int final)
{
	if (!tid)
		return;
	atomic_store(&p->stop, 1);
	pthread_join(*tid, NULL);
	if (g->tty && final) {
		progress_line(p, g->t0, 1);
		fputc('\n', stderr);
	} else if (g->tty) {
		fputs("\r\033[K", stderr);
	}
	atomic_store(&progress_tty, 0);
}

static int pack_run(const struct pack_opts *o, int dtype, char **inputs, int ninputs)
{
	struct pack p = {.dtype = dtype, .in = o->in, .keys = o->keys, .skip_bad = o->skip_bad, .quiet = o->quiet,
			 .key = o->json_key, .threads = o->threads};
	pthread_mutex_init(&p.mu, NULL);
	const char *out = o->out;
	int kind = o->kind, json = o->json, quiet = o->quiet;
	long threads = o->threads;
	double t0 = ferry_tools_now_s();
	if (p.key) {
		p.want = dtype >= 0 ? 'a' : 's';
		for (size_t k = 0; p.want == 'a' && k < sizeof(token_types) / sizeof(token_types[0]); k++)
			if (token_types[k].dt == dtype)
				p.max = token_types[k].max;
		p.esize = dtype >= 0 ? (size_t)ferry_dtype_bits(dtype) / 8 : 1;
	}
	/* where the output is (or an earlier run's is), so that the walk leaves it out */
	char bin[4200], idx[4200], parent[4200];
	if (kind == FERRY_WRITE_FERRY) {
		p.has_out_dir = stat(out, &p.out_dir) == 0 && S_ISDIR(p.out_dir.st_mode);
	} else {
		snprintf(bin, sizeof(bin), "%s.bin", out);
		snprintf(idx, sizeof(idx), "%s.idx", out);
		snprintf(parent, sizeof(parent), "%s", out);
		char *slash = strrchr(parent, '/');
		p.out_base = slash ? out + (slash - parent) + 1 : out;
		if (slash)
			*slash = slash == parent ? (slash[1] = 0, '/') : 0;
		else
			snprintf(parent, sizeof(parent), ".");
		p.has_out_bin = stat(bin, &p.out_bin) == 0;
		p.has_out_idx = stat(idx, &p.out_idx) == 0;
		p.has_out_parent = stat(parent, &p.out_parent) == 0;
	}
	for (int i = 0; i < ninputs; i++) {
		struct stat st;
		if (stat(inputs[i], &st) < 0) {
			say("ferry pack: %s: %s\n", inputs[i], strerror(errno));
			return 1;
		}
		if ((p.has_out_dir && S_ISDIR(st.st_mode) && same_file(&st, &p.out_dir)) ||
		    (p.has_out_bin && same_file(&st, &p.out_bin)) || (p.has_out_idx && same_file(&st, &p.out_idx))) {
			say("ferry pack: %s: is the output (-o %s): it would pack its own earlier output; "
					"write the output outside the inputs\n", inputs[i], out);
			return 1;
		}
		size_t before = p.nsrc;
		int w = S_ISDIR(st.st_mode) ? walk(&p, inputs[i]) : add_src(&p, inputs[i], &st) < 0 ? -1 : 0;
		if (w < 0)
			return 1;
		if (S_ISDIR(st.st_mode) && !w && p.nsrc == before) {
			say("ferry pack: %s: the directory holds no files to pack%s\n", inputs[i],
				p.skipped_out ? " (but the output)" : "");
			return 1;
		}
	}
	atomic_store(&p.total_in, p.in_bytes);
	struct progress g = {&p, t0, !quiet && isatty(2)};
	atomic_store(&progress_tty, g.tty);
	pthread_t ptid, *progress_tid = NULL;
	if (!quiet && pthread_create(&ptid, NULL, progress_main, &g) == 0)
		progress_tid = &ptid;
	int failed = scan(&p);
	double t_scan = ferry_tools_now_s(), t_copy = t_scan;
	if (!failed && !p.n) {
		stop_progress(&p, progress_tid, &g, 0);
		progress_tid = NULL;
		uint64_t sk = 0;
		for (int k = 0; k < FERRY_JSONL__COUNT; k++)
			sk += p.skipped[k];
		say("ferry pack: no samples in %s%s%s: nothing to pack\n", ninputs ? inputs[0] : "the inputs",
			ninputs > 1 ? " and the other inputs" : "", sk ? " (every line was skipped)" : "");
		failed = 1;
	}
	if (p.dtype < 0)
		p.dtype = FERRY_DT_BYTES;
	ferry_ctx *ctx = NULL;
	int nshards = 0;
	if (!failed) {
		/* the output's directories, created as mkdir -p would; the writer creates its files exclusively */
		if (kind == FERRY_WRITE_FERRY ? mkdir_p(out) : strchr(out, '/') ? mkdir_p(parent) : 0)
			failed = 1;
	}
	if (!failed) {
		int err = ferry_ctx_create(&ctx);
		err = err ? err : ferry_dataset_writer_create(ctx, out, kind, p.dtype, o->shard_size, &p.w);
		for (uint64_t i = 0; !err && i < p.n; i++) {
			char key[4200];
			int kl = 0;
			if (p.keys) {
				struct sample *s = &p.s[i];
				kl = snprintf(key, sizeof(key), "%s", p.srcs[s->src].path);
				if ((i && p.s[i - 1].src == s->src) || (i + 1 < p.n && p.s[i + 1].src == s->src))
					kl = snprintf(key, sizeof(key), "%s@%llu", p.srcs[s->src].path,
						      (unsigned long long)s->off);
				if (kl >= (int)sizeof(key))
					kl = (int)sizeof(key) - 1;
			}
			int64_t r = ferry_dataset_writer_add(p.w, p.s[i].len, p.keys ? key : NULL, (size_t)kl, 1);
			err = r < 0 ? (int)r : 0;
		}
		nshards = err ? 0 : ferry_dataset_writer_layout(p.w);
		if (err || nshards < 0) {
			stop_progress(&p, progress_tid, &g, 0);
			progress_tid = NULL;
			lib_error(err ? err : nshards);
			failed = 1;
		}
	}
	struct job *jobs = NULL;
	pthread_t *tids = NULL;
	if (!failed) {
		atomic_store(&p.phase, PHASE_COPY);
		p.shard_mu = calloc((size_t)(nshards ? nshards : 1), sizeof(*p.shard_mu));
		for (int k = 0; p.shard_mu && k < nshards; k++)
			pthread_mutex_init(&p.shard_mu[k], NULL);
		t_copy = ferry_tools_now_s(); /* after the writer's layout */
		if ((uint64_t)threads > p.n)
			threads = (long)p.n;
		jobs = calloc((size_t)threads, sizeof(*jobs));
		tids = calloc((size_t)threads, sizeof(*tids));
		if (!jobs || !tids || !p.shard_mu) {
			stop_progress(&p, progress_tid, &g, 0);
			progress_tid = NULL;
			say("ferry pack: out of memory\n");
			failed = 1;
		}
	}
	if (!failed) {
		/* contiguous ranges of about equal bytes: each thread reads its inputs in order */
		uint64_t per = p.bytes / (uint64_t)threads + 1, acc = 0, first = 0;
		long t = 0;
		for (uint64_t i = 0; i < p.n && t < threads - 1; i++) {
			acc += p.s[i].len;
			if (acc >= per * (uint64_t)(t + 1)) {
				jobs[t] = (struct job){&p, first, i + 1};
				first = i + 1;
				t++;
			}
		}
		for (; t < threads; t++) {
			jobs[t] = (struct job){&p, first, p.n};
			first = p.n;
		}
		long started = 0;
		int err;
		for (t = 0; t < threads; t++)
			if (pthread_create(&tids[t], NULL, copy_main, &jobs[t]) == 0)
				started++;
			else
				break;
		if (started < threads) /* what a thread did not start, this one copies */
			copy_main(&(struct job){&p, jobs[started].first, p.n});
		for (t = 0; t < started; t++)
			pthread_join(tids[t], NULL);
		stop_progress(&p, progress_tid, &g, !atomic_load(&p.failed));
		progress_tid = NULL;
		if (atomic_load(&p.failed)) {
			say("ferry pack: %s\n", p.err[0] ? p.err : "out of memory");
			failed = 1;
		} else if ((err = ferry_dataset_writer_set_copies(p.w, o->copies, o->seed)) ||
			   (err = ferry_dataset_writer_finish(p.w))) {
			lib_error(err);
			failed = 1;
		} else if (o->compress && (err = ferry_cli_cz_shards(ctx, out, o->compress == CZ_AUTO ? 0 : o->compress))) {
			lib_error(err);
			failed = 1;
		}
	}
	stop_progress(&p, progress_tid, &g, 0);
	double el = ferry_tools_now_s() - t0, t_end = ferry_tools_now_s();
	ferry_dataset_writer_destroy(p.w);
	ferry_ctx_destroy(ctx);
	uint64_t skipped = 0;
	for (int k = 0; k < FERRY_JSONL__COUNT; k++)
		skipped += p.skipped[k];
	const char *fmt = kind == FERRY_WRITE_MEGATRON ? "megatron" : "ferry";
	int odt = kind == FERRY_WRITE_MEGATRON && p.dtype == FERRY_DT_BYTES ? FERRY_DT_U8 : p.dtype;
	if (failed) {
	} else if (json) {
		printf("{\"format\": \"%s\", \"output\": ", fmt);
		ferry_tools_json_string(stdout, out);
		printf(", \"samples\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"shards\": %d, \"dtype\": \"%s\", "
		       "\"shuffled_copies\": %u, \"inputs\": %zu, \"input_bytes\": %" PRIu64 ", \"blank_lines\": %" PRIu64
		       ", \"skipped_lines\": %" PRIu64 ", \"skipped\": {",
		       p.n, p.bytes, nshards, ferry_dtype_numpy_name(odt), o->copies, p.nsrc, p.in_bytes, p.blank, skipped);
		for (int k = FERRY_JSONL_UTF8; k < FERRY_JSONL__COUNT; k++)
			printf("%s\"%s\": %" PRIu64, k == FERRY_JSONL_UTF8 ? "" : ", ", ferry_tools_jsonl_status_name(k),
			       p.skipped[k]);
		printf("}, \"output_left_out\": %" PRIu64 ", \"seconds\": %.3f, \"scan_seconds\": %.3f, "
		       "\"copy_seconds\": %.3f, \"bytes_per_s\": %.0f}\n", p.skipped_out, el, t_scan - t0, t_end - t_copy,
		       el > 0 ? p.in_bytes / el : 0);
	} else {
		printf("packed %" PRIu64 " samples (%.1f MiB, %s) from %zu inputs (%.1f MiB) into %d %s in %.2f s "
		       "(%.0f MiB/s of input): %s\n", p.n, p.bytes / 1048576.0, ferry_dtype_numpy_name(odt), p.nsrc,
		       p.in_bytes / 1048576.0, nshards,
		       kind == FERRY_WRITE_MEGATRON ? "file (.bin/.idx)" : nshards == 1 ? "shard" : "shards",
		       el, el > 0 ? p.in_bytes / 1048576.0 / el : 0, out);
		if (skipped) {
			static const char *const words[FERRY_JSONL__COUNT] = {
				"", "", "not UTF-8", "not one JSON value", "without the member", "of another type",
				"with a token id out of range"};
			printf("skipped %" PRIu64 " lines (--skip-bad):", skipped);
			const char *sep = " ";
			for (int k = FERRY_JSONL_UTF8; k < FERRY_JSONL__COUNT; k++)
				if (p.skipped[k]) {
					printf("%s%" PRIu64 " %s", sep, p.skipped[k], words[k]);
					sep = ", ";
				}
			printf("\n");
		}
	}
	for (size_t i = 0; i < p.nsrc; i++)
		free(p.srcs[i].path);
	free(p.srcs);
	free(p.seen);
	free(p.s);
	free(jobs);
	free(tids);
	free(p.shard_mu);
	return failed ? 1 : 0;
}
