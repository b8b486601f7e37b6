/* Internal declarations shared by the library's layers (never installed). Names: ferry__*. */
#ifndef FERRY_CORE_INTERNAL_H
#define FERRY_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include "ferry/ferry.h"

#define FERRY__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FERRY__UNLIKELY(x) __builtin_expect(!!(x), 0)

/*
 * Records the calling thread's detail string and returns err, so that failures read
 *   return ferry__error(-errno, "pread(%s, offset %llu, %zu bytes) on %s", path, off, len, backend);
 * The message is prefixed with nothing: callers name the call, the file, the offset and the backend.
 */
int ferry__error(int err, const char *fmt, ...) FERRY__PRINTF(2, 3);
/* Records msg and returns err: a message another thread's ferry__error made, raised again on the
 * thread that reports it; the code's text is added only where msg does not hold it already. */
int ferry__error_raise(int err, const char *msg);
/* Appends ": <more>" to the current detail string (context added by an outer layer). */
void ferry__error_append(const char *fmt, ...) FERRY__PRINTF(1, 2);
void ferry__error_clear(void);

/* Logging to stderr, only when the log_level knob (or FERRY_LOG_LEVEL) allows; off by default. */
enum { FERRY__LOG_ERROR = 1, FERRY__LOG_WARN = 2, FERRY__LOG_INFO = 3, FERRY__LOG_DEBUG = 4 };
extern int ferry__log_level;
void ferry__log(int level, const char *fmt, ...) FERRY__PRINTF(2, 3);
#define FERRY__LOG(level, ...)                                      \
	do {                                                        \
		if (FERRY__UNLIKELY(ferry__log_level >= (level)))   \
			ferry__log((level), __VA_ARGS__);           \
	} while (0)

/* Parses "123", "4k", "1m", "2g", "1.5g" (powers of 1024). Returns 0 or FERRY_EBADOPT. */
int ferry__parse_size(const char *s, uint64_t *out);

/* Grows the array *p of *cap elements of size bytes to hold at least need (doubling). 0 or -ENOMEM. */
int ferry__grow(void **p, size_t *cap, size_t need, size_t size);

/* Monotonic clock in nanoseconds. */
uint64_t ferry__now_ns(void);

#endif
