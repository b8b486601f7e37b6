/*
 * Verifying a committed checkpoint step (see include/ferry/ckpt.h): one set of rules for the C API,
 * the CLI (ferry ckpt verify) and Python (ferry.checkpoint.verify). Every problem found is
 * recorded (the first KEEP_PROBLEMS with their messages) and checking goes on, so that one run
 * names them all; the result is the first problem's code.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "format/safetensors.h"
#include "base/json.h"
#include "engine/export.h"

#define KEEP_PROBLEMS 64
#define MANIFEST_MAX (1 << 20)

struct vfile {
	char *name;
	uint64_t s[FERRY_VERIFY_STAT__COUNT];
	uint64_t listed_bytes;
	int listed_codec; /* the manifest's "codec" (FERRY_CZ_*), 0 for none */
	int listed, has_bytes, present, rank, world; /* rank, world: from the name, -1 when it is not one */
};

/* A piece of a replicated tensor (python/ferry/_replicated.py: the shard's "ferry.replicated"). */
struct rpiece {
	char *name, *dtype, *file;
	uint64_t shape[FERRY_ST_MAX_DIMS];
	int ndim;
	uint64_t off, nbytes;
};

struct ferry_ckpt_report {
	uint64_t s[FERRY_VERIFY_STAT__COUNT];
	struct vfile *f;
	size_t nf, cf;
	struct rpiece *rp; /* the step's replicated pieces, from every shard */
	size_t nrp, crp, rep_shards;
	uint64_t rep_tensors, rep_bytes;
	int rep_counts_set;
	char *msg[KEEP_PROBLEMS];
	int code[KEEP_PROBLEMS];
	size_t nmsg;
	int first;
};

static void problem(ferry_ckpt_report *rep, struct vfile *f, int code, const char *fmt, ...) FERRY__PRINTF(4, 5);
static void problem(ferry_ckpt_report *rep, struct vfile *f, int code, const char *fmt, ...)
{
	rep->s[FERRY_VERIFY_PROBLEMS]++;
	if (f)
		f->s[FERRY_VERIFY_PROBLEMS]++;
	if (!rep->first)
		rep->first = code;
	if (rep->nmsg == KEEP_PROBLEMS)
		return;
	va_list ap;
	va_start(ap, fmt);
	char *m = NULL;
	if (vasprintf(&m, fmt, ap) < 0)
		m = NULL;
	va_end(ap);
	rep->code[rep->nmsg] = code;
	rep->msg[rep->nmsg++] = m; /* NULL when out of memory: read back as a generic sentence */
}

/* The error a call just recorded, as a problem: its message without the ": <strerror>" ferry__error
 * ended it with (the report's messages are sentences without it, as ferry__error takes them). */
static void problem_last(ferry_ckpt_report *rep, struct vfile *f, int code)
{
	const char *m = ferry_last_error(), *why = ferry_strerror(code);
	size_t n = strlen(m), w = strlen(why);
	if (n > w + 2 && !strcmp(m + n - w, why) && !memcmp(m + n - w - 2, ": ", 2))
		n -= w + 2;
	problem(rep, f, code, "%.*s", (int)n, m);
}

/* "rank-RRRRR-of-WWWWW.safetensors", or a compressed shard's ".safetensors.fz" (the names
 * ferry_ckpt_shard_path makes): 0, or -1. */
static int parse_shard_name(const char *name, int *rank, int *world)
{
	static const char pat[] = "rank-#####-of-#####.safetensors";
	int v[2] = {0, 0}, k = 0;
	if (strlen(name) != sizeof(pat) - 1 && (strlen(name) != sizeof(pat) + 2 || strcmp(name + sizeof(pat) - 1, ".fz")))
		return -1;
	for (size_t i = 0; pat[i]; i++) {
		if (pat[i] == '#') {
			if (name[i] < '0' || name[i] > '9')
				return -1;
			v[k] = v[k] * 10 + (name[i] - '0');
			if (pat[i + 1] != '#')
				k++;
		} else if (name[i] != pat[i]) {
			return -1;
		}
	}
	*rank = v[0];
	*world = v[1];
	return 0;
}

static struct vfile *add_file(ferry_ckpt_report *rep, const char *name)
{
	if (ferry__grow((void **)&rep->f, &rep->cf, rep->nf + 1, sizeof(*rep->f)))
		return NULL;
	struct vfile *f = &rep->f[rep->nf];
	memset(f, 0, sizeof(*f));
	if (!(f->name = strdup(name)))
		return NULL;
	if (parse_shard_name(name, &f->rank, &f->world))
		f->rank = f->world = -1;
	else
		f->s[FERRY_VERIFY_WORLD] = (uint64_t)f->world;
	rep->nf++;
	return f;
}

/* ------------------------------------------------------------------------------------ manifest */

struct manifest {
	char *buf; /* the file, parsed in place: names and run point into it */
	uint64_t world, step;
	int has_world, has_step, has_shards;
	const char *run, *format;
	struct mshard {
		const char *file;
		uint64_t bytes;
		int has_bytes, codec;
	} *sh;
	size_t n, cap;
};

static void manifest_free(struct manifest *m)
{
	free(m->buf);
	free(m->sh);
}

static int manifest_shards(struct ferry__json *j, struct manifest *m, const char *path)
{
	char *k, *v;
	size_t kl, vl, kpos;
	int a, o;
	if (ferry__json_array_begin(j))
		return 1;
	while ((a = ferry__json_array_next(j)) == 1) {
		if (ferry__grow((void **)&m->sh, &m->cap, m->n + 1, sizeof(*m->sh)))
			return ferry__error(-ENOMEM, "ckpt: out of memory");
		struct mshard *s = &m->sh[m->n];
		memset(s, 0, sizeof(*s));
		size_t opos = j->pos;
		if (ferry__json_object_begin(j))
			return 1;
		while ((o = ferry__json_object_next(j, &k, &kl, &kpos)) == 1) {
			if (!strcmp(k, "file")) {
				size_t vpos = j->pos;
				if (ferry__json_string(j, &v, &vl))
					return 1;
				int r = ferry__check_shard_name(path, v, vl, vpos);
				if (r)
					return r;
				s->file = v;
			} else if (!strcmp(k, "bytes")) {
				if (ferry__json_uint(j, &s->bytes))
					return 1;
				s->has_bytes = 1;
			} else if (!strcmp(k, "codec")) {
				size_t vpos = j->pos;
				if (ferry__json_string(j, &v, &vl))
					return 1;
				if ((s->codec = ferry_cz_codec_from_name(v)) < 0)
					return ferry__json_fail(j, vpos, "\"codec\" is neither \"lz4\" nor \"zstd\""), 1;
			} else if (ferry__json_skip(j)) {
				return 1;
			}
		}
		if (o < 0)
			return 1;
		if (!s->file)
			return ferry__json_fail(j, opos, "a shard without \"file\""), 1;
		m->n++;
	}
	return a < 0;
}

/*
 * Reads and parses DIR/step-N/manifest.json into m (the step directory's path in sp). missing:
 * the error for a step without a manifest. Returns 0 or an error naming the file (and the byte).
 */
static int manifest_read(const char *dir, int64_t step, int missing, char *sp, size_t splen, struct manifest *m)
{
	char p[PATH_MAX + 32];
	memset(m, 0, sizeof(*m));
	int r = ferry_ckpt_step_path(dir, step, sp, splen);
	if (r < 0)
		return r;
	snprintf(p, sizeof(p), "%s/manifest.json", sp);
	size_t len = 0;
	if (strstr(dir, "://")) { /* a step under an s3:// prefix (docs/REMOTE.md) */
		r = ferry__url_get(NULL, p, MANIFEST_MAX, &m->buf, &len);
		if (r == -ENOENT)
			return ferry__error(missing, "%s: no manifest.json: step %lld is not committed", sp, (long long)step);
		if (r)
			return r == -EFBIG ? ferry__error(FERRY_ECORRUPT, "%s: more than %d bytes", p, MANIFEST_MAX) : r;
		goto parse;
	}
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT)
			return ferry__error(missing, "%s: no manifest.json: step %lld is not committed", sp, (long long)step);
		return ferry__error(-e, "%s: %s", p, strerror(e));
	}
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > MANIFEST_MAX) {
		close(fd);
		return ferry__error(FERRY_ECORRUPT, "%s: not a plain file of at most %d bytes", p, MANIFEST_MAX);
	}
	if (!(m->buf = malloc((size_t)st.st_size + 1))) {
		close(fd);
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	}
	while (len < (size_t)st.st_size) {
		ssize_t n = read(fd, m->buf + len, (size_t)st.st_size - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			return ferry__error(-e, "%s: read: %s", p, strerror(e));
		}
		if (!n)
			break;
		len += (size_t)n;
	}
	close(fd);
	m->buf[len] = '\0';
parse:;
	struct ferry__json j;
	char *k, *v;
	size_t kl, vl, kpos;
	int o = 0;
	r = 0;
	if (ferry__json_init(&j, m->buf, len) || ferry__json_object_begin(&j))
		goto bad;
	while (!r && (o = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "world")) {
			if (ferry__json_uint(&j, &m->world))
				goto bad;
			m->has_world = 1;
		} else if (!strcmp(k, "step")) {
			if (ferry__json_uint(&j, &m->step))
				goto bad;
			m->has_step = 1;
		} else if (!strcmp(k, "run") || !strcmp(k, "format")) {
			int is_run = k[0] == 'r';
			if (ferry__json_string(&j, &v, &vl))
				goto bad;
			*(is_run ? &m->run : &m->format) = v;
		} else if (!strcmp(k, "shards")) {
			r = manifest_shards(&j, m, p);
			if (r == 1)
				goto bad;
			m->has_shards = 1;
		} else if (ferry__json_skip(&j)) {
			goto bad;
		}
	}
	if (r)
		return r;
	if (o < 0 || ferry__json_end(&j))
		goto bad;
	if (!m->has_world || !m->has_shards)
		return ferry__error(FERRY_ECORRUPT, "%s: no \"%s\"", p, m->has_world ? "shards" : "world");
	return 0;
bad:
	return ferry__error(FERRY_ECORRUPT, "%s: byte %zu: %s", p, j.err_pos, j.err ? j.err : "unexpected JSON");
}

/* ---------------------------------------------------------------------------------------- shard */

/*
 * The metadata a checkpoint save writes into every shard (ckpt.c, save()): the step, the run id,
 * the rank and the world. A shard with none of them was written before ferry tied shards to their
 * step: counted as untied, not a problem.
 */
static void check_ties(ferry_ckpt_report *rep, struct vfile *f, const char *path, ferry_st *st, int64_t step,
		       const char *run, int rank, uint64_t world)
{
	char sv[32], rv[32], wv[32];
	snprintf(sv, sizeof(sv), "%lld", (long long)step);
	snprintf(rv, sizeof(rv), "%d", rank);
	snprintf(wv, sizeof(wv), "%llu", (unsigned long long)world);
	const char *key[4] = {"ferry.step", "ferry.run", "ferry.rank", "ferry.world"};
	const char *want[4] = {sv, run, rv, wv};
	const char *from[4] = {"the step directory", "manifest.json", "the file name", "the file name"};
	const char *got[4];
	int any = 0;
	for (int i = 0; i < 4; i++)
		any |= (got[i] = ferry_st_metadata_get(st, key[i])) != NULL;
	if (!any) {
		f->s[FERRY_VERIFY_UNTIED] = 1;
		return;
	}
	for (int i = 0; i < 4; i++) {
		if (!got[i])
			problem(rep, f, FERRY_ECORRUPT, "%s: metadata %s missing (expected \"%s\", from %s)", path, key[i],
				want[i], from[i]);
		else if (strcmp(got[i], want[i]))
			problem(rep, f, FERRY_ECORRUPT, "%s: metadata %s is \"%.128s\", expected \"%s\" (from %s)", path,
				key[i], got[i], want[i], from[i]);
	}
}

/*
 * The replicated pieces a shard holds, described by its "ferry.replicated" metadata:
 * {"world": N, "tensors": T, "bytes": B, "pieces": [[piece, name, dtype, [shape], offset], ...]}.
 * Each piece must be a tensor of the shard; the pieces of all shards are checked together
 * (check_replicated) to make up every replicated tensor exactly.
 */
static void read_replicated(ferry_ckpt_report *rep, struct vfile *f, const char *path, ferry_st *st)
{
	const char *md = ferry_st_metadata_get(st, "ferry.replicated");
	if (!md)
		return;
	rep->rep_shards++;
	size_t len = strlen(md);
	char *buf = malloc(len + 1);
	if (!buf) {
		problem(rep, f, -ENOMEM, "%s: out of memory", path);
		return;
	}
	memcpy(buf, md, len + 1);
	struct ferry__json j;
	char *k, *v;
	size_t kl, kpos, vl;
	uint64_t tensors = 0, bytes = 0;
	int m, have_t = 0, have_b = 0, have_p = 0;
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		goto bad;
	while ((m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "tensors")) {
			if (ferry__json_uint(&j, &tensors))
				goto bad;
			have_t = 1;
		} else if (!strcmp(k, "bytes")) {
			if (ferry__json_uint(&j, &bytes))
				goto bad;
			have_b = 1;
		} else if (!strcmp(k, "pieces")) {
			have_p = 1;
			if (ferry__json_array_begin(&j))
				goto bad;
			int a;
			while ((a = ferry__json_array_next(&j)) == 1) {
				struct rpiece rp = {0};
				char *piece;
				size_t pl;
				if (ferry__json_array_begin(&j) || ferry__json_array_next(&j) != 1 ||
				    ferry__json_string(&j, &piece, &pl))
					goto bad;
				int idx = ferry_st_find(st, piece);
				if (idx < 0) {
					problem(rep, f, FERRY_ECORRUPT,
						"%s: metadata ferry.replicated names piece \"%.200s\", which the shard does not hold",
						path, piece);
				}
				if (ferry__json_array_next(&j) != 1 || ferry__json_string(&j, &v, &vl) ||
				    !(rp.name = strdup(v)))
					goto bad_piece;
				if (ferry__json_array_next(&j) != 1 || ferry__json_string(&j, &v, &vl) ||
				    !(rp.dtype = strdup(v)))
					goto bad_piece;
				if (ferry__json_array_next(&j) != 1 || ferry__json_array_begin(&j))
					goto bad_piece;
				int d;
				while ((d = ferry__json_array_next(&j)) == 1) {
					if (rp.ndim == FERRY_ST_MAX_DIMS || ferry__json_uint(&j, &rp.shape[rp.ndim++]))
						goto bad_piece;
				}
				if (d < 0 || ferry__json_array_next(&j) != 1 || ferry__json_uint(&j, &rp.off) ||
				    ferry__json_array_next(&j) != 0)
					goto bad_piece;
				if (idx < 0) {
					free(rp.name);
					free(rp.dtype);
					continue;
				}
				rp.nbytes = ferry_st_nbytes(st, (size_t)idx);
				rp.file = f->name;
				if (ferry__grow((void **)&rep->rp, &rep->crp, rep->nrp + 1, sizeof(*rep->rp)))
					goto bad_piece;
				rep->rp[rep->nrp++] = rp;
				continue;
bad_piece:
				free(rp.name);
				free(rp.dtype);
				goto bad;
			}
			if (a < 0)
				goto bad;
		} else if (ferry__json_skip(&j)) {
			goto bad;
		}
	}
	if (m < 0 || ferry__json_end(&j) || !have_t || !have_b || !have_p)
		goto bad;
	if (!rep->rep_counts_set) {
		rep->rep_tensors = tensors;
		rep->rep_bytes = bytes;
		rep->rep_counts_set = 1;
	} else if (rep->rep_tensors != tensors || rep->rep_bytes != bytes) {
		problem(rep, f, FERRY_ECORRUPT,
			"%s: metadata ferry.replicated says %llu tensors of %llu bytes, another shard %llu of %llu", path,
			(unsigned long long)tensors, (unsigned long long)bytes, (unsigned long long)rep->rep_tensors,
			(unsigned long long)rep->rep_bytes);
	}
	free(buf);
	return;
bad:
	problem(rep, f, FERRY_ECORRUPT, "%s: metadata ferry.replicated is malformed (byte %zu: %s)", path, j.err_pos,
		j.err ? j.err : "not the expected layout");
	free(buf);
}

static int cmp_piece(const void *a, const void *b)
{
	const struct rpiece *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : x->off < y->off ? -1 : x->off > y->off;
}

/* The step's replicated pieces make up each of its replicated tensors exactly, once. */
static void check_replicated(ferry_ckpt_report *rep, const char *sp, size_t present)
{
	if (!rep->rep_shards)
		return;
	if (rep->rep_shards != present)
		problem(rep, NULL, FERRY_ECORRUPT,
			"%s: %zu of %zu shards describe replicated state (metadata ferry.replicated): every shard must",
			sp, rep->rep_shards, present);
	qsort(rep->rp, rep->nrp, sizeof(*rep->rp), cmp_piece);
	uint64_t tensors = 0, total = 0;
	for (size_t i = 0; i < rep->nrp;) {
		struct rpiece *t = &rep->rp[i];
		size_t e = i;
		uint64_t at = 0;
		int bad = 0;
		for (; e < rep->nrp && !strcmp(rep->rp[e].name, t->name); e++) {
			struct rpiece *q = &rep->rp[e];
			if (!bad && (strcmp(q->dtype, t->dtype) || q->ndim != t->ndim ||
				     memcmp(q->shape, t->shape, sizeof(t->shape[0]) * (size_t)t->ndim))) {
				problem(rep, NULL, FERRY_ECORRUPT, "%s: replicated tensor \"%.200s\" has another dtype or shape in %s than in %s",
					sp, t->name, q->file, t->file);
				bad = 1;
			}
			if (!bad && q->off != at) {
				problem(rep, NULL, FERRY_ECORRUPT,
					q->off > at ? "%s: replicated tensor \"%.200s\": bytes [%llu, %llu) are in no shard of the step"
						    : "%s: replicated tensor \"%.200s\": pieces overlap at byte %llu (%llu)",
					sp, t->name, (unsigned long long)at, (unsigned long long)q->off);
				bad = 1;
			}
			at = q->off + q->nbytes;
		}
		enum ferry_dtype dt;
		uint64_t want = 0;
		if (!bad && ferry_dtype_from_name(t->dtype, &dt)) {
			problem(rep, NULL, FERRY_ECORRUPT, "%s: replicated tensor \"%.200s\": dtype \"%.32s\" unknown", sp,
				t->name, t->dtype);
			bad = 1;
		} else if (!bad) {
			want = (uint64_t)ferry_dtype_bits(dt);
			for (int d = 0; d < t->ndim; d++)
				want *= t->shape[d];
			want /= 8;
			if (at != want)
				problem(rep, NULL, FERRY_ECORRUPT,
					"%s: replicated tensor \"%.200s\": bytes [%llu, %llu) are in no shard of the step", sp,
					t->name, (unsigned long long)at, (unsigned long long)want);
		}
		tensors++;
		total += at;
		i = e;
	}
	if (rep->rep_counts_set && (tensors != rep->rep_tensors || total != rep->rep_bytes))
		problem(rep, NULL, FERRY_ECORRUPT,
			"%s: %llu replicated tensors of %llu bytes in the step's shards, their metadata says %llu of %llu", sp,
			(unsigned long long)tensors, (unsigned long long)total, (unsigned long long)rep->rep_tensors,
			(unsigned long long)rep->rep_bytes);
}

static void check_shard(ferry_ctx *ctx, ferry_ckpt_report *rep, struct vfile *f, const char *path, int64_t step,
			const char *run, int rank, uint64_t world, int require_sums)
{
	ferry_st *st;
	int r = ferry_st_open(ctx, path, &st);
	if (r) {
		problem_last(rep, f, r);
		return;
	}
	ferry_cz *z = ferry__st_cz(st);
	int codec = z ? ferry_cz_codec(z) : 0;
	size_t pl = strlen(path);
	if (f->listed && codec != f->listed_codec)
		problem(rep, f, FERRY_ECORRUPT, "%s: %s, manifest.json says %s", path,
			codec ? ferry_cz_codec_name(codec) : "not compressed",
			f->listed_codec ? ferry_cz_codec_name(f->listed_codec) : "not compressed");
	else if ((pl > 3 && !strcmp(path + pl - 3, ".fz")) != (codec != 0))
		problem(rep, f, FERRY_ECORRUPT, "%s: %s, its name says otherwise", path,
			codec ? "compressed" : "not compressed");
	check_ties(rep, f, path, st, step, run, rank, world);
	read_replicated(rep, f, path, st);
	size_t n = ferry_st_count(st);
	f->s[FERRY_VERIFY_TENSORS] = n;
	for (size_t i = 0; i < n; i++) {
		int v = ferry_st_verify(st, i);
		enum ferry_verify_stat k = v == 1 ? FERRY_VERIFY_VERIFIED : v == 0 ? FERRY_VERIFY_NOSUM : FERRY_VERIFY_FAILED;
		f->s[k]++;
		if (v < 0) {
			problem_last(rep, f, v);
		} else if (v == 0 && require_sums) {
			f->s[FERRY_VERIFY_FAILED]++;
			problem(rep, f, FERRY_EVERIFY, "%s: tensor \"%s\" has no checksum", path, ferry_st_name(st, i));
		}
	}
	ferry_st_destroy(st);
}

/* ------------------------------------------------------------------------------------------ step */

static int is_shard_file(const char *name)
{
	size_t n = strlen(name);
	return name[0] != '.' && ((n > 12 && !strcmp(name + n - 12, ".safetensors")) ||
				  (n > 15 && !strcmp(name + n - 15, ".safetensors.fz")));
}

/* The objects directly under an s3:// step (a listing stands for the step directory's readdir). */
struct listed {
	const char *prefix; /* "<step URL>/" */
	char (*name)[256];
	uint64_t *size;
	size_t n, cap;
};

static int on_listed(void *arg, const char *url, uint64_t size, const char *etag)
{
	(void)etag;
	struct listed *l = arg;
	size_t pl = strlen(l->prefix);
	const char *name = url + pl;
	if (strncmp(url, l->prefix, pl) || strchr(name, '/') || strlen(name) >= sizeof(*l->name))
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		char(*nm)[256] = realloc(l->name, cap * sizeof(*nm));
		if (nm)
			l->name = nm;
		uint64_t *sz = nm ? realloc(l->size, cap * sizeof(*sz)) : NULL;
		if (!sz)
			return -ENOMEM;
		l->size = sz;
		l->cap = cap;
	}
	snprintf(l->name[l->n], sizeof(*l->name), "%s", name);
	l->size[l->n++] = size;
	return 0;
}

static int verify_step(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums, ferry_ckpt_report *rep)
{
	char sp[PATH_MAX], p[PATH_MAX + 300];
	struct manifest m;
	int r = manifest_read(dir, step, FERRY_ECORRUPT, sp, sizeof(sp) - 64, &m);
	if (r) {
		problem_last(rep, NULL, r);
		manifest_free(&m);
		return 0;
	}
	const char *run = m.run ? m.run : "";
	rep->s[FERRY_VERIFY_WORLD] = m.world;
	if (m.format && strcmp(m.format, "ferry-checkpoint-1"))
		problem(rep, NULL, FERRY_ECORRUPT, "%s/manifest.json: format \"%.64s\", expected \"ferry-checkpoint-1\"", sp,
			m.format);
	if (m.has_step && m.step != (uint64_t)step)
		problem(rep, NULL, FERRY_ECORRUPT, "%s/manifest.json: step %llu, expected %lld (the step directory)", sp,
			(unsigned long long)m.step, (long long)step);
	if (!m.world || m.world > INT_MAX || m.world != m.n)
		problem(rep, NULL, FERRY_ECORRUPT, "%s/manifest.json: %zu shards listed for a world of %llu", sp, m.n,
			(unsigned long long)m.world);
	for (size_t i = 0; i < m.n; i++) {
		struct vfile *f = NULL;
		for (size_t k = 0; k < rep->nf && !f; k++)
			if (!strcmp(rep->f[k].name, m.sh[i].file))
				f = &rep->f[k];
		if (f) {
			problem(rep, f, FERRY_ECORRUPT, "%s/manifest.json: shard \"%s\" listed twice", sp, m.sh[i].file);
			continue;
		}
		if (!(f = add_file(rep, m.sh[i].file)))
			goto oom;
		f->listed = 1;
		f->listed_bytes = m.sh[i].bytes;
		f->listed_codec = m.sh[i].codec;
		f->has_bytes = m.sh[i].has_bytes;
		if (f->rank < 0)
			problem(rep, f, FERRY_ECORRUPT, "%s/manifest.json: shard %zu is \"%s\", not a rank-R-of-W.safetensors name",
				sp, i, f->name);
		else if ((uint64_t)f->rank != i || (uint64_t)f->world != m.world)
			problem(rep, f, FERRY_ECORRUPT,
				"%s/manifest.json: shard %zu is \"%s\" (rank %d of %d), the manifest's rank %zu of %llu", sp, i,
				f->name, f->rank, f->world, i, (unsigned long long)m.world);
		if (!f->has_bytes)
			problem(rep, f, FERRY_ECORRUPT, "%s/manifest.json: shard \"%s\" without \"bytes\"", sp, f->name);
	}
	/* What the step directory holds: every listed shard, and no other */
	int url = strstr(sp, "://") != NULL;
	struct listed ls = {0};
	char lp[PATH_MAX + 2];
	ferry_ctx *own = NULL;
	DIR *d = NULL;
	if (url) { /* an s3:// step: its objects by listing (docs/REMOTE.md) */
		snprintf(lp, sizeof(lp), "%s/", sp);
		ls.prefix = lp;
		int lr = ctx ? 0 : ferry_ctx_create(&own);
		lr = lr ? lr : ferry__remote_list(ctx ? ctx : own, lp, on_listed, &ls);
		ferry_ctx_destroy(own);
		if (lr)
			problem_last(rep, NULL, lr);
		for (size_t k = 0; k < ls.n; k++) {
			if (!is_shard_file(ls.name[k]))
				continue;
			size_t j = 0;
			while (j < rep->nf && strcmp(rep->f[j].name, ls.name[k]))
				j++;
			if (j == rep->nf && !add_file(rep, ls.name[k])) {
				free(ls.name);
				free(ls.size);
				goto oom;
			}
		}
	} else if (!(d = opendir(sp))) {
		problem(rep, NULL, -errno, "opendir(%s): %s", sp, strerror(errno));
	} else {
		struct dirent *e;
		while ((e = readdir(d))) {
			if (!is_shard_file(e->d_name))
				continue;
			size_t k = 0;
			while (k < rep->nf && strcmp(rep->f[k].name, e->d_name))
				k++;
			if (k == rep->nf && !add_file(rep, e->d_name)) {
				closedir(d);
				goto oom;
			}
		}
		closedir(d);
	}
	for (size_t i = 0; i < rep->nf; i++) {
		struct vfile *f = &rep->f[i];
		snprintf(p, sizeof(p), "%s/%s", sp, f->name);
		struct stat st;
		if (url) {
			size_t k = 0;
			while (k < ls.n && strcmp(ls.name[k], f->name))
				k++;
			memset(&st, 0, sizeof(st));
			st.st_mode = S_IFREG;
			st.st_size = k < ls.n ? (off_t)ls.size[k] : 0;
			if (k == ls.n) {
				problem(rep, f, FERRY_ECORRUPT, "%s: listed in manifest.json but missing", p);
				continue;
			}
		} else if (fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW)) {
			int e = errno;
			if (e == ENOENT)
				problem(rep, f, FERRY_ECORRUPT, "%s: listed in manifest.json but missing", p);
			else
				problem(rep, f, -e, "%s: %s", p, strerror(e));
			continue;
		}
		if (!S_ISREG(st.st_mode)) {
			problem(rep, f, FERRY_ECORRUPT, "%s: not a plain file", p);
			continue;
		}
		f->present = 1;
		f->s[FERRY_VERIFY_FILES] = 1;
		f->s[FERRY_VERIFY_BYTES] = (uint64_t)st.st_size;
		if (!f->listed)
			problem(rep, f, FERRY_ECORRUPT, "%s: in the step directory but not in manifest.json", p);
		else if (f->has_bytes && (uint64_t)st.st_size != f->listed_bytes)
			problem(rep, f, FERRY_ECORRUPT, "%s: %llu bytes, manifest.json says %llu", p,
				(unsigned long long)st.st_size, (unsigned long long)f->listed_bytes);
		int rank = f->rank >= 0 ? f->rank : (int)i;
		uint64_t world = f->world >= 0 ? (uint64_t)f->world : m.world;
		check_shard(ctx, rep, f, p, step, run, rank, world, require_sums);
	}
	size_t present = 0;
	for (size_t i = 0; i < rep->nf; i++)
		present += rep->f[i].present;
	check_replicated(rep, sp, present);
	manifest_free(&m);
	free(ls.name);
	free(ls.size);
	return 0;
oom:
	manifest_free(&m);
	return ferry__error(-ENOMEM, "ckpt: out of memory");
}

int ferry_ckpt_verify_report(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums, ferry_ckpt_report **out)
{
	*out = NULL;
	ferry_ckpt_report *rep = calloc(1, sizeof(*rep));
	if (!rep)
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	int r = verify_step(ctx, dir, step, require_sums, rep);
	if (r) {
		ferry_ckpt_report_destroy(rep);
		return r;
	}
	for (size_t i = 0; i < rep->nf; i++)
		for (int k = 0; k < FERRY_VERIFY_STAT__COUNT; k++)
			if (k != FERRY_VERIFY_WORLD && k != FERRY_VERIFY_PROBLEMS)
				rep->s[k] += rep->f[i].s[k];
	*out = rep;
	if (!rep->first)
		return 0;
	uint64_t more = rep->s[FERRY_VERIFY_PROBLEMS] - 1;
	if (!more)
		return ferry__error(rep->first, "%s", rep->msg[0] ? rep->msg[0] : "ckpt verify: out of memory");
	return ferry__error(rep->first, "%s (and %llu more problem%s)", rep->msg[0] ? rep->msg[0] : "out of memory",
			    (unsigned long long)more, more > 1 ? "s" : "");
}

void ferry_ckpt_report_destroy(ferry_ckpt_report *rep)
{
	if (!rep)
		return;
	for (size_t i = 0; i < rep->nf; i++)
		free(rep->f[i].name);
	for (size_t i = 0; i < rep->nmsg; i++)
		free(rep->msg[i]);
	for (size_t i = 0; i < rep->nrp; i++) {
		free(rep->rp[i].name);
		free(rep->rp[i].dtype);
	}
	free(rep->rp);
	free(rep->f);
	free(rep);
}

uint64_t ferry_ckpt_report_stat(const ferry_ckpt_report *rep, enum ferry_verify_stat which)
{
	return rep && (unsigned)which < FERRY_VERIFY_STAT__COUNT ? rep->s[which] : 0;
}

size_t ferry_ckpt_report_files(const ferry_ckpt_report *rep)
{
	return rep ? rep->nf : 0;
}

const char *ferry_ckpt_report_file(const ferry_ckpt_report *rep, size_t i)
{
	return rep && i < rep->nf ? rep->f[i].name : NULL;
}

uint64_t ferry_ckpt_report_file_stat(const ferry_ckpt_report *rep, size_t i, enum ferry_verify_stat which)
{
	return rep && i < rep->nf && (unsigned)which < FERRY_VERIFY_STAT__COUNT ? rep->f[i].s[which] : 0;
}

const char *ferry_ckpt_report_problem(const ferry_ckpt_report *rep, size_t i, int *code)
{
	if (!rep || i >= rep->nmsg)
		return NULL;
	if (code)
		*code = rep->code[i];
	return rep->msg[i] ? rep->msg[i] : "out of memory (the problem's message was lost)";
}

int ferry_ckpt_verify(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums)
{
	ferry_ckpt_report *rep;
	int r = ferry_ckpt_verify_report(ctx, dir, step, require_sums, &rep);
	ferry_ckpt_report_destroy(rep);
	return r;
}

int ferry_ckpt_world(const char *dir, int64_t step)
{
	char sp[PATH_MAX];
	struct manifest m;
	int r = manifest_read(dir, step, -ENOENT, sp, sizeof(sp), &m);
	if (!r && (!m.world || m.world > INT_MAX || m.world != m.n))
		r = ferry__error(FERRY_ECORRUPT, "%s/manifest.json: %zu shards listed for a world of %llu", sp, m.n,
				 (unsigned long long)m.world);
	int world = (int)m.world;
	manifest_free(&m);
	return r ? r : world;
}
