/* ferry ckpt: inspect, verify and benchmark safetensors files and checkpoint directories. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_torch.h"
#include "commands.h"
#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"
#include "progress.h"

#define PATH_ABOUT                                                                                       \
	"PATH: a .safetensors file, a model.safetensors.index.json, a directory holding either,\n"          \
	"a checkpoint step directory (step-N), a checkpoint directory (its latest step, or --step N),\n"    \
	"a torch.distributed.checkpoint directory (it holds .metadata) or a torch.save file (.pt, .bin)."

struct inspect_opts {
	int json;
	uint64_t step;
};

static const struct cli_opt inspect_rows[] = {
	{.name = "json", .kind = CLI_FLAG, .off = offsetof(struct inspect_opts, json),
	 .help = "one JSON object (metadata values in full)"},
	{.name = "step", .kind = CLI_U64, .off = offsetof(struct inspect_opts, step), .arg = "N",
	 .help = "of a checkpoint directory: this step instead of the latest"},
	{.name = NULL},
};

/* A command of one PATH. */
#define PATH_COMMAND(nm, syn, text, rows)                                                                \
	{                                                                                                \
		.name = nm, .synopsis = syn, .about = text "\n" PATH_ABOUT, .opts = rows, .min_args = 1, \
		.max_args = 1, .args = "PATH",                                                           \
	}

static const struct cli_cmd inspect_cmd = PATH_COMMAND(
	"ckpt inspect", "ferry ckpt inspect PATH [--json] [--step N]",
	"Lists the tensors (dtypes, shapes, offsets) and the metadata, per shard for a checkpoint step.\n"
	"Text output cuts metadata values longer than 120 bytes (saying how many bytes it cut).",
	inspect_rows);

struct verify_opts {
	int json, require_sums, quiet;
	uint64_t step;
};

static const struct cli_opt verify_rows[] = {
	{.name = "json", .kind = CLI_FLAG, .off = offsetof(struct verify_opts, json), .help = "one JSON object"},
	{.name = "step", .kind = CLI_U64, .off = offsetof(struct verify_opts, step), .arg = "N",
	 .help = "of a checkpoint directory: this step instead of the latest"},
	{.name = "require-checksums", .kind = CLI_FLAG, .off = offsetof(struct verify_opts, require_sums),
	 .help = "a tensor without a stored checksum is a failure"},
	{.name = "quiet", .kind = CLI_FLAG, .off = offsetof(struct verify_opts, quiet),
	 .help = "no progress line on a terminal"},
	{.name = NULL},
};

static const struct cli_cmd verify_cmd = PATH_COMMAND(
	"ckpt verify", "ferry ckpt verify PATH [--json] [--step N] [--require-checksums]",
	"Checks a checkpoint step by the rules of ferry.checkpoint.verify (ferry_ckpt_verify): manifest\n"
	"present and well-formed, its world equal to the shards it lists and to the files present, each\n"
	"shard's name, size, structure, step/run/rank/world metadata and every stored checksum; reports\n"
	"every problem found. A plain file or index: structure and checksums. A DCP directory: every item\n"
	"inside its file, each item's zip and crc32s; a torch.save file: its crc32s and storages\n"
	"(docs/CLI.md). Exits 1 if one fails.",
	verify_rows);

#define META_SHOWN 120

/* What PATH names: a checkpoint step (dir and step set) or a plain file, index or directory. */
struct target {
	int is_step;
	char dir[4096];
	int64_t step;
};

static int64_t parse_step(const char *s)
{
	if (strncmp(s, "step-", 5) || !s[5])
		return -1;
	int64_t v = 0;
	for (s += 5; *s; s++) {
		if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v;
}

static int has_step_dirs(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;
	while (d && !found && (e = readdir(d)))
		found = parse_step(e->d_name) >= 0;
	if (d)
		closedir(d);
	return found;
}

/*
 * resolve() of an s3:// URL (docs/REMOTE.md): .../step-N is that step of the prefix before it; a
 * prefix with a `latest` object (or --step) is a checkpoint; anything else one object (a file).
 */
static int resolve_url(const struct cli_cmd *cmd, const struct cli_args *a, int has_step, uint64_t step,
		       struct target *t)
{
	char *base = strrchr(t->dir, '/');
	int64_t s = base ? parse_step(base + 1) : -1;
	if (s >= 0) {
		if (has_step && (uint64_t)s != step)
			return cli_usage_error(cmd, a, "--step %llu, but %s is step %lld", (unsigned long long)step,
					       t->dir, (long long)s);
		*base = '\0';
	} else if (has_step) {
		if (step > INT64_MAX)
			return cli_usage_error(cmd, a, "--step %llu is out of range", (unsigned long long)step);
		s = (int64_t)step;
	} else {
		s = ferry_ckpt_latest(t->dir);
		if (s == -ENOENT)
			return 0; /* no `latest`: an object */
		if (s < 0)
			return fprintf(stderr, "ferry %s: %s: %s\n", cmd->name, ferry_strerror((int)s), ferry_last_error()), 1;
	}
	t->is_step = 1;
	t->step = s;
	return 0;
}

/*
 * Resolves PATH: a step directory (step-N, with or without a trailing '/'), a checkpoint directory
 * (it has `latest`, or --step was given), else a plain path. Returns 0, 1 after an error printed,
 * or 2 (a usage error printed).
 */
static int resolve(const struct cli_cmd *cmd, const struct cli_args *a, const char *path, int has_step,
		   uint64_t step, struct target *t)
{
	struct stat st;
	char p[4200];
	memset(t, 0, sizeof(*t));
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n >= sizeof(t->dir))
		return fprintf(stderr, "ferry %s: %s: path too long\n", cmd->name, path), 1;
	memcpy(t->dir, path, n);
	t->dir[n] = '\0';
	if (strstr(t->dir, "://"))
		return resolve_url(cmd, a, has_step, step, t);
	if (stat(t->dir, &st) || !S_ISDIR(st.st_mode)) {
		if (has_step)
			return cli_usage_error(cmd, a, "--step is for a checkpoint directory, and %s is not one", path);
		return 0;
	}
	char *base = strrchr(t->dir, '/');
	int64_t s = parse_step(base ? base + 1 : t->dir);
	if (s >= 0) {
		if (has_step && (uint64_t)s != step)
			return cli_usage_error(cmd, a, "--step %llu, but %s is step %lld", (unsigned long long)step, path,
					       (long long)s);
		if (!base)
			strcpy(t->dir, ".");
		else if (base == t->dir)
			strcpy(t->dir, "/");
		else
			*base = '\0';
		t->is_step = 1;
		t->step = s;
		return 0;
	}
	snprintf(p, sizeof(p), "%s/latest", t->dir);
	if (has_step) {
		if (step > INT64_MAX)
			return cli_usage_error(cmd, a, "--step %llu is out of range", (unsigned long long)step);
		t->is_step = 1;
		t->step = (int64_t)step;
	} else if (!access(p, F_OK)) {
		int64_t l = ferry_ckpt_latest(t->dir);
		if (l < 0)
			return fprintf(stderr, "ferry %s: %s: %s\n", cmd->name, ferry_strerror((int)l), ferry_last_error()), 1;
		t->is_step = 1;
		t->step = l;
	} else if (has_step_dirs(t->dir)) {
		return fprintf(stderr, "ferry %s: %s: a checkpoint directory without `latest`: no step committed (--step N "
				       "names one)\n", cmd->name, path), 1;
	}
	return 0;
}

static void json_key_u64(const char *key, uint64_t v, int comma)
{
	printf("%s\"%s\":%" PRIu64, comma ? "," : "", key, v);
}

/* ---------------------------------------------------------------------------------------- inspect */

/* Text: a value longer than META_SHOWN bytes is cut at a character boundary, saying how much. */
static void print_meta_text(const char *key, const char *value)
{
	size_t n = strlen(value);
	if (n <= META_SHOWN) {
		printf("  metadata %s = %s\n", key, value);
		return;
	}
	size_t k = META_SHOWN;
	while (k > 0 && ((unsigned char)value[k] & 0xC0) == 0x80)
		k--;
	printf("  metadata %s = %.*s... (%zu of %zu bytes cut; --json prints all)\n", key, (int)k, value, n - k, n);
}

/* A shard in ferry's compressed format (a compressed checkpoint's): its codec and ratio; else nothing. */
static void print_compressed(ferry_ctx *ctx, const char *path, int json)
{
	ferry_cz *z = NULL;
	if (ferry_cz_is_compressed(ctx, path) != 1 || ferry_cz_open(ctx, path, &z))
		return;
	int64_t size = ferry_cz_size(z), csize = ferry_cz_compressed_size(z);
	double ratio = csize > 0 ? (double)size / (double)csize : 0;
	if (json)
		printf(",\"compressed\":{\"codec\":\"%s\",\"bytes\":%lld,\"compressed_bytes\":%lld,\"ratio\":%.4f,"
		       "\"chunk_size\":%lld,\"chunks\":%lld,\"stored_chunks\":%lld}",
		       ferry_cz_codec_name(ferry_cz_codec(z)), (long long)size, (long long)csize, ratio,
		       (long long)ferry_cz_chunk_size(z), (long long)ferry_cz_chunks(z), (long long)ferry_cz_stored_chunks(z));
	else
		printf("  compressed: %s, ratio %.3f (%lld bytes in %lld), %lld chunks of %lld bytes, %lld stored\n",
		       ferry_cz_codec_name(ferry_cz_codec(z)), ratio, (long long)size, (long long)csize,
		       (long long)ferry_cz_chunks(z), (long long)ferry_cz_chunk_size(z), (long long)ferry_cz_stored_chunks(z));
	ferry_cz_destroy(z);
}

static void print_file(ferry_ctx *ctx, ferry_st *st, int json, int first, int rank)
{
	uint64_t dims[FERRY_ST_MAX_DIMS];
	if (json) {
		printf("%s{\"path\":", first ? "" : ",");
		ferry_tools_json_string(stdout, ferry_st_path(st));
		if (rank >= 0)
			printf(",\"rank\":%d", rank);
		print_compressed(ctx, ferry_st_path(st), 1);
		printf(",\"data_start\":%" PRIu64 ",\"metadata\":{", ferry_st_data_start(st));
		for (size_t m = 0; m < ferry_st_metadata_count(st); m++) {
			printf("%s", m ? "," : "");
			ferry_tools_json_string(stdout, ferry_st_metadata_key(st, m));
			putchar(':');
			ferry_tools_json_string(stdout, ferry_st_metadata_value(st, m));
		}
		printf("},\"tensors\":[");
	} else {
		printf("%s: %zu tensors, data at byte %" PRIu64 "\n", ferry_st_path(st), ferry_st_count(st),
		       ferry_st_data_start(st));
		print_compressed(ctx, ferry_st_path(st), 0);
		for (size_t m = 0; m < ferry_st_metadata_count(st); m++)
			print_meta_text(ferry_st_metadata_key(st, m), ferry_st_metadata_value(st, m));
	}
	for (size_t i = 0; i < ferry_st_count(st); i++) {
		int nd = ferry_st_shape(st, i, dims, FERRY_ST_MAX_DIMS);
		if (json) {
			printf("%s{\"name\":", i ? "," : "");
			ferry_tools_json_string(stdout, ferry_st_name(st, i));
			printf(",\"dtype\":\"%s\",\"shape\":[", ferry_dtype_name(ferry_st_dtype(st, i)));
			for (int d = 0; d < nd; d++)
				printf("%s%" PRIu64, d ? "," : "", dims[d]);
			printf("],\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", ferry_st_offset(st, i), ferry_st_nbytes(st, i));
		} else {
			printf("  %-48s %-8s [", ferry_st_name(st, i), ferry_dtype_name(ferry_st_dtype(st, i)));
			for (int d = 0; d < nd; d++)
				printf("%s%" PRIu64, d ? ", " : "", dims[d]);
			printf("] offset %" PRIu64 " bytes %" PRIu64 "\n", ferry_st_offset(st, i), ferry_st_nbytes(st, i));
		}
	}
	if (json)
		printf("]}");
}

/* A committed step: each rank's shard on its own (ranks of a step hold tensors of the same names). */
static int inspect_step(ferry_ctx *ctx, const struct target *t, int json)
{
	char p[4400];
	int world = ferry_ckpt_world(t->dir, t->step);
	if (world < 0) {
		fprintf(stderr, "ferry ckpt inspect: %s: %s\n", ferry_strerror(world), ferry_last_error());
		return 1;
	}
	ferry_st **st = calloc((size_t)world, sizeof(*st));
	int r = st ? 0 : -ENOMEM;
	for (int k = 0; k < world && !r; k++) {
		r = ferry_ckpt_shard_path(t->dir, t->step, k, world, p, sizeof(p));
		r = r < 0 ? r : ferry_st_open(ctx, p, &st[k]);
	}
	if (r) {
		fprintf(stderr, "ferry ckpt inspect: %s: %s\n", ferry_strerror(r), r == -ENOMEM ? "out of memory" : ferry_last_error());
	} else {
		if (ferry_ckpt_step_path(t->dir, t->step, p, sizeof(p)) < 0)
			snprintf(p, sizeof(p), "%s", t->dir);
		if (json) {
			printf("{\"path\":");
			ferry_tools_json_string(stdout, p);
			printf(",\"step\":%lld,\"world\":%d,\"files\":[", (long long)t->step, world);
		} else {
			printf("%s: step %lld, %d rank%s\n", p, (long long)t->step, world, world > 1 ? "s" : "");
		}
		for (int k = 0; k < world; k++)
			print_file(ctx, st[k], json, k == 0, k);
		if (json)
			printf("]}\n");
	}
	for (int k = 0; st && k < world; k++)
		ferry_st_destroy(st[k]);
	free(st);
	return r ? 1 : 0;
}

static int cmd_inspect(int argc, char **argv)
{
	struct inspect_opts o = {0};
	struct cli_args a = {0};
	struct target t;
	int rc = cli_parse(&inspect_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	enum ckpt_torch_kind tk = cli_given(&inspect_cmd, &a, "step") ? CKPT_TORCH_NONE : ckpt_torch_kind(a.argv[0]);
	if (tk != CKPT_TORCH_NONE)
		return ckpt_torch_inspect(a.argv[0], tk, o.json);
	if ((rc = resolve(&inspect_cmd, &a, a.argv[0], cli_given(&inspect_cmd, &a, "step"), o.step, &t)))
		return rc;
	ferry_ctx *ctx = NULL;
	ferry_st_load *ld = NULL;
	int r = ferry_ctx_create(&ctx);
	if (!r && t.is_step) {
		rc = inspect_step(ctx, &t, o.json);
		ferry_ctx_destroy(ctx);
		return rc;
	}
	if (!r)
		r = ferry_st_load_open(ctx, a.argv[0], &ld);
	if (r) {
		fprintf(stderr, "ferry ckpt inspect: %s: %s\n", ferry_strerror(r), ferry_last_error());
		ferry_ctx_destroy(ctx);
		return 1;
	}
	if (o.json)
		printf("{\"files\":[");
	for (size_t f = 0; f < ferry_st_load_files(ld); f++)
		print_file(ctx, ferry_st_load_file(ld, f), o.json, f == 0, -1);
	if (o.json)
		printf("]}\n");
	ferry_st_load_destroy(ld);
	ferry_ctx_destroy(ctx);
	return 0;
}

/* ----------------------------------------------------------------------------------------- verify */

static const char *const stat_keys[FERRY_VERIFY_STAT__COUNT] = {
	[FERRY_VERIFY_FILES] = "files",       [FERRY_VERIFY_TENSORS] = "tensors",
	[FERRY_VERIFY_BYTES] = "bytes",       [FERRY_VERIFY_VERIFIED] = "verified",
	[FERRY_VERIFY_NOSUM] = "without_checksum", [FERRY_VERIFY_FAILED] = "failed",
	[FERRY_VERIFY_UNTIED] = "untied",     [FERRY_VERIFY_PROBLEMS] = "problem_count",
	[FERRY_VERIFY_WORLD] = "world",
};

static void json_problem(int first, int code, const char *msg)
{
	printf("%s{\"error\":", first ? "" : ",");
	ferry_tools_json_string(stdout, ferry_strerror(code));
	printf(",\"message\":");
	ferry_tools_json_string(stdout, msg);
	printf("}");
}

/* An error before anything could be checked (no `latest`, out of memory): still one JSON object. */
static int verify_failed(const char *path, int json, int code)
{
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, path);
		printf(",\"ok\":false,\"problems\":[");
		json_problem(1, code, ferry_last_error());
		printf("]}\n");
	} else {
		fprintf(stderr, "ferry ckpt verify: %s: %s\n", ferry_strerror(code), ferry_last_error());
	}
	return 1;
}

/* The progress line's bytes done: what the context has read since verification began. */
struct verify_progress {
	ferry_ctx *ctx;
	uint64_t base;
};

static uint64_t verify_read(void *arg)
{
	struct verify_progress *v = arg;
	return ferry_ctx_stat(v->ctx, FERRY_STAT_BYTES_READ) - v->base;
}

/* Bytes of the step's shards: the progress line's total. */
static uint64_t dir_bytes(const char *dir)
{
	uint64_t sum = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	struct stat st;
	while (d && (e = readdir(d)))
		if (strlen(e->d_name) > 12 && !strcmp(e->d_name + strlen(e->d_name) - 12, ".safetensors") &&
		    !fstatat(dirfd(d), e->d_name, &st, 0) && S_ISREG(st.st_mode))
			sum += (uint64_t)st.st_size;
	if (d)
		closedir(d);
	return sum;
}

static int verify_step(ferry_ctx *ctx, const struct target *t, const struct verify_opts *o)
{
	char sp[4400];
	ferry_ckpt_report *rep = NULL;
	int r = ferry_ckpt_step_path(t->dir, t->step, sp, sizeof(sp));
	if (r < 0)
		return verify_failed(t->dir, o->json, r);
	struct verify_progress vp = {ctx, ferry_ctx_stat(ctx, FERRY_STAT_BYTES_READ)};
	struct cli_progress bar;
	cli_progress_start(&bar, "ferry ckpt verify", NULL, dir_bytes(sp), o->quiet, verify_read, &vp);
	r = ferry_ckpt_verify_report(ctx, t->dir, t->step, o->require_sums, &rep);
	cli_progress_stop(&bar, 1);
	if (!rep)
		return verify_failed(sp, o->json, r);
	uint64_t s[FERRY_VERIFY_STAT__COUNT];
	for (int k = 0; k < FERRY_VERIFY_STAT__COUNT; k++)
		s[k] = ferry_ckpt_report_stat(rep, (enum ferry_verify_stat)k);
	size_t nf = ferry_ckpt_report_files(rep);
	const char *msg;
	int code;
	if (o->json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, sp);
		printf(",\"dir\":");
		ferry_tools_json_string(stdout, t->dir);
		printf(",\"step\":%lld,\"ok\":%s", (long long)t->step, r ? "false" : "true");
		for (int k = 0; k < FERRY_VERIFY_STAT__COUNT; k++)
			json_key_u64(stat_keys[k], s[k], 1);
		printf(",\"shards\":[");
		for (size_t i = 0; i < nf; i++) {
			printf("%s{\"file\":", i ? "," : "");
			ferry_tools_json_string(stdout, ferry_ckpt_report_file(rep, i));
			for (int k = 0; k < FERRY_VERIFY_STAT__COUNT; k++)
				if (k != FERRY_VERIFY_FILES)
					json_key_u64(stat_keys[k], ferry_ckpt_report_file_stat(rep, i, (enum ferry_verify_stat)k), k);
			printf(",\"present\":%s}", ferry_ckpt_report_file_stat(rep, i, FERRY_VERIFY_FILES) ? "true" : "false");
		}
		printf("],\"problems\":[");
		for (size_t i = 0; (msg = ferry_ckpt_report_problem(rep, i, &code)); i++)
			json_problem(i == 0, code, msg);
		printf("]}\n");
	} else {
		size_t shown = 0;
		for (; (msg = ferry_ckpt_report_problem(rep, shown, &code)); shown++)
			fprintf(stderr, "ferry ckpt verify: %s: %s\n", ferry_strerror(code), msg);
		if (s[FERRY_VERIFY_PROBLEMS] > shown)
			fprintf(stderr, "ferry ckpt verify: %" PRIu64 " more problems not shown\n",
				s[FERRY_VERIFY_PROBLEMS] - shown);
		if (nf)
			printf("%s: step %lld, world %" PRIu64 "\n", sp, (long long)t->step, s[FERRY_VERIFY_WORLD]);
		else
			printf("%s: step %lld\n", sp, (long long)t->step);
		for (size_t i = 0; i < nf; i++) {
			uint64_t f[FERRY_VERIFY_STAT__COUNT];
			for (int k = 0; k < FERRY_VERIFY_STAT__COUNT; k++)
				f[k] = ferry_ckpt_report_file_stat(rep, i, (enum ferry_verify_stat)k);
			printf("  %s: ", ferry_ckpt_report_file(rep, i));
			if (!f[FERRY_VERIFY_FILES])
				printf("missing");
			else
				printf("%" PRIu64 " tensors, %" PRIu64 " bytes: %" PRIu64 " verified, %" PRIu64
				       " without checksum, %" PRIu64 " failed%s",
				       f[FERRY_VERIFY_TENSORS], f[FERRY_VERIFY_BYTES], f[FERRY_VERIFY_VERIFIED],
				       f[FERRY_VERIFY_NOSUM], f[FERRY_VERIFY_FAILED], f[FERRY_VERIFY_UNTIED] ? ", untied" : "");
			if (f[FERRY_VERIFY_PROBLEMS])
				printf(" (%" PRIu64 " problem%s)", f[FERRY_VERIFY_PROBLEMS], f[FERRY_VERIFY_PROBLEMS] > 1 ? "s" : "");
			putchar('\n');
		}
		if (nf)
			printf("%" PRIu64 " files, %" PRIu64 " bytes: %" PRIu64 " tensors verified, %" PRIu64
			       " without checksum, %" PRIu64 " failed\n",
			       s[FERRY_VERIFY_FILES], s[FERRY_VERIFY_BYTES], s[FERRY_VERIFY_VERIFIED], s[FERRY_VERIFY_NOSUM],
			       s[FERRY_VERIFY_FAILED]);
		if (s[FERRY_VERIFY_UNTIED])
			printf("note: %" PRIu64 " shard%s not tied to the step and run (saved before ferry wrote ferry.step, "
			       "ferry.run, ferry.rank and ferry.world into shards): a shard moved from another step would "
			       "not be caught\n",
			       s[FERRY_VERIFY_UNTIED], s[FERRY_VERIFY_UNTIED] > 1 ? "s are" : " is");
		if (r)
			printf("FAILED: %" PRIu64 " problem%s\n", s[FERRY_VERIFY_PROBLEMS], s[FERRY_VERIFY_PROBLEMS] > 1 ? "s" : "");
		else
			printf("OK\n");
	}
	ferry_ckpt_report_destroy(rep);
	return r ? 1 : 0;
}

/* A plain file, index or directory of them: structure and checksums, every tensor of every file. */
static int verify_plain(ferry_ctx *ctx, const char *path, const struct verify_opts *o)
{
	ferry_st_load *ld = NULL;
	int r = ferry_st_load_open(ctx, path, &ld);
	if (r)
		return verify_failed(path, o->json, r);
	size_t ok = 0, nosum = 0, bad = 0, tensors = 0;
	uint64_t total = 0;
	for (size_t f = 0; f < ferry_st_load_files(ld); f++) {
		ferry_st *st = ferry_st_load_file(ld, f);
		for (size_t i = 0; i < ferry_st_count(st); i++)
			total += ferry_st_nbytes(st, i);
	}
	struct verify_progress vp = {ctx, ferry_ctx_stat(ctx, FERRY_STAT_BYTES_READ)};
	struct cli_progress bar;
	cli_progress_start(&bar, "ferry ckpt verify", NULL, total, o->quiet, verify_read, &vp);
	if (o->json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, path);
		printf(",\"problems\":[");
	}
	for (size_t f = 0; f < ferry_st_load_files(ld); f++) {
		ferry_st *st = ferry_st_load_file(ld, f);
		for (size_t i = 0; i < ferry_st_count(st); i++, tensors++) {
			int v = ferry_st_verify(st, i), code = v;
			char nm[600];
			const char *msg = ferry_last_error();
			if (v == 1) {
				ok++;
				continue;
			}
			if (v == 0) {
				nosum++;
				if (!o->require_sums)
					continue;
				snprintf(nm, sizeof(nm), "%s: tensor \"%.400s\" has no checksum", ferry_st_path(st),
					 ferry_st_name(st, i));
				code = FERRY_EVERIFY;
				msg = nm;
			}
			if (o->json) {
				json_problem(bad == 0, code, msg);
			} else {
				cli_progress_clear(&bar);
				fprintf(stderr, "ferry ckpt verify: %s: %s\n", ferry_strerror(code), msg);
			}
			bad++;
		}
	}
	cli_progress_stop(&bar, 1);
	size_t files = ferry_st_load_files(ld);
	if (o->json)
		printf("],\"ok\":%s,\"files\":%zu,\"tensors\":%zu,\"verified\":%zu,\"without_checksum\":%zu,\"failed\":%zu}\n",
		       bad ? "false" : "true", files, tensors, ok, nosum, bad);
	else
		printf("%zu files: %zu tensors verified, %zu without checksum, %zu failed\n", files, ok, nosum, bad);
	ferry_st_load_destroy(ld);
	return bad ? 1 : 0;
}

static int cmd_verify(int argc, char **argv)
{
	struct verify_opts o = {0};
	struct cli_args a = {0};
	struct target t;
	int rc = cli_parse(&verify_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	enum ckpt_torch_kind tk = cli_given(&verify_cmd, &a, "step") ? CKPT_TORCH_NONE : ckpt_torch_kind(a.argv[0]);
	if (tk != CKPT_TORCH_NONE)
		return ckpt_torch_verify(a.argv[0], tk, o.json);
	if ((rc = resolve(&verify_cmd, &a, a.argv[0], cli_given(&verify_cmd, &a, "step"), o.step, &t)))
		return rc;
	ferry_ctx *ctx = NULL;
	int r = ferry_ctx_create(&ctx);
	if (r)
		rc = verify_failed(a.argv[0], o.json, r);
	else
		rc = t.is_step ? verify_step(ctx, &t, &o) : verify_plain(ctx, a.argv[0], &o);
	ferry_ctx_destroy(ctx);
	return rc;
}

static const struct ferry_cli_command ckpt_commands[] = {
	{"inspect", "tensors, dtypes, shapes, offsets, metadata", cmd_inspect},
	{"verify", "a checkpoint step's manifest, shards, metadata and checksums", cmd_verify},
	{"bench", "save/load throughput on a transformer-shaped set", ferry_cmd_ckpt_bench},
	{"plan", "the checkpoint interval that loses least time (Young, Daly)", ferry_cmd_ckpt_plan},
	{NULL, NULL, NULL},
};

int ferry_cmd_ckpt(int argc, char **argv)
{
	return cli_dispatch("ferry ckpt", ckpt_commands, PATH_ABOUT "\n", argc, argv);
}
