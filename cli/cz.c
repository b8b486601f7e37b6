/*
 * Compressed files from the command line (docs/FORMATS.md):
 *   ferry cp --compress zstd|lz4 [--level N] [--chunk SIZE] [--threads N] SRC DST   (DST local or s3://)
 *   ferry cp SRC DST            (SRC a compressed file: DST gets the plain bytes; both local)
 *   ferry cz info [--json] FILE
 * ferry cp between a URL and a local path without these options is ferry stage (cli/stage.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "ferry/compress.h"
#include "ferry/data.h"
#include "ferry/ferry.h"
#include "progress.h"

#define BLOCK (64u << 20) /* bytes per read: many chunks, so the writer and reader work in parallel */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int is_url(const char *s)
{
	return strstr(s, "://") != NULL;
}

static int cp_usage(void)
{
	fprintf(stderr,
		"usage: ferry cp [--compress zstd|lz4] [--level N] [--chunk SIZE] [--threads N] [--json] [--quiet] SRC DST\n"
		"  --compress: DST becomes a compressed file (docs/FORMATS.md); SRC a local path or a URL; DST a\n"
		"    local path or an s3:// URL (one multipart upload, visible whole at the end)\n"
		"  SRC a compressed file, no --compress: DST gets its plain bytes (--decompress for a URL)\n"
		"  between a URL and a local path otherwise: ferry stage (resumable, prefixes)\n");
	return 2;
}

static atomic_uint_fast64_t moved;
static uint64_t poll_moved(void *arg)
{
	(void)arg;
	return atomic_load(&moved);
}

static int fail(const char *what)
{
	fprintf(stderr, "ferry cp: %s: %s\n", what, ferry_last_error());
	return 1;
}

int ferry_cmd_cp(int argc, char **argv)
{
	const char *src = NULL, *dst = NULL, *codec_name = NULL, *level = NULL, *chunk = NULL, *threads = NULL;
	int json = 0, quiet = 0, decompress = 0;
	for (int a = 1; a < argc; a++) {
		const char *arg = argv[a];
		const char **opt = !strcmp(arg, "--compress") ? &codec_name
				   : !strcmp(arg, "--level")  ? &level
				   : !strcmp(arg, "--chunk")  ? &chunk
				   : !strcmp(arg, "--threads") ? &threads
							       : NULL;
		if (opt) {
			if (a + 1 >= argc) {
				fprintf(stderr, "ferry cp: %s needs a value\n", arg);
				return 2;
			}
			*opt = argv[++a];
		} else if (!strncmp(arg, "--compress=", 11))
			codec_name = arg + 11;
		else if (!strcmp(arg, "--decompress"))
			decompress = 1;
		else if (!strcmp(arg, "--json"))
			json = 1;
		else if (!strcmp(arg, "--quiet") || !strcmp(arg, "-q"))
			quiet = 1;
		else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			cp_usage();
			return 0;
		} else if (arg[0] == '-' && arg[1] && strcmp(arg, "--jobs") && strncmp(arg, "--jobs=", 7)) {
			fprintf(stderr, "ferry cp: unknown option %s\n", arg);
			return cp_usage();
		} else if (!strcmp(arg, "--jobs")) {
			a++; /* ferry stage's; checked there */
		} else if (!strncmp(arg, "--jobs=", 7)) {
		} else if (!src)
			src = arg;
		else if (!dst)
			dst = arg;
		else
			return cp_usage();
	}
	if (!src || !dst)
		return cp_usage();
	if (!codec_name && !decompress && (is_url(src) || is_url(dst)))
		return ferry_cmd_stage(argc, argv);
	if (is_url(dst) && !codec_name) {
		fprintf(stderr, "ferry cp: %s: a decompressed copy is written to a local path; "
				"stage it afterwards with ferry cp LOCAL URL\n", dst);
		return 2;
	}
	int codec = 0;
	if (codec_name && (codec = ferry_cz_codec_from_name(codec_name)) < 0) {
		fprintf(stderr, "ferry cp: --compress %s: expected zstd or lz4\n", codec_name);
		return 2;
	}
	if (!codec_name && (level || chunk)) {
		fprintf(stderr, "ferry cp: --level and --chunk go with --compress\n");
		return 2;
	}
	/* a directory as DST: the file keeps its name there */
	char dpath[4096];
	struct stat sb;
	if (!is_url(dst) && !stat(dst, &sb) && S_ISDIR(sb.st_mode)) {
		const char *base = strrchr(src, '/');
		snprintf(dpath, sizeof(dpath), "%s/%s", dst, base ? base + 1 : src);
		dst = dpath;
	}
	ferry_ctx *ctx;
	if (ferry_ctx_create(&ctx))
		return fail("context");
	int rc = 0;
	double t0 = now();
	uint64_t in_bytes = 0, out_bytes = 0;
	char *buf = malloc(BLOCK);
	struct cli_progress prog = {0};
	ferry_cz *z = NULL;
	ferry_file *f = NULL;
	const char *mode;
	if (!buf) {
		fprintf(stderr, "ferry cp: out of memory\n");
		rc = 1;
		goto done;
	}
	int compressed = codec ? 0 : ferry_cz_is_compressed(ctx, src);
	if (compressed < 0) {
		rc = fail(src);
		goto done;
	}
	if (decompress && !compressed) {
		fprintf(stderr, "ferry cp: --decompress: %s is not a ferry compressed file\n", src);
		rc = 1;
		goto done;
	}
	if (codec) { /* compress */
		mode = "compress";
		ferry_cz_writer *w = NULL;
		int64_t size;
		if (ferry_file_open(ctx, src, FERRY_O_RDONLY, &f) || (size = ferry_file_size(f)) < 0) {
			rc = fail(src);
			goto done;
		}
		if (ferry_cz_writer_create(dst, codec, 0, &w) || (threads && ferry_cz_writer_set(w, "cz_threads", threads)) ||
		    (level && ferry_cz_writer_set(w, "cz_level", level)) || (chunk && ferry_cz_writer_set(w, "cz_chunk", chunk))) {
			rc = fail(dst);
			ferry_cz_writer_destroy(w);
			goto done;
		}
		cli_progress_start(&prog, "ferry cp --compress", NULL, (uint64_t)size, quiet || json, poll_moved, NULL);
		while (!rc && in_bytes < (uint64_t)size) {
			ssize_t k = ferry_pread(f, buf, BLOCK, in_bytes);
			if (k <= 0) {
				rc = k < 0 ? fail(src) : (fprintf(stderr, "ferry cp: %s: shorter than its size\n", src), 1);
				break;
			}
			if (ferry_cz_writer_write(w, buf, (size_t)k))
				rc = fail(dst);
			in_bytes += (uint64_t)k;
			atomic_store(&moved, in_bytes);
		}
		int64_t out = rc ? 0 : ferry_cz_writer_commit(w);
		cli_progress_stop(&prog, !rc && out >= 0);
		if (out < 0)
			rc = fail(dst);
		ferry_cz_writer_destroy(w);
		out_bytes = rc ? 0 : (uint64_t)out;
	} else { /* decompress, or a plain local copy */
		mode = compressed ? "decompress" : "copy";
		ferry_durable *d = NULL;
		int64_t size;
		if (compressed ? (ferry_cz_open(ctx, src, &z) || (threads && ferry_cz_set(z, "cz_threads", threads)))
			       : ferry_file_open(ctx, src, FERRY_O_RDONLY, &f)) {
			rc = fail(src);
			goto done;
		}
		size = compressed ? ferry_cz_size(z) : ferry_file_size(f);
		if (size < 0 || ferry_durable_create(dst, &d)) {
			rc = fail(size < 0 ? src : dst);
			goto done;
		}
		cli_progress_start(&prog, compressed ? "ferry cp (decompress)" : "ferry cp", NULL, (uint64_t)size,
				   quiet || json, poll_moved, NULL);
		while (!rc && out_bytes < (uint64_t)size) {
			ssize_t k = compressed ? ferry_cz_pread(z, buf, BLOCK, out_bytes) : ferry_pread(f, buf, BLOCK, out_bytes);
			if (k <= 0) {
				rc = k < 0 ? fail(src) : (fprintf(stderr, "ferry cp: %s: shorter than its size\n", src), 1);
				break;
			}
			if (ferry_durable_pwrite(d, buf, (size_t)k, out_bytes) != k)
				rc = fail(dst);
			out_bytes += (uint64_t)k;
			atomic_store(&moved, out_bytes);
		}
		if (!rc && ferry_durable_commit(d, 0))
			rc = fail(dst);
		cli_progress_stop(&prog, !rc);
		ferry_durable_destroy(d);
		in_bytes = compressed ? (uint64_t)ferry_cz_compressed_size(z) : out_bytes;
	}
	if (!rc) {
		double s = now() - t0;
		uint64_t plain = codec ? in_bytes : out_bytes, packed = codec ? out_bytes : in_bytes;
		if (json)
			printf("{\"src\":\"%s\",\"dst\":\"%s\",\"mode\":\"%s\",\"bytes\":%llu,\"compressed_bytes\":%llu,"
			       "\"ratio\":%.4f,\"seconds\":%.3f,\"bytes_per_s\":%.0f}\n",
			       src, dst, mode, (unsigned long long)plain, (unsigned long long)packed,
			       packed ? (double)plain / (double)packed : 0.0, s, s > 0 ? (double)plain / s : 0.0);
		else if (!quiet) {
			char ratio[48] = "";
			if ((compressed || codec) && packed)
				snprintf(ratio, sizeof(ratio), ", ratio %.2f", (double)plain / (double)packed);
			printf("ferry cp: %s %s -> %s: %llu bytes%s in %.2f s (%.0f MB/s)\n", mode, src, dst,
			       (unsigned long long)plain, ratio, s, s > 0 ? (double)plain / s / 1e6 : 0.0);
		}
	}
done:
	free(buf);
	ferry_cz_destroy(z);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	return rc;
}

static int cz_usage(void)
{
	fprintf(stderr, "usage: ferry cz info [--json] FILE...\n"
			"  a compressed file's codec, sizes, ratio and chunks (docs/FORMATS.md)\n");
	return 2;
}

int ferry_cmd_cz(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "info"))
		return argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) ? (cz_usage(), 0) : cz_usage();
	int json = 0, files = 0, rc = 0;
	for (int a = 2; a < argc; a++)
		if (!strcmp(argv[a], "--json"))
			json = 1;
		else if (argv[a][0] == '-' && argv[a][1]) {
			fprintf(stderr, "ferry cz info: unknown option %s\n", argv[a]);
			return cz_usage();
		} else
			files++;
	if (!files)
		return cz_usage();
	ferry_ctx *ctx;
	if (ferry_ctx_create(&ctx)) {
		fprintf(stderr, "ferry cz info: %s\n", ferry_last_error());
		return 1;
	}
	for (int a = 2; a < argc; a++) {
		if (argv[a][0] == '-' && argv[a][1])
			continue;
		ferry_cz *z;
		if (ferry_cz_open(ctx, argv[a], &z)) {
			if (json)
				printf("{\"file\":\"%s\",\"error\":\"%s\"}\n", argv[a], ferry_last_error());
			else
				fprintf(stderr, "ferry cz info: %s\n", ferry_last_error());
			rc = 1;
			continue;
		}
		int64_t u = ferry_cz_size(z), c = ferry_cz_compressed_size(z);
		double ratio = c ? (double)u / (double)c : 0.0;
		if (json)
			printf("{\"file\":\"%s\",\"codec\":\"%s\",\"bytes\":%lld,\"compressed_bytes\":%lld,\"ratio\":%.4f,"
			       "\"chunk_size\":%lld,\"chunks\":%lld,\"stored_chunks\":%lld}\n",
			       argv[a], ferry_cz_codec_name(ferry_cz_codec(z)), (long long)u, (long long)c, ratio,
			       (long long)ferry_cz_chunk_size(z), (long long)ferry_cz_chunks(z),
			       (long long)ferry_cz_stored_chunks(z));
		else
			printf("%s: %s, %lld bytes in %lld compressed (ratio %.2f), %lld chunks of %lld bytes, %lld stored\n",
			       argv[a], ferry_cz_codec_name(ferry_cz_codec(z)), (long long)u, (long long)c, ratio,
			       (long long)ferry_cz_chunks(z), (long long)ferry_cz_chunk_size(z),
			       (long long)ferry_cz_stored_chunks(z));
		ferry_cz_destroy(z);
	}
	ferry_ctx_destroy(ctx);
	return rc;
}

/* src into a new compressed file dst (replacing it); its size, or a negative code. */
static int64_t compress_one(ferry_ctx *ctx, const char *src, const char *dst, int codec, char *buf)
{
	ferry_file *f = NULL;
	ferry_cz_writer *w = NULL;
	int64_t r = ferry_file_open(ctx, src, FERRY_O_RDONLY, &f), size = r ? 0 : ferry_file_size(f);
	if (!r && size < 0)
		r = size;
	if (!r)
		r = ferry_cz_writer_create(dst, codec, 0, &w);
	for (uint64_t off = 0; !r && off < (uint64_t)size;) {
		ssize_t k = ferry_pread(f, buf, BLOCK, off);
		r = k <= 0 ? (k < 0 ? k : -EIO) : ferry_cz_writer_write(w, buf, (size_t)k);
		off += k > 0 ? (uint64_t)k : 0;
	}
	if (!r)
		r = ferry_cz_writer_commit(w);
	ferry_cz_writer_destroy(w);
	ferry_file_destroy(f);
	return r;
}

int ferry_cli_cz_shards(ferry_ctx *ctx, const char *dir, int codec)
{
	ferry_dataset *ds;
	int r = ferry_dataset_open(ctx, dir, &ds);
	if (r)
		return r;
	uint32_t n = ferry_dataset_shards(ds);
	char **paths = calloc(n ? n : 1, sizeof(*paths));
	for (uint32_t k = 0; paths && k < n; k++)
		paths[k] = strdup(ferry_dataset_shard_path(ds, k));
	ferry_dataset_destroy(ds);
	char *buf = malloc(BLOCK);
	if (!paths || !buf)
		r = -ENOMEM;
	for (uint32_t k = 0; !r && k < n; k++) {
		if (!paths[k]) {
			r = -ENOMEM;
			break;
		}
		if (codec) {
			int64_t c = compress_one(ctx, paths[k], paths[k], codec, buf);
			r = c < 0 ? (int)c : 0;
			continue;
		}
		/* auto: zstd into a temporary beside the shard, kept only where it saves a tenth */
		char tmp[4096];
		struct stat plain;
		snprintf(tmp, sizeof(tmp), "%s.cz-auto-%d", paths[k], (int)getpid());
		int64_t c = stat(paths[k], &plain) ? -errno : compress_one(ctx, paths[k], tmp, FERRY_CZ_ZSTD, buf);
		if (c < 0)
			r = (int)c;
		else if (c * 10 <= (int64_t)plain.st_size * 9) {
			if (rename(tmp, paths[k]))
				r = -errno;
			char d[4096];
			snprintf(d, sizeof(d), "%s", paths[k]);
			char *slash = strrchr(d, '/');
			if (slash)
				*slash = 0;
			int fd = open(slash ? d : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (fd >= 0) {
				if (!r && fsync(fd))
					r = -errno;
				close(fd);
			}
		}
		unlink(tmp); /* not taken (or already renamed: nothing there) */
	}
	for (uint32_t k = 0; paths && k < n; k++)
		free(paths[k]);
	free(paths);
	free(buf);
	return r;
}
