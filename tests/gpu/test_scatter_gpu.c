/*
 * The scatter kernel on a real GPU (issue 22; src/gpu/scatter.c). The embedded PTX must load here
 * (the driver JIT-compiles it); then:
 *   1. launches on their own: pieces of 1 B to 2 MiB at unaligned places in registered (mapped)
 *      host memory, to unaligned places in device memory: every byte lands, nothing between the
 *      pieces is written;
 *   2. the engine: small random reads of a page-cache-resident file into device memory, through the
 *      batch API and through futures, compared with the file byte for byte: random sizes 1 B to
 *      2 MiB (those of 256 KiB or less go through gathers, hence the kernel), unaligned file offsets
 *      and device addresses, pieces that end at EOF, cross it (short) or start past it (0 bytes,
 *      nothing written); then the same with pieces of 1 B to 16 KiB, where the kernel must have
 *      copied pieces (ferry__scatter_pieces; gathers of larger pieces go to the copy engine).
 *   test_scatter_gpu [pieces]   (default 600 per round)
 *   test_scatter_gpu bench      the cost of one gather of 16 pieces of 4 KiB and of 64 KiB, side by
 *                               side: the kernel's launch, the cuMemcpyBatchAsync it replaces and
 *                               one cuMemcpyHtoDAsync of the same bytes (the floor); CPU microseconds
 *                               in the enqueueing call and wall microseconds to the end of the
 *                               copies, medians of 300; TABLE rows (bench/gpu-small-reads.sh).
 */
#include <time.h>
#include <fcntl.h>

#include "ferry_test.h"
#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "gpu/ring.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"

#define FILE_SIZE ((64u << 20) + 777u)
#define GAP 0xee

static uint64_t seed = 2222;

/* 1 B to 2 MiB, most of them small: a third up to 4 KiB, a third up to 256 KiB, the rest up to 2 MiB. */
static bool small_only; /* pieces of 1 B-16 KiB: gathers the kernel takes (under 32 KiB a piece) */

static size_t piece_len(void)
{
	if (small_only)
		return 1 + t_rand(&seed) % (16 << 10);
	switch (t_rand(&seed) % 3) {
	case 0:
		return 1 + t_rand(&seed) % 4096;
	case 1:
		return 1 + t_rand(&seed) % (256 << 10);
	default:
		return 1 + t_rand(&seed) % (2 << 20);
	}
}

static void compare(const unsigned char *got, const unsigned char *want, size_t n, const char *what)
{
	if (memcmp(got, want, n) == 0)
		return;
	size_t i = 0;
	while (got[i] == want[i])
		i++;
	fprintf(stderr, "%s: device bytes differ at %zu of %zu (0x%02x, expected 0x%02x)\n", what, i, n,
		got[i], want[i]);
	t_failures++;
}

static void launches(void)
{
	enum { N = 150 };
	const size_t room = (size_t)N * ((2 << 20) + 16);
	struct ferry__scatter_piece p[N];
	struct ferry__ring_gpu *r;
	unsigned char *host = ferry_alloc_aligned(room), *want = malloc(room), *back = malloc(room);
	void *d = NULL;
	uint64_t hp = 0;
	unsigned made = 0;

	T_ASSERT(host && want && back);
	T_EQ_INT(ferry__cuda_set_device(0), 0);
	T_EQ_INT(ferry__cuda()->MemHostRegister(host, room, FERRY__CU_MEMHOSTREGISTER_PORTABLE |
						FERRY__CU_MEMHOSTREGISTER_DEVICEMAP), 0);
	T_EQ_INT(ferry__scatter_host_ptr(0, host, &hp), 0);
	T_ASSERT(ferry_gpu_malloc(0, room, &d) == 0);
	T_ASSERT(ferry__ring_create(0, 2, 0, &r) == 0);
	t_fill_pattern(host, room, 0, 9);
	memset(want, GAP, room);
	T_EQ_INT(ferry_gpu_memcpy_htod(d, want, room), 0);
	size_t soff = 0, doff = 0;
	for (int i = 0; i < N; i++) {
		size_t len = i < 16 ? (size_t)i + 1 : piece_len();
		soff += t_rand(&seed) % 16;
		doff += t_rand(&seed) % 16;
		p[i] = (struct ferry__scatter_piece){hp + soff, (uint64_t)(uintptr_t)d + doff, len};
		memcpy(want + doff, host + soff, len);
		soff += len;
		doff += len;
	}
	T_EQ_INT(ferry__scatter_launch(0, ferry__ring_stream(r), p, N, &made), 0);
	T_EQ_INT(made, (N + FERRY__SCATTER_MAX - 1) / FERRY__SCATTER_MAX);
	T_EQ_INT(ferry__ring_drain(r), 0);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, room), 0);
	compare(back, want, room, "launches");
	printf("launches: %d pieces, %zu bytes, in %u launches: %s\n", N, doff, made,
	       memcmp(back, want, room) ? "DIFFER" : "every byte in place");
	ferry__ring_destroy(r);
	T_EQ_INT(ferry_gpu_free(d), 0);
	T_EQ_INT(ferry__cuda()->MemHostUnregister(host), 0);
	ferry_free_aligned(host, room);
	free(want);
	free(back);
}

struct piece {
	uint64_t off;
	size_t len, doff, got;
};

static void engine(const char *file, const unsigned char *data, int n, bool futures)
{
	struct piece *p = calloc((size_t)n, sizeof(*p));
	ferry_ctx *ctx;
	ferry_file *f;
	void *d = NULL;

	T_ASSERT(p);
	size_t doff = 0;
	for (int i = 0; i < n; i++) {
		size_t len = piece_len();
		uint64_t off;
		if (i % 50 == 1)
			off = FILE_SIZE - len; /* ends at EOF */
		else if (i % 50 == 2)
			off = FILE_SIZE - len / 2; /* crosses it: short */
		else if (i % 50 == 3)
			off = FILE_SIZE + t_rand(&seed) % 4096; /* past it: 0 bytes */
		else
			off = t_rand(&seed) % FILE_SIZE;
		doff += t_rand(&seed) % 16;
		p[i] = (struct piece){off, len, doff, off >= FILE_SIZE ? 0 : off + len > FILE_SIZE ? FILE_SIZE - off : len};
		doff += len;
	}
	size_t room = doff + 16;
	unsigned char *want = malloc(room), *back = malloc(room);
	T_ASSERT(want && back);
	memset(want, GAP, room);
	for (int i = 0; i < n; i++)
		memcpy(want + p[i].doff, data + (p[i].off < FILE_SIZE ? p[i].off : 0), p[i].got);
	T_ASSERT(ferry_gpu_malloc(0, room, &d) == 0);
	memset(back, GAP, room);
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, room), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_file_open(ctx, file, FERRY_O_RDONLY, &f) == 0);
	uint64_t launched0 = ferry__scatter_pieces();
	if (futures) {
		ferry_req **r = calloc((size_t)n, sizeof(*r));
		T_ASSERT(r);
		for (int i = 0; i < n; i++)
			T_EQ_INT(ferry_pread_async(f, (char *)d + p[i].doff, p[i].len, p[i].off, &r[i]), 0);
		for (int i = 0; i < n; i++) {
			T_EQ_INT(ferry_req_wait(r[i], -1), (ssize_t)p[i].got);
			ferry_req_destroy(r[i]);
		}
		free(r);
	} else {
		ferry_batch *b;
		T_ASSERT(ferry_batch_create(ctx, &b) == 0);
		for (int i = 0; i < n; i++)
			T_EQ_INT(ferry_batch_add_read(b, f, p[i].off, p[i].len, (char *)d + p[i].doff), i);
		T_EQ_INT(ferry_batch_submit(b), 0);
		T_CHECK(ferry_batch_wait(b, -1) > 0); /* the short pieces */
		for (int i = 0; i < n; i++)
			T_EQ_INT(ferry_batch_result(b, (size_t)i), (ssize_t)p[i].got);
		ferry_batch_destroy(b);
	}
	uint64_t launched = ferry__scatter_pieces() - launched0;
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, room), 0);
	compare(back, want, room, futures ? "futures" : "batch");
	printf("%s: %d pieces, %zu bytes: %s; %llu pieces copied by the kernel\n", futures ? "futures" : "batch", n,
	       doff, memcmp(back, want, room) ? "DIFFER" : "every byte in place", (unsigned long long)launched);
	if (small_only) /* mixed sizes: gathers whose mean piece is 32 KiB or more go to the copy engine */
		T_CHECK(launched > 0);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(d), 0);
	free(want);
	free(back);
	free(p);
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* One gather of 16 pieces of `size` from slots 1 MiB apart (as the engine's) three ways. */
static void bench_gather(size_t size)
{
	enum { P = 16, ROUNDS = 300, KERNEL = 0, BATCH = 1, FLOOR = 2 };
	const size_t stride = 1 << 20, room = P * stride;
	static const char *const names[] = {"kernel launch", "cuMemcpyBatchAsync", "one cuMemcpyHtoDAsync"};
	unsigned char *host = ferry_alloc_aligned(room);
	struct ferry__scatter_piece sp[P];
	struct ferry__ring_piece rp[P];
	struct ferry__ring_gpu *r;
	double call[3][ROUNDS], wall[3][ROUNDS];
	uint64_t hp = 0;
	void *d = NULL;

	T_ASSERT(host);
	T_EQ_INT(ferry__cuda_set_device(0), 0);
	T_EQ_INT(ferry__cuda()->MemHostRegister(host, room, FERRY__CU_MEMHOSTREGISTER_PORTABLE |
						FERRY__CU_MEMHOSTREGISTER_DEVICEMAP), 0);
	T_EQ_INT(ferry__scatter_host_ptr(0, host, &hp), 0);
	T_ASSERT(ferry_gpu_malloc(0, room, &d) == 0);
	T_ASSERT(ferry__ring_create(0, 2, 0, &r) == 0);
	memset(host, 1, room);
	for (int i = 0; i < P; i++) {
		uint64_t dst = (uint64_t)(uintptr_t)d + (uint64_t)((i * 7) % P) * stride; /* not in order */
		sp[i] = (struct ferry__scatter_piece){hp + (uint64_t)i * stride, dst, size};
		rp[i] = (struct ferry__ring_piece){dst, host + (size_t)i * stride, size};
	}
	bool batch = ferry__ring_can_batch();
	for (int k = 0; k < 3; k++) {
		for (int i = -20; i < ROUNDS; i++) { /* 20 to warm up */
			double t0 = now_us();
			int err = k == KERNEL ? ferry__scatter_launch(0, ferry__ring_stream(r), sp, P, NULL)
				  : k == BATCH ? ferry__ring_h2d_gather(r, rp, P, NULL)
					       : ferry__ring_h2d(r, (uint64_t)(uintptr_t)d, host, P * size, true);
			double t1 = now_us();
			T_EQ_INT(err, 0);
			T_EQ_INT(ferry__ring_drain(r), 0);
			if (i >= 0) {
				call[k][i] = t1 - t0;
				wall[k][i] = now_us() - t0;
			}
		}
		qsort(call[k], ROUNDS, sizeof(double), t_cmp_double);
		qsort(wall[k], ROUNDS, sizeof(double), t_cmp_double);
	}
	for (int k = 0; k < 3; k++)
		printf("TABLE scatter gather 16 x %zuk %s | %.1f us CPU | %.1f us to the end of the copies%s\n",
		       size >> 10, names[k], call[k][ROUNDS / 2], wall[k][ROUNDS / 2],
		       k == BATCH && !batch ? " (no cuMemcpyBatchAsync here: one call per piece)" : "");
	ferry__ring_destroy(r);
	T_EQ_INT(ferry_gpu_free(d), 0);
	T_EQ_INT(ferry__cuda()->MemHostUnregister(host), 0);
	ferry_free_aligned(host, room);
}

int main(int argc, char **argv)
{
	char why[512], file[4200];
	bool bench = argc > 1 && !strcmp(argv[1], "bench");
	int n = argc > 1 && !bench ? atoi(argv[1]) : 600;

	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no usable GPU: %s", why);
	int st = ferry__scatter_state(0, true);
	printf("scatter kernel on device 0: %s%s\n", st == FERRY__SCATTER_READY ? "loaded" : "NOT loaded: ",
	       ferry__scatter_reason(0));
	T_ASSERT(st == FERRY__SCATTER_READY); /* a GPU of this project's must run it */
	if (bench) {
		bench_gather(4 << 10);
		bench_gather(64 << 10);
		return t_result();
	}
	launches();

	unsigned char *data = malloc(FILE_SIZE);
	T_ASSERT(data);
	t_fill_pattern(data, FILE_SIZE, 0, 17);
	snprintf(file, sizeof(file), "%s/scatter-gpu.bin", t_tmpdir());
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, data, FILE_SIZE) == (ssize_t)FILE_SIZE); /* resident: just written */
	close(fd);
	engine(file, data, n, false);
	engine(file, data, n, true);
	small_only = true;
	engine(file, data, n, false);
	engine(file, data, n, true);
	unlink(file);
	free(data);
	return t_result();
}
