/*
 * Knobs declared as data rows (fio's parse.h, zstd's setParameter): every object that has knobs
 * (the context, the loader, the checkpoint, the safetensors writer) describes them in one table of
 * rows, and this engine sets them by name from text, reads them back as text, lists their names and
 * applies their environment variables. Knobs are read from the environment here only, when an
 * object is created (ferry__knobs_init). docs/CONFIG.md documents every row; tests/unit/test_knobs.c checks it.
 */
#ifndef FERRY_BASE_KNOB_H
#define FERRY_BASE_KNOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ferry__knob_type {
	FERRY__KNOB_UINT, /* an unsigned integer from min to max */
	FERRY__KNOB_SIZE, /* bytes, with suffixes k, m, g (ferry__parse_size), from min to max */
	FERRY__KNOB_BOOL, /* 0 or 1 */
	FERRY__KNOB_ENUM, /* one of choices; the stored value is the index */
	FERRY__KNOB_TEXT, /* text of fewer than max bytes, stored in a char array */
};

enum {
	FERRY__KNOB_FIXED = 1 << 0,    /* cannot change once the owner has started (the owner checks) */
	FERRY__KNOB_NUMBERED = 1 << 1, /* ENUM: a single digit d also names choices[d] */
	FERRY__KNOB_NUMBERED_FROM_1 = 1 << 2, /* ENUM: d names choices[d + 1] (gdsio's -x numbers) */
	FERRY__KNOB_C_INT = 1 << 3,    /* UINT: C syntax (0x hex, 0 octal), as strtoull(base 0) reads */
	FERRY__KNOB_SIGNED = 1 << 4,   /* a signed field: min, max and the text compare as int64_t */
};

struct ferry__knob {
	const char *name;
	enum ferry__knob_type type;
	size_t offset; /* of the field in the owner's struct */
	size_t width;  /* of the field: 1, 2, 4 or 8 (integers), or the char array's size (TEXT) */
	uint64_t def, min, max;
	uint64_t align;                 /* SIZE: a multiple of this, or 0 */
	const char *const *choices;     /* ENUM: names, NULL-terminated */
	const char *env;                /* its environment variable, or NULL for none */
	unsigned flags;                 /* FERRY__KNOB_* */
	uint64_t (*def_fn)(void);       /* a default computed at creation (replaces def), or NULL */
	/* Optional: parses text (replacing the type's syntax; min and max still apply) and says what it
	 * expects, for values the type cannot say (a device: cpu, -1, N, cuda:N). */
	int (*parse)(const char *text, uint64_t *out);
	const char *expect;
	void *global; /* a process-wide setting: stored here, not in the owner (offset unused) */
	const char *doc; /* one line: what it does */
};

/* A row's field of struct type, in a designated initializer: its offset and width. */
#define FERRY__KNOB_AT(type, field) .offset = offsetof(type, field), .width = sizeof(((type *)0)->field)

struct ferry__knobs {
	const char *owner; /* "context", "loader", ...: for messages */
	const struct ferry__knob *rows;
	size_t n;
	const char **keys; /* n + 1 slots: the names, NULL-terminated, filled by ferry__knobs_keys */
};

/* Sets every row of obj to its default, then applies the rows' environment variables (a
 * process-wide row's once per process). Returns 0, or FERRY_EBADOPT naming the variable. */
int ferry__knobs_init(const struct ferry__knobs *t, void *obj);
/* The row called name, or NULL. */
const struct ferry__knob *ferry__knobs_find(const struct ferry__knobs *t, const char *name);
/*
 * Parses text for key. Returns 0 with *row and *v (TEXT rows: *v is 0, ferry__knob_store takes the
 * text), or FERRY_EBADOPT with a detail "origin: unknown knob 'key'" or "origin: key='text' is not
 * valid; expected <what the row accepts>".
 */
int ferry__knobs_parse(const struct ferry__knobs *t, const char *key, const char *text, const char *origin,
		       const struct ferry__knob **row, uint64_t *v);
/* The row's value in obj (a process-wide row: the process's). Not for TEXT rows. */
uint64_t ferry__knob_load(const struct ferry__knob *k, const void *obj);
/* Stores v (TEXT rows: text) into obj's field (a process-wide row: the process's). */
void ferry__knob_store(const struct ferry__knob *k, void *obj, uint64_t v, const char *text);
/* Parse, then store. Returns 0 or FERRY_EBADOPT (as ferry__knobs_parse). */
int ferry__knobs_set(const struct ferry__knobs *t, void *obj, const char *key, const char *text,
		     const char *origin);
/* Writes key's value as text into buf (as snprintf). Returns its length or FERRY_EBADOPT. */
int ferry__knobs_get(const struct ferry__knobs *t, const void *obj, const char *key, char *buf, size_t len,
		     const char *origin);
/* The names, NULL-terminated, in the table's order. */
const char *const *ferry__knobs_keys(const struct ferry__knobs *t);
/* What a row accepts, as a sentence's end: "an integer from 1 to 256", "one of auto, on, off". */
void ferry__knob_describe(const struct ferry__knob *k, char *buf, size_t len);

#endif
