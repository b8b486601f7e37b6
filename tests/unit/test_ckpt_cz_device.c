/* Compressed checkpoints loaded into "device memory" without a GPU: tests/gpu/test_ckpt_cz_gpu.c's
 * checks (a checkpoint saved with compress=zstd and lz4 from host and "device" memory, loaded whole
 * into device memory through ferry_st_load with cz_gpu=off and nvCOMP, every tensor compared) run
 * over the fake CUDA driver and the fake nvCOMP of tests/unit/fakes/, built here with cc, as
 * test_compress_device.c does for the reader alone. On the GPU machine the same checks run on the
 * real driver and nvCOMP (ctest -L gpu). */
#define main ckpt_cz_gpu_main
#include "gpu/test_ckpt_cz_gpu.c"
#undef main

static int build(const char *cc, const char *src_dir, const char *out, const char *src, const char *flags)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "%s -shared -fPIC -O1 -fvisibility=hidden %s -o '%s' '%s/%s' -lpthread %s 2>&1", cc,
		 strstr(src, "nvcomp") ? "" : flags, out, src_dir, src, strstr(src, "nvcomp") ? flags : "");
	return system(cmd);
}

int main(void)
{
	char src_dir[1024], cuda[1200], nvcomp[1200];
	snprintf(src_dir, sizeof(src_dir), "%s", __FILE__);
	char *slash = strrchr(src_dir, '/');
	snprintf(slash ? slash + 1 : src_dir, sizeof(src_dir) - (slash ? (size_t)(slash + 1 - src_dir) : 0), "fakes");
	const char *cc = getenv("CC");
	if (!cc || !*cc)
		cc = "cc";
	snprintf(cuda, sizeof(cuda), "%s/test_ckpt_cz_device.%d.cuda.so", t_tmpdir(), (int)getpid());
	snprintf(nvcomp, sizeof(nvcomp), "%s/test_ckpt_cz_device.%d.nvcomp.so", t_tmpdir(), (int)getpid());
	if (build(cc, src_dir, cuda, "fake_libcuda.c", "-DFAKE_ATTRIBUTES") ||
	    build(cc, src_dir, nvcomp, "fake_libnvcomp.c", "-l:libzstd.so.1 -l:liblz4.so.1")) {
		unlink(cuda), unlink(nvcomp);
		T_SKIP("the fake CUDA driver or nvCOMP did not build with %s from %s", cc, src_dir);
	}
	setenv("FERRY_CUDA_LIBRARY", cuda, 1); /* read when the library first loads the driver */
	setenv("FERRY_NVCOMP_LIB", nvcomp, 1);
	setenv("FERRY_CZ_EXPECT_NVCOMP", "1", 1);
	int r = ckpt_cz_gpu_main();
	unlink(cuda), unlink(nvcomp);
	return r;
}
