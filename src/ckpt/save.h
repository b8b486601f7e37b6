/* Internals of the safetensors writer shared with checkpoints (src/ckpt/ckpt.c). */
#ifndef FERRY_CKPT_SAVE_H
#define FERRY_CKPT_SAVE_H

#include <sys/types.h>

#include "base/durable.h" /* ferry__fsync_dir, ferry__fsync_parent, ferry__write_durable */
#include "ferry/safetensors.h"

/*
 * Runs after the file of an asynchronous or synchronous save is in place (or failed): result is
 * the save's result; the hook's return replaces it. Called on the writer's thread.
 */
typedef int64_t (*ferry__save_hook)(void *arg, int64_t result);
/* The writer's knob table (base/knob.h), which ferry_ckpt_set passes the writer's keys on to. */
extern const struct ferry__knobs ferry__st_writer_knobs;
/* reuse: NULL, or a pruned file that the writer thread renames to the temporary name and writes
 * over (when it exists, is a plain file with one link, and no other process has it open). */
int64_t ferry__st_writer_save_hooked(ferry_st_writer *w, const char *path, int flags, int async,
				     ferry__save_hook hook, void *arg, const char *reuse);
/* The next save (only) writes a compressed file (docs/FORMATS.md) of codec (FERRY_CZ_*; 0: plain):
 * its header without per-tensor checksums (the chunks' checksums cover every byte), no file written
 * over (reuse ignored), not to a URL (-EOPNOTSUPP). */
void ferry__st_writer_compress(ferry_st_writer *w, int codec);
/* Adds ns to a phase of the current save (checkpoints time FERRY_PHASE_CKPT_PREPARE). */
void ferry__st_writer_phase(ferry_st_writer *w, enum ferry_save_phase phase, uint64_t ns);
/* fallocate(2), through a pointer so that tests can play a file system that refuses it. */
extern int (*ferry__save_fallocate)(int fd, int mode, off_t offset, off_t len);
/* A shard file named by an index or manifest must be a plain name in its directory (no separator,
 * no "." or "..", no NUL inside): 0, or FERRY_ECORRUPT naming the index and the byte. */
int ferry__check_shard_name(const char *index, const char *name, size_t len, size_t pos);
struct ferry__json;
/* A manifest's "shards" value at j's position, [{"file": NAME, ...}, ...]: fn(arg, NAME) for each
 * file, NAME checked first with ferry__check_shard_name (index names the manifest). Returns 0, the
 * first error of the check or of fn, or 1 when the JSON is malformed (j's error says where). */
int ferry__json_shard_files(struct ferry__json *j, const char *index, int (*fn)(void *arg, const char *name),
			    void *arg);
/*
 * A checkpoint's small objects on s3:// (markers, manifest, `latest`; docs/REMOTE.md), read and
 * written whole through the remote backend; ctx NULL: a context made for the call. get: a new
 * NUL-terminated buffer in *buf (the caller frees it), -ENOENT when absent, -EFBIG over max bytes.
 * put: one PUT, the object visible whole once it returns 0 (a PUT in S3 replaces atomically).
 */
int ferry__url_get(ferry_ctx *ctx, const char *url, size_t max, char **buf, size_t *len);
int ferry__url_put(ferry_ctx *ctx, const char *url, const void *buf, size_t len);

#endif
