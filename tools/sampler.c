/*
 * The sampler behind `ferry top`: counters from /proc/diskstats, /proc/stat, NVML and the ferry
 * publications, turned into rates between two samples.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpu/shim.h"
#include "engine/publish.h"
#include "tools/sys.h"

#define MAX_ROWS 256
#define MAX_METRICS 16

struct metric {
	const char *key;
	double v;
};

struct row {
	char kind[12];
	char name[64];
	char text_name[64], text_path[32];
	const char *text_kind, *text_phase; /* activities: "loader", "save", "load"; the phase */
	int parent;                          /* activities: the ferry row they belong to */
	int nm;
	struct metric m[MAX_METRICS];
};

/* Raw counters of one disk (Documentation/admin-guide/iostats.rst, fields 1-11). */
struct disk_raw {
	char name[64];
	unsigned long long f[11];
};

struct proc_raw {
	char file[96];
	uint64_t start_ns;
	struct ferry__publish pub; /* an older writer's 192 bytes: act[] all free */
};

struct snapshot {
	uint64_t t_ns;
	unsigned long long cpu[10];
	int have_cpu;
	struct disk_raw *disks;
	int ndisks;
	struct proc_raw *procs;
	int nprocs;
	int nnewer;       /* publications of a newer layout, not shown */
	char newer[600];  /* what to tell about the first */
};

struct ferry_sampler {
	struct snapshot prev, cur;
	int have_prev;
	double interval;
	double wall;
	struct row rows[MAX_ROWS];
	size_t nrows;
	char notes[6][600];
	size_t nnotes;
	struct ferry__sbuf json, prom;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int ferry_sampler_create(ferry_sampler **out)
{
	if (!out)
		return ferry__error(-EINVAL, "ferry_sampler_create: NULL out");
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return ferry__error(-ENOMEM, "ferry_sampler_create: out of memory");
	return 0;
}

static void snap_free(struct snapshot *s)
{
	free(s->disks);
	free(s->procs);
	memset(s, 0, sizeof(*s));
}

void ferry_sampler_destroy(ferry_sampler *s)
{
	if (!s)
		return;
	snap_free(&s->prev);
	snap_free(&s->cur);
	ferry__sbuf_free(&s->json);
	ferry__sbuf_free(&s->prom);
	free(s);
}

/* ------------------------------------------------------------------------------------ reading */

static char *slurp(const char *path, size_t max)
{
	char *buf = malloc(max);
	if (!buf)
		return NULL;
	int n = ferry__sys_read(path, buf, max);
	if (n < 0) {
		free(buf);
		errno = -n;
		return NULL;
	}
	return buf;
}

/* A partition, or a device nobody has used since boot (the idle loop devices), is not shown. */
static int disk_wanted(const char *name, const unsigned long long *f)
{
	char p[PATH_MAX];
	if (ferry__sys_exists(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "class/block/%s/partition", name)) == 1)
		return 0;
	return f[0] || f[4] || f[8];
}

static int read_diskstats(struct snapshot *s)
{
	char path[PATH_MAX];
	ferry__sys_path(path, sizeof(path), FERRY__ROOT_PROC, "diskstats");
	char *text = slurp(path, 1 << 20);
	if (!text)
		return ferry__error(-errno, "read %s: %s", path, strerror(errno));
	int cap = 16;
	s->disks = calloc((size_t)cap, sizeof(*s->disks));
	s->ndisks = 0;
	if (!s->disks) {
		free(text);
		return -ENOMEM;
	}
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		struct disk_raw d;
		unsigned maj, min;
		int n = sscanf(line, " %u %u %63s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &maj, &min,
			       d.name, &d.f[0], &d.f[1], &d.f[2], &d.f[3], &d.f[4], &d.f[5], &d.f[6], &d.f[7], &d.f[8],
			       &d.f[9], &d.f[10]);
		if (n < 14 || !disk_wanted(d.name, d.f))
			continue;
		if (s->ndisks == cap) {
			if (cap >= MAX_ROWS)
				break;
			cap *= 2;
			struct disk_raw *nd = realloc(s->disks, (size_t)cap * sizeof(*nd));
			if (!nd)
				break;
			s->disks = nd;
		}
		s->disks[s->ndisks++] = d;
	}
	free(text);
	return 0;
}

static int read_stat(struct snapshot *s)
{
	char path[PATH_MAX];
	ferry__sys_path(path, sizeof(path), FERRY__ROOT_PROC, "stat");
	char *text = slurp(path, 1 << 20);
	if (!text)
		return ferry__error(-errno, "read %s: %s", path, strerror(errno));
	memset(s->cpu, 0, sizeof(s->cpu));
	/* "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (proc(5)). */
	s->have_cpu = sscanf(text, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &s->cpu[0], &s->cpu[1],
			     &s->cpu[2], &s->cpu[3], &s->cpu[4], &s->cpu[5], &s->cpu[6], &s->cpu[7], &s->cpu[8],
			     &s->cpu[9]) >= 7;
	free(text);
	return 0;
}

/* 1 if the process is gone. EPERM means it exists under another user. */
static int pid_dead(int32_t pid)
{
	return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH);
}

static void read_publications(struct snapshot *s)
{
	s->nnewer = 0;
	const char *dir = ferry__publish_dir();
	DIR *d = opendir(dir);
	s->nprocs = 0;
	if (!d)
		return;
	int cap = 8;
	s->procs = calloc((size_t)cap, sizeof(*s->procs));
	struct dirent *e;
	int scanned = 0;
	while (s->procs && (e = readdir(d)) && scanned++ < 4096) {
		size_t len = strlen(e->d_name);
		if (strncmp(e->d_name, "ferry-", 6) || len < 7 || len >= sizeof(s->procs[0].file) ||
		    strcmp(e->d_name + len - 6, ".stats"))
			continue;
		int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			continue;
		struct ferry__publish p;
		struct ferry__activity again[FERRY__PUBLISH_ACTIVITIES];
		struct stat st;
		memset(&p, 0, sizeof(p));
		ssize_t got = pread(fd, &p, sizeof(p), 0);
		/* the slots once more: one whose seq moved or is odd was being rewritten (publish.h) */
		ssize_t got2 = pread(fd, again, sizeof(again), offsetof(struct ferry__publish, act));
		int mine = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
		close(fd);
		if (got < (ssize_t)offsetof(struct ferry__publish, c) || p.magic != FERRY__PUBLISH_MAGIC)
			continue;
		if (p.version > FERRY__PUBLISH_VERSION) {
			if (s->nnewer++ == 0)
				snprintf(s->newer, sizeof(s->newer),
					 "%s/%s: publication layout version %u is newer than this ferry top reads (%u): "
					 "run the ferry top of that process's ferry version", dir, e->d_name, p.version,
					 FERRY__PUBLISH_VERSION);
			continue;
		}
		/* the header and counters; the activity slots where the writer appended them */
		if (p.version < 1 || p.size < FERRY__PUBLISH_MIN_SIZE || got < FERRY__PUBLISH_MIN_SIZE)
			continue;
		int slots = p.size >= sizeof(p) && got >= (ssize_t)sizeof(p);
		if (!slots)
			memset(p.act, 0, sizeof(p.act));
		for (int k = 0; slots && k < FERRY__PUBLISH_ACTIVITIES; k++) {
			if (got2 != (ssize_t)sizeof(again) || (p.act[k].seq & 1) || again[k].seq != p.act[k].seq) {
				p.act[k].kind = 0;
				continue;
			}
			memcpy(p.act[k].v, again[k].v, sizeof(again[k].v)); /* the later counters */
			p.act[k].end_ns = again[k].end_ns;
			p.act[k].name[sizeof(p.act[k].name) - 1] = '\0';
		}
		if (pid_dead(p.pid)) {
			/* Left by a publisher killed before it could remove it (SIGKILL, SIGTERM). Only our
			 * own files, and only when the name carries the same pid and kill() says it is gone. */
			long npid;
			if (mine && p.pid > 0 && kill(p.pid, 0) == -1 && errno == ESRCH && sscanf(e->d_name, "ferry-%ld-", &npid) == 1 && npid == p.pid)
				unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		p.name[sizeof(p.name) - 1] = '\0';
		p.path[sizeof(p.path) - 1] = '\0';
		if (s->nprocs == cap) {
			if (cap >= 64)
				break;
			cap *= 2;
			struct proc_raw *np = realloc(s->procs, (size_t)cap * sizeof(*np));
			if (!np)
				break;
			s->procs = np;
		}
		struct proc_raw *r = &s->procs[s->nprocs++];
		snprintf(r->file, sizeof(r->file), "%s", e->d_name);
		r->start_ns = p.start_ns;
		r->pub = p;
	}
	closedir(d);
}

/* ------------------------------------------------------------------------------------- rows */

static struct row *add_row(ferry_sampler *s, const char *kind, const char *name)
{
	if (s->nrows >= MAX_ROWS)
		return NULL;
	struct row *r = &s->rows[s->nrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->kind, sizeof(r->kind), "%s", kind);
	snprintf(r->name, sizeof(r->name), "%s", name);
	return r;
}

static void put(struct row *r, const char *key, double v)
{
	if (r && r->nm < MAX_METRICS && isfinite(v))
		r->m[r->nm++] = (struct metric){key, v};
}

static const struct disk_raw *find_disk(const struct snapshot *s, const char *name)
{
	for (int i = 0; i < s->ndisks; i++)
		if (!strcmp(s->disks[i].name, name))
			return &s->disks[i];
	return NULL;
}

static const struct proc_raw *find_proc(const struct snapshot *s, const struct proc_raw *p)
{
	for (int i = 0; i < s->nprocs; i++)
		if (!strcmp(s->procs[i].file, p->file) && s->procs[i].start_ns == p->start_ns)
			return &s->procs[i];
	return NULL;
}

/* Counter delta, 0 when it went backwards (a device re-created, a counter wrapped). */
static double delta(unsigned long long now, unsigned long long before)
{
	return now >= before ? (double)(now - before) : 0.0;
}

static const char *activity_kind(uint32_t k)
{
	return k == FERRY__ACTIVITY_LOADER ? "loader" : k == FERRY__ACTIVITY_SAVE ? "save" : k == FERRY__ACTIVITY_LOAD ? "load" : NULL;
}

static const char *activity_phase(uint32_t kind, uint64_t ph)
{
	switch (ph) {
	case FERRY__PHASE_PREPARE:
		return kind == FERRY__ACTIVITY_SAVE ? "snapshot" : "plan";
	case FERRY__PHASE_MOVE:
		return kind == FERRY__ACTIVITY_SAVE ? "write" : kind == FERRY__ACTIVITY_LOAD ? "read" : "run";
	case FERRY__PHASE_SYNC:
		return "sync";
	case FERRY__PHASE_COMMIT:
		return "commit";
	case FERRY__PHASE_DONE:
		return "done";
	case FERRY__PHASE_FAILED:
		return "failed";
	default:
		return "?";
	}
}

/*
 * The rows of a process's activities, right after its ferry row. Rates: over the interval when the
 * previous sample saw the same activity (same slot, same start), else the average since it began
 * (until it ended, for a finished save or load).
 */
static void add_activities(ferry_sampler *s, int parent, const struct proc_raw *pr, const struct proc_raw *o,
			   double dt)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (int k = 0; k < FERRY__PUBLISH_ACTIVITIES; k++) {
		const struct ferry__activity *a = &pr->pub.act[k];
		const char *kind = activity_kind(a->kind);
		if (!kind)
			continue;
		const struct ferry__activity *b = o && o->pub.act[k].kind == a->kind &&
							  o->pub.act[k].start_ns == a->start_ns ? &o->pub.act[k] : NULL;
		uint64_t end = a->end_ns ? a->end_ns : now;
		double span = end > a->start_ns ? (double)(end - a->start_ns) / 1e9 : 0;
		int live = !a->end_ns, inter = b && live && dt > 0;
		const uint64_t *v = a->v, *w = b ? b->v : NULL;
#define RATE(f) (inter ? delta(v[f], w[f]) / dt : span > 0 ? (double)v[f] / span : 0)
		char pid[16];
		snprintf(pid, sizeof(pid), "%d", pr->pub.pid);
		struct row *r = add_row(s, "activity", pid);
		if (!r)
			return;
		r->parent = parent;
		r->text_kind = kind;
		r->text_phase = activity_phase(a->kind, v[FERRY__ACT_PHASE]);
		snprintf(r->text_name, sizeof(r->text_name), "%s", a->name);
		put(r, "slot", k);
		put(r, "bytes_total", (double)v[FERRY__ACT_BYTES]);
		put(r, "gbps", RATE(FERRY__ACT_BYTES) / 1e9);
		put(r, "elapsed_s", span);
		if (a->kind == FERRY__ACTIVITY_LOADER) {
			put(r, "samples_total", (double)v[FERRY__ACT_ITEMS]);
			put(r, "batches_total", (double)v[FERRY__ACT_BATCHES]);
			put(r, "samples_per_s", RATE(FERRY__ACT_ITEMS));
			put(r, "batches_per_s", RATE(FERRY__ACT_BATCHES));
			double wait = 100.0 * RATE(FERRY__ACT_WAIT_NS) / 1e9;
			put(r, "wait_pct", wait > 100 ? 100 : wait);
			put(r, "threads", (double)v[FERRY__ACT_THREADS]);
		} else {
			put(r, "tensors", (double)v[FERRY__ACT_ITEMS]);
			put(r, "total_bytes", (double)v[FERRY__ACT_TOTAL]);
			if (v[FERRY__ACT_TOTAL])
				put(r, "progress_pct", 100.0 * (double)v[FERRY__ACT_BYTES] / (double)v[FERRY__ACT_TOTAL]);
			if (v[FERRY__ACT_STEP] != UINT64_MAX)
				put(r, "step", (double)v[FERRY__ACT_STEP]);
		}
#undef RATE
	}
}

static void build_rows(ferry_sampler *s, double dt)
{
	const struct snapshot *c = &s->cur, *p = s->have_prev ? &s->prev : NULL;
	s->nrows = 0;
	if (c->have_cpu) {
		struct row *r = add_row(s, "cpu", "all");
		double d[10], total = 0;
		for (int i = 0; i < 10; i++) {
			d[i] = p && p->have_cpu ? delta(c->cpu[i], p->cpu[i]) : 0;
			/* guest and guest_nice are already inside user and nice */
			if (i < 8)
				total += d[i];
		}
		put(r, "busy_pct", total > 0 ? 100.0 * (total - d[3] - d[4]) / total : 0);
		put(r, "iowait_pct", total > 0 ? 100.0 * d[4] / total : 0);
		put(r, "softirq_pct", total > 0 ? 100.0 * d[6] / total : 0);
	}
	for (int i = 0; i < c->ndisks; i++) {
		const struct disk_raw *d = &c->disks[i], *o = p ? find_disk(p, d->name) : NULL;
		struct row *r = add_row(s, "disk", d->name);
		double f[11] = {0};
		for (int k = 0; k < 11; k++)
			f[k] = o && dt > 0 ? delta(d->f[k], o->f[k]) : 0;
		double ms = dt * 1000.0;
		/* Sectors are always 512 bytes in diskstats, whatever the device's block size. */
		put(r, "read_mbps", dt > 0 ? f[2] * 512.0 / dt / 1e6 : 0);
		put(r, "write_mbps", dt > 0 ? f[6] * 512.0 / dt / 1e6 : 0);
		put(r, "read_iops", dt > 0 ? f[0] / dt : 0);
		put(r, "write_iops", dt > 0 ? f[4] / dt : 0);
		put(r, "read_await_ms", f[0] > 0 ? f[3] / f[0] : 0);
		put(r, "write_await_ms", f[4] > 0 ? f[7] / f[4] : 0);
		/* Field 11 (weighted ms doing I/O) over elapsed ms is iostat's aqu-sz. */
		put(r, "queue_depth", ms > 0 ? f[10] / ms : 0);
		double util = ms > 0 ? 100.0 * f[9] / ms : 0;
		put(r, "util_pct", util > 100 ? 100 : util);
		put(r, "read_bytes_total", (double)d->f[2] * 512.0);
		put(r, "write_bytes_total", (double)d->f[6] * 512.0);
		put(r, "reads_total", (double)d->f[0]);
		put(r, "writes_total", (double)d->f[4]);
	}
	if (ferry__sys_nvml_usable()) {
		const struct ferry__nvml_api *n = ferry__nvml();
		for (unsigned g = 0; n && g < n->device_count && g < 64; g++) {
			struct ferry__nvml_device_info info;
			if (ferry__nvml_device_info(g, &info))
				continue;
			char name[16];
			snprintf(name, sizeof(name), "%u", g);
			struct row *r = add_row(s, "gpu", name);
			if (!r)
				break;
			snprintf(r->text_name, sizeof(r->text_name), "%s", info.name);
			put(r, "util_pct", info.util_gpu >= 0 ? info.util_gpu : NAN);
			put(r, "mem_used_mib", info.mem_used >= 0 ? info.mem_used / 1048576.0 : NAN);
			put(r, "mem_total_mib", info.mem_total >= 0 ? info.mem_total / 1048576.0 : NAN);
			/* NVML gives KiB/s averaged over its own 20 ms window. */
			put(r, "pcie_rx_mbps", info.pcie_rx_kibps >= 0 ? info.pcie_rx_kibps * 1024.0 / 1e6 : NAN);
			put(r, "pcie_tx_mbps", info.pcie_tx_kibps >= 0 ? info.pcie_tx_kibps * 1024.0 / 1e6 : NAN);
		}
	}
	for (int i = 0; i < c->nprocs; i++) {
		const struct proc_raw *pr = &c->procs[i], *o = p ? find_proc(p, pr) : NULL;
		char name[64];
		snprintf(name, sizeof(name), "%d", pr->pub.pid);
		struct row *r = add_row(s, "ferry", name);
		if (!r)
			break;
		snprintf(r->text_name, sizeof(r->text_name), "%s", pr->pub.name);
		snprintf(r->text_path, sizeof(r->text_path), "%s", pr->pub.path);
		const struct ferry__publish_counters *a = &pr->pub.c, *b = o ? &o->pub.c : NULL;
		int ok = b && dt > 0;
		put(r, "pid", pr->pub.pid);
		put(r, "read_mbps", ok ? delta(a->bytes_read, b->bytes_read) / dt / 1e6 : 0);
		put(r, "write_mbps", ok ? delta(a->bytes_written, b->bytes_written) / dt / 1e6 : 0);
		put(r, "read_iops", ok ? delta(a->reads, b->reads) / dt : 0);
		put(r, "write_iops", ok ? delta(a->writes, b->writes) / dt : 0);
		double wait = ok ? 100.0 * delta(a->consumer_wait_ns, b->consumer_wait_ns) / (dt * 1e9) : 0;
		put(r, "wait_pct", wait > 100 ? 100 : wait);
		put(r, "read_bytes_total", (double)a->bytes_read);
		put(r, "write_bytes_total", (double)a->bytes_written);
		put(r, "errors_total", (double)a->errors);
		put(r, "fallbacks_total", (double)a->fallbacks);
		add_activities(s, (int)(r - s->rows), pr, o, dt);
	}
}

int ferry_sampler_sample(ferry_sampler *s)
{
	if (!s)
		return ferry__error(-EINVAL, "ferry_sampler_sample: NULL sampler");
	struct snapshot next;
	memset(&next, 0, sizeof(next));
	next.t_ns = mono_ns();
	int err = read_diskstats(&next);
	if (!err)
		err = read_stat(&next);
	if (err) {
		snap_free(&next);
		return err;
	}
	read_publications(&next);
	snap_free(&s->prev);
	s->prev = s->cur;
	s->have_prev = s->prev.t_ns != 0;
	s->cur = next;
	s->interval = s->have_prev ? (double)(s->cur.t_ns - s->prev.t_ns) / 1e9 : 0;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	s->wall = (double)ts.tv_sec + ts.tv_nsec / 1e9;
	build_rows(s, s->interval);
	s->nnotes = 0;
	const char *why = ferry__sys_nvml_reason();
	if (why[0])
		snprintf(s->notes[s->nnotes++], sizeof(s->notes[0]), "%s", why);
	if (s->cur.nnewer)
		snprintf(s->notes[s->nnotes++], sizeof(s->notes[0]), "%s%s", s->cur.newer,
			 s->cur.nnewer > 1 ? " (and others like it)" : "");
	return 0;
}

double ferry_sampler_interval(const ferry_sampler *s)
{
	return s ? s->interval : 0;
}

size_t ferry_sampler_rows(const ferry_sampler *s)
{
	return s ? s->nrows : 0;
}

const char *ferry_sampler_row_kind(const ferry_sampler *s, size_t i)
{
	return s && i < s->nrows ? s->rows[i].kind : NULL;
}

const char *ferry_sampler_row_name(const ferry_sampler *s, size_t i)
{
	return s && i < s->nrows ? s->rows[i].name : NULL;
}

int ferry_sampler_row_value(const ferry_sampler *s, size_t i, const char *metric, double *out)
{
	if (!s || i >= s->nrows || !metric || !out)
		return -EINVAL;
	const struct row *r = &s->rows[i];
	for (int k = 0; k < r->nm; k++)
		if (!strcmp(r->m[k].key, metric)) {
			*out = r->m[k].v;
			return 0;
		}
	return -ENOENT;
}

const char *ferry_sampler_row_text(const ferry_sampler *s, size_t i, const char *key)
{
	if (!s || i >= s->nrows || !key)
		return NULL;
	const struct row *r = &s->rows[i];
	if (!strcmp(key, "name") && r->text_name[0])
		return r->text_name;
	if (!strcmp(key, "path") && !strcmp(r->kind, "ferry"))
		return r->text_path;
	if (!strcmp(key, "kind") && r->text_kind)
		return r->text_kind;
	if (!strcmp(key, "phase") && r->text_phase)
		return r->text_phase;
	return NULL;
}

const char *ferry_sampler_note(const ferry_sampler *s, size_t i)
{
	return s && i < s->nnotes ? s->notes[i] : NULL;
}

/* ----------------------------------------------------------------------------------- output */

/* A ferry row's "activities": [{"kind": ..., "name": ..., "phase": ..., metrics}, ...]. */
static void json_activities(struct ferry__sbuf *b, const ferry_sampler *s, size_t parent)
{
	ferry__sbuf_printf(b, ", \"activities\": [");
	int first = 1;
	for (size_t i = parent + 1; i < s->nrows && !strcmp(s->rows[i].kind, "activity"); i++) {
		const struct row *r = &s->rows[i];
		ferry__sbuf_printf(b, "%s{\"kind\": ", first ? "" : ", ");
		ferry__sbuf_json(b, r->text_kind);
		ferry__sbuf_printf(b, ", \"name\": ");
		ferry__sbuf_json(b, r->text_name);
		ferry__sbuf_printf(b, ", \"phase\": ");
		ferry__sbuf_json(b, r->text_phase);
		for (int m = 0; m < r->nm; m++)
			ferry__sbuf_printf(b, ", \"%s\": %.15g", r->m[m].key, r->m[m].v);
		ferry__sbuf_put(b, "}", 1);
		first = 0;
	}
	ferry__sbuf_put(b, "]", 1);
}

int ferry_sampler_json(ferry_sampler *s, const char **out)
{
	if (!s || !out)
		return -EINVAL;
	struct ferry__sbuf *b = &s->json;
	ferry__sbuf_free(b);
	ferry__sbuf_printf(b, "{\"schema_version\": 1, \"time\": %.3f, \"interval_s\": %.3f", s->wall, s->interval);
	static const char *const kinds[] = {"cpu", "disk", "gpu", "ferry"};
	for (size_t k = 0; k < 4; k++) {
		ferry__sbuf_printf(b, ", \"%s\": [", kinds[k]);
		int first = 1;
		for (size_t i = 0; i < s->nrows; i++) {
			const struct row *r = &s->rows[i];
			if (strcmp(r->kind, kinds[k]))
				continue;
			ferry__sbuf_printf(b, "%s{\"name\": ", first ? "" : ", ");
			ferry__sbuf_json(b, r->name);
			if (r->text_name[0]) {
				ferry__sbuf_printf(b, ", \"label\": ");
				ferry__sbuf_json(b, r->text_name);
			}
			if (!strcmp(r->kind, "ferry")) {
				ferry__sbuf_printf(b, ", \"path\": ");
				ferry__sbuf_json(b, r->text_path);
			}
			for (int m = 0; m < r->nm; m++)
				ferry__sbuf_printf(b, ", \"%s\": %.15g", r->m[m].key, r->m[m].v);
			if (!strcmp(r->kind, "ferry"))
				json_activities(b, s, i);
			ferry__sbuf_put(b, "}", 1);
			first = 0;
		}
		ferry__sbuf_put(b, "]", 1);
	}
	ferry__sbuf_printf(b, ", \"notes\": [");
	for (size_t i = 0; i < s->nnotes; i++) {
		if (i)
			ferry__sbuf_put(b, ", ", 2);
		ferry__sbuf_json(b, s->notes[i]);
	}
	ferry__sbuf_printf(b, "]}");
	if (b->oom) {
		ferry__sbuf_free(b);
		return ferry__error(-ENOMEM, "ferry_sampler_json: out of memory");
	}
	*out = b->data;
	return 0;
}

/* Prometheus label values escape backslash, double quote and newline (exposition format 0.0.4). */
static void prom_label(struct ferry__sbuf *b, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			ferry__sbuf_printf(b, "\\%c", *v);
		else if (*v == '\n')
			ferry__sbuf_put(b, "\\n", 2);
		else
			ferry__sbuf_put(b, v, 1);
	}
}

static const struct prom_metric {
	const char *kind, *key, *name, *type, *help;
	double scale;
} prom_metrics[] = {
	{"cpu", "busy_pct", "ferry_cpu_busy_percent", "gauge", "CPU time not idle or iowait, percent", 1},
	{"cpu", "iowait_pct", "ferry_cpu_iowait_percent", "gauge", "CPU time in iowait, percent", 1},
	{"cpu", "softirq_pct", "ferry_cpu_softirq_percent", "gauge", "CPU time in softirq, percent", 1},
	{"disk", "read_mbps", "ferry_disk_read_bytes_per_second", "gauge", "Bytes read per second", 1e6},
	{"disk", "write_mbps", "ferry_disk_write_bytes_per_second", "gauge", "Bytes written per second", 1e6},
	{"disk", "read_iops", "ferry_disk_reads_per_second", "gauge", "Reads completed per second", 1},
	{"disk", "write_iops", "ferry_disk_writes_per_second", "gauge", "Writes completed per second", 1},
	{"disk", "read_await_ms", "ferry_disk_read_await_seconds", "gauge", "Average read latency", 1e-3},
	{"disk", "write_await_ms", "ferry_disk_write_await_seconds", "gauge", "Average write latency", 1e-3},
	{"disk", "queue_depth", "ferry_disk_queue_depth", "gauge", "Average requests in flight (aqu-sz)", 1},
	{"disk", "util_pct", "ferry_disk_utilization_percent", "gauge", "Time the device was busy, percent", 1},
	{"disk", "read_bytes_total", "ferry_disk_read_bytes_total", "counter", "Bytes read since boot", 1},
	{"disk", "write_bytes_total", "ferry_disk_written_bytes_total", "counter", "Bytes written since boot", 1},
	{"disk", "reads_total", "ferry_disk_reads_completed_total", "counter", "Reads completed since boot", 1},
	{"disk", "writes_total", "ferry_disk_writes_completed_total", "counter", "Writes completed since boot", 1},
	{"gpu", "util_pct", "ferry_gpu_utilization_percent", "gauge", "GPU busy, percent (NVML)", 1},
	{"gpu", "mem_used_mib", "ferry_gpu_memory_used_bytes", "gauge", "GPU memory used", 1048576},
	{"gpu", "mem_total_mib", "ferry_gpu_memory_total_bytes", "gauge", "GPU memory total", 1048576},
	{"gpu", "pcie_rx_mbps", "ferry_gpu_pcie_rx_bytes_per_second", "gauge", "PCIe bytes received by the GPU per second", 1e6},
	{"gpu", "pcie_tx_mbps", "ferry_gpu_pcie_tx_bytes_per_second", "gauge", "PCIe bytes sent by the GPU per second", 1e6},
	{"ferry", "read_mbps", "ferry_process_read_bytes_per_second", "gauge", "Bytes a ferry process read per second", 1e6},
	{"ferry", "write_mbps", "ferry_process_write_bytes_per_second", "gauge", "Bytes a ferry process wrote per second", 1e6},
	{"ferry", "wait_pct", "ferry_process_consumer_wait_percent", "gauge", "Time the consumer waited for data, percent", 1},
	{"ferry", "read_bytes_total", "ferry_process_read_bytes_total", "counter", "Bytes a ferry process read", 1},
	{"ferry", "write_bytes_total", "ferry_process_written_bytes_total", "counter", "Bytes a ferry process wrote", 1},
	{"ferry", "errors_total", "ferry_process_errors_total", "counter", "Failed requests of a ferry process", 1},
	{"ferry", "fallbacks_total", "ferry_process_fallbacks_total", "counter", "Automatic fallbacks a ferry process took", 1},
	{"activity", "samples_total", "ferry_loader_samples_total", "counter", "Samples a loader handed out", 1},
	{"activity", "samples_per_s", "ferry_loader_samples_per_second", "gauge", "Samples a loader handed out per second", 1},
	{"activity", "batches_per_s", "ferry_loader_batches_per_second", "gauge", "Batches a loader handed out per second", 1},
	{"activity", "wait_pct", "ferry_loader_wait_percent", "gauge", "Time the loader's consumer waited for batches, percent", 1},
	{"activity", "bytes_total", "ferry_activity_bytes_total", "counter", "Bytes a loader handed out, a save wrote or a load read", 1},
	{"activity", "gbps", "ferry_activity_bytes_per_second", "gauge", "Bytes per second of a loader, save or load", 1e9},
	{"activity", "step", "ferry_save_step", "gauge", "The step of a checkpoint save (in flight or last)", 1},
	{"activity", "progress_pct", "ferry_activity_progress_percent", "gauge", "Bytes of a save or load done, percent", 1},
};

int ferry_sampler_prometheus(ferry_sampler *s, const char **out)
{
	if (!s || !out)
		return -EINVAL;
	struct ferry__sbuf *b = &s->prom;
	ferry__sbuf_free(b);
	for (size_t k = 0; k < sizeof(prom_metrics) / sizeof(prom_metrics[0]); k++) {
		const struct prom_metric *pm = &prom_metrics[k];
		int header = 0;
		for (size_t i = 0; i < s->nrows; i++) {
			const struct row *r = &s->rows[i];
			double v;
			if (strcmp(r->kind, pm->kind) || ferry_sampler_row_value(s, i, pm->key, &v))
				continue;
			if (!header) {
				ferry__sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", pm->name, pm->help, pm->name, pm->type);
				header = 1;
			}
			ferry__sbuf_printf(b, "%s", pm->name);
			if (!strcmp(r->kind, "disk")) {
				ferry__sbuf_printf(b, "{device=\"");
				prom_label(b, r->name);
				ferry__sbuf_printf(b, "\"}");
			} else if (!strcmp(r->kind, "gpu")) {
				ferry__sbuf_printf(b, "{gpu=\"");
				prom_label(b, r->name);
				ferry__sbuf_printf(b, "\",model=\"");
				prom_label(b, r->text_name);
				ferry__sbuf_printf(b, "\"}");
			} else if (!strcmp(r->kind, "ferry")) {
				ferry__sbuf_printf(b, "{pid=\"");
				prom_label(b, r->name);
				ferry__sbuf_printf(b, "\",name=\"");
				prom_label(b, r->text_name);
				ferry__sbuf_printf(b, "\",path=\"");
				prom_label(b, r->text_path);
				ferry__sbuf_printf(b, "\"}");
			} else if (!strcmp(r->kind, "activity")) {
				ferry__sbuf_printf(b, "{pid=\"");
				prom_label(b, r->name);
				double slot = 0;
				if (ferry_sampler_row_value(s, i, "slot", &slot))
					slot = -1;
				ferry__sbuf_printf(b, "\",kind=\"%s\",slot=\"%d\",name=\"", r->text_kind, (int)slot);
				prom_label(b, r->text_name);
				ferry__sbuf_printf(b, "\"}");
			}
			ferry__sbuf_printf(b, " %.9g\n", v * pm->scale);
		}
	}
	ferry__sbuf_printf(b, "# HELP ferry_up 1 while ferry top is sampling\n# TYPE ferry_up gauge\nferry_up 1\n");
	if (b->oom) {
		ferry__sbuf_free(b);
		return ferry__error(-ENOMEM, "ferry_sampler_prometheus: out of memory");
	}
	*out = b->data;
	return 0;
}
