/*
 * A stand-in for libnvcomp.so.6, built by tests/unit/test_nvcomp.c at test time (cc -shared), to
 * go with fake_libcuda.c, whose "device memory" is host memory: the batched decompressors run
 * libzstd and liblz4 on the CPU over the device arrays, so src/gpu/nvcomp.c's logic (arrays, temp
 * space, statuses, sizes) runs without a GPU. -DFAKE_NO_ZSTD leaves the zstd symbols out;
 * -DFAKE_VERSION=n sets nvcompGetProperties' version (major * 1000 + minor * 100 + patch).
 * The prototypes are nvCOMP 6's (nvcomp/zstd.h, nvcomp/lz4.h).
 */
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef struct {
	char bytes[64];
} opts_t; /* nvcompBatched{Zstd,LZ4}DecompressOpts_t: 64 bytes */
typedef struct {
	size_t input, output, temp;
} align_t;
typedef struct {
	uint32_t version, cudart_version;
} props_t;

/* the runtime libraries' own prototypes (zstd.h, lz4.h) */
size_t ZSTD_decompress(void *dst, size_t cap, const void *src, size_t n);
unsigned ZSTD_isError(size_t code);
int LZ4_decompress_safe(const char *src, char *dst, int n, int cap);

static int temp_calls, async_calls, nonzero_opts;
API int fake_nvcomp_temp_calls(void) { return temp_calls; }
API int fake_nvcomp_async_calls(void) { return async_calls; }
API int fake_nvcomp_nonzero_opts(void) { return nonzero_opts; }

API int nvcompGetProperties(props_t *p)
{
#ifndef FAKE_VERSION
#define FAKE_VERSION 6000 /* 6.0.0 */
#endif
	p->version = FAKE_VERSION;
	p->cudart_version = 13000;
	return 0;
}

API const char *nvcompGetStatusString(int s)
{
	return s == 12 ? "cannot decompress (fake)" : s ? "error (fake)" : "success (fake)";
}

static void check_opts(opts_t o)
{
	for (size_t i = 0; i < sizeof(o.bytes); i++)
		if (o.bytes[i])
			nonzero_opts++;
}

static size_t temp_need(size_t n, size_t max_chunk)
{
	return 256 * n + max_chunk / 16;
}

static int temp_size(size_t n, size_t max_chunk, opts_t o, size_t *temp, size_t total, void *stream)
{
	(void)total;
	(void)stream;
	check_opts(o);
	temp_calls++;
	*temp = temp_need(n, max_chunk);
	return 0;
}

static int decompress(int zstd, const void *const *in, const size_t *in_n, const size_t *cap, size_t *out_n,
		      size_t n, void *temp, size_t temp_bytes, void *const *out, opts_t o, int *status, void *stream)
{
	size_t max_cap = 0;
	(void)stream;
	check_opts(o);
	async_calls++;
	for (size_t i = 0; i < n; i++)
		if (cap[i] > max_cap)
			max_cap = cap[i];
	if (!temp || temp_bytes < temp_need(n, max_cap))
		return 10; /* nvcompErrorInvalidValue */
	for (size_t i = 0; i < n; i++) {
		if (zstd) {
			size_t r = ZSTD_decompress(out[i], cap[i], in[i], in_n[i]);
			status[i] = ZSTD_isError(r) ? 12 : 0;
			out_n[i] = ZSTD_isError(r) ? 0 : r;
		} else {
			int r = LZ4_decompress_safe(in[i], out[i], (int)in_n[i], (int)cap[i]);
			status[i] = r < 0 ? 12 : 0;
			out_n[i] = r < 0 ? 0 : (size_t)r;
		}
	}
	return 0;
}

/* $FAKE_NVCOMP_ALIGN: the input alignment asked (else nvCOMP 6.0's headers' figure), so that a
 * test reaches the reader's one-copy path (every frame at a multiple of it: 1) */
static size_t input_align(size_t def)
{
	const char *e = getenv("FAKE_NVCOMP_ALIGN");
	return e && *e ? (size_t)strtoull(e, NULL, 10) : def;
}

API int nvcompBatchedLZ4DecompressGetRequiredAlignments(opts_t o, align_t *a)
{
	check_opts(o);
	*a = (align_t){input_align(4), 4, 4};
	return 0;
}
API int nvcompBatchedLZ4DecompressGetTempSize(size_t n, size_t m, opts_t o, size_t *t, size_t total, void *s)
{
	return temp_size(n, m, o, t, total, s);
}
API int nvcompBatchedLZ4DecompressAsync(const void *const *in, const size_t *in_n, const size_t *cap, size_t *out_n,
					size_t n, void *temp, size_t temp_bytes, void *const *out, opts_t o, int *status,
					void *stream)
{
	return decompress(0, in, in_n, cap, out_n, n, temp, temp_bytes, out, o, status, stream);
}

#ifndef FAKE_NO_ZSTD
API int nvcompBatchedZstdDecompressGetRequiredAlignments(opts_t o, align_t *a)
{
	check_opts(o);
	*a = (align_t){input_align(8), 8, 8};
	return 0;
}
API int nvcompBatchedZstdDecompressGetTempSize(size_t n, size_t m, opts_t o, size_t *t, size_t total, void *s)
{
	return temp_size(n, m, o, t, total, s);
}
API int nvcompBatchedZstdDecompressAsync(const void *const *in, const size_t *in_n, const size_t *cap, size_t *out_n,
					 size_t n, void *temp, size_t temp_bytes, void *const *out, opts_t o, int *status,
					 void *stream)
{
	return decompress(1, in, in_n, cap, out_n, n, temp, temp_bytes, out, o, status, stream);
}
#endif
