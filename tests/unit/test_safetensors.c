/* safetensors: writer/reader round trips (every dtype, scalars, empty tensors), subsets, slices,
 * checksums, and rejection of malformed files with a clear error. */
#include <fcntl.h>
#include <stdarg.h>
#include <dirent.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "ckpt/save.h"
#include "ferry/ckpt.h" /* ferry_st_load_place */
#include "ferry/safetensors.h"
#include "ferry_test.h"

static ferry_ctx *ctx;
static char dir[512];

static void write_raw(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f && fwrite(buf, 1, len, f) == len);
	fclose(f);
}

/* A file made of an 8-byte length, the header text and n data bytes. */
static void write_st(const char *path, const char *hdr, size_t data_len)
{
	size_t hl = strlen(hdr), len = 8 + hl + data_len;
	unsigned char *b = calloc(1, len);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, hdr, hl);
	write_raw(path, b, len);
	free(b);
}

static int open_err(const char *hdr, size_t data_len, const char *want)
{
	char p[600];
	ferry_st *st = NULL;
	snprintf(p, sizeof(p), "%s/bad.safetensors", dir);
	write_st(p, hdr, data_len);
	int r = ferry_st_open(ctx, p, &st);
	if (r != FERRY_ECORRUPT || !strstr(ferry_last_error(), want)) {
		fprintf(stderr, "header %.120s: got %d \"%s\", wanted FERRY_ECORRUPT with \"%s\"\n", hdr, r,
			ferry_last_error(), want);
		t_failures++;
	}
	ferry_st_destroy(st);
	return r;
}

static void test_bad_input(void)
{
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "trailing bytes");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16, "hole");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,800000000000]}}", 8, "bytes, but dtype and shape");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, "64 bits");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "duplicate tensor name");
	open_err("{\"a/b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "path separator");
	open_err("{\"a\\\\b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "path separator");
	open_err("{\"a\\u0001\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "control character");
	open_err("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "empty tensor name");
	open_err("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "non-negative integer");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "non-negative integer");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, "not two integers");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "missing field");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field");
	open_err("{\"__metadata__\":{\"k\":1}}", 0, "not a string");
	open_err("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "duplicate key");
	open_err("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key");
	open_err("[]", 0, "start with '{'");
	open_err(" {}", 0, "start with '{'");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, "trailing characters");
	open_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],}}", 8, "trailing comma");
	open_err("{\"\xff\":1}", 0, "invalid UTF-8");
	open_err("{\"\xc0\x80\":1}", 0, "invalid UTF-8");
	open_err("{\"a\\ud800\":1}", 0, "surrogate");
	open_err("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "whole number of bytes");

	/* Lying lengths: a length beyond the file or the cap; nothing of that size is allocated. */
	char p[600];
	unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
	ferry_st *st = NULL;
	snprintf(p, sizeof(p), "%s/lie.safetensors", dir);
	write_raw(p, b, 10);
	T_EQ_INT(ferry_st_open(ctx, p, &st), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "exceeds the limit") != NULL);
	b[0] = 50, b[1] = b[2] = b[3] = b[4] = b[5] = b[6] = b[7] = 0;
	write_raw(p, b, 10);
	T_EQ_INT(ferry_st_open(ctx, p, &st), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "past the end") != NULL);
	write_raw(p, b, 5);
	T_EQ_INT(ferry_st_open(ctx, p, &st), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "shorter than") != NULL);
	/* The error names the file and a byte offset. */
	open_err("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "bad.safetensors: safetensors byte 22");
	/* Offsets out of order in the JSON are fine (the reference sorts them). */
	snprintf(p, sizeof(p), "%s/order.safetensors", dir);
	write_st(p, "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
		    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2);
	T_EQ_INT(ferry_st_open(ctx, p, &st), 0);
	if (st) {
		T_EQ_STR(ferry_st_name(st, 0), "a");
		ferry_st_destroy(st);
	}
}

/* safetensors' dtypes: every enum ferry_dtype before FERRY_DT_BYTES */
#define ST_DTYPES FERRY_DT_BYTES

static void fill(unsigned char *b, size_t n, uint32_t seed)
{
	t_fill_pattern(b, n, 0, seed);
}

static void test_roundtrip(void)
{
	char p[600];
	ferry_st_writer *w;
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	unsigned char *bufs[ST_DTYPES + 2];
	uint64_t shape[3] = {3, 5, 4};
	for (int d = 0; d < ST_DTYPES; d++) {
		char name[64];
		uint64_t nb;
		snprintf(name, sizeof(name), "t.%s", ferry_dtype_name(d));
		nb = 60 * (uint64_t)ferry_dtype_bits(d) / 8;
		bufs[d] = malloc(nb);
		fill(bufs[d], nb, (uint32_t)d);
		T_CHECK(ferry_st_writer_add(w, name, d, 3, shape, bufs[d], nb) >= 0);
	}
	uint64_t zero[2] = {0, 7};
	unsigned char scalar[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	T_CHECK(ferry_st_writer_add(w, "empty", FERRY_DT_F32, 2, zero, NULL, 0) >= 0);
	T_CHECK(ferry_st_writer_add(w, "scalar", FERRY_DT_F64, 0, NULL, scalar, 8) >= 0);
	T_EQ_INT(ferry_st_writer_add(w, "bad/name", FERRY_DT_U8, 0, NULL, scalar, 1), -EINVAL);
	T_EQ_INT(ferry_st_writer_add(w, "size", FERRY_DT_U8, 0, NULL, scalar, 2), -EINVAL);
	T_EQ_INT(ferry_st_writer_add(w, "bytes", FERRY_DT_BYTES, 0, NULL, scalar, 1), -EINVAL); /* no safetensors dtype */
	T_EQ_INT(ferry_st_writer_metadata(w, "format", "pt"), 0);
	snprintf(p, sizeof(p), "%s/rt.safetensors", dir);
	int64_t size = ferry_st_writer_save(w, p, FERRY_SAVE_CHECKSUM);
	T_CHECK(size > 0);
	if (size < 0)
		fprintf(stderr, "save: %s\n", ferry_last_error());
	ferry_st *st = NULL;
	T_ASSERT(ferry_st_open(ctx, p, &st) == 0);
	T_EQ_INT(ferry_st_data_start(st) % 4096, 0);
	T_EQ_INT(ferry_st_count(st), ST_DTYPES + 2);
	T_EQ_STR(ferry_st_metadata_get(st, "format"), "pt");
	/* The reference layout: decreasing dtype alignment, then name. */
	T_EQ_STR(ferry_st_name(st, 0), "t.U64");
	for (int d = 0; d < ST_DTYPES; d++) {
		char name[64];
		snprintf(name, sizeof(name), "t.%s", ferry_dtype_name(d));
		int i = ferry_st_find(st, name);
		T_CHECK(i >= 0);
		if (i < 0)
			continue;
		uint64_t nb = ferry_st_nbytes(st, (size_t)i), dims[4];
		T_EQ_INT(nb, 60 * (uint64_t)ferry_dtype_bits(d) / 8);
		T_EQ_INT(ferry_st_dtype(st, (size_t)i), d);
		T_EQ_INT(ferry_st_shape(st, (size_t)i, dims, 4), 3);
		T_EQ_INT(dims[1], 5);
		unsigned char *got = malloc(nb);
		T_EQ_INT(ferry_st_read(st, (size_t)i, got, nb), nb);
		T_CHECK(!memcmp(got, bufs[d], nb));
		T_EQ_INT(ferry_st_verify(st, (size_t)i), 1);
		free(got);
	}
	int e = ferry_st_find(st, "empty"), s = ferry_st_find(st, "scalar");
	T_CHECK(e >= 0 && s >= 0);
	T_EQ_INT(ferry_st_nbytes(st, (size_t)e), 0);
	T_EQ_INT(ferry_st_shape(st, (size_t)s, NULL, 0), 0);
	T_EQ_INT(ferry_st_verify(st, (size_t)e), 1);
	T_EQ_INT(ferry_st_verify(st, (size_t)s), 1);

	/* Slices along each dimension equal the same part of the full tensor. */
	int i = ferry_st_find(st, "t.F32");
	uint32_t full[60], part[60]; /* random bits: compare as integers, not floats (NaN) */
	T_EQ_INT(ferry_st_read(st, (size_t)i, full, sizeof(full)), 240);
	for (int dim = 0; dim < 3; dim++) {
		uint64_t lo = 1, hi = shape[dim];
		ssize_t n = ferry_st_read_slice(st, (size_t)i, dim, lo, hi, part, sizeof(part));
		uint64_t outer = 1, inner = 1;
		for (int k = 0; k < dim; k++)
			outer *= shape[k];
		for (int k = dim + 1; k < 3; k++)
			inner *= shape[k];
		T_EQ_INT(n, (ssize_t)(outer * (hi - lo) * inner * 4));
		int ok = 1;
		for (uint64_t o = 0; o < outer; o++)
			for (uint64_t m = lo; m < hi; m++)
				for (uint64_t q = 0; q < inner; q++)
					ok &= full[(o * shape[dim] + m) * inner + q] == part[(o * (hi - lo) + m - lo) * inner + q];
		T_CHECK(ok);
	}
	T_EQ_INT(ferry_st_read_slice(st, (size_t)i, 1, 2, 6, part, sizeof(part)), -EINVAL);
	T_EQ_INT(ferry_st_read_slice(st, (size_t)i, 3, 0, 1, part, sizeof(part)), -EINVAL);
	ferry_st_destroy(st);

	/* The loader: everything, a subset, a slice, and verified. */
	ferry_st_load *ld;
	T_ASSERT(ferry_st_load_open(ctx, p, &ld) == 0);
	T_EQ_INT(ferry_st_load_count(ld), ST_DTYPES + 2);
	T_EQ_INT(ferry_st_load_run(ld, -1, FERRY_LOAD_VERIFY, 0), 0);
	for (size_t k = 0; k < ferry_st_load_count(ld); k++) {
		const char *nm = ferry_st_load_name(ld, k);
		if (strncmp(nm, "t.", 2))
			continue;
		enum ferry_dtype d;
		T_ASSERT(ferry_dtype_from_name(nm + 2, &d) == 0);
		T_CHECK(!memcmp(ferry_st_load_ptr(ld, k), bufs[d], ferry_st_load_nbytes(ld, k)));
	}
	T_EQ_INT(ferry_st_load_run(ld, -1, 0, 0), 0);
	T_CHECK(!memcmp(ferry_st_load_ptr(ld, (size_t)0), bufs[FERRY_DT_U64], 480));
	/* ferry_st_load_place says where run() put each entry: one region laid out like the file. */
	size_t pf;
	uint64_t poff, plen, base_off = 0, base_len = 0;
	for (size_t k = 0; k < ferry_st_load_count(ld); k++) {
		T_EQ_INT(ferry_st_load_place(ld, k, 0, &pf, &poff, &plen), 1);
		T_EQ_INT(pf, 0);
		if (k == 0) {
			base_off = poff;
			base_len = plen;
		}
		T_EQ_INT(plen, base_len);
		T_CHECK((char *)ferry_st_load_ptr(ld, k) - poff == (char *)ferry_st_load_ptr(ld, 0) - base_off);
	}
	uint64_t total = 0;
	for (size_t k = 0; k < ferry_st_load_count(ld); k++)
		total += ferry_st_load_nbytes(ld, k);
	T_EQ_INT(base_len, total); /* the writer leaves no gap between tensors */
	T_EQ_INT(ferry_st_load_place(ld, 0, FERRY_LOAD_PER_TENSOR, &pf, &poff, &plen), 0);
	T_EQ_INT(ferry_st_load_place(ld, ferry_st_load_count(ld), 0, &pf, &poff, &plen), -EINVAL);
	ferry_st_load_destroy(ld);
	T_ASSERT(ferry_st_load_open(ctx, p, &ld) == 0);
	T_EQ_INT(ferry_st_load_select(ld, "t.BF16"), 0);
	T_EQ_INT(ferry_st_load_select_slice(ld, "t.F32", 2, 1, 3), 0);
	T_EQ_INT(ferry_st_load_select(ld, "nope"), -ENOENT);
	T_EQ_INT(ferry_st_load_count(ld), 2);
	uint64_t dims[3];
	T_EQ_INT(ferry_st_load_shape(ld, 1, dims, 3), 3);
	T_EQ_INT(dims[2], 2);
	/* A slice gets its own allocation; the one whole tensor is its file's region. */
	T_EQ_INT(ferry_st_load_place(ld, 1, 0, &pf, &poff, &plen), 0);
	T_EQ_INT(ferry_st_load_place(ld, 0, 0, &pf, &poff, &plen), 1);
	T_CHECK(poff == 0 && plen == 120);
	T_EQ_INT(ferry_st_load_run(ld, -1, FERRY_LOAD_PER_TENSOR | FERRY_LOAD_VERIFY, 0), 0);
	T_CHECK(!memcmp(ferry_st_load_ptr(ld, 0), bufs[FERRY_DT_BF16], 120));
	uint32_t *sl = ferry_st_load_ptr(ld, 1);
	T_CHECK(sl && sl[0] == full[1] && sl[1] == full[2] && sl[2] == full[5]);
	ferry_st_load_destroy(ld);

	/* A flipped byte in the data: the checksum catches it. */
	int fd = open(p, O_RDWR);
	unsigned char c;
	T_ASSERT(fd >= 0 && pread(fd, &c, 1, (off_t)size - 3) == 1);
	c ^= 0x40;
	T_ASSERT(pwrite(fd, &c, 1, (off_t)size - 3) == 1);
	close(fd);
	T_ASSERT(ferry_st_open(ctx, p, &st) == 0);
	int bad = 0;
	for (size_t k = 0; k < ferry_st_count(st); k++)
		bad += ferry_st_verify(st, k) == FERRY_EVERIFY;
	T_EQ_INT(bad, 1);
	T_CHECK(strstr(ferry_last_error(), "xxh3") != NULL);
	ferry_st_destroy(st);
	T_ASSERT(ferry_st_load_open(ctx, p, &ld) == 0);
	T_EQ_INT(ferry_st_load_run(ld, -1, FERRY_LOAD_VERIFY, 0), FERRY_EVERIFY);
	ferry_st_load_destroy(ld);

	for (int d = 0; d < ST_DTYPES; d++)
		free(bufs[d]);
	ferry_st_writer_destroy(w);
}

/* Larger than one pipeline chunk, several files, an index. */
static void test_sharded(void)
{
	char p[600];
	ferry_st_writer *w;
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	size_t n = (40u << 20) + 12345;
	unsigned char *big = malloc(n), *got;
	fill(big, n, 7);
	for (int f = 0; f < 2; f++) {
		char name[32];
		uint64_t shape[1] = {n / 2 - f};
		snprintf(name, sizeof(name), "big.%d", f);
		T_CHECK(ferry_st_writer_add(w, name, FERRY_DT_U8, 1, shape, big + f, shape[0]) >= 0);
		snprintf(p, sizeof(p), "%s/model-%05d-of-00002.safetensors", dir, f + 1);
		T_CHECK(ferry_st_writer_save_async(w, p, FERRY_SAVE_CHECKSUM) == 0);
		T_CHECK(ferry_st_writer_wait(w, -1) > 0);
		T_EQ_INT(ferry_st_writer_reset(w), 0);
	}
	snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
	const char *idx = "{\"metadata\":{\"total_size\":1},\"weight_map\":{\"big.0\":\"model-00001-of-00002.safetensors\","
			  "\"big.1\":\"model-00002-of-00002.safetensors\"}}";
	write_raw(p, idx, strlen(idx));
	ferry_st_load *ld;
	T_ASSERT(ferry_st_load_open(ctx, dir, &ld) == 0 || (fprintf(stderr, "%s\n", ferry_last_error()), 0));
	T_EQ_INT(ferry_st_load_files(ld), 2);
	T_EQ_INT(ferry_st_load_count(ld), 2);
	T_EQ_INT(ferry_st_load_run(ld, -1, 0, 0), 0);
	for (int f = 0; f < 2; f++) {
		got = ferry_st_load_ptr(ld, (size_t)f);
		T_CHECK(got && !memcmp(got, big + f, n / 2 - (size_t)f));
	}
	T_EQ_INT(ferry_st_load_run(ld, -1, FERRY_LOAD_VERIFY, 1u << 20), 0);
	got = ferry_st_load_ptr(ld, 1);
	T_CHECK(got && !memcmp(got, big + 1, n / 2 - 1));
	ferry_st_load_destroy(ld);
	/* Deep nesting in an index is refused without recursion running away. */
	char deep[300] = "{\"metadata\":";
	for (int i = 0; i < 100; i++)
		strcat(deep, "[");
	write_raw(p, deep, strlen(deep));
	T_EQ_INT(ferry_st_load_open(ctx, p, &ld), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "nested too deeply") != NULL);
	/* An index naming a shard outside its directory is refused. */
	idx = "{\"weight_map\":{\"a\":\"../x.safetensors\"}}";
	write_raw(p, idx, strlen(idx));
	T_EQ_INT(ferry_st_load_open(ctx, p, &ld), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "plain file name") != NULL);
	/* The same through a checkpoint manifest's "shards", and a "file" that is not a string. */
	idx = "{\"shards\":[{\"rank\":0,\"file\":\"a\\\\b.safetensors\"}]}";
	write_raw(p, idx, strlen(idx));
	T_EQ_INT(ferry_st_load_open(ctx, p, &ld), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "plain file name") != NULL);
	idx = "{\"shards\":[{\"file\":1}]}";
	write_raw(p, idx, strlen(idx));
	T_EQ_INT(ferry_st_load_open(ctx, p, &ld), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "byte") != NULL);
	unlink(p);
	free(big);
	ferry_st_writer_destroy(w);
}

/* fallocate stand-ins: record the call and pass it on, or refuse as a file system would. */
static int fa_calls, fa_errno;
static off_t fa_len;
static int fa_stub(int fd, int mode, off_t off, off_t len)
{
	fa_calls++;
	fa_len = off + len;
	if (fa_errno) {
		errno = fa_errno;
		return -1;
	}
	return mode ? -1 : fallocate(fd, mode, off, len);
}

static int leftover_tmp(const char *d)
{
	int n = 0;
	DIR *dp = opendir(d);
	struct dirent *e;
	while (dp && (e = readdir(dp)))
		n += strstr(e->d_name, ".tmp-") != NULL;
	if (dp)
		closedir(dp);
	return n;
}

/* With save_prealloc=on the temporary file is laid out at its final size before the data is written
 * (fallocate); a file system that refuses fallocate gets ftruncate and the save works; a refusal
 * that the writes would meet too (ENOSPC) fails early and leaves PATH as it was. With off no
 * fallocate is made: the file is sized with ftruncate and each write allocates its blocks; the
 * file ends complete, with no hole. The default, auto, is on except on tmpfs. */
static void test_prealloc(void)
{
	char p[600], sub[560];
	snprintf(sub, sizeof(sub), "%s/prealloc", dir);
	mkdir(sub, 0755);
	snprintf(p, sizeof(p), "%s/pre.safetensors", sub);
	size_t nb = (40u << 20) + 12345; /* 3 chunks, the last one short */
	unsigned char *a = malloc(nb), *b = malloc(nb), *got = malloc(nb);
	T_ASSERT(a && b && got);
	fill(a, nb, 7);
	fill(b, nb, 8);
	ferry_st_writer *w;
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	uint64_t shape[1] = {nb};
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, a, nb) >= 0);

	int (*real)(int, int, off_t, off_t) = ferry__save_fallocate;
	ferry__save_fallocate = fa_stub;
	fa_calls = 0;
	fa_errno = 0;
	/* save_prealloc is the writer's knob now, auto by default (test_knobs checks the default) */
	struct statfs sf;
	T_ASSERT(statfs(sub, &sf) == 0);
	int64_t sizea = ferry_st_writer_save(w, p, 0);
	T_CHECK(sizea > (int64_t)nb);
	T_EQ_INT(fa_calls, sf.f_type == TMPFS_MAGIC ? 0 : 1);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_FALLOCATED), sf.f_type == TMPFS_MAGIC ? 0 : 1);
	T_EQ_INT(ferry_st_writer_set(w, "save_prealloc", "off"), 0);
	T_EQ_INT(ferry_st_writer_reset(w), 0);
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, a, nb) >= 0);
	fa_calls = 0;
	int64_t size0 = ferry_st_writer_save(w, p, 0);
	T_CHECK(size0 > (int64_t)nb);
	T_EQ_INT(fa_calls, 0);
	int fd0 = open(p, O_RDONLY);
	T_CHECK(fd0 >= 0);
	T_EQ_INT(lseek(fd0, 0, SEEK_HOLE), size0);
	close(fd0);
	ferry_st *st0 = NULL;
	T_ASSERT(ferry_st_open(ctx, p, &st0) == 0);
	T_EQ_INT(ferry_st_read(st0, 0, got, nb), nb);
	T_CHECK(!memcmp(got, a, nb));
	ferry_st_destroy(st0);
	/* Where the save's time went: the bytes, the slots, and every phase, by name. */
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_BYTES), nb);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_SLOTS), 3);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT__COUNT), 0);
	T_CHECK(ferry_st_writer_phase_ns(w, FERRY_PHASE_CALL_TOTAL) > 0);
	T_CHECK(ferry_st_writer_phase_ns(w, FERRY_PHASE_WRITER_TOTAL) >= ferry_st_writer_phase_ns(w, FERRY_PHASE_WRITER_FSYNC));
	T_EQ_INT(ferry_st_writer_phase_ns(w, FERRY_SAVE_PHASE__COUNT), 0);
	const char *stat_names[] = {"bytes", "slots", "pinned_new_bytes", "fallocated", "recycled", "device_snapshot_bytes"};
	const char *phase_names[] = {"call.check", "call.header", "call.slots", "call.start", "call.copy",
				     "call.slot_wait", "call.sync", "call.total", "ckpt.prepare", "writer.layout",
				     "writer.open", "writer.ready_wait", "writer.event_wait", "writer.hash",
				     "writer.submit", "writer.write_wait", "writer.header", "writer.fsync",
				     "writer.rename", "writer.dirsync", "writer.after", "writer.total"};
	T_EQ_INT(sizeof(stat_names) / sizeof(*stat_names), FERRY_SAVE_STAT__COUNT);
	T_EQ_INT(sizeof(phase_names) / sizeof(*phase_names), FERRY_SAVE_PHASE__COUNT);
	for (int k = 0; k < FERRY_SAVE_STAT__COUNT; k++)
		T_EQ_STR(ferry_save_stat_name(k), stat_names[k]);
	for (int k = 0; k < FERRY_SAVE_PHASE__COUNT; k++)
		T_EQ_STR(ferry_save_phase_name(k), phase_names[k]);
	T_CHECK(ferry_save_stat_name(FERRY_SAVE_STAT__COUNT) == NULL && ferry_save_phase_name(-1) == NULL);
	T_EQ_INT(ferry_st_writer_set(w, "save_prealloc", "on"), 0);
	T_EQ_INT(ferry_st_writer_reset(w), 0);
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, a, nb) >= 0);
	int64_t size = ferry_st_writer_save(w, p, 0);
	T_CHECK(size > (int64_t)nb);
	T_EQ_INT(fa_calls, 1);
	T_EQ_INT(fa_len, size);
	struct stat sb;
	T_ASSERT(stat(p, &sb) == 0);
	T_EQ_INT(sb.st_size, size);
	int fd = open(p, O_RDONLY);
	T_CHECK(fd >= 0);
	T_EQ_INT(lseek(fd, 0, SEEK_HOLE), size); /* no hole left anywhere */
	close(fd);

	const int refusals[] = {EOPNOTSUPP, ENOSYS, EINVAL};
	for (size_t k = 0; k < sizeof(refusals) / sizeof(*refusals); k++) {
		T_EQ_INT(ferry_st_writer_reset(w), 0);
		T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, k % 2 ? a : b, nb) >= 0);
		fa_calls = 0;
		fa_errno = refusals[k];
		T_EQ_INT(ferry_st_writer_save(w, p, 0), size);
		T_EQ_INT(fa_calls, 1);
		ferry_st *st = NULL;
		T_ASSERT(ferry_st_open(ctx, p, &st) == 0);
		T_EQ_INT(ferry_st_read(st, 0, got, nb), nb);
		T_CHECK(!memcmp(got, k % 2 ? a : b, nb));
		ferry_st_destroy(st);
	}

	/* No space: an error before any data is written; the last good file stays, no temporary. */
	T_EQ_INT(ferry_st_writer_reset(w), 0);
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, a, nb) >= 0);
	fa_errno = ENOSPC;
	T_EQ_INT(ferry_st_writer_save(w, p, 0), -ENOSPC);
	T_CHECK(strstr(ferry_last_error(), "fallocate") != NULL);
	ferry__save_fallocate = real;
	fa_errno = 0;
	T_EQ_INT(ferry_st_writer_set(w, "save_prealloc", "auto"), 0);
	T_EQ_INT(leftover_tmp(sub), 0);
	ferry_st *st = NULL;
	T_ASSERT(ferry_st_open(ctx, p, &st) == 0);
	T_EQ_INT(ferry_st_read(st, 0, got, nb), nb);
	T_CHECK(!memcmp(got, b, nb)); /* what the last good save (k = 2) wrote */
	ferry_st_destroy(st);

	ferry_st_writer_destroy(w);
	unlink(p);
	rmdir(sub);
	free(a);
	free(b);
	free(got);
}

/* ferry_st_writer_reserve: the memory of an asynchronous save made ahead (host memory here, so
 * allocated and faulted in rather than pinned), so that the save allocates none; capped by
 * host_budget. */
static void test_reserve(void)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/reserve.safetensors", dir);
	size_t nb = (40u << 20) + 4096; /* 3 slots */
	unsigned char *a = malloc(nb);
	T_ASSERT(a);
	fill(a, nb, 9);
	ferry_st_writer *w;
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	T_EQ_INT(ferry_st_writer_reserve(w, nb, -2), -EINVAL);
	int64_t held = ferry_st_writer_reserve(w, nb, -1);
	T_EQ_INT(held, 48u << 20);
	T_EQ_INT(ferry_st_writer_reserve(w, nb, -1), held); /* the same slots, nothing more */
	uint64_t shape[1] = {nb};
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, a, nb) >= 0);
	T_EQ_INT(ferry_st_writer_save_async(w, p, 0), 0);
	T_CHECK(ferry_st_writer_wait(w, -1) > (int64_t)nb);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_SLOTS), 3);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_PINNED_NEW_BYTES), 0);
	/* save_hold (FERRY_SAVE_HOLD): the writer starts once the snapshot is taken; the file is the same. */
	T_EQ_INT(ferry_st_writer_set(w, "save_hold", "1"), 0);
	T_EQ_INT(ferry_st_writer_save_async(w, p, 0), 0);
	T_CHECK(ferry_st_writer_wait(w, -1) > (int64_t)nb);
	T_EQ_INT(ferry_st_writer_set(w, "save_hold", "0"), 0);
	ferry_st *st = NULL;
	unsigned char *got = malloc(nb);
	T_ASSERT(got && ferry_st_open(ctx, p, &st) == 0);
	T_EQ_INT(ferry_st_read(st, 0, got, nb), nb);
	T_CHECK(!memcmp(got, a, nb));
	ferry_st_destroy(st);
	free(got);
	ferry_st_writer_destroy(w);

	ferry_ctx *small;
	T_ASSERT(ferry_ctx_create(&small) == 0);
	T_EQ_INT(ferry_ctx_set(small, "host_budget", "32m"), 0);
	T_ASSERT(ferry_st_writer_create(small, &w) == 0);
	T_EQ_INT(ferry_st_writer_reserve(w, 1u << 30, -1), 32u << 20);
	ferry_st_writer_destroy(w);
	ferry_ctx_destroy(small);
	unlink(p);
	free(a);
}

/* The data file goes through the durable module: FERRY_SAVE_EXCL never replaces a file that is
 * there (and leaves no temporary), a symlink at PATH is replaced as a name, never followed, and a
 * save into a directory that is a symlink (one the user named) works. */
static void test_durable_save(void)
{
	char sub[560], p[600], victim[600], link[600];
	unsigned char data[4096], got[16];
	uint64_t shape[1] = {sizeof(data)};
	ferry_st_writer *w;
	fill(data, sizeof(data), 3);
	snprintf(sub, sizeof(sub), "%s/durable", dir);
	mkdir(sub, 0755);
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	T_CHECK(ferry_st_writer_add(w, "x", FERRY_DT_U8, 1, shape, data, sizeof(data)) >= 0);
	snprintf(p, sizeof(p), "%s/m.safetensors", sub);
	write_raw(p, "mine", 4);
	T_EQ_INT(ferry_st_writer_save(w, p, FERRY_SAVE_EXCL), -EEXIST);
	int fd = open(p, O_RDONLY);
	T_ASSERT(fd >= 0);
	T_EQ_INT(read(fd, got, sizeof(got)), 4);
	close(fd);
	T_CHECK(memcmp(got, "mine", 4) == 0);
	T_EQ_INT(leftover_tmp(sub), 0);
	/* PATH a symlink to a victim: the save replaces the link, the victim keeps its bytes */
	snprintf(victim, sizeof(victim), "%s/victim", sub);
	write_raw(victim, "keep", 4);
	snprintf(link, sizeof(link), "%s/l.safetensors", sub);
	T_ASSERT(symlink(victim, link) == 0);
	T_CHECK(ferry_st_writer_save(w, link, 0) > 0);
	struct stat st;
	T_ASSERT(lstat(link, &st) == 0);
	T_CHECK(S_ISREG(st.st_mode));
	fd = open(victim, O_RDONLY);
	T_ASSERT(fd >= 0);
	T_EQ_INT(read(fd, got, sizeof(got)), 4);
	close(fd);
	T_CHECK(memcmp(got, "keep", 4) == 0);
	/* a directory given through a symlink */
	snprintf(link, sizeof(link), "%s/dirlink", sub);
	T_ASSERT(symlink(sub, link) == 0);
	snprintf(p, sizeof(p), "%s/dirlink/d.safetensors", sub);
	T_CHECK(ferry_st_writer_save(w, p, 0) > 0);
	snprintf(p, sizeof(p), "%s/d.safetensors", sub);
	T_EQ_INT(access(p, R_OK), 0);
	T_EQ_INT(leftover_tmp(sub), 0);
	ferry_st_writer_destroy(w);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "%s/st-%d", t_tmpdir(), (int)getpid());
	mkdir(dir, 0755);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	test_bad_input();
	test_roundtrip();
	test_sharded();
	test_prealloc();
	test_reserve();
	test_durable_save();
	ferry_ctx_destroy(ctx);
	if (!t_failures) {
		if (t_rmtree(dir))
			fprintf(stderr, "could not remove %s\n", dir);
	}
	return t_result();
}
