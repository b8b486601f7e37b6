/*
 * ferry_pread_stream / ferry_pwrite_stream on the GPU machine: the transfer is ordered after work
 * already on the caller's stream and before work queued after it, and the call does not block.
 * The stream is kept busy by large memsets queued ahead of the read: if ferry copied into the
 * buffer before them, a memset queued just before the read would overwrite the data.
 */
#include <dlfcn.h>
#include <fcntl.h>

#include "ferry_test.h"
#include "ferry/ferry.h"
#include "ferry/gpu.h"

#define SIZE ((32u << 20) + 333u)

typedef int (*memset_async_t)(unsigned long long, unsigned char, size_t, void *);
typedef int (*memcpy_dtod_async_t)(unsigned long long, unsigned long long, size_t, void *);
typedef int (*stream_create_t)(void **, unsigned);
typedef int (*stream_sync_t)(void *);

int main(void)
{
	char why[512], path[512];
	void *lib, *stream;
	unsigned char *expect = malloc(SIZE), *back = malloc(SIZE);
	void *dst, *copy, *ballast;
	size_t ballast_len = 8ull << 30;

	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no usable GPU: %s", why);
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	T_ASSERT(lib);
	memset_async_t memset_async = (memset_async_t)dlsym(lib, "cuMemsetD8Async");
	memcpy_dtod_async_t dtod_async = (memcpy_dtod_async_t)dlsym(lib, "cuMemcpyDtoDAsync_v2");
	stream_create_t stream_create = (stream_create_t)dlsym(lib, "cuStreamCreate");
	stream_sync_t stream_sync = (stream_sync_t)dlsym(lib, "cuStreamSynchronize");
	T_ASSERT(memset_async && dtod_async && stream_create && stream_sync);

	snprintf(path, sizeof(path), "/dev/shm/ferry-stream.%d", (int)getpid());
	t_fill_pattern(expect, SIZE, 0, 77);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, expect, SIZE) == (ssize_t)SIZE);
	close(fd);

	ferry_ctx *ctx;
	ferry_file *f;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR, &f) == 0);
	T_ASSERT(ferry_gpu_malloc(0, SIZE, &dst) == 0);
	T_ASSERT(ferry_gpu_malloc(0, SIZE, &copy) == 0);
	T_ASSERT(ferry_gpu_malloc(0, ballast_len, &ballast) == 0);
	T_ASSERT(stream_create(&stream, 1 /* non-blocking */) == 0);

	for (int round = 0; round < 3; round++) {
		/* keep the stream busy for a while, then poison the destination, then the read */
		for (int i = 0; i < 20; i++)
			T_EQ_INT(memset_async((unsigned long long)(uintptr_t)ballast, (unsigned char)i, ballast_len, stream), 0);
		T_EQ_INT(memset_async((unsigned long long)(uintptr_t)dst, 0xAB, SIZE, stream), 0);
		ferry_req *r;
		T_EQ_INT(ferry_pread_stream(f, dst, SIZE, 0, stream, &r), 0);
		/* the call returned while the stream is still busy with the memsets ahead of it */
		int done_at_return = ferry_req_done(r);
		T_EQ_INT(done_at_return, 0);
		/* work after the read sees the data */
		T_EQ_INT(dtod_async((unsigned long long)(uintptr_t)copy, (unsigned long long)(uintptr_t)dst, SIZE, stream), 0);
		T_EQ_INT(stream_sync(stream), 0);
		T_EQ_INT(ferry_req_wait(r, -1), SIZE);
		ferry_req_destroy(r);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, dst, SIZE), 0);
		T_CHECK(memcmp(back, expect, SIZE) == 0); /* landed after the poisoning memset */
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, copy, SIZE), 0);
		T_CHECK(memcmp(back, expect, SIZE) == 0); /* the later copy saw it */
	}

	/* stream-ordered write: takes the device data as it is after the work queued before it */
	T_EQ_INT(memset_async((unsigned long long)(uintptr_t)dst, 0x5C, SIZE, stream), 0);
	ferry_req *w;
	T_EQ_INT(ferry_pwrite_stream(f, dst, SIZE, 0, stream, &w), 0);
	T_EQ_INT(memset_async((unsigned long long)(uintptr_t)dst, 0x00, SIZE, stream), 0); /* after: not written */
	T_EQ_INT(stream_sync(stream), 0);
	T_EQ_INT(ferry_req_wait(w, -1), SIZE);
	ferry_req_destroy(w);
	fd = open(path, O_RDONLY);
	T_ASSERT(fd >= 0 && read(fd, back, SIZE) == (ssize_t)SIZE);
	close(fd);
	size_t bad = 0;
	for (size_t i = 0; i < SIZE; i++)
		bad += back[i] != 0x5C;
	T_EQ_INT(bad, 0);

	/* host memory has nothing to order */
	ferry_req *h = NULL;
	T_EQ_INT(ferry_pread_stream(f, expect, 4096, 0, stream, &h), -EINVAL);
	T_CHECK(h == NULL);
	printf("stream-ordered read and write: ordered on the caller's stream, call returned before the data\n");
	ferry_gpu_free(dst);
	ferry_gpu_free(copy);
	ferry_gpu_free(ballast);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	unlink(path);
	free(expect);
	free(back);
	return t_result();
}
