/* NVML (libnvidia-ml.so.1), loaded at run time: device facts for doctor and the monitor. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "gpu/shim.h"

#define OFF(field) offsetof(struct ferry__nvml_api, field)

static const struct ferry__sym nvml_syms[] = {
	{ "nvmlInit_v2", NULL, NULL, OFF(Init), 0 },
	{ "nvmlShutdown", NULL, NULL, OFF(Shutdown), 0 },
	{ "nvmlErrorString", NULL, NULL, OFF(ErrorString), 0 },
	{ "nvmlSystemGetDriverVersion", NULL, NULL, OFF(SystemGetDriverVersion), 0 },
	{ "nvmlDeviceGetCount_v2", NULL, NULL, OFF(DeviceGetCount), 0 },
	{ "nvmlDeviceGetHandleByIndex_v2", NULL, NULL, OFF(DeviceGetHandleByIndex), 0 },
	{ "nvmlDeviceGetName", NULL, NULL, OFF(DeviceGetName), 0 },
	{ "nvmlDeviceGetMemoryInfo", NULL, NULL, OFF(DeviceGetMemoryInfo), 0 },
	{ "nvmlDeviceGetUtilizationRates", NULL, NULL, OFF(DeviceGetUtilizationRates), 0 },
	{ "nvmlDeviceGetPciInfo_v3", NULL, NULL, OFF(DeviceGetPciInfo), 0 },
	{ "nvmlDeviceGetPcieThroughput", NULL, NULL, OFF(DeviceGetPcieThroughput), 0 },
	{ "nvmlDeviceGetCurrPcieLinkGeneration", NULL, NULL, OFF(DeviceGetCurrPcieLinkGeneration), 0 },
	{ "nvmlDeviceGetCurrPcieLinkWidth", NULL, NULL, OFF(DeviceGetCurrPcieLinkWidth), 0 },
	{ "nvmlDeviceGetMaxPcieLinkGeneration", NULL, NULL, OFF(DeviceGetMaxPcieLinkGeneration), 0 },
	{ "nvmlDeviceGetMaxPcieLinkWidth", NULL, NULL, OFF(DeviceGetMaxPcieLinkWidth), 0 },
	{ "nvmlDeviceGetPersistenceMode", NULL, NULL, OFF(DeviceGetPersistenceMode), 0 },
	/* renamed in NVML 12.2 (r535); the old name is deprecated in 13.0 */
	{ "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", NULL,
	  OFF(DeviceGetCurrentClocksEventReasons), 1 },
	{ "nvmlDeviceGetNumaNodeId", NULL, NULL, OFF(DeviceGetNumaNodeId), 2 },
};
#define NSYMS (sizeof(nvml_syms) / sizeof(nvml_syms[0]))

const struct ferry__sym *ferry__nvml_symbols(size_t *n)
{
	*n = NSYMS;
	return nvml_syms;
}

static struct ferry__nvml_api api;
static const struct ferry__nvml_api *loaded;
static char reason[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *ret_name(ferry__nvmlReturn_t r)
{
	switch (r) {
	case 0: return "NVML_SUCCESS";
	case 1: return "NVML_ERROR_UNINITIALIZED";
	case 2: return "NVML_ERROR_INVALID_ARGUMENT";
	case 3: return "NVML_ERROR_NOT_SUPPORTED";
	case 4: return "NVML_ERROR_NO_PERMISSION";
	case 6: return "NVML_ERROR_NOT_FOUND";
	case 7: return "NVML_ERROR_INSUFFICIENT_SIZE";
	case 9: return "NVML_ERROR_DRIVER_NOT_LOADED";
	case 12: return "NVML_ERROR_LIBRARY_NOT_FOUND";
	case 13: return "NVML_ERROR_FUNCTION_NOT_FOUND";
	case 15: return "NVML_ERROR_GPU_IS_LOST";
	case 17: return "NVML_ERROR_OPERATING_SYSTEM";
	case 18: return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
	case 999: return "NVML_ERROR_UNKNOWN";
	default: return "NVML_ERROR_?";
	}
}

static void load(void)
{
	ferry__nvmlReturn_t r;
	void *h = ferry__dl_open("libnvidia-ml.so.1", "FERRY_NVML_LIBRARY", "no NVIDIA driver", reason,
				 sizeof(reason));

	if (!h)
		return;
	if (ferry__dl_resolve(h, "libnvidia-ml.so.1", &api, nvml_syms, NSYMS, NULL, NULL, NULL, reason,
			      sizeof(reason)) < 0)
		return;
	r = api.Init();
	if (r != FERRY__NVML_SUCCESS) {
		const char *s = api.ErrorString(r);
		snprintf(reason, sizeof(reason), "nvmlInit_v2 failed: %s (%d): %s%s", ret_name(r), (int)r,
			 s ? s : "",
			 r == FERRY__NVML_ERROR_LIB_RM_VERSION_MISMATCH
				 ? "; the driver library and the kernel module differ in version (reboot or reload the module)"
				 : "");
		return;
	}
	r = api.DeviceGetCount(&api.device_count);
	if (r != FERRY__NVML_SUCCESS) {
		snprintf(reason, sizeof(reason), "nvmlDeviceGetCount_v2 failed: %s (%d)", ret_name(r), (int)r);
		return;
	}
	if (api.SystemGetDriverVersion(api.driver_version, sizeof(api.driver_version)) != FERRY__NVML_SUCCESS)
		api.driver_version[0] = '\0';
	api.driver_version[sizeof(api.driver_version) - 1] = '\0';
	reason[0] = '\0';
	loaded = &api;
}

const struct ferry__nvml_api *ferry__nvml(void)
{
	pthread_once(&once, load);
	return loaded;
}

const char *ferry__nvml_unavailable_reason(void)
{
	pthread_once(&once, load);
	return reason;
}

static int u32(ferry__nvmlReturn_t r, unsigned int v)
{
	return r == FERRY__NVML_SUCCESS ? (int)v : -1;
}

int ferry__nvml_device_info(unsigned int index, struct ferry__nvml_device_info *info)
{
	const struct ferry__nvml_api *nv = ferry__nvml();
	ferry__nvmlDevice_t dev;
	ferry__nvmlMemory_t mem;
	ferry__nvmlUtilization_t util;
	ferry__nvmlPciInfo_t pci;
	ferry__nvmlEnableState_t pm;
	ferry__nvmlReturn_t r;
	unsigned int v;
	unsigned long long reasons;

	if (!nv)
		return ferry__error(FERRY_ENOGPU, "%s", reason);
	if (index >= nv->device_count)
		return ferry__error(-EINVAL, "NVML device %u does not exist (%u visible)", index,
				    nv->device_count);
	r = nv->DeviceGetHandleByIndex(index, &dev);
	if (r != FERRY__NVML_SUCCESS)
		return ferry__error(r == FERRY__NVML_ERROR_NO_PERMISSION ? -EACCES : FERRY_ENOGPU,
				    "nvmlDeviceGetHandleByIndex_v2(%u): %s (%d)", index, ret_name(r), (int)r);
	memset(info, 0, sizeof(*info));
	if (nv->DeviceGetName(dev, info->name, sizeof(info->name)) != FERRY__NVML_SUCCESS)
		info->name[0] = '\0';
	info->name[sizeof(info->name) - 1] = '\0';
	memset(&pci, 0, sizeof(pci));
	if (nv->DeviceGetPciInfo(dev, &pci) == FERRY__NVML_SUCCESS)
		snprintf(info->bus_id, sizeof(info->bus_id), "%.31s", pci.busId);
	info->mem_total = info->mem_free = info->mem_used = -1;
	if (nv->DeviceGetMemoryInfo(dev, &mem) == FERRY__NVML_SUCCESS) {
		info->mem_total = (int64_t)mem.total;
		info->mem_free = (int64_t)mem.free;
		info->mem_used = (int64_t)mem.used;
	}
	info->util_gpu = info->util_mem = -1;
	if (nv->DeviceGetUtilizationRates(dev, &util) == FERRY__NVML_SUCCESS) {
		info->util_gpu = (int)util.gpu;
		info->util_mem = (int)util.memory;
	}
	r = nv->DeviceGetCurrPcieLinkGeneration(dev, &v);
	info->pcie_gen = u32(r, v);
	r = nv->DeviceGetCurrPcieLinkWidth(dev, &v);
	info->pcie_width = u32(r, v);
	r = nv->DeviceGetMaxPcieLinkGeneration(dev, &v);
	info->pcie_gen_max = u32(r, v);
	r = nv->DeviceGetMaxPcieLinkWidth(dev, &v);
	info->pcie_width_max = u32(r, v);
	r = nv->DeviceGetPcieThroughput(dev, FERRY__NVML_PCIE_UTIL_TX_BYTES, &v);
	info->pcie_tx_kibps = r == FERRY__NVML_SUCCESS ? (int64_t)v : -1;
	r = nv->DeviceGetPcieThroughput(dev, FERRY__NVML_PCIE_UTIL_RX_BYTES, &v);
	info->pcie_rx_kibps = r == FERRY__NVML_SUCCESS ? (int64_t)v : -1;
	info->persistence = -1;
	if (nv->DeviceGetPersistenceMode(dev, &pm) == FERRY__NVML_SUCCESS)
		info->persistence = pm == FERRY__NVML_FEATURE_ENABLED;
	info->numa_node = -1;
	if (nv->DeviceGetNumaNodeId && nv->DeviceGetNumaNodeId(dev, &v) == FERRY__NVML_SUCCESS)
		info->numa_node = (int)v;
	info->clocks_event_reasons = -1;
	if (nv->DeviceGetCurrentClocksEventReasons &&
	    nv->DeviceGetCurrentClocksEventReasons(dev, &reasons) == FERRY__NVML_SUCCESS)
		info->clocks_event_reasons = (int64_t)reasons;
	return 0;
}
