/*
 * GPU decompression through nvCOMP, loaded at run time (never linked at build time), for ferry's
 * compressed chunk format (issue 26). The library is found through the FERRY_NVCOMP_LIB knob or
 * environment variable (a full path), then dlopen("libnvcomp.so.6"), then "libnvcomp.so"; the
 * Python package points FERRY_NVCOMP_LIB at the `nvidia-libnvcomp-cu13` wheel's copy when that is
 * installed. Absence is never an error at load time: ferry__nvc_available says why it cannot run,
 * and callers decompress on the CPU instead.
 *
 * Codecs: LZ4 (raw LZ4 blocks: the payload of an LZ4 frame's block, not the frame) and zstd
 * (standard zstd frames). nvCOMP does not bound its output by the room it is given, so an LZ4
 * decoder walks each batch's blocks on the GPU before nvCOMP runs (ferry__lz4_walk_launch) where
 * ferry's kernels load on its device; where they do not, the caller must have walked each block
 * on the host (ferry__cz_check_gpu_frame, told by the same ferry__nvc_walks_lz4).
 *
 * A decoder belongs to one device and is used by one thread at a time. It keeps its device scratch
 * (nvCOMP's temporary space, the device arrays of pointers and sizes, the statuses) between calls
 * and grows it when a batch needs more. The calls make the decoder's device current on the calling
 * thread.
 */
#ifndef FERRY_GPU_NVCOMP_H
#define FERRY_GPU_NVCOMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ferry__nvc_codec {
	FERRY__NVC_LZ4 = 1,
	FERRY__NVC_ZSTD = 2,
};

struct ferry__nvc;

/* 1 when nvCOMP is loaded, a GPU is present and the codec's batched decoder exists; else 0 with a
 * static string saying why in *why (may be NULL). Thread-safe; loads the library once. */
int ferry__nvc_available(int codec, const char **why);
/* nvCOMP's version as text ("6.0.0") and the path it was loaded from, or NULL when not loaded. */
const char *ferry__nvc_version(void);
const char *ferry__nvc_path(void);

/* A decoder on device dev for codec. 0 or a negative code with ferry_last_error() set (-ENOTSUP
 * with the reason when nvCOMP cannot run). */
int ferry__nvc_open(int dev, int codec, struct ferry__nvc **out);
void ferry__nvc_close(struct ferry__nvc *d);
/* The alignment in bytes nvCOMP asks of each compressed chunk's device address (at least 1). */
size_t ferry__nvc_input_align(const struct ferry__nvc *d);
/* 1 when an LZ4 decoder on dev walks each batch's blocks on the GPU before nvCOMP runs (ferry's
 * kernels load there: ferry__lz4_walk_ready, waiting for their load); 0 when each block must be
 * walked on the host first (ferry__cz_check_gpu_frame). Once 1, always 1. */
bool ferry__nvc_walks_lz4(int dev);
/* The batch index of the first chunk the last ferry__nvc_finish failed (SIZE_MAX: none), for the
 * caller to name it in its own terms. */
size_t ferry__nvc_failed(const struct ferry__nvc *d);

/*
 * Enqueues the decompression of n chunks on stream (a CUstream: the copy ring's,
 * ferry__ring_stream, so the copies of the compressed bytes into device memory come first).
 * src[i] (src_len[i] bytes) and dst[i] (room for dst_cap[i] bytes) are device addresses; the
 * arrays themselves are host memory the call copies from before it returns. LZ4: dst_cap[i] is
 * the block's exact decoded size (the walk refuses a block that decodes to any other). Returns 0
 * or a negative code (a walk the driver would not launch: nothing went to nvCOMP); nothing is
 * known about the data until ferry__nvc_finish.
 */
int ferry__nvc_decompress(struct ferry__nvc *d, void *stream, size_t n, const uint64_t *src,
			  const size_t *src_len, const uint64_t *dst, const size_t *dst_cap);
/*
 * After the batch's work has completed (the caller synchronised its stream, or an event recorded
 * after it; later work on the stream need not have run): the decompressed size of
 * each chunk of the last batch into out_len[i] (may be NULL), and 0, or a negative code naming
 * the first failed chunk by its index in the batch and nvCOMP's status in ferry_last_error().
 * Before the stream has run the batch: FERRY_EBUSY, the batch kept. A batch never finished is
 * dropped when the next one is enqueued on the same decoder (waited for first); several decoders
 * may have batches in flight on one stream at once.
 */
int ferry__nvc_finish(struct ferry__nvc *d, size_t *out_len);

#endif
