/*
 * The stats file a ferry process publishes for `ferry top` (issue 20, finding 4): created
 * exclusively under an unpredictable name, mode 0600, never through a file or symlink planted at
 * the old predictable name ferry-<pid>-<n>.stats; refused in a directory others may write to
 * without the sticky bit (or owned by another user); and a stale file of a dead process, ours, is
 * removed by the sampler's scan (what `ferry top` runs) while a live one stays.
 */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include "ferry_test.h"
#include "ferry_tools.h"
#include "engine/publish.h"

static char rundir[512];

static void write_text(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	T_ASSERT(f != NULL);
	fputs(text, f);
	fclose(f);
	chmod(path, mode);
}

static off_t size_of(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_size : -1;
}

/* The one file of this pid in dir that is not one of the planted names; 1 if found. */
static int find_new(const char *dir, char *out, size_t n)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "ferry-%d-", (int)getpid());
	DIR *d = opendir(dir);
	T_ASSERT(d != NULL);
	struct dirent *e;
	int found = 0;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (strncmp(e->d_name, prefix, strlen(prefix)) || len < 6 || strcmp(e->d_name + len - 6, ".stats"))
			continue;
		const char *rest = e->d_name + strlen(prefix);
		if (!strcmp(rest, "0.stats") || !strcmp(rest, "1.stats") || !strcmp(rest, "2.stats"))
			continue;
		snprintf(out, n, "%s/%s", dir, e->d_name);
		found++;
	}
	closedir(d);
	return found == 1;
}

static void write_publication(const char *path, int32_t pid)
{
	struct ferry__publish p;
	memset(&p, 0, sizeof(p));
	p.magic = FERRY__PUBLISH_MAGIC;
	p.version = FERRY__PUBLISH_VERSION;
	p.size = sizeof(p);
	p.pid = pid;
	snprintf(p.name, sizeof(p.name), "ghost");
	FILE *f = fopen(path, "w");
	T_ASSERT(f && fwrite(&p, sizeof(p), 1, f) == 1);
	fclose(f);
}

int main(void)
{
	const char *tmp = t_tmpdir();
	char p[1024], victim[1024], link[1024], fresh[1024];
	snprintf(rundir, sizeof(rundir), "%s/publish-run-%d", tmp, (int)getpid());
	T_ASSERT(mkdir(rundir, 0700) == 0);
	setenv("FERRY_RUN_DIR", rundir, 1);

	/* Another user's files at the old predictable names: a 0666 file and a symlink to a victim. */
	snprintf(victim, sizeof(victim), "%s/publish-victim-%d", tmp, (int)getpid());
	write_text(victim, "not yours\n", 0644);
	for (int n = 0; n < 2; n++) {
		snprintf(p, sizeof(p), "%s/ferry-%d-%d.stats", rundir, (int)getpid(), n);
		write_text(p, "planted\n", 0666);
	}
	snprintf(link, sizeof(link), "%s/ferry-%d-2.stats", rundir, (int)getpid());
	T_ASSERT(symlink(victim, link) == 0);

	struct ferry__publish_counters *c[3];
	for (int i = 0; i < 3; i++) {
		c[i] = ferry__publish_open("unit test");
		if (!c[i])
			fprintf(stderr, "publish_open: %s\n", ferry_last_error());
		T_ASSERT(c[i] != NULL);
	}
	for (int n = 0; n < 2; n++) {
		snprintf(p, sizeof(p), "%s/ferry-%d-%d.stats", rundir, (int)getpid(), n);
		T_EQ_INT((int)size_of(p), 8); /* neither truncated nor grown to 192 */
	}
	T_EQ_INT((int)size_of(victim), 10);
	struct stat ls;
	T_CHECK(lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode));
	for (int i = 1; i < 3; i++)
		ferry__publish_close(c[i]);

	/* The new file: one per open publication, mode 0600, ours, 192 bytes. */
	T_ASSERT(find_new(rundir, fresh, sizeof(fresh)));
	struct stat st;
	T_ASSERT(stat(fresh, &st) == 0);
	T_EQ_INT((int)(st.st_mode & 07777), 0600);
	T_EQ_INT((int)st.st_uid, (int)geteuid());
	T_EQ_INT((int)st.st_size, (int)sizeof(struct ferry__publish));

	/* ferry top's scan: our stale file of a dead pid goes, the live one stays, and so does a
	 * dead pid's file whose name names another pid. */
	char stale[1024], odd[1024];
	int32_t dead = 0x3ffffff0; /* above pid_max: never alive */
	snprintf(stale, sizeof(stale), "%s/ferry-%d-0123456789abcdef.stats", rundir, (int)dead);
	write_publication(stale, dead);
	snprintf(odd, sizeof(odd), "%s/ferry-%d-00.stats", rundir, (int)dead - 1);
	write_publication(odd, dead);
	ferry_sampler *s;
	T_ASSERT(ferry_sampler_create(&s) == 0);
	int sr = ferry_sampler_sample(s); /* diskstats may be missing in a container: the scan still runs */
	(void)sr;
	T_CHECK(access(stale, F_OK) != 0);
	T_CHECK(access(odd, F_OK) == 0);
	T_CHECK(access(fresh, F_OK) == 0);
	int others_tested = 0;
	if (geteuid() == 0) {
		/* Another user's stale file is never removed. */
		write_publication(stale, dead);
		T_ASSERT(chown(stale, 65534, 65534) == 0);
		sr = ferry_sampler_sample(s);
		T_CHECK(access(stale, F_OK) == 0);
		unlink(stale);
		others_tested = 1;
	}
	ferry_sampler_destroy(s);
	ferry__publish_close(c[0]);
	T_CHECK(access(fresh, F_OK) != 0);

	/* A directory anyone may write to without the sticky bit: refused, with the reason. */
	char open_dir[1024];
	snprintf(open_dir, sizeof(open_dir), "%s/publish-open-%d", tmp, (int)getpid());
	T_ASSERT(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0777) == 0);
	setenv("FERRY_RUN_DIR", open_dir, 1);
	struct ferry__publish_counters *r = ferry__publish_open("unit test");
	T_CHECK(r == NULL);
	T_CHECK(strstr(ferry_last_error(), "sticky") != NULL);
	ferry__publish_close(r);
	/* With the sticky bit (as /dev/shm and /tmp have) it is fine. */
	T_ASSERT(chmod(open_dir, 01777) == 0);
	r = ferry__publish_open("unit test");
	T_CHECK(r != NULL);
	ferry__publish_close(r);
	if (geteuid() == 0) {
		/* A directory owned by another user: refused. */
		T_ASSERT(chmod(open_dir, 0755) == 0 && chown(open_dir, 65534, 65534) == 0);
		r = ferry__publish_open("unit test");
		T_CHECK(r == NULL);
		T_CHECK(strstr(ferry_last_error(), "owned by uid 65534") != NULL);
		ferry__publish_close(r);
	}
	rmdir(open_dir);

	for (int n = 0; n < 3; n++) {
		snprintf(p, sizeof(p), "%s/ferry-%d-%d.stats", rundir, (int)getpid(), n);
		unlink(p);
	}
	unlink(odd);
	unlink(victim);
	rmdir(rundir);
	if (!others_tested && !t_failures)
		printf("note: another user's files and directory not tried (needs root to chown)\n");
	return t_result();
}
