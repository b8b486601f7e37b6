/*
 * The sampler's arithmetic on a fixture /proc (diskstats and stat rewritten between two samples),
 * and the shared-memory publication: open, count, read back by the sampler, skipped when its
 * process is dead, removed on close.
 */
#include <stdint.h>
#include <sys/stat.h>

#include "ferry_test.h"
#include "ferry_tools.h"
#include "engine/publish.h"

static char procdir[512], sysdir[512], rundir[512];

static void write_file(const char *dir, const char *name, const char *text)
{
	char p[1024];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	T_ASSERT(f != NULL);
	fputs(text, f);
	fclose(f);
}

static int find_row(ferry_sampler *s, const char *kind, const char *name)
{
	for (size_t i = 0; i < ferry_sampler_rows(s); i++)
		if (!strcmp(ferry_sampler_row_kind(s, i), kind) && !strcmp(ferry_sampler_row_name(s, i), name))
			return (int)i;
	return -1;
}

static double v(ferry_sampler *s, int row, const char *m)
{
	double x = -1;
	T_EQ_INT(ferry_sampler_row_value(s, (size_t)row, m, &x), 0);
	return x;
}

#define T_NEAR(a, b)                                                                                  \
	do {                                                                                          \
		double t_a_ = (a), t_b_ = (b);                                                        \
		if (!(t_a_ > t_b_ * 0.999 - 1e-9 && t_a_ < t_b_ * 1.001 + 1e-9)) {                     \
			fprintf(stderr, "%s:%d: %s ~= %s failed: %g != %g\n", __FILE__, __LINE__, #a, #b, \
				t_a_, t_b_);                                                          \
			t_failures++;                                                                 \
		}                                                                                     \
	} while (0)

int main(void)
{
	const char *tmp = t_tmpdir();
	snprintf(procdir, sizeof(procdir), "%s/sampler-proc-%d", tmp, (int)getpid());
	snprintf(sysdir, sizeof(sysdir), "%s/sampler-sys-%d", tmp, (int)getpid());
	snprintf(rundir, sizeof(rundir), "%s/sampler-run-%d", tmp, (int)getpid());
	T_ASSERT(mkdir(procdir, 0755) == 0 && mkdir(sysdir, 0755) == 0 && mkdir(rundir, 0755) == 0);
	char p[1024];
	snprintf(p, sizeof(p), "%s/class", sysdir);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/class/block", sysdir);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/class/block/nvme0n1p1", sysdir);
	mkdir(p, 0755);
	write_file(p, "partition", "1\n");
	setenv("FERRY_PROCFS_ROOT", procdir, 1);
	setenv("FERRY_SYSFS_ROOT", sysdir, 1);
	setenv("FERRY_RUN_DIR", rundir, 1);

	/* fields: reads merged sectors ms | writes merged sectors ms | inflight io_ms weighted_ms */
	write_file(procdir, "diskstats",
		   " 259 0 nvme0n1 1000 0 8000 500 2000 0 16000 4000 0 1000 4500 0 0 0 0\n"
		   " 259 1 nvme0n1p1 1000 0 8000 500 2000 0 16000 4000 0 1000 4500\n"
		   "   7 0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
		   " 253 0 odd\\name 5 0 40 1 0 0 0 0 0 1 1\n"
		   " garbage line\n");
	write_file(procdir, "stat", "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n");

	ferry_sampler *s;
	T_ASSERT(ferry_sampler_create(&s) == 0);
	T_EQ_INT(ferry_sampler_sample(s), 0);
	T_CHECK(ferry_sampler_interval(s) == 0);
	T_CHECK(find_row(s, "disk", "nvme0n1") >= 0);
	T_CHECK(find_row(s, "disk", "nvme0n1p1") < 0); /* partitions are not shown */
	T_CHECK(find_row(s, "disk", "loop0") < 0);     /* never used since boot */
	T_CHECK(find_row(s, "disk", "odd\\name") >= 0);

	/* Publication of this process, found by the sampler; a dead process's file is skipped. */
	struct ferry__publish_counters *c = ferry__publish_open("unit test");
	T_ASSERT(c != NULL);
	ferry__publish_set_path(c, "bounce");
	FERRY__PUBLISH_ADD(c, bytes_read, 1000000);
	struct ferry__publish dead;
	memset(&dead, 0, sizeof(dead));
	dead.magic = FERRY__PUBLISH_MAGIC;
	dead.version = FERRY__PUBLISH_VERSION;
	dead.size = sizeof(dead);
	dead.pid = 0x3ffffff0; /* above pid_max: never alive */
	snprintf(dead.name, sizeof(dead.name), "ghost");
	snprintf(p, sizeof(p), "%s/ferry-%d-0.stats", rundir, dead.pid);
	FILE *f = fopen(p, "w");
	T_ASSERT(f && fwrite(&dead, sizeof(dead), 1, f) == 1);
	fclose(f);
	T_EQ_INT(ferry_sampler_sample(s), 0);
	usleep(200 * 1000);

	/* Second sample: +4000 sectors read (2 MB), +200 reads costing 100 ms, +16000 sectors written,
	 * +400 writes costing 1200 ms, io_ms +100, weighted +600; cpu: +100 user, +50 iowait, +50 softirq, +800 idle. */
	write_file(procdir, "diskstats",
		   " 259 0 nvme0n1 1200 0 12000 600 2400 0 32000 5200 3 1100 5100 0 0 0 0\n"
		   " 253 0 odd\\name 5 0 40 1 0 0 0 0 0 1 1\n");
	write_file(procdir, "stat", "cpu  200 0 100 1500 150 0 50 0 0 0\n");
	FERRY__PUBLISH_ADD(c, bytes_read, 3000000);
	FERRY__PUBLISH_ADD(c, reads, 30);
	FERRY__PUBLISH_ADD(c, consumer_wait_ns, 1000);
	T_EQ_INT(ferry_sampler_sample(s), 0);
	double dt = ferry_sampler_interval(s);
	T_CHECK(dt > 0.15 && dt < 5);
	int d = find_row(s, "disk", "nvme0n1");
	T_ASSERT(d >= 0);
	T_NEAR(v(s, d, "read_mbps") * dt, 4000 * 512 / 1e6);
	T_NEAR(v(s, d, "write_mbps") * dt, 16000 * 512 / 1e6);
	T_NEAR(v(s, d, "read_iops") * dt, 200);
	T_NEAR(v(s, d, "write_iops") * dt, 400);
	T_NEAR(v(s, d, "read_await_ms"), 0.5);
	T_NEAR(v(s, d, "write_await_ms"), 3.0);
	T_NEAR(v(s, d, "queue_depth") * dt * 1000, 600);
	T_NEAR(v(s, d, "read_bytes_total"), 12000 * 512.0);
	double none;
	T_EQ_INT(ferry_sampler_row_value(s, (size_t)d, "no_such_metric", &none), -ENOENT);
	int cpu = find_row(s, "cpu", "all");
	T_ASSERT(cpu >= 0);
	T_NEAR(v(s, cpu, "busy_pct"), 100.0 * 150 / 1000); /* user 100 + softirq 50 of 1000 */
	T_NEAR(v(s, cpu, "iowait_pct"), 5.0);
	T_NEAR(v(s, cpu, "softirq_pct"), 5.0);

	char me[32];
	snprintf(me, sizeof(me), "%d", (int)getpid());
	int fr = find_row(s, "ferry", me);
	T_ASSERT(fr >= 0);
	T_EQ_STR(ferry_sampler_row_text(s, (size_t)fr, "name"), "unit test");
	T_EQ_STR(ferry_sampler_row_text(s, (size_t)fr, "path"), "bounce");
	T_NEAR(v(s, fr, "read_mbps") * dt, 3.0);
	T_NEAR(v(s, fr, "read_bytes_total"), 4000000);
	T_CHECK(find_row(s, "ferry", "1073741808") < 0); /* the dead one */

	const char *json, *prom;
	T_EQ_INT(ferry_sampler_json(s, &json), 0);
	T_CHECK(strstr(json, "\"name\": \"odd\\\\name\"") != NULL);
	T_CHECK(strstr(json, "\"label\": \"unit test\"") != NULL);
	T_EQ_INT(ferry_sampler_prometheus(s, &prom), 0);
	T_CHECK(strstr(prom, "# TYPE ferry_disk_read_bytes_total counter\n") != NULL);
	T_CHECK(strstr(prom, "ferry_disk_read_bytes_total{device=\"nvme0n1\"} 6144000\n") != NULL);
	T_CHECK(strstr(prom, "{device=\"odd\\\\name\"}") != NULL);
	T_CHECK(strstr(prom, "ferry_process_read_bytes_total{pid=\"") != NULL);
	if (!strstr(prom, "ferry_disk_read_bytes_total{device=\"nvme0n1\"} 6144000\n"))
		fprintf(stderr, "prometheus text:\n%s", prom);

	/* A missing /proc/diskstats is an error with a reason, not a crash. */
	snprintf(p, sizeof(p), "%s/diskstats", procdir);
	unlink(p);
	int err = ferry_sampler_sample(s);
	T_EQ_INT(err, -ENOENT);
	T_CHECK(strstr(ferry_last_error(), "diskstats") != NULL);

	/* Closing removes this process's file. */
	ferry__publish_close(c);
	snprintf(p, sizeof(p), "%s/ferry-%d-0.stats", rundir, (int)getpid());
	T_CHECK(access(p, F_OK) != 0);
	ferry_sampler_destroy(s);
	ferry_sampler_destroy(NULL);
	return t_result();
}
