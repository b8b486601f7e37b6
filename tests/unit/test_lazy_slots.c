/*
 * The workers' bounce slots cost nothing until a transfer uses them (issue 22): the io_uring
 * rings register them as fixed buffers slot by slot, at first use, instead of pinning every
 * worker's 16 slots at the context's start. Pinned pages show in /proc/self/status as VmPin
 * (io_uring accounts its registered buffers there). Reads that bounce through the slots still
 * land byte for byte, and a ring pins only the slots its transfers used.
 */
#include <fcntl.h>

#include "ferry_test.h"
#include "ferry/ferry.h"

/* kB of pinned memory of this process, or -1 where /proc does not say. */
static long vm_pin_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

int main(void)
{
	enum { THREADS = 2, SIZE = 8 << 20 };
	ferry_ctx *ctx;
	ferry_file *f;
	char path[4200], buf[64];
	static unsigned char want[SIZE], got[SIZE + 4096];

	if (vm_pin_kb() < 0)
		T_SKIP("/proc/self/status has no VmPin line");
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "2"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "backend", "io_uring"), 0);
	if (strcmp(ferry_ctx_backend(ctx), "io_uring") != 0)
		T_SKIP("io_uring cannot be used here: %s", ferry_last_error());
	T_CHECK(ferry_ctx_get(ctx, "register", buf, sizeof(buf)) > 0 && !strcmp(buf, "1"));
	T_CHECK(ferry_ctx_get(ctx, "slots", buf, sizeof(buf)) > 0 && !strcmp(buf, "16"));
	long before = vm_pin_kb();
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	long started = vm_pin_kb();
	/* before: every worker's 16 slots of 1 MiB + 128 KiB, 36 MiB for two workers */
	printf("VmPin: %ld kB before the start, %ld kB after it (%d workers x 16 slots: %d kB if registered at once)\n",
	       before, started, THREADS, THREADS * 16 * 1152);
	T_CHECK(started - before < 1152);

	/* an unaligned read of a file opened with O_DIRECT bounces through the workers' slots */
	snprintf(path, sizeof(path), "%s/ferry-lazy-slots-%d.bin", t_tmpdir(), (int)getpid());
	t_fill_pattern(want, SIZE, 0, 7);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, want, SIZE) == SIZE);
	close(fd);
	T_EQ_INT(ferry_ctx_set(ctx, "direct", "on"), 0);
	int r = ferry_file_open(ctx, path, FERRY_O_RDONLY, &f);
	if (r) {
		unlink(path);
		T_SKIP("%s refuses O_DIRECT: %s", t_tmpdir(), ferry_last_error());
	}
	size_t len = SIZE - 3 * 4096 - 100;
	T_EQ_INT(ferry_pread(f, got + 1, len, 1000), (long long)len);
	T_CHECK(memcmp(got + 1, want + 1000, len) == 0);
	long used = vm_pin_kb();
	printf("VmPin after an unaligned %zu-byte O_DIRECT read: %ld kB\n", len, used);
	/* the slots that carried chunks are registered now, and no more than the workers have */
	T_CHECK(used > started);
	T_CHECK(used - before <= THREADS * 16 * 1152);
	/* reused slots are not registered twice */
	T_EQ_INT(ferry_pread(f, got + 1, len, 1000), (long long)len);
	T_CHECK(memcmp(got + 1, want + 1000, len) == 0);
	T_CHECK(vm_pin_kb() - before <= THREADS * 16 * 1152);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	unlink(path);
	return t_result();
}
