/*
 * A growing string and the JSON string writer. Appends never fail one by one: the first failed
 * allocation sets oom and every later append does nothing, so a caller builds the whole text and
 * checks oom once. data is NUL-terminated whenever len > 0.
 */
#ifndef FERRY_BASE_SBUF_H
#define FERRY_BASE_SBUF_H

#include <stdarg.h>
#include <stddef.h>

#include "base/base.h"

struct ferry__sbuf {
	char *data;
	size_t len, cap;
	int oom;
};

void ferry__sbuf_put(struct ferry__sbuf *b, const char *s, size_t n);
void ferry__sbuf_puts(struct ferry__sbuf *b, const char *s);
void ferry__sbuf_printf(struct ferry__sbuf *b, const char *fmt, ...) FERRY__PRINTF(2, 3);
void ferry__sbuf_vprintf(struct ferry__sbuf *b, const char *fmt, va_list ap);
/*
 * Appends s as a JSON string literal, quotes included; NULL becomes null. Valid UTF-8 passes
 * through; '"', '\\' and control characters (U+0000..U+001F, U+007F) are escaped; a byte that does
 * not start a valid UTF-8 sequence (text from sysfs or mountinfo is not promised to be UTF-8)
 * becomes \ufffd, so the output is always valid JSON in valid UTF-8.
 */
void ferry__sbuf_json(struct ferry__sbuf *b, const char *s);
/* The same without the quotes (a piece of a longer string literal). */
void ferry__sbuf_json_body(struct ferry__sbuf *b, const char *s);
/* Frees the text and leaves b empty (and usable again). */
void ferry__sbuf_free(struct ferry__sbuf *b);

#endif
