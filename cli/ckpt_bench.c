/*
 * ferry ckpt bench: save and load throughput of a transformer-shaped set of tensors, durable saves,
 * asynchronous saves and loads into GPU or host memory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/ckpt.h"
#include "ferry/compress.h"
#include "ferry/gpu.h"
#include "ferry/safetensors.h"
#include "ferry_tools.h"

struct bench_opts {
	const char *dir, *compress;
	uint64_t size;
	int device, host, cold, keep, json, loads, save_only, saves, phases;
};

#define BO(f) offsetof(struct bench_opts, f)

static const struct cli_choice compress_codecs[] = {{"zstd", 0, 0}, {"lz4", 0, 0}, {"auto", 0, 0}, {NULL, 0, 0}};

static const struct cli_opt bench_rows[] = {
	{.name = "dir", .kind = CLI_STR, .off = BO(dir), .arg = "DIR", .help = "where the file is written (default .)"},
	{.name = "size", .kind = CLI_SIZE, .off = BO(size), .arg = "SIZE", .min = 1,
	 .help = "bytes of tensors (default 1g; 8g is a 4B model in bf16)"},
	{.name = "device", .kind = CLI_INT, .off = BO(device), .arg = "N", .max = 1024,
	 .help = "tensors in the memory of GPU N (default: GPU 0 if there is one, else host memory)"},
	{.name = "host", .kind = CLI_FLAG, .off = BO(host), .help = "tensors in host memory"},
	{.name = "cold", .kind = CLI_FLAG, .off = BO(cold), .help = "drop the file's page cache before each load"},
	{.name = "loads", .kind = CLI_INT, .off = BO(loads), .arg = "N", .min = 1, .max = 1000000,
	 .help = "loads (default 3: the first and the best are reported)"},
	{.name = "keep", .kind = CLI_FLAG, .off = BO(keep), .help = "keep the saved file"},
	{.name = "json", .kind = CLI_FLAG, .off = BO(json), .help = "one JSON object instead of the TABLE lines"},
	{.name = "save-only", .kind = CLI_FLAG, .off = BO(save_only),
	 .help = "the durable saves alone: no asynchronous saves, no loads"},
	{.name = "saves", .kind = CLI_INT, .off = BO(saves), .arg = "N", .min = 1, .max = 1000000,
	 .help = "durable saves (default 2; the third and later each into a new file after the previous one\n"
		 "is deleted and synced; the best of the second and later is reported)"},
	{.name = "phases", .kind = CLI_FLAG, .off = BO(phases), .help = "a PHASES line per save: where its time went"},
	{.name = "compress", .kind = CLI_STR, .off = BO(compress), .arg = "CODEC", .choices = compress_codecs,
	 .help = "a compressed checkpoint (ferry_ckpt, compress=CODEC: zstd, lz4, auto) of bf16 weights\n"
		 "(randn x 0.02): its ratio, save rate, and load rates (effective: uncompressed bytes per\n"
		 "second; compressed: the file's) and where the chunks were decoded"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "ckpt bench",
	.synopsis = "ferry ckpt bench [options]",
	.about = "Saves a Qwen3-4B-shaped set of bf16 tensors (durable, then asynchronous), loads it back, and\n"
		 "prints TABLE lines: GB/s of each.",
	.opts = bench_rows,
	.max_args = 0,
};

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

/* The last save's statistics and seconds per phase, as one JSON object (bench/ckpt-save.py reads it). */
static void print_phases(ferry_st_writer *w, const char *what, int rep, double gbps)
{
	printf("PHASES %s %d %.2f GB/s {", what, rep, gbps);
	for (int i = 0; i < FERRY_SAVE_STAT__COUNT; i++)
		printf("%s\"%s\":%llu", i ? "," : "", ferry_save_stat_name(i),
		       (unsigned long long)ferry_st_writer_stat(w, i));
	for (int i = 0; i < FERRY_SAVE_PHASE__COUNT; i++)
		printf(",\"%s\":%.6f", ferry_save_phase_name(i), (double)ferry_st_writer_phase_ns(w, i) * 1e-9);
	printf("}\n");
}

/*
 * Weights as a model's are at initialisation: randn x 0.02 rounded to bf16 (bench/cz-codecs.py's
 * data, whose ratio PERFORMANCE.md reports). A pool of 16 MiB of them is copied into each tensor at
 * a varying offset: compressed chunks (at most 4 MiB) are independent, so the pool's repeats are
 * never seen by the compressor, and the state is made at memory speed.
 */
#define POOL_BYTES (16u << 20)
static uint16_t *weight_pool(void)
{
	uint16_t *p = malloc(POOL_BYTES);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; p && i < POOL_BYTES / 2; i += 2) {
		double u[2];
		for (int k = 0; k < 2; k++) { /* xorshift64*, 53 bits, never 0 */
			x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
			u[k] = ((double)((x * 0x2545F4914F6CDD1Dull) >> 11) + 1.0) / 9007199254740993.0;
		}
		double rad = sqrt(-2.0 * log(u[0])) * 0.02, th = 6.283185307179586 * u[1];
		float f[2] = {(float)(rad * cos(th)), (float)(rad * sin(th))};
		for (int k = 0; k < 2; k++) {
			uint32_t b;
			memcpy(&b, &f[k], 4);
			p[i + k] = (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16); /* round to nearest even */
		}
	}
	return p;
}

static int fill_weights(void *dst, size_t bytes, int dev, const uint16_t *pool, size_t seed)
{
	size_t at = (seed * 7919u * 4096u + 2 * seed) % (POOL_BYTES / 2) & ~(size_t)1;
	for (size_t done = 0; done < bytes;) {
		size_t n = bytes - done < POOL_BYTES - at ? bytes - done : POOL_BYTES - at;
		if (dev >= 0) {
			int r = ferry_gpu_memcpy_htod((char *)dst + done, (const char *)pool + at, n);
			if (r)
				return r;
		} else {
			memcpy((char *)dst + done, (const char *)pool + at, n);
		}
		done += n;
		at = 0;
	}
	return 0;
}

/* Removes the checkpoint directory this run made (its own files only: the names a checkpoint makes). */
static void remove_ckpt_dir(const char *cdir)
{
	DIR *d = opendir(cdir);
	struct dirent *e;
	char p[4608], q[4864];
	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", cdir, e->d_name);
		if (!strncmp(e->d_name, "step-", 5) || !strcmp(e->d_name, "recycle")) {
			DIR *s = opendir(p);
			struct dirent *f;
			while (s && (f = readdir(s)))
				if (strcmp(f->d_name, ".") && strcmp(f->d_name, "..")) {
					snprintf(q, sizeof(q), "%s/%s", p, f->d_name);
					unlink(q);
				}
			if (s)
				closedir(s);
			rmdir(p);
		} else if (!strcmp(e->d_name, "latest") || !strncmp(e->d_name, ".ferry-lock-rank-", 17)) {
			unlink(p);
		}
	}
	if (d)
		closedir(d);
	rmdir(cdir);
}

/*
 * --compress: a one-rank checkpoint saved with compress=CODEC (the ferry_ckpt path a training job
 * takes), then loaded back whole through ferry_st_load (what ferry.checkpoint.load does), decoded
 * by nvCOMP on the GPU or on the CPU (cz_gpu, FERRY_CZ_GPU) as ferry_st_load_path_info reports.
 */
static int bench_compressed(ferry_ctx *ctx, const struct bench_opts *o, struct btensor *t, size_t n,
			    uint64_t total, int dev)
{
	char cdir[4200], shard[4400], info[256] = "";
	snprintf(cdir, sizeof(cdir), "%s/ferry-ckpt-bench-%d.d", o->dir, (int)getpid());
	uint16_t *pool = weight_pool();
	int r = pool ? 0 : -ENOMEM;
	for (size_t i = 0; i < n && !r; i++)
		r = fill_weights(t[i].p, t[i].bytes, dev, pool, i);
	free(pool);
	ferry_ckpt *ck = NULL;
	ferry_st_load *ld = NULL;
	if (!r)
		r = ferry_ckpt_open(ctx, cdir, 0, 1, &ck);
	if (!r)
		r = ferry_ckpt_set(ck, "compress", o->compress);
	if (!r)
		r = ferry_ckpt_set(ck, "keep", "1");
	double t_save = 0, t_best = 0, t_load = 0, t_first = 0;
	int64_t step = 0;
	for (int rep = 0; rep < o->saves && !r; rep++) {
		for (size_t i = 0; i < n && !r; i++)
			r = ferry_ckpt_add(ck, t[i].name, FERRY_DT_BF16, t[i].ndim, t[i].shape, t[i].p, t[i].bytes);
		if (r)
			break;
		sync();
		double t0 = ferry_tools_now_s();
		r = ferry_ckpt_save(ck, ++step);
		double d = ferry_tools_now_s() - t0;
		if (!rep)
			t_save = d;
		if (!rep || d < t_best)
			t_best = d;
	}
	struct stat sb;
	if (!r && (r = ferry_ckpt_shard_path(cdir, step, 0, 1, shard, sizeof(shard))) > 0)
		r = stat(shard, &sb) ? -errno : 0;
	if (!r)
		r = ferry_st_load_open(ctx, shard, &ld);
	uint64_t plain = 0;
	ferry_cz *z = NULL;
	if (!r && !(r = ferry_cz_open(ctx, shard, &z)))
		plain = (uint64_t)ferry_cz_size(z);
	ferry_cz_destroy(z);
	for (int rep = 0; rep < o->loads && !r; rep++) {
		if (o->cold)
			ferry_tools_drop_cache(shard);
		double t0 = ferry_tools_now_s();
		r = ferry_st_load_run(ld, dev, 0, 0);
		double d = ferry_tools_now_s() - t0;
		if (!rep)
			t_first = d;
		if (!rep || d < t_load)
			t_load = d;
		if (!r)
			(void)ferry_st_load_path_info(ld, info, sizeof(info));
	}
	if (r) {
		fprintf(stderr, "ferry ckpt bench: %s: %s\n", ferry_strerror(r), ferry_last_error());
	} else {
		double gb = (double)total / 1e9, ratio = sb.st_size ? (double)plain / (double)sb.st_size : 0;
		const char *where = dev >= 0 ? "gpu" : "host";
		if (o->json)
			printf("{\"bytes\":%" PRIu64 ",\"tensors\":%zu,\"memory\":\"%s\",\"cold\":%d,\"compress\":\"%s\","
			       "\"file_bytes\":%lld,\"plain_bytes\":%" PRIu64 ",\"ratio\":%.4f,\"save_s\":%.4f,"
			       "\"save_best_s\":%.4f,\"load_s\":%.4f,\"load_first_s\":%.4f,\"loads\":%d,"
			       "\"effective_gbps\":%.3f,\"compressed_gbps\":%.3f,\"decoded\":\"%s\"}\n",
			       total, n, where, o->cold, o->compress, (long long)sb.st_size, plain, ratio, t_save, t_best,
			       t_load, t_first, o->loads, gb / t_load, (double)sb.st_size / 1e9 / t_load, info);
		else {
			printf("TABLE ferry ckpt save compressed (%s) %s | %.2f GB/s | ratio %.3f (%.2f GB in %.2f GB), "
			       "%zu tensors, best of %d, first %.3f s\n", o->compress, where, gb / t_best, ratio, gb,
			       (double)sb.st_size / 1e9, n, o->saves, t_save);
			printf("TABLE ferry ckpt load compressed (%s) %s%s | %.2f GB/s effective | compressed %.2f GB/s, "
			       "ratio %.3f, best of %d (first %.3f s); decoded: %s\n", o->compress, where,
			       o->cold ? " cold" : " warm", gb / t_load, (double)sb.st_size / 1e9 / t_load, ratio, o->loads,
			       t_first, info);
		}
	}
	ferry_st_load_destroy(ld);
	ferry_ckpt_destroy(ck);
	if (!o->keep)
		remove_ckpt_dir(cdir);
	return r;
}

int ferry_cmd_ckpt_bench(int argc, char **argv)
{
	struct bench_opts o = {.dir = ".", .size = 1ull << 30, .device = -2, .loads = 3, .saves = 2};
	struct cli_args a = {0};
	int r = cli_parse(&cmd, &o, argc, argv, &a);
	if (r != CLI_CONTINUE)
		return r;
	const char *dir = o.dir;
	uint64_t size = o.size;
	int dev = o.host ? -1 : o.device, cold = o.cold, keep = o.keep, json = o.json, loads = o.loads;
	int save_only = o.save_only, saves = o.saves, phases = o.phases;
	char why[256] = "";
	if (dev == -2)
		dev = ferry_gpu_available(why, sizeof(why)) ? 0 : -1;
	ferry_ctx *ctx;
	r = ferry_ctx_create(&ctx);
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
	if (o.compress && !r) {
		r = bench_compressed(ctx, &o, t, n, total, dev);
		goto free_tensors;
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
		double t0 = ferry_tools_now_s();
		int64_t s = ferry_st_writer_save(w, rep ? path2 : path, sums);
		double d = ferry_tools_now_s() - t0;
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
		double t0 = ferry_tools_now_s();
		r = ferry_st_writer_save_async(w, path, sums);
		t_async_block = ferry_tools_now_s() - t0;
		int64_t s = r ? r : ferry_st_writer_wait(w, -1);
		t_async = ferry_tools_now_s() - t0;
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
			ferry_tools_drop_cache(path);
		for (int k = 0; k < FERRY_STAT__COUNT; k++)
			st0[k] = ferry_ctx_stat(ctx, (enum ferry_stat)k);
		double t0 = ferry_tools_now_s();
		r = ferry_st_load_run(ld, dev, 0, 0);
		double d = ferry_tools_now_s() - t0;
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
free_tensors:
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
