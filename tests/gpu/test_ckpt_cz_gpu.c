/* Compressed checkpoints loaded into device memory (issue 26; docs/CHECKPOINTS.md, "Compressed
 * checkpoints"): a one-rank checkpoint of bf16 weights, fp32 and int64 tensors, saved with
 * compress=zstd and compress=lz4 (256 KiB chunks) from host memory and from device memory, then
 * loaded whole into GPU memory through ferry_st_load (what ferry.checkpoint.load does) with
 * cz_gpu=off (the CPU decodes, the copy ring copies) and cz_gpu=auto / on (nvCOMP where it is
 * loaded: FERRY_NVCOMP_LIB, the wheel, the system), every tensor compared byte for byte.
 * ferry_st_load_path_info says which path ran; where FERRY_NVCOMP_LIB is set, nvCOMP must have
 * run for zstd under auto and for LZ4 under on; without it the nvCOMP path is reported as not run,
 * with the reason. */
#include <math.h>
#include <sys/stat.h>

#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "ferry/safetensors.h"
#include "ferry_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

#define NT 4
static const char *const names[NT] = {"model.embed.weight", "model.proj.weight", "optim.step", "optim.ids"};
static const enum ferry_dtype dts[NT] = {FERRY_DT_BF16, FERRY_DT_F32, FERRY_DT_I64, FERRY_DT_I32};
static const uint64_t shapes[NT][2] = {{4096, 1024}, {257, 1031}, {1, 1}, {100000, 3}};
static const int elt[NT] = {2, 4, 8, 4};

static void fill(int k, uint8_t *p, size_t n)
{
	if (dts[k] == FERRY_DT_BF16) { /* randn x 0.02 rounded to bf16, as initialised weights are */
		for (size_t i = 0; i + 1 < n; i += 2) {
			double u1 = ((double)(next() >> 11) + 1) / 9007199254740993.0, u2 = (double)(next() >> 11) / 9007199254740992.0;
			float f = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2) * 0.02);
			uint32_t b;
			memcpy(&b, &f, 4);
			uint16_t h = (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
			memcpy(p + i, &h, 2);
		}
	} else if (dts[k] == FERRY_DT_F32) { /* random bytes: chunks that do not compress, stored */
		for (size_t i = 0; i < n; i++)
			p[i] = (uint8_t)(next() >> 40);
	} else { /* small integers (ids, counters): compress with LZ4 too */
		memset(p, 0, n);
		for (size_t i = 0; i + (size_t)elt[k] <= n; i += (size_t)elt[k]) {
			uint16_t v = (uint16_t)(next() % 1000);
			memcpy(p + i, &v, 2);
		}
	}
}

/* FERRY_NVCOMP_LIB set (gpu-check.sh sets it from the carried wheel): nvCOMP must run */
static int nvcomp_expected(void)
{
	const char *nvc = getenv("FERRY_NVCOMP_LIB");
	return nvc && *nvc;
}

/* Loads shard into GPU 0 with cz_gpu=gpu; compares every tensor with host[]; the path in info. */
static void load_check(ferry_ctx *ctx, const char *shard, const char *gpu, uint8_t *const host[NT],
		       const size_t bytes[NT], char *info, size_t len, const char *what)
{
	setenv("FERRY_CZ_GPU", gpu, 1); /* the reader takes its knobs from the environment at open */
	setenv("FERRY_CZ_GPU_MIN", "1", 1);
	ferry_st_load *ld = NULL;
	info[0] = 0;
	T_EQ_INT(ferry_st_load_open(ctx, shard, &ld), 0);
	if (!ld)
		return;
	int r = ferry_st_load_run(ld, 0, 0, 0);
	if (r && !strcmp(gpu, "on") && !nvcomp_expected() && strstr(ferry_last_error(), "nvCOMP cannot")) {
		/* cz_gpu=on where nvCOMP cannot load: refused with the reason, never a silent CPU decode */
		snprintf(info, len, "refused: %s", ferry_last_error());
		printf("%s cz_gpu=%s: %s\n", what, gpu, info);
		ferry_st_load_destroy(ld);
		return;
	}
	if (r) {
		fprintf(stderr, "%s cz_gpu=%s: load: %s\n", what, gpu, ferry_last_error());
		t_failures++;
	}
	(void)ferry_st_load_path_info(ld, info, len);
	for (size_t i = 0; !r && i < ferry_st_load_count(ld); i++) {
		const char *nm = ferry_st_load_name(ld, i);
		int k = 0;
		while (k < NT && strcmp(names[k], nm))
			k++;
		T_ASSERT(k < NT);
		T_EQ_INT(ferry_mem_kind(ferry_st_load_ptr(ld, i), NULL), FERRY_MEM_DEVICE);
		uint8_t *back = malloc(bytes[k]);
		memset(back, 0xEE, bytes[k]);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, ferry_st_load_ptr(ld, i), bytes[k]), 0);
		if (memcmp(back, host[k], bytes[k])) {
			fprintf(stderr, "%s cz_gpu=%s: %s differs after the load (%s)\n", what, gpu, nm, info);
			t_failures++;
		}
		free(back);
	}
	printf("%s cz_gpu=%s: %s\n", what, gpu, info);
	ferry_st_load_destroy(ld);
}

int main(void)
{
	char why[256], dir[512], shard[1024], info[256];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no GPU: %s", why);
	const char *nvc = getenv("FERRY_NVCOMP_LIB");
	int expect_nvcomp = nvcomp_expected();
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	uint8_t *host[NT];
	void *dev[NT];
	size_t bytes[NT];
	for (int k = 0; k < NT; k++) {
		bytes[k] = (size_t)(shapes[k][0] * shapes[k][1]) * (size_t)elt[k];
		host[k] = malloc(bytes[k]);
		fill(k, host[k], bytes[k]);
		T_EQ_INT(ferry_gpu_malloc(0, bytes[k], &dev[k]), 0);
		T_EQ_INT(ferry_gpu_memcpy_htod(dev[k], host[k], bytes[k]), 0);
	}
	setenv("FERRY_CZ_CHUNK", "256k", 1); /* nvCOMP's better size (docs/FORMATS.md); many chunks */
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		for (int from_dev = 0; from_dev < 2; from_dev++) {
			char what[64];
			snprintf(what, sizeof(what), "%s, saved from %s memory", ferry_cz_codec_name(codec),
				 from_dev ? "device" : "host");
			snprintf(dir, sizeof(dir), "%s/test_ckpt_cz_gpu.%d.%d.%d", t_tmpdir(), (int)getpid(), codec, from_dev);
			ferry_ckpt *ck;
			T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
			T_EQ_INT(ferry_ckpt_set(ck, "compress", ferry_cz_codec_name(codec)), 0);
			for (int k = 0; k < NT; k++)
				T_EQ_INT(ferry_ckpt_add(ck, names[k], dts[k], 2, shapes[k], from_dev ? dev[k] : host[k], bytes[k]), 0);
			T_EQ_INT(ferry_ckpt_save(ck, 1), 0);
			ferry_ckpt_destroy(ck);
			T_ASSERT(ferry_ckpt_shard_path(dir, 1, 0, 1, shard, sizeof(shard)) > 0);
			T_CHECK(strstr(shard, ".safetensors.fz") != NULL);
			T_EQ_INT(ferry_ckpt_verify(ctx, dir, 1, 1), 0);

			load_check(ctx, shard, "off", host, bytes, info, sizeof(info), what);
			T_CHECK(strncmp(info, "cpu (nvcomp: cz_gpu=off)", 24) == 0);
			const char *gpu = codec == FERRY_CZ_ZSTD ? "auto" : "on"; /* LZ4 goes to nvCOMP only when on */
			load_check(ctx, shard, gpu, host, bytes, info, sizeof(info), what);
			int on_gpu = 0;
			if (sscanf(info, "nvcomp (%d chunks on the GPU", &on_gpu) == 1 && on_gpu > 0)
				printf("%s: nvCOMP path run, %d chunks on the GPU\n", what, on_gpu);
			else if (expect_nvcomp) {
				fprintf(stderr, "%s cz_gpu=%s: FERRY_NVCOMP_LIB=%s is set, but the load decoded: %s (%s)\n",
					what, gpu, nvc, info, ferry_last_error());
				t_failures++;
			} else {
				printf("%s: nvCOMP path not run (FERRY_NVCOMP_LIB unset): %s\n", what, info);
			}
			char p[1200];
			snprintf(p, sizeof(p), "%s/latest", dir);
			unlink(p);
			snprintf(p, sizeof(p), "%s/step-000000000001/manifest.json", dir);
			unlink(p);
			snprintf(p, sizeof(p), "%s/step-000000000001/rank-00000-of-00001.done", dir);
			unlink(p);
			unlink(shard);
			snprintf(p, sizeof(p), "%s/step-000000000001", dir);
			rmdir(p);
			rmdir(dir);
		}
	}
	for (int k = 0; k < NT; k++) {
		T_EQ_INT(ferry_gpu_free(dev[k]), 0);
		free(host[k]);
	}
	ferry_ctx_destroy(ctx);
	return t_result();
}
