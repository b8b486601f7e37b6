/* Compressed files read into device memory (include/ferry/compress.h): for each codec, the whole
 * file and ranges that cross chunk boundaries and end at the end, decoded with cz_gpu=off (the CPU
 * and the copy ring) and cz_gpu=auto (nvCOMP where it is loaded), each compared with the data; the
 * file mixes compressible chunks with a stored (random) one. Prints the path each read took. With
 * cz_gpu=on, a machine without nvCOMP must refuse (FERRY_EBACKEND) rather than fall back. Reads go
 * through the pipeline in windows of 1-2 chunks (several in flight); a read of fewer chunks than
 * cz_gpu_min decodes on the CPU under auto and says so. A crafted LZ4 block (it decodes past its
 * chunk, every checksum made to match) is refused by name, never handed to nvCOMP (lz4_crafted). */
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "base/byteorder.h"
#include "base/lz4_walk.h"
#include "base/xxh.h"
#include "format/cz.h"
#include "gpu/nvcomp.h"
#include "cz_files.h"
#include "ferry_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static void check(ferry_cz *z, void *dev, const uint8_t *data, size_t n, uint64_t off, size_t len, const char *what)
{
	uint8_t *host = malloc(len);
	memset(host, 0xEE, len); /* the destination poisoned, so no earlier read's bytes pass */
	T_EQ_INT(ferry_gpu_memcpy_htod(dev, host, len), 0);
	ssize_t want = off >= n ? 0 : (ssize_t)(n - off < len ? n - off : len);
	ssize_t got = ferry_cz_pread(z, dev, len, off);
	char info[256];
	ferry_cz_path_info(z, info, sizeof(info));
	if (got != want) {
		fprintf(stderr, "%s: pread(%zu at %llu) into device memory: %zd, want %zd: %s\n", what, len,
			(unsigned long long)off, got, want, ferry_last_error());
		t_failures++;
	} else if (want) {
		T_EQ_INT(ferry_gpu_memcpy_dtoh(host, dev, (size_t)want), 0);
		if (memcmp(host, data + off, (size_t)want)) {
			fprintf(stderr, "%s: pread(%zu at %llu) into device memory: bytes differ (%s)\n", what, len,
				(unsigned long long)off, info);
			t_failures++;
		}
	}
	printf("%s: %zu bytes at %llu: %s\n", what, len, (unsigned long long)off, info);
	free(host);
}

/* A copy of path with one byte of a compressed chunk near its end flipped: a read of the whole
 * file fails with FERRY_ECORRUPT naming a chunk, into host and device memory, with windows of 1-2
 * chunks (the damaged one while others are in flight), and the same reader then reads an
 * undamaged range right (nothing stale left in its slots). */
static void damaged(ferry_ctx *ctx, const char *path, void *dev, const uint8_t *data, size_t cs)
{
	char bad[600];
	snprintf(bad, sizeof(bad), "%s.damaged", path);
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	uint8_t *b = malloc(16 << 20);
	size_t n = fread(b, 1, 16 << 20, f);
	fclose(f);
	ferry_cz *z;
	T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
	size_t at = (size_t)(ferry_cz_compressed_size(z) * 9 / 10); /* inside a compressed frame past the stored chunk 4 (the index and trailer come after) */
	size_t total = (size_t)ferry_cz_size(z);
	ferry_cz_destroy(z);
	b[at] ^= 0x5A;
	f = fopen(bad, "wb");
	T_ASSERT(f && fwrite(b, 1, n, f) == n);
	fclose(f);
	T_ASSERT(ferry_cz_open(ctx, bad, &z) == 0);
	T_EQ_INT(ferry_cz_set(z, "cz_threads", "1"), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_window", "512k"), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
	uint8_t *host = malloc(total);
	for (int g = 0; g < 3; g++) { /* host memory; device memory with cz_gpu=off, auto */
		if (g)
			T_EQ_INT(ferry_cz_set(z, "cz_gpu", g == 1 ? "off" : "auto"), 0);
		ssize_t r = ferry_cz_pread(z, g ? dev : (void *)host, total, 0);
		T_EQ_INT(r, FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "chunk ") != NULL);
		printf("damaged at byte %zu, %s: %s\n", at, g == 0 ? "host" : g == 1 ? "cz_gpu=off" : "cz_gpu=auto",
		       ferry_last_error());
		memset(host, 0xEE, total);
		if (g)
			T_EQ_INT(ferry_gpu_memcpy_htod(dev, host, 2 * cs), 0);
		T_EQ_INT(ferry_cz_pread(z, g ? dev : (void *)host, 2 * cs, 0), 2 * cs);
		if (g)
			T_EQ_INT(ferry_gpu_memcpy_dtoh(host, dev, 2 * cs), 0);
		T_CHECK(memcmp(host, data, 2 * cs) == 0);
	}
	ferry_cz_destroy(z);
	free(host), free(b);
	unlink(bad);
}

/*
 * An LZ4 block made to decode to more than its chunk, its frame's checksum, the index's and the
 * trailer's made to match (a crafted file): nvCOMP, which does not bound its output, never decodes
 * it. With cz_gpu=on the walk refuses it, naming the chunk: on the GPU before nvCOMP runs where
 * ferry's kernels load (the GPU machine), else on the host before the batch (the fakes without
 * kernels, test_compress_device); with cz_gpu=off the CPU decoder does.
 */
static void lz4_crafted(ferry_ctx *ctx)
{
	const size_t cs = 64 << 10, n = 12 * cs;
	uint8_t *data = malloc(n);
	T_ASSERT(data);
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)((i / 7) % 61 + (i % 13 == 0 ? i >> 9 : 0));
	char path[512];
	snprintf(path, sizeof(path), "%s/test_compress_device.%d.crafted", t_tmpdir(), (int)getpid());
	compress(path, FERRY_CZ_LZ4, "64k", data, n);
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	fseek(f, 0, SEEK_END);
	size_t len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(len);
	T_ASSERT(b && fread(b, 1, len, f) == len);
	fclose(f);
	uint8_t *t = b + len - FERRY__CZ_TRAILER_LEN;
	uint8_t *idx = b + ferry__rd64(t + 32), *e5 = idx + FERRY__CZ_INDEX_HEAD + 5 * FERRY__CZ_ENTRY_LEN;
	uint64_t c5 = ferry__rd64(e5);
	uint32_t c5_size = ferry__rd32(e5 + 32);
	T_EQ_INT(ferry__rd32(e5 + 44), 0); /* compressed, not stored */
	/* the first sequence's match one byte longer: every byte after it moves, and the block decodes
	 * to one more than its chunk */
	t_lz4_longer(b + c5 + FERRY__CZ_LZ4_PAYLOAD);
	T_EQ_INT(ferry__lz4_walk(b + c5 + FERRY__CZ_LZ4_PAYLOAD, c5_size - FERRY__CZ_LZ4_PAYLOAD - 4, cs), -1);
	ferry__wr64(e5 + 24, ferry__xxh3_64(b + c5, c5_size));
	ferry__wr64(t + 64, ferry__xxh3_64(idx, ferry__rd64(t + 40)));
	ferry__wr64(t + 72, ferry__xxh3_64(t, 72));
	f = fopen(path, "wb");
	T_ASSERT(f && fwrite(b, 1, len, f) == len);
	fclose(f);
	void *dev;
	T_ASSERT(ferry_gpu_malloc(0, n, &dev) == 0);
	const char *fk = getenv("FERRY_FAKE_KERNELS");
	if (fk && !strcmp(fk, "1")) /* the fakes' run with ferry's kernels: the walk is the GPU's */
		T_CHECK(ferry__nvc_walks_lz4(0));
	for (int on = 0; on < 2; on++) {
		ferry_cz *z;
		T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
		T_EQ_INT(ferry_cz_set(z, "cz_gpu", on ? "on" : "off"), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_window", "128k"), 0); /* chunk 5 in a window of its own pair */
		ssize_t r = ferry_cz_pread(z, dev, n, 0);
		if (on && r == FERRY_EBACKEND) { /* no nvCOMP here: cz_gpu=on refuses, saying why */
			printf("crafted LZ4 block, cz_gpu=on: refused: %s\n", ferry_last_error());
			ferry_cz_destroy(z);
			continue;
		}
		T_EQ_INT(r, FERRY_ECORRUPT);
		/* on: the walk's refusal, the GPU's (before nvCOMP ran) or the host's (malformed) */
		const char *walk = ferry__nvc_walks_lz4(0) ? "refused before nvCOMP ran" : "LZ4 block: malformed or does not decode";
		if (!strstr(ferry_last_error(), "chunk 5 (compressed offset") || (on && !strstr(ferry_last_error(), walk))) {
			fprintf(stderr, "crafted LZ4 block, cz_gpu=%s: %s\n", on ? "on" : "off", ferry_last_error());
			t_failures++;
		}
		printf("crafted LZ4 block, cz_gpu=%s (%s): %s\n", on ? "on" : "off",
		       on && ferry__nvc_walks_lz4(0) ? "walked on the GPU" : "walked on the host", ferry_last_error());
		ferry_cz_destroy(z);
	}
	T_EQ_INT(ferry_gpu_free(dev), 0);
	unlink(path);
	free(b);
	free(data);
}

int main(void)
{
	char why[256];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no GPU: %s", why);
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	const size_t cs = 256 << 10, n = 9 * cs + 777;
	uint8_t *data = malloc(n);
	static const uint16_t phrase[16] = {464, 3290, 286, 262, 11, 1110, 318, 257, 922, 40, 1049, 13, 198, 50256, 7, 99};
	for (size_t i = 0; i + 1 < n; i += 2) { /* uint16 tokens: phrases of a small vocabulary, and rare ones */
		uint16_t t = (next() & 15) ? phrase[(i / 2) % 16] : (uint16_t)(next() % 50000);
		data[i] = (uint8_t)t, data[i + 1] = (uint8_t)(t >> 8);
	}
	data[n - 1] = 7;
	for (size_t i = 4 * cs; i < 5 * cs; i++) /* chunk 4: random, stored */
		data[i] = (uint8_t)(next() >> 32);
	void *dev;
	T_ASSERT(ferry_gpu_malloc(0, n, &dev) == 0);
	char path[512];
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		snprintf(path, sizeof(path), "%s/test_cz_gpu.%d.%s", t_tmpdir(), (int)getpid(), ferry_cz_codec_name(codec));
		compress(path, codec, "256k", data, n);
		ferry_cz *z;
		T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
		T_CHECK(ferry_cz_stored_chunks(z) >= 1);
		for (int g = 0; g < 2; g++) {
			char what[64];
			snprintf(what, sizeof(what), "%s cz_gpu=%s", ferry_cz_codec_name(codec), g ? "auto" : "off");
			T_EQ_INT(ferry_cz_set(z, "cz_gpu", g ? "auto" : "off"), 0);
			/* every read nvCOMP's, however small; windows of 1, 2, 2, ... chunks, so the
			 * pipeline has several in flight and reuses its slots within one read */
			T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_threads", "1"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_window", "512k"), 0);
			check(z, dev, data, n, 0, n, what);
			check(z, dev, data, n, cs - 5, 2 * cs + 10, what);   /* partial, whole, whole, partial */
			check(z, dev, data, n, 3 * cs + 1, 3 * cs, what);      /* across the stored chunk */
			check(z, dev, data, n, n - 1000, 5000, what);          /* to the end, clipped */
			check(z, dev, data, n, 2 * cs, cs, what);              /* exactly one chunk */
			char info[256];
			ferry_cz_path_info(z, info, sizeof(info));
			if (!g)
				T_CHECK(strncmp(info, "cpu (nvcomp: cz_gpu=off)", 24) == 0);
			else if (codec == FERRY_CZ_LZ4) /* LZ4 goes to nvCOMP only under cz_gpu=on (cz_file.c) */
				T_CHECK(strstr(info, "LZ4 decodes on the CPU unless cz_gpu=on") != NULL);
			else if (getenv("FERRY_CZ_EXPECT_NVCOMP")) /* the fakes' run: nvCOMP is there */
				T_CHECK(strncmp(info, "nvcomp (", 8) == 0);
		}
		/* a small read under auto: the CPU, saying why (cz_gpu_min); on: nvCOMP whatever the size */
		T_EQ_INT(ferry_cz_set(z, "cz_gpu", "auto"), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "4"), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_threads", "4"), 0);
		check(z, dev, data, n, cs, 3 * cs, "small read (3 chunks)");
		if (codec == FERRY_CZ_ZSTD && getenv("FERRY_CZ_EXPECT_NVCOMP")) {
			char info[256];
			ferry_cz_path_info(z, info, sizeof(info));
			T_CHECK(strstr(info, "cpu (nvcomp: 3 chunks, fewer than cz_gpu_min=4)") == info);
			check(z, dev, data, n, cs, 4 * cs, "read of 4 chunks");
			ferry_cz_path_info(z, info, sizeof(info));
			T_CHECK(strncmp(info, "nvcomp (", 8) == 0);
		}
		/* cz_gpu=on: nvCOMP or a refusal that says why, never a silent CPU decode */
		T_EQ_INT(ferry_cz_set(z, "cz_gpu", "on"), 0);
		ssize_t r = ferry_cz_pread(z, dev, n, 0);
		char info[256];
		ferry_cz_path_info(z, info, sizeof(info));
		if (r < 0) {
			T_EQ_INT(r, FERRY_EBACKEND);
			printf("%s cz_gpu=on: refused: %s\n", ferry_cz_codec_name(codec), ferry_last_error());
		} else {
			T_EQ_INT(r, n);
			T_CHECK(strncmp(info, "nvcomp", 6) == 0);
			printf("%s cz_gpu=on: %s\n", ferry_cz_codec_name(codec), info);
		}
		ferry_cz_destroy(z);
		damaged(ctx, path, dev, data, cs);
		unlink(path);
	}
	T_EQ_INT(ferry_gpu_free(dev), 0);
	free(data);
	lz4_crafted(ctx);
	ferry_ctx_destroy(ctx);
	return t_result();
}
