/*
 * ferry: machine checks (doctor) and live counters (sampler), the API behind `ferry doctor` and
 * `ferry top`. Same conventions as ferry.h: 0 or a count on success, a negative code on failure
 * with ferry_last_error() saying why; opaque handles; _destroy(NULL) does nothing.
 *
 * Probes read /sys, /proc, /run and /etc, or the trees named by FERRY_SYSFS_ROOT,
 * FERRY_PROCFS_ROOT, FERRY_RUN_ROOT and FERRY_ETC_ROOT (docs/DOCTOR.md). Nothing here changes
 * the machine.
 */
#ifndef FERRY_SYS_H
#define FERRY_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* -------------------------------------------------------------------------------------- doctor */

enum ferry_verdict {
	FERRY_VERDICT_OK = 0,
	FERRY_VERDICT_WARN = 1,
	FERRY_VERDICT_FAIL = 2,
	FERRY_VERDICT_UNKNOWN = 3, /* the probe could not tell; value holds the reason */
};

typedef struct ferry_report ferry_report;

/*
 * Checks the machine and the storage under each of the n paths (n may be 0) and returns the
 * findings in *out (free with ferry_report_destroy). A path that cannot be resolved is a finding
 * (a failed check), not an error. Returns 0, or -ENOMEM (then *out is NULL).
 */
FERRY_API FERRY_WUR int ferry_doctor_run(const char *const *paths, size_t n, ferry_report **out);
FERRY_API void ferry_report_destroy(ferry_report *r);

/* Number of checks. */
FERRY_API size_t ferry_report_count(const ferry_report *r);
/*
 * A field of check i: "id" (stable dotted name, e.g. "block.scheduler"), "subject" (the device,
 * mount or GPU), "verdict" ("ok", "warn", "fail", "unknown"), "value" (what was found, or why it
 * is unknown), "expected", "source" (file or call read), "fix" (a command, or ""). Returns NULL
 * if i is out of range or the field name is not one of these. Valid until the report is destroyed.
 */
FERRY_API const char *ferry_report_field(const ferry_report *r, size_t i, const char *field);
/* The verdict of check i (enum ferry_verdict), or -EINVAL if i is out of range. */
FERRY_API int ferry_report_verdict(const ferry_report *r, size_t i);
/* The worst verdict among the checks, ordered ok < unknown < warn < fail (FERRY_VERDICT_*). */
FERRY_API int ferry_report_worst(const ferry_report *r);
/* "host" (node name), "kernel" (release), "mode" ("live" or "fixture"). NULL for other keys. */
FERRY_API const char *ferry_report_host(const ferry_report *r, const char *key);
/*
 * The report as one JSON object: {"schema_version": 1, "host": {...}, "checks": [{...}, ...]}.
 * *out stays owned by the report. Returns 0 or -ENOMEM.
 */
FERRY_API FERRY_WUR int ferry_report_json(ferry_report *r, const char **out);

/* ------------------------------------------------------------------------------------- sampler */

/*
 * A sampler reads the machine's counters (block devices from /proc/diskstats, CPU from
 * /proc/stat, GPUs through NVML, ferry processes through their published statistics) and turns
 * two consecutive samples into rates. The result is a list of rows; each row has a kind
 * ("cpu", "disk", "gpu", "ferry"), a name, numeric metrics and text fields.
 *
 * Metrics by kind (rates per second over the last interval; 0 after the first sample):
 *   cpu:   busy_pct, iowait_pct, softirq_pct
 *   disk:  read_mbps, write_mbps, read_iops, write_iops, read_await_ms, write_await_ms,
 *          queue_depth (average requests in flight, iostat's aqu-sz), util_pct
 *   gpu:   util_pct, mem_used_mib, mem_total_mib, pcie_rx_mbps, pcie_tx_mbps
 *   ferry: pid, read_mbps, write_mbps, read_iops, write_iops, wait_pct (consumer waiting)
 * Text by kind: ferry: "path" (the transfer path used), "name".
 */
typedef struct ferry_sampler ferry_sampler;

FERRY_API FERRY_WUR int ferry_sampler_create(ferry_sampler **out);
FERRY_API void ferry_sampler_destroy(ferry_sampler *s);
/* Takes a sample now. Returns 0 or -errno (e.g. /proc/diskstats unreadable). */
FERRY_API FERRY_WUR int ferry_sampler_sample(ferry_sampler *s);
/* Seconds between the last two samples (0 after the first). */
FERRY_API double ferry_sampler_interval(const ferry_sampler *s);
FERRY_API size_t ferry_sampler_rows(const ferry_sampler *s);
/* Kind and name of row i, NULL if out of range. */
FERRY_API const char *ferry_sampler_row_kind(const ferry_sampler *s, size_t i);
FERRY_API const char *ferry_sampler_row_name(const ferry_sampler *s, size_t i);
/* Metric of row i. Returns 0, or -ENOENT if the row has no such metric. */
FERRY_API FERRY_WUR int ferry_sampler_row_value(const ferry_sampler *s, size_t i,
						const char *metric, double *out);
/* Text field of row i, NULL if absent. */
FERRY_API const char *ferry_sampler_row_text(const ferry_sampler *s, size_t i, const char *key);
/* Notes about what could not be sampled ("NVML not available: ..."), NULL past the last. */
FERRY_API const char *ferry_sampler_note(const ferry_sampler *s, size_t i);
/* The last sample as one line of JSON (no newline); *out owned by the sampler. 0 or -ENOMEM. */
FERRY_API FERRY_WUR int ferry_sampler_json(ferry_sampler *s, const char **out);
/* The last sample in Prometheus' text exposition format 0.0.4; *out owned by the sampler. */
FERRY_API FERRY_WUR int ferry_sampler_prometheus(ferry_sampler *s, const char **out);

/* -------------------------------------------------------------------- the library's utilities */

/*
 * Writes s to out as a JSON string literal, quotes included, escaped as everything ferry writes:
 * valid UTF-8 as is, '"', '\\' and control characters escaped, a byte that is not UTF-8 as
 * \ufffd; NULL as null. Returns 0, -ENOMEM, or -EIO when out reports an error.
 */
FERRY_API int ferry_tools_json_string(FILE *out, const char *s);
/* Seconds on the monotonic clock (the CLI's timers and progress lines). */
FERRY_API double ferry_tools_now_s(void);
/* Writes path's dirty pages and drops its pages from the page cache (a cold read next); best effort. */
FERRY_API void ferry_tools_drop_cache(const char *path);
/* The CRC-32C that ferry's shard format stores (crc 0 to start; "123456789" gives 0xE3069283). */
FERRY_API uint32_t ferry_tools_crc32c(uint32_t crc, const void *buf, size_t len);

/* --------------------------------------------------------------------------- object storage */

/*
 * The objects under an s3:// prefix (ListObjectsV2 by the remote backend, signed; docs/REMOTE.md),
 * in key order: fn(arg, "s3://bucket/key", size, ETag) for each; a nonzero return of fn stops the
 * listing and is returned. 0, or a negative code with ferry_last_error() naming the URL and status.
 */
int ferry_tools_list(ferry_ctx *ctx, const char *prefix,
		     int (*fn)(void *arg, const char *url, uint64_t size, const char *etag), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SYS_H */
