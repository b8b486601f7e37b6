/* The loader's GPU decoding of compressed shards (tests/gpu/test_loader_cz_gpu.c) without a GPU:
 * over the fake CUDA driver (device memory is host memory) and the fake nvCOMP (libzstd and liblz4
 * on the CPU) of tests/unit/fakes/, built here with cc, so the device cache, its nvCOMP batches,
 * stored chunks' copies and the device-to-device gather into the batch run in every CI build. On
 * the GPU machine the same checks run on the real driver and nvCOMP (ctest -L gpu). Here also
 * 64 KiB chunks: more chunks than the device cache's first 64 entries (its index of held chunks
 * grows, cz_dcache.c), and a 4 MiB cache that evicts them.
 * FERRY_TEST_FAKE_KERNELS: CMake runs it again with the fake driver running ferry's kernels (the
 * scatter kernel's gathers, the LZ4 walk before nvCOMP), as the GPU machine does.
 */
#define main loader_cz_gpu_main
#include "gpu/test_loader_cz_gpu.c"
#undef main
#include "unit/fakes/fake_gpu_env.h"

/* zstd in 64 KiB chunks (about 150 here): the same samples in the same order as the CPU's decoding,
 * each chunk decoded on the GPU about once, with the default cache and with a 4 MiB one */
static void small_chunks(void)
{
	lcz_begin("test_loader_cz_device");
	char plain[600], cz[600];
	lcz_noise = 0;
	snprintf(plain, sizeof(plain), "%s/plain", dir);
	make_plain(plain);
	snprintf(cz, sizeof(cz), "%s/zstd64k", dir);
	uint64_t chunks = make_cz_chunks(plain, cz, FERRY_CZ_ZSTD, "64k", 64);
	T_CHECK(chunks > 128);
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, cz, &ds) == 0);
	int64_t *a = malloc(N * 8), *b = malloc(N * 8);
	const char *win[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1", NULL};
	ferry_loader *l = dev_loader(ds, "cpu", win);
	check_once(a, drain(l, a, 0));
	ferry_loader_destroy(l);
	const char *small[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1",
			       "chunk_cache", "4m", NULL};
	const char *const *kvs[] = {win, small};
	for (int k = 0; k < 2; k++) {
		l = same_order(ds, "auto", kvs[k], a, b);
		double g = metric(l, "gpu_chunk_decodes"), dec = metric(l, "chunk_decodes");
		printf("64 KiB chunks, %s cache: %.0f chunk decodes, %.0f on the GPU, for %llu chunks\n", k ? "4 MiB" : "default",
		       dec, g, (unsigned long long)chunks);
		T_CHECK(g == dec && dec >= (double)chunks && dec <= 2.0 * (double)chunks);
		ferry_loader_destroy(l);
	}
	free(a);
	free(b);
	ferry_dataset_destroy(ds);
	lcz_end();
}

int main(void)
{
	struct fake_gpu_env e;
	fake_gpu_env_setup(&e, __FILE__, "test_loader_cz_device");
	int r = loader_cz_gpu_main();
	if (!r)
		small_chunks();
	fake_gpu_env_done(&e);
	return r ? r : t_result();
}
