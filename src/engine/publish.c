/* Publishing a process's transfer counters in shared memory (see publish.h). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engine/publish.h"
#include "base/base.h"

const char *ferry__publish_dir(void)
{
	const char *d = getenv("FERRY_RUN_DIR");
	return d && *d ? d : "/dev/shm";
}

struct ferry__publish_counters *ferry__publish_open(const char *name)
{
	static unsigned next;
	unsigned n = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
	char path[4096];
	snprintf(path, sizeof(path), "%s/ferry-%ld-%u.stats", ferry__publish_dir(), (long)getpid(), n);
	/* 0644: counters and a name are not secret, and top may run as another user. O_NOFOLLOW so
	 * a link planted in a shared directory cannot redirect the write. A file left by an earlier
	 * process with this pid is stale: truncated and reused. */
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		ferry__error(-errno, "publish: open(%s): %s", path, strerror(errno));
		return NULL;
	}
	if (ftruncate(fd, sizeof(struct ferry__publish)) < 0) {
		ferry__error(-errno, "publish: ftruncate(%s): %s", path, strerror(errno));
		close(fd);
		unlink(path);
		return NULL;
	}
	struct ferry__publish *p = mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		ferry__error(-errno, "publish: mmap(%s): %s", path, strerror(errno));
		unlink(path);
		return NULL;
	}
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
	return &p->c;
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
	char path[4096];
	snprintf(path, sizeof(path), "%s/ferry-%ld-%u.stats", ferry__publish_dir(), (long)p->pid, p->index);
	unlink(path);
	munmap(p, sizeof(*p));
}

/* The layout is an interface between processes of different builds (and tests/cli/test_top_*.py
 * writes it from Python): pin it. */
_Static_assert(sizeof(struct ferry__publish) == 192, "publication layout changed: bump the version");
_Static_assert(offsetof(struct ferry__publish, c) == 136, "publication layout changed: bump the version");
