/*
 * What a future costs the caller beyond its I/O (issue 22): after a warm-up, ferry_pread_async +
 * ferry_req_wait + ferry_req_destroy allocate nothing on the caller's thread (requests are reused,
 * their mutex and condition variable with them). Futures made on one thread and destroyed on others
 * (whose caches go when they exit) read the right bytes.
 *
 * calloc and malloc are counted by defining them here (the library is linked statically) and
 * calling glibc's own; sanitizers define them too, so under a sanitizer only the correctness part runs.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "ferry_test.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define COUNTING 0
#endif
#endif
#ifndef COUNTING
#define COUNTING 1
#endif

#if COUNTING
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_malloc(size_t);
static _Thread_local long allocs; /* on this thread */

void *calloc(size_t n, size_t size)
{
	allocs++;
	return __libc_calloc(n, size);
}

void *malloc(size_t size)
{
	allocs++;
	return __libc_malloc(size);
}
#endif

enum { PIECE = 4096, NPIECES = 256, WINDOW = 16 };
static unsigned char want[PIECE * NPIECES];

/* n futures, a window of WINDOW in flight, each piece compared with the file */
static void futures(ferry_file *f, int n, unsigned seed)
{
	static _Thread_local unsigned char buf[WINDOW][PIECE];
	ferry_req *w[WINDOW] = {0};
	unsigned off[WINDOW];

	for (int i = 0; i < n + WINDOW; i++) {
		int k = i % WINDOW;
		if (w[k]) {
			T_EQ_INT(ferry_req_wait(w[k], -1), PIECE);
			T_CHECK(memcmp(buf[k], want + off[k], PIECE) == 0);
			ferry_req_destroy(w[k]);
			w[k] = NULL;
		}
		if (i < n) {
			off[k] = (unsigned)((i * 37u + seed) % NPIECES) * PIECE;
			T_ASSERT(ferry_pread_async(f, buf[k], PIECE, off[k], &w[k]) == 0);
		}
	}
}

struct handoff {
	ferry_req *r[64];
	unsigned char buf[64][PIECE];
};

static void *destroy_all(void *arg)
{
	struct handoff *h = arg;
	for (int i = 0; i < 64; i++) {
		T_EQ_INT(ferry_req_wait(h->r[i], -1), PIECE);
		T_CHECK(memcmp(h->buf[i], want + (size_t)i * PIECE, PIECE) == 0);
		ferry_req_destroy(h->r[i]);
	}
	return NULL;
}

int main(void)
{
	char path[4200];
	ferry_ctx *ctx;
	ferry_file *f;

	snprintf(path, sizeof(path), "%s/req_costs.bin", t_tmpdir());
	t_fill_pattern(want, sizeof(want), 0, 22);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, want, sizeof(want)) == (ssize_t)sizeof(want));
	close(fd);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "threads", "2") == 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);

	futures(f, 64, 1); /* warm-up: workers started, requests made */
#if COUNTING
	long a0 = allocs;
	futures(f, 2000, 2);
	long per_1000 = (allocs - a0) / 2;
	printf("allocations on the caller's thread per 1000 futures: %ld\n", per_1000);
	T_CHECK(per_1000 < 10);
#else
	futures(f, 2000, 2);
	printf("allocation count not checked under a sanitizer (it defines calloc/malloc itself)\n");
#endif

	/* made here, waited and destroyed by other threads, which exit with requests cached */
	for (int round = 0; round < 3; round++) {
		struct handoff *h = calloc(1, sizeof(*h));
		pthread_t th;
		T_ASSERT(h != NULL);
		for (int i = 0; i < 64; i++)
			T_ASSERT(ferry_pread_async(f, h->buf[i], PIECE, (uint64_t)i * PIECE, &h->r[i]) == 0);
		T_ASSERT(pthread_create(&th, NULL, destroy_all, h) == 0);
		pthread_join(th, NULL);
		free(h);
	}
	/* a zero-length request from the cache is done at once */
	ferry_req *z;
	T_ASSERT(ferry_pread_async(f, want, 0, 0, &z) == 0);
	T_EQ_INT(ferry_req_done(z), 1);
	T_EQ_INT(ferry_req_wait(z, 0), 0);
	ferry_req_destroy(z);
	futures(f, 200, 3);

	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	unlink(path);
	return t_result();
}
