/*
 * Durable files: every file ferry creates goes through here. Names are resolved relative to a
 * directory descriptor opened once, never through a symlink in the last component; a new file is
 * created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW) under an unpredictable temporary name (random
 * bytes from getrandom), written, fsynced, renamed into place (or linked, refusing to replace),
 * and the directory fsynced. On failure only the temporary that was created is removed.
 *
 *   int dfd = ferry__dir_open(dir, 0);                      // or ferry__dir_open_parent(path, 0, &name)
 *   struct ferry__tmpfile t;
 *   r = ferry__tmp_create(dfd, "model.safetensors", 0644, 0, &t);   // t.fd: write, fallocate, O_DIRECT ...
 *   r = r ? r : ferry__tmp_commit(&t, 0);                     // fsync, renameat, fsync(dfd)
 *   if (r) ferry__tmp_abort(&t);                               // empties (if created) and unlinks t.name only
 *   close(dfd);
 *
 * Every function returns 0 (or a descriptor) or a negative code with ferry__error's detail.
 */
#ifndef FERRY_BASE_DURABLE_H
#define FERRY_BASE_DURABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Flags of ferry__tmp_commit and ferry__durable_write. */
#define FERRY__DURABLE_NOREPLACE 0x1 /* -EEXIST if the final name exists (RENAME_NOREPLACE or link) */
#define FERRY__DURABLE_NOSYNC 0x2    /* the caller has fsynced the file's data itself */
#define FERRY__DURABLE_NODIRSYNC 0x4 /* ferry__tmp_commit: the caller fsyncs the directory (or, for a
				      * benchmark of the non-durable cost, does not) */

/*
 * Opens dir as a directory (O_DIRECTORY|O_CLOEXEC), refusing a symlink as its last component
 * (O_NOFOLLOW) unless flags has FERRY__DIR_FOLLOW: a directory the user named may be a symlink
 * (/ckpt -> /mnt/nvme/ckpt); one that ferry made or walks (a step, recycle/) may not. fd or -errno.
 */
#define FERRY__DIR_FOLLOW 0x1
int ferry__dir_open(const char *dir, int flags);
/*
 * Opens the directory that holds path's last component ("." for a bare name) the same way and
 * points *name at that component inside path. fd or -errno (-EINVAL when path ends in '/').
 */
int ferry__dir_open_parent(const char *path, int flags, const char **name);
/* fsync of an open directory; what names it in the error. 0 or -errno. */
int ferry__fsync_dirfd(int dirfd, const char *what);

/*
 * openat(dirfd, name, O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC|O_WRONLY|extra, mode): refuses a name
 * that exists, a symlink included (-EEXIST), and a name with a '/' (-EINVAL). fd or -errno.
 */
int ferry__create_excl(int dirfd, const char *name, int extra, mode_t mode);

/* A temporary file in a directory, to be renamed over final. */
struct ferry__tmpfile {
	int dirfd; /* borrowed: the caller keeps it open until commit or abort */
	int fd;    /* -1 once closed */
	char name[256];       /* "<final>.tmp-<16 hex digits>", at most NAME_MAX bytes */
	char final[256 - 21]; /* room for ".tmp-" and the 16 digits */
	bool created; /* made by ferry__tmp_create (not adopted): ferry__tmp_abort may empty it */
};

/*
 * Creates "<final>.tmp-<random>" exclusively in dirfd, open for writing with extra open flags
 * (O_DIRECT, O_RDWR, ...). final is one name component. On success t->fd is open; on failure
 * nothing was created and t->fd is -1.
 */
int ferry__tmp_create(int dirfd, const char *final, mode_t mode, int extra, struct ferry__tmpfile *t);
/*
 * Takes the existing file from_dirfd/from (a recycled shard, in dirfd or another directory of the
 * same file system) as the temporary for final in dirfd: renames it, never replacing anything, to
 * a fresh "<final>.tmp-<random>" and opens it (O_NOFOLLOW, with
 * extra flags). Returns 1 (t as from ferry__tmp_create), 0 when from does not exist (nothing
 * done), or a negative code. The caller checks what it got (a plain file, one link) through t->fd
 * and calls ferry__tmp_abort to drop it.
 */
int ferry__tmp_adopt(int dirfd, int from_dirfd, const char *from, const char *final, int extra,
		     struct ferry__tmpfile *t);
/*
 * fsyncs the file (unless FERRY__DURABLE_NOSYNC), closes it, renames it to its final name
 * (FERRY__DURABLE_NOREPLACE: refusing to replace one) and fsyncs the directory. On failure before
 * the rename the temporary is left for ferry__tmp_abort; after it (the directory's fsync) the
 * file is in place and the error says the directory entry may not be durable.
 */
int ferry__tmp_commit(struct ferry__tmpfile *t, int flags);
/* Closes the file if open and unlinks the temporary it created (nothing else). Idempotent. */
void ferry__tmp_abort(struct ferry__tmpfile *t);

/* The whole protocol for a small file: len bytes of buf become dirfd/name, durably. */
int ferry__durable_write(int dirfd, const char *name, const void *buf, size_t len, mode_t mode, int flags);

/* Path forms, for callers that hold a path: each opens the directory once for the call, following
 * a symlinked directory as before (FERRY__DIR_FOLLOW); the file's own name is never followed. */
int ferry__fsync_dir(const char *dir);
int ferry__fsync_parent(const char *path);
/* Replaces path with text durably (mode 0644): the manifests, `latest`, indexes. */
int ferry__write_durable(const char *path, const char *text, size_t len);

#endif
