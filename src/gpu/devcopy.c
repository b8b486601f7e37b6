/*
 * Device memory for the features beyond the ring's host copies: how much a device has free, and
 * device-to-device copies ordered on a ring's stream (the checkpoint writer's device-side
 * snapshot, src/ckpt/save.c; the loader's samples out of chunks decoded on the GPU, a gather).
 */
#include <errno.h>

#include "base/base.h"
#include "gpu/ring.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"

int ferry__gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	size_t fr = 0, tot = 0;
	int r = cu ? ferry__cuda_set_device(dev) : ferry__cuda_require();
	if (r)
		return r;
	if (!cu->MemGetInfo)
		return ferry__error(-ENOTSUP, "device %d: the CUDA driver has no cuMemGetInfo", dev);
	ferry__CUresult e = cu->MemGetInfo(&fr, &tot);
	if (e)
		return ferry__cuda_fail(e, "cuMemGetInfo on device %d", dev);
	*free_bytes = fr;
	*total_bytes = tot;
	return 0;
}

bool ferry__ring_can_d2d(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	return cu && cu->MemcpyDtoDAsync;
}

int ferry__ring_d2d(struct ferry__ring_gpu *r, int dev, uint64_t dst, uint64_t src, size_t n)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	int err = cu ? ferry__cuda_set_device(dev) : ferry__cuda_require();
	if (err)
		return err;
	if (!cu->MemcpyDtoDAsync)
		return ferry__error(-ENOTSUP, "device %d: the CUDA driver has no cuMemcpyDtoDAsync", dev);
	ferry__CUresult e = cu->MemcpyDtoDAsync((ferry__CUdeviceptr)dst, (ferry__CUdeviceptr)src, n,
						(ferry__CUstream)ferry__ring_stream(r));
	return e ? ferry__cuda_fail(e, "cuMemcpyDtoDAsync of %zu bytes on device %d", n, dev) : 0;
}

int ferry__ring_d2d_gather(struct ferry__ring_gpu *r, int dev, const struct ferry__ring_dpiece *p, size_t n,
			   bool *kernel)
{
	int st = n ? ferry__scatter_state(dev, false) : FERRY__SCATTER_NONE;
	if (kernel)
		*kernel = false;
	if (st == FERRY__SCATTER_LOADING)
		ferry__scatter_prepare(dev); /* for the next gather: this one copies */
	if (st == FERRY__SCATTER_READY) {
		struct ferry__scatter_piece sp[FERRY__SCATTER_MAX];
		int err = 0;
		for (size_t k = 0; k < n && !err; k += FERRY__SCATTER_MAX) {
			size_t m = n - k < FERRY__SCATTER_MAX ? n - k : FERRY__SCATTER_MAX;
			for (size_t q = 0; q < m; q++)
				sp[q] = (struct ferry__scatter_piece){p[k + q].src, p[k + q].dst, p[k + q].len};
			err = ferry__scatter_launch(dev, ferry__ring_stream(r), sp, m, NULL);
			if (err == FERRY_ECUDA && !k) /* the first launch refused: copied, as from now on */
				ferry__scatter_refuse(dev, ferry_last_error());
			else if (err)
				return err;
		}
		if (!err) {
			if (kernel)
				*kernel = true;
			return 0;
		}
	}
	for (size_t k = 0; k < n; k++) {
		int err = p[k].len ? ferry__ring_d2d(r, dev, p[k].dst, p[k].src, p[k].len) : 0;
		if (err)
			return err;
	}
	return 0;
}
