/* safetensors: the strict reader (see include/ferry/safetensors.h for the rules). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "base/byteorder.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "base/json.h"
#include "format/dtype.h"
#include "format/safetensors.h"

/* The dtype a header's "dtype" string names (not NUL-terminated), or -1. */
static int dtype_lookup(const char *s, size_t len)
{
	for (int i = 0; i < FERRY_DT__COUNT; i++)
		if (ferry__dtype_in_safetensors(i) && strlen(ferry_dtype_name(i)) == len &&
		    !memcmp(ferry_dtype_name(i), s, len))
			return i;
	return -1;
}

const char *ferry__st_name_problem(const char *name, size_t len)
{
	if (len == 0)
		return "empty tensor name";
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)name[i];
		if (c == '/' || c == '\\')
			return "tensor name holds a path separator";
		if (c < 0x20 || c == 0x7f)
			return "tensor name holds a control character";
	}
	if (!strcmp(name, "__metadata__"))
		return "tensor named __metadata__";
	return NULL;
}

int ferry__st_nbytes(int dtype, int ndim, const uint64_t *shape, uint64_t *out)
{
	if (!ferry__dtype_in_safetensors(dtype) || ndim < 0 || ndim > FERRY_ST_MAX_DIMS)
		return -EINVAL;
	uint64_t n = 1;
	for (int i = 0; i < ndim; i++)
		if (__builtin_mul_overflow(n, shape[i], &n))
			return -EOVERFLOW;
	if (__builtin_mul_overflow(n, (uint64_t)ferry_dtype_bits(dtype), &n))
		return -EOVERFLOW;
	if (n % 8)
		return -EINVAL;
	*out = n / 8;
	return 0;
}

const char *ferry__st_printable(const char *name, size_t len, char *buf, size_t size)
{
	size_t w = 0;
	for (size_t i = 0; i < len && w + 8 < size; i++) {
		unsigned char c = (unsigned char)name[i];
		if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
			w += (size_t)snprintf(buf + w, size - w, "\\x%02x", c);
		else
			buf[w++] = (char)c;
		if (i + 1 < len && w + 8 >= size) {
			memcpy(buf + w, "...", 4);
			return buf;
		}
	}
	buf[w] = '\0';
	return buf;
}

/* ------------------------------------------------------------------------------------ checksums */

int ferry_xxh3(const void *buf, size_t len, uint64_t *out)
{
	if ((!buf && len) || !out)
		return ferry__error(-EINVAL, "ferry_xxh3: NULL argument");
	*out = ferry__xxh3_64(buf, len);
	return 0;
}

int ferry__hex64(const char *s, uint64_t *out)
{
	return ferry__hex_digits(s, 16, out) || s[16] ? -1 : 0;
}

/* --------------------------------------------------------------------------------------- parser */

struct st_tensor {
	const char *name;
	size_t name_len;
	size_t pos; /* header offset of the name, for messages */
	int dtype;
	int ndim;
	size_t dims; /* index into st->dims */
	uint64_t begin, end;
};

struct st_meta {
	const char *key, *value;
	size_t key_len, pos;
};

struct ferry_st {
	char *path;
	ferry_ctx *ctx;
	ferry_file *file;
	ferry_cz *cz; /* a compressed file holding the safetensors bytes (then file is NULL) */
	char *hdr;
	uint64_t hdr_len, file_size;
	struct st_tensor *t;
	size_t n, cap;
	uint64_t *dims;
	size_t ndims, dcap;
	struct st_meta *meta;
	size_t nmeta, mcap;
	size_t *by_name;
};


/* FERRY_ECORRUPT naming file, absolute byte offset and the reason. */
static int corrupt(const ferry_st *st, uint64_t hdr_pos, const char *fmt, ...) FERRY__PRINTF(3, 4);
static int corrupt(const ferry_st *st, uint64_t hdr_pos, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte %llu: %s", st->path,
			    (unsigned long long)(8 + hdr_pos), msg);
}

static int json_corrupt(const ferry_st *st, const struct ferry__json *j, const char *where)
{
	return corrupt(st, j->err_pos, "%s%s%s", where, *where ? ": " : "", j->err ? j->err : "invalid JSON");
}

static int parse_metadata(ferry_st *st, struct ferry__json *j)
{
	char *k, *v;
	size_t kl, vl, kpos;
	int r;
	if (ferry__json_peek(j) != '{')
		return corrupt(st, j->pos, "__metadata__: expected an object of strings");
	if (ferry__json_object_begin(j))
		return json_corrupt(st, j, "__metadata__");
	while ((r = ferry__json_object_next(j, &k, &kl, &kpos)) == 1) {
		if (ferry__json_peek(j) != '"')
			return corrupt(st, j->pos, "__metadata__ value of \"%.64s\": not a string", k);
		if (ferry__json_string(j, &v, &vl))
			return json_corrupt(st, j, "__metadata__");
		if (ferry__grow((void **)&st->meta, &st->mcap, st->nmeta + 1, sizeof(*st->meta)))
			return ferry__error(-ENOMEM, "%s: safetensors metadata", st->path);
		st->meta[st->nmeta++] = (struct st_meta){k, v, kl, kpos};
	}
	return r < 0 ? json_corrupt(st, j, "__metadata__") : 0;
}

static int parse_tensor(ferry_st *st, struct ferry__json *j, char *name, size_t name_len, size_t npos)
{
	char pn[96], *k, *s;
	size_t kl, sl, kpos;
	int r, seen = 0;
	struct st_tensor t = {.name = name, .name_len = name_len, .pos = npos, .dtype = -1};
	const char *why = ferry__st_name_problem(name, name_len);

	ferry__st_printable(name, name_len, pn, sizeof(pn));
	if (why)
		return corrupt(st, npos, "tensor \"%s\": %s", pn, why);
	if (ferry__json_peek(j) != '{')
		return corrupt(st, j->pos, "tensor \"%s\": expected an object", pn);
	if (ferry__json_object_begin(j))
		return json_corrupt(st, j, pn);
	while ((r = ferry__json_object_next(j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "dtype") && kl == 5) {
			if (seen & 1)
				return corrupt(st, kpos, "tensor \"%s\": duplicate field \"dtype\"", pn);
			seen |= 1;
			if (ferry__json_peek(j) != '"')
				return corrupt(st, j->pos, "tensor \"%s\" field \"dtype\": not a string", pn);
			size_t vpos = j->pos;
			if (ferry__json_string(j, &s, &sl))
				return json_corrupt(st, j, pn);
			t.dtype = dtype_lookup(s, sl);
			if (t.dtype < 0)
				return corrupt(st, vpos, "tensor \"%s\" field \"dtype\": unknown dtype \"%.32s\"", pn, s);
		} else if (!strcmp(k, "shape") && kl == 5) {
			if (seen & 2)
				return corrupt(st, kpos, "tensor \"%s\": duplicate field \"shape\"", pn);
			seen |= 2;
			if (ferry__json_peek(j) != '[')
				return corrupt(st, j->pos, "tensor \"%s\" field \"shape\": not an array", pn);
			if (ferry__json_array_begin(j))
				return json_corrupt(st, j, pn);
			t.dims = st->ndims;
			while ((r = ferry__json_array_next(j)) == 1) {
				uint64_t d;
				if (t.ndim >= FERRY_ST_MAX_DIMS)
					return corrupt(st, j->pos, "tensor \"%s\" field \"shape\": more than %d dimensions",
						       pn, FERRY_ST_MAX_DIMS);
				if (ferry__json_uint(j, &d))
					return json_corrupt(st, j, "field \"shape\"");
				if (ferry__grow((void **)&st->dims, &st->dcap, st->ndims + 1, sizeof(*st->dims)))
					return ferry__error(-ENOMEM, "%s: safetensors shapes", st->path);
				st->dims[st->ndims++] = d;
				t.ndim++;
			}
			if (r < 0)
				return json_corrupt(st, j, "field \"shape\"");
		} else if (!strcmp(k, "data_offsets") && kl == 12) {
			if (seen & 4)
				return corrupt(st, kpos, "tensor \"%s\": duplicate field \"data_offsets\"", pn);
			seen |= 4;
			size_t apos = j->pos;
			if (ferry__json_peek(j) != '[')
				return corrupt(st, j->pos, "tensor \"%s\" field \"data_offsets\": not an array", pn);
			if (ferry__json_array_begin(j) || ferry__json_array_next(j) != 1 ||
			    ferry__json_uint(j, &t.begin) || ferry__json_array_next(j) != 1 ||
			    ferry__json_uint(j, &t.end) || ferry__json_array_next(j) != 0) {
				if (j->err)
					return json_corrupt(st, j, "field \"data_offsets\"");
				return corrupt(st, apos, "tensor \"%s\" field \"data_offsets\": not two integers", pn);
			}
		} else {
			char pk[64];
			return corrupt(st, kpos, "tensor \"%s\": unknown field \"%s\"", pn,
				       ferry__st_printable(k, kl, pk, sizeof(pk)));
		}
	}
	if (r < 0)
		return json_corrupt(st, j, pn);
	if (seen != 7)
		return corrupt(st, npos, "tensor \"%s\": missing field \"%s\"", pn,
			       !(seen & 1) ? "dtype" : !(seen & 2) ? "shape" : "data_offsets");
	if (ferry__grow((void **)&st->t, &st->cap, st->n + 1, sizeof(*st->t)))
		return ferry__error(-ENOMEM, "%s: safetensors tensors", st->path);
	st->t[st->n++] = t;
	return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

static int name_cmp(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);
	if (c)
		return c;
	return al < bl ? -1 : al > bl;
}

static int cmp_by_name(const void *a, const void *b, void *arg)
{
	const ferry_st *sort_st = arg;
	const struct st_tensor *x = &sort_st->t[*(const size_t *)a], *y = &sort_st->t[*(const size_t *)b];
	return name_cmp(x->name, x->name_len, y->name, y->name_len);
}

static int cmp_meta(const void *a, const void *b)
{
	const struct st_meta *x = a, *y = b;
	int c = name_cmp(x->key, x->key_len, y->key, y->key_len);
	return c ? c : (x->pos < y->pos ? -1 : 1);
}

static int validate(ferry_st *st)
{
	char pn[96];
	uint64_t at = 0;

	if (st->n > 1)
		qsort(st->t, st->n, sizeof(*st->t), cmp_offsets);
	for (size_t i = 0; i < st->n; i++) {
		struct st_tensor *t = &st->t[i];
		uint64_t nb;
		ferry__st_printable(t->name, t->name_len, pn, sizeof(pn));
		if (t->end < t->begin)
			return corrupt(st, t->pos, "tensor \"%s\" field \"data_offsets\": end %llu before begin %llu",
				       pn, (unsigned long long)t->end, (unsigned long long)t->begin);
		if (t->begin != at)
			return corrupt(st, t->pos, "tensor \"%s\" field \"data_offsets\": begins at %llu, expected %llu (%s)",
				       pn, (unsigned long long)t->begin, (unsigned long long)at,
				       t->begin < at ? "overlaps the previous tensor" : "hole before it");
		/* scalars have no dims and st->dims may still be NULL: no pointer arithmetic on it */
		int r = ferry__st_nbytes(t->dtype, t->ndim, t->ndim ? st->dims + t->dims : NULL, &nb);
		if (r == -EOVERFLOW)
			return corrupt(st, t->pos, "tensor \"%s\" field \"shape\": byte size overflows 64 bits", pn);
		if (r)
			return corrupt(st, t->pos, "tensor \"%s\" field \"shape\": %s elements are not a whole number of bytes",
				       pn, ferry_dtype_name(t->dtype));
		if (t->end - t->begin != nb)
			return corrupt(st, t->pos, "tensor \"%s\" field \"data_offsets\": %llu bytes, but dtype and shape make %llu",
				       pn, (unsigned long long)(t->end - t->begin), (unsigned long long)nb);
		at = t->end;
	}
	uint64_t data_start = 8 + st->hdr_len;
	if (at > st->file_size - data_start || data_start + at != st->file_size)
		return corrupt(st, st->hdr_len, "data section is %llu bytes by the header but %llu in the file (%s)",
			       (unsigned long long)at, (unsigned long long)(st->file_size - data_start),
			       at > st->file_size - data_start ? "truncated" : "trailing bytes");

	st->by_name = malloc((st->n ? st->n : 1) * sizeof(*st->by_name));
	if (!st->by_name)
		return ferry__error(-ENOMEM, "%s: safetensors index", st->path);
	for (size_t i = 0; i < st->n; i++)
		st->by_name[i] = i;
	if (st->n > 1)
		qsort_r(st->by_name, st->n, sizeof(*st->by_name), cmp_by_name, st);
	for (size_t i = 1; i < st->n; i++) {
		struct st_tensor *a = &st->t[st->by_name[i - 1]], *b = &st->t[st->by_name[i]];
		if (!name_cmp(a->name, a->name_len, b->name, b->name_len))
			return corrupt(st, a->pos > b->pos ? a->pos : b->pos, "duplicate tensor name \"%s\"",
				       ferry__st_printable(b->name, b->name_len, pn, sizeof(pn)));
	}
	/* Metadata keeps file order for listing; a sorted copy finds duplicates. */
	if (st->nmeta > 1) {
		struct st_meta *m = malloc(st->nmeta * sizeof(*m));
		if (!m)
			return ferry__error(-ENOMEM, "%s: safetensors metadata", st->path);
		memcpy(m, st->meta, st->nmeta * sizeof(*m));
		qsort(m, st->nmeta, sizeof(*m), cmp_meta);
		for (size_t i = 1; i < st->nmeta; i++)
			if (!name_cmp(m[i - 1].key, m[i - 1].key_len, m[i].key, m[i].key_len)) {
				size_t pos = m[i].pos;
				ferry__st_printable(m[i].key, m[i].key_len, pn, sizeof(pn));
				free(m);
				return corrupt(st, pos, "__metadata__: duplicate key \"%s\"", pn);
			}
		free(m);
	}
	return 0;
}

static int parse_header(ferry_st *st)
{
	struct ferry__json j;
	char *k;
	size_t kl, kpos;
	int r, have_meta = 0;

	if (st->hdr_len == 0 || st->hdr[0] != '{')
		return corrupt(st, 0, "header does not start with '{'");
	if (ferry__json_init(&j, st->hdr, st->hdr_len))
		return json_corrupt(st, &j, "header");
	if (ferry__json_object_begin(&j))
		return json_corrupt(st, &j, "header");
	while ((r = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (kl == 12 && !strcmp(k, "__metadata__")) {
			if (have_meta++)
				return corrupt(st, kpos, "duplicate key \"__metadata__\"");
			r = parse_metadata(st, &j);
		} else {
			r = parse_tensor(st, &j, k, kl, kpos);
		}
		if (r)
			return r;
	}
	if (r < 0 || ferry__json_end(&j))
		return json_corrupt(st, &j, "header");
	return validate(st);
}

void ferry_st_destroy(ferry_st *st)
{
	if (!st)
		return;
	ferry_file_destroy(st->file);
	ferry_cz_destroy(st->cz);
	free(st->path);
	free(st->hdr);
	free(st->t);
	free(st->dims);
	free(st->meta);
	free(st->by_name);
	free(st);
}

static ferry_st *st_new(const char *path)
{
	ferry_st *st = calloc(1, sizeof(*st));
	if (!st)
		return NULL;
	st->path = strdup(path ? path : "(memory)");
	if (!st->path) {
		free(st);
		return NULL;
	}
	return st;
}

/* Checks the 8-byte length against the file size; sets hdr_len. */
static int check_prefix(ferry_st *st, const unsigned char *p, size_t have)
{
	if (st->file_size < 8 || have < 8)
		return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte 0: file of %llu bytes is shorter than the 8-byte header length",
				    st->path, (unsigned long long)st->file_size);
	uint64_t n = ferry__rd64(p);
	if (n > FERRY__ST_MAX_HEADER)
		return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte 0: header length %llu exceeds the limit of %llu bytes",
				    st->path, (unsigned long long)n, FERRY__ST_MAX_HEADER);
	if (n > st->file_size - 8)
		return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte 0: header length %llu runs past the end of the %llu-byte file",
				    st->path, (unsigned long long)n, (unsigned long long)st->file_size);
	st->hdr_len = n;
	return 0;
}

int ferry__st_parse(const void *buf, size_t len, uint64_t file_size, const char *name, ferry_st **out)
{
	*out = NULL;
	ferry_st *st = st_new(name);
	if (!st)
		return ferry__error(-ENOMEM, "safetensors: out of memory");
	st->file_size = file_size;
	int r = check_prefix(st, buf, len);
	if (!r && st->hdr_len > len - 8)
		r = ferry__error(FERRY_ECORRUPT, "%s: safetensors byte %zu: header truncated (%llu bytes expected)",
				 st->path, len, (unsigned long long)st->hdr_len);
	if (!r) {
		st->hdr = malloc(st->hdr_len + 1);
		if (!st->hdr)
			r = ferry__error(-ENOMEM, "%s: header of %llu bytes", st->path, (unsigned long long)st->hdr_len);
	}
	if (!r) {
		memcpy(st->hdr, (const char *)buf + 8, st->hdr_len);
		r = parse_header(st);
	}
	if (r) {
		ferry_st_destroy(st);
		return r;
	}
	*out = st;
	return 0;
}

/* Refuses what is not a regular file before any open: opening a FIFO blocks until a writer comes. */
static int reject_special(const char *path)
{
	struct stat sb;
	if (stat(path, &sb) < 0 || S_ISREG(sb.st_mode))
		return 0; /* the open names the error */
	const char *what = S_ISDIR(sb.st_mode)	  ? "a directory"
			   : S_ISFIFO(sb.st_mode) ? "a FIFO (named pipe)"
			   : S_ISSOCK(sb.st_mode) ? "a socket"
			   : S_ISCHR(sb.st_mode)  ? "a character device"
			   : S_ISBLK(sb.st_mode)  ? "a block device"
						  : "not a regular file";
	return ferry__error(S_ISDIR(sb.st_mode) ? -EISDIR : -EINVAL, "%s: is %s; safetensors are read from regular files",
			    path, what);
}

int ferry_st_open(ferry_ctx *ctx, const char *path, ferry_st **out)
{
	unsigned char pre[8];
	*out = NULL;
	ferry_st *st = st_new(path);
	if (!st)
		return ferry__error(-ENOMEM, "safetensors: out of memory");
	st->ctx = ctx;
	int r = reject_special(path);
	if (r)
		goto fail;
	r = ferry_file_open(ctx, path, FERRY_O_RDONLY, &st->file);
	int64_t size = r ? r : ferry_file_size(st->file);
	ssize_t got = 0;
	if (size < 0) {
		r = (int)size;
		goto fail;
	}
	st->file_size = (uint64_t)size;
	got = size >= 8 ? ferry_pread(st->file, pre, 8, 0) : 0;
	if (got < 0) {
		r = (int)got;
		goto fail;
	}
	/* A ferry compressed file (docs/FORMATS.md) starts with a zstd or LZ4 frame's magic, which as
	 * a header length (>= 0x184D2204) exceeds the format's limit: no safetensors file is taken for
	 * one. Its bytes are a safetensors file's, read through the compressed reader; a damaged or
	 * truncated one fails with the compressed reader's error (the file, the chunk, the field). */
	if (got >= 4 && (ferry__rd32(pre) == 0xFD2FB528u || ferry__rd32(pre) == 0x184D2204u)) {
		ferry_file_destroy(st->file);
		st->file = NULL;
		if ((r = ferry_cz_open(ctx, path, &st->cz)))
			goto fail;
		size = ferry_cz_size(st->cz);
		st->file_size = (uint64_t)size;
		got = size >= 8 ? ferry_cz_pread(st->cz, pre, 8, 0) : 0;
		if (got < 0) {
			r = (int)got;
			goto fail;
		}
	}
	if ((r = check_prefix(st, pre, (size_t)got)))
		goto fail;
	st->hdr = malloc(st->hdr_len + 1);
	if (!st->hdr) {
		r = ferry__error(-ENOMEM, "%s: header of %llu bytes", path, (unsigned long long)st->hdr_len);
		goto fail;
	}
	got = st->cz ? ferry_cz_pread(st->cz, st->hdr, st->hdr_len, 8) : ferry_pread(st->file, st->hdr, st->hdr_len, 8);
	if (got >= 0 && (uint64_t)got != st->hdr_len)
		got = ferry__error(FERRY_ECORRUPT, "%s: safetensors byte %lld: file shrank while its header was read",
				   path, (long long)(8 + got));
	if (got < 0) {
		r = (int)got;
		goto fail;
	}
	if ((r = parse_header(st)))
		goto fail;
	*out = st;
	return 0;
fail:
	ferry_st_destroy(st);
	return r;
}

const char *ferry_st_path(const ferry_st *st)
{
	return st->path;
}
ferry_file *ferry_st_file(ferry_st *st)
{
	return st->file;
}
ferry_cz *ferry__st_cz(ferry_st *st)
{
	return st->cz;
}
uint64_t ferry_st_data_start(const ferry_st *st)
{
	return 8 + st->hdr_len;
}
size_t ferry_st_count(const ferry_st *st)
{
	return st->n;
}

int ferry_st_find(const ferry_st *st, const char *name)
{
	size_t lo = 0, hi = st->n, len = strlen(name);
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct st_tensor *t = &st->t[st->by_name[mid]];
		int c = name_cmp(t->name, t->name_len, name, len);
		if (!c)
			return (int)st->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -ENOENT;
}

const char *ferry_st_name(const ferry_st *st, size_t i)
{
	return i < st->n ? st->t[i].name : NULL;
}
enum ferry_dtype ferry_st_dtype(const ferry_st *st, size_t i)
{
	return i < st->n ? st->t[i].dtype : FERRY_DT_INVALID;
}
int ferry_st_shape(const ferry_st *st, size_t i, uint64_t *dims, int max)
{
	if (i >= st->n)
		return -1;
	for (int d = 0; dims && d < max && d < st->t[i].ndim; d++)
		dims[d] = st->dims[st->t[i].dims + (size_t)d];
	return st->t[i].ndim;
}
uint64_t ferry_st_offset(const ferry_st *st, size_t i)
{
	return i < st->n ? 8 + st->hdr_len + st->t[i].begin : 0;
}
uint64_t ferry_st_nbytes(const ferry_st *st, size_t i)
{
	return i < st->n ? st->t[i].end - st->t[i].begin : 0;
}
size_t ferry_st_metadata_count(const ferry_st *st)
{
	return st->nmeta;
}
const char *ferry_st_metadata_key(const ferry_st *st, size_t i)
{
	return i < st->nmeta ? st->meta[i].key : NULL;
}
const char *ferry_st_metadata_value(const ferry_st *st, size_t i)
{
	return i < st->nmeta ? st->meta[i].value : NULL;
}
const char *ferry_st_metadata_get(const ferry_st *st, const char *key)
{
	size_t len = strlen(key);
	for (size_t i = 0; i < st->nmeta; i++)
		if (st->meta[i].key_len == len && !memcmp(st->meta[i].key, key, len))
			return st->meta[i].value;
	return NULL;
}

/* ------------------------------------------------------------------------------------- reading */

static ssize_t read_exact(ferry_st *st, void *buf, size_t len, uint64_t off)
{
	if (!st->file && !st->cz)
		return ferry__error(-EBADF, "%s: parsed from memory, no file to read", st->path);
	ssize_t got = st->cz ? ferry_cz_pread(st->cz, buf, len, off) : ferry_pread(st->file, buf, len, off);
	if (got >= 0 && (size_t)got != len)
		return ferry__error(FERRY_ECORRUPT, "%s: safetensors byte %llu: file ends early (shrank after it was opened?)",
				    st->path, (unsigned long long)(off + (uint64_t)got));
	return got;
}

ssize_t ferry_st_read(ferry_st *st, size_t i, void *buf, size_t len)
{
	if (i >= st->n)
		return ferry__error(-EINVAL, "%s: no tensor %zu", st->path, i);
	uint64_t nb = ferry_st_nbytes(st, i);
	if (len < nb)
		return ferry__error(-EINVAL, "%s: tensor \"%s\" is %llu bytes, buffer %zu", st->path, st->t[i].name,
				    (unsigned long long)nb, len);
	return nb ? read_exact(st, buf, nb, ferry_st_offset(st, i)) : 0;
}

/* Geometry of a slice: `outer` rows of `piece` bytes, `stride` bytes apart, the first at `first`. */
struct slice_geo {
	uint64_t outer, piece, stride, first;
};

static int slice_geometry(const ferry_st *st, size_t i, int dim, uint64_t start, uint64_t stop,
			  struct slice_geo *g)
{
	const struct st_tensor *t = &st->t[i];
	if (dim < 0 || dim >= t->ndim) /* a scalar has no dimension to slice (and no dims) */
		return ferry__error(-EINVAL, "%s: tensor \"%s\": no dimension %d to slice (it has %d)",
				    st->path, t->name, dim, t->ndim);
	const uint64_t *d = st->dims + t->dims;
	if (start > stop || stop > d[dim])
		return ferry__error(-EINVAL, "%s: tensor \"%s\": slice [%llu, %llu) of dimension %d is out of range",
				    st->path, t->name, (unsigned long long)start, (unsigned long long)stop, dim);
	/* Overflow is impossible: every product here divides the tensor's validated bit size. */
	uint64_t outer = 1, inner = (uint64_t)ferry_dtype_bits(t->dtype);
	for (int k = 0; k < dim; k++)
		outer *= d[k];
	for (int k = dim + 1; k < t->ndim; k++)
		inner *= d[k];
	uint64_t piece = (stop - start) * inner, stride = d[dim] * inner, first = start * inner;
	if (piece % 8 || stride % 8 || first % 8)
		return ferry__error(-EINVAL, "%s: tensor \"%s\": slice of %s elements does not fall on byte boundaries",
				    st->path, t->name, ferry_dtype_name(t->dtype));
	g->outer = outer;
	g->piece = piece / 8;
	g->stride = stride / 8;
	g->first = first / 8;
	return 0;
}

int ferry__st_slice_shape(const ferry_st *st, size_t i, int dim, uint64_t start, uint64_t stop,
			  uint64_t *nbytes)
{
	struct slice_geo g;
	int r = slice_geometry(st, i, dim, start, stop, &g);
	if (!r)
		*nbytes = g.outer * g.piece;
	return r;
}

#define GATHER_WINDOW (64u << 20)

ssize_t ferry_st_read_slice(ferry_st *st, size_t i, int dim, uint64_t start, uint64_t stop, void *buf,
			    size_t len)
{
	struct slice_geo g;
	if (i >= st->n)
		return ferry__error(-EINVAL, "%s: no tensor %zu", st->path, i);
	int r = slice_geometry(st, i, dim, start, stop, &g);
	if (r)
		return r;
	uint64_t total = g.outer * g.piece, base = ferry_st_offset(st, i);
	if (len < total)
		return ferry__error(-EINVAL, "%s: slice of \"%s\" is %llu bytes, buffer %zu", st->path, st->t[i].name,
				    (unsigned long long)total, len);
	if (total == 0)
		return 0;
	if (g.outer == 1 || g.piece == g.stride)
		return read_exact(st, buf, total, base + g.first);
	if (g.piece >= (1u << 20)) {
		ferry_batch *b;
		if ((r = ferry_batch_create(st->ctx, &b)))
			return r;
		for (uint64_t k = 0; k < g.outer && r >= 0; k++)
			r = ferry_batch_add_read(b, st->file, base + k * g.stride + g.first, g.piece,
						 (char *)buf + k * g.piece);
		if (r >= 0)
			r = ferry_batch_submit(b);
		if (r >= 0)
			r = ferry_batch_wait(b, -1);
		if (r > 0)
			r = ferry__error(FERRY_ECORRUPT, "%s: file ends early", st->path);
		ferry_batch_destroy(b);
		return r < 0 ? r : (ssize_t)total;
	}
	/* Small rows: read whole spans of rows through host memory and gather. */
	int dev = -1;
	enum ferry_mem_kind kind = ferry_mem_kind(buf, &dev);
	int on_dev = kind == FERRY_MEM_DEVICE;
	uint64_t rows = GATHER_WINDOW / g.stride;
	if (rows == 0)
		rows = 1;
	size_t span_cap = (size_t)(rows * g.stride), out_cap = (size_t)(rows * g.piece);
	char *span = ferry_alloc_aligned(span_cap);
	char *stage = on_dev ? ferry_alloc_aligned(out_cap) : NULL;
	if (!span || (on_dev && !stage)) {
		ferry_free_aligned(span, span_cap);
		ferry_free_aligned(stage, out_cap);
		return ferry__error(-ENOMEM, "%s: slice staging of %zu bytes", st->path, span_cap);
	}
	ssize_t res = (ssize_t)total;
	for (uint64_t k = 0; k < g.outer; k += rows) {
		uint64_t nr = g.outer - k < rows ? g.outer - k : rows;
		uint64_t span_len = (nr - 1) * g.stride + g.piece;
		ssize_t got = read_exact(st, span, span_len, base + k * g.stride + g.first);
		if (got < 0) {
			res = got;
			break;
		}
		char *dst = on_dev ? stage : (char *)buf + k * g.piece;
		for (uint64_t q = 0; q < nr; q++)
			memcpy(dst + q * g.piece, span + q * g.stride, g.piece);
		if (on_dev && (r = ferry_gpu_memcpy_htod((char *)buf + k * g.piece, stage, nr * g.piece))) {
			res = r;
			break;
		}
	}
	ferry_free_aligned(span, span_cap);
	ferry_free_aligned(stage, out_cap);
	return res;
}

int ferry_st_verify(ferry_st *st, size_t i)
{
	char key[4096];
	uint64_t want, got;
	if (i >= st->n)
		return ferry__error(-EINVAL, "%s: no tensor %zu", st->path, i);
	snprintf(key, sizeof(key), "%s%s", FERRY_ST_CHECKSUM_PREFIX, st->t[i].name);
	const char *v = ferry_st_metadata_get(st, key);
	if (!v && st->cz) { /* every chunk holds the XXH3 of its bytes: the tensor's are checked as read */
		uint64_t nb = ferry_st_nbytes(st, i), off = ferry_st_offset(st, i);
		size_t cap = nb < (16u << 20) ? (size_t)nb + 1 : (16u << 20);
		char *b = malloc(cap);
		int sr = b ? ferry_cz_set(st->cz, "cz_verify", "1") : ferry__error(-ENOMEM, "%s: verify", st->path);
		for (uint64_t done = 0; !sr && done < nb;) {
			size_t n = nb - done < cap ? (size_t)(nb - done) : cap;
			ssize_t rd = read_exact(st, b, n, off + done);
			sr = rd < 0 ? (int)rd : 0;
			done += n;
		}
		free(b);
		return sr ? sr : 1;
	}
	if (!v)
		return 0;
	if (ferry__hex64(v, &want))
		return ferry__error(FERRY_ECORRUPT, "%s: __metadata__ \"%s\": \"%.32s\" is not 16 hex digits", st->path, key, v);
	struct ferry__xxh3 *h = ferry__xxh3_create();
	uint64_t nb = ferry_st_nbytes(st, i), off = ferry_st_offset(st, i);
	size_t cap = nb < (16u << 20) ? (size_t)nb + 1 : (16u << 20);
	char *b = ferry_alloc_aligned(cap);
	if (!h || !b) {
		ferry__xxh3_destroy(h);
		ferry_free_aligned(b, cap);
		return ferry__error(-ENOMEM, "%s: verify", st->path);
	}
	ssize_t r = 0;
	for (uint64_t done = 0; done < nb; done += (uint64_t)r) {
		size_t n = nb - done < cap ? (size_t)(nb - done) : cap;
		r = read_exact(st, b, n, off + done);
		if (r < 0)
			break;
		ferry__xxh3_update(h, b, n);
	}
	got = ferry__xxh3_digest(h);
	ferry__xxh3_destroy(h);
	ferry_free_aligned(b, cap);
	if (r < 0)
		return (int)r;
	if (got != want)
		return ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\" (bytes %llu..%llu): xxh3 %016llx, stored %016llx",
				    st->path, st->t[i].name, (unsigned long long)off, (unsigned long long)(off + nb),
				    (unsigned long long)got, (unsigned long long)want);
	return 1;
}
