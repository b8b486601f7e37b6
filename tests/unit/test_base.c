/* src/base: the string builder and JSON string writer, sizes, CRC-32C, byte order, xxh3, the
 * JSON-with-comments reader, and the durable-file module. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>

#include "ferry_test.h"
#include "base/base.h"
#include "base/byteorder.h"
#include "base/crc32c.h"
#include "base/durable.h"
#include "base/json.h"
#include "base/sbuf.h"
#include "base/xxh.h"
#include "engine/export.h"
#include "ferry/ckpt.h"
#include "ferry/data.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

/* xxhash's portable code, the reference for ferry's (xxh.c dispatches to AVX2 where it can) */
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_SCALAR
#include <xxhash.h>

/* ---------------------------------------------------------------------------------- sbuf, JSON */

static void json_is(const char *in, const char *want)
{
	struct ferry__sbuf b = {0};
	ferry__sbuf_json(&b, in);
	T_CHECK(!b.oom);
	T_EQ_STR(b.data, want);
	T_EQ_INT(b.len, strlen(want));
	ferry__sbuf_free(&b);
}

static void test_json_strings(void)
{
	json_is("plain", "\"plain\"");
	json_is("", "\"\"");
	json_is(NULL, "null");
	json_is("a\"b\\c", "\"a\\\"b\\\\c\"");
	json_is("\n\t\r", "\"\\n\\t\\r\"");
	json_is("\x01\x1f\x7f", "\"\\u0001\\u001f\\u007f\"");
	json_is("/", "\"/\"");
	/* valid UTF-8 passes through: é (2 bytes), € (3), U+1F600 (4) */
	json_is("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
	/* invalid UTF-8 becomes U+FFFD per byte: a Latin-1 byte, a lone continuation, an overlong,
	 * a surrogate, a sequence cut by the end of the string */
	json_is("\xe9t\xe9", "\"\\ufffdt\\ufffd\"");
	json_is("\x80", "\"\\ufffd\"");
	json_is("\xc0\xaf", "\"\\ufffd\\ufffd\"");
	json_is("\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");
	json_is("a\xe2\x82", "\"a\\ufffd\\ufffd\"");

	/* What the writer writes, the strict parser reads back to the same bytes. */
	const char *back = "q\"\\\n\x01 \xc3\xa9";
	struct ferry__sbuf b = {0};
	ferry__sbuf_json(&b, back);
	struct ferry__json j;
	char *s;
	size_t len;
	T_ASSERT(ferry__json_init(&j, b.data, b.len) == 0);
	T_EQ_INT(ferry__json_string(&j, &s, &len), 0);
	T_EQ_INT(len, strlen(back));
	T_CHECK(len == strlen(back) && !memcmp(s, back, len));
	ferry__sbuf_free(&b);
}

static void test_sbuf(void)
{
	struct ferry__sbuf b = {0};
	ferry__sbuf_puts(&b, "x=");
	ferry__sbuf_printf(&b, "%d,%s", 42, "y");
	ferry__sbuf_put(&b, "abc", 2);
	T_EQ_STR(b.data, "x=42,yab");
	T_EQ_INT(b.len, 8);
	/* growth past the first allocation keeps every byte */
	for (int i = 0; i < 1000; i++)
		ferry__sbuf_printf(&b, "%03d", i % 1000);
	T_EQ_INT(b.len, 8 + 3000);
	T_CHECK(!memcmp(b.data + 8 + 3 * 999, "999", 3) && b.data[b.len] == '\0');
	T_CHECK(!b.oom);

	/* A length that cannot be allocated sets oom; later appends do nothing; the text is kept. */
	size_t len = b.len;
	ferry__sbuf_put(&b, "z", SIZE_MAX / 2);
	T_CHECK(b.oom);
	ferry__sbuf_puts(&b, "more");
	ferry__sbuf_printf(&b, "%d", 7);
	ferry__sbuf_json(&b, "s");
	T_EQ_INT(b.len, len);
	ferry__sbuf_free(&b);
	T_CHECK(!b.oom && !b.data && !b.len);
	ferry__sbuf_puts(&b, "again");
	T_EQ_STR(b.data, "again");
	ferry__sbuf_free(&b);
}

/* ----------------------------------------------------------------------------------------- sizes */

static void test_sizes(void)
{
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{"0", 0},	   {"123", 123},	{"4k", 4096},		{"4K", 4096},
		{"4kb", 4096},	   {"4KiB", 4096},	{"1m", 1 << 20},	{"1MiB", 1 << 20},
		{"2g", 2ull << 30}, {"1.5g", 3ull << 29}, {"1t", 1ull << 40},
	};
	static const char *bad[] = {"", "-1", " 4k", "4x", "k", "4kk", "4 k", "1e30t", "nan", NULL};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 7;
		T_EQ_INT(ferry__parse_size(ok[i].s, &v), 0);
		if (v != ok[i].v)
			fprintf(stderr, "parse_size(\"%s\") = %llu, want %llu\n", ok[i].s, (unsigned long long)v,
				(unsigned long long)ok[i].v);
		T_CHECK(v == ok[i].v);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v;
		if (ferry__parse_size(bad[i], &v) != FERRY_EBADOPT) {
			fprintf(stderr, "parse_size(\"%s\") accepted\n", bad[i] ? bad[i] : "NULL");
			t_failures++;
		}
	}
}

/* ------------------------------------------------------------------------------ CRC-32C, xxh3 */

/* Bit at a time, from the definition (reflected polynomial 0x82F63B78). */
static uint32_t crc_ref(const uint8_t *p, size_t n)
{
	uint32_t c = ~0u;
	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
	}
	return ~c;
}

static void test_crc32c(void)
{
	uint8_t b[64];
	T_EQ_INT(ferry__crc32c(0, "123456789", 9), 0xe3069283u);
	T_EQ_INT(ferry__crc32c(0, "", 0), 0);
	/* RFC 3720, B.4 */
	memset(b, 0, 32);
	T_EQ_INT(ferry__crc32c(0, b, 32), 0x8a9136aau);
	memset(b, 0xff, 32);
	T_EQ_INT(ferry__crc32c(0, b, 32), 0x62a8ab43u);
	for (int i = 0; i < 32; i++)
		b[i] = (uint8_t)i;
	T_EQ_INT(ferry__crc32c(0, b, 32), 0x46dd794eu);
	/* every alignment and length up to 64, and continuation across any split */
	uint64_t seed = 0x1234;
	for (int i = 0; i < 64; i++)
		b[i] = (uint8_t)t_rand(&seed);
	for (size_t off = 0; off < 8; off++)
		for (size_t n = 0; off + n <= 64; n++) {
			uint32_t want = crc_ref(b + off, n);
			T_EQ_INT(ferry__crc32c(0, b + off, n), want);
			size_t cut = n / 3;
			T_EQ_INT(ferry__crc32c(ferry__crc32c(0, b + off, cut), b + off + cut, n - cut), want);
		}
}

static void test_xxh3(void)
{
	/* XXH3_64bits of the empty input, seed 0 (xxhash's own sanity vector) */
	T_EQ_INT(ferry__xxh3_64("", 0), 0x2d06800538d394c2ull);
	uint8_t buf[5000];
	uint64_t seed = 99;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)t_rand(&seed);
	struct ferry__xxh3 *h = ferry__xxh3_create();
	T_ASSERT(h);
	/* streaming in uneven pieces equals one shot, for short, medium and long inputs */
	size_t lens[] = {0, 3, 16, 17, 128, 129, 240, 241, 1024, 5000};
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		ferry__xxh3_reset(h);
		for (size_t done = 0; done < lens[k];) {
			size_t n = lens[k] - done < 77 ? lens[k] - done : 77;
			ferry__xxh3_update(h, buf + done, n);
			done += n;
		}
		T_CHECK(ferry__xxh3_digest(h) == ferry__xxh3_64(buf, lens[k]));
	}
	/* against xxhash's portable code: lengths around every path's edges (16, 128, 240, a 1,024-byte
	 * block, a stripe of 64), odd offsets, and 1 MiB + 3 in pieces of random sizes, so that the
	 * AVX2 code (where the CPU has it) and the streaming state's hand-over are both covered */
	size_t big = (1u << 20) + 3;
	uint8_t *b = malloc(big + 8);
	T_ASSERT(b);
	for (size_t i = 0; i < big + 8; i++)
		b[i] = (uint8_t)t_rand(&seed);
	int bad = 0;
	for (size_t off = 0; off < 8; off += 3)
		for (size_t n = 0; n <= 4200; n += n < 300 ? 1 : 61)
			bad += ferry__xxh3_64(b + off, n) != XXH3_64bits(b + off, n);
	T_EQ_INT(bad, 0);
	uint64_t want = XXH3_64bits(b + 1, big);
	T_CHECK(ferry__xxh3_64(b + 1, big) == want);
	for (int rep = 0; rep < 3; rep++) {
		ferry__xxh3_reset(h);
		for (size_t done = 0; done < big;) {
			size_t n = (size_t)(t_rand(&seed) % (rep == 0 ? 100 : rep == 1 ? 5000 : 300000)) + 1;
			n = n < big - done ? n : big - done;
			ferry__xxh3_update(h, b + 1 + done, n);
			done += n;
		}
		T_CHECK(ferry__xxh3_digest(h) == want);
	}
#if FERRY__XXH_AVX2
	if (__builtin_cpu_supports("avx2"))
		printf("xxh3: the AVX2 code checked against the portable one\n");
	else
		printf("xxh3: skipped the AVX2 code's check: this CPU has no AVX2 (the portable code ran)\n");
#endif
	free(b);
	ferry__xxh3_destroy(h);
	ferry__xxh3_destroy(NULL);
	uint64_t pub = 0;
	T_EQ_INT(ferry_xxh3(buf, 100, &pub), 0);
	T_CHECK(pub == ferry__xxh3_64(buf, 100));
}

/* The CLI's door to the same escaping and CRC (tools/ferry_tools.h). */
static void test_tools_helpers(void)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	T_ASSERT(f);
	T_EQ_INT(ferry_tools_json_string(f, "a\"\xe9\xc3\xa9\n"), 0);
	T_EQ_INT(ferry_tools_json_string(f, NULL), 0);
	fclose(f);
	T_EQ_STR(text, "\"a\\\"\\ufffd\xc3\xa9\\n\"null");
	free(text);
	T_EQ_INT(ferry_tools_crc32c(0, "123456789", 9), 0xe3069283u);
}

/* ------------------------------------------------------------------------------------ byte order */

static void test_byteorder(void)
{
	uint8_t b[9] = {0};
	ferry__wr64(b + 1, 0x0102030405060708ull);
	T_EQ_INT(b[1], 0x08);
	T_EQ_INT(b[8], 0x01);
	T_CHECK(ferry__rd64(b + 1) == 0x0102030405060708ull);
	ferry__wr32(b, 0xa1b2c3d4u);
	T_EQ_INT(b[0], 0xd4);
	T_EQ_INT(b[3], 0xa1);
	T_EQ_INT(ferry__rd32(b), 0xa1b2c3d4u);
	ferry__wr64(b, UINT64_MAX);
	T_CHECK(ferry__rd64(b) == UINT64_MAX);
}

/* ------------------------------------------------------------------------- JSON with comments */

static int cufile_bool(const char *text, const char *key)
{
	const char *const keys[] = {"properties", key, NULL};
	char *buf = strdup(text);
	size_t n = strlen(buf);
	int v = -2;
	ferry__jsonc_strip(buf, n);
	int r = ferry__json_find_bool(buf, n, keys, &v);
	free(buf);
	return r == 1 ? v : r == 0 ? -1 : -2;
}

static void test_hex(void)
{
	uint64_t v = 0;
	T_EQ_INT(ferry__hex_digits("00fF", 4, &v), 0);
	T_EQ_INT(v, 0xff);
	T_EQ_INT(ferry__hex_digits("0123456789abcdef", 16, &v), 0);
	T_CHECK(v == 0x0123456789abcdefull);
	T_EQ_INT(ferry__hex_digits("12g4", 4, &v), -1);
	T_EQ_INT(ferry__hex_digits("12", 4, &v), -1); /* the NUL is not a digit: never read past it */
}

static void test_jsonc(void)
{
	const char *doc =
		"{\n"
		"  // \"properties\": { \"use_pci_p2pdma\": true },\n"
		"  \"logging\": { \"dir\": \"/var/log // not a comment\", \"level\": \"ERROR\" },\n"
		"  /* block \"use_pci_p2pdma\": true\n  over lines */\n"
		"  \"properties\": {\n"
		"    \"text\": \"a /* not */ b, }\",\n"
		"    \"allow_compat_mode\": false, // trailing comment\n"
		"    \"list\": [ 1, 2, ],\n"
		"    \"use_pci_p2pdma\": true,\n"
		"  },\n"
		"}\n";
	T_EQ_INT(cufile_bool(doc, "use_pci_p2pdma"), 1);
	T_EQ_INT(cufile_bool(doc, "allow_compat_mode"), 0);
	T_EQ_INT(cufile_bool(doc, "absent"), -1);
	T_EQ_INT(cufile_bool(doc, "text"), -2); /* not a boolean */
	/* the strings survive stripping intact */
	char *buf = strdup(doc);
	ferry__jsonc_strip(buf, strlen(buf));
	T_CHECK(strstr(buf, "\"/var/log // not a comment\"") != NULL);
	T_CHECK(strstr(buf, "\"a /* not */ b, }\"") != NULL);
	T_CHECK(strstr(buf, "block") == NULL);
	free(buf);
	T_EQ_INT(cufile_bool("{ \"properties\": { \"use_pci_p2pdma\": false } }", "use_pci_p2pdma"), 0);
	T_EQ_INT(cufile_bool("{ \"properties\": 3 }", "use_pci_p2pdma"), -1);
	T_EQ_INT(cufile_bool("not json", "use_pci_p2pdma"), -2);
	T_EQ_INT(cufile_bool("{ \"properties\": { \"use_pci_p2pdma\": true } /* unterminated", "use_pci_p2pdma"), -2);
}

/* --------------------------------------------------------------------------------------- durable */

static char dir[2048];

static int count_entries(const char *d)
{
	DIR *dp = opendir(d);
	int n = 0;
	if (!dp)
		return -1;
	for (struct dirent *e; (e = readdir(dp));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(dp);
	return n;
}

static void slurp_is(const char *path, const char *want)
{
	char buf[256] = "";
	int fd = open(path, O_RDONLY);
	T_CHECK(fd >= 0);
	if (fd < 0)
		return;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	T_EQ_STR(buf, want);
}

static void test_durable(void)
{
	char p[4400], q[4200];
	snprintf(dir, sizeof(dir), "%s/test_base-%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
	int dfd = ferry__dir_open(dir, 0);
	T_ASSERT(dfd >= 0);

	/* exclusive create refuses an existing name, and a planted symlink without touching its target */
	int fd = ferry__create_excl(dfd, "a", 0, 0644);
	T_CHECK(fd >= 0);
	close(fd);
	T_EQ_INT(ferry__create_excl(dfd, "a", 0, 0644), -EEXIST);
	snprintf(p, sizeof(p), "%s/victim", dir);
	snprintf(q, sizeof(q), "%s/planted", dir);
	T_ASSERT(symlink(p, q) == 0);
	T_EQ_INT(ferry__create_excl(dfd, "planted", 0, 0644), -EEXIST);
	T_EQ_INT(access(p, F_OK), -1);
	T_EQ_INT(ferry__create_excl(dfd, "x/y", 0, 0644), -EINVAL);

	/* a whole-file write replaces, leaves nothing beside it; NOREPLACE refuses to replace */
	T_EQ_INT(ferry__durable_write(dfd, "m", "one", 3, 0644, 0), 0);
	T_EQ_INT(ferry__durable_write(dfd, "m", "two", 3, 0644, 0), 0);
	snprintf(p, sizeof(p), "%s/m", dir);
	slurp_is(p, "two");
	T_EQ_INT(ferry__durable_write(dfd, "m", "three", 5, 0644, FERRY__DURABLE_NOREPLACE), -EEXIST);
	slurp_is(p, "two");
	T_EQ_INT(ferry__durable_write(dfd, "n", "new", 3, 0644, FERRY__DURABLE_NOREPLACE), 0);
	T_EQ_INT(count_entries(dir), 4); /* a, planted, m, n */
	/* renaming onto the planted symlink replaces the link, never writes through it */
	T_EQ_INT(ferry__durable_write(dfd, "planted", "p", 1, 0644, 0), 0);
	snprintf(p, sizeof(p), "%s/victim", dir);
	T_EQ_INT(access(p, F_OK), -1);

	/* temporaries have unpredictable names; abort removes the one it made and nothing else */
	struct ferry__tmpfile t1, t2;
	T_EQ_INT(ferry__tmp_create(dfd, "m", 0644, 0, &t1), 0);
	T_EQ_INT(ferry__tmp_create(dfd, "m", 0644, 0, &t2), 0);
	T_CHECK(strncmp(t1.name, "m.tmp-", 6) == 0 && strlen(t1.name) == 6 + 16);
	T_CHECK(strcmp(t1.name, t2.name) != 0);
	ferry__tmp_abort(&t1);
	ferry__tmp_abort(&t1);
	T_EQ_INT(write(t2.fd, "four", 4), 4);
	T_EQ_INT(ferry__tmp_commit(&t2, 0), 0);
	ferry__tmp_abort(&t2); /* after commit: the final name is not its to remove */
	snprintf(p, sizeof(p), "%s/m", dir);
	slurp_is(p, "four");
	T_EQ_INT(count_entries(dir), 4);
	/* extra O_RDWR: a temporary that can be read back and mapped (the dataset cache maps it) */
	T_EQ_INT(ferry__tmp_create(dfd, "rw", 0644, O_RDWR, &t1), 0);
	T_EQ_INT(ftruncate(t1.fd, 4), 0);
	T_EQ_INT(pwrite(t1.fd, "rwok", 4, 0), 4);
	T_EQ_INT(pread(t1.fd, q, 4, 0), 4);
	ferry__tmp_abort(&t1);
	T_EQ_INT(count_entries(dir), 4);

	/* a recycled file adopted as the temporary of another name, then committed */
	T_EQ_INT(ferry__durable_write(dfd, "old", "recycled", 8, 0644, 0), 0);
	T_EQ_INT(ferry__tmp_adopt(dfd, dfd, "old", "fresh", 0, &t1), 1);
	T_CHECK(strncmp(t1.name, "fresh.tmp-", 10) == 0);
	T_EQ_INT(faccessat(dfd, "old", F_OK, 0), -1);
	T_EQ_INT(pwrite(t1.fd, "RE", 2, 0), 2);
	T_EQ_INT(ferry__tmp_commit(&t1, 0), 0);
	snprintf(p, sizeof(p), "%s/fresh", dir);
	slurp_is(p, "REcycled");
	T_EQ_INT(ferry__tmp_adopt(dfd, dfd, "old", "fresh", 0, &t1), 0); /* gone: nothing to adopt */
	/* a symlink planted as the recycled file is refused and removed; its target is untouched */
	snprintf(p, sizeof(p), "%s/m", dir);
	T_ASSERT(symlinkat(p, dfd, "old") == 0);
	T_CHECK(ferry__tmp_adopt(dfd, dfd, "old", "fresh", 0, &t1) < 0);
	slurp_is(p, "four");
	T_EQ_INT(unlinkat(dfd, "fresh", 0), 0);
	T_EQ_INT(count_entries(dir), 4);
	/* adopted from another directory (a checkpoint's recycle/), committed without the directory
	 * fsync (the caller's to do) */
	T_ASSERT(mkdirat(dfd, "rec", 0755) == 0);
	int rdfd = openat(dfd, "rec", O_DIRECTORY | O_CLOEXEC);
	T_ASSERT(rdfd >= 0);
	T_EQ_INT(ferry__durable_write(rdfd, "old", "elsewhere", 9, 0644, 0), 0);
	T_EQ_INT(ferry__tmp_adopt(dfd, rdfd, "old", "moved", 0, &t1), 1);
	T_EQ_INT(faccessat(rdfd, "old", F_OK, 0), -1);
	T_EQ_INT(ferry__tmp_commit(&t1, FERRY__DURABLE_NOSYNC | FERRY__DURABLE_NODIRSYNC), 0);
	snprintf(p, sizeof(p), "%s/moved", dir);
	slurp_is(p, "elsewhere");
	close(rdfd);
	T_EQ_INT(unlinkat(dfd, "moved", 0), 0);
	T_EQ_INT(unlinkat(dfd, "rec", AT_REMOVEDIR), 0);

	/* a write that fails (file size limit: EFBIG) leaves no temporary behind */
	struct rlimit old, small = {.rlim_cur = 2, .rlim_max = RLIM_INFINITY};
	getrlimit(RLIMIT_FSIZE, &old);
	small.rlim_max = old.rlim_max;
	signal(SIGXFSZ, SIG_IGN);
	T_ASSERT(setrlimit(RLIMIT_FSIZE, &small) == 0);
	int r = ferry__durable_write(dfd, "big", "0123456789", 10, 0644, 0);
	setrlimit(RLIMIT_FSIZE, &old);
	T_EQ_INT(r, -EFBIG);
	T_CHECK(strstr(ferry_last_error(), "big.tmp-") != NULL);
	T_EQ_INT(count_entries(dir), 4);

	/* writes go through the descriptor: renaming the directory does not redirect them */
	snprintf(q, sizeof(q), "%s.moved", dir);
	T_ASSERT(rename(dir, q) == 0);
	T_ASSERT(mkdir(dir, 0755) == 0);
	T_EQ_INT(ferry__durable_write(dfd, "after", "x", 1, 0644, 0), 0);
	T_EQ_INT(count_entries(dir), 0);
	snprintf(p, sizeof(p), "%s/after", q);
	slurp_is(p, "x");
	close(dfd);

	/* directories: a symlinked one is refused unless followed on purpose */
	snprintf(p, sizeof(p), "%s/link", dir);
	T_ASSERT(symlink(q, p) == 0);
	int e = ferry__dir_open(p, 0);
	T_CHECK(e < 0);
	if (e >= 0)
		close(e);
	e = ferry__dir_open(p, FERRY__DIR_FOLLOW);
	T_CHECK(e >= 0);
	if (e >= 0)
		close(e);
	/* the path forms: write_durable through a followed directory, fsync_dir, fsync_parent */
	snprintf(p, sizeof(p), "%s/link/manifest.json", dir);
	T_EQ_INT(ferry__write_durable(p, "{}", 2), 0);
	snprintf(p, sizeof(p), "%s/manifest.json", q);
	slurp_is(p, "{}");
	T_EQ_INT(ferry__fsync_dir(q), 0);
	T_EQ_INT(ferry__fsync_parent(p), 0);
	snprintf(p, sizeof(p), "%s/nonexistent/f", dir);
	T_EQ_INT(ferry__write_durable(p, "x", 1), -ENOENT);

	T_CHECK(t_rmtree(dir) == 0 && t_rmtree(q) == 0);
}

/* 1 if directory d holds exactly the names in want (NULL-terminated), in any order. */
static int holds_exactly(const char *d, const char *const *want)
{
	int n = 0;
	for (; want[n]; n++) {
		char p[4400];
		snprintf(p, sizeof(p), "%s/%s", d, want[n]);
		if (access(p, F_OK)) {
			fprintf(stderr, "%s: missing\n", p);
			return 0;
		}
	}
	if (count_entries(d) != n) {
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "ls -la '%s' >&2", d);
		if (system(cmd)) {
		}
		return 0;
	}
	return 1;
}

/* The dataset writer's files go through the durable module: its data files sit under temporary
 * names until finish renames them, and a writer destroyed unfinished leaves nothing behind. */
static void test_dataset_writer_files(void)
{
	ferry_ctx *ctx;
	char d[2100], p[2200];
	uint8_t sample[100] = {1, 2, 3};
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(d, sizeof(d), "%s/test_base-ds-%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(d, 0755) == 0);
	for (int kind = 0; kind < 2; kind++) {
		int ferry = kind == 0;
		snprintf(p, sizeof(p), "%s/%s", d, ferry ? "set" : "out");
		for (int finish = 0; finish < 2; finish++) {
			ferry_dataset_writer *w;
			T_ASSERT(ferry_dataset_writer_create(ctx, p, ferry ? FERRY_WRITE_FERRY : FERRY_WRITE_MEGATRON,
							     FERRY_DT_U8, 0, &w) == 0);
			for (int i = 0; i < 3; i++)
				T_ASSERT(ferry_dataset_writer_add(w, sizeof(sample), NULL, 0, 1) == i);
			T_EQ_INT(ferry_dataset_writer_layout(w), 1);
			for (int i = 0; i < 3; i++)
				T_EQ_INT(ferry_dataset_writer_put(w, (uint64_t)i, sample, sizeof(sample)), 0);
			/* laid out and written, not finished: no data file under its final name yet */
			const char *wdir = ferry ? p : d;
			char bin[2300];
			snprintf(bin, sizeof(bin), ferry ? "%s/shard-00000.fsh" : "%s.bin", p);
			T_EQ_INT(access(bin, F_OK), -1);
			T_EQ_INT(count_entries(wdir), ferry ? 1 : 2); /* the temporary (and set/) */
			if (finish)
				T_EQ_INT(ferry_dataset_writer_finish(w), 0);
			ferry_dataset_writer_destroy(w);
			const char *done_ferry[] = {"shard-00000.fsh", "ferry.idx", NULL};
			const char *done_meg[] = {"set", "out.bin", "out.idx", NULL};
			const char *none_ferry[] = {NULL};
			const char *none_meg[] = {"set", NULL};
			T_CHECK(holds_exactly(wdir, finish ? (ferry ? done_ferry : done_meg) : (ferry ? none_ferry : none_meg)));
		}
		ferry_dataset *ds;
		T_EQ_INT(ferry_dataset_open(ctx, p, &ds), 0);
		ferry_dataset_destroy(ds);
	}
	ferry_ctx_destroy(ctx);
	T_CHECK(t_rmtree(d) == 0);
}

/* A run id is text (the knob refuses '"', '\\' and newlines, not other control characters): the
 * manifest and the markers escape it (it was pasted into the JSON as is). */
static void test_ckpt_run_escaped(void)
{
	ferry_ctx *ctx;
	ferry_ckpt *ck;
	char d[2100], p[2300];
	static uint8_t data[4096];
	uint64_t shape[1] = {sizeof(data)};
	snprintf(d, sizeof(d), "%s/test_base-ck-%d", t_tmpdir(), (int)getpid());
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ckpt_open(ctx, d, 0, 1, &ck) == 0);
	T_EQ_INT(ferry_ckpt_set(ck, "run", "job\t7 \x01 \xc3\xa9"), 0);
	T_CHECK(ferry_ckpt_add(ck, "w", FERRY_DT_U8, 1, shape, data, sizeof(data)) >= 0);
	T_EQ_INT(ferry_ckpt_save(ck, 1), 0);
	T_EQ_INT(ferry_ckpt_latest(d), 1);
	T_EQ_INT(ferry_ckpt_world(d, 1), 1);
	T_EQ_INT(ferry_ckpt_verify(ctx, d, 1, 1), 0);
	T_ASSERT(ferry_ckpt_step_path(d, 1, p, sizeof(p) - 16) > 0);
	strcat(p, "/manifest.json");
	char text[1024] = "";
	FILE *f = fopen(p, "r");
	T_CHECK(f != NULL);
	if (f) {
		size_t n = fread(text, 1, sizeof(text) - 1, f);
		text[n] = '\0';
		fclose(f);
	}
	T_CHECK(strstr(text, "\"run\":\"job\\t7 \\u0001 \xc3\xa9\"") != NULL);
	ferry_ckpt_destroy(ck);
	ferry_ctx_destroy(ctx);
	T_CHECK(t_rmtree(d) == 0);
}

/*
 * The writer opens the temporary it made through the directory and checks it is the same file
 * (issue 20): a name pointed elsewhere between making and opening (renamed over, a symlink) is
 * refused with -ESTALE instead of written.
 */
static void test_open_made(void)
{
	char odir[600];
	snprintf(odir, sizeof(odir), "%s/open-made-%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(odir, 0755) == 0);
	int dfd = ferry__dir_open(odir, 0);
	T_ASSERT(dfd >= 0);
	ferry_ctx *ctx;
	ferry_file *f;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	struct ferry__tmpfile t;
	T_ASSERT(ferry__tmp_create(dfd, "x", 0644, 0, &t) == 0);
	T_EQ_INT(ferry__file_open_made(ctx, dfd, t.name, t.fd, "dir/x.tmp", FERRY_O_WRONLY, &f), 0);
	ferry_file_destroy(f);
	/* another file renamed over the temporary's name */
	int other = openat(dfd, "other", O_CREAT | O_EXCL | O_WRONLY, 0644);
	T_ASSERT(other >= 0);
	close(other);
	T_ASSERT(renameat(dfd, "other", dfd, t.name) == 0);
	T_EQ_INT(ferry__file_open_made(ctx, dfd, t.name, t.fd, "dir/x.tmp", FERRY_O_WRONLY, &f), -ESTALE);
	/* a symlink there, to a file elsewhere: not followed */
	T_ASSERT(unlinkat(dfd, t.name, 0) == 0 && symlinkat("/etc/hostname", dfd, t.name) == 0);
	T_CHECK(ferry__file_open_made(ctx, dfd, t.name, t.fd, "dir/x.tmp", FERRY_O_WRONLY, &f) < 0);
	ferry__tmp_abort(&t);
	(void)unlinkat(dfd, t.name, 0);
	close(dfd);
	T_ASSERT(rmdir(odir) == 0);
	ferry_ctx_destroy(ctx);
}

/*
 * ferry__json_string's word-at-a-time scan (plain_run) against a plain reading: a quote, a
 * backslash escape or a control character at every position of strings of 0-40 bytes, so that
 * each falls at every place in an 8-byte word, with escapes before and after moving the text.
 */
static void test_json_string_runs(void)
{
	char text[128], buf[128];
	for (int len = 0; len <= 40; len++) {
		for (int at = 0; at <= len; at++) {
			for (int kind = 0; kind < 3; kind++) {
				/* "xxxx<special>yyyy" with kind 0: \n escape, 1: \u00e9, 2: a raw tab (refused) */
				int n = 0;
				text[n++] = '"';
				for (int i = 0; i < len; i++) {
					if (i == at)
						n += snprintf(text + n, sizeof(text) - (size_t)n, "%s",
							      kind == 0 ? "\\n" : kind == 1 ? "\\u00e9" : "\t");
					text[n++] = (char)('a' + i % 26);
				}
				text[n++] = '"';
				memcpy(buf, text, (size_t)n);
				struct ferry__json j;
				char *out;
				size_t olen;
				T_ASSERT(ferry__json_init(&j, buf, (size_t)n) == 0);
				int r = ferry__json_string(&j, &out, &olen);
				if (kind == 2 && at < len) {
					T_CHECK(r != 0);
					continue;
				}
				T_EQ_INT(r, 0);
				if (r)
					continue;
				char want[128];
				size_t w = 0;
				for (int i = 0; i < len; i++) {
					if (i == at && kind == 0)
						want[w++] = '\n';
					if (i == at && kind == 1) {
						want[w++] = (char)0xc3;
						want[w++] = (char)0xa9;
					}
					want[w++] = (char)('a' + i % 26);
				}
				T_EQ_INT(olen, w);
				T_CHECK(olen == w && !memcmp(out, want, w));
			}
		}
	}
}

int main(void)
{
	test_json_strings();
	test_sbuf();
	test_sizes();
	test_crc32c();
	test_xxh3();
	test_byteorder();
	test_tools_helpers();
	test_hex();
	test_jsonc();
	test_durable();
	test_dataset_writer_files();
	test_ckpt_run_escaped();
	test_open_made();
	test_json_string_runs();
	return t_result();
}
