/*
 * JSON Lines for `ferry pack`: one line checked, and one member's value taken from it, with the
 * library's strict JSON parser (src/base/json.h), so that the CLI holds no JSON parser of its own.
 * A line is parsed in place (its strings are decoded into the caller's buffer).
 */
#ifndef FERRY_TOOLS_JSONL_H
#define FERRY_TOOLS_JSONL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a line is; every value but OK and BLANK is a reason to refuse (or, asked, skip) the line. */
enum ferry_jsonl_status {
	FERRY_JSONL_OK = 0,
	FERRY_JSONL_BLANK,  /* only whitespace: not a sample */
	FERRY_JSONL_UTF8,   /* not valid UTF-8 (RFC 3629) */
	FERRY_JSONL_JSON,   /* not exactly one JSON value (RFC 8259) */
	FERRY_JSONL_NO_KEY, /* not an object, or an object without the member */
	FERRY_JSONL_TYPE,   /* the member is not a string (text) or not an array (token ids) */
	FERRY_JSONL_RANGE,  /* a token id that is not an integer, negative, or above the maximum */
	FERRY_JSONL__COUNT
};

/* A word for each status ("utf8", "json", "no_key", "type", "range"), the summary's keys. */
const char *ferry_tools_jsonl_status_name(int status);

/* What ferry_tools_jsonl_scan found. */
struct ferry_jsonl_value {
	size_t start, end; /* the member's value in the line as written: [start, end), quotes included */
	uint64_t count;    /* a string's decoded bytes, or an array's elements */
	int escaped;       /* the string holds an escape (its decoded bytes differ from the written) */
	size_t pos;        /* where the problem is (status other than OK) */
	const char *why;   /* and what it is (NULL for a missing member: nothing more to say) */
	char text[48];     /* the offending token id as written (FERRY_JSONL_RANGE), cut to fit */
};

/*
 * Checks the line (len bytes, no newline) and, when key is not NULL, finds the object member key
 * (the first one of that name): want 's' for a string, 'a' for an array of integers in
 * [0, max]. Returns a status; line's strings are decoded in place (the caller keeps its own copy
 * of the bytes it needs as written).
 */
int ferry_tools_jsonl_scan(char *line, size_t len, const char *key, int want, uint64_t max,
			   struct ferry_jsonl_value *v);
/*
 * A string literal as written (quotes included, len bytes), decoded in place: its bytes at *out,
 * *out_len of them. 0 or -1 (not one valid string literal).
 */
int ferry_tools_jsonl_string(char *lit, size_t len, char **out, size_t *out_len);
/*
 * An array of integers as written, each in [0, max], stored as elem_size-byte (1, 2, 4, 8)
 * host-order integers at out, which holds cap elements. Returns the number of elements or -1.
 */
int64_t ferry_tools_jsonl_ints(char *arr, size_t len, uint64_t max, void *out, size_t elem_size, uint64_t cap);

#ifdef __cplusplus
}
#endif
#endif
