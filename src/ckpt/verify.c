/* Verifying a committed checkpoint step (see include/ferry/ckpt.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/save.h"
#include "base/base.h"
#include "ferry/ckpt.h"
#include "base/json.h"

static int read_small(const char *path, char *buf, size_t cap, size_t *len)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	*len = fread(buf, 1, cap - 1, f);
	int full = !feof(f) && fgetc(f) != EOF;
	fclose(f);
	buf[*len] = '\0';
	return full ? -EFBIG : 0;
}

/* -------------------------------------------------------------------------------------- verify */

/* Checks one shard file: structure (ferry_st_open) and every tensor's checksum. */
static int verify_shard(ferry_ctx *ctx, const char *path, int require_sums)
{
	ferry_st *st;
	int r = ferry_st_open(ctx, path, &st);
	for (size_t i = 0; !r && i < ferry_st_count(st); i++) {
		int v = ferry_st_verify(st, i);
		if (v == 0 && require_sums)
			r = ferry__error(FERRY_EVERIFY, "%s: tensor \"%s\" has no checksum", path, ferry_st_name(st, i));
		else if (v < 0)
			r = v;
	}
	ferry_st_destroy(st);
	return r;
}

struct verify_files {
	ferry_ctx *ctx;
	const char *step_dir;
	int require_sums;
	int shards;
};

static int verify_shard_file(void *arg, const char *name)
{
	struct verify_files *vf = arg;
	char fp[PATH_MAX + 300];
	snprintf(fp, sizeof(fp), "%s/%s", vf->step_dir, name);
	vf->shards++;
	return vf->ctx ? verify_shard(vf->ctx, fp, vf->require_sums) : 0;
}

/*
 * Reads a committed step's manifest: its world, and as many shards listed; with ctx, each shard
 * verified on its own (the ranks of a step usually hold tensors of the same names, replicas or
 * tensor-parallel pieces, which one load of the whole manifest refuses as ambiguous). missing:
 * the error for a step without a manifest.
 */
static int read_manifest(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums, int missing,
			 uint64_t *world_out)
{
	char sp[PATH_MAX], p[PATH_MAX + 32];
	int r = ferry_ckpt_step_path(dir, step, sp, sizeof(sp) - 16);
	if (r < 0)
		return r;
	snprintf(p, sizeof(p), "%s/manifest.json", sp);
	if (access(p, F_OK))
		return ferry__error(missing, "%s: no manifest.json: step %lld is not committed", sp, (long long)step);
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return ferry__error(-ENOMEM, "ckpt: out of memory");
	if ((r = read_small(p, buf, cap, &len))) {
		free(buf);
		return ferry__error(r, "%s: %s", p, strerror(-r));
	}
	struct ferry__json j;
	char *k;
	size_t kl, kpos;
	int m = 0, shards = 0;
	uint64_t world = 0;
	if (ferry__json_init(&j, buf, len) || ferry__json_object_begin(&j))
		goto bad;
	while (!r && (m = ferry__json_object_next(&j, &k, &kl, &kpos)) == 1) {
		if (!strcmp(k, "world")) {
			if (ferry__json_uint(&j, &world))
				goto bad;
		} else if (!strcmp(k, "shards")) {
			struct verify_files vf = {ctx, sp, require_sums, 0};
			r = ferry__json_shard_files(&j, p, verify_shard_file, &vf);
			shards = vf.shards;
			if (r == 1)
				goto bad;
		} else if (ferry__json_skip(&j)) {
			goto bad;
		}
		if (m < 0)
			goto bad;
	}
	if (!r && (m < 0 || ferry__json_end(&j)))
		goto bad;
	if (!r && (!shards || (uint64_t)shards != world || world > INT_MAX))
		r = ferry__error(FERRY_ECORRUPT, "%s: %d shards listed for a world of %llu", p, shards,
				 (unsigned long long)world);
	free(buf);
	*world_out = world;
	return r;
bad:
	free(buf);
	return ferry__error(FERRY_ECORRUPT, "%s: byte %zu: %s", p, j.err_pos, j.err ? j.err : "unexpected JSON");
}

int ferry_ckpt_verify(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums)
{
	uint64_t world;
	return read_manifest(ctx, dir, step, require_sums, FERRY_ECORRUPT, &world);
}

int ferry_ckpt_world(const char *dir, int64_t step)
{
	uint64_t world;
	int r = read_manifest(NULL, dir, step, 0, -ENOENT, &world);
	return r < 0 ? r : (int)world;
}
