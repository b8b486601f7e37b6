/*
 * Shared by tests/unit/test_nvcomp.c (fake libcuda and libnvcomp on the CPU) and
 * tests/gpu/test_nvcomp.c (the real ones): the CPU codecs, loaded at run time from the runtime
 * libraries libzstd.so.1 and liblz4.so.1 (no -dev package needed, as on the GPU machine), data
 * that looks like what ferry compresses (uint16 tokens of text, bf16 weights), and one check of
 * gpu/nvcomp.h: a batch of chunks of different sizes compressed on the CPU, decompressed through
 * ferry__nvc_*, compared byte for byte, then the failures nvCOMP documents, named by chunk index.
 */
#ifndef FERRY_TEST_NVCOMP_CHECK_H
#define FERRY_TEST_NVCOMP_CHECK_H

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_test.h"
#include "gpu/nvcomp.h"
#include "gpu/shim.h"

struct t_codecs {
	size_t (*ZSTD_compress)(void *dst, size_t cap, const void *src, size_t n, int level);
	size_t (*ZSTD_decompress)(void *dst, size_t cap, const void *src, size_t n);
	unsigned (*ZSTD_isError)(size_t code);
	size_t (*ZSTD_compressBound)(size_t n);
	int (*LZ4_compress_default)(const char *src, char *dst, int n, int cap);
	int (*LZ4_compressBound)(int n);
	int (*LZ4_decompress_safe)(const char *src, char *dst, int n, int cap);
};

/* 0, or -1 with the reason in why. */
static int t_codecs_load(struct t_codecs *c, char *why, size_t len)
{
	void *z = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL), *l = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!z || !l) {
		snprintf(why, len, "%s not loadable: %s", !z ? "libzstd.so.1" : "liblz4.so.1", dlerror());
		return -1;
	}
#define T_SYM(h, f)                                                              \
	do {                                                                     \
		void *p_ = dlsym(h, #f);                                         \
		if (!p_) {                                                       \
			snprintf(why, len, "symbol %s missing", #f);             \
			return -1;                                               \
		}                                                                \
		memcpy(&c->f, &p_, sizeof(p_));                                  \
	} while (0)
	T_SYM(z, ZSTD_compress);
	T_SYM(z, ZSTD_decompress);
	T_SYM(z, ZSTD_isError);
	T_SYM(z, ZSTD_compressBound);
	T_SYM(l, LZ4_compress_default);
	T_SYM(l, LZ4_compressBound);
	T_SYM(l, LZ4_decompress_safe);
#undef T_SYM
	return 0;
}

static size_t t_bound(const struct t_codecs *c, int codec, size_t n)
{
	return codec == FERRY__NVC_ZSTD ? c->ZSTD_compressBound(n) : (size_t)c->LZ4_compressBound((int)n);
}

/* One standard zstd frame (level 3), or one raw LZ4 block; 0 on failure. */
static size_t t_compress(const struct t_codecs *c, int codec, int level, const void *src, size_t n, void *dst,
			 size_t cap)
{
	if (codec == FERRY__NVC_ZSTD) {
		size_t r = c->ZSTD_compress(dst, cap, src, n, level);
		return c->ZSTD_isError(r) ? 0 : r;
	}
	int r = c->LZ4_compress_default(src, dst, (int)n, (int)cap);
	return r > 0 ? (size_t)r : 0;
}

/* Bytes written, or -1. */
__attribute__((unused)) static long long t_decompress(const struct t_codecs *c, int codec, const void *src, size_t n, void *dst, size_t cap)
{
	if (codec == FERRY__NVC_ZSTD) {
		size_t r = c->ZSTD_decompress(dst, cap, src, n);
		return c->ZSTD_isError(r) ? -1 : (long long)r;
	}
	int r = c->LZ4_decompress_safe(src, dst, (int)n, (int)cap);
	return r < 0 ? -1 : r;
}

static uint64_t t_rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/*
 * uint16 token ids that look like tokenized text: a Zipf(1.0) unigram law over a 50,257-token
 * vocabulary (GPT-2's size), with one position in 50 starting a copy of an earlier phrase of 4 to 20
 * tokens (about a fifth of the tokens: text repeats names and phrases, which LZ matches find).
 */
static void t_gen_tokens(void *buf, size_t bytes, uint64_t seed)
{
	enum { VOCAB = 50257, QUANT = 1 << 20 };
	static uint16_t *rank; /* inverse CDF: a uniform 20-bit number to a token's frequency rank */
	uint16_t *t = buf;
	size_t n = bytes / 2;
	uint64_t s = seed | 1;

	if (!rank) {
		double sum = 0, acc = 0;
		size_t q = 0;
		T_ASSERT((rank = malloc(QUANT * sizeof(*rank))));
		for (int i = 0; i < VOCAB; i++)
			sum += 1.0 / (i + 1);
		for (int i = 0; i < VOCAB && q < QUANT; i++) {
			acc += 1.0 / (i + 1) / sum;
			while (q < QUANT && (double)q / QUANT < acc)
				rank[q++] = (uint16_t)i;
		}
		while (q < QUANT)
			rank[q++] = VOCAB - 1;
	}
	for (size_t i = 0; i < n;) {
		uint64_t x = t_rng(&s);
		if (i > 4096 && x % 50 == 0) {
			size_t len = 4 + (x >> 8) % 17, from = i - 1 - (x >> 16) % 4000;
			for (size_t k = 0; k < len && i < n; k++)
				t[i++] = t[from + k];
			continue;
		}
		/* ids are not ranks: spread the frequent ones over the vocabulary as BPE merges do */
		t[i++] = (uint16_t)(((size_t)rank[(x >> 40) & (QUANT - 1)] * 7919) % VOCAB);
	}
	if (bytes & 1)
		((unsigned char *)buf)[bytes - 1] = 0;
}

/* bf16 weights of a trained-looking layer: normal, std 0.02, rounded to nearest even from fp32. */
static void t_gen_bf16(void *buf, size_t bytes, uint64_t seed)
{
	uint16_t *w = buf;
	uint64_t s = seed | 1;

	for (size_t i = 0; i < bytes / 2; i++) {
		double u1 = ((double)(t_rng(&s) >> 11) + 1) / (double)(1ull << 53);
		double u2 = (double)(t_rng(&s) >> 11) / (double)(1ull << 53);
		float f = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
		uint32_t x;
		memcpy(&x, &f, 4);
		x += 0x7fff + ((x >> 16) & 1);
		w[i] = (uint16_t)(x >> 16);
	}
	if (bytes & 1)
		((unsigned char *)buf)[bytes - 1] = 0;
}

#define T_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/*
 * The check: returns the number of failed checks (printed), or -1 with the reason in why when it
 * cannot run (CPU codecs missing). Uses device dev through the shim (a fake libcuda's "device
 * memory" is host memory).
 */
static int t_nvc_check(int codec, int dev, char *why, size_t whylen)
{
	static const size_t sizes[] = {1, 4093, 65536, (256 << 10) + 17, 1 << 20, 3 << 20, 100, (1 << 20) - 1};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	const char *cname = codec == FERRY__NVC_ZSTD ? "zstd" : "lz4";
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct t_codecs cc;
	uint64_t src[N], dst[N];
	size_t clen[N], cap[N], out_len[N], in_off[N], out_off[N], in_total = 0, out_total = 0;
	unsigned char *plain[N], *comp[N];
	struct ferry__nvc *d = NULL;
	ferry__CUstream stream = NULL;
	ferry__CUdeviceptr din = 0, dout = 0;
	int before = t_failures, r;

	if (t_codecs_load(&cc, why, whylen) < 0)
		return -1;
	T_ASSERT(cu);
	T_ASSERT(ferry__cuda_set_device(dev) == 0);
	for (size_t i = 0; i < N; i++) {
		plain[i] = malloc(sizes[i]);
		comp[i] = malloc(t_bound(&cc, codec, sizes[i]));
		T_ASSERT(plain[i] && comp[i]);
		if (i % 2)
			t_gen_bf16(plain[i], sizes[i], 11 + i);
		else
			t_gen_tokens(plain[i], sizes[i], 7 + i);
		clen[i] = t_compress(&cc, codec, 3, plain[i], sizes[i], comp[i], t_bound(&cc, codec, sizes[i]));
		T_ASSERT(clen[i] > 0);
		cap[i] = sizes[i];
		in_off[i] = in_total;
		out_off[i] = out_total;
		in_total += T_ALIGN_UP(clen[i], 256);
		out_total += T_ALIGN_UP(sizes[i], 256);
	}
	T_ASSERT(cu->MemAlloc(&din, in_total) == FERRY__CUDA_SUCCESS);
	T_ASSERT(cu->MemAlloc(&dout, out_total + 256) == FERRY__CUDA_SUCCESS);
	T_ASSERT(cu->StreamCreate(&stream, FERRY__CU_STREAM_NON_BLOCKING) == FERRY__CUDA_SUCCESS);
	for (size_t i = 0; i < N; i++) {
		T_ASSERT(cu->MemcpyHtoD(din + in_off[i], comp[i], clen[i]) == FERRY__CUDA_SUCCESS);
		src[i] = din + in_off[i];
		dst[i] = dout + out_off[i];
	}
	r = ferry__nvc_open(dev, codec, &d);
	if (r < 0) {
		fprintf(stderr, "%s: ferry__nvc_open: %d %s\n", cname, r, ferry_last_error());
		T_ASSERT(r == 0);
	}

	/* 1. the batch, byte for byte */
	T_ASSERT(cu->MemsetD8(dout, 0xAB, out_total) == FERRY__CUDA_SUCCESS);
	r = ferry__nvc_decompress(d, stream, N, src, clen, dst, cap);
	if (r < 0)
		fprintf(stderr, "%s: decompress: %s\n", cname, ferry_last_error());
	T_EQ_INT(r, 0);
	/* a batch left unfinished is dropped by the next one (after its stream drained) */
	T_EQ_INT(ferry__nvc_decompress(d, stream, N, src, clen, dst, cap), 0);
	T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
	memset(out_len, 0xff, sizeof(out_len));
	r = ferry__nvc_finish(d, out_len);
	if (r < 0)
		fprintf(stderr, "%s: finish: %s\n", cname, ferry_last_error());
	T_EQ_INT(r, 0);
	for (size_t i = 0; i < N; i++) {
		unsigned char *back = malloc(sizes[i]);
		T_ASSERT(back);
		T_EQ_INT(out_len[i], sizes[i]);
		T_ASSERT(cu->MemcpyDtoH(back, dst[i], sizes[i]) == FERRY__CUDA_SUCCESS);
		if (memcmp(back, plain[i], sizes[i]) != 0) {
			size_t k = 0;
			while (back[k] == plain[i][k])
				k++;
			fprintf(stderr, "%s: chunk %zu (%zu bytes): first difference at byte %zu: %u != %u\n", cname, i,
				sizes[i], k, back[k], plain[i][k]);
			t_failures++;
		}
		free(back);
	}
	/* finish without a batch: nothing to report */
	T_EQ_INT(ferry__nvc_finish(d, NULL), 0);

	/* 2. an output too small for chunk 5 (nvCOMP documents nvcompErrorCannotDecompress) */
	size_t small[N];
	memcpy(small, cap, sizeof(small));
	small[5] = cap[5] / 2;
	/* a canary past the room: does the decoder write there? */
	size_t past = cap[5] - small[5];
	T_ASSERT(cu->MemsetD8(dst[5] + small[5], 0xCD, past) == FERRY__CUDA_SUCCESS);
	T_EQ_INT(ferry__nvc_decompress(d, stream, N, src, clen, dst, small), 0);
	T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
	r = ferry__nvc_finish(d, out_len);
	{
		unsigned char *canary = malloc(past);
		size_t changed = 0;
		T_ASSERT(canary);
		T_ASSERT(cu->MemcpyDtoH(canary, dst[5] + small[5], past) == FERRY__CUDA_SUCCESS);
		for (size_t k = 0; k < past; k++)
			changed += canary[k] != 0xCD;
		printf("%s: too small output: %zu of the %zu bytes past chunk 5's room were written\n", cname,
		       changed, past);
		free(canary);
	}
	/* Reported as chunk 5's error, or (nvCOMP 6.0 on an H100 did this) a success whose size for
	 * chunk 5 is not the chunk's: the format's reader compares every size with its index
	 * (cz_file.c). A size past the room given would be a write past the buffer: never accepted. */
	if (r == FERRY_ECORRUPT) {
		if (!strstr(ferry_last_error(), "chunk 5 of 8")) {
			fprintf(stderr, "%s: too small output: error does not name chunk 5: %s\n", cname, ferry_last_error());
			t_failures++;
		}
	} else {
		T_EQ_INT(r, 0);
		/* nvCOMP 6.0 on an H100: no error, and the chunk's whole size reported. What the format's
		 * reader does about it: every frame decoded on the GPU is checked against its index entry
		 * (checksum and sizes) first, so the room given is always the frame's size. */
		printf("%s: too small output: nvCOMP reported no error; chunk 5's size %zu (room %zu, the chunk %zu)\n",
		       cname, out_len[5], small[5], sizes[5]);
	}
	T_EQ_INT(out_len[0], sizes[0]);

	/* 3. zstd: chunk 3's frame magic destroyed (a header nvCOMP checks) */
	if (codec == FERRY__NVC_ZSTD) {
		static const unsigned char zero[4];
		T_ASSERT(cu->MemcpyHtoD(src[3], zero, 4) == FERRY__CUDA_SUCCESS);
		T_EQ_INT(ferry__nvc_decompress(d, stream, N, src, clen, dst, cap), 0);
		T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
		r = ferry__nvc_finish(d, out_len);
		/* nvCOMP's headers call corrupt input undefined: reported, it names chunk 3; not reported
		 * (nvCOMP 6.0), the format's checksum of each compressed frame, checked before the GPU
		 * decodes it (cz_file.c), is what keeps such bytes out */
		if (r == FERRY_ECORRUPT) {
			if (!strstr(ferry_last_error(), "chunk 3 of 8")) {
				fprintf(stderr, "%s: bad magic: error does not name chunk 3: %s\n", cname, ferry_last_error());
				t_failures++;
			}
		} else {
			T_EQ_INT(r, 0);
			printf("%s: bad magic: nvCOMP reported no error for chunk 3 (the format's frame checksum "
			       "catches it before the GPU)\n", cname);
		}
		T_ASSERT(cu->MemcpyHtoD(src[3], comp[3], 4) == FERRY__CUDA_SUCCESS);
	}

	/* 4. a misaligned input is refused before anything is enqueued, by index */
	uint64_t bad[N];
	memcpy(bad, src, sizeof(bad));
	bad[2] += 1;
	r = ferry__nvc_decompress(d, stream, N, bad, clen, dst, cap);
	if (r == 0) {
		/* this nvCOMP asks no alignment of its input (6.0 did not): nothing to refuse; the batch
		 * (chunk 2 read one byte late) is finished and its outcome not judged */
		T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
		(void)ferry__nvc_finish(d, NULL);
		printf("%s: misaligned: nvCOMP requires no input alignment here\n", cname);
	} else {
		T_EQ_INT(r, -EINVAL);
		if (!strstr(ferry_last_error(), "chunk 2 of 8"))
			fprintf(stderr, "%s: misaligned: %s\n", cname, ferry_last_error()), t_failures++;
	}

	/* 5. the scratch grows: a batch of 3x more chunks (the same ones again) still decodes */
	{
		enum { M = 3 * N };
		uint64_t s3[M], d3[M];
		size_t l3[M], c3[M], o3[M];
		ferry__CUdeviceptr dout3 = 0;
		T_ASSERT(cu->MemAlloc(&dout3, 3 * out_total) == FERRY__CUDA_SUCCESS);
		for (size_t i = 0; i < M; i++) {
			s3[i] = src[i % N];
			l3[i] = clen[i % N];
			c3[i] = cap[i % N];
			d3[i] = dout3 + (i / N) * out_total + out_off[i % N];
		}
		T_EQ_INT(ferry__nvc_decompress(d, stream, M, s3, l3, d3, c3), 0);
		T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
		r = ferry__nvc_finish(d, o3);
		if (r < 0)
			fprintf(stderr, "%s: %d chunks: %s\n", cname, M, ferry_last_error());
		T_EQ_INT(r, 0);
		for (size_t i = 0; i < M; i++) {
			unsigned char *back = malloc(sizes[i % N]);
			T_ASSERT(back);
			T_EQ_INT(o3[i], sizes[i % N]);
			T_ASSERT(cu->MemcpyDtoH(back, d3[i], sizes[i % N]) == FERRY__CUDA_SUCCESS);
			T_CHECK(memcmp(back, plain[i % N], sizes[i % N]) == 0);
			free(back);
		}
		cu->MemFree(dout3);
	}

	/* 6. LZ4: a block made to decode to one byte more than its room (chunk 2's, its first sequence's
	 * match one longer) never reaches nvCOMP. Walked on the GPU (ferry's kernels loaded): a batch of
	 * it and chunk 4 runs, the crafted one is named by finish and ferry__nvc_failed, the 4 KiB
	 * canary past its room is untouched and chunk 4 decodes. Without the kernel the callers walk on
	 * the host (test_compress). */
	if (codec == FERRY__NVC_LZ4 && !ferry__nvc_walks_lz4(dev)) {
		printf("%s: the walk on the GPU: ferry's kernels are not loaded here; callers walk on the host\n", cname);
	} else if (codec == FERRY__NVC_LZ4) {
		enum { CANARY = 4096 };
		unsigned char *blk = malloc(clen[2]), *canary = malloc(CANARY), *back = malloc(sizes[4]);
		ferry__CUdeviceptr craft = 0;
		T_ASSERT(blk && canary && back);
		memcpy(blk, comp[2], clen[2]);
		t_lz4_longer(blk);
		T_ASSERT(cu->MemAlloc(&craft, T_ALIGN_UP(clen[2], 256) + cap[2] + CANARY) == FERRY__CUDA_SUCCESS);
		const uint64_t cin = craft, cout = craft + T_ALIGN_UP(clen[2], 256);
		T_ASSERT(cu->MemcpyHtoD(cin, blk, clen[2]) == FERRY__CUDA_SUCCESS);
		T_ASSERT(cu->MemsetD8(cout + cap[2], 0xCD, CANARY) == FERRY__CUDA_SUCCESS);
		uint64_t s2[2] = {cin, src[4]}, d2[2] = {cout, dst[4]};
		size_t l2[2] = {clen[2], clen[4]}, c2[2] = {cap[2], cap[4]}, o2[2];
		T_EQ_INT(ferry__nvc_decompress(d, stream, 2, s2, l2, d2, c2), 0);
		T_ASSERT(cu->StreamSynchronize(stream) == FERRY__CUDA_SUCCESS);
		r = ferry__nvc_finish(d, o2);
		T_EQ_INT(r, FERRY_ECORRUPT);
		if (!strstr(ferry_last_error(), "chunk 0 of 2") || !strstr(ferry_last_error(), "refused before nvCOMP ran"))
			fprintf(stderr, "%s: crafted block: %s\n", cname, ferry_last_error()), t_failures++;
		T_EQ_INT(ferry__nvc_failed(d), 0);
		size_t changed = 0;
		T_ASSERT(cu->MemcpyDtoH(canary, cout + cap[2], CANARY) == FERRY__CUDA_SUCCESS);
		for (size_t k = 0; k < CANARY; k++)
			changed += canary[k] != 0xCD;
		T_EQ_INT(changed, 0);
		T_ASSERT(cu->MemcpyDtoH(back, dst[4], sizes[4]) == FERRY__CUDA_SUCCESS);
		T_CHECK(o2[1] == sizes[4] && memcmp(back, plain[4], sizes[4]) == 0);
		printf("%s: crafted block (one byte more than its room): refused by the walk on the GPU, %zu bytes past its room written; %s\n",
		       cname, changed, ferry_last_error());
		cu->MemFree(craft);
		free(canary);
		free(back);
		free(blk);
	}

	ferry__nvc_close(d);
	ferry__nvc_close(NULL);
	cu->StreamDestroy(stream);
	cu->MemFree(din);
	cu->MemFree(dout);
	for (size_t i = 0; i < N; i++) {
		free(plain[i]);
		free(comp[i]);
	}
	printf("%s: %d chunks of 1 B to 3 MiB decompressed and compared; failures named by chunk: %s\n", cname, N,
	       t_failures == before ? "ok" : "FAILED");
	return t_failures - before;
}

#endif
