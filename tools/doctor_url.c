/* ferry doctor URL (docs/DOCTOR.md, docs/REMOTE.md): an s3:// or http(s):// object's reachability,
 * where the credentials came from, the latency of a HEAD and the rate of one ranged GET, measured
 * through the remote backend as ferry's reads see them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/sys.h"

#define GET_MAX (64u << 20) /* bytes of the one ranged GET: long enough for a rate, one part */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The credentials' source: the end of ferry_file_path_info's line ("...; credentials: X"). */
static void cred_source(const char *text, char *out, size_t len)
{
	const char *c = strstr(text, "credentials: ");
	snprintf(out, len, "%s", c ? c + 13 : "");
	out[strcspn(out, ";\n")] = 0;
}

void ferry__doctor_url(ferry_report *r, const char *url)
{
	ferry_ctx *ctx = NULL;
	ferry_file *f = NULL;
	int s3 = !strncasecmp(url, "s3://", 5);
	char part[32], info[2048] = "", creds[700] = "";
	if (ferry_ctx_create(&ctx)) {
		ferry__report_add(r, "remote.reach", url, FERRY_VERDICT_UNKNOWN, ferry_last_error(), "the object answers a HEAD",
				  "ferry_ctx_create", "");
		return;
	}
	snprintf(part, sizeof(part), "%u", GET_MAX);
	if (ferry_ctx_set(ctx, "remote_part_size", part) || ferry_ctx_set(ctx, "remote_connections", "1"))
		ferry__error_clear(); /* the rate is then of the default part size: still one GET's */
	if (s3) { /* opened for writing, an s3:// URL sends nothing until a write: its setup alone */
		if (!ferry_file_open(ctx, url, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &f) &&
		    ferry_file_path_info(f, info, sizeof(info)) >= 0)
			cred_source(info, creds, sizeof(creds));
		ferry_file_destroy(f); /* nothing written: no upload to abort */
		f = NULL;
		ferry__error_clear();
	}
	double t0 = ferry_tools_now_s();
	int err = ferry_file_open(ctx, url, FERRY_O_RDONLY, &f);
	double first = ferry_tools_now_s() - t0;
	if (err) {
		const char *why = ferry_last_error();
		ferry__report_addf(r, "remote.reach", url, FERRY_VERDICT_FAIL, "the object answers a HEAD", "HEAD", 
				   err == -EACCES ? "check the keys (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket's policy"
				   : err == -ENOENT ? "check the bucket and key" : "check the endpoint (AWS_ENDPOINT_URL_S3) and the network",
				   "%s", why);
	} else {
		if (ferry_file_path_info(f, info, sizeof(info)) < 0)
			snprintf(info, sizeof(info), "%s", ferry_last_error());
		ferry__report_addf(r, "remote.reach", url, FERRY_VERDICT_OK, "the object answers a HEAD", "HEAD", "",
				   "%s", info);
	}
	if (s3)
		ferry__report_add(r, "remote.credentials", url,
				  !creds[0] ? FERRY_VERDICT_UNKNOWN : strncmp(creds, "none", 4) ? FERRY_VERDICT_OK : FERRY_VERDICT_WARN,
				  creds[0] ? creds : "not said by the backend",
				  "keys from the environment or a profile (none: unsigned requests, public buckets only)",
				  "AWS_* variables, ~/.aws/credentials, ~/.aws/config", 
				  strncmp(creds, "none", 4) ? "" : "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or set AWS_PROFILE");
	if (err) {
		ferry_ctx_destroy(ctx);
		return;
	}
	/* HEAD latency: the median of three more opens (each a HEAD on a connection of its own) */
	double lat[3] = {0};
	int n = 0;
	for (; n < 3; n++) {
		ferry_file *g = NULL;
		t0 = ferry_tools_now_s();
		if (ferry_file_open(ctx, url, FERRY_O_RDONLY, &g))
			break;
		lat[n] = ferry_tools_now_s() - t0;
		ferry_file_destroy(g);
	}
	if (n)
		qsort(lat, (size_t)n, sizeof(double), cmp_double);
	ferry__report_addf(r, "remote.head_ms", url, n ? FERRY_VERDICT_OK : FERRY_VERDICT_UNKNOWN,
			   "milliseconds of a HEAD (connection included), the median of 3", "HEAD", "",
			   "%.1f ms (the first open: %.1f ms)%s", n ? lat[n / 2] * 1e3 : first * 1e3, first * 1e3,
			   n ? "" : "; later HEADs failed");
	int64_t size = ferry_file_size(f);
	size_t len = size > (int64_t)GET_MAX ? GET_MAX : (size_t)(size > 0 ? size : 0);
	char *buf = len ? malloc(len) : NULL;
	if (!len) {
		ferry__report_add(r, "remote.get_rate", url, FERRY_VERDICT_UNKNOWN, "an empty object: nothing to read",
				  "one ranged GET of up to 64 MiB", "GET", "");
	} else if (!buf) {
		ferry__report_add(r, "remote.get_rate", url, FERRY_VERDICT_UNKNOWN, "out of memory",
				  "one ranged GET of up to 64 MiB", "GET", "");
	} else {
		t0 = ferry_tools_now_s();
		ssize_t got = ferry_pread(f, buf, len, 0);
		double dt = ferry_tools_now_s() - t0;
		if (got != (ssize_t)len)
			ferry__report_addf(r, "remote.get_rate", url, FERRY_VERDICT_FAIL, "one ranged GET of up to 64 MiB", "GET",
					   "", "%s", got < 0 ? ferry_last_error() : "short read");
		else
			ferry__report_addf(r, "remote.get_rate", url, FERRY_VERDICT_OK,
					   "one ranged GET of up to 64 MiB, one connection (ferry's reads run remote_connections at once)",
					   "GET", "", "%.1f MB/s (%zu bytes in %.1f ms)", dt > 0 ? (double)len / dt / 1e6 : 0.0, len,
					   dt * 1e3);
	}
	free(buf);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
}
