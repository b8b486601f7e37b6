/* ferry ckpt: inspect, verify and benchmark safetensors files and checkpoint directories. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/ckpt.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

#define PATH_ABOUT                                                                                       \
	"PATH: a .safetensors file, a model.safetensors.index.json, a directory holding either,\n"          \
	"a checkpoint step directory, or a checkpoint directory (its latest step)."

struct inspect_opts {
	int json;
};

static const struct cli_opt inspect_rows[] = {
	{.name = "json", .kind = CLI_FLAG, .off = offsetof(struct inspect_opts, json), .help = "one JSON object"},
	{.name = NULL},
};

/* A command of one PATH. */
#define PATH_COMMAND(nm, syn, text, rows)                                                                \
	{                                                                                                \
		.name = nm, .synopsis = syn, .about = text "\n" PATH_ABOUT, .opts = rows, .min_args = 1, \
		.max_args = 1, .args = "PATH",                                                           \
	}

static const struct cli_cmd inspect_cmd = PATH_COMMAND("ckpt inspect", "ferry ckpt inspect PATH [--json]",
							"Lists the tensors (dtypes, shapes, offsets) and the metadata.",
							inspect_rows);

static const struct cli_opt no_rows[] = {{.name = NULL}};

static const struct cli_cmd verify_cmd = PATH_COMMAND("ckpt verify", "ferry ckpt verify PATH",
						       "Checks the structure and every stored checksum; exits 1 if one fails.",
						       no_rows);

/* A checkpoint directory (with `latest`) resolves to its latest step. */
static const char *resolve(const char *path, char *buf, size_t len)
{
	char p[4096];
	snprintf(p, sizeof(p), "%s/latest", path);
	if (access(p, F_OK))
		return path;
	int64_t step = ferry_ckpt_latest(path);
	if (step < 0 || ferry_ckpt_step_path(path, step, buf, len) < 0)
		return path;
	return buf;
}

static int open_load(ferry_ctx **ctx, const char *arg, ferry_st_load **ld)
{
	char buf[4096];
	const char *path = resolve(arg, buf, sizeof(buf));
	int r = ferry_ctx_create(ctx);
	if (!r)
		r = ferry_st_load_open(*ctx, path, ld);
	if (r)
		fprintf(stderr, "ferry ckpt: %s: %s\n", ferry_strerror(r), ferry_last_error());
	return r;
}

static int cmd_inspect(int argc, char **argv)
{
	struct inspect_opts o = {0};
	struct cli_args a = {0};
	int rc = cli_parse(&inspect_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	const char *path = a.argv[0];
	int json = o.json;
	ferry_ctx *ctx = NULL;
	ferry_st_load *ld = NULL;
	if (open_load(&ctx, path, &ld)) {
		ferry_ctx_destroy(ctx);
		return 1;
	}
	uint64_t dims[FERRY_ST_MAX_DIMS];
	if (json)
		printf("{\"files\":[");
	for (size_t f = 0; f < ferry_st_load_files(ld); f++) {
		ferry_st *st = ferry_st_load_file(ld, f);
		if (json) {
			printf("%s{\"path\":", f ? "," : "");
			ferry_tools_json_string(stdout, ferry_st_path(st));
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
			for (size_t m = 0; m < ferry_st_metadata_count(st); m++)
				printf("  metadata %s = %s\n", ferry_st_metadata_key(st, m), ferry_st_metadata_value(st, m));
		}
		for (size_t i = 0; i < ferry_st_count(st); i++) {
			int nd = ferry_st_shape(st, i, dims, FERRY_ST_MAX_DIMS);
			if (json) {
				printf("%s{\"name\":", i ? "," : "");
				ferry_tools_json_string(stdout, ferry_st_name(st, i));
				printf(",\"dtype\":\"%s\",\"shape\":[", ferry_dtype_name(ferry_st_dtype(st, i)));
				for (int d = 0; d < nd; d++)
					printf("%s%" PRIu64, d ? "," : "", dims[d]);
				printf("],\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", ferry_st_offset(st, i),
				       ferry_st_nbytes(st, i));
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
	if (json)
		printf("]}\n");
	ferry_st_load_destroy(ld);
	ferry_ctx_destroy(ctx);
	return 0;
}

static int cmd_verify(int argc, char **argv)
{
	struct cli_args a = {0};
	int rc = cli_parse(&verify_cmd, NULL, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	ferry_ctx *ctx = NULL;
	ferry_st_load *ld = NULL;
	if (open_load(&ctx, a.argv[0], &ld)) {
		ferry_ctx_destroy(ctx);
		return 1;
	}
	size_t ok = 0, nosum = 0, bad = 0;
	for (size_t f = 0; f < ferry_st_load_files(ld); f++) {
		ferry_st *st = ferry_st_load_file(ld, f);
		for (size_t i = 0; i < ferry_st_count(st); i++) {
			int r = ferry_st_verify(st, i);
			if (r == 1)
				ok++;
			else if (r == 0)
				nosum++;
			else {
				bad++;
				fprintf(stderr, "ferry ckpt verify: %s: %s\n", ferry_strerror(r), ferry_last_error());
			}
		}
	}
	printf("%zu files: %zu tensors verified, %zu without checksum, %zu failed\n", ferry_st_load_files(ld), ok,
	       nosum, bad);
	ferry_st_load_destroy(ld);
	ferry_ctx_destroy(ctx);
	return bad ? 1 : 0;
}

static const struct ferry_cli_command ckpt_commands[] = {
	{"inspect", "tensors, dtypes, shapes, offsets, metadata", cmd_inspect},
	{"verify", "structure and every stored checksum", cmd_verify},
	{"bench", "save/load throughput on a transformer-shaped set", ferry_cmd_ckpt_bench},
	{NULL, NULL, NULL},
};

int ferry_cmd_ckpt(int argc, char **argv)
{
	return cli_dispatch("ferry ckpt", ckpt_commands, PATH_ABOUT "\n", argc, argv);
}
