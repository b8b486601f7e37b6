/* ferry ckpt: inspect, verify and benchmark safetensors files and checkpoint directories. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/ckpt.h"
#include "ferry/gpu.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: ferry ckpt inspect PATH [--json]   tensors, dtypes, shapes, offsets, metadata\n"
		"       ferry ckpt verify PATH             structure and every stored checksum\n"
		"       ferry ckpt bench [options]         save/load throughput on a transformer-shaped set\n"
		"PATH: a .safetensors file, a model.safetensors.index.json, a directory holding either,\n"
		"a checkpoint step directory, or a checkpoint directory (its latest step).\n"
		"bench options: --dir DIR (default .), --size SIZE (default 1g; 8g is a 4B model in bf16),\n"
		"  --device N | --host, --cold (drop the files' page cache before loading), --loads N (default 3:\n"
		"  the first and the best are reported), --keep, --json,\n"
		"  --save-only (the durable saves alone: no asynchronous saves, no loads), --saves N (default 2;\n"
		"  the third and later each into a new file after the previous one is deleted and synced; the\n"
		"  best of the second and later is reported), --phases (a PHASES line per save: where its time went)\n");
}

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
	const char *path = NULL;
	int json = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!path && argv[i][0] != '-')
			path = argv[i];
		else {
			usage(stderr);
			return 2;
		}
	}
	if (!path) {
		usage(stderr);
		return 2;
	}
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
	if (argc != 2 || argv[1][0] == '-') {
		usage(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
		return 2;
	}
	ferry_ctx *ctx = NULL;
	ferry_st_load *ld = NULL;
	if (open_load(&ctx, argv[1], &ld)) {
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

/* ---------------------------------------------------------------------------------------- bench */

struct btensor {
	char name[96];
	uint64_t shape[2];
	int ndim;
	size_t bytes;
	void *p;
};

/* A Qwen3-4B-like decoder in bf16: hidden 2560, MLP 9728, vocab 151936, 36 layers (~8 GB). */
static size_t make_set(struct btensor **out, uint64_t target)
{
	const uint64_t h = 2560, ffn = 9728, vocab = 151936, kv = 1024;
	size_t n = 0, cap = 64;
	struct btensor *t = malloc(cap * sizeof(*t));
	uint64_t total = 0;
#define ADD(nm, a, b)                                                                         \
	do {                                                                                  \
		if (n == cap)                                                                 \
			t = realloc(t, (cap *= 2) * sizeof(*t));                              \
		struct btensor *x = &t[n++];                                                  \
		snprintf(x->name, sizeof(x->name), "%s", nm);                                 \
		x->shape[0] = (a);                                                            \
		x->shape[1] = (b);                                                            \
		x->ndim = (b) ? 2 : 1;                                                        \
		x->bytes = (size_t)((a) * ((b) ? (b) : 1) * 2);                               \
		total += x->bytes;                                                            \
	} while (0)
	ADD("model.embed_tokens.weight", vocab, h);
	char nm[96];
	for (int l = 0; total < target || l == 0; l++) {
		static const char *const names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
						    "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
		const uint64_t rows[] = {4096, kv, kv, h, ffn, ffn, h}, cols[] = {h, h, h, 4096, h, h, ffn};
		for (int k = 0; k < 7; k++) {
			snprintf(nm, sizeof(nm), "model.layers.%d.%s.weight", l, names[k]);
			ADD(nm, rows[k], cols[k]);
		}
		snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", l);
		ADD(nm, h, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", l);
		ADD(nm, h, 0);
	}
	ADD("model.norm.weight", h, 0);
#undef ADD
	*out = t;
	return n;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd >= 0) {
		fdatasync(fd);
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

static void print_phases(ferry_st_writer *w, const char *what, int rep, double gbps)
{
	char buf[2048];
	if (ferry_st_writer_stats(w, buf, sizeof(buf)) > 0)
		printf("PHASES %s %d %.2f GB/s %s\n", what, rep, gbps, buf);
}

static int cmd_bench(int argc, char **argv)
{
	const char *dir = ".";
	uint64_t size = 1ull << 30;
	int dev = -2, cold = 0, keep = 0, json = 0, loads = 3, save_only = 0, saves = 2, phases = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
			char *e;
			double v = strtod(argv[++i], &e);
			size = (uint64_t)(v * (double)(*e == 'g' || *e == 'G' ? 1ull << 30 : *e == 'm' || *e == 'M' ? 1ull << 20 : 1));
		} else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			dev = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--host"))
			dev = -1;
		else if (!strcmp(argv[i], "--cold"))
			cold = 1;
		else if (!strcmp(argv[i], "--loads") && i + 1 < argc && atoi(argv[i + 1]) > 0)
			loads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--keep"))
			keep = 1;
		else if (!strcmp(argv[i], "--save-only"))
			save_only = 1;
		else if (!strcmp(argv[i], "--saves") && i + 1 < argc && atoi(argv[i + 1]) > 0)
			saves = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--phases"))
			phases = 1;
		else if (!strcmp(argv[i], "--json"))
			json = 1;
		else {
			usage(!strcmp(argv[i], "--help") ? stdout : stderr);
			return !strcmp(argv[i], "--help") ? 0 : 2;
		}
	}
	char why[256] = "";
	if (dev == -2)
		dev = ferry_gpu_available(why, sizeof(why)) ? 0 : -1;
	ferry_ctx *ctx;
	int r = ferry_ctx_create(&ctx);
	if (r) {
		fprintf(stderr, "ferry ckpt bench: %s\n", ferry_last_error());
		return 1;
	}
	struct btensor *t;
	size_t n = make_set(&t, size);
	uint64_t total = 0;
	for (size_t i = 0; i < n && !r; i++) {
		total += t[i].bytes;
		if (dev >= 0) {
			r = ferry_gpu_malloc(dev, t[i].bytes, &t[i].p);
		} else {
			t[i].p = ferry_alloc_aligned(t[i].bytes);
			if (!t[i].p)
				r = -ENOMEM;
			else
				for (size_t b = 0; b < t[i].bytes; b += 4096)
					((char *)t[i].p)[b] = (char)(i + b);
		}
	}
	char path[4096], path2[4200];
	snprintf(path, sizeof(path), "%s/ferry-ckpt-bench-%d.safetensors", dir, (int)getpid());
	snprintf(path2, sizeof(path2), "%s.second", path);
	ferry_st_writer *w = NULL;
	ferry_st_load *ld = NULL;
	int sums = FERRY_SAVE_CHECKSUM;
	const char *sum_note = "xxh3";
	double t_save = 0, t_save2 = 0, t_async_block = 0, t_async = 0, t_load = 0, t_load_first = 0;
	uint64_t st0[FERRY_STAT__COUNT], st1[FERRY_STAT__COUNT];
	if (!r)
		r = ferry_st_writer_create(ctx, &w);
	for (size_t i = 0; i < n && !r; i++) {
		int k = ferry_st_writer_add(w, t[i].name, FERRY_DT_BF16, t[i].ndim, t[i].shape, t[i].p, t[i].bytes);
		r = k < 0 ? k : 0;
	}
	/* Twice, each into a new file: the first also pins the writer's slots (what one save_file
	 * costs), the second reuses them (a training job's steady state). A new name each time: a
	 * rename over an old file would add the file system's freeing of its blocks. */
	for (int rep = 0; rep < saves && !r; rep++) {
		if (rep > 1) /* a third save and later: a new file again, the previous one gone */
			unlink(path2);
		/* Untimed: the disk quiet first. With ext4's `discard` option the blocks of files deleted
		 * just before (an earlier run's) are discarded at the next journal commit, which would
		 * otherwise land inside this save. */
		sync();
		double t0 = now_s();
		int64_t s = ferry_st_writer_save(w, rep ? path2 : path, sums);
		double d = now_s() - t0;
		if (!rep)
			t_save = d;
		else if (rep == 1 || d < t_save2)
			t_save2 = d;
		r = s < 0 ? (int)s : 0;
		if (phases && !r)
			print_phases(w, "save", rep, (double)total / 1e9 / d);
	}
	unlink(path2);
	if (save_only) {
		if (!r)
			printf("TABLE ferry save (durable, %s) %s | %.2f GB/s | %.2f GB in %.3f s, %zu tensors; "
			       "later saves (slots kept, best of %d) %.2f GB/s\n", sum_note, dev >= 0 ? "gpu" : "host",
			       (double)total / 1e9 / t_save, (double)total / 1e9, t_save, n, saves - 1,
			       t_save2 > 0 ? (double)total / 1e9 / t_save2 : 0.0);
		else
			fprintf(stderr, "ferry ckpt bench: %s: %s\n", ferry_strerror(r), ferry_last_error());
		loads = 0;
		goto out;
	}
	/* Twice: the first also allocates and pins the snapshot's memory, which later saves reuse. */
	double t_async_first = 0;
	for (int rep = 0; rep < 2 && !r; rep++) {
		double t0 = now_s();
		r = ferry_st_writer_save_async(w, path, sums);
		t_async_block = now_s() - t0;
		int64_t s = r ? r : ferry_st_writer_wait(w, -1);
		t_async = now_s() - t0;
		r = s < 0 ? (int)s : 0;
		if (phases && !r)
			print_phases(w, "async", rep, (double)total / 1e9 / t_async);
		if (!rep)
			t_async_first = t_async_block;
	}
	if (!r)
		r = ferry_st_load_open(ctx, path, &ld);
	/* Each load allocates its memory and reads the whole file as one transfer; the stats of the
	 * last one say which path the engine took for its chunks. */
	for (int rep = 0; rep < loads && !r; rep++) {
		if (cold)
			drop_cache(path);
		for (int k = 0; k < FERRY_STAT__COUNT; k++)
			st0[k] = ferry_ctx_stat(ctx, (enum ferry_stat)k);
		double t0 = now_s();
		r = ferry_st_load_run(ld, dev, 0, 0);
		double d = now_s() - t0;
		for (int k = 0; k < FERRY_STAT__COUNT; k++)
			st1[k] = ferry_ctx_stat(ctx, (enum ferry_stat)k) - st0[k];
		if (!rep)
			t_load_first = d;
		if (!rep || d < t_load)
			t_load = d;
	}
	if (r)
		fprintf(stderr, "ferry ckpt bench: %s: %s\n", ferry_strerror(r), ferry_last_error());
	double gb = (double)total / 1e9;
	const char *where = dev >= 0 ? "gpu" : "host";
	if (!r && json) {
		printf("{\"bytes\":%" PRIu64 ",\"tensors\":%zu,\"memory\":\"%s\",\"cold\":%d,\"save_s\":%.4f,"
		       "\"save_second_s\":%.4f,\"checksums\":%d,\"async_blocked_s\":%.4f,\"async_first_blocked_s\":%.4f,"
		       "\"async_total_s\":%.4f,\"load_s\":%.4f,\"load_first_s\":%.4f,\"loads\":%d,"
		       "\"load_chunks\":{\"direct\":%" PRIu64 ",\"bounced\":%" PRIu64 ",\"buffered\":%" PRIu64
		       ",\"cached\":%" PRIu64 ",\"all\":%" PRIu64 "}}\n",
		       total, n, where, cold, t_save, t_save2, sums != 0, t_async_block, t_async_first, t_async, t_load,
		       t_load_first, loads, st1[FERRY_STAT_DIRECT_CHUNKS], st1[FERRY_STAT_BOUNCED_CHUNKS],
		       st1[FERRY_STAT_BUFFERED_CHUNKS], st1[FERRY_STAT_CACHED_CHUNKS], st1[FERRY_STAT_CHUNKS]);
	} else if (!r) {
		printf("TABLE ferry save (durable, %s) %s | %.2f GB/s | %.2f GB in %.3f s, %zu tensors; "
		       "second save (slots kept) %.2f GB/s\n", sum_note, where, gb / t_save, gb, t_save, n, gb / t_save2);
		printf("TABLE ferry async save blocked %s | %.3f s | %.2f GB/s snapshot; total %.3f s; first save blocked %.3f s\n",
		       where, t_async_block, gb / t_async_block, t_async, t_async_first);
		printf("TABLE ferry load %s%s | %.2f GB/s | best of %d, %.3f s; first %.3f s; chunks: %" PRIu64
		       " direct, %" PRIu64 " bounced, %" PRIu64 " buffered, %" PRIu64 " cached\n",
		       where, cold ? " cold" : " warm", gb / t_load, loads, t_load, t_load_first,
		       st1[FERRY_STAT_DIRECT_CHUNKS], st1[FERRY_STAT_BOUNCED_CHUNKS], st1[FERRY_STAT_BUFFERED_CHUNKS],
		       st1[FERRY_STAT_CACHED_CHUNKS]);
	}
out:
	ferry_st_load_destroy(ld);
	ferry_st_writer_destroy(w);
	if (!keep)
		unlink(path);
	for (size_t i = 0; i < n; i++) {
		if (dev >= 0)
			(void)ferry_gpu_free(t[i].p);
		else
			ferry_free_aligned(t[i].p, t[i].bytes);
	}
	free(t);
	ferry_ctx_destroy(ctx);
	return r ? 1 : 0;
}

int ferry_cmd_ckpt(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "inspect"))
		return cmd_inspect(argc - 1, argv + 1);
	if (!strcmp(argv[1], "verify"))
		return cmd_verify(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 1, argv + 1);
	fprintf(stderr, "ferry ckpt: unknown subcommand '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
