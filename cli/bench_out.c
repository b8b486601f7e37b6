/* ferry bench: the readable table and fio-schema JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "ferry/compress.h"
#include "ferry_tools.h"

char *bench_fmt_size(char *buf, size_t len, uint64_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned u = 0;
	double v = (double)bytes;
	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (v == (double)(uint64_t)v)
		snprintf(buf, len, "%" PRIu64 " %s", (uint64_t)v, units[u]);
	else
		snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}

char *bench_fmt_ns(char *buf, size_t len, double ns)
{
	if (ns < 1e3)
		snprintf(buf, len, "%.0fns", ns);
	else if (ns < 1e6)
		snprintf(buf, len, "%.1fus", ns / 1e3);
	else if (ns < 1e9)
		snprintf(buf, len, "%.2fms", ns / 1e6);
	else
		snprintf(buf, len, "%.2fs", ns / 1e9);
	return buf;
}

static char *fmt_count(char *buf, size_t len, double v)
{
	if (v < 1e4)
		snprintf(buf, len, "%.0f", v);
	else if (v < 1e6)
		snprintf(buf, len, "%.1fk", v / 1e3);
	else
		snprintf(buf, len, "%.2fM", v / 1e6);
	return buf;
}

static double secs(const struct bench_result *r)
{
	return r->wall_ns ? (double)r->wall_ns / 1e9 : 0.0;
}

double bench_gbps(const struct bench_result *r)
{
	double s = secs(r);
	return s > 0 ? (double)(r->dir[0].bytes + r->dir[1].bytes) / s / 1e9 : 0.0;
}

static double cpu_cores(const struct bench_result *r)
{
	double s = secs(r);
	return s > 0 ? r->self_cpu_s / s : 0.0;
}

void bench_print_normal(FILE *out, struct bench_result *const *res, unsigned n)
{
	if (!n)
		return;
	const struct bench_result *r0 = res[0];
	const struct bench_job_opts *o = &r0->opts;
	char a[32], b[32];
	fprintf(out, "ferry %s bench: %s\n", ferry_version(), o->name);
	fprintf(out, "  file     %s, %s region at offset %" PRIu64 ", %s\n", o->filename,
		bench_fmt_size(a, sizeof(a), r0->region), o->offset,
		r0->direct ? "O_DIRECT" : "buffered (page cache)");
	fprintf(out, "  engine   %s, backend %s, cold cache: %s, verify: %s\n",
		o->api_pread ? "ferry_pread/pwrite (chunks over the worker threads)" : "ferry_queue (one ring per job)",
		r0->backend, r0->cold_done, bench_verify_name(o->verify));
	if (o->runtime > 0)
		fprintf(out, "  workload %s, time based: %.3g s per run\n", bench_rw_name(o->rw), o->runtime);
	else
		fprintf(out, "  workload %s, %s per job\n", bench_rw_name(o->rw),
			bench_fmt_size(a, sizeof(a), o->io_size ? o->io_size : r0->region));
	fprintf(out, "\n  %-6s %8s %4s %4s %8s %8s %8s %8s %8s %8s %8s %8s %6s\n", "rw", "bs", "jobs",
		"qd", "GB/s", "GiB/s", "IOPS", "p50", "p90", "p99", "p99.9", "max", "cores");
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *r = res[i];
		double s = secs(r);
		for (int d = 0; d < 2; d++) {
			const struct bench_dir *dd = &r->dir[d];
			if (!dd->ios)
				continue;
			char p[5][16];
			bench_fmt_ns(p[0], 16, (double)bench_hist_percentile(&dd->clat, 50));
			bench_fmt_ns(p[1], 16, (double)bench_hist_percentile(&dd->clat, 90));
			bench_fmt_ns(p[2], 16, (double)bench_hist_percentile(&dd->clat, 99));
			bench_fmt_ns(p[3], 16, (double)bench_hist_percentile(&dd->clat, 99.9));
			bench_fmt_ns(p[4], 16, (double)dd->clat.max);
			double bps = s > 0 ? (double)dd->bytes / s : 0;
			fprintf(out, "  %-6s %8s %4u %4u %8.3f %8.3f %8s %8s %8s %8s %8s %8s %6.2f\n",
				d ? "write" : "read", bench_fmt_size(a, sizeof(a), r->opts.bs),
				r->opts.numjobs, r->iodepth, bps / 1e9, bps / (1024.0 * 1024 * 1024),
				fmt_count(b, sizeof(b), s > 0 ? (double)dd->ios / s : 0), p[0], p[1], p[2],
				p[3], p[4], cpu_cores(r));
		}
	}
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *r = res[i];
		double s = secs(r), bps = s > 0 ? (double)r->dir[0].bytes / s : 0;
		double ratio = r->cz_compressed > 0 ? (double)r->cz_bytes / (double)r->cz_compressed : 0;
		if (r->cz_codec)
			fprintf(out, "  compressed (%s): bs %s ratio %.3f, effective %.3f GB/s (the GB/s above: uncompressed "
				"bytes), compressed %.3f GB/s; decoded: %s\n", ferry_cz_codec_name(r->cz_codec),
				bench_fmt_size(a, sizeof(a), r->opts.bs), ratio, bps / 1e9, ratio > 0 ? bps / ratio / 1e9 : 0,
				r->cz_info);
	}
	fprintf(out, "\n  latency: submit to completion per I/O; cores: process CPU time (user+sys) / wall time\n");
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *r = res[i];
		double js = (double)r->job_runtime_ns / 1e9;
		fprintf(out, "  bs %-8s %.3f s, cpu usr %.1f%% sys %.1f%% per job, %" PRIu64
			" context switches",
			bench_fmt_size(a, sizeof(a), r->opts.bs), secs(r), js > 0 ? 100 * r->usr_s / js : 0,
			js > 0 ? 100 * r->sys_s / js : 0, r->ctxsw);
		if (r->opts.verify)
			fprintf(out, ", %" PRIu64 " blocks verified", r->verified);
		fprintf(out, "\n");
	}
}

/* ------------------------------------------------------------------------------------------ JSON */

static void indent(struct bench_json *j)
{
	for (int i = 0; i < j->depth; i++)
		fputs("  ", j->out);
}

static void member(struct bench_json *j, const char *key)
{
	if (!j->first)
		fputc(',', j->out);
	fputc('\n', j->out);
	j->first = 0;
	indent(j);
	if (key) {
		ferry_tools_json_string(j->out, key);
		fputs(" : ", j->out);
	}
}

void bench_json_begin(struct bench_json *j, FILE *out)
{
	j->out = out;
	j->depth = 1;
	j->first = 1;
	fputc('{', out);
}

void bench_json_end(struct bench_json *j)
{
	fputs("\n}\n", j->out);
}

void bench_json_obj(struct bench_json *j, const char *key)
{
	member(j, key);
	fputc('{', j->out);
	j->depth++;
	j->first = 1;
}

void bench_json_arr(struct bench_json *j, const char *key)
{
	member(j, key);
	fputc('[', j->out);
	j->depth++;
	j->first = 1;
}

static void close_with(struct bench_json *j, char c)
{
	j->depth--;
	fputc('\n', j->out);
	indent(j);
	fputc(c, j->out);
	j->first = 0;
}

void bench_json_close_obj(struct bench_json *j)
{
	close_with(j, '}');
}

void bench_json_close_arr(struct bench_json *j)
{
	close_with(j, ']');
}

void bench_json_str(struct bench_json *j, const char *key, const char *val)
{
	member(j, key);
	ferry_tools_json_string(j->out, val);
}

void bench_json_u64(struct bench_json *j, const char *key, uint64_t val)
{
	member(j, key);
	fprintf(j->out, "%" PRIu64, val);
}

void bench_json_i64(struct bench_json *j, const char *key, int64_t val)
{
	member(j, key);
	fprintf(j->out, "%" PRId64, val);
}

void bench_json_dbl(struct bench_json *j, const char *key, double val)
{
	member(j, key);
	fprintf(j->out, "%f", val == val ? val : 0.0);
}

void bench_json_bool(struct bench_json *j, const char *key, int val)
{
	member(j, key);
	fputs(val ? "true" : "false", j->out);
}

static void json_lat(struct bench_json *j, const char *key, const struct bench_hist *h)
{
	bench_json_obj(j, key);
	bench_json_u64(j, "min", h->n ? h->min : 0);
	bench_json_u64(j, "max", h->max);
	bench_json_dbl(j, "mean", bench_hist_mean(h));
	bench_json_dbl(j, "stddev", bench_hist_stddev(h));
	bench_json_u64(j, "N", h->n);
	if (h->n) {
		bench_json_obj(j, "percentile");
		for (unsigned i = 0; i < bench_npercentiles; i++) {
			char k[32];
			snprintf(k, sizeof(k), "%f", bench_percentiles[i]);
			bench_json_u64(j, k, bench_hist_percentile(h, bench_percentiles[i]));
		}
		bench_json_close_obj(j);
	}
	bench_json_close_obj(j);
}

static void json_dir(struct bench_json *j, const char *key, const struct bench_result *r,
		     const struct bench_dir *d)
{
	double s = d->ios ? (double)r->wall_ns / 1e9 : 0;
	uint64_t bw = s > 0 ? (uint64_t)((double)d->bytes / s) : 0;
	bench_json_obj(j, key);
	bench_json_u64(j, "io_bytes", d->bytes);
	bench_json_u64(j, "io_kbytes", d->bytes / 1024);
	bench_json_u64(j, "bw_bytes", bw);
	bench_json_u64(j, "bw", bw / 1024);
	bench_json_dbl(j, "iops", s > 0 ? (double)d->ios / s : 0);
	bench_json_u64(j, "runtime", d->ios ? (r->wall_ns + 500000) / 1000000 : 0);
	bench_json_u64(j, "total_ios", d->ios);
	bench_json_u64(j, "short_ios", 0);
	bench_json_u64(j, "drop_ios", 0);
	struct bench_hist none;
	bench_hist_init(&none);
	json_lat(j, "slat_ns", &none);
	json_lat(j, "clat_ns", &d->clat);
	json_lat(j, "lat_ns", &d->lat);
	bench_json_close_obj(j);
}

static void opt_u64(struct bench_json *j, const char *key, uint64_t v)
{
	char s[32];
	snprintf(s, sizeof(s), "%" PRIu64, v);
	bench_json_str(j, key, s);
}

static void json_job(struct bench_json *j, const struct bench_result *r, unsigned groupid)
{
	const struct bench_job_opts *o = &r->opts;
	double js = (double)r->job_runtime_ns / 1e9;
	bench_json_obj(j, NULL);
	bench_json_str(j, "jobname", o->name);
	bench_json_u64(j, "groupid", groupid);
	bench_json_u64(j, "error", 0);
	bench_json_obj(j, "job options");
	bench_json_str(j, "name", o->name);
	bench_json_str(j, "filename", o->filename);
	bench_json_str(j, "rw", bench_rw_name(o->rw));
	opt_u64(j, "bs", o->bs);
	opt_u64(j, "size", o->size);
	if (o->offset)
		opt_u64(j, "offset", o->offset);
	if (o->offset_increment)
		opt_u64(j, "offset_increment", o->offset_increment);
	opt_u64(j, "numjobs", o->numjobs);
	opt_u64(j, "iodepth", o->iodepth);
	if (o->end_fsync)
		bench_json_str(j, "end_fsync", "1");
	opt_u64(j, "iodepth_batch_submit", o->iodepth_batch_submit);
	if (o->direct != BENCH_DIRECT_AUTO) /* -x without --direct: the library decides per chunk */
		opt_u64(j, "direct", (uint64_t)o->direct);
	bench_json_str(j, "ioengine", o->ioengine);
	if (o->rw == BENCH_RANDRW)
		opt_u64(j, "rwmixread", o->rwmixread);
	if (o->runtime > 0) {
		char s[32];
		snprintf(s, sizeof(s), "%g", o->runtime);
		bench_json_str(j, "runtime", s);
		bench_json_str(j, "time_based", "1");
	}
	if (o->io_size)
		opt_u64(j, "io_size", o->io_size);
	opt_u64(j, "randseed", o->randseed);
	if (o->randgen != BENCH_RANDGEN_MAP)
		bench_json_str(j, "random_generator", bench_randgen_name(o->randgen));
	if (o->norandommap)
		bench_json_str(j, "norandommap", "1");
	if (o->verify)
		bench_json_str(j, "verify", bench_verify_name(o->verify));
	bench_json_close_obj(j);
	json_dir(j, "read", r, &r->dir[0]);
	json_dir(j, "write", r, &r->dir[1]);
	struct bench_dir none = {0};
	bench_hist_init(&none.clat);
	bench_hist_init(&none.lat);
	json_dir(j, "trim", r, &none);
	bench_json_u64(j, "job_runtime", (r->wall_ns + 500000) / 1000000);
	bench_json_dbl(j, "usr_cpu", js > 0 ? 100 * r->usr_s / js : 0);
	bench_json_dbl(j, "sys_cpu", js > 0 ? 100 * r->sys_s / js : 0);
	bench_json_u64(j, "ctx", r->ctxsw);
	bench_json_u64(j, "majf", r->majf);
	bench_json_u64(j, "minf", r->minf);
	bench_json_obj(j, "ferry");
	bench_json_u64(j, "schema_version", 1);
	bench_json_str(j, "engine", o->api_pread ? "ferry_pread" : "ferry_queue");
	bench_json_str(j, "backend", r->backend);
	bench_json_bool(j, "direct", r->direct);
	bench_json_str(j, "cold_cache", r->cold_done);
	bench_json_dbl(j, "cpu_cores", cpu_cores(r));
	bench_json_dbl(j, "gbps", bench_gbps(r));
	bench_json_dbl(j, "gibps", bench_gbps(r) * 1e9 / (1024.0 * 1024 * 1024));
	bench_json_str(j, "verify", bench_verify_name(o->verify));
	bench_json_u64(j, "verified_blocks", r->verified);
	if (o->xmode != BENCH_X_NONE) {
		bench_json_obj(j, "xfer");
		bench_json_str(j, "mode", bench_x_names[o->xmode]);
		if (o->xmode != BENCH_X_AUTO)
			bench_json_u64(j, "gdsio_mode", (uint64_t)BENCH_X_GDSIO(o->xmode));
		bench_json_u64(j, "gpu", (uint64_t)o->gpu);
		bench_json_str(j, "api", o->api_pread ? "pread" : "queue");
		bench_json_dbl(j, "htod_ceiling_bytes", r->htod);
		bench_json_dbl(j, "dtoh_ceiling_bytes", r->dtoh);
		double ceil = bench_rw_writes(o->rw) ? r->dtoh : r->htod;
		bench_json_dbl(j, "fraction_of_copy_ceiling",
			       bench_x_on_gpu(o->xmode) && ceil > 0 ? bench_gbps(r) * 1e9 / ceil : 0);
		bench_json_str(j, "path_info", r->path_info);
		bench_json_close_obj(j);
	}
	if (r->cz_codec) { /* read through ferry_cz_pread: the figures count uncompressed bytes */
		double ratio = r->cz_compressed > 0 ? (double)r->cz_bytes / (double)r->cz_compressed : 0;
		bench_json_obj(j, "compressed");
		bench_json_str(j, "codec", ferry_cz_codec_name(r->cz_codec));
		bench_json_u64(j, "bytes", (uint64_t)r->cz_bytes);
		bench_json_u64(j, "compressed_bytes", (uint64_t)r->cz_compressed);
		bench_json_dbl(j, "ratio", ratio);
		bench_json_dbl(j, "effective_gbps", bench_gbps(r));
		bench_json_dbl(j, "compressed_gbps", ratio > 0 ? bench_gbps(r) / ratio : 0);
		bench_json_str(j, "decoded", r->cz_info);
		bench_json_close_obj(j);
	}
	bench_json_str(j, "rw", bench_rw_name(o->rw));
	bench_json_u64(j, "bs", o->bs);
	bench_json_u64(j, "iodepth", r->iodepth);
	bench_json_u64(j, "numjobs", o->numjobs);
	bench_json_u64(j, "size", r->region);
	bench_json_u64(j, "offset", o->offset);
	bench_json_u64(j, "wall_ns", r->wall_ns);
	bench_json_dbl(j, "cpu_seconds", r->self_cpu_s);
	bench_json_obj(j, "engine_stats");
	for (int k = 0; k < FERRY_STAT__COUNT; k++)
		bench_json_u64(j, ferry_stat_name((enum ferry_stat)k), r->stats[k]);
	bench_json_close_obj(j);
	bench_json_close_obj(j);
	bench_json_close_obj(j);
}

void bench_print_json(FILE *out, struct bench_result *const *res, unsigned n,
		      void (*extra_top)(struct bench_json *j, void *arg), void *arg)
{
	struct bench_json j;
	char vers[64], when[64];
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	time_t t = now.tv_sec;
	struct tm tm;
	localtime_r(&t, &tm);
	strftime(when, sizeof(when), "%a %b %e %H:%M:%S %Y", &tm);
	snprintf(vers, sizeof(vers), "ferry-%s", ferry_version());

	bench_json_begin(&j, out);
	bench_json_str(&j, "ferry version", vers);
	bench_json_i64(&j, "timestamp", (int64_t)now.tv_sec);
	bench_json_i64(&j, "timestamp_ms", (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
	bench_json_str(&j, "time", when);
	bench_json_arr(&j, "jobs");
	for (unsigned i = 0; i < n; i++)
		json_job(&j, res[i], i);
	bench_json_close_arr(&j);

	double cpu = 0, wall = 0, bytes = 0;
	for (unsigned i = 0; i < n; i++) {
		cpu += res[i]->self_cpu_s;
		wall += (double)res[i]->wall_ns / 1e9;
		bytes += (double)(res[i]->dir[0].bytes + res[i]->dir[1].bytes);
	}
	bench_json_obj(&j, "ferry");
	bench_json_u64(&j, "schema_version", 1);
	if (n) {
		bench_json_str(&j, "backend", res[0]->backend);
		bench_json_bool(&j, "direct", res[0]->direct);
		bench_json_str(&j, "cold_cache", res[0]->cold_done);
		bench_json_str(&j, "verify", bench_verify_name(res[0]->opts.verify));
	}
	bench_json_dbl(&j, "cpu_cores", wall > 0 ? cpu / wall : 0);
	bench_json_dbl(&j, "gbps", wall > 0 ? bytes / wall / 1e9 : 0);
	if (extra_top)
		extra_top(&j, arg);
	bench_json_close_obj(&j);
	bench_json_end(&j);
}

void bench_print_xfer(FILE *out, struct bench_result *const *res, unsigned n)
{
	double htod = 0, dtoh = 0, storage = 0;
	int gpu = 0;

	for (unsigned i = 0; i < n; i++) {
		if (res[i]->htod > 0) {
			htod = res[i]->htod;
			dtoh = res[i]->dtoh;
		}
		gpu = res[i]->opts.gpu;
		if (res[i]->opts.xmode == BENCH_X_CPU && !res[i]->cannot[0])
			storage = bench_gbps(res[i]);
	}
	fprintf(out, "\n  transfer modes, GPU %d; pinned copy ceilings measured in this run: host-to-device %.1f GB/s, "
		     "device-to-host %.1f GB/s\n", gpu, htod / 1e9, dtoh / 1e9);
	fprintf(out, "  %-14s %9s %11s %11s %6s  %s\n", "mode", "GB/s", "of copy", "of storage", "cores",
		"path");
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *r = res[i];
		const struct bench_job_opts *o = &r->opts;
		if (r->cannot[0]) {
			fprintf(out, "  %-14s %9s %11s %11s %6s  cannot run here: %s\n", bench_x_names[o->xmode], "-",
				"-", "-", "-", r->cannot);
			continue;
		}
		double g = bench_gbps(r), ceil = bench_rw_writes(o->rw) ? dtoh : htod;
		char f1[16] = "-", f2[16] = "-";
		if (bench_x_on_gpu(o->xmode) && ceil > 0)
			snprintf(f1, sizeof(f1), "%.2f", g * 1e9 / ceil);
		if (storage > 0 && o->xmode != BENCH_X_CPU)
			snprintf(f2, sizeof(f2), "%.2f", g / storage);
		const char *info = strstr(r->path_info, "device memory: ");
		fprintf(out, "  %-14s %9.3f %11s %11s %6.2f  %s\n", bench_x_names[o->xmode], g, f1, f2,
			cpu_cores(r), !bench_x_on_gpu(o->xmode) ? "storage to host memory"
								 : info ? info + 15 : r->path_info);
	}
	fprintf(out, "  of copy: the figure over the pinned ceiling of its direction; of storage: over mode cpu\n"
		     "  (storage to host memory) measured just before, the ceiling when storage is the bottleneck\n");
}

void bench_print_gpus(FILE *out, const struct bench_result *r)
{
	const struct bench_job_opts *o = &r->opts;
	int wr = bench_rw_writes(o->rw);
	double one = 0, total = bench_gbps(r) * 1e9, all = wr ? r->dtoh_all : r->htod_all;

	fprintf(out, "\n  %u GPUs at once, one process, one context; pinned copy ceilings measured in this run (%s)\n",
		o->ngpus, wr ? "device-to-host" : "host-to-device");
	fprintf(out, "  %-6s %9s %13s %9s\n", "gpu", "GB/s", "ceiling alone", "of it");
	for (unsigned g = 0; g < o->ngpus; g++) {
		const struct bench_gpu_part *p = &r->part[g];
		double bw = p->wall_ns ? (double)p->bytes / ((double)p->wall_ns / 1e9) : 0;
		double c = wr ? p->dtoh : p->htod;
		if (c > one)
			one = c;
		fprintf(out, "  %-6d %9.3f %13.1f %9.2f\n", o->gpus[g], bw / 1e9, c / 1e9, c > 0 ? bw / c : 0);
	}
	fprintf(out, "  %-6s %9.3f %13s %9s  all at once: %.1f GB/s (%.2fx one GPU's), of it %.2f; %.2f CPU cores\n",
		"total", total / 1e9, "-", "-", all / 1e9, one > 0 ? all / one : 0, all > 0 ? total / all : 0,
		cpu_cores(r));
}

void bench_json_gpus(struct bench_json *j, const struct bench_result *r)
{
	const struct bench_job_opts *o = &r->opts;
	int wr = bench_rw_writes(o->rw);
	double total = bench_gbps(r) * 1e9, all = wr ? r->dtoh_all : r->htod_all;

	bench_json_arr(j, "gpus");
	for (unsigned g = 0; g < o->ngpus; g++) {
		const struct bench_gpu_part *p = &r->part[g];
		double bw = p->wall_ns ? (double)p->bytes / ((double)p->wall_ns / 1e9) : 0;
		bench_json_obj(j, NULL);
		bench_json_u64(j, "gpu", (uint64_t)o->gpus[g]);
		bench_json_u64(j, "bytes", p->bytes);
		bench_json_u64(j, "ios", p->ios);
		bench_json_u64(j, "wall_ns", p->wall_ns);
		bench_json_dbl(j, "bw_bytes", bw);
		bench_json_dbl(j, "htod_ceiling_bytes", p->htod);
		bench_json_dbl(j, "dtoh_ceiling_bytes", p->dtoh);
		bench_json_close_obj(j);
	}
	bench_json_close_arr(j);
	bench_json_dbl(j, "gpus_total_bw_bytes", total);
	bench_json_dbl(j, "gpus_htod_ceiling_all_bytes", r->htod_all);
	bench_json_dbl(j, "gpus_dtoh_ceiling_all_bytes", r->dtoh_all);
	bench_json_dbl(j, "gpus_fraction_of_ceiling_all", all > 0 ? total / all : 0);
	bench_json_dbl(j, "gpus_cpu_cores", cpu_cores(r));
}
