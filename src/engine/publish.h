/*
 * Live statistics a ferry process publishes for `ferry top` (and anything else) to read: one small
 * shared-memory file per publisher, <dir>/ferry-<pid>-<16 random hex digits>.stats, where <dir> is
 * $FERRY_RUN_DIR or /dev/shm: created exclusively, mode 0600, in a directory owned by us or root and
 * not writable by others unless sticky (docs/DOCTOR.md). The file holds one struct ferry__publish: a versioned header, then counters the
 * publisher bumps with relaxed atomic adds and readers load without locks (each counter is an
 * aligned 64-bit word; a reader may see one counter a little ahead of another, never a torn one).
 */
#ifndef FERRY_SYS_PUBLISH_H
#define FERRY_SYS_PUBLISH_H

#include <stdint.h>

#define FERRY__PUBLISH_MAGIC 0x3159524546ull /* "FERY1" */
#define FERRY__PUBLISH_VERSION 1

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
};

/*
 * Creates the publication file and maps it. Returns the counters to bump, or NULL with
 * ferry_last_error() set (the caller carries on without publishing: publishing is best effort).
 */
struct ferry__publish_counters *ferry__publish_open(const char *name);
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
