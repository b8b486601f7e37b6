/*
 * Device memory for the features beyond the ring's host copies: how much a device has free, and
 * device-to-device copies ordered on a ring's stream (the checkpoint writer's device-side
 * snapshot, src/ckpt/save.c).
 */
#include <errno.h>

#include "base/base.h"
#include "gpu/ring.h"
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
