/* Path -> mount (from mountinfo) -> block device stack (from sysfs). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "tools/sys.h"

/* mountinfo escapes space, tab, newline and backslash as \ooo (fs/proc_namespace.c, mangle()). */
static void unescape(const char *in, char *out, size_t len)
{
	size_t o = 0;
	while (*in && o + 1 < len) {
		if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
		    in[3] >= '0' && in[3] <= '7') {
			out[o++] = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
			in += 4;
		} else {
			out[o++] = *in++;
		}
	}
	out[o] = '\0';
}

static void copy_field(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src ? src : "");
}

/*
 * One line: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
 * (Documentation/filesystems/proc.rst, /proc/<pid>/mountinfo). Returns 0 or -EINVAL.
 */
static int parse_line(char *line, struct ferry__mount *m)
{
	char *save = NULL, *tok[6];
	int n = 0;
	while (n < 6) {
		char *t = strtok_r(n ? NULL : line, " ", &save);
		if (!t)
			break;
		tok[n++] = t;
	}
	if (n < 6)
		return -EINVAL;
	/* tok: id, parent, maj:min, root, point, options; then optional fields up to "-". */
	char *colon = strchr(tok[2], ':');
	if (!colon)
		return -EINVAL;
	char *end;
	unsigned long maj = strtoul(tok[2], &end, 10);
	if (end != colon)
		return -EINVAL;
	unsigned long min = strtoul(colon + 1, &end, 10);
	if (*end || maj > 0xfffff || min > 0xfffff)
		return -EINVAL;
	m->major = (unsigned)maj;
	m->minor = (unsigned)min;
	unescape(tok[3], m->root, sizeof(m->root));
	unescape(tok[4], m->point, sizeof(m->point));
	copy_field(m->options, sizeof(m->options), tok[5]);
	char *t;
	while ((t = strtok_r(NULL, " ", &save)) && strcmp(t, "-"))
		;
	if (!t)
		return -EINVAL;
	char *fstype = strtok_r(NULL, " ", &save), *source = strtok_r(NULL, " ", &save);
	char *super = strtok_r(NULL, " ", &save);
	if (!fstype)
		return -EINVAL;
	unescape(fstype, m->fstype, sizeof(m->fstype));
	unescape(source ? source : "", m->source, sizeof(m->source));
	copy_field(m->super, sizeof(m->super), super);
	return 0;
}

/* 1 if mount point mp contains path p (both canonical, absolute). */
static int contains(const char *mp, const char *p)
{
	size_t n = strlen(mp);
	if (n == 1 && mp[0] == '/')
		return p[0] == '/';
	return !strncmp(mp, p, n) && (p[n] == '/' || p[n] == '\0');
}

int ferry__sys_find_mount(const char *path, struct ferry__mount *out)
{
	int fixture = ferry__sys_fixture_mode();
	char canon[PATH_MAX], mi[512];
	int have_dev = 0;
	dev_t dev = 0;
	if (!path || path[0] == '\0')
		return ferry__error(-EINVAL, "doctor: empty path");
	if (fixture) {
		if (path[0] != '/')
			return ferry__error(-EINVAL, "doctor: fixture mode needs an absolute path, not '%s'", path);
		snprintf(canon, sizeof(canon), "%s", path);
	} else {
		struct stat st;
		if (stat(path, &st) < 0)
			return ferry__error(-errno, "stat(%s): %s", path, strerror(errno));
		if (!realpath(path, canon))
			return ferry__error(-errno, "realpath(%s): %s", path, strerror(errno));
		dev = st.st_dev;
		have_dev = 1;
	}
	ferry__sys_path(mi, sizeof(mi), FERRY__ROOT_PROC, "self/mountinfo");
	/* O_NONBLOCK: a FIFO planted in a fixture (or a broken /proc) must not hang the doctor. */
	int fd = open(mi, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
	if (!f) {
		int err = errno;
		if (fd >= 0)
			close(fd);
		return ferry__error(-err, "open(%s): %s", mi, strerror(err));
	}
	char *line = NULL;
	size_t cap = 0;
	size_t best_len = 0;
	int found = 0, best_devmatch = 0;
	struct ferry__mount m;
	while (getline(&line, &cap, f) > 0) {
		line[strcspn(line, "\n")] = '\0';
		if (parse_line(line, &m) || m.point[0] != '/' || !contains(m.point, canon))
			continue;
		size_t len = strlen(m.point);
		int devmatch = have_dev && makedev(m.major, m.minor) == dev;
		/* Longest mount point wins; among equals, a later line (mounted over the earlier)
		 * wins; a st_dev match beats a longer point only when it is bind-mounted oddly. */
		if (!found || (devmatch && !best_devmatch) ||
		    (devmatch == best_devmatch && len >= best_len)) {
			*out = m;
			best_len = len;
			best_devmatch = devmatch;
			found = 1;
		}
	}
	free(line);
	fclose(f);
	if (!found)
		return ferry__error(-ENOENT, "doctor: no mount in %s contains %s", mi, canon);
	/* btrfs and overlay report an anonymous st_dev that differs from mountinfo's; keep both
	 * views honest by preferring the device stat gave when it names a block device. */
	if (have_dev && !best_devmatch) {
		char p[512];
		ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "dev/block/%u:%u", major(dev), minor(dev));
		if (ferry__sys_exists(p) == 1) {
			out->major = major(dev);
			out->minor = minor(dev);
		}
	}
	return 0;
}

int ferry__sys_option(const char *list, const char *key, char *val, size_t len)
{
	size_t klen = strlen(key);
	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		if (n >= klen && !strncmp(p, key, klen) && (n == klen || p[klen] == '=')) {
			if (val && len) {
				size_t vn = n == klen ? 0 : n - klen - 1;
				if (vn >= len)
					vn = len - 1;
				memcpy(val, p + klen + (n == klen ? 0 : 1), vn);
				val[vn] = '\0';
			}
			return 1;
		}
		p = end ? end + 1 : NULL;
	}
	return 0;
}

/* ---------------------------------------------------------------------------- block devices */

/* Turns an absolute path under the sysfs root into a root-relative one ("devices/..."). */
static int sys_relative(const char *abs, char *out, size_t len)
{
	char root[PATH_MAX];
	if (!realpath(ferry__sys_root(FERRY__ROOT_SYS), root))
		return -errno;
	size_t n = strlen(root);
	if (strncmp(abs, root, n) || (abs[n] != '/' && abs[n] != '\0'))
		return -EXDEV; /* a link that leaves the tree: a broken fixture, or a bind mount */
	snprintf(out, len, "%s", abs[n] == '/' ? abs + n + 1 : "");
	return 0;
}

static int resolve(const char *rel_link, char *out, size_t len)
{
	char p[PATH_MAX], abs[PATH_MAX];
	ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s", rel_link);
	if (!realpath(p, abs))
		return -errno;
	return sys_relative(abs, out, len);
}

static const char *base(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

static int add_dev(struct ferry__blk *out, int max, int *n, const char *sysdir, int parent, int depth);

static int add_slaves(struct ferry__blk *out, int max, int *n, int self, int depth)
{
	char p[PATH_MAX];
	ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/slaves", out[self].sysdir);
	DIR *d = opendir(p);
	if (!d)
		return 0; /* no slaves directory: a leaf (or a partial /sys) */
	struct dirent *e;
	char names[FERRY__BLK_MAX][64];
	int k = 0;
	while ((e = readdir(d)) && k < FERRY__BLK_MAX) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(names[k++], sizeof(names[0]), "%s", e->d_name);
	}
	closedir(d);
	/* readdir order is arbitrary; members are reported in name order. */
	qsort(names, (size_t)k, sizeof(names[0]), (int (*)(const void *, const void *))strcmp);
	for (int i = 0; i < k; i++) {
		char rel[PATH_MAX], dir[PATH_MAX];
		snprintf(rel, sizeof(rel), "%s/slaves/%s", out[self].sysdir, names[i]);
		if (resolve(rel, dir, sizeof(dir)))
			continue;
		out[self].leaf = 0;
		add_dev(out, max, n, dir, self, depth + 1);
	}
	return 0;
}

static int add_dev(struct ferry__blk *out, int max, int *n, const char *sysdir, int parent, int depth)
{
	if (*n >= max || depth > 8)
		return 0;
	char p[PATH_MAX];
	int self = *n;
	struct ferry__blk *b = &out[self];
	memset(b, 0, sizeof(*b));
	snprintf(b->sysdir, sizeof(b->sysdir), "%s", sysdir);
	snprintf(b->name, sizeof(b->name), "%s", base(sysdir));
	b->parent = parent;
	b->leaf = 1;
	(*n)++;
	if (ferry__sys_exists(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/partition", sysdir)) == 1) {
		snprintf(b->kind, sizeof(b->kind), "part");
		/* A partition's disk is its parent directory in sysfs. */
		char disk[PATH_MAX];
		snprintf(disk, sizeof(disk), "%s", sysdir);
		char *slash = strrchr(disk, '/');
		if (slash && slash != disk) {
			*slash = '\0';
			b->leaf = 0;
			add_dev(out, max, n, disk, self, depth + 1);
		}
		return 0;
	}
	if (ferry__sys_exists(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/md", sysdir)) == 1)
		snprintf(b->kind, sizeof(b->kind), "md");
	else if (ferry__sys_exists(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/dm", sysdir)) == 1)
		snprintf(b->kind, sizeof(b->kind), "dm");
	else
		snprintf(b->kind, sizeof(b->kind), "disk");
	return add_slaves(out, max, n, self, depth);
}

int ferry__sys_block_stack(unsigned maj, unsigned min, struct ferry__blk *out, int max)
{
	char rel[64], dir[PATH_MAX];
	snprintf(rel, sizeof(rel), "dev/block/%u:%u", maj, min);
	int err = resolve(rel, dir, sizeof(dir));
	if (err == -ENOENT)
		return 0;
	if (err)
		return err;
	int n = 0;
	add_dev(out, max, &n, dir, -1, 0);
	return n;
}

static int is_bdf(const char *s)
{
	/* dddd:bb:dd.f */
	unsigned dom, bus, dev, fn;
	char tail;
	return strlen(s) == 12 && sscanf(s, "%4x:%2x:%2x.%1x%c", &dom, &bus, &dev, &fn, &tail) == 4;
}

int ferry__sys_pci_of(const char *sysdir, char *bdf, size_t len)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", sysdir);
	int found = 0;
	char *save = NULL;
	for (char *t = strtok_r(tmp, "/", &save); t; t = strtok_r(NULL, "/", &save))
		if (is_bdf(t)) {
			snprintf(bdf, len, "%s", t);
			found = 1; /* keep going: the last one is the endpoint, not a bridge */
		}
	return found ? 0 : -ENOENT;
}
