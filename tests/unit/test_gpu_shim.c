/*
 * The GPU shims without a GPU: libraries absent, partial, failing, and fake ones that work.
 *
 * The shims load once per process, so each scenario runs in a child process (this program
 * re-executed with the scenario's name and environment). Fake libcuda/libcufile/libnvidia-ml are
 * compiled from tests/unit/fakes/ with the system C compiler at test time.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>

#include "ferry/data.h"
#include "ferry/ferry.h"
#include "ferry/gpu.h"
#include "ferry/safetensors.h"
#include "ferry_test.h"
#include "gpu/ring.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"
#include "engine/engine.h"
#include "ferry_snapshot.h"

#define HAS(hay, needle) has_((hay), (needle), #hay, __FILE__, __LINE__)

static int has_(const char *hay, const char *needle, const char *expr, const char *file, int line)
{
	if (hay && strstr(hay, needle))
		return 1;
	fprintf(stderr, "%s:%d: %s does not contain \"%s\": \"%s\"\n", file, line, expr, needle,
		hay ? hay : "(null)");
	t_failures++;
	return 0;
}

static const char *dir; /* where the fakes are built */
static char libdir_path[4096];

static const char *lib(const char *name)
{
	static char path[8][4200];
	static int i;
	char *p = path[i++ % 8];
	snprintf(p, sizeof(path[0]), "%s/%s", dir, name);
	return p;
}

/* A function a fake library exports for the test to look inside it. */
static int fake_counter(const char *env, const char *sym)
{
	void *h = dlopen(getenv(env), RTLD_NOW | RTLD_NOLOAD);
	int (*fn)(void);
	int v;

	if (!h)
		return -1;
	*(void **)&fn = dlsym(h, sym);
	v = fn ? fn() : -1;
	dlclose(h);
	return v;
}

static int fake_ranges(int type)
{
	void *h = dlopen(getenv("FERRY_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
	int (*fn)(int);
	int v;

	if (!h)
		return -1;
	*(void **)&fn = dlsym(h, "fake_ranges");
	v = fn ? fn(type) : -1;
	dlclose(h);
	return v;
}

/* Every public GPU call fails with FERRY_ENOGPU, naming `needle`. */
static void expect_no_gpu(const char *needle)
{
	char why[1024], buf[64];
	void *d = (void *)&why;
	int x = 0, dev = 7;

	T_EQ_INT(ferry_gpu_available(why, sizeof(why)), 0);
	HAS(why, needle);
	T_CHECK(ferry__cuda() == NULL);
	HAS(ferry__cuda_unavailable_reason(), needle);
	T_EQ_INT(ferry_gpu_count(), FERRY_ENOGPU);
	HAS(ferry_last_error(), needle);
	T_EQ_INT(ferry_gpu_name(0, buf, sizeof(buf)), FERRY_ENOGPU);
	T_EQ_INT(ferry_gpu_malloc(0, 4096, &d), FERRY_ENOGPU);
	T_CHECK(d == (void *)&why);
	HAS(ferry_last_error(), needle);
	T_EQ_INT(ferry_gpu_free(&x), FERRY_ENOGPU);
	T_EQ_INT(ferry_gpu_memcpy_htod(&x, &x, sizeof(x)), FERRY_ENOGPU);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(&x, &x, sizeof(x)), FERRY_ENOGPU);
	HAS(ferry_last_error(), needle);
	why[0] = '\0';
	T_EQ_INT(ferry_gds_status("/", why, sizeof(why)), FERRY_ENOGPU);
	HAS(why, needle);
	HAS(ferry_last_error(), needle);
	T_EQ_INT(ferry_mem_kind(&x, &dev), FERRY_MEM_HOST);
	T_EQ_INT(dev, -1);
	T_CHECK(ferry__cufile() == NULL);
	HAS(ferry__cufile_unavailable_reason(), "GPUDirect Storage needs CUDA");
	HAS(ferry__cufile_unavailable_reason(), needle);
	T_EQ_INT(ferry__gds_probe_fd(0, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, needle);
}

/* Without a GPU the pool hands out plain page-aligned memory within its budget. */
static void pool_without_gpu(const char *needle)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct ferry__pinned_pool *pool;
	void *a = NULL, *b = NULL, *c = NULL;
	int pinned = -1;

	T_ASSERT(ferry__pinned_pool_create(4 * page, 0, &pool) == 0);
	T_EQ_INT(ferry__pinned_alloc(pool, page + 1, &a, &pinned), 0);
	T_EQ_INT(pinned, 0);
	T_EQ_INT((uintptr_t)a % page, 0);
	memset(a, 0x5a, 2 * page);
	T_EQ_INT(ferry__pinned_held(pool), 2 * page);
	HAS(ferry__pinned_unpinned_reason(pool), needle);
	T_EQ_INT(ferry__pinned_alloc(pool, 3 * page, &b, &pinned), FERRY_EBUDGET);
	HAS(ferry_last_error(), "host_budget");
	ferry__pinned_free(pool, a);
	T_EQ_INT(ferry__pinned_alloc(pool, 2 * page, &c, &pinned), 0);
	T_CHECK(c == a); /* reused */
	T_EQ_INT(ferry__pinned_alloc(pool, 0, &b, &pinned), -EINVAL);
	ferry__pinned_pool_destroy(pool);
	ferry__pinned_pool_destroy(NULL);
}

static int sc_absent(void)
{
	expect_no_gpu("libcuda.so.1");
	HAS(ferry__cuda_unavailable_reason(), "FERRY_CUDA_LIBRARY");
	pool_without_gpu("libcuda.so.1");
	T_CHECK(ferry__nvml() == NULL);
	HAS(ferry__nvml_unavailable_reason(), "libnvidia-ml.so.1");
	struct ferry__nvml_device_info info;
	T_EQ_INT(ferry__nvml_device_info(0, &info), FERRY_ENOGPU);
	return t_result();
}

/* Whatever this machine has: without a usable GPU the reason must be stated. */
static int sc_default(void)
{
	char why[1024];

	if (ferry_gpu_available(why, sizeof(why))) {
		T_CHECK(ferry_gpu_count() >= 1);
		printf("default: a GPU is usable here, checked ferry_gpu_count only\n");
		return t_result();
	}
	T_CHECK(why[0] != '\0');
	T_CHECK(strstr(why, "libcuda.so.1") || strstr(why, "cuInit") || strstr(why, "cuDeviceGetCount"));
	expect_no_gpu(why);
	return t_result();
}

static int sc_missing(void)
{
	expect_no_gpu("symbol cuMemcpyHtoDAsync_v2 missing from libcuda.so.1");
	T_CHECK(!strstr(ferry__cuda_unavailable_reason(), "more"));
	/* the exported ABI is checked before anything in the library runs */
	T_EQ_INT(fake_counter("FERRY_CUDA_LIBRARY", "fake_init_calls"), 0);
	return t_result();
}

static int sc_missing2(void)
{
	/* cuMemcpyHtoDAsync_v2 comes before cuStreamCreate in the table */
	expect_no_gpu("symbol cuMemcpyHtoDAsync_v2 missing from libcuda.so.1 (and 1 more");
	return t_result();
}

static int sc_nodevice(void)
{
	expect_no_gpu("cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
	T_EQ_INT(fake_counter("FERRY_CUDA_LIBRARY", "fake_init_calls"), 1);
	return t_result();
}

static int sc_zerodevices(void)
{
	expect_no_gpu("found no CUDA device");
	return t_result();
}

static void *race(void *arg)
{
	(void)arg;
	return (void *)ferry__cuda();
}

static void mem_kinds_and_copies(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	unsigned char host[3000], back[3000];
	void *d0 = NULL, *d1 = NULL, *slot = NULL, *slot2 = NULL, *slot3 = NULL;
	struct ferry__pinned_pool *pool;
	int dev = 9, pinned = 0, stack = 0;

	T_EQ_INT(ferry_gpu_malloc(0, sizeof(host), &d0), 0);
	T_EQ_INT(ferry_gpu_malloc(1, 4096, &d1), 0);
	T_EQ_INT(ferry_mem_kind(d0, &dev), FERRY_MEM_DEVICE);
	T_EQ_INT(dev, 0);
	T_EQ_INT(ferry_mem_kind((char *)d1 + 100, &dev), FERRY_MEM_DEVICE);
	T_EQ_INT(dev, 1);
	T_EQ_INT(ferry_mem_kind(&stack, &dev), FERRY_MEM_HOST);
	T_EQ_INT(dev, -1);
	T_EQ_INT(ferry_mem_kind(NULL, NULL), FERRY_MEM_HOST);

	t_fill_pattern(host, sizeof(host), 0, 42);
	T_EQ_INT(ferry_gpu_memcpy_htod(d0, host, sizeof(host)), 0);
	memset(back, 0, sizeof(back));
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d0, sizeof(back)), 0);
	T_CHECK(memcmp(host, back, sizeof(host)) == 0);
	T_EQ_INT(ferry_gpu_memcpy_htod(host, back, 16), -EINVAL);
	HAS(ferry_last_error(), "is not CUDA device memory");
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, host, 16), -EINVAL);
	T_EQ_INT(ferry_gpu_memcpy_htod(d0, host, 0), 0);

	T_EQ_INT(ferry_gpu_malloc(0, 0, &d1), -EINVAL);
	T_EQ_INT(ferry_gpu_malloc(7, 16, &slot), -EINVAL);
	HAS(ferry_last_error(), "CUDA device 7 does not exist");
	T_EQ_INT(ferry_gpu_free(host), -EINVAL);
	T_EQ_INT(ferry_gpu_free(NULL), 0);

	/* pinned pool: registration, budget, reuse, unregistration */
	T_ASSERT(ferry__pinned_pool_create(3 * page, 0, &pool) == 0);
	T_EQ_INT(ferry__pinned_alloc(pool, page, &slot, &pinned), 0);
	T_EQ_INT(pinned, 1);
	T_EQ_INT(ferry__mem_kind(slot, &dev), FERRY__MEM_PINNED);
	T_EQ_INT(ferry__mem_kind((char *)slot + page - 1, NULL), FERRY__MEM_PINNED);
	T_EQ_INT(ferry__pinned_alloc(pool, 2 * page, &slot2, &pinned), 0);
	T_EQ_INT(fake_ranges(1), 2);
	T_EQ_INT(ferry__pinned_alloc(pool, page, &slot3, &pinned), FERRY_EBUDGET);
	ferry__pinned_free(pool, slot2);
	/* the cached 2-page slot is dropped (unregistered) to make room */
	T_EQ_INT(ferry__pinned_alloc(pool, page, &slot3, &pinned), 0);
	T_EQ_INT(pinned, 1);
	T_EQ_INT(fake_ranges(1), 2);
	T_EQ_INT(ferry__pinned_held(pool), 2 * page);
	T_EQ_INT(ferry__pinned_unpinned_reason(pool)[0], '\0');
	ferry__pinned_pool_destroy(pool);
	T_EQ_INT(fake_ranges(1), 0);
	/* deferred locking (ferry__pinned_alloc_unpinned): not registered until ferry__pinned_pin,
	 * once; a slot kept unlocked comes locked to ferry__pinned_alloc, and as it is (unlocked) to
	 * another deferred caller */
	T_ASSERT(ferry__pinned_pool_create(0, 0, &pool) == 0);
	T_EQ_INT(ferry__pinned_alloc_unpinned(pool, page, &slot, &pinned), 0);
	T_EQ_INT(pinned, 0);
	T_EQ_INT(fake_ranges(1), 0);
	T_EQ_INT(ferry__mem_kind(slot, NULL), FERRY__MEM_HOST);
	T_EQ_INT(ferry__pinned_pin(pool, slot, &pinned), 0);
	T_EQ_INT(pinned, 1);
	T_EQ_INT(fake_ranges(1), 1);
	T_EQ_INT(ferry__mem_kind(slot, NULL), FERRY__MEM_PINNED);
	T_EQ_INT(ferry__pinned_pin(pool, slot, &pinned), 0); /* again: nothing more */
	T_EQ_INT(pinned, 1);
	T_EQ_INT(fake_ranges(1), 1);
	T_EQ_INT(ferry__pinned_alloc_unpinned(pool, 2 * page, &slot2, &pinned), 0);
	ferry__pinned_free(pool, slot2);
	T_EQ_INT(ferry__pinned_alloc_unpinned(pool, 2 * page, &slot3, &pinned), 0);
	T_CHECK(slot3 == slot2 && pinned == 0 && fake_ranges(1) == 1);
	ferry__pinned_free(pool, slot3);
	T_EQ_INT(ferry__pinned_alloc(pool, 2 * page, &slot3, &pinned), 0);
	T_CHECK(slot3 == slot2 && pinned == 1 && fake_ranges(1) == 2);
	T_EQ_INT(ferry__pinned_pin(pool, host, &pinned), -EINVAL);
	ferry__pinned_pool_destroy(pool);
	T_EQ_INT(fake_ranges(1), 0);
	/* device -1: plain memory even with a GPU */
	T_ASSERT(ferry__pinned_pool_create(0, -1, &pool) == 0);
	T_EQ_INT(ferry__pinned_alloc(pool, 10, &slot, &pinned), 0);
	T_EQ_INT(pinned, 0);
	T_EQ_INT(ferry__mem_kind(slot, NULL), FERRY__MEM_HOST);
	ferry__pinned_pool_destroy(pool);

	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	T_EQ_INT(ferry_mem_kind(d0, NULL), FERRY_MEM_HOST);
	T_EQ_INT(fake_ranges(2), 0);
}

/*
 * The safetensors writer saving device tensors through its copy ring (a ticket per slot): a
 * 40 MiB device tensor spans three 16 MiB slots, so slots are reused after their copies; a host
 * tensor sits beside it. Synchronous and asynchronous saves, read back and compared byte for byte.
 */
static void writer_device(void)
{
	enum { BIG = 40 << 20, SMALL = 4096 };
	char path[600];
	ferry_ctx *ctx;
	ferry_st_writer *w;
	ferry_st *st;
	void *dbig = NULL;
	uint8_t *big = malloc(BIG), *back = malloc(BIG), host[SMALL];
	uint64_t shape_big[1] = {BIG}, shape_small[1] = {SMALL};

	T_ASSERT(big && back);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (uint8_t)(i * 7 + (i >> 20));
	for (size_t i = 0; i < SMALL; i++)
		host[i] = (uint8_t)(255 - i);
	T_EQ_INT(ferry_gpu_malloc(1, BIG, &dbig), 0);
	T_EQ_INT(ferry_gpu_memcpy_htod(dbig, big, BIG), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	T_ASSERT(ferry_st_writer_add(w, "big", FERRY_DT_U8, 1, shape_big, dbig, BIG) >= 0);
	T_ASSERT(ferry_st_writer_add(w, "small", FERRY_DT_U8, 1, shape_small, host, SMALL) >= 0);
	for (int async = 0; async < 2; async++) {
		snprintf(path, sizeof(path), "%s/writer_device_%d.safetensors", t_tmpdir(), async);
		unlink(path);
		if (async) {
			T_EQ_INT(ferry_st_writer_save_async(w, path, 0), 0);
			T_ASSERT(ferry_st_writer_wait(w, -1) > BIG);
		} else {
			T_ASSERT(ferry_st_writer_save(w, path, 0) > BIG);
		}
		T_ASSERT(ferry_st_open(ctx, path, &st) == 0);
		int ib = ferry_st_find(st, "big"), is = ferry_st_find(st, "small");
		T_ASSERT(ib >= 0 && is >= 0);
		memset(back, 0, BIG);
		T_EQ_INT(ferry_st_read(st, (size_t)ib, back, BIG), BIG);
		T_CHECK(memcmp(back, big, BIG) == 0);
		T_EQ_INT(ferry_st_read(st, (size_t)is, back, SMALL), SMALL);
		T_CHECK(memcmp(back, host, SMALL) == 0);
		ferry_st_destroy(st);
		unlink(path);
	}
	ferry_st_writer_destroy(w);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(dbig), 0);
	free(big);
	free(back);
}

/*
 * An asynchronous save's snapshot (the save_snapshot knob): auto takes it on the device for a
 * writer's first save (no slots pinned yet, room on the device by the fake's cuMemGetInfo), in the
 * pinned slots once that save left them pinned, and in pinned slots when the device lacks room
 * ($FAKE_MEM_FREE); device and pinned force each. Each save's file holds the bytes the tensors had
 * when the call returned (both tensors are overwritten right after it), and the device snapshot's
 * memory is freed by the end of the save.
 */
static int sc_save_snapshot(void)
{
	enum { BIG = 40 << 20, SMALL = 4096 };
	static const struct {
		const char *knob, *mem_free;
		int fresh, device;
	} cases[] = {
		{ "auto", NULL, 1, 1 },     /* a first save: nothing pinned, room: the device */
		{ "auto", NULL, 0, 0 },     /* the first save's filler left the slots pinned */
		{ "auto", "1073741824", 1, 0 }, /* 1 GiB free: below the state plus the margin */
		{ "device", "1073741824", 1, 1 },
		{ "pinned", NULL, 1, 0 },
	};
	char path[600];
	ferry_ctx *ctx;
	ferry_st_writer *w = NULL;
	ferry_st *st;
	void *dbig = NULL;
	uint8_t *big = malloc(BIG), *back = malloc(BIG), *junk = malloc(BIG), host[SMALL], want_host[SMALL];
	uint64_t shape_big[1] = {BIG}, shape_small[1] = {SMALL};

	T_ASSERT(big && back && junk);
	memset(junk, 0xee, BIG);
	T_EQ_INT(ferry_gpu_malloc(0, BIG, &dbig), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		printf("save_snapshot=%s, free %s, %s writer\n", cases[c].knob, cases[c].mem_free ? cases[c].mem_free : "64 GiB",
		       cases[c].fresh ? "a new" : "the same");
		if (cases[c].mem_free)
			setenv("FAKE_MEM_FREE", cases[c].mem_free, 1);
		else
			unsetenv("FAKE_MEM_FREE");
		for (size_t i = 0; i < BIG; i++)
			big[i] = (uint8_t)(i * 7 + (i >> 20) + c * 13);
		for (size_t i = 0; i < SMALL; i++)
			host[i] = want_host[i] = (uint8_t)(255 - i - c);
		T_EQ_INT(ferry_gpu_memcpy_htod(dbig, big, BIG), 0);
		if (cases[c].fresh) {
			ferry_st_writer_destroy(w);
			T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
		}
		T_EQ_INT(ferry_st_writer_set(w, "save_snapshot", cases[c].knob), 0);
		T_EQ_INT(ferry_st_writer_reset(w), 0);
		T_ASSERT(ferry_st_writer_add(w, "big", FERRY_DT_U8, 1, shape_big, dbig, BIG) >= 0);
		T_ASSERT(ferry_st_writer_add(w, "small", FERRY_DT_U8, 1, shape_small, host, SMALL) >= 0);
		snprintf(path, sizeof(path), "%s/save_snapshot_%zu.safetensors", t_tmpdir(), c);
		unlink(path);
		int d0 = fake_counter("FERRY_CUDA_LIBRARY", "fake_dtod_async_calls");
		T_EQ_INT(ferry_st_writer_save_async(w, path, 0), 0);
		T_EQ_INT(ferry_gpu_memcpy_htod(dbig, junk, BIG), 0); /* the caller's tensors change at once */
		memset(host, 0xee, SMALL);
		T_ASSERT(ferry_st_writer_wait(w, -1) > BIG);
		T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_DEVICE_SNAPSHOT_BYTES), cases[c].device ? BIG + SMALL : 0);
		T_EQ_INT(fake_counter("FERRY_CUDA_LIBRARY", "fake_dtod_async_calls") - d0, cases[c].device ? 1 : 0);
		/* a first save pins its slots: on the device path the filler thread does, off the call */
		T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_PINNED_NEW_BYTES), cases[c].fresh ? 3u << 24 : 0);
		T_EQ_INT(fake_ranges(2), 1); /* dbig: the device snapshot is gone */
		T_ASSERT(ferry_st_open(ctx, path, &st) == 0);
		int ib = ferry_st_find(st, "big"), is = ferry_st_find(st, "small");
		T_ASSERT(ib >= 0 && is >= 0);
		memset(back, 0, BIG);
		T_EQ_INT(ferry_st_read(st, (size_t)ib, back, BIG), BIG);
		T_CHECK(memcmp(back, big, BIG) == 0);
		T_EQ_INT(ferry_st_read(st, (size_t)is, back, SMALL), SMALL);
		T_CHECK(memcmp(back, want_host, SMALL) == 0);
		ferry_st_destroy(st);
		unlink(path);
	}
	/* host_budget below the state: the pinned path would wait for writes, so auto keeps taking
	 * the device, its filler reusing the slots the budget allows */
	ferry_ctx *small;
	ferry_st_writer *ws;
	T_ASSERT(ferry_ctx_create(&small) == 0);
	T_EQ_INT(ferry_ctx_set(small, "host_budget", "32m"), 0);
	T_ASSERT(ferry_st_writer_create(small, &ws) == 0);
	T_ASSERT(ferry_st_writer_add(ws, "big", FERRY_DT_U8, 1, shape_big, dbig, BIG) >= 0);
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/save_snapshot_budget.safetensors", t_tmpdir());
		unlink(path);
		T_EQ_INT(ferry_st_writer_save_async(ws, path, 0), 0);
		T_ASSERT(ferry_st_writer_wait(ws, -1) > BIG);
		T_EQ_INT(ferry_st_writer_stat(ws, FERRY_SAVE_STAT_DEVICE_SNAPSHOT_BYTES), BIG);
		T_EQ_INT(ferry_st_writer_stat(ws, FERRY_SAVE_STAT_SLOTS), 2);
		T_ASSERT(ferry_st_open(small, path, &st) == 0);
		T_EQ_INT(ferry_st_read(st, (size_t)ferry_st_find(st, "big"), back, BIG), BIG);
		T_CHECK(memcmp(back, junk, BIG) == 0); /* the last case's overwrite, as dbig holds now */
		ferry_st_destroy(st);
		unlink(path);
	}
	ferry_st_writer_destroy(ws);
	ferry_ctx_destroy(small);
	/* forced onto a device that cannot hold it: the save is refused, naming the knob */
	T_EQ_INT(ferry_st_writer_reset(w), 0);
	T_EQ_INT(ferry_st_writer_set(w, "save_snapshot", "device"), 0);
	T_ASSERT(ferry_st_writer_add(w, "big", FERRY_DT_U8, 1, shape_big, dbig, BIG) >= 0);
	setenv("FAKE_ALLOC_FAIL", "1", 1);
	snprintf(path, sizeof(path), "%s/save_snapshot_refused.safetensors", t_tmpdir());
	T_EQ_INT(ferry_st_writer_save_async(w, path, 0), -ENOMEM);
	HAS(ferry_last_error(), "save_snapshot=device");
	/* auto falls back to the pinned slots */
	ferry_st_writer_destroy(w);
	T_ASSERT(ferry_st_writer_create(ctx, &w) == 0);
	T_ASSERT(ferry_st_writer_add(w, "big", FERRY_DT_U8, 1, shape_big, dbig, BIG) >= 0);
	T_EQ_INT(ferry_st_writer_save_async(w, path, 0), 0);
	T_ASSERT(ferry_st_writer_wait(w, -1) > BIG);
	T_EQ_INT(ferry_st_writer_stat(w, FERRY_SAVE_STAT_DEVICE_SNAPSHOT_BYTES), 0);
	unsetenv("FAKE_ALLOC_FAIL");
	unlink(path);
	ferry_st_writer_destroy(w);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(dbig), 0);
	free(big);
	free(back);
	free(junk);
	return t_result();
}

/*
 * The loader on a (fake) CUDA device, its device memory taken by the consumer (ferry_loader_take)
 * and given back (ferry_loader_buffer_destroy): each taken buffer holds its batch's bytes, slots get
 * other memory while the consumer keeps some (75 batches through 3 slots in at most 8 buffers), a buffer freed after the loader is destroyed is freed then (ASan checks
 * the loader's remains). A host loader refuses, and takes the batch back all the same.
 */
static void loader_take(void)
{
	enum { N = 300, LEN = 6 };
	char dpath[600];
	ferry_ctx *ctx;
	ferry_dataset_writer *w;
	ferry_dataset *ds;
	ferry_loader *l, *lh;
	ferry_loader_batch *b;
	ferry_loader_buffer *kept, *buf;
	uint16_t sample[LEN], got[4 * LEN];

	snprintf(dpath, sizeof(dpath), "%s/loader_ds", t_tmpdir());
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_dataset_writer_create(ctx, dpath, FERRY_WRITE_FERRY, FERRY_DT_U16, 0, &w) == 0);
	for (int i = 0; i < N; i++)
		T_ASSERT(ferry_dataset_writer_add(w, sizeof(sample), NULL, 0, 1) >= 0);
	T_ASSERT(ferry_dataset_writer_layout(w) > 0);
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < LEN; j++)
			sample[j] = (uint16_t)(i * 31 + j);
		T_ASSERT(ferry_dataset_writer_put(w, (uint64_t)i, sample, sizeof(sample)) == 0);
	}
	T_ASSERT(ferry_dataset_writer_finish(w) == 0);
	ferry_dataset_writer_destroy(w);
	T_ASSERT(ferry_dataset_open(ctx, dpath, &ds) == 0);

	T_ASSERT(ferry_loader_create(ds, &l) == 0);
	T_EQ_INT(ferry_loader_set(l, "device", "0"), 0);
	T_EQ_INT(ferry_loader_set(l, "batch_size", "4"), 0);
	T_EQ_INT(ferry_loader_set(l, "prefetch", "2"), 0);
	T_EQ_INT(ferry_loader_set(l, "order", "shuffle"), 0);
	T_EQ_INT(ferry_loader_set(l, "epochs", "1"), 0);
	int device_ranges = -1, batches = 0, seen[N] = {0}, r;
	ferry_loader_buffer *queue[3] = {NULL, NULL, NULL}; /* the consumer keeps its last 3 batches */
	kept = NULL;
	while ((r = ferry_loader_next(l, &b)) == 1) {
		int64_t ix[4];
		uint32_t n = ferry_loader_batch_samples(b);
		memcpy(ix, ferry_loader_batch_indices(b), n * sizeof(int64_t));
		T_EQ_INT(ferry_loader_batch_bytes(b), n * sizeof(sample));
		T_EQ_INT(ferry_loader_take(l, b, &buf), 0);
		T_ASSERT(buf != NULL);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(got, ferry_loader_buffer_data(buf), n * sizeof(sample)), 0);
		for (uint32_t k = 0; k < n; k++) {
			seen[ix[k]]++;
			for (int j = 0; j < LEN; j++)
				if (got[k * LEN + j] != (uint16_t)(ix[k] * 31 + j)) {
					fprintf(stderr, "batch %d sample %u (index %lld): wrong bytes\n", batches, k,
						(long long)ix[k]);
					t_failures++;
					break;
				}
		}
		if (batches == 0)
			kept = buf; /* kept past the loader's end */
		else {
			T_EQ_INT(ferry_loader_buffer_destroy(queue[batches % 3], NULL), 0);
			queue[batches % 3] = buf;
		}
		/* memory reused: at most the 3 slots' plus the 5 buffers the consumer holds here */
		device_ranges = fake_ranges(2) > device_ranges ? fake_ranges(2) : device_ranges;
		batches++;
	}
	T_EQ_INT(r, 0);
	T_EQ_INT(batches, N / 4);
	T_CHECK(device_ranges >= 4 && device_ranges <= 8);
	int once = 1, total = 0;
	for (int i = 0; i < N; i++)
		total += seen[i], once &= seen[i] == 1;
	T_CHECK(once);
	T_EQ_INT(total, N);
	for (int i = 0; i < 3; i++)
		T_EQ_INT(ferry_loader_buffer_destroy(queue[i], NULL), 0);
	ferry_loader_destroy(l);
	T_EQ_INT(fake_ranges(2), 1); /* the kept buffer */
	T_EQ_INT(ferry_gpu_memcpy_dtoh(got, ferry_loader_buffer_data(kept), 8), 0);
	T_EQ_INT(ferry_loader_buffer_destroy(kept, NULL), 0);
	T_EQ_INT(fake_ranges(2), 0);

	T_ASSERT(ferry_loader_create(ds, &lh) == 0);
	T_EQ_INT(ferry_loader_next(lh, &b), 1);
	T_EQ_INT(ferry_loader_take(lh, b, &buf), -EINVAL);
	HAS(ferry_last_error(), "not on a CUDA device");
	T_CHECK(buf == NULL);
	T_EQ_INT(ferry_loader_next(lh, &b), 1); /* the refused batch was handed back */
	ferry_loader_batch_destroy(b);
	ferry_loader_destroy(lh);
	ferry_dataset_destroy(ds);
	ferry_ctx_destroy(ctx);
}

static int sc_fake(void)
{
	pthread_t th[8];
	void *got[8];
	char buf[64], why[1024];
	const struct ferry__cuda_api *cu;
	int fd;

	for (int i = 0; i < 8; i++)
		T_ASSERT(pthread_create(&th[i], NULL, race, NULL) == 0);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], &got[i]);
	cu = ferry__cuda();
	T_ASSERT(cu != NULL);
	for (int i = 0; i < 8; i++)
		T_CHECK(got[i] == cu);
	T_EQ_INT(fake_counter("FERRY_CUDA_LIBRARY", "fake_init_calls"), 1);
	T_EQ_STR(cu->resolver, "dlsym");
	T_EQ_INT(cu->driver_version, 12080);
	T_CHECK(cu->GetProcAddress == NULL && cu->MemGetInfo == NULL);
	T_EQ_STR(ferry__cuda_unavailable_reason(), "");
	T_EQ_INT(ferry_gpu_available(why, sizeof(why)), 1);
	T_EQ_STR(why, "");
	T_EQ_INT(ferry_gpu_count(), 2);
	T_EQ_INT(ferry_gpu_name(1, buf, sizeof(buf)), 10);
	T_EQ_STR(buf, "Fake GPU 1");
	T_EQ_INT(ferry_gpu_name(2, buf, sizeof(buf)), -EINVAL);
	T_EQ_STR(ferry__cuda_err_name(100), "CUDA_ERROR_NO_DEVICE");
	T_EQ_INT(ferry__cuda_fail(2, "cuMemAlloc(%d bytes)", 5), -ENOMEM);
	HAS(ferry_last_error(), "cuMemAlloc(5 bytes): CUDA_ERROR_OUT_OF_MEMORY (2)");
	T_EQ_INT(ferry__cuda_fail(201, "x"), FERRY_ECUDA);
	mem_kinds_and_copies();
	loader_take();
	writer_device();

	/* GDS without libcufile: refused, with the reason */
	fd = open(t_tmpdir(), O_RDONLY | O_DIRECTORY);
	T_EQ_INT(ferry__gds_probe_fd(fd, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, "libcufile.so.0 not loaded");
	T_EQ_INT(ferry__gds_probe_fd(fd, NULL, 0), FERRY__GDS_REFUSED);
	close(fd);
	why[0] = '\0';
	T_EQ_INT(ferry_gds_status("/nonexistent/file", why, sizeof(why)), -ENOENT);
	HAS(why, "/nonexistent/file");
	return t_result();
}

static int fake_int(const char *sym)
{
	return fake_counter("FERRY_CUDA_LIBRARY", sym);
}

/*
 * ferry__ring_h2d_gather: runs merged (source and destination both contiguous), a piece of
 * length 0 (a failed read) left out, one cuMemcpyBatchAsync for the runs where the driver has it
 * (batch 1), else one cuMemcpyHtoDAsync per run. Counted by the fake driver; bytes compared.
 */
static void ring_gather(int batch)
{
	enum { P = 4096, N = 80 };
	static unsigned char src[N * P], back[N * P];
	struct ferry__ring_piece p[N];
	struct ferry__ring_gpu *r;
	void *d = NULL;
	unsigned calls = 99;

	T_EQ_INT(ferry_gpu_malloc(0, sizeof(src), &d), 0);
	T_ASSERT(ferry__ring_create(0, 4, 0, &r) == 0);
	t_fill_pattern(src, sizeof(src), 0, 7);
	memset(back, 0xee, sizeof(back));
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, sizeof(back)), 0);
	uint64_t dev = (uint64_t)(uintptr_t)d;
	int h0 = fake_int("fake_htod_async_calls"), b0 = fake_int("fake_batch_calls");
	int bytes0 = fake_int("fake_async_bytes");

	/* 8 pieces in order, piece 3 failed: runs 0-2 and 4-7 */
	for (int i = 0; i < 8; i++)
		p[i] = (struct ferry__ring_piece){dev + (uint64_t)i * P, src + i * P, i == 3 ? 0 : P};
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 8, &calls), 0);
	T_EQ_INT(calls, batch ? 1 : 2);
	T_EQ_INT(fake_int("fake_batch_calls") - b0, batch ? 1 : 0);
	T_EQ_INT(fake_int("fake_htod_async_calls") - h0, batch ? 0 : 2);
	T_EQ_INT(fake_int("fake_async_bytes") - bytes0, 7 * P);
	T_EQ_INT(ferry__ring_record(r, 1), 0);
	/* item 3 of issue 22: sync and query say "done" alike */
	T_EQ_INT(ferry__ring_query(r, 1), 1);
	T_EQ_INT(ferry__ring_sync(r, 1), 1);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, 8 * P), 0);
	T_CHECK(memcmp(back, src, 3 * P) == 0);
	T_CHECK(back[3 * P] == 0xee && back[4 * P - 1] == 0xee);
	T_CHECK(memcmp(back + 4 * P, src + 4 * P, 4 * P) == 0);

	/* N pieces landing in reverse order: no run to merge; a batch holds 64 copies */
	h0 = fake_int("fake_htod_async_calls");
	b0 = fake_int("fake_batch_calls");
	for (int i = 0; i < N; i++)
		p[i] = (struct ferry__ring_piece){dev + (uint64_t)(N - 1 - i) * P, src + i * P, P};
	T_EQ_INT(ferry__ring_h2d_gather(r, p, N, &calls), 0);
	T_EQ_INT(calls, batch ? 2 : N);
	T_EQ_INT(fake_int("fake_batch_calls") - b0, batch ? 2 : 0);
	T_EQ_INT(fake_int("fake_htod_async_calls") - h0, batch ? 0 : N);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	for (int i = 0; i < N; i++)
		T_CHECK(memcmp(back + (size_t)(N - 1 - i) * P, src + (size_t)i * P, P) == 0);

	/* one run: one plain copy even with the batch call; nothing at all: no call */
	h0 = fake_int("fake_htod_async_calls");
	for (int i = 0; i < 4; i++)
		p[i] = (struct ferry__ring_piece){dev + (uint64_t)i * 100, src + i * 100, 100};
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 4, &calls), 0);
	T_EQ_INT(calls, 1);
	T_EQ_INT(fake_int("fake_htod_async_calls") - h0, 1);
	p[0].len = 0;
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 1, &calls), 0);
	T_EQ_INT(calls, 0);

	/* a destination that is not device memory: the call's failure, with the driver's name */
	p[0] = (struct ferry__ring_piece){(uint64_t)(uintptr_t)back, src, P};
	p[1] = (struct ferry__ring_piece){dev, src + 2 * P, P};
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 2, &calls), FERRY_ECUDA);
	/* with the batch call: refused, then the plain call names the copy; the batch call stays in use */
	HAS(ferry_last_error(), "cuMemcpyHtoDAsync of 4096 bytes");
	T_EQ_INT(ferry__ring_can_batch(), batch);

	void *fence = NULL;
	T_EQ_INT(ferry__fence_create(0, &fence), 0);
	T_EQ_INT(ferry__fence_record(fence, ferry__ring_stream(r)), 0);
	T_EQ_INT(ferry__fence_query(fence), 1);
	T_EQ_INT(ferry__fence_sync(fence), 1);
	ferry__fence_destroy(fence);
	ferry__ring_destroy(r);
	T_EQ_INT(ferry_gpu_free(d), 0);
}

/*
 * The engine's gather: a batch of small reads into device memory, destinations following on, one
 * piece past the end of the file (0 bytes) in the middle and a short one at the end. Each piece has
 * its own result and bytes; the pieces' copies go in a few driver calls (before: one each): launches
 * of the scatter kernel where the driver has it, else cuMemcpyBatchAsync or, without it, copies of
 * runs packed together. Then futures, waited in order. *fallbacks: the context's count (path
 * cpu-async-gpu, so that auto's GDS fallback is not among them).
 */
static void engine_gather(uint64_t *fallbacks)
{
	enum { P = 4096, N = 48, SHORT = 1000, HOLE = 5 };
	static unsigned char want[N * P], back[N * P];
	char path[4200];
	ferry_ctx *ctx;
	ferry_file *f;
	ferry_batch *b;
	void *d = NULL;

	snprintf(path, sizeof(path), "%s/gather.bin", t_tmpdir());
	t_fill_pattern(want, sizeof(want), 0, 11);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, want, N * P - SHORT) == N * P - SHORT);
	close(fd);
	T_EQ_INT(ferry_gpu_malloc(0, sizeof(back), &d), 0);
	memset(back, 0xee, sizeof(back));
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, sizeof(back)), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "1"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "path", "cpu-async-gpu"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	for (int i = 0; i < N; i++)
		T_EQ_INT(ferry_batch_add_read(b, f, i == HOLE ? (uint64_t)N * P : (uint64_t)i * P, P,
					      (char *)d + (size_t)i * P), i);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	int h0 = fake_int("fake_htod_async_calls"), b0 = fake_int("fake_batch_calls");
	int bytes0 = fake_int("fake_async_bytes"), l0 = fake_int("fake_launches");
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), 2);
	int calls = fake_int("fake_htod_async_calls") - h0 + fake_int("fake_batch_calls") - b0 +
		    fake_int("fake_launches") - l0;
	printf("%d pieces into device memory: %d copy calls\n", N, calls);
	T_CHECK(calls >= 1 && calls <= N / 3); /* one per piece before the gather */
	T_EQ_INT(fake_int("fake_async_bytes") - bytes0, (N - 2) * P + P - SHORT);
	for (int i = 0; i < N; i++)
		T_EQ_INT(ferry_batch_result(b, (size_t)i), i == HOLE ? 0 : i == N - 1 ? P - SHORT : P);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	for (int i = 0; i < N; i++) {
		size_t got = i == HOLE ? 0 : i == N - 1 ? P - SHORT : P;
		T_CHECK(memcmp(back + (size_t)i * P, want + (size_t)i * P, got) == 0);
		T_CHECK(got == P || back[(size_t)i * P + got] == 0xee);
	}

	/* futures: each its own result, waited in the order they were made */
	ferry_req *r[N];
	memset(back, 0xee, sizeof(back));
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, sizeof(back)), 0);
	for (int i = 0; i < N; i++)
		T_EQ_INT(ferry_pread_async(f, (char *)d + (size_t)(N - 1 - i) * P, P, (uint64_t)i * P, &r[i]), 0);
	for (int i = 0; i < N; i++) {
		T_EQ_INT(ferry_req_wait(r[i], -1), i == N - 1 ? P - SHORT : P);
		ferry_req_destroy(r[i]);
	}
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	for (int i = 0; i < N; i++)
		T_CHECK(memcmp(back + (size_t)(N - 1 - i) * P, want + (size_t)i * P, i == N - 1 ? P - SHORT : P) == 0);
	if (fallbacks)
		*fallbacks = ferry_ctx_stat(ctx, FERRY_STAT_FALLBACKS);
	ferry_batch_destroy(b);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(d), 0);
	unlink(path);
}

/*
 * A batch of 16 resident pieces of P bytes into device memory (one worker, one round of 16). With
 * the scatter kernel, pieces under SCATTER_PIECE_MAX (32 KiB, gpu_io.c) go in launches, and the
 * gather goes out each 256 KiB read (GATHER_FLUSH_BYTES), so the first pieces' copies run while the
 * rest are read: 28 KiB pieces in 2 launches (10, then 6); 64 KiB pieces are the copy engine's,
 * one cuMemcpyBatchAsync at the round's end (a call costs 80-110 us on the H100), as without the
 * kernel. Every piece's bytes land. Returns the driver calls made: launches, pieces launched and
 * batch calls.
 */
static void engine_gather_pieces(size_t P, int *launches, int *pieces, int *batches)
{
	enum { N = 16, PMAX = 64 << 10 };
	static unsigned char want[N * PMAX], back[N * PMAX];
	T_ASSERT(P <= PMAX);
	char path[4200];
	ferry_ctx *ctx;
	ferry_file *f;
	ferry_batch *b;
	void *d = NULL;

	snprintf(path, sizeof(path), "%s/gather-%zuk.bin", t_tmpdir(), P >> 10);
	t_fill_pattern(want, N * P, 0, 17);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, want, N * P) == (ssize_t)(N * P));
	close(fd);
	T_EQ_INT(ferry_gpu_malloc(0, N * P, &d), 0);
	memset(back, 0xee, N * P);
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, N * P), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "1"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "path", "cpu-async-gpu"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	/* scattered: piece i of the file to place N-1-i */
	for (int i = 0; i < N; i++)
		T_EQ_INT(ferry_batch_add_read(b, f, (uint64_t)i * P, P, (char *)d + (size_t)(N - 1 - i) * P), i);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	int l0 = fake_int("fake_launches"), p0 = fake_int("fake_launch_pieces"), b0 = fake_int("fake_batch_calls");
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), 0);
	*launches = fake_int("fake_launches") - l0;
	*pieces = fake_int("fake_launch_pieces") - p0;
	*batches = fake_int("fake_batch_calls") - b0;
	printf("%d pieces of %zu KiB: %d launches (%d pieces), %d batch copy calls\n", N, P >> 10, *launches,
	       *pieces, *batches);
	for (int i = 0; i < N; i++)
		T_EQ_INT(ferry_batch_result(b, (size_t)i), (ssize_t)P);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, N * P), 0);
	for (int i = 0; i < N; i++)
		T_CHECK(memcmp(back + (size_t)(N - 1 - i) * P, want + (size_t)i * P, P) == 0);
	ferry_batch_destroy(b);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(d), 0);
	unlink(path);
}

/*
 * A piece whose read fails in the middle of a gathered batch (/proc/self/mem at offset 0, which is
 * not mapped: EIO): it reports its error and its destination is not written; the pieces before and
 * after it land, each with its own count.
 */
static void engine_gather_fail(void)
{
	enum { P = 4096, N = 13, BAD = 6 };
	static unsigned char want[N * P], back[N * P];
	char path[4200];
	ferry_ctx *ctx;
	ferry_file *f, *mem;
	ferry_batch *b;
	void *d = NULL;

	snprintf(path, sizeof(path), "%s/gather-fail.bin", t_tmpdir());
	t_fill_pattern(want, sizeof(want), 0, 13);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, want, sizeof(want)) == (ssize_t)sizeof(want));
	close(fd);
	T_EQ_INT(ferry_gpu_malloc(0, sizeof(back), &d), 0);
	memset(back, 0xee, sizeof(back));
	T_EQ_INT(ferry_gpu_memcpy_htod(d, back, sizeof(back)), 0);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "1"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "path", "cpu-async-gpu"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	T_ASSERT(ferry_file_open(ctx, "/proc/self/mem", FERRY_O_RDONLY, &mem) == 0);
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	for (int i = 0; i < N; i++)
		T_EQ_INT(i == BAD ? ferry_batch_add_read(b, mem, 0, P, (char *)d + (size_t)i * P)
				  : ferry_batch_add_read(b, f, (uint64_t)i * P, P, (char *)d + (size_t)i * P), i);
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), -EIO);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	for (int i = 0; i < N; i++) {
		T_EQ_INT(ferry_batch_result(b, (size_t)i), i == BAD ? -EIO : P);
		if (i == BAD)
			T_CHECK(back[(size_t)i * P] == 0xee && back[(size_t)i * P + P - 1] == 0xee);
		else
			T_CHECK(memcmp(back + (size_t)i * P, want + (size_t)i * P, P) == 0);
	}
	ferry_batch_destroy(b);
	ferry_file_destroy(mem);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(ferry_gpu_free(d), 0);
	unlink(path);
}

static int sc_gather(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	const char *kind = getenv("FERRY_CUDA_LIBRARY");

	T_ASSERT(cu != NULL);
	bool batch = strstr(kind, "batch") != NULL;
	T_CHECK((cu->MemcpyBatchAsync_v2 != NULL) == (strstr(kind, "cuda_batch.so") != NULL));
	T_CHECK((cu->MemcpyBatchAsync != NULL) == (strstr(kind, "cuda_batch12.so") != NULL));
	ring_gather(batch);
	/* no scatter kernel in these fakes: counted as the one fallback of the worker's queue */
	T_EQ_INT(ferry__scatter_state(0, true), FERRY__SCATTER_NONE);
	HAS(ferry__scatter_reason(0), "cuModuleLoadData");
	uint64_t fallbacks = 0;
	engine_gather(&fallbacks);
	T_EQ_INT(fallbacks, 1);
	engine_gather_fail();
	return t_result();
}

/* A driver whose cuMemcpyBatchAsync refuses: that gather's copies go one by one, and every
 * gather after it without trying the batch call again. */
static int sc_gather_refused(void)
{
	enum { P = 4096 };
	static unsigned char src[8 * P], back[8 * P];
	struct ferry__ring_piece p[8];
	struct ferry__ring_gpu *r;
	void *d = NULL;

	T_ASSERT(ferry__cuda() != NULL && ferry__cuda()->MemcpyBatchAsync_v2 != NULL);
	T_EQ_INT(ferry__ring_can_batch(), 1);
	T_EQ_INT(ferry_gpu_malloc(0, sizeof(src), &d), 0);
	T_ASSERT(ferry__ring_create(0, 2, 0, &r) == 0);
	t_fill_pattern(src, sizeof(src), 0, 5);
	int h0 = fake_int("fake_htod_async_calls"), bytes0 = fake_int("fake_async_bytes");
	for (int i = 0; i < 8; i++)
		p[i] = (struct ferry__ring_piece){(uint64_t)(uintptr_t)d + (uint64_t)(7 - i) * P, src + i * P, P};
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 8, NULL), 0);
	T_EQ_INT(fake_int("fake_batch_attempts"), 1);
	T_EQ_INT(fake_int("fake_htod_async_calls") - h0, 8);
	T_EQ_INT(fake_int("fake_async_bytes") - bytes0, 8 * P);
	T_EQ_INT(ferry__ring_can_batch(), 0);
	T_EQ_INT(ferry__ring_h2d_gather(r, p, 8, NULL), 0);
	T_EQ_INT(fake_int("fake_batch_attempts"), 1);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	for (int i = 0; i < 8; i++)
		T_CHECK(memcmp(back + (size_t)(7 - i) * P, src + (size_t)i * P, P) == 0);
	ferry__ring_destroy(r);
	T_EQ_INT(ferry_gpu_free(d), 0);
	engine_gather(NULL);
	T_EQ_INT(fake_int("fake_batch_attempts"), 1);
	return t_result();
}

/*
 * ferry__scatter_launch on its own: N pieces of 1 B to 64 KiB at unaligned places, read through
 * the mapping of registered host memory (the fake gives mapped memory addresses of its own), one
 * of length 0 left out, in two launches (64 pieces each at most); every piece's bytes land and
 * nothing between them is written. A source given as the plain host address fails, naming the launch.
 */
static void scatter_pieces(void)
{
	enum { N = 100, MAXP = 64 << 10, HOLE = 7 };
	static unsigned char host[N * (MAXP + 16)], back[N * (MAXP + 16)], want[N * (MAXP + 16)];
	struct ferry__scatter_piece p[N];
	struct ferry__ring_gpu *r;
	uint64_t seed = 22, hp = 0;
	void *d = NULL;
	unsigned launches = 0;

	T_EQ_INT(ferry__cuda_set_device(0), 0);
	T_EQ_INT(ferry__cuda()->MemHostRegister(host, sizeof(host), FERRY__CU_MEMHOSTREGISTER_PORTABLE |
						FERRY__CU_MEMHOSTREGISTER_DEVICEMAP), 0);
	T_EQ_INT(ferry__scatter_host_ptr(0, host, &hp), 0);
	T_CHECK(hp != 0);
	T_EQ_INT(ferry_gpu_malloc(0, sizeof(back), &d), 0);
	T_ASSERT(ferry__ring_create(0, 2, 0, &r) == 0);
	t_fill_pattern(host, sizeof(host), 0, 3);
	memset(want, 0xee, sizeof(want));
	T_EQ_INT(ferry_gpu_memcpy_htod(d, want, sizeof(want)), 0);
	size_t soff = 0, doff = 0;
	for (int i = 0; i < N; i++) {
		size_t len = i == HOLE ? 0 : i < 4 ? (size_t)i + 1 : 1 + t_rand(&seed) % MAXP;
		soff += t_rand(&seed) % 16;
		doff += t_rand(&seed) % 16;
		p[i] = (struct ferry__scatter_piece){hp + soff, (uint64_t)(uintptr_t)d + doff, len};
		memcpy(want + doff, host + soff, len);
		soff += len;
		doff += len;
	}
	int pieces0 = fake_int("fake_launch_pieces");
	T_EQ_INT(ferry__scatter_launch(0, ferry__ring_stream(r), p, N, &launches), 0);
	T_EQ_INT(launches, 2);
	T_EQ_INT(fake_int("fake_launch_pieces") - pieces0, N - 1);
	T_EQ_INT(ferry__ring_drain(r), 0);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d, sizeof(back)), 0);
	T_CHECK(memcmp(back, want, sizeof(back)) == 0);

	p[0].src = (uint64_t)(uintptr_t)host; /* not the mapping */
	T_EQ_INT(ferry__scatter_launch(0, ferry__ring_stream(r), p, 1, &launches), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuLaunchKernel(ferry_scatter, 1 pieces) on device 0");
	T_EQ_INT(ferry__scatter_state(0, false), FERRY__SCATTER_READY); /* a failure is not a refusal */
	ferry__ring_destroy(r);
	T_EQ_INT(ferry_gpu_free(d), 0);
	T_EQ_INT(ferry__cuda()->MemHostUnregister(host), 0);
}

/*
 * A driver with the kernel API (cuda_kernel.so): the module is loaded once per device, when first
 * asked for, from the PTX the library embeds (the fake checks its entry and argument size); the
 * engine's gathers of small pieces then go in launches, not copies, each piece with its own result
 * as before, and no fallback is counted; gathers of 64 KiB pieces stay with the copy engine.
 */
static int sc_gather_kernel(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	char size[32];

	T_ASSERT(cu != NULL);
	T_ASSERT(cu->ModuleLoadData && cu->ModuleGetFunction && cu->LaunchKernel && cu->MemHostGetDevicePointer);
	snprintf(size, sizeof(size), "[%zu]", sizeof(struct ferry__scatter_args));
	HAS(ferry__scatter_ptx, size);
	HAS(ferry__scatter_ptx, ".entry " FERRY__SCATTER_ENTRY "(");
	T_EQ_INT(ferry__scatter_state(0, false), FERRY__SCATTER_LOADING);
	T_EQ_INT(fake_int("fake_module_loads"), 0);
	T_EQ_INT(ferry__scatter_state(0, true), FERRY__SCATTER_READY);
	T_EQ_INT(ferry__scatter_state(0, true), FERRY__SCATTER_READY);
	T_EQ_INT(fake_int("fake_module_loads"), 1);
	T_EQ_INT(strcmp(ferry__scatter_reason(0), ""), 0);
	scatter_pieces();

	int l0 = fake_int("fake_launches"), b0 = fake_int("fake_batch_calls");
	uint64_t fallbacks = 99;
	engine_gather(&fallbacks);
	T_CHECK(fake_int("fake_launches") > l0);
	T_EQ_INT(fake_int("fake_batch_calls") - b0, 0); /* a gather of one piece is a plain copy */
	T_EQ_INT(fallbacks, 0);
	int p0 = fake_int("fake_launch_pieces");
	engine_gather_fail();
	T_CHECK(fake_int("fake_launch_pieces") > p0);
	int launches, pieces, batches;
	engine_gather_pieces(28 << 10, &launches, &pieces, &batches);
	T_EQ_INT(launches, 2); /* a gather out each 256 KiB, while the round's reads go on */
	T_EQ_INT(pieces, 16);
	T_EQ_INT(batches, 0);
	/* pieces of 64 KiB are the copy engine's (SCATTER_PIECE_MAX): one batch copy at the round's
	 * end, no launch and no early send, as with the kernel off */
	engine_gather_pieces(64 << 10, &launches, &pieces, &batches);
	T_EQ_INT(launches, 0);
	T_EQ_INT(pieces, 0);
	T_EQ_INT(batches, 1);
	T_EQ_INT(ferry__scatter_state(1, true), FERRY__SCATTER_READY);
	T_EQ_INT(fake_int("fake_module_loads"), 2);
	return t_result();
}

/* A driver that refuses the launch: the first gather's pieces are copied instead and land, the
 * kernel is off for the process (its reason names the launch), counted as the queue's fallback. */
static int sc_gather_kernel_refused(void)
{
	uint64_t fallbacks = 0;

	T_EQ_INT(ferry__scatter_state(0, true), FERRY__SCATTER_READY);
	engine_gather(&fallbacks);
	T_EQ_INT(fake_int("fake_launch_attempts"), 1);
	T_EQ_INT(fake_int("fake_launches"), 0);
	T_EQ_INT(ferry__scatter_state(0, false), FERRY__SCATTER_NONE);
	HAS(ferry__scatter_reason(0), "cuLaunchKernel");
	T_EQ_INT(fallbacks, 1);
	return t_result();
}

/* FERRY_SCATTER=0: the kernel is not loaded, gathers copy, and that is no fallback. */
static int sc_gather_kernel_off(void)
{
	uint64_t fallbacks = 99;

	setenv("FERRY_SCATTER", "0", 1);
	T_EQ_INT(ferry__scatter_state(0, true), FERRY__SCATTER_OFF);
	HAS(ferry__scatter_reason(0), "FERRY_SCATTER=0");
	engine_gather(&fallbacks);
	T_EQ_INT(fake_int("fake_module_loads"), 0);
	T_EQ_INT(fake_int("fake_launch_attempts"), 0);
	T_EQ_INT(fallbacks, 0);
	/* copies: the round's 16 pieces in one batch call at its end, not one per 256 KiB */
	int launches, pieces, batches;
	engine_gather_pieces(64 << 10, &launches, &pieces, &batches);
	T_EQ_INT(launches, 0);
	T_EQ_INT(batches, 1);
	return t_result();
}

static int sc_fake_attrs(void)
{
	const struct ferry__cuda_api *cu = ferry__cuda();

	T_ASSERT(cu != NULL);
	T_CHECK(cu->PointerGetAttributes != NULL);
	mem_kinds_and_copies();
	return t_result();
}

static int scratch_fd(void)
{
	char path[4200];
	int fd;

	snprintf(path, sizeof(path), "%s/gpu_shim_scratch", t_tmpdir());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	unlink(path);
	return fd;
}

static int sc_cufile_5027(void)
{
	ferry__CUfileHandle_t fh = (void *)&fh;
	char why[1024];
	int code = -1, fd = scratch_fd();

	T_ASSERT(ferry__cufile() != NULL);
	T_EQ_INT(ferry__gds_probe_fd(fd, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, "cuFileHandleRegister: CU_FILE_HANDLE_NOT_REGISTERED (5027): file descriptor is not registered");
	HAS(why, "cuFile could not read the volume's attributes");
	HAS(why, "pipelined bounce path");
	if (access("/run/udev", F_OK) != 0)
		HAS(why, "/run/udev absent");
	else
		HAS(why, "CUFILE_LOGGING_LEVEL=INFO");
	T_EQ_INT(ferry__gds_handle_register(fd, &fh, &code, NULL, 0), FERRY_ENOGDS);
	T_EQ_INT(code, 5027);
	T_CHECK(fh == (void *)&fh);
	HAS(ferry_last_error(), "cuFileHandleRegister(fd ");
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_opens"), 1);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_live_handles"), 0);
	close(fd);
	return t_result();
}

static int sc_cufile_ok(void)
{
	const struct ferry__cufile_api *cf = ferry__cufile();
	ferry__CUfileHandle_t fh = NULL;
	char why[1024];
	int st, fd = scratch_fd();

	T_ASSERT(cf != NULL);
	T_EQ_INT(cf->version, 1150);
	T_CHECK(cf->DriverClose != NULL); /* found under its old name */
	T_CHECK(cf->has & FERRY__CUFILE_HAS_STREAM);
	T_CHECK(cf->ReadAsync && cf->WriteAsync && cf->StreamRegister && cf->StreamDeregister);
	/* one batch symbol missing: the whole batch group is absent */
	T_CHECK(!(cf->has & FERRY__CUFILE_HAS_BATCH));
	T_CHECK(!cf->BatchIOSetUp && !cf->BatchIOSubmit && !cf->BatchIOGetStatus && !cf->BatchIODestroy);
	T_CHECK(cf->DriverGetProperties == NULL);
	st = ferry__gds_probe_fd(fd, why, sizeof(why));
	if (access("/proc/driver/nvidia-fs/version", F_OK) == 0) {
		T_EQ_INT(st, FERRY__GDS_NATIVE);
	} else {
		T_EQ_INT(st, FERRY__GDS_COMPAT);
		HAS(why, "compatibility mode");
	}
	T_EQ_INT(ferry__gds_probe_fd(fd, why, sizeof(why)), st);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_opens"), 1);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_live_handles"), 0);
	T_EQ_INT(ferry__gds_handle_register(fd, &fh, NULL, NULL, 0), 0);
	T_CHECK(fh != NULL);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_live_handles"), 1);
	ferry__gds_handle_deregister(fh);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_live_handles"), 0);
	/* a bad descriptor comes back as cuFile's invalid-value error */
	T_EQ_INT(ferry__gds_probe_fd(-1, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, "CU_FILE_INVALID_VALUE (5022)");
	close(fd);
	return t_result();
}

/* Device-to-storage scenarios' data: n bytes of a pattern (seed) in src, copied to d0 on device dev,
 * and a second device buffer d1 to read back into. */
static void device_pair(int dev, size_t n, unsigned seed, uint8_t **src, uint8_t **back, void **d0, void **d1)
{
	*src = malloc(n);
	*back = malloc(n);
	T_ASSERT(*src && *back);
	for (size_t i = 0; i < n; i++)
		(*src)[i] = (uint8_t)(i * seed + (i >> 12));
	T_EQ_INT(ferry_gpu_malloc(dev, n, d0), 0);
	T_EQ_INT(ferry_gpu_malloc(dev, n, d1), 0);
	T_EQ_INT(ferry_gpu_memcpy_htod(*d0, *src, n), 0);
}

/*
 * The cufile backend, an ops set like psync and io_uring. With the fake CUDA's device memory (host
 * memory it calls device memory) and the fake cuFile (pread and pwrite underneath, its batch API
 * doing each op at submit), device writes and reads through path=gds (a cuFileWrite or cuFileRead
 * per op) and path=gds-batch (cuFile's batch API) land every byte in its place across several
 * chunks, a read past the end comes back short, and the file's path info names the mode. The
 * backend's own ring gives a failed op back with its tag and -errno.
 */
static int sc_cufile_io(void)
{
	enum { N = 3 << 20 };
	static const char *const modes[] = {"gds", "gds-batch"};
	char path[4200], why[1024];
	uint8_t *src, *back;
	void *d0 = NULL, *d1 = NULL;

	device_pair(0, N, 13, &src, &back, &d0, &d1);
	snprintf(path, sizeof(path), "%s/cufile_io.bin", t_tmpdir());
	for (int m = 0; m < 2; m++) {
		ferry_ctx *ctx;
		ferry_file *f;
		unlink(path);
		T_ASSERT(ferry_ctx_create(&ctx) == 0);
		T_EQ_INT(ferry_ctx_set(ctx, "path", modes[m]), 0);
		T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "1m"), 0);
		T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR | FERRY_O_CREAT, &f) == 0);
		if (!ferry_file_is_direct(f)) {
			ferry_file_destroy(f);
			ferry_ctx_destroy(ctx);
			printf("skipped: %s refuses O_DIRECT, which cuFile needs\n", t_tmpdir());
			return T_EXIT_SKIP;
		}
		T_EQ_INT(ferry_pwrite(f, d0, N, 0), N);
		memset(back, 0, N);
		T_EQ_INT(ferry_gpu_memcpy_htod(d1, back, N), 0);
		T_EQ_INT(ferry_pread(f, d1, N, 0), N);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
		T_CHECK(memcmp(back, src, N) == 0);
		T_EQ_INT(ferry_pread(f, d1, 1 << 20, N - 4096), 4096);
		/* cuFile did the I/O, per call or in batches: 3 + 3 one-MiB chunks, and the short read's
		 * two (its range crosses the 3 MiB boundary) */
		T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", m ? "fake_batch_ops" : "fake_rw_calls"), 8);
		ferry_file_destroy(f);
		ferry_ctx_destroy(ctx);
	}
	unlink(path);

	const struct ferry__backend_ops *cf = &ferry__backend_cufile;
	struct ferry__ring *r;
	void *tag = NULL;
	int64_t res = 0;
	char buf[16];
	T_EQ_INT(cf->probe(why, sizeof(why)), 0);
	T_ASSERT(cf->ring_init(&r, 4, NULL) == 0);
	struct ferry__op bad = {.fd = -1, .fixed_file = -1, .buf_index = -1, .handle = (void *)(size_t)(0x1000 - 1),
				.dev = 0, .addr = buf, .len = sizeof(buf), .tag = buf};
	T_EQ_INT(cf->prep(r, &bad), 0);
	T_EQ_INT(cf->submit(r), 1);
	T_EQ_INT(cf->reap(r, 1, &tag, &res, 1), 1);
	T_CHECK(tag == buf);
	T_EQ_INT(res, -EBADF);
	cf->ring_exit(r);
	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	free(src);
	free(back);
	return t_result();
}

/*
 * The engine's bounce path on the fake CUDA: device memory written to a file and read back through
 * the copy ring in each mode that stages through pinned slots (cpu-gpu: synchronous copies;
 * cpu-async-gpu and auto: asynchronous, a ticket per chunk; pagecache-gpu: buffered reads), whole
 * and at an unaligned offset, length and address; the resident file read in copy units (1 MiB units
 * of 256 KiB chunks, on the device's shared unit ring); and a stream-ordered read (a fence on the
 * caller's stream).
 */
static int sc_bounce(void)
{
	enum { N = (5 << 20) + 12345, U = 100001, UOFF = 4097 };
	static const char *const modes[] = {"cpu-gpu", "cpu-async-gpu", "pagecache-gpu", "auto"};
	char path[4200];
	uint8_t *src, *back;
	void *d0 = NULL, *d1 = NULL;

	device_pair(1, N, 29, &src, &back, &d0, &d1);
	snprintf(path, sizeof(path), "%s/bounce.bin", t_tmpdir());
	for (int m = 0; m < 4; m++) {
		ferry_ctx *ctx;
		ferry_file *f;
		ferry_req *req;
		unlink(path);
		T_ASSERT(ferry_ctx_create(&ctx) == 0);
		T_EQ_INT(ferry_ctx_set(ctx, "path", modes[m]), 0);
		T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "256k"), 0);
		T_EQ_INT(ferry_ctx_set(ctx, "copy_unit", "1m"), 0);
		T_EQ_INT(ferry_ctx_set(ctx, "threads", "2"), 0);
		T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR | FERRY_O_CREAT, &f) == 0);
		T_EQ_INT(ferry_pwrite(f, d0, N, 0), N);
		/* the O_DIRECT write left nothing in the page cache: a buffered read puts it there */
		int fd = open(path, O_RDONLY);
		T_ASSERT(fd >= 0);
		T_EQ_INT(pread(fd, back, N, 0), N);
		close(fd);
		T_CHECK(memcmp(back, src, N) == 0);
		memset(back, 0, N);
		T_EQ_INT(ferry_gpu_memcpy_htod(d1, back, N), 0);
		T_EQ_INT(ferry_pread(f, d1, N, 0), N);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
		T_CHECK(memcmp(back, src, N) == 0);
		T_EQ_INT(ferry_pread(f, (char *)d1 + 3, U, UOFF), U);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, (char *)d1 + 3, U), 0);
		T_CHECK(memcmp(back, src + UOFF, U) == 0);
		T_EQ_INT(ferry_pread_stream(f, d1, N, 0, NULL, &req), 0);
		T_EQ_INT(ferry_req_wait(req, -1), N);
		ferry_req_destroy(req);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
		T_CHECK(memcmp(back, src, N) == 0);
		if (m == 1 || m == 3) /* the file is in the page cache: its reads went in copy units */
			T_CHECK(ferry_ctx_stat(ctx, FERRY_STAT_UNIT_COPIES) > 0);
		ferry_file_destroy(f);
		ferry_ctx_destroy(ctx);
	}
	unlink(path);
	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	free(src);
	free(back);
	return t_result();
}

/* A void function a fake library exports for the test to steer it. */
static void fake_call(const char *sym, void *arg)
{
	void *h = dlopen(getenv("FERRY_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
	void (*fn)(void *) = NULL;

	T_ASSERT(h);
	*(void **)&fn = dlsym(h, sym);
	T_ASSERT(fn);
	fn(arg);
	dlclose(h);
}

/*
 * Stream-ordered requests on one worker. A read and a write whose caller's stream has not reached
 * their start (the fake's held stream: its events unfired, its host functions waiting) touch
 * neither the caller's buffer nor the file, and they do not hold up a request queued after them
 * on the same worker: before, the worker's copy stream waited for their start, so every copy
 * queued behind it did too, and a caller's stream held for an earlier request (its host function)
 * could never reach the later one's start, a hang seen on the 2-GPU machine. Released, they land.
 */
static int sc_stream_order(void)
{
	enum { N = (1 << 20) + 4096 };
	static char held; /* the caller's stream: any handle; the fake holds it */
	const int64_t wait_ns = 10 * 1000000000LL;
	char path[4200];
	uint8_t *src, *back, *zero = calloc(1, N);
	void *d0 = NULL, *d1 = NULL, *d2 = NULL;
	ferry_ctx *ctx;
	ferry_file *f;
	ferry_req *ra, *rw, *rb;

	T_ASSERT(zero);
	device_pair(1, N, 37, &src, &back, &d0, &d1);
	T_EQ_INT(ferry_gpu_malloc(1, N, &d2), 0);
	T_EQ_INT(ferry_gpu_memcpy_htod(d1, zero, N), 0);
	snprintf(path, sizeof(path), "%s/stream-order.bin", t_tmpdir());
	unlink(path);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "path", "cpu-async-gpu"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "1"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR | FERRY_O_CREAT, &f) == 0);
	T_EQ_INT(ferry_pwrite(f, d0, N, 0), N);

	fake_call("fake_hold_stream", &held);
	T_EQ_INT(ferry_pread_stream(f, d1, N, 0, &held, &ra), 0);
	T_EQ_INT(ferry_pwrite_stream(f, d0, N, N, &held, &rw), 0); /* the file's second half */
	/* queued after them on the only worker, on no stream: done while they wait */
	T_EQ_INT(ferry_pread_async(f, d2, N, 0, &rb), 0);
	ssize_t got = ferry_req_wait(rb, wait_ns);
	if (got != N) /* held up by the waiting ones: a failure, not a hang */
		fake_call("fake_release_stream", NULL);
	T_EQ_INT(got, N);
	ferry_req_destroy(rb);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d2, N), 0);
	T_CHECK(memcmp(back, src, N) == 0);
	usleep(20000);
	T_CHECK(!ferry_req_done(ra) && !ferry_req_done(rw));
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
	T_CHECK(memcmp(back, zero, N) == 0); /* nothing copied before the start */
	T_EQ_INT(ferry_file_size(f), N);      /* nothing written either */

	fake_call("fake_release_stream", NULL);
	T_EQ_INT(ferry_req_wait(ra, wait_ns), N);
	T_EQ_INT(ferry_req_wait(rw, wait_ns), N);
	ferry_req_destroy(ra);
	ferry_req_destroy(rw);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
	T_CHECK(memcmp(back, src, N) == 0);
	T_EQ_INT(ferry_pread(f, d2, N, N), N);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d2, N), 0);
	T_CHECK(memcmp(back, src, N) == 0);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	unlink(path);
	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	T_EQ_INT(ferry_gpu_free(d2), 0);
	free(src);
	free(back);
	free(zero);
	return t_result();
}

/*
 * A fresh process's first read into device memory (issue 22). A read of resident data goes
 * through the device's copy units and pins none of the workers' bounce slots (each worker
 * registered its 16 slots at its first chunk before), and only the units it uses (one
 * cuMemHostAlloc of all four before); a read that bounces through the slots
 * (gathered small pieces) pins the slots of the workers that carried it, then. Where the driver
 * says the process already uses the device (cuDevicePrimaryCtxGetState, cuda_state.so), the
 * workers make their copy streams and worker 0 the copy units as soon as they are up, before any
 * request; elsewhere (cuda_ok.so) nothing GPU happens before the first request into device
 * memory. Every byte lands either way.
 */
static int sc_lazy_slots(void)
{
	enum { THREADS = 3, N = (6 << 20) + 8192, P = 4096, PIECES = 64 };
	const char *kind = getenv("FERRY_CUDA_LIBRARY");
	bool state = strstr(kind, "cuda_state.so") != NULL;
	char path[4200];
	uint8_t *src, *back;
	void *d0 = NULL, *d1 = NULL;
	ferry_ctx *ctx;
	ferry_file *f;

	T_ASSERT(ferry__cuda() != NULL);
	T_CHECK((ferry__cuda()->DevicePrimaryCtxGetState != NULL) == state);
	device_pair(0, N, 31, &src, &back, &d0, &d1); /* retains device 0's context: in use */
	snprintf(path, sizeof(path), "%s/lazy-slots.bin", t_tmpdir());
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, src, N) == N); /* and in the page cache */
	close(fd);
	int pinned0 = fake_ranges(1), streams0 = fake_int("fake_streams_made");
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "3"), 0);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	/* the units' buffers: made one by one, each at its first use (the read below uses unit 0
	 * alone: 7 chunks of 1 MiB in units of 8), or all four by worker 0 at its start */
	int units = state ? 4 : 1;
	if (state) {
		/* the workers ready their GPU side after the start returns: THREADS streams and the
		 * units' stream, and the units' pinned buffers */
		for (int i = 0; i < 2000 && (fake_ranges(1) - pinned0 < units ||
					     fake_int("fake_streams_made") - streams0 < THREADS + 1); i++)
			usleep(1000);
		T_EQ_INT(fake_int("fake_streams_made") - streams0, THREADS + 1);
		T_EQ_INT(fake_ranges(1) - pinned0, units);
	} else {
		usleep(20000);
		T_EQ_INT(fake_int("fake_streams_made") - streams0, 0);
		T_EQ_INT(fake_ranges(1) - pinned0, 0);
	}
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	memset(back, 0, N);
	T_EQ_INT(ferry_gpu_memcpy_htod(d1, back, N), 0);
	T_EQ_INT(ferry_pread(f, d1, N, 0), N);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
	T_CHECK(memcmp(back, src, N) == 0);
	T_CHECK(ferry_ctx_stat(ctx, FERRY_STAT_UNIT_COPIES) > 0);
	printf("%s: after a resident read in copy units: %d pinned ranges made, %d streams\n", kind,
	       fake_ranges(1) - pinned0, fake_int("fake_streams_made") - streams0);
	/* the units' buffers only: no worker's slots */
	T_EQ_INT(fake_ranges(1) - pinned0, units);

	/* small pieces bounce through the slots: the workers that carry them pin theirs now */
	ferry_batch *b;
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	for (int i = 0; i < PIECES; i++)
		T_EQ_INT(ferry_batch_add_read(b, f, (uint64_t)(PIECES - 1 - i) * P * 3 + 17, P, (char *)d1 + (size_t)i * P), i);
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), 0);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, (size_t)PIECES * P), 0);
	for (int i = 0; i < PIECES; i++)
		T_CHECK(memcmp(back + (size_t)i * P, src + (size_t)(PIECES - 1 - i) * P * 3 + 17, P) == 0);
	int slots = fake_ranges(1) - pinned0 - units;
	printf("after %d small pieces: the slots of %d of %d workers pinned\n", PIECES, slots, THREADS);
	T_CHECK(slots >= 1 && slots <= THREADS);
	ferry_batch_destroy(b);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(fake_ranges(1), pinned0); /* units and slots given back */
	unlink(path);
	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	free(src);
	free(back);
	return t_result();
}

/*
 * ferry_ctx_start after requests started the workers (issue 24: a job that saves, then loads into
 * GPU memory, starting its context ahead of the load): the running workers ready their GPU side
 * (a stream each and the units' stream, the units pinned) as a start ahead of any request does;
 * a start made by a host request alone makes none of it.
 */
static int sc_late_start(void)
{
	enum { THREADS = 3, N = 1 << 20 };
	char path[4200];
	uint8_t *src, *back;
	void *d0 = NULL, *d1 = NULL;
	ferry_ctx *ctx;
	ferry_file *f;

	T_ASSERT(ferry__cuda() != NULL && ferry__cuda()->DevicePrimaryCtxGetState != NULL);
	device_pair(0, N, 7, &src, &back, &d0, &d1); /* retains device 0's context: in use */
	snprintf(path, sizeof(path), "%s/late-start.bin", t_tmpdir());
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, src, N) == N);
	close(fd);
	int pinned0 = fake_ranges(1), streams0 = fake_int("fake_streams_made");
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "3"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	memset(back, 0, N);
	/* into host memory, through the workers (a lone ferry_pread may be done by the caller): the
	 * request starts them */
	ferry_batch *b;
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	T_EQ_INT(ferry_batch_add_read(b, f, 0, N / 2, back), 0);
	T_EQ_INT(ferry_batch_add_read(b, f, N / 2, N / 2, back + N / 2), 1);
	T_EQ_INT(ferry_batch_submit(b), 0);
	T_EQ_INT(ferry_batch_wait(b, -1), 0);
	ferry_batch_destroy(b);
	T_CHECK(memcmp(back, src, N) == 0);
	usleep(20000);
	T_EQ_INT(fake_int("fake_streams_made") - streams0, 0);
	T_EQ_INT(fake_ranges(1) - pinned0, 0);
	T_EQ_INT(ferry_ctx_start(ctx), 0);
	for (int i = 0; i < 2000 && (fake_ranges(1) - pinned0 < 4 ||
				     fake_int("fake_streams_made") - streams0 < THREADS + 1); i++)
		usleep(1000);
	T_EQ_INT(fake_int("fake_streams_made") - streams0, THREADS + 1);
	T_EQ_INT(fake_ranges(1) - pinned0, 4);
	T_EQ_INT(ferry_ctx_start(ctx), 0); /* again: nothing more */
	usleep(20000);
	T_EQ_INT(fake_int("fake_streams_made") - streams0, THREADS + 1);
	T_EQ_INT(ferry_pread(f, d1, N, 0), N); /* and the GPU read works */
	memset(back, 0, N);
	T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d1, N), 0);
	T_CHECK(memcmp(back, src, N) == 0);
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	T_EQ_INT(fake_ranges(1), pinned0);
	unlink(path);
	T_EQ_INT(ferry_gpu_free(d0), 0);
	T_EQ_INT(ferry_gpu_free(d1), 0);
	free(src);
	free(back);
	return t_result();
}

/*
 * One context driving two GPUs (issue 28): requests into device 0's and device 1's memory in flight
 * at once on one worker (threads=1, so one queue holds chunks of both devices, with a copy ring
 * each): small chunks are gathered per device and a chunk for the other device sends the gather
 * out first. Every byte lands on the device its buffer is on.
 */
static int sc_two_devices(void)
{
	enum { N = 2 << 20, PIECE = 96 << 10, NP = N / PIECE };
	char path[4200];
	uint8_t *src = malloc(N), *back = malloc(N);
	void *d[2] = {NULL, NULL};
	ferry_req *req[NP];
	ferry_ctx *ctx;
	ferry_file *f;
	int dev = -1;

	T_ASSERT(src && back);
	for (size_t i = 0; i < N; i++)
		src[i] = (uint8_t)(i * 31 + (i >> 11));
	snprintf(path, sizeof(path), "%s/two_devices.bin", t_tmpdir());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0);
	T_EQ_INT(pwrite(fd, src, N, 0), N);
	close(fd);
	T_EQ_INT(ferry_gpu_malloc(0, N, &d[0]), 0);
	T_EQ_INT(ferry_gpu_malloc(1, N, &d[1]), 0);
	T_EQ_INT(ferry_mem_kind(d[1], &dev), FERRY_MEM_DEVICE);
	T_EQ_INT(dev, 1);
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_EQ_INT(ferry_ctx_set(ctx, "path", "cpu-async-gpu"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "chunk_size", "64k"), 0);
	T_EQ_INT(ferry_ctx_set(ctx, "threads", "1"), 0);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	/* pieces alternate between the devices; each device gets every other piece */
	for (int i = 0; i < NP; i++)
		T_EQ_INT(ferry_pread_async(f, (char *)d[i % 2] + (size_t)i * PIECE, PIECE, (uint64_t)i * PIECE, &req[i]), 0);
	for (int i = 0; i < NP; i++) {
		T_EQ_INT(ferry_req_wait(req[i], -1), PIECE);
		ferry_req_destroy(req[i]);
	}
	for (int k = 0; k < 2; k++) {
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d[k], N), 0);
		for (int i = k; i < NP; i += 2)
			T_CHECK(memcmp(back + (size_t)i * PIECE, src + (size_t)i * PIECE, PIECE) == 0);
	}
	/* and whole requests, one per device, at once */
	T_EQ_INT(ferry_pread_async(f, d[0], N, 0, &req[0]), 0);
	T_EQ_INT(ferry_pread_async(f, d[1], N, 0, &req[1]), 0);
	for (int k = 0; k < 2; k++) {
		T_EQ_INT(ferry_req_wait(req[k], -1), N);
		ferry_req_destroy(req[k]);
		memset(back, 0, N);
		T_EQ_INT(ferry_gpu_memcpy_dtoh(back, d[k], N), 0);
		T_CHECK(memcmp(back, src, N) == 0);
	}
	ferry_file_destroy(f);
	ferry_ctx_destroy(ctx);
	unlink(path);
	T_EQ_INT(ferry_gpu_free(d[0]), 0);
	T_EQ_INT(ferry_gpu_free(d[1]), 0);
	free(src);
	free(back);
	/* the pinned ceiling of both devices at once; a device listed twice or missing is named */
	double htod = 0, dtoh = 0;
	T_EQ_INT(ferry_gpu_copy_ceiling_all((const int[]){0, 1}, 2, 1 << 20, 3, &htod, &dtoh), 0);
	T_CHECK(htod > 0 && dtoh > 0);
	T_EQ_INT(ferry_gpu_copy_ceiling_all((const int[]){1, 1}, 2, 1 << 20, 3, &htod, &dtoh), -EINVAL);
	HAS(ferry_last_error(), "device 1 is listed twice");
	T_EQ_INT(ferry_gpu_copy_ceiling_all((const int[]){0, 2}, 2, 1 << 20, 3, &htod, &dtoh), -EINVAL);
	HAS(ferry_last_error(), "CUDA device 2 does not exist (2 visible)");
	return t_result();
}

static int sc_cufile_missing(void)
{
	char why[1024];

	T_CHECK(ferry__cuda() != NULL);
	T_CHECK(ferry__cufile() == NULL);
	HAS(ferry__cufile_unavailable_reason(), "symbol cuFileRead missing from libcufile.so.0");
	T_EQ_INT(ferry__gds_probe_fd(0, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, "symbol cuFileRead missing");
	HAS(ferry_last_error(), "symbol cuFileRead missing");
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_opens"), 0);
	return t_result();
}

static int sc_cufile_open(void)
{
	char why[1024];
	int fd = scratch_fd();

	T_CHECK(ferry__cufile() != NULL);
	T_EQ_INT(ferry__gds_probe_fd(fd, why, sizeof(why)), FERRY__GDS_REFUSED);
	HAS(why, "cuFileDriverOpen: CU_FILE_DRIVER_NOT_INITIALIZED (5001)");
	T_EQ_INT(ferry__gds_probe_fd(fd, why, sizeof(why)), FERRY__GDS_REFUSED);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_opens"), 1);
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_registers"), 0);
	close(fd);
	return t_result();
}

static int sc_cufile_nocuda(void)
{
	char why[1024];

	T_CHECK(ferry__cufile() == NULL);
	HAS(ferry__cufile_unavailable_reason(), "GPUDirect Storage needs CUDA");
	T_EQ_INT(ferry_gds_status("/", why, sizeof(why)), FERRY_ENOGPU);
	/* libcufile is never even opened */
	T_EQ_INT(fake_counter("FERRY_CUFILE_LIBRARY", "fake_opens"), -1);
	return t_result();
}

static int sc_nvml_init(void)
{
	T_CHECK(ferry__nvml() == NULL);
	HAS(ferry__nvml_unavailable_reason(), "nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9): Driver Not Loaded");
	return t_result();
}

static int sc_nvml_ok(void)
{
	const struct ferry__nvml_api *nv = ferry__nvml();
	struct ferry__nvml_device_info info;

	T_ASSERT(nv != NULL);
	T_EQ_STR(nv->driver_version, "999.1.2");
	T_EQ_INT(nv->device_count, 1);
	T_CHECK(nv->DeviceGetCurrentClocksEventReasons != NULL); /* via the old name */
	T_CHECK(nv->DeviceGetNumaNodeId == NULL);
	T_EQ_INT(ferry__nvml_device_info(0, &info), 0);
	T_EQ_STR(info.name, "Fake GPU");
	T_EQ_STR(info.bus_id, "00000000:18:00.0");
	T_EQ_INT(info.mem_total, 80ll << 30);
	T_EQ_INT(info.mem_used, 1ll << 30);
	T_EQ_INT(info.util_gpu, 7);
	T_EQ_INT(info.pcie_gen, 5);
	T_EQ_INT(info.pcie_width, 16);
	T_EQ_INT(info.pcie_width_max, -1);
	T_EQ_INT(info.pcie_tx_kibps, 1000);
	T_EQ_INT(info.pcie_rx_kibps, 2000);
	T_EQ_INT(info.persistence, 1);
	T_EQ_INT(info.numa_node, -1);
	T_EQ_INT(info.clocks_event_reasons, 4);
	T_EQ_INT(ferry__nvml_device_info(1, &info), -EINVAL);
	return t_result();
}

/* ------------------------------------------------------------------------------------ driver */

struct fake {
	const char *out, *src, *defs;
};

static const struct fake fakes[] = {
	{ "cuda_ok.so", "fake_libcuda.c", "-DFAKE_DEVICES=2" },
	{ "cuda_attrs.so", "fake_libcuda.c", "-DFAKE_DEVICES=2 -DFAKE_ATTRIBUTES" },
	{ "cuda_meminfo.so", "fake_libcuda.c", "-DFAKE_MEMINFO" },
	{ "cuda_state.so", "fake_libcuda.c", "-DFAKE_DEVICES=2 -DFAKE_CTX_STATE" },
	{ "cuda_batch.so", "fake_libcuda.c", "-DFAKE_DEVICES=2 -DFAKE_BATCH" },
	{ "cuda_batch12.so", "fake_libcuda.c", "-DFAKE_BATCH12" },
	{ "cuda_batch_refuse.so", "fake_libcuda.c", "-DFAKE_BATCH -DFAKE_BATCH_REFUSE" },
	{ "cuda_kernel.so", "fake_libcuda.c", "-DFAKE_DEVICES=2 -DFAKE_BATCH -DFAKE_KERNEL" },
	{ "cuda_kernel_refuse.so", "fake_libcuda.c", "-DFAKE_BATCH -DFAKE_KERNEL -DFAKE_LAUNCH_REFUSE" },
	{ "cuda_ckpt.so", "fake_libcuda.c", "-DFAKE_CHECKPOINT" },
	{ "cuda_ckpt_partial.so", "fake_libcuda.c", "-DFAKE_CHECKPOINT -DcuCheckpointProcessRestore=renamed_r "
	  "-DcuCheckpointProcessGetRestoreThreadId=renamed_t" },
	{ "cuda_missing.so", "fake_libcuda.c", "-DcuMemcpyHtoDAsync_v2=renamed_1" },
	{ "cuda_missing2.so", "fake_libcuda.c", "-DcuStreamCreate=renamed_1 -DcuMemcpyHtoDAsync_v2=renamed_2" },
	{ "cuda_nodevice.so", "fake_libcuda.c", "-DFAKE_INIT_RESULT=100" },
	{ "cuda_zero.so", "fake_libcuda.c", "-DFAKE_DEVICES=0" },
	{ "cufile_5027.so", "fake_libcufile.c", "-DFAKE_REGISTER_RESULT=5027 -DFAKE_CLOSE_V2" },
	{ "cufile_ok.so", "fake_libcufile.c", "-DcuFileBatchIOCancel=renamed_1" },
	{ "cufile_batch.so", "fake_libcufile.c", "" },
	{ "cufile_missing.so", "fake_libcufile.c", "-DcuFileRead=renamed_1 -DFAKE_CLOSE_V2" },
	{ "cufile_open.so", "fake_libcufile.c", "-DFAKE_OPEN_RESULT=5001 -DFAKE_CLOSE_V2" },
	{ "nvml_ok.so", "fake_libnvml.c", "" },
	{ "nvml_init.so", "fake_libnvml.c", "-DFAKE_NVML_INIT=9" },
};

/* ------------------------------------------------- the checkpoint API (tools/snapshot.c) */

static const char *ckpt_trace(void)
{
	void *h = dlopen(getenv("FERRY_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
	const char *(*fn)(void);
	const char *v;

	if (!h)
		return "";
	*(void **)&fn = dlsym(h, "fake_ckpt_trace");
	v = fn ? fn() : "";
	dlclose(h);
	return v;
}

/* A driver without the checkpoint API (before 570): every entry point named, nothing called. */
static int sc_ckpt_absent(void)
{
	struct ferry_snapshot_driver d;
	int st = -1;

	T_CHECK(ferry__cuda() != NULL);
	T_CHECK(ferry__cuda()->CheckpointProcessLock == NULL);
	T_EQ_INT(ferry_snapshot_driver_probe(&d), -ENOTSUP);
	T_EQ_INT(d.usable, 1);
	T_EQ_INT(d.driver_version, 12080);
	T_EQ_INT(d.present, 0);
	HAS(d.missing, "cuCheckpointProcessGetState, cuCheckpointProcessLock, cuCheckpointProcessCheckpoint, "
		       "cuCheckpointProcessRestore, cuCheckpointProcessUnlock, cuCheckpointProcessGetRestoreThreadId");
	HAS(d.why, "the CUDA driver (12.8) lacks the checkpoint API");
	HAS(d.why, "drivers 570 and later");
	T_EQ_INT(ferry_snapshot_gpu_suspend(getpid(), 0), -ENOTSUP);
	HAS(ferry_last_error(), "cuCheckpointProcessLock");
	T_EQ_INT(ferry_snapshot_gpu_state(getpid(), &st), -ENOTSUP);
	T_EQ_INT(st, -1);
	return t_result();
}

/* Some present, some not: the absent ones named, the call refused before any runs. */
static int sc_ckpt_partial(void)
{
	struct ferry_snapshot_driver d;

	T_EQ_INT(ferry_snapshot_driver_probe(&d), -ENOTSUP);
	T_EQ_INT(d.present, 4);
	T_EQ_STR(d.missing, "cuCheckpointProcessRestore, cuCheckpointProcessGetRestoreThreadId");
	T_CHECK(ferry__cuda()->CheckpointProcessLock != NULL);
	T_EQ_INT(ferry_snapshot_gpu_resume(getpid()), -ENOTSUP);
	HAS(ferry_last_error(), "cuCheckpointProcessRestore, cuCheckpointProcessGetRestoreThreadId missing");
	T_EQ_STR(ckpt_trace(), "");
	return t_result();
}

static int sc_ckpt_nodriver(void)
{
	struct ferry_snapshot_driver d;

	T_EQ_INT(ferry_snapshot_driver_probe(&d), FERRY_ENOGPU);
	T_EQ_INT(d.usable, 0);
	HAS(d.why, "no usable CUDA driver: libcuda.so.1 not loaded from /nonexistent/libcuda.so.1");
	T_EQ_INT(ferry_snapshot_take(getpid(), "/nonexistent/snap", NULL, NULL), FERRY_ENOGPU);
	HAS(ferry_last_error(), "cannot snapshot pid");
	HAS(ferry_last_error(), "libcuda.so.1 not loaded");
	return t_result();
}

static int state_of(int pid)
{
	int st = -1;
	T_EQ_INT(ferry_snapshot_gpu_state(pid, &st), 0);
	return st;
}

/* lock -> checkpoint -> restore -> unlock, and what each failure leaves. */
static int sc_ckpt_states(void)
{
	struct ferry_snapshot_driver d;
	char pid_s[32];
	int pid = (int)getpid(), st = -1;

	snprintf(pid_s, sizeof(pid_s), "%d", pid);
	setenv("FAKE_CKPT_PID", pid_s, 1);
	unsetenv("FAKE_CKPT_FAIL");
	T_EQ_INT(ferry_snapshot_driver_probe(&d), 0);
	T_EQ_INT(d.present, 6);
	T_EQ_STR(d.missing, "");

	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 500), 0);
	T_EQ_INT(state_of(pid), FERRY_SNAP_CHECKPOINTED);
	/* twice: the lock refuses (401), the state is said */
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 0), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessLock(pid ");
	HAS(ferry_last_error(), "CUDA_ERROR_ILLEGAL_STATE (401)");
	HAS(ferry_last_error(), "; its GPU state is now checkpointed");
	T_EQ_INT(ferry_snapshot_gpu_resume(pid), 0);
	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);
	/* resuming a running process does nothing */
	T_EQ_INT(ferry_snapshot_gpu_resume(pid), 0);
	HAS(ckpt_trace(), "state,lock,checkpoint,state,lock,state,state,restore,unlock,state,state");

	/* another pid: the driver's error, nothing changed */
	T_EQ_INT(ferry_snapshot_gpu_state(pid + 100000, &st), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessGetState(pid ");
	HAS(ferry_last_error(), "CUDA_ERROR_INVALID_VALUE (1)");

	/* the lock times out: still running */
	setenv("FAKE_CKPT_FAIL", "lock", 1);
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 10), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessLock(pid ");
	HAS(ferry_last_error(), "timeout 10 ms): CUDA_ERROR_NOT_READY (600)");
	HAS(ferry_last_error(), "; its GPU state is now running");

	/* the checkpoint fails: unlocked again */
	setenv("FAKE_CKPT_FAIL", "checkpoint", 1);
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 0), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessCheckpoint(pid ");
	HAS(ferry_last_error(), "CUDA_ERROR_NOT_SUPPORTED (801)");
	HAS(ferry_last_error(), "CUDA_ERROR_NOT_SUPPORTED (801): fake error: a CUDA driver call failed; unlocked again, the process runs on");
	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);

	/* the checkpoint fails and so does the unlock: both said, the state (locked) too */
	setenv("FAKE_CKPT_FAIL", "checkpoint,unlock", 1);
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 0), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessCheckpoint(pid ");
	HAS(ferry_last_error(), "; and then cuCheckpointProcessUnlock(pid ");
	HAS(ferry_last_error(), "; its GPU state is now locked");
	T_EQ_INT(state_of(pid), FERRY_SNAP_LOCKED);
	/* from locked, resume is the unlock alone */
	unsetenv("FAKE_CKPT_FAIL");
	T_EQ_INT(ferry_snapshot_gpu_resume(pid), 0);
	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);

	/* the restore fails: the driver says FAILED, and resume refuses from there */
	T_EQ_INT(ferry_snapshot_gpu_suspend(pid, 0), 0);
	setenv("FAKE_CKPT_FAIL", "restore", 1);
	T_EQ_INT(ferry_snapshot_gpu_resume(pid), FERRY_ECUDA);
	HAS(ferry_last_error(), "cuCheckpointProcessRestore(pid ");
	HAS(ferry_last_error(), "CUDA_ERROR_UNKNOWN (999)");
	HAS(ferry_last_error(), "; its GPU state is now failed");
	T_EQ_INT(ferry_snapshot_gpu_resume(pid), FERRY_ECUDA);
	HAS(ferry_last_error(), "its GPU state is failed: it cannot be resumed");
	T_EQ_STR(ferry_snapshot_state_name(FERRY_SNAP_FAILED), "failed");
	T_EQ_STR(ferry_snapshot_state_name(7), "unknown");
	return t_result();
}

/* A stand-in for criu: --version, check, dump and restore, each writing what it was given into
 * args.txt in the images directory; $FAKE_CRIU_FAIL=1 makes dump fail as CRIU does (log line). */
static const char fake_criu[] =
	"#!/bin/sh\n"
	"case \"$1\" in\n"
	"--version) echo 'Version: 3.17.1'; exit 0;;\n"
	"check) echo 'Warn  (criu/kerndat.c:1): something optional'; echo 'Looks good.'; exit 0;;\n"
	"esac\n"
	"d=; prev=; for a in \"$@\"; do [ \"$prev\" = -D ] && d=$a; prev=$a; done\n"
	"echo \"$*\" >>\"$d/args.txt\"\n"
	"if [ \"$1\" = dump ]; then\n"
	"  echo image >\"$d/core-1.img\"\n"
	"  if [ \"${FAKE_CRIU_FAIL:-0}\" = 1 ]; then\n"
	"    printf '(00.01) Error (criu/cr-dump.c:2093): Dumping FAILED.\\n' >\"$d/dump.log\"; exit 1\n"
	"  fi\n"
	"  echo '(00.02) Dumping finished successfully' >\"$d/dump.log\"\n"
	"else\n"
	"  echo '(00.03) Restore finished successfully' >\"$d/restore.log\"\n"
	"fi\n"
	"exit 0\n";

static char *slurp(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, len - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = '\0';
	return buf;
}

static int sc_snapshot_criu(void)
{
	char base[4096], criu[4200], d1[4200], d2[4200], d3[4200], p[4300], buf[4096], pid_s[32];
	struct ferry_snapshot_criu c;
	struct ferry_snapshot_opts o = {.lock_timeout_ms = 0, .leave_running = 0, .criu_args = "--ext-unix-sk  --x"};
	int pid = (int)getpid();
	double t[2] = {-1, -1};

	snprintf(base, sizeof(base), "%s/gpu_shim_snap_%d", t_tmpdir(), pid);
	T_ASSERT(mkdir(base, 0755) == 0 || errno == EEXIST);
	snprintf(criu, sizeof(criu), "%s/criu", base);
	FILE *f = fopen(criu, "w");
	T_ASSERT(f && fputs(fake_criu, f) >= 0 && fclose(f) == 0);
	T_ASSERT(chmod(criu, 0755) == 0);
	snprintf(pid_s, sizeof(pid_s), "%d", pid);
	setenv("FAKE_CKPT_PID", pid_s, 1);

	setenv("FERRY_CRIU", "/nonexistent/criu", 1);
	T_EQ_INT(ferry_snapshot_criu_probe(&c, 0), -ENOENT);
	HAS(ferry_last_error(), "FERRY_CRIU=/nonexistent/criu is not an executable file");
	snprintf(d1, sizeof(d1), "%s/s1", base);
	T_EQ_INT(ferry_snapshot_take(pid, d1, &o, t), -ENOENT);
	HAS(ferry_last_error(), "cannot snapshot pid");

	setenv("FERRY_CRIU", criu, 1);
	T_EQ_INT(ferry_snapshot_criu_probe(&c, 1), 0);
	T_EQ_STR(c.path, criu);
	T_EQ_STR(c.version, "Version: 3.17.1");
	T_EQ_INT(c.check_rc, 0);
	T_EQ_STR(c.check, "Looks good.");

	/* dump fails: GPU resumed, the process runs on, no manifest, CRIU's error quoted */
	setenv("FAKE_CRIU_FAIL", "1", 1);
	T_EQ_INT(ferry_snapshot_take(pid, d1, &o, t), -EIO);
	HAS(ferry_last_error(), "criu dump -t ");
	HAS(ferry_last_error(), "failed (exit 1): Error (criu/cr-dump.c:2093): Dumping FAILED. (log: ");
	HAS(ferry_last_error(), "/s1/dump.log)");
	HAS(ferry_last_error(), "dump.log); its GPU state was resumed, the process runs on: Input/output error");
	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);
	snprintf(p, sizeof(p), "%s/ferry-snapshot.json", d1);
	T_CHECK(access(p, F_OK) != 0);
	/* d1 now holds CRIU's files: a second snapshot into it is refused */
	unsetenv("FAKE_CRIU_FAIL");
	T_EQ_INT(ferry_snapshot_take(pid, d1, &o, t), -EEXIST);
	HAS(ferry_last_error(), "not empty");

	/* dump succeeds: checkpointed (the real process would have ended), the manifest written */
	snprintf(d2, sizeof(d2), "%s/s2", base);
	T_EQ_INT(ferry_snapshot_take(pid, d2, &o, t), 0);
	T_CHECK(t[0] >= 0 && t[1] >= 0);
	T_EQ_INT(state_of(pid), FERRY_SNAP_CHECKPOINTED);
	snprintf(p, sizeof(p), "%s/args.txt", d2);
	HAS(slurp(p, buf, sizeof(buf)), "dump -t ");
	HAS(buf, " --shell-job -o dump.log -v4 --ext-unix-sk --x\n");
	T_CHECK(!strstr(buf, "--leave-running"));
	snprintf(p, sizeof(p), "%s/ferry-snapshot.json", d2);
	HAS(slurp(p, buf, sizeof(buf)), "\"format\":\"ferry-snapshot\",\"version\":1,\"pid\":");
	HAS(buf, "\"driver_version\":12080,\"criu\":\"Version: 3.17.1\",\"left_running\":0");
	/* the process is checkpointed: a second snapshot is refused before CRIU runs */
	snprintf(d3, sizeof(d3), "%s/s3", base);
	T_EQ_INT(ferry_snapshot_take(pid, d3, &o, t), -EBUSY);
	HAS(ferry_last_error(), "its GPU state is checkpointed, not running");
	T_CHECK(access(d3, F_OK) != 0); /* the directory it made is gone again */

	/* restore: refused while the pid is in use (it is ours) */
	T_EQ_INT(ferry_snapshot_restore(d2, &o, t), -EEXIST);
	HAS(ferry_last_error(), "is in use, and CRIU restores the process under its old pid");
	/* a pid that has ended stands for the dumped process: CRIU restores it, the GPU resumes */
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	T_ASSERT(dead > 0 && waitpid(dead, NULL, 0) == dead);
	char man[512];
	snprintf(man, sizeof(man), "{\"format\":\"ferry-snapshot\",\"version\":1,\"pid\":%d}\n", (int)dead);
	snprintf(p, sizeof(p), "%s/ferry-snapshot.json", d2);
	f = fopen(p, "w");
	T_ASSERT(f && fputs(man, f) >= 0 && fclose(f) == 0);
	snprintf(pid_s, sizeof(pid_s), "%d", (int)dead);
	setenv("FAKE_CKPT_PID", pid_s, 1);
	T_EQ_INT(ferry_snapshot_restore(d2, &o, t), (int)dead);
	T_EQ_INT(state_of((int)dead), FERRY_SNAP_RUNNING);
	snprintf(p, sizeof(p), "%s/args.txt", d2);
	HAS(slurp(p, buf, sizeof(buf)), " --shell-job --restore-detached -o restore.log -v4 --ext-unix-sk --x\n");
	HAS(ckpt_trace(), "restore,unlock");

	/* --leave-running: the GPU state resumed after the dump */
	setenv("FAKE_CKPT_PID", pid_s, 1);
	o.leave_running = 1;
	T_EQ_INT(ferry_snapshot_take((int)getpid(), d3, &o, t), FERRY_ECUDA); /* not the fake's pid */
	HAS(ferry_last_error(), "cuCheckpointProcessGetState");
	snprintf(pid_s, sizeof(pid_s), "%d", pid);
	setenv("FAKE_CKPT_PID", pid_s, 1);
	T_CHECK(access(d3, F_OK) != 0);
	T_EQ_INT(ferry_snapshot_take(pid, d3, &o, t), 0);
	T_EQ_INT(state_of(pid), FERRY_SNAP_RUNNING);
	snprintf(p, sizeof(p), "%s/args.txt", d3);
	HAS(slurp(p, buf, sizeof(buf)), " --leave-running");
	snprintf(p, sizeof(p), "%s/ferry-snapshot.json", d3);
	HAS(slurp(p, buf, sizeof(buf)), "\"left_running\":1");

	/* a directory without a manifest is not a snapshot */
	T_EQ_INT(ferry_snapshot_restore(base, &o, t), -ENOENT);
	HAS(ferry_last_error(), "ferry-snapshot.json: cannot open it");
	T_CHECK(t_rmtree(base) == 0);
	return t_result();
}

struct scenario {
	const char *name;
	int (*run)(void);
	const char *cuda, *cufile, *nvml; /* NULL: leave unset; "/": a path that does not exist */
};

#define NX "/nonexistent/"
static const struct scenario scenarios[] = {
	{ "absent", sc_absent, NX "libcuda.so.1", NX "libcufile.so.0", NX "libnvidia-ml.so.1" },
	{ "default", sc_default, NULL, NULL, NULL },
	{ "missing", sc_missing, "cuda_missing.so", NX "c", NX "n" },
	{ "missing2", sc_missing2, "cuda_missing2.so", NX "c", NX "n" },
	{ "nodevice", sc_nodevice, "cuda_nodevice.so", NX "c", NX "n" },
	{ "zerodevices", sc_zerodevices, "cuda_zero.so", NX "c", NX "n" },
	{ "fake", sc_fake, "cuda_ok.so", NX "libcufile.so.0", NX "n" },
	{ "fake_attrs", sc_fake_attrs, "cuda_attrs.so", NX "c", NX "n" },
	{ "save_snapshot", sc_save_snapshot, "cuda_meminfo.so", NX "c", NX "n" },
	{ "gather_batch", sc_gather, "cuda_batch.so", NX "c", NX "n" },
	{ "gather_batch12", sc_gather, "cuda_batch12.so", NX "c", NX "n" },
	{ "gather_none", sc_gather, "cuda_ok.so", NX "c", NX "n" },
	{ "gather_refused", sc_gather_refused, "cuda_batch_refuse.so", NX "c", NX "n" },
	{ "gather_kernel", sc_gather_kernel, "cuda_kernel.so", NX "c", NX "n" },
	{ "gather_kernel_refused", sc_gather_kernel_refused, "cuda_kernel_refuse.so", NX "c", NX "n" },
	{ "gather_kernel_off", sc_gather_kernel_off, "cuda_kernel.so", NX "c", NX "n" },
	{ "cufile_5027", sc_cufile_5027, "cuda_ok.so", "cufile_5027.so", NX "n" },
	{ "cufile_ok", sc_cufile_ok, "cuda_ok.so", "cufile_ok.so", NX "n" },
	{ "cufile_io", sc_cufile_io, "cuda_ok.so", "cufile_batch.so", NX "n" },
	{ "bounce", sc_bounce, "cuda_ok.so", NX "c", NX "n" },
	{ "stream_order", sc_stream_order, "cuda_ok.so", NX "c", NX "n" },
	{ "lazy_slots", sc_lazy_slots, "cuda_ok.so", NX "c", NX "n" },
	{ "lazy_slots_state", sc_lazy_slots, "cuda_state.so", NX "c", NX "n" },
	{ "late_start", sc_late_start, "cuda_state.so", NX "c", NX "n" },
	{ "two_devices", sc_two_devices, "cuda_ok.so", NX "c", NX "n" },
	{ "cufile_missing", sc_cufile_missing, "cuda_ok.so", "cufile_missing.so", NX "n" },
	{ "cufile_open", sc_cufile_open, "cuda_ok.so", "cufile_open.so", NX "n" },
	{ "cufile_nocuda", sc_cufile_nocuda, NX "libcuda.so.1", "cufile_ok.so", NX "n" },
	{ "nvml_ok", sc_nvml_ok, NX "c", NX "c", "nvml_ok.so" },
	{ "nvml_init", sc_nvml_init, NX "c", NX "c", "nvml_init.so" },
	{ "ckpt_absent", sc_ckpt_absent, "cuda_ok.so", NX "c", NX "n" },
	{ "ckpt_partial", sc_ckpt_partial, "cuda_ckpt_partial.so", NX "c", NX "n" },
	{ "ckpt_nodriver", sc_ckpt_nodriver, NX "libcuda.so.1", NX "c", NX "n" },
	{ "ckpt_states", sc_ckpt_states, "cuda_ckpt.so", NX "c", NX "n" },
	{ "snapshot_criu", sc_snapshot_criu, "cuda_ckpt.so", NX "c", NX "n" },
};
#define NSCEN (sizeof(scenarios) / sizeof(scenarios[0]))

static void set_lib(const char *env, const char *v)
{
	if (!v)
		unsetenv(env);
	else if (v[0] == '/')
		setenv(env, v, 1);
	else
		setenv(env, lib(v), 1);
}

static int needs_fakes(const struct scenario *s)
{
	const char *v[3] = { s->cuda, s->cufile, s->nvml };
	for (int i = 0; i < 3; i++)
		if (v[i] && v[i][0] != '/')
			return 1;
	return 0;
}

/* The directory of this source file, where fakes/ lives. */
static const char *fakes_src(void)
{
	static char path[4096];
	const char *root = getenv("FERRY_SOURCE_DIR");

	snprintf(path, sizeof(path), "%s", __FILE__);
	char *slash = strrchr(path, '/');
	if (slash) {
		snprintf(slash, sizeof(path) - (size_t)(slash - path), "/fakes");
		if (access(path, R_OK) == 0)
			return path;
	}
	if (root) {
		snprintf(path, sizeof(path), "%s/tests/unit/fakes", root);
		if (access(path, R_OK) == 0)
			return path;
	}
	return NULL;
}

/* Builds the fake libraries; returns 0, or -1 with the reason in why. */
static int build_fakes(char *why, size_t len)
{
	const char *src = fakes_src(), *cc = getenv("CC");
	char cmd[8192];

	if (!src) {
		snprintf(why, len, "tests/unit/fakes not found from %s", __FILE__);
		return -1;
	}
	if (!cc || !*cc)
		cc = "cc";
	for (size_t i = 0; i < sizeof(fakes) / sizeof(fakes[0]); i++) {
		snprintf(cmd, sizeof(cmd), "%s -shared -fPIC -O1 -fvisibility=hidden -o '%s' %s '%s/%s' -lpthread 2>&1",
			 cc, lib(fakes[i].out), fakes[i].defs, src, fakes[i].src);
		int rc = system(cmd);
		if (rc != 0) {
			snprintf(why, len, "cannot build fake %s with %s (exit %d): %.1000s", fakes[i].out,
				 cc, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, cmd);
			return -1;
		}
	}
	return 0;
}

static int run_child(const char *self, const struct scenario *s)
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		set_lib("FERRY_CUDA_LIBRARY", s->cuda);
		set_lib("FERRY_CUFILE_LIBRARY", s->cufile);
		set_lib("FERRY_NVML_LIBRARY", s->nvml);
		execl(self, self, s->name, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
	char why[8192], self[4096];
	int failed = 0, passed = 0, skipped = 0, have_fakes;
	ssize_t n;

	snprintf(libdir_path, sizeof(libdir_path), "%s/gpu_shim_fakes", t_tmpdir());
	mkdir(libdir_path, 0755);
	dir = libdir_path;
	if (argc > 1) {
		for (size_t i = 0; i < NSCEN; i++)
			if (strcmp(argv[1], scenarios[i].name) == 0)
				return scenarios[i].run();
		fprintf(stderr, "unknown scenario %s\n", argv[1]);
		return T_EXIT_FAIL;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	T_ASSERT(n > 0);
	self[n] = '\0';
	have_fakes = build_fakes(why, sizeof(why)) == 0;
	if (!have_fakes)
		printf("fake libraries not built: %s\n", why);
	for (size_t i = 0; i < NSCEN; i++) {
		const struct scenario *s = &scenarios[i];
		if (needs_fakes(s) && !have_fakes) {
			printf("%-16s skipped (no fake libraries)\n", s->name);
			skipped++;
			continue;
		}
		int rc = run_child(self, s);
		printf("%-16s %s\n", s->name, rc == 0 ? "ok" : rc == T_EXIT_SKIP ? "skipped" : "FAILED");
		fflush(stdout);
		if (rc == 0)
			passed++;
		else if (rc == T_EXIT_SKIP)
			skipped++;
		else
			failed++;
	}
	printf("scenarios: %d ok, %d failed, %d skipped\n", passed, failed, skipped);
	if (failed)
		return T_EXIT_FAIL;
	if (skipped)
		T_SKIP("%d scenario(s) could not run here: %s", skipped, have_fakes ? "see above" : why);
	return T_EXIT_PASS;
}
