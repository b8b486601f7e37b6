/* The knob engine (knob.h): rows in, set/get/keys/environment out. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/knob.h"

static pthread_mutex_t knobs_mu = PTHREAD_MUTEX_INITIALIZER;
/* Process-wide rows already given their environment variable (one per process, not per object). */
static void *env_done[8];

static void *field(const struct ferry__knob *k, const void *obj)
{
	return k->global ? k->global : (char *)obj + k->offset;
}

uint64_t ferry__knob_load(const struct ferry__knob *k, const void *obj)
{
	const void *p = field(k, obj);
	bool sign = k->flags & FERRY__KNOB_SIGNED;

	switch (k->width) {
	case 1:
		return sign ? (uint64_t)(int64_t) * (const int8_t *)p : *(const uint8_t *)p;
	case 2:
		return sign ? (uint64_t)(int64_t) * (const int16_t *)p : *(const uint16_t *)p;
	case 4:
		return sign ? (uint64_t)(int64_t) * (const int32_t *)p : *(const uint32_t *)p;
	default:
		return *(const uint64_t *)p;
	}
}

void ferry__knob_store(const struct ferry__knob *k, void *obj, uint64_t v, const char *text)
{
	void *p = field(k, obj);

	if (k->type == FERRY__KNOB_TEXT) {
		snprintf(p, k->width, "%s", text ? text : "");
		return;
	}
	switch (k->width) {
	case 1:
		*(uint8_t *)p = (uint8_t)v;
		break;
	case 2:
		*(uint16_t *)p = (uint16_t)v;
		break;
	case 4:
		*(uint32_t *)p = (uint32_t)v;
		break;
	default:
		*(uint64_t *)p = v;
		break;
	}
}

const struct ferry__knob *ferry__knobs_find(const struct ferry__knobs *t, const char *name)
{
	for (size_t i = 0; name && i < t->n; i++)
		if (!strcmp(t->rows[i].name, name))
			return &t->rows[i];
	return NULL;
}

const char *const *ferry__knobs_keys(const struct ferry__knobs *t)
{
	pthread_mutex_lock(&knobs_mu);
	if (!t->keys[0] && t->n) {
		for (size_t i = 0; i < t->n; i++)
			t->keys[i] = t->rows[i].name;
		t->keys[t->n] = NULL;
	}
	pthread_mutex_unlock(&knobs_mu);
	return t->keys;
}

/* "4k", "1m", "1g" or a byte count. */
static void size_text(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "gmk";
	for (int i = 0; i < 3; i++) {
		uint64_t u = 1ull << (10 * (3 - i));
		if (v && v % u == 0) {
			snprintf(buf, len, "%" PRIu64 "%c", v / u, units[i]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
}

void ferry__knob_describe(const struct ferry__knob *k, char *buf, size_t len)
{
	char a[32];
	size_t n = 0;

	if (k->expect) {
		snprintf(buf, len, "%s", k->expect);
		return;
	}
	switch (k->type) {
	case FERRY__KNOB_ENUM:
		n += (size_t)snprintf(buf + n, len - n, "one of");
		for (size_t i = 0; k->choices[i] && n < len; i++)
			n += (size_t)snprintf(buf + n, len - n, "%s %s", i ? "," : "", k->choices[i]);
		break;
	case FERRY__KNOB_SIZE:
		size_text(k->align, a, sizeof(a));
		snprintf(buf, len, "a size from %" PRIu64 " to %" PRIu64 " bytes (suffixes k, m, g)%s%s", k->min,
			 k->max, k->align ? ", a multiple of " : "", k->align ? a : "");
		break;
	case FERRY__KNOB_BOOL:
		snprintf(buf, len, "0 or 1");
		break;
	case FERRY__KNOB_TEXT:
		snprintf(buf, len, "text of at most %zu bytes without '\"', '\\' or a newline", k->width - 1);
		break;
	default:
		snprintf(buf, len, "an integer from %" PRIu64 " to %" PRIu64, k->min, k->max);
		break;
	}
}

static int parse_uint(const struct ferry__knob *k, const char *text, uint64_t *out)
{
	char *end;

	if (k->flags & FERRY__KNOB_C_INT) {
		if (!*text || *text == '-')
			return FERRY_EBADOPT;
	} else if (!isdigit((unsigned char)text[0])) {
		return FERRY_EBADOPT;
	}
	errno = 0;
	*out = strtoull(text, &end, k->flags & FERRY__KNOB_C_INT ? 0 : 10);
	return errno || *end ? FERRY_EBADOPT : 0;
}

static int parse_enum(const struct ferry__knob *k, const char *text, uint64_t *out)
{
	uint64_t n = 0;

	for (; k->choices[n]; n++)
		if (!strcmp(k->choices[n], text)) {
			*out = n;
			return 0;
		}
	if ((k->flags & (FERRY__KNOB_NUMBERED | FERRY__KNOB_NUMBERED_FROM_1)) &&
	    isdigit((unsigned char)text[0]) && !text[1]) {
		*out = (uint64_t)(text[0] - '0') + (k->flags & FERRY__KNOB_NUMBERED_FROM_1 ? 1 : 0);
		return *out < n ? 0 : FERRY_EBADOPT;
	}
	return FERRY_EBADOPT;
}

static int parse_value(const struct ferry__knob *k, const char *text, uint64_t *v)
{
	*v = 0;
	if (k->type == FERRY__KNOB_TEXT)
		return strlen(text) < k->width && !strpbrk(text, "\"\\\n") ? 0 : FERRY_EBADOPT;
	if (k->type == FERRY__KNOB_ENUM)
		return parse_enum(k, text, v);
	if (k->parse) {
		if (k->parse(text, v))
			return FERRY_EBADOPT;
	} else if (k->type == FERRY__KNOB_SIZE) {
		if (ferry__parse_size(text, v))
			return FERRY_EBADOPT;
	} else if (parse_uint(k, text, v)) {
		return FERRY_EBADOPT;
	}
	if (k->flags & FERRY__KNOB_SIGNED ? (int64_t)*v < (int64_t)k->min || (int64_t)*v > (int64_t)k->max
					  : *v < k->min || *v > k->max)
		return FERRY_EBADOPT;
	return k->align && *v % k->align ? FERRY_EBADOPT : 0;
}

int ferry__knobs_parse(const struct ferry__knobs *t, const char *key, const char *text, const char *origin,
		       const struct ferry__knob **row, uint64_t *v)
{
	const struct ferry__knob *k = ferry__knobs_find(t, key);
	char expect[192];

	*row = k;
	if (!k)
		return ferry__error(FERRY_EBADOPT, "%s: unknown knob '%s'", origin, key ? key : "(null)");
	if (!text || parse_value(k, text, v)) {
		ferry__knob_describe(k, expect, sizeof(expect));
		return ferry__error(FERRY_EBADOPT, "%s: %s='%s' is not valid; expected %s", origin, key,
				    text ? text : "(null)", expect);
	}
	return 0;
}

int ferry__knobs_set(const struct ferry__knobs *t, void *obj, const char *key, const char *text,
		     const char *origin)
{
	const struct ferry__knob *k;
	uint64_t v;
	int r = ferry__knobs_parse(t, key, text, origin, &k, &v);

	if (!r)
		ferry__knob_store(k, obj, v, text);
	return r;
}

int ferry__knobs_get(const struct ferry__knobs *t, const void *obj, const char *key, char *buf, size_t len,
		     const char *origin)
{
	const struct ferry__knob *k = ferry__knobs_find(t, key);
	uint64_t v;

	if (!k)
		return ferry__error(FERRY_EBADOPT, "%s: unknown knob '%s'", origin, key ? key : "(null)");
	if (k->type == FERRY__KNOB_TEXT)
		return snprintf(buf, len, "%s", (const char *)field(k, obj));
	v = ferry__knob_load(k, obj);
	if (k->type == FERRY__KNOB_ENUM) {
		for (uint64_t i = 0; k->choices[i]; i++)
			if (i == v)
				return snprintf(buf, len, "%s", k->choices[i]);
	}
	if (k->flags & FERRY__KNOB_SIGNED)
		return snprintf(buf, len, "%" PRId64, (int64_t)v);
	return snprintf(buf, len, "%" PRIu64, v);
}

/* Whether a process-wide row's variable was applied already; mark: record that it now is. */
static bool env_applied(const struct ferry__knob *k, bool mark)
{
	bool seen = false;

	pthread_mutex_lock(&knobs_mu);
	for (size_t i = 0; i < sizeof(env_done) / sizeof(env_done[0]); i++) {
		if (env_done[i] == k->global) {
			seen = true;
			break;
		}
		if (!env_done[i]) {
			if (mark)
				env_done[i] = k->global;
			break;
		}
	}
	pthread_mutex_unlock(&knobs_mu);
	return seen;
}

int ferry__knobs_init(const struct ferry__knobs *t, void *obj)
{
	for (size_t i = 0; i < t->n; i++) {
		const struct ferry__knob *k = &t->rows[i];
		if (k->global)
			continue; /* the process's, not this object's: set below, once */
		if (k->type == FERRY__KNOB_TEXT)
			ferry__knob_store(k, obj, 0, "");
		else
			ferry__knob_store(k, obj, k->def_fn ? k->def_fn() : k->def, NULL);
	}
	/* The one place a knob is read from the environment. */
	for (size_t i = 0; i < t->n; i++) {
		const struct ferry__knob *k = &t->rows[i];
		const char *v = k->env ? getenv(k->env) : NULL;
		int r;
		if (k->global && env_applied(k, false))
			continue;
		if (v && (r = ferry__knobs_set(t, obj, k->name, v, k->env)) < 0)
			return r;
		if (k->global)
			env_applied(k, true);
	}
	return 0;
}
