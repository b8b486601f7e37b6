/*
 * Run-time shims of the NVIDIA libraries: libcuda.so.1 (driver API), libcufile.so.0 (GPUDirect
 * Storage) and libnvidia-ml.so.1 (NVML). Nothing here links them: each is dlopen'ed by soname once
 * (pthread_once), every required symbol is resolved or the library counts as unavailable, with a
 * sentence saying why. The few types used are declared by hand; tests/gpu/test_abi*.c check them
 * against the real cuda.h, cufile.h and nvml.h.
 *
 * Defining FERRY__ABI_REAL_TYPES before including this header (after cuda.h, cufile.h and nvml.h,
 * whichever are there) makes the hand-declared types aliases of the real ones, so that a test can
 * compare every function pointer type with the real prototype (tests/gpu/test_abi_sig.c).
 */
#ifndef FERRY_GPU_SHIM_H
#define FERRY_GPU_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* ------------------------------------------------------------------------------ CUDA driver ABI */

#if defined(FERRY__ABI_REAL_TYPES) && defined(CUDA_VERSION)
typedef CUresult ferry__CUresult;
typedef CUdevice ferry__CUdevice;
typedef CUdeviceptr ferry__CUdeviceptr;
typedef CUcontext ferry__CUcontext;
typedef CUstream ferry__CUstream;
typedef CUevent ferry__CUevent;
typedef CUhostFn ferry__CUhostFn;
typedef CUdevice_attribute ferry__CUdevice_attribute;
typedef CUpointer_attribute ferry__CUpointer_attribute;
typedef CUdriverProcAddressQueryResult ferry__CUdriverProcAddressQueryResult;
typedef cuuint64_t ferry__cuuint64_t;
typedef CUmodule ferry__CUmodule;
typedef CUfunction ferry__CUfunction;
#if CUDA_VERSION >= 12080 /* the checkpoint API */
typedef CUprocessState ferry__CUprocessState;
typedef CUcheckpointLockArgs ferry__CUcheckpointLockArgs;
typedef CUcheckpointCheckpointArgs ferry__CUcheckpointCheckpointArgs;
typedef CUcheckpointRestoreArgs ferry__CUcheckpointRestoreArgs;
typedef CUcheckpointUnlockArgs ferry__CUcheckpointUnlockArgs;
#define FERRY__ABI_HAS_CHECKPOINT 1
#endif
#else
typedef int ferry__CUresult;
typedef int ferry__CUdevice;
typedef unsigned long long ferry__CUdeviceptr;
typedef struct ferry__CUctx_st *ferry__CUcontext;
typedef struct ferry__CUstream_st *ferry__CUstream;
typedef struct ferry__CUevent_st *ferry__CUevent;
typedef void (*ferry__CUhostFn)(void *user_data);
typedef int ferry__CUdevice_attribute;
typedef int ferry__CUpointer_attribute;
typedef int ferry__CUdriverProcAddressQueryResult;
typedef uint64_t ferry__cuuint64_t;
typedef struct ferry__CUmod_st *ferry__CUmodule;
typedef struct ferry__CUfunc_st *ferry__CUfunction;
#endif
#ifndef FERRY__ABI_HAS_CHECKPOINT
/* The checkpoint API's types (cuda.h 12.8, drivers 570 and later). */
typedef int ferry__CUprocessState; /* FERRY__CU_PROCESS_STATE_* */
typedef struct {
	unsigned int timeoutMs; /* 0: wait as long as it takes */
	unsigned int reserved0;
	uint64_t reserved1[7];
} ferry__CUcheckpointLockArgs;
typedef struct {
	uint64_t reserved[8];
} ferry__CUcheckpointCheckpointArgs;
typedef struct {
	void *gpuPairs; /* CUcheckpointGpuPair *: GPUs to remap; NULL restores onto the same ones */
	unsigned int gpuPairsCount;
	char reserved[52 - sizeof(void *)];
	uint64_t reserved1;
} ferry__CUcheckpointRestoreArgs;
typedef struct {
	uint64_t reserved[8];
} ferry__CUcheckpointUnlockArgs;
#endif
#define FERRY__CU_PROCESS_STATE_RUNNING 0
#define FERRY__CU_PROCESS_STATE_LOCKED 1
#define FERRY__CU_PROCESS_STATE_CHECKPOINTED 2
#define FERRY__CU_PROCESS_STATE_FAILED 3

/* CUresult values (cuda.h, enum cudaError_enum). */
#define FERRY__CUDA_SUCCESS 0
#define FERRY__CUDA_ERROR_INVALID_VALUE 1
#define FERRY__CUDA_ERROR_OUT_OF_MEMORY 2
#define FERRY__CUDA_ERROR_NOT_INITIALIZED 3
#define FERRY__CUDA_ERROR_DEINITIALIZED 4
#define FERRY__CUDA_ERROR_STUB_LIBRARY 34
#define FERRY__CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define FERRY__CUDA_ERROR_NO_DEVICE 100
#define FERRY__CUDA_ERROR_INVALID_DEVICE 101
#define FERRY__CUDA_ERROR_INVALID_CONTEXT 201
#define FERRY__CUDA_ERROR_OPERATING_SYSTEM 304
#define FERRY__CUDA_ERROR_NOT_FOUND 500
#define FERRY__CUDA_ERROR_NOT_READY 600
#define FERRY__CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define FERRY__CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define FERRY__CUDA_ERROR_NOT_SUPPORTED 801
#define FERRY__CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803
#define FERRY__CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE 804
#define FERRY__CUDA_ERROR_UNKNOWN 999

/* CUpointer_attribute */
#define FERRY__CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define FERRY__CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define FERRY__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
/* CUmemorytype */
#define FERRY__CU_MEMORYTYPE_HOST 1
#define FERRY__CU_MEMORYTYPE_DEVICE 2
#define FERRY__CU_MEMORYTYPE_ARRAY 3
#define FERRY__CU_MEMORYTYPE_UNIFIED 4
/* CUdevice_attribute */
#define FERRY__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define FERRY__CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define FERRY__CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define FERRY__CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT 40
#define FERRY__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define FERRY__CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define FERRY__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define FERRY__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define FERRY__CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED 99
#define FERRY__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
/* flags */
#define FERRY__CU_MEMHOSTALLOC_PORTABLE 0x01
#define FERRY__CU_MEMHOSTREGISTER_PORTABLE 0x01
#define FERRY__CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define FERRY__CU_MEMHOSTREGISTER_READ_ONLY 0x08
#define FERRY__CU_STREAM_DEFAULT 0x0
#define FERRY__CU_STREAM_NON_BLOCKING 0x1
#define FERRY__CU_EVENT_DEFAULT 0x0
#define FERRY__CU_EVENT_BLOCKING_SYNC 0x1
#define FERRY__CU_EVENT_DISABLE_TIMING 0x2
/* cuGetProcAddress */
#define FERRY__CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define FERRY__CU_GET_PROC_ADDRESS_SUCCESS 0
/* cuMemcpyBatchAsync's attributes (cuda.h 12.8: CUmemcpyAttributes, CUmemLocation), declared by hand. */
#if defined(FERRY__ABI_REAL_TYPES) && defined(CUDA_VERSION) && CUDA_VERSION >= 12080
typedef CUmemcpyAttributes ferry__CUmemcpyAttributes;
#else
typedef struct {
	int type; /* CUmemLocationType; 0 (invalid): no hint */
	int id;
} ferry__CUmemLocation;
typedef struct {
	int srcAccessOrder; /* FERRY__CU_MEMCPY_SRC_ACCESS_ORDER_* */
	ferry__CUmemLocation srcLocHint, dstLocHint;
	unsigned int flags;
} ferry__CUmemcpyAttributes;
#endif
#define FERRY__CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 1
#define FERRY__CU_MEM_LOCATION_TYPE_DEVICE 1
#define FERRY__CU_MEM_LOCATION_TYPE_HOST 2
/* The driver ABI the function pointer types below were written against; passed to cuGetProcAddress. */
#define FERRY__CUDA_ABI_VERSION 12000

/*
 * The driver API. Members are named after the function without its `cu` prefix (cuda.h turns
 * cuMemAlloc and friends into macros, so the real names cannot be used as member names).
 * Members marked optional may be NULL.
 */
struct ferry__cuda_api {
	int driver_version;  /* cuDriverGetVersion: 12080 means 12.8 */
	int device_count;    /* >= 1 */
	const char *resolver; /* "cuGetProcAddress" or "dlsym" */

	ferry__CUresult (*Init)(unsigned int flags);
	ferry__CUresult (*DriverGetVersion)(int *version);
	ferry__CUresult (*GetErrorName)(ferry__CUresult err, const char **str);
	ferry__CUresult (*GetErrorString)(ferry__CUresult err, const char **str);
	ferry__CUresult (*DeviceGet)(ferry__CUdevice *dev, int ordinal);
	ferry__CUresult (*DeviceGetCount)(int *count);
	ferry__CUresult (*DeviceGetName)(char *name, int len, ferry__CUdevice dev);
	ferry__CUresult (*DeviceGetAttribute)(int *value, ferry__CUdevice_attribute attr, ferry__CUdevice dev);
	ferry__CUresult (*DevicePrimaryCtxRetain)(ferry__CUcontext *ctx, ferry__CUdevice dev);
	ferry__CUresult (*DevicePrimaryCtxRelease)(ferry__CUdevice dev);
	ferry__CUresult (*CtxSetCurrent)(ferry__CUcontext ctx);
	ferry__CUresult (*CtxGetCurrent)(ferry__CUcontext *ctx);
	ferry__CUresult (*CtxGetDevice)(ferry__CUdevice *dev);
	ferry__CUresult (*MemAlloc)(ferry__CUdeviceptr *dptr, size_t size);
	ferry__CUresult (*MemFree)(ferry__CUdeviceptr dptr);
	ferry__CUresult (*MemHostAlloc)(void **p, size_t size, unsigned int flags);
	ferry__CUresult (*MemFreeHost)(void *p);
	ferry__CUresult (*MemHostRegister)(void *p, size_t size, unsigned int flags);
	ferry__CUresult (*MemHostUnregister)(void *p);
	ferry__CUresult (*MemcpyHtoD)(ferry__CUdeviceptr dst, const void *src, size_t size);
	ferry__CUresult (*MemcpyDtoH)(void *dst, ferry__CUdeviceptr src, size_t size);
	ferry__CUresult (*MemcpyDtoD)(ferry__CUdeviceptr dst, ferry__CUdeviceptr src, size_t size);
	ferry__CUresult (*MemcpyHtoDAsync)(ferry__CUdeviceptr dst, const void *src, size_t size,
					   ferry__CUstream stream);
	ferry__CUresult (*MemcpyDtoHAsync)(void *dst, ferry__CUdeviceptr src, size_t size,
					   ferry__CUstream stream);
	ferry__CUresult (*MemsetD8)(ferry__CUdeviceptr dst, unsigned char value, size_t n);
	ferry__CUresult (*PointerGetAttribute)(void *data, ferry__CUpointer_attribute attr,
					       ferry__CUdeviceptr ptr);
	ferry__CUresult (*StreamCreate)(ferry__CUstream *stream, unsigned int flags);
	ferry__CUresult (*StreamDestroy)(ferry__CUstream stream);
	ferry__CUresult (*StreamSynchronize)(ferry__CUstream stream);
	ferry__CUresult (*StreamQuery)(ferry__CUstream stream);
	ferry__CUresult (*StreamWaitEvent)(ferry__CUstream stream, ferry__CUevent event, unsigned int flags);
	ferry__CUresult (*EventCreate)(ferry__CUevent *event, unsigned int flags);
	ferry__CUresult (*EventRecord)(ferry__CUevent event, ferry__CUstream stream);
	ferry__CUresult (*EventQuery)(ferry__CUevent event);
	ferry__CUresult (*EventSynchronize)(ferry__CUevent event);
	ferry__CUresult (*EventDestroy)(ferry__CUevent event);
	ferry__CUresult (*LaunchHostFunc)(ferry__CUstream stream, ferry__CUhostFn fn, void *user_data);

	/* optional */
	ferry__CUresult (*MemAllocHost)(void **p, size_t size);
	ferry__CUresult (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
	ferry__CUresult (*MemGetAddressRange)(ferry__CUdeviceptr *base, size_t *size, ferry__CUdeviceptr ptr);
	ferry__CUresult (*PointerGetAttributes)(unsigned int n, ferry__CUpointer_attribute *attrs,
						void **data, ferry__CUdeviceptr ptr);
	ferry__CUresult (*GetProcAddress)(const char *symbol, void **pfn, int cuda_version,
					  ferry__cuuint64_t flags,
					  ferry__CUdriverProcAddressQueryResult *status);
	/* optional, each on its own (drivers 570 and later): the checkpoint API, which acts on
	 * another process (pid). NULL when absent: tools/snapshot.c names the missing ones. */
	ferry__CUresult (*CheckpointProcessGetRestoreThreadId)(int pid, int *tid);
	ferry__CUresult (*CheckpointProcessGetState)(int pid, ferry__CUprocessState *state);
	ferry__CUresult (*CheckpointProcessLock)(int pid, ferry__CUcheckpointLockArgs *args);
	ferry__CUresult (*CheckpointProcessCheckpoint)(int pid, ferry__CUcheckpointCheckpointArgs *args);
	ferry__CUresult (*CheckpointProcessRestore)(int pid, ferry__CUcheckpointRestoreArgs *args);
	ferry__CUresult (*CheckpointProcessUnlock)(int pid, ferry__CUcheckpointUnlockArgs *args);
	/* optional: many host-to-device copies in one call (gpu/ring.c's gather). cuda.h 13 maps
	 * cuMemcpyBatchAsync to cuMemcpyBatchAsync_v2 (no failIdx); drivers 12.8 and 12.9 export only
	 * the first form, with failIdx. Either may be NULL; ring.c uses the one there is. */
	ferry__CUresult (*MemcpyBatchAsync_v2)(ferry__CUdeviceptr *dsts, ferry__CUdeviceptr *srcs, size_t *sizes,
					       size_t count, ferry__CUmemcpyAttributes *attrs, size_t *attrsIdxs,
					       size_t numAttrs, ferry__CUstream stream);
	ferry__CUresult (*MemcpyBatchAsync)(ferry__CUdeviceptr *dsts, ferry__CUdeviceptr *srcs, size_t *sizes,
					    size_t count, ferry__CUmemcpyAttributes *attrs, size_t *attrsIdxs,
					    size_t numAttrs, size_t *failIdx, ferry__CUstream stream);
	/* optional: the checkpoint writer's device-side snapshot (gpu/devcopy.c) does without it */
	ferry__CUresult (*MemcpyDtoDAsync)(ferry__CUdeviceptr dst, ferry__CUdeviceptr src, size_t size,
					   ferry__CUstream stream);
	/* optional: whether a device's primary context is active, asked without making it (the
	 * engine readies its GPU state at the start only where the process already uses the GPU) */
	ferry__CUresult (*DevicePrimaryCtxGetState)(ferry__CUdevice dev, unsigned int *flags, int *active);
	/* optional, all three or none: the scatter kernel (gpu/scatter.c); without them a gather's
	 * pieces are copied with cuMemcpyBatchAsync or cuMemcpyHtoDAsync */
	ferry__CUresult (*ModuleLoadData)(ferry__CUmodule *module, const void *image);
	ferry__CUresult (*ModuleGetFunction)(ferry__CUfunction *fn, ferry__CUmodule module, const char *name);
	ferry__CUresult (*LaunchKernel)(ferry__CUfunction fn, unsigned int grid_x, unsigned int grid_y,
					unsigned int grid_z, unsigned int block_x, unsigned int block_y,
					unsigned int block_z, unsigned int shared_bytes, ferry__CUstream stream,
					void **params, void **extra);
	/* optional: where a kernel reaches mapped pinned host memory (the scatter kernel's sources) */
	ferry__CUresult (*MemHostGetDevicePointer)(ferry__CUdeviceptr *dptr, void *p, unsigned int flags);
};

/*
 * The loaded driver API, or NULL when libcuda.so.1 cannot be used here (then
 * ferry__cuda_unavailable_reason() says why). Loads once per process (thread-safe); cuInit(0) has
 * succeeded and at least one device is visible when it returns non-NULL.
 */
const struct ferry__cuda_api *ferry__cuda(void);
/* "" when CUDA is usable, else e.g. "libcuda.so.1 not found (no NVIDIA driver): dlopen: ...",
 * "cuInit failed: CUDA_ERROR_NO_DEVICE (100) ...", "symbol cuMemcpyHtoDAsync_v2 missing from libcuda.so.1". */
const char *ferry__cuda_unavailable_reason(void);
/* 0 if CUDA is usable, else FERRY_ENOGPU with the reason as the thread's error detail. */
int ferry__cuda_require(void);
/* "CUDA_ERROR_OUT_OF_MEMORY" (the driver's name for err, or ferry's table when the driver is absent). */
const char *ferry__cuda_err_name(ferry__CUresult err);
/*
 * Records a failed driver call as the thread's error detail, "<what>: CUDA_ERROR_X (n): text", and
 * returns -ENOMEM for CUDA_ERROR_OUT_OF_MEMORY, FERRY_ECUDA otherwise.
 */
int ferry__cuda_fail(ferry__CUresult err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * Makes the primary context of device `dev` current on the calling thread (retained once per
 * process and device, never released). Returns 0, FERRY_ENOGPU, -EINVAL (no such device) or FERRY_ECUDA.
 */
int ferry__cuda_set_device(int dev);
/* The primary context of `dev` (retained as above), without making it current. */
int ferry__cuda_primary_ctx(int dev, ferry__CUcontext *out);
/*
 * For library work on a caller's thread: makes dev's primary context current and saves the
 * context that was current in *prev; ferry__cuda_leave_device(prev) puts it back (when there was one).
 */
int ferry__cuda_enter_device(int dev, ferry__CUcontext *prev);
void ferry__cuda_leave_device(ferry__CUcontext prev);

/* One row of a shim's symbol table, exported for tests that compare resolution methods. */
struct ferry__sym {
	const char *name;    /* exported symbol, as dlsym looks it up */
	const char *alt;     /* older exported name tried when name is absent, or NULL */
	const char *base;    /* name given to cuGetProcAddress, or NULL */
	size_t offset;       /* of the function pointer in the api struct */
	int group;           /* 0: required; n > 0: optional group n, resolved all or none */
};
const struct ferry__sym *ferry__cuda_symbols(size_t *n);
const struct ferry__sym *ferry__cufile_symbols(size_t *n);
const struct ferry__sym *ferry__nvml_symbols(size_t *n);

/* ------------------------------------------------------------------------------- memory kinds */

enum {
	FERRY__MEM_HOST = 0,    /* pageable host memory, or anything CUDA does not know */
	FERRY__MEM_PINNED = 1,  /* page-locked host memory (cuMemHostAlloc or cuMemHostRegister) */
	FERRY__MEM_DEVICE = 2,  /* device memory */
	FERRY__MEM_MANAGED = 3, /* unified (managed) memory: host-accessible, migrates on demand */
};
/*
 * The kind of memory ptr addresses, and its device ordinal (-1 for host memory) in *device when
 * device is not NULL. FERRY__MEM_HOST when CUDA is unavailable. Never fails: an unknown pointer is
 * host memory.
 */
int ferry__mem_kind(const void *ptr, int *device);

/* ------------------------------------------------------------------------------- cuFile ABI */

#if defined(FERRY__ABI_REAL_TYPES) && defined(CUFILEOP_BASE_ERR)
typedef CUfileError_t ferry__CUfileError_t;
typedef CUfileDescr_t ferry__CUfileDescr_t;
typedef CUfileHandle_t ferry__CUfileHandle_t;
typedef CUfileBatchHandle_t ferry__CUfileBatchHandle_t;
typedef CUfileIOParams_t ferry__CUfileIOParams_t;
typedef CUfileIOEvents_t ferry__CUfileIOEvents_t;
typedef CUfileDrvProps_t ferry__CUfileDrvProps_t;
#else
typedef struct {
	int err;    /* CUfileOpError */
	int cu_err; /* CUresult, when err is CU_FILE_CUDA_DRIVER_ERROR */
} ferry__CUfileError_t;

typedef struct {
	int type; /* enum CUfileFileHandleType: CU_FILE_HANDLE_TYPE_OPAQUE_FD */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops; /* const CUfileFSOps_t *: NULL */
} ferry__CUfileDescr_t;

typedef void *ferry__CUfileHandle_t;
typedef void *ferry__CUfileBatchHandle_t;

typedef struct {
	int mode; /* CUfileBatchMode_t: CUFILE_BATCH */
	union {
		struct {
			void *devPtr_base;
			off_t file_offset;
			off_t devPtr_offset;
			size_t size;
		} batch;
	} u;
	ferry__CUfileHandle_t fh;
	int opcode; /* CUfileOpcode_t */
	void *cookie;
} ferry__CUfileIOParams_t;

typedef struct {
	void *cookie;
	int status; /* CUfileStatus_t */
	size_t ret; /* bytes transferred, or a negative error stored in a size_t */
} ferry__CUfileIOEvents_t;

typedef struct {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
		size_t poll_thresh_size;
		size_t max_direct_io_size;
		unsigned int dstatusflags;
		unsigned int dcontrolflags;
	} nvfs;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
	unsigned int max_batch_io_size;
	unsigned int max_batch_io_timeout_msecs;
} ferry__CUfileDrvProps_t;
#endif

#define FERRY__CU_FILE_SUCCESS 0
#define FERRY__CUFILEOP_BASE_ERR 5000
#define FERRY__CU_FILE_DRIVER_NOT_INITIALIZED 5001
#define FERRY__CU_FILE_DRIVER_VERSION_MISMATCH 5004
#define FERRY__CU_FILE_PLATFORM_NOT_SUPPORTED 5007
#define FERRY__CU_FILE_IO_NOT_SUPPORTED 5008
#define FERRY__CU_FILE_DEVICE_NOT_SUPPORTED 5009
#define FERRY__CU_FILE_NVFS_DRIVER_ERROR 5010
#define FERRY__CU_FILE_CUDA_DRIVER_ERROR 5011
#define FERRY__CU_FILE_INVALID_FILE_TYPE 5018
#define FERRY__CU_FILE_INVALID_FILE_OPEN_FLAG 5019
#define FERRY__CU_FILE_DIO_NOT_SET 5020
#define FERRY__CU_FILE_INVALID_VALUE 5022
#define FERRY__CU_FILE_PERMISSION_DENIED 5025
#define FERRY__CU_FILE_DRIVER_ALREADY_OPEN 5026
#define FERRY__CU_FILE_HANDLE_NOT_REGISTERED 5027
#define FERRY__CU_FILE_HANDLE_ALREADY_REGISTERED 5028
#define FERRY__CU_FILE_DEVICE_NOT_FOUND 5029
#define FERRY__CU_FILE_IO_DISABLED 5034
#define FERRY__CU_FILE_BATCH_NOCOMPAT_ERROR 5049
#define FERRY__CU_FILE_HANDLE_TYPE_OPAQUE_FD 1
#define FERRY__CUFILE_READ 0
#define FERRY__CUFILE_WRITE 1
#define FERRY__CUFILE_BATCH 1
#define FERRY__CUFILE_WAITING 0x01
#define FERRY__CUFILE_PENDING 0x02
#define FERRY__CUFILE_INVALID 0x04
#define FERRY__CUFILE_CANCELED 0x08
#define FERRY__CUFILE_COMPLETE 0x10
#define FERRY__CUFILE_TIMEOUT 0x20
#define FERRY__CUFILE_FAILED 0x40
#define FERRY__CU_FILE_STREAM_FIXED_BUF_OFFSET 1
#define FERRY__CU_FILE_STREAM_FIXED_FILE_OFFSET 2
#define FERRY__CU_FILE_STREAM_FIXED_FILE_SIZE 4
#define FERRY__CU_FILE_STREAM_PAGE_ALIGNED_INPUTS 8

/* Optional symbol groups of libcufile.so.0, each resolved all or none. */
enum { FERRY__CUFILE_HAS_STREAM = 1 << 0, FERRY__CUFILE_HAS_BATCH = 1 << 1 };

struct ferry__cufile_api {
	int version;  /* cuFileGetVersion (1150 means 1.15), 0 when the library cannot tell */
	unsigned has; /* FERRY__CUFILE_HAS_* */

	ferry__CUfileError_t (*DriverOpen)(void);
	ferry__CUfileError_t (*DriverClose)(void); /* cuFileDriverClose_v2, or cuFileDriverClose */
	ferry__CUfileError_t (*HandleRegister)(ferry__CUfileHandle_t *fh, ferry__CUfileDescr_t *descr);
	void (*HandleDeregister)(ferry__CUfileHandle_t fh);
	ferry__CUfileError_t (*BufRegister)(const void *base, size_t length, int flags);
	ferry__CUfileError_t (*BufDeregister)(const void *base);
	ssize_t (*Read)(ferry__CUfileHandle_t fh, void *base, size_t size, off_t file_offset,
			off_t buf_offset);
	ssize_t (*Write)(ferry__CUfileHandle_t fh, const void *base, size_t size, off_t file_offset,
			 off_t buf_offset);

	/* optional */
	ferry__CUfileError_t (*GetVersion)(int *version);
	ferry__CUfileError_t (*DriverGetProperties)(ferry__CUfileDrvProps_t *props);
	long (*UseCount)(void);
	/* FERRY__CUFILE_HAS_STREAM */
	ferry__CUfileError_t (*ReadAsync)(ferry__CUfileHandle_t fh, void *base, size_t *size,
					  off_t *file_offset, off_t *buf_offset, ssize_t *bytes_read,
					  ferry__CUstream stream);
	ferry__CUfileError_t (*WriteAsync)(ferry__CUfileHandle_t fh, void *base, size_t *size,
					   off_t *file_offset, off_t *buf_offset,
					   ssize_t *bytes_written, ferry__CUstream stream);
	ferry__CUfileError_t (*StreamRegister)(ferry__CUstream stream, unsigned flags);
	ferry__CUfileError_t (*StreamDeregister)(ferry__CUstream stream);
	/* FERRY__CUFILE_HAS_BATCH */
	ferry__CUfileError_t (*BatchIOSetUp)(ferry__CUfileBatchHandle_t *batch, unsigned nr);
	ferry__CUfileError_t (*BatchIOSubmit)(ferry__CUfileBatchHandle_t batch, unsigned nr,
					      ferry__CUfileIOParams_t *params, unsigned int flags);
	ferry__CUfileError_t (*BatchIOGetStatus)(ferry__CUfileBatchHandle_t batch, unsigned min_nr,
						 unsigned *nr, ferry__CUfileIOEvents_t *events,
						 struct timespec *timeout);
	ferry__CUfileError_t (*BatchIOCancel)(ferry__CUfileBatchHandle_t batch);
	void (*BatchIODestroy)(ferry__CUfileBatchHandle_t batch);
};

/*
 * The loaded cuFile API (library loaded and symbols resolved; the driver is not opened yet), or
 * NULL with ferry__cufile_unavailable_reason(). Requires CUDA: when ferry__cuda() is NULL so is this.
 */
const struct ferry__cufile_api *ferry__cufile(void);
const char *ferry__cufile_unavailable_reason(void);
/*
 * Opens the cuFile driver once per process (cuFileDriverOpen, with device 0's primary context
 * current). Returns the API, or NULL with the reason in why (when not NULL) and as the thread's
 * error detail. Never closed: the process exit does it.
 */
const struct ferry__cufile_api *ferry__cufile_driver(char *why, size_t len);
/* "CU_FILE_HANDLE_NOT_REGISTERED" for 5027, "CU_FILE_5099" for codes it does not know. */
const char *ferry__cufile_err_name(int err);
/*
 * A sentence explaining a cuFile error for users: the name, the code, cuFile's own text, and what
 * it means for ferry. For 5027 it checks /run/udev. Returns buf.
 */
const char *ferry__cufile_explain(ferry__CUfileError_t err, char *buf, size_t len);

enum {
	FERRY__GDS_REFUSED = 0, /* cuFile cannot take this file (why says so) */
	FERRY__GDS_NATIVE = 1,  /* registered, nvidia-fs loaded: true GPUDirect Storage */
	FERRY__GDS_COMPAT = 2,  /* registered, but nvidia-fs is not loaded: cuFile compatibility mode */
};
/*
 * Registers fd (opened with O_DIRECT) with cuFile. Returns 0 with the handle, or FERRY_ENOGDS with
 * the sentence in why, the thread's error detail, and cuFile's code in *cufile_err (when not NULL;
 * 0 when the failure was not cuFile's: library or driver unavailable).
 */
int ferry__gds_handle_register(int fd, ferry__CUfileHandle_t *out, int *cufile_err, char *why, size_t len);
void ferry__gds_handle_deregister(ferry__CUfileHandle_t fh);
/*
 * Whether GDS can take this file: registers and deregisters fd. Returns FERRY__GDS_NATIVE,
 * FERRY__GDS_COMPAT or FERRY__GDS_REFUSED, with a sentence in why in every case.
 */
int ferry__gds_probe_fd(int fd, char *why, size_t len);
/*
 * Whether true GPUDirect DMA can happen here at all (nvidia-fs loaded, or P2PDMA enabled in
 * cufile.json), without loading cuFile. 0 with the reason in why when it cannot: `auto` then skips
 * cuFile (its driver open costs about a second) since compatibility mode is slower than ferry's path.
 * Asked once per process (the answer and its reason kept: path=auto asks at every request into
 * device memory, and reading cufile.json each time cost about 50 us a request); _probe asks again.
 */
int ferry__gds_native_possible(char *why, size_t len);
int ferry__gds_native_probe(char *why, size_t len);

/* ---------------------------------------------------------------------------------- NVML ABI */

#if defined(FERRY__ABI_REAL_TYPES) && defined(NVML_API_VERSION)
typedef nvmlReturn_t ferry__nvmlReturn_t;
typedef nvmlDevice_t ferry__nvmlDevice_t;
typedef nvmlMemory_t ferry__nvmlMemory_t;
typedef nvmlUtilization_t ferry__nvmlUtilization_t;
typedef nvmlPciInfo_t ferry__nvmlPciInfo_t;
typedef nvmlPcieUtilCounter_t ferry__nvmlPcieUtilCounter_t;
typedef nvmlEnableState_t ferry__nvmlEnableState_t;
#else
typedef int ferry__nvmlReturn_t;
typedef struct ferry__nvmlDevice_st *ferry__nvmlDevice_t;
typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} ferry__nvmlMemory_t;
typedef struct {
	unsigned int gpu;
	unsigned int memory;
} ferry__nvmlUtilization_t;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} ferry__nvmlPciInfo_t;
typedef int ferry__nvmlPcieUtilCounter_t;
typedef int ferry__nvmlEnableState_t;
#endif

#define FERRY__NVML_SUCCESS 0
#define FERRY__NVML_ERROR_UNINITIALIZED 1
#define FERRY__NVML_ERROR_NOT_SUPPORTED 3
#define FERRY__NVML_ERROR_NO_PERMISSION 4
#define FERRY__NVML_ERROR_DRIVER_NOT_LOADED 9
#define FERRY__NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define FERRY__NVML_ERROR_UNKNOWN 999
#define FERRY__NVML_PCIE_UTIL_TX_BYTES 0
#define FERRY__NVML_PCIE_UTIL_RX_BYTES 1
#define FERRY__NVML_FEATURE_DISABLED 0
#define FERRY__NVML_FEATURE_ENABLED 1
#define FERRY__NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define FERRY__NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

struct ferry__nvml_api {
	char driver_version[FERRY__NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE]; /* "580.65.06" */
	unsigned int device_count;

	ferry__nvmlReturn_t (*Init)(void); /* nvmlInit_v2 */
	ferry__nvmlReturn_t (*Shutdown)(void);
	const char *(*ErrorString)(ferry__nvmlReturn_t r);
	ferry__nvmlReturn_t (*SystemGetDriverVersion)(char *version, unsigned int len);
	ferry__nvmlReturn_t (*DeviceGetCount)(unsigned int *count);
	ferry__nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned int index, ferry__nvmlDevice_t *dev);
	ferry__nvmlReturn_t (*DeviceGetName)(ferry__nvmlDevice_t dev, char *name, unsigned int len);
	ferry__nvmlReturn_t (*DeviceGetMemoryInfo)(ferry__nvmlDevice_t dev, ferry__nvmlMemory_t *mem);
	ferry__nvmlReturn_t (*DeviceGetUtilizationRates)(ferry__nvmlDevice_t dev, ferry__nvmlUtilization_t *u);
	ferry__nvmlReturn_t (*DeviceGetPciInfo)(ferry__nvmlDevice_t dev, ferry__nvmlPciInfo_t *pci); /* _v3 */
	ferry__nvmlReturn_t (*DeviceGetPcieThroughput)(ferry__nvmlDevice_t dev,
						       ferry__nvmlPcieUtilCounter_t counter,
						       unsigned int *kib_per_s);
	ferry__nvmlReturn_t (*DeviceGetCurrPcieLinkGeneration)(ferry__nvmlDevice_t dev, unsigned int *gen);
	ferry__nvmlReturn_t (*DeviceGetCurrPcieLinkWidth)(ferry__nvmlDevice_t dev, unsigned int *width);
	ferry__nvmlReturn_t (*DeviceGetMaxPcieLinkGeneration)(ferry__nvmlDevice_t dev, unsigned int *gen);
	ferry__nvmlReturn_t (*DeviceGetMaxPcieLinkWidth)(ferry__nvmlDevice_t dev, unsigned int *width);
	ferry__nvmlReturn_t (*DeviceGetPersistenceMode)(ferry__nvmlDevice_t dev, ferry__nvmlEnableState_t *mode);

	/* optional */
	/* nvmlDeviceGetCurrentClocksEventReasons, or the older ...ThrottleReasons (same ABI) */
	ferry__nvmlReturn_t (*DeviceGetCurrentClocksEventReasons)(ferry__nvmlDevice_t dev,
								  unsigned long long *reasons);
	ferry__nvmlReturn_t (*DeviceGetNumaNodeId)(ferry__nvmlDevice_t dev, unsigned int *node);
};

/* The loaded and initialized NVML (nvmlInit_v2 done, never shut down), or NULL with the reason. */
const struct ferry__nvml_api *ferry__nvml(void);
const char *ferry__nvml_unavailable_reason(void);

/* One device as NVML sees it; fields NVML cannot tell are -1 (numbers) or "" (strings). */
struct ferry__nvml_device_info {
	char name[FERRY__NVML_DEVICE_NAME_V2_BUFFER_SIZE];
	char bus_id[32]; /* "00000000:18:00.0" */
	int64_t mem_total, mem_free, mem_used;
	int util_gpu, util_mem;     /* percent */
	int pcie_gen, pcie_width;   /* current link */
	int pcie_gen_max, pcie_width_max;
	int64_t pcie_tx_kibps, pcie_rx_kibps; /* KiB/s over NVML's 20 ms sample */
	int persistence;            /* 1 on, 0 off */
	int numa_node;
	int64_t clocks_event_reasons; /* nvmlClocksEventReason bit mask */
};
/* Fills info for device index. Returns 0, FERRY_ENOGPU (no NVML), -EINVAL (no such index). */
int ferry__nvml_device_info(unsigned int index, struct ferry__nvml_device_info *info);

/* ------------------------------------------------------------------------- shared by the shims */

/*
 * dlopen(soname, or the path in environment variable env when set and non-empty), RTLD_NOW |
 * RTLD_LOCAL. On failure writes "<soname> not found (<missing>): dlopen: <dlerror>" into why.
 */
void *ferry__dl_open(const char *soname, const char *env, const char *missing, char *why, size_t len);
/*
 * Resolves syms into the struct at api. lookup, when not NULL, is tried first for rows with a
 * `base` (cuGetProcAddress); dlsym on handle otherwise. Required rows: all or the call fails with
 * "symbol X missing from <soname>" (the first in table order, and how many more). Optional groups
 * are all or none; *groups_missing gets bit (group - 1) for each group left unresolved.
 * Returns 0 or -1.
 */
typedef void *(*ferry__dl_lookup_fn)(const char *base, void *arg);
int ferry__dl_resolve(void *handle, const char *soname, void *api, const struct ferry__sym *syms,
		      size_t n, ferry__dl_lookup_fn lookup, void *lookup_arg, unsigned *groups_missing,
		      char *why, size_t len);

#endif
