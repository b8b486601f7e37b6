/*
 * Copies out of a file's mapping, guarded against SIGBUS: the loader's small reads of resident
 * shards, where a memcpy out of a mapping it keeps costs less than a pread(2) call each. (A
 * mapping made for one pass does not win: its page faults and munmap cost more than pread,
 * docs/PERFORMANCE.md, issue 28.)
 *
 * A file truncated under the reader turns a load from a mapped page past its new end into SIGBUS
 * (and a disk error reading a page, EIO, does the same), which by default kills the process. The
 * first ferry__bus_guarded() installs a handler that jumps back out of a guarded copy, in the
 * thread that faulted, and passes every other SIGBUS on to the handler it replaced (the default:
 * the process dies as before). ferry__bus_guarded() also checks that the handler is still ferry's
 * (a later sigaction, Python's faulthandler.enable() say, replaces it): when it is not, callers
 * read with pread instead. A copy that faults stops there; the caller reads the rest with pread,
 * which reports the truncation or the error.
 *
 * A guard belongs to one thread: claimed once by a worker thread, released when it ends. There are
 * 64; a thread that gets none copies nothing from mappings.
 */
#ifndef FERRY_BASE_MAPCOPY_H
#define FERRY_BASE_MAPCOPY_H

#include <stddef.h>
#include <stdint.h>

struct ferry__bus_guard;

struct ferry__mcopy {
	const void *src; /* in a mapping */
	void *dst;
	uint64_t len;
	size_t tag; /* the caller's */
};

/* 1 when copies out of mappings are guarded now (one sigaction(2) call), 0 otherwise. */
int ferry__bus_guarded(void);

/* A guard for the calling thread, or NULL when all are taken. */
struct ferry__bus_guard *ferry__bus_guard_claim(void);
void ferry__bus_guard_release(struct ferry__bus_guard *g); /* NULL: nothing */

/* Does copies mc[0..n) under g (the calling thread's); returns how many were done (< n: copy n
 * faulted, partly done). Call only after ferry__bus_guarded() returned 1. */
size_t ferry__copy_guarded(struct ferry__bus_guard *g, const struct ferry__mcopy *mc, size_t n);

#endif
