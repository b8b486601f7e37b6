/*
 * A strict pull parser for JSON (RFC 8259) over a caller-owned, writable buffer: nothing is
 * allocated; strings are decoded in place (an escape never decodes longer than it is written).
 * The whole buffer must be valid UTF-8. Used for safetensors headers and shard indexes, which are
 * untrusted input (tests/fuzz/fuzz_safetensors.c).
 */
#ifndef FERRY_FORMAT_JSON_H
#define FERRY_FORMAT_JSON_H

#include <stddef.h>
#include <stdint.h>

#define FERRY__JSON_MAX_DEPTH 64

struct ferry__json {
	char *buf;
	size_t len;
	size_t pos;
	int depth;
	/* Set on the first error: byte offset in buf and a short reason. */
	size_t err_pos;
	const char *err;
	/* Per open container: 1 once its first member has been read. */
	unsigned char started[FERRY__JSON_MAX_DEPTH];
};

/* Returns 0, or -1 (err set) when buf is not valid UTF-8 (err_pos at the first bad byte). */
int ferry__json_init(struct ferry__json *j, char *buf, size_t len);
/* The type of the next value: '{', '[', '"', 'n' (number), 't', 'f', 'z' (null), or 0 at the end/error. */
int ferry__json_peek(struct ferry__json *j);
/* Expects '{' / '['. Returns 0 or -1. */
int ferry__json_object_begin(struct ferry__json *j);
int ferry__json_array_begin(struct ferry__json *j);
/*
 * Next member of the innermost object: returns 1 with its key (decoded, NUL-terminated in place,
 * *klen bytes, may hold NUL bytes) and the parser placed at the value; 0 at '}'; -1 on error.
 * *kpos is the byte offset of the key's opening quote.
 */
int ferry__json_object_next(struct ferry__json *j, char **key, size_t *klen, size_t *kpos);
/* Next element of the innermost array: 1 (parser at the element), 0 at ']', -1 on error. */
int ferry__json_array_next(struct ferry__json *j);
/* A string value, decoded in place. Returns 0 or -1. */
int ferry__json_string(struct ferry__json *j, char **s, size_t *len);
/* A non-negative integer without fraction or exponent that fits in 64 bits. Returns 0 or -1. */
int ferry__json_uint(struct ferry__json *j, uint64_t *out);
/* true or false. Returns 0 (*out 1 or 0) or -1. */
int ferry__json_bool(struct ferry__json *j, int *out);
/* Skips any value (depth-limited). Returns 0 or -1. */
int ferry__json_skip(struct ferry__json *j);
/* Only whitespace may remain. Returns 0 or -1. */
int ferry__json_end(struct ferry__json *j);
/*
 * Length of the valid UTF-8 sequence at s, of the n bytes there (RFC 3629: no overlongs,
 * surrogates or code points above U+10FFFF), or 0 if none starts there.
 */
size_t ferry__utf8_seq(const char *s, size_t n);
/* Exactly n hex digits (either case; n <= 16) at s. Returns 0 or -1 (a byte that is not one). */
int ferry__hex_digits(const char *s, size_t n, uint64_t *out);
/* 1 if s[0..len) is valid UTF-8 (RFC 3629), else 0. */
int ferry__utf8_valid(const char *s, size_t len);
/*
 * Configuration files written as JSON with comments (cuFile's cufile.json: // and block comments,
 * and trailing commas before '}' or ']', which cuFile's own reader accepts): blanks the comments
 * and those commas in place, outside strings, so that the strict parser reads the rest.
 */
void ferry__jsonc_strip(char *buf, size_t len);
/*
 * The boolean at a path of object keys (NULL-terminated: {"properties", "use_pci_p2pdma", NULL})
 * in the JSON document buf (parsed whole, in place, so modified): 1 with *out set, 0 when the
 * path is absent (the first occurrence of each key counts), -1 when buf is not one JSON object or
 * the value is not a boolean.
 */
int ferry__json_find_bool(char *buf, size_t len, const char *const *keys, int *out);
/* Records an error of the caller's own (a schema error) at pos; returns -1. */
int ferry__json_fail(struct ferry__json *j, size_t pos, const char *why);

#endif
