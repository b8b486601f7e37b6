/* The doctor's report: a list of checks, each a handful of strings. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/sys.h"

#define FERRY__REPORT_SCHEMA 1

enum { F_ID, F_SUBJECT, F_VALUE, F_EXPECTED, F_SOURCE, F_FIX, F__COUNT };
static const char *const field_names[F__COUNT] = {"id", "subject", "value", "expected", "source", "fix"};
static const char *const verdict_names[] = {"ok", "warn", "fail", "unknown"};

struct check {
	char *f[F__COUNT];
	int verdict;
};

struct ferry_report {
	struct check *checks;
	size_t n, cap;
	char host[256], kernel[128];
	int fixture;
	struct ferry__sbuf json;
};

ferry_report *ferry__report_new(void)
{
	return calloc(1, sizeof(ferry_report));
}

void ferry__report_set_host(ferry_report *r, const char *host, const char *kernel, int fixture)
{
	snprintf(r->host, sizeof(r->host), "%s", host ? host : "");
	snprintf(r->kernel, sizeof(r->kernel), "%s", kernel ? kernel : "");
	r->fixture = fixture;
}

int ferry__report_add(ferry_report *r, const char *id, const char *subject, int verdict,
		      const char *value, const char *expected, const char *source, const char *fix)
{
	if (verdict < FERRY_VERDICT_OK || verdict > FERRY_VERDICT_UNKNOWN)
		verdict = FERRY_VERDICT_UNKNOWN;
	/* Two paths on one device would check it twice: the first finding stands. */
	for (size_t i = 0; i < r->n; i++)
		if (!strcmp(r->checks[i].f[F_ID], id ? id : "") &&
		    !strcmp(r->checks[i].f[F_SUBJECT], subject ? subject : ""))
			return 0;
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 32;
		struct check *c = realloc(r->checks, cap * sizeof(*c));
		if (!c)
			return -ENOMEM;
		r->checks = c;
		r->cap = cap;
	}
	const char *in[F__COUNT] = {id, subject, value, expected, source, fix};
	struct check *c = &r->checks[r->n];
	for (int i = 0; i < F__COUNT; i++) {
		c->f[i] = strdup(in[i] ? in[i] : "");
		if (!c->f[i]) {
			while (i--)
				free(c->f[i]);
			return -ENOMEM;
		}
	}
	c->verdict = verdict;
	r->n++;
	return 0;
}

int ferry__report_addf(ferry_report *r, const char *id, const char *subject, int verdict,
		       const char *expected, const char *source, const char *fix, const char *fmt, ...)
{
	char value[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(value, sizeof(value), fmt, ap);
	va_end(ap);
	return ferry__report_add(r, id, subject, verdict, value, expected, source, fix);
}

void ferry_report_destroy(ferry_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++)
		for (int j = 0; j < F__COUNT; j++)
			free(r->checks[i].f[j]);
	free(r->checks);
	ferry__sbuf_free(&r->json);
	free(r);
}

size_t ferry_report_count(const ferry_report *r)
{
	return r ? r->n : 0;
}

const char *ferry_report_field(const ferry_report *r, size_t i, const char *field)
{
	if (!r || i >= r->n || !field)
		return NULL;
	if (!strcmp(field, "verdict"))
		return verdict_names[r->checks[i].verdict];
	for (int j = 0; j < F__COUNT; j++)
		if (!strcmp(field, field_names[j]))
			return r->checks[i].f[j];
	return NULL;
}

int ferry_report_verdict(const ferry_report *r, size_t i)
{
	if (!r || i >= r->n)
		return -EINVAL;
	return r->checks[i].verdict;
}

int ferry_report_worst(const ferry_report *r)
{
	static const int rank[] = {[FERRY_VERDICT_OK] = 0, [FERRY_VERDICT_UNKNOWN] = 1,
				   [FERRY_VERDICT_WARN] = 2, [FERRY_VERDICT_FAIL] = 3};
	int worst = FERRY_VERDICT_OK;
	for (size_t i = 0; r && i < r->n; i++)
		if (rank[r->checks[i].verdict] > rank[worst])
			worst = r->checks[i].verdict;
	return worst;
}

const char *ferry_report_host(const ferry_report *r, const char *key)
{
	if (!r || !key)
		return NULL;
	if (!strcmp(key, "host"))
		return r->host;
	if (!strcmp(key, "kernel"))
		return r->kernel;
	if (!strcmp(key, "mode"))
		return r->fixture ? "fixture" : "live";
	return NULL;
}

int ferry_report_json(ferry_report *r, const char **out)
{
	if (!r || !out)
		return -EINVAL;
	struct ferry__sbuf *b = &r->json;
	ferry__sbuf_free(b);
	ferry__sbuf_printf(b, "{\"schema_version\": %d, \"host\": {\"name\": ", FERRY__REPORT_SCHEMA);
	ferry__sbuf_json(b, r->host);
	ferry__sbuf_printf(b, ", \"kernel\": ");
	ferry__sbuf_json(b, r->kernel);
	ferry__sbuf_printf(b, ", \"mode\": \"%s\"}, \"checks\": [", r->fixture ? "fixture" : "live");
	for (size_t i = 0; i < r->n; i++) {
		const struct check *c = &r->checks[i];
		ferry__sbuf_printf(b, "%s\n  {\"id\": ", i ? "," : "");
		ferry__sbuf_json(b, c->f[F_ID]);
		ferry__sbuf_printf(b, ", \"subject\": ");
		ferry__sbuf_json(b, c->f[F_SUBJECT]);
		ferry__sbuf_printf(b, ", \"verdict\": \"%s\"", verdict_names[c->verdict]);
		for (int j = F_VALUE; j < F__COUNT; j++) {
			ferry__sbuf_printf(b, ", \"%s\": ", field_names[j]);
			ferry__sbuf_json(b, c->f[j]);
		}
		ferry__sbuf_put(b, "}", 1);
	}
	ferry__sbuf_printf(b, "\n]}\n");
	if (b->oom) {
		ferry__sbuf_free(b);
		return ferry__error(-ENOMEM, "ferry_report_json: out of memory");
	}
	*out = b->data;
	return 0;
}
