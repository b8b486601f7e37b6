/*
 * ferry loader-bench: runs the loader over a dataset and reports samples/s, bytes/s, CPU time and
 * how long the consumer waited per step. With --step-fraction F it first measures the loader's
 * peak rate, then consumes with a synthetic step (a busy wait) that needs F of that rate, which
 * is the GPU-starvation figure: the share of time the "GPU" waited for data.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

#include "commands.h"
#include "ferry/data.h"
#include "ferry/ferry.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct run {
	double seconds, samples_per_s, bytes_per_s, wait_total, wait_p50, wait_p99, wait_max, cpu_s;
	double steps, reads, wait_share, proc_cpu_s, inline_reads;
};

/* The loader's knobs this command passes on (ferry_loader_set validates them); --batch-size sets
 * batch_size. The options struct holds their values in this order. */
static const char *const knobs[] = {"batch_size", "seq_len", "order", "block", "threads", "prefetch", "device",
				    "world_size", "rank", "seed", "merge_gap", "epoch", "inline_cached", NULL};
enum { NKNOBS = sizeof(knobs) / sizeof(knobs[0]) - 1 };

/* CPU seconds of the whole process: pipeline threads, the engine's workers, io_uring's io-wq
 * threads (they count as the process's), and this consumer. */
static double proc_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The names asked for are ferry_loader_metric_names(): none is unknown. */
static double metric(ferry_loader *l, const char *name)
{
	double v = 0;
	return ferry_loader_metric(l, name, &v) < 0 ? 0 : v;
}

static int one_run(ferry_dataset *ds, const char *const *vals, double seconds, uint64_t step_ns, struct run *r)
{
	ferry_loader *l;
	if (ferry_loader_create(ds, &l))
		return -1;
	for (int k = 0; knobs[k]; k++)
		if (vals[k] && ferry_loader_set(l, knobs[k], vals[k])) {
			fprintf(stderr, "ferry loader-bench: %s\n", ferry_last_error());
			ferry_loader_destroy(l);
			return -2;
		}
	if (ferry_loader_start(l)) {
		fprintf(stderr, "ferry loader-bench: %s\n", ferry_last_error());
		ferry_loader_destroy(l);
		return -1;
	}
	double c0 = proc_cpu_s();
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9), busy = 0;
	ferry_loader_batch *b;
	int rc;
	while ((rc = ferry_loader_next(l, &b)) == 1) {
		if (step_ns) {
			uint64_t s = now_ns();
			while (now_ns() - s < step_ns)
				;
			busy += step_ns;
		}
		ferry_loader_batch_destroy(b);
		if (now_ns() >= end)
			break;
	}
	if (rc < 0) {
		fprintf(stderr, "ferry loader-bench: %s\n", ferry_last_error());
		ferry_loader_destroy(l);
		return -1;
	}
	double el = (double)(now_ns() - t0) / 1e9;
	r->proc_cpu_s = proc_cpu_s() - c0;
	r->seconds = el;
	r->inline_reads = metric(l, "inline_reads");
	r->samples_per_s = metric(l, "samples_per_s");
	r->bytes_per_s = metric(l, "bytes_per_s");
	r->wait_total = metric(l, "wait_total_ns") / 1e9;
	r->wait_p50 = metric(l, "wait_p50_ns") / 1e3;
	r->wait_p99 = metric(l, "wait_p99_ns") / 1e3;
	r->wait_max = metric(l, "wait_max_ns") / 1e3;
	r->cpu_s = metric(l, "cpu_ns") / 1e9;
	r->steps = metric(l, "steps");
	r->reads = metric(l, "reads");
	r->wait_share = el > 0 ? r->wait_total / el : 0;
	(void)busy;
	ferry_loader_destroy(l);
	return 0;
}

struct lb_opts {
	const char *knob[NKNOBS]; /* NULL: the loader's default */
	double seconds, frac;
	const char *name;
	int json;
};

#define LB(f) offsetof(struct lb_opts, f)
#define KNOB(nm, i, a, h) {.name = nm, .kind = CLI_STR, .off = LB(knob[i]), .arg = a, .help = h}

static const struct cli_opt rows[] = {
	KNOB("batch-size", 0, "N", "samples per batch (default 1)"),
	KNOB("seq-len", 1, "N", "token windows of N over the concatenated samples (default 0: whole samples)"),
	KNOB("order", 2, "sequential|shuffle|block", "the sample order (default sequential)"),
	KNOB("block", 3, "N", "samples per block of --order block (default 256)"),
	KNOB("threads", 4, "N", "pipeline threads (default 1)"),
	KNOB("prefetch", 5, "N", "batches kept ready (default 4)"),
	KNOB("device", 6, "cpu|N", "host memory, or CUDA device N"),
	KNOB("world-size", 7, "N", "ranks sharing the dataset (default 1)"),
	KNOB("rank", 8, "N", "this rank (default 0)"),
	KNOB("seed", 9, "N", "seed of the shuffles (default 0)"),
	KNOB("merge-gap", 10, "BYTES", "reads this close are merged into one (default 0)"),
	KNOB("epoch", 11, "N", "first epoch (default 0)"),
	KNOB("inline-cached", 12, "0|1", "read page-cache-resident samples inline (docs/CONFIG.md)"),
	{.name = "seconds", .kind = CLI_TIME, .off = LB(seconds), .arg = "S", .help = "per run (default 10)"},
	{.name = "step-fraction", .kind = CLI_DOUBLE, .off = LB(frac), .arg = "F", .max = 10,
	 .help = "also run with a synthetic step needing F of the peak rate (e.g. 0.8)"},
	{.name = "name", .kind = CLI_STR, .off = LB(name), .arg = "NAME", .help = "label of the TABLE lines (default ferry)"},
	{.name = "json", .kind = CLI_FLAG, .off = LB(json), .help = "one JSON object"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "loader-bench",
	.synopsis = "ferry loader-bench DATASET [options]",
	.about = "Runs the loader over DATASET for --seconds and reports samples/s, bytes/s, CPU time and how\n"
		 "long the consumer waited per step. docs/DATA.md describes the loader's knobs.",
	.opts = rows,
	.min_args = 1,
	.max_args = 1,
	.args = "DATASET",
};

int ferry_cmd_loader_bench(int argc, char **argv)
{
	struct lb_opts o = {.seconds = 10, .name = "ferry"};
	struct cli_args a = {0};
	int rc = cli_parse(&cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	const char *path = a.argv[0], *name = o.name;
	const char *const *vals = o.knob;
	double seconds = o.seconds, frac = o.frac;
	int json = o.json;
	ferry_ctx *ctx;
	ferry_dataset *ds;
	if (ferry_ctx_create(&ctx) || ferry_dataset_open(ctx, path, &ds)) {
		fprintf(stderr, "ferry loader-bench: %s\n", ferry_last_error());
		return 1;
	}
	struct run peak, fed = {0};
	rc = one_run(ds, vals, seconds, 0, &peak);
	uint64_t step_ns = 0;
	if (!rc && frac > 0 && peak.steps > 0) {
		double steps_per_s = peak.steps / peak.seconds;
		step_ns = (uint64_t)(1e9 / (steps_per_s * frac));
		rc = one_run(ds, vals, seconds, step_ns, &fed);
	}
	if (rc) {
		ferry_dataset_destroy(ds);
		ferry_ctx_destroy(ctx);
		return rc == -2 ? 2 : 1;
	}
	if (json) {
		printf("{\"name\": \"%s\", \"dataset\": \"%s\", \"samples_per_s\": %.1f, \"bytes_per_s\": %.0f, "
		       "\"cpu_cores\": %.3f, \"process_cpu_cores\": %.3f, \"steps\": %.0f, \"reads\": %.0f, "
		       "\"inline_reads\": %.0f, \"wait_share\": %.5f, "
		       "\"wait_p50_us\": %.1f, \"wait_p99_us\": %.1f, \"wait_max_us\": %.1f",
		       name, path, peak.samples_per_s, peak.bytes_per_s, peak.cpu_s / peak.seconds,
		       peak.proc_cpu_s / peak.seconds, peak.steps, peak.reads, peak.inline_reads, peak.wait_share, peak.wait_p50, peak.wait_p99, peak.wait_max);
		if (step_ns)
			printf(", \"step_fraction\": %.2f, \"step_us\": %.1f, \"fed_wait_share\": %.5f, "
			       "\"fed_wait_p99_us\": %.1f, \"fed_samples_per_s\": %.1f",
			       frac, step_ns / 1e3, fed.wait_share, fed.wait_p99, fed.samples_per_s);
		printf("}\n");
	} else {
		printf("TABLE %s samples/s | %.0f | %.1f MiB/s, %.2f CPU cores in the process (pipeline threads %.2f), "
		       "%.0f steps, %.0f of %.0f reads inline\n",
		       name, peak.samples_per_s, peak.bytes_per_s / 1048576.0, peak.proc_cpu_s / peak.seconds,
		       peak.cpu_s / peak.seconds, peak.steps, peak.inline_reads, peak.reads);
		printf("TABLE %s wait p50/p99/max | %.0f/%.0f/%.0f us | consumer not computing (peak run)\n", name,
		       peak.wait_p50, peak.wait_p99, peak.wait_max);
		if (step_ns)
			printf("TABLE %s GPU wait at %.0f%% of peak | %.3f%% | step %.1f us, wait p99 %.0f us, %.0f samples/s\n",
			       name, frac * 100, fed.wait_share * 100, step_ns / 1e3, fed.wait_p99, fed.samples_per_s);
	}
	ferry_dataset_destroy(ds);
	ferry_ctx_destroy(ctx);
	return 0;
}
