/* The doctor's snapshot.* rows: can `ferry snapshot` run here (driver, CRIU, kernel), and why not. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry_snapshot.h"
#include "tools/sys.h"

#define OK FERRY_VERDICT_OK
#define WARN FERRY_VERDICT_WARN
#define UNKNOWN FERRY_VERDICT_UNKNOWN

/* Bit cap of CapEff in /proc/self/status: 1 set, 0 not, -1 unknown. */
static int has_cap(int cap)
{
	char p[PATH_MAX], buf[4096];
	if (ferry__sys_read(ferry__sys_path(p, sizeof(p), FERRY__ROOT_PROC, "self/status"), buf, sizeof(buf)) < 0)
		return -1;
	const char *c = strstr(buf, "CapEff:");
	if (!c)
		return -1;
	unsigned long long v = strtoull(c + 7, NULL, 16);
	return (int)((v >> cap) & 1);
}

void ferry__doctor_snapshot(ferry_report *r, int ngpus)
{
	const char *nogpu = "; not needed: no NVIDIA GPU";
	if (ferry__sys_fixture_mode()) {
		ferry__report_add(r, "snapshot.driver", "host", UNKNOWN, "fixture mode: libraries are probed only on the live machine",
				  "CUDA driver 570+ with the checkpoint API", "dlopen(libcuda.so.1)", "");
		ferry__report_add(r, "snapshot.criu", "host", UNKNOWN, "fixture mode: criu is run only on the live machine",
				  "criu installed and `criu check` passing", "criu check", "");
		ferry__report_add(r, "snapshot.kernel", "host", UNKNOWN, "fixture mode: probed only on the live machine",
				  "CONFIG_CHECKPOINT_RESTORE, ptrace allowed, root", "/proc/sys/kernel", "");
		return;
	}

	struct ferry_snapshot_driver d;
	const char *dexpect = "CUDA driver 570+ with the checkpoint API (cuCheckpointProcess*)";
	if (ferry_snapshot_driver_probe(&d) == 0)
		ferry__report_addf(r, "snapshot.driver", "host", OK, dexpect, "dlsym(libcuda.so.1)", "",
				   "driver %d.%d: all 6 checkpoint entry points present", d.driver_version / 1000,
				   d.driver_version % 1000 / 10);
	else
		ferry__report_addf(r, "snapshot.driver", "host", ngpus ? WARN : OK, dexpect, "dlsym(libcuda.so.1)",
				   ngpus ? (d.usable ? "update the NVIDIA driver to 570 or later"
						     : "install the NVIDIA driver (570 or later); see gpu.* rows")
					 : "",
				   "ferry snapshot cannot run: %s%s", d.why, ngpus ? "" : nogpu);

	struct ferry_snapshot_criu c;
	const char *cexpect = "criu installed and `criu check` passing";
	if (ferry_snapshot_criu_probe(&c, 1) != 0) {
		ferry__report_addf(r, "snapshot.criu", "host", ngpus ? WARN : OK, cexpect, "criu", ngpus ? "apt-get install criu" : "",
				   "ferry snapshot cannot run: %s%s", ferry_last_error(), ngpus ? "" : nogpu);
	} else if (c.check_rc == 0) {
		ferry__report_addf(r, "snapshot.criu", "host", OK, cexpect, "criu check", "", "%s (%s); criu check: %s",
				   c.version, c.path, c.check);
	} else {
		ferry__report_addf(r, "snapshot.criu", "host", ngpus ? WARN : OK, cexpect, "criu check",
				   ngpus ? (geteuid() ? "run ferry snapshot (and criu check) as root" : "see `criu check --all` for what the kernel lacks") : "",
				   "%s (%s); criu check failed (exit %d): %s%s%s", c.version, c.path, c.check_rc, c.check,
				   geteuid() ? " (not root: criu needs root or CAP_CHECKPOINT_RESTORE)" : "", ngpus ? "" : nogpu);
	}

	/* CRIU's needs that the doctor can read without running it. */
	char p[PATH_MAX], v[64], missing[512] = "", have[512] = "";
	size_t mn = 0, hn = 0;
	ferry__sys_path(p, sizeof(p), FERRY__ROOT_PROC, "sys/kernel/ns_last_pid");
	if (ferry__sys_exists(p) == 1)
		hn += (size_t)snprintf(have + hn, sizeof(have) - hn, "CONFIG_CHECKPOINT_RESTORE (ns_last_pid present)");
	else
		mn += (size_t)snprintf(missing + mn, sizeof(missing) - mn, "%s absent: kernel without CONFIG_CHECKPOINT_RESTORE", p);
	ferry__sys_path(p, sizeof(p), FERRY__ROOT_PROC, "sys/kernel/yama/ptrace_scope");
	if (ferry__sys_read(p, v, sizeof(v)) > 0) {
		if (atoi(v) >= 3)
			mn += (size_t)snprintf(missing + mn, sizeof(missing) - mn, "%sptrace_scope %s: ptrace disabled, CRIU cannot seize the process",
					       mn ? "; " : "", v);
		else
			hn += (size_t)snprintf(have + hn, sizeof(have) - hn, "%sptrace_scope %s", hn ? ", " : "", v);
	}
	int cap_cr = has_cap(40), cap_admin = has_cap(21);
	if (geteuid() == 0 || cap_cr == 1 || cap_admin == 1)
		hn += (size_t)snprintf(have + hn, sizeof(have) - hn, "%s%s", hn ? ", " : "",
				       geteuid() == 0 ? "root" : cap_cr == 1 ? "CAP_CHECKPOINT_RESTORE" : "CAP_SYS_ADMIN");
	else
		mn += (size_t)snprintf(missing + mn, sizeof(missing) - mn,
				       "%snot root and no CAP_CHECKPOINT_RESTORE (CRIU and the checkpoint API need them)", mn ? "; " : "");
	const char *kexpect = "CONFIG_CHECKPOINT_RESTORE, ptrace allowed, root (or CAP_CHECKPOINT_RESTORE)";
	if (!mn)
		ferry__report_add(r, "snapshot.kernel", "host", OK, have, kexpect, "/proc/sys/kernel, /proc/self/status", "");
	else
		ferry__report_addf(r, "snapshot.kernel", "host", ngpus ? WARN : OK, kexpect, "/proc/sys/kernel, /proc/self/status",
				   ngpus ? "run as root on a kernel with CONFIG_CHECKPOINT_RESTORE (and kernel.yama.ptrace_scope <= 2)" : "",
				   "%s%s%s%s", missing, hn ? "; has " : "", have, ngpus ? "" : nogpu);
}
