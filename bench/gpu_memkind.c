/*
 * What detecting the kind of a buffer costs (ferry_mem_kind: one cuPointerGetAttributes call when
 * libcuda is loaded): every ferry_pread and queued I/O does it once. Prints "TABLE" rows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ferry/ferry.h"
#include "ferry/gpu.h"

static double ns_per_call(const void *p, int n)
{
	struct timespec a, b;
	int dev, kinds = 0;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++)
		kinds += ferry_mem_kind(p, &dev);
	clock_gettime(CLOCK_MONOTONIC, &b);
	if (kinds < 0)
		printf("impossible\n");
	return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

int main(void)
{
	char why[256];
	void *host = malloc(1 << 20), *dev = NULL;

	if (ferry_gpu_available(why, sizeof(why)) && ferry_gpu_malloc(0, 1 << 20, &dev) == 0) {
		ns_per_call(host, 1000);
		printf("TABLE ferry_mem_kind(host pointer), CUDA loaded | %.0f ns | per call, 1M calls\n",
		       ns_per_call(host, 1000000));
		printf("TABLE ferry_mem_kind(device pointer) | %.0f ns | per call, 1M calls\n",
		       ns_per_call(dev, 1000000));
		ferry_gpu_free(dev);
	} else {
		printf("TABLE ferry_mem_kind(host pointer), no GPU | %.0f ns | per call (%s)\n",
		       ns_per_call(host, 1000000), why);
	}
	free(host);
	return 0;
}
