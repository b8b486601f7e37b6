/* Error codes, their names and descriptions, and the thread-local detail string. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

#define DETAIL_MAX 1024
static _Thread_local char detail[DETAIL_MAX];

const char *ferry_strerror(int err)
{
	switch (err) {
#define FERRY__XX(name, code, msg) \
	case FERRY_##name:         \
		return msg;
		FERRY_ERRNO_MAP(FERRY__XX)
#undef FERRY__XX
	}
	if (err < 0 && err > -4096)
		return strerror(-err);
	if (err >= 0)
		return "success";
	return "unknown error";
}

const char *ferry_err_name(int err)
{
	switch (err) {
#define FERRY__XX(name, code, msg) \
	case FERRY_##name:         \
		return "FERRY_" #name;
		FERRY_ERRNO_MAP(FERRY__XX)
#undef FERRY__XX
	}
	if (err < 0 && err > -4096) {
		const char *n = strerrorname_np(-err);
		return n ? n : "EUNKNOWN";
	}
	return err >= 0 ? "OK" : "EUNKNOWN";
}

const char *ferry_last_error(void)
{
	return detail;
}

int ferry__error(int err, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(detail) - 2 && err < 0)
		snprintf(detail + n, sizeof(detail) - (size_t)n, ": %s", ferry_strerror(err));
	return err;
}

int ferry__error_raise(int err, const char *msg)
{
	const char *why = err < 0 ? ferry_strerror(err) : NULL;
	char tail[200];
	snprintf(tail, sizeof(tail), ": %s", why ? why : "");
	if (!why || strstr(msg, tail)) /* its code's text is there already (ferry__error put it) */
		snprintf(detail, sizeof(detail), "%s", msg);
	else
		snprintf(detail, sizeof(detail), "%s%s", msg, tail);
	return err;
}

void ferry__error_append(const char *fmt, ...)
{
	size_t n = strlen(detail);
	va_list ap;

	if (n + 3 >= sizeof(detail))
		return;
	detail[n++] = ';';
	detail[n++] = ' ';
	va_start(ap, fmt);
	vsnprintf(detail + n, sizeof(detail) - n, fmt, ap);
	va_end(ap);
}

void ferry__error_clear(void)
{
	detail[0] = '\0';
}
