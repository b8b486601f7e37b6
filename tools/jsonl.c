/* JSON Lines for ferry pack (see ferry_jsonl.h), on the strict parser of src/base/json.c. */
#include <string.h>

#include "base/json.h"
#include "tools/ferry_jsonl.h"

const char *ferry_tools_jsonl_status_name(int status)
{
	static const char *const names[FERRY_JSONL__COUNT] = {"ok", "blank", "utf8", "json", "no_key", "type", "range"};
	return status >= 0 && status < FERRY_JSONL__COUNT ? names[status] : "?";
}

static int fail(struct ferry__json *j, struct ferry_jsonl_value *v, int status)
{
	if (!j->err) /* ferry__json_peek found no value: says 0 without recording why */
		ferry__json_fail(j, j->pos, j->pos >= j->len ? "unexpected end of JSON" : "expected a value");
	v->pos = j->err_pos;
	v->why = j->err;
	return status;
}

/* The number written at pos (for the message naming it), cut to fit. */
static void number_text(const char *b, size_t len, size_t pos, char *out, size_t cap)
{
	size_t n = 0;
	while (pos + n < len && n + 1 < cap && strchr("+-.0123456789eE", b[pos + n]) && b[pos + n])
		n++;
	memcpy(out, b + pos, n);
	out[n] = 0;
}

/* An array of integers in [0, max] at the parser's position; counts them. A status. */
static int int_array(struct ferry__json *j, uint64_t max, struct ferry_jsonl_value *v)
{
	if (ferry__json_array_begin(j))
		return fail(j, v, FERRY_JSONL_JSON);
	int r;
	while ((r = ferry__json_array_next(j)) == 1) {
		int t = ferry__json_peek(j);
		if (t != 'n') {
			if (!t)
				return fail(j, v, FERRY_JSONL_JSON);
			v->pos = j->pos;
			v->why = "a token id is not a number";
			return FERRY_JSONL_TYPE;
		}
		size_t at = j->pos;
		uint64_t x;
		if (ferry__json_uint(j, &x) || x > max) {
			number_text(j->buf, j->len, at, v->text, sizeof(v->text));
			v->pos = at;
			v->why = j->err && !strstr(j->err, "64 bits") ? "is not a non-negative integer" : "is out of range";
			return FERRY_JSONL_RANGE;
		}
		v->count++;
	}
	return r < 0 ? fail(j, v, FERRY_JSONL_JSON) : FERRY_JSONL_OK;
}

int ferry_tools_jsonl_scan(char *line, size_t len, const char *key, int want, uint64_t max,
			   struct ferry_jsonl_value *v)
{
	struct ferry__json j;
	memset(v, 0, sizeof(*v));
	size_t i = 0;
	while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
		i++;
	if (i == len)
		return FERRY_JSONL_BLANK;
	if (ferry__json_init(&j, line, len))
		return fail(&j, v, FERRY_JSONL_UTF8);
	if (!key || ferry__json_peek(&j) != '{') {
		if (ferry__json_skip(&j) || ferry__json_end(&j))
			return fail(&j, v, FERRY_JSONL_JSON);
		if (!key)
			return FERRY_JSONL_OK;
		v->pos = 0;
		v->why = "the line is not a JSON object";
		return FERRY_JSONL_NO_KEY;
	}
	size_t klen = strlen(key), kpos;
	int found = 0, status = FERRY_JSONL_OK, r;
	char *k;
	size_t kl;
	if (ferry__json_object_begin(&j))
		return fail(&j, v, FERRY_JSONL_JSON);
	while ((r = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (found || kl != klen || memcmp(k, key, klen)) {
			if (ferry__json_skip(&j))
				return fail(&j, v, FERRY_JSONL_JSON);
			continue;
		}
		found = 1;
		int t = ferry__json_peek(&j);
		v->start = j.pos;
		if (want == 's' && t == '"') {
			char *s;
			size_t n;
			if (ferry__json_string(&j, &s, &n))
				return fail(&j, v, FERRY_JSONL_JSON);
			v->count = n;
			/* every escape decodes shorter than it is written */
			v->escaped = n != j.pos - v->start - 2;
		} else if (want == 'a' && t == '[') {
			status = int_array(&j, max, v);
			if (status)
				return status; /* the parser stopped inside the array */
		} else {
			if (!t)
				return fail(&j, v, FERRY_JSONL_JSON);
			status = FERRY_JSONL_TYPE;
			v->pos = j.pos;
			v->why = want == 's' ? "the value is not a string" : "the value is not an array of token ids";
			if (ferry__json_skip(&j))
				return fail(&j, v, FERRY_JSONL_JSON);
		}
		v->end = j.pos;
	}
	if (r < 0 || ferry__json_end(&j))
		return fail(&j, v, FERRY_JSONL_JSON);
	if (!found) {
		v->pos = 0;
		v->why = NULL;
		return FERRY_JSONL_NO_KEY;
	}
	return status;
}

int ferry_tools_jsonl_string(char *lit, size_t len, char **out, size_t *out_len)
{
	struct ferry__json j;
	if (ferry__json_init(&j, lit, len) || ferry__json_string(&j, out, out_len) || ferry__json_end(&j))
		return -1;
	return 0;
}

int64_t ferry_tools_jsonl_ints(char *arr, size_t len, uint64_t max, void *out, size_t elem_size, uint64_t cap)
{
	struct ferry__json j;
	if (ferry__json_init(&j, arr, len) || ferry__json_array_begin(&j))
		return -1;
	uint64_t n = 0;
	int r;
	while ((r = ferry__json_array_next(&j)) == 1) {
		uint64_t x;
		if (n == cap || ferry__json_uint(&j, &x) || x > max)
			return -1;
		unsigned char *p = (unsigned char *)out + n * elem_size;
		if (elem_size == 1)
			*p = (unsigned char)x;
		else if (elem_size == 2) {
			uint16_t y = (uint16_t)x;
			memcpy(p, &y, 2);
		} else if (elem_size == 4) {
			uint32_t y = (uint32_t)x;
			memcpy(p, &y, 4);
		} else {
			memcpy(p, &x, 8);
		}
		n++;
	}
	if (r < 0 || ferry__json_end(&j))
		return -1;
	return (int64_t)n;
}
