/*
 * ferry bench --suite: the storage-tuning chapter's demonstrations, measured on this machine, as a
 * table with a one-line reading per section and, with --report, a self-contained HTML page.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench_suite.h"
#include "progress.h"

struct suite_case {
	const char *label;
	enum bench_rw rw;
	uint64_t bs;
	unsigned iodepth, numjobs;
	int direct;
	const char *engine;
	int cold_pass; /* cold cache, one pass over the file instead of time based */
	int warm;      /* read the file once, unmeasured, before the run */
	struct bench_result *res;
	const char *skipped;
};

enum { S_SEQRAND, S_SIZE, S_QD, S_JOBS, S_CACHE, S_ENGINE, S_N };

struct suite_section {
	const char *title;
	const char *metric; /* "GB/s" or "IOPS": what the chart shows */
	int cases[6];
	unsigned ncases;
	char reading[512];
	const char *skipped;
};

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* Unique cases; sections refer to them by index, so a shared configuration runs once. */
static struct suite_case cases[] = {
	/* 0 */ {"read 1 MiB QD16 io_uring direct", BENCH_READ, MiB, 16, 1, 1, "io_uring"},
	/* 1 */ {"randread 4 KiB QD16 io_uring direct", BENCH_RANDREAD, 4 * KiB, 16, 1, 1, "io_uring"},
	/* 2 */ {"randread 1 MiB QD16 io_uring direct", BENCH_RANDREAD, MiB, 16, 1, 1, "io_uring"},
	/* 3 */ {"randread 4 KiB QD1 io_uring direct", BENCH_RANDREAD, 4 * KiB, 1, 1, 1, "io_uring"},
	/* 4 */ {"randread 4 KiB QD4 io_uring direct", BENCH_RANDREAD, 4 * KiB, 4, 1, 1, "io_uring"},
	/* 5 */ {"randread 4 KiB QD64 io_uring direct", BENCH_RANDREAD, 4 * KiB, 64, 1, 1, "io_uring"},
	/* 6 */ {"randread 4 KiB 1 job psync direct", BENCH_RANDREAD, 4 * KiB, 1, 1, 1, "psync"},
	/* 7 */ {"randread 4 KiB 2 jobs psync direct", BENCH_RANDREAD, 4 * KiB, 1, 2, 1, "psync"},
	/* 8 */ {"randread 4 KiB 4 jobs psync direct", BENCH_RANDREAD, 4 * KiB, 1, 4, 1, "psync"},
	/* 9 */ {"read 1 MiB QD16 buffered, cold cache", BENCH_READ, MiB, 16, 1, 0, "io_uring", 1},
	/* 10 */ {"read 1 MiB QD16 buffered, warm cache", BENCH_READ, MiB, 16, 1, 0, "io_uring", 0, 1},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static struct suite_section sections[S_N] = {
	[S_SEQRAND] = {"Sequential vs random", "GB/s", {0, 1}, 2},
	[S_SIZE] = {"4 KiB vs 1 MiB requests", "GB/s", {1, 2}, 2},
	[S_QD] = {"Queue depth (io_uring, one job)", "IOPS", {3, 4, 1, 5}, 4},
	[S_JOBS] = {"Jobs (threads, psync)", "IOPS", {6, 7, 8}, 3},
	[S_CACHE] = {"Buffered vs O_DIRECT", "GB/s", {0, 9, 10}, 3},
	[S_ENGINE] = {"psync vs io_uring", "IOPS", {6, 3, 1}, 3},
};

static char temp_path[4096];

static void on_signal(int sig)
{
	if (temp_path[0])
		unlink(temp_path);
	suite_gpu_cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

static double gbps(const struct suite_case *c)
{
	return c->res ? bench_gbps(c->res) : 0;
}

static double iops(const struct suite_case *c)
{
	if (!c->res || !c->res->wall_ns)
		return 0;
	return (double)(c->res->dir[0].ios + c->res->dir[1].ios) / ((double)c->res->wall_ns / 1e9);
}

static double cores(const struct suite_case *c)
{
	return c->res && c->res->wall_ns ? c->res->self_cpu_s / ((double)c->res->wall_ns / 1e9) : 0;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static void read_sections(void)
{
	struct suite_case *c = cases;
	struct suite_section *s;
	double r;

	s = &sections[S_SEQRAND];
	if (c[0].res && c[1].res) {
		r = ratio(gbps(&c[1]), gbps(&c[0]));
		snprintf(s->reading, sizeof(s->reading),
			 "random 4 KiB reads ran at %.1f%% of sequential 1 MiB bandwidth (%.3f vs %.3f GB/s): %s",
			 100 * r, gbps(&c[1]), gbps(&c[0]),
			 r < 0.5 ? "random access is IOPS-bound; pack small files into shards and read them in large requests."
				 : "random access costs little on this storage, but small requests still cost CPU per byte.");
	}
	s = &sections[S_SIZE];
	if (c[1].res && c[2].res)
		snprintf(s->reading, sizeof(s->reading),
			 "1 MiB requests moved %.1fx the bytes per second of 4 KiB requests at %.1f%% of their "
			 "IOPS (%.0f vs %.0f): every request has a fixed cost, so read in large requests.",
			 ratio(gbps(&c[2]), gbps(&c[1])), 100 * ratio(iops(&c[2]), iops(&c[1])), iops(&c[2]),
			 iops(&c[1]));
	s = &sections[S_QD];
	if (c[3].res && c[5].res) {
		int best = 3;
		for (unsigned i = 0; i < s->ncases; i++)
			if (iops(&c[s->cases[i]]) > iops(&c[best]))
				best = s->cases[i];
		r = ratio(iops(&c[5]), iops(&c[3]));
		snprintf(s->reading, sizeof(s->reading),
			 "QD64 gave %.1fx the IOPS of QD1 (%.0f vs %.0f), best at QD%u: %s", r, iops(&c[5]),
			 iops(&c[3]), c[best].iodepth,
			 r >= 1.5 ? "the device serves requests in parallel, so keep many in flight."
				  : "depth did not pay here; the device (or one CPU) is the limit at low depth.");
	}
	s = &sections[S_JOBS];
	if (c[6].res && c[8].res) {
		r = ratio(iops(&c[8]), iops(&c[6]));
		snprintf(s->reading, sizeof(s->reading),
			 "4 psync jobs gave %.1fx one job's IOPS (%.0f vs %.0f) using %.2f CPU cores against %.2f: %s",
			 r, iops(&c[8]), iops(&c[6]), cores(&c[8]), cores(&c[6]),
			 r >= 1.5 ? "threads add parallelism as queue depth does, at a CPU cost."
				  : "more threads did not add much; the device or the CPUs are saturated.");
	}
	s = &sections[S_CACHE];
	if (c[0].res && c[9].res && c[10].res) {
		r = ratio(gbps(&c[9]), gbps(&c[0]));
		snprintf(s->reading, sizeof(s->reading),
			 "the warm page cache served %.3f GB/s, %.1fx O_DIRECT (%.3f GB/s); cold buffered reads "
			 "ran at %.0f%% of O_DIRECT%s: data already in RAM is read fastest buffered, data on the "
			 "device with O_DIRECT (no copy, no cache pollution).",
			 gbps(&c[10]), ratio(gbps(&c[10]), gbps(&c[0])), gbps(&c[0]), 100 * r,
			 r > 1 ? " (read-ahead helped this sequential read)" : "");
	}
	s = &sections[S_ENGINE];
	if (c[6].res && c[3].res && c[1].res)
		snprintf(s->reading, sizeof(s->reading),
			 "at QD1 io_uring ran at %.2fx psync's IOPS (%.0f vs %.0f); at QD16 one io_uring job "
			 "reached %.1fx psync at %.2f cores: io_uring's gain is depth from one thread, not "
			 "speed per request.",
			 ratio(iops(&c[3]), iops(&c[6])), iops(&c[3]), iops(&c[6]),
			 ratio(iops(&c[1]), iops(&c[6])), cores(&c[1]));
	for (int i = 0; i < S_N; i++) {
		s = &sections[i];
		if (s->reading[0])
			continue;
		for (unsigned k = 0; k < s->ncases; k++)
			if (c[s->cases[k]].skipped)
				s->skipped = c[s->cases[k]].skipped;
		if (!s->skipped)
			s->skipped = "a case did not run";
	}
}

static void print_table(FILE *out, const char *path, uint64_t size)
{
	char a[32];
	fprintf(out, "ferry %s bench --suite on %s (%s)\n", ferry_version(), path,
		bench_fmt_size(a, sizeof(a), size));
	for (int i = 0; i < S_N; i++) {
		struct suite_section *s = &sections[i];
		fprintf(out, "\n%s\n", s->title);
		if (s->skipped && !s->reading[0]) {
			fprintf(out, "  skipped: %s\n", s->skipped);
			continue;
		}
		fprintf(out, "  %-40s %9s %10s %9s %9s %6s\n", "case", "GB/s", "IOPS", "p50", "p99", "cores");
		for (unsigned k = 0; k < s->ncases; k++) {
			struct suite_case *c = &cases[s->cases[k]];
			if (!c->res) {
				fprintf(out, "  %-40s skipped: %s\n", c->label, c->skipped ? c->skipped : "?");
				continue;
			}
			const struct bench_hist *h = &c->res->dir[0].clat;
			char p50[16], p99[16];
			fprintf(out, "  %-40s %9.3f %10.0f %9s %9s %6.2f\n", c->label, gbps(c), iops(c),
				bench_fmt_ns(p50, 16, (double)bench_hist_percentile(h, 50)),
				bench_fmt_ns(p99, 16, (double)bench_hist_percentile(h, 99)), cores(c));
		}
		fprintf(out, "  -> %s\n", s->reading);
	}
	suite_gpu_print(out);
}

/* ----------------------------------------------------------------------------------------- HTML */

void suite_html_esc(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else if (*s == '&')
			fputs("&amp;", f);
		else if (*s == '"')
			fputs("&quot;", f);
		else
			fputc(*s, f);
	}
}

static void html_chart(FILE *f, const struct suite_section *s)
{
	int iops_metric = !strcmp(s->metric, "IOPS");
	double max = 0;
	for (unsigned k = 0; k < s->ncases; k++) {
		const struct suite_case *c = &cases[s->cases[k]];
		double v = iops_metric ? iops(c) : gbps(c);
		if (v > max)
			max = v;
	}
	const int bar_h = 26, label_w = 260, chart_w = 420;
	int h = (int)s->ncases * (bar_h + 8) + 8;
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\">\n",
		label_w + chart_w + 120, h);
	for (unsigned k = 0; k < s->ncases; k++) {
		const struct suite_case *c = &cases[s->cases[k]];
		double v = iops_metric ? iops(c) : gbps(c);
		int y = 8 + (int)k * (bar_h + 8);
		int w = max > 0 ? (int)(v / max * chart_w) : 0;
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" class=\"l\">", label_w - 8,
			y + bar_h / 2 + 5);
		suite_html_esc(f, c->label);
		fprintf(f, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"b\"/>\n",
			label_w, y, w > 1 ? w : 1, bar_h);
		if (iops_metric)
			fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"v\">%.0f IOPS</text>\n", label_w + w + 6,
				y + bar_h / 2 + 5, v);
		else
			fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"v\">%.3f GB/s</text>\n", label_w + w + 6,
				y + bar_h / 2 + 5, v);
	}
	fprintf(f, "</svg>\n");
}

static int write_report(const char *file, const char *path, uint64_t size, const char *backend)
{
	FILE *f = fopen(file, "w");
	if (!f) {
		fprintf(stderr, "ferry bench: cannot write --report %s: %s\n", file, strerror(errno));
		return 1;
	}
	struct utsname u;
	char host[300] = "?", when[64], a[32];
	if (!uname(&u))
		snprintf(host, sizeof(host), "%s, Linux %s %s", u.nodename, u.release, u.machine);
	time_t t = time(NULL);
	struct tm tm;
	localtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %z", &tm);

	fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
	      "<title>ferry bench --suite</title>\n<style>\n"
	      "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}\n"
	      "h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}\n"
	      "table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .7em;text-align:right}\n"
	      "td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#f4f4f4}\n"
	      ".reading{background:#eef5ff;border-left:4px solid #3a7bd5;padding:.5em .8em}\n"
	      ".skip{color:#a60}.meta{color:#555}\n"
	      "svg .b{fill:#3a7bd5}svg .s{fill:#ccc}svg text{font-size:13px;font-family:system-ui,sans-serif}\n"
	      "svg .ceil{stroke:#c33;stroke-width:2;stroke-dasharray:6 4}svg .ceil-t{fill:#c33}\n"
	      "</style>\n</head>\n<body>\n<h1>ferry bench --suite</h1>\n<p class=\"meta\">",
	      f);
	fprintf(f, "ferry %s &middot; ", ferry_version());
	suite_html_esc(f, host);
	fprintf(f, " &middot; %s<br>file ", when);
	suite_html_esc(f, path);
	fprintf(f, " (%s) &middot; backend %s</p>\n", bench_fmt_size(a, sizeof(a), size), backend);
	for (int i = 0; i < S_N; i++) {
		struct suite_section *s = &sections[i];
		fprintf(f, "<h2>");
		suite_html_esc(f, s->title);
		fprintf(f, "</h2>\n");
		if (s->skipped && !s->reading[0]) {
			fprintf(f, "<p class=\"skip\">skipped: ");
			suite_html_esc(f, s->skipped);
			fprintf(f, "</p>\n");
			continue;
		}
		fprintf(f, "<table>\n<tr><th>case</th><th>GB/s</th><th>GiB/s</th><th>IOPS</th><th>p50</th>"
			   "<th>p99</th><th>p99.9</th><th>CPU cores</th></tr>\n");
		for (unsigned k = 0; k < s->ncases; k++) {
			struct suite_case *c = &cases[s->cases[k]];
			fprintf(f, "<tr><td>");
			suite_html_esc(f, c->label);
			if (!c->res) {
				fprintf(f, "</td><td colspan=\"7\" class=\"skip\">skipped: ");
				suite_html_esc(f, c->skipped ? c->skipped : "?");
				fprintf(f, "</td></tr>\n");
				continue;
			}
			const struct bench_hist *h = &c->res->dir[0].clat;
			char p[3][16];
			bench_fmt_ns(p[0], 16, (double)bench_hist_percentile(h, 50));
			bench_fmt_ns(p[1], 16, (double)bench_hist_percentile(h, 99));
			bench_fmt_ns(p[2], 16, (double)bench_hist_percentile(h, 99.9));
			fprintf(f, "</td><td>%.3f</td><td>%.3f</td><td>%.0f</td><td>%s</td><td>%s</td><td>%s</td>"
				   "<td>%.2f</td></tr>\n",
				gbps(c), gbps(c) * 1e9 / (1024.0 * 1024 * 1024), iops(c), p[0], p[1], p[2],
				cores(c));
		}
		fprintf(f, "</table>\n");
		html_chart(f, s);
		fprintf(f, "<p class=\"reading\">");
		suite_html_esc(f, s->reading);
		fprintf(f, "</p>\n");
	}
	suite_gpu_html(f);
	fprintf(f, "<p class=\"meta\">Latency is per I/O, submit to completion. CPU cores: process "
		   "CPU time (user+sys) divided by wall time. Reproduce with <code>ferry bench --suite</code>; "
		   "single cases with <code>ferry bench --filename F --rw R --bs B --iodepth Q --direct D</code>.</p>\n"
		   "</body>\n</html>\n");
	if (fclose(f)) {
		fprintf(stderr, "ferry bench: writing --report %s failed: %s\n", file, strerror(errno));
		return 1;
	}
	return 0;
}

/* ----------------------------------------------------------------------------------------- JSON */

static void json_suite(struct bench_json *j, void *arg)
{
	(void)arg;
	bench_json_arr(j, "suite");
	for (int i = 0; i < S_N; i++) {
		struct suite_section *s = &sections[i];
		bench_json_obj(j, NULL);
		bench_json_str(j, "section", s->title);
		bench_json_str(j, "metric", s->metric);
		if (s->reading[0])
			bench_json_str(j, "reading", s->reading);
		else
			bench_json_str(j, "skipped", s->skipped ? s->skipped : "");
		bench_json_arr(j, "cases");
		for (unsigned k = 0; k < s->ncases; k++)
			bench_json_str(j, NULL, cases[s->cases[k]].label);
		bench_json_close_arr(j);
		bench_json_close_obj(j);
	}
	bench_json_close_arr(j);
	suite_gpu_json(j);
}

/* -------------------------------------------------------------------------------------- the run */

struct tick_state {
	struct cli_progress *bar;
	unsigned n, total;
	int quiet;
};

/* A GPU step begins: the bar advances, or (not on a terminal) the step's line as the host cases have. */
static void tick(void *arg, const char *what)
{
	struct tick_state *t = arg;
	if (t->bar->on)
		cli_progress_set(t->bar, t->n++);
	else if (!t->quiet)
		fprintf(stderr, "ferry bench --suite: %u/%u GPU: %s\n", ++t->n, t->total, what);
}

/* O_DIRECT is refused by some file systems (tmpfs): then the suite's direct cases run buffered. */
static int direct_works(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

int bench_suite(const struct bench_suite_opts *so)
{
	uint64_t size = so->size ? so->size : 256 * MiB;
	double runtime = so->runtime > 0 ? so->runtime : so->quick ? 1.0 : 4.0;
	const char *path = so->filename;
	int ret = 1;

	if (!path) {
		const char *dir = so->directory;
		if (!dir)
			dir = getenv("TMPDIR");
		if (!dir || !*dir)
			dir = "/tmp";
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		snprintf(temp_path, sizeof(temp_path), "%s/ferry-suite-%d-%ld.dat", dir, (int)getpid(),
			 (long)(ts.tv_nsec % 1000000));
		path = temp_path;
	}
	signal(SIGINT, on_signal); /* also with --filename: the GPU rows' model and dataset */
	signal(SIGTERM, on_signal);
	if (size < 4 * MiB) {
		fprintf(stderr, "ferry bench: --suite needs --size of at least 4m\n");
		return 2;
	}

	const char *uring_why = ferry_backend_unavailable_reason("io_uring");
	int have_uring = !uring_why || !*uring_why;
	char uring_skip[300];
	snprintf(uring_skip, sizeof(uring_skip), "io_uring is not available here (%s)",
		 have_uring ? "" : uring_why);

	/* Lay the file out once (a one-pass buffered read creates it), then probe O_DIRECT. */
	struct bench_job_opts base = {
		.name = "layout",
		.filename = path,
		.rw = BENCH_READ,
		.bs = MiB,
		.size = size,
		.numjobs = 1,
		.iodepth = 1,
		.iodepth_batch_submit = 1,
		.ioengine = "psync",
		.randseed = 0x6665727279ull,
		.quiet = 1,
	};
	struct bench_result *probe = calloc(1, sizeof(*probe));
	if (!probe)
		return 1;
	char a[32];
	if (!so->quiet)
		fprintf(stderr, "ferry bench --suite: preparing %s (%s)\n", path, bench_fmt_size(a, sizeof(a), size));
	if (bench_run(&base, probe)) {
		free(probe);
		goto out;
	}
	free(probe);
	int direct_ok = direct_works(path);

	unsigned nrun = 0, total = NCASES + suite_gpu_steps();
	struct cli_progress bar;
	cli_progress_start(&bar, "ferry bench --suite", "steps", total, so->quiet, NULL, NULL);
	for (unsigned i = 0; i < NCASES; i++) {
		struct suite_case *c = &cases[i];
		if (!strcmp(c->engine, "io_uring") && !have_uring) {
			c->skipped = uring_skip;
			continue;
		}
		if (c->direct && !direct_ok) {
			c->skipped = "the file system refuses O_DIRECT";
			continue;
		}
		struct bench_job_opts o = base;
		o.name = c->label;
		o.rw = c->rw;
		o.bs = c->bs;
		o.iodepth = c->iodepth;
		o.numjobs = c->numjobs;
		o.direct = c->direct;
		o.ioengine = c->engine;
		o.runtime = runtime;
		if (c->cold_pass) {
			o.runtime = 0;
			o.cold = BENCH_COLD_FILE;
		}
		if (c->warm) {
			struct bench_result *w = calloc(1, sizeof(*w));
			struct bench_job_opts wo = o;
			wo.runtime = 0;
			int bad = !w || bench_run(&wo, w);
			free(w);
			if (bad)
				goto out;
		}
		if (bar.on)
			cli_progress_set(&bar, nrun++);
		else if (so->quiet)
			nrun++;
		else
			fprintf(stderr, "ferry bench --suite: %u/%u %s\n", ++nrun, total, c->label);
		c->res = calloc(1, sizeof(*c->res));
		if (!c->res || bench_run(&o, c->res)) {
			cli_progress_stop(&bar, 0);
			free(c->res);
			c->res = NULL;
			goto out;
		}
	}
	struct tick_state ts = {&bar, nrun, total, so->quiet};
	const char *slash = strrchr(path, '/');
	char gdir[4096];
	if (slash && slash != path)
		snprintf(gdir, sizeof(gdir), "%.*s", (int)(slash - path), path);
	else
		snprintf(gdir, sizeof(gdir), "%s", slash ? "/" : ".");
	struct suite_gpu_in gin = {
		.file = path,
		.dir = gdir,
		.size = size,
		.runtime = runtime,
		.storage_gbps = gbps(&cases[0]),
		.tick = tick,
		.arg = &ts,
	};
	suite_gpu_run(&gin);
	cli_progress_stop(&bar, 0);
	read_sections();

	if (so->json) {
		struct bench_result *res[NCASES];
		unsigned n = 0;
		for (unsigned i = 0; i < NCASES; i++)
			if (cases[i].res)
				res[n++] = cases[i].res;
		bench_print_json(so->out, res, n, json_suite, NULL);
	} else {
		print_table(so->out, path, size);
	}
	ret = 0;
	if (so->report) {
		const char *backend = have_uring ? "io_uring and psync" : "psync";
		ret = write_report(so->report, path, size, backend);
		if (!ret && !so->json)
			fprintf(so->out, "\nreport: %s\n", so->report);
	}
out:
	if (temp_path[0])
		unlink(temp_path);
	for (unsigned i = 0; i < NCASES; i++)
		free(cases[i].res);
	return ret;
}
