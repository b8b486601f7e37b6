/* ferry_doctor_run: the checks, in the order the report shows them. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

#include "tools/sys.h"

int ferry_doctor_run(const char *const *paths, size_t n, ferry_report **out)
{
	if (!out || (n && !paths))
		return ferry__error(-EINVAL, "ferry_doctor_run: NULL argument");
	*out = NULL;
	ferry_report *r = ferry__report_new();
	if (!r)
		return ferry__error(-ENOMEM, "ferry_doctor_run: out of memory");

	char p[PATH_MAX], host[256] = "", kernel[128] = "";
	int fixture = ferry__sys_fixture_mode();
	ferry__sys_read(ferry__sys_path(p, sizeof(p), FERRY__ROOT_PROC, "sys/kernel/hostname"), host, sizeof(host));
	ferry__sys_read(ferry__sys_path(p, sizeof(p), FERRY__ROOT_PROC, "sys/kernel/osrelease"), kernel, sizeof(kernel));
	struct utsname u;
	if (!fixture && (!host[0] || !kernel[0]) && uname(&u) == 0) {
		if (!host[0])
			snprintf(host, sizeof(host), "%s", u.nodename);
		if (!kernel[0])
			snprintf(kernel, sizeof(kernel), "%s", u.release);
	}
	ferry__report_set_host(r, host, kernel, fixture);

	struct ferry__pcidev gpus[FERRY__GPU_MAX], drives[FERRY__BLK_MAX];
	int ngpus = ferry__sys_gpus(gpus, FERRY__GPU_MAX), ndrives = 0;
	ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "bus/pci/devices");
	if (ngpus < 0) {
		ferry__report_add(r, "gpu.present", "host", FERRY_VERDICT_UNKNOWN, ferry_last_error(),
				  "NVIDIA GPUs listed on the PCI bus", p, "");
		ngpus = 0;
	} else if (ngpus == 0) {
		ferry__report_add(r, "gpu.present", "host", FERRY_VERDICT_OK,
				  "no NVIDIA GPU on the PCI bus (vendor 0x10de, class 0x03)",
				  "NVIDIA GPUs listed on the PCI bus", p, "");
	} else {
		ferry__report_addf(r, "gpu.present", "host", FERRY_VERDICT_OK, "NVIDIA GPUs listed on the PCI bus", p, "",
				   "%d NVIDIA GPU%s (first at %s)", ngpus, ngpus == 1 ? "" : "s", gpus[0].bdf);
	}

	for (size_t i = 0; i < n; i++)
		if (paths[i] && strstr(paths[i], "://"))
			ferry__doctor_url(r, paths[i]);
		else
			ferry__doctor_path(r, paths[i] ? paths[i] : "", drives, &ndrives, FERRY__BLK_MAX);
	ferry__doctor_pcie(r, gpus, ngpus, drives, ndrives);
	ferry__doctor_gpus(r, gpus, ngpus);
	ferry__doctor_memory(r);
	ferry__doctor_io_uring(r);
	ferry__doctor_gds(r, ngpus, paths, n);
	ferry__doctor_nvcomp(r, ngpus);
	ferry__doctor_snapshot(r, ngpus);
	ferry__error_clear();
	*out = r;
	return 0;
}
