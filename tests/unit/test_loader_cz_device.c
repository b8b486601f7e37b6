/* The loader's GPU decoding of compressed shards (tests/gpu/test_loader_cz_gpu.c) without a GPU:
 * over the fake CUDA driver (device memory is host memory) and the fake nvCOMP (libzstd and liblz4
 * on the CPU) of tests/unit/fakes/, built here with cc, so the device cache, its nvCOMP batches,
 * stored chunks' copies and the device-to-device gather into the batch run in every CI build. On
 * the GPU machine the same checks run on the real driver and nvCOMP (ctest -L gpu). */
#define main loader_cz_gpu_main
#include "gpu/test_loader_cz_gpu.c"
#undef main
#include "unit/fakes/fake_gpu_env.h"

int main(void)
{
	struct fake_gpu_env e;
	fake_gpu_env_setup(&e, __FILE__, "test_loader_cz_device");
	int r = loader_cz_gpu_main();
	fake_gpu_env_done(&e);
	return r;
}
