/*
 * A stand-in for libnvidia-ml.so.1, built by tests/unit/test_gpu_shim.c at test time. Exports the
 * pre-12.2 name nvmlDeviceGetCurrentClocksThrottleReasons only and no nvmlDeviceGetNumaNodeId, to
 * exercise the shim's fallbacks. -DFAKE_NVML_INIT=n sets nvmlInit_v2's result.
 */
#include <stdio.h>
#include <string.h>

#ifndef FAKE_NVML_INIT
#define FAKE_NVML_INIT 0
#endif
#define API __attribute__((visibility("default")))

typedef int R;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
static char dev0;

API R nvmlInit_v2(void) { return FAKE_NVML_INIT; }
API R nvmlShutdown(void) { return 0; }
API const char *nvmlErrorString(R r) { return r == 9 ? "Driver Not Loaded" : "Fake"; }
API R nvmlSystemGetDriverVersion(char *v, unsigned n) { snprintf(v, n, "999.1.2"); return 0; }
API R nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return 0; }
API R nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) { if (i) return 2; *d = &dev0; return 0; }
API R nvmlDeviceGetName(void *d, char *n, unsigned len) { (void)d; snprintf(n, len, "Fake GPU"); return 0; }
API R nvmlDeviceGetMemoryInfo(void *d, mem_t *m) { (void)d; m->total = 80ull << 30; m->free = 79ull << 30; m->used = 1ull << 30; return 0; }
API R nvmlDeviceGetUtilizationRates(void *d, util_t *u) { (void)d; u->gpu = 7; u->memory = 3; return 0; }
API R nvmlDeviceGetPciInfo_v3(void *d, pci_t *p) { (void)d; memset(p, 0, sizeof(*p)); snprintf(p->busId, sizeof(p->busId), "00000000:18:00.0"); return 0; }
API R nvmlDeviceGetPcieThroughput(void *d, int c, unsigned *v) { (void)d; *v = c ? 2000 : 1000; return 0; }
API R nvmlDeviceGetCurrPcieLinkGeneration(void *d, unsigned *v) { (void)d; *v = 5; return 0; }
API R nvmlDeviceGetCurrPcieLinkWidth(void *d, unsigned *v) { (void)d; *v = 16; return 0; }
API R nvmlDeviceGetMaxPcieLinkGeneration(void *d, unsigned *v) { (void)d; *v = 5; return 0; }
API R nvmlDeviceGetMaxPcieLinkWidth(void *d, unsigned *v) { (void)d; (void)v; return 3; /* NOT_SUPPORTED */ }
API R nvmlDeviceGetPersistenceMode(void *d, int *m) { (void)d; *m = 1; return 0; }
API R nvmlDeviceGetCurrentClocksThrottleReasons(void *d, unsigned long long *r) { (void)d; *r = 0x4; return 0; }
