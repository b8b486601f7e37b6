/*
 * TEMPORARY (branch sys): weak stand-ins for src/core functions the probes and the CLI link
 * against, so that this branch builds before the core lands. The core's real definitions are
 * strong and replace these; delete this file once main has src/core/error.c and friends.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

static _Thread_local char detail[1024];

__attribute__((weak)) int ferry__error(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	return err;
}

__attribute__((weak)) void ferry__error_clear(void)
{
	detail[0] = '\0';
}

__attribute__((weak)) const char *ferry_last_error(void)
{
	return detail;
}

__attribute__((weak)) const char *ferry_strerror(int err)
{
	return strerror(-err);
}

__attribute__((weak)) const char *ferry_version(void)
{
	return "0.1.0";
}
