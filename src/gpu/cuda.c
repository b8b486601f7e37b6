/* The CUDA driver API, loaded at run time from libcuda.so.1. */
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "gpu/shim.h"

#define SYM(name, field, base, group) \
	{ name, NULL, base, offsetof(struct ferry__cuda_api, field), group }
#define REQ(field, exported) SYM(exported, field, "cu" #field, 0)

/*
 * Exported names carry the version suffix that matches the prototypes in shim.h (cuda.h maps
 * cuMemAlloc to cuMemAlloc_v2 and so on); the base names go to cuGetProcAddress.
 */
static const struct ferry__sym cuda_syms[] = {
	REQ(Init, "cuInit"),
	REQ(DriverGetVersion, "cuDriverGetVersion"),
	REQ(GetErrorName, "cuGetErrorName"),
	REQ(GetErrorString, "cuGetErrorString"),
	REQ(DeviceGet, "cuDeviceGet"),
	REQ(DeviceGetCount, "cuDeviceGetCount"),
	REQ(DeviceGetName, "cuDeviceGetName"),
	REQ(DeviceGetAttribute, "cuDeviceGetAttribute"),
	REQ(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	REQ(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
	REQ(CtxSetCurrent, "cuCtxSetCurrent"),
	REQ(CtxGetCurrent, "cuCtxGetCurrent"),
	REQ(CtxGetDevice, "cuCtxGetDevice"),
	REQ(MemAlloc, "cuMemAlloc_v2"),
	REQ(MemFree, "cuMemFree_v2"),
	REQ(MemHostAlloc, "cuMemHostAlloc"),
	REQ(MemFreeHost, "cuMemFreeHost"),
	REQ(MemHostRegister, "cuMemHostRegister_v2"),
	REQ(MemHostUnregister, "cuMemHostUnregister"),
	REQ(MemcpyHtoD, "cuMemcpyHtoD_v2"),
	REQ(MemcpyDtoH, "cuMemcpyDtoH_v2"),
	REQ(MemcpyDtoD, "cuMemcpyDtoD_v2"),
	REQ(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
	REQ(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
	REQ(MemsetD8, "cuMemsetD8_v2"),
	REQ(PointerGetAttribute, "cuPointerGetAttribute"),
	REQ(StreamCreate, "cuStreamCreate"),
	REQ(StreamDestroy, "cuStreamDestroy_v2"),
	REQ(StreamSynchronize, "cuStreamSynchronize"),
	REQ(StreamQuery, "cuStreamQuery"),
	REQ(StreamWaitEvent, "cuStreamWaitEvent"),
	REQ(EventCreate, "cuEventCreate"),
	REQ(EventRecord, "cuEventRecord"),
	REQ(EventQuery, "cuEventQuery"),
	REQ(EventSynchronize, "cuEventSynchronize"),
	REQ(EventDestroy, "cuEventDestroy_v2"),
	REQ(LaunchHostFunc, "cuLaunchHostFunc"),
	SYM("cuMemAllocHost_v2", MemAllocHost, "cuMemAllocHost", 1),
	SYM("cuMemGetInfo_v2", MemGetInfo, "cuMemGetInfo", 2),
	SYM("cuMemGetAddressRange_v2", MemGetAddressRange, "cuMemGetAddressRange", 3),
	SYM("cuPointerGetAttributes", PointerGetAttributes, "cuPointerGetAttributes", 4),
	SYM("cuGetProcAddress_v2", GetProcAddress, NULL, 5),
	/* No base name: cuGetProcAddress at FERRY__CUDA_ABI_VERSION (12.0) predates them (12.8). */
	SYM("cuCheckpointProcessGetRestoreThreadId", CheckpointProcessGetRestoreThreadId, NULL, 6),
	SYM("cuCheckpointProcessGetState", CheckpointProcessGetState, NULL, 7),
	SYM("cuCheckpointProcessLock", CheckpointProcessLock, NULL, 8),
	SYM("cuCheckpointProcessCheckpoint", CheckpointProcessCheckpoint, NULL, 9),
	SYM("cuCheckpointProcessRestore", CheckpointProcessRestore, NULL, 10),
	SYM("cuCheckpointProcessUnlock", CheckpointProcessUnlock, NULL, 11),
	/* No base name either (12.8 and 13.0); each on its own. */
	SYM("cuMemcpyBatchAsync_v2", MemcpyBatchAsync_v2, NULL, 12),
	SYM("cuMemcpyBatchAsync", MemcpyBatchAsync, NULL, 13),
	SYM("cuMemcpyDtoDAsync_v2", MemcpyDtoDAsync, "cuMemcpyDtoDAsync", 14),
	SYM("cuDevicePrimaryCtxGetState", DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 17),
	SYM("cuModuleLoadData", ModuleLoadData, "cuModuleLoadData", 15),
	SYM("cuModuleGetFunction", ModuleGetFunction, "cuModuleGetFunction", 15),
	SYM("cuLaunchKernel", LaunchKernel, "cuLaunchKernel", 15),
	SYM("cuMemHostGetDevicePointer_v2", MemHostGetDevicePointer, "cuMemHostGetDevicePointer", 16),
};

const struct ferry__sym *ferry__cuda_symbols(size_t *n)
{
	*n = sizeof(cuda_syms) / sizeof(cuda_syms[0]);
	return cuda_syms;
}

static struct ferry__cuda_api api;
static const struct ferry__cuda_api *loaded;
static char reason[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void);

static const struct {
	int code;
	const char *name;
	const char *hint; /* what it means for ferry, or NULL */
} cu_errors[] = {
	{ 0, "CUDA_SUCCESS", NULL },
	{ 1, "CUDA_ERROR_INVALID_VALUE", NULL },
	{ 2, "CUDA_ERROR_OUT_OF_MEMORY", NULL },
	{ 3, "CUDA_ERROR_NOT_INITIALIZED", NULL },
	{ 4, "CUDA_ERROR_DEINITIALIZED", NULL },
	{ 34, "CUDA_ERROR_STUB_LIBRARY",
	  "the libcuda.so.1 found is the CUDA toolkit's link stub, not the driver's: check LD_LIBRARY_PATH" },
	{ 46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "the GPU is busy or in exclusive-process mode" },
	{ 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is visible (check CUDA_VISIBLE_DEVICES and /dev/nvidia*)" },
	{ 101, "CUDA_ERROR_INVALID_DEVICE", NULL },
	{ 201, "CUDA_ERROR_INVALID_CONTEXT", NULL },
	{ 218, "CUDA_ERROR_INVALID_PTX", NULL },
	{ 221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "the driver's PTX compiler (libnvidia-ptxjitcompiler.so) is missing" },
	{ 222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the driver is older than the PTX it was given" },
	{ 304, "CUDA_ERROR_OPERATING_SYSTEM", NULL },
	{ 401, "CUDA_ERROR_ILLEGAL_STATE", "the process is not in the state this checkpoint call needs" },
	{ 500, "CUDA_ERROR_NOT_FOUND", NULL },
	{ 600, "CUDA_ERROR_NOT_READY", NULL },
	{ 712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", NULL },
	{ 713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", NULL },
	{ 801, "CUDA_ERROR_NOT_SUPPORTED", NULL },
	{ 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the user-space driver and the kernel module differ in version" },
	{ 804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "the CUDA forward-compatibility package does not support this GPU" },
	{ 999, "CUDA_ERROR_UNKNOWN", NULL },
};

static const char *err_name(ferry__CUresult err)
{
	const char *s = NULL;

	for (size_t i = 0; i < sizeof(cu_errors) / sizeof(cu_errors[0]); i++)
		if (cu_errors[i].code == err)
			return cu_errors[i].name;
	if (api.GetErrorName && api.GetErrorName(err, &s) == FERRY__CUDA_SUCCESS && s)
		return s;
	return "CUDA_ERROR_?";
}

/* Only after the load (which itself uses err_name): the api struct is written there. */
const char *ferry__cuda_err_name(ferry__CUresult err)
{
	pthread_once(&once, load);
	return err_name(err);
}

static const char *err_hint(ferry__CUresult err)
{
	for (size_t i = 0; i < sizeof(cu_errors) / sizeof(cu_errors[0]); i++)
		if (cu_errors[i].code == err)
			return cu_errors[i].hint;
	return NULL;
}

static const char *err_text(ferry__CUresult err)
{
	const char *s = NULL;

	if (api.GetErrorString && api.GetErrorString(err, &s) == FERRY__CUDA_SUCCESS && s)
		return s;
	return "";
}

static void describe(ferry__CUresult err, char *buf, size_t len)
{
	const char *text = err_text(err), *hint = err_hint(err);

	snprintf(buf, len, "%s (%d)%s%s%s%s", err_name(err), (int)err, *text ? ": " : "",
		 text, hint ? "; " : "", hint ? hint : "");
}

/*
 * cuGetProcAddress hands out the entry point of the ABI we ask for (FERRY__CUDA_ABI_VERSION), and
 * it is the door tools such as profilers and checkpointers hook, as the CUDA runtime resolves
 * through it too.
 */
static void *proc_address(const char *base, void *arg)
{
	void *p = NULL;
	ferry__CUdriverProcAddressQueryResult status = 0;

	(void)arg;
	if (api.GetProcAddress(base, &p, FERRY__CUDA_ABI_VERSION, FERRY__CU_GET_PROC_ADDRESS_LEGACY_STREAM,
			       &status) != FERRY__CUDA_SUCCESS || status != FERRY__CU_GET_PROC_ADDRESS_SUCCESS)
		return NULL;
	return p;
}

static void load(void)
{
	char detail[320];
	unsigned gmiss = 0;
	ferry__CUresult r;
	void *h = ferry__dl_open("libcuda.so.1", "FERRY_CUDA_LIBRARY", "no NVIDIA driver", reason,
				 sizeof(reason));

	if (!h)
		return;
	/* First the exported ABI, all or none, so that a partial library is named as such. */
	if (ferry__dl_resolve(h, "libcuda.so.1", &api, cuda_syms, sizeof(cuda_syms) / sizeof(cuda_syms[0]),
			      NULL, NULL, &gmiss, reason, sizeof(reason)) < 0)
		return;
	r = api.Init(0);
	if (r != FERRY__CUDA_SUCCESS) {
		describe(r, detail, sizeof(detail));
		snprintf(reason, sizeof(reason), "cuInit failed: %s", detail);
		return;
	}
	r = api.DriverGetVersion(&api.driver_version);
	if (r != FERRY__CUDA_SUCCESS) {
		describe(r, detail, sizeof(detail));
		snprintf(reason, sizeof(reason), "cuDriverGetVersion failed: %s", detail);
		return;
	}
	api.resolver = "dlsym";
	if (api.GetProcAddress && api.driver_version >= FERRY__CUDA_ABI_VERSION) {
		struct ferry__cuda_api viaproc = api;
		char why[256];
		/* Rows cuGetProcAddress cannot give keep their dlsym pointer (lookup falls back). */
		if (ferry__dl_resolve(h, "libcuda.so.1", &viaproc, cuda_syms,
				      sizeof(cuda_syms) / sizeof(cuda_syms[0]), proc_address, NULL, &gmiss,
				      why, sizeof(why)) == 0) {
			viaproc.driver_version = api.driver_version;
			api = viaproc;
			api.resolver = "cuGetProcAddress";
		}
	}
	r = api.DeviceGetCount(&api.device_count);
	if (r != FERRY__CUDA_SUCCESS) {
		describe(r, detail, sizeof(detail));
		snprintf(reason, sizeof(reason), "cuDeviceGetCount failed: %s", detail);
		return;
	}
	if (api.device_count < 1) {
		snprintf(reason, sizeof(reason), "cuDeviceGetCount found no CUDA device "
			 "(check CUDA_VISIBLE_DEVICES and /dev/nvidia*)");
		return;
	}
	reason[0] = '\0';
	loaded = &api;
	FERRY__LOG(FERRY__LOG_INFO, "libcuda.so.1: driver %d.%d, %d device(s), resolved with %s",
		   api.driver_version / 1000, api.driver_version % 1000 / 10, api.device_count, api.resolver);
}

const struct ferry__cuda_api *ferry__cuda(void)
{
	pthread_once(&once, load);
	return loaded;
}

const char *ferry__cuda_unavailable_reason(void)
{
	pthread_once(&once, load);
	return reason;
}

int ferry__cuda_require(void)
{
	if (ferry__cuda())
		return 0;
	return ferry__error(FERRY_ENOGPU, "%s", reason);
}

int ferry__cuda_fail(ferry__CUresult err, const char *fmt, ...)
{
	char what[256], detail[320];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	describe(err, detail, sizeof(detail));
	return ferry__error(err == FERRY__CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : FERRY_ECUDA, "%s: %s",
			    what, detail);
}

#define MAX_DEVICES 64

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* Retained once per device and kept for the process; read without the lock once set (every copy
 * ring call asks for it: with the lock, eight workers' calls met on one mutex). */
static _Atomic(ferry__CUcontext) primary[MAX_DEVICES];

int ferry__cuda_primary_ctx(int dev, ferry__CUcontext *out)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUcontext ctx;
	ferry__CUdevice d;
	ferry__CUresult r;
	int err = 0;

	if (!cu)
		return ferry__error(FERRY_ENOGPU, "%s", reason);
	if (dev < 0 || dev >= cu->device_count || dev >= MAX_DEVICES)
		return ferry__error(-EINVAL, "CUDA device %d does not exist (%d visible)", dev,
				    cu->device_count);
	if ((ctx = atomic_load_explicit(&primary[dev], memory_order_acquire))) {
		*out = ctx;
		return 0;
	}
	pthread_mutex_lock(&ctx_lock);
	ctx = atomic_load_explicit(&primary[dev], memory_order_relaxed);
	if (!ctx) {
		r = cu->DeviceGet(&d, dev);
		if (r == FERRY__CUDA_SUCCESS)
			r = cu->DevicePrimaryCtxRetain(&ctx, d);
		if (r != FERRY__CUDA_SUCCESS)
			err = ferry__cuda_fail(r, "cuDevicePrimaryCtxRetain(device %d)", dev);
		else
			atomic_store_explicit(&primary[dev], ctx, memory_order_release);
	}
	pthread_mutex_unlock(&ctx_lock);
	if (err)
		return err;
	*out = ctx;
	return 0;
}

int ferry__cuda_set_device(int dev)
{
	const struct ferry__cuda_api *cu;
	ferry__CUcontext ctx, cur = NULL;
	ferry__CUresult r;
	int err = ferry__cuda_primary_ctx(dev, &ctx);

	if (err)
		return err;
	cu = ferry__cuda();
	if (cu->CtxGetCurrent(&cur) == FERRY__CUDA_SUCCESS && cur == ctx)
		return 0;
	r = cu->CtxSetCurrent(ctx);
	if (r != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(r, "cuCtxSetCurrent(primary context of device %d)", dev);
	return 0;
}

int ferry__cuda_enter_device(int dev, ferry__CUcontext *prev)
{
	const struct ferry__cuda_api *cu = ferry__cuda();

	*prev = NULL;
	if (cu && cu->CtxGetCurrent(prev) != FERRY__CUDA_SUCCESS)
		*prev = NULL;
	return ferry__cuda_set_device(dev);
}

void ferry__cuda_leave_device(ferry__CUcontext prev)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUcontext cur = NULL;

	if (!cu || !prev)
		return;
	if (cu->CtxGetCurrent(&cur) == FERRY__CUDA_SUCCESS && cur == prev)
		return;
	cu->CtxSetCurrent(prev);
}
