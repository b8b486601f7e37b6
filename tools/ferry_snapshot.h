/*
 * GPU process snapshots (`ferry snapshot PID DIR`, `ferry restore DIR`, the doctor's snapshot.*
 * rows): a CUDA process's GPU state suspended with the driver's checkpoint API (drivers 570 and
 * later, loaded at run time through the CUDA shim) and its image dumped by CRIU into DIR. Same
 * conventions as ferry_tools.h: 0 on success, a negative code with ferry_last_error() saying why.
 * docs/CHECKPOINTS.md, "GPU process snapshots", says what each step does and what it needs.
 */
#ifndef FERRY_SNAPSHOT_H
#define FERRY_SNAPSHOT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The driver's process states (CUprocessState). */
enum { FERRY_SNAP_RUNNING = 0, FERRY_SNAP_LOCKED = 1, FERRY_SNAP_CHECKPOINTED = 2, FERRY_SNAP_FAILED = 3 };
/* "running", "locked", "checkpointed", "failed", "unknown". */
const char *ferry_snapshot_state_name(int state);

/* What the driver offers. */
struct ferry_snapshot_driver {
	int usable;         /* libcuda loaded, cuInit done, a device visible */
	int driver_version; /* cuDriverGetVersion (12080 is 12.8), 0 when not usable */
	int present;        /* how many of the 6 checkpoint entry points resolved */
	char missing[256];  /* their names, comma-separated, when some are absent */
	char why[640];      /* when it cannot snapshot: the sentence */
};
/* Fills d. Returns 0 when all 6 entry points are there, else FERRY_ENOGPU (no driver) or -ENOTSUP
 * (entry points missing), with d->why and ferry_last_error() saying which. */
int ferry_snapshot_driver_probe(struct ferry_snapshot_driver *d);

/* The driver's state of process pid. 0 or an error (FERRY_ECUDA: the driver's code and text). */
int ferry_snapshot_gpu_state(int pid, int *state);
/*
 * RUNNING -> CHECKPOINTED: cuCheckpointProcessLock (waiting at most timeout_ms, 0 for as long as
 * it takes), then cuCheckpointProcessCheckpoint (GPU memory copied into the process's host memory,
 * device handles released). If the checkpoint fails, the process is unlocked again (RUNNING) and
 * the error says both. On failure the error names the call, the driver's code and the state left.
 */
int ferry_snapshot_gpu_suspend(int pid, unsigned timeout_ms);
/* CHECKPOINTED -> RUNNING: cuCheckpointProcessRestore then cuCheckpointProcessUnlock (from LOCKED:
 * only the unlock). The error names the call that failed and the state left. */
int ferry_snapshot_gpu_resume(int pid);

/* CRIU on this machine. */
struct ferry_snapshot_criu {
	char path[512];    /* $FERRY_CRIU, else criu on $PATH, /usr/sbin, /sbin; "" when none */
	char version[128]; /* first line of `criu --version` */
	int check_rc;      /* `criu check`'s exit status (-1: not run or no status) */
	char check[1024];  /* its last line ("Looks good."), or its "Error (...)" lines joined with " | " */
};
/* Finds CRIU (and runs `criu check` when run_check). 0, or -ENOENT when not found (c->path ""). */
int ferry_snapshot_criu_probe(struct ferry_snapshot_criu *c, int run_check);

struct ferry_snapshot_opts {
	unsigned lock_timeout_ms; /* 0: wait for the process's CUDA calls as long as it takes */
	int leave_running;        /* criu dump --leave-running: the process goes on after the dump */
	const char *criu_args;    /* more arguments for criu dump / restore, split at spaces, or NULL */
};
/*
 * Snapshots process pid into dir (created: it must not exist, or be empty): suspends its GPU
 * state, runs `criu dump -t PID -D DIR --shell-job -o dump.log`, fsyncs every file CRIU wrote
 * and dir, and writes dir/ferry-snapshot.json durably. If CRIU fails the GPU state is resumed and
 * the process runs on; the error quotes CRIU's log. With leave_running the GPU state is resumed
 * after the dump; without it CRIU has ended the process. *seconds (when not NULL) gets the time the
 * GPU suspend took, [0], and the dump, [1].
 */
int ferry_snapshot_take(int pid, const char *dir, const struct ferry_snapshot_opts *o, double seconds[2]);
/*
 * Restores the snapshot in dir: `criu restore -D DIR --shell-job --restore-detached -o
 * restore.log`, then resumes the GPU state of the restored process (same PID). Returns the PID,
 * or a negative code. seconds as for take: [0] CRIU's restore, [1] the GPU resume.
 */
int ferry_snapshot_restore(const char *dir, const struct ferry_snapshot_opts *o, double seconds[2]);

#ifdef __cplusplus
}
#endif
#endif
