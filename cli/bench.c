/*
 * ferry bench: options named like fio's, so that fio users' habits work. Options are data rows
 * (as in fio's parse.h); both --opt=value and --opt value are accepted.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "commands.h"
#include "ferry/gpu.h"

enum opt_type {
	OPT_STR,
	OPT_SIZE,    /* bytes, fio suffixes */
	OPT_SIZE0,   /* bytes, 0 allowed */
	OPT_BS,      /* size or min:max sweep */
	OPT_UINT,    /* positive integer */
	OPT_UINT0,   /* 0 to 65536 */
	OPT_PERCENT, /* 0..100 */
	OPT_U64,     /* any unsigned 64-bit integer */
	OPT_01,
	OPT_TIME,    /* seconds, or with s/ms/m/h */
	OPT_RW,
	OPT_ENGINE,
	OPT_VERIFY,
	OPT_FORMAT,
	OPT_COLD,    /* value optional: --cold or --cold=file|system */
	OPT_FLAG,    /* no value (or =0/=1) */
	OPT_XMODE,   /* -x: a transfer mode's name or gdsio number, or all */
	OPT_API,
	OPT_INT0,    /* 0..1024 */
	OPT_RANDGEN, /* tausworthe, tausworthe64 or lfsr */
};

struct bench_cli {
	struct bench_job_opts jo;
	uint64_t bs_max;
	int json;
	const char *output;
	const char *directory;
	const char *report;
	int suite, quick, help, time_based;
	int xall;
	uint64_t seen; /* bit k: opts[k] was given */
};

struct opt {
	const char *name;
	enum opt_type type;
	size_t off;
	const char *arg;
	const char *help;
};

#define JO(f) offsetof(struct bench_cli, jo.f)
#define CL(f) offsetof(struct bench_cli, f)

static const struct opt opts[] = {
	{"filename", OPT_STR, JO(filename), "FILE", "file to read or write (created for reads when --size is given)"},
	{"directory", OPT_STR, CL(directory), "DIR", "directory for --filename (relative names) or --suite's file"},
	{"name", OPT_STR, JO(name), "NAME", "job name in the output (default: the --rw value)"},
	{"rw", OPT_RW, JO(rw), "MODE", "read, write, randread, randwrite or randrw (default read)"},
	{"rwmixread", OPT_PERCENT, JO(rwmixread), "PCT", "percent of randrw I/Os that read (default 50)"},
	{"bs", OPT_BS, JO(bs), "SIZE", "I/O size, or MIN:MAX for a sweep doubling from MIN (default 4k)"},
	{"size", OPT_SIZE, JO(size), "SIZE", "bytes of the file to use (default: the whole existing file)"},
	{"offset", OPT_SIZE0, JO(offset), "SIZE", "start of the region used (default 0)"},
	{"offset_increment", OPT_SIZE0, JO(offset_increment), "SIZE", "job k's region starts at --offset + k x SIZE, as fio's (default 0: every job over the same region; needs --size)"},
	{"numjobs", OPT_UINT, JO(numjobs), "N", "threads, each with its own queue over the region (each its own with --offset_increment; default 1)"},
	{"end_fsync", OPT_01, JO(end_fsync), "0|1", "1: each job fsyncs the file once its I/O is done, inside its timed run (fio's)"},
	{"iodepth", OPT_UINT, JO(iodepth), "N", "I/Os each job keeps in flight (default 1)"},
	{"iodepth_batch_submit", OPT_UINT0, JO(iodepth_batch_submit), "N", "submit to the kernel each N I/Os queued (default 1, as fio's; 0: all queued at once, in the same call as the wait for completions)"},
	{"direct", OPT_01, JO(direct), "0|1", "1: O_DIRECT, bypassing the page cache (default 0)"},
	{"ioengine", OPT_ENGINE, JO(ioengine), "ENGINE", "psync, io_uring or auto (default auto: io_uring where it works)"},
	{"runtime", OPT_TIME, JO(runtime), "TIME", "run this long, looping over the region (seconds, or 500ms, 2m)"},
	{"time_based", OPT_FLAG, CL(time_based), NULL, "accepted for fio habits; --runtime is always time based"},
	{"io_size", OPT_SIZE, JO(io_size), "SIZE", "bytes each job transfers (default: one pass over the region)"},
	{"randseed", OPT_U64, JO(randseed), "N", "seed of random offsets and of the --verify pattern"},
	{"random_generator", OPT_RANDGEN, JO(randgen), "GEN", "random offsets as fio's: tausworthe (default: uniform picks; a block already done this pass is replaced by the next one not done) or lfsr (a permutation: each block once per pass, no collisions); tausworthe64 is tausworthe"},
	{"norandommap", OPT_FLAG, JO(norandommap), NULL, "random offsets without the map of blocks done: uniform picks, some blocks twice, some never, no passes (fio's --norandommap)"},
	{"verify", OPT_VERIFY, JO(verify), "ALGO", "xxh3 or crc32c: writes checksummed blocks, checks every block read"},
	{"cold", OPT_COLD, JO(cold), "[=file|system]", "drop the file's cached pages first (system: all caches, as root)"},
	{"output-format", OPT_FORMAT, CL(json), "FMT", "normal or json (fio's schema)"},
	{"output", OPT_STR, CL(output), "FILE", "write the results to FILE instead of standard output"},
	{"xfer", OPT_XMODE, JO(xmode), "MODE", "-x MODE: to/from GPU memory: gds, cpu, cpu-gpu, cpu-async-gpu, pagecache-gpu, gds-async, gds-batch, auto (or gdsio's 0-6), or all"},
	{"gpu", OPT_INT0, JO(gpu), "N", "with -x: the GPU (default 0)"},
	{"api", OPT_API, JO(api_pread), "queue|pread", "queue: each job keeps --iodepth I/Os on its own ring (default); pread: each I/O is one ferry_pread/pwrite, split over the worker threads"},
	{"suite", OPT_FLAG, CL(suite), NULL, "run the storage-tuning demonstrations (see below)"},
	{"quick", OPT_FLAG, CL(quick), NULL, "with --suite: one second per case (default 4; --runtime sets it)"},
	{"report", OPT_STR, CL(report), "FILE", "with --suite: write a self-contained HTML report"},
	{"help", OPT_FLAG, CL(help), NULL, "print this help"},
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: ferry bench --filename FILE [options]\n"
		     "       ferry bench --suite [--filename FILE | --directory DIR] [--size SIZE] [--report FILE.html] [--quick]\n\n"
		     "Measures reads and writes of a file the way fio does: each job is a thread keeping\n"
		     "--iodepth I/Os of --bs bytes in flight on its own queue.\n\noptions:\n");
	for (size_t i = 0; i < NOPTS; i++) {
		char left[64];
		snprintf(left, sizeof(left), "--%s%s%s", opts[i].name,
			 opts[i].arg && opts[i].arg[0] != '[' ? " " : "", opts[i].arg ? opts[i].arg : "");
		fprintf(out, "  %-26s %s\n", left, opts[i].help);
	}
	fprintf(out, "\nSizes take fio's suffixes (4k, 1m, 2g, 4KiB; powers of 1024). Usage errors exit 2,\n"
		     "failures (I/O errors, verification errors) exit 1. docs/BENCH.md describes the output.\n");
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "ferry bench: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (see 'ferry bench --help')\n");
	va_end(ap);
	return 2;
}

/* fio's size syntax: 4096, 4k, 4K, 4KiB, 4kb, 1.5g; powers of 1024 (fio's default kb_base). */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!*s || *s == '-' || *s == '+')
		return -1;
	double v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -1;
	double mul = 1;
	if (*end) {
		const char *units = "kmgtp";
		const char *u = strchr(units, (char)(*end | 0x20));
		if (u) {
			mul = pow(1024, (double)(u - units + 1));
			end++;
			if (*end == 'i' || *end == 'I')
				end++;
			if (*end == 'b' || *end == 'B')
				end++;
		} else if (*end == 'b' || *end == 'B') {
			end++;
		}
	}
	if (*end)
		return -1;
	double b = v * mul;
	if (b >= 18446744073709551615.0 || b != floor(b))
		return -1;
	*out = (uint64_t)b;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	if (!*s || *s == '-' || *s == '+')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

static int parse_time(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v > 0) || isinf(v))
		return -1;
	if (!*end || !strcmp(end, "s"))
		*out = v;
	else if (!strcmp(end, "ms"))
		*out = v / 1e3;
	else if (!strcmp(end, "us"))
		*out = v / 1e6;
	else if (!strcmp(end, "m"))
		*out = v * 60;
	else if (!strcmp(end, "h"))
		*out = v * 3600;
	else
		return -1;
	return 0;
}

static int set_opt(struct bench_cli *c, const struct opt *o, const char *val)
{
	void *p = (char *)c + o->off;
	uint64_t u;
	switch (o->type) {
	case OPT_STR:
		if (!*val)
			return bad("--%s needs a non-empty value", o->name);
		*(const char **)p = val;
		return 0;
	case OPT_SIZE:
	case OPT_SIZE0:
		if (parse_size(val, &u) || (o->type == OPT_SIZE && !u))
			return bad("--%s expects a size%s such as 4k, 64m or 2g; got '%s'", o->name,
				   o->type == OPT_SIZE ? " above zero" : "", val);
		*(uint64_t *)p = u;
		return 0;
	case OPT_BS: {
		const char *colon = strchr(val, ':');
		uint64_t lo, hi;
		char first[64];
		if (colon) {
			snprintf(first, sizeof(first), "%.*s", (int)(colon - val), val);
			if (parse_size(first, &lo) || parse_size(colon + 1, &hi) || !lo || hi < lo)
				return bad("--bs expects a size (4k) or a sweep MIN:MAX with MIN <= MAX (4k:1m); got '%s'",
					   val);
		} else {
			if (parse_size(val, &lo) || !lo)
				return bad("--bs expects a size above zero (4k, 1m) or a sweep MIN:MAX; got '%s'", val);
			hi = lo;
		}
		if (hi > (64ull << 30))
			return bad("--bs expects at most 64g; got '%s'", val);
		c->jo.bs = lo;
		c->bs_max = hi;
		return 0;
	}
	case OPT_UINT:
	case OPT_UINT0:
		if (parse_u64(val, &u) || (!u && o->type == OPT_UINT) || u > 65536)
			return bad("--%s expects a whole number from %d to 65536; got '%s'", o->name,
				   o->type == OPT_UINT, val);
		*(unsigned *)p = (unsigned)u;
		return 0;
	case OPT_PERCENT:
		if (parse_u64(val, &u) || u > 100)
			return bad("--%s expects a percentage from 0 to 100; got '%s'", o->name, val);
		*(unsigned *)p = (unsigned)u;
		return 0;
	case OPT_U64:
		if (parse_u64(val, &u))
			return bad("--%s expects a whole number; got '%s'", o->name, val);
		*(uint64_t *)p = u;
		return 0;
	case OPT_01:
	case OPT_FLAG:
		if (strcmp(val, "0") && strcmp(val, "1"))
			return bad("--%s expects 0 or 1; got '%s'", o->name, val);
		*(int *)p = val[0] == '1';
		return 0;
	case OPT_TIME:
		if (parse_time(val, (double *)p))
			return bad("--%s expects a duration above zero in seconds (10, 500ms, 2m); got '%s'",
				   o->name, val);
		return 0;
	case OPT_RW:
		for (int rw = BENCH_READ; rw <= BENCH_RANDRW; rw++)
			if (!strcmp(val, bench_rw_name(rw))) {
				*(enum bench_rw *)p = rw;
				return 0;
			}
		return bad("--rw expects read, write, randread, randwrite or randrw; got '%s'", val);
	case OPT_ENGINE:
		if (strcmp(val, "psync") && strcmp(val, "io_uring") && strcmp(val, "auto"))
			return bad("--ioengine expects psync, io_uring or auto; got '%s'", val);
		*(const char **)p = val;
		return 0;
	case OPT_VERIFY:
		if (!strcmp(val, "xxh3"))
			*(enum bench_verify *)p = BENCH_VERIFY_XXH3;
		else if (!strcmp(val, "crc32c"))
			*(enum bench_verify *)p = BENCH_VERIFY_CRC32C;
		else if (!strcmp(val, "0") || !strcmp(val, "off"))
			*(enum bench_verify *)p = BENCH_VERIFY_NONE;
		else
			return bad("--verify expects xxh3 or crc32c; got '%s'", val);
		return 0;
	case OPT_FORMAT:
		if (strcmp(val, "normal") && strcmp(val, "json"))
			return bad("--output-format expects normal or json; got '%s'", val);
		*(int *)p = !strcmp(val, "json");
		return 0;
	case OPT_XMODE:
		if (!strcmp(val, "all")) {
			c->xall = 1;
			*(int *)p = BENCH_X_AUTO;
			return 0;
		}
		for (int m = 1; m < BENCH_X_COUNT; m++)
			if (!strcmp(val, bench_x_names[m]) ||
			    (m != BENCH_X_AUTO && val[0] == '0' + BENCH_X_GDSIO(m) && !val[1])) {
				*(int *)p = m;
				return 0;
			}
		return bad("-x expects a transfer mode: gds, cpu, cpu-gpu, cpu-async-gpu, pagecache-gpu, gds-async, "
			   "gds-batch, auto, gdsio's number 0-6, or all; got '%s'", val);
	case OPT_API:
		if (strcmp(val, "queue") && strcmp(val, "pread"))
			return bad("--api expects queue or pread; got '%s'", val);
		*(int *)p = !strcmp(val, "pread");
		return 0;
	case OPT_INT0:
		if (parse_u64(val, &u) || u > 1024)
			return bad("--%s expects a whole number from 0 to 1024; got '%s'", o->name, val);
		*(int *)p = (int)u;
		return 0;
	case OPT_RANDGEN:
		if (!strcmp(val, "tausworthe") || !strcmp(val, "tausworthe64"))
			*(enum bench_randgen *)p = BENCH_RANDGEN_MAP;
		else if (!strcmp(val, "lfsr"))
			*(enum bench_randgen *)p = BENCH_RANDGEN_PERM;
		else
			return bad("--random_generator expects tausworthe, tausworthe64 or lfsr; got '%s'", val);
		return 0;
	case OPT_COLD:
		if (!strcmp(val, "1") || !strcmp(val, "file"))
			*(enum bench_cold *)p = BENCH_COLD_FILE;
		else if (!strcmp(val, "system"))
			*(enum bench_cold *)p = BENCH_COLD_SYSTEM;
		else if (!strcmp(val, "0") || !strcmp(val, "none"))
			*(enum bench_cold *)p = BENCH_COLD_NONE;
		else
			return bad("--cold expects file or system (or no value); got '%s'", val);
		return 0;
	}
	return 2;
}

static const struct opt *find_opt(const char *name)
{
	for (size_t k = 0; k < NOPTS; k++)
		if (!strcmp(opts[k].name, name))
			return &opts[k];
	return NULL;
}

static int parse(struct bench_cli *c, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-x"))
			a = "--xfer"; /* gdsio's spelling */
		else if (!strncmp(a, "-x", 2) && a[2]) {
			int rc = set_opt(c, &opts[0] + (size_t)(find_opt("xfer") - opts), a + 2);
			if (rc)
				return rc;
			continue;
		}
		if (strncmp(a, "--", 2) || !a[2])
			return bad("unexpected argument '%s'; options start with --", a);
		const char *eq = strchr(a, '=');
		size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
		const struct opt *o = NULL;
		for (size_t k = 0; k < NOPTS; k++)
			if (strlen(opts[k].name) == nlen && !strncmp(opts[k].name, a + 2, nlen))
				o = &opts[k];
		if (!o)
			return bad("unknown option '%.*s'", (int)(nlen + 2), a);
		c->seen |= 1ull << (o - opts);
		const char *val = eq ? eq + 1 : NULL;
		if (!val && o->type == OPT_FLAG)
			val = "1";
		else if (!val && o->type == OPT_COLD) {
			/* No positional arguments exist, so a following value word is unambiguous. */
			const char *next = i + 1 < argc ? argv[i + 1] : "";
			if (!strcmp(next, "file") || !strcmp(next, "system") || !strcmp(next, "none"))
				val = argv[++i];
			else
				val = "file";
		}
		else if (!val) {
			if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))
				return bad("--%s needs a value (%s)", o->name, o->arg);
			val = argv[++i];
		}
		int rc = set_opt(c, o, val);
		if (rc)
			return rc;
	}
	return 0;
}

static int seen(const struct bench_cli *c, const char *name)
{
	for (size_t k = 0; k < NOPTS; k++)
		if (!strcmp(opts[k].name, name))
			return !!(c->seen & (1ull << k));
	return 0;
}

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
}

static int run_suite(struct bench_cli *c, FILE **out)
{
	static const char *const allowed[] = {"filename", "directory", "size", "report", "output-format",
					      "output", "quick", "suite", "runtime"};
	for (size_t k = 0; k < NOPTS; k++) {
		if (!(c->seen & (1ull << k)))
			continue;
		int ok = 0;
		for (size_t a = 0; a < sizeof(allowed) / sizeof(allowed[0]); a++)
			ok |= !strcmp(opts[k].name, allowed[a]);
		if (!ok)
			return bad("--%s does not apply to --suite, which chooses its own workloads", opts[k].name);
	}
	if (c->jo.filename && c->directory)
		return bad("--suite takes --filename or --directory, not both");
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
			.iodepth_batch_submit = 1, /* fio's default; docs/PERFORMANCE.md, fifth session */
			.ioengine = "auto",
			.randseed = 0x6665727279ull, /* "ferry": fixed, so that runs repeat */
		},
	};
	c.bs_max = c.jo.bs;
	int rc = parse(&c, argc, argv);
	if (rc)
		return rc;
	if (c.help) {
		usage(stdout);
		return 0;
	}
	if ((c.report || c.quick) && !c.suite)
		return bad("--%s goes with --suite", c.report ? "report" : "quick");

	FILE *out = stdout;
	if (c.suite) {
		rc = run_suite(&c, &out);
		goto done;
	}

	struct bench_job_opts *jo = &c.jo;
	char path[4096];
	rc = 2;
	if (!jo->filename) {
		rc = bad("--filename is required (the file to read or write)");
		goto done;
	}
	if (c.directory && jo->filename[0] != '/') {
		snprintf(path, sizeof(path), "%s/%s", c.directory, jo->filename);
		jo->filename = path;
	}
	if (c.time_based && !(jo->runtime > 0)) {
		rc = bad("--time_based needs --runtime");
		goto done;
	}
	if (jo->runtime > 0 && jo->io_size) {
		rc = bad("give --runtime or --io_size, not both");
		goto done;
	}
	if (jo->offset_increment && !seen(&c, "size")) {
		rc = bad("--offset_increment needs --size (each job's region)");
		goto done;
	}
	if (jo->io_size && jo->io_size < jo->bs) {
		rc = bad("--io_size %" PRIu64 " is smaller than --bs %" PRIu64, jo->io_size, jo->bs);
		goto done;
	}
	if (jo->verify) {
		if (c.bs_max != jo->bs) {
			rc = bad("--verify needs one --bs, not a sweep (blocks are checked at the size they were written)");
			goto done;
		}
		if (jo->bs < BENCH_VERIFY_HEADER) {
			rc = bad("--verify needs --bs of at least %d bytes (the block header); got %" PRIu64,
				 BENCH_VERIFY_HEADER, jo->bs);
			goto done;
		}
		if (jo->offset % jo->bs && bench_rw_reads(jo->rw) && bench_rw_writes(jo->rw)) {
			rc = bad("--verify with --rw randrw needs --offset to be a multiple of --bs");
			goto done;
		}
	}
	if (jo->xmode != BENCH_X_NONE && jo->verify) {
		rc = bad("--verify checks host memory; it does not go with -x");
		goto done;
	}
	/* like gdsio, -x opens files for O_DIRECT; without --direct, the library's direct=auto also
	 * reads page-cache-resident data through the cache */
	if (jo->xmode != BENCH_X_NONE && !seen(&c, "direct"))
		jo->direct = BENCH_DIRECT_AUTO;
	if (seen(&c, "gpu") && jo->xmode == BENCH_X_NONE) {
		rc = bad("--gpu goes with -x");
		goto done;
	}
	if (c.xall && c.bs_max != jo->bs) {
		rc = bad("-x all takes one --bs, not a sweep");
		goto done;
	}
	if (!seen(&c, "name"))
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
	if (jo->xmode != BENCH_X_NONE && (c.xall || bench_x_on_gpu(jo->xmode))) {
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
			r->htod = htod;
			r->dtoh = dtoh;
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
		if (!c.json && jo->xmode != BENCH_X_NONE)
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
