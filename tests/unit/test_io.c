/*
 * The engine end to end, once per backend (argv[1]: psync | io_uring; CTest runs both, and again
 * with FERRY_FAULT_INJECT making short transfers, EINTR and EAGAIN happen): writes read back,
 * random unaligned ranges and buffers through every API (sync, async, batch, queue), reads past
 * end of file, zero-length transfers, errors. FERRY_TEST_PER_BACKEND
 */
#include <fcntl.h>
#include <pthread.h>

#include "ferry_test.h"
#include "ferry/ferry.h"

#define FILE_SIZE ((8u << 20) + 777u) /* not a multiple of any chunk or block size */

static const char *backend;
static unsigned char *expect; /* what the file must hold */
static uint64_t seed = 42;

static ferry_ctx *make_ctx(const char *direct, const char *chunk)
{
	ferry_ctx *ctx;

	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "backend", backend) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "direct", direct) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "chunk_size", chunk) == 0);
	T_ASSERT(ferry_ctx_set(ctx, "threads", "3") == 0);
	int r = ferry_ctx_start(ctx);
	if (r) {
		fprintf(stderr, "ctx start: %s\n", ferry_last_error());
		exit(T_EXIT_FAIL);
	}
	T_EQ_STR(ferry_ctx_backend(ctx), backend);
	return ctx;
}

/* A buffer whose address is off by `skew` bytes from page alignment. */
static unsigned char *skewed(size_t len, size_t skew, void **base, size_t *blen)
{
	*blen = len + skew + 4096;
	*base = ferry_alloc_aligned(*blen);
	T_ASSERT(*base);
	return (unsigned char *)*base + skew;
}

static uint64_t rnd_off(void)
{
	uint64_t off = t_rand(&seed) % FILE_SIZE;
	if (t_rand(&seed) % 3 == 0)
		off -= off % 4096;
	return off;
}

static size_t rnd_len(void)
{
	static const size_t lens[] = {1, 511, 512, 4096, 4097, 65536, 65536 + 3, 300000, 1 << 20};
	size_t len = t_rand(&seed) % 4 ? lens[t_rand(&seed) % 9] : t_rand(&seed) % (3u << 20);
	return len;
}

/* Checks a read of [off, off+len) that returned n into buf (sentinel 0xA5 beyond). */
static void check_read(const char *what, const unsigned char *buf, size_t len, uint64_t off, int64_t n)
{
	int64_t want = off >= FILE_SIZE ? 0 : (int64_t)(FILE_SIZE - off < len ? FILE_SIZE - off : len);

	if (n != want) {
		fprintf(stderr, "%s: read(off %llu, len %zu) returned %lld, expected %lld (%s)\n", what,
			(unsigned long long)off, len, (long long)n, (long long)want, ferry_last_error());
		t_failures++;
		return;
	}
	if (n > 0 && memcmp(buf, expect + off, (size_t)n)) {
		fprintf(stderr, "%s: data differs at off %llu len %zu\n", what, (unsigned long long)off, len);
		t_failures++;
	}
	/* Past the count: untouched, or zero where O_DIRECT filled the rest of the last block. */
	for (size_t i = (size_t)n; i < len; i++)
		if (buf[i] != 0xA5 && buf[i] != 0) {
			fprintf(stderr, "%s: byte %zu past the count holds stale data\n", what, i);
			t_failures++;
			break;
		}
}

static void write_whole(ferry_ctx *ctx, const char *path)
{
	ferry_file *f;
	void *base;
	size_t blen;
	unsigned char *buf = skewed(FILE_SIZE, 3, &base, &blen);

	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR | FERRY_O_CREAT | FERRY_O_TRUNC, &f) == 0);
	t_fill_pattern(expect, FILE_SIZE, 0, (uint32_t)seed);
	memcpy(buf, expect, FILE_SIZE);
	T_EQ_INT(ferry_pwrite(f, buf, FILE_SIZE, 0), FILE_SIZE);
	T_EQ_INT(ferry_file_size(f), FILE_SIZE);
	T_EQ_INT(ferry_file_sync(f, 0), 0);
	ferry_file_destroy(f);
	ferry_free_aligned(base, blen);
}

static void sync_reads(ferry_file *f, int rounds)
{
	for (int i = 0; i < rounds; i++) {
		uint64_t off = rnd_off();
		size_t len = rnd_len(), blen;
		void *base;
		unsigned char *buf = skewed(len, t_rand(&seed) % 2 ? 0 : t_rand(&seed) % 4096, &base, &blen);
		memset(buf, 0xA5, len);
		check_read("ferry_pread", buf, len, off, ferry_pread(f, buf, len, off));
		ferry_free_aligned(base, blen);
	}
	/* whole file, and past the end */
	void *base;
	size_t blen;
	unsigned char *buf = skewed(FILE_SIZE + 8192, 1, &base, &blen);
	memset(buf, 0xA5, FILE_SIZE + 8192);
	check_read("whole file", buf, FILE_SIZE + 8192, 0, ferry_pread(f, buf, FILE_SIZE + 8192, 0));
	memset(buf, 0xA5, 100);
	check_read("beyond EOF", buf, 100, FILE_SIZE + 5000, ferry_pread(f, buf, 100, FILE_SIZE + 5000));
	memset(buf, 0xA5, 100);
	check_read("at EOF", buf, 100, FILE_SIZE, ferry_pread(f, buf, 100, FILE_SIZE));
	T_EQ_INT(ferry_pread(f, buf, 0, 123), 0);
	ferry_free_aligned(base, blen);
}

static void async_reads(ferry_file *f, int n)
{
	ferry_req *reqs[64];
	unsigned char *bufs[64];
	void *bases[64];
	size_t blens[64], lens[64];
	uint64_t offs[64];

	T_ASSERT(n <= 64);
	for (int i = 0; i < n; i++) {
		offs[i] = rnd_off();
		lens[i] = rnd_len();
		bufs[i] = skewed(lens[i], i % 3 ? 0 : 17, &bases[i], &blens[i]);
		memset(bufs[i], 0xA5, lens[i]);
		T_ASSERT(ferry_pread_async(f, bufs[i], lens[i], offs[i], &reqs[i]) == 0);
	}
	for (int i = n - 1; i >= 0; i--) {
		ssize_t r = ferry_req_wait(reqs[i], -1);
		T_CHECK(ferry_req_done(reqs[i]));
		check_read("async", bufs[i], lens[i], offs[i], r);
		ferry_req_destroy(reqs[i]);
		ferry_free_aligned(bases[i], blens[i]);
	}
}

static void batch_reads(ferry_ctx *ctx, ferry_file *f, int n)
{
	ferry_batch *b;
	unsigned char *bufs[128];
	void *bases[128];
	size_t blens[128], lens[128];
	uint64_t offs[128];
	int shorts = 0;

	T_ASSERT(n <= 128);
	T_ASSERT(ferry_batch_create(ctx, &b) == 0);
	for (int round = 0; round < 2; round++) { /* a batch is reusable after reset */
		shorts = 0;
		for (int i = 0; i < n; i++) {
			offs[i] = rnd_off();
			lens[i] = i % 5 == 0 ? 0 : rnd_len();
			bufs[i] = skewed(lens[i], i % 2 ? 0 : 100, &bases[i], &blens[i]);
			memset(bufs[i], 0xA5, lens[i]);
			T_EQ_INT(ferry_batch_add_read(b, f, offs[i], lens[i], bufs[i]), i);
			shorts += offs[i] + lens[i] > FILE_SIZE;
		}
		T_EQ_INT(ferry_batch_count(b), n);
		T_EQ_INT(ferry_batch_submit(b), 0);
		T_EQ_INT(ferry_batch_wait(b, -1), shorts);
		for (int i = 0; i < n; i++) {
			check_read("batch", bufs[i], lens[i], offs[i], ferry_batch_result(b, (size_t)i));
			ferry_free_aligned(bases[i], blens[i]);
		}
		ferry_batch_reset(b);
	}
	ferry_batch_destroy(b);
}

static void queue_reads(ferry_ctx *ctx, ferry_file *f, int total)
{
	ferry_queue *q;
	enum { DEPTH = 16 };
	unsigned char *bufs[DEPTH];
	void *bases[DEPTH];
	size_t blens[DEPTH], lens[DEPTH];
	uint64_t offs[DEPTH];
	void *ud[DEPTH];
	int64_t res[DEPTH];
	int issued = 0, done = 0;

	T_ASSERT(ferry_queue_create(ctx, DEPTH, &q) == 0);
	for (int i = 0; i < DEPTH; i++) {
		bufs[i] = skewed(1 << 20, i % 2 ? 0 : 9, &bases[i], &blens[i]);
		lens[i] = 0;
	}
	int free_idx[DEPTH], nfree = DEPTH;
	for (int i = 0; i < DEPTH; i++)
		free_idx[i] = i;
	while (done < total) {
		while (nfree && issued < total) {
			int i = free_idx[--nfree];
			offs[i] = rnd_off();
			lens[i] = rnd_len() % (1 << 20) + 1;
			memset(bufs[i], 0xA5, lens[i]);
			T_ASSERT(ferry_queue_read(q, f, bufs[i], lens[i], offs[i], (void *)(intptr_t)i) == 0);
			issued++;
		}
		T_ASSERT(ferry_queue_submit(q) >= 0);
		int n = ferry_queue_reap(q, 1, DEPTH, ud, res);
		T_ASSERT(n > 0);
		for (int k = 0; k < n; k++) {
			int i = (int)(intptr_t)ud[k];
			check_read("queue", bufs[i], lens[i], offs[i], res[k]);
			free_idx[nfree++] = i;
			done++;
		}
	}
	T_EQ_INT(ferry_queue_pending(q), 0);
	/* a full queue says so */
	for (int i = 0; i < DEPTH; i++)
		T_EQ_INT(ferry_queue_read(q, f, bufs[i], 4096, 0, NULL), 0);
	T_EQ_INT(ferry_queue_read(q, f, bufs[0], 4096, 0, NULL), -EBUSY);
	ferry_queue_destroy(q); /* drains what is in flight */
	for (int i = 0; i < DEPTH; i++)
		ferry_free_aligned(bases[i], blens[i]);
}

/* Random writes (sync, async, queue) against a shadow copy, then everything read back. */
static void random_writes(ferry_ctx *ctx, ferry_file *f, int rounds)
{
	ferry_queue *q;
	void *ud;
	int64_t res;

	T_ASSERT(ferry_queue_create(ctx, 4, &q) == 0);
	for (int i = 0; i < rounds; i++) {
		uint64_t off = rnd_off();
		size_t len = rnd_len(), blen;
		if (off + len > FILE_SIZE)
			len = (size_t)(FILE_SIZE - off);
		void *base;
		unsigned char *buf = skewed(len, t_rand(&seed) % 2 ? 0 : 5, &base, &blen);
		t_fill_pattern(buf, len, off, (uint32_t)(seed + (uint64_t)i));
		memcpy(expect + off, buf, len);
		switch (i % 3) {
		case 0:
			T_EQ_INT(ferry_pwrite(f, buf, len, off), len);
			break;
		case 1: {
			ferry_req *r;
			T_ASSERT(ferry_pwrite_async(f, buf, len, off, &r) == 0);
			T_EQ_INT(ferry_req_wait(r, -1), len);
			ferry_req_destroy(r);
			break;
		}
		default:
			T_EQ_INT(ferry_queue_write(q, f, buf, len, off, buf), 0);
			T_ASSERT(ferry_queue_submit(q) >= 0);
			T_EQ_INT(ferry_queue_reap(q, 1, 1, &ud, &res), 1);
			T_CHECK(ud == buf);
			T_EQ_INT(res, len);
		}
		ferry_free_aligned(base, blen);
	}
	ferry_queue_destroy(q);
	T_EQ_INT(ferry_file_size(f), FILE_SIZE);
	sync_reads(f, 5);
}

static void errors(ferry_ctx *ctx, const char *dir)
{
	ferry_file *f;
	char path[512];
	char buf[16];

	snprintf(path, sizeof(path), "%s/does-not-exist", dir);
	T_EQ_INT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f), -ENOENT);
	T_CHECK(strstr(ferry_last_error(), path) != NULL);
	T_CHECK(f == NULL);
	T_EQ_INT(ferry_file_open(ctx, dir, FERRY_O_RDONLY, &f), -EISDIR);
	T_CHECK(strstr(ferry_last_error(), "directory") != NULL);
	snprintf(path, sizeof(path), "%s/ferry-test-io.%d", dir, (int)getpid());
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDONLY, &f) == 0);
	T_EQ_INT(ferry_pwrite(f, buf, sizeof(buf), 0), -EBADF);
	T_CHECK(strstr(ferry_last_error(), "read-only") != NULL);
	T_EQ_INT(ferry_pread(f, NULL, 10, 0), -EFAULT);
	T_EQ_INT(ferry_pread(f, buf, 10, UINT64_MAX - 4), -EINVAL);
	/* stream ordering is for device memory; host memory is refused with a reason */
	ferry_req *sr = (ferry_req *)&sr;
	T_EQ_INT(ferry_pread_stream(f, buf, sizeof(buf), 0, NULL, &sr), -EINVAL);
	T_CHECK(sr == NULL);
	T_CHECK(strstr(ferry_last_error(), "host memory") != NULL);
	T_EQ_INT(ferry_pread_stream(f, buf, sizeof(buf), 0, NULL, NULL), -EINVAL);
	ferry_file_destroy(f);
	ferry_file_destroy(NULL);
}

/*
 * A queue's ring takes work from its own thread only, and files other threads open and close
 * while it exists reach its registered-file table all the same: a file opened by another thread
 * is read through the queue, and so is the file opened after that one was closed, which
 * takes the same table slot (and often the same descriptor number): the queue must read the
 * new file, not the old one. Another thread's use of the queue is refused with a reason.
 */
struct qthread {
	ferry_ctx *ctx;
	ferry_queue *q;
	const char *open_path;
	ferry_file *close_file;
	ferry_file *opened;
	int read_ret, submit_ret, reap_ret;
	int mentions_owner;
};

static void *qthread_main(void *arg)
{
	struct qthread *t = arg;
	char buf[16];
	void *ud;
	int64_t res;

	if (t->close_file)
		ferry_file_destroy(t->close_file);
	if (ferry_file_open(t->ctx, t->open_path, FERRY_O_RDONLY, &t->opened))
		t->opened = NULL;
	t->read_ret = ferry_queue_read(t->q, t->opened, buf, sizeof(buf), 0, NULL);
	t->mentions_owner = strstr(ferry_last_error(), "thread that created it") != NULL;
	t->submit_ret = ferry_queue_submit(t->q);
	t->reap_ret = ferry_queue_reap(t->q, 0, 1, &ud, &res);
	return NULL;
}

static void queue_threads(ferry_ctx *ctx, const char *dir)
{
	enum { LEN = 8192 };
	char path[2][512];
	unsigned char *buf = ferry_alloc_aligned(LEN), *fill = malloc(LEN);
	ferry_queue *q;
	ferry_file *prev = NULL;
	void *ud;
	int64_t res;

	T_ASSERT(buf && fill);
	T_ASSERT(ferry_queue_create(ctx, 4, &q) == 0);
	for (int k = 0; k < 2; k++) {
		snprintf(path[k], sizeof(path[k]), "%s/ferry-test-qthread.%d.%d", dir, (int)getpid(), k);
		memset(fill, 'A' + k, LEN);
		int fd = open(path[k], O_CREAT | O_TRUNC | O_WRONLY, 0644);
		T_ASSERT(fd >= 0);
		T_EQ_INT(write(fd, fill, LEN), LEN);
		close(fd);
	}
	for (int k = 0; k < 2; k++) {
		struct qthread t = {.ctx = ctx, .q = q, .open_path = path[k], .close_file = prev};
		pthread_t th;
		T_ASSERT(pthread_create(&th, NULL, qthread_main, &t) == 0);
		pthread_join(th, NULL);
		T_ASSERT(t.opened);
		T_EQ_INT(t.read_ret, -EINVAL);
		T_CHECK(t.mentions_owner);
		T_EQ_INT(t.submit_ret, -EINVAL);
		T_EQ_INT(t.reap_ret, -EINVAL);
		memset(buf, 0, LEN);
		T_EQ_INT(ferry_queue_read(q, t.opened, buf, LEN, 0, buf), 0);
		T_EQ_INT(ferry_queue_reap(q, 1, 1, &ud, &res), 1);
		T_EQ_INT(res, LEN);
		memset(fill, 'A' + k, LEN);
		T_CHECK(memcmp(buf, fill, LEN) == 0);
		prev = t.opened;
	}
	ferry_file_destroy(prev);
	ferry_queue_destroy(q);
	for (int k = 0; k < 2; k++)
		unlink(path[k]);
	ferry_free_aligned(buf, LEN);
	free(fill);
}

static void run(const char *dir, const char *direct, const char *chunk)
{
	char path[512];
	ferry_ctx *ctx = make_ctx(direct, chunk);
	ferry_file *f;
	char info[512];

	snprintf(path, sizeof(path), "%s/ferry-test-io.%d", dir, (int)getpid());
	write_whole(ctx, path);
	T_ASSERT(ferry_file_open(ctx, path, FERRY_O_RDWR, &f) == 0);
	ferry_file_path_info(f, info, sizeof(info));
	printf("%s direct=%s chunk=%s: %s\n", backend, direct, chunk, info);
	if (!strcmp(direct, "off"))
		T_EQ_INT(ferry_file_is_direct(f), 0);
	sync_reads(f, 60);
	async_reads(f, 48);
	batch_reads(ctx, f, 100);
	queue_reads(ctx, f, 200);
	random_writes(ctx, f, 40);
	queue_threads(ctx, dir);
	if (ferry_file_is_direct(f))
		T_CHECK(ferry_ctx_stat(ctx, FERRY_STAT_BOUNCED_CHUNKS) > 0);
	T_CHECK(ferry_ctx_stat(ctx, FERRY_STAT_BYTES_READ) > FILE_SIZE);
	T_EQ_INT(ferry_ctx_stat(ctx, FERRY_STAT_ERRORS), 0);
	if (getenv("FERRY_FAULT_INJECT"))
		T_CHECK(ferry_ctx_stat(ctx, FERRY_STAT_RETRIES) > 0);
	errors(ctx, dir);
	ferry_file_destroy(f);
	unlink(path);
	ferry_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
	const char *why;
	struct stat st;

	backend = argc > 1 ? argv[1] : "psync";
	why = ferry_backend_unavailable_reason(backend);
	if (*why)
		T_SKIP("backend %s is not available here: %s", backend, why);
	expect = malloc(FILE_SIZE);
	T_ASSERT(expect);
	run(t_tmpdir(), "auto", "64k");
	run(t_tmpdir(), "off", "1m");
	run(t_tmpdir(), "auto", "1m");
	if (stat("/dev/shm", &st) == 0 && access("/dev/shm", W_OK) == 0)
		run("/dev/shm", "auto", "128k");
	else
		printf("note: /dev/shm not writable; tmpfs case not run\n");
	free(expect);
	return t_result();
}
