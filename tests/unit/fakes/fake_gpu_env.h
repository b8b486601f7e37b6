/*
 * For tests that run GPU code paths without a GPU: builds the fake CUDA driver (with pointer
 * attributes) and the fake nvCOMP of this folder with $CC (cc) into the test's temporary
 * directory and points FERRY_CUDA_LIBRARY and FERRY_NVCOMP_LIB at them (each read when the library
 * first loads it), with FERRY_CZ_EXPECT_NVCOMP=1; with FERRY_FAKE_KERNELS=1 the driver runs ferry's
 * kernels too (-DFAKE_KERNEL). Skips the test (exit 77, saying why) where they
 * do not build. `file` is the calling test's __FILE__ (the fakes sit in fakes/ beside it); `name`
 * names the libraries. fake_gpu_env_done() removes them.
 */
#ifndef FERRY_FAKE_GPU_ENV_H
#define FERRY_FAKE_GPU_ENV_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry_test.h"

struct fake_gpu_env {
	char cuda[1200], nvcomp[1200];
};

static int fake_gpu_build(const char *cc, const char *src_dir, const char *out, const char *src, const char *flags)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "%s -shared -fPIC -O1 -fvisibility=hidden %s -o '%s' '%s/%s' -lpthread %s 2>&1", cc,
		 strstr(src, "nvcomp") ? "" : flags, out, src_dir, src, strstr(src, "nvcomp") ? flags : "");
	return system(cmd);
}

static void fake_gpu_env_done(struct fake_gpu_env *e)
{
	unlink(e->cuda);
	unlink(e->nvcomp);
}

static void fake_gpu_env_setup(struct fake_gpu_env *e, const char *file, const char *name)
{
	char src_dir[1024];
	snprintf(src_dir, sizeof(src_dir), "%s", file);
	char *slash = strrchr(src_dir, '/');
	snprintf(slash ? slash + 1 : src_dir, sizeof(src_dir) - (slash ? (size_t)(slash + 1 - src_dir) : 0), "fakes");
	const char *cc = getenv("CC");
	if (!cc || !*cc)
		cc = "cc";
	snprintf(e->cuda, sizeof(e->cuda), "%s/%s.%d.cuda.so", t_tmpdir(), name, (int)getpid());
	snprintf(e->nvcomp, sizeof(e->nvcomp), "%s/%s.%d.nvcomp.so", t_tmpdir(), name, (int)getpid());
	/* FERRY_FAKE_KERNELS=1: the driver runs ferry's kernels too (the scatter kernel's copies, the
	 * LZ4 walk on the CPU), so the paths that launch them run */
	const char *k = getenv("FERRY_FAKE_KERNELS");
	const bool kernels = k && !strcmp(k, "1");
	if (fake_gpu_build(cc, src_dir, e->cuda, "fake_libcuda.c", kernels ? "-DFAKE_ATTRIBUTES -DFAKE_KERNEL" : "-DFAKE_ATTRIBUTES") ||
	    fake_gpu_build(cc, src_dir, e->nvcomp, "fake_libnvcomp.c", "-l:libzstd.so.1 -l:liblz4.so.1")) {
		fake_gpu_env_done(e);
		T_SKIP("the fake CUDA driver or nvCOMP did not build with %s from %s", cc, src_dir);
	}
	setenv("FERRY_CUDA_LIBRARY", e->cuda, 1);
	setenv("FERRY_NVCOMP_LIB", e->nvcomp, 1);
	setenv("FERRY_CZ_EXPECT_NVCOMP", "1", 1);
}

#endif
