/* ferry snapshot PID DIR, ferry restore DIR: GPU process snapshots (tools/ferry_snapshot.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "commands.h"
#include "ferry/ferry.h"
#include "ferry_snapshot.h"
#include "ferry_tools.h"

struct snap_opts {
	int leave_running, gpu_only;
	unsigned lock_timeout_ms;
	const char *criu_args;
};

#define SO(f) offsetof(struct snap_opts, f)
static const struct cli_opt snapshot_rows[] = {
	{.name = "leave-running", .kind = CLI_FLAG, .off = SO(leave_running),
	 .help = "the process goes on after the dump (criu dump --leave-running; its GPU state is resumed)"},
	{.name = "lock-timeout-ms", .kind = CLI_UINT, .off = SO(lock_timeout_ms), .arg = "MS", .min = 0, .max = 3600000,
	 .help = "how long to wait for the process's CUDA calls to finish before it is locked (0: as long as it takes)"},
	{.name = "gpu-only", .kind = CLI_FLAG, .off = SO(gpu_only),
	 .help = "no CRIU, no DIR: suspend the GPU state and resume it at once, timing both (a check of the driver part)"},
	{.name = "criu-args", .kind = CLI_STR, .off = SO(criu_args), .arg = "ARGS",
	 .help = "more arguments for criu dump, split at spaces (--criu-args=\"--tcp-established --ext-unix-sk\")"},
	{.name = NULL},
};
static const struct cli_opt restore_rows[] = {
	{.name = "criu-args", .kind = CLI_STR, .off = SO(criu_args), .arg = "ARGS",
	 .help = "more arguments for criu restore, split at spaces (--criu-args=\"...\")"},
	{.name = NULL},
};

#define NEEDS                                                                                          \
	"Needs: an NVIDIA driver with the checkpoint API (570 or later), CRIU (apt-get install criu, or\n" \
	"FERRY_CRIU=/path/to/criu), root (or CAP_CHECKPOINT_RESTORE); 'ferry doctor' says what this\n"     \
	"machine lacks (rows snapshot.*). docs/CHECKPOINTS.md, \"GPU process snapshots\"."

static const struct cli_cmd snapshot_cmd = {
	.name = "snapshot",
	.synopsis = "ferry snapshot PID DIR [--leave-running] [--lock-timeout-ms MS] [--criu-args ARGS]\n"
		    "ferry snapshot PID --gpu-only [--lock-timeout-ms MS]",
	.about = "Suspends the GPU state of CUDA process PID with the driver's checkpoint API (its CUDA calls\n"
		 "locked, GPU memory moved into its host memory), dumps the process with CRIU into DIR (new or\n"
		 "empty), fsyncs every file there and writes DIR/ferry-snapshot.json last. Without\n"
		 "--leave-running the process ends with the dump. If CRIU fails, the GPU state is resumed and the\n"
		 "process runs on.\n" NEEDS,
	.opts = snapshot_rows,
	.min_args = 1,
	.max_args = 2,
	.args = "PID DIR",
};

static const struct cli_cmd restore_cmd = {
	.name = "restore",
	.synopsis = "ferry restore DIR [--criu-args ARGS]",
	.about = "Restores the process snapshotted into DIR with CRIU (under its old PID, detached) and then its\n"
		 "GPU state (cuCheckpointProcessRestore, unlock): it computes on from where it stopped.\n" NEEDS,
	.opts = restore_rows,
	.min_args = 1,
	.max_args = 1,
	.args = "DIR",
};

int ferry_cmd_snapshot(int argc, char **argv)
{
	struct snap_opts o = {0};
	struct cli_args a = {0};
	int rc = cli_parse(&snapshot_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	char *end;
	long pid = strtol(a.argv[0], &end, 10);
	if (*end || pid <= 0 || pid > 0x7fffffff)
		return cli_usage_error(&snapshot_cmd, &a, "PID %s is not a process id", a.argv[0]);
	if (o.gpu_only != (a.argc == 1))
		return cli_usage_error(&snapshot_cmd, &a, o.gpu_only ? "--gpu-only takes no DIR" : "DIR is missing");
	double t[2];
	if (o.gpu_only) {
		double t0 = ferry_tools_now_s();
		if (ferry_snapshot_gpu_suspend((int)pid, o.lock_timeout_ms)) {
			fprintf(stderr, "ferry snapshot: %s\n", ferry_last_error());
			return 1;
		}
		double t1 = ferry_tools_now_s();
		if (ferry_snapshot_gpu_resume((int)pid)) {
			fprintf(stderr, "ferry snapshot: pid %ld was suspended, but: %s\n", pid, ferry_last_error());
			return 1;
		}
		printf("pid %ld: GPU suspended in %.3f s (lock, checkpoint), resumed in %.3f s (restore, unlock)\n", pid,
		       t1 - t0, ferry_tools_now_s() - t1);
		return 0;
	}
	struct ferry_snapshot_opts so = {.lock_timeout_ms = o.lock_timeout_ms, .leave_running = o.leave_running,
					 .criu_args = o.criu_args};
	int err = ferry_snapshot_take((int)pid, a.argv[1], &so, t);
	if (err) {
		fprintf(stderr, "ferry snapshot: %s\n", ferry_last_error());
		return 1;
	}
	printf("snapshot of pid %ld in %s: GPU suspended in %.3f s, CRIU dump %.3f s; the process %s\n", pid,
	       a.argv[1], t[0], t[1], o.leave_running ? "runs on" : "has ended (ferry restore DIR brings it back)");
	return 0;
}

int ferry_cmd_restore(int argc, char **argv)
{
	struct snap_opts o = {0};
	struct cli_args a = {0};
	int rc = cli_parse(&restore_cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	struct ferry_snapshot_opts so = {.criu_args = o.criu_args};
	double t[2];
	int pid = ferry_snapshot_restore(a.argv[0], &so, t);
	if (pid < 0) {
		fprintf(stderr, "ferry restore: %s\n", ferry_last_error());
		return 1;
	}
	printf("restored pid %d from %s: CRIU restore %.3f s, GPU resumed in %.3f s\n", pid, a.argv[0], t[0], t[1]);
	return 0;
}
