/* GPU machine only: safetensors save (sync and async) from device memory and load into device
 * memory, whole, sliced and verified, compared byte for byte through host copies. */
#include "ferry/ckpt.h"
#include "ferry/gpu.h"
#include "ferry_test.h"

int main(void)
{
	char why[256], dir[512], path[600];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("%s", why);
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(dir, sizeof(dir), "%s/ckpt-gpu-%d", t_tmpdir(), (int)getpid());
	mkdir(dir, 0755);
	enum { N = 3 };
	const uint64_t shapes[N][2] = {{1024, 4099}, {7, 3}, {4096, 4096}};
	void *dev[N];
	unsigned char *host[N];
	ferry_st_writer *w;
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	for (int i = 0; i < N; i++) {
		size_t nb = shapes[i][0] * shapes[i][1] * 2;
		char name[32];
		host[i] = malloc(nb);
		t_fill_pattern(host[i], nb, 0, (uint32_t)i);
		T_ASSERT(ferry_gpu_malloc(0, nb, &dev[i]) == 0);
		T_ASSERT(ferry_gpu_memcpy_htod(dev[i], host[i], nb) == 0);
		snprintf(name, sizeof(name), "w%d", i);
		T_ASSERT(ferry_st_writer_add(w, name, FERRY_DT_BF16, 2, shapes[i], dev[i], nb) >= 0);
	}
	for (int async = 0; async < 2; async++) {
		snprintf(path, sizeof(path), "%s/m%d.safetensors", dir, async);
		int64_t r = async ? ferry_st_writer_save_async(w, path, FERRY_SAVE_CHECKSUM)
				  : ferry_st_writer_save(w, path, FERRY_SAVE_CHECKSUM);
		if (async && r == 0) {
			/* the snapshot is taken: the device tensors may change now */
			T_CHECK(ferry_gpu_memcpy_htod(dev[0], host[1], 42) == 0);
			r = ferry_st_writer_wait(w, -1);
			T_CHECK(ferry_gpu_memcpy_htod(dev[0], host[0], 42) == 0);
		}
		T_CHECK(r >= 0);
		if (r < 0)
			fprintf(stderr, "save: %s\n", ferry_last_error());
		for (int flags = 0; flags < 4; flags++) {
			ferry_st_load *ld;
			T_ASSERT(ferry_st_load_open(ctx, path, &ld) == 0);
			if (flags & 2)
				T_EQ_INT(ferry_st_load_select_slice(ld, "w2", 1, 1024, 2048), 0);
			int lr = ferry_st_load_run(ld, 0, flags & 1 ? FERRY_LOAD_VERIFY : 0, 0);
			T_EQ_INT(lr, 0);
			if (lr)
				fprintf(stderr, "load: %s\n", ferry_last_error());
			for (size_t k = 0; !lr && k < ferry_st_load_count(ld); k++) {
				size_t nb = (size_t)ferry_st_load_nbytes(ld, k);
				unsigned char *back = malloc(nb);
				void *p = ferry_st_load_ptr(ld, k);
				T_EQ_INT(ferry_mem_kind(p, NULL), FERRY_MEM_DEVICE);
				T_CHECK(ferry_gpu_memcpy_dtoh(back, p, nb) == 0);
				int i = ferry_st_load_name(ld, k)[1] - '0';
				if (flags & 2) {
					int ok = 1;
					for (uint64_t row = 0; row < 4096; row++)
						ok &= !memcmp(back + row * 2048, host[2] + row * 8192 + 2048, 2048);
					T_CHECK(ok);
				} else {
					T_CHECK(!memcmp(back, host[i], nb));
				}
				free(back);
			}
			ferry_st_load_destroy(ld);
		}
	}
	ferry_st_writer_destroy(w);
	for (int i = 0; i < N; i++) {
		(void)ferry_gpu_free(dev[i]);
		free(host[i]);
	}
	ferry_ctx_destroy(ctx);
	return t_result();
}
