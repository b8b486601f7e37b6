/* Files: a buffered descriptor always, an O_DIRECT one where the file system accepts it. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gpu/shim.h"
#include "engine/engine.h"
#include "engine/remote.h"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

/* The direct-I/O alignment the kernel reports (statx STATX_DIOALIGN, Linux 6.1), else 4 KiB, which
 * satisfies every logical block size up to 4 KiB. */
static void dio_alignment(int fd, uint32_t *offset_align, uint32_t *mem_align)
{
	struct statx stx;

	*offset_align = 4096;
	*mem_align = 4096;
	memset(&stx, 0, sizeof(stx));
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
		*offset_align = stx.stx_dio_offset_align;
		*mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : stx.stx_dio_offset_align;
		return;
	}
	struct stat st;
	int bs;
	if (fstat(fd, &st) == 0 && S_ISBLK(st.st_mode) && ioctl(fd, BLKSSZGET, &bs) == 0 && bs > 0) {
		*offset_align = (uint32_t)bs;
		*mem_align = (uint32_t)bs;
	}
}

/*
 * Opens dirfd/name (path: how errors name it); with `same` (a descriptor of the file the caller
 * made), the file opened must be that file: the descriptors are opened relative to the directory,
 * never through a symlink, and checked against it (no window between making a file and opening it
 * in which its name could be pointed elsewhere).
 */
static int file_open(ferry_ctx *ctx, int dirfd, const char *name, const char *path, int flags, int same,
		     ferry_file **out)
{
	struct ferry_file *f;
	struct stat st;
	int oflags = O_CLOEXEC | (same >= 0 ? O_NOFOLLOW : 0), acc = flags & 0x3;

	*out = NULL;
	if (!ctx || !path || !name)
		return ferry__error(-EINVAL, "ferry_file_open: NULL context or path");
	if (acc == FERRY_O_WRONLY)
		oflags |= O_WRONLY;
	else if (acc == FERRY_O_RDWR)
		oflags |= O_RDWR;
	else
		oflags |= O_RDONLY;
	f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path))) {
		free(f);
		return ferry__error(-ENOMEM, "opening %s", path);
	}
	f->ctx = ctx;
	f->fd_direct = -1;
	f->slot = -1;
	f->writable = acc != FERRY_O_RDONLY;
	f->gds_state = FERRY__GDS_UNPROBED;
	pthread_mutex_init(&f->gds_mu, NULL);
	f->fd_buf = openat(dirfd, name, oflags | (flags & FERRY_O_CREAT ? O_CREAT : 0) |
					       (flags & FERRY_O_TRUNC ? O_TRUNC : 0) |
					       (flags & FERRY_O_EXCL ? O_EXCL : 0),
			   0644);
	if (f->fd_buf < 0) {
		int err = -errno;
		free(f->path);
		free(f);
		return ferry__error(err, "open(%s, %s)", path,
				    acc == FERRY_O_RDONLY ? "read" : acc == FERRY_O_WRONLY ? "write" : "read/write");
	}
	if (fstat(f->fd_buf, &st) == 0 && S_ISDIR(st.st_mode)) {
		close(f->fd_buf);
		free(f->path);
		free(f);
		return ferry__error(-EISDIR, "open(%s): it is a directory, not a file", path);
	}
	struct stat made;
	if (same >= 0 && (fstat(same, &made) || made.st_dev != st.st_dev || made.st_ino != st.st_ino)) {
		close(f->fd_buf);
		free(f->path);
		free(f);
		return ferry__error(-ESTALE, "open(%s): not the file ferry made there (replaced since)", path);
	}
	dio_alignment(f->fd_buf, &f->block_size, &f->mem_align);
	struct statfs sfs;
	f->in_memory = fstatfs(f->fd_buf, &sfs) == 0 && (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC);
	if (ctx->cfg.direct == FERRY__DIRECT_OFF || (flags & FERRY_O_BUFFERED)) {
		snprintf(f->direct_note, sizeof(f->direct_note), "O_DIRECT off (%s)",
			 flags & FERRY_O_BUFFERED ? "FERRY_O_BUFFERED" : "direct=off");
	} else {
		f->fd_direct = openat(dirfd, name, oflags | O_DIRECT);
		if (f->fd_direct >= 0 && same >= 0 &&
		    (fstat(f->fd_direct, &made) || made.st_dev != st.st_dev || made.st_ino != st.st_ino)) {
			close(f->fd_direct);
			close(f->fd_buf);
			free(f->path);
			free(f);
			return ferry__error(-ESTALE, "open(%s, O_DIRECT): not the file ferry made there", path);
		}
		if (f->fd_direct < 0) {
			int err = -errno;
			snprintf(f->direct_note, sizeof(f->direct_note),
				 "the file system refused O_DIRECT (%s): reads go through the page cache",
				 strerror(-err));
			if (ctx->cfg.direct == FERRY__DIRECT_ON) {
				close(f->fd_buf);
				free(f->path);
				free(f);
				return ferry__error(err, "open(%s, O_DIRECT) with direct=on", path);
			}
			ferry__stat_add(ctx, FERRY_STAT_FALLBACKS, 1);
		}
	}
	ferry__file_register(ctx, f);
	*out = f;
	return 0;
}

int ferry_file_open(ferry_ctx *ctx, const char *path, int flags, ferry_file **out)
{
	if (ferry__is_url(path)) /* s3://, http(s):// (docs/REMOTE.md) */
		return ferry__remote_file_open(ctx, path, flags, out);
	return file_open(ctx, AT_FDCWD, path, path, flags, -1, out);
}

int ferry__file_open_made(ferry_ctx *ctx, int dirfd, const char *name, int made_fd, const char *path,
			  int flags, ferry_file **out)
{
	if (made_fd < 0)
		return ferry__error(-EINVAL, "%s: no descriptor of the file made", path);
	return file_open(ctx, dirfd, name, path, flags, made_fd, out);
}

void ferry_file_destroy(ferry_file *f)
{
	if (!f)
		return;
	if (f->remote) {
		ferry__remote_file_destroy(f);
		return;
	}
	ferry__file_unregister(f->ctx, f);
	ferry__file_gds_close(f);
	pthread_mutex_destroy(&f->gds_mu);
	if (f->fd_direct >= 0)
		close(f->fd_direct);
	close(f->fd_buf);
	free(f->path);
	free(f);
}

int64_t ferry_file_size(ferry_file *f)
{
	struct stat st;

	if (f->remote)
		return (int64_t)ferry__remote_size(f->remote);
	if (fstat(f->fd_buf, &st) < 0)
		return ferry__error(-errno, "fstat(%s)", f->path);
	if (S_ISBLK(st.st_mode)) {
		uint64_t sz;
		if (ioctl(f->fd_buf, BLKGETSIZE64, &sz) < 0)
			return ferry__error(-errno, "ioctl(%s, BLKGETSIZE64)", f->path);
		return (int64_t)sz;
	}
	return st.st_size;
}

uint32_t ferry_file_block_size(const ferry_file *f)
{
	return f->block_size;
}

uint32_t ferry_file_mem_align(const ferry_file *f)
{
	return f->mem_align;
}

int ferry_file_is_direct(const ferry_file *f)
{
	return f->fd_direct >= 0;
}

const char *ferry_file_path(const ferry_file *f)
{
	return f->path;
}

int ferry_file_sync(ferry_file *f, int full)
{
	if (f->remote) /* a remote object written: the commit that makes it visible */
		return ferry__remote_commit(f->remote);
	if ((full ? fsync(f->fd_buf) : fdatasync(f->fd_buf)) < 0)
		return ferry__error(-errno, "%s(%s)", full ? "fsync" : "fdatasync", f->path);
	return 0;
}

int ferry_file_truncate(ferry_file *f, uint64_t size)
{
	if (ftruncate(f->fd_buf, (off_t)size) < 0)
		return ferry__error(-errno, "ftruncate(%s, %llu)", f->path, (unsigned long long)size);
	return 0;
}

int ferry_file_path_info(ferry_file *f, char *buf, size_t len)
{
	ferry_ctx *ctx = f->ctx;
	const char *backend = ferry_ctx_backend(ctx);
	char gds[512] = "";
	int n;

	if (f->remote)
		return ferry__remote_info(f->remote, buf, len);
	pthread_mutex_lock(&f->gds_mu);
	if (f->gds_state == FERRY__GDS_UNPROBED && f->gds_note[0])
		snprintf(gds, sizeof(gds), "; device memory: %s; %s", ferry__path_name(FERRY__P_PIPE), f->gds_note);
	else if (f->gds_state == FERRY__GDS_UNPROBED)
		snprintf(gds, sizeof(gds), "; GDS not probed yet (no transfer to device memory so far)");
	else
		snprintf(gds, sizeof(gds), "; device memory: %s; %s",
			 f->gds_state == FERRY__GDS_NATIVE ? "GDS" : ferry__path_name(FERRY__P_PIPE), f->gds_note);
	pthread_mutex_unlock(&f->gds_mu);
	if (f->fd_direct >= 0)
		n = snprintf(buf, len,
			     "%s: O_DIRECT (offset alignment %u, memory alignment %u; unaligned "
			     "pieces through aligned bounce slots), backend %s%s%s",
			     f->path, f->block_size, f->mem_align, backend,
			     f->slot >= 0 ? ", registered file" : "", gds);
	else
		n = snprintf(buf, len, "%s: buffered (%s), backend %s%s%s", f->path, f->direct_note, backend,
			     f->slot >= 0 ? ", registered file" : "", gds);
	return n;
}

int ferry__file_fd(const ferry_file *f)
{
	return f->fd_buf;
}
