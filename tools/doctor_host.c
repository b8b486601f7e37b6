/* Doctor checks of the host: locked memory, huge pages, free memory, io_uring, GPUDirect Storage. */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/json.h"
#include "gpu/shim.h"
#include "tools/sys.h"

#define OK FERRY_VERDICT_OK
#define WARN FERRY_VERDICT_WARN
#define FAIL FERRY_VERDICT_FAIL
#define UNKNOWN FERRY_VERDICT_UNKNOWN

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---------------------------------------------------------------------------------- memory */

/* "Max locked memory   8388608   8388608   bytes" from <proc>/self/limits. -1 means unlimited. */
static int limits_memlock(const char *path, long long *soft)
{
	char buf[4096];
	int n = ferry__sys_read(path, buf, sizeof(buf));
	if (n < 0)
		return n;
	const char *l = strstr(buf, "Max locked memory");
	if (!l)
		return -EINVAL;
	l += strlen("Max locked memory");
	while (*l == ' ' || *l == '\t')
		l++;
	if (!strncmp(l, "unlimited", 9)) {
		*soft = -1;
		return 0;
	}
	char *end;
	long long v = strtoll(l, &end, 10);
	if (end == l)
		return -EINVAL;
	*soft = v;
	return 0;
}

static void check_memlock(ferry_report *r)
{
	const char *expect = "unlimited (or >= 1 GiB)";
	const char *fix = "ulimit -l unlimited; persistently: '* - memlock unlimited' in /etc/security/limits.conf, "
			  "LimitMEMLOCK=infinity for systemd units, docker run --ulimit memlock=-1";
	long long soft;
	char src[PATH_MAX];
	if (ferry__sys_fixture_mode()) {
		ferry__sys_path(src, sizeof(src), FERRY__ROOT_PROC, "self/limits");
		int err = limits_memlock(src, &soft);
		if (err) {
			char why[PATH_MAX + 64];
			ferry__report_add(r, "mem.memlock", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), src, err),
					  expect, src, "");
			return;
		}
	} else {
		struct rlimit rl;
		snprintf(src, sizeof(src), "getrlimit(RLIMIT_MEMLOCK)");
		if (getrlimit(RLIMIT_MEMLOCK, &rl)) {
			ferry__report_addf(r, "mem.memlock", "host", UNKNOWN, expect, src, "", "getrlimit: %s", strerror(errno));
			return;
		}
		soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long long)rl.rlim_cur;
	}
	/* Locked memory bounds io_uring registered buffers (register=1 pins every bounce slot:
	 * threads x slots x chunk_size) and RDMA registrations; the common default of 8 MiB holds a
	 * handful of 1 MiB slots. CUDA's own pinned allocations are not charged to it. */
	if (soft < 0)
		ferry__report_add(r, "mem.memlock", "host", OK, "unlimited", expect, src, "");
	else
		ferry__report_addf(r, "mem.memlock", "host", soft >= (1LL << 30) ? OK : WARN, expect, src,
				   soft >= (1LL << 30) ? "" : fix, "%lld KiB%s", soft / 1024,
				   soft >= (1LL << 30) ? "" : ": too little to register ferry's bounce slots with io_uring");
}

static void check_thp(ferry_report *r)
{
	char src[PATH_MAX], buf[128], cur[32], why[PATH_MAX + 64];
	const char *expect = "always or madvise";
	ferry__sys_path(src, sizeof(src), FERRY__ROOT_SYS, "kernel/mm/transparent_hugepage/enabled");
	int n = ferry__sys_read(src, buf, sizeof(buf));
	if (n < 0 || ferry__sys_bracketed(buf, cur, sizeof(cur))) {
		ferry__report_add(r, "mem.thp", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), src, n < 0 ? n : -EINVAL),
				  expect, src, "");
		return;
	}
	int ok = !strcmp(cur, "always") || !strcmp(cur, "madvise");
	/* ferry madvises its large buffers (MADV_HUGEPAGE): 2 MiB pages pin and map faster and
	 * need 512x fewer TLB entries for a bounce ring. */
	ferry__report_addf(r, "mem.thp", "host", ok ? OK : WARN, expect, src,
			   ok ? "" : "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled",
			   ok ? "%s" : "%s: large buffers use 4 KiB pages", cur);
}

static long long meminfo_kb(const char *text, const char *key)
{
	const char *p = text;
	size_t k = strlen(key);
	while ((p = strstr(p, key))) {
		if ((p == text || p[-1] == '\n') && p[k] == ':')
			return atoll(p + k + 1);
		p += k;
	}
	return -1;
}

static void check_meminfo(ferry_report *r)
{
	char src[PATH_MAX], buf[8192], why[PATH_MAX + 64];
	ferry__sys_path(src, sizeof(src), FERRY__ROOT_PROC, "meminfo");
	int n = ferry__sys_read(src, buf, sizeof(buf));
	long long total = n < 0 ? -1 : meminfo_kb(buf, "MemTotal"), avail = n < 0 ? -1 : meminfo_kb(buf, "MemAvailable");
	long long fre = n < 0 ? -1 : meminfo_kb(buf, "MemFree"), cached = n < 0 ? -1 : meminfo_kb(buf, "Cached");
	const char *expect = "MemAvailable >= 10% of MemTotal";
	if (n < 0 || total <= 0 || avail < 0 || fre < 0 || cached < 0) {
		ferry__report_add(r, "mem.available", "host", UNKNOWN,
				  ferry__sys_reason(why, sizeof(why), src, n < 0 ? n : -EINVAL), expect, src, "");
		return;
	}
	int low = avail * 10 < total;
	/* Below a tenth, pinned bounce buffers and the page cache that serves repeated epochs
	 * evict each other. */
	ferry__report_addf(r, "mem.available", "host", low ? WARN : OK, expect, src,
			   low ? "lower host_budget, or stop what holds the memory" : "",
			   "%.1f GiB available of %.1f GiB (%.0f%%)%s", avail * 1024 / GIB, total * 1024 / GIB,
			   100.0 * (double)avail / (double)total, low ? ": little room for pinned buffers and page cache" : "");
	ferry__report_addf(r, "mem.pagecache", "host", OK, "information: data in the page cache is read from RAM",
			   src, "", "%.1f GiB free, %.1f GiB page cache (Cached)", fre * 1024 / GIB, cached * 1024 / GIB);
}

void ferry__doctor_memory(ferry_report *r)
{
	check_memlock(r);
	check_thp(r);
	check_meminfo(r);
}

/* --------------------------------------------------------------------------------- io_uring */

void ferry__doctor_io_uring(ferry_report *r)
{
	char src[PATH_MAX], why[PATH_MAX + 64];
	long long v;
	ferry__sys_path(src, sizeof(src), FERRY__ROOT_PROC, "sys/kernel/io_uring_disabled");
	int err = ferry__sys_read_ll(src, &v);
	const char *expect = "0 (io_uring enabled)";
	const char *fix = "sudo sysctl -w kernel.io_uring_disabled=0 (persist in /etc/sysctl.d/)";
	if (err == -ENOENT)
		ferry__report_add(r, "io_uring.sysctl", "host", OK, "absent: kernels before 6.6 have no switch", expect, src, "");
	else if (err)
		ferry__report_add(r, "io_uring.sysctl", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), src, err), expect,
				  src, "");
	else if (v == 0)
		ferry__report_add(r, "io_uring.sysctl", "host", OK, "0", expect, src, "");
	else
		ferry__report_addf(r, "io_uring.sysctl", "host", WARN, expect, src, fix,
				   v == 1 ? "1: only CAP_SYS_ADMIN or kernel.io_uring_group members may create rings"
					  : "%lld: io_uring disabled; ferry falls back to psync threads", v);

	const char *sexpect = "io_uring_setup succeeds";
	if (ferry__sys_fixture_mode()) {
		ferry__report_add(r, "io_uring.setup", "host", UNKNOWN,
				  "fixture mode: io_uring_setup is probed only on the live machine", sexpect, "", "");
		return;
	}
	/* The engine's own verdict first (it is what ferry will use), then a raw setup for the errno. */
	const char *lib = ferry_backend_unavailable_reason("io_uring");
	char libwhy[300];
	snprintf(libwhy, sizeof(libwhy), "%s", lib ? lib : "");
#ifdef __NR_io_uring_setup
	unsigned char params[120]; /* struct io_uring_params is 120 bytes; zeroed means no flags */
	memset(params, 0, sizeof(params));
	long fd = syscall(__NR_io_uring_setup, 4, params);
	if (fd >= 0 && !libwhy[0]) {
		close((int)fd);
		ferry__report_add(r, "io_uring.setup", "host", OK, "a 4-entry ring was created; ferry's io_uring backend is usable",
				  sexpect, "io_uring_setup(2), ferry_backend_unavailable_reason(\"io_uring\")", "");
	} else if (fd >= 0) {
		close((int)fd);
		ferry__report_addf(r, "io_uring.setup", "host", WARN, sexpect,
				   "ferry_backend_unavailable_reason(\"io_uring\")",
				   "build ferry with liburing (pkg-config liburing) to get the io_uring backend",
				   "the kernel accepts io_uring_setup but ferry's backend is unusable: %s", libwhy);
	} else {
		int e = errno;
		ferry__report_addf(r, "io_uring.setup", "host", WARN, sexpect, "io_uring_setup(2)",
				   e == EPERM ? "allow io_uring in the container's seccomp profile "
						"(docker: --security-opt seccomp=<profile with io_uring_*>) or the sysctl"
					  : "use a kernel >= 5.10 with CONFIG_IO_URING=y",
				   "%s%s; ferry falls back to psync threads (%s)", strerror(e),
				   e == EPERM ? " (seccomp or kernel.io_uring_disabled)"
				   : e == ENOSYS ? " (kernel without io_uring)" : "",
				   libwhy[0] ? libwhy : "the engine's probe passed regardless");
	}
#else
	ferry__report_add(r, "io_uring.setup", "host", UNKNOWN, "built without io_uring syscall numbers", sexpect, "", "");
#endif
}

/* ------------------------------------------------------------------------------------- GDS */

/* cufile.json's properties.<key> in text (comments stripped): 1/0, or -1 if missing, not a
 * boolean, or the file is not JSON. The parser decodes in place, so each lookup reads a copy. */
static int cufile_bool(const char *text, size_t n, const char *key)
{
	const char *const keys[] = {"properties", key, NULL};
	char *copy = malloc(n ? n : 1);
	int v = -1;
	if (copy) {
		memcpy(copy, text, n);
		if (ferry__json_find_bool(copy, n, keys, &v) != 1)
			v = -1;
	}
	free(copy);
	return v;
}

struct gds_state {
	int ngpus;
	int compat;       /* allow_compat_mode (cuFile's default: true) */
	int p2pdma;       /* use_pci_p2pdma (default: false) */
	int udev;         /* /run/udev present */
	int nvfs;         /* nvidia-fs loaded */
	int kernel_6_2;   /* kernel >= 6.2 (P2PDMA for GDS) */
	int have_lib;     /* 1 found, 0 not, -1 not probed */
	int shim;         /* ferry__cufile() loaded it (CUDA usable too) */
	char shimversion[32];
	char libpath[PATH_MAX];
	char libversion[64];
};

static void probe_lib(struct gds_state *g)
{
	g->have_lib = -1;
	if (ferry__sys_fixture_mode())
		return;
	/* The shim loads libcufile only where CUDA works; a plain dlopen still tells "installed". */
	const struct ferry__cufile_api *cf = ferry__cufile();
	g->shim = cf != NULL;
	if (cf && cf->version > 0)
		snprintf(g->shimversion, sizeof(g->shimversion), "%d.%d", cf->version / 1000, cf->version % 1000 / 10);
	void *h = dlopen("libcufile.so.0", RTLD_LAZY | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(g->libpath, sizeof(g->libpath), "%s", e ? e : "libcufile.so.0 not found");
		g->have_lib = 0;
		return;
	}
	g->have_lib = 1;
	Dl_info info;
	void *sym = dlsym(h, "cuFileDriverOpen");
	char real[PATH_MAX];
	if (sym && dladdr(sym, &info) && info.dli_fname && realpath(info.dli_fname, real)) {
		snprintf(g->libpath, sizeof(g->libpath), "%s", real);
		/* The real file is named libcufile.so.<major>.<minor>.<patch>. */
		const char *v = strstr(real, ".so.");
		snprintf(g->libversion, sizeof(g->libversion), "%s", v ? v + 4 : "unknown");
	} else {
		snprintf(g->libpath, sizeof(g->libpath), "libcufile.so.0");
		snprintf(g->libversion, sizeof(g->libversion), "unknown");
	}
	dlclose(h);
}

static void check_config(ferry_report *r, struct gds_state *g)
{
	char src[PATH_MAX], why[PATH_MAX + 64];
	const char *env = ferry__sys_fixture_mode() ? NULL : getenv("CUFILE_ENV_PATH_JSON");
	if (env && *env)
		snprintf(src, sizeof(src), "%s", env);
	else
		ferry__sys_path(src, sizeof(src), FERRY__ROOT_ETC, "cufile.json");
	g->compat = 1;
	g->p2pdma = 0;
	const char *expect = "allow_compat_mode true unless GDS is known to work";
	char *text = malloc(256 * 1024);
	int n = text ? ferry__sys_read(src, text, 256 * 1024) : -ENOMEM;
	if (n == -ENOENT) {
		ferry__report_add(r, "gds.config", "host", OK, "absent: cuFile's defaults (allow_compat_mode=true, "
				  "use_pci_p2pdma=false)", expect, src, "");
		free(text);
		return;
	}
	if (n < 0) {
		ferry__report_add(r, "gds.config", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), src, n), expect, src, "");
		free(text);
		return;
	}
	ferry__jsonc_strip(text, (size_t)n);
	int c = cufile_bool(text, (size_t)n, "allow_compat_mode"), p = cufile_bool(text, (size_t)n, "use_pci_p2pdma");
	free(text);
	g->compat = c != 0;
	g->p2pdma = p == 1;
	int gds_possible = g->udev && (g->nvfs || (g->p2pdma && g->kernel_6_2));
	int fail = g->ngpus > 0 && !g->compat && !gds_possible;
	ferry__report_addf(r, "gds.config", "host", fail ? FAIL : OK, expect, src,
			   fail ? "set \"allow_compat_mode\": true in cufile.json (or fix what stops GDS)" : "",
			   "allow_compat_mode=%s, use_pci_p2pdma=%s%s", c < 0 ? "true (default)" : c ? "true" : "false",
			   p < 0 ? "false (default)" : p ? "true" : "false",
			   fail ? ": GDS cannot run here and compatibility mode is off, so cuFile refuses every file" : "");
}

static int kernel_at_least(const char *release, int maj, int min)
{
	int a = 0, b = 0;
	if (sscanf(release, "%d.%d", &a, &b) < 2)
		return 0;
	return a > maj || (a == maj && b >= min);
}

void ferry__doctor_gds(ferry_report *r, int ngpus, const char *const *paths, size_t npaths)
{
	struct gds_state g = {.ngpus = ngpus};
	char src[PATH_MAX], buf[8192], release[128] = "";
	ferry__sys_read(ferry__sys_path(src, sizeof(src), FERRY__ROOT_PROC, "sys/kernel/osrelease"), release,
			sizeof(release));
	g.kernel_6_2 = kernel_at_least(release, 6, 2);
	const char *nogpu = "not needed: no NVIDIA GPU";

	/* libcufile */
	probe_lib(&g);
	const char *lexpect = "libcufile.so.0 loadable (GDS)";
	if (g.have_lib < 0)
		ferry__report_add(r, "gds.libcufile", "host", UNKNOWN, "fixture mode: libraries are probed only on the live machine",
				  lexpect, "dlopen(libcufile.so.0)", "");
	else if (g.have_lib)
		ferry__report_addf(r, "gds.libcufile", "host", OK, lexpect, "dlopen(libcufile.so.0), cuFileGetVersion", "",
				   "version %s (%s)%s%s", g.shimversion[0] ? g.shimversion : g.libversion, g.libpath,
				   g.shim ? "" : "; ferry cannot use it: ", g.shim ? "" : ferry__cufile_unavailable_reason());
	else
		ferry__report_addf(r, "gds.libcufile", "host", ngpus ? WARN : OK, lexpect, "dlopen(libcufile.so.0)",
				   ngpus ? "install NVIDIA GDS (the cuda toolkit's nvidia-gds package) if GDS is wanted" : "",
				   "not found (%s)%s", g.libpath, ngpus ? ": no GDS; ferry uses the bounce path" : "; not needed: no NVIDIA GPU");

	/* nvidia-fs */
	char stats[PATH_MAX], mods[PATH_MAX];
	ferry__sys_path(stats, sizeof(stats), FERRY__ROOT_PROC, "driver/nvidia-fs/stats");
	ferry__sys_path(mods, sizeof(mods), FERRY__ROOT_PROC, "modules");
	g.nvfs = ferry__sys_exists(stats) == 1;
	int modn = ferry__sys_read(mods, buf, sizeof(buf));
	if (!g.nvfs && modn > 0) {
		for (const char *p = buf; (p = strstr(p, "nvidia_fs ")); p++)
			if (p == buf || p[-1] == '\n') {
				g.nvfs = 1;
				break;
			}
	}

	/* /run/udev */
	char udev[PATH_MAX];
	ferry__sys_path(udev, sizeof(udev), FERRY__ROOT_RUN, "udev");
	int ue = ferry__sys_exists(udev);
	g.udev = ue == 1;

	check_config(r, &g);

	char src2[2 * PATH_MAX + 8];
	snprintf(src2, sizeof(src2), "%s, %s", stats, mods);
	const char *nexpect = "nvidia-fs loaded (or P2PDMA mode)";
	if (g.nvfs) {
		char ver[64] = "";
		ferry__sys_read(ferry__sys_path(src, sizeof(src), FERRY__ROOT_PROC, "driver/nvidia-fs/version"), ver,
				sizeof(ver));
		ferry__report_addf(r, "gds.nvidia_fs", "host", OK, nexpect, src2, "", "loaded%s%s", ver[0] ? ", version " : "", ver);
	} else if (g.p2pdma && g.kernel_6_2) {
		ferry__report_add(r, "gds.nvidia_fs", "host", OK, "not loaded; use_pci_p2pdma=true uses the kernel's P2PDMA",
				  nexpect, src2, "");
	} else if (!ngpus) {
		ferry__report_addf(r, "gds.nvidia_fs", "host", OK, nexpect, src2, "", "not loaded; %s", nogpu);
	} else if (modn < 0 && ferry__sys_exists(stats) < 0) {
		char why[PATH_MAX + 64];
		ferry__report_add(r, "gds.nvidia_fs", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), mods, modn), nexpect,
				  src2, "");
	} else {
		ferry__report_add(r, "gds.nvidia_fs", "host", WARN,
				  "not loaded: cuFile can only run in compatibility mode (no GPUDirect DMA)", nexpect, src2,
				  "sudo modprobe nvidia-fs (package nvidia-fs-dkms), or on kernels >= 6.2 set use_pci_p2pdma");
	}

	ferry__report_addf(r, "gds.p2pdma", "host", g.p2pdma && !g.kernel_6_2 ? WARN : OK,
			   "use_pci_p2pdma only on kernels >= 6.2 with the open GPU kernel modules", src,
			   g.p2pdma && !g.kernel_6_2 ? "set use_pci_p2pdma false, or use a kernel >= 6.2" : "",
			   "use_pci_p2pdma=%s, kernel %s", g.p2pdma ? "true" : "false", release[0] ? release : "unknown");

	const char *uexpect = "/run/udev present (cuFile reads the device's udev properties)";
	if (ue < 0) {
		char why[PATH_MAX + 64];
		ferry__report_add(r, "gds.udev", "host", UNKNOWN, ferry__sys_reason(why, sizeof(why), udev, ue), uexpect, udev, "");
	} else if (g.udev) {
		ferry__report_add(r, "gds.udev", "host", OK, "present", uexpect, udev, "");
	} else if (!ngpus) {
		ferry__report_addf(r, "gds.udev", "host", OK, uexpect, udev, "", "absent; %s", nogpu);
	} else {
		/* cuFile looks up ID_FS_TYPE/ID_FS_USAGE of the block device in the udev database;
		 * without it cuFileHandleRegister logs "udev property not found" and returns
		 * CU_FILE_INTERNAL_ERROR (5030) or, with allow_compat_mode, falls back to POSIX I/O. */
		ferry__report_addf(r, "gds.udev", "host", g.compat ? WARN : FAIL, uexpect, udev,
				   "in a container: docker run -v /run/udev:/run/udev:ro; on a VM or bare host: start systemd-udevd",
				   "absent: cuFileHandleRegister cannot read the device's udev properties and %s",
				   g.compat ? "falls back to compatibility mode (POSIX reads inside cuFile)"
					    : "fails with CU_FILE_INTERNAL_ERROR (5030) since allow_compat_mode is false");
	}

	/* The real thing: register a file under each path with cuFile (src/gpu/cufile.c). */
	const char *rexpect = "cuFileHandleRegister succeeds with nvidia-fs (true GDS) on a file under the path";
	for (size_t i = 0; i < npaths; i++) {
		const char *why = ferry__sys_fixture_mode() ? "fixture mode: not attempted"
				  : !ngpus ? "not attempted: no NVIDIA GPU"
				  : !g.shim ? ferry__cufile_unavailable_reason() : NULL;
		if (why) {
			ferry__report_add(r, "gds.register", paths[i], UNKNOWN, why[0] ? why : "cuFile unavailable", rexpect,
					  "cuFileHandleRegister", "");
			continue;
		}
		char file[PATH_MAX + 64], how[PATH_MAX + 256], res[700];
		int created;
		int fd = ferry__sys_probe_file(paths[i], file, sizeof(file), &created, how, sizeof(how));
		if (fd < 0) {
			ferry__report_addf(r, "gds.register", paths[i], UNKNOWN, rexpect, "cuFileHandleRegister", "",
					   "no file to register: %s", how);
			continue;
		}
		int kind = ferry__gds_probe_fd(fd, res, sizeof(res));
		close(fd);
		if (created)
			unlink(file);
		ferry__report_addf(r, "gds.register", paths[i],
				   kind == FERRY__GDS_NATIVE ? OK : kind == FERRY__GDS_COMPAT ? WARN : g.compat ? WARN : FAIL,
				   rexpect, "cuFileHandleRegister",
				   kind == FERRY__GDS_NATIVE ? "" : "see gds.udev, gds.nvidia_fs and fs.type above; cufile.log names the cause",
				   "%s (%s)", res, how);
	}
}
