/* The data of the loader's tests over compressed shards (tests/unit/test_loader_cz.c, the host
 * path; tests/gpu/test_loader_cz_gpu.c, decoding on the GPU, also run over the fake driver and
 * nvCOMP by tests/unit/test_loader_cz_device.c): a plain dataset of N uint16 samples in 3 MiB
 * shards, the same shards compressed, and a reader of the loader's batches that checks each
 * sample's bytes. */
#ifndef FERRY_LOADER_CZ_DATA_H
#define FERRY_LOADER_CZ_DATA_H

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/compress.h"
#include "ferry/data.h"
#include "cz_files.h"
#include "ferry/gpu.h"
#include "ferry_test.h"
#include "unit/loader_test.h"

static ferry_ctx *ctx;
static char dir[512]; /* the test's own directory (lcz_begin) */
static uint64_t N;
static uint8_t *stream;
static uint64_t *soff;
static int lcz_noise; /* make_plain: the first 1.5 MiB of every 4 MiB random (stored chunks) */

static size_t slen(uint64_t i) { return 2 * (700 + (i * 389) % 1400); }

/* Compressible bytes (small values with runs): zstd and LZ4 both compress them, so chunks are
 * real frames, not stored ones (except where lcz_noise makes them random). */
static void fill(uint8_t *p, uint64_t n)
{
	uint64_t s = 11;
	for (uint64_t k = 0; k < n; k++) {
		if (lcz_noise && k % (4u << 20) < (3u << 19))
			p[k] = (uint8_t)(t_rand(&s) >> 24);
		else
			p[k] = (k & 15) ? p[k - 1] + (uint8_t)(t_rand(&s) % 3) : (uint8_t)(t_rand(&s) % 40);
	}
}

static void make_plain(const char *path)
{
	uint64_t total = 0;
	free(stream), free(soff);
	for (N = 0; total < (9u << 20); N++)
		total += slen(N);
	T_ASSERT(write_samples(ctx, path, 3u << 20, N, slen, fill, &stream, &soff) >= 3);
}

static uint8_t *slurp(const char *p, size_t *len)
{
	int fd = open(p, O_RDONLY);
	T_ASSERT(fd >= 0);
	struct stat st;
	T_ASSERT(fstat(fd, &st) == 0);
	uint8_t *b = malloc((size_t)st.st_size + 1);
	T_ASSERT(pread(fd, b, (size_t)st.st_size, 0) == st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return b;
}

static void spit(const char *p, const uint8_t *b, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	T_ASSERT(write(fd, b, len) == (ssize_t)len);
	close(fd);
}

/* The test's context and its directory, t_tmpdir()/name.pid, made; lcz_end removes both. */
static void lcz_begin(const char *name)
{
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(dir, sizeof(dir), "%s/%s.%d", t_tmpdir(), name, (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
}

static void lcz_end(void)
{
	ferry_ctx_destroy(ctx);
	ctx = NULL;
	if (t_rmtree(dir))
		fprintf(stderr, "could not remove %s\n", dir);
}

/* dst: src's shards compressed in chunks of chunk ("1m", "64k": kib KiB), its index copied.
 * Returns the chunks written. */
static uint64_t make_cz_chunks(const char *src, const char *dst, int codec, const char *chunk, uint64_t kib)
{
	char a[700], b[700];
	uint64_t chunks = 0;
	T_ASSERT(mkdir(dst, 0755) == 0);
	for (int s = 0;; s++) {
		snprintf(a, sizeof(a), "%s/shard-%05d.fsh", src, s);
		if (access(a, F_OK))
			break;
		snprintf(b, sizeof(b), "%s/shard-%05d.fsh", dst, s);
		size_t len;
		uint8_t *buf = slurp(a, &len);
		compress(b, codec, chunk, buf, len);
		chunks += (len + (kib << 10) - 1) / (kib << 10);
		free(buf);
	}
	snprintf(a, sizeof(a), "%s/ferry.idx", src);
	snprintf(b, sizeof(b), "%s/ferry.idx", dst);
	size_t len;
	uint8_t *buf = slurp(a, &len);
	spit(b, buf, len);
	free(buf);
	return chunks;
}

/* dst: src's shards compressed (1 MiB chunks), its index copied. Returns the chunks written. */
static uint64_t make_cz(const char *src, const char *dst, int codec) { return make_cz_chunks(src, dst, codec, "1m", 1024); }

/* Flips a byte inside chunk 1's frame of cz_path's shard 1; returns the frame's offset. */
static uint64_t damage_chunk1(const char *cz_path)
{
	char f[700];
	snprintf(f, sizeof(f), "%s/shard-00001.fsh", cz_path);
	size_t len;
	uint8_t *b = slurp(f, &len);
	uint64_t index = 0;
	memcpy(&index, b + len - 80 + 32, 8);
	uint64_t c1 = 0;
	memcpy(&c1, b + index + 24 + 48, 8);
	b[c1 + 100] ^= 0xff;
	spit(f, b, len);
	free(b);
	return c1;
}

/* The loader over a dataset damaged by damage_chunk1 (c1: the frame's offset) fails with
 * FERRY_ECORRUPT naming the shard and the chunk. */
static void expect_damaged(ferry_loader *l, uint64_t c1)
{
	ferry_loader_batch *bt;
	int r;
	while ((r = ferry_loader_next(l, &bt)) == 1)
		ferry_loader_batch_destroy(bt);
	T_EQ_INT(r, FERRY_ECORRUPT);
	char want[64];
	snprintf(want, sizeof(want), "chunk 1 (compressed offset %llu", (unsigned long long)c1);
	printf("damaged: %s\n", ferry_last_error());
	T_CHECK(strstr(ferry_last_error(), want) && strstr(ferry_last_error(), "shard-00001.fsh"));
}

/* Up to max batches (0: the epoch), each sample's bytes checked (copied out of device memory
 * first where the loader is on a device); indices appended to out. */
static uint64_t drain(ferry_loader *l, int64_t *out, uint64_t max)
{
	uint64_t k = 0, b = 0;
	ferry_loader_batch *bt;
	int r = 1;
	uint8_t *host = NULL;
	size_t host_cap = 0;
	while ((!max || b < max) && (r = ferry_loader_next(l, &bt)) == 1) {
		const uint8_t *d = ferry_loader_batch_data(bt);
		const uint64_t *o = ferry_loader_batch_offsets(bt);
		const int64_t *ix = ferry_loader_batch_indices(bt);
		uint32_t ns = ferry_loader_batch_samples(bt);
		int dev = -1;
		if (ns && ferry_mem_kind(d, &dev) == FERRY_MEM_DEVICE) {
			if (o[ns] > host_cap) {
				free(host);
				host_cap = o[ns];
				T_ASSERT((host = malloc(host_cap)) != NULL);
			}
			T_ASSERT(ferry_gpu_memcpy_dtoh(host, d, o[ns]) == 0);
			d = host;
		}
		for (uint32_t s = 0; s < ns; s++) {
			size_t len = slen((uint64_t)ix[s]);
			if (o[s + 1] - o[s] != len || memcmp(d + o[s], stream + soff[ix[s]], len)) {
				fprintf(stderr, "batch %llu sample %u (index %lld): wrong bytes\n", (unsigned long long)b, s,
					(long long)ix[s]);
				t_failures++;
			}
			out[k++] = ix[s];
		}
		ferry_loader_batch_destroy(bt);
		b++;
	}
	free(host);
	if (r < 0)
		fprintf(stderr, "loader: %s\n", ferry_last_error());
	T_CHECK(r >= 0);
	return k;
}

static void check_once(const int64_t *got, uint64_t k)
{
	T_EQ_INT(k, N);
	uint8_t *seen = calloc(N, 1);
	for (uint64_t i = 0; i < k; i++) {
		T_CHECK(got[i] >= 0 && (uint64_t)got[i] < N && !seen[got[i]]);
		if (got[i] >= 0 && (uint64_t)got[i] < N)
			seen[got[i]] = 1;
	}
	free(seen);
}

#endif
