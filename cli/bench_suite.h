/* ferry bench --suite: the GPU rows (cli/bench_suite_gpu.c), for cli/bench_suite.c. */
#ifndef FERRY_CLI_BENCH_SUITE_H
#define FERRY_CLI_BENCH_SUITE_H

#include <stdint.h>
#include <stdio.h>

struct bench_json;

struct suite_gpu_in {
	const char *file;      /* the suite's data file, laid out */
	const char *dir;       /* where the model, checkpoint and dataset are written (and removed) */
	uint64_t size;         /* bytes of the file; the model and dataset take at most 256 MiB */
	double runtime;        /* seconds per timed case */
	double storage_gbps;   /* storage to host memory (the host rows), 0 if unknown */
	void (*tick)(void *arg, const char *what); /* called as each step starts (progress) */
	void *arg;
};

/* Steps suite_gpu_run ticks (for the progress count): 0 without a usable GPU. */
unsigned suite_gpu_steps(void);
/* Measures the GPU rows, or records why each is skipped. Prints nothing. */
void suite_gpu_run(const struct suite_gpu_in *in);
void suite_gpu_print(FILE *out);
void suite_gpu_html(FILE *f);
void suite_gpu_json(struct bench_json *j);
/* Removes the model file and dataset of a run cut short (the suite's signal handler). */
void suite_gpu_cleanup(void);
/* s with HTML's special characters escaped, to f (the report's one escaper, bench_suite.c). */
void suite_html_esc(FILE *f, const char *s);

#endif
