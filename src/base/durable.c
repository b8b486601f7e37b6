/* Durable files (durable.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/durable.h"

/*
 * 1 when path's last component is a symlink that the kernel's fs.protected_symlinks would refuse
 * to follow: in a sticky, world-writable directory (/tmp, /dev/shm, a shared scratch), owned by
 * neither the follower nor the directory's owner: one planted by another user to redirect our
 * writes. Refused whatever the sysctl says (containers often have it off). *owner: the link's.
 */
static int planted_link(const char *path, uid_t *owner)
{
	char p[PATH_MAX];
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n >= sizeof(p))
		return 0;
	memcpy(p, path, n);
	p[n] = '\0';
	struct stat l, d;
	if (lstat(p, &l) || !S_ISLNK(l.st_mode))
		return 0;
	char *slash = strrchr(p, '/');
	if (!slash)
		strcpy(p, ".");
	else if (slash == p)
		p[1] = '\0';
	else
		*slash = '\0';
	if (stat(p, &d) || !(d.st_mode & S_ISVTX) || !(d.st_mode & S_IWOTH))
		return 0;
	*owner = l.st_uid;
	return l.st_uid != geteuid() && l.st_uid != d.st_uid;
}

int ferry__dir_open(const char *dir, int flags)
{
	uid_t owner;
	if ((flags & FERRY__DIR_FOLLOW) && planted_link(dir, &owner))
		return ferry__error(-ELOOP, "open directory %s: a symlink of another user (uid %u) in a sticky, "
				    "world-writable directory: refused, as fs.protected_symlinks does",
				    dir, (unsigned)owner);
	int nofollow = flags & FERRY__DIR_FOLLOW ? 0 : O_NOFOLLOW;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | nofollow | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		/* O_NOFOLLOW on a symlink gives ELOOP, with O_DIRECTORY ENOTDIR on some kernels */
		return ferry__error(-e, "open directory %s: %s%s", dir, strerror(e),
				    e == ELOOP ? " (a symlink: ferry does not follow one here)" : "");
	}
	return fd;
}

int ferry__dir_open_parent(const char *path, int flags, const char **name)
{
	const char *slash = strrchr(path, '/');
	if (!slash) {
		*name = path;
		return ferry__dir_open(".", flags);
	}
	if (!slash[1])
		return ferry__error(-EINVAL, "%s: names a directory, not a file", path);
	char dir[PATH_MAX];
	size_t n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(dir))
		return ferry__error(-ENAMETOOLONG, "%s: path too long", path);
	memcpy(dir, path, n);
	dir[n] = '\0';
	*name = slash + 1;
	return ferry__dir_open(dir, flags);
}

int ferry__fsync_dirfd(int dirfd, const char *what)
{
	if (fsync(dirfd)) {
		int e = errno;
		return ferry__error(-e, "fsync(directory %s): %s", what, strerror(e));
	}
	return 0;
}

/* O_WRONLY unless extra asks for O_RDWR: O_WRONLY|O_RDWR is access mode 3, which can neither read nor
 * write (ftruncate and a shared writable mmap fail with EINVAL). */
static int write_mode(int extra)
{
	return (extra & O_ACCMODE) == O_RDWR ? 0 : O_WRONLY;
}

int ferry__create_excl(int dirfd, const char *name, int extra, mode_t mode)
{
	if (!*name || strchr(name, '/'))
		return ferry__error(-EINVAL, "create \"%s\": not a single name", name);
	int fd;
	do
		fd = openat(dirfd, name, write_mode(extra) | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra, mode);
	while (fd < 0 && errno == EINTR);
	if (fd < 0) {
		int e = errno;
		return ferry__error(-e, "create %s: %s", name, strerror(e));
	}
	return fd;
}

static int random_hex(char *out, size_t digits)
{
	unsigned char b[16];
	size_t need = (digits + 1) / 2, got = 0;
	if (need > sizeof(b))
		return -EINVAL;
	while (got < need) {
		ssize_t r = getrandom(b + got, need - got, 0);
		if (r < 0 && errno != EINTR)
			return ferry__error(-errno, "getrandom: %s", strerror(errno));
		got += r > 0 ? (size_t)r : 0;
	}
	for (size_t i = 0; i < digits; i++)
		out[i] = "0123456789abcdef"[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
	out[digits] = '\0';
	return 0;
}

static int tmp_init(int dirfd, const char *final, struct ferry__tmpfile *t)
{
	t->dirfd = dirfd;
	t->fd = -1;
	t->name[0] = '\0';
	t->created = false;
	if (!*final || strchr(final, '/'))
		return ferry__error(-EINVAL, "\"%s\": not a single name", final);
	if (strlen(final) + 5 + 16 > NAME_MAX)
		return ferry__error(-ENAMETOOLONG, "%s: name too long for a temporary beside it", final);
	snprintf(t->final, sizeof(t->final), "%s", final);
	return 0;
}

/* Sets t->name to a fresh random temporary name for t->final. */
static int tmp_name(struct ferry__tmpfile *t)
{
	char rnd[17];
	int r = random_hex(rnd, 16);
	if (!r)
		snprintf(t->name, sizeof(t->name), "%s.tmp-%s", t->final, rnd);
	return r;
}

int ferry__tmp_create(int dirfd, const char *final, mode_t mode, int extra, struct ferry__tmpfile *t)
{
	int r = tmp_init(dirfd, final, t);
	/* A collision (EEXIST) with 64 random bits means someone planted the name: try others. */
	for (int tries = 0; !r && tries < 8; tries++) {
		if ((r = tmp_name(t)))
			break;
		int fd = ferry__create_excl(dirfd, t->name, extra, mode);
		if (fd >= 0) {
			t->fd = fd;
			t->created = true;
			return 0;
		}
		r = fd == -EEXIST ? 0 : fd;
	}
	t->name[0] = '\0';
	return r ? r : ferry__error(-EEXIST, "%s: 8 random temporary names beside it all exist", final);
}

static int rename_noreplace(int from_dirfd, const char *from, int to_dirfd, const char *to);

int ferry__tmp_adopt(int dirfd, int from_dirfd, const char *from, const char *final, int extra,
		     struct ferry__tmpfile *t)
{
	int r = tmp_init(dirfd, final, t);
	for (int tries = 0; !r && tries < 8; tries++) {
		if ((r = tmp_name(t)))
			break;
		r = rename_noreplace(from_dirfd, from, dirfd, t->name);
		if (r == -EEXIST) { /* the fresh name exists: planted */
			r = 0;
			continue;
		}
		if (r) {
			t->name[0] = '\0';
			return r == -ENOENT ? 0 : ferry__error(r, "rename(%s, a temporary for %s): %s", from, final, strerror(-r));
		}
		t->fd = openat(dirfd, t->name, write_mode(extra) | O_NOFOLLOW | O_CLOEXEC | extra);
		if (t->fd < 0) {
			r = ferry__error(-errno, "open %s (was %s): %s", t->name, from, strerror(errno));
			ferry__tmp_abort(t);
			return r;
		}
		return 1;
	}
	t->name[0] = '\0';
	return r ? r : ferry__error(-EEXIST, "%s: 8 random temporary names beside it all exist", final);
}

/* rename without replacing: renameat2 where the file system has it, else link and unlink. */
static int rename_noreplace(int from_dirfd, const char *from, int to_dirfd, const char *to)
{
	if (renameat2(from_dirfd, from, to_dirfd, to, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
		return -errno;
	if (linkat(from_dirfd, from, to_dirfd, to, 0))
		return -errno;
	unlinkat(from_dirfd, from, 0); /* both names are the file now: the temporary's is debris at worst */
	return 0;
}

int ferry__tmp_commit(struct ferry__tmpfile *t, int flags)
{
	if (t->fd < 0 || !t->name[0])
		return ferry__error(-EINVAL, "%s: commit of a temporary that is not open", t->final);
	if (!(flags & FERRY__DURABLE_NOSYNC) && fsync(t->fd))
		return ferry__error(-errno, "fsync(%s): %s", t->name, strerror(errno));
	int fd = t->fd;
	t->fd = -1;
	if (close(fd))
		return ferry__error(-errno, "close(%s): %s", t->name, strerror(errno));
	int r = flags & FERRY__DURABLE_NOREPLACE ? rename_noreplace(t->dirfd, t->name, t->dirfd, t->final)
						 : renameat(t->dirfd, t->name, t->dirfd, t->final) ? -errno : 0;
	if (r)
		return ferry__error(r, "rename(%s, %s): %s", t->name, t->final, strerror(-r));
	t->name[0] = '\0'; /* no longer ours to remove */
	if (flags & FERRY__DURABLE_NODIRSYNC)
		return 0;
	r = ferry__fsync_dirfd(t->dirfd, t->final);
	if (r)
		ferry__error_append("%s is in place, its directory entry may not be durable", t->final);
	return r;
}

/*
 * A temporary this process created is emptied before its name goes: the unlink frees its blocks
 * only with the file's last reference, which the kernel may hold a moment after the caller's
 * writes completed (see drop_prefixed in src/ckpt/ckpt.c). An adopted one (a recycled shard that
 * was refused: another link, another process reading it) is only unlinked.
 */
void ferry__tmp_abort(struct ferry__tmpfile *t)
{
	if (t->fd >= 0) {
		if (t->name[0] && t->created)
			(void)!ftruncate(t->fd, 0);
		close(t->fd);
		t->fd = -1;
	}
	if (t->name[0]) {
		unlinkat(t->dirfd, t->name, 0);
		t->name[0] = '\0';
	}
}

int ferry__durable_write(int dirfd, const char *name, const void *buf, size_t len, mode_t mode, int flags)
{
	struct ferry__tmpfile t;
	int r = ferry__tmp_create(dirfd, name, mode, 0, &t);
	if (r)
		return r;
	for (size_t done = 0; done < len && !r;) {
		ssize_t n = write(t.fd, (const char *)buf + done, len - done);
		if (n < 0 && errno != EINTR)
			r = ferry__error(-errno, "write(%s): %s", t.name, strerror(errno));
		else if (n > 0)
			done += (size_t)n;
	}
	if (!r)
		r = ferry__tmp_commit(&t, flags & ~FERRY__DURABLE_NOSYNC);
	ferry__tmp_abort(&t);
	return r;
}

int ferry__fsync_dir(const char *dir)
{
	int fd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (fd < 0)
		return fd;
	int r = ferry__fsync_dirfd(fd, dir);
	close(fd);
	return r;
}

int ferry__fsync_parent(const char *path)
{
	const char *name;
	int fd = ferry__dir_open_parent(path, FERRY__DIR_FOLLOW, &name);
	if (fd < 0)
		return fd;
	int r = ferry__fsync_dirfd(fd, path);
	close(fd);
	return r;
}

int ferry__write_durable(const char *path, const char *text, size_t len)
{
	const char *name;
	int fd = ferry__dir_open_parent(path, FERRY__DIR_FOLLOW, &name);
	if (fd < 0)
		return fd;
	int r = ferry__durable_write(fd, name, text, len, 0644, 0);
	close(fd);
	return r;
}
