/* Compressed files read into "device memory" without a GPU: tests/gpu/test_cz_gpu.c's checks run
 * over the fake CUDA driver (device memory is host memory) and the fake nvCOMP (libzstd and liblz4
 * on the CPU) of tests/unit/fakes/, both built here with cc, so the device read path (pinned
 * windows, aligned inputs, the device-to-device copy of unaligned outputs, stored and partial
 * chunks through the copy ring, cz_gpu=off/auto/on and the path reported) runs in every CI build.
 * On the GPU machine the same checks run on the real driver and nvCOMP (ctest -L gpu).
 * FERRY_TEST_FAKE_KERNELS: CMake runs it again with the fake driver running ferry's kernels (the
 * scatter kernel's gathers, the LZ4 walk before nvCOMP), as the GPU machine does.
 */
#define main cz_gpu_main
#include "gpu/test_cz_gpu.c"
#undef main
#include "fakes/fake_gpu_env.h"
#include "format/cz.h"
#include <dlfcn.h>

/* A counter the fake driver or nvCOMP exports (dlsym in the copy the library loaded). */
static int fake_count(const char *env, const char *sym)
{
	void *h = dlopen(getenv(env), RTLD_NOW | RTLD_NOLOAD);
	int (*fn)(void);
	int v = -1;
	if (!h)
		return -1;
	*(void **)&fn = dlsym(h, sym);
	if (fn)
		v = fn();
	dlclose(h);
	return v;
}

struct counts {
	int allocs, streams, events, batches;
};

static struct counts counts_now(void)
{
	struct counts c = {fake_count("FERRY_CUDA_LIBRARY", "fake_mem_allocs"),
			   fake_count("FERRY_CUDA_LIBRARY", "fake_streams_made"),
			   fake_count("FERRY_CUDA_LIBRARY", "fake_events_made"),
			   fake_count("FERRY_NVCOMP_LIB", "fake_nvcomp_async_calls")};
	T_CHECK(c.allocs >= 0 && c.streams >= 0 && c.events >= 0 && c.batches >= 0);
	return c;
}

/* 12 chunks of 64 KiB of zstd-compressible bytes (*data, *n) in a file of the test's named for
 * what (path), and a reader of it into device memory (*dev, n bytes): nvCOMP from one chunk
 * (cz_gpu_min 1), 2 threads, nvCOMP windows of window. */
static ferry_cz *zstd_reader(ferry_ctx *ctx, const char *what, const char *window, uint8_t **data, size_t *n,
			     void **dev, char *path, size_t plen)
{
	const size_t cs = 64 << 10;
	*n = 12 * cs;
	uint8_t *d = *data = malloc(*n);
	T_ASSERT(d);
	for (size_t i = 0; i < *n; i++)
		d[i] = (uint8_t)((i / 7) % 61 + (i % 13 == 0 ? i >> 9 : 0));
	snprintf(path, plen, "%s/test_compress_device.%d.%s", t_tmpdir(), (int)getpid(), what);
	compress(path, FERRY_CZ_ZSTD, "64k", d, *n);
	ferry_cz *z;
	T_ASSERT(ferry_cz_open(ctx, path, &z) == 0 && ferry_gpu_malloc(0, *n, dev) == 0);
	T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_threads", "2"), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_window", window), 0);
	T_EQ_INT(ferry_cz_stored_chunks(z), 0);
	return z;
}

/*
 * The device path's set-up is the reader's, not each read's: the first reads into device memory
 * (the whole file, then a range with partial chunks at its ends, decoded on the CPU) make the
 * slots' streams (one each), pinned buffers, device scratch and nvCOMP decoders (an event each);
 * the next reads, no larger (the whole file again, ranges with partial ends of other sizes),
 * allocate no device or pinned memory (no new cuMemHostRegister either), make no stream and no
 * event (no decoder), and still run on nvCOMP. Windows of 2 chunks of 12, so every slot is reused
 * within a read. The set-up outlives the reader: a reader opened after it was destroyed takes its
 * slots (streams, pinned buffers, scratch, decoders) and makes none.
 */
static void steady_reads(void)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	const size_t cs = 64 << 10;
	uint8_t *data;
	size_t n;
	void *dev;
	char path[512];
	ferry_cz *z = zstd_reader(ctx, "steady", "128k", &data, &n, &dev, path, sizeof(path));
	struct counts c0 = counts_now();
	check(z, dev, data, n, 0, n, "steady: first read, whole");
	check(z, dev, data, n, cs / 2, n - cs, "steady: second read, partial ends");
	struct counts c1 = counts_now();
	printf("steady: the first two reads made %d streams, %d events, %d allocations; %d nvCOMP batches\n",
	       c1.streams - c0.streams, c1.events - c0.events, c1.allocs - c0.allocs, c1.batches - c0.batches);
	/* a stream per slot, or none where the tests before left an idle set */
	T_CHECK(c1.streams - c0.streams >= 3 || c1.streams - c0.streams == 0);
	T_EQ_INT(c1.batches - c0.batches, 12); /* windows of 2 chunks of 12 from the first, each read */
	check(z, dev, data, n, 0, n, "steady: third read, whole");
	check(z, dev, data, n, cs / 3, n - cs / 3 - cs / 5, "steady: fourth read, other partial ends");
	check(z, dev, data, n, 3 * cs + 100, 5 * cs, "steady: fifth read, partial ends");
	char info[256];
	ferry_cz_path_info(z, info, sizeof(info));
	T_CHECK(strncmp(info, "nvcomp (", 8) == 0);
	struct counts c2 = counts_now();
	printf("steady: the next three reads made %d streams, %d events, %d allocations; %d nvCOMP batches\n",
	       c2.streams - c1.streams, c2.events - c1.events, c2.allocs - c1.allocs, c2.batches - c1.batches);
	T_EQ_INT(c2.streams - c1.streams, 0);
	T_EQ_INT(c2.events - c1.events, 0);
	T_EQ_INT(c2.allocs - c1.allocs, 0);
	T_EQ_INT(c2.batches - c1.batches, 15); /* 6, 6 and 3 windows */
	ferry_cz_destroy(z);
	T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
	T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
	T_EQ_INT(ferry_cz_set(z, "cz_window", "128k"), 0);
	check(z, dev, data, n, 0, n, "steady: a new reader's first read");
	struct counts c3 = counts_now();
	printf("steady: a new reader's first read made %d streams, %d events, %d allocations\n", c3.streams - c2.streams,
	       c3.events - c2.events, c3.allocs - c2.allocs);
	T_EQ_INT(c3.streams - c2.streams, 0);
	T_EQ_INT(c3.events - c2.events, 0);
	T_EQ_INT(c3.allocs - c2.allocs, 0);
	ferry_cz_destroy(z);
	/* The frames of a window go to the GPU in one copy where nvCOMP's input alignment allows
	 * (FAKE_NVCOMP_ALIGN=1: always): 6 windows, 6 host-to-device copies of frames and 6 of
	 * nvCOMP's arrays; with the headers' 8, a copy per chunk where a frame lies off it (up to
	 * 12 + 6). Bytes compared either way. */
	for (int k = 0; k < 2; k++) {
		if (k)
			setenv("FAKE_NVCOMP_ALIGN", "1", 1);
		ferry__cz_release_idle(); /* decoders made anew: they ask for the alignment once */
		T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
		T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
		T_EQ_INT(ferry_cz_set(z, "cz_window", "128k"), 0);
		check(z, dev, data, n, 0, n, k ? "one copy: first read" : "copy per frame: first read");
		int h0 = fake_count("FERRY_CUDA_LIBRARY", "fake_htod_async_calls");
		check(z, dev, data, n, 0, n, k ? "one copy: second read" : "copy per frame: second read");
		int h = fake_count("FERRY_CUDA_LIBRARY", "fake_htod_async_calls") - h0;
		printf("%s: %d host-to-device copies for 6 windows of 2 chunks (frames and nvCOMP's arrays)\n",
		       k ? "FAKE_NVCOMP_ALIGN=1" : "alignment 8", h);
		if (k)
			T_EQ_INT(h, 12);
		else
			T_CHECK(h >= 12 && h <= 18);
		ferry_cz_destroy(z);
	}
	unsetenv("FAKE_NVCOMP_ALIGN");
	T_EQ_INT(ferry_gpu_free(dev), 0);
	unlink(path);
	free(data);
	ferry_ctx_destroy(ctx);
}

/*
 * A file of stored chunks only (random data) read into device memory, cz_gpu=off and on: each
 * window's payloads go from the file into the slot's pinned buffer and to the GPU in ONE copy
 * (12 chunks: windows of 1 then 2 at cz_threads=1 (off), of 2 from the first (on, cz_window);
 * FAKE_NVCOMP_ALIGN=1 so that nvCOMP's frames would take one copy a window too), no nvCOMP batch;
 * a partial read's end chunks still decode through their frames; a flipped byte in chunk 5's
 * bytes is named by its checksum, in both modes; chunk 5's frame magic damaged instead is not
 * read by a whole read (the payloads are read straight; the frames' way would name it).
 */
static void stored_reads(void)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	const size_t cs = 64 << 10, n = 12 * cs;
	uint8_t *data = malloc(n);
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)(next() >> 24);
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		char path[512], bad[520];
		snprintf(path, sizeof(path), "%s/test_compress_device.%d.stored", t_tmpdir(), (int)getpid());
		snprintf(bad, sizeof(bad), "%s.bad", path);
		ferry_cz_writer *w;
		T_ASSERT(ferry_cz_writer_create(path, codec, 0, &w) == 0);
		T_ASSERT(ferry_cz_writer_set(w, "cz_chunk", "64k") == 0);
		T_ASSERT(ferry_cz_writer_write(w, data, n) == 0 && ferry_cz_writer_commit(w) > 0);
		ferry_cz_writer_destroy(w);
		void *dev;
		T_ASSERT(ferry_gpu_malloc(0, n, &dev) == 0);
		for (int on = 0; on < 2; on++) {
			ferry_cz *z;
			T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
			T_EQ_INT(ferry_cz_stored_chunks(z), 12);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu", on ? "on" : "off"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_threads", "1"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_window", "128k"), 0);
			check(z, dev, data, n, 0, n, "stored: first read");
			int h0 = fake_count("FERRY_CUDA_LIBRARY", "fake_htod_async_calls");
			int b0 = fake_count("FERRY_NVCOMP_LIB", "fake_nvcomp_async_calls");
			check(z, dev, data, n, 0, n, on ? "stored, cz_gpu=on: whole" : "stored, cz_gpu=off: whole");
			int h = fake_count("FERRY_CUDA_LIBRARY", "fake_htod_async_calls") - h0;
			int b = fake_count("FERRY_NVCOMP_LIB", "fake_nvcomp_async_calls") - b0;
			printf("stored, cz_gpu=%s: %d host-to-device copies, %d nvCOMP batches for 12 chunks\n", on ? "on" : "off", h, b);
			T_EQ_INT(h, on ? 6 : 7); /* a copy a window: 2 chunks (cz_window 128k); off: 1, then 2 */
			T_EQ_INT(b, 0);
			check(z, dev, data, n, cs / 2 + 3, 7 * cs, "stored: partial ends");
			ferry_cz_destroy(z);
		}
		FILE *f = fopen(path, "rb");
		T_ASSERT(f);
		uint8_t *b = malloc(2 * n);
		size_t len = fread(b, 1, 2 * n, f);
		fclose(f);
		ferry_cz *z;
		T_ASSERT(ferry_cz_open(ctx, path, &z) == 0);
		ferry_cz_destroy(z);
		/* chunk 5's frame starts after 5 stored frames of 64 KiB and their headers: LZ4 23 bytes
		 * each, zstd 13 + 3 (one raw block) */
		size_t c5 = 5 * (cs + (codec == FERRY_CZ_LZ4 ? 23 : 16));
		b[c5 + 1000] ^= 0x10;
		f = fopen(bad, "wb");
		T_ASSERT(f && fwrite(b, 1, len, f) == len);
		fclose(f);
		for (int on = 0; on < 2; on++) {
			T_ASSERT(ferry_cz_open(ctx, bad, &z) == 0);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu", on ? "on" : "off"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
			ssize_t r = ferry_cz_pread(z, dev, n, 0);
			T_EQ_INT(r, FERRY_ECORRUPT);
			if (!strstr(ferry_last_error(), "chunk 5 (bytes 327680 to 393216): checksum")) {
				fprintf(stderr, "stored, damaged, cz_gpu=%s: %s\n", on ? "on" : "off", ferry_last_error());
				t_failures++;
			}
			ferry_cz_destroy(z);
		}
		b[c5 + 1000] ^= 0x10;
		b[c5] ^= 0x01;
		f = fopen(bad, "wb");
		T_ASSERT(f && fwrite(b, 1, len, f) == len);
		fclose(f);
		for (int on = 0; on < 2; on++) {
			T_ASSERT(ferry_cz_open(ctx, bad, &z) == 0);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu", on ? "on" : "off"), 0);
			T_EQ_INT(ferry_cz_set(z, "cz_gpu_min", "1"), 0);
			check(z, dev, data, n, 0, n, "stored: frame magic damaged, payloads read straight");
			ferry_cz_destroy(z);
		}
		free(b);
		unlink(bad);
		unlink(path);
		T_EQ_INT(ferry_gpu_free(dev), 0);
	}
	free(data);
	ferry_ctx_destroy(ctx);
}

/*
 * A read into device memory from storage (its pages dropped) takes nvCOMP windows of cz_window
 * from the first, and its last ones halve (the taper), so that what is left once its last frame
 * comes is a small window's work; in the page cache they do not. 12 chunks of 64 KiB, cz_window
 * 512k (8 chunks), cz_threads 2 (the taper's least, 2 chunks): from storage 6, 3, 2, 1 (4
 * windows), cached 8 then 4. The bytes are compared each time.
 */
static void cold_taper(void)
{
	ferry_ctx *ctx;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	uint8_t *data;
	size_t n;
	void *dev;
	char path[512];
	ferry_cz *z = zstd_reader(ctx, "taper", "512k", &data, &n, &dev, path, sizeof(path));
	int on_disk = 0;
	for (int cold = 1; cold >= 0; cold--) { /* dropped, then read into the page cache */
		if (cold)
			drop(path);
		else
			load(path);
		int out = !resident(path);
		on_disk |= out;
		check(z, dev, data, n, 0, n, cold ? "taper: cold" : "taper: cached");
		struct ferry__cz_phases ph;
		ferry__cz_last_phases(z, &ph);
		printf("%s: %llu windows\n", out ? "from storage" : "in memory", (unsigned long long)ph.windows);
		T_EQ_INT((long long)ph.windows, out ? 4 : 2);
	}
	if (!on_disk)
		printf("taper: %s stays in memory when its pages are dropped (tmpfs): only the in-memory windows were checked\n",
		       t_tmpdir());
	ferry_cz_destroy(z);
	T_EQ_INT(ferry_gpu_free(dev), 0);
	unlink(path);
	free(data);
	ferry_ctx_destroy(ctx);
}

int main(void)
{
	struct fake_gpu_env e;
	fake_gpu_env_setup(&e, __FILE__, "test_compress_device");
	int r = cz_gpu_main();
	steady_reads();
	setenv("FAKE_NVCOMP_ALIGN", "1", 1);
	stored_reads();
	unsetenv("FAKE_NVCOMP_ALIGN");
	cold_taper();
	r = r ? r : t_result();
	fake_gpu_env_done(&e);
	return r;
}
