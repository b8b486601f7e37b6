/*
 * GPU process snapshots: the driver's checkpoint API through the CUDA shim, CRIU as a child
 * process, DIR made durable with the durable-file module (tools/ferry_snapshot.h).
 *
 * The order is NVIDIA's cuda-checkpoint + CRIU flow (github.com/NVIDIA/cuda-checkpoint): lock the
 * process's CUDA calls, checkpoint (GPU memory into host memory, device handles released, so the
 * image holds no /dev/nvidia* mapping), criu dump; and back: criu restore, cuCheckpointProcessRestore
 * (GPU memory back onto the device), unlock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/durable.h"
#include "ferry/ferry.h"
#include "ferry_snapshot.h"
#include "ferry_tools.h"
#include "gpu/shim.h"

#define MANIFEST "ferry-snapshot.json"

const char *ferry_snapshot_state_name(int state)
{
	static const char *const names[] = {"running", "locked", "checkpointed", "failed"};
	return state >= 0 && state <= 3 ? names[state] : "unknown";
}

/* The thread's error detail without the ": <what err means>" that ferry__error appended, so that
 * a message built on it gets that suffix once. Returns buf. */
static const char *detail(char *buf, size_t len, int err)
{
	char suffix[160];
	snprintf(buf, len, "%s", ferry_last_error());
	snprintf(suffix, sizeof(suffix), ": %s", ferry_strerror(err));
	char *last = NULL;
	for (char *p = buf; (p = strstr(p, suffix)); p++)
		last = p;
	if (last)
		memmove(last, last + strlen(suffix), strlen(last + strlen(suffix)) + 1);
	return buf;
}

/* ----------------------------------------------------------------------------------- driver */

static const struct {
	const char *name;
	size_t off;
} entry_points[] = {
#define EP(f) {"cu" #f, offsetof(struct ferry__cuda_api, f)}
	EP(CheckpointProcessGetState),  EP(CheckpointProcessLock),   EP(CheckpointProcessCheckpoint),
	EP(CheckpointProcessRestore),   EP(CheckpointProcessUnlock), EP(CheckpointProcessGetRestoreThreadId),
#undef EP
};
#define NEP (sizeof(entry_points) / sizeof(entry_points[0]))

int ferry_snapshot_driver_probe(struct ferry_snapshot_driver *d)
{
	memset(d, 0, sizeof(*d));
	const struct ferry__cuda_api *cu = ferry__cuda();
	if (!cu) {
		snprintf(d->why, sizeof(d->why), "no usable CUDA driver: %s", ferry__cuda_unavailable_reason());
		return ferry__error(FERRY_ENOGPU, "%s", d->why);
	}
	d->usable = 1;
	d->driver_version = cu->driver_version;
	size_t n = 0;
	for (size_t i = 0; i < NEP; i++) {
		void *fn;
		memcpy(&fn, (const char *)cu + entry_points[i].off, sizeof(fn));
		if (fn) {
			d->present++;
		} else if (n < sizeof(d->missing)) {
			n += (size_t)snprintf(d->missing + n, sizeof(d->missing) - n, "%s%s", n ? ", " : "",
					      entry_points[i].name);
		}
	}
	if (d->present == (int)NEP)
		return 0;
	snprintf(d->why, sizeof(d->why),
		 "the CUDA driver (%d.%d) lacks the checkpoint API: %s missing from libcuda.so.1 (drivers 570 "
		 "and later have it)",
		 d->driver_version / 1000, d->driver_version % 1000 / 10, d->missing);
	return ferry__error(-ENOTSUP, "%s", d->why);
}

static int api_get(const struct ferry__cuda_api **cu)
{
	struct ferry_snapshot_driver d;
	int err = ferry_snapshot_driver_probe(&d);
	*cu = err ? NULL : ferry__cuda();
	return err;
}

static int get_state(const struct ferry__cuda_api *cu, int pid, ferry__CUprocessState *s)
{
	*s = 0;
	ferry__CUresult r = cu->CheckpointProcessGetState(pid, s);
	return r == FERRY__CUDA_SUCCESS ? 0 : ferry__cuda_fail(r, "cuCheckpointProcessGetState(pid %d)", pid);
}

int ferry_snapshot_gpu_state(int pid, int *state)
{
	const struct ferry__cuda_api *cu;
	ferry__CUprocessState s;
	int err = api_get(&cu);
	if (!err && !(err = get_state(cu, pid, &s)))
		*state = (int)s;
	return err;
}

/* The state after a failure, appended to the error: "; its GPU state is now running". */
static void append_state(const struct ferry__cuda_api *cu, int pid)
{
	ferry__CUprocessState s = 0;
	if (cu->CheckpointProcessGetState(pid, &s) == FERRY__CUDA_SUCCESS)
		ferry__error_append("its GPU state is now %s", ferry_snapshot_state_name((int)s));
	else
		ferry__error_append("its GPU state cannot be read");
}

int ferry_snapshot_gpu_suspend(int pid, unsigned timeout_ms)
{
	const struct ferry__cuda_api *cu;
	int aerr = api_get(&cu);
	if (aerr)
		return aerr;
	ferry__CUcheckpointLockArgs la;
	memset(&la, 0, sizeof(la));
	la.timeoutMs = timeout_ms;
	ferry__CUresult r = cu->CheckpointProcessLock(pid, &la);
	if (r != FERRY__CUDA_SUCCESS) {
		int err = ferry__cuda_fail(r, "cuCheckpointProcessLock(pid %d, timeout %u ms)", pid, timeout_ms);
		append_state(cu, pid);
		return err;
	}
	ferry__CUcheckpointCheckpointArgs ca;
	memset(&ca, 0, sizeof(ca));
	r = cu->CheckpointProcessCheckpoint(pid, &ca);
	if (r != FERRY__CUDA_SUCCESS) {
		int err = ferry__cuda_fail(r, "cuCheckpointProcessCheckpoint(pid %d)", pid);
		char first[1024];
		detail(first, sizeof(first), err);
		ferry__CUcheckpointUnlockArgs ua;
		memset(&ua, 0, sizeof(ua));
		ferry__CUresult u = cu->CheckpointProcessUnlock(pid, &ua);
		if (u == FERRY__CUDA_SUCCESS) {
			ferry__error_append("unlocked again, the process runs on");
		} else {
			ferry__cuda_fail(u, "cuCheckpointProcessUnlock(pid %d)", pid);
			char second[1024];
			detail(second, sizeof(second), err);
			ferry__error(err, "%s; and then %s", first, second);
			append_state(cu, pid);
		}
		return err;
	}
	return 0;
}

int ferry_snapshot_gpu_resume(int pid)
{
	const struct ferry__cuda_api *cu;
	int aerr = api_get(&cu);
	if (aerr)
		return aerr;
	ferry__CUprocessState s;
	if ((aerr = get_state(cu, pid, &s)))
		return aerr;
	if (s == FERRY__CU_PROCESS_STATE_RUNNING)
		return 0;
	ferry__CUresult r;
	if (s == FERRY__CU_PROCESS_STATE_CHECKPOINTED) {
		ferry__CUcheckpointRestoreArgs ra;
		memset(&ra, 0, sizeof(ra));
		r = cu->CheckpointProcessRestore(pid, &ra);
		if (r != FERRY__CUDA_SUCCESS) {
			int err = ferry__cuda_fail(r, "cuCheckpointProcessRestore(pid %d)", pid);
			append_state(cu, pid);
			return err;
		}
	} else if (s != FERRY__CU_PROCESS_STATE_LOCKED) {
		return ferry__error(FERRY_ECUDA, "pid %d: its GPU state is %s: it cannot be resumed", pid,
				    ferry_snapshot_state_name((int)s));
	}
	ferry__CUcheckpointUnlockArgs ua;
	memset(&ua, 0, sizeof(ua));
	r = cu->CheckpointProcessUnlock(pid, &ua);
	if (r != FERRY__CUDA_SUCCESS) {
		int err = ferry__cuda_fail(r, "cuCheckpointProcessUnlock(pid %d)", pid);
		append_state(cu, pid);
		return err;
	}
	return 0;
}

/* ------------------------------------------------------------------------------------- CRIU */

static int executable(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/*
 * Runs argv with stdin /dev/null, stdout and stderr into out (the last len-1 bytes kept), for at
 * most timeout_s. Returns the exit status, 128 + signal, or -errno when it could not run.
 */
static int run(char *const argv[], char *out, size_t len, int timeout_s)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = -errno;
		close(p[0]);
		close(p[1]);
		return e;
	}
	if (pid == 0) {
		int nul = open("/dev/null", O_RDONLY);
		if (nul >= 0)
			dup2(nul, 0);
		dup2(p[1], 1);
		dup2(p[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	size_t n = 0;
	double end = ferry_tools_now_s() + timeout_s;
	int killed = 0;
	for (;;) {
		struct pollfd pf = {.fd = p[0], .events = POLLIN};
		int left = (int)((end - ferry_tools_now_s()) * 1000);
		if (left <= 0) {
			kill(pid, SIGKILL);
			killed = 1;
			break;
		}
		int k = poll(&pf, 1, left);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			continue;
		char buf[4096];
		ssize_t m = read(p[0], buf, sizeof(buf));
		if (m < 0 && errno == EINTR)
			continue;
		if (m <= 0)
			break;
		/* keep the tail */
		for (ssize_t i = 0; i < m; i++) {
			if (n + 1 >= len) {
				memmove(out, out + len / 2, n - len / 2);
				n -= len / 2;
			}
			out[n++] = buf[i];
		}
	}
	close(p[0]);
	if (len)
		out[n < len ? n : len - 1] = '\0';
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (killed)
		return snprintf(out, len, "killed after %d s", timeout_s), 128 + SIGKILL;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The last non-empty line of text holding prefer (any line when prefer is NULL or none holds it),
 * trailing white space cut, into line. */
static void last_line(const char *text, const char *prefer, char *line, size_t len)
{
	const char *best = NULL, *any = NULL, *p = text;
	size_t bestn = 0, anyn = 0;
	while (*p) {
		const char *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p), m = n;
		while (m && (p[m - 1] == ' ' || p[m - 1] == '\r' || p[m - 1] == '\t'))
			m--;
		if (m) {
			any = p;
			anyn = m;
			if (prefer && memmem(p, m, prefer, strlen(prefer))) {
				best = p;
				bestn = m;
			}
		}
		p = e ? e + 1 : p + n;
	}
	if (!best) {
		best = any;
		bestn = anyn;
	}
	snprintf(line, len, "%.*s", (int)bestn, best ? best : "");
}

/* CRIU's "Error (file:line): ..." lines of text joined with " | " (the first says what failed, the
 * last what gave up), or its last line when it has none. */
static void error_lines(const char *text, char *out, size_t len)
{
	size_t o = 0;
	out[0] = '\0';
	for (const char *p = text; *p;) {
		const char *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		const char *err = memmem(p, n, "Error (", 7);
		/* "exited, status=1" is CRIU saying a helper failed; the lines after it say why */
		if (err && !memmem(err, n - (size_t)(err - p), "exited, status=", 15) && o + 4 < len)
			o += (size_t)snprintf(out + o, len - o, "%s%.*s", o ? " | " : "", (int)(n - (size_t)(err - p)), err);
		p = e ? e + 1 : p + n;
	}
	if (!out[0])
		last_line(text, NULL, out, len);
}

int ferry_snapshot_criu_probe(struct ferry_snapshot_criu *c, int run_check)
{
	memset(c, 0, sizeof(*c));
	c->check_rc = -1;
	const char *env = getenv("FERRY_CRIU");
	if (env && *env) {
		if (!executable(env))
			return ferry__error(-ENOENT, "FERRY_CRIU=%s is not an executable file", env);
		snprintf(c->path, sizeof(c->path), "%s", env);
	} else {
		char dirs[4096];
		const char *path = getenv("PATH");
		snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/sbin:/usr/local/sbin", path ? path : "/usr/bin:/bin");
		for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
			char p[PATH_MAX];
			if (*d && strlen(d) + 6 < sizeof(c->path) && snprintf(p, sizeof(p), "%s/criu", d) > 0 &&
			    executable(p)) {
				memcpy(c->path, p, strlen(p) + 1);
				break;
			}
		}
		if (!c->path[0])
			return ferry__error(-ENOENT, "criu not found on PATH, /usr/sbin or /sbin (Debian and Ubuntu: "
						     "apt-get install criu; or FERRY_CRIU=/path/to/criu)");
	}
	char out[2048];
	char *vargv[] = {c->path, (char *)"--version", NULL};
	int rc = run(vargv, out, sizeof(out), 10);
	last_line(out, "Version", c->version, sizeof(c->version));
	if (rc != 0 && !c->version[0])
		snprintf(c->version, sizeof(c->version), "criu --version exit %d", rc);
	if (run_check) {
		char *cargv[] = {c->path, (char *)"check", NULL};
		c->check_rc = run(cargv, out, sizeof(out), 30);
		if (c->check_rc)
			error_lines(out, c->check, sizeof(c->check));
		else
			last_line(out, NULL, c->check, sizeof(c->check));
		if (!c->check[0])
			snprintf(c->check, sizeof(c->check), "no output");
	}
	return 0;
}

/* Splits s at spaces into argv from *n on (at most max). */
static char *split_args(const char *s, char **argv, int *n, int max)
{
	if (!s || !*s)
		return NULL;
	char *copy = strdup(s);
	if (!copy)
		return NULL;
	for (char *save = NULL, *t = strtok_r(copy, " \t", &save); t && *n < max; t = strtok_r(NULL, " \t", &save))
		argv[(*n)++] = t;
	return copy;
}

/* The error of a failed criu run: its exit status and the first "Error" line of its log. */
static int criu_failed(const char *what, int rc, const char *out, const char *dir, const char *log)
{
	char path[PATH_MAX + 64], line[1024] = "", text[16384];
	snprintf(path, sizeof(path), "%s/%s", dir, log);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, text, sizeof(text) - 1);
		off_t size = lseek(fd, 0, SEEK_END);
		/* the log's end says why */
		if (size > (off_t)sizeof(text) - 1 && lseek(fd, size - (off_t)sizeof(text) + 1, SEEK_SET) >= 0)
			n = read(fd, text, sizeof(text) - 1);
		close(fd);
		text[n > 0 ? n : 0] = '\0';
		error_lines(text, line, sizeof(line));
	}
	if (!line[0])
		error_lines(out, line, sizeof(line));
	if (rc < 0)
		return ferry__error(rc, "%s: cannot run criu: %s", what, strerror(-rc));
	return ferry__error(-EIO, "%s failed (exit %d): %s (log: %s)", what, rc, line[0] ? line : "no output", path);
}

static int dir_empty(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n == 0;
}

/* fsyncs every regular file in dirfd (CRIU writes its images without fsync). */
static int fsync_files(int dirfd, const char *dir)
{
	int fd2 = dup(dirfd);
	DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
	if (!d) {
		if (fd2 >= 0)
			close(fd2);
		return ferry__error(-errno, "%s: cannot list it: %s", dir, strerror(errno));
	}
	rewinddir(d);
	struct dirent *e;
	int err = 0;
	while (!err && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		if (fd < 0)
			continue; /* a symlink or a socket CRIU left: nothing to make durable */
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && fsync(fd))
			err = ferry__error(-errno, "%s/%s: fsync: %s", dir, e->d_name, strerror(errno));
		close(fd);
	}
	closedir(d);
	return err;
}

int ferry_snapshot_take(int pid, const char *dir, const struct ferry_snapshot_opts *o, double seconds[2])
{
	static const struct ferry_snapshot_opts none;
	if (!o)
		o = &none;
	if (pid <= 0 || !dir || !*dir)
		return ferry__error(-EINVAL, "ferry_snapshot_take: pid %d, dir %s", pid, dir ? dir : "NULL");
	struct ferry_snapshot_driver drv;
	struct ferry_snapshot_criu criu;
	char msg[2048];
	int err;
	if ((err = ferry_snapshot_driver_probe(&drv)))
		return ferry__error(err, "cannot snapshot pid %d: %s", pid, drv.why);
	if ((err = ferry_snapshot_criu_probe(&criu, 0)))
		return ferry__error(err, "cannot snapshot pid %d: %s", pid, detail(msg, sizeof(msg), err));
	if (kill(pid, 0) && errno == ESRCH)
		return ferry__error(-ESRCH, "cannot snapshot pid %d: no such process", pid);
	int made = mkdir(dir, 0700) == 0;
	if (!made && errno != EEXIST)
		return ferry__error(-errno, "%s: mkdir: %s", dir, strerror(errno));
	int empty = dir_empty(dir);
	if (empty <= 0)
		return ferry__error(empty < 0 ? empty : -EEXIST, "%s: %s", dir,
				    empty < 0 ? strerror(-empty) : "not empty: a snapshot goes into a new or empty directory");
	int dirfd = (err = ferry__fsync_parent(dir)) ? err : ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (dirfd < 0) {
		if (made)
			rmdir(dir);
		return dirfd;
	}
	int state = -1;
	if ((err = ferry_snapshot_gpu_state(pid, &state)))
		goto out;
	if (state != FERRY_SNAP_RUNNING) {
		err = ferry__error(-EBUSY, "cannot snapshot pid %d: its GPU state is %s, not running", pid,
				   ferry_snapshot_state_name(state));
		goto out;
	}
	double t0 = ferry_tools_now_s();
	if ((err = ferry_snapshot_gpu_suspend(pid, o->lock_timeout_ms)))
		goto out;
	double t1 = ferry_tools_now_s();
	char pids[32], out[4096];
	snprintf(pids, sizeof(pids), "%d", pid);
	char *argv[64] = {criu.path, (char *)"dump", (char *)"-t", pids, (char *)"-D", (char *)dir,
			  (char *)"--shell-job", (char *)"-o", (char *)"dump.log", (char *)"-v4"};
	int n = 10;
	if (o->leave_running)
		argv[n++] = (char *)"--leave-running";
	char *extra = split_args(o->criu_args, argv, &n, 62);
	argv[n] = NULL;
	int rc = run(argv, out, sizeof(out), 3600);
	free(extra);
	double t2 = ferry_tools_now_s();
	if (rc != 0) {
		char what[128];
		snprintf(what, sizeof(what), "criu dump -t %d", pid);
		err = criu_failed(what, rc, out, dir, "dump.log");
		char first[2048];
		detail(first, sizeof(first), err);
		int e2 = ferry_snapshot_gpu_resume(pid);
		if (e2)
			ferry__error(err, "%s; resuming its GPU state failed too: %s", first, detail(msg, sizeof(msg), e2));
		else
			ferry__error(err, "%s; its GPU state was resumed, the process runs on", first);
		goto out;
	}
	if (o->leave_running && (err = ferry_snapshot_gpu_resume(pid))) {
		ferry__error(err, "the snapshot of pid %d is in %s, but its GPU state was not resumed: %s", pid, dir,
			     detail(msg, sizeof(msg), err));
		goto out;
	}
	if ((err = fsync_files(dirfd, dir)))
		goto out;
	char man[1024];
	int len = snprintf(man, sizeof(man),
			   "{\"format\":\"ferry-snapshot\",\"version\":1,\"pid\":%d,\"driver_version\":%d,"
			   "\"criu\":\"%s\",\"left_running\":%d,\"suspend_s\":%.6f,\"dump_s\":%.6f,\"created_unix\":%lld}\n",
			   pid, drv.driver_version, criu.version[0] && !strchr(criu.version, '"') ? criu.version : "",
			   o->leave_running != 0, t1 - t0, t2 - t1, (long long)time(NULL));
	err = ferry__durable_write(dirfd, MANIFEST, man, (size_t)len, 0644, FERRY__DURABLE_NOREPLACE);
	if (!err && seconds) {
		seconds[0] = t1 - t0;
		seconds[1] = t2 - t1;
	}
out:
	close(dirfd);
	/* refused before CRIU wrote anything: the directory this call made goes again */
	if (err && made && dir_empty(dir) == 1)
		rmdir(dir);
	return err;
}

int ferry_snapshot_restore(const char *dir, const struct ferry_snapshot_opts *o, double seconds[2])
{
	static const struct ferry_snapshot_opts none;
	if (!o)
		o = &none;
	char path[PATH_MAX + 32], man[4096];
	snprintf(path, sizeof(path), "%s/" MANIFEST, dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return ferry__error(-errno, "%s: cannot open it (not a snapshot made by ferry snapshot, or an unfinished one)",
				    path);
	ssize_t n = read(fd, man, sizeof(man) - 1);
	close(fd);
	man[n > 0 ? n : 0] = '\0';
	const char *p = strstr(man, "\"pid\":");
	long pid = p ? strtol(p + 6, NULL, 10) : 0;
	if (!strstr(man, "\"format\":\"ferry-snapshot\"") || pid <= 0 || pid > INT_MAX)
		return ferry__error(FERRY_ECORRUPT, "%s: not a ferry snapshot manifest (field format or pid)", path);
	struct ferry_snapshot_driver drv;
	struct ferry_snapshot_criu criu;
	char msg[2048];
	int err;
	if ((err = ferry_snapshot_driver_probe(&drv)))
		return ferry__error(err, "cannot restore %s: %s", dir, drv.why);
	if ((err = ferry_snapshot_criu_probe(&criu, 0)))
		return ferry__error(err, "cannot restore %s: %s", dir, detail(msg, sizeof(msg), err));
	if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
		return ferry__error(-EEXIST, "cannot restore %s: pid %ld is in use, and CRIU restores the process "
					     "under its old pid (end that process first)", dir, pid);
	char out[4096];
	char *argv[64] = {criu.path, (char *)"restore", (char *)"-D", (char *)dir, (char *)"--shell-job",
			  (char *)"--restore-detached", (char *)"-o", (char *)"restore.log", (char *)"-v4"};
	int k = 9;
	char *extra = split_args(o->criu_args, argv, &k, 62);
	argv[k] = NULL;
	double t0 = ferry_tools_now_s();
	int rc = run(argv, out, sizeof(out), 3600);
	free(extra);
	double t1 = ferry_tools_now_s();
	if (rc != 0)
		return criu_failed("criu restore", rc, out, dir, "restore.log");
	if ((err = ferry_snapshot_gpu_resume((int)pid)))
		return ferry__error(err, "criu restored pid %ld, but its GPU state was not: %s", pid, detail(msg, sizeof(msg), err));
	if (seconds) {
		seconds[0] = t1 - t0;
		seconds[1] = ferry_tools_now_s() - t1;
	}
	return (int)pid;
}
