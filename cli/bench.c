/*
 * ferry bench: options named like fio's, so that fio users' habits work. Options are data rows
 * read by the CLI's one parser (cli/opts.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "commands.h"
#include "ferry/gpu.h"

struct bench_cli {
	struct bench_job_opts jo;
	uint64_t bs_max;
	int json;
	const char *output;
	const char *directory;
	const char *report;
	int suite, quick, time_based;
	int xall;
};

/* --bs SIZE or a sweep MIN:MAX */
static const char *set_bs(void *opts, const char *val)
{
	static const char *const want = "a size above zero (4k, 1m) or a sweep MIN:MAX with MIN <= MAX (4k:1m), "
					"at most 64g";
	struct bench_cli *c = opts;
	const char *colon = strchr(val, ':');
	uint64_t lo, hi;
	char first[64];
	if (colon) {
		snprintf(first, sizeof(first), "%.*s", (int)(colon - val), val);
		if (cli_parse_size(first, &lo) || cli_parse_size(colon + 1, &hi) || hi < lo)
			return want;
	} else {
		if (cli_parse_size(val, &lo))
			return want;
		hi = lo;
	}
	if (!lo || hi > (64ull << 30))
		return want;
	c->jo.bs = lo;
	c->bs_max = hi;
	return NULL;
}

/* -x MODE: a transfer mode's name, gdsio's number, or all */
static const char *set_xfer(void *opts, const char *val)
{
	struct bench_cli *c = opts;
	if (!strcmp(val, "all")) {
		c->xall = 1;
		c->jo.xmode = BENCH_X_AUTO;
		return NULL;
	}
	for (int m = 1; m < BENCH_X_COUNT; m++)
		if (!strcmp(val, bench_x_names[m]) ||
		    (m != BENCH_X_AUTO && val[0] == '0' + BENCH_X_GDSIO(m) && !val[1])) {
			c->jo.xmode = m;
			return NULL;
		}
	return "a transfer mode: gds, cpu, cpu-gpu, cpu-async-gpu, pagecache-gpu, gds-async, gds-batch, auto, "
	       "gdsio's number 0-6, or all";
}

/* --gpus LIST: devices by number, comma separated, each once (gdsio's -d, for several) */
static const char *set_gpus(void *opts, const char *val)
{
	static const char *const want = "a comma-separated list of GPU numbers, each once (0,1), at most 16";
	struct bench_cli *c = opts;
	const char *p = val;
	c->jo.ngpus = 0;
	while (*p) {
		char *end;
		if (*p < '0' || *p > '9' || c->jo.ngpus == BENCH_MAX_GPUS)
			return want;
		long v = strtol(p, &end, 10);
		if (v > 1024 || (*end && *end != ','))
			return want;
		for (unsigned k = 0; k < c->jo.ngpus; k++)
			if (c->jo.gpus[k] == (int)v)
				return want;
		c->jo.gpus[c->jo.ngpus++] = (int)v;
		p = *end ? end + 1 : end;
		if (*end && !*p)
			return want;
	}
	return c->jo.ngpus ? NULL : want;
}

static const struct cli_choice rw_names[] = {
	{"read", BENCH_READ, 0},	   {"write", BENCH_WRITE, 0},	      {"randread", BENCH_RANDREAD, 0},
	{"randwrite", BENCH_RANDWRITE, 0}, {"randrw", BENCH_RANDRW, 0}, {NULL, 0, 0},
};
static const struct cli_choice zero_one[] = {{"0", 0, 0}, {"1", 1, 0}, {NULL, 0, 0}};
static const struct cli_choice engines[] = {{"psync", 0, 0}, {"io_uring", 0, 0}, {"auto", 0, 0}, {NULL, 0, 0}};
static const struct cli_choice randgens[] = {
	{"tausworthe", BENCH_RANDGEN_MAP, 0}, {"tausworthe64", BENCH_RANDGEN_MAP, 0},
	{"lfsr", BENCH_RANDGEN_PERM, 0},      {NULL, 0, 0},
};
static const struct cli_choice verifies[] = {
	{"xxh3", BENCH_VERIFY_XXH3, 0}, {"crc32c", BENCH_VERIFY_CRC32C, 0},
	{"0", BENCH_VERIFY_NONE, 1},	{"off", BENCH_VERIFY_NONE, 1},	    {NULL, 0, 0},
};
static const struct cli_choice colds[] = {
	{"file", BENCH_COLD_FILE, 0}, {"system", BENCH_COLD_SYSTEM, 0}, {"none", BENCH_COLD_NONE, 0},
	{"1", BENCH_COLD_FILE, 1},    {"0", BENCH_COLD_NONE, 1},	 {NULL, 0, 0},
};
static const struct cli_choice formats[] = {{"normal", 0, 0}, {"json", 1, 0}, {NULL, 0, 0}};
static const struct cli_choice apis[] = {{"queue", 0, 0}, {"pread", 1, 0}, {NULL, 0, 0}};

#define JO(f) offsetof(struct bench_cli, jo.f)
#define CL(f) offsetof(struct bench_cli, f)

static const struct cli_opt rows[] = {
	{.name = "filename", .kind = CLI_STR, .off = JO(filename), .arg = "FILE",
	 .help = "file to read or write (created for reads when --size is given)"},
	{.name = "directory", .kind = CLI_STR, .off = CL(directory), .arg = "DIR",
	 .help = "directory for --filename (relative names) or --suite's file"},
	{.name = "name", .kind = CLI_STR, .off = JO(name), .arg = "NAME",
	 .help = "job name in the output (default: the --rw value)"},
	{.name = "rw", .kind = CLI_CHOICE, .off = JO(rw), .arg = "MODE", .choices = rw_names,
	 .help = "read, write, randread, randwrite or randrw (default read)"},
	{.name = "rwmixread", .kind = CLI_UINT, .off = JO(rwmixread), .arg = "PCT", .max = 100,
	 .help = "percent of randrw I/Os that read (default 50)"},
	{.name = "bs", .kind = CLI_FUNC, .set = set_bs, .arg = "SIZE",
	 .help = "I/O size, or MIN:MAX for a sweep doubling from MIN (default 4k)"},
	{.name = "size", .kind = CLI_SIZE, .off = JO(size), .arg = "SIZE", .min = 1,
	 .help = "bytes of the file to use (default: the whole existing file)"},
	{.name = "offset", .kind = CLI_SIZE, .off = JO(offset), .arg = "SIZE", .help = "start of the region used (default 0)"},
	{.name = "offset_increment", .kind = CLI_SIZE, .off = JO(offset_increment), .arg = "SIZE",
	 .help = "job k's region starts at --offset + k x SIZE, as fio's (default 0: every job over the same region; "
		 "needs --size)"},
	{.name = "numjobs", .kind = CLI_UINT, .off = JO(numjobs), .arg = "N", .min = 1, .max = 65536,
	 .help = "threads, each with its own queue over the region (each its own with --offset_increment; default 1)"},
	{.name = "end_fsync", .kind = CLI_CHOICE, .off = JO(end_fsync), .arg = "0|1", .choices = zero_one,
	 .help = "1: each job fsyncs the file once its I/O is done, inside its timed run (fio's)"},
	{.name = "iodepth", .kind = CLI_UINT, .off = JO(iodepth), .arg = "N", .min = 1, .max = 65536,
	 .help = "I/Os each job keeps in flight (default 1)"},
	{.name = "iodepth_batch_submit", .kind = CLI_UINT, .off = JO(iodepth_batch_submit), .arg = "N", .max = 65536,
	 .help = "submit to the kernel each N I/Os queued (default 1, as fio's; 0: all queued at once, in the same "
		 "call as the wait for completions)"},
	{.name = "direct", .kind = CLI_CHOICE, .off = JO(direct), .arg = "0|1", .choices = zero_one,
	 .help = "1: O_DIRECT, bypassing the page cache (default 0)"},
	{.name = "ioengine", .kind = CLI_STR, .off = JO(ioengine), .arg = "ENGINE", .choices = engines,
	 .help = "psync, io_uring or auto (default auto: io_uring where it works)"},
	{.name = "runtime", .kind = CLI_TIME, .off = JO(runtime), .arg = "TIME",
	 .help = "run this long, looping over the region (seconds, or 500ms, 2m)"},
	{.name = "time_based", .kind = CLI_FLAG, .off = CL(time_based),
	 .help = "accepted for fio habits; --runtime is always time based"},
	{.name = "io_size", .kind = CLI_SIZE, .off = JO(io_size), .arg = "SIZE", .min = 1,
	 .help = "bytes each job transfers (default: one pass over the region)"},
	{.name = "randseed", .kind = CLI_U64, .off = JO(randseed), .arg = "N",
	 .help = "seed of random offsets and of the --verify pattern"},
	{.name = "random_generator", .kind = CLI_CHOICE, .off = JO(randgen), .arg = "GEN", .choices = randgens,
	 .help = "random offsets as fio's: tausworthe (default: uniform picks; a block already done this pass is "
		 "replaced by the next one not done) or lfsr (a permutation: each block once per pass, no collisions); "
		 "tausworthe64 is tausworthe"},
	{.name = "norandommap", .kind = CLI_FLAG, .off = JO(norandommap),
	 .help = "random offsets without the map of blocks done: uniform picks, some blocks twice, some never, no "
		 "passes (fio's --norandommap)"},
	{.name = "verify", .kind = CLI_CHOICE, .off = JO(verify), .arg = "ALGO", .choices = verifies,
	 .help = "xxh3 or crc32c: writes checksummed blocks, checks every block read"},
	{.name = "cold", .kind = CLI_CHOICE, .off = JO(cold), .arg = "file|system", .choices = colds,
	 .flags = CLI_OPTIONAL, .implicit = "file",
	 .help = "drop the file's cached pages first (system: all caches, as root)"},
	{.name = "output-format", .kind = CLI_CHOICE, .off = CL(json), .arg = "FMT", .choices = formats,
	 .help = "normal or json (fio's schema)"},
	{.name = "output", .kind = CLI_STR, .off = CL(output), .arg = "FILE",
	 .help = "write the results to FILE instead of standard output"},
	{.name = "xfer", .letter = 'x', .kind = CLI_FUNC, .set = set_xfer, .arg = "MODE",
	 .help = "to/from GPU memory (gdsio's -x): gds, cpu, cpu-gpu, cpu-async-gpu, pagecache-gpu, gds-async, "
		 "gds-batch, auto (or gdsio's 0-6), or all"},
	{.name = "gpu", .kind = CLI_INT, .off = JO(gpu), .arg = "N", .max = 1024, .help = "with -x: the GPU (default 0)"},
	{.name = "gpus", .kind = CLI_FUNC, .set = set_gpus, .arg = "LIST",
	 .help = "several GPUs at once from one process (gdsio's -d): --numjobs jobs per GPU, each GPU's figure, "
		 "the total and the pinned ceilings of one GPU and of all at once (default -x auto)"},
	{.name = "api", .kind = CLI_CHOICE, .off = JO(api_pread), .arg = "queue|pread", .choices = apis,
	 .help = "queue: each job keeps --iodepth I/Os on its own ring (default); pread: each I/O is one "
		 "ferry_pread/pwrite, split over the worker threads"},
	{.name = "raw", .kind = CLI_FLAG, .off = JO(raw),
	 .help = "read a ferry compressed file's bytes as stored (default: reads of one go through\n"
		 "ferry_cz_pread, offsets in its uncompressed bytes, one call per I/O over the worker threads,\n"
		 "reporting the ratio, the effective and compressed rates and where it decoded)"},
	{.name = "suite", .kind = CLI_FLAG, .off = CL(suite), .help = "run the storage-tuning demonstrations (see below)"},
	{.name = "quick", .kind = CLI_FLAG, .off = CL(quick),
	 .help = "with --suite: one second per case (default 4; --runtime sets it)"},
	{.name = "report", .kind = CLI_STR, .off = CL(report), .arg = "FILE",
	 .help = "with --suite: write a self-contained HTML report"},
	{.name = "quiet", .kind = CLI_FLAG, .off = JO(quiet),
	 .help = "with --suite: no progress bar and no per-case lines, the table and report only"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "bench",
	.synopsis = "ferry bench --filename FILE [options]\n"
		    "ferry bench --suite [--filename FILE | --directory DIR] [--size SIZE] [--report FILE.html] [--quick]",
	.about = "Measures reads and writes of a file the way fio does: each job is a thread keeping\n"
		 "--iodepth I/Os of --bs bytes in flight on its own queue.",
	.opts = rows,
	.footer = "Sizes take fio's suffixes (4k, 1m, 2g, 4KiB; powers of 1024). Usage errors exit 2,\n"
		  "failures (I/O errors, verification errors) exit 1. docs/BENCH.md describes the output.",
	.max_args = 0,
};

/* Opened only once the options are known good, so that a usage error leaves no empty file. */
static int open_output(const struct bench_cli *c, FILE **out)
{
	if (c->output && !(*out = fopen(c->output, "w"))) {
		*out = stdout;
		fprintf(stderr, "ferry bench: cannot write --output %s: %s\n", c->output, strerror(errno));
		return 1;
	}
	return 0;
}

struct cannot_list {
	struct bench_result *const *res;
	unsigned n;
};

/* -x: the ceilings, and the modes that could not run, with why, at the top level */
static void json_cannot(struct bench_json *j, void *arg)
{
	const struct cannot_list *l = arg;
	if (l->n) {
		bench_json_dbl(j, "htod_ceiling_bytes", l->res[0]->htod);
		bench_json_dbl(j, "dtoh_ceiling_bytes", l->res[0]->dtoh);
	}
	bench_json_arr(j, "xfer_cannot_run");
	for (unsigned i = 0; i < l->n; i++) {
		if (!l->res[i]->cannot[0])
			continue;
		bench_json_obj(j, NULL);
		bench_json_str(j, "mode", bench_x_names[l->res[i]->opts.xmode]);
		bench_json_str(j, "reason", l->res[i]->cannot);
		bench_json_close_obj(j);
	}
	bench_json_close_arr(j);
	if (l->n && l->res[0]->opts.ngpus)
		bench_json_gpus(j, l->res[0]);
}

static int run_suite(struct bench_cli *c, const struct cli_args *a, FILE **out)
{
	static const char *const allowed[] = {"filename", "directory", "size", "report", "output-format",
					      "output", "quick", "suite", "runtime", "quiet"};
	for (size_t k = 0; rows[k].name; k++) {
		if (!(a->seen & (1ull << k)))
			continue;
		int ok = 0;
		for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
			ok |= !strcmp(rows[k].name, allowed[i]);
		if (!ok)
			return cli_usage_error(&cmd, NULL, "--%s does not apply to --suite, which chooses its own workloads",
					       rows[k].name);
	}
	if (c->jo.filename && c->directory)
		return cli_usage_error(&cmd, NULL, "--suite takes --filename or --directory, not both");
	if (open_output(c, out))
		return 1;
	struct bench_suite_opts so = {
		.filename = c->jo.filename,
		.directory = c->directory,
		.size = c->jo.size,
		.report = c->report,
		.json = c->json,
		.quick = c->quick,
		.runtime = c->jo.runtime,
		.quiet = c->jo.quiet,
		.out = *out,
	};
	return bench_suite(&so);
}

int ferry_cmd_bench(int argc, char **argv)
{
	struct bench_cli c = {
		.jo = {
			.rw = BENCH_READ,
			.rwmixread = 50,
			.bs = 4096,
			.numjobs = 1,
			.iodepth = 1,
			.iodepth_batch_submit = 1, /* fio's; batches ran 0.90-0.93x fio, this 0.95-0.98x (docs/CONFIG.md) */
			.ioengine = "auto",
			.randseed = 0x6665727279ull, /* "ferry": fixed, so that runs repeat */
		},
	};
	c.bs_max = c.jo.bs;
	struct cli_args a = {0};
	int rc = cli_parse(&cmd, &c, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	if ((c.report || c.quick || c.jo.quiet) && !c.suite)
		return cli_usage_error(&cmd, NULL, "--%s goes with --suite",
				       c.report ? "report" : c.quick ? "quick" : "quiet");

	FILE *out = stdout;
	if (c.suite) {
		rc = run_suite(&c, &a, &out);
		goto done;
	}

	struct bench_job_opts *jo = &c.jo;
	char path[4096];
	rc = 2;
	if (!jo->filename) {
		rc = cli_usage_error(&cmd, NULL, "--filename is required (the file to read or write)");
		goto done;
	}
	if (c.directory && jo->filename[0] != '/') {
		snprintf(path, sizeof(path), "%s/%s", c.directory, jo->filename);
		jo->filename = path;
	}
	if (c.time_based && !(jo->runtime > 0)) {
		rc = cli_usage_error(&cmd, NULL, "--time_based needs --runtime");
		goto done;
	}
	if (jo->runtime > 0 && jo->io_size) {
		rc = cli_usage_error(&cmd, NULL, "give --runtime or --io_size, not both");
		goto done;
	}
	if (jo->offset_increment && !cli_given(&cmd, &a, "size")) {
		rc = cli_usage_error(&cmd, NULL, "--offset_increment needs --size (each job's region)");
		goto done;
	}
	if (jo->io_size && jo->io_size < jo->bs) {
		rc = cli_usage_error(&cmd, NULL, "--io_size %" PRIu64 " is smaller than --bs %" PRIu64, jo->io_size, jo->bs);
		goto done;
	}
	if (jo->verify) {
		if (c.bs_max != jo->bs) {
			rc = cli_usage_error(&cmd, NULL, "--verify needs one --bs, not a sweep (blocks are checked at the size they were written)");
			goto done;
		}
		if (jo->bs < BENCH_VERIFY_HEADER) {
			rc = cli_usage_error(&cmd, NULL, "--verify needs --bs of at least %d bytes (the block header); got %" PRIu64,
				 BENCH_VERIFY_HEADER, jo->bs);
			goto done;
		}
		if (jo->offset % jo->bs && bench_rw_reads(jo->rw) && bench_rw_writes(jo->rw)) {
			rc = cli_usage_error(&cmd, NULL, "--verify with --rw randrw needs --offset to be a multiple of --bs");
			goto done;
		}
	}
	/* O_DIRECT transfers must be whole logical blocks (512 bytes at least; the file's own block
	 * size is checked when it is opened), as fio refuses too */
	if (jo->direct == 1 && (jo->bs % 512 || c.bs_max % 512)) {
		rc = cli_usage_error(&cmd, NULL, "--bs %" PRIu64 " is not a multiple of 512 bytes, the smallest logical "
			 "block size that --direct 1 (O_DIRECT) needs", jo->bs % 512 ? jo->bs : c.bs_max);
		goto done;
	}
	if (jo->xmode != BENCH_X_NONE && jo->verify) {
		rc = cli_usage_error(&cmd, NULL, "--verify checks host memory; it does not go with -x");
		goto done;
	}
	/* like gdsio, -x opens files for O_DIRECT; without --direct, the library's direct=auto also
	 * reads page-cache-resident data through the cache */
	if (jo->xmode != BENCH_X_NONE && !cli_given(&cmd, &a, "direct"))
		jo->direct = BENCH_DIRECT_AUTO;
	if (cli_given(&cmd, &a, "gpu") && jo->xmode == BENCH_X_NONE) {
		rc = cli_usage_error(&cmd, NULL, "--gpu goes with -x");
		goto done;
	}
	if (jo->ngpus) {
		if (cli_given(&cmd, &a, "gpu")) {
			rc = cli_usage_error(&cmd, NULL, "give --gpu or --gpus, not both");
			goto done;
		}
		if (c.xall || c.bs_max != jo->bs) {
			rc = cli_usage_error(&cmd, NULL, "--gpus takes one transfer mode and one --bs (not -x all or a sweep)");
			goto done;
		}
		if (jo->xmode == BENCH_X_NONE) {
			jo->xmode = BENCH_X_AUTO;
			if (!cli_given(&cmd, &a, "direct"))
				jo->direct = BENCH_DIRECT_AUTO;
		}
		if (!bench_x_on_gpu(jo->xmode)) {
			rc = cli_usage_error(&cmd, NULL, "--gpus needs a transfer mode to GPU memory, not -x %s",
					     bench_x_names[jo->xmode]);
			goto done;
		}
	}
	if (c.xall && c.bs_max != jo->bs) {
		rc = cli_usage_error(&cmd, NULL, "-x all takes one --bs, not a sweep");
		goto done;
	}
	if (!cli_given(&cmd, &a, "name"))
		jo->name = bench_rw_name(jo->rw);
	if (open_output(&c, &out)) {
		rc = 1;
		goto done;
	}

	struct bench_result *res[64];
	unsigned n = 0, ran = 0;
	double htod = 0, dtoh = 0;
	char gpu_why[512] = "";
	rc = 0;
	struct bench_gpu_part parts[BENCH_MAX_GPUS] = {{0}};
	double htod_all = 0, dtoh_all = 0;
	if (jo->ngpus) {
		/* each listed device must exist before anything runs: a missing one is named, with the
		 * devices this process can see */
		int count = ferry_gpu_count();
		if (count < 0) {
			fprintf(stderr, "ferry bench: --gpus needs a GPU: %s\n", ferry_last_error());
			rc = 1;
			goto done;
		}
		for (unsigned g = 0; g < jo->ngpus; g++)
			if (jo->gpus[g] >= count) {
				const char *vis = getenv("CUDA_VISIBLE_DEVICES");
				fprintf(stderr, "ferry bench: --gpus: GPU %d does not exist: this process sees %d GPU%s, "
						"numbered from 0 (CUDA_VISIBLE_DEVICES %s%s)\n",
					jo->gpus[g], count, count == 1 ? "" : "s", vis ? "is " : "is unset", vis ? vis : "");
				rc = 1;
				goto done;
			}
		for (unsigned g = 0; g < jo->ngpus && !rc; g++)
			if (ferry_gpu_copy_ceiling(jo->gpus[g], 256u << 20, 5, &parts[g].htod, &parts[g].dtoh) < 0)
				rc = 1;
		if (!rc && ferry_gpu_copy_ceiling_all(jo->gpus, jo->ngpus, 256u << 20, 5, &htod_all, &dtoh_all) < 0)
			rc = 1;
		if (rc) {
			fprintf(stderr, "ferry bench: measuring the pinned copy ceilings of --gpus failed: %s\n",
				ferry_last_error());
			goto done;
		}
		jo->numjobs *= jo->ngpus;
	}
	if (!jo->ngpus && jo->xmode != BENCH_X_NONE && (c.xall || bench_x_on_gpu(jo->xmode))) {
		/* the ceilings every GPU figure is a fraction of, measured in this run */
		int err = ferry_gpu_copy_ceiling(jo->gpu, 256u << 20, 5, &htod, &dtoh);
		if (err < 0) {
			snprintf(gpu_why, sizeof(gpu_why), "%s", ferry_last_error());
			if (!c.xall) {
				fprintf(stderr, "ferry bench: -x %s needs a GPU: %s\n", bench_x_names[jo->xmode], gpu_why);
				rc = 1;
				goto done;
			}
		}
	}
	/* -x all: storage to host first (the storage ceiling), then every mode to the GPU */
	static const int all_modes[] = {BENCH_X(1), BENCH_X(2), BENCH_X(3), BENCH_X(4), BENCH_X(0),
					BENCH_X(5), BENCH_X(6), BENCH_X_AUTO};
	unsigned nmodes = c.xall ? sizeof(all_modes) / sizeof(all_modes[0]) : 1;
	for (uint64_t bs = jo->bs; bs <= c.bs_max && n < 64; bs *= 2) {
		for (unsigned m = 0; m < nmodes && n < 64; m++) {
			struct bench_job_opts one = *jo;
			one.bs = bs;
			if (c.xall)
				one.xmode = all_modes[m];
			res[n] = calloc(1, sizeof(*res[n]));
			if (!res[n]) {
				fprintf(stderr, "ferry bench: out of memory\n");
				rc = 1;
				break;
			}
			struct bench_result *r = res[n++];
			r->htod = htod;
			r->dtoh = dtoh;
			if (c.xall && bench_x_on_gpu(one.xmode) && gpu_why[0]) {
				r->opts = one;
				snprintf(r->cannot, sizeof(r->cannot), "no GPU: %s", gpu_why);
				continue;
			}
			if (c.xall) {
				bench_error_sink = r->cannot;
				bench_error_sink_len = sizeof(r->cannot);
			}
			int failed = bench_run(&one, r);
			bench_error_sink = NULL;
			r->htod = jo->ngpus ? htod_all : htod;
			r->dtoh = jo->ngpus ? dtoh_all : dtoh;
			for (unsigned g = 0; g < jo->ngpus; g++) {
				r->part[g].htod = parts[g].htod;
				r->part[g].dtoh = parts[g].dtoh;
			}
			r->htod_all = htod_all;
			r->dtoh_all = dtoh_all;
			if (failed && !c.xall) {
				rc = 1;
				break;
			}
			ran += !failed;
		}
		if (rc)
			break;
	}
	if (c.xall && !ran) {
		fprintf(stderr, "ferry bench: no transfer mode could run here\n");
		rc = 1;
	}
	if (!rc) {
		struct bench_result *ok[64];
		unsigned nok = 0;
		for (unsigned i = 0; i < n; i++)
			if (!res[i]->cannot[0])
				ok[nok++] = res[i];
		if (c.json)
			bench_print_json(out, ok, nok, jo->xmode != BENCH_X_NONE ? json_cannot : NULL, &(struct cannot_list){res, n});
		else
			bench_print_normal(out, ok, nok);
		if (!c.json && jo->ngpus && nok)
			bench_print_gpus(out, ok[0]);
		else if (!c.json && jo->xmode != BENCH_X_NONE)
			bench_print_xfer(out, res, n);
	}
	for (unsigned i = 0; i < n; i++)
		free(res[i]);
done:
	if (out != stdout && fclose(out) && !rc) {
		fprintf(stderr, "ferry bench: writing --output %s failed: %s\n", c.output, strerror(errno));
		rc = 1;
	}
	return rc;
}
