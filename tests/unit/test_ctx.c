/* Context knobs: set/get by name, FERRY_* environment variables, validation with a sentence naming
 * the knob and what it expects, knobs that shape the workers refused once I/O has started. */
#include <dirent.h>
#include <sched.h>

#include "ferry_test.h"
#include "ferry/ferry.h"

/* Threads of this process (entries of /proc/self/task), or -1 without /proc. */
static int thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	if (!d)
		return -1;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int main(void)
{
	ferry_ctx *ctx;
	char buf[64];

	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	/* every listed key reads back; defaults as documented in docs/CONFIG.md */
	for (const char *const *k = ferry_ctx_keys(); *k; k++)
		T_CHECK(ferry_ctx_get(ctx, *k, buf, sizeof(buf)) > 0 || !strcmp(*k, "cache_dir"));
	/* cache_dir: text, empty (no cache) by default */
	T_CHECK(ferry_ctx_get(ctx, "cache_dir", buf, sizeof(buf)) == 0 && !buf[0]);
	T_CHECK(ferry_ctx_set(ctx, "cache_dir", "/tmp/c") == 0 && ferry_ctx_get(ctx, "cache_dir", buf, sizeof(buf)) == 6 &&
		!strcmp(buf, "/tmp/c"));
	T_CHECK(ferry_ctx_set(ctx, "cache_dir", "") == 0);
	{
		/* threads: 3/4 of the CPUs this process may run on, 4 to 16 */
		cpu_set_t set;
		long n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
		long want = n * 3 / 4 < 4 ? 4 : n * 3 / 4 > 16 ? 16 : n * 3 / 4;
		T_CHECK(ferry_ctx_get(ctx, "threads", buf, sizeof(buf)) > 0 && atol(buf) == want);
		T_CHECK(ferry_ctx_get(ctx, "copy_unit", buf, sizeof(buf)) > 0 && !strcmp(buf, "8388608"));
	}
	T_CHECK(ferry_ctx_get(ctx, "direct", buf, sizeof(buf)) > 0 && !strcmp(buf, "auto"));
	/* sizes with suffixes; enums by name or gdsio number */
	T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "4m"), 0);
	T_CHECK(ferry_ctx_get(ctx, "chunk_size", buf, sizeof(buf)) > 0 && !strcmp(buf, "4194304"));
	T_EQ_INT(ferry_ctx_set(ctx, "path", "3"), 0); /* gdsio's 3: cpu-async-gpu */
	T_CHECK(ferry_ctx_get(ctx, "path", buf, sizeof(buf)) > 0 && !strcmp(buf, "cpu-async-gpu"));
	T_EQ_INT(ferry_ctx_set(ctx, "memory", "host"), 0);
	/* bad values: FERRY_EBADOPT, and the detail names the knob and what it expects */
	T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "5000"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "chunk_size") && strstr(ferry_last_error(), "multiple of 4k"));
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "0"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "from 1 to 256"));
	T_EQ_INT(ferry_ctx_set(ctx, "direct", "maybe"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "auto, on, off"));
	T_EQ_INT(ferry_ctx_set(ctx, "no_such_knob", "1"), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "no_such_knob"));
	T_EQ_INT(ferry_ctx_get(ctx, "no_such_knob", buf, sizeof(buf)), FERRY_EBADOPT);
	/* after the workers start, knobs that shape them are refused; the others still change */
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "2"), 0);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "3"), FERRY_EBUSY);
	T_CHECK(strstr(ferry_last_error(), "threads"));
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "2"), 0); /* unchanged value is fine */
	T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "1m"), 0);
	ferry_ctx_destroy(ctx);
	ferry_ctx_destroy(NULL);

	/* FERRY_<KEY> environment variables, and a bad one fails creation naming the variable */
	setenv("FERRY_THREADS", "5", 1);
	setenv("FERRY_BACKEND", "psync", 1);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_CHECK(ferry_ctx_get(ctx, "threads", buf, sizeof(buf)) > 0 && !strcmp(buf, "5"));
	/* naming the backend probes it but starts no worker; ferry_ctx_start starts all five */
	int before = thread_count();
	T_EQ_STR(ferry_ctx_backend(ctx), "psync");
	T_ASSERT(before > 0); /* /proc/self/task */
	T_EQ_INT(thread_count(), before);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	T_EQ_INT(thread_count(), before + 5);
	ferry_ctx_destroy(ctx);
	setenv("FERRY_QUEUE_DEPTH", "lots", 1);
	ctx = (ferry_ctx *)&ctx;
	T_EQ_INT(ferry_ctx_create(&ctx), FERRY_EBADOPT);
	T_CHECK(ctx == NULL);
	T_CHECK(strstr(ferry_last_error(), "FERRY_QUEUE_DEPTH"));
	unsetenv("FERRY_QUEUE_DEPTH");
	/* error names and strings for our own codes and errno */
	T_EQ_STR(ferry_err_name(FERRY_ENOGDS), "FERRY_ENOGDS");
	T_EQ_STR(ferry_err_name(-ENOENT), "ENOENT");
	T_CHECK(strstr(ferry_strerror(FERRY_ENOGPU), "GPU") != NULL);
	T_CHECK(ferry_strerror(-99999) != NULL);
	return t_result();
}
