/*
 * Live statistics a ferry process publishes for `ferry top` (and anything else) to read: one small
 * shared-memory file per publisher, <dir>/ferry-<pid>-<16 random hex digits>.stats, where <dir> is
 * $FERRY_RUN_DIR or /dev/shm: created exclusively, mode 0600, in a directory owned by us or root and
 * not writable by others unless sticky (docs/DOCTOR.md). The file holds one struct ferry__publish: a versioned header, then counters the
 * publisher bumps with relaxed atomic adds and readers load without locks (each counter is an
 * aligned 64-bit word; a reader may see one counter a little ahead of another, never a torn one),
 * then slots saying what the context is doing: its loaders, saves and loads (engine/export.h,
 * ferry__activity_*). Appended, not a new version: a `ferry top` that knows only the first 192
 * bytes still shows the process, and files of 192 bytes (older writers) are read without slots.
 */
#ifndef FERRY_SYS_PUBLISH_H
#define FERRY_SYS_PUBLISH_H

#include <stdint.h>

#include "engine/export.h"

#define FERRY__PUBLISH_MAGIC 0x3159524546ull /* "FERY1" */
#define FERRY__PUBLISH_VERSION 1   /* changes only where the layout is not merely appended to */
#define FERRY__PUBLISH_MIN_SIZE 192 /* the header and counters: what every writer writes */
#define FERRY__PUBLISH_ACTIVITIES 8

/* Monotonic counters since the publisher opened. Append only; never reorder (readers check size). */
struct ferry__publish_counters {
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t reads;            /* requests completed */
	uint64_t writes;
	uint64_t errors;
	uint64_t fallbacks;
	uint64_t consumer_wait_ns; /* time consumers spent blocked waiting for data (loader next(), req_wait) */
};

/*
 * One thing the process is doing. A slot is claimed, reused or freed under seq (odd while kind,
 * start_ns and name are rewritten and the counters zeroed); the counters then only grow. A reader
 * takes a slot whose seq is even and the same before and after it copied it.
 */
struct ferry__activity {
	uint32_t kind;     /* enum ferry__activity_kind; 0: free */
	uint32_t seq;
	uint64_t start_ns; /* CLOCK_REALTIME at begin: tells a reused slot from the one seen before */
	uint64_t end_ns;   /* CLOCK_REALTIME at end; 0 while it runs */
	char name[40];
	uint64_t v[FERRY__ACT__COUNT]; /* enum ferry__activity_field */
};

struct ferry__publish {
	uint64_t magic;            /* written last on open, so a reader never sees a half-made header */
	uint32_t version;
	uint32_t size;             /* sizeof(struct ferry__publish) of the writer */
	int32_t pid;
	uint32_t index;            /* n-th publication of this process */
	uint32_t path_seq;         /* odd while path is being rewritten (a seqlock for the text) */
	uint32_t reserved;
	uint64_t start_ns;         /* CLOCK_REALTIME at open: tells a reused pid from the original */
	char name[64];             /* what the publisher calls itself: "bench", "loader:imagenet", ... */
	char path[32];             /* transfer path now in use: "gds", "bounce", "buffered", ... */
	struct ferry__publish_counters c;
	struct ferry__activity act[FERRY__PUBLISH_ACTIVITIES]; /* in files of sizeof(struct ferry__publish) */
};

/*
 * Creates the publication file and maps it. Returns the counters to bump, or NULL with
 * ferry_last_error() set (the caller carries on without publishing: publishing is best effort).
 */
struct ferry__publish_counters *ferry__publish_open(const char *name);
/* A slot of this publication for an activity (ferry__activity_begin); NULL when c is or all are taken. */
struct ferry__activity *ferry__publish_activity(struct ferry__publish_counters *c, enum ferry__activity_kind kind,
						const char *name);
/* Unmaps and removes the file. NULL is accepted. */
void ferry__publish_close(struct ferry__publish_counters *c);
/* Sets the path text ("bounce", ...), truncated to 31 bytes. */
void ferry__publish_set_path(struct ferry__publish_counters *c, const char *path);
/* Adds v to a counter: FERRY__PUBLISH_ADD(c, bytes_read, n). c may be NULL (not publishing). */
#define FERRY__PUBLISH_ADD(c, field, v)                                                     \
	do {                                                                                \
		if (c)                                                                      \
			__atomic_fetch_add(&(c)->field, (uint64_t)(v), __ATOMIC_RELAXED);   \
	} while (0)

/* The directory publications live in: $FERRY_RUN_DIR or /dev/shm. */
const char *ferry__publish_dir(void);

#endif
