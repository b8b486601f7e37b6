/* GPUDirect Storage: libcufile.so.0 loaded at run time, the driver state, and per-file probes. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/json.h"
#include "gpu/shim.h"

#define OFF(field) offsetof(struct ferry__cufile_api, field)

enum { G_VERSION = 1, G_PROPS, G_USECOUNT, G_STREAM, G_BATCH };

static const struct ferry__sym cufile_syms[] = {
	{ "cuFileDriverOpen", NULL, NULL, OFF(DriverOpen), 0 },
	/* cufile.h maps cuFileDriverClose to _v2 since cuFile 1.9; older libraries lack it. */
	{ "cuFileDriverClose_v2", "cuFileDriverClose", NULL, OFF(DriverClose), 0 },
	{ "cuFileHandleRegister", NULL, NULL, OFF(HandleRegister), 0 },
	{ "cuFileHandleDeregister", NULL, NULL, OFF(HandleDeregister), 0 },
	{ "cuFileBufRegister", NULL, NULL, OFF(BufRegister), 0 },
	{ "cuFileBufDeregister", NULL, NULL, OFF(BufDeregister), 0 },
	{ "cuFileRead", NULL, NULL, OFF(Read), 0 },
	{ "cuFileWrite", NULL, NULL, OFF(Write), 0 },
	{ "cuFileGetVersion", NULL, NULL, OFF(GetVersion), G_VERSION },
	{ "cuFileDriverGetProperties", NULL, NULL, OFF(DriverGetProperties), G_PROPS },
	{ "cuFileUseCount", NULL, NULL, OFF(UseCount), G_USECOUNT },
	{ "cuFileReadAsync", NULL, NULL, OFF(ReadAsync), G_STREAM },
	{ "cuFileWriteAsync", NULL, NULL, OFF(WriteAsync), G_STREAM },
	{ "cuFileStreamRegister", NULL, NULL, OFF(StreamRegister), G_STREAM },
	{ "cuFileStreamDeregister", NULL, NULL, OFF(StreamDeregister), G_STREAM },
	{ "cuFileBatchIOSetUp", NULL, NULL, OFF(BatchIOSetUp), G_BATCH },
	{ "cuFileBatchIOSubmit", NULL, NULL, OFF(BatchIOSubmit), G_BATCH },
	{ "cuFileBatchIOGetStatus", NULL, NULL, OFF(BatchIOGetStatus), G_BATCH },
	{ "cuFileBatchIOCancel", NULL, NULL, OFF(BatchIOCancel), G_BATCH },
	{ "cuFileBatchIODestroy", NULL, NULL, OFF(BatchIODestroy), G_BATCH },
};
#define NSYMS (sizeof(cufile_syms) / sizeof(cufile_syms[0]))

const struct ferry__sym *ferry__cufile_symbols(size_t *n)
{
	*n = NSYMS;
	return cufile_syms;
}

static struct ferry__cufile_api api;
static const struct ferry__cufile_api *loaded, *opened;
static char reason[640], driver_reason[640];
static pthread_once_t once = PTHREAD_ONCE_INIT, driver_once = PTHREAD_ONCE_INIT;

/* Names and texts from cufile.h (CUFILEOP_STATUS_ENTRIES); hints say what it means for ferry. */
static const struct {
	int code;
	const char *name;
	const char *text;
} cf_errors[] = {
	{ 0, "CU_FILE_SUCCESS", "cufile success" },
	{ 5001, "CU_FILE_DRIVER_NOT_INITIALIZED", "nvidia-fs driver is not loaded" },
	{ 5002, "CU_FILE_DRIVER_INVALID_PROPS", "invalid property" },
	{ 5003, "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "property range error" },
	{ 5004, "CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs driver version mismatch" },
	{ 5005, "CU_FILE_DRIVER_VERSION_READ_ERROR", "nvidia-fs driver version read error" },
	{ 5006, "CU_FILE_DRIVER_CLOSING", "driver shutdown in progress" },
	{ 5007, "CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage not supported on current platform" },
	{ 5008, "CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage not supported on current file" },
	{ 5009, "CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage not supported on current GPU" },
	{ 5010, "CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs driver ioctl error" },
	{ 5011, "CU_FILE_CUDA_DRIVER_ERROR", "CUDA Driver API error" },
	{ 5012, "CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer" },
	{ 5013, "CU_FILE_CUDA_MEMORY_TYPE_INVALID", "invalid pointer memory type" },
	{ 5014, "CU_FILE_CUDA_POINTER_RANGE_ERROR", "pointer range exceeds allocated address range" },
	{ 5015, "CU_FILE_CUDA_CONTEXT_MISMATCH", "cuda context mismatch" },
	{ 5016, "CU_FILE_INVALID_MAPPING_SIZE", "access beyond maximum pinned size" },
	{ 5017, "CU_FILE_INVALID_MAPPING_RANGE", "access beyond mapped size" },
	{ 5018, "CU_FILE_INVALID_FILE_TYPE", "unsupported file type" },
	{ 5019, "CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags" },
	{ 5020, "CU_FILE_DIO_NOT_SET", "fd direct IO not set" },
	{ 5022, "CU_FILE_INVALID_VALUE", "invalid arguments" },
	{ 5023, "CU_FILE_MEMORY_ALREADY_REGISTERED", "device pointer already registered" },
	{ 5024, "CU_FILE_MEMORY_NOT_REGISTERED", "device pointer lookup failure" },
	{ 5025, "CU_FILE_PERMISSION_DENIED", "driver or file access error" },
	{ 5026, "CU_FILE_DRIVER_ALREADY_OPEN", "driver is already open" },
	{ 5027, "CU_FILE_HANDLE_NOT_REGISTERED", "file descriptor is not registered" },
	{ 5028, "CU_FILE_HANDLE_ALREADY_REGISTERED", "file descriptor is already registered" },
	{ 5029, "CU_FILE_DEVICE_NOT_FOUND", "GPU device not found" },
	{ 5030, "CU_FILE_INTERNAL_ERROR", "internal error" },
	{ 5031, "CU_FILE_GETNEWFD_FAILED", "failed to obtain new file descriptor" },
	{ 5033, "CU_FILE_NVFS_SETUP_ERROR", "NVFS driver initialization error" },
	{ 5034, "CU_FILE_IO_DISABLED", "GPUDirect Storage disabled by config on current file" },
	{ 5035, "CU_FILE_BATCH_SUBMIT_FAILED", "failed to submit batch operation" },
	{ 5036, "CU_FILE_GPU_MEMORY_PINNING_FAILED", "failed to allocate pinned GPU Memory" },
	{ 5037, "CU_FILE_BATCH_FULL", "queue full for batch operation" },
	{ 5038, "CU_FILE_ASYNC_NOT_SUPPORTED", "cuFile stream operation not supported" },
	{ 5039, "CU_FILE_INTERNAL_BATCH_SETUP_ERROR", "batch setup internal error - retry later" },
	{ 5040, "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", "batch submit internal error - retry later" },
	{ 5041, "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR", "batch get status internal error - retry later" },
	{ 5042, "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", "batch cancel internal error - retry later" },
	{ 5043, "CU_FILE_NOMEM_ERROR", "cufile no memory error - retry later" },
	{ 5044, "CU_FILE_IO_ERROR", "cufile io error" },
	{ 5045, "CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "cufile buf registration error" },
	{ 5046, "CU_FILE_HASH_OPR_ERROR", "cufile hash operation error" },
	{ 5047, "CU_FILE_INVALID_CONTEXT_ERROR", "cufile invalid context error" },
	{ 5048, "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", "nvfs internal driver error" },
	{ 5049, "CU_FILE_BATCH_NOCOMPAT_ERROR", "compat mode off error" },
	{ 5050, "CU_FILE_IO_MAX_ERROR", "GPUDirect Storage Max Error" },
};
#define NERRORS (sizeof(cf_errors) / sizeof(cf_errors[0]))

static int find_error(int code)
{
	code = abs(code);
	for (size_t i = 0; i < NERRORS; i++)
		if (cf_errors[i].code == code)
			return (int)i;
	return -1;
}

const char *ferry__cufile_err_name(int err)
{
	static __thread char unknown[32];
	int i = find_error(err);

	if (i >= 0)
		return cf_errors[i].name;
	snprintf(unknown, sizeof(unknown), "CU_FILE_%d", abs(err));
	return unknown;
}

static int have_udev(void)
{
	return access("/run/udev", F_OK) == 0;
}

static int have_nvidia_fs(void)
{
	return access("/proc/driver/nvidia-fs/version", F_OK) == 0;
}

/* cufile.json's properties.use_pci_p2pdma (DMA without nvidia-fs on kernels >= 6.2). A file that
 * cannot be read or parsed counts as cuFile's default, false. */
static int p2pdma_enabled(void)
{
	static const char *const keys[] = {"properties", "use_pci_p2pdma", NULL};
	const char *path = getenv("CUFILE_ENV_PATH_JSON");
	size_t cap = 256 * 1024, n;
	char *buf = malloc(cap);
	FILE *f = buf ? fopen(path && *path ? path : "/etc/cufile.json", "r") : NULL;
	int on = 0;

	if (f) {
		n = fread(buf, 1, cap, f);
		fclose(f);
		ferry__jsonc_strip(buf, n);
		if (ferry__json_find_bool(buf, n, keys, &on) != 1)
			on = 0;
	}
	free(buf);
	return on;
}

/* Asked once per process: path=auto asks for every request into device memory, and reading and
 * parsing cufile.json each time cost about 50 us of the caller's time per request (4 KiB reads into
 * GPU memory ran at 17k IOPS against 258k into pinned memory, FERRY_ENGINE_TRACE, H100). */
static pthread_once_t native_once = PTHREAD_ONCE_INIT;
static int native_possible;
static char native_why[320];

int ferry__gds_native_probe(char *why, size_t len)
{
	if (have_nvidia_fs() || p2pdma_enabled())
		return 1;
	if (why && len)
		snprintf(why, len, "nvidia-fs is not loaded and cufile.json does not enable use_pci_p2pdma: "
				   "cuFile could only run in compatibility mode (POSIX reads inside cuFile)%s; ferry "
				   "uses its pipelined bounce path",
			 have_udev() ? "" : ", and /run/udev is absent, so it would refuse files (5027)");
	return 0;
}

static void native_once_probe(void)
{
	native_possible = ferry__gds_native_probe(native_why, sizeof(native_why));
}

int ferry__gds_native_possible(char *why, size_t len)
{
	pthread_once(&native_once, native_once_probe);
	if (!native_possible && why && len)
		snprintf(why, len, "%s", native_why);
	return native_possible;
}

static const char *hint(int code)
{
	switch (abs(code)) {
	case 5001:
		return "the nvidia-fs kernel module is not loaded and cuFile's compatibility mode is off "
		       "(allow_compat_mode in /etc/cufile.json); ferry uses its pipelined bounce path";
	case 5007:
	case 5009:
		return "ferry uses its pipelined bounce path";
	case 5008:
		return "this file system is not one GDS supports (ext4 or xfs on local NVMe, NFS over "
		       "RDMA, Lustre, GPFS, WekaFS, BeeGFS, ...); ferry uses its pipelined bounce path";
	case 5018:
		return "GDS takes regular files and block devices only";
	case 5019:
	case 5020:
		return "the file must be opened with O_DIRECT";
	case 5027:
		if (!have_udev())
			return "cuFile could not read the volume's attributes; on VMs and containers "
			       "without a udev database (/run/udev absent, as here) GDS cannot work; ferry "
			       "uses its pipelined bounce path";
		return "cuFile could not read the volume's attributes or does not support the file "
		       "system (its log says which: CUFILE_LOGGING_LEVEL=INFO "
		       "CUFILE_LOGFILE_PATH=/tmp/cufile.log); ferry uses its pipelined bounce path";
	case 5034:
		return "GDS is disabled for this file by /etc/cufile.json (or CUFILE_ENV_PATH_JSON)";
	case 5049:
		return "the batch API needs allow_compat_mode true in /etc/cufile.json when nvidia-fs is "
		       "not loaded";
	default:
		return NULL;
	}
}

const char *ferry__cufile_explain(ferry__CUfileError_t e, char *buf, size_t len)
{
	int i = find_error(e.err);
	const char *h = hint(e.err);
	char cuda[160] = "";

	if (abs(e.err) == FERRY__CU_FILE_CUDA_DRIVER_ERROR)
		snprintf(cuda, sizeof(cuda), " (%s, %d)", ferry__cuda_err_name(e.cu_err), (int)e.cu_err);
	snprintf(buf, len, "%s (%d): %s%s%s%s", ferry__cufile_err_name(e.err), abs(e.err),
		 i >= 0 ? cf_errors[i].text : "unknown cuFile error", cuda, h ? "; " : "", h ? h : "");
	return buf;
}

static void load(void)
{
	unsigned gmiss = 0;
	void *h;

	if (!ferry__cuda()) {
		snprintf(reason, sizeof(reason), "GPUDirect Storage needs CUDA, which is unavailable: %s",
			 ferry__cuda_unavailable_reason());
		return;
	}
	h = ferry__dl_open("libcufile.so.0", "FERRY_CUFILE_LIBRARY",
			   "GPUDirect Storage is not installed (libcufile from the CUDA toolkit or the "
			   "nvidia-cufile package)", reason, sizeof(reason));
	if (!h)
		return;
	if (ferry__dl_resolve(h, "libcufile.so.0", &api, cufile_syms, NSYMS, NULL, NULL, &gmiss, reason,
			      sizeof(reason)) < 0)
		return;
	if (!(gmiss & (1u << (G_STREAM - 1))))
		api.has |= FERRY__CUFILE_HAS_STREAM;
	if (!(gmiss & (1u << (G_BATCH - 1))))
		api.has |= FERRY__CUFILE_HAS_BATCH;
	if (api.GetVersion) {
		int v = 0;
		if (api.GetVersion(&v).err == FERRY__CU_FILE_SUCCESS)
			api.version = v;
	}
	reason[0] = '\0';
	loaded = &api;
	FERRY__LOG(FERRY__LOG_INFO, "libcufile.so.0: version %d, stream API %s, batch API %s",
		   api.version, api.has & FERRY__CUFILE_HAS_STREAM ? "yes" : "no",
		   api.has & FERRY__CUFILE_HAS_BATCH ? "yes" : "no");
}

const struct ferry__cufile_api *ferry__cufile(void)
{
	pthread_once(&once, load);
	return loaded;
}

const char *ferry__cufile_unavailable_reason(void)
{
	pthread_once(&once, load);
	return reason;
}

static void driver_open(void)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	ferry__CUcontext prev = NULL;
	ferry__CUfileError_t r;
	char detail[480];

	if (!cf) {
		snprintf(driver_reason, sizeof(driver_reason), "%s", reason);
		return;
	}
	/* cuFile binds to the context current at open; keep the caller's own current afterwards. */
	if (ferry__cuda_enter_device(0, &prev) != 0) {
		snprintf(driver_reason, sizeof(driver_reason), "cuFileDriverOpen not tried: %s",
			 ferry_last_error());
		return;
	}
	r = cf->DriverOpen();
	ferry__cuda_leave_device(prev);
	if (r.err != FERRY__CU_FILE_SUCCESS && abs(r.err) != FERRY__CU_FILE_DRIVER_ALREADY_OPEN) {
		snprintf(driver_reason, sizeof(driver_reason), "cuFileDriverOpen: %s",
			 ferry__cufile_explain(r, detail, sizeof(detail)));
		return;
	}
	opened = cf;
}

const struct ferry__cufile_api *ferry__cufile_driver(char *why, size_t len)
{
	pthread_once(&driver_once, driver_open);
	if (!opened) {
		if (why && len)
			snprintf(why, len, "%s", driver_reason);
		ferry__error(FERRY_ENOGDS, "%s", driver_reason);
	}
	return opened;
}

int ferry__gds_handle_register(int fd, ferry__CUfileHandle_t *out, int *cufile_err, char *why, size_t len)
{
	const struct ferry__cufile_api *cf;
	ferry__CUfileDescr_t descr;
	ferry__CUfileHandle_t fh = NULL;
	ferry__CUfileError_t r;
	char detail[480];

	if (cufile_err)
		*cufile_err = 0;
	cf = ferry__cufile_driver(why, len);
	if (!cf)
		return FERRY_ENOGDS;
	memset(&descr, 0, sizeof(descr));
	descr.type = FERRY__CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	descr.handle.fd = fd;
	descr.fs_ops = NULL;
	r = cf->HandleRegister(&fh, &descr);
	if (r.err != FERRY__CU_FILE_SUCCESS) {
		if (cufile_err)
			*cufile_err = abs(r.err);
		ferry__cufile_explain(r, detail, sizeof(detail));
		if (why && len)
			snprintf(why, len, "cuFileHandleRegister: %s", detail);
		return ferry__error(FERRY_ENOGDS, "cuFileHandleRegister(fd %d): %s", fd, detail);
	}
	*out = fh;
	return 0;
}

void ferry__gds_handle_deregister(ferry__CUfileHandle_t fh)
{
	if (fh && opened)
		opened->HandleDeregister(fh);
}

int ferry__gds_probe_fd(int fd, char *why, size_t len)
{
	ferry__CUfileHandle_t fh = NULL;
	char buf[640];

	if (!why || !len) {
		why = buf;
		len = sizeof(buf);
	}
	if (ferry__gds_handle_register(fd, &fh, NULL, why, len) != 0)
		return FERRY__GDS_REFUSED;
	ferry__gds_handle_deregister(fh);
	if (have_nvidia_fs()) {
		snprintf(why, len, "cuFile registered the file and nvidia-fs is loaded: GPUDirect Storage");
		return FERRY__GDS_NATIVE;
	}
	snprintf(why, len, "cuFile registered the file in compatibility mode: nvidia-fs is not "
		 "loaded, so cuFile reads through host memory itself (no direct DMA)");
	return FERRY__GDS_COMPAT;
}
