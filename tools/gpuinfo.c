/*
 * GPUs and NVMe controllers on the PCI bus, from sysfs; their links and NUMA nodes.
 *
 * NVML facts (model, memory, persistence, throttling) come through the GPU shim (src/gpu/nvml.c);
 * without NVML they are reported unknown with the reason from ferry__sys_nvml_reason().
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/shim.h"
#include "tools/sys.h"

#define OK FERRY_VERDICT_OK
#define WARN FERRY_VERDICT_WARN
#define FAIL FERRY_VERDICT_FAIL
#define UNKNOWN FERRY_VERDICT_UNKNOWN

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct ferry__pcidev *)a)->bdf, ((const struct ferry__pcidev *)b)->bdf);
}

/* PCI devices whose class, masked, equals want; vendor 0 means any vendor. */
static int scan_pci(unsigned vendor, unsigned long class_mask, unsigned long class_want,
		    struct ferry__pcidev *out, int max)
{
	char dir[PATH_MAX], p[PATH_MAX];
	ferry__sys_path(dir, sizeof(dir), FERRY__ROOT_SYS, "bus/pci/devices");
	DIR *d = opendir(dir);
	if (!d)
		return ferry__error(-errno, "opendir(%s): %s", dir, strerror(errno));
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)) && n < max) {
		if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(out[0].bdf))
			continue;
		long long v, cls, node;
		if (ferry__sys_read_ll(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "bus/pci/devices/%s/class",
						       e->d_name), &cls))
			continue;
		if (((unsigned long)cls & class_mask) != class_want)
			continue;
		if (vendor && (ferry__sys_read_ll(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS,
								  "bus/pci/devices/%s/vendor", e->d_name), &v) ||
			       (unsigned)v != vendor))
			continue;
		struct ferry__pcidev *g = &out[n++];
		memset(g, 0, sizeof(*g));
		snprintf(g->bdf, sizeof(g->bdf), "%s", e->d_name);
		g->numa = -1;
		if (ferry__sys_read_ll(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "bus/pci/devices/%s/numa_node",
						       e->d_name), &node) == 0) {
			g->numa = (int)node;
			g->numa_known = 1;
		}
	}
	closedir(d);
	qsort(out, (size_t)n, sizeof(*out), cmp_name);
	return n;
}

int ferry__sys_gpus(struct ferry__pcidev *out, int max)
{
	/* Class 0x03xxxx: display controllers (0x0300 VGA on GeForce, 0x0302 3D on data-centre parts). */
	int n = scan_pci(0x10de, 0xff0000, 0x030000, out, max);
	/* nvidia-smi and NVML number GPUs in PCI bus order, as here (CUDA does too with
	 * CUDA_DEVICE_ORDER=PCI_BUS_ID). */
	for (int i = 0; i < n; i++)
		snprintf(out[i].name, sizeof(out[i].name), "GPU %d", i);
	return n;
}

int ferry__sys_nvme_ctrls(struct ferry__pcidev *out, int max)
{
	int n = scan_pci(0, 0xffffff, 0x010802, out, max);
	char dir[PATH_MAX];
	for (int i = 0; i < n; i++) {
		/* The controller's name (nvme0) is the one entry under <pci>/nvme/. */
		snprintf(out[i].name, sizeof(out[i].name), "nvme?");
		DIR *d = opendir(ferry__sys_path(dir, sizeof(dir), FERRY__ROOT_SYS, "bus/pci/devices/%s/nvme", out[i].bdf));
		struct dirent *e;
		while (d && (e = readdir(d)))
			if (e->d_name[0] != '.') {
				snprintf(out[i].name, sizeof(out[i].name), "%.60s", e->d_name);
				break;
			}
		if (d)
			closedir(d);
	}
	return n;
}

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static char nvml_reason[600];

static void nvml_probe(void)
{
	if (!ferry__nvml())
		snprintf(nvml_reason, sizeof(nvml_reason), "NVML not loaded: %s", ferry__nvml_unavailable_reason());
}

/* In fixture mode NVML would describe this machine, not the fixture: it is used only when
 * FERRY_NVML_LIBRARY names a library explicitly (a test's fake NVML). */
static int nvml_allowed(void)
{
	const char *lib = getenv("FERRY_NVML_LIBRARY");
	return !ferry__sys_fixture_mode() || (lib && *lib);
}

const char *ferry__sys_nvml_reason(void)
{
	if (!nvml_allowed())
		return "NVML not loaded: fixture mode (NVML describes the live machine)";
	pthread_once(&nvml_once, nvml_probe);
	return nvml_reason;
}

int ferry__sys_nvml_usable(void)
{
	return nvml_allowed() && ferry__sys_nvml_reason()[0] == '\0';
}

/* "0000:17:00.0" and NVML's "00000000:17:00.0" name the same device. */
static int same_bdf(const char *a, const char *b)
{
	unsigned d1, b1, s1, f1, d2, b2, s2, f2;
	return sscanf(a, "%x:%x:%x.%x", &d1, &b1, &s1, &f1) == 4 && sscanf(b, "%x:%x:%x.%x", &d2, &b2, &s2, &f2) == 4 &&
	       d1 == d2 && b1 == b2 && s1 == s2 && f1 == f2;
}

int ferry__sys_nvml_index(const char *bdf)
{
	const struct ferry__nvml_api *n = ferry__sys_nvml_usable() ? ferry__nvml() : NULL;
	for (unsigned i = 0; n && i < n->device_count; i++) {
		struct ferry__nvml_device_info info;
		if (ferry__nvml_device_info(i, &info) == 0 && same_bdf(info.bus_id, bdf))
			return (int)i;
	}
	return -1;
}

/* ------------------------------------------------------------------------------ PCIe links */

/* "16.0 GT/s PCIe" -> 16.0; "Unknown" -> -1. */
static double parse_speed(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	return end == s || v <= 0 ? -1 : v;
}

static int pcie_gen(double gts)
{
	static const double g[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
	for (int i = 0; i < 6; i++)
		if (gts < g[i] + 0.1)
			return i + 1;
	return 0;
}

static void check_link(ferry_report *r, const struct ferry__pcidev *d, int gpu)
{
	char subj[128], p[4][PATH_MAX], v[4][64];
	static const char *const files[4] = {"current_link_speed", "max_link_speed", "current_link_width",
					     "max_link_width"};
	snprintf(subj, sizeof(subj), "%s (%s)", d->name, d->bdf);
	int bad = -1;
	for (int i = 0; i < 4; i++) {
		ferry__sys_path(p[i], sizeof(p[i]), FERRY__ROOT_SYS, "bus/pci/devices/%s/%s", d->bdf, files[i]);
		int err = ferry__sys_read(p[i], v[i], sizeof(v[i]));
		if (err < 0 && bad < 0)
			bad = i;
		if (err < 0)
			snprintf(v[i], sizeof(v[i]), "%s", strerror(-err));
	}
	char why[PATH_MAX + 64];
	double cs = parse_speed(v[0]), ms = parse_speed(v[1]);
	if (bad == 0 || bad == 1 || cs < 0 || ms < 0) {
		int which = bad == 0 || bad == 1 ? bad : cs < 0 ? 0 : 1;
		snprintf(why, sizeof(why), "%s: %s (virtual or emulated devices have no PCIe link)", p[which], v[which]);
		ferry__report_add(r, "pcie.speed", subj, UNKNOWN, why, "current = max link speed", p[which], "");
	} else {
		char src[2 * PATH_MAX + 8];
		snprintf(src, sizeof(src), "%s, %s", p[0], p[1]);
		int verdict = cs + 0.01 >= ms ? OK : gpu ? WARN : cs * 2 <= ms + 0.01 ? FAIL : WARN;
		ferry__report_addf(r, "pcie.speed", subj, verdict, "current = max link speed", src,
				   verdict == OK ? ""
				   : gpu ? "recheck under load (nvidia-smi -q -d PCIE); if it stays low, reseat the card or check BIOS PCIe settings"
					 : "check the slot's generation and BIOS PCIe settings; reseat the drive",
				   "Gen%d (%.1f GT/s) of max Gen%d (%.1f GT/s)%s", pcie_gen(cs), cs, pcie_gen(ms), ms,
				   verdict == OK ? ""
				   : gpu ? ": GPUs lower their link speed when idle, so this may be power saving"
				   : verdict == FAIL ? ": half the bandwidth or less" : "");
	}
	long long cw = atoll(v[2]), mw = atoll(v[3]);
	if (bad == 2 || bad == 3 || cw <= 0 || mw <= 0) {
		int which = bad == 2 || bad == 3 ? bad : cw <= 0 ? 2 : 3;
		snprintf(why, sizeof(why), "%s: %s", p[which], v[which]);
		ferry__report_add(r, "pcie.width", subj, UNKNOWN, why, "current = max link width", p[which], "");
	} else {
		char src[2 * PATH_MAX + 8];
		snprintf(src, sizeof(src), "%s, %s", p[2], p[3]);
		int verdict = cw >= mw ? OK : cw * 2 <= mw ? FAIL : WARN;
		ferry__report_addf(r, "pcie.width", subj, verdict, "current = max link width", src,
				   verdict == OK ? "" : "move the card to a full-width slot, check riser/bifurcation settings in the BIOS, reseat it",
				   "x%lld of max x%lld%s", cw, mw, verdict == FAIL ? ": half the bandwidth or less" : "");
	}
}

void ferry__doctor_pcie(ferry_report *r, const struct ferry__pcidev *gpus, int ngpus,
			const struct ferry__pcidev *drives, int ndrives)
{
	struct ferry__pcidev nvme[FERRY__GPU_MAX];
	int nn = ferry__sys_nvme_ctrls(nvme, FERRY__GPU_MAX);
	for (int i = 0; i < nn; i++)
		check_link(r, &nvme[i], 0);
	for (int i = 0; i < ngpus; i++)
		check_link(r, &gpus[i], 1);

	/* Drives to compare with: those under the given paths, else every NVMe controller. */
	const struct ferry__pcidev *dv = ndrives ? drives : nvme;
	int nd = ndrives ? ndrives : (nn > 0 ? nn : 0);
	for (int i = 0; i < ngpus; i++) {
		char subj[128], src[PATH_MAX], val[1024];
		snprintf(subj, sizeof(subj), "%s (%s)", gpus[i].name, gpus[i].bdf);
		ferry__sys_path(src, sizeof(src), FERRY__ROOT_SYS, "bus/pci/devices/*/numa_node");
		const char *expect = "GPU and drives on the same NUMA node";
		if (!gpus[i].numa_known || gpus[i].numa < 0) {
			ferry__report_addf(r, "numa.affinity", subj, OK, expect, src, "",
					   "GPU NUMA node %s: one node, or the platform does not say",
					   gpus[i].numa_known ? "-1" : "unreadable");
			continue;
		}
		if (nd == 0) {
			ferry__report_addf(r, "numa.affinity", subj, OK, expect, src, "",
					   "GPU on node %d; no NVMe drive to compare with", gpus[i].numa);
			continue;
		}
		int far = 0;
		int used = snprintf(val, sizeof(val), "GPU on node %d;", gpus[i].numa);
		for (int j = 0; j < nd && used > 0 && (size_t)used < sizeof(val); j++) {
			int other = dv[j].numa_known && dv[j].numa >= 0 && dv[j].numa != gpus[i].numa;
			far |= other;
			used += snprintf(val + used, sizeof(val) - (size_t)used, " %s (%s) on node %d", dv[j].name,
					 dv[j].bdf, dv[j].numa);
		}
		char fix[256];
		snprintf(fix, sizeof(fix), "pin the job to the GPU's node (numactl --cpunodebind=%d --membind=%d) "
			 "and keep its data on a drive attached to that node", gpus[i].numa, gpus[i].numa);
		if (far && (size_t)used < sizeof(val))
			snprintf(val + used, sizeof(val) - (size_t)used,
				 ": storage-to-GPU traffic crosses the inter-socket link");
		ferry__report_add(r, "numa.affinity", subj, far ? WARN : OK, val, expect, src, far ? fix : "");
	}
}

/* nvmlClocksEventReason bits (nvml.h): idle, application clocks, sync boost and display clock
 * settings are benign; software power cap slows under load; hardware slowdown, thermal and
 * power-brake throttling cut clocks hard. */
#define NVML_BENIGN (0x1ull | 0x2ull | 0x10ull | 0x100ull)
#define NVML_SW_POWER 0x4ull
#define NVML_HARD (0x8ull | 0x20ull | 0x40ull | 0x80ull)

void ferry__doctor_gpus(ferry_report *r, const struct ferry__pcidev *gpus, int ngpus)
{
	static const struct {
		const char *id, *expected, *source;
	} facts[] = {
		{"gpu.model", "an NVIDIA GPU that NVML reports", "nvmlDeviceGetName"},
		{"gpu.memory", "reported", "nvmlDeviceGetMemoryInfo"},
		{"gpu.persistence", "persistence mode on (no driver re-initialisation per process)", "nvmlDeviceGetPersistenceMode"},
		{"gpu.throttle", "no clock throttle reasons other than idle or settings", "nvmlDeviceGetCurrentClocksEventReasons"},
	};
	for (int i = 0; i < ngpus; i++) {
		char subj[128], why[700];
		snprintf(subj, sizeof(subj), "%s (%s)", gpus[i].name, gpus[i].bdf);
		struct ferry__nvml_device_info info;
		int idx = ferry__sys_nvml_index(gpus[i].bdf);
		if (idx < 0 || ferry__nvml_device_info((unsigned)idx, &info)) {
			snprintf(why, sizeof(why), "%s", ferry__sys_nvml_usable()
				 ? "NVML lists no device at this PCI address (not bound by the NVIDIA driver?)" : ferry__sys_nvml_reason());
			for (size_t k = 0; k < sizeof(facts) / sizeof(facts[0]); k++)
				ferry__report_add(r, facts[k].id, subj, UNKNOWN, why, facts[k].expected, facts[k].source, "");
			continue;
		}
		const struct ferry__nvml_api *n = ferry__nvml();
		ferry__report_addf(r, "gpu.model", subj, OK, facts[0].expected, facts[0].source, "", "%s (driver %s)",
				   info.name[0] ? info.name : "unnamed", n ? n->driver_version : "?");
		if (info.mem_total >= 0)
			ferry__report_addf(r, "gpu.memory", subj, OK, facts[1].expected, facts[1].source, "",
					   "%.1f GiB total, %.1f GiB used", info.mem_total / (1024.0 * 1024 * 1024),
					   info.mem_used >= 0 ? info.mem_used / (1024.0 * 1024 * 1024) : 0.0);
		else
			ferry__report_add(r, "gpu.memory", subj, UNKNOWN, "NVML cannot tell", facts[1].expected, facts[1].source, "");
		if (info.persistence < 0)
			ferry__report_add(r, "gpu.persistence", subj, UNKNOWN, "NVML cannot tell (not supported)", facts[2].expected,
					  facts[2].source, "");
		else
			ferry__report_add(r, "gpu.persistence", subj, info.persistence ? OK : WARN,
					  info.persistence ? "on" : "off: each new process waits for the driver to initialise the GPU",
					  facts[2].expected, facts[2].source,
					  info.persistence ? "" : "sudo nvidia-smi -pm 1 (or enable nvidia-persistenced)");
		if (info.clocks_event_reasons < 0) {
			ferry__report_add(r, "gpu.throttle", subj, UNKNOWN, "NVML cannot tell (not supported)", facts[3].expected,
					  facts[3].source, "");
		} else {
			unsigned long long m = (unsigned long long)info.clocks_event_reasons;
			int v = m & NVML_HARD ? FAIL : m & NVML_SW_POWER ? WARN : OK;
			ferry__report_addf(r, "gpu.throttle", subj, v, facts[3].expected, facts[3].source,
					   v == OK ? "" : "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER; check cooling and power limits",
					   "reasons 0x%llx%s", m, v == FAIL ? ": hardware or thermal slowdown"
							       : v == WARN ? ": software power cap" : (m & ~NVML_BENIGN) ? "" : " (none that slow work)");
		}
	}
}
