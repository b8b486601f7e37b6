/* Publishing a process's transfer counters in shared memory (see publish.h). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/publish.h"
#include "base/base.h"
#include "base/durable.h"

const char *ferry__publish_dir(void)
{
	const char *d = getenv("FERRY_RUN_DIR");
	return d && *d ? d : "/dev/shm";
}

/* What close needs to find the file again: its directory and its unpredictable name. */
struct publication {
	struct publication *next;
	struct ferry__publish *p;
	int dirfd;
	pid_t pid; /* the process that made it: a fork()ed child inherits the list, not the files */
	char name[64];
};
static pthread_mutex_t pubs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct publication *pubs;
static pthread_once_t atexit_once = PTHREAD_ONCE_INIT;

/*
 * A process that exits without destroying its contexts (Python's interpreter does not) takes its
 * publications with it: the names are unlinked (the mappings stay valid for threads still writing
 * until the process is gone). Files of processes that died (SIGKILL) are left for `ferry top`.
 */
static void unlink_at_exit(void)
{
	pthread_mutex_lock(&pubs_mu);
	for (struct publication *pub = pubs; pub; pub = pub->next)
		if (pub->pid == getpid())
			(void)unlinkat(pub->dirfd, pub->name, 0);
	pthread_mutex_unlock(&pubs_mu);
}

static void register_atexit(void)
{
	(void)atexit(unlink_at_exit);
}

/*
 * A directory other users can write to and we cannot trust to keep our file ours: one owned by
 * another user (they may rename or replace what we create), or writable by others without the
 * sticky bit (anyone may unlink and replace our file). 0 or a negative code with the reason.
 */
static int check_dir(int dfd, const char *dir)
{
	struct stat st;
	if (fstat(dfd, &st))
		return ferry__error(-errno, "publish: stat(%s): %s", dir, strerror(errno));
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return ferry__error(-EPERM, "publish: %s is owned by uid %u, not by this user (%u) or root: not publishing there",
				    dir, (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
		return ferry__error(-EPERM, "publish: %s is writable by others without the sticky bit (mode %04o): not publishing there",
				    dir, (unsigned)(st.st_mode & 07777));
	return 0;
}

/* "ferry-<pid>-<16 hex digits>.stats": the prefix and pid let readers find it, the random part
 * keeps another user from creating it first. */
static int random_name(char *out, size_t n)
{
	unsigned char b[8];
	size_t got = 0;
	while (got < sizeof(b)) {
		ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return ferry__error(-errno, "publish: getrandom: %s", strerror(errno));
		got += (size_t)r;
	}
	snprintf(out, n, "ferry-%ld-%02x%02x%02x%02x%02x%02x%02x%02x.stats", (long)getpid(), b[0], b[1], b[2], b[3],
		 b[4], b[5], b[6], b[7]);
	return 0;
}

struct ferry__publish_counters *ferry__publish_open(const char *name)
{
	static unsigned next;
	unsigned n = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
	const char *dir = ferry__publish_dir();
	struct publication *pub = calloc(1, sizeof(*pub));
	if (!pub) {
		ferry__error(-ENOMEM, "publish: out of memory");
		return NULL;
	}
	/* The run directory is named by the user ($FERRY_RUN_DIR) and may be a symlink: what is
	 * checked is the directory actually opened. */
	int dfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (dfd < 0 || check_dir(dfd, dir) || random_name(pub->name, sizeof(pub->name)))
		goto fail;
	/* 0600: another user must not be able to truncate it under our mapping (SIGBUS). */
	int wfd = ferry__create_excl(dfd, pub->name, 0, 0600);
	if (wfd < 0)
		goto fail;
	/* ferry__create_excl opens write-only and a shared writable mapping needs O_RDWR: reopen the
	 * file we just made, and make sure it is still that file. */
	int fd = openat(dfd, pub->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	struct stat ws, st;
	int bad = fd < 0 ? -errno : 0;
	if (!bad && (fstat(wfd, &ws) || fstat(fd, &st) || ws.st_dev != st.st_dev || ws.st_ino != st.st_ino ||
		     !S_ISREG(st.st_mode) || st.st_uid != geteuid()))
		bad = -EEXIST;
	close(wfd);
	if (bad) {
		ferry__error(bad, "publish: reopen %s/%s: %s", dir, pub->name,
			     bad == -EEXIST ? "replaced after creation" : strerror(-bad));
		goto fail_created;
	}
	if (ftruncate(fd, sizeof(struct ferry__publish)) < 0) {
		ferry__error(-errno, "publish: ftruncate(%s/%s): %s", dir, pub->name, strerror(errno));
		goto fail_created;
	}
	struct ferry__publish *p = mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		ferry__error(-errno, "publish: mmap(%s/%s): %s", dir, pub->name, strerror(errno));
		goto fail_created;
	}
	close(fd);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	p->version = FERRY__PUBLISH_VERSION;
	p->size = sizeof(*p);
	p->pid = (int32_t)getpid();
	p->index = n;
	p->start_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	snprintf(p->name, sizeof(p->name), "%s", name ? name : "ferry");
	snprintf(p->path, sizeof(p->path), "-");
	__atomic_store_n(&p->magic, FERRY__PUBLISH_MAGIC, __ATOMIC_RELEASE);
	pub->p = p;
	pub->dirfd = dfd;
	pub->pid = getpid();
	pthread_once(&atexit_once, register_atexit);
	pthread_mutex_lock(&pubs_mu);
	pub->next = pubs;
	pubs = pub;
	pthread_mutex_unlock(&pubs_mu);
	return &p->c;

fail_created:
	if (fd >= 0)
		close(fd);
	unlinkat(dfd, pub->name, 0);
fail:
	if (dfd >= 0)
		close(dfd);
	free(pub);
	return NULL;
}

static struct ferry__publish *header_of(struct ferry__publish_counters *c)
{
	return (struct ferry__publish *)((char *)c - offsetof(struct ferry__publish, c));
}

void ferry__publish_set_path(struct ferry__publish_counters *c, const char *path)
{
	if (!c)
		return;
	struct ferry__publish *p = header_of(c);
	__atomic_fetch_add(&p->path_seq, 1, __ATOMIC_ACQ_REL);
	char tmp[sizeof(p->path)];
	snprintf(tmp, sizeof(tmp), "%s", path ? path : "-");
	memcpy(p->path, tmp, sizeof(tmp));
	__atomic_fetch_add(&p->path_seq, 1, __ATOMIC_RELEASE);
}

void ferry__publish_close(struct ferry__publish_counters *c)
{
	if (!c)
		return;
	struct ferry__publish *p = header_of(c);
	pthread_mutex_lock(&pubs_mu);
	struct publication **pp = &pubs;
	while (*pp && (*pp)->p != p)
		pp = &(*pp)->next;
	struct publication *pub = *pp;
	if (pub)
		*pp = pub->next;
	pthread_mutex_unlock(&pubs_mu);
	munmap(p, sizeof(*p));
	if (pub) {
		if (pub->pid == getpid())
			unlinkat(pub->dirfd, pub->name, 0);
		close(pub->dirfd);
		free(pub);
	}
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rewrites a slot's identity under its seq (publish.h): kind 0 frees it. */
static void slot_write(struct ferry__activity *a, uint32_t kind, const char *name)
{
	__atomic_fetch_add(&a->seq, 1, __ATOMIC_ACQ_REL);
	__atomic_store_n(&a->kind, kind, __ATOMIC_RELAXED);
	for (int f = 0; f < FERRY__ACT__COUNT; f++)
		__atomic_store_n(&a->v[f], f == FERRY__ACT_STEP ? UINT64_MAX : 0, __ATOMIC_RELAXED);
	__atomic_store_n(&a->end_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&a->start_ns, kind ? realtime_ns() : 0, __ATOMIC_RELAXED);
	char tmp[sizeof(a->name)] = {0};
	if (name) { /* the end of a long path says most */
		size_t len = strlen(name);
		snprintf(tmp, sizeof(tmp), "%s", len >= sizeof(tmp) ? name + len - (sizeof(tmp) - 1) : name);
	}
	memcpy(a->name, tmp, sizeof(tmp));
	__atomic_fetch_add(&a->seq, 1, __ATOMIC_RELEASE);
}

struct ferry__activity *ferry__publish_activity(struct ferry__publish_counters *c, enum ferry__activity_kind kind,
						const char *name)
{
	if (!c)
		return NULL;
	struct ferry__publish *p = header_of(c);
	struct ferry__activity *same = NULL, *free_slot = NULL, *oldest = NULL;
	pthread_mutex_lock(&pubs_mu);
	/* A finished one of the same kind first (a save loop shows its last save, not eight old
	 * ones), then a free slot, then the one that finished longest ago. */
	for (int i = 0; i < FERRY__PUBLISH_ACTIVITIES; i++) {
		struct ferry__activity *a = &p->act[i];
		uint64_t end = a->end_ns;
		if (!a->kind && !free_slot)
			free_slot = a;
		if (a->kind == (uint32_t)kind && end && (!same || end < same->end_ns))
			same = a;
		if (a->kind && end && (!oldest || end < oldest->end_ns))
			oldest = a;
	}
	struct ferry__activity *pick = same ? same : free_slot ? free_slot : oldest;
	if (pick)
		slot_write(pick, (uint32_t)kind, name);
	pthread_mutex_unlock(&pubs_mu);
	return pick;
}

void ferry__activity_add(struct ferry__activity *a, enum ferry__activity_field f, uint64_t v)
{
	if (a && (unsigned)f < FERRY__ACT__COUNT)
		__atomic_fetch_add(&a->v[f], v, __ATOMIC_RELAXED);
}

void ferry__activity_set(struct ferry__activity *a, enum ferry__activity_field f, uint64_t v)
{
	if (a && (unsigned)f < FERRY__ACT__COUNT)
		__atomic_store_n(&a->v[f], v, __ATOMIC_RELAXED);
}

void ferry__activity_end(struct ferry__activity *a, enum ferry__activity_phase phase)
{
	if (!a)
		return;
	pthread_mutex_lock(&pubs_mu);
	if (a->kind == FERRY__ACTIVITY_LOADER) {
		slot_write(a, 0, NULL);
	} else {
		__atomic_store_n(&a->v[FERRY__ACT_PHASE], (uint64_t)phase, __ATOMIC_RELAXED);
		__atomic_store_n(&a->end_ns, realtime_ns(), __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&pubs_mu);
}

/* The layout is an interface between processes of different builds (and tests/cli/test_top_*.py
 * writes it from Python): pin it. */
_Static_assert(offsetof(struct ferry__publish, act) == FERRY__PUBLISH_MIN_SIZE, "publication layout changed: bump the version");
_Static_assert(offsetof(struct ferry__publish, c) == 136, "publication layout changed: bump the version");
_Static_assert(sizeof(struct ferry__activity) == 128, "publication layout changed: bump the version");
_Static_assert(offsetof(struct ferry__activity, v) == 64, "publication layout changed: bump the version");
_Static_assert(sizeof(struct ferry__publish) == 192 + 8 * 128, "publication layout changed: bump the version");
