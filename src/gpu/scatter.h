/*
 * ferry's kernels, in one module per device: the scatter kernel and the LZ4 walk (at the end).
 *
 * The scatter kernel: many small copies in one launch (issue 22). A gather of small reads into
 * device memory cost one cuMemcpyBatchAsync of 80-110 us for 16 pieces on the H100, 5-7 us a
 * piece that reads into host memory do not pay; one launch of this kernel copies every piece,
 * whatever their number, reading the pinned slots where the reads landed through their mapping
 * in the device's address space (no staging copy, no device memory of ferry's).
 *
 * The kernel is PTX text (src/gpu/scatter.cu, made into src/gpu/scatter_ptx.c by
 * scripts/gen-scatter-ptx.sh) that the driver compiles for its GPU when the module is loaded: once
 * per process and device, in the primary context, on a thread of its own started by the first
 * ferry__scatter_prepare, so no request waits for the JIT. Until it is loaded, and where it cannot
 * be (a driver or fake without cuModuleLoadData/cuLaunchKernel, a PTX the driver refuses,
 * FERRY_SCATTER=0), callers copy as before (ferry__ring_h2d_gather); ferry__scatter_state says which.
 */
#ifndef FERRY_GPU_SCATTER_H
#define FERRY_GPU_SCATTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kernel's argument, passed by value (cuLaunchKernel copies it): pieces per launch. */
#define FERRY__SCATTER_MAX 64
struct ferry__scatter_piece {
	uint64_t src; /* device-accessible address: device memory, or mapped pinned host memory */
	uint64_t dst; /* device memory */
	uint64_t len;
};
struct ferry__scatter_args {
	uint32_t n, pad;
	struct ferry__scatter_piece p[FERRY__SCATTER_MAX];
};
/* The PTX of ferry_scatter(struct ferry__scatter_args) (src/gpu/scatter_ptx.c, generated). */
extern const char ferry__scatter_ptx[];
#define FERRY__SCATTER_ENTRY "ferry_scatter"
#define FERRY__LZ4_WALK_ENTRY "ferry_lz4_walk"

/* ferry__scatter_state's answers */
#define FERRY__SCATTER_READY 1
#define FERRY__SCATTER_LOADING 0 /* not asked for yet, or its load is under way */
#define FERRY__SCATTER_OFF (-1)  /* FERRY_SCATTER=0: turned off by the user (not a fallback) */
#define FERRY__SCATTER_NONE (-2) /* cannot run here: ferry__scatter_reason() says why */

/* Starts loading the kernel for device dev, once per process and device, in the background. */
void ferry__scatter_prepare(int dev);
/* The kernel's state on dev (FERRY__SCATTER_*); wait: until its load is over (starting it if needed). */
int ferry__scatter_state(int dev, bool wait);
/* Why the kernel cannot run on dev ("" when it can or its load is not over). */
const char *ferry__scatter_reason(int dev);
/* Makes the kernel unusable on dev from now on (a launch the driver refused), with the reason. */
void ferry__scatter_refuse(int dev, const char *why);
/*
 * Queues the copies of the n pieces (pieces of length 0 are left out) on stream, a CUstream of
 * dev, in ceil(n / FERRY__SCATTER_MAX) launches (*launches, may be NULL). The kernel must be ready
 * (FERRY__SCATTER_READY). Returns 0 or a negative code (the failed launch named).
 */
int ferry__scatter_launch(int dev, void *stream, const struct ferry__scatter_piece *p, size_t n,
			  unsigned *launches);
/* Pieces copied by launches so far in this process (for tests and benchmarks: did the kernel run). */
uint64_t ferry__scatter_pieces(void);
/* The address through which dev's kernels reach pinned host memory host (cuMemHostGetDevicePointer,
 * dev made current). 0, or a negative code with the reason recorded. */
int ferry__scatter_host_ptr(int dev, void *host, uint64_t *out);

/*
 * The LZ4 walk (src/base/lz4_walk.h) on the GPU, over nvCOMP's batch before it runs
 * (src/gpu/nvcomp.c): so that the host need not walk each block itself, which costs it nearly a
 * decode. ferry__lz4_walk_ready: whether dev has the kernel (waiting for the module's load); once
 * true it stays true (a refused scatter launch does not take it away), so a caller that left the
 * walk to the GPU can count on nvCOMP's decoder running it.
 */
bool ferry__lz4_walk_ready(int dev);
/* Queues the walk of n chunks on stream: the device arrays src (compressed pointers), len
 * (compressed sizes) and cap (output rooms) of nvCOMP's batch; a chunk whose block does not
 * decode to exactly its room gets verdict[i] = 1 (else 0) and is pointed at dummy, a 2-byte block
 * decoding to one byte. 0, or a negative code naming the failed launch. */
int ferry__lz4_walk_launch(int dev, void *stream, uint64_t n, uint64_t src, uint64_t len, uint64_t cap,
			   uint64_t verdict, uint64_t dummy);

#endif
