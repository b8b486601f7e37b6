/* ferry ckpt plan: the checkpoint interval that loses the least time (Young, Daly), and what
 * the user's current interval and asynchronous saves lose. The arithmetic is tools/ckpt_plan.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ferry_ckpt_plan.h"

struct plan_opts {
	double save_s, restart_s, mtbf_h, interval_s, blocked_s;
	uint64_t nodes;
	const char *bench;
	int json;
};

#define PO(f) offsetof(struct plan_opts, f)
static const struct cli_opt plan_rows[] = {
	{.name = "save-s", .kind = CLI_DOUBLE, .off = PO(save_s), .arg = "S", .min = 1e-6, .max = 1e9,
	 .help = "seconds one checkpoint save takes (blocking), as measured"},
	{.name = "from-bench", .kind = CLI_STR, .off = PO(bench), .arg = "FILE.json",
	 .help = "read save_s (and the async save's figures) from 'ferry ckpt bench --json' output"},
	{.name = "restart-s", .kind = CLI_DOUBLE, .off = PO(restart_s), .arg = "R", .min = 0, .max = 1e9,
	 .help = "seconds from a failure to computing again: restart, reload the checkpoint"},
	{.name = "mtbf-h", .kind = CLI_DOUBLE, .off = PO(mtbf_h), .arg = "H", .min = 1e-6, .max = 1e9,
	 .help = "mean time between failures of one node, in hours"},
	{.name = "nodes", .kind = CLI_U64, .off = PO(nodes), .arg = "N", .min = 1, .max = 1e9,
	 .help = "nodes the job runs on (any one failing stops it)"},
	{.name = "interval-s", .kind = CLI_DOUBLE, .off = PO(interval_s), .arg = "T", .min = 1e-6, .max = 1e12,
	 .help = "the interval used now (seconds of training between saves), to compare"},
	{.name = "async-blocked-s", .kind = CLI_DOUBLE, .off = PO(blocked_s), .arg = "B", .min = 0, .max = 1e9,
	 .help = "with asynchronous saves: seconds training is blocked per save (the save itself takes S)"},
	{.name = "json", .kind = CLI_FLAG, .off = PO(json), .help = "one JSON object"},
	{.name = NULL},
};

static const struct cli_cmd plan_cmd = {
	.name = "ckpt plan",
	.synopsis = "ferry ckpt plan (--save-s S | --from-bench FILE.json) --restart-s R --mtbf-h H --nodes N\n"
		    "                [--interval-s T] [--async-blocked-s B] [--json]",
	.about = "Prints the checkpoint interval that minimises the time lost to saving and to failures,\n"
		 "by Young's formula sqrt(2CM) and Daly's higher-order one, with M = node MTBF / nodes, and\n"
		 "the expected fraction of the run lost at each interval (and at --interval-s): C/T to saves,\n"
		 "(T+C)/2M + R/M to failures (first order; docs/CHECKPOINTS.md). With --async-blocked-s (or\n"
		 "async figures in --from-bench) also the asynchronous save: C becomes the time blocked, the\n"
		 "rollback after a failure grows by the save's duration, and no interval is below it.",
	.opts = plan_rows,
	.min_args = 0,
	.max_args = 0,
};

struct row {
	const char *name, *mode; /* "young", "daly", "current"; "sync", "async" */
	double tau, c;
	struct ferry_ckpt_loss loss;
	const char *note;
};

static char *read_all(const char *path, char *why, size_t len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
	if (!f)
		return snprintf(why, len, "%m"), NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap + 1);
	while (buf && (n < cap) && !ferror(f) && !feof(f))
		n += fread(buf + n, 1, cap - n, f);
	int err = !buf || ferror(f) || n == cap;
	if (f != stdin)
		fclose(f);
	if (err) {
		snprintf(why, len, "%s", !buf ? "out of memory" : n == cap ? "larger than 64 KiB" : "read error");
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

static void add(struct row *rows, int *n, const char *name, const char *mode, double tau, double c,
		double rollback, double r, double m, const char *note)
{
	struct row *x = &rows[(*n)++];
	x->name = name;
	x->mode = mode;
	x->tau = tau;
	x->c = c;
	x->note = note;
	(void)ferry_ckpt_plan_loss(tau, c, rollback, r, m, &x->loss);
}

int ferry_cmd_ckpt_plan(int argc, char **argv)
{
	struct plan_opts o = {0};
	struct cli_args a = {0};
	int rc = cli_parse(&plan_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	int has_save = cli_given(&plan_cmd, &a, "save-s"), has_bench = cli_given(&plan_cmd, &a, "from-bench");
	if (has_save == has_bench)
		return cli_usage_error(&plan_cmd, &a, "give one of --save-s and --from-bench");
	if (!cli_given(&plan_cmd, &a, "restart-s") || !cli_given(&plan_cmd, &a, "mtbf-h") ||
	    !cli_given(&plan_cmd, &a, "nodes"))
		return cli_usage_error(&plan_cmd, &a, "--restart-s, --mtbf-h and --nodes are required");
	double c = o.save_s, blocked = -1, async_total = 0;
	const char *source = "--save-s";
	if (has_bench) {
		char why[256];
		char *text = read_all(o.bench, why, sizeof(why));
		double b = 0;
		if (!text || ferry_ckpt_plan_from_bench(text, &c, &b, &async_total, why, sizeof(why))) {
			free(text);
			fprintf(stderr, "ferry ckpt plan: %s: %s\n", o.bench, why);
			return 1;
		}
		free(text);
		if (b > 0)
			blocked = b;
		source = "--from-bench";
	}
	if (cli_given(&plan_cmd, &a, "async-blocked-s"))
		blocked = o.blocked_s;
	/* An asynchronous save's duration: the bench's async total when it measured one, else the
	 * blocking save's time (the same bytes written). */
	double s_async = async_total > 0 ? async_total : c;
	double m = ferry_ckpt_plan_mtbf_s(o.mtbf_h, (double)o.nodes), r = o.restart_s;

	struct row rows[8];
	int n = 0;
	double young = ferry_ckpt_plan_young(c, m), daly = ferry_ckpt_plan_daly(c, m);
	add(rows, &n, "young", "sync", young, c, c, r, m, "sqrt(2CM)");
	add(rows, &n, "daly", "sync", daly, c, c, r, m, c >= 2 * m ? "C >= 2M: M" : "Daly 2006");
	if (cli_given(&plan_cmd, &a, "interval-s"))
		add(rows, &n, "current", "sync", o.interval_s, c, c, r, m, "--interval-s");
	if (blocked >= 0) {
		/* C is the time blocked; a save cannot start before the previous one ended, so no
		 * interval is shorter than the save's duration. */
		double ya = ferry_ckpt_plan_young(blocked, m), da = ferry_ckpt_plan_daly(blocked, m);
		add(rows, &n, "young", "async", ya < s_async ? s_async : ya, blocked, s_async, r, m,
		    ya < s_async ? "raised to the save's duration" : "sqrt(2BM)");
		add(rows, &n, "daly", "async", da < s_async ? s_async : da, blocked, s_async, r, m,
		    da < s_async ? "raised to the save's duration" : "Daly 2006, C = B");
		if (cli_given(&plan_cmd, &a, "interval-s"))
			add(rows, &n, "current", "async", o.interval_s < s_async ? s_async : o.interval_s, blocked,
			    s_async, r, m, o.interval_s < s_async ? "raised to the save's duration" : "--interval-s");
	}

	if (o.json) {
		printf("{\"save_s\":%.6g,\"source\":\"%s\",\"restart_s\":%.6g,\"node_mtbf_h\":%.6g,\"nodes\":%llu,"
		       "\"job_mtbf_s\":%.6g,",
		       c, has_bench ? "from-bench" : "save-s", r, o.mtbf_h, (unsigned long long)o.nodes, m);
		if (blocked >= 0)
			printf("\"async_blocked_s\":%.6g,\"async_save_s\":%.6g,", blocked, s_async);
		printf("\"rows\":[");
		for (int i = 0; i < n; i++)
			printf("%s{\"name\":\"%s\",\"mode\":\"%s\",\"interval_s\":%.6g,\"blocked_s\":%.6g,"
			       "\"lost_ckpt\":%.6g,\"lost_failure\":%.6g,\"lost_total\":%.6g}",
			       i ? "," : "", rows[i].name, rows[i].mode, rows[i].tau, rows[i].c, rows[i].loss.ckpt,
			       rows[i].loss.failure, rows[i].loss.total);
		printf("]}\n");
		return 0;
	}
	printf("save C = %.4g s (%s), restart R = %.4g s, job MTBF M = %.4g h (%.4g h per node / %llu nodes)\n", c,
	       source, r, m / 3600, o.mtbf_h, (unsigned long long)o.nodes);
	if (blocked >= 0)
		printf("async: blocked B = %.4g s per save, save lasts S = %.4g s\n", blocked, s_async);
	printf("%-8s %-6s %12s %10s %10s %10s  %s\n", "interval", "save", "seconds", "saves %", "failures %",
	       "lost %", "note");
	for (int i = 0; i < n; i++)
		printf("%-8s %-6s %12.1f %10.3f %10.3f %10.3f  %s\n", rows[i].name, rows[i].mode, rows[i].tau,
		       100 * rows[i].loss.ckpt, 100 * rows[i].loss.failure, 100 * rows[i].loss.total, rows[i].note);
	if (c > m / 10)
		printf("note: C is above M/10, where the first-order model underestimates the loss (and Daly's\n"
		       "      interval is the better guess); read the fractions as rough\n");
	printf("lost %% = share of the run's compute time: C/T to saves, (T+C)/2M + R/M to failures "
	       "(first order; docs/CHECKPOINTS.md)\n");
	return 0;
}
