/* The growing string and the JSON string writer (sbuf.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/sbuf.h"

static int grow(struct ferry__sbuf *b, size_t extra)
{
	if (b->oom)
		return -1;
	if (extra >= SIZE_MAX / 2 - b->len) { /* the doubling below would overflow */
		b->oom = 1;
		return -1;
	}
	if (b->len + extra + 1 <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + extra + 1)
		cap *= 2;
	char *p = realloc(b->data, cap);
	if (!p) {
		b->oom = 1;
		return -1;
	}
	b->data = p;
	b->cap = cap;
	return 0;
}

void ferry__sbuf_put(struct ferry__sbuf *b, const char *s, size_t n)
{
	if (grow(b, n))
		return;
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = '\0';
}

void ferry__sbuf_puts(struct ferry__sbuf *b, const char *s)
{
	ferry__sbuf_put(b, s, strlen(s));
}

void ferry__sbuf_vprintf(struct ferry__sbuf *b, const char *fmt, va_list ap)
{
	va_list aq;
	va_copy(aq, ap);
	int n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0) {
		b->oom = 1;
		return;
	}
	if (grow(b, (size_t)n))
		return;
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	b->len += (size_t)n;
}

void ferry__sbuf_printf(struct ferry__sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ferry__sbuf_vprintf(b, fmt, ap);
	va_end(ap);
}

void ferry__sbuf_json_body(struct ferry__sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *run = p;
	while (*p) {
		const char *esc = NULL;
		char hex[8];
		size_t seq = 1;
		if (*p >= 0x80) {
			seq = ferry__utf8_seq((const char *)p, strnlen((const char *)p, 4));
			if (seq) {
				p += seq;
				continue;
			}
			esc = "\\ufffd";
			seq = 1;
		} else if (*p == '"') {
			esc = "\\\"";
		} else if (*p == '\\') {
			esc = "\\\\";
		} else if (*p == '\n') {
			esc = "\\n";
		} else if (*p == '\t') {
			esc = "\\t";
		} else if (*p == '\r') {
			esc = "\\r";
		} else if (*p < 0x20 || *p == 0x7f) {
			snprintf(hex, sizeof(hex), "\\u%04x", *p);
			esc = hex;
		} else {
			p++;
			continue;
		}
		ferry__sbuf_put(b, (const char *)run, (size_t)(p - run));
		ferry__sbuf_puts(b, esc);
		p += seq;
		run = p;
	}
	ferry__sbuf_put(b, (const char *)run, (size_t)(p - run));
}

void ferry__sbuf_json(struct ferry__sbuf *b, const char *s)
{
	if (!s) {
		ferry__sbuf_put(b, "null", 4);
		return;
	}
	ferry__sbuf_put(b, "\"", 1);
	ferry__sbuf_json_body(b, s);
	ferry__sbuf_put(b, "\"", 1);
}

void ferry__sbuf_free(struct ferry__sbuf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
	b->oom = 0;
}
