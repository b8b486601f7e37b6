/*
 * The local cache of datasets read from URLs (docs/REMOTE.md, "The dataset cache"): whole shards
 * staged into the context's cache_dir by cache_jobs threads, ahead of the reads and at once for a
 * shard a read is waiting for; reads go to the staged file while it is there, to the object
 * otherwise. Ahead of plain reads the stagers go in index order and eviction takes the least
 * recently used; ahead of a loader that gave its order (ferry__dataset_cache_plan: this epoch's
 * shards and the next epoch's) they go in that order as far as the budget holds, and eviction
 * takes the shard whose next use is farthest (never one of the window being read). An entry is
 * "<xxh3(url)>-<xxh3(ETag, size)>.fcache", so a changed object has another name and is fetched
 * again, never mixed with the old bytes; beside it "<name>.json" records the URL, ETag and size,
 * compared on reuse. Entries are made through durable.h (a temporary renamed into place: no
 * process sees a half file) and held open with a shared flock while a dataset uses them; eviction
 * (recency: the mtime, which every use sets) takes an exclusive flock without waiting and skips
 * what is in use, in this process or another.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/durable.h"
#include "base/sbuf.h"
#include "base/xxh.h"
#include "engine/export.h"
#include "format/shards.h"

enum { ST_NONE, ST_STAGING, ST_READY };

struct centry {
	ferry_file *local; /* ST_READY: the staged file, flock(LOCK_SH) held on its descriptor */
	int state;
	unsigned users;    /* reads holding local (ferry__dataset_file_get .. put) */
	bool used;         /* read since it was staged: may be evicted (without a plan) */
	bool skipped;      /* no room: read from the object until the next ferry__dataset_cache_rewind
			    * (with a plan: until the reads reach another window) */
	bool urgent;       /* a read waits for it */
	uint64_t gen;      /* ST_READY: which staging of it local is (a reader's mapping of it names it) */
	/* ST_READY, once a loader reads mapped (c->lend): local mapped read-only, every page in
	 * (lend_map), lent to the loader's reads that hold local; else NULL. Set by the stager that
	 * staged it, or by a stager's map job for an entry made ready before (mapping: under way) */
	_Atomic(void *) map;
	size_t map_len;
	bool map_tried; /* ST_READY: mapped, being mapped, or failed to (the reads map it themselves) */
	char name[64];
};

struct ferry__dscache {
	struct ferry_dataset *ds;
	pid_t pid; /* the process that made it: a fork()ed child has none of its threads */
	int dirfd;
	char *dir;
	uint64_t budget;
	unsigned jobs;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct centry *e;
	uint32_t n;
	uint32_t next; /* background staging without a plan: the next shard in index order */
	/* the reads' plan (ferry__dataset_cache_plan): the shards in the order they will be read,
	 * window at a time, this epoch's (places 0 .. plan_n - 1) then the next epoch's (plan_n ..
	 * 2 plan_n - 1); rwin: the window the reads are in (ferry__dataset_cache_reading). A shard's
	 * next use is its place this epoch when that is not behind the reads, else its place next
	 * epoch (next_use); the stagers stage in plan order from the reads on, as far as the budget
	 * holds without evicting a shard needed sooner (blocked when it does not) */
	uint32_t *plan;     /* [2 plan_n] */
	uint32_t *plan_pos; /* [2 n]: plan_pos[s] = s's place this epoch, plan_pos[n + s] next epoch's,
			     * UINT32_MAX if none */
	uint32_t plan_n, window, rwin;
	uint64_t plan_next; /* the place the stagers look at next */
	uint64_t plan_epoch;
	bool blocked;       /* the shard at plan_next found no room: staging waits for the reads */
	_Atomic bool lend;  /* a loader reads mapped (ferry__dataset_cache_lend): stagers map what they stage */
	bool map_scan;      /* with lend: an entry may be ready and not mapped yet (map_job) */
	bool stop;
	pthread_t *threads;
	unsigned nthreads;
	/* what happened, for ferry__dataset_cache_stats */
	uint64_t hits, fetched, fetched_bytes, evicted, remote_reads;
	uint64_t waits, wait_ns; /* reads that waited for their shard's staging, and how long */
	uint64_t staging_bytes; /* this dataset's shards being fetched: counted against the budget */
	uint64_t gens;          /* entries made ready so far: the next one's gen */
	_Atomic uint64_t drops; /* this dataset's entries given up so far (ferry__dataset_cache_drops) */
	char err[512]; /* the first staging failure (reads then go to the object) */
};

/*
 * This process's id, without a system call: the loader asks the cache for a shard's file twice a
 * read (get and put), and each asked whether it runs in a fork()ed child; getpid(2) is a system
 * call (glibc no longer caches it), 128 a batch of 64 reads, ~60 us of the pipeline's ~180 per
 * batch over a staged dataset on the dev VM against ~120 over local files (perf: __getpid,
 * __x64_sys_getpid). Refreshed in a fork()ed child by pthread_atfork.
 */
static pid_t self_pid_v;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;

static void self_pid_child(void)
{
	self_pid_v = getpid();
}

static void self_pid_init(void)
{
	self_pid_v = getpid();
	pthread_atfork(NULL, NULL, self_pid_child);
}

static pid_t self_pid(void)
{
	pthread_once(&self_pid_once, self_pid_init);
	return self_pid_v;
}

static void entry_name(const char *url, ferry_file *remote, char *out, size_t len)
{
	const char *etag = ferry__file_etag(remote);
	char v[400];
	int k = snprintf(v, sizeof(v), "%s\n%lld", etag ? etag : "", (long long)ferry_file_size(remote));
	snprintf(out, len, "%016" PRIx64 "-%016" PRIx64 ".fcache", ferry__xxh3_64(url, strlen(url)),
		 ferry__xxh3_64(v, (size_t)(k < 0 ? 0 : k)));
}

static int meta_text(const char *url, ferry_file *remote, char *out, size_t len)
{
	const char *etag = ferry__file_etag(remote);
	struct ferry__sbuf b = {0};
	
	ferry__sbuf_puts(&b, "{\"url\": ");
	ferry__sbuf_json(&b, url);
	ferry__sbuf_puts(&b, ", \"etag\": ");
	ferry__sbuf_json(&b, etag ? etag : "");
	ferry__sbuf_printf(&b, ", \"size\": %lld}\n", (long long)ferry_file_size(remote));
	int n = -1;
	if (!b.oom && b.len < len) {
		memcpy(out, b.data, b.len + 1);
		n = (int)b.len;
	}
	ferry__sbuf_free(&b);
	return n;
}

/* 1 when dirfd/name is the file open as fd (not removed or replaced since), else 0. */
static int same_file(int dirfd, const char *name, int fd)
{
	struct stat a, b;
	return !fstat(fd, &a) && !fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) && a.st_dev == b.st_dev &&
	       a.st_ino == b.st_ino;
}

/*
 * The staged file of shard s when dirfd holds a whole, matching one: opened, locked shared, its
 * mtime set to now (its recency). 1 with *out, 0 when there is none (or it does not match).
 */
static int open_entry(struct ferry__dscache *c, uint32_t s, const char *name, ferry_file **out)
{
	struct ferry_dataset *ds = c->ds;
	ferry_file *remote = ds->files[s];
	char meta[1600], want[1600], mname[80];
	int want_len = meta_text(ds->paths[s], remote, want, sizeof(want));
	snprintf(mname, sizeof(mname), "%s.json", name);
	int mfd = openat(c->dirfd, mname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (mfd < 0)
		return 0;
	ssize_t got = read(mfd, meta, sizeof(meta));
	close(mfd);
	if (want_len < 0 || got != want_len || memcmp(meta, want, (size_t)got))
		return 0;
	size_t pl = strlen(c->dir) + strlen(name) + 2;
	char *p = malloc(pl);
	if (!p)
		return 0;
	snprintf(p, pl, "%s/%s", c->dir, name);
	ferry_file *f = NULL;
	int r = ferry_file_open(ds->ctx, p, FERRY_O_RDONLY, &f);
	free(p);
	if (r)
		return 0;
	int fd = ferry__file_fd(f);
	struct stat st;
	/* an evictor holding LOCK_EX unlinks the name before it lets go: check the name after the lock */
	if (flock(fd, LOCK_SH) || !same_file(c->dirfd, name, fd) || fstat(fd, &st) ||
	    (int64_t)st.st_size != ferry_file_size(remote)) {
		ferry_file_destroy(f);
		return 0;
	}
	futimens(fd, NULL);
	*out = f;
	return 1;
}

/* Removes dirfd/name (and its .json) unless someone holds it: 1 removed, 0 in use or gone. */
static int evict_file(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return 0;
	int done = 0;
	if (!flock(fd, LOCK_EX | LOCK_NB) && same_file(dirfd, name, fd)) {
		char m[300];
		snprintf(m, sizeof(m), "%s.json", name);
		done = !unlinkat(dirfd, name, 0);
		unlinkat(dirfd, m, 0);
	}
	close(fd);
	return done;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/*
 * f (a shard's staged file, just opened) mapped read-only with every page in, for a loader that
 * reads mapped: a new mapping of a shard costs the reader a fault every 16 pages (fault-around)
 * as its copies first touch them, about 2.6 ms a 16 MiB shard on the development VM, more than
 * the copies (a loader new each epoch over resident shards ran 0.73x the kept one's samples/s on
 * the H200 VM at 1.33x its CPU a batch); populated here, on a stager's thread, the reader's
 * copies fault nothing. NULL (the reader maps it itself) when the mapping fails or the file is
 * not all in memory.
 */
static void *lend_map(struct ferry__dscache *c, ferry_file *f, size_t *len, bool *tried)
{
	int64_t size = ferry_file_size(f);
	*len = 0;
	*tried = atomic_load(&c->lend);
	/* only an entry wholly in the page cache (one just staged; one found staged may not be):
	 * bringing in pages from the disk would read the whole cache at a loader's start, and the
	 * loader's reads of a shard not resident go to its I/O threads, not its pipeline thread */
	if (!*tried || size <= 0 || c->pid != self_pid() || !ferry__range_resident(f, 0, (uint64_t)size))
		return NULL;
	void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, ferry__file_fd(f), 0);
	if (m == MAP_FAILED)
		return NULL;
	/* (a kernel before 5.14 refuses it: the pages come in at the reader's faults, as before) */
	madvise(m, (size_t)size, MADV_POPULATE_READ);
	*len = (size_t)size;
	return m;
}

static void unlend_map(void *m, size_t len)
{
	if (m)
		munmap(m, len);
}

struct dent {
	char name[64];
	uint64_t bytes;
	struct timespec mtime;
	uint32_t shard; /* this dataset's shard it is, c->n when another's */
	uint64_t use;   /* with a plan: the shard's next use (next_use), when it was listed */
};

static int cmp_dent(const void *a, const void *b)
{
	const struct dent *x = a, *y = b;
	/* with a plan (use set): others' entries first, by recency, then this dataset's, farthest
	 * next use first */
	if (x->use != y->use)
		return x->use > y->use ? -1 : 1;
	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
	return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

/* With a plan: the place of shard s's next read (this epoch's from the reads' window on, else
 * the next epoch's, counted after this one's), UINT64_MAX when the plan does not read it. */
static uint64_t next_use(const struct ferry__dscache *c, uint32_t s)
{
	uint64_t lo = (uint64_t)c->rwin * c->window;
	if (s >= c->n)
		return UINT64_MAX;
	if (c->plan_pos[s] != UINT32_MAX && c->plan_pos[s] >= lo)
		return c->plan_pos[s];
	return c->plan_pos[c->n + s] != UINT32_MAX ? (uint64_t)c->plan_n + c->plan_pos[c->n + s] : UINT64_MAX;
}

/* With a plan: 1 when shard s is read in the window being read (never evicted). */
static int in_read_window(const struct ferry__dscache *c, uint32_t s)
{
	uint64_t u = next_use(c, s), lo = (uint64_t)c->rwin * c->window;
	return u >= lo && u < lo + c->window;
}

/*
 * With a plan: 1 when shard s may be evicted to stage a shard for place limit (0: one a read waits
 * for). Never one of the window being read, nor one used before limit. For the next window (or a
 * read waiting), the one used farthest goes, whichever: that window must be there when the reads
 * reach it. Further ahead, only a shard used in a later epoch than limit (read already this epoch,
 * or not in the plan): the shards kept from the last epoch are hits when their turn comes, and
 * evicting one to stage a shard earlier would fetch it twice (simulated, 15 shards, a cache of 5,
 * windows of 1: 14-15 fetched an epoch so, 11-12 without; no order of fetches does under 10).
 */
static int may_evict_but_read(const struct ferry__dscache *c, uint32_t s, uint64_t limit)
{
	uint64_t u = next_use(c, s);
	if (c->e[s].state == ST_STAGING || in_read_window(c, s) || u <= limit)
		return 0;
	return limit < ((uint64_t)c->rwin + 2) * c->window || u == UINT64_MAX || u / c->plan_n > limit / c->plan_n;
}

/* may_evict_but_read, and no read holds it */
static int may_evict(const struct ferry__dscache *c, uint32_t s, uint64_t limit)
{
	return !c->e[s].users && may_evict_but_read(c, s, limit);
}

/* With a plan: 1 when a read of shard s (not staged) should wait for it to be staged: s is read in
 * the window before the reads' (a pipeline thread behind the others), theirs or the next; any other
 * read of it (the tail of a token window that begins in another shard) goes to the object. */
static int near_reads(const struct ferry__dscache *c, uint32_t s)
{
	uint64_t p = c->plan_pos[s], w = p / c->window;
	return p != UINT32_MAX && w + 1 >= c->rwin && w <= (uint64_t)c->rwin + 1;
}

/*
 * Room for need more bytes under the budget: the directory's entries (every process's) are
 * counted and evicted until they fit, skipping entries in use (this dataset's shards being read;
 * anyone's locked ones). Without a plan the least recently used go first, and this dataset's
 * shards not yet read since staged stay. With one, other datasets' entries go first (least
 * recently used first: their use is not known), then this dataset's shards whose next use is
 * farthest, only those may_evict allows for place limit (staging a shard ahead never evicts one
 * needed sooner). Called with c->mu held; drops it while it works
 * on files. 0 when there is room, -ENOSPC when not.
 */
static int make_room(struct ferry__dscache *c, uint64_t need, uint64_t limit)
{
	if (!c->budget)
		return 0;
	if (need > c->budget)
		return -ENOSPC;
	int dfd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return -ENOSPC;
	}
	struct dent *v = NULL;
	size_t nv = 0, cap = 0;
	uint64_t total = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		struct stat st;
		if (l < 7 || l >= sizeof(v->name) || strcmp(de->d_name + l - 7, ".fcache") ||
		    fstatat(c->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		if (ferry__grow((void **)&v, &cap, nv + 1, sizeof(*v)))
			break;
		memcpy(v[nv].name, de->d_name, l + 1);
		v[nv].bytes = (uint64_t)st.st_size;
		v[nv].mtime = st.st_mtim;
		total += v[nv].bytes;
		nv++;
	}
	closedir(d);
	for (size_t i = 0; i < nv; i++) {
		uint32_t s;
		for (s = 0; s < c->n && strcmp(c->e[s].name, v[i].name); s++)
			;
		v[i].shard = s;
		/* others' first (UINT64_MAX), then ours by next use (a shard the plan does not read:
		 * UINT64_MAX - 1) */
		uint64_t u = s < c->n && c->plan_n ? next_use(c, s) : 0;
		v[i].use = !c->plan_n ? 0 : s == c->n ? UINT64_MAX : u - (u == UINT64_MAX);
	}
	qsort(v, nv, sizeof(*v), cmp_dent);
	if (c->plan_n) {
		/* what would go first: nothing goes unless that makes room (a stage that found none
		 * after all would have evicted for nothing), and staging ahead waits for a shard a read
		 * still holds (its put wakes the stagers) rather than evict one used sooner instead */
		uint64_t left = total;
		for (size_t i = 0; i < nv && left + c->staging_bytes + need > c->budget; i++) {
			uint32_t s = v[i].shard;
			if (s == c->n || may_evict(c, s, limit))
				left -= v[i].bytes;
			else if (limit && may_evict_but_read(c, s, limit))
				break;
		}
		if (left + c->staging_bytes + need > c->budget) {
			free(v);
			return -ENOSPC;
		}
	}
	/* the shards this dataset's other stagers are fetching count too: with cache_jobs of them
	 * each seeing the directory without the others' shards, a budget of half a 6-shard dataset
	 * held all 6 (bench/remote-loader.py) and, full, nothing was ever evicted again */
	for (size_t i = 0; i < nv && total + c->staging_bytes + need > c->budget; i++) {
		/* one of this dataset's: give it up first when it may go */
		uint32_t s = v[i].shard;
		if (s < c->n) {
			struct centry *e = &c->e[s];
			if (c->plan_n) { /* (the reads may have moved on while mu was dropped) */
				if (!may_evict(c, s, limit))
					continue;
			} else if (e->state != ST_READY || e->users || !e->used) {
				continue;
			}
		}
		if (s < c->n && c->e[s].state == ST_READY) {
			struct centry *e = &c->e[s];
			ferry_file *f = e->local;
			void *m = atomic_load(&e->map);
			size_t ml = e->map_len;
			e->local = NULL;
			atomic_store(&e->map, NULL);
			e->state = ST_NONE;
			atomic_fetch_add(&c->drops, 1);
			pthread_mutex_unlock(&c->mu);
			unlend_map(m, ml); /* (no read holds it: may_evict) */
			ferry_file_destroy(f); /* drops its LOCK_SH */
			pthread_mutex_lock(&c->mu);
		}
		pthread_mutex_unlock(&c->mu);
		int gone = evict_file(c->dirfd, v[i].name);
		pthread_mutex_lock(&c->mu);
		if (gone) {
			total -= v[i].bytes;
			c->evicted++;
		}
	}
	free(v);
	return total + c->staging_bytes + need <= c->budget ? 0 : -ENOSPC;
}

/* Downloads shard s whole into dirfd/name (durable.h: a temporary renamed into place). */
static int fetch(struct ferry__dscache *c, uint32_t s, const char *name)
{
	struct ferry_dataset *ds = c->ds;
	ferry_file *remote = ds->files[s];
	int64_t size = ferry_file_size(remote);
	char meta[1600], mname[80];
	int mlen = meta_text(ds->paths[s], remote, meta, sizeof(meta));
	if (size < 0 || mlen < 0)
		return ferry__error(-EINVAL, "%s: cache %s: the ETag is too long to record", ds->paths[s], c->dir);
	/* the record first: an entry whose data is in place always has it (a record alone is ignored) */
	snprintf(mname, sizeof(mname), "%s.json", name);
	int r = ferry__durable_write(c->dirfd, mname, meta, (size_t)mlen, 0644, 0);
	if (r)
		return r;
	struct ferry__tmpfile t;
	if ((r = ferry__tmp_create(c->dirfd, name, 0644, O_RDWR, &t)))
		return r;
	if (size && ftruncate(t.fd, size))
		r = ferry__error(-errno, "%s: cache %s/%s: ftruncate", ds->paths[s], c->dir, t.name);
	if (!r && size) {
		/* the parallel ranged GETs land in the file's pages: no bounce buffer of our own */
		void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, t.fd, 0);
		if (m == MAP_FAILED) {
			r = ferry__error(-errno, "%s: cache %s/%s: mmap", ds->paths[s], c->dir, t.name);
		} else {
			ssize_t got = ferry_pread(remote, m, (size_t)size, 0);
			if (got != size)
				r = got < 0 ? (int)got : ferry__error(-EIO, "%s: short read staging it (%zd of %lld bytes)",
								      ds->paths[s], got, (long long)size);
			/* unmapped before the data is made durable: writing back pages still mapped
			 * writable cleans each page's entry with a TLB flush of every CPU the process
			 * runs on (msync did that, 4,096 times a 16 MiB shard, each an interrupt of the
			 * loader's thread: perf on the development VM); unmapped, one flush at munmap */
			munmap(m, (size_t)size);
			if (!r && fdatasync(t.fd))
				r = ferry__error(-errno, "%s: cache %s/%s: fdatasync", ds->paths[s], c->dir, t.name);
		}
	}
	if (!r)
		r = ferry__tmp_commit(&t, FERRY__DURABLE_NOREPLACE | FERRY__DURABLE_NOSYNC);
	if (r)
		ferry__tmp_abort(&t);
	if (r == -EEXIST) { /* another process staged it meanwhile: theirs is as good */
		ferry__error_clear();
		r = 0;
	}
	return r;
}

/*
 * One shard: reused when staged before (by anyone), else fetched when there is room. ahead: the
 * place in the plan it is staged for, ahead of the reads (UINT64_MAX: a read waits for it, or
 * there is no plan): then only shards used after it may be evicted for it, and when that does not
 * make room the stagers wait for the reads to move on (blocked) rather than skip it.
 */
static void stage(struct ferry__dscache *c, uint32_t s, uint64_t ahead)
{
	struct centry *e = &c->e[s];
	ferry_file *f = NULL;
	int ok = open_entry(c, s, e->name, &f);
	int room = -ENOSPC;
	size_t map_len = 0;
	bool map_tried = false;
	void *map = ok ? lend_map(c, f, &map_len, &map_tried) : NULL;
	pthread_mutex_lock(&c->mu);
	if (ok) {
		c->hits++;
	} else if ((room = make_room(c, (uint64_t)ferry_file_size(c->ds->files[s]), ahead == UINT64_MAX ? 0 : ahead)) == 0) {
		uint64_t size = (uint64_t)ferry_file_size(c->ds->files[s]);
		c->staging_bytes += size;
		pthread_mutex_unlock(&c->mu);
		int r = fetch(c, s, e->name);
		if (r && !c->err[0]) {
			pthread_mutex_lock(&c->mu);
			if (!c->err[0])
				snprintf(c->err, sizeof(c->err), "%s", ferry_last_error());
			pthread_mutex_unlock(&c->mu);
		}
		ok = !r && open_entry(c, s, e->name, &f);
		if (ok)
			map = lend_map(c, f, &map_len, &map_tried);
		pthread_mutex_lock(&c->mu);
		c->staging_bytes -= size; /* in the directory now (counted there), or not at all */
		if (ok) {
			c->fetched++;
			c->fetched_bytes += (uint64_t)ferry_file_size(c->ds->files[s]);
		}
	}
	if (ok) {
		e->local = f;
		e->map_len = map_len;
		e->map_tried = map_tried;
		c->map_scan |= !map_tried;
		atomic_store(&e->map, map);
		e->state = ST_READY;
		e->gen = ++c->gens;
		e->used = false;
	} else if (room && ahead != UINT64_MAX) {
		/* no room ahead of the reads without evicting a shard needed sooner: tried again from
		 * this place when they move on; a read that came for it meanwhile has it staged now
		 * (urgent: pick gives it again, and any shard outside the read window may go for it) */
		e->state = ST_NONE;
		if (!e->urgent) {
			c->blocked = true;
			if (c->plan_next > ahead)
				c->plan_next = ahead;
		}
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		return;
	} else {
		e->state = ST_NONE;
		e->skipped = true;
	}
	e->urgent = false;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/*
 * The next shard to stage (under mu): one a read waits for (*ahead UINT64_MAX), else with a plan
 * the next in it from the reads on (this epoch's, then the next epoch's: *ahead its place), else
 * the next in index order.
 */
static int pick(struct ferry__dscache *c, uint32_t *s, uint64_t *ahead)
{
	*ahead = UINT64_MAX;
	for (uint32_t i = 0; i < c->n; i++)
		if (c->e[i].urgent && c->e[i].state == ST_NONE) {
			*s = i;
			return 1;
		}
	if (c->plan_n) {
		if (c->blocked)
			return 0;
		uint64_t lo = (uint64_t)c->rwin * c->window;
		if (c->plan_next < lo)
			c->plan_next = lo;
		for (; c->plan_next < 2 * (uint64_t)c->plan_n; c->plan_next++) {
			uint32_t i = c->plan[c->plan_next];
			/* (a shard's place next epoch is its next use only once this epoch's reads of it
			 * are behind) */
			if (c->e[i].state == ST_NONE && !c->e[i].skipped && next_use(c, i) == c->plan_next) {
				*s = i;
				*ahead = c->plan_next++;
				return 1;
			}
		}
		return 0;
	}
	for (; c->next < c->n; c->next++)
		if (c->e[c->next].state == ST_NONE && !c->e[c->next].skipped) {
			*s = c->next++;
			return 1;
		}
	return 0;
}

/*
 * A map job (under mu): an entry made ready before a loader asked for mappings (the entries a new
 * process found staged, reused from the open on, most of all) mapped now, held meanwhile so that
 * it is not evicted. 0 when there is none.
 */
static int map_job(struct ferry__dscache *c)
{
	if (!c->map_scan || !atomic_load(&c->lend))
		return 0;
	for (uint32_t s = 0; s < c->n; s++) {
		struct centry *e = &c->e[s];
		if (e->state != ST_READY || e->map_tried)
			continue;
		ferry_file *f = e->local;
		e->map_tried = true;
		e->users++;
		pthread_mutex_unlock(&c->mu);
		size_t len;
		bool tried;
		void *m = lend_map(c, f, &len, &tried);
		pthread_mutex_lock(&c->mu);
		if (m) {
			e->map_len = len;
			atomic_store(&e->map, m);
		}
		if (!--e->users && c->blocked && (!c->plan_n || may_evict_but_read(c, s, c->plan_next))) {
			c->blocked = false;
			pthread_cond_broadcast(&c->cv);
		}
		return 1;
	}
	c->map_scan = false;
	return 0;
}

static void *stager(void *arg)
{
	struct ferry__dscache *c = arg;
	pthread_mutex_lock(&c->mu);
	while (!c->stop) {
		uint32_t s;
		uint64_t ahead;
		if (!pick(c, &s, &ahead)) {
			if (!map_job(c))
				pthread_cond_wait(&c->cv, &c->mu);
			continue;
		}
		c->e[s].state = ST_STAGING;
		pthread_mutex_unlock(&c->mu);
		stage(c, s, ahead);
		pthread_mutex_lock(&c->mu);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* A small object (a dataset's index) read whole through the context's cache_dir: 1 with *buf from
 * the entry when it matches remote's URL, ETag and size; 0 when there is none (or no cache_dir). */
int ferry__cache_get_small(ferry_ctx *ctx, const char *url, ferry_file *remote, uint8_t **buf, size_t *len)
{
	uint64_t budget;
	unsigned jobs;
	const char *dir = ferry__ctx_cache(ctx, &budget, &jobs);
	char name[64], mname[80], meta[1600], want[1600];
	int64_t size = ferry_file_size(remote);
	int want_len = meta_text(url, remote, want, sizeof(want));
	if (!dir[0] || size < 0 || want_len < 0)
		return 0;
	entry_name(url, remote, name, sizeof(name));
	snprintf(mname, sizeof(mname), "%s.json", name);
	int dfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (dfd < 0) {
		ferry__error_clear();
		return 0;
	}
	int hit = 0, mfd = openat(dfd, mname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t got = mfd < 0 ? -1 : read(mfd, meta, sizeof(meta));
	if (mfd >= 0)
		close(mfd);
	int fd = got == want_len && !memcmp(meta, want, (size_t)got) ? openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
	struct stat st;
	uint8_t *b = NULL;
	if (fd >= 0 && !fstat(fd, &st) && st.st_size == size && (b = malloc(size ? (size_t)size : 1))) {
		size_t done = 0;
		while (done < (size_t)size) {
			ssize_t r = pread(fd, b + done, (size_t)size - done, (off_t)done);
			if (r <= 0 && !(r < 0 && errno == EINTR))
				break;
			done += r > 0 ? (size_t)r : 0;
		}
		if (done == (size_t)size) {
			futimens(fd, NULL);
			*buf = b;
			*len = done;
			hit = 1;
		} else {
			free(b);
		}
	}
	if (fd >= 0)
		close(fd);
	close(dfd);
	return hit;
}

/* Records a small object just read from remote in the cache (best effort: a failure is no error). */
void ferry__cache_put_small(ferry_ctx *ctx, const char *url, ferry_file *remote, const uint8_t *buf, size_t len)
{
	uint64_t budget;
	unsigned jobs;
	const char *dir = ferry__ctx_cache(ctx, &budget, &jobs);
	char name[64], mname[80], meta[1600];
	int mlen = meta_text(url, remote, meta, sizeof(meta));
	if (!dir[0] || mlen < 0 || (budget && len > budget))
		return;
	entry_name(url, remote, name, sizeof(name));
	snprintf(mname, sizeof(mname), "%s.json", name);
	int dfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (dfd >= 0 && !ferry__durable_write(dfd, mname, meta, (size_t)mlen, 0644, 0))
		(void)ferry__durable_write(dfd, name, buf, len, 0644, FERRY__DURABLE_NOREPLACE);
	if (dfd >= 0)
		close(dfd);
	ferry__error_clear();
}

int ferry__dataset_cache_open(struct ferry_dataset *ds)
{
	uint64_t budget;
	unsigned jobs;
	const char *dir = ferry__ctx_cache(ds->ctx, &budget, &jobs);
	uint32_t all = ds->x.nfiles + ds->copies.nfiles;
	if (!dir[0] || !all)
		return 0;
	struct ferry__dscache *c = calloc(1, sizeof(*c));
	if (!c || !(c->e = calloc(all, sizeof(*c->e))) || !(c->dir = strdup(dir)) ||
	    !(c->threads = calloc(jobs, sizeof(*c->threads)))) {
		if (c) {
			free(c->e);
			free(c->dir);
		}
		free(c);
		return ferry__error(-ENOMEM, "%s: cache %s", ds->path, dir);
	}
	c->ds = ds;
	c->pid = self_pid();
	c->n = all;
	c->budget = budget;
	c->jobs = jobs;
	c->dirfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (c->dirfd < 0) {
		int r = c->dirfd;
		free(c->threads);
		free(c->e);
		free(c->dir);
		free(c);
		ferry__error_append("the cache_dir of %s", ds->path);
		return r;
	}
	for (uint32_t s = 0; s < all; s++)
		entry_name(ds->paths[s], ds->files[s], c->e[s].name, sizeof(c->e[s].name));
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	ds->cache = c;
	for (unsigned i = 0; i < jobs; i++) {
		if (pthread_create(&c->threads[i], NULL, stager, c))
			break;
		c->nthreads++;
	}
	if (!c->nthreads) {
		ferry__dataset_cache_close(ds);
		return ferry__error(-EAGAIN, "%s: cache %s: no staging thread", ds->path, dir);
	}
	return 0;
}

void ferry__dataset_cache_close(struct ferry_dataset *ds)
{
	struct ferry__dscache *c = ds->cache;
	if (!c)
		return;
	bool forked = c->pid != self_pid();
	if (!forked) { /* a fork()ed child has no stagers to stop, and the mutex may be a parent thread's */
		pthread_mutex_lock(&c->mu);
		c->stop = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		for (unsigned i = 0; i < c->nthreads; i++)
			pthread_join(c->threads[i], NULL);
	}
	for (uint32_t s = 0; s < c->n; s++)
		if (!forked || c->e[s].state == ST_READY) {
			unlend_map(atomic_load(&c->e[s].map), c->e[s].map_len);
			ferry_file_destroy(c->e[s].local);
		}
	if (!forked) {
		pthread_mutex_destroy(&c->mu);
		pthread_cond_destroy(&c->cv);
	}
	close(c->dirfd);
	free(c->plan);
	free(c->plan_pos);
	free(c->threads);
	free(c->e);
	free(c->dir);
	free(c);
	ds->cache = NULL;
}

ferry_file *ferry__dataset_file_get(struct ferry_dataset *ds, uint32_t s)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || s >= c->n)
		return ds->files[s];
	struct centry *e = &c->e[s];
	if (c->pid != self_pid()) /* a fork()ed child (DataLoader workers): what was staged, else the object */
		return e->state == ST_READY ? e->local : ds->files[s];
	pthread_mutex_lock(&c->mu);
	/* a shard not staged yet is staged now, whole, and the read waits for it: a read of the object
	 * beside the staging would fetch its bytes twice. With a plan, only one read near where the
	 * reads are (near_reads); another (the tail of a token window that begins in another shard)
	 * is read from the object: staging it whole would evict what the next windows need */
	const bool want = !c->plan_n || near_reads(c, s);
	uint64_t t0 = 0;
	for (;;) {
		if (e->state == ST_NONE && !e->skipped && want && !e->urgent) {
			e->urgent = true;
			pthread_cond_broadcast(&c->cv);
		}
		if (c->stop || !(e->state == ST_STAGING || (e->state == ST_NONE && e->urgent)))
			break;
		if (!t0) {
			t0 = ferry__now_ns();
			c->waits++;
		}
		pthread_cond_wait(&c->cv, &c->mu);
	}
	if (t0)
		c->wait_ns += ferry__now_ns() - t0;
	ferry_file *f;
	if (e->state == ST_READY) {
		e->users++;
		e->used = true;
		f = e->local;
	} else {
		c->remote_reads++;
		f = ds->files[s];
	}
	pthread_mutex_unlock(&c->mu);
	return f;
}

void ferry__dataset_file_put(struct ferry_dataset *ds, uint32_t s, ferry_file *f)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || s >= c->n || f == ds->files[s] || c->pid != self_pid())
		return;
	pthread_mutex_lock(&c->mu);
	/* the staging ahead, blocked at plan_next, may find room now that s may be evicted; only
	 * then are the stagers woken: every read's put releases its shard, and waking them for one
	 * of the window being read (never evicted) had each stager scan the directory under mu again,
	 * about 7,000 scans an epoch against the loader's get and put (60 shards, a cache of half) */
	if (c->e[s].users && !--c->e[s].users && c->blocked && (!c->plan_n || may_evict_but_read(c, s, c->plan_next))) {
		c->blocked = false;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
}

void ferry__dataset_cache_rewind(struct ferry_dataset *ds)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || c->pid != self_pid())
		return;
	pthread_mutex_lock(&c->mu);
	for (uint32_t s = 0; s < c->n; s++)
		c->e[s].skipped = false;
	c->next = 0;
	c->blocked = false;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

int ferry_dataset_cache_stats(ferry_dataset *ds, char *buf, size_t len)
{
	if (!ds || (!buf && len))
		return ferry__error(-EINVAL, "ferry_dataset_cache_stats: NULL argument");
	struct ferry__dscache *c = ds->cache;
	if (!c)
		return snprintf(buf, len, "{}");
	if (c->pid != self_pid())
		return ferry__error(-ECHILD, "ferry_dataset_cache_stats: a fork()ed child does not run the cache");
	pthread_mutex_lock(&c->mu);
	uint32_t ready = 0;
	for (uint32_t s = 0; s < c->n; s++)
		ready += c->e[s].state == ST_READY;
	struct ferry__sbuf b = {0};
	
	ferry__sbuf_puts(&b, "{\"dir\": ");
	ferry__sbuf_json(&b, c->dir);
	ferry__sbuf_printf(&b, ", \"budget\": %" PRIu64 ", \"shards\": %u, \"staged\": %u, \"reused\": %" PRIu64
			   ", \"fetched\": %" PRIu64 ", \"fetched_bytes\": %" PRIu64 ", \"evicted\": %" PRIu64
			   ", \"remote_reads\": %" PRIu64 ", \"waits\": %" PRIu64 ", \"wait_s\": %.6f, \"error\": ",
			   c->budget, c->n, ready, c->hits, c->fetched, c->fetched_bytes, c->evicted, c->remote_reads,
			   c->waits, (double)c->wait_ns / 1e9);
	ferry__sbuf_json(&b, c->err);
	ferry__sbuf_puts(&b, "}");
	pthread_mutex_unlock(&c->mu);
	int n = b.oom ? ferry__error(-ENOMEM, "cache stats") : snprintf(buf, len, "%s", b.data);
	ferry__sbuf_free(&b);
	return n;
}

uint64_t ferry__dataset_file_gen(const struct ferry_dataset *ds, uint32_t s, const ferry_file *f)
{
	const struct ferry__dscache *c = ds->cache;
	if (!c || s >= c->n || f == ds->files[s] || f != c->e[s].local)
		return 0;
	return c->e[s].gen; /* set before the get that handed f out (under mu), unchanged while held */
}

const uint8_t *ferry__dataset_file_map(const struct ferry_dataset *ds, uint32_t s, const ferry_file *f, uint64_t *len)
{
	const struct ferry__dscache *c = ds->cache;
	if (!c || s >= c->n || f == ds->files[s] || f != c->e[s].local || c->pid != self_pid())
		return NULL;
	/* (a map job may set it while f is held: map_len is set before it) */
	void *m = atomic_load(&((struct ferry__dscache *)c)->e[s].map);
	if (m)
		*len = c->e[s].map_len;
	return m;
}

void ferry__dataset_cache_lend(struct ferry_dataset *ds)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || c->pid != self_pid() || atomic_load(&c->lend))
		return;
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->lend, true);
	c->map_scan = true;
	pthread_cond_broadcast(&c->cv); /* the entries made ready before: map jobs */
	pthread_mutex_unlock(&c->mu);
}

int ferry__dataset_file_current(struct ferry_dataset *ds, uint32_t s, const ferry_file *f, uint64_t gen)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || s >= c->n)
		return f == ds->files[s];
	if (c->pid != self_pid())
		return c->e[s].state == ST_READY && c->e[s].local == f && c->e[s].gen == gen;
	pthread_mutex_lock(&c->mu);
	int r = c->e[s].state == ST_READY && c->e[s].local == f && c->e[s].gen == gen;
	pthread_mutex_unlock(&c->mu);
	return r;
}

uint64_t ferry__dataset_cache_drops(struct ferry_dataset *ds)
{
	struct ferry__dscache *c = ds->cache;
	return c ? atomic_load(&c->drops) : 0;
}

uint64_t ferry__dataset_cache_budget(const struct ferry_dataset *ds)
{
	return ds->cache ? ds->cache->budget : 0;
}

void ferry__dataset_cache_plan(struct ferry_dataset *ds, uint64_t epoch, const uint32_t *seq, const uint32_t *next,
				uint32_t n, uint32_t window)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || c->pid != self_pid() || !n || n > c->n || !window)
		return;
	for (uint32_t i = 0; i < n; i++)
		if (seq[i] >= n || (next && next[i] >= n))
			return; /* not a plan of this dataset's shards (not reached: the loader's) */
	pthread_mutex_lock(&c->mu);
	/* every pipeline thread sets the epoch's plan: the same one is kept as it is (where its reads are) */
	if (c->plan_n == n && c->plan_epoch == epoch && c->window == window && !memcmp(c->plan, seq, n * sizeof(*seq)) &&
	    (next ? !memcmp(c->plan + n, next, n * sizeof(*next)) : !memcmp(c->plan + n, seq, n * sizeof(*seq)))) {
		pthread_mutex_unlock(&c->mu);
		return;
	}
	if (!c->plan) {
		c->plan = malloc(2 * (size_t)c->n * sizeof(*c->plan));
		c->plan_pos = malloc(2 * (size_t)c->n * sizeof(*c->plan_pos));
		if (!c->plan || !c->plan_pos) { /* no plan: index order, as without one */
			free(c->plan);
			free(c->plan_pos);
			c->plan = c->plan_pos = NULL;
			pthread_mutex_unlock(&c->mu);
			return;
		}
	}
	/* without the next epoch's order, this one's again (the best guess: a shard read early is
	 * read early again) */
	memcpy(c->plan, seq, n * sizeof(*seq));
	memcpy(c->plan + n, next ? next : seq, n * sizeof(*seq));
	for (uint32_t i = 0; i < 2 * c->n; i++)
		c->plan_pos[i] = UINT32_MAX;
	for (uint32_t i = 0; i < n; i++) {
		c->plan_pos[c->plan[i]] = i;
		c->plan_pos[c->n + c->plan[n + i]] = i;
	}
	c->plan_n = n;
	c->plan_epoch = epoch;
	c->window = window;
	c->rwin = 0;
	c->plan_next = 0;
	c->blocked = false;
	for (uint32_t i = 0; i < c->n; i++)
		c->e[i].skipped = false;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

void ferry__dataset_cache_reading(struct ferry_dataset *ds, uint64_t epoch, uint32_t s)
{
	struct ferry__dscache *c = ds->cache;
	if (!c || c->pid != self_pid())
		return;
	pthread_mutex_lock(&c->mu);
	if (c->plan_n && c->plan_epoch == epoch && s < c->n && c->plan_pos[s] != UINT32_MAX &&
	    c->plan_pos[s] / c->window > c->rwin) {
		/* the reads moved on: the shards of the windows behind them are next used next epoch
		 * (the farthest: evicted first), and the staging ahead goes on from here (the shards
		 * that found no room before are tried again) */
		c->rwin = c->plan_pos[s] / c->window;
		c->plan_next = (uint64_t)c->rwin * c->window;
		c->blocked = false;
		for (uint32_t i = 0; i < c->n; i++)
			c->e[i].skipped = false;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
}
