/*
 * Every function pointer of the shims against the real prototype of the exported symbol the
 * shim resolves (the tables in src/gpu), at compile time: shim.h is included in its real-types
 * mode, so the pointer types must be identical to the headers' declarations.
 */
#include <stdio.h>

#include <cuda.h>
#if __has_include(<cufile.h>)
#include <cufile.h>
#define HAVE_CUFILE 1
#endif
#if __has_include(<nvml.h>)
#include <nvml.h>
#define HAVE_NVML 1
#endif

#define FERRY__ABI_REAL_TYPES 1
#include "gpu/shim.h"

#define SIG(api, field, fn)                                                                   \
	_Static_assert(__builtin_types_compatible_p(__typeof__(((struct api *)0)->field),       \
						    __typeof__(&fn)),                            \
		       #api "." #field " does not match the prototype of " #fn)
#define CU(field, fn) SIG(ferry__cuda_api, field, fn)

/* The names are the exported symbols in cuda_syms[] (cuda.h's macros map the plain names to them). */
CU(Init, cuInit);
CU(DriverGetVersion, cuDriverGetVersion);
CU(GetErrorName, cuGetErrorName);
CU(GetErrorString, cuGetErrorString);
CU(DeviceGet, cuDeviceGet);
CU(DeviceGetCount, cuDeviceGetCount);
CU(DeviceGetName, cuDeviceGetName);
CU(DeviceGetAttribute, cuDeviceGetAttribute);
CU(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
CU(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
CU(CtxSetCurrent, cuCtxSetCurrent);
CU(CtxGetCurrent, cuCtxGetCurrent);
CU(CtxGetDevice, cuCtxGetDevice);
CU(MemAlloc, cuMemAlloc_v2);
CU(MemFree, cuMemFree_v2);
CU(MemHostAlloc, cuMemHostAlloc);
CU(MemFreeHost, cuMemFreeHost);
CU(MemHostRegister, cuMemHostRegister_v2);
CU(MemHostUnregister, cuMemHostUnregister);
CU(MemcpyHtoD, cuMemcpyHtoD_v2);
CU(MemcpyDtoH, cuMemcpyDtoH_v2);
CU(MemcpyDtoD, cuMemcpyDtoD_v2);
CU(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
CU(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
CU(MemsetD8, cuMemsetD8_v2);
CU(PointerGetAttribute, cuPointerGetAttribute);
CU(StreamCreate, cuStreamCreate);
CU(StreamDestroy, cuStreamDestroy_v2);
CU(StreamSynchronize, cuStreamSynchronize);
CU(StreamQuery, cuStreamQuery);
CU(StreamWaitEvent, cuStreamWaitEvent);
CU(EventCreate, cuEventCreate);
CU(EventRecord, cuEventRecord);
CU(EventQuery, cuEventQuery);
CU(EventSynchronize, cuEventSynchronize);
CU(EventDestroy, cuEventDestroy_v2);
CU(LaunchHostFunc, cuLaunchHostFunc);
CU(MemAllocHost, cuMemAllocHost_v2);
CU(MemGetInfo, cuMemGetInfo_v2);
CU(MemGetAddressRange, cuMemGetAddressRange_v2);
CU(PointerGetAttributes, cuPointerGetAttributes);
CU(GetProcAddress, cuGetProcAddress_v2);
CU(ModuleLoadData, cuModuleLoadData);
CU(ModuleGetFunction, cuModuleGetFunction);
CU(LaunchKernel, cuLaunchKernel);
CU(MemHostGetDevicePointer, cuMemHostGetDevicePointer_v2);
#if CUDA_VERSION >= 12080
CU(CheckpointProcessGetRestoreThreadId, cuCheckpointProcessGetRestoreThreadId);
CU(CheckpointProcessGetState, cuCheckpointProcessGetState);
CU(CheckpointProcessLock, cuCheckpointProcessLock);
CU(CheckpointProcessCheckpoint, cuCheckpointProcessCheckpoint);
CU(CheckpointProcessRestore, cuCheckpointProcessRestore);
CU(CheckpointProcessUnlock, cuCheckpointProcessUnlock);
#endif

#ifdef HAVE_CUFILE
#define CF(field, fn) SIG(ferry__cufile_api, field, fn)
CF(DriverOpen, cuFileDriverOpen);
CF(DriverClose, cuFileDriverClose_v2);
CF(HandleRegister, cuFileHandleRegister);
CF(HandleDeregister, cuFileHandleDeregister);
CF(BufRegister, cuFileBufRegister);
CF(BufDeregister, cuFileBufDeregister);
CF(Read, cuFileRead);
CF(Write, cuFileWrite);
CF(GetVersion, cuFileGetVersion);
CF(DriverGetProperties, cuFileDriverGetProperties);
CF(UseCount, cuFileUseCount);
CF(ReadAsync, cuFileReadAsync);
CF(WriteAsync, cuFileWriteAsync);
CF(StreamRegister, cuFileStreamRegister);
CF(StreamDeregister, cuFileStreamDeregister);
CF(BatchIOSetUp, cuFileBatchIOSetUp);
CF(BatchIOSubmit, cuFileBatchIOSubmit);
CF(BatchIOGetStatus, cuFileBatchIOGetStatus);
CF(BatchIOCancel, cuFileBatchIOCancel);
CF(BatchIODestroy, cuFileBatchIODestroy);
#endif

#ifdef HAVE_NVML
#define NV(field, fn) SIG(ferry__nvml_api, field, fn)
NV(Init, nvmlInit_v2);
NV(Shutdown, nvmlShutdown);
NV(ErrorString, nvmlErrorString);
NV(SystemGetDriverVersion, nvmlSystemGetDriverVersion);
NV(DeviceGetCount, nvmlDeviceGetCount_v2);
NV(DeviceGetHandleByIndex, nvmlDeviceGetHandleByIndex_v2);
NV(DeviceGetName, nvmlDeviceGetName);
NV(DeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo);
NV(DeviceGetUtilizationRates, nvmlDeviceGetUtilizationRates);
NV(DeviceGetPciInfo, nvmlDeviceGetPciInfo_v3);
NV(DeviceGetPcieThroughput, nvmlDeviceGetPcieThroughput);
NV(DeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkGeneration);
NV(DeviceGetCurrPcieLinkWidth, nvmlDeviceGetCurrPcieLinkWidth);
NV(DeviceGetMaxPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration);
NV(DeviceGetMaxPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth);
NV(DeviceGetPersistenceMode, nvmlDeviceGetPersistenceMode);
NV(DeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksEventReasons);
NV(DeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksThrottleReasons);
NV(DeviceGetNumaNodeId, nvmlDeviceGetNumaNodeId);
#endif

int main(void)
{
#if !defined(HAVE_CUFILE) || !defined(HAVE_NVML)
	printf("skipped: %s not found: only the prototypes of the headers found were checked\n",
#ifndef HAVE_CUFILE
	       "cufile.h"
#else
	       "nvml.h"
#endif
	);
	return 77;
#else
	printf("test_abi_sig: every shim function pointer matches cuda.h, cufile.h and nvml.h\n");
	return 0;
#endif
}
