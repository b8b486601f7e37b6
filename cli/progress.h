/*
 * A progress line on stderr for long CLI work: a bar, done/total, rate and time left, redrawn ten
 * times a second by a thread while stderr is a terminal. Not on a terminal, or when quiet, it draws
 * nothing and starts no thread, so logs and pipes get no extra lines.
 */
#ifndef FERRY_CLI_PROGRESS_H
#define FERRY_CLI_PROGRESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

struct cli_progress {
	const char *label;        /* "ferry ckpt verify" */
	const char *unit;         /* NULL: bytes (sizes and a rate); else a count ("cases") */
	uint64_t total;           /* 0: unknown (no bar, no time left) */
	atomic_uint_fast64_t done;
	uint64_t (*poll)(void *arg); /* when set, done is read from it at each redraw */
	void *arg;
	double t0;
	int on;                   /* a thread draws (stderr is a terminal, not quiet) */
	atomic_int stop;
	pthread_t tid;
};

/* Draws one progress line into buf (no \r, no newline): "LABEL [###   ]  45% 1.2/2.7 GiB, 850 MB/s, 2 s left". */
void cli_progress_format(char *buf, size_t len, const char *label, const char *unit, uint64_t done,
			 uint64_t total, double elapsed);
/* 1 if a progress line would be drawn: stderr is a terminal and not quiet. */
int cli_progress_wanted(int quiet);
/* Starts the redraw thread when cli_progress_wanted(quiet); otherwise does nothing. */
void cli_progress_start(struct cli_progress *p, const char *label, const char *unit, uint64_t total, int quiet,
			uint64_t (*poll)(void *arg), void *arg);
void cli_progress_set(struct cli_progress *p, uint64_t done);
/* Stops the thread; the last line stays, drawn as complete (keep: the work finished), or is cleared.
 * Safe if never started. */
void cli_progress_stop(struct cli_progress *p, int keep);
/* Clears the line now (before printing a message); the next redraw draws it again. */
void cli_progress_clear(struct cli_progress *p);

#endif
