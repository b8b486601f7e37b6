/* Internal declarations of the doctor and monitor probes (src/sys). Names: ferry__sys_*. */
#ifndef FERRY_SYS_SYS_H
#define FERRY_SYS_SYS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/sbuf.h"

/* Probes format into fixed buffers on purpose (sysfs names are short; an absurd one is cut, and a
 * cut path fails to open, which is reported): GCC's truncation warning is noise here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "ferry_tools.h"

/*
 * The roots probes read below. Each is overridden by an environment variable so that tests can
 * point the probes at a fixture tree: FERRY_SYSFS_ROOT (/sys), FERRY_PROCFS_ROOT (/proc),
 * FERRY_RUN_ROOT (/run), FERRY_ETC_ROOT (/etc).
 */
enum ferry__sys_root_id {
	FERRY__ROOT_SYS,
	FERRY__ROOT_PROC,
	FERRY__ROOT_RUN,
	FERRY__ROOT_ETC,
	FERRY__ROOT__COUNT
};

/* The root directory ("/sys" or the override), never NULL. */
const char *ferry__sys_root(int root);
/*
 * 1 if FERRY_SYSFS_ROOT or FERRY_PROCFS_ROOT is set: then the machine's live state (stat of a
 * path, getrlimit, io_uring_setup, dlopen, O_DIRECT opens) is not probed, since it would describe
 * this machine and not the fixture.
 */
int ferry__sys_fixture_mode(void);

/* Formats root + "/" + fmt into buf. Returns buf; a path too long is truncated (reads then fail). */
char *ferry__sys_path(char *buf, size_t len, int root, const char *fmt, ...) FERRY__PRINTF(4, 5);
/*
 * Reads a small file (at most len-1 bytes), strips trailing white space, NUL-terminates.
 * Returns the length or -errno. path is absolute (from ferry__sys_path).
 */
int ferry__sys_read(const char *path, char *buf, size_t len);
/* Reads an integer file. Returns 0 or -errno / -EINVAL when the content is not a number. */
int ferry__sys_read_ll(const char *path, long long *out);
/* 1 if the path exists (lstat), 0 if not, -errno (other than ENOENT) if it cannot be told. */
int ferry__sys_exists(const char *path);
/* "No such file or directory" style reason for a -errno, with the path: fills buf, returns buf. */
const char *ferry__sys_reason(char *buf, size_t len, const char *path, int err);
/* The bracketed word of a sysfs choice file ("none [mq-deadline] bfq" -> "mq-deadline"). */
int ferry__sys_bracketed(const char *text, char *out, size_t len);
/* Number of online CPUs from <sys>/devices/system/cpu/online ("0-3,8-11"); 0 if unknown. */
int ferry__sys_online_cpus(void);

/* ------------------------------------------------------------------------------------- report */

/* Adds a check. value/expected/source/fix may be NULL (stored as ""). Returns 0 or -ENOMEM. */
int ferry__report_add(ferry_report *r, const char *id, const char *subject, int verdict,
		      const char *value, const char *expected, const char *source, const char *fix);
/* Same with a printf-formatted value. */
int ferry__report_addf(ferry_report *r, const char *id, const char *subject, int verdict,
		       const char *expected, const char *source, const char *fix, const char *fmt, ...)
	FERRY__PRINTF(8, 9);
ferry_report *ferry__report_new(void);
void ferry__report_set_host(ferry_report *r, const char *host, const char *kernel, int fixture);

/* ------------------------------------------------------------------------------ mounts, blocks */

struct ferry__mount {
	unsigned major, minor;
	char root[512];      /* the mount's root within its file system */
	char point[512];     /* mount point, unescaped */
	char options[512];   /* per-mount options (rw,noatime,...) */
	char fstype[64];
	char source[256];
	char super[1024];    /* super block options (NFS rsize=...) */
};

/*
 * Finds the mount holding path: the longest mount point that contains it (in fixture mode the
 * path is taken literally; otherwise it is made canonical with realpath and the entry whose
 * major:minor matches stat's st_dev is preferred). Returns 0, or -errno with ferry_last_error set.
 */
int ferry__sys_find_mount(const char *path, struct ferry__mount *out);
/* Value of option key in a comma list ("rsize" in "rw,rsize=32768"): 1 found (value copied,
 * "" for a bare flag), 0 absent. */
int ferry__sys_option(const char *list, const char *key, char *val, size_t len);

#define FERRY__BLK_MAX 32
struct ferry__blk {
	char name[64];       /* kernel name: nvme0n1, md0, dm-0, vda */
	char sysdir[512];    /* sysfs-relative directory: devices/.../block/nvme0n1 */
	char kind[8];        /* "disk", "part", "md", "dm" */
	int parent;          /* index of the device above it (-1 for the top) */
	int leaf;            /* 1 if no slaves */
};
/*
 * The block device stack for major:minor, top first: the partition (if any), its disk, through
 * device-mapper and md slaves down to the leaves. Returns the number of devices (0 if major:minor
 * has no block device in sysfs) or -errno.
 */
int ferry__sys_block_stack(unsigned major, unsigned minor, struct ferry__blk *out, int max);

/* The PCI address (0000:01:00.0) above a sysfs-relative device directory; 0 or -ENOENT. */
int ferry__sys_pci_of(const char *sysdir, char *bdf, size_t len);

/* ------------------------------------------------------------------------------------- GPUs */

#define FERRY__GPU_MAX 16
struct ferry__pcidev {
	char bdf[32];
	char name[64];       /* "GPU 0" or "nvme0" */
	int numa;            /* -1 if none or unknown */
	int numa_known;
};
/* NVIDIA GPUs (vendor 0x10de, class 0x03xxxx) in PCI order. Returns the count or -errno. */
int ferry__sys_gpus(struct ferry__pcidev *out, int max);
/* NVMe controllers (PCI class 0x010802) in PCI order. Returns the count or -errno. */
int ferry__sys_nvme_ctrls(struct ferry__pcidev *out, int max);
/* Why NVML facts are unknown ("NVML not loaded: ..."), "" when NVML is usable; never NULL. */
const char *ferry__sys_nvml_reason(void);
/* 1 if NVML is loaded and this is not fixture mode. */
int ferry__sys_nvml_usable(void);
/* NVML's index of the GPU at PCI address bdf, or -1. */
int ferry__sys_nvml_index(const char *bdf);

/*
 * Opens a file under path with O_DIRECT for a probe: path itself if it is a file (read-only); in a
 * writable directory a new temporary file (O_EXCL, *created set: the caller unlinks file when
 * done); otherwise the first readable regular file in the directory. Returns the descriptor or
 * -errno, with what was done in how.
 */
int ferry__sys_probe_file(const char *path, char *file, size_t flen, int *created, char *how, size_t hlen);

/* ---------------------------------------------------------------------------- doctor modules */

void ferry__doctor_path(ferry_report *r, const char *path, struct ferry__pcidev *drives,
			int *ndrives, int maxdrives);
/* An s3:// or http(s):// URL: reachability, credentials' source, HEAD latency, one GET's rate. */
void ferry__doctor_url(ferry_report *r, const char *url);
void ferry__doctor_pcie(ferry_report *r, const struct ferry__pcidev *gpus, int ngpus,
			const struct ferry__pcidev *drives, int ndrives);
void ferry__doctor_memory(ferry_report *r);
void ferry__doctor_io_uring(ferry_report *r);
void ferry__doctor_gds(ferry_report *r, int ngpus, const char *const *paths, size_t npaths);
void ferry__doctor_gpus(ferry_report *r, const struct ferry__pcidev *gpus, int ngpus);
/* The snapshot.* rows (tools/doctor_snapshot.c): ferry snapshot's driver, CRIU and kernel needs. */
void ferry__doctor_snapshot(ferry_report *r, int ngpus);
/* The gpu.nvcomp row (tools/doctor_nvcomp.c): nvCOMP found or not, version, path, codecs. */
void ferry__doctor_nvcomp(ferry_report *r, int ngpus);

#endif
