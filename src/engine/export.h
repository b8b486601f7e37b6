/*
 * What the engine offers the layers above it (formats, checkpoints, the loader, the tools), beside
 * the public API. Everything else in src/engine/ is the engine's own: the build gives the upper
 * layers this header only (CMakeLists.txt, FERRY_EXPORTS_engine).
 */
#ifndef FERRY_ENGINE_EXPORT_H
#define FERRY_ENGINE_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "ferry/ferry.h"

/*
 * true if every page of [off, off+len) of f is in memory: always for a file on tmpfs or ramfs
 * (asked once, at open), else by cachestat(2) (false when unknown).
 */
bool ferry__range_resident(const ferry_file *f, uint64_t off, uint64_t len);
/* The buffered descriptor of an open file (always open; the file keeps it). */
int ferry__file_fd(const ferry_file *f);
/*
 * ferry_file_open of the file a caller has just made (durable.h's temporary: made_fd open on it) as
 * dirfd/name: opened relative to the directory, never through a symlink, and refused (-ESTALE) when
 * the name no longer leads to that file. path: how errors and the file name it.
 */
int ferry__file_open_made(ferry_ctx *ctx, int dirfd, const char *name, int made_fd, const char *path,
			  int flags, ferry_file **out);
/*
 * Object storage beyond one object (remote.c, docs/REMOTE.md). ferry__remote_list: the objects
 * under an s3:// prefix URL ("s3://bucket/dir/" or any key prefix) by ListObjectsV2 (signed as
 * every request), in key order, pages of 100 followed; fn(arg, "s3://bucket/key", size, ETag) for
 * each, and a nonzero return of fn stops the listing and is returned. ferry__remote_delete:
 * DeleteObject of an s3:// URL (an absent key is no error, as in S3). 0, or a negative code with
 * the detail (URL, HTTP status, S3 Code) set.
 */
typedef int (*ferry__remote_list_fn)(void *arg, const char *url, uint64_t size, const char *etag);
int ferry__remote_list(ferry_ctx *ctx, const char *prefix, ferry__remote_list_fn fn, void *arg);
int ferry__remote_delete(ferry_ctx *ctx, const char *url);
/* The context's host_budget knob: pinned host memory its users may hold (0: no limit). */
uint64_t ferry__ctx_host_budget(const ferry_ctx *ctx);
/* The context's cache knobs (cache_dir: "" for none, cache_bytes, cache_jobs). */
const char *ferry__ctx_cache(const ferry_ctx *ctx, uint64_t *bytes, unsigned *jobs);
/* A remote file's ETag as HEAD gave it ("" when the server sends none); NULL for a local file. */
const char *ferry__file_etag(const ferry_file *f);
/*
 * The commit of an s3:// object being written is made conditional on header ("If-None-Match: *":
 * only if there is no object; "If-Match: <ETag>": only if it is still that one). A refused commit
 * is -EEXIST, a store without conditional writes -EOPNOTSUPP, each saying so. Returns 1 when set,
 * 0 when the context's remote_lock knob is off (nothing set), or a negative code.
 */
int ferry__file_put_condition(ferry_file *f, const char *header);

/*
 * What a process is doing, for `ferry top`: a loader, a checkpoint save, a safetensors load. When
 * the context publishes (publish=1, FERRY_PUBLISH=1), ferry__activity_begin takes a slot of its
 * publication (src/engine/publish.h) and returns it; otherwise, or when every slot is taken, NULL,
 * which every other call accepts and ignores. Counters are relaxed atomic words: cheap enough for
 * every batch. The caller ends what it began, before the context is destroyed.
 */
enum ferry__activity_kind { FERRY__ACTIVITY_LOADER = 1, FERRY__ACTIVITY_SAVE = 2, FERRY__ACTIVITY_LOAD = 3 };
enum ferry__activity_field {
	FERRY__ACT_ITEMS,   /* loader: samples handed out; save, load: tensors */
	FERRY__ACT_BATCHES, /* loader: batches handed out */
	FERRY__ACT_BYTES,   /* loader: bytes handed out; save: written; load: read */
	FERRY__ACT_WAIT_NS, /* loader: time the consumer waited for its batches */
	FERRY__ACT_TOTAL,   /* save, load: bytes the whole operation moves (0: not known) */
	FERRY__ACT_STEP,    /* save: the checkpoint's step (UINT64_MAX: none) */
	FERRY__ACT_PHASE,   /* enum ferry__activity_phase */
	FERRY__ACT_THREADS, /* loader: pipeline threads */
	FERRY__ACT__COUNT
};
enum ferry__activity_phase {
	FERRY__PHASE_PREPARE, /* save: taking the snapshot; load: planning */
	FERRY__PHASE_MOVE,    /* loader: running; save: writing; load: reading */
	FERRY__PHASE_SYNC,    /* save: fsync */
	FERRY__PHASE_COMMIT,  /* save: rename, directory sync, the checkpoint's commit */
	FERRY__PHASE_DONE,
	FERRY__PHASE_FAILED,
};
struct ferry__activity;
/* name: what top shows (a dataset, a file; its last 39 bytes are kept). */
struct ferry__activity *ferry__activity_begin(ferry_ctx *ctx, enum ferry__activity_kind kind, const char *name);
void ferry__activity_add(struct ferry__activity *a, enum ferry__activity_field f, uint64_t v);
void ferry__activity_set(struct ferry__activity *a, enum ferry__activity_field f, uint64_t v);
/* A save or load stays shown as the last one (phase DONE or FAILED) until its kind begins again;
 * a loader's slot is freed. a must not be used afterwards. */
void ferry__activity_end(struct ferry__activity *a, enum ferry__activity_phase phase);

#endif
