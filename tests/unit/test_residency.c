/*
 * direct=auto reads what the page cache holds through it and the rest with O_DIRECT (DESIGN.md
 * decision 5); direct=on always goes to the device. Needs cachestat (Linux 6.5) and a file system
 * with O_DIRECT and a page cache that drops pages on request (not tmpfs).
 */
#include <fcntl.h>

#include "ferry_test.h"
#include "ferry/ferry.h"
#include "engine/engine.h"

#define SIZE (8u << 20)

static void read_all(const char *path, const char *direct, uint64_t *cached, uint64_t *direct_chunks)
{
	ferry_ctx *ctx;
	ferry_file *f;
	void *buf = ferry_alloc_aligned(SIZE);

	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "direct", direct) == 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	T_EQ_INT(ferry_pread(f, buf, SIZE, 0), SIZE);
	*cached = ferry_ctx_stat(ctx, FERRY_STAT_CACHED_CHUNKS);
	*direct_chunks = ferry_ctx_stat(ctx, FERRY_STAT_DIRECT_CHUNKS);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	ferry_free_aligned(buf, SIZE);
}

/* ferry__range_resident through a file of its own (the engine asks per open file) */
static bool resident(const char *path, uint64_t len)
{
	ferry_ctx *ctx;
	ferry_file *f;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	bool r = ferry__range_resident(f, 0, len);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	return r;
}

int main(void)
{
	char path[512];
	unsigned char *data = malloc(SIZE);
	uint64_t cached, direct;

	snprintf(path, sizeof(path), "%s/ferry-residency.%d", t_tmpdir(), (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && data);
	t_fill_pattern(data, SIZE, 0, 3);
	T_ASSERT(write(fd, data, SIZE) == (ssize_t)SIZE);
	fsync(fd);
	int dfd = open(path, O_RDONLY | O_DIRECT);
	if (dfd < 0) {
		unlink(path);
		T_SKIP("%s refuses O_DIRECT", t_tmpdir());
	}
	close(dfd);
	if (!resident(path, SIZE)) {
		unlink(path);
		T_SKIP("cachestat(2) is unavailable here (Linux < 6.5 or filtered): residency is not detected");
	}
	/* just written: resident, so direct=auto reads it through the cache */
	read_all(path, "auto", &cached, &direct);
	T_EQ_INT(cached, SIZE >> 20);
	T_EQ_INT(direct, 0);
	/* direct=on: always O_DIRECT */
	read_all(path, "on", &cached, &direct);
	T_EQ_INT(cached, 0);
	T_EQ_INT(direct, SIZE >> 20);
	/* dropped from the cache: direct=auto goes to the device */
	posix_fadvise(fd, 0, SIZE, POSIX_FADV_DONTNEED);
	if (resident(path, SIZE)) {
		printf("note: the file system kept the pages after POSIX_FADV_DONTNEED; the cold case is not checked\n");
	} else {
		read_all(path, "auto", &cached, &direct);
		T_EQ_INT(cached, 0);
		T_EQ_INT(direct, SIZE >> 20);
	}
	close(fd);
	unlink(path);
	free(data);
	return t_result();
}
