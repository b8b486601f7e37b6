/* Checkpoint directories: commit protocol, pruning, recycled shards, several ranks, async saves,
 * and a writer killed with SIGKILL at many random moments (at least 50) during save and async save. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include "ferry/ckpt.h"
#include "ferry_test.h"

static ferry_ctx *ctx;
static char root[512];

#define NT 3
static const size_t sizes[NT] = {1u << 20, (3u << 20) + 4093, 17};

static void fill_step(unsigned char **bufs, int64_t step, int rank)
{
	for (int i = 0; i < NT; i++)
		t_fill_pattern(bufs[i], sizes[i], (uint64_t)i << 32, (uint32_t)(step * 131 + rank));
}

static int add_all(ferry_ckpt *ck, unsigned char **bufs, int rank)
{
	char name[64];
	for (int i = 0; i < NT; i++) {
		uint64_t shape[1] = {sizes[i]};
		snprintf(name, sizeof(name), "r%d.t%d", rank, i);
		int r = ferry_ckpt_add(ck, name, FERRY_DT_U8, 1, shape, bufs[i], sizes[i]);
		if (r)
			return r;
	}
	return 0;
}

/* 0 when step of dir verifies and holds the content of that step (rank 0 of world 1). */
static int check_content(const char *dir, int64_t step, int world)
{
	char p[700];
	if (ferry_ckpt_verify(ctx, dir, step, 1)) {
		fprintf(stderr, "verify step %lld: %s\n", (long long)step, ferry_last_error());
		return -1;
	}
	if (ferry_ckpt_step_path(dir, step, p, sizeof(p)) < 0)
		return -1;
	ferry_st_load *ld;
	if (ferry_st_load_open(ctx, p, &ld) || ferry_st_load_run(ld, -1, FERRY_LOAD_VERIFY, 0)) {
		fprintf(stderr, "load step %lld: %s\n", (long long)step, ferry_last_error());
		return -1;
	}
	int bad = 0, known = 0;
	unsigned char *want[NT];
	for (int i = 0; i < NT; i++)
		want[i] = malloc(sizes[i]);
	for (int rank = 0; rank < world; rank++) {
		fill_step(want, step, rank);
		for (size_t k = 0; k < ferry_st_load_count(ld); k++) {
			int rr, ti;
			if (sscanf(ferry_st_load_name(ld, k), "r%d.t%d", &rr, &ti) != 2 || rr != rank)
				continue;
			known++;
			bad |= memcmp(ferry_st_load_ptr(ld, k), want[ti], sizes[ti]) != 0;
		}
	}
	if (known != NT * world) /* other tensors (test_recycle's "extra") verified by checksum only */
		bad = 1;
	for (int i = 0; i < NT; i++)
		free(want[i]);
	ferry_st_load_destroy(ld);
	if (bad)
		fprintf(stderr, "step %lld: content differs from what was saved\n", (long long)step);
	return bad ? -1 : 0;
}

static unsigned char *bufs0[NT];

static void test_basic(void)
{
	char dir[600];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/basic", root);
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	T_EQ_INT(ferry_ckpt_latest(dir), -ENOENT);
	T_EQ_INT(ferry_ckpt_set(ck, "keep", "2"), 0);
	T_EQ_INT(ferry_ckpt_set(ck, "busy", "maybe"), FERRY_EBADOPT);
	for (int64_t s = 1; s <= 4; s++) {
		fill_step(bufs0, s, 0);
		T_EQ_INT(add_all(ck, bufs0, 0), 0);
		int r = s % 2 ? ferry_ckpt_save(ck, s) : ferry_ckpt_save_async(ck, s);
		T_EQ_INT(r, 0);
		if (r)
			fprintf(stderr, "%s\n", ferry_last_error());
		if (s % 2 == 0) {
			/* the snapshot is taken: the caller may overwrite its tensors at once */
			memset(bufs0[0], 0xee, sizes[0]);
			T_EQ_INT(ferry_ckpt_wait(ck, -1), 0);
			T_EQ_INT(ferry_ckpt_done(ck), 1);
		}
		T_EQ_INT(ferry_ckpt_latest(dir), s);
		/* the last save's statistics, the checkpoint's own phase among them */
		T_CHECK(ferry_ckpt_phase_ns(ck, FERRY_PHASE_CKPT_PREPARE) > 0);
		T_CHECK(ferry_ckpt_stat(ck, FERRY_SAVE_STAT_BYTES) > 0);
	}
	T_EQ_INT(check_content(dir, 4, 1), 0);
	T_EQ_INT(check_content(dir, 3, 1), 0);
	T_EQ_INT(ferry_ckpt_world(dir, 4), 1);
	T_EQ_INT(ferry_ckpt_world(dir, 2), -ENOENT); /* pruned */
	char p[700];
	T_CHECK(ferry_ckpt_step_path(dir, 2, p, sizeof(p)) > 0 && access(p, F_OK) != 0);
	T_CHECK(ferry_ckpt_step_path(dir, 1, p, sizeof(p)) > 0 && access(p, F_OK) != 0);
	/* A step not after latest is refused. */
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	T_EQ_INT(ferry_ckpt_save(ck, 4), -EEXIST);

	/* busy=refuse: a second save while one is in flight fails with FERRY_EBUSY. */
	T_EQ_INT(ferry_ckpt_set(ck, "busy", "refuse"), 0);
	size_t bn = 64u << 20;
	unsigned char *big = calloc(1, bn);
	int tested = 0;
	for (int64_t s = 5; s < 15 && !tested; s += 2) {
		uint64_t shape[1] = {bn};
		T_EQ_INT(ferry_ckpt_add(ck, "big", FERRY_DT_U8, 1, shape, big, bn), 0);
		T_EQ_INT(ferry_ckpt_save_async(ck, s), 0);
		if (!ferry_ckpt_done(ck)) {
			T_EQ_INT(ferry_ckpt_add(ck, "big", FERRY_DT_U8, 1, shape, big, bn), 0);
			T_EQ_INT(ferry_ckpt_save_async(ck, s + 1), FERRY_EBUSY);
			tested = 1;
		}
		T_EQ_INT(ferry_ckpt_wait(ck, -1), 0);
		(void)ferry_st_writer_reset; /* the refused save's tensors are forgotten with it */
	}
	T_CHECK(tested);
	free(big);
	ferry_ckpt_destroy(ck);
}

static ino_t inode_of(const char *path)
{
	struct stat st;
	return stat(path, &st) ? 0 : st.st_ino;
}

/* "recycled" of the last save's stats: 1 or 0. */
static int stat_recycled(ferry_ckpt *ck)
{
	return (int)ferry_ckpt_stat(ck, FERRY_SAVE_STAT_RECYCLED);
}

/* Whether the file system under dir grants write leases (the proof that no one else has a
 * recycled shard open); where it does not, saves make new files and the test says so. */
static int leases_work(const char *dir)
{
	char p[700];
	snprintf(p, sizeof(p), "%s/lease-probe", dir);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644), ok = 0;
	if (fd >= 0) {
		ok = fcntl(fd, F_SETLEASE, F_WRLCK) == 0;
		if (ok)
			fcntl(fd, F_SETLEASE, F_UNLCK);
		close(fd);
		unlink(p);
	}
	return ok;
}

static void save_step(ferry_ckpt *ck, int64_t s, int extra)
{
	fill_step(bufs0, s, 0);
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	static unsigned char more[3 << 20];
	if (extra) {
		/* a larger state than the recycled file held (or, the step after, a smaller one) */
		uint64_t shape[1] = {sizeof(more)};
		memset(more, (int)s, sizeof(more));
		T_EQ_INT(ferry_ckpt_add(ck, "extra", FERRY_DT_U8, 1, shape, more, sizeof(more)), 0);
	}
	int r = ferry_ckpt_save(ck, s);
	T_EQ_INT(r, 0);
	if (r)
		fprintf(stderr, "step %lld: %s\n", (long long)s, ferry_last_error());
}

/* Pruning keeps the newest pruned step's shards in DIR/recycle; the next save writes over its
 * shard there (the same inode) instead of making a new file, unless the file has another link or
 * is open elsewhere; every kept step still verifies, whatever the sizes. */
static void test_recycle(void)
{
	char dir[600], rp[700], sp[700], lp[700];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/recycle", root);
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	T_EQ_INT(ferry_ckpt_set(ck, "keep", "1"), 0);
	T_EQ_INT(ferry_ckpt_set(ck, "recycle", "2"), FERRY_EBADOPT);
	int leases = leases_work(dir);
	if (!leases)
		printf("recycle: %s grants no write leases: shards are not recycled there (checked as such)\n", dir);
	snprintf(rp, sizeof(rp), "%s/recycle/rank-00000-of-00001.safetensors", dir);
	save_step(ck, 1, 0);
	T_EQ_INT(stat_recycled(ck), 0);
	T_CHECK(access(rp, F_OK) != 0);
	save_step(ck, 2, 0);
	/* step 1 pruned: its shard waits in DIR/recycle, its marker and manifest are gone */
	ino_t old = inode_of(rp);
	T_CHECK(old != 0);
	T_CHECK(ferry_ckpt_step_path(dir, 1, sp, sizeof(sp)) > 0 && access(sp, F_OK) != 0);
	snprintf(lp, sizeof(lp), "%s/recycle/manifest.json", dir);
	T_CHECK(access(lp, F_OK) != 0);
	for (int64_t s = 3; s <= 6; s++) {
		/* 4: larger than the file it reuses; 5: smaller again */
		save_step(ck, s, s == 4);
		T_EQ_INT(ferry_ckpt_shard_path(dir, s, 0, 1, sp, sizeof(sp)) > 0, 1);
		T_EQ_INT(stat_recycled(ck), leases);
		if (leases)
			T_CHECK(inode_of(sp) == old);
		T_EQ_INT(check_content(dir, s, 1), 0);
		old = inode_of(rp);
		T_CHECK(old != 0);
	}
	/* A recycled shard with another link (a copy kept with `cp -al`) is left alone. */
	snprintf(lp, sizeof(lp), "%s/kept-copy.safetensors", root);
	unlink(lp);
	T_ASSERT(link(rp, lp) == 0);
	save_step(ck, 7, 0);
	T_EQ_INT(stat_recycled(ck), 0);
	T_CHECK(ferry_ckpt_shard_path(dir, 7, 0, 1, sp, sizeof(sp)) > 0 && inode_of(sp) != inode_of(lp));
	T_EQ_INT(check_content(dir, 7, 1), 0);
	ferry_st *st;
	T_EQ_INT(ferry_st_open(ctx, lp, &st), 0); /* step 5's shard, intact */
	T_EQ_INT(ferry_st_verify(st, 0), 1);
	ferry_st_destroy(st);
	unlink(lp);
	/* One open elsewhere (a reader still loading the pruned step) is left alone too. */
	if (leases) {
		int fd = open(rp, O_RDONLY);
		T_ASSERT(fd >= 0);
		ino_t held = inode_of(rp);
		save_step(ck, 8, 0);
		T_EQ_INT(stat_recycled(ck), 0);
		T_CHECK(ferry_ckpt_shard_path(dir, 8, 0, 1, sp, sizeof(sp)) > 0 && inode_of(sp) != held);
		struct stat fst;
		T_CHECK(fstat(fd, &fst) == 0 && fst.st_ino == held);
		close(fd);
		save_step(ck, 9, 0);
		T_EQ_INT(stat_recycled(ck), 1);
	}
	/* recycle=0: pruned steps are removed as before, and the recycled one's space goes back */
	T_EQ_INT(ferry_ckpt_set(ck, "recycle", "0"), 0);
	save_step(ck, 10, 0);
	T_EQ_INT(stat_recycled(ck), 0);
	T_EQ_INT(check_content(dir, 10, 1), 0);
	snprintf(lp, sizeof(lp), "%s/recycle", dir);
	T_CHECK(access(lp, F_OK) != 0);
	/* an explicit prune does the same */
	T_EQ_INT(ferry_ckpt_set(ck, "recycle", "1"), 0);
	save_step(ck, 11, 0);
	T_CHECK(access(rp, F_OK) == 0);
	T_EQ_INT(ferry_ckpt_prune(dir, 1), 1);
	T_CHECK(access(lp, F_OK) != 0);
	T_EQ_INT(ferry_ckpt_latest(dir), 11);
	T_EQ_INT(check_content(dir, 11, 1), 0);
	/* the directory removed under the open handle: the next save makes it again */
	T_ASSERT(t_rmtree(dir) == 0);
	save_step(ck, 1, 0);
	T_EQ_INT(ferry_ckpt_latest(dir), 1);
	T_EQ_INT(check_content(dir, 1, 1), 0);
	ferry_ckpt_destroy(ck);
}

struct rank_arg {
	const char *dir;
	int rank, world;
	int64_t step;
	int result;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	unsigned char *b[NT];
	ferry_ckpt *ck;
	for (int i = 0; i < NT; i++)
		b[i] = malloc(sizes[i]);
	fill_step(b, a->step, a->rank);
	a->result = ferry_ckpt_open(ctx, a->dir, a->rank, a->world, &ck);
	if (!a->result)
		a->result = ferry_ckpt_set(ck, "run", "test-run");
	if (!a->result)
		a->result = add_all(ck, b, a->rank);
	if (!a->result)
		a->result = ferry_ckpt_save_async(ck, a->step);
	if (!a->result)
		a->result = ferry_ckpt_wait(ck, -1);
	if (a->result)
		fprintf(stderr, "rank %d: %s\n", a->rank, ferry_last_error());
	ferry_ckpt_destroy(ck);
	for (int i = 0; i < NT; i++)
		free(b[i]);
	return NULL;
}

/* ferry_ckpt_world reads the manifest: a world its shards do not match is corrupt. */
static void test_world_manifest(void)
{
	char dir[600], sp[700], p[800];
	snprintf(dir, sizeof(dir), "%s/world", root);
	T_ASSERT(ferry_ckpt_step_path(dir, 7, sp, sizeof(sp)) > 0);
	mkdir(dir, 0755);
	mkdir(sp, 0755);
	snprintf(p, sizeof(p), "%s/manifest.json", sp);
	static const char *const manifests[] = {
		"{\"format\":\"ferry-checkpoint-1\",\"step\":7,\"world\":2,\"shards\":[{\"file\":\"a\"},{\"file\":\"b\"}]}",
		"{\"format\":\"ferry-checkpoint-1\",\"step\":7,\"world\":3,\"shards\":[{\"file\":\"a\"}]}",
		"{\"world\":",
	};
	for (int i = 0; i < 3; i++) {
		FILE *f = fopen(p, "w");
		T_ASSERT(f != NULL);
		fputs(manifests[i], f);
		fclose(f);
		T_EQ_INT(ferry_ckpt_world(dir, 7), i == 0 ? 2 : FERRY_ECORRUPT);
	}
	T_EQ_INT(ferry_ckpt_world(dir, 8), -ENOENT);
}

static void test_ranks(void)
{
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/ranks", root);
	enum { W = 3 };
	for (int64_t step = 10; step <= 11; step++) {
		pthread_t th[W];
		struct rank_arg a[W];
		/* rank 0 starts first: it must wait for the others' markers */
		for (int r = 0; r < W; r++) {
			a[r] = (struct rank_arg){dir, r, W, step, -1};
			T_ASSERT(pthread_create(&th[r], NULL, rank_main, &a[r]) == 0);
			if (r == 0)
				usleep(20000);
		}
		for (int r = 0; r < W; r++) {
			pthread_join(th[r], NULL);
			T_EQ_INT(a[r].result, 0);
		}
		T_EQ_INT(ferry_ckpt_latest(dir), step);
		T_EQ_INT(check_content(dir, step, W), 0);
		T_EQ_INT(ferry_ckpt_world(dir, step), W);
	}
	/* Rank 0 alone times out instead of committing a partial step. */
	ferry_ckpt *ck;
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, W, &ck) == 0);
	T_EQ_INT(ferry_ckpt_set(ck, "timeout_ms", "200"), 0);
	T_EQ_INT(ferry_ckpt_set(ck, "run", "test-run"), 0);
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	T_EQ_INT(ferry_ckpt_save(ck, 12), -ETIMEDOUT);
	T_EQ_INT(ferry_ckpt_latest(dir), 11);
	ferry_ckpt_destroy(ck);
}

/* A file name in dir/sub (made), with content "x"; 0 or -1. */
static int plant(const char *dir, const char *name)
{
	char p[800];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	if (!f)
		return -1;
	fputs("x", f);
	return fclose(f);
}

static int exists(const char *dir, const char *name)
{
	char p[800];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

/* Entries of dir other than . and .. */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (d)
		closedir(d);
	return d ? n : -1;
}

/*
 * Symlinks in a checkpoint directory are never followed by saves and prunes (issue 20, finding 2):
 * an old step that is a symlink to another directory (with a manifest, so it looks committed) is
 * not emptied by pruning, nor is the target of recycle/ as a symlink, and a planted symlinked step
 * directory makes the save of that step fail without writing into its target.
 */
static void test_symlinks(void)
{
	char dir[600], t1[600], t2[600], t3[600], p[700];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/links", root);
	snprintf(t1, sizeof(t1), "%s/links-victim-step", root);
	snprintf(t2, sizeof(t2), "%s/links-victim-recycle", root);
	snprintf(t3, sizeof(t3), "%s/links-victim-planted", root);
	T_ASSERT(mkdir(dir, 0755) == 0 && mkdir(t1, 0755) == 0 && mkdir(t2, 0755) == 0 && mkdir(t3, 0755) == 0);
	T_ASSERT(!plant(t1, "manifest.json") && !plant(t1, "precious") && !plant(t2, "precious") &&
		 !plant(t2, "rank-00000-of-00001.safetensors"));
	T_ASSERT(ferry_ckpt_step_path(dir, 1, p, sizeof(p)) > 0);
	T_ASSERT(symlink(t1, p) == 0);
	snprintf(p, sizeof(p), "%s/recycle", dir);
	T_ASSERT(symlink(t2, p) == 0);
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	T_EQ_INT(ferry_ckpt_set(ck, "keep", "1"), 0);
	for (int64_t s = 2; s <= 4; s++) {
		fill_step(bufs0, s, 0);
		T_EQ_INT(add_all(ck, bufs0, 0), 0);
		int r = ferry_ckpt_save(ck, s);
		T_EQ_INT(r, 0);
		if (r)
			fprintf(stderr, "%s\n", ferry_last_error());
	}
	T_EQ_INT(ferry_ckpt_latest(dir), 4);
	T_EQ_INT(check_content(dir, 4, 1), 0);
	T_EQ_INT(ferry_ckpt_prune(dir, 1) >= 0, 1);
	T_EQ_INT(exists(t1, "manifest.json"), 1);
	T_EQ_INT(exists(t1, "precious"), 1);
	T_EQ_INT(exists(t2, "precious"), 1);
	T_EQ_INT(exists(t2, "rank-00000-of-00001.safetensors"), 1);
	T_EQ_INT(count_entries(t1), 2);
	T_EQ_INT(count_entries(t2), 2);
	T_EQ_INT(exists(dir, "step-000000000001"), 1); /* the symlink itself is not ferry's either */
	/* a planted symlinked step: the save refuses it, naming it, and its target stays empty */
	T_ASSERT(ferry_ckpt_step_path(dir, 10, p, sizeof(p)) > 0);
	T_ASSERT(symlink(t3, p) == 0);
	fill_step(bufs0, 10, 0);
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	T_EQ_INT(ferry_ckpt_save(ck, 10), -ELOOP);
	T_CHECK(strstr(ferry_last_error(), "step-000000000010") != NULL);
	T_EQ_INT(count_entries(t3), 0);
	T_EQ_INT(ferry_ckpt_latest(dir), 4);
	ferry_ckpt_destroy(ck);
}

/* The lock holder (--hold DIR): opens rank 0 of DIR, says so (DIR/held), destroys the handle once
 * DIR/release exists (DIR/released), then waits to be killed. */
static void holder(const char *dir)
{
	ferry_ckpt *ck;
	ferry_ctx *c;
	if (ferry_ctx_create(&c) || ferry_ckpt_open(c, dir, 0, 1, &ck) || plant(dir, "held"))
		_exit(3);
	while (!exists(dir, "release"))
		usleep(1000);
	ferry_ckpt_destroy(ck);
	if (plant(dir, "released"))
		_exit(4);
	for (;;)
		pause();
}

static pid_t start_holder(const char *dir)
{
	pid_t pid = fork();
	if (pid == 0) {
		execl("/proc/self/exe", "test_ckpt", "--hold", dir, (char *)NULL);
		_exit(6);
	}
	for (int i = 0; pid > 0 && i < 20000 && !exists(dir, "held"); i++)
		usleep(1000);
	return pid;
}

/*
 * Two processes writing the same rank of one directory (issue 20, finding 6): the second is refused
 * with FERRY_EBUSY naming the holder's PID; another rank is not; once the holder destroys its
 * handle, or dies, a new writer gets in.
 */
static void test_lock(void)
{
	char dir[600], pid_text[32];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/lock", root);
	T_ASSERT(mkdir(dir, 0755) == 0);
	for (int death = 0; death < 2; death++) {
		pid_t pid = start_holder(dir);
		T_ASSERT(pid > 0 && exists(dir, "held"));
		T_EQ_INT(ferry_ckpt_open(ctx, dir, 0, 1, &ck), FERRY_EBUSY);
		snprintf(pid_text, sizeof(pid_text), "pid %d ", (int)pid);
		T_CHECK(strstr(ferry_last_error(), pid_text) != NULL);
		if (!strstr(ferry_last_error(), pid_text))
			fprintf(stderr, "lock: \"%s\" does not name the holder, %s\n", ferry_last_error(), pid_text);
		T_EQ_INT(ferry_ckpt_open(ctx, dir, 1, 2, &ck), 0); /* another rank */
		ferry_ckpt_destroy(ck);
		int st;
		if (death) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0); /* the kernel drops a dead process's locks as it exits */
		} else {
			T_ASSERT(plant(dir, "release") == 0);
			for (int i = 0; i < 20000 && !exists(dir, "released"); i++)
				usleep(1000);
			T_EQ_INT(exists(dir, "released"), 1);
		}
		T_EQ_INT(ferry_ckpt_open(ctx, dir, 0, 1, &ck), 0);
		ferry_ckpt_destroy(ck);
		if (!death) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
		}
		const char *names[] = {"held", "release", "released"};
		for (int i = 0; i < 3; i++) {
			char p[700];
			snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
			unlink(p);
		}
	}
}

static int count_temporaries(const char *dir);

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The writer: resumes after latest and saves step after step until killed. */
static void child(const char *dir, int async)
{
	ferry_ckpt *ck;
	ferry_ctx *c;
	if (ferry_ctx_create(&c) || ferry_ckpt_open(c, dir, 0, 1, &ck) || ferry_ckpt_set(ck, "keep", "3"))
		_exit(3);
	int64_t step = ferry_ckpt_latest(dir);
	step = step < 0 ? 0 : step + 1;
	for (;; step++) {
		fill_step(bufs0, step, 0);
		if (add_all(ck, bufs0, 0))
			_exit(4);
		int r = async ? ferry_ckpt_save_async(ck, step) : ferry_ckpt_save(ck, step);
		if (!r && async) {
			/* training goes on and scribbles over its tensors while the write runs */
			memset(bufs0[1], 0x5a, sizes[1]);
			r = ferry_ckpt_wait(ck, -1);
		}
		if (r) {
			fprintf(stderr, "child: step %lld: %s\n", (long long)step, ferry_last_error());
			_exit(5);
		}
	}
}

static void test_crash(int async, int kills)
{
	char dir[600], p[700];
	snprintf(dir, sizeof(dir), "%s/crash-%s", root, async ? "async" : "sync");
	uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL) ^ (uint64_t)async;
	int64_t prev = -1;
	int advanced = 0;
	uint64_t window_ns = 0;
	for (int k = 0; k < kills; k++) {
		pid_t pid = fork();
		T_ASSERT(pid >= 0);
		if (pid == 0) {
			/* A fresh process image: the parent is multi-threaded (and TSan refuses threads
			 * after a fork of one). */
			execl("/proc/self/exe", "test_ckpt", "--writer", dir, async ? "1" : "0", (char *)NULL);
			_exit(6);
		}
		if (k == 0) {
			/* Calibration: how long a writer takes to commit its first step here (sanitizers
			 * and slow disks differ by 10x); kills then land anywhere in three times that. */
			uint64_t t0 = now_ns();
			while (ferry_ckpt_latest(dir) < 0 && now_ns() - t0 < 60000000000ull)
				usleep(1000);
			window_ns = 3 * (now_ns() - t0) + 1000000;
		} else {
			uint64_t d = t_rand(&seed) % window_ns + 1000000;
			struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
			nanosleep(&ts, NULL);
		}
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		if (!WIFSIGNALED(st)) {
			fprintf(stderr, "writer exited with status %d before it was killed\n", WEXITSTATUS(st));
			t_failures++;
			break;
		}
		int64_t latest = ferry_ckpt_latest(dir);
		if (latest < 0) {
			if (prev >= 0) {
				fprintf(stderr, "kill %d: latest lost (%s)\n", k, ferry_last_error());
				t_failures++;
			}
			continue;
		}
		if (latest < prev) {
			fprintf(stderr, "kill %d: latest went back from %lld to %lld\n", k, (long long)prev, (long long)latest);
			t_failures++;
		}
		if (check_content(dir, latest, 1)) {
			fprintf(stderr, "kill %d: latest step %lld is not a complete checkpoint\n", k, (long long)latest);
			t_failures++;
		}
		/* Nothing older was lost: the previous latest is kept unless pruning was due (keep 3). */
		if (prev >= 0 && prev != latest && latest - prev < 3 &&
		    (ferry_ckpt_step_path(dir, prev, p, sizeof(p)) < 0 || check_content(dir, prev, 1))) {
			fprintf(stderr, "kill %d: previous latest %lld lost\n", k, (long long)prev);
			t_failures++;
		}
		/* Steps are saved one after another, so the 3 kept are latest and the two before it: each
		 * must still verify (a recycled shard written over a kept step would fail here). */
		for (int64_t s = latest - 2; s < latest; s++) {
			if (s >= 0 && check_content(dir, s, 1)) {
				fprintf(stderr, "kill %d: kept step %lld (latest %lld) lost\n", k, (long long)s,
					(long long)latest);
				t_failures++;
			}
		}
		advanced += latest > prev;
		prev = latest;
	}
	/* The last kill may have left a preallocated temporary: the next save removes it (finding 5) */
	ferry_ckpt *ck;
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	fill_step(bufs0, prev + 1, 0);
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	T_EQ_INT(ferry_ckpt_save(ck, prev + 1), 0);
	ferry_ckpt_destroy(ck);
	T_EQ_INT(count_temporaries(dir), 0);
	printf("crash %s: %d kills within %.0f ms of start, latest advanced %d times, last step %lld\n",
	       async ? "async" : "sync", kills, (double)window_ns / 1e6, advanced, (long long)prev);
	T_CHECK(advanced >= 3);
}

/* Entries named *.tmp-* anywhere under dir (steps, recycle/), counted. */
static int count_temporaries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	char p[1200];
	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		struct stat st;
		if (!lstat(p, &st) && S_ISDIR(st.st_mode))
			n += count_temporaries(p);
		else if (strstr(e->d_name, ".tmp-") && ++n)
			printf("temporary left: %s\n", p);
	}
	if (d)
		closedir(d);
	return n;
}

/*
 * A process that forked without exec (a DataLoader worker) does not keep the parent's writer lock
 * once the parent is gone (issue 20): --forkhold DIR opens rank 0, forks a child that sleeps
 * (its PID in DIR/child), and exits without closing anything. The child's handle refuses to save.
 */
static void fork_holder(const char *dir)
{
	ferry_ckpt *ck;
	ferry_ctx *c;
	if (ferry_ctx_create(&c) || ferry_ckpt_open(c, dir, 0, 1, &ck))
		_exit(3);
	pid_t kid = fork();
	if (kid == 0) {
		uint64_t shape[1] = {4};
		int r = ferry_ckpt_add(ck, "x", FERRY_DT_U8, 1, shape, "abcd", 4);
		r = r ? r : ferry_ckpt_save(ck, 1);
		if (r != -EPERM || !plant(dir, "child-refused"))
			(void)0;
		for (;;)
			pause();
	}
	char p[700];
	snprintf(p, sizeof(p), "%s/child", dir);
	FILE *f = fopen(p, "w");
	if (!f)
		_exit(4);
	fprintf(f, "%d\n", (int)kid);
	fclose(f);
	for (int i = 0; i < 20000 && !exists(dir, "child-refused"); i++)
		usleep(1000);
	_exit(0);
}

static void test_fork_lock(void)
{
	char dir[600], p[700];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/forklock", root);
	T_ASSERT(mkdir(dir, 0755) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		execl("/proc/self/exe", "test_ckpt", "--forkhold", dir, (char *)NULL);
		_exit(6);
	}
	int st;
	T_ASSERT(pid > 0 && waitpid(pid, &st, 0) == pid);
	T_EQ_INT(WIFEXITED(st) && WEXITSTATUS(st) == 0, 1);
	T_EQ_INT(exists(dir, "child-refused"), 1); /* the child's inherited handle said EPERM */
	int kid = 0;
	snprintf(p, sizeof(p), "%s/child", dir);
	FILE *f = fopen(p, "r");
	T_ASSERT(f && fscanf(f, "%d", &kid) == 1 && kid > 0);
	fclose(f);
	int r = ferry_ckpt_open(ctx, dir, 0, 1, &ck); /* the parent is gone, its forked child is not */
	T_EQ_INT(r, 0);
	if (r)
		fprintf(stderr, "fork lock: %s\n", ferry_last_error());
	else
		ferry_ckpt_destroy(ck);
	kill(kid, SIGKILL);
}

/* A save killed mid-write leaves a shard-sized temporary; the next save of that rank removes it. */
static void test_debris(void)
{
	char dir[600], p[800];
	ferry_ckpt *ck;
	snprintf(dir, sizeof(dir), "%s/debris", root);
	T_ASSERT(mkdir(dir, 0755) == 0);
	T_ASSERT(ferry_ckpt_step_path(dir, 9, p, sizeof(p)) > 0 && mkdir(p, 0755) == 0);
	T_ASSERT(!plant(p, "rank-00000-of-00001.safetensors.tmp-0123456789abcdef"));
	T_ASSERT(!plant(p, "rank-00001-of-00002.safetensors.tmp-0123456789abcdef")); /* rank 1's: kept */
	T_ASSERT(!plant(p, "notes.txt"));                                             /* not ferry's: kept */
	T_ASSERT(ferry_ckpt_step_path(dir, 10, p, sizeof(p)) > 0 && mkdir(p, 0755) == 0);
	T_ASSERT(!plant(p, "rank-00000-of-00004.safetensors.tmp-fedcba9876543210"));
	T_ASSERT(!plant(p, "rank-00000-of-00004.done.tmp-fedcba9876543210"));
	T_ASSERT(!plant(p, "manifest.json.tmp-fedcba9876543210"));
	T_ASSERT(!plant(dir, "latest.tmp-fedcba9876543210"));
	T_ASSERT(ferry_ckpt_open(ctx, dir, 0, 1, &ck) == 0);
	fill_step(bufs0, 7, 0);
	T_EQ_INT(add_all(ck, bufs0, 0), 0);
	T_EQ_INT(ferry_ckpt_save(ck, 7), 0);
	ferry_ckpt_destroy(ck);
	T_EQ_INT(count_temporaries(dir), 1); /* rank 1's */
	T_ASSERT(ferry_ckpt_step_path(dir, 9, p, sizeof(p)) > 0);
	T_EQ_INT(exists(p, "notes.txt"), 1);
	T_ASSERT(ferry_ckpt_step_path(dir, 10, p, sizeof(p)) > 0);
	T_EQ_INT(count_entries(p), 0); /* emptied; the directory stays (another rank may write into it) */
	T_EQ_INT(check_content(dir, 7, 1), 0);
}

static uint64_t free_bytes(const char *dir)
{
	struct statvfs v;
	return statvfs(dir, &v) ? 0 : (uint64_t)v.f_bavail * v.f_frsize;
}

/*
 * A full disk at each write after the shard is in place (the marker, the manifest, `latest`): the
 * save fails with ENOSPC and gives all its space back, latest still names the step before and it
 * verifies, and the next save succeeds once there is room (issue 20, finding 5). On a tmpfs this
 * test mounts, sized so that the shard fits and the k-th small file after it does not.
 */
static void test_enospc(void)
{
	char dir[600], fill[700], p[800];
	snprintf(dir, sizeof(dir), "%s/enospc", root);
	T_ASSERT(mkdir(dir, 0755) == 0);
	if (mount("tmpfs", dir, "tmpfs", 0, "size=24m,mode=0755")) {
		printf("enospc: skipped: mount tmpfs on %s: %s (needs root)\n", dir, strerror(errno));
		rmdir(dir);
		return;
	}
	for (int k = 0; k < 3; k++) {
		char ck_dir[700];
		ferry_ckpt *ck;
		snprintf(ck_dir, sizeof(ck_dir), "%s/c%d", dir, k);
		T_ASSERT(ferry_ckpt_open(ctx, ck_dir, 0, 1, &ck) == 0);
		T_EQ_INT(ferry_ckpt_set(ck, "recycle", "0"), 0);
		fill_step(bufs0, 1, 0);
		T_EQ_INT(add_all(ck, bufs0, 0), 0);
		T_EQ_INT(ferry_ckpt_save(ck, 1), 0);
		struct stat st;
		T_ASSERT(ferry_ckpt_shard_path(ck_dir, 1, 0, 1, p, sizeof(p)) > 0 && stat(p, &st) == 0);
		uint64_t shard = (uint64_t)st.st_blocks * 512, avail = free_bytes(dir);
		/* room for the shard and k pages: the (k+1)-th small file after it finds the disk full */
		snprintf(fill, sizeof(fill), "%s/filler", dir);
		int fd = open(fill, O_CREAT | O_EXCL | O_WRONLY, 0600);
		T_ASSERT(fd >= 0 && avail > shard + (uint64_t)k * 4096);
		T_ASSERT(posix_fallocate(fd, 0, (off_t)(avail - shard - (uint64_t)k * 4096)) == 0);
		close(fd);
		uint64_t before = free_bytes(dir);
		fill_step(bufs0, 2, 0);
		T_EQ_INT(add_all(ck, bufs0, 0), 0);
		int r = ferry_ckpt_save(ck, 2);
		T_EQ_INT(r, -ENOSPC);
		if (r != -ENOSPC)
			fprintf(stderr, "enospc %d: save gave %d: %s\n", k, r, ferry_last_error());
		T_EQ_INT(free_bytes(dir), before); /* everything the failed save wrote is gone */
		T_EQ_INT(ferry_ckpt_latest(ck_dir), 1);
		T_ASSERT(ferry_ckpt_step_path(ck_dir, 2, p, sizeof(p)) > 0);
		T_EQ_INT(count_entries(p) <= 0, 1); /* nothing of the failed step (an empty directory at most) */
		T_EQ_INT(check_content(ck_dir, 1, 1), 0);
		T_ASSERT(unlink(fill) == 0);
		fill_step(bufs0, 3, 0);
		T_EQ_INT(add_all(ck, bufs0, 0), 0);
		T_EQ_INT(ferry_ckpt_save(ck, 3), 0);
		T_EQ_INT(check_content(ck_dir, 3, 1), 0);
		ferry_ckpt_destroy(ck);
		T_ASSERT(t_rmtree(ck_dir) == 0);
	}
	T_ASSERT(umount(dir) == 0);
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--writer")) {
		for (int i = 0; i < NT; i++)
			bufs0[i] = malloc(sizes[i]);
		child(argv[2], atoi(argv[3]));
	}
	if (argc == 3 && !strcmp(argv[1], "--hold"))
		holder(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "--forkhold"))
		fork_holder(argv[2]);
	snprintf(root, sizeof(root), "%s/ckpt-%d", t_tmpdir(), (int)getpid());
	mkdir(root, 0755);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	for (int i = 0; i < NT; i++)
		bufs0[i] = malloc(sizes[i]);
	test_basic();
	test_recycle();
	test_ranks();
	test_world_manifest();
	test_symlinks();
	test_lock();
	test_fork_lock();
	test_debris();
	test_enospc();
	test_crash(0, 30);
	test_crash(1, 30);
	for (int i = 0; i < NT; i++)
		free(bufs0[i]);
	ferry_ctx_destroy(ctx);
	if (!t_failures) {
		if (t_rmtree(root))
			fprintf(stderr, "could not remove %s\n", root);
	}
	return t_result();
}
