/* ferry doctor: check the machine and the storage under the given paths. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/ferry.h"
#include "ferry_tools.h"

struct doctor_opts {
	int json, no_color, verbose;
	const char *root;
};

#define DO(f) offsetof(struct doctor_opts, f)

static const struct cli_opt rows[] = {
	{.name = "json", .letter = 'j', .kind = CLI_FLAG, .off = DO(json),
	 .help = "one JSON object: schema_version, host, checks[]"},
	{.name = "no-color", .letter = 'C', .kind = CLI_FLAG, .off = DO(no_color),
	 .help = "no colour even on a terminal (NO_COLOR does the same)"},
	{.name = "no-colour", .kind = CLI_FLAG, .off = DO(no_color), .flags = CLI_HIDDEN},
	{.name = "verbose", .letter = 'v', .kind = CLI_FLAG, .off = DO(verbose),
	 .help = "show expected value and source for every check, not only problems"},
	{.name = "root", .letter = 'r', .kind = CLI_STR, .off = DO(root), .arg = "DIR",
	 .help = "read a fixture tree: DIR/sys, DIR/proc, DIR/run, DIR/etc stand for /sys, /proc, /run,\n"
		 "/etc (PATHs are then resolved through DIR/proc/self/mountinfo)"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "doctor",
	.synopsis = "ferry doctor [--json] [--no-color] [--verbose] [--root DIR] [PATH ...]",
	.about = "Checks the machine, and the storage under each PATH, against the tuning checklist\n"
		 "(docs/DOCTOR.md). Never changes the machine; the O_DIRECT check creates and removes one\n"
		 "4 KiB temporary file in a writable directory PATH.",
	.opts = rows,
	.footer = "exit status: 0 nothing failed, 1 a check failed, 2 usage error",
	.max_args = -1,
};

static const char *color_of(const char *verdict)
{
	if (!strcmp(verdict, "ok"))
		return "\033[32m";
	if (!strcmp(verdict, "warn"))
		return "\033[33m";
	if (!strcmp(verdict, "fail"))
		return "\033[1;31m";
	return "\033[36m";
}

static int set_root(const char *env, const char *dir, const char *sub)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s/%s", dir, sub);
	return setenv(env, buf, 1);
}

static void print_table(ferry_report *r, int color, int verbose)
{
	size_t n = ferry_report_count(r);
	int counts[4] = {0};
	printf("ferry doctor: host %s, kernel %s%s\n", ferry_report_host(r, "host"), ferry_report_host(r, "kernel"),
	       strcmp(ferry_report_host(r, "mode"), "fixture") ? "" : " (fixture)");
	char *done = calloc(n ? n : 1, 1);
	/* Grouped by subject, subjects in the order they first appear. */
	for (size_t i = 0; i < n; i++) {
		if (done && done[i])
			continue;
		const char *subj = ferry_report_field(r, i, "subject");
		printf("\n%s%s%s\n", color ? "\033[1m" : "", subj, color ? "\033[0m" : "");
		for (size_t j = i; j < n; j++) {
			if (strcmp(ferry_report_field(r, j, "subject"), subj) || (done && done[j]))
				continue;
			if (done)
				done[j] = 1;
			const char *v = ferry_report_field(r, j, "verdict");
			int vi = ferry_report_verdict(r, j);
			if (vi >= 0 && vi < 4)
				counts[vi]++;
			printf("  %s%-7s%s %-20s %s\n", color ? color_of(v) : "", v, color ? "\033[0m" : "",
			       ferry_report_field(r, j, "id"), ferry_report_field(r, j, "value"));
			int problem = vi == FERRY_VERDICT_WARN || vi == FERRY_VERDICT_FAIL;
			if (problem || verbose) {
				printf("  %-7s %-20s expected: %s\n", "", "", ferry_report_field(r, j, "expected"));
				printf("  %-7s %-20s source:   %s\n", "", "", ferry_report_field(r, j, "source"));
			}
			const char *fix = ferry_report_field(r, j, "fix");
			if (fix[0] && (problem || verbose))
				printf("  %-7s %-20s fix:      %s\n", "", "", fix);
		}
	}
	free(done);
	printf("\n%zu checks: %d ok, %d warn, %d fail, %d unknown\n", n, counts[FERRY_VERDICT_OK],
	       counts[FERRY_VERDICT_WARN], counts[FERRY_VERDICT_FAIL], counts[FERRY_VERDICT_UNKNOWN]);
}

int ferry_cmd_doctor(int argc, char **argv)
{
	struct doctor_opts o = {0};
	struct cli_args a = {0};
	int rc = cli_parse(&cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	int json = o.json, verbose = o.verbose, color = isatty(STDOUT_FILENO) && !o.no_color;
	const char *nc = getenv("NO_COLOR");
	if (nc && *nc)
		color = 0;
	if (o.root && (set_root("FERRY_SYSFS_ROOT", o.root, "sys") || set_root("FERRY_PROCFS_ROOT", o.root, "proc") ||
		       set_root("FERRY_RUN_ROOT", o.root, "run") || set_root("FERRY_ETC_ROOT", o.root, "etc"))) {
		perror("ferry doctor: setenv");
		return 2;
	}
	ferry_report *r = NULL;
	int err = ferry_doctor_run((const char *const *)a.argv, (size_t)a.argc, &r);
	if (err) {
		fprintf(stderr, "ferry doctor: %s (%s)\n", ferry_strerror(err), ferry_last_error());
		return 1;
	}
	if (json) {
		const char *text;
		if (ferry_report_json(r, &text)) {
			fprintf(stderr, "ferry doctor: %s\n", ferry_last_error());
			ferry_report_destroy(r);
			return 1;
		}
		fputs(text, stdout);
	} else {
		print_table(r, color, verbose);
	}
	int failed = ferry_report_worst(r) == FERRY_VERDICT_FAIL;
	ferry_report_destroy(r);
	if (fflush(stdout) == EOF)
		return 1;
	return failed ? 1 : 0;
}
