/*
 * gpu/nvcomp.h on the GPU with the real nvCOMP: chunks compressed on the CPU by libzstd (standard
 * frames) and liblz4 (raw blocks), decompressed in one batch on the GPU and compared byte for
 * byte; a too-small output and a broken zstd frame named by chunk index (tests/nvcomp_check.h,
 * which tests/unit/test_nvcomp.c runs over fakes). Skipped, with the reason, without a GPU or nvCOMP
 * (scripts/gpu-check.sh points FERRY_NVCOMP_LIB at the carried wheel's library).
 *
 * `test_nvcomp_gpu bench` is bench/gpu-compress.sh's measurement instead (one program, so the codecs
 * and the data are the test's): for uint16 token data and bf16 weights, chunks of 256 KiB, 1 MiB
 * and 4 MiB, zstd and LZ4: the compression ratio, GPU batched decompression from device memory and
 * from pinned host memory (the copy included), and the CPU's decompression of the same chunks on
 * every core, in the same process. NVC_BENCH_MIB (default 256) sets the bytes per data set; without
 * a GPU only the CPU half runs.
 */
#include <pthread.h>
#include <time.h>

#include "ferry/ferry.h"
#include "ferry_test.h"
#include "nvcomp_check.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int test(void)
{
	const char *why;
	char reason[512];
	int ran = 0;

	for (int codec = FERRY__NVC_LZ4; codec <= FERRY__NVC_ZSTD; codec++) {
		const char *name = codec == FERRY__NVC_ZSTD ? "zstd" : "lz4";
		if (!ferry__nvc_available(codec, &why)) {
			printf("skipped: %s: nvCOMP cannot run here: %s\n", name, why);
			continue;
		}
		printf("nvCOMP %s from %s\n", ferry__nvc_version(), ferry__nvc_path());
		if (t_nvc_check(codec, 0, reason, sizeof(reason)) < 0)
			T_SKIP("CPU codecs: %s", reason);
		ran++;
	}
	if (!ran)
		T_SKIP("nvCOMP cannot run here: %s", why);
	return t_result();
}

/* ------------------------------------------------------------------------------ the benchmark */

struct set {
	const struct t_codecs *cc;
	int codec;
	const unsigned char *plain; /* size bytes, chunk after chunk */
	unsigned char *comp;        /* chunk i at in_off[i], aligned to 256 */
	unsigned char *out;         /* the CPU's output */
	size_t size, chunk, n, *in_off, *clen;
};

struct job {
	struct set *s;
	int t, nt, compress;
	long long bad;
};

static size_t chunk_len(const struct set *s, size_t i)
{
	size_t off = i * s->chunk;
	return s->size - off < s->chunk ? s->size - off : s->chunk;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	struct set *s = j->s;

	for (size_t i = (size_t)j->t; i < s->n; i += (size_t)j->nt) {
		size_t len = chunk_len(s, i);
		if (j->compress) {
			s->clen[i] = t_compress(s->cc, s->codec, 3, s->plain + i * s->chunk, len, s->comp + s->in_off[i],
						t_bound(s->cc, s->codec, s->chunk));
			if (!s->clen[i])
				j->bad++;
		} else if (t_decompress(s->cc, s->codec, s->comp + s->in_off[i], s->clen[i], s->out + i * s->chunk,
					len) != (long long)len) {
			j->bad++;
		}
	}
	return NULL;
}

/* Runs compress or decompress over every chunk on nt threads; seconds, or -1 if a chunk failed. */
static double parallel(struct set *s, int nt, int compress)
{
	pthread_t th[256];
	struct job jobs[256];
	long long bad = 0;
	double t0 = now();

	for (int t = 0; t < nt; t++) {
		jobs[t] = (struct job){s, t, nt, compress, 0};
		T_ASSERT(pthread_create(&th[t], NULL, worker, &jobs[t]) == 0);
	}
	for (int t = 0; t < nt; t++) {
		pthread_join(th[t], NULL);
		bad += jobs[t].bad;
	}
	return bad ? -1 : now() - t0;
}

#define REPS 5

/* GPU figures for one set: seconds per batch from device memory and from pinned host memory. */
static int gpu_run(struct set *s, const struct ferry__cuda_api *cu, double *dev_s, double *pinned_s, char *err,
		   size_t errlen)
{
	size_t in_total = s->in_off[s->n - 1] + T_ALIGN_UP(s->clen[s->n - 1], 256);
	uint64_t *src = calloc(s->n, 8), *dst = calloc(s->n, 8);
	size_t *cap = calloc(s->n, sizeof(size_t)), *olen = calloc(s->n, sizeof(size_t));
	ferry__CUdeviceptr din = 0, dout = 0;
	ferry__CUstream st = NULL;
	struct ferry__nvc *d = NULL;
	double t[REPS];
	int r = -1;

	T_ASSERT(src && dst && cap && olen);
	if (cu->MemAlloc(&din, in_total) || cu->MemAlloc(&dout, s->size) || cu->StreamCreate(&st, FERRY__CU_STREAM_NON_BLOCKING)) {
		snprintf(err, errlen, "device memory or stream: out of memory?");
		goto out;
	}
	if (ferry__nvc_open(0, s->codec, &d) < 0) {
		snprintf(err, errlen, "%s", ferry_last_error());
		goto out;
	}
	for (size_t i = 0; i < s->n; i++) {
		src[i] = din + s->in_off[i];
		dst[i] = dout + i * s->chunk;
		cap[i] = chunk_len(s, i);
	}
	T_ASSERT(cu->MemcpyHtoD(din, s->comp, in_total) == FERRY__CUDA_SUCCESS);
	for (int pinned = 0; pinned < 2; pinned++) {
		for (int k = -1; k < REPS; k++) { /* k = -1: the untimed first batch (scratch, kernels) */
			double t0 = now();
			if (pinned && cu->MemcpyHtoDAsync(din, s->comp, in_total, st) != FERRY__CUDA_SUCCESS) {
				snprintf(err, errlen, "cuMemcpyHtoDAsync failed");
				goto out;
			}
			if (ferry__nvc_decompress(d, st, s->n, src, s->clen, dst, cap) < 0 || cu->StreamSynchronize(st) ||
			    ferry__nvc_finish(d, olen) < 0) {
				snprintf(err, errlen, "%s", ferry_last_error());
				goto out;
			}
			if (k >= 0)
				t[k] = now() - t0;
		}
		*(pinned ? pinned_s : dev_s) = t_median(t, REPS);
	}
	/* the bytes, once */
	unsigned char *back = malloc(s->size);
	T_ASSERT(back);
	T_ASSERT(cu->MemcpyDtoH(back, dout, s->size) == FERRY__CUDA_SUCCESS);
	if (memcmp(back, s->plain, s->size) != 0) {
		snprintf(err, errlen, "GPU output differs from the input");
		free(back);
		goto out;
	}
	free(back);
	r = 0;
out:
	ferry__nvc_close(d);
	if (st)
		cu->StreamDestroy(st);
	if (din)
		cu->MemFree(din);
	if (dout)
		cu->MemFree(dout);
	free(src);
	free(dst);
	free(cap);
	free(olen);
	return r;
}

static int bench(void)
{
	static const size_t chunks[] = {256 << 10, 1 << 20, 4 << 20};
	static const char *const dnames[] = {"tokens", "bf16"};
	const char *mib_env = getenv("NVC_BENCH_MIB"), *why[3] = {"", "", ""};
	size_t size = (size_t)(mib_env ? atoi(mib_env) : 256) << 20, tile = (size_t)32 << 20;
	int nt = (int)sysconf(_SC_NPROCESSORS_ONLN), gpu[3] = {0, 0, 0}, failed = 0;
	const struct ferry__cuda_api *cu = NULL;
	struct t_codecs cc;
	char reason[512];

	if (nt < 1)
		nt = 1;
	if (nt > 256)
		nt = 256;
	if (t_codecs_load(&cc, reason, sizeof(reason)) < 0)
		T_SKIP("CPU codecs: %s", reason);
	for (int c = FERRY__NVC_LZ4; c <= FERRY__NVC_ZSTD; c++)
		gpu[c] = ferry__nvc_available(c, &why[c]);
	if (gpu[1] || gpu[2]) {
		cu = ferry__cuda();
		T_ASSERT(ferry__cuda_set_device(0) == 0);
		printf("nvCOMP %s from %s\n", ferry__nvc_version(), ferry__nvc_path());
	}
	unsigned char *plain = NULL, *comp = NULL, *out = malloc(size);
	size_t nmax = size / chunks[0] + 1, *in_off = calloc(nmax, sizeof(size_t)), *clen = calloc(nmax, sizeof(size_t));
	size_t comp_cap = size + size / 8 + nmax * 1024;
	/* pinned, so that the GPU's "from host" figure is a DMA from pinned memory */
	if (cu) {
		T_ASSERT(cu->MemHostAlloc((void **)&plain, size, 0) == FERRY__CUDA_SUCCESS);
		T_ASSERT(cu->MemHostAlloc((void **)&comp, comp_cap, 0) == FERRY__CUDA_SUCCESS);
	} else {
		plain = malloc(size);
		comp = malloc(comp_cap);
	}
	T_ASSERT(plain && comp && out && in_off && clen);
	printf("%-7s %-5s %6s %6s %10s %10s %10s %9s %9s\n", "data", "codec", "chunk", "ratio", "GPU dev", "GPU pinned",
	       "CPU", "dev/CPU", "pin/CPU");
	printf("(GB/s of decompressed bytes; CPU: %d threads; %zu MiB per data set)\n", nt, size >> 20);
	for (int ds = 0; ds < 2; ds++) {
		/* 32 MiB of fresh data, repeated: chunks are compressed on their own, so a 4 MiB chunk
		 * sees no more than this */
		for (size_t off = 0; off < size; off += tile) {
			size_t len = size - off < tile ? size - off : tile;
			if (off == 0)
				(ds ? t_gen_bf16 : t_gen_tokens)(plain, len, 42);
			else
				memcpy(plain + off, plain, len);
		}
		for (int c = FERRY__NVC_LZ4; c <= FERRY__NVC_ZSTD; c++) {
			const char *cname = c == FERRY__NVC_ZSTD ? "zstd" : "lz4";
			for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
				struct set s = {&cc, c, plain, comp, out, size, chunks[k], (size + chunks[k] - 1) / chunks[k],
						in_off, clen};
				size_t pos = 0, ctotal = 0;
				for (size_t i = 0; i < s.n; i++) {
					in_off[i] = pos;
					pos += T_ALIGN_UP(t_bound(&cc, c, s.chunk), 256);
				}
				T_ASSERT(pos <= comp_cap || !"comp buffer");
				if (parallel(&s, nt, 1) < 0) {
					printf("%s %s: compression failed\n", dnames[ds], cname);
					failed++;
					continue;
				}
				/* pack the chunks (aligned) so the GPU copies only compressed bytes */
				pos = 0;
				for (size_t i = 0; i < s.n; i++) {
					if (pos != in_off[i])
						memmove(comp + pos, comp + in_off[i], clen[i]);
					in_off[i] = pos;
					pos += T_ALIGN_UP(clen[i], 256);
					ctotal += clen[i];
				}
				double cpu[3], dev = 0, pin = 0;
				for (int r = 0; r < 3; r++)
					if ((cpu[r] = parallel(&s, nt, 0)) < 0) {
						printf("%s %s: CPU decompression failed\n", dnames[ds], cname);
						failed++;
						break;
					}
				double cpu_s = t_median(cpu, 3);
				T_CHECK(memcmp(out, plain, size) == 0);
				char gerr[512] = "";
				int g = gpu[c] && gpu_run(&s, cu, &dev, &pin, gerr, sizeof(gerr)) == 0;
				double ratio = (double)size / (double)ctotal, cpu_gbs = size / cpu_s / 1e9;
				char chunk_s[24];
				snprintf(chunk_s, sizeof(chunk_s), "%zuk", chunks[k] >> 10);
				if (g) {
					double dg = size / dev / 1e9, pg = size / pin / 1e9;
					printf("%-7s %-5s %6s %6.2f %10.1f %10.1f %10.1f %8.2fx %8.2fx\n", dnames[ds], cname,
					       chunk_s, ratio, dg, pg, cpu_gbs, dg / cpu_gbs, pg / cpu_gbs);
					printf("TABLE compress %s %s %s | ratio %.2f; GPU %.1f GB/s (from pinned %.1f); CPU %d threads %.1f GB/s | "
					       "GPU/CPU %.2fx (from pinned %.2fx), target 3x %s\n", dnames[ds], cname, chunk_s, ratio, dg, pg,
					       nt, cpu_gbs, dg / cpu_gbs, pg / cpu_gbs, pg / cpu_gbs >= 3 ? "met" : "not met");
				} else {
					printf("%-7s %-5s %6s %6.2f %10s %10s %10.1f\n", dnames[ds], cname, chunk_s, ratio, "-", "-",
					       cpu_gbs);
					printf("TABLE compress %s %s %s | ratio %.2f; CPU %d threads %.1f GB/s | GPU %s: %s\n", dnames[ds],
					       cname, chunk_s, ratio, nt, cpu_gbs, gerr[0] ? "FAILED" : "skipped", gerr[0] ? gerr : why[c]);
					if (gerr[0])
						failed++;
				}
				fflush(stdout);
			}
		}
	}
	if (cu) {
		cu->MemFreeHost(plain);
		cu->MemFreeHost(comp);
	} else {
		free(plain);
		free(comp);
	}
	free(out);
	free(in_off);
	free(clen);
	if (failed)
		return T_EXIT_FAIL;
	if (!gpu[1] && !gpu[2])
		T_SKIP("GPU half: nvCOMP cannot run here: %s", why[2]);
	return t_result();
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "bench") == 0)
		return bench();
	return test();
}
