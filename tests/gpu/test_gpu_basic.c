/*
 * The shims on a real GPU: loading, device memory, copies (sync and the asynchronous calls the
 * pipelined path uses), memory kinds of host/pinned/device pointers, the pinned pool, NVML, and the
 * GDS probe of a file on the root file system and on /dev/shm (where GDS may well be refused: the
 * test asserts that ferry gives the reason, not that GDS works).
 *
 * Lines "FIGURE name value unit" are picked up by scripts/gpu-check.sh for its table.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <time.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "ferry_test.h"
#include "gpu/ring.h"
#include "gpu/shim.h"

#define MiB (1024u * 1024u)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_resolution(const struct ferry__cuda_api *cu)
{
	size_t n, same = 0, total = 0;
	const struct ferry__sym *syms = ferry__cuda_symbols(&n);
	void *h = dlopen(getenv("FERRY_CUDA_LIBRARY") ? getenv("FERRY_CUDA_LIBRARY") : "libcuda.so.1",
			 RTLD_NOW | RTLD_NOLOAD);

	T_ASSERT(h != NULL);
	for (size_t i = 0; i < n; i++) {
		void *ours, *exported = dlsym(h, syms[i].name);
		memcpy(&ours, (const char *)cu + syms[i].offset, sizeof(ours));
		if (syms[i].group == 0)
			T_CHECK(ours != NULL);
		if (!ours || !exported)
			continue;
		total++;
		same += ours == exported;
	}
	/* cuGetProcAddress may hand out other entry points than the exports (tools hook there). */
	printf("resolved with %s: %zu of %zu pointers equal the exported symbols\n", cu->resolver, same, total);
	if (strcmp(cu->resolver, "dlsym") == 0)
		T_EQ_INT(same, total);
	dlclose(h);
}

static void copies(void)
{
	size_t len = 64 * MiB + 4097;
	unsigned char *a = malloc(len), *b = malloc(len);
	void *d = NULL, *d2 = NULL;
	int dev = -5;

	T_ASSERT(a && b);
	t_fill_pattern(a, len, 0, 7);
	T_EQ_INT(ferry_gpu_malloc(0, len, &d), 0);
	T_EQ_INT(ferry_gpu_malloc(0, len, &d2), 0);
	T_EQ_INT(ferry_mem_kind(d, &dev), FERRY_MEM_DEVICE);
	T_EQ_INT(dev, 0);
	T_EQ_INT(ferry_mem_kind((char *)d + len - 1, &dev), FERRY_MEM_DEVICE);
	T_EQ_INT(ferry_mem_kind(a, &dev), FERRY_MEM_HOST);
	T_EQ_INT(dev, -1);
	T_EQ_INT(ferry_gpu_memcpy_htod(d, a, len), 0);
	memset(b, 0, len);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(b, d, len), 0);
	T_CHECK(memcmp(a, b, len) == 0);
	/* unaligned and tiny */
	T_EQ_INT(ferry_gpu_memcpy_htod((char *)d + 3, a + 1, 1), 0);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(b + 5, (char *)d + 3, 1), 0);
	T_EQ_INT(b[5], a[1]);
	/* device-to-device and memset through the raw table */
	const struct ferry__cuda_api *cu = ferry__cuda();
	T_EQ_INT(cu->MemcpyDtoD((ferry__CUdeviceptr)(uintptr_t)d2, (ferry__CUdeviceptr)(uintptr_t)d, len), 0);
	T_EQ_INT(cu->MemsetD8((ferry__CUdeviceptr)(uintptr_t)d2 + 100, 0xab, 10), 0);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(b, d2, 200), 0);
	T_EQ_INT(b[99], a[99]);
	T_EQ_INT(b[100], 0xab);
	T_EQ_INT(b[109], 0xab);
	T_EQ_INT(b[110], a[110]);
	T_EQ_INT(ferry_gpu_memcpy_htod(a, b, 16), -EINVAL);
	T_EQ_INT(ferry_gpu_free(d), 0);
	T_EQ_INT(ferry_gpu_free(d2), 0);
	T_EQ_INT(ferry_mem_kind(d, NULL), FERRY_MEM_HOST);
	free(a);
	free(b);
}

static void host_done(void *arg)
{
	__atomic_store_n((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* The calls of the pipelined bounce path: pinned slot -> async copy on a stream -> event. */
static void async_path(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	struct ferry__pinned_pool *pool;
	size_t len = 256 * MiB;
	unsigned char *slot = NULL, *check = malloc(len);
	ferry__CUstream st = NULL;
	ferry__CUevent ev = NULL;
	ferry__CUdeviceptr d = 0;
	void *dp = NULL;
	int pinned = 0, dev = -1, flag = 0, reps = 8;

	T_ASSERT(check != NULL);
	T_ASSERT(ferry__pinned_pool_create(2 * len, 0, &pool) == 0);
	T_EQ_INT(ferry__pinned_alloc(pool, len, (void **)&slot, &pinned), 0);
	T_EQ_INT(pinned, 1);
	if (!pinned)
		printf("unpinned: %s\n", ferry__pinned_unpinned_reason(pool));
	T_EQ_INT(ferry_mem_kind(slot, &dev), FERRY_MEM_PINNED);
	T_EQ_INT(ferry_mem_kind(slot + len - 1, NULL), FERRY_MEM_PINNED);
	t_fill_pattern(slot, len, 0, 99);
	T_EQ_INT(ferry_gpu_malloc(0, len, &dp), 0);
	d = (ferry__CUdeviceptr)(uintptr_t)dp;
	T_EQ_INT(ferry__cuda_set_device(0), 0);
	T_EQ_INT(cu->StreamCreate(&st, FERRY__CU_STREAM_NON_BLOCKING), 0);
	T_EQ_INT(cu->EventCreate(&ev, FERRY__CU_EVENT_DISABLE_TIMING), 0);
	double t0 = now();
	for (int i = 0; i < reps; i++)
		T_EQ_INT(cu->MemcpyHtoDAsync(d, slot, len, st), 0);
	T_EQ_INT(cu->EventRecord(ev, st), 0);
	T_EQ_INT(cu->LaunchHostFunc(st, host_done, &flag), 0);
	T_EQ_INT(cu->EventSynchronize(ev), 0);
	double t1 = now();
	T_EQ_INT(cu->EventQuery(ev), FERRY__CUDA_SUCCESS);
	T_EQ_INT(cu->StreamSynchronize(st), 0);
	T_EQ_INT(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 1);
	T_EQ_INT(cu->StreamQuery(st), FERRY__CUDA_SUCCESS);
	printf("FIGURE pinned_h2d %.1f GB/s\n", reps * (double)len / (t1 - t0) / 1e9);
	memset(check, 0, len);
	t0 = now();
	for (int i = 0; i < reps; i++)
		T_EQ_INT(cu->MemcpyDtoHAsync(slot, d, len, st), 0);
	T_EQ_INT(cu->StreamSynchronize(st), 0);
	t1 = now();
	printf("FIGURE pinned_d2h %.1f GB/s\n", reps * (double)len / (t1 - t0) / 1e9);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(check, dp, len), 0);
	T_CHECK(memcmp(check, slot, len) == 0);
	T_EQ_INT(cu->StreamWaitEvent(st, ev, 0), 0);
	T_EQ_INT(cu->EventDestroy(ev), 0);
	T_EQ_INT(cu->StreamDestroy(st), 0);
	T_EQ_INT(ferry_gpu_free(dp), 0);
	ferry__pinned_free(pool, slot);
	ferry__pinned_pool_destroy(pool);
	/* after destroy the range is no longer registered */
	void *p = NULL;
	T_EQ_INT(cu->MemHostAlloc(&p, 4096, FERRY__CU_MEMHOSTALLOC_PORTABLE), 0);
	T_EQ_INT(ferry_mem_kind(p, NULL), FERRY_MEM_PINNED);
	T_EQ_INT(cu->MemFreeHost(p), 0);
	free(check);
}

static void nvml(void)
{
	struct ferry__nvml_device_info info;

	if (!ferry__nvml()) {
		printf("NVML unavailable: %s\n", ferry__nvml_unavailable_reason());
		T_CHECK(ferry__nvml_unavailable_reason()[0] != '\0');
		return;
	}
	T_EQ_INT(ferry__nvml_device_info(0, &info), 0);
	printf("NVML: driver %s, %s, %s, PCIe gen %d x%d (max gen %d x%d), %lld MiB, persistence %d, "
	       "NUMA %d, clocks event reasons %#llx\n",
	       ferry__nvml()->driver_version, info.name, info.bus_id, info.pcie_gen, info.pcie_width,
	       info.pcie_gen_max, info.pcie_width_max, (long long)(info.mem_total >> 20), info.persistence,
	       info.numa_node, (long long)info.clocks_event_reasons);
	T_CHECK(info.name[0] != '\0');
	T_CHECK(info.mem_total > 0);
	T_CHECK(info.bus_id[0] != '\0');
}

/* GDS on one directory: ferry must say what happens and why. */
static void gds_on(const char *dirpath)
{
	char path[4096], why[1024];
	size_t len = 4 * MiB;
	unsigned char *buf = NULL;
	int fd, st, st2;

	snprintf(path, sizeof(path), "%s/ferry_gds_probe.%d", dirpath, (int)getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		printf("GDS %s: cannot create a file there: %s\n", dirpath, strerror(errno));
		return;
	}
	T_ASSERT(posix_memalign((void **)&buf, 4096, len) == 0);
	t_fill_pattern(buf, len, 0, 5);
	T_EQ_INT(pwrite(fd, buf, len, 0), (ssize_t)len);
	fsync(fd);
	close(fd);

	st = ferry_gds_status(path, why, sizeof(why));
	printf("GDS %s: %s: %s\n", dirpath,
	       st == FERRY_GDS_NATIVE ? "native" : st == FERRY_GDS_COMPAT ? "compat" : st == 0 ? "refused" : "error",
	       why);
	printf("FIGURE gds_%s %s\n", strcmp(dirpath, "/dev/shm") == 0 ? "shm" : "disk",
	       st == FERRY_GDS_NATIVE ? "native" : st == FERRY_GDS_COMPAT ? "compat" : "refused");
	T_CHECK(st >= 0);
	T_CHECK(why[0] != '\0');
	if (st == FERRY_GDS_REFUSED)
		T_CHECK(strstr(why, "CU_FILE_") || strstr(why, "libcufile") || strstr(why, "O_DIRECT"));

	fd = open(path, O_RDONLY | O_DIRECT);
	if (fd >= 0) {
		st2 = ferry__gds_probe_fd(fd, why, sizeof(why));
		T_EQ_INT(st2, st);
		if (st2 != FERRY__GDS_REFUSED) {
			/* it registers: read through cuFile into device memory and compare */
			const struct ferry__cufile_api *cf = ferry__cufile_driver(NULL, 0);
			ferry__CUfileHandle_t fh = NULL;
			void *d = NULL;
			unsigned char *back = malloc(len);
			T_ASSERT(cf && back);
			T_EQ_INT(ferry__gds_handle_register(fd, &fh, NULL, why, sizeof(why)), 0);
			T_EQ_INT(ferry_gpu_malloc(0, len, &d), 0);
			T_EQ_INT(cf->BufRegister(d, len, 0).err, 0);
			T_EQ_INT(cf->Read(fh, d, len, 0, 0), (ssize_t)len);
			T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, len), 0);
			T_CHECK(memcmp(back, buf, len) == 0);
			T_EQ_INT(cf->BufDeregister(d).err, 0);
			ferry__gds_handle_deregister(fh);
			T_EQ_INT(ferry_gpu_free(d), 0);
			free(back);
		}
		close(fd);
	}
	unlink(path);
	free(buf);
}

int main(void)
{
	char why[1024], name[128];
	const struct ferry__cuda_api *cu;
	const struct ferry__cufile_api *cf;

	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no usable GPU: %s", why);
	cu = ferry__cuda();
	T_ASSERT(ferry_gpu_name(0, name, sizeof(name)) > 0);
	printf("CUDA driver %d.%d, %d device(s), device 0: %s\n", cu->driver_version / 1000,
	       cu->driver_version % 1000 / 10, ferry_gpu_count(), name);
	check_resolution(cu);
	copies();
	async_path();
	nvml();

	cf = ferry__cufile();
	if (cf)
		printf("libcufile: version %d, stream API %s, batch API %s, driver: %s\n", cf->version,
		       cf->has & FERRY__CUFILE_HAS_STREAM ? "yes" : "no",
		       cf->has & FERRY__CUFILE_HAS_BATCH ? "yes" : "no",
		       ferry__cufile_driver(why, sizeof(why)) ? "opened" : why);
	else
		printf("libcufile unavailable: %s\n", ferry__cufile_unavailable_reason());
	printf("/run/udev %s, nvidia-fs %s\n", access("/run/udev", F_OK) == 0 ? "present" : "absent",
	       access("/proc/driver/nvidia-fs/version", F_OK) == 0 ? "loaded" : "not loaded");
	gds_on(getenv("FERRY_GDS_DIR") ? getenv("FERRY_GDS_DIR") : "/var/tmp");
	gds_on("/dev/shm");
	return t_result();
}
