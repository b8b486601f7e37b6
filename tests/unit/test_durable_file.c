/* ferry_durable (the public durable-file handle): a file appears only committed, an abort or a
 * killed writer leaves nothing behind (once the next writer of the name has run), and a file is
 * never replaced where the caller said it must not be. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "ferry/ferry.h"
#include "ferry_test.h"

static char dir[512];

/* Entries of dir whose name starts with prefix. */
static int count(const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	T_ASSERT(d);
	while ((e = readdir(d)))
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

static void slurp(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY);
	memset(buf, 0, len);
	if (fd < 0)
		return;
	ssize_t r = read(fd, buf, len - 1);
	(void)r;
	close(fd);
}

static void put(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	T_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
}

int main(void)
{
	char path[600], buf[1200];
	ferry_durable *d;
	ferry_ctx *ctx;
	ferry_file *f;

	snprintf(dir, sizeof(dir), "%s/durable-XXXXXX", getenv("FERRY_TEST_TMPDIR") ? getenv("FERRY_TEST_TMPDIR") : "/tmp");
	mkdir(getenv("FERRY_TEST_TMPDIR") ? getenv("FERRY_TEST_TMPDIR") : "/tmp", 0755);
	T_ASSERT(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/model.pt", dir);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);

	/* Written through the handle and through the engine's file, committed: the whole file. */
	T_EQ_INT(ferry_durable_create(path, &d), 0);
	T_CHECK(strstr(ferry_durable_tmp_path(d), "/.model.pt.ferry-tmp-") != NULL);
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 1);
	T_EQ_INT(access(path, F_OK), -1);
	T_EQ_INT(ferry_durable_pwrite(d, "hello ", 6, 0), 6);
	T_EQ_INT(ferry_durable_open(d, ctx, FERRY_O_RDONLY, &f), -EINVAL);
	T_EQ_INT(ferry_durable_open(d, ctx, FERRY_O_WRONLY, &f), 0);
	T_EQ_INT(ferry_pwrite(f, "world", 5, 6), 5);
	ferry_file_destroy(f);
	T_EQ_INT(ferry_durable_commit(d, 0), 0);
	T_EQ_STR(ferry_durable_tmp_path(d), "");
	T_EQ_INT(ferry_durable_commit(d, 0), -EBADF);
	ferry_durable_destroy(d);
	slurp(path, buf, sizeof(buf));
	T_EQ_STR(buf, "hello world");
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 0);

	/* Aborted (destroyed uncommitted): the old file stays, no temporary. */
	T_EQ_INT(ferry_durable_create(path, &d), 0);
	T_EQ_INT(ferry_durable_pwrite(d, "half", 4, 0), 4);
	ferry_durable_destroy(d);
	slurp(path, buf, sizeof(buf));
	T_EQ_STR(buf, "hello world");
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 0);

	/* NOREPLACE over an existing file: -EEXIST, the file as it was, no temporary. */
	T_EQ_INT(ferry_durable_create(path, &d), 0);
	T_EQ_INT(ferry_durable_pwrite(d, "new", 3, 0), 3);
	T_EQ_INT(ferry_durable_commit(d, FERRY_DURABLE_NOREPLACE | FERRY_DURABLE_NOSYNC), -EEXIST);
	T_CHECK(strstr(ferry_last_error(), "model.pt") != NULL);
	ferry_durable_destroy(d);
	slurp(path, buf, sizeof(buf));
	T_EQ_STR(buf, "hello world");
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 0);
	/* and where nothing is there, NOREPLACE commits */
	snprintf(path, sizeof(path), "%s/fresh.bin", dir);
	T_EQ_INT(ferry_durable_create(path, &d), 0);
	T_EQ_INT(ferry_durable_commit(d, FERRY_DURABLE_NOREPLACE), 0);
	ferry_durable_destroy(d);
	T_EQ_INT(access(path, F_OK), 0);

	/* A writer killed mid-write leaves its temporary; the next create of the name removes it, but
	 * not a live writer's (it holds the flock), nor a file of another name. */
	snprintf(path, sizeof(path), "%s/model.pt", dir);
	int ready[2];
	T_ASSERT(pipe(ready) == 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		ferry_durable *c;
		if (ferry_durable_create(path, &c) || ferry_durable_pwrite(c, "partial", 7, 0) != 7)
			_exit(1);
		if (write(ready[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	T_ASSERT(read(ready[0], buf, 1) == 1);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 1);
	snprintf(buf, sizeof(buf), "%s/.other.pt.ferry-tmp-0123456789abcdef", dir);
	put(buf, "another name's");
	ferry_durable *live;
	T_EQ_INT(ferry_durable_create(path, &live), 0);
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 1); /* the dead one went, this one is there */
	T_EQ_INT(ferry_durable_create(path, &d), 0);
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 2); /* the live one stays */
	ferry_durable_destroy(d);
	ferry_durable_destroy(live);
	T_EQ_INT(count(".model.pt.ferry-tmp-"), 0);
	T_EQ_INT(count(".other.pt.ferry-tmp-"), 1);

	/* A directory that is not there, and a path naming a directory: errors naming the path. */
	snprintf(path, sizeof(path), "%s/missing/x", dir);
	T_EQ_INT(ferry_durable_create(path, &d), -ENOENT);
	T_CHECK(d == NULL);
	T_CHECK(strstr(ferry_last_error(), "missing") != NULL);
	snprintf(path, sizeof(path), "%s/", dir);
	T_EQ_INT(ferry_durable_create(path, &d), -EINVAL);
	ferry_durable_destroy(NULL);

	ferry_ctx_destroy(ctx);
	T_CHECK(t_rmtree(dir) == 0);
	return t_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
