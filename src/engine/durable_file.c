/*
 * ferry_durable: the durable-file module (base/durable.h) behind the public API, for the front ends
 * that write whole files themselves (Python's ferry.torch.save and ferry.dcp's writer).
 *
 * The temporary's name, ".NAME.ferry-tmp-<random>", is not durable.h's "NAME.tmp-<random>": those
 * writers hold no lock on their temporaries, so a sweep of that pattern could remove a live
 * writer's file. Every ".NAME.ferry-tmp-*" is made here and flocked for its whole life, so one
 * whose lock can be taken belongs to a dead writer (SIGKILL, OOM), and the next create removes it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/durable.h"
#include "engine/export.h"

#define TMP_TAG ".ferry-tmp-"

struct ferry_durable {
	struct ferry__tmpfile t; /* t.dirfd is ours */
	int lock;                /* a dup of t.fd holding the flock past t.fd's close in commit */
	char *path, *tmp_path;
};

/* Unlinks dfd's ".BASE.ferry-tmp-*" whose flock can be taken, only if the name still leads to the
 * file locked (never through a symlink). Best effort: a sweep that fails leaves debris, no error. */
static void sweep(int dfd, const char *base)
{
	size_t pl = strlen(base) + 1 + strlen(TMP_TAG);
	char *prefix = malloc(pl + 1);
	int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!dir && fd >= 0)
		close(fd);
	if (!prefix || !dir) {
		free(prefix);
		if (dir)
			closedir(dir);
		return;
	}
	snprintf(prefix, pl + 1, ".%s" TMP_TAG, base);
	while ((e = readdir(dir))) {
		struct stat a, b;
		if (strncmp(e->d_name, prefix, pl) != 0)
			continue;
		int f = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		if (f < 0)
			continue;
		if (flock(f, LOCK_EX | LOCK_NB) == 0 && fstat(f, &a) == 0 &&
		    fstatat(dfd, e->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(a.st_mode) &&
		    a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			unlinkat(dfd, e->d_name, 0);
		close(f);
	}
	closedir(dir);
	free(prefix);
}

/* Makes dfd/".BASE.ferry-tmp-<16 hex>" exclusively into t (a planted name: another try). */
static int make_tmp(int dfd, const char *path, const char *base, struct ferry__tmpfile *t)
{
	t->dirfd = dfd;
	t->fd = -1;
	t->name[0] = '\0';
	if (strlen(base) + 1 + strlen(TMP_TAG) + 16 > 255 || strlen(base) >= sizeof(t->final))
		return ferry__error(-ENAMETOOLONG, "%s: name too long for a temporary beside it", path);
	snprintf(t->final, sizeof(t->final), "%s", base);
	for (int tries = 0; tries < 8; tries++) {
		unsigned char rnd[8];
		size_t got = 0;
		while (got < sizeof(rnd)) {
			ssize_t r = getrandom(rnd + got, sizeof(rnd) - got, 0);
			if (r < 0 && errno != EINTR)
				return ferry__error(-errno, "getrandom: %s", strerror(errno));
			got += r > 0 ? (size_t)r : 0;
		}
		int n = snprintf(t->name, sizeof(t->name), ".%s" TMP_TAG, base);
		for (size_t i = 0; i < sizeof(rnd); i++)
			n += snprintf(t->name + n, sizeof(t->name) - (size_t)n, "%02x", rnd[i]);
		int fd = ferry__create_excl(dfd, t->name, 0, 0644);
		if (fd >= 0) {
			t->fd = fd;
			return 0;
		}
		if (fd != -EEXIST) {
			t->name[0] = '\0';
			ferry__error_append("the temporary of %s", path);
			return fd;
		}
	}
	t->name[0] = '\0';
	return ferry__error(-EEXIST, "%s: 8 random temporary names beside it all exist", path);
}

int ferry_durable_create(const char *path, ferry_durable **out)
{
	const char *base;
	ferry_durable *d;
	int r;

	if (!out)
		return ferry__error(-EINVAL, "ferry_durable_create: NULL out");
	*out = NULL;
	if (!path || !*path)
		return ferry__error(-EINVAL, "ferry_durable_create: empty path");
	if (!(d = calloc(1, sizeof(*d))) || !(d->path = strdup(path))) {
		free(d);
		return ferry__error(-ENOMEM, "%s: durable file", path);
	}
	d->lock = -1;
	d->t.fd = -1;
	d->t.dirfd = -1;
	/* A directory the user names may be a symlink (/ckpt -> /mnt/nvme/ckpt); the file never is. */
	int dfd = ferry__dir_open_parent(d->path, FERRY__DIR_FOLLOW, &base);
	if (dfd < 0) {
		r = dfd; /* the detail names the directory */
		goto fail;
	}
	d->t.dirfd = dfd;
	sweep(dfd, base);
	if ((r = make_tmp(dfd, path, base, &d->t)))
		goto fail;
	size_t dl = (size_t)(base - d->path), n = dl + strlen(d->t.name) + 1;
	if (!(d->tmp_path = malloc(n))) {
		r = ferry__error(-ENOMEM, "%s: durable file", path);
		goto fail;
	}
	snprintf(d->tmp_path, n, "%.*s%s", (int)dl, d->path, d->t.name);
	/* The lock lives on a duplicate: ferry__tmp_commit closes t.fd before its rename, and a sweep
	 * between the two must not take the temporary. */
	d->lock = fcntl(d->t.fd, F_DUPFD_CLOEXEC, 0);
	if (d->lock < 0 || flock(d->lock, LOCK_EX)) {
		r = ferry__error(-errno, "flock(%s): %s", d->tmp_path, strerror(errno));
		goto fail;
	}
	*out = d;
	return 0;
fail:
	ferry_durable_destroy(d);
	return r;
}

int ferry_durable_open(ferry_durable *d, ferry_ctx *ctx, int flags, ferry_file **out)
{
	if (out)
		*out = NULL;
	if (!d || !ctx || !out)
		return ferry__error(-EINVAL, "ferry_durable_open: NULL argument");
	if (d->t.fd < 0)
		return ferry__error(-EBADF, "%s: durable file already committed or aborted", d->path);
	if ((flags & 0x3) == FERRY_O_RDONLY || (flags & ~(0x3 | FERRY_O_BUFFERED)))
		return ferry__error(-EINVAL, "%s: durable file opened with flags 0x%x (FERRY_O_WRONLY or "
					     "FERRY_O_RDWR, and FERRY_O_BUFFERED, only)", d->path, (unsigned)flags);
	return ferry__file_open_made(ctx, d->t.dirfd, d->t.name, d->t.fd, d->tmp_path, flags, out);
}

int64_t ferry_durable_pwrite(ferry_durable *d, const void *buf, size_t len, uint64_t offset)
{
	size_t done = 0;

	if (!d || (!buf && len))
		return ferry__error(-EINVAL, "ferry_durable_pwrite: NULL argument");
	if (d->t.fd < 0)
		return ferry__error(-EBADF, "%s: durable file already committed or aborted", d->path);
	while (done < len) {
		ssize_t w = pwrite(d->t.fd, (const char *)buf + done, len - done, (off_t)(offset + done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return ferry__error(w < 0 ? -errno : -EIO, "pwrite(%s, offset %llu, %zu bytes): %s",
					    d->tmp_path, (unsigned long long)(offset + done), len - done,
					    w < 0 ? strerror(errno) : "wrote nothing");
		done += (size_t)w;
	}
	return (int64_t)len;
}

const char *ferry_durable_tmp_path(const ferry_durable *d)
{
	return d && d->t.name[0] ? d->tmp_path : "";
}

int ferry_durable_commit(ferry_durable *d, int flags)
{
	if (!d)
		return ferry__error(-EINVAL, "ferry_durable_commit: NULL");
	if (flags & ~(FERRY_DURABLE_NOREPLACE | FERRY_DURABLE_NOSYNC))
		return ferry__error(-EINVAL, "%s: commit flags 0x%x", d->path, (unsigned)flags);
	if (d->t.fd < 0)
		return ferry__error(-EBADF, "%s: durable file already committed or aborted", d->path);
	int r = ferry__tmp_commit(&d->t, (flags & FERRY_DURABLE_NOREPLACE ? FERRY__DURABLE_NOREPLACE : 0) |
					       (flags & FERRY_DURABLE_NOSYNC
							? FERRY__DURABLE_NOSYNC | FERRY__DURABLE_NODIRSYNC
							: 0));
	if (r == -EEXIST)
		ferry__error_append("%s exists and is left as it is", d->path);
	if (d->t.name[0]) /* not renamed: the commit failed before it; the temporary goes */
		ferry__tmp_abort(&d->t);
	return r;
}

void ferry_durable_destroy(ferry_durable *d)
{
	if (!d)
		return;
	ferry__tmp_abort(&d->t); /* nothing once committed */
	if (d->lock >= 0)
		close(d->lock);
	if (d->t.dirfd >= 0)
		close(d->t.dirfd);
	free(d->tmp_path);
	free(d->path);
	free(d);
}
