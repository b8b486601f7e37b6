/* Reading /sys, /proc, /run and /etc (or the fixture trees that stand in for them). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "tools/sys.h"

static const struct {
	const char *env;
	const char *dflt;
} roots[FERRY__ROOT__COUNT] = {
	[FERRY__ROOT_SYS] = {"FERRY_SYSFS_ROOT", "/sys"},
	[FERRY__ROOT_PROC] = {"FERRY_PROCFS_ROOT", "/proc"},
	[FERRY__ROOT_RUN] = {"FERRY_RUN_ROOT", "/run"},
	[FERRY__ROOT_ETC] = {"FERRY_ETC_ROOT", "/etc"},
};

/*
 * Read on every call, not cached: tests switch fixtures within one process. getenv is cheap next
 * to the open() that follows. (src/core's ferry__sysfs_root/ferry__procfs_root read the same two
 * variables.)
 */
const char *ferry__sys_root(int root)
{
	if (root < 0 || root >= FERRY__ROOT__COUNT)
		return "/nonexistent";
	const char *v = getenv(roots[root].env);
	return v && *v ? v : roots[root].dflt;
}

int ferry__sys_fixture_mode(void)
{
	const char *a = getenv("FERRY_SYSFS_ROOT"), *b = getenv("FERRY_PROCFS_ROOT");
	return (a && *a) || (b && *b);
}

char *ferry__sys_path(char *buf, size_t len, int root, const char *fmt, ...)
{
	int n = snprintf(buf, len, "%s/", ferry__sys_root(root));
	if (n < 0 || (size_t)n >= len)
		return buf;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + n, len - (size_t)n, fmt, ap);
	va_end(ap);
	return buf;
}

int ferry__sys_read(const char *path, char *buf, size_t len)
{
	if (!len)
		return -EINVAL;
	buf[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	size_t got = 0;
	while (got + 1 < len) {
		ssize_t n = read(fd, buf + got, len - 1 - got);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int err = -errno;
			close(fd);
			return err;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	while (got && isspace((unsigned char)buf[got - 1]))
		got--;
	buf[got] = '\0';
	/* Binary junk (a NUL inside) is cut at the NUL: callers treat the text as a C string. */
	return (int)strlen(buf);
}

int ferry__sys_read_ll(const char *path, long long *out)
{
	char buf[64], *end;
	int n = ferry__sys_read(path, buf, sizeof(buf));
	if (n < 0)
		return n;
	errno = 0;
	long long v = strtoll(buf, &end, 0);
	if (end == buf || errno)
		return -EINVAL;
	while (isspace((unsigned char)*end))
		end++;
	if (*end)
		return -EINVAL;
	*out = v;
	return 0;
}

int ferry__sys_exists(const char *path)
{
	struct stat st;
	if (lstat(path, &st) == 0)
		return 1;
	return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
}

const char *ferry__sys_reason(char *buf, size_t len, const char *path, int err)
{
	if (err == -EINVAL)
		snprintf(buf, len, "%s: unexpected content", path);
	else
		snprintf(buf, len, "%s: %s", path, strerror(-err));
	return buf;
}

int ferry__sys_bracketed(const char *text, char *out, size_t len)
{
	const char *a = strchr(text, '['), *b = a ? strchr(a, ']') : NULL;
	if (!a || !b || !len)
		return -EINVAL;
	size_t n = (size_t)(b - a - 1);
	if (n >= len)
		n = len - 1;
	memcpy(out, a + 1, n);
	out[n] = '\0';
	return 0;
}

int ferry__sys_online_cpus(void)
{
	char path[512], buf[1024];
	ferry__sys_path(path, sizeof(path), FERRY__ROOT_SYS, "devices/system/cpu/online");
	if (ferry__sys_read(path, buf, sizeof(buf)) <= 0)
		return 0;
	int count = 0;
	for (char *p = buf; *p;) {
		char *end;
		long a = strtol(p, &end, 10), b = a;
		if (end == p)
			return 0;
		if (*end == '-') {
			p = end + 1;
			b = strtol(p, &end, 10);
			if (end == p || b < a)
				return 0;
		}
		if (b - a > 65536)
			return 0;
		count += (int)(b - a + 1);
		p = end;
		if (*p == ',')
			p++;
		else if (*p)
			return 0;
	}
	return count;
}

/* --------------------------------------------------------------------- the library's utilities */

int ferry_tools_json_string(FILE *out, const char *s)
{
	struct ferry__sbuf b = {0};
	ferry__sbuf_json(&b, s);
	int r = b.oom ? -ENOMEM : fwrite(b.data, 1, b.len, out) == b.len ? 0 : -EIO;
	ferry__sbuf_free(&b);
	return r;
}

double ferry_tools_now_s(void)
{
	return (double)ferry__now_ns() * 1e-9;
}

void ferry_tools_drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fdatasync(fd);
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

uint32_t ferry_tools_crc32c(uint32_t crc, const void *buf, size_t len)
{
	return ferry__crc32c(crc, buf, len);
}
