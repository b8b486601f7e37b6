/* Doctor checks of one path: its file system, mount options, O_DIRECT, and the block devices under it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/sys.h"

#define OK FERRY_VERDICT_OK
#define WARN FERRY_VERDICT_WARN
#define FAIL FERRY_VERDICT_FAIL
#define UNKNOWN FERRY_VERDICT_UNKNOWN

/* File systems cuFile can drive with GPUDirect Storage (NVIDIA GDS release notes, "supported file systems"). */
static const char *const gds_fs[] = {"ext4", "xfs", "nfs", "nfs4", "lustre", "wekafs", "gpfs",
				     "beegfs", "exafs", NULL};

static int in_list(const char *s, const char *const *list)
{
	for (; *list; list++)
		if (!strcmp(s, *list))
			return 1;
	return 0;
}

static void check_fs(ferry_report *r, const char *subj, const struct ferry__mount *m, const char *mi)
{
	char src[600];
	snprintf(src, sizeof(src), "%s (%s)", mi, m->point);
	if (in_list(m->fstype, gds_fs))
		ferry__report_addf(r, "fs.type", subj, OK, "xfs or ext4 (or a GDS-capable network fs)", src, "",
				   "%s on %s, mounted at %s", m->fstype, m->source, m->point);
	else if (!strncmp(m->fstype, "fuse", 4))
		ferry__report_addf(r, "fs.type", subj, WARN, "xfs or ext4 (or a GDS-capable network fs)", src,
				   "copy hot data to a local xfs/ext4 or NVMe scratch volume",
				   "%s on %s: FUSE cannot do GPUDirect Storage and usually refuses O_DIRECT; "
				   "reads go through the page cache and the FUSE daemon", m->fstype, m->source);
	else
		ferry__report_addf(r, "fs.type", subj, WARN, "xfs or ext4 (or a GDS-capable network fs)", src,
				   "use an xfs or ext4 volume for GPUDirect Storage",
				   "%s on %s, mounted at %s: not a file system cuFile supports for GDS "
				   "(ferry uses the bounce path)", m->fstype, m->source, m->point);

	/* relatime (the default since 2.6.30) writes atime at most once a day per file: harmless
	 * for training reads. strictatime turns every read into an inode write. */
	char any[8];
	if (ferry__sys_option(m->options, "noatime", any, sizeof(any)))
		ferry__report_add(r, "fs.atime", subj, OK, "noatime", "noatime (or relatime)", src, "");
	else if (ferry__sys_option(m->options, "relatime", any, sizeof(any)))
		ferry__report_add(r, "fs.atime", subj, OK, "relatime (atime written at most once a day per file)",
				  "noatime (or relatime)", src, "");
	else {
		char fix[600];
		snprintf(fix, sizeof(fix), "sudo mount -o remount,noatime %s (and add noatime in /etc/fstab)", m->point);
		ferry__report_addf(r, "fs.atime", subj, WARN, "noatime (or relatime)", src, fix,
				   "strictatime (%s): every read updates the inode", m->options);
	}

	if (strncmp(m->fstype, "nfs", 3))
		return;
	static const struct {
		const char *id, *key;
	} sizes[] = {{"fs.nfs.rsize", "rsize"}, {"fs.nfs.wsize", "wsize"}};
	for (size_t i = 0; i < 2; i++) {
		char v[32];
		if (!ferry__sys_option(m->super, sizes[i].key, v, sizeof(v))) {
			ferry__report_addf(r, sizes[i].id, subj, UNKNOWN, ">= 1048576", src, "",
					   "%s not among the super block options '%s'", sizes[i].key, m->super);
			continue;
		}
		long long n = atoll(v);
		char fix[700];
		snprintf(fix, sizeof(fix), "sudo mount -o remount,%s=1048576 %s (the server may cap it; "
			 "check its nfsd max_block_size)", sizes[i].key, m->point);
		/* 1 MiB is the Linux client's maximum (NFS_MAX_FILE_IO_SIZE); each RPC below it costs a
		 * round trip, so 32 KiB needs 32x the RPCs of 1 MiB for a stream. */
		ferry__report_addf(r, sizes[i].id, subj, n >= 1048576 ? OK : WARN, ">= 1048576", src,
				   n >= 1048576 ? "" : fix, "%s=%lld", sizes[i].key, n);
	}
	char v[32];
	if (ferry__sys_option(m->super, "noac", v, sizeof(v)) || ferry__sys_option(m->options, "noac", v, sizeof(v)))
		ferry__report_add(r, "fs.nfs.actimeo", subj, WARN, "noac: every access revalidates attributes with the server",
				  "attribute caching on (actimeo >= 3; read-only data: actimeo=600)", src,
				  "remount without noac (for read-only datasets, -o actimeo=600)");
	else if (ferry__sys_option(m->super, "actimeo", v, sizeof(v)) ||
		 ferry__sys_option(m->super, "acregmin", v, sizeof(v)))
		ferry__report_addf(r, "fs.nfs.actimeo", subj, atoll(v) >= 3 ? OK : WARN,
				   "attribute caching on (actimeo >= 3; read-only data: actimeo=600)", src,
				   atoll(v) >= 3 ? "" : "remount with -o actimeo=600 for read-only datasets",
				   "attribute cache minimum %s s", v);
	else
		ferry__report_add(r, "fs.nfs.actimeo", subj, OK, "default attribute caching (acregmin=3, acregmax=60)",
				  "attribute caching on (actimeo >= 3; read-only data: actimeo=600)", src, "");
	long long nc = ferry__sys_option(m->super, "nconnect", v, sizeof(v)) ? atoll(v) : 1;
	ferry__report_addf(r, "fs.nfs.nconnect", subj, nc >= 2 ? OK : WARN, ">= 2 TCP connections (one saturates near one core)",
			   src, nc >= 2 ? "" : "mount with -o nconnect=8 (Linux >= 5.3)", "nconnect=%lld", nc);
}

/* A temporary name in dir that does not exist yet (the file is created with O_EXCL). */
static void temp_name(char *buf, size_t len, const char *dir)
{
	static unsigned counter;
	snprintf(buf, len, "%s/.ferry-doctor-%ld-%u", dir, (long)getpid(), counter++);
}

int ferry__sys_probe_file(const char *path, char *file, size_t flen, int *created, char *how, size_t hlen)
{
	struct stat st;
	*created = 0;
	if (stat(path, &st) < 0) {
		int err = -errno;
		snprintf(how, hlen, "stat(%s): %s", path, strerror(-err));
		return err;
	}
	/* opening a FIFO blocks until a writer comes: only regular files, directories and block
	 * devices are probed */
	if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISCHR(st.st_mode)) {
		snprintf(how, hlen, "%s is a %s, not a regular file or directory: not probed", path,
			 S_ISFIFO(st.st_mode) ? "FIFO (named pipe)" : S_ISSOCK(st.st_mode) ? "socket" : "character device");
		return -ENXIO;
	}
	if (S_ISDIR(st.st_mode) && access(path, W_OK) == 0) {
		/* The one file the doctor ever writes: created with O_EXCL, 4 KiB, removed at once. */
		temp_name(file, flen, path);
		int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
		if (fd < 0) {
			int err = -errno;
			/* O_CREAT may have made the file before O_DIRECT was refused. */
			if (err == -EINVAL)
				unlink(file);
			snprintf(how, hlen, "creating a temporary file in %s: %s", path, strerror(-err));
			return err;
		}
		*created = 1;
		snprintf(how, hlen, "temporary file %s, removed afterwards", file);
		return fd;
	}
	if (S_ISDIR(st.st_mode)) {
		/* Not writable: use a file that is already there. */
		DIR *d = opendir(path);
		struct dirent *e;
		int tries = 0;
		file[0] = '\0';
		while (d && (e = readdir(d)) && tries++ < 256) {
			struct stat fs;
			snprintf(file, flen, "%s/%s", path, e->d_name);
			if (stat(file, &fs) == 0 && S_ISREG(fs.st_mode) && access(file, R_OK) == 0)
				break;
			file[0] = '\0';
		}
		if (d)
			closedir(d);
		if (!file[0]) {
			snprintf(how, hlen, "%s is not writable and holds no readable file: the doctor does not create "
				 "files where it may not; pass a file", path);
			return -ENOENT;
		}
	} else {
		snprintf(file, flen, "%s", path);
	}
	int fd = open(file, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		snprintf(how, hlen, "open(%s, O_RDONLY|O_DIRECT): %s", file, strerror(-err));
		return err;
	}
	snprintf(how, hlen, "existing file %s, read only", file);
	return fd;
}

static void check_odirect(ferry_report *r, const char *subj, const char *path)
{
	const char *expected = "O_DIRECT accepted (needed by GDS and ferry's direct reads)";
	if (ferry__sys_fixture_mode()) {
		ferry__report_add(r, "fs.odirect", subj, UNKNOWN,
				  "fixture mode: O_DIRECT is probed only on the live machine", expected, "", "");
		return;
	}
	char file[PATH_MAX + 64], how[PATH_MAX + 256], src[PATH_MAX + 128];
	int created;
	int fd = ferry__sys_probe_file(path, file, sizeof(file), &created, how, sizeof(how));
	snprintf(src, sizeof(src), "open(O_DIRECT) + 4 KiB %s", created ? "pwrite" : "pread");
	int err = fd < 0 ? -fd : 0;
	if (fd >= 0) {
		void *buf = NULL;
		if (posix_memalign(&buf, 4096, 4096) == 0) {
			memset(buf, 0, 4096);
			ssize_t n = created ? pwrite(fd, buf, 4096, 0) : pread(fd, buf, 4096, 0);
			if (n < 0)
				err = errno;
			free(buf);
		}
		close(fd);
		if (created)
			unlink(file);
	}
	if (!err)
		ferry__report_addf(r, "fs.odirect", subj, OK, expected, src, "", "accepted (%s)", how);
	else if (err == EINVAL || err == EOPNOTSUPP)
		ferry__report_addf(r, "fs.odirect", subj, WARN, expected, src,
				   "use a file system that supports O_DIRECT (xfs, ext4, nfs)",
				   "refused: %s (%s); ferry reads buffered here (direct=auto) and GDS cannot run",
				   strerror(err), how);
	else
		ferry__report_addf(r, "fs.odirect", subj, UNKNOWN, expected, src, "", "%s", how);
}

/* ---------------------------------------------------------------------------- block devices */

static void dev_subject(const struct ferry__blk *b, char *out, size_t len)
{
	char p[PATH_MAX], name[128];
	if (!strcmp(b->kind, "dm") &&
	    ferry__sys_read(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/dm/name", b->sysdir), name,
			    sizeof(name)) > 0)
		snprintf(out, len, "%s (%s)", b->name, name);
	else
		snprintf(out, len, "%s", b->name);
}

static int is_nvme(const char *name)
{
	return !strncmp(name, "nvme", 4);
}

static int is_virtio(const char *name)
{
	return name[0] == 'v' && name[1] == 'd';
}

/* Reads <sysdir>/<file>; on failure adds an unknown check with the reason and returns the error. */
static int read_attr(ferry_report *r, const char *id, const char *subj, const struct ferry__blk *b,
		     const char *file, const char *expected, char *buf, size_t len, char *src, size_t srclen)
{
	ferry__sys_path(src, srclen, FERRY__ROOT_SYS, "%s/%s", b->sysdir, file);
	int n = ferry__sys_read(src, buf, len);
	if (n < 0) {
		char why[PATH_MAX + 64];
		ferry__report_add(r, id, subj, UNKNOWN, ferry__sys_reason(why, sizeof(why), src, n), expected, src, "");
	}
	return n < 0 ? n : 0;
}

static void check_leaf(ferry_report *r, const struct ferry__blk *b, int ncpu)
{
	char subj[160], buf[256], src[PATH_MAX], fix[512];
	dev_subject(b, subj, sizeof(subj));
	long long rot = -1;
	if (read_attr(r, "block.rotational", subj, b, "queue/rotational", "0 (solid state)", buf, sizeof(buf),
		      src, sizeof(src)) == 0) {
		rot = atoll(buf);
		if (rot == 0)
			ferry__report_add(r, "block.rotational", subj, OK, "0 (solid state)", "0 (solid state)", src, "");
		else if (is_virtio(b->name))
			ferry__report_add(r, "block.rotational", subj, OK,
					  "1, but virtio-blk reports 1 unless the host says otherwise: the medium is unknown",
					  "0 (solid state)", src, "");
		else
			ferry__report_add(r, "block.rotational", subj, WARN,
					  "1: a spinning disk, seek-bound (~200 MB/s, ~200 IOPS): not a GPU data path",
					  "0 (solid state)", src, "move training data and checkpoints to NVMe");
	}
	/* A virtio disk's queue feeds the host's: scheduling twice only adds latency, so it is
	 * judged like a solid-state drive whatever rotational says. */
	int ssd = rot == 0 || is_nvme(b->name) || is_virtio(b->name);

	const char *sched_expect = ssd ? "none or mq-deadline" : "mq-deadline or bfq";
	if (read_attr(r, "block.scheduler", subj, b, "queue/scheduler", sched_expect, buf, sizeof(buf), src,
		      sizeof(src)) == 0) {
		char cur[64];
		if (ferry__sys_bracketed(buf, cur, sizeof(cur)))
			snprintf(cur, sizeof(cur), "%s", buf); /* "none" alone when only one choice */
		int ok = ssd ? (!strcmp(cur, "none") || !strcmp(cur, "mq-deadline"))
			     : (!strcmp(cur, "mq-deadline") || !strcmp(cur, "bfq") || !strcmp(cur, "kyber"));
		snprintf(fix, sizeof(fix), "echo %s | sudo tee /sys/block/%s/queue/scheduler (persist with a udev rule: "
			 "ACTION==\"add|change\", KERNEL==\"%s\", ATTR{queue/scheduler}=\"%s\")",
			 ssd ? "none" : "mq-deadline", b->name, b->name, ssd ? "none" : "mq-deadline");
		ferry__report_addf(r, "block.scheduler", subj, ok ? OK : WARN, sched_expect, src, ok ? "" : fix,
				   ok ? "%s" : ssd ? "%s: costs CPU per request and caps IOPS on solid-state drives"
						   : "%s: no request sorting for a seeking disk", cur);
	}

	if (read_attr(r, "block.nr_requests", subj, b, "queue/nr_requests", ">= 64", buf, sizeof(buf), src,
		      sizeof(src)) == 0) {
		long long n = atoll(buf);
		snprintf(fix, sizeof(fix), "echo 256 | sudo tee /sys/block/%s/queue/nr_requests", b->name);
		/* Fewer requests than ferry keeps in flight (threads x queue_depth, 64 by default) makes
		 * submitters sleep in the block layer waiting for a tag. */
		ferry__report_addf(r, "block.nr_requests", subj, n >= 64 ? OK : WARN, ">= 64", src, n >= 64 ? "" : fix,
				   "%lld", n);
	}

	ferry__sys_path(src, sizeof(src), FERRY__ROOT_SYS, "%s/mq", b->sysdir);
	DIR *d = opendir(src);
	if (!d) {
		char why[PATH_MAX + 64];
		ferry__report_add(r, "block.queues", subj, UNKNOWN, ferry__sys_reason(why, sizeof(why), src, -errno),
				  ">= 2 hardware queues", src, "");
	} else {
		int q = 0;
		struct dirent *e;
		while ((e = readdir(d)))
			if (e->d_name[0] != '.')
				q++;
		closedir(d);
		int single = q <= 1 && ncpu > 1 && rot != 1;
		if (is_virtio(b->name) && q <= 1 && ncpu > 1)
			single = 1;
		snprintf(fix, sizeof(fix), is_virtio(b->name)
				  ? "give the VM more virtio queues (QEMU: -device virtio-blk-pci,num-queues=%d)"
				  : "check the queues the controller granted: dmesg | grep -i 'queues'",
			 ncpu > 0 ? ncpu : 4);
		ferry__report_addf(r, "block.queues", subj, single ? WARN : OK, ">= 2 hardware queues (one per CPU is ideal)",
				   src, single ? fix : "", "%d hardware queue%s, %d CPUs online%s", q, q == 1 ? "" : "s", ncpu,
				   single ? ": every CPU submits through one queue" : "");
	}
}

static void check_readahead(ferry_report *r, const struct ferry__blk *b)
{
	char subj[160], buf[64], src[PATH_MAX], fix[256];
	dev_subject(b, subj, sizeof(subj));
	if (read_attr(r, "block.read_ahead_kb", subj, b, "queue/read_ahead_kb", ">= 128", buf, sizeof(buf), src,
		      sizeof(src)))
		return;
	long long kb = atoll(buf);
	snprintf(fix, sizeof(fix), "echo 1024 | sudo tee /sys/block/%s/queue/read_ahead_kb", b->name);
	/* 128 KiB is the kernel default (VM_READAHEAD_PAGES); below it a buffered stream issues
	 * many small reads and stalls between them. O_DIRECT and GDS reads ignore read-ahead. */
	ferry__report_addf(r, "block.read_ahead_kb", subj, kb >= 128 ? OK : WARN, ">= 128", src, kb >= 128 ? "" : fix,
			   kb >= 128 ? "%lld" : "%lld: buffered streaming reads come in small pieces", kb);
}

static void check_md(ferry_report *r, const struct ferry__blk *stack, int n, int self)
{
	const struct ferry__blk *b = &stack[self];
	char subj[160], level[32], chunk[32], src[PATH_MAX], members[512] = "";
	dev_subject(b, subj, sizeof(subj));
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (stack[i].parent != self)
			continue;
		/* A member that is a partition: name the partition. */
		size_t used = strlen(members);
		snprintf(members + used, sizeof(members) - used, "%s%s", k ? ", " : "", stack[i].name);
		k++;
	}
	if (read_attr(r, "block.raid", subj, b, "md/level", "raid0 (or raid1/raid10) with all members present",
		      level, sizeof(level), src, sizeof(src)))
		return;
	long long chunk_b = -1, degraded = 0;
	char p[PATH_MAX];
	if (ferry__sys_read(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/md/chunk_size", b->sysdir), chunk,
			    sizeof(chunk)) > 0)
		chunk_b = atoll(chunk);
	ferry__sys_read_ll(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "%s/md/degraded", b->sysdir), &degraded);
	int verdict = OK;
	const char *why = "";
	if (degraded > 0) {
		verdict = FAIL;
		why = ": degraded";
	} else if (!strcmp(level, "raid5") || !strcmp(level, "raid6")) {
		verdict = WARN;
		why = ": parity RAID turns checkpoint writes into read-modify-write";
	} else if (chunk_b >= 0 && chunk_b < 65536 && !strcmp(level, "raid0")) {
		verdict = WARN;
		why = ": chunks under 64 KiB split ferry's chunk I/Os across members";
	}
	char chunk_txt[48];
	if (chunk_b >= 0)
		snprintf(chunk_txt, sizeof(chunk_txt), "%lld KiB", chunk_b / 1024);
	else
		snprintf(chunk_txt, sizeof(chunk_txt), "unknown");
	ferry__report_addf(r, "block.raid", subj, verdict, "raid0 (or raid1/raid10) with all members present", src,
			   verdict == FAIL ? "cat /proc/mdstat; mdadm --detail /dev/<md>" : "",
			   "%s, %d member%s (%s), chunk %s%s%s", level, k, k == 1 ? "" : "s", members, chunk_txt,
			   degraded > 0 ? ", degraded" : "", why);
}

static void add_drive(const struct ferry__blk *b, struct ferry__pcidev *drives, int *nd, int max)
{
	char bdf[32], p[PATH_MAX];
	if (ferry__sys_pci_of(b->sysdir, bdf, sizeof(bdf)))
		return;
	for (int i = 0; i < *nd; i++)
		if (!strcmp(drives[i].bdf, bdf))
			return;
	if (*nd >= max)
		return;
	struct ferry__pcidev *d = &drives[(*nd)++];
	memset(d, 0, sizeof(*d));
	snprintf(d->bdf, sizeof(d->bdf), "%s", bdf);
	snprintf(d->name, sizeof(d->name), "%s", b->name);
	long long node;
	d->numa = -1;
	if (ferry__sys_read_ll(ferry__sys_path(p, sizeof(p), FERRY__ROOT_SYS, "bus/pci/devices/%s/numa_node", bdf),
			       &node) == 0) {
		d->numa = (int)node;
		d->numa_known = 1;
	}
}

void ferry__doctor_path(ferry_report *r, const char *path, struct ferry__pcidev *drives, int *ndrives,
			int maxdrives)
{
	struct ferry__mount m;
	char mi[512];
	ferry__sys_path(mi, sizeof(mi), FERRY__ROOT_PROC, "self/mountinfo");
	if (ferry__sys_find_mount(path, &m)) {
		ferry__report_add(r, "path.resolve", path, FAIL, ferry_last_error(), "an existing path on a mounted file system",
				  mi, "");
		return;
	}
	const char *subj = path;
	check_fs(r, subj, &m, mi);
	check_odirect(r, subj, path);

	struct ferry__blk stack[FERRY__BLK_MAX];
	int n = ferry__sys_block_stack(m.major, m.minor, stack, FERRY__BLK_MAX);
	char src[128];
	snprintf(src, sizeof(src), "%s/dev/block/%u:%u", ferry__sys_root(FERRY__ROOT_SYS), m.major, m.minor);
	if (n < 0) {
		char why[600];
		ferry__report_add(r, "block.stack", subj, UNKNOWN, ferry__sys_reason(why, sizeof(why), src, n),
				  "the block devices under the path", src, "");
		return;
	}
	if (n == 0) {
		const char *expect = "the block devices under the path";
		if (m.major == 0)
			ferry__report_addf(r, "block.stack", subj, OK, expect, src, "",
					   "no local block device (%s, device %u:%u)", m.fstype, m.major, m.minor);
		else
			ferry__report_addf(r, "block.stack", subj, UNKNOWN, expect, src, "",
					   "device %u:%u not in %s/dev/block (a container with a partial /sys?)",
					   m.major, m.minor, ferry__sys_root(FERRY__ROOT_SYS));
		return;
	}
	char chain[1024] = "";
	for (int i = 0; i < n; i++) {
		size_t used = strlen(chain);
		snprintf(chain + used, sizeof(chain) - used, "%s%s (%s)", i ? (stack[i].parent == i - 1 ? " -> " : ", ")
									    : "", stack[i].name, stack[i].kind);
	}
	ferry__report_addf(r, "block.stack", subj, OK, "the block devices under the path", src, "", "%s", chain);

	int ncpu = ferry__sys_online_cpus();
	/* Read-ahead belongs to the device the file system sits on (a partition shares its disk's queue). */
	int top = 0;
	while (top < n - 1 && !strcmp(stack[top].kind, "part"))
		top++;
	check_readahead(r, &stack[top]);
	for (int i = 0; i < n; i++) {
		if (!strcmp(stack[i].kind, "md"))
			check_md(r, stack, n, i);
		if (stack[i].leaf && strcmp(stack[i].kind, "part")) {
			check_leaf(r, &stack[i], ncpu);
			add_drive(&stack[i], drives, ndrives, maxdrives);
		}
	}
}
