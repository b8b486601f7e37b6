/*
 * ferry pack: a directory of files, JSON Lines, or token arrays (.npy, raw) into ferry shards and
 * an index, or into Megatron's .bin/.idx. Sources are listed first (so the layout is known), then
 * threads copy whole ranges of samples; the index is published last (write, fsync, rename).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/data.h"
#include "ferry/ferry.h"

enum { IN_AUTO, IN_FILES, IN_JSONL, IN_NPY, IN_RAW };

struct src {
	char *path;
	int fd;
};

struct sample {
	uint32_t src;
	uint64_t off, len;
};

struct pack {
	struct src *srcs;
	size_t nsrc, src_cap;
	struct sample *s;
	uint64_t n, cap;
	int in, dtype, keys;
	uint64_t bytes;
	ferry_dataset_writer *w;
	atomic_uint_fast64_t done;
	atomic_int failed;
	char err[1024];
	pthread_mutex_t mu;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int add_src(struct pack *p, const char *path)
{
	if (p->nsrc == p->src_cap) {
		p->src_cap = p->src_cap ? p->src_cap * 2 : 64;
		p->srcs = realloc(p->srcs, p->src_cap * sizeof(*p->srcs));
		if (!p->srcs)
			return -ENOMEM;
	}
	p->srcs[p->nsrc].path = strdup(path);
	p->srcs[p->nsrc].fd = -1;
	return (int)p->nsrc++;
}

static int add_sample(struct pack *p, uint32_t src, uint64_t off, uint64_t len)
{
	if (p->n == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 1024;
		p->s = realloc(p->s, p->cap * sizeof(*p->s));
		if (!p->s)
			return -ENOMEM;
	}
	p->s[p->n++] = (struct sample){src, off, len};
	p->bytes += len;
	return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Files of a directory tree, in name order so that packing is reproducible. */
static int walk(struct pack *p, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		fprintf(stderr, "ferry pack: %s: %s\n", dir, strerror(errno));
		return -1;
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
		fprintf(stderr, "ferry pack: %s: out of memory listing it\n", dir);
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
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		struct stat st;
		if (!rc && stat(path, &st) == 0) {
			if (S_ISDIR(st.st_mode))
				rc = walk(p, path);
			else if (S_ISREG(st.st_mode) && add_src(p, path) < 0)
				rc = -1;
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
		fprintf(stderr, "ferry pack: %s: not an .npy file\n", path);
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
		fprintf(stderr, "ferry pack: %s: .npy header too long\n", path);
		return -1;
	}
	h[start + hl] = 0;
	char *descr = strstr(h + start, "'descr':"), *shape = strstr(h + start, "'shape':");
	char *fortran = strstr(h + start, "'fortran_order':");
	char d[16] = "";
	if (!descr || !shape || sscanf(descr, "'descr': '%15[^']'", d) != 1 || npy_dtype(d) < 0) {
		fprintf(stderr, "ferry pack: %s: unsupported .npy dtype '%s' (integers and floats, little-endian)\n",
			path, d);
		return -1;
	}
	if (fortran && strstr(fortran, "True") == fortran + 17) {
		fprintf(stderr, "ferry pack: %s: Fortran-ordered arrays are not supported\n", path);
		return -1;
	}
	int dt = npy_dtype(d);
	if (p->dtype >= 0 && p->dtype != dt) {
		fprintf(stderr, "ferry pack: %s: dtype %s differs from the other inputs' %s\n", path,
			ferry_dtype_numpy_name(dt), ferry_dtype_numpy_name(p->dtype));
		return -1;
	}
	p->dtype = dt;
	unsigned long long a = 0, b = 0;
	int dims = sscanf(shape, "'shape': (%llu, %llu", &a, &b);
	if (dims < 1 || (dims == 1 && strstr(shape, "(") && strchr(shape, ')') && sscanf(shape, "'shape': (%llu,)", &a) != 1)) {
		fprintf(stderr, "ferry pack: %s: unsupported shape\n", path);
		return -1;
	}
	uint64_t es = (uint64_t)ferry_dtype_bits(dt) / 8, data = start + hl;
	uint64_t rows = dims == 2 ? a : 1, cols = dims == 2 ? b : a;
	if (data + rows * cols * es > size) {
		fprintf(stderr, "ferry pack: %s: truncated .npy (%llu bytes of data expected)\n", path,
			(unsigned long long)(rows * cols * es));
		return -1;
	}
	for (uint64_t i = 0; i < rows; i++)
		if (add_sample(p, si, data + i * cols * es, cols * es))
			return -1;
	return 0;
}

/* Length of the valid UTF-8 prefix of [p, e) (RFC 3629: no overlongs, surrogates or > U+10FFFF). */
static size_t utf8_valid(const unsigned char *p, const unsigned char *e)
{
	const unsigned char *b = p;
	while (p < e) {
		unsigned c = *p, n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
		if (n == 9 || (size_t)(e - p) <= n || c == 0xc0 || c == 0xc1 || c > 0xf4)
			return (size_t)(p - b);
		for (unsigned k = 1; k <= n; k++)
			if ((p[k] & 0xc0) != 0x80)
				return (size_t)(p - b);
		if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f) || (c == 0xf0 && p[1] < 0x90) ||
		    (c == 0xf4 && p[1] > 0x8f))
			return (size_t)(p - b);
		p += n + 1;
	}
	return (size_t)(p - b);
}

static const unsigned char *json_ws(const unsigned char *p, const unsigned char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
		p++;
	return p;
}

/* The end of the one JSON value (RFC 8259) at p, or NULL. */
static const unsigned char *json_value(const unsigned char *p, const unsigned char *e, int depth)
{
	p = json_ws(p, e);
	if (p == e || depth > 512)
		return NULL;
	if (*p == '"') {
		for (p++; p < e && *p != '"'; p++) {
			if (*p < 0x20)
				return NULL;
			if (*p == '\\') {
				if (++p == e || !strchr("\"\\/bfnrtu", *p))
					return NULL;
				if (*p == 'u')
					for (int k = 0; k < 4; k++)
						if (++p == e || !strchr("0123456789abcdefABCDEF", *p))
							return NULL;
			}
		}
		return p < e ? p + 1 : NULL;
	}
	if (*p == '{' || *p == '[') {
		unsigned char close = *p == '{' ? '}' : ']';
		p = json_ws(p + 1, e);
		if (p < e && *p == close)
			return p + 1;
		for (;;) {
			if (close == '}') {
				p = json_ws(p, e);
				if (p == e || *p != '"' || !(p = json_value(p, e, depth + 1)))
					return NULL;
				p = json_ws(p, e);
				if (p == e || *p++ != ':')
					return NULL;
			}
			if (!(p = json_value(p, e, depth + 1)))
				return NULL;
			p = json_ws(p, e);
			if (p < e && *p == ',') {
				p++;
				continue;
			}
			return p < e && *p == close ? p + 1 : NULL;
		}
	}
	static const char *const lits[] = {"true", "false", "null"};
	for (int k = 0; k < 3; k++) {
		size_t l = strlen(lits[k]);
		if ((size_t)(e - p) >= l && !memcmp(p, lits[k], l))
			return p + l;
	}
	/* a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
	if (p < e && *p == '-')
		p++;
	if (p == e || *p < '0' || *p > '9')
		return NULL;
	if (*p == '0')
		p++;
	else
		while (p < e && *p >= '0' && *p <= '9')
			p++;
	if (p < e && *p == '.') {
		if (++p == e || *p < '0' || *p > '9')
			return NULL;
		while (p < e && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < e && (*p == 'e' || *p == 'E')) {
		if (++p < e && (*p == '+' || *p == '-'))
			p++;
		if (p == e || *p < '0' || *p > '9')
			return NULL;
		while (p < e && *p >= '0' && *p <= '9')
			p++;
	}
	return p;
}

/* 0 when the line (no newline) is valid UTF-8 holding one JSON value; else prints why and returns -1. */
static int check_jsonl_line(const char *path, uint64_t lineno, const unsigned char *b, size_t len)
{
	size_t ok = utf8_valid(b, b + len);
	if (ok != len) {
		fprintf(stderr, "ferry pack: %s:%llu: invalid UTF-8 at byte %zu of the line (JSON Lines are UTF-8)\n",
			path, (unsigned long long)lineno, ok + 1);
		return -1;
	}
	const unsigned char *end = json_value(b, b + len, 0);
	if (!end || json_ws(end, b + len) != b + len) {
		fprintf(stderr, "ferry pack: %s:%llu: not one JSON value (a broken or truncated line?)\n", path,
			(unsigned long long)lineno);
		return -1;
	}
	return 0;
}

static int scan_jsonl(struct pack *p, uint32_t si, int fd, uint64_t size)
{
	/* the whole file is read (each line checked: UTF-8, one JSON value; blank lines are skipped) */
	const char *path = p->srcs[si].path;
	unsigned char *buf = size ? malloc(size) : NULL;
	if (size && !buf) {
		fprintf(stderr, "ferry pack: %s: cannot hold its %llu bytes to check its lines\n", path,
			(unsigned long long)size);
		return -1;
	}
	for (uint64_t got = 0; got < size;) {
		ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
		if (r <= 0) {
			fprintf(stderr, "ferry pack: %s: read at %llu: %s\n", path, (unsigned long long)got,
				r < 0 ? strerror(errno) : "file shrank");
			free(buf);
			return -1;
		}
		got += (uint64_t)r;
	}
	uint64_t line = 0, lineno = 0;
	int rc = 0;
	for (uint64_t i = 0; !rc && i <= size; i++) {
		if (i < size && buf[i] != '\n')
			continue;
		lineno++;
		uint64_t len = i - line;
		const unsigned char *b = buf + line, *blank = len ? json_ws(b, b + len) : b;
		if (len && blank != b + len)
			rc = check_jsonl_line(path, lineno, b, (size_t)len) || add_sample(p, si, line, i - line) ? -1 : 0;
		line = i + 1;
	}
	free(buf);
	return rc;
}

static int scan(struct pack *p)
{
	for (size_t si = 0; si < p->nsrc; si++) {
		struct src *s = &p->srcs[si];
		/* O_NONBLOCK: a FIFO named as an input must not block the open; it is refused below */
		s->fd = open(s->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		struct stat st;
		if (s->fd < 0 || fstat(s->fd, &st) < 0) {
			fprintf(stderr, "ferry pack: %s: %s\n", s->path, strerror(errno));
			return -1;
		}
		if (!S_ISREG(st.st_mode)) {
			fprintf(stderr, "ferry pack: %s: is a %s, not a regular file\n", s->path,
				S_ISFIFO(st.st_mode) ? "FIFO (named pipe)" : S_ISCHR(st.st_mode) ? "character device"
				: S_ISBLK(st.st_mode) ? "block device" : "special file");
			return -1;
		}
		uint64_t size = (uint64_t)st.st_size;
		int in = p->in;
		if (in == IN_AUTO) {
			size_t l = strlen(s->path);
			in = l > 6 && !strcmp(s->path + l - 6, ".jsonl") ? IN_JSONL
			     : l > 4 && !strcmp(s->path + l - 4, ".npy") ? IN_NPY : IN_FILES;
		}
		int rc = 0;
		if (in == IN_NPY)
			rc = scan_npy(p, (uint32_t)si, s->fd, size);
		else if (in == IN_JSONL)
			rc = scan_jsonl(p, (uint32_t)si, s->fd, size);
		else {
			if (in == IN_RAW && size % ((uint64_t)ferry_dtype_bits(p->dtype) / 8)) {
				fprintf(stderr, "ferry pack: %s: %llu bytes is not a whole number of %s\n", s->path,
					(unsigned long long)size, ferry_dtype_numpy_name(p->dtype));
				return -1;
			}
			rc = add_sample(p, (uint32_t)si, 0, size);
		}
		if (rc)
			return rc;
	}
	return 0;
}

struct job {
	struct pack *p;
	uint64_t first, end;
};

static void *copy_main(void *arg)
{
	struct job *j = arg;
	struct pack *p = j->p;
	size_t cap = 1 << 20;
	char *buf = malloc(cap);
	for (uint64_t i = j->first; i < j->end && buf && !atomic_load(&p->failed); i++) {
		struct sample *s = &p->s[i];
		if (s->len > cap) {
			free(buf);
			cap = s->len;
			if (!(buf = malloc(cap)))
				break;
		}
		uint64_t got = 0;
		while (got < s->len) {
			ssize_t r = pread(p->srcs[s->src].fd, buf + got, s->len - got, (off_t)(s->off + got));
			if (r <= 0) {
				pthread_mutex_lock(&p->mu);
				snprintf(p->err, sizeof(p->err), "%s: read at %llu: %s", p->srcs[s->src].path,
					 (unsigned long long)(s->off + got), r < 0 ? strerror(errno) : "file shrank");
				pthread_mutex_unlock(&p->mu);
				atomic_store(&p->failed, 1);
				goto out;
			}
			got += (uint64_t)r;
		}
		int err = ferry_dataset_writer_put(p->w, i, buf, s->len);
		if (err) {
			pthread_mutex_lock(&p->mu);
			snprintf(p->err, sizeof(p->err), "%s", ferry_last_error());
			pthread_mutex_unlock(&p->mu);
			atomic_store(&p->failed, 1);
			break;
		}
		atomic_fetch_add(&p->done, s->len);
	}
	if (!buf)
		atomic_store(&p->failed, 1);
out:
	free(buf);
	return NULL;
}

static void progress(uint64_t done, uint64_t total, double t0, int final)
{
	double el = now_s() - t0, frac = total ? (double)done / (double)total : 1;
	int w = 30, k = (int)(frac * w);
	char bar[40];
	for (int i = 0; i < w; i++)
		bar[i] = i < k ? '#' : ' ';
	bar[w] = 0;
	fprintf(stderr, "\r[%s] %3.0f%% %.1f/%.1f MiB %.0f MiB/s%s", bar, frac * 100, done / 1048576.0,
		total / 1048576.0, el > 0 ? done / 1048576.0 / el : 0, final ? "\n" : "");
}

struct pack_opts {
	const char *out, *dtype;
	int kind, in, keys, json, quiet, threads;
	uint64_t shard_size;
};

static const struct cli_choice formats[] = {
	{"ferry", FERRY_WRITE_FERRY, 0}, {"megatron", FERRY_WRITE_MEGATRON, 0}, {NULL, 0, 0}};
static const struct cli_choice input_kinds[] = {
	{"auto", IN_AUTO, 0}, {"files", IN_FILES, 0}, {"jsonl", IN_JSONL, 0},
	{"npy", IN_NPY, 0},   {"raw", IN_RAW, 0},     {NULL, 0, 0},
};

#define PO(f) offsetof(struct pack_opts, f)

static const struct cli_opt rows[] = {
	{.name = "output", .letter = 'o', .kind = CLI_STR, .off = PO(out), .arg = "PATH",
	 .help = "output directory (ferry) or prefix (megatron)"},
	{.name = "format", .kind = CLI_CHOICE, .off = PO(kind), .choices = formats, .help = "what to write (default ferry)"},
	{.name = "input", .kind = CLI_CHOICE, .off = PO(in), .choices = input_kinds,
	 .help = "how to read INPUTs (default auto: by extension)"},
	{.name = "dtype", .kind = CLI_STR, .off = PO(dtype), .arg = "T", .help = "element type (raw inputs; uint16, int32, ...)"},
	{.name = "shard-size", .kind = CLI_SIZE, .off = PO(shard_size), .arg = "SIZE", .min = 1,
	 .help = "bytes per shard (default 1g; samples never straddle shards)"},
	{.name = "keys", .kind = CLI_FLAG, .off = PO(keys),
	 .help = "store each sample's source (file name, file:line) as its key"},
	{.name = "threads", .kind = CLI_INT, .off = PO(threads), .arg = "N", .min = 1, .max = 1024,
	 .help = "copying threads (default: number of CPUs)"},
	{.name = "json", .kind = CLI_FLAG, .off = PO(json), .help = "print the summary as JSON"},
	{.name = "quiet", .letter = 'q', .kind = CLI_FLAG, .off = PO(quiet), .help = "no progress bar"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "pack",
	.synopsis = "ferry pack [options] -o OUT INPUT...",
	.about = "Packs files, directories (walked in name order), JSON Lines (.jsonl: a sample per line) or\n"
		 "token arrays (.npy: 1-D one sample, 2-D a sample per row; raw: --input raw --dtype T) into\n"
		 "ferry shards + ferry.idx in directory OUT, or Megatron OUT.bin + OUT.idx (--format megatron).\n"
		 "Refused (exit 1, naming the file and line): a .jsonl line that is not valid UTF-8 holding one\n"
		 "JSON value (blank lines are skipped), an input that is not a regular file or directory, an\n"
		 "empty directory, and inputs that hold no samples at all.",
	.opts = rows,
	.min_args = 1,
	.max_args = -1,
	.args = "INPUT",
};

static int pack_run(const struct pack_opts *o, int dtype, char **inputs, int ninputs);

int ferry_cmd_pack(int argc, char **argv)
{
	struct pack_opts o = {.kind = FERRY_WRITE_FERRY, .in = IN_AUTO};
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
			fprintf(stderr, "ferry pack: %s\n", ferry_last_error());
			return 2;
		}
		dtype = dt;
	} else if (o.in == IN_RAW) {
		return cli_usage_error(&cmd, &a, "--input raw needs --dtype");
	}
	return pack_run(&o, dtype, a.argv, a.argc);
}

static int pack_run(const struct pack_opts *o, int dtype, char **inputs, int ninputs)
{
	struct pack p = {.dtype = dtype, .in = o->in, .keys = o->keys};
	pthread_mutex_init(&p.mu, NULL);
	const char *out = o->out;
	int kind = o->kind, json = o->json, quiet = o->quiet;
	uint64_t shard_size = o->shard_size;
	long threads = o->threads;
	double t0 = now_s();
	for (int i = 0; i < ninputs; i++) {
		struct stat st;
		if (stat(inputs[i], &st) < 0) {
			fprintf(stderr, "ferry pack: %s: %s\n", inputs[i], strerror(errno));
			return 1;
		}
		size_t before = p.nsrc;
		if (S_ISDIR(st.st_mode) ? walk(&p, inputs[i]) : add_src(&p, inputs[i]) < 0)
			return 1;
		if (S_ISDIR(st.st_mode) && p.nsrc == before) {
			fprintf(stderr, "ferry pack: %s: the directory holds no files to pack\n", inputs[i]);
			return 1;
		}
	}
	if (scan(&p))
		return 1;
	if (!p.n) {
		fprintf(stderr, "ferry pack: no samples in %s%s: nothing to pack\n", ninputs ? inputs[0] : "the inputs",
			ninputs > 1 ? " and the other inputs" : "");
		return 1;
	}
	if (p.dtype < 0)
		p.dtype = FERRY_DT_BYTES;
	ferry_ctx *ctx;
	if (ferry_ctx_create(&ctx)) {
		fprintf(stderr, "ferry pack: %s\n", ferry_last_error());
		return 1;
	}
	int err = ferry_dataset_writer_create(ctx, out, kind, p.dtype, shard_size, &p.w);
	for (uint64_t i = 0; !err && i < p.n; i++) {
		char key[4200];
		int kl = 0;
		if (p.keys) {
			struct sample *s = &p.s[i];
			kl = snprintf(key, sizeof(key), "%s", p.srcs[s->src].path);
			if (i && p.s[i - 1].src == s->src)
				kl = snprintf(key, sizeof(key), "%s@%llu", p.srcs[s->src].path,
					      (unsigned long long)s->off);
			else if (i + 1 < p.n && p.s[i + 1].src == s->src)
				kl = snprintf(key, sizeof(key), "%s@%llu", p.srcs[s->src].path,
					      (unsigned long long)s->off);
			if (kl >= (int)sizeof(key))
				kl = (int)sizeof(key) - 1;
		}
		int64_t r = ferry_dataset_writer_add(p.w, p.s[i].len, p.keys ? key : NULL, (size_t)kl, 1);
		err = r < 0 ? (int)r : 0;
	}
	int nshards = err ? 0 : ferry_dataset_writer_layout(p.w);
	if (err || nshards < 0) {
		fprintf(stderr, "ferry pack: %s\n", ferry_last_error());
		return 1;
	}
	if ((uint64_t)threads > p.n)
		threads = p.n ? (long)p.n : 1;
	struct job *jobs = calloc((size_t)threads, sizeof(*jobs));
	pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
	/* contiguous ranges of about equal bytes */
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
	for (t = 0; t < threads; t++)
		pthread_create(&tids[t], NULL, copy_main, &jobs[t]);
	int tty = !quiet && isatty(2);
	if (tty) {
		while (atomic_load(&p.done) < p.bytes && !atomic_load(&p.failed)) {
			progress(atomic_load(&p.done), p.bytes, t0, 0);
			usleep(100000);
		}
	}
	for (t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	if (tty)
		progress(atomic_load(&p.done), p.bytes, t0, 1);
	if (atomic_load(&p.failed)) {
		fprintf(stderr, "ferry pack: %s\n", p.err[0] ? p.err : "out of memory");
		return 1;
	}
	if (ferry_dataset_writer_finish(p.w)) {
		fprintf(stderr, "ferry pack: %s\n", ferry_last_error());
		return 1;
	}
	double el = now_s() - t0;
	ferry_dataset_writer_destroy(p.w);
	ferry_ctx_destroy(ctx);
	const char *fmt = kind == FERRY_WRITE_MEGATRON ? "megatron" : "ferry";
	int odt = kind == FERRY_WRITE_MEGATRON && p.dtype == FERRY_DT_BYTES ? FERRY_DT_U8 : p.dtype;
	if (json)
		printf("{\"format\": \"%s\", \"output\": \"%s\", \"samples\": %" PRIu64 ", \"bytes\": %" PRIu64
		       ", \"shards\": %d, \"dtype\": \"%s\", \"inputs\": %zu, \"seconds\": %.3f, \"bytes_per_s\": %.0f}\n",
		       fmt, out, p.n, p.bytes, nshards, ferry_dtype_numpy_name(odt), p.nsrc, el,
		       el > 0 ? p.bytes / el : 0);
	else
		printf("packed %" PRIu64 " samples (%.1f MiB, %s) from %zu inputs into %d %s in %.2f s "
		       "(%.0f MiB/s): %s\n", p.n, p.bytes / 1048576.0, ferry_dtype_numpy_name(odt), p.nsrc, nshards,
		       kind == FERRY_WRITE_MEGATRON ? "file (.bin/.idx)" : nshards == 1 ? "shard" : "shards",
		       el, el > 0 ? p.bytes / 1048576.0 / el : 0, out);
	for (size_t i = 0; i < p.nsrc; i++) {
		if (p.srcs[i].fd >= 0)
			close(p.srcs[i].fd);
		free(p.srcs[i].path);
	}
	free(p.srcs);
	free(p.s);
	free(jobs);
	free(tids);
	return 0;
}
