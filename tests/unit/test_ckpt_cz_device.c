/* Compressed checkpoints loaded into "device memory" without a GPU: tests/gpu/test_ckpt_cz_gpu.c's
 * checks (a checkpoint saved with compress=zstd and lz4 from host and "device" memory, loaded whole
 * into device memory through ferry_st_load with cz_gpu=off and nvCOMP, every tensor compared) run
 * over the fake CUDA driver and the fake nvCOMP of tests/unit/fakes/, built here with cc, as
 * test_compress_device.c does for the reader alone. On the GPU machine the same checks run on the
 * real driver and nvCOMP (ctest -L gpu). */
#define main ckpt_cz_gpu_main
#include "gpu/test_ckpt_cz_gpu.c"
#undef main
#include "fakes/fake_gpu_env.h"

int main(void)
{
	struct fake_gpu_env e;
	fake_gpu_env_setup(&e, __FILE__, "test_ckpt_cz_device");
	int r = ckpt_cz_gpu_main();
	fake_gpu_env_done(&e);
	return r;
}
