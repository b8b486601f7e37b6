/* Strict JSON pull parser (see json.h). */
#include <string.h>

#include "base/json.h"

int ferry__json_fail(struct ferry__json *j, size_t pos, const char *why)
{
	if (!j->err) {
		j->err = why;
		j->err_pos = pos;
	}
	return -1;
}

size_t ferry__utf8_seq(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
			return 0;
		if (c == 0xe0 && s[1] < 0xa0)
			return 0; /* overlong */
		if (c == 0xed && s[1] >= 0xa0)
			return 0; /* surrogate */
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		if (c == 0xf0 && s[1] < 0x90)
			return 0;
		if (c == 0xf4 && s[1] >= 0x90)
			return 0;
		return 4;
	}
	return 0;
}

int ferry__utf8_valid(const char *str, size_t len)
{
	const unsigned char *s = (const unsigned char *)str;
	for (size_t i = 0; i < len;) {
		size_t k = s[i] < 0x80 ? 1 : ferry__utf8_seq((const char *)s + i, len - i);
		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

int ferry__json_init(struct ferry__json *j, char *buf, size_t len)
{
	memset(j, 0, sizeof(*j));
	j->buf = buf;
	j->len = len;
	const unsigned char *s = (const unsigned char *)buf;
	for (size_t i = 0; i < len;) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		size_t k = ferry__utf8_seq((const char *)s + i, len - i);
		if (!k)
			return ferry__json_fail(j, i, "invalid UTF-8");
		i += k;
	}
	return 0;
}

static void skip_ws(struct ferry__json *j)
{
	while (j->pos < j->len) {
		char c = j->buf[j->pos];
		if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
			break;
		j->pos++;
	}
}

int ferry__json_peek(struct ferry__json *j)
{
	if (j->err)
		return 0;
	skip_ws(j);
	if (j->pos >= j->len)
		return 0;
	char c = j->buf[j->pos];
	switch (c) {
	case '{': case '[': case '"': case 't': case 'f':
		return c;
	case 'n':
		return 'z';
	default:
		return (c == '-' || (c >= '0' && c <= '9')) ? 'n' : 0;
	}
}

static int expect(struct ferry__json *j, char c, const char *why)
{
	if (j->err)
		return -1;
	skip_ws(j);
	if (j->pos >= j->len)
		return ferry__json_fail(j, j->pos, "unexpected end of JSON");
	if (j->buf[j->pos] != c)
		return ferry__json_fail(j, j->pos, why);
	j->pos++;
	return 0;
}

static int open_container(struct ferry__json *j, char c, const char *why)
{
	if (expect(j, c, why))
		return -1;
	if (j->depth >= FERRY__JSON_MAX_DEPTH)
		return ferry__json_fail(j, j->pos - 1, "JSON nested too deeply");
	j->started[j->depth++] = 0;
	return 0;
}

int ferry__json_object_begin(struct ferry__json *j)
{
	return open_container(j, '{', "expected an object");
}

int ferry__json_array_begin(struct ferry__json *j)
{
	return open_container(j, '[', "expected an array");
}

/* Common part of object_next/array_next: 1 if a member follows, 0 at the closing bracket. */
static int container_next(struct ferry__json *j, char close)
{
	if (j->err)
		return -1;
	if (j->depth <= 0)
		return ferry__json_fail(j, j->pos, "no open container");
	skip_ws(j);
	if (j->pos >= j->len)
		return ferry__json_fail(j, j->pos, "unexpected end of JSON");
	char c = j->buf[j->pos];
	unsigned char *st = &j->started[j->depth - 1];
	if (c == close) {
		j->pos++;
		j->depth--;
		return 0;
	}
	if (*st) {
		if (c != ',')
			return ferry__json_fail(j, j->pos, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
		j->pos++;
		skip_ws(j);
		if (j->pos < j->len && j->buf[j->pos] == close)
			return ferry__json_fail(j, j->pos, "trailing comma");
	}
	*st = 1;
	return 1;
}

int ferry__hex_digits(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint64_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint64_t)(c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

static int hex4(const char *s, unsigned *out)
{
	uint64_t v;
	if (ferry__hex_digits(s, 4, &v))
		return -1;
	*out = (unsigned)v;
	return 0;
}

/*
 * The length of the run at p of bytes a string copies as they are: not '"', '\\' or a control
 * character. Eight bytes at a time (a word holds one of them when one of these is nonzero; a
 * false alarm only hands the word to the byte loop): long text fields are most of what a JSON
 * Lines corpus holds, and ferry pack --json-key spent half its time here byte by byte.
 */
static size_t plain_run(const unsigned char *p, size_t n)
{
	const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v, q, s;
		memcpy(&v, p + i, 8);
		q = v ^ (ones * '"');
		s = v ^ (ones * '\\');
		if ((((q - ones) & ~q) | ((s - ones) & ~s) | ((v - ones * 0x20) & ~v)) & high)
			break;
	}
	for (; i < n; i++)
		if (p[i] == '"' || p[i] == '\\' || p[i] < 0x20)
			break;
	return i;
}

int ferry__json_string(struct ferry__json *j, char **out, size_t *olen)
{
	if (expect(j, '"', "expected a string"))
		return -1;
	char *b = j->buf;
	size_t r = j->pos, w = j->pos, start = j->pos;
	for (;;) {
		size_t run = r < j->len ? plain_run((const unsigned char *)b + r, j->len - r) : 0;
		if (run) {
			if (w != r) /* an escape before shortened the text: move the run down */
				memmove(b + w, b + r, run);
			w += run;
			r += run;
		}
		if (r >= j->len)
			return ferry__json_fail(j, start - 1, "unterminated string");
		unsigned char c = (unsigned char)b[r];
		if (c == '"')
			break;
		if (c < 0x20)
			return ferry__json_fail(j, r, "control character in string");
		if (c != '\\') {
			b[w++] = b[r++];
			continue;
		}
		if (r + 1 >= j->len)
			return ferry__json_fail(j, r, "unterminated escape");
		char e = b[r + 1];
		const char *simple = strchr("\"\\/bfnrt", e);
		if (e && simple) {
			static const char map[] = "\"\\/\b\f\n\r\t";
			b[w++] = map[simple - "\"\\/bfnrt"];
			r += 2;
			continue;
		}
		if (e != 'u')
			return ferry__json_fail(j, r, "invalid escape");
		unsigned cp, lo;
		if (r + 6 > j->len || hex4(b + r + 2, &cp))
			return ferry__json_fail(j, r, "invalid \\u escape");
		size_t esc = 6;
		if (cp >= 0xdc00 && cp <= 0xdfff)
			return ferry__json_fail(j, r, "lone low surrogate");
		if (cp >= 0xd800 && cp <= 0xdbff) {
			if (r + 12 > j->len || b[r + 6] != '\\' || b[r + 7] != 'u' || hex4(b + r + 8, &lo) ||
			    lo < 0xdc00 || lo > 0xdfff)
				return ferry__json_fail(j, r, "lone high surrogate");
			cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			esc = 12;
		}
		if (cp < 0x80) {
			b[w++] = (char)cp;
		} else if (cp < 0x800) {
			b[w++] = (char)(0xc0 | (cp >> 6));
			b[w++] = (char)(0x80 | (cp & 0x3f));
		} else if (cp < 0x10000) {
			b[w++] = (char)(0xe0 | (cp >> 12));
			b[w++] = (char)(0x80 | ((cp >> 6) & 0x3f));
			b[w++] = (char)(0x80 | (cp & 0x3f));
		} else {
			b[w++] = (char)(0xf0 | (cp >> 18));
			b[w++] = (char)(0x80 | ((cp >> 12) & 0x3f));
			b[w++] = (char)(0x80 | ((cp >> 6) & 0x3f));
			b[w++] = (char)(0x80 | (cp & 0x3f));
		}
		r += esc;
	}
	j->pos = r + 1;
	b[w] = '\0'; /* w <= r: the closing quote or an escape already consumed */
	*out = b + start;
	*olen = w - start;
	return 0;
}

/* Scans a JSON number at pos; sets *is_uint when it is a plain non-negative integer. */
static int scan_number(struct ferry__json *j, size_t *end, int *is_uint)
{
	const char *b = j->buf;
	size_t p = j->pos, n = j->len;
	*is_uint = 1;
	if (p < n && b[p] == '-') {
		*is_uint = 0;
		p++;
	}
	if (p >= n || b[p] < '0' || b[p] > '9')
		return ferry__json_fail(j, j->pos, "invalid number");
	if (b[p] == '0') {
		p++;
		if (p < n && b[p] >= '0' && b[p] <= '9')
			return ferry__json_fail(j, j->pos, "leading zero in number");
	} else {
		while (p < n && b[p] >= '0' && b[p] <= '9')
			p++;
	}
	if (p < n && b[p] == '.') {
		*is_uint = 0;
		p++;
		if (p >= n || b[p] < '0' || b[p] > '9')
			return ferry__json_fail(j, j->pos, "invalid number");
		while (p < n && b[p] >= '0' && b[p] <= '9')
			p++;
	}
	if (p < n && (b[p] == 'e' || b[p] == 'E')) {
		*is_uint = 0;
		p++;
		if (p < n && (b[p] == '+' || b[p] == '-'))
			p++;
		if (p >= n || b[p] < '0' || b[p] > '9')
			return ferry__json_fail(j, j->pos, "invalid number");
		while (p < n && b[p] >= '0' && b[p] <= '9')
			p++;
	}
	*end = p;
	return 0;
}

int ferry__json_uint(struct ferry__json *j, uint64_t *out)
{
	if (j->err)
		return -1;
	skip_ws(j);
	size_t end;
	int is_uint;
	if (j->pos >= j->len)
		return ferry__json_fail(j, j->pos, "unexpected end of JSON");
	if (scan_number(j, &end, &is_uint))
		return -1;
	if (!is_uint)
		return ferry__json_fail(j, j->pos, "expected a non-negative integer");
	uint64_t v = 0;
	for (size_t p = j->pos; p < end; p++) {
		unsigned d = (unsigned)(j->buf[p] - '0');
		if (v > (UINT64_MAX - d) / 10)
			return ferry__json_fail(j, j->pos, "integer does not fit in 64 bits");
		v = v * 10 + d;
	}
	j->pos = end;
	*out = v;
	return 0;
}

static int literal(struct ferry__json *j, const char *word)
{
	size_t n = strlen(word);
	if (j->len - j->pos < n || memcmp(j->buf + j->pos, word, n))
		return ferry__json_fail(j, j->pos, "invalid literal");
	j->pos += n;
	return 0;
}

int ferry__json_skip(struct ferry__json *j)
{
	char *s;
	size_t len, end, kpos;
	int is_uint, r;
	switch (ferry__json_peek(j)) {
	case '{':
		if (ferry__json_object_begin(j))
			return -1;
		while ((r = ferry__json_object_next(j, &s, &len, &kpos)) == 1)
			if (ferry__json_skip(j))
				return -1;
		return r;
	case '[':
		if (ferry__json_array_begin(j))
			return -1;
		while ((r = ferry__json_array_next(j)) == 1)
			if (ferry__json_skip(j))
				return -1;
		return r;
	case '"':
		return ferry__json_string(j, &s, &len);
	case 'n':
		if (scan_number(j, &end, &is_uint))
			return -1;
		j->pos = end;
		return 0;
	case 't':
	case 'f':
		return ferry__json_bool(j, &r);
	case 'z':
		return literal(j, "null");
	default:
		if (j->err)
			return -1;
		return ferry__json_fail(j, j->pos, j->pos >= j->len ? "unexpected end of JSON" : "expected a value");
	}
}

int ferry__json_object_next(struct ferry__json *j, char **key, size_t *klen, size_t *kpos)
{
	int r = container_next(j, '}');
	if (r != 1)
		return r;
	skip_ws(j);
	*kpos = j->pos;
	if (ferry__json_string(j, key, klen) || expect(j, ':', "expected ':'"))
		return -1;
	return 1;
}

int ferry__json_array_next(struct ferry__json *j)
{
	return container_next(j, ']');
}

int ferry__json_end(struct ferry__json *j)
{
	if (j->err)
		return -1;
	skip_ws(j);
	if (j->pos != j->len)
		return ferry__json_fail(j, j->pos, "trailing characters after JSON");
	return 0;
}

int ferry__json_bool(struct ferry__json *j, int *out)
{
	switch (ferry__json_peek(j)) {
	case 't':
		*out = 1;
		return literal(j, "true");
	case 'f':
		*out = 0;
		return literal(j, "false");
	default:
		if (j->err)
			return -1;
		return ferry__json_fail(j, j->pos, "expected true or false");
	}
}

/* Blanks from p up to (not including) end. */
static void blank(char *p, const char *end)
{
	while (p < end)
		*p++ = ' ';
}

void ferry__jsonc_strip(char *buf, size_t len)
{
	char *end = buf + len;
	for (char *p = buf; p < end; p++) {
		if (*p == '"') {
			for (p++; p < end && *p != '"'; p++)
				if (*p == '\\' && p + 1 < end)
					p++;
		} else if (*p == '/' && p + 1 < end && p[1] == '/') {
			char *nl = memchr(p, '\n', (size_t)(end - p));
			blank(p, nl ? nl : end);
			p = nl ? nl : end - 1;
		} else if (*p == '/' && p + 1 < end && p[1] == '*') {
			char *q = p + 2;
			while (q + 1 < end && !(q[0] == '*' && q[1] == '/'))
				q++;
			q = q + 1 < end ? q + 2 : end; /* an unterminated comment runs to the end */
			blank(p, q);
			p = q - 1;
		}
	}
	/* Now without comments: a ',' whose next non-space character closes its container goes. */
	for (char *p = buf; p < end; p++) {
		if (*p == '"') {
			for (p++; p < end && *p != '"'; p++)
				if (*p == '\\' && p + 1 < end)
					p++;
		} else if (*p == ',') {
			char *q = p + 1;
			while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
				q++;
			if (q < end && (*q == '}' || *q == ']'))
				*p = ' ';
		}
	}
}

int ferry__json_find_bool(char *buf, size_t len, const char *const *keys, int *out)
{
	struct ferry__json j;
	int depth = 1, done = 0, found = 0; /* depth: objects open along the path */
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		return -1;
	while (depth) {
		char *k;
		size_t klen, kpos;
		int r = ferry__json_object_next(&j, &k, &klen, &kpos);
		if (r < 0)
			return -1;
		if (r == 0) { /* back in the parent: the path's first occurrence is behind us */
			depth--;
			done = 1;
			continue;
		}
		const char *want = keys[depth - 1];
		if (done || klen != strlen(want) || memcmp(k, want, klen)) {
			if (ferry__json_skip(&j))
				return -1;
		} else if (!keys[depth]) {
			if (ferry__json_bool(&j, out))
				return -1;
			found = done = 1;
		} else if (ferry__json_peek(&j) == '{') {
			if (ferry__json_object_begin(&j))
				return -1;
			depth++;
		} else {
			done = 1;
			if (ferry__json_skip(&j))
				return -1;
		}
	}
	return ferry__json_end(&j) ? -1 : found;
}
