/* ferry bench: shared declarations of cli/bench*.c. */
#ifndef FERRY_CLI_BENCH_H
#define FERRY_CLI_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "ferry/ferry.h"

/* ------------------------------------------------------------------------------ latency histogram */

/*
 * Log-linear buckets (HdrHistogram style): values below 64 ns are exact; above, each power of two
 * is split into 64 buckets, so a bucket is at most 1/64 (1.56%) of its value wide. Reported values
 * are bucket midpoints (error at most 0.8%), clamped to the exact min and max.
 */
#define BENCH_HIST_SUB 64
#define BENCH_HIST_BUCKETS (BENCH_HIST_SUB + 58 * BENCH_HIST_SUB)

struct bench_hist {
	uint64_t n, min, max, sum;
	double sumsq;
	uint64_t count[BENCH_HIST_BUCKETS];
};

void bench_hist_init(struct bench_hist *h);
void bench_hist_add(struct bench_hist *h, uint64_t ns);
void bench_hist_merge(struct bench_hist *into, const struct bench_hist *from);
/* p in [0, 100]: the smallest recorded value (as bucket midpoint) with at least p% at or below it. */
uint64_t bench_hist_percentile(const struct bench_hist *h, double p);
double bench_hist_mean(const struct bench_hist *h);
double bench_hist_stddev(const struct bench_hist *h);

/* fio's default percentile list, in its order. */
extern const double bench_percentiles[];
extern const unsigned bench_npercentiles;

/* ----------------------------------------------------------------------------------------- verify */

enum bench_verify { BENCH_VERIFY_NONE, BENCH_VERIFY_XXH3, BENCH_VERIFY_CRC32C };

/* Bytes at the start of each verified block; --bs must be at least this. Layout in docs/BENCH.md. */
#define BENCH_VERIFY_HEADER 40

const char *bench_verify_name(enum bench_verify v);
/* Fills a block of len bytes for file offset off: pattern from (seed, off), then the header. */
void bench_verify_fill(enum bench_verify v, void *block, size_t len, uint64_t off, uint64_t seed);
/*
 * Checks a block read at file offset off. Returns 0, or -1 with a sentence in msg naming the
 * offset and what is wrong (checksum mismatch, data of another offset, not a ferry block).
 */
int bench_verify_check(enum bench_verify v, void *block, size_t len, uint64_t off, const char *path,
		       char *msg, size_t msglen);

/* ------------------------------------------------------------------------------ random offsets */

/* fio's default (random_generator=tausworthe, with its random map), or its lfsr (cli/bench_rand.c). */
enum bench_randgen { BENCH_RANDGEN_MAP, BENCH_RANDGEN_PERM };

/* The block numbers of a job's random I/Os, in [0, n). One per job; not thread-safe. */
struct bench_offsets {
	uint64_t n;
	enum bench_randgen gen;
	int norandommap;
	uint64_t mask, i, k1, k2; /* perm */
	unsigned shift;
	uint64_t *bits, *full;    /* map */
	uint64_t nwords, nfull, done;
};

uint64_t bench_rng_next(uint64_t *s);
/* Uniform in [0, n). */
uint64_t bench_rng_below(uint64_t *s, uint64_t n);
const char *bench_randgen_name(enum bench_randgen g);
/* 0, -EINVAL (no blocks) or -ENOMEM (the map: n/8 bytes). Draws its keys from rng. */
int bench_offsets_init(struct bench_offsets *g, uint64_t nblocks, enum bench_randgen gen, int norandommap,
		       uint64_t *rng) __attribute__((warn_unused_result));
/* The next block; sets *new_pass when a pass over the blocks begins again (never with norandommap). */
uint64_t bench_offsets_next(struct bench_offsets *g, uint64_t *rng, int *new_pass);
void bench_offsets_free(struct bench_offsets *g);

/* ------------------------------------------------------------------------------------------ runs */

enum bench_rw { BENCH_READ, BENCH_WRITE, BENCH_RANDREAD, BENCH_RANDWRITE, BENCH_RANDRW };
enum bench_cold { BENCH_COLD_NONE, BENCH_COLD_FILE, BENCH_COLD_SYSTEM };

#define BENCH_MAX_GPUS 16

/* What one run (one job group: numjobs threads, one block size) is asked to do. */
struct bench_job_opts {
	const char *name;
	const char *filename;
	enum bench_rw rw;
	unsigned rwmixread;     /* percent of randrw I/Os that read */
	uint64_t bs;
	uint64_t size;          /* region length; 0: the file's size */
	uint64_t offset;        /* region start */
	uint64_t offset_increment; /* job k's region starts at offset + k * offset_increment (fio's) */
	int end_fsync;          /* each job fsyncs the file when its I/O is done, inside its timed run */
	unsigned iodepth_batch_submit; /* submit each N I/Os queued (fio's); 0: all that can be queued at once */
	unsigned numjobs;
	unsigned iodepth;
	int direct;             /* 0, 1, or BENCH_DIRECT_AUTO (-x without --direct: the library's choice) */
	const char *ioengine;   /* "auto", "psync", "io_uring" */
	double runtime;         /* seconds, time based; 0: by bytes */
	uint64_t io_size;       /* bytes per job; 0: one pass over the region */
	uint64_t randseed;
	enum bench_verify verify;
	enum bench_cold cold;
	int quiet;              /* no notes on stderr (the suite) */
	int xmode;              /* -x: BENCH_X_NONE (0: host memory, no -x), else BENCH_X(gdsio's number), BENCH_X_AUTO */
	int gpu;                /* --gpu: the device for -x */
	unsigned ngpus;         /* --gpus: 0, or the devices that job k uses in turn (gpus[k % ngpus]) */
	int gpus[BENCH_MAX_GPUS];
	int api_pread;          /* --api=pread: each I/O is one ferry_pread/pwrite (worker pool) */
	int raw;                /* --raw: a compressed file's bytes as stored (else read through ferry_cz_pread) */
	enum bench_randgen randgen; /* --random_generator */
	int norandommap;        /* --norandommap: uniform picks with repeats, no passes */
};

#define BENCH_DIRECT_AUTO 2

/* Transfer modes (-x): gdsio's -x number n is BENCH_X(n); names as DESIGN.md's table and the `path`
 * knob. 0 is "no -x", so that zeroed options mean host memory. */
#define BENCH_X_NONE 0
#define BENCH_X(gdsio) ((gdsio) + 1)
#define BENCH_X_GDSIO(x) ((x) - 1)
#define BENCH_X_CPU BENCH_X(1)
#define BENCH_X_AUTO 8
#define BENCH_X_COUNT 9
extern const char *const bench_x_names[BENCH_X_COUNT];
/* The GPU job number job uses: --gpus' devices in turn, else --gpu. */
int bench_job_gpu(const struct bench_job_opts *o, unsigned job);
/* 1 if the mode moves data to or from device memory (all but none and cpu). */
int bench_x_on_gpu(int xmode);

struct bench_dir {
	uint64_t bytes, ios;
	struct bench_hist clat, lat;
};

/* What it measured. */
struct bench_result {
	struct bench_job_opts opts;
	unsigned iodepth;       /* effective: 1 with psync */
	uint64_t region;        /* bytes of the file used, from opts.offset */
	char backend[16];
	int direct;             /* 1 if the file's O_DIRECT descriptor is open */
	char cold_done[96];     /* what was done to make the cache cold, "none" */
	struct bench_dir dir[2];/* [0] read, [1] write */
	uint64_t wall_ns;       /* first start to last finish */
	uint64_t job_runtime_ns;/* summed over jobs */
	double usr_s, sys_s;    /* summed over the job threads (RUSAGE_THREAD) */
	double self_cpu_s;      /* whole process (RUSAGE_SELF), during the run */
	uint64_t ctxsw, majf, minf;
	uint64_t verified;      /* blocks verified */
	uint64_t stats[FERRY_STAT__COUNT]; /* the context's counters over the run */
	int64_t timestamp_ms;
	char path_info[768];    /* -x: ferry_file_path_info() of the file after the run */
	/* a ferry compressed file read through ferry_cz_pread: its codec (0: not one), its bytes and
	 * the bytes of its frames, and ferry_cz_path_info of job 0's last read (where it decoded) */
	int cz_codec;
	int64_t cz_bytes, cz_compressed;
	char cz_info[256];
	double htod, dtoh;      /* -x: pinned copy ceilings (bytes/s) measured in the same invocation */
	char cannot[768];       /* -x all: why this mode cannot run here ("" if it ran) */
	/* --gpus: each device's part of the run (its jobs), and the ceilings of all at once */
	struct bench_gpu_part {
		uint64_t bytes, ios;
		uint64_t wall_ns;       /* its jobs' first start to last finish */
		double htod, dtoh;      /* this device's ceilings measured alone */
	} part[BENCH_MAX_GPUS];
	double htod_all, dtoh_all;      /* every listed device copying at once (bytes of all per second) */
};

/*
 * Prepares the file (creates and lays it out for a read of a missing file), drops its cache if
 * asked, and runs numjobs threads. Returns 0, or 1 after printing one sentence on stderr.
 * res must point to zeroed memory; its histograms are large, so callers allocate it.
 */
int bench_run(const struct bench_job_opts *o, struct bench_result *res);
/* When set, bench_run's next error sentence goes here instead of stderr (then it is reset). */
extern char *bench_error_sink;
extern size_t bench_error_sink_len;
const char *bench_rw_name(enum bench_rw rw);
int bench_rw_reads(enum bench_rw rw);
int bench_rw_writes(enum bench_rw rw);

/* ----------------------------------------------------------------------------------------- output */

/* Sizes as "4 KiB", "1 MiB"; latencies as "12.3us". Return buf. */
char *bench_fmt_size(char *buf, size_t len, uint64_t bytes);
char *bench_fmt_ns(char *buf, size_t len, double ns);
double bench_gbps(const struct bench_result *r);

void bench_print_normal(FILE *out, struct bench_result *const *res, unsigned n);
/* -x: the transfer modes' table, each figure beside the ceiling that bounds it. */
void bench_print_xfer(FILE *out, struct bench_result *const *res, unsigned n);
struct bench_json;
/* --gpus: each GPU's figure and the total beside the ceilings of one and of all at once. */
void bench_print_gpus(FILE *out, const struct bench_result *r);
/* --gpus: the same in JSON, at the top level of "ferry" (an extra_top of bench_print_json). */
void bench_json_gpus(struct bench_json *j, const struct bench_result *r);
/* JSON in fio's schema; extra_top (may be NULL) writes more members into the top-level "ferry". */
struct bench_json;
void bench_print_json(FILE *out, struct bench_result *const *res, unsigned n,
		      void (*extra_top)(struct bench_json *j, void *arg), void *arg);

/* A tiny JSON writer in fio's layout ("key" : value, two-space indent). */
struct bench_json {
	FILE *out;
	int depth;
	int first;
};
void bench_json_begin(struct bench_json *j, FILE *out);
void bench_json_end(struct bench_json *j);
void bench_json_obj(struct bench_json *j, const char *key);   /* key NULL inside arrays */
void bench_json_arr(struct bench_json *j, const char *key);
void bench_json_close_obj(struct bench_json *j);
void bench_json_close_arr(struct bench_json *j);
void bench_json_str(struct bench_json *j, const char *key, const char *val);
void bench_json_u64(struct bench_json *j, const char *key, uint64_t val);
void bench_json_i64(struct bench_json *j, const char *key, int64_t val);
void bench_json_dbl(struct bench_json *j, const char *key, double val);
void bench_json_bool(struct bench_json *j, const char *key, int val);

/* ------------------------------------------------------------------------------------------ suite */

struct bench_suite_opts {
	const char *filename;   /* use this file (kept) instead of a temporary one */
	const char *directory;
	uint64_t size;
	const char *report;
	int json;
	int quick;
	double runtime;         /* seconds per case; 0: 4, or 1 with quick */
	int quiet;              /* --quiet: no bar, no per-case lines, no notes */
	FILE *out;
};
int bench_suite(const struct bench_suite_opts *o);

#endif
