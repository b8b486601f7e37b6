/*
 * ferry: checkpoint directories for training, durable and asynchronous.
 *
 *   DIR/step-000000000100/rank-00000-of-00002.safetensors   each rank's shard
 *   DIR/step-000000000100/rank-00000-of-00002.done          a rank's marker: its shard is durable
 *   DIR/step-000000000100/manifest.json                     written by rank 0 once all markers are in
 *   DIR/latest                                              "step-000000000100\n"
 *
 * A rank writes its shard (temporary name, fsync, rename, directory fsync), then its marker the
 * same way. Rank 0 (the committer) waits for every marker of the step that carries the same run
 * id, writes the manifest durably, then moves `latest` by renaming a new file over it and
 * fsyncing the directory, then prunes old steps (keeping the newest pruned one's shards in
 * DIR/recycle for the next save to write over). A crash at any instant leaves `latest` naming a
 * complete checkpoint. Tensors (host or device memory) are added before each save and forgotten
 * after it.
 */
#ifndef FERRY_CKPT_H
#define FERRY_CKPT_H

#include "ferry/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_ckpt ferry_ckpt;

/*
 * Opens (creates) the checkpoint directory dir for rank of world ranks, as that rank's one writer:
 * it holds a lock on DIR/.ferry-lock-rank-R while open (handles of one process share it). Returns
 * 0, FERRY_EBUSY when another process writes the same rank (the message names its pid and host),
 * or another error.
 */
FERRY_API FERRY_WUR int ferry_ckpt_open(ferry_ctx *ctx, const char *dir, int rank, int world, ferry_ckpt **out);
/* Waits for a save in flight, then frees. NULL is accepted. */
FERRY_API void ferry_ckpt_destroy(ferry_ckpt *ck);
/*
 * Options: keep (steps kept by pruning, 0 keeps all; default 2), busy (wait|refuse: what a save
 * does while another is in flight; default wait), checksum (0|1; default 1), run (an id shared
 * by the ranks of one run; markers of another run are ignored), timeout_ms (how long rank 0 waits
 * for the other ranks' markers; default 600000), recycle (0|1, default 1: pruning moves the newest
 * pruned step to DIR/recycle, and each rank's next save writes over its shard there instead of
 * making a new file, unless the file has other links or another process has it open), compress
 * (off|lz4|zstd|auto, default off: the shard is written as rank-R-of-W.safetensors.fz, ferry's
 * compressed format holding the safetensors file, its codec in the manifest; auto is zstd;
 * ferry_st_open reads it; not under a URL, docs/CHECKPOINTS.md "Compressed checkpoints"). The
 * writer's knobs (ferry_st_writer_set: save_prealloc, ...) are passed on to the checkpoint's writer.
 * Returns 0 or FERRY_EBADOPT.
 */
FERRY_API FERRY_WUR int ferry_ckpt_set(ferry_ckpt *ck, const char *key, const char *value);
/* The checkpoint's own knob names, NULL-terminated (ferry_ckpt_set also takes the writer's). */
FERRY_API const char *const *ferry_ckpt_keys(void);
/* Adds a tensor / metadata string to the next save (as ferry_st_writer_add / _metadata). */
FERRY_API FERRY_WUR int ferry_ckpt_add(ferry_ckpt *ck, const char *name, enum ferry_dtype dtype, int ndim,
				       const uint64_t *shape, const void *data, size_t nbytes);
FERRY_API FERRY_WUR int ferry_ckpt_metadata(ferry_ckpt *ck, const char *key, const char *value);
/*
 * Saves step (>= 0) synchronously: this rank's shard and marker; rank 0 also commits. Returns 0,
 * -EEXIST (the step is already committed), FERRY_EBUSY (busy=refuse and a save is in flight),
 * -ETIMEDOUT (rank 0: markers missing), or an I/O error.
 */
FERRY_API FERRY_WUR int ferry_ckpt_save(ferry_ckpt *ck, int64_t step);
/* The same, returning once the tensors are snapshotted into pinned host memory. */
FERRY_API FERRY_WUR int ferry_ckpt_save_async(ferry_ckpt *ck, int64_t step);
/* 1 if no save is in flight. */
FERRY_API int ferry_ckpt_done(ferry_ckpt *ck);
/* Waits for the save in flight: 0, its error, or -ETIMEDOUT. */
FERRY_API int ferry_ckpt_wait(ferry_ckpt *ck, int64_t timeout_ns);
/* As ferry_st_writer_reserve, for this checkpoint's saves. */
FERRY_API FERRY_WUR int64_t ferry_ckpt_reserve(ferry_ckpt *ck, uint64_t bytes, int device);
/* As ferry_st_writer_stat and _phase_ns, for the last save (FERRY_PHASE_CKPT_PREPARE included). */
FERRY_API uint64_t ferry_ckpt_stat(const ferry_ckpt *ck, enum ferry_save_stat which);
FERRY_API uint64_t ferry_ckpt_phase_ns(const ferry_ckpt *ck, enum ferry_save_phase which);

/* The step `latest` names, -ENOENT when there is none, FERRY_ECORRUPT when it is unreadable. */
FERRY_API FERRY_WUR int64_t ferry_ckpt_latest(const char *dir);
/*
 * The committed steps of dir (a step-N directory holding manifest.json; under an s3:// prefix, a
 * step-N/manifest.json object, found by listing), newest first: up to cap of them into steps.
 * Returns how many there are (more than cap: call again with room for them), or a negative code.
 */
FERRY_API FERRY_WUR int64_t ferry_ckpt_steps(const char *dir, int64_t *steps, size_t cap);
/* Path of a step's directory, and of a rank's shard in it (a compressed shard's .fz name where the
 * plain one is absent and it is present). Return the length or -ENAMETOOLONG. */
FERRY_API FERRY_WUR int ferry_ckpt_step_path(const char *dir, int64_t step, char *buf, size_t len);
FERRY_API FERRY_WUR int ferry_ckpt_shard_path(const char *dir, int64_t step, int rank, int world,
					      char *buf, size_t len);
/*
 * Checks a committed step: manifest, every shard's structure, sizes, metadata and checksums, as
 * ferry_ckpt_verify_report lists (tensors without a checksum count as failures when require_sums).
 * Returns 0, FERRY_ECORRUPT, FERRY_EVERIFY or an I/O error, with the first problem in
 * ferry_last_error().
 */
FERRY_API FERRY_WUR int ferry_ckpt_verify(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums);
/*
 * What ferry_ckpt_verify_report counted, for the step (ferry_ckpt_report_stat) and for each shard
 * file (ferry_ckpt_report_file_stat).
 */
enum ferry_verify_stat {
	FERRY_VERIFY_FILES,    /* shard files present (a file: 1 when present) */
	FERRY_VERIFY_TENSORS,  /* tensors in them */
	FERRY_VERIFY_BYTES,    /* their size in bytes */
	FERRY_VERIFY_VERIFIED, /* tensors whose stored checksum matches */
	FERRY_VERIFY_NOSUM,    /* tensors without a checksum */
	FERRY_VERIFY_FAILED,   /* tensors whose checksum does not match (or is missing, with require_sums) */
	FERRY_VERIFY_UNTIED,   /* shards without ferry.step/run/rank/world metadata (saved before ferry wrote them) */
	FERRY_VERIFY_PROBLEMS, /* problems found, the first 64 of them kept with their messages */
	FERRY_VERIFY_WORLD,    /* the manifest's world (a file: the world in its name) */
	FERRY_VERIFY_STAT__COUNT
};
typedef struct ferry_ckpt_report ferry_ckpt_report;
/*
 * ferry_ckpt_verify, keeping going after a problem: manifest.json present (else the step is not
 * committed) and well-formed; its world equal to the shards it lists and to the shard files in the
 * step directory; each shard's name (rank-R-of-W, R its place in the list, W the world), its size
 * (the manifest's bytes), its structure, its metadata ferry.step, ferry.run, ferry.rank and
 * ferry.world (which every save writes: the step directory's, the manifest's run, the name's rank
 * and world), and every checksum. Returns what ferry_ckpt_verify does (the first problem's code,
 * its message in ferry_last_error()); *out is the report (free with ferry_ckpt_report_destroy),
 * NULL only when the report could not be made (out of memory).
 */
FERRY_API FERRY_WUR int ferry_ckpt_verify_report(ferry_ctx *ctx, const char *dir, int64_t step, int require_sums,
						 ferry_ckpt_report **out);
/* NULL is accepted. */
FERRY_API void ferry_ckpt_report_destroy(ferry_ckpt_report *rep);
/* The step's count of which; 0 for a value out of range. */
FERRY_API uint64_t ferry_ckpt_report_stat(const ferry_ckpt_report *rep, enum ferry_verify_stat which);
/* The shard files examined (listed in the manifest, then found besides), their names, their counts. */
FERRY_API size_t ferry_ckpt_report_files(const ferry_ckpt_report *rep);
FERRY_API const char *ferry_ckpt_report_file(const ferry_ckpt_report *rep, size_t i);
FERRY_API uint64_t ferry_ckpt_report_file_stat(const ferry_ckpt_report *rep, size_t i, enum ferry_verify_stat which);
/* The i-th problem's message (its code in *code when code is not NULL), or NULL past the last kept. */
FERRY_API const char *ferry_ckpt_report_problem(const ferry_ckpt_report *rep, size_t i, int *code);
/* Removes committed steps beyond the newest keep (never the one latest names), uncommitted
 * steps older than latest, and DIR/recycle (the shards a save would write over). Returns the number
 * of directories removed or an error. */
FERRY_API FERRY_WUR int ferry_ckpt_prune(const char *dir, int keep);

/*
 * The number of ranks that saved a committed step, read from its manifest (which must list as
 * many shards). Returns it (>= 1), -ENOENT when the step has no manifest (not committed),
 * FERRY_ECORRUPT for a manifest that breaks the format, or an I/O error.
 */
FERRY_API FERRY_WUR int ferry_ckpt_world(const char *dir, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CKPT_H */
