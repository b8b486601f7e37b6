/* The knob engine (src/base/knob.h): each row type, ranges, messages, environment variables read
 * once per object (once per process for a process-wide row); every object's knobs through the
 * public API; and every knob of every object documented in docs/CONFIG.md. */
#include <stddef.h>

#include "ferry_test.h"
#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "ferry/data.h"
#include "ferry/ferry.h"
#include "base/knob.h"
#include "ckpt/save.h"

struct cfg {
	uint64_t u, sz;
	uint32_t b;
	int e, dev;
	char text[8];
	uint64_t computed;
};

static int global_level;
static const char *const colours[] = {"red", "green", "blue", NULL};

static uint64_t forty_two(void) { return 42; }

static int parse_dev(const char *text, uint64_t *out)
{
	if (!strcmp(text, "cpu")) {
		*out = (uint64_t)-1;
		return 0;
	}
	char *end;
	*out = strtoull(text, &end, 10);
	return *text && !*end ? 0 : FERRY_EBADOPT;
}

static const struct ferry__knob rows[] = {
	{.name = "u", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct cfg, u), .def = 3, .min = 1, .max = 9,
	 .env = "FERRY_TEST_KNOB_U"},
	{.name = "sz", .type = FERRY__KNOB_SIZE, FERRY__KNOB_AT(struct cfg, sz), .def = 4096, .min = 4096,
	 .max = 1u << 30, .align = 4096},
	{.name = "b", .type = FERRY__KNOB_BOOL, FERRY__KNOB_AT(struct cfg, b), .def = 1, .max = 1},
	{.name = "e", .type = FERRY__KNOB_ENUM, FERRY__KNOB_AT(struct cfg, e), .def = 2, .max = 2,
	 .choices = colours, .flags = FERRY__KNOB_NUMBERED_FROM_1},
	{.name = "dev", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct cfg, dev), .def = (uint64_t)-1,
	 .min = (uint64_t)-1, .max = 7, .flags = FERRY__KNOB_SIGNED, .parse = parse_dev, .expect = "cpu or N"},
	{.name = "text", .type = FERRY__KNOB_TEXT, FERRY__KNOB_AT(struct cfg, text)},
	{.name = "computed", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct cfg, computed), .max = 100,
	 .def_fn = forty_two},
	{.name = "level", .type = FERRY__KNOB_UINT, .width = sizeof(int), .max = 4, .global = &global_level,
	 .env = "FERRY_TEST_KNOB_LEVEL"},
};
static const char *keys[sizeof(rows) / sizeof(rows[0]) + 1];
static const struct ferry__knobs table = {"test", rows, sizeof(rows) / sizeof(rows[0]), keys};

/* The detail begins with want (ferry__error may add the code's name after it). */
#define T_ERR_STARTS(want) T_CHECK(!strncmp(ferry_last_error(), want, strlen(want)))

static const char *get(const struct cfg *c, const char *key)
{
	static char buf[64];
	if (ferry__knobs_get(&table, c, key, buf, sizeof(buf), "get") < 0)
		return "(error)";
	return buf;
}

static void test_engine(void)
{
	struct cfg c, d;

	unsetenv("FERRY_TEST_KNOB_U");
	setenv("FERRY_TEST_KNOB_LEVEL", "3", 1);
	memset(&c, 0xa5, sizeof(c));
	T_EQ_INT(ferry__knobs_init(&table, &c), 0);
	T_EQ_INT(c.u, 3);
	T_EQ_INT(c.sz, 4096);
	T_EQ_INT(c.b, 1);
	T_EQ_INT(c.e, 2);
	T_EQ_INT(c.dev, -1);
	T_EQ_STR(c.text, "");
	T_EQ_INT(c.computed, 42);
	T_EQ_INT(global_level, 3); /* the process-wide row: from its variable, the first time */
	T_EQ_STR(get(&c, "e"), "blue");
	T_EQ_STR(get(&c, "dev"), "-1");

	/* sizes with suffixes and alignment; the message names the knob, the value, what it expects */
	T_EQ_INT(ferry__knobs_set(&table, &c, "sz", "8k", "set"), 0);
	T_EQ_INT(c.sz, 8192);
	T_EQ_INT(ferry__knobs_set(&table, &c, "sz", "5000", "set"), FERRY_EBADOPT);
	T_ERR_STARTS("set: sz='5000' is not valid; expected a size from 4096 to 1073741824 "
		     "bytes (suffixes k, m, g), a multiple of 4k");
	T_EQ_INT(ferry__knobs_set(&table, &c, "u", "10", "set"), FERRY_EBADOPT);
	T_ERR_STARTS("set: u='10' is not valid; expected an integer from 1 to 9");
	T_EQ_INT(ferry__knobs_set(&table, &c, "u", "0x5", "set"), FERRY_EBADOPT); /* decimal only */
	T_EQ_INT(ferry__knobs_set(&table, &c, "u", "9", "set"), 0);
	T_EQ_INT(c.u, 9);
	T_EQ_INT(ferry__knobs_set(&table, &c, "b", "2", "set"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "expected 0 or 1") != NULL);
	T_EQ_INT(ferry__knobs_set(&table, &c, "b", "0", "set"), 0);
	T_EQ_INT(c.b, 0);
	/* enums by name or by number (here gdsio's: 0 names the second choice) */
	T_EQ_INT(ferry__knobs_set(&table, &c, "e", "red", "set"), 0);
	T_EQ_INT(c.e, 0);
	T_EQ_INT(ferry__knobs_set(&table, &c, "e", "0", "set"), 0);
	T_EQ_STR(get(&c, "e"), "green");
	T_EQ_INT(ferry__knobs_set(&table, &c, "e", "2", "set"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "one of red, green, blue") != NULL);
	/* a parse hook, a signed field, its own words for what it expects */
	T_EQ_INT(ferry__knobs_set(&table, &c, "dev", "5", "set"), 0);
	T_EQ_INT(c.dev, 5);
	T_EQ_INT(ferry__knobs_set(&table, &c, "dev", "8", "set"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "expected cpu or N") != NULL);
	T_EQ_INT(ferry__knobs_set(&table, &c, "dev", "cpu", "set"), 0);
	T_EQ_INT(c.dev, -1);
	/* text: length and characters a JSON string or a marker line could not hold */
	T_EQ_INT(ferry__knobs_set(&table, &c, "text", "run-1", "set"), 0);
	T_EQ_STR(get(&c, "text"), "run-1");
	T_EQ_INT(ferry__knobs_set(&table, &c, "text", "12345678", "set"), FERRY_EBADOPT);
	T_EQ_INT(ferry__knobs_set(&table, &c, "text", "a\"b", "set"), FERRY_EBADOPT);
	T_EQ_STR(c.text, "run-1");
	/* unknown keys and NULL values */
	T_EQ_INT(ferry__knobs_set(&table, &c, "nope", "1", "set"), FERRY_EBADOPT);
	T_ERR_STARTS("set: unknown knob 'nope'");
	T_EQ_INT(ferry__knobs_set(&table, &c, "u", NULL, "set"), FERRY_EBADOPT);
	T_EQ_INT(ferry__knobs_get(&table, &c, "nope", NULL, 0, "get"), FERRY_EBADOPT);
	/* keys in the table's order */
	const char *const *k = ferry__knobs_keys(&table);
	T_EQ_STR(k[0], "u");
	T_EQ_STR(k[7], "level");
	T_CHECK(k[8] == NULL);

	/* environment: applied at creation; a bad value fails naming the variable; the process-wide
	 * row is read once per process, so what the program set stays */
	global_level = 1;
	setenv("FERRY_TEST_KNOB_U", "7", 1);
	T_EQ_INT(ferry__knobs_init(&table, &d), 0);
	T_EQ_INT(d.u, 7);
	T_EQ_INT(global_level, 1);
	setenv("FERRY_TEST_KNOB_U", "77", 1);
	T_EQ_INT(ferry__knobs_init(&table, &d), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "FERRY_TEST_KNOB_U: u='77'") != NULL);
	unsetenv("FERRY_TEST_KNOB_U");
	unsetenv("FERRY_TEST_KNOB_LEVEL");
}

/* The context's log_level is the process's: every context reads and writes the same level. */
static void test_context(void)
{
	ferry_ctx *a, *b;
	char buf[32];

	T_ASSERT(ferry_ctx_create(&a) == 0);
	T_ASSERT(ferry_ctx_create(&b) == 0);
	T_EQ_INT(ferry_ctx_set(a, "log_level", "1"), 0);
	T_CHECK(ferry_ctx_get(b, "log_level", buf, sizeof(buf)) > 0);
	T_EQ_STR(buf, "1");
	setenv("FERRY_LOG_LEVEL", "3", 1); /* read once per process: a later context keeps 1 */
	ferry_ctx *c;
	T_ASSERT(ferry_ctx_create(&c) == 0);
	T_CHECK(ferry_ctx_get(c, "log_level", buf, sizeof(buf)) > 0);
	T_EQ_STR(buf, "1");
	unsetenv("FERRY_LOG_LEVEL");
	T_EQ_INT(ferry_ctx_set(a, "log_level", "0"), 0);
	/* the io_uring setup knobs that were environment variables only */
	T_CHECK(ferry_ctx_get(a, "uring_defer", buf, sizeof(buf)) > 0);
	T_EQ_STR(buf, "1");
	T_CHECK(ferry_ctx_get(a, "uring_no_coop", buf, sizeof(buf)) > 0);
	T_EQ_STR(buf, "0");
	/* save_prealloc is the writer's now */
	T_EQ_INT(ferry_ctx_get(a, "save_prealloc", buf, sizeof(buf)), FERRY_EBADOPT);
	/* the ring setup knobs shape the rings: fixed once the workers run */
	T_EQ_INT(ferry_ctx_set(b, "uring_defer", "0"), 0);
	T_EQ_INT(ferry_ctx_set(b, "threads", "1"), 0);
	T_EQ_INT(ferry_ctx_start(b), 0);
	T_EQ_INT(ferry_ctx_set(b, "uring_defer", "1"), FERRY_EBUSY);
	T_EQ_INT(ferry_ctx_set(b, "uring_no_coop", "1"), FERRY_EBUSY);
	T_EQ_INT(ferry_ctx_set(b, "cached_depth", "8"), 0); /* not a shape: still changes */
	ferry_ctx_destroy(c);
	ferry_ctx_destroy(b);
	ferry_ctx_destroy(a);
}

/* The writer's knobs: defaults (16 MiB pieces, 8 in flight, prealloc auto), environment, and the
 * checkpoint passing them on. */
static void test_writer_and_ckpt(void)
{
	ferry_ctx *ctx;
	ferry_st_writer *w;
	char dir[] = "/tmp/ferry-knobs-XXXXXX";
	char buf[32];

	T_ASSERT(mkdtemp(dir) != NULL);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	T_EQ_STR(ferry_st_writer_keys()[0], "save_prealloc");
	const struct ferry__knobs *t = &ferry__st_writer_knobs;
	T_EQ_INT(ferry__knobs_find(t, "save_chunk_mib")->def, 16);
	T_EQ_INT(ferry__knobs_find(t, "save_inflight")->def, 8);
	T_EQ_INT(ferry__knobs_find(t, "save_prealloc")->def, 0); /* auto */
	T_EQ_INT(ferry_st_writer_set(w, "save_inflight", "65"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "save_inflight='65'") && strstr(ferry_last_error(), "from 1 to 64"));
	T_EQ_INT(ferry_st_writer_set(w, "save_prealloc", "on"), 0);
	ferry_st_writer_destroy(w);
	setenv("FERRY_SAVE_CHUNK_MIB", "0", 1);
	T_EQ_INT(ferry_st_writer_create(ctx, &w), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "FERRY_SAVE_CHUNK_MIB") != NULL);
	unsetenv("FERRY_SAVE_CHUNK_MIB");

	ferry_ckpt *ck;
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	T_EQ_INT(ferry_ckpt_set(ck, "save_prealloc", "off"), 0);
	T_EQ_INT(ferry_ckpt_set(ck, "save_prealloc", "sometimes"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "save_prealloc") != NULL);
	T_EQ_INT(ferry_ckpt_set(ck, "keep", "-1"), FERRY_EBADOPT);
	T_EQ_INT(ferry_ckpt_set(ck, "run", "a\"b"), FERRY_EBADOPT);
	T_EQ_INT(ferry_ckpt_set(ck, "busy", "refuse"), 0);
	T_EQ_INT(ferry_ckpt_set(ck, "nope", "1"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "unknown knob 'nope'") != NULL);
	ferry_ckpt_destroy(ck);
	ferry_ctx_destroy(ctx);
	T_CHECK(snprintf(buf, sizeof(buf), "%s", dir) > 0 && rmdir(buf) == 0);
}

/* Every key of every object appears in CONFIG.md as a table row, "| `key` |". */
static void test_documented(void)
{
	char path[4096];
	const char *src = __FILE__;
	const char *cut = strstr(src, "tests/unit/test_knobs.c");
	snprintf(path, sizeof(path), "%.*sdocs/CONFIG.md", cut ? (int)(cut - src) : 0, src);
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "SKIP documentation check: %s: %s\n", path, strerror(errno));
		return;
	}
	static char doc[1 << 20];
	size_t n = fread(doc, 1, sizeof(doc) - 1, f);
	fclose(f);
	doc[n] = '\0';
	const struct {
		const char *object;
		const char *const *keys;
	} objects[] = {
		{"context", ferry_ctx_keys()},
		{"loader", ferry_loader_keys()},
		{"checkpoint", ferry_ckpt_keys()},
		{"safetensors writer", ferry_st_writer_keys()},
		{"compressed file", ferry_cz_keys()},
	};
	for (size_t o = 0; o < sizeof(objects) / sizeof(objects[0]); o++)
		for (const char *const *k = objects[o].keys; *k; k++) {
			char row[96];
			snprintf(row, sizeof(row), "| `%s` |", *k);
			if (!strstr(doc, row)) {
				fprintf(stderr, "FAIL: the %s knob %s is not documented in %s (no row \"%s\")\n",
					objects[o].object, *k, path, row);
				t_failures++;
			}
		}
	/* and the environment variables of the writer's knobs (the context's are FERRY_<KEY>) */
	for (size_t i = 0; i < ferry__st_writer_knobs.n; i++) {
		const char *env = ferry__st_writer_knobs.rows[i].env;
		if (env && !strstr(doc, env)) {
			fprintf(stderr, "FAIL: %s is not documented in %s\n", env, path);
			t_failures++;
		}
	}
}

int main(void)
{
	test_engine();
	test_context();
	test_writer_and_ckpt();
	test_documented();
	return t_result();
}
