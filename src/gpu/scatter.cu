/*
 * ferry's kernels (src/gpu/scatter.c loads them, one module per device): the scatter kernel, n
 * pieces, each len bytes from src to dst, in one launch; and the LZ4 walk, below.
 * The engine's gather (src/engine/gpu_io.c) passes pinned host slots, mapped into the device's
 * address space, as the sources and the caller's device memory as the destinations, so a gather
 * of small reads costs one launch whatever its piece count.
 *
 * Not compiled by the build (DESIGN.md decision 1: no build-time CUDA): scripts/gen-scatter-ptx.sh
 * turns it into PTX text in src/gpu/scatter_ptx.c, which the driver compiles for the GPU at run
 * time; tests/build/test_scatter_ptx.sh checks that the two agree where nvcc is installed.
 *
 * The argument layout is struct ferry__scatter_args in src/gpu/scatter.h: keep them the same.
 * Grid: blockIdx.y is the piece, blockIdx.x and threadIdx.x stride over its bytes; 256 threads.
 */
#include "../format/lz4_walk.h"

struct ferry_scatter_piece {
	unsigned long long src, dst, len;
};
#define FERRY_SCATTER_MAX 64
struct ferry_scatter_args {
	unsigned int n, pad;
	ferry_scatter_piece p[FERRY_SCATTER_MAX];
};

/* Words of type W, four loads in flight per thread before their stores (the sources are host
 * memory read over PCIe, where one outstanding load per thread leaves the link idle), then the
 * tail bytes. Plain loads, not the read-only path (no __restrict__): the sources are mapped host
 * memory. */
template <typename W>
__device__ __forceinline__ void words(const char *s, char *d, unsigned long long len, unsigned long long i,
				      unsigned long long step)
{
	const W *sw = (const W *)s;
	W *dw = (W *)d;
	unsigned long long n = len / sizeof(W), k = i;
	for (; k + 3 * step < n; k += 4 * step) {
		W a = sw[k], b = sw[k + step], c = sw[k + 2 * step], e = sw[k + 3 * step];
		dw[k] = a;
		dw[k + step] = b;
		dw[k + 2 * step] = c;
		dw[k + 3 * step] = e;
	}
	for (; k < n; k += step)
		dw[k] = sw[k];
	for (k = n * sizeof(W) + i; k < len; k += step)
		d[k] = s[k];
}

/* __grid_constant__: the table is read in place from the parameter space (a piece's row is picked
 * by blockIdx.y), not copied to each thread's local memory. */
extern "C" __global__ void __launch_bounds__(256) ferry_scatter(const __grid_constant__ ferry_scatter_args a)
{
	if (blockIdx.y >= a.n)
		return;
	const ferry_scatter_piece &p = a.p[blockIdx.y];
	const char *s = (const char *)p.src;
	char *d = (char *)p.dst;
	unsigned long long len = p.len;
	unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
	unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
	/* the widest word (1 to 16 bytes) at which source and destination are aligned alike, once the
	 * destination's first head bytes are copied one by one */
	unsigned long long x = (p.src ^ p.dst) | 16;
	unsigned long long w = x & (~x + 1);
	unsigned long long head = (w - (p.dst & (w - 1))) & (w - 1);
	if (head > len)
		head = len;
	if (i < head)
		d[i] = s[i];
	s += head;
	d += head;
	len -= head;
	if (w == 16)
		words<uint4>(s, d, len, i, step);
	else if (w == 8)
		words<unsigned long long>(s, d, len, i, step);
	else if (w == 4)
		words<unsigned int>(s, d, len, i, step);
	else if (w == 2)
		words<unsigned short>(s, d, len, i, step);
	else
		words<unsigned char>(s, d, len, i, step);
}

/*
 * The LZ4 walk (src/format/lz4_walk.h) over a batch before nvCOMP decodes it (src/gpu/nvcomp.c),
 * one thread a chunk, on the batch's stream between the upload of its arrays and nvCOMP's launch:
 * src, len and cap are nvCOMP's arrays of compressed pointers, compressed sizes and output rooms.
 * A block that does not decode to exactly its room is replaced in the arrays by dummy, a 2-byte
 * block of one literal, and its verdict set: nvCOMP, which does not bound its output, never sees
 * it, and the batch's finish names it. 64 threads a block: the walks diverge, each its own chunk.
 */
extern "C" __global__ void __launch_bounds__(64)
	ferry_lz4_walk(unsigned long long n, unsigned long long *src, unsigned long long *len,
		       const unsigned long long *cap, int *verdict, unsigned long long dummy)
{
	unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	int bad = ferry__lz4_walk((const unsigned char *)src[i], len[i], cap[i]) != 0;
	verdict[i] = bad;
	if (bad) {
		src[i] = dummy;
		len[i] = 2;
	}
}
