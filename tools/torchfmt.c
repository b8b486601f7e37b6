/* torch.save zips, their data.pkl, and DCP's .metadata read without Python (ferry_torchfmt.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/ferry.h"
#include "ferry_torchfmt.h"

/* ------------------------------------------------------------------------------------------ crc32 */

static uint32_t crc_table[8][256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

uint32_t ferry_tf_crc32(uint32_t crc, const void *buf, size_t len)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, crc_init);
	const uint8_t *p = buf;
	crc = ~crc;
	while (len >= 8) { /* slicing-by-8 */
		uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
		crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF] ^
		      crc_table[4][a >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
		      crc_table[0][p[7]];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
	return ~crc;
}

/* -------------------------------------------------------------------------------------------- zip */

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int read_exact(const char *name, uint64_t base, ferry_tf_read_fn rd, void *u, uint64_t off, void *buf,
		      size_t n, const char *what)
{
	int64_t got = rd(u, off, buf, n);
	if (got < 0)
		return ferry__error((int)got, "%s: offset %" PRIu64 ": %s: read failed", name, base + off, what);
	if ((size_t)got != n)
		return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": %s: %zu bytes wanted, the file ends after %" PRId64
				    " (truncated?)", name, base + off, what, n, got);
	return 0;
}

void ferry_tf_zip_free(struct ferry_tf_zip *z)
{
	if (!z)
		return;
	for (size_t i = 0; i < z->n; i++)
		free(z->rec[i].name);
	free(z->rec);
	memset(z, 0, sizeof(*z));
}

int ferry_tf_zip_parse(const char *name, uint64_t base, uint64_t length, ferry_tf_read_fn rd, void *u,
		       struct ferry_tf_zip *out)
{
	memset(out, 0, sizeof(*out));
	if (length < 22)
		return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": zip: %" PRIu64 " bytes, too short for a zip "
				    "(truncated?)", name, base, length);
	/* The end record lies in the last 22 + 65535 (comment) bytes. */
	size_t tail_n = length < 22 + 65535 ? (size_t)length : 22 + 65535;
	uint8_t *tail = malloc(tail_n), *cd = NULL;
	if (!tail)
		return ferry__error(-ENOMEM, "%s: out of memory", name);
	uint64_t tail_at = length - tail_n;
	int r = read_exact(name, base, rd, u, tail_at, tail, tail_n, "zip end records");
	if (r)
		goto out;
	size_t at = tail_n - 22 + 1;
	while (at-- > 0)
		if (!memcmp(tail + at, "PK\x05\x06", 4))
			break;
	if (at == (size_t)-1) {
		r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": end of central directory: not found in the last "
				 "%zu bytes (truncated, or not a zip)", name, base + tail_at, tail_n);
		goto out;
	}
	uint64_t eocd = tail_at + at, count = le16(tail + at + 10), cd_size = le32(tail + at + 12),
		 cd_off = le32(tail + at + 16);
	if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
		uint8_t loc[20], e64[56];
		if (eocd < 20 || (r = read_exact(name, base, rd, u, eocd - 20, loc, 20, "zip64 locator")))
			goto bad64;
		if (memcmp(loc, "PK\x06\x07", 4))
			goto bad64;
		uint64_t e64_at = le64(loc + 8);
		if (e64_at > eocd - 20 || eocd - 20 - e64_at < 56) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": zip64 end record: at offset %" PRIu64
					 ", not before the locator", name, base + eocd - 20, base + e64_at);
			goto out;
		}
		if ((r = read_exact(name, base, rd, u, e64_at, e64, 56, "zip64 end record")))
			goto out;
		if (memcmp(e64, "PK\x06\x06", 4)) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": zip64 end record: bad signature", name,
					 base + e64_at);
			goto out;
		}
		count = le64(e64 + 32);
		cd_size = le64(e64 + 40);
		cd_off = le64(e64 + 48);
		eocd = e64_at;
		goto parsed;
	bad64:
		if (!r)
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": zip64 locator: missing where the end record "
					 "says the archive is zip64", name, base + (eocd >= 20 ? eocd - 20 : 0));
		goto out;
	}
parsed:
	if (cd_off > eocd || cd_size > eocd - cd_off) {
		r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": central directory: offset %" PRIu64 " + size %" PRIu64
				 " runs past the end records at %" PRIu64 " (truncated?)", name, base + eocd, base + cd_off,
				 cd_size, base + eocd);
		goto out;
	}
	if (count > cd_size / 46) {
		r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": central directory: %" PRIu64 " entries cannot fit "
				 "in %" PRIu64 " bytes", name, base + eocd, count, cd_size);
		goto out;
	}
	cd = malloc(cd_size ? (size_t)cd_size : 1);
	out->rec = calloc(count ? (size_t)count : 1, sizeof(*out->rec));
	if (!cd || !out->rec) {
		r = ferry__error(-ENOMEM, "%s: out of memory", name);
		goto out;
	}
	if ((r = read_exact(name, base, rd, u, cd_off, cd, (size_t)cd_size, "central directory")))
		goto out;
	size_t p = 0;
	for (uint64_t i = 0; i < count; i++) {
		uint64_t e = cd_off + p;
		if (cd_size - p < 46 || memcmp(cd + p, "PK\x01\x02", 4)) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": central directory entry %" PRIu64 ": bad "
					 "signature", name, base + e, i);
			goto out;
		}
		struct ferry_tf_record *rec = &out->rec[out->n];
		rec->method = le16(cd + p + 10);
		rec->crc = le32(cd + p + 16);
		uint64_t csize = le32(cd + p + 20);
		rec->size = le32(cd + p + 24);
		size_t nlen = le16(cd + p + 28), xlen = le16(cd + p + 30), clen = le16(cd + p + 32);
		rec->header = le32(cd + p + 42);
		if (cd_size - p - 46 < nlen + xlen + clen) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": central directory entry %" PRIu64 ": name and "
					 "extra fields run past the directory", name, base + e, i);
			goto out;
		}
		const uint8_t *x = cd + p + 46 + nlen;
		for (size_t k = 0; k + 4 <= xlen;) { /* the zip64 extra field: the values that are 0xFFFFFFFF */
			size_t tag = le16(x + k), ln = le16(x + k + 2), v = k + 4;
			if (k + 4 + ln > xlen)
				break;
			if (tag == 1) {
				if (rec->size == 0xFFFFFFFF && v + 8 <= k + 4 + ln)
					rec->size = le64(x + v), v += 8;
				if (csize == 0xFFFFFFFF && v + 8 <= k + 4 + ln)
					csize = le64(x + v), v += 8;
				if (rec->header == 0xFFFFFFFF && v + 8 <= k + 4 + ln)
					rec->header = le64(x + v), v += 8;
				break;
			}
			k += 4 + ln;
		}
		rec->name = malloc(nlen + 1);
		if (!rec->name) {
			r = ferry__error(-ENOMEM, "%s: out of memory", name);
			goto out;
		}
		memcpy(rec->name, cd + p + 46, nlen);
		rec->name[nlen] = '\0';
		out->n++;
		if (memchr(rec->name, '\0', nlen)) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": central directory entry %" PRIu64 ": a NUL in "
					 "the name", name, base + e, i);
			goto out;
		}
		if (rec->method != 0) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: compressed (method %d); torch.save "
					 "records are stored", name, base + e, rec->name, rec->method);
			goto out;
		}
		if (csize != rec->size) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: stored size %" PRIu64 " differs from "
					 "its size %" PRIu64, name, base + e, rec->name, csize, rec->size);
			goto out;
		}
		uint8_t lh[30];
		if (rec->header > cd_off || cd_off - rec->header < 30) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: local header at offset %" PRIu64
					 " is not before the central directory", name, base + e, rec->name, base + rec->header);
			goto out;
		}
		if ((r = read_exact(name, base, rd, u, rec->header, lh, 30, "local header")))
			goto out;
		if (memcmp(lh, "PK\x03\x04", 4)) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: no local header there", name,
					 base + rec->header, rec->name);
			goto out;
		}
		rec->data = rec->header + 30 + le16(lh + 26) + le16(lh + 28);
		if (rec->data > cd_off || rec->size > cd_off - rec->data) {
			r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: %" PRIu64 " bytes of data run past "
					 "the central directory at %" PRIu64 " (truncated, or a record past the end)", name,
					 base + rec->data, rec->name, rec->size, base + cd_off);
			goto out;
		}
		p += 46 + nlen + xlen + clen;
	}
	if (!out->n) {
		r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": zip: no records", name, base + eocd);
		goto out;
	}
	const char *slash = strchr(out->rec[0].name, '/');
	out->prefix_len = slash ? (size_t)(slash - out->rec[0].name) + 1 : 0;
out:
	free(tail);
	free(cd);
	if (r)
		ferry_tf_zip_free(out);
	return r;
}

const struct ferry_tf_record *ferry_tf_zip_find(const struct ferry_tf_zip *z, const char *name)
{
	for (size_t i = 0; i < z->n; i++)
		if (strlen(z->rec[i].name) >= z->prefix_len && !strncmp(z->rec[i].name, z->rec[0].name, z->prefix_len) &&
		    !strcmp(z->rec[i].name + z->prefix_len, name))
			return &z->rec[i];
	return NULL;
}

int ferry_tf_zip_read(const char *name, const struct ferry_tf_zip *z, const struct ferry_tf_record *r,
		      ferry_tf_read_fn rd, void *u, size_t max, uint8_t **out)
{
	(void)z;
	*out = NULL;
	if (r->size > max)
		return ferry__error(FERRY_ECORRUPT, "%s: record %s: %" PRIu64 " bytes, more than the %zu read here", name,
				    r->name, r->size, max);
	uint8_t *b = malloc(r->size ? (size_t)r->size : 1);
	if (!b)
		return ferry__error(-ENOMEM, "%s: out of memory", name);
	int e = read_exact(name, 0, rd, u, r->data, b, (size_t)r->size, r->name);
	if (e) {
		free(b);
		return e;
	}
	*out = b;
	return 0;
}

int ferry_tf_zip_check(const char *name, uint64_t base, const struct ferry_tf_record *r, ferry_tf_read_fn rd,
		       void *u)
{
	enum { STEP = 1 << 20 };
	uint8_t *b = malloc(STEP);
	if (!b)
		return ferry__error(-ENOMEM, "%s: out of memory", name);
	uint32_t crc = 0;
	int e = 0;
	for (uint64_t at = 0; at < r->size && !e;) {
		size_t n = r->size - at < STEP ? (size_t)(r->size - at) : STEP;
		if (!(e = read_exact(name, base, rd, u, r->data + at, b, n, r->name))) {
			crc = ferry_tf_crc32(crc, b, n);
			at += n;
		}
	}
	free(b);
	if (e)
		return e;
	if (crc == r->crc)
		return 1;
	if (r->crc == 0)
		return 0;
	return ferry__error(FERRY_EVERIFY, "%s: offset %" PRIu64 ": record %s: crc32 %08" PRIx32 " of the %" PRIu64
			    " bytes read, the zip says %08" PRIx32, name, base + r->data, r->name, crc, r->size, r->crc);
}

/* ----------------------------------------------------------------------------------------- pickle */

enum pk_kind { PK_MARK, PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_BYTES, PK_TUPLE, PK_LIST, PK_DICT,
	       PK_GLOBAL, PK_OBJ, PK_PERSID };

/* A value the unpickler built. OBJ: a called (a), with arguments (b, a tuple) and state (c). */
struct pv {
	enum pk_kind kind;
	uint64_t at; /* the opcode's offset */
	int64_t i;
	double f;
	char *s, *s2; /* str/bytes (len bytes); GLOBAL: module, name */
	size_t len;
	struct pv **v; /* tuple, list; dict: key, value pairs */
	size_t n, cap;
	struct pv *a, *b, *c;
};

struct pk {
	const char *name;
	const uint8_t *p;
	size_t len, pos;
	int restricted; /* DCP: only the classes DCP writes */
	void **alloc;
	size_t nalloc, capalloc;
	struct pv **stack;
	size_t sn, scap;
	struct pv **memo;
	size_t mcap;
	uint64_t budget; /* walks of shared values are bounded by this */
};

static int pk_err(struct pk *k, uint64_t at, const char *fmt, ...) FERRY__PRINTF(3, 4);

static int pk_err(struct pk *k, uint64_t at, const char *fmt, ...)
{
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": %s", k->name, at, what);
}

static void *pk_alloc(struct pk *k, size_t n)
{
	if (k->nalloc == k->capalloc) {
		size_t c = k->capalloc ? 2 * k->capalloc : 256;
		void **a = realloc(k->alloc, c * sizeof(*a));
		if (!a)
			return NULL;
		k->alloc = a;
		k->capalloc = c;
	}
	void *p = calloc(1, n ? n : 1);
	if (p)
		k->alloc[k->nalloc++] = p;
	return p;
}

static void pk_free(struct pk *k)
{
	for (size_t i = 0; i < k->nalloc; i++)
		free(k->alloc[i]);
	free(k->alloc);
	free(k->stack);
	free(k->memo);
}

static struct pv *pv_new(struct pk *k, enum pk_kind kind, uint64_t at)
{
	struct pv *v = pk_alloc(k, sizeof(*v));
	if (v) {
		v->kind = kind;
		v->at = at;
	}
	return v;
}

/* Arrays of values live outside the arena (they grow); the arena keeps a value's array pointer. */
static int pv_push(struct pk *k, struct pv *c, struct pv *x)
{
	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 4;
		struct pv **a = pk_alloc(k, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		if (c->n)
			memcpy(a, c->v, c->n * sizeof(*a));
		c->v = a;
		c->cap = cap;
	}
	c->v[c->n++] = x;
	return 0;
}

static int st_push(struct pk *k, struct pv *v)
{
	if (!v)
		return ferry__error(-ENOMEM, "%s: out of memory", k->name);
	if (k->sn == k->scap) {
		size_t c = k->scap ? 2 * k->scap : 64;
		struct pv **s = realloc(k->stack, c * sizeof(*s));
		if (!s)
			return ferry__error(-ENOMEM, "%s: out of memory", k->name);
		k->stack = s;
		k->scap = c;
	}
	k->stack[k->sn++] = v;
	return 0;
}

static struct pv *st_pop(struct pk *k)
{
	return k->sn && k->stack[k->sn - 1]->kind != PK_MARK ? k->stack[--k->sn] : NULL;
}

/* The index of the topmost mark, or -1. */
static int64_t st_mark(struct pk *k)
{
	for (size_t i = k->sn; i-- > 0;)
		if (k->stack[i]->kind == PK_MARK)
			return (int64_t)i;
	return -1;
}

static const char *const dtypes[][2] = {
	{"float32", "4"}, {"float", "4"}, {"float64", "8"}, {"double", "8"}, {"float16", "2"}, {"half", "2"},
	{"bfloat16", "2"}, {"int64", "8"}, {"long", "8"}, {"int32", "4"}, {"int", "4"}, {"int16", "2"},
	{"short", "2"}, {"int8", "1"}, {"uint8", "1"}, {"bool", "1"}, {"uint16", "2"}, {"uint32", "4"},
	{"uint64", "8"}, {"complex32", "4"}, {"complex64", "8"}, {"complex128", "16"}, {"cfloat", "8"},
	{"cdouble", "16"}, {"float8_e4m3fn", "1"}, {"float8_e5m2", "1"}, {"float8_e4m3fnuz", "1"},
	{"float8_e5m2fnuz", "1"}, {"float8_e8m0fnu", "1"}, {"float4_e2m1fn_x2", "1"}, {"qint8", "1"},
	{"quint8", "1"}, {"qint32", "4"},
};

/* Element size of torch.<name>, or 0. */
static int dtype_size(const char *name)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (!strcmp(name, dtypes[i][0]))
			return atoi(dtypes[i][1]);
	return 0;
}

/* The legacy storage classes torch.save names, and their dtypes. */
static const char *const storages[][2] = {
	{"FloatStorage", "float32"}, {"DoubleStorage", "float64"}, {"HalfStorage", "float16"},
	{"BFloat16Storage", "bfloat16"}, {"LongStorage", "int64"}, {"IntStorage", "int32"},
	{"ShortStorage", "int16"}, {"CharStorage", "int8"}, {"ByteStorage", "uint8"}, {"BoolStorage", "bool"},
	{"ComplexFloatStorage", "complex64"}, {"ComplexDoubleStorage", "complex128"}, {"QInt8Storage", "qint8"},
	{"QUInt8Storage", "quint8"}, {"QInt32Storage", "qint32"}, {"UntypedStorage", "uint8"},
};

/* What `.metadata` may name: DCP's own classes, torch's Size, dtypes and layouts, paths. */
static int dcp_allowed(const char *mod, const char *name)
{
	static const char *const dcp[] = {"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
					  "TensorProperties", "BytesStorageMetadata", "MetadataIndex",
					  "StorageMeta", "_MEM_FORMAT_ENCODING", NULL};
	static const char *const torch_names[] = {"Size", "strided", "sparse_coo", "sparse_csr", "contiguous_format",
						  "channels_last", "channels_last_3d", "preserve_format", NULL};
	static const char *const paths[] = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path", NULL};
	const char *const *list = NULL;
	if (!strcmp(mod, "torch.distributed.checkpoint.metadata"))
		list = dcp;
	else if (!strcmp(mod, "torch.distributed.checkpoint.filesystem"))
		return !strcmp(name, "_StorageInfo");
	else if (!strcmp(mod, "torch.serialization"))
		return !strcmp(name, "_get_layout");
	else if (!strcmp(mod, "collections"))
		return !strcmp(name, "OrderedDict");
	else if (!strcmp(mod, "pathlib") || !strcmp(mod, "pathlib._local"))
		list = paths;
	else if (!strcmp(mod, "torch")) {
		if (dtype_size(name))
			return 1;
		list = torch_names;
	}
	for (size_t i = 0; list && list[i]; i++)
		if (!strcmp(list[i], name))
			return 1;
	return 0;
}

static uint64_t rd_le(const uint8_t *p, size_t n)
{
	uint64_t v = 0;
	for (size_t i = n; i-- > 0;)
		v = v << 8 | p[i];
	return v;
}

static struct pv *pv_str(struct pk *k, enum pk_kind kind, uint64_t at, const uint8_t *s, size_t n)
{
	struct pv *v = pv_new(k, kind, at);
	char *b = v ? pk_alloc(k, n + 1) : NULL;
	if (!b)
		return NULL;
	memcpy(b, s, n);
	b[n] = '\0';
	v->s = b;
	v->len = n;
	return v;
}

/* Pops the values above the topmost mark into a new container of kind (the mark goes too). */
static struct pv *pop_mark(struct pk *k, enum pk_kind kind, uint64_t at, int *err)
{
	int64_t m = st_mark(k);
	if (m < 0) {
		*err = pk_err(k, at, "no mark for this opcode");
		return NULL;
	}
	struct pv *c = pv_new(k, kind, at);
	if (!c) {
		*err = ferry__error(-ENOMEM, "%s: out of memory", k->name);
		return NULL;
	}
	for (size_t i = (size_t)m + 1; i < k->sn; i++)
		if (pv_push(k, c, k->stack[i])) {
			*err = ferry__error(-ENOMEM, "%s: out of memory", k->name);
			return NULL;
		}
	k->sn = (size_t)m;
	return c;
}

static int memo_put(struct pk *k, uint64_t idx, uint64_t at)
{
	if (!k->sn || k->stack[k->sn - 1]->kind == PK_MARK)
		return pk_err(k, at, "memo put of an empty stack");
	if (idx > (1u << 24) || idx > 16 * k->len + 16)
		return pk_err(k, at, "memo index out of range");
	if (idx >= k->mcap) {
		size_t c = k->mcap ? k->mcap : 64;
		while (c <= idx)
			c *= 2;
		struct pv **m = realloc(k->memo, c * sizeof(*m));
		if (!m)
			return ferry__error(-ENOMEM, "%s: out of memory", k->name);
		memset(m + k->mcap, 0, (c - k->mcap) * sizeof(*m));
		k->memo = m;
		k->mcap = c;
	}
	k->memo[idx] = k->stack[k->sn - 1];
	return 0;
}

/* Runs the pickle; *out is the value STOP returns (owned by k). */
static int pk_run(struct pk *k, struct pv **out)
{
	uint64_t memo_next = 0;
	int err = 0;
	*out = NULL;
	while (k->pos < k->len) {
		uint64_t at = k->pos;
		uint8_t op = k->p[k->pos++];
		size_t left = k->len - k->pos;
		const uint8_t *a = k->p + k->pos;
		struct pv *v = NULL, *x, *y;
		size_t n;
#define NEED(bytes)                                                                      \
	do {                                                                             \
		if (left < (size_t)(bytes))                                              \
			return pk_err(k, at, "opcode's argument runs past the end"); \
	} while (0)
		switch (op) {
		case 0x80: /* PROTO */
			NEED(1);
			if (a[0] > 5)
				return pk_err(k, at, "pickle protocol above 5");
			k->pos += 1;
			break;
		case 0x95: /* FRAME */
			NEED(8);
			k->pos += 8;
			break;
		case '.': /* STOP */
			if (!(*out = st_pop(k)))
				return pk_err(k, at, "STOP with nothing to return");
			return 0;
		case '(':
			if ((err = st_push(k, pv_new(k, PK_MARK, at))))
				return err;
			break;
		case ')':
		case ']':
		case '}':
		case 0x8f: /* EMPTY_SET: a list here */
			if ((err = st_push(k, pv_new(k, op == ')' ? PK_TUPLE : op == '}' ? PK_DICT : PK_LIST, at))))
				return err;
			break;
		case 't':
		case 'l':
		case 0x91: /* FROZENSET */
			if (!(v = pop_mark(k, op == 't' ? PK_TUPLE : PK_LIST, at, &err)))
				return err;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'd':
			if (!(v = pop_mark(k, PK_DICT, at, &err)))
				return err;
			if (v->n % 2)
				return pk_err(k, at, "DICT of an odd number of items");
			if ((err = st_push(k, v)))
				return err;
			break;
		case 0x85:
		case 0x86:
		case 0x87: /* TUPLE1..3 */
			n = (size_t)(op - 0x84);
			if (k->sn < n)
				return pk_err(k, at, "TUPLE%s of too few values", op == 0x85 ? "1" : op == 0x86 ? "2" : "3");
			if (!(v = pv_new(k, PK_TUPLE, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			for (size_t i = k->sn - n; i < k->sn; i++)
				if (k->stack[i]->kind == PK_MARK)
					return pk_err(k, at, "TUPLE of a mark");
				else if (pv_push(k, v, k->stack[i]))
					return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			k->sn -= n;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'a': /* APPEND */
			if (!(x = st_pop(k)) || !k->sn || k->stack[k->sn - 1]->kind != PK_LIST)
				return pk_err(k, at, "APPEND to something not a list");
			if (pv_push(k, k->stack[k->sn - 1], x))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			break;
		case 'e':
		case 0x90: /* APPENDS, ADDITEMS */
		case 'u': { /* SETITEMS */
			if (!(v = pop_mark(k, PK_LIST, at, &err)))
				return err;
			enum pk_kind want = op == 'u' ? PK_DICT : PK_LIST;
			if (!k->sn || k->stack[k->sn - 1]->kind != want || (op == 'u' && v->n % 2))
				return pk_err(k, at, "%s", op == 'u' ? "SETITEMS to something not a dict, or an odd count"
								       : "APPENDS to something not a list");
			for (size_t i = 0; i < v->n; i++)
				if (pv_push(k, k->stack[k->sn - 1], v->v[i]))
					return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			break;
		}
		case 's': /* SETITEM */
			if (!(y = st_pop(k)) || !(x = st_pop(k)) || !k->sn || k->stack[k->sn - 1]->kind != PK_DICT)
				return pk_err(k, at, "SETITEM to something not a dict");
			if (pv_push(k, k->stack[k->sn - 1], x) || pv_push(k, k->stack[k->sn - 1], y))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			break;
		case 'N':
		case 0x88:
		case 0x89:
			if (!(v = pv_new(k, op == 'N' ? PK_NONE : PK_BOOL, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			v->i = op == 0x88;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'J':
		case 'K':
		case 'M': /* BININT, BININT1, BININT2 */
			n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
			NEED(n);
			if (!(v = pv_new(k, PK_INT, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			v->i = op == 'J' ? (int64_t)(int32_t)(uint32_t)rd_le(a, 4) : (int64_t)rd_le(a, n);
			k->pos += n;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 0x8a:
		case 0x8b: /* LONG1, LONG4 */
			n = op == 0x8a ? 1 : 4;
			NEED(n);
			{
				uint64_t len = rd_le(a, n);
				if (len > 8)
					return pk_err(k, at, "an integer wider than 64 bits");
				NEED(n + len);
				uint64_t u = rd_le(a + n, (size_t)len);
				if (len && len < 8 && (a[n + len - 1] & 0x80))
					u |= ~0ull << (8 * len); /* sign-extend */
				if (!(v = pv_new(k, PK_INT, at)))
					return ferry__error(-ENOMEM, "%s: out of memory", k->name);
				v->i = (int64_t)u;
				k->pos += n + (size_t)len;
			}
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'G': /* BINFLOAT, big-endian */
			NEED(8);
			{
				uint64_t u = 0;
				for (int i = 0; i < 8; i++)
					u = u << 8 | a[i];
				if (!(v = pv_new(k, PK_FLOAT, at)))
					return ferry__error(-ENOMEM, "%s: out of memory", k->name);
				memcpy(&v->f, &u, 8);
			}
			k->pos += 8;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'X':
		case 0x8c:
		case 0x8d: /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
		case 'T':
		case 'U': /* BINSTRING, SHORT_BINSTRING */
		case 'B':
		case 'C':
		case 0x8e:
		case 0x96: { /* BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8 */
			n = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
			NEED(n);
			uint64_t len = rd_le(a, n);
			if (len > left - n)
				return pk_err(k, at, "a string's length runs past the end");
			int bytes = op == 'B' || op == 'C' || op == 0x8e || op == 0x96;
			if ((err = st_push(k, pv_str(k, bytes ? PK_BYTES : PK_STR, at, a + n, (size_t)len))))
				return err;
			k->pos += n + (size_t)len;
			break;
		}
		case 'c': /* GLOBAL "module\nname\n" */
		case 0x93: { /* STACK_GLOBAL */
			const char *mod, *nm;
			char *s1, *s2;
			if (op == 'c') {
				const uint8_t *e1 = memchr(a, '\n', left), *e2;
				if (!e1 || !(e2 = memchr(e1 + 1, '\n', left - (size_t)(e1 + 1 - a))))
					return pk_err(k, at, "GLOBAL without its two lines");
				s1 = pk_alloc(k, (size_t)(e1 - a) + 1);
				s2 = pk_alloc(k, (size_t)(e2 - e1));
				if (!s1 || !s2)
					return ferry__error(-ENOMEM, "%s: out of memory", k->name);
				memcpy(s1, a, (size_t)(e1 - a));
				memcpy(s2, e1 + 1, (size_t)(e2 - e1 - 1));
				k->pos += (size_t)(e2 + 1 - a);
				mod = s1;
				nm = s2;
			} else {
				if (!(y = st_pop(k)) || !(x = st_pop(k)) || x->kind != PK_STR || y->kind != PK_STR)
					return pk_err(k, at, "STACK_GLOBAL of values that are not two strings");
				mod = x->s;
				nm = y->s;
			}
			if (k->restricted && !dcp_allowed(mod, nm))
				return pk_err(k, at, "global %s.%s: not one of the classes DCP's .metadata holds (refused)", mod, nm);
			if (!(v = pv_new(k, PK_GLOBAL, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			v->s = (char *)mod;
			v->s2 = (char *)nm;
			if ((err = st_push(k, v)))
				return err;
			break;
		}
		case 'R':
		case 0x81: /* REDUCE, NEWOBJ: f(*args) is recorded, never called */
			if (!(y = st_pop(k)) || !(x = st_pop(k)))
				return pk_err(k, at, "%s of too few values", op == 'R' ? "REDUCE" : "NEWOBJ");
			if (y->kind != PK_TUPLE)
				return pk_err(k, at, "%s: arguments are not a tuple", op == 'R' ? "REDUCE" : "NEWOBJ");
			if (k->restricted && x->kind != PK_GLOBAL)
				return pk_err(k, at, "%s of something not a class", op == 'R' ? "REDUCE" : "NEWOBJ");
			if (!(v = pv_new(k, PK_OBJ, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			v->a = x;
			v->b = y;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'b': /* BUILD */
			if (!(y = st_pop(k)) || !k->sn || k->stack[k->sn - 1]->kind != PK_OBJ)
				return pk_err(k, at, "BUILD of something not an object");
			k->stack[k->sn - 1]->c = y;
			break;
		case 'Q': /* BINPERSID */
			if (k->restricted)
				return pk_err(k, at, "a persistent id, which .metadata never holds");
			if (!(x = st_pop(k)))
				return pk_err(k, at, "BINPERSID of nothing");
			if (!(v = pv_new(k, PK_PERSID, at)))
				return ferry__error(-ENOMEM, "%s: out of memory", k->name);
			v->a = x;
			if ((err = st_push(k, v)))
				return err;
			break;
		case 'q':
		case 'r': /* BINPUT, LONG_BINPUT */
			n = op == 'q' ? 1 : 4;
			NEED(n);
			if ((err = memo_put(k, rd_le(a, n), at)))
				return err;
			k->pos += n;
			break;
		case 0x94: /* MEMOIZE */
			if ((err = memo_put(k, memo_next++, at)))
				return err;
			break;
		case 'h':
		case 'j': { /* BINGET, LONG_BINGET */
			n = op == 'h' ? 1 : 4;
			NEED(n);
			uint64_t idx = rd_le(a, n);
			if (idx >= k->mcap || !k->memo[idx])
				return pk_err(k, at, "memo get of an entry never put");
			k->pos += n;
			if ((err = st_push(k, k->memo[idx])))
				return err;
			break;
		}
		case '0': /* POP */
			if (!k->sn)
				return pk_err(k, at, "POP of an empty stack");
			k->sn--;
			break;
		case '1': { /* POP_MARK */
			int64_t m = st_mark(k);
			if (m < 0)
				return pk_err(k, at, "POP_MARK without a mark");
			k->sn = (size_t)m;
			break;
		}
		case '2': /* DUP */
			if (!k->sn)
				return pk_err(k, at, "DUP of an empty stack");
			if ((err = st_push(k, k->stack[k->sn - 1])))
				return err;
			break;
		default: {
			char o[8];
			snprintf(o, sizeof(o), "0x%02x", op);
			return pk_err(k, at, "opcode %s: not one this reader takes", o);
		}
		}
#undef NEED
	}
	return pk_err(k, k->len, "the pickle ends without STOP (truncated?)");
}

static int is_global(const struct pv *v, const char *mod, const char *name)
{
	return v && v->kind == PK_GLOBAL && !strcmp(v->s, mod) && !strcmp(v->s2, name);
}

/* An object made by calling class mod.name (NEWOBJ or REDUCE). */
static int is_obj(const struct pv *v, const char *mod, const char *name)
{
	return v && v->kind == PK_OBJ && is_global(v->a, mod, name);
}

/* A field of an object's state: a dict, or (dict, slots dict). */
static const struct pv *field(const struct pv *o, const char *key)
{
	const struct pv *st = o ? o->c : NULL;
	const struct pv *dicts[2] = {st, NULL};
	if (st && st->kind == PK_TUPLE && st->n == 2) {
		dicts[0] = st->v[0];
		dicts[1] = st->v[1];
	}
	for (int d = 0; d < 2; d++)
		if (dicts[d] && dicts[d]->kind == PK_DICT)
			for (size_t i = 0; i + 1 < dicts[d]->n; i += 2)
				if (dicts[d]->v[i]->kind == PK_STR && !strcmp(dicts[d]->v[i]->s, key))
					return dicts[d]->v[i + 1];
	return NULL;
}

/* A torch.Size (or a plain tuple of ints) into dims; returns the count or -1. */
static int size_of(const struct pv *v, uint64_t *dims)
{
	if (v && v->kind == PK_OBJ && is_global(v->a, "torch", "Size") && v->b->n == 1)
		v = v->b->v[0];
	if (!v || (v->kind != PK_TUPLE && v->kind != PK_LIST) || v->n > FERRY_TF_MAX_DIMS)
		return -1;
	for (size_t i = 0; i < v->n; i++) {
		if (v->v[i]->kind != PK_INT || v->v[i]->i < 0)
			return -1;
		dims[i] = (uint64_t)v->v[i]->i;
	}
	return (int)v->n;
}

static char *dup_str(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

/* ------------------------------------------------------------------------------- torch.save pickle */

struct walk {
	struct pk *k;
	struct ferry_tf_tensor *t;
	size_t n, cap;
	char path[1024];
};

static int pt_tensor(struct walk *w, const struct pv *call, const struct pv *dtype_global)
{
	const struct pv *args = call->b;
	const struct pv *pid = args->n >= 4 ? args->v[0] : NULL;
	if (!pid || pid->kind != PK_PERSID || !pid->a || pid->a->kind != PK_TUPLE || pid->a->n != 5)
		return pk_err(w->k, call->at, "tensor %s: its storage is not a persistent id ('storage', type, key, "
			      "location, numel)", w->path);
	const struct pv *const *s = (const struct pv *const *)pid->a->v;
	if (s[1]->kind != PK_GLOBAL || (s[2]->kind != PK_STR) || s[3]->kind != PK_STR || s[4]->kind != PK_INT ||
	    s[4]->i < 0 || args->v[1]->kind != PK_INT || args->v[1]->i < 0)
		return pk_err(w->k, call->at, "tensor %s: malformed storage record", w->path);
	const char *dt = NULL;
	if (dtype_global && dtype_global->kind == PK_GLOBAL)
		dt = dtype_global->s2;
	else
		for (size_t i = 0; i < sizeof(storages) / sizeof(storages[0]); i++)
			if (!strcmp(s[1]->s2, storages[i][0]))
				dt = storages[i][1];
	if (!dt || !dtype_size(dt))
		return pk_err(w->k, call->at, "tensor %s: storage type %s unknown", w->path, s[1]->s2);
	if (w->n == w->cap) {
		size_t c = w->cap ? 2 * w->cap : 16;
		struct ferry_tf_tensor *t = realloc(w->t, c * sizeof(*t));
		if (!t)
			return ferry__error(-ENOMEM, "%s: out of memory", w->k->name);
		w->t = t;
		w->cap = c;
	}
	struct ferry_tf_tensor *t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	snprintf(t->dtype, sizeof(t->dtype), "%s", dt);
	t->elsize = dtype_size(dt);
	t->storage_numel = (uint64_t)s[4]->i;
	t->offset = (uint64_t)args->v[1]->i;
	int nd = size_of(args->v[2], t->shape), ns = size_of(args->v[3], t->stride);
	if (nd < 0 || ns != nd)
		return pk_err(w->k, call->at, "tensor %s: shape or stride not a tuple of as many ints", w->path);
	t->ndim = nd;
	t->name = dup_str(w->path);
	t->key = dup_str(s[2]->s);
	t->location = dup_str(s[3]->s);
	w->n++;
	if (!t->name || !t->key || !t->location)
		return ferry__error(-ENOMEM, "%s: out of memory", w->k->name);
	return 0;
}

static int pt_walk(struct walk *w, const struct pv *v, int depth)
{
	if (!v || depth > 64 || !w->k->budget)
		return depth > 64 ? pk_err(w->k, v ? v->at : 0, "nested deeper than 64 levels") : 0;
	w->k->budget--;
	size_t plen = strlen(w->path);
	int r = 0;
	switch (v->kind) {
	case PK_DICT:
		for (size_t i = 0; i + 1 < v->n && !r; i += 2) {
			const struct pv *key = v->v[i];
			char seg[160];
			if (key->kind == PK_STR)
				snprintf(seg, sizeof(seg), "%s", key->s);
			else if (key->kind == PK_INT)
				snprintf(seg, sizeof(seg), "%" PRId64, key->i);
			else
				snprintf(seg, sizeof(seg), "?");
			snprintf(w->path + plen, sizeof(w->path) - plen, "%s%s", plen ? "." : "", seg);
			r = pt_walk(w, v->v[i + 1], depth + 1);
		}
		break;
	case PK_LIST:
	case PK_TUPLE:
		for (size_t i = 0; i < v->n && !r; i++) {
			snprintf(w->path + plen, sizeof(w->path) - plen, "%s%zu", plen ? "." : "", i);
			r = pt_walk(w, v->v[i], depth + 1);
		}
		break;
	case PK_OBJ:
		if (is_global(v->a, "torch._utils", "_rebuild_tensor_v2") || is_global(v->a, "torch._utils", "_rebuild_tensor"))
			return pt_tensor(w, v, NULL);
		if (is_global(v->a, "torch._utils", "_rebuild_tensor_v3"))
			return pt_tensor(w, v, v->b->n >= 7 ? v->b->v[6] : NULL);
		if ((is_global(v->a, "torch._utils", "_rebuild_parameter") ||
		     is_global(v->a, "torch._utils", "_rebuild_parameter_with_state")) && v->b->n)
			return pt_walk(w, v->b->v[0], depth + 1);
		/* Another object (OrderedDict, a module): its arguments and state, under its own path. */
		r = pt_walk(w, v->b, depth + 1);
		w->path[plen] = '\0';
		if (!r && v->c)
			r = pt_walk(w, v->c, depth + 1);
		break;
	default:
		break;
	}
	w->path[plen] = '\0';
	return r;
}

void ferry_tf_tensors_free(struct ferry_tf_tensor *t, size_t n)
{
	for (size_t i = 0; t && i < n; i++) {
		free(t[i].name);
		free(t[i].key);
		free(t[i].location);
	}
	free(t);
}

int ferry_tf_pt_tensors(const char *name, const uint8_t *pkl, size_t len, struct ferry_tf_tensor **out, size_t *n)
{
	struct pk k = {.name = name, .p = pkl, .len = len, .budget = 64 * (uint64_t)len + 64};
	struct walk w = {.k = &k};
	struct pv *root;
	*out = NULL;
	*n = 0;
	int r = pk_run(&k, &root);
	if (!r)
		r = pt_walk(&w, root, 0);
	if (!r && !k.budget)
		r = pk_err(&k, 0, "values shared so often that walking them would not end");
	pk_free(&k);
	if (r) {
		ferry_tf_tensors_free(w.t, w.n);
		return r;
	}
	*out = w.t;
	*n = w.n;
	return 0;
}

void ferry_tf_pt_free(struct ferry_tf_pt *pt)
{
	if (!pt)
		return;
	ferry_tf_zip_free(&pt->zip);
	ferry_tf_tensors_free(pt->t, pt->n);
	memset(pt, 0, sizeof(*pt));
}

int ferry_tf_pt_open(const char *name, uint64_t base, uint64_t length, ferry_tf_read_fn rd, void *u,
		     struct ferry_tf_pt *out)
{
	memset(out, 0, sizeof(*out));
	int r = ferry_tf_zip_parse(name, base, length, rd, u, &out->zip);
	if (r)
		return r;
	const struct ferry_tf_record *pkl = ferry_tf_zip_find(&out->zip, "data.pkl");
	uint8_t *b = NULL;
	if (!pkl) {
		r = ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record data.pkl: missing (%s)", name, base,
				 ferry_tf_zip_find(&out->zip, "constants.pkl") ? "a TorchScript archive, not a torch.save file"
									      : "not a torch.save file");
	} else if (!(r = ferry_tf_zip_read(name, &out->zip, pkl, rd, u, 256u << 20, &b))) {
		char where[1200];
		snprintf(where, sizeof(where), "%s: record %s (its data at offset %" PRIu64 ")", name, pkl->name,
			 base + pkl->data);
		r = ferry_tf_pt_tensors(where, b, (size_t)pkl->size, &out->t, &out->n);
		free(b);
	}
	if (r)
		ferry_tf_pt_free(out);
	return r;
}

int ferry_tf_pt_check(const char *name, uint64_t base, const struct ferry_tf_pt *pt, size_t i)
{
	const struct ferry_tf_tensor *t = &pt->t[i];
	char rec[300];
	snprintf(rec, sizeof(rec), "data/%s", t->key);
	const struct ferry_tf_record *r = ferry_tf_zip_find(&pt->zip, rec);
	if (!r)
		return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: missing (tensor %s's storage)", name,
				    base, rec, t->name);
	uint64_t need;
	if (__builtin_mul_overflow(t->storage_numel, (uint64_t)t->elsize, &need) || r->size != need)
		return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": record %s: %" PRIu64 " bytes where the pickle "
				    "says %" PRIu64 " elements of %d bytes", name, base + r->data, rec, r->size,
				    t->storage_numel, t->elsize);
	uint64_t last = t->offset, numel = 1;
	for (int d = 0; d < t->ndim; d++) {
		uint64_t span;
		if (!t->shape[d])
			numel = 0;
		else if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &span) ||
			 __builtin_add_overflow(last, span, &last))
			last = UINT64_MAX;
	}
	if (numel && last >= t->storage_numel)
		return ferry__error(FERRY_ECORRUPT, "%s: offset %" PRIu64 ": tensor %s: elements up to %" PRIu64 " of a "
				    "storage (record %s) of %" PRIu64, name, base + r->data, t->name, last, rec,
				    t->storage_numel);
	return 0;
}

/* -------------------------------------------------------------------------------------- DCP */

void ferry_tf_dcp_free(struct ferry_tf_dcp *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++) {
		for (size_t c = 0; c < d->item[i].n; c++)
			free(d->item[i].piece[c].file);
		free(d->item[i].piece);
		free(d->item[i].fqn);
	}
	free(d->item);
	memset(d, 0, sizeof(*d));
}

#define DCP_MOD "torch.distributed.checkpoint.metadata"

static int dcp_tensor(struct pk *k, const char *fqn, const struct pv *tsm, struct ferry_tf_dcp_item *it)
{
	const struct pv *props = field(tsm, "properties"), *dt = NULL;
	if (is_obj(props, DCP_MOD, "TensorProperties") && props->c) {
		/* TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format, pin_memory[, strides]) */
		if (props->c->kind == PK_TUPLE && props->c->n >= 1)
			dt = props->c->v[0];
		else
			dt = field(props, "dtype");
	}
	if (!dt || dt->kind != PK_GLOBAL || strcmp(dt->s, "torch") || !dtype_size(dt->s2))
		return pk_err(k, tsm->at, "tensor %s: properties: no torch dtype", fqn);
	snprintf(it->dtype, sizeof(it->dtype), "%s", dt->s2);
	it->elsize = dtype_size(dt->s2);
	if ((it->ndim = size_of(field(tsm, "size"), it->size)) < 0)
		return pk_err(k, tsm->at, "tensor %s: size: not a torch.Size", fqn);
	const struct pv *chunks = field(tsm, "chunks");
	if (!chunks || chunks->kind != PK_LIST)
		return pk_err(k, tsm->at, "tensor %s: chunks: not a list", fqn);
	it->piece = calloc(chunks->n ? chunks->n : 1, sizeof(*it->piece));
	if (!it->piece)
		return ferry__error(-ENOMEM, "%s: out of memory", k->name);
	for (size_t c = 0; c < chunks->n; c++, it->n++) {
		const struct pv *ch = chunks->v[c];
		struct ferry_tf_dcp_piece *p = &it->piece[c];
		if (!is_obj(ch, DCP_MOD, "ChunkStorageMetadata") || size_of(field(ch, "offsets"), p->offsets) != it->ndim ||
		    size_of(field(ch, "sizes"), p->sizes) != it->ndim)
			return pk_err(k, ch->at, "tensor %s: a chunk without offsets and sizes of the tensor's rank", fqn);
		for (int d = 0; d < it->ndim; d++)
			if (p->offsets[d] > it->size[d] || p->sizes[d] > it->size[d] - p->offsets[d])
				return pk_err(k, ch->at, "tensor %s: a chunk reaching past the tensor's size", fqn);
	}
	return 0;
}

/* Ties storage_data's (MetadataIndex -> _StorageInfo) entries to the items' pieces. */
static int dcp_storage(struct pk *k, const struct pv *sd, struct ferry_tf_dcp *d)
{
	if (!sd || sd->kind == PK_NONE)
		return 0;
	if (sd->kind != PK_DICT)
		return pk_err(k, sd->at, "storage_data: not a dict");
	for (size_t i = 0; i + 1 < sd->n; i += 2) {
		const struct pv *mi = sd->v[i], *si = sd->v[i + 1];
		const struct pv *fqn = field(mi, "fqn"), *off = field(mi, "offset");
		const struct pv *rel = field(si, "relative_path"), *o = field(si, "offset"), *l = field(si, "length"),
				*tr = field(si, "transform_descriptors");
		if (!is_obj(mi, DCP_MOD, "MetadataIndex") || !fqn || fqn->kind != PK_STR)
			return pk_err(k, mi->at, "storage_data: a key that is not a MetadataIndex with an fqn");
		if (!is_obj(si, "torch.distributed.checkpoint.filesystem", "_StorageInfo") || !rel || rel->kind != PK_STR ||
		    !o || o->kind != PK_INT || o->i < 0 || !l || l->kind != PK_INT || l->i < 0)
			return pk_err(k, si->at, "storage_data[%s]: not a _StorageInfo of relative_path, offset and length",
				      fqn->s);
		if (strchr(rel->s, '/') || !strcmp(rel->s, "..") || !strcmp(rel->s, ".") || !rel->s[0] || rel->len != strlen(rel->s))
			return pk_err(k, si->at, "storage_data[%s]: relative_path \"%s\" is not a file name in the directory",
				      fqn->s, rel->s);
		struct ferry_tf_dcp_item *it = NULL;
		for (size_t j = 0; j < d->n && !it; j++)
			if (!strcmp(d->item[j].fqn, fqn->s))
				it = &d->item[j];
		if (!it)
			return pk_err(k, mi->at, "storage_data[%s]: no such item in state_dict_metadata", fqn->s);
		struct ferry_tf_dcp_piece *p = NULL;
		if (it->is_bytes) {
			p = &it->piece[0];
		} else {
			uint64_t at[FERRY_TF_MAX_DIMS];
			if (size_of(off, at) != it->ndim)
				return pk_err(k, mi->at, "storage_data[%s]: offset not of the tensor's rank", fqn->s);
			for (size_t c = 0; c < it->n && !p; c++)
				if (!memcmp(it->piece[c].offsets, at, sizeof(at[0]) * (size_t)it->ndim))
					p = &it->piece[c];
			if (!p)
				return pk_err(k, mi->at, "storage_data[%s]: an offset that names no chunk", fqn->s);
		}
		if (p->file)
			return pk_err(k, mi->at, "storage_data[%s]: a piece stored twice", fqn->s);
		if (!(p->file = dup_str(rel->s)))
			return ferry__error(-ENOMEM, "%s: out of memory", k->name);
		p->offset = (uint64_t)o->i;
		p->length = (uint64_t)l->i;
		p->transformed = tr && tr->kind == PK_LIST && tr->n > 0;
	}
	return 0;
}

int ferry_tf_dcp_parse(const char *name, const uint8_t *buf, size_t len, struct ferry_tf_dcp *out)
{
	struct pk k = {.name = name, .p = buf, .len = len, .restricted = 1};
	struct pv *root;
	memset(out, 0, sizeof(*out));
	int r = pk_run(&k, &root);
	if (r)
		goto out;
	if (!is_obj(root, DCP_MOD, "Metadata")) {
		r = pk_err(&k, root->at, "not a torch.distributed.checkpoint Metadata");
		goto out;
	}
	const struct pv *sdm = field(root, "state_dict_metadata"), *ver = field(root, "version");
	if (!sdm || sdm->kind != PK_DICT) {
		r = pk_err(&k, root->at, "state_dict_metadata: missing or not a dict");
		goto out;
	}
	if (ver && ver->kind == PK_STR)
		snprintf(out->version, sizeof(out->version), "%s", ver->s);
	out->item = calloc(sdm->n / 2 + 1, sizeof(*out->item));
	if (!out->item) {
		r = ferry__error(-ENOMEM, "%s: out of memory", name);
		goto out;
	}
	for (size_t i = 0; i + 1 < sdm->n && !r; i += 2) {
		const struct pv *key = sdm->v[i], *val = sdm->v[i + 1];
		if (key->kind != PK_STR || key->len != strlen(key->s)) {
			r = pk_err(&k, key->at, "state_dict_metadata: a key that is not a string");
			break;
		}
		for (size_t j = 0; j < out->n; j++)
			if (!strcmp(out->item[j].fqn, key->s)) {
				r = pk_err(&k, key->at, "state_dict_metadata: %s twice", key->s);
				goto out;
			}
		struct ferry_tf_dcp_item *it = &out->item[out->n++];
		if (!(it->fqn = dup_str(key->s))) {
			r = ferry__error(-ENOMEM, "%s: out of memory", name);
			break;
		}
		if (is_obj(val, DCP_MOD, "BytesStorageMetadata")) {
			it->is_bytes = 1;
			it->piece = calloc(1, sizeof(*it->piece));
			it->n = 1;
			if (!it->piece)
				r = ferry__error(-ENOMEM, "%s: out of memory", name);
		} else if (is_obj(val, DCP_MOD, "TensorStorageMetadata")) {
			r = dcp_tensor(&k, key->s, val, it);
		} else {
			r = pk_err(&k, val->at, "state_dict_metadata[%s]: neither TensorStorageMetadata nor "
				   "BytesStorageMetadata", key->s);
		}
	}
	if (!r)
		r = dcp_storage(&k, field(root, "storage_data"), out);
out:
	pk_free(&k);
	if (r)
		ferry_tf_dcp_free(out);
	return r;
}
