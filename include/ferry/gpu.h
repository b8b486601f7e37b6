/*
 * ferry: the GPU-facing part of the public API.
 *
 * Nothing here links CUDA: the NVIDIA libraries (libcuda.so.1, libcufile.so.0) are loaded at run
 * time, once. Without a usable GPU every call below that needs one returns FERRY_ENOGPU, and
 * ferry_last_error() says what is missing ("libcuda.so.1 not found (no NVIDIA driver): ...",
 * "cuInit failed: CUDA_ERROR_NO_DEVICE (100) ..."). docs/GPU.md explains each message.
 *
 * Device memory is passed as void * holding the CUDA device address (a CUdeviceptr, the value of
 * torch's tensor.data_ptr()).
 */
#ifndef FERRY_GPU_H
#define FERRY_GPU_H

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * 1 if a CUDA device can be used, 0 if not; then why (when not NULL, len > 0) holds the reason,
 * NUL-terminated. Loads the driver on first use. Never fails otherwise.
 */
FERRY_API int ferry_gpu_available(char *why, size_t len);

/* Number of visible CUDA devices (>= 1), or FERRY_ENOGPU. */
FERRY_API FERRY_WUR int ferry_gpu_count(void);

/* Writes device dev's name ("NVIDIA H200") into buf. Returns its length, FERRY_ENOGPU or -EINVAL. */
FERRY_API FERRY_WUR int ferry_gpu_name(int dev, char *buf, size_t len);

/*
 * Allocates len bytes of device memory on device dev (cuMemAlloc in the device's primary context).
 * Returns 0, FERRY_ENOGPU, -EINVAL (len 0 or no such device), -ENOMEM or FERRY_ECUDA.
 */
FERRY_API FERRY_WUR int ferry_gpu_malloc(int dev, size_t len, void **out);
/* Frees memory from ferry_gpu_malloc. NULL is accepted. Returns 0, FERRY_ENOGPU, -EINVAL or FERRY_ECUDA. */
FERRY_API int ferry_gpu_free(void *dev_ptr);

/*
 * Synchronous copies between host memory and device (or managed) memory, for tests and
 * verification, not for speed. Returns 0, FERRY_ENOGPU, -EINVAL (the device side is not device
 * memory) or FERRY_ECUDA.
 */
FERRY_API FERRY_WUR int ferry_gpu_memcpy_htod(void *dst_dev, const void *src_host, size_t len);
FERRY_API FERRY_WUR int ferry_gpu_memcpy_dtoh(void *dst_host, const void *src_dev, size_t len);

/* What kind of memory a pointer addresses. */
enum ferry_mem_kind {
	FERRY_MEM_HOST = 0,    /* pageable host memory, or any pointer CUDA does not know */
	FERRY_MEM_PINNED = 1,  /* page-locked host memory (cudaHostAlloc, cudaHostRegister, ...) */
	FERRY_MEM_DEVICE = 2,  /* device memory */
	FERRY_MEM_MANAGED = 3, /* unified (managed) memory */
};
/*
 * The kind of memory at ptr, and in *device (when not NULL) the CUDA device it belongs to (-1 for
 * host memory). Without a GPU every pointer is FERRY_MEM_HOST: this call never fails.
 */
FERRY_API enum ferry_mem_kind ferry_mem_kind(const void *ptr, int *device);

/* GPUDirect Storage for one file. */
enum ferry_gds_status {
	FERRY_GDS_REFUSED = 0, /* cuFile will not take the file: why says so */
	FERRY_GDS_NATIVE = 1,  /* cuFile registers the file and nvidia-fs is loaded: direct DMA */
	FERRY_GDS_COMPAT = 2,  /* cuFile registers it only in compatibility mode (no nvidia-fs) */
};
/*
 * Whether GPUDirect Storage can read path: opens it with O_DIRECT and registers it with cuFile
 * (cuFileHandleRegister). Returns an enum ferry_gds_status (an int, as errors share it):
 * FERRY_GDS_NATIVE, FERRY_GDS_COMPAT or FERRY_GDS_REFUSED, with a
 * sentence in why in each case (e.g. "cuFileHandleRegister: CU_FILE_HANDLE_NOT_REGISTERED (5027):
 * ... /run/udev is absent ..."); FERRY_ENOGPU without a GPU; -errno when path cannot be opened.
 */
FERRY_API int ferry_gds_status(const char *path, char *why, size_t len);

/*
 * The machine's copy ceilings for device dev, measured now: `reps` copies of `bytes` each way between
 * pinned host memory (cuMemHostAlloc) and device memory, the median of each in bytes per second
 * (*htod, *dtoh). Benchmarks report their figures as fractions of these. Returns 0, FERRY_ENOGPU,
 * -EINVAL, -ENOMEM or FERRY_ECUDA.
 */
FERRY_API FERRY_WUR int ferry_gpu_copy_ceiling(int dev, size_t bytes, unsigned reps, double *htod,
					       double *dtoh);
/*
 * The same ceilings for the n devices devs[] at once: a thread per device copies `bytes` each way
 * between its own pinned buffer and its device, every repetition started on all of them together;
 * *htod and *dtoh are the medians of the bytes of all devices per second (what the host's memory
 * and links carry together, which may be less than n times one device's ceiling). Returns 0,
 * FERRY_ENOGPU, -EINVAL (no device, more than 64, one listed twice, or one that does not exist),
 * -ENOMEM, -EAGAIN or FERRY_ECUDA.
 */
FERRY_API FERRY_WUR int ferry_gpu_copy_ceiling_all(const int *devs, unsigned n, size_t bytes, unsigned reps,
						   double *htod, double *dtoh);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_GPU_H */
