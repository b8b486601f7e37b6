/*
 * gpu/nvcomp.h without a GPU: nvCOMP absent (FERRY_NVCOMP_LIB pointing nowhere), present without a
 * GPU, present without one codec's symbols, of another major version, and the whole decoder (arrays, temp space, statuses,
 * errors by chunk index) over a fake libcuda (tests/unit/fakes/fake_libcuda.c, device memory in
 * host memory) and a fake libnvcomp (fakes/fake_libnvcomp.c, libzstd and liblz4 underneath).
 * nvCOMP loads once per process, so each scenario runs in a child (this program re-executed with
 * the scenario's name and environment). tests/gpu/test_nvcomp_gpu.c runs the same check on the GPU.
 */
#include <sys/wait.h>

#include "ferry/ferry.h"
#include "ferry_test.h"
#include "nvcomp_check.h"

#define HAS(hay, needle) has_((hay), (needle), #hay, __LINE__)

static int has_(const char *hay, const char *needle, const char *expr, int line)
{
	if (hay && strstr(hay, needle))
		return 1;
	fprintf(stderr, "%s:%d: %s does not contain \"%s\": \"%s\"\n", __FILE__, line, expr, needle, hay ? hay : "(null)");
	t_failures++;
	return 0;
}

static char dir[4096];

static const char *lib(const char *name)
{
	static char path[4][4200];
	static int i;
	char *p = path[i++ % 4];
	snprintf(p, sizeof(path[0]), "%s/%s", dir, name);
	return p;
}

static int absent(void)
{
	const char *why = NULL;
	struct ferry__nvc *d = (void *)1;

	T_EQ_INT(ferry__nvc_available(FERRY__NVC_ZSTD, &why), 0);
	HAS(why, "library not found");
	HAS(why, "FERRY_NVCOMP_LIB=/nonexistent/libnvcomp.so.6");
	T_EQ_INT(ferry__nvc_available(FERRY__NVC_LZ4, NULL), 0);
	T_CHECK(ferry__nvc_version() == NULL);
	T_CHECK(ferry__nvc_path() == NULL);
	T_EQ_INT(ferry__nvc_open(0, FERRY__NVC_LZ4, &d), -ENOTSUP);
	T_CHECK(d == NULL);
	HAS(ferry_last_error(), "library not found");
	return t_result();
}

static int no_gpu(void)
{
	const char *why = NULL;
	char real[4096];

	T_EQ_INT(ferry__nvc_available(FERRY__NVC_ZSTD, &why), 0);
	HAS(why, "no GPU: ");
	HAS(why, "FERRY_CUDA_LIBRARY");
	T_ASSERT(ferry__nvc_version());
	T_EQ_STR(ferry__nvc_version(), "6.0.0");
	T_ASSERT(realpath(getenv("FERRY_NVCOMP_LIB"), real));
	T_ASSERT(ferry__nvc_path());
	T_EQ_STR(ferry__nvc_path(), real);
	return t_result();
}

static int no_zstd(void)
{
	const char *why = NULL;
	struct ferry__nvc *d = NULL;

	T_EQ_INT(ferry__nvc_available(FERRY__NVC_LZ4, &why), 1);
	T_EQ_STR(why, "");
	T_EQ_INT(ferry__nvc_available(FERRY__NVC_ZSTD, &why), 0);
	HAS(why, "symbol missing");
	HAS(why, "nvcompBatchedZstdDecompressAsync");
	T_EQ_INT(ferry__nvc_available(99, &why), 0);
	HAS(why, "unknown codec 99");
	T_EQ_INT(ferry__nvc_open(0, FERRY__NVC_ZSTD, &d), -ENOTSUP);
	HAS(ferry_last_error(), "symbol missing");
	return t_result();
}

static int old_major(void)
{
	const char *why = NULL;

	T_EQ_INT(ferry__nvc_available(FERRY__NVC_LZ4, &why), 0);
	HAS(why, "unsupported version: nvCOMP 5.1.0");
	HAS(why, "nvcomp_v5.so");
	T_CHECK(ferry__nvc_version() == NULL);
	return t_result();
}

static int batch(void)
{
	char why[512];
	int (*opts)(void);
	void *h;

	for (int codec = FERRY__NVC_LZ4; codec <= FERRY__NVC_ZSTD; codec++) {
		const char *w;
		T_EQ_INT(ferry__nvc_available(codec, &w), 1);
		if (t_nvc_check(codec, 0, why, sizeof(why)) < 0)
			T_SKIP("%s", why);
	}
	/* finish before the stream has run the batch: refused, the batch kept for a later finish */
	{
		const struct ferry__cuda_api *cu = ferry__cuda();
		void (*query)(int);
		struct t_codecs cc;
		unsigned char plain[4096], comp[8192];
		ferry__CUdeviceptr din, dout;
		struct ferry__nvc *d;
		size_t out = 0;
		T_ASSERT(t_codecs_load(&cc, why, sizeof(why)) == 0);
		t_gen_tokens(plain, sizeof(plain), 3);
		size_t clen = t_compress(&cc, FERRY__NVC_LZ4, 1, plain, sizeof(plain), comp, sizeof(comp)), cap = sizeof(plain);
		T_ASSERT(clen > 0);
		h = dlopen(getenv("FERRY_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
		T_ASSERT(h);
		*(void **)&query = dlsym(h, "fake_set_stream_query");
		T_ASSERT(query);
		T_ASSERT(cu->MemAlloc(&din, sizeof(comp)) == 0 && cu->MemAlloc(&dout, sizeof(plain)) == 0);
		T_ASSERT(cu->MemcpyHtoD(din, comp, clen) == 0);
		T_ASSERT(ferry__nvc_open(0, FERRY__NVC_LZ4, &d) == 0);
		uint64_t s = din, o = dout;
		T_EQ_INT(ferry__nvc_decompress(d, NULL, 1, &s, &clen, &o, &cap), 0);
		query(600); /* CUDA_ERROR_NOT_READY */
		T_EQ_INT(ferry__nvc_finish(d, &out), FERRY_EBUSY);
		HAS(ferry_last_error(), "still running");
		query(0);
		T_EQ_INT(ferry__nvc_finish(d, &out), 0);
		T_EQ_INT(out, sizeof(plain));
		ferry__nvc_close(d);
		cu->MemFree(din);
		cu->MemFree(dout);
	}
	/* the options struct went over zeroed (every field's default) */
	h = dlopen(getenv("FERRY_NVCOMP_LIB"), RTLD_NOW | RTLD_NOLOAD);
	T_ASSERT(h);
	*(void **)&opts = dlsym(h, "fake_nvcomp_nonzero_opts");
	T_ASSERT(opts);
	T_EQ_INT(opts(), 0);
	return t_result();
}

/* The same batches where ferry's kernels load (the fake runs the LZ4 walk on the CPU): LZ4 batches
 * are walked before nvCOMP, a crafted block refused by index (t_nvc_check's part 6). */
static int batch_walk(void)
{
	char why[512];
	int (*walks)(void), (*refused)(void);
	T_EQ_INT(ferry__nvc_walks_lz4(0), 1);
	for (int codec = FERRY__NVC_LZ4; codec <= FERRY__NVC_ZSTD; codec++)
		if (t_nvc_check(codec, 0, why, sizeof(why)) < 0)
			T_SKIP("%s", why);
	void *h = dlopen(getenv("FERRY_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
	T_ASSERT(h);
	*(void **)&walks = dlsym(h, "fake_walk_launches");
	*(void **)&refused = dlsym(h, "fake_walk_refused");
	T_ASSERT(walks && refused);
	printf("walk launches %d, blocks refused %d\n", walks(), refused());
	T_CHECK(walks() >= 4); /* LZ4's batches: 1, 2 (half room), 4 (misaligned: refused first, or run), 5, 6 */
	T_EQ_INT(refused(), 2);  /* chunk 5 given half its room, and part 6's crafted chunk 2 */
	return t_result();
}

static const struct scenario {
	const char *name;
	int (*run)(void);
	const char *nvcomp, *cuda; /* a fake's file name, a path, or NULL */
} scenarios[] = {
	{"absent", absent, "/nonexistent/libnvcomp.so.6", "/nonexistent/libcuda.so.1"},
	{"no_gpu", no_gpu, "nvcomp.so", "/nonexistent/libcuda.so.1"},
	{"no_zstd", no_zstd, "nvcomp_nozstd.so", "cuda.so"},
	{"old_major", old_major, "nvcomp_v5.so", "cuda.so"},
	{"batch", batch, "nvcomp.so", "cuda.so"},
	{"batch_walk", batch_walk, "nvcomp.so", "cuda_kernel.so"},
};
#define NSCEN (sizeof(scenarios) / sizeof(scenarios[0]))

static int build(char *why, size_t len)
{
	static const struct {
		const char *out, *src, *defs, *libs;
	} fakes[] = {
		{"cuda.so", "fake_libcuda.c", "", "-lpthread"},
		{"cuda_kernel.so", "fake_libcuda.c", "-DFAKE_KERNEL", "-lpthread"},
		{"nvcomp.so", "fake_libnvcomp.c", "", "-l:libzstd.so.1 -l:liblz4.so.1"},
		{"nvcomp_nozstd.so", "fake_libnvcomp.c", "-DFAKE_NO_ZSTD", "-l:libzstd.so.1 -l:liblz4.so.1"},
		{"nvcomp_v5.so", "fake_libnvcomp.c", "-DFAKE_VERSION=5100", "-l:libzstd.so.1 -l:liblz4.so.1"},
	};
	char src[4096], cmd[12000];
	const char *cc = getenv("CC");

	snprintf(src, sizeof(src), "%s", __FILE__);
	char *slash = strrchr(src, '/');
	T_ASSERT(slash);
	snprintf(slash, sizeof(src) - (size_t)(slash - src), "/fakes");
	if (access(src, R_OK) != 0) {
		snprintf(why, len, "tests/unit/fakes not found from %s", __FILE__);
		return -1;
	}
	for (size_t i = 0; i < sizeof(fakes) / sizeof(fakes[0]); i++) {
		snprintf(cmd, sizeof(cmd), "%s -shared -fPIC -O1 -fvisibility=hidden %s -o '%s' '%s/%s' %s 2>&1",
			 cc && *cc ? cc : "cc", fakes[i].defs, lib(fakes[i].out), src, fakes[i].src, fakes[i].libs);
		int rc = system(cmd);
		if (rc != 0) {
			snprintf(why, len, "cannot build fake %s (exit %d): %.3000s", fakes[i].out,
				 WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, cmd);
			return -1;
		}
	}
	return 0;
}

static void set_lib(const char *env, const char *v)
{
	if (!v)
		unsetenv(env);
	else
		setenv(env, v[0] == '/' ? v : lib(v), 1);
}

int main(int argc, char **argv)
{
	char why[4096], self[4096];
	int failed = 0, skipped = 0, have_fakes;
	ssize_t n;

	snprintf(dir, sizeof(dir), "%s/nvcomp_fakes", t_tmpdir());
	mkdir(dir, 0755);
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
	have_fakes = build(why, sizeof(why)) == 0;
	if (!have_fakes)
		printf("fake libraries not built: %s\n", why);
	for (size_t i = 0; i < NSCEN; i++) {
		const struct scenario *s = &scenarios[i];
		if (!have_fakes && (s->nvcomp[0] != '/' || s->cuda[0] != '/')) {
			printf("%-8s skipped (no fake libraries)\n", s->name);
			skipped++;
			continue;
		}
		fflush(stdout);
		pid_t pid = fork();
		int status = 0;
		if (pid == 0) {
			set_lib("FERRY_NVCOMP_LIB", s->nvcomp);
			set_lib("FERRY_CUDA_LIBRARY", s->cuda);
			execl(self, self, s->name, (char *)NULL);
			_exit(127);
		}
		T_ASSERT(pid > 0 && waitpid(pid, &status, 0) == pid);
		int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		printf("%-8s %s\n", s->name, rc == 0 ? "ok" : rc == T_EXIT_SKIP ? "skipped" : "FAILED");
		if (rc == T_EXIT_SKIP)
			skipped++;
		else if (rc)
			failed++;
	}
	if (failed)
		return T_EXIT_FAIL;
	if (skipped)
		T_SKIP("%d scenario(s) could not run here: %s", skipped, have_fakes ? "see above" : why);
	return T_EXIT_PASS;
}
