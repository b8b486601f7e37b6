/* Compressed files (include/ferry/compress.h, docs/FORMATS.md): round trips for each codec and
 * chunk size on random, zero, text, uint16 token and bf16-like data; ranges across chunk
 * boundaries and to the end; the stock zstd and lz4 tools decoding the file; damaged files
 * (a corrupted chunk, a truncated file, an index pointing past the end, a wrong checksum) giving
 * errors that name the chunk; an aborted writer leaving nothing; the walk that bounds an LZ4 block
 * before nvCOMP. */
#include <dirent.h>
#include <fcntl.h>
#include <lz4.h>
#include <lz4hc.h>
#include <math.h>
#include <time.h>

#include "ferry/compress.h"
#include "ferry_test.h"
#include "base/base.h"
#include "base/xxh.h"
#include "base/lz4_walk.h"
#include "format/cz.h"

static ferry_ctx *ctx;
static char dir[512];

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

enum { D_RANDOM, D_ZERO, D_TEXT, D_TOKENS, D_BF16, D__N };
static const char *dnames[] = {"random", "zero", "text", "tokens", "bf16"};

static void fill(int kind, uint8_t *p, size_t n)
{
	static const char *words[] = {"the ", "of ", "ferry ", "moves ", "bytes ", "between ", "storage ", "and ",
				      "GPU ", "memory, ", "quickly. ", "A ", "chunk ", "is ", "compressed ", "alone\n"};
	size_t i = 0;
	switch (kind) {
	case D_RANDOM:
		for (; i < n; i++)
			p[i] = (uint8_t)(next() >> 24);
		break;
	case D_ZERO:
		memset(p, 0, n);
		break;
	case D_TEXT:
		while (i < n) {
			const char *w = words[next() % 16];
			for (; *w && i < n; w++)
				p[i++] = (uint8_t)*w;
		}
		break;
	case D_TOKENS: /* Zipf-like ids below 50257, little-endian uint16 */
		for (; i + 1 < n; i += 2) {
			double u = (double)(next() >> 11) / 9007199254740992.0;
			uint16_t t = (uint16_t)(pow(50257.0, u * u) - 1);
			p[i] = (uint8_t)t, p[i + 1] = (uint8_t)(t >> 8);
		}
		if (i < n)
			p[i] = 0;
		break;
	case D_BF16: /* normal-ish weights of scale 0.02, bf16: the top half of float32 */
		for (; i + 1 < n; i += 2) {
			double s = 0;
			for (int k = 0; k < 4; k++)
				s += (double)(next() >> 11) / 9007199254740992.0 - 0.5;
			float f = (float)(s * 0.035);
			uint32_t b;
			memcpy(&b, &f, 4);
			p[i] = (uint8_t)(b >> 16), p[i + 1] = (uint8_t)(b >> 24);
		}
		if (i < n)
			p[i] = 0;
		break;
	}
}

static int64_t write_file(const char *path, int codec, const char *chunk, const uint8_t *data, size_t n, int flags)
{
	ferry_cz_writer *w;
	int r = ferry_cz_writer_create(path, codec, flags, &w);
	if (r)
		return r;
	T_EQ_INT(ferry_cz_writer_set(w, "cz_chunk", chunk), 0);
	T_EQ_INT(ferry_cz_writer_set(w, "cz_threads", "2"), 0);
	for (size_t off = 0; off < n && !r;) { /* pieces of odd sizes, as a stream comes */
		size_t k = n - off < 100003 ? n - off : 100003;
		r = ferry_cz_writer_write(w, data + off, k);
		off += k;
	}
	int64_t size = r ? r : ferry_cz_writer_commit(w);
	ferry_cz_writer_destroy(w);
	return size;
}

static void check_range(ferry_cz *z, const uint8_t *data, size_t total, uint64_t off, size_t len, const char *what)
{
	uint8_t *buf = malloc(len + 16);
	memset(buf, 0xA5, len + 16);
	ssize_t got = ferry_cz_pread(z, buf, len, off);
	size_t want = off >= total ? 0 : total - off < len ? total - off : len;
	if (got != (ssize_t)want) {
		fprintf(stderr, "%s: pread(%zu at %llu): %zd, want %zu: %s\n", what, len, (unsigned long long)off, got,
			want, ferry_last_error());
		t_failures++;
	} else if (want && memcmp(buf, data + off, want) != 0) {
		fprintf(stderr, "%s: pread(%zu at %llu): bytes differ\n", what, len, (unsigned long long)off);
		t_failures++;
	}
	free(buf);
}

static int have_tool(const char *t)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", t);
	return system(cmd) == 0;
}

/* The stock tool decodes path into exactly data. */
static void check_tool(const char *tool, const char *path, const uint8_t *data, size_t n)
{
	char cmd[2200], out[800];
	snprintf(out, sizeof(out), "%s.dec", path);
	snprintf(cmd, sizeof(cmd), "%s -d -q -f -c '%s' > '%s'", tool, path, out);
	T_EQ_INT(system(cmd), 0);
	FILE *f = fopen(out, "rb");
	T_ASSERT(f);
	uint8_t *buf = malloc(n + 1);
	size_t got = fread(buf, 1, n + 1, f);
	fclose(f);
	unlink(out);
	T_EQ_INT(got, n);
	if (got == n && memcmp(buf, data, n) != 0) {
		fprintf(stderr, "%s -d %s: bytes differ\n", tool, path);
		t_failures++;
	}
	free(buf);
}

static void round_trips(int tools)
{
	static const char *chunks[] = {"64k", "256k", "1m"};
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++)
		for (int c = 0; c < 3; c++)
			for (int d = 0; d < D__N; d++) {
				uint64_t cs;
				T_EQ_INT(ferry__parse_size(chunks[c], &cs), 0);
				size_t n = (size_t)(3 * cs + 12345);
				uint8_t *data = malloc(n);
				fill(d, data, n);
				char path[700], what[128];
				snprintf(path, sizeof(path), "%s/%s-%s-%s.fz", dir, ferry_cz_codec_name(codec), chunks[c], dnames[d]);
				snprintf(what, sizeof(what), "%s %s %s", ferry_cz_codec_name(codec), chunks[c], dnames[d]);
				int64_t size = write_file(path, codec, chunks[c], data, n, 0);
				if (size < 0) {
					fprintf(stderr, "%s: write: %s\n", what, ferry_last_error());
					t_failures++;
					free(data);
					continue;
				}
				ferry_cz *z;
				int r = ferry_cz_open(ctx, path, &z);
				T_EQ_INT(r, 0);
				if (r) {
					fprintf(stderr, "%s: open: %s\n", what, ferry_last_error());
					free(data);
					continue;
				}
				T_EQ_INT(ferry_cz_size(z), n);
				T_EQ_INT(ferry_cz_codec(z), codec);
				T_EQ_INT(ferry_cz_chunk_size(z), cs);
				T_EQ_INT(ferry_cz_chunks(z), 4);
				T_EQ_INT(ferry_cz_is_compressed(ctx, path), 1);
				if (d == D_RANDOM) /* compression does not pay: every chunk stored */
					T_EQ_INT(ferry_cz_stored_chunks(z), 4);
				else if (d != D_BF16) /* bf16: LZ4 finds few repeats (docs/FORMATS.md) */
					T_EQ_INT(ferry_cz_stored_chunks(z), 0);
				if (d == D_ZERO)
					T_CHECK(ferry_cz_compressed_size(z) * 50 < (int64_t)n);
				check_range(z, data, n, 0, n, what);
				check_range(z, data, n, cs - 5, 10, what);           /* across one boundary */
				check_range(z, data, n, cs / 2, 2 * cs, what);        /* partial, whole, partial */
				check_range(z, data, n, 2 * cs + 1, n, what);         /* to the end (clipped) */
				check_range(z, data, n, n - 7, 7, what);              /* ends at EOF exactly */
				check_range(z, data, n, n, 10, what);                 /* at EOF: 0 */
				check_range(z, data, n, n + 100, 10, what);           /* past it: 0 */
				check_range(z, data, n, 3 * cs, 12345, what);         /* the short last chunk */
				char info[128];
				ferry_cz_path_info(z, info, sizeof(info));
				T_EQ_STR(info, "cpu (host memory)");
				ferry_cz_destroy(z);
				if (tools && c == 1)
					check_tool(ferry_cz_codec_name(codec), path, data, n);
				unlink(path);
				free(data);
			}
}

static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(*n);
	T_ASSERT(fread(b, 1, *n, f) == *n);
	fclose(f);
	return b;
}

static void spit(const char *path, const uint8_t *b, size_t n)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f && fwrite(b, 1, n, f) == n);
	fclose(f);
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Fixes the index's checksum in the trailer and the trailer's own, so only the change is wrong. */
static void reseal(uint8_t *b, size_t n)
{
	uint8_t *t = b + n - FERRY__CZ_TRAILER_LEN;
	uint64_t ioff = get64(t + 32), ilen = get64(t + 40);
	if (ioff + ilen <= n)
		put64(t + 64, ferry__xxh3_64(b + ioff, ilen));
	put64(t + 72, ferry__xxh3_64(t, 72));
}

/* Opens (and when that works, reads all of) path; the error must contain want. */
static void expect_error(const char *path, size_t total, const char *want, const char *what)
{
	ferry_cz *z;
	int r = ferry_cz_open(ctx, path, &z);
	if (!r) {
		uint8_t *buf = malloc(total ? total : 1);
		ssize_t k = ferry_cz_pread(z, buf, total, 0);
		r = k < 0 ? (int)k : 0;
		free(buf);
		ferry_cz_destroy(z);
	}
	if (r != FERRY_ECORRUPT || !strstr(ferry_last_error(), want)) {
		fprintf(stderr, "%s: got %d (%s), want FERRY_ECORRUPT with \"%s\"\n", what, r, ferry_last_error(), want);
		t_failures++;
	}
}

static void damaged(void)
{
	size_t n = 4 * 65536 + 100;
	uint8_t *data = malloc(n);
	fill(D_TEXT, data, n);
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		char good[700], bad[700];
		snprintf(good, sizeof(good), "%s/good-%s.fz", dir, ferry_cz_codec_name(codec));
		snprintf(bad, sizeof(bad), "%s/bad-%s.fz", dir, ferry_cz_codec_name(codec));
		T_ASSERT(write_file(good, codec, "64k", data, n, 0) > 0);
		size_t len;
		uint8_t *b = slurp(good, &len);
		uint8_t *t = b + len - FERRY__CZ_TRAILER_LEN;
		uint64_t ioff = get64(t + 32);
		uint8_t *e2 = b + ioff + FERRY__CZ_INDEX_HEAD + 2 * FERRY__CZ_ENTRY_LEN; /* chunk 2's entry */
		uint64_t c2 = get64(e2);

		/* a byte of chunk 2's frame flipped: its compressed checksum names it */
		b[c2 + 30] ^= 0x40;
		spit(bad, b, len);
		expect_error(bad, n, "chunk 2 (compressed offset", "corrupted chunk");
		b[c2 + 30] ^= 0x40;

		/* the same with cz_verify=0: the decoder or nothing notices; no crash, and no checksum */
		/* the index's checksum of chunk 2's bytes wrong: the decoded bytes' checksum names it */
		e2[16] ^= 1;
		reseal(b, len);
		spit(bad, b, len);
		expect_error(bad, n, "chunk 2 (bytes 131072 to 196608): checksum", "wrong checksum");
		e2[16] ^= 1;

		/* chunk 2's compressed size grown by one: the index's chain breaks at chunk 2 */
		e2[32] += 1;
		reseal(b, len);
		spit(bad, b, len);
		expect_error(bad, n, "chunk 3: compressed offset", "index pointing past its chunk");
		e2[32] -= 1;

		/* the index's own checksum wrong */
		e2[8] ^= 1;
		spit(bad, b, len);
		expect_error(bad, n, "index at offset", "index checksum");
		e2[8] ^= 1;

		/* the trailer's index offset past the end of the file */
		uint8_t save[8];
		memcpy(save, t + 32, 8);
		put64(t + 32, len + 4096);
		reseal(b, len);
		spit(bad, b, len);
		expect_error(bad, n, "trailer: index offset", "index past the end");
		memcpy(t + 32, save, 8);
		reseal(b, len);

		/* truncated: the trailer is gone, or the chunks are cut with the trailer moved up */
		spit(bad, b, len - 10);
		expect_error(bad, n, "not a ferry compressed file", "truncated file");
		spit(bad, b, 40);
		expect_error(bad, n, "too short", "truncated to 40 bytes");

		/* chunk 3's last entry claims a frame past the index (the chunks end there) */
		uint8_t *e3 = e2 + FERRY__CZ_ENTRY_LEN;
		uint8_t keep[4];
		memcpy(keep, e3 + 32, 4);
		e3[35] = 0x7f;
		reseal(b, len);
		spit(bad, b, len);
		expect_error(bad, n, "chunk 3: compressed size", "chunk past the end");
		memcpy(e3 + 32, keep, 4);
		reseal(b, len);

		/* the untouched copy still reads */
		spit(bad, b, len);
		ferry_cz *z;
		T_EQ_INT(ferry_cz_open(ctx, bad, &z), 0);
		check_range(z, data, n, 0, n, "resealed copy");
		ferry_cz_destroy(z);
		unlink(bad);
		unlink(good);
		free(b);
	}
	free(data);
}

static int count_entries(const char *d)
{
	DIR *dp = opendir(d);
	int k = 0;
	for (struct dirent *e; dp && (e = readdir(dp));)
		k += e->d_name[0] != '.' || (e->d_name[1] && strcmp(e->d_name, ".."));
	if (dp)
		closedir(dp);
	return k;
}

static void writer_lifecycle(void)
{
	char sub[600], path[700];
	snprintf(sub, sizeof(sub), "%s/life", dir);
	mkdir(sub, 0755);
	snprintf(path, sizeof(path), "%s/a.fz", sub);
	uint8_t data[5000];
	fill(D_TEXT, data, sizeof(data));
	/* aborted: nothing left */
	ferry_cz_writer *w;
	T_EQ_INT(ferry_cz_writer_create(path, FERRY_CZ_ZSTD, 0, &w), 0);
	T_EQ_INT(ferry_cz_writer_write(w, data, sizeof(data)), 0);
	T_EQ_INT(ferry_cz_writer_set(w, "cz_level", "5"), FERRY_EBUSY);
	ferry_cz_writer_destroy(w);
	T_EQ_INT(count_entries(sub), 0);
	/* empty file */
	T_CHECK(write_file(path, FERRY_CZ_LZ4, "64k", data, 0, 0) > 0);
	ferry_cz *z;
	T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
	T_EQ_INT(ferry_cz_size(z), 0);
	T_EQ_INT(ferry_cz_chunks(z), 0);
	T_EQ_INT(ferry_cz_pread(z, data, 10, 0), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_chunk", "1m"), FERRY_EBADOPT);
	T_EQ_INT(ferry_cz_set(z, "cz_verify", "0"), 0);
	ferry_cz_destroy(z);
	/* FERRY_CZ_EXCL over an existing file: -EEXIST, the file as it was, no temporary left */
	T_EQ_INT(write_file(path, FERRY_CZ_ZSTD, "64k", data, sizeof(data), FERRY_CZ_EXCL), -EEXIST);
	T_EQ_INT(count_entries(sub), 1);
	T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
	T_EQ_INT(ferry_cz_codec(z), FERRY_CZ_LZ4);
	ferry_cz_destroy(z);
	/* replaced without it */
	T_CHECK(write_file(path, FERRY_CZ_ZSTD, "64k", data, sizeof(data), 0) > 0);
	T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
	T_EQ_INT(ferry_cz_codec(z), FERRY_CZ_ZSTD);
	check_range(z, data, sizeof(data), 0, sizeof(data), "replaced");
	ferry_cz_destroy(z);
	T_EQ_INT(count_entries(sub), 1);
	/* not compressed: a plain file */
	snprintf(path, sizeof(path), "%s/plain", sub);
	spit(path, data, sizeof(data));
	T_EQ_INT(ferry_cz_is_compressed(ctx, path), 0);
	T_EQ_INT(ferry_cz_open(ctx, path, &z), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "not a ferry compressed file") != NULL);
	T_EQ_INT(ferry_cz_codec_from_name("gzip"), FERRY_EBADOPT);
	T_EQ_INT(ferry_cz_writer_create(path, 7, 0, &w), FERRY_EBADOPT);
	T_EQ_INT(t_rmtree(sub), 0);
}

/* Reads of many windows (cz_threads=1: 4 chunks each), the next window's bytes read ahead while
 * one decodes: whole, from the middle of a window to the middle of another, the last windows. */
static void windows(void)
{
	size_t n = 21 * 65536 + 999;
	uint8_t *data = malloc(n);
	fill(D_TOKENS, data, n);
	char path[700];
	snprintf(path, sizeof(path), "%s/windows.fz", dir);
	T_ASSERT(write_file(path, FERRY_CZ_ZSTD, "64k", data, n, 0) > 0);
	ferry_cz *z;
	T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
	T_EQ_INT(ferry_cz_chunks(z), 22);
	for (int t = 1; t <= 3; t++) {
		char th[4];
		snprintf(th, sizeof(th), "%d", t);
		T_EQ_INT(ferry_cz_set(z, "cz_threads", th), 0);
		check_range(z, data, n, 0, n, "windows: whole");
		check_range(z, data, n, 3 * 65536 + 17, 9 * 65536, "windows: across three");
		check_range(z, data, n, 15 * 65536 - 1, n, "windows: the last ones");
	}
	ferry_cz_destroy(z);
	unlink(path);
	free(data);
}

/* Stored chunks (random data) read into host memory go straight from the file into the buffer,
 * their frames' headers unread: whole, from inside a chunk (the chunk at each end decoded through
 * its frame), a file mixing stored and compressed chunks, 1 and 2 threads. A stored chunk's
 * damaged frame header shows which way ran: a read of the whole chunk (straight) does not read
 * it, a read from inside the chunk (through the frame) names it. A flipped byte in chunk 2's
 * bytes is named by its checksum, and read as is with cz_verify=0. */
static void stored_direct(void)
{
	size_t n = 12 * 65536 + 5000;
	uint8_t *data = malloc(n);
	fill(D_RANDOM, data, n);
	fill(D_TEXT, data + 6 * 65536, 3 * 65536); /* chunks 6-8 compress */
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		char path[700], bad[700];
		snprintf(path, sizeof(path), "%s/stored-%s.fz", dir, ferry_cz_codec_name(codec));
		snprintf(bad, sizeof(bad), "%s/stored-bad-%s.fz", dir, ferry_cz_codec_name(codec));
		T_ASSERT(write_file(path, codec, "64k", data, n, 0) > 0);
		ferry_cz *z;
		T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
		T_EQ_INT(ferry_cz_stored_chunks(z), 10);
		for (int t = 1; t <= 2; t++) {
			T_EQ_INT(ferry_cz_set(z, "cz_threads", t == 1 ? "1" : "2"), 0);
			check_range(z, data, n, 0, n, "stored: whole, mixed");
			check_range(z, data, n, 65536 + 7, 4 * 65536, "stored: from inside a chunk");
			check_range(z, data, n, 9 * 65536, n, "stored: the last, short one");
			check_range(z, data, n, 2 * 65536, 2 * 65536, "stored: chunks 2 and 3");
		}
		ferry_cz_destroy(z);
		size_t len;
		uint8_t *b = slurp(path, &len);
		uint64_t ioff = get64(b + len - FERRY__CZ_TRAILER_LEN + 32);
		uint64_t c2 = get64(b + ioff + FERRY__CZ_INDEX_HEAD + 2 * FERRY__CZ_ENTRY_LEN); /* chunk 2's frame */
		b[c2] ^= 0x01; /* its magic */
		spit(bad, b, len);
		T_EQ_INT(ferry_cz_open(ctx, bad, &z), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_threads", "2"), 0);
		check_range(z, data, n, 2 * 65536, 2 * 65536, "stored: straight, the frame's header unread");
		uint8_t *part = malloc(65536);
		T_EQ_INT(ferry_cz_pread(z, part, 1000, 2 * 65536 + 5), FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "chunk 2 (compressed offset") != NULL);
		free(part);
		ferry_cz_destroy(z);
		b[c2] ^= 0x01;
		b[c2 + 40] ^= 0x40; /* inside its bytes (LZ4's payload from byte 19, zstd's first raw block from 16) */
		spit(bad, b, len);
		expect_error(bad, n, "chunk 2 (bytes 131072 to 196608): checksum", "stored chunk corrupted");
		ferry_cz *g;
		T_EQ_INT(ferry_cz_open(ctx, bad, &g), 0);
		T_EQ_INT(ferry_cz_set(g, "cz_verify", "0"), 0);
		uint8_t *back = malloc(n);
		T_EQ_INT(ferry_cz_pread(g, back, n, 0), (ssize_t)n);
		T_CHECK(back[2 * 65536 + 40 - (codec == FERRY_CZ_LZ4 ? 19 : 16)] == (data[2 * 65536 + 40 - (codec == FERRY_CZ_LZ4 ? 19 : 16)] ^ 0x40));
		b[c2 + 40] ^= 0x40;
		T_CHECK(memcmp(back, data, 2 * 65536) == 0 && memcmp(back + 3 * 65536, data + 3 * 65536, n - 3 * 65536) == 0);
		free(back);
		ferry_cz_destroy(g);
		free(b);
		unlink(bad);
		unlink(path);
	}
	free(data);
}

/* A cold read (pages dropped) of a file whose chunks all compress: each window is read in whole
 * 4 KiB blocks into an aligned buffer, so the engine's O_DIRECT descriptor takes it with no bounce
 * (before, every window's chunk I/O went through a bounce slot: frames start anywhere). Where the
 * file system refuses O_DIRECT there is nothing to check: said, and the bytes still compared. */
static void aligned_reads(void)
{
	size_t n = 40 * 65536 + 777;
	uint8_t *data = malloc(n);
	fill(D_TEXT, data, n);
	char path[700];
	snprintf(path, sizeof(path), "%s/aligned.fz", dir);
	T_ASSERT(write_file(path, FERRY_CZ_ZSTD, "64k", data, n, 0) > 0);
	ferry_file *f;
	T_EQ_INT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f), 0);
	int direct = ferry_file_is_direct(f);
	ferry_file_destroy(f);
	for (int t = 1; t <= 2; t++) {
		ferry_cz *z;
		T_EQ_INT(ferry_cz_open(ctx, path, &z), 0);
		T_EQ_INT(ferry_cz_stored_chunks(z), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_threads", t == 1 ? "1" : "2"), 0);
		int fd = open(path, O_RDONLY);
		T_ASSERT(fd >= 0);
		T_EQ_INT(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
		close(fd);
		uint64_t b0 = ferry_ctx_stat(ctx, FERRY_STAT_BOUNCED_CHUNKS), d0 = ferry_ctx_stat(ctx, FERRY_STAT_DIRECT_CHUNKS);
		check_range(z, data, n, 0, n, "aligned: whole, cold");
		uint64_t bounced = ferry_ctx_stat(ctx, FERRY_STAT_BOUNCED_CHUNKS) - b0;
		uint64_t direct_chunks = ferry_ctx_stat(ctx, FERRY_STAT_DIRECT_CHUNKS) - d0;
		printf("aligned, %d thread(s): %llu chunk I/Os direct, %llu bounced (%s)\n", t, (unsigned long long)direct_chunks,
		       (unsigned long long)bounced, direct ? "O_DIRECT" : "the file system refused O_DIRECT: not checked");
		if (direct) {
			T_EQ_INT(bounced, 0);
			T_CHECK(direct_chunks > 0);
		}
		ferry_cz_destroy(z);
	}
	unlink(path);
	free(data);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * The walk that bounds an LZ4 block before nvCOMP decodes it (ferry__lz4_walk): every block
 * liblz4 writes (fast and HC, each data kind, sizes from 1 byte to 1 MiB) is taken at its size and
 * refused at one byte less or more and cut short; of a text block's single-byte changes, whatever
 * it takes liblz4 decodes to the size (the fuzz target, fuzz_lz4_block, goes further), and some
 * are refused. Prints the walk's rate beside the decoder's on token chunks.
 */
static void lz4_walk(void)
{
	static const size_t sizes[] = {1, 15, 100, 4096, 65536, 1u << 20};
	size_t cap = (size_t)LZ4_compressBound(1 << 20);
	uint8_t *src = malloc(1u << 20), *blk = malloc(cap), *dst = malloc((1u << 20) + 1);
	T_ASSERT(src && blk && dst);
	int taken = 0;
	for (int kind = 0; kind < 5; kind++)
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
			for (int hc = 0; hc < 2; hc++) {
				size_t n = sizes[si];
				fill(kind, src, n);
				int c = hc ? LZ4_compress_HC((char *)src, (char *)blk, (int)n, (int)cap, 9)
					   : LZ4_compress_default((char *)src, (char *)blk, (int)n, (int)cap);
				T_ASSERT(c > 0);
				int ok = ferry__lz4_walk(blk, (size_t)c, n) == 0;
				T_CHECK(ok);
				if (!ok)
					printf("lz4 walk: %s %zu bytes (%s) refused\n", dnames[kind], n, hc ? "HC" : "fast");
				taken += ok;
				T_EQ_INT(ferry__lz4_walk(blk, (size_t)c, n + 1), -1);
				if (n > 1)
					T_EQ_INT(ferry__lz4_walk(blk, (size_t)c, n - 1), -1);
				if (c > 1)
					T_EQ_INT(ferry__lz4_walk(blk, (size_t)c - 1, n), -1);
			}
	T_EQ_INT(taken, 60);
	/* single-byte changes of a 4 KiB text block */
	fill(D_TEXT, src, 4096);
	int c = LZ4_compress_default((char *)src, (char *)blk, 4096, (int)cap), accepted = 0, refused = 0;
	T_ASSERT(c > 0);
	for (int at = 0; at < c; at++)
		for (int x = 1; x < 256; x <<= 1) {
			blk[at] ^= (uint8_t)x;
			if (ferry__lz4_walk(blk, (size_t)c, 4096) == 0) {
				accepted++;
				T_EQ_INT(LZ4_decompress_safe((char *)blk, (char *)dst, c, 4096), 4096);
			} else {
				refused++;
			}
			blk[at] ^= (uint8_t)x;
		}
	printf("lz4 walk: of %d single-bit changes of a 4 KiB text block, %d taken (liblz4 decodes each to 4096 bytes), %d refused\n",
	       accepted + refused, accepted, refused);
	T_CHECK(accepted > 0 && refused > 0);
	/* the walk's cost beside the decoder's: tokens, 1 MiB chunks */
	fill(D_TOKENS, src, 1u << 20);
	c = LZ4_compress_default((char *)src, (char *)blk, 1 << 20, (int)cap);
	double tw = 1e9, td = 1e9;
	for (int r = 0; r < 5; r++) {
		double t0 = now_s();
		T_EQ_INT(ferry__lz4_walk(blk, (size_t)c, 1u << 20), 0);
		double t1 = now_s();
		T_EQ_INT(LZ4_decompress_safe((char *)blk, (char *)dst, c, 1 << 20), 1 << 20);
		double t2 = now_s();
		tw = t1 - t0 < tw ? t1 - t0 : tw;
		td = t2 - t1 < td ? t2 - t1 : td;
	}
	printf("lz4 walk: tokens, 1 MiB (ratio %.2f): the walk %.2f GB/s, LZ4_decompress_safe %.2f GB/s (of output, one core)\n",
	       (double)(1 << 20) / c, (1 << 20) / tw / 1e9, (1 << 20) / td / 1e9);
	free(src);
	free(blk);
	free(dst);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "%s/test_compress.%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	int tools = have_tool("zstd") && have_tool("lz4");
	round_trips(tools);
	damaged();
	windows();
	stored_direct();
	aligned_reads();
	writer_lifecycle();
	lz4_walk();
	ferry_ctx_destroy(ctx);
	rmdir(dir);
	if (t_failures || tools)
		return t_result();
	T_SKIP("everything else passed; the stock zstd and lz4 tools are not installed (apt-get install zstd lz4), so their decoding of ferry's files was not checked");
}
