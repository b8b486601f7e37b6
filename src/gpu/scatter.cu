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
 * The LZ4 walk (src/base/lz4_walk.h) over a batch before nvCOMP decodes it (src/gpu/nvcomp.c),
 * on the batch's stream between the upload of its arrays and nvCOMP's launch: src, len and cap are
 * nvCOMP's arrays of compressed pointers, compressed sizes and output rooms. A block that does not
 * decode to exactly its room is replaced in the arrays by dummy, a 2-byte block of one literal, and
 * its verdict set: nvCOMP, which does not bound its output, never sees it, and the batch's finish
 * names it.
 *
 * A warp a chunk, 4 a block. The walk is a chain of dependent byte reads (a token's position
 * depends on the sequence before it), so it runs on every lane alike, reading from a tile of the
 * block in shared memory that the 32 lanes fill together (4-byte loads) whenever the walk leaves
 * it: each read is one broadcast from shared memory, the same on every lane, and the lanes never
 * diverge. (A thread a chunk, its lanes walking 32 blocks from global memory at once, ran 1 MiB
 * chunks of tokens at about 17 ms a window on the H200.)
 */
#define FERRY_WALK_WARPS 4
#define FERRY_WALK_TILE 4096 /* bytes of a warp's tile */
struct ferry_walk_src {
	const unsigned char *base; /* the block */
	unsigned long long n;      /* its bytes */
	unsigned *tile;            /* this warp's tile in shared memory */
	unsigned long long at;     /* the block's offset of the tile's first byte (a multiple of 4) */
};

/* The tile refilled from the 4-byte word holding byte i of the block: by all 32 lanes at once. */
__device__ __forceinline__ void ferry_walk_fill(ferry_walk_src *s, unsigned long long i)
{
	const unsigned lane = threadIdx.x & 31;
	const unsigned long long at = i & ~3ull;
	const bool aligned = ((unsigned long long)s->base & 3) == 0;
	__syncwarp(); /* every lane is done with the old tile */
	for (unsigned k = lane; k < FERRY_WALK_TILE / 4; k += 32) {
		unsigned long long o = at + 4ull * k;
		unsigned w = 0;
		if (aligned && o + 4 <= s->n)
			w = *(const unsigned *)(s->base + o);
		else
			for (unsigned b = 0; b < 4; b++)
				if (o + b < s->n)
					w |= (unsigned)s->base[o + b] << (8 * b);
		s->tile[k] = w;
	}
	s->at = at;
	__syncwarp();
}

__device__ __forceinline__ unsigned ferry_walk_byte(ferry_walk_src *s, unsigned long long i)
{
	if (i - s->at >= FERRY_WALK_TILE) /* before the tile too: the difference wraps */
		ferry_walk_fill(s, i);
	const unsigned long long k = i - s->at;
	return (s->tile[k >> 2] >> (8 * (k & 3))) & 0xff;
}

#define FERRY__LZ4_SRC ferry_walk_src *
#define FERRY__LZ4_GET(s, i) ferry_walk_byte((s), (i))
#include "../base/lz4_walk.h"

extern "C" __global__ void __launch_bounds__(32 * FERRY_WALK_WARPS)
	ferry_lz4_walk(unsigned long long n, unsigned long long *src, unsigned long long *len,
		       const unsigned long long *cap, int *verdict, unsigned long long dummy)
{
	__shared__ unsigned tiles[FERRY_WALK_WARPS][FERRY_WALK_TILE / 4];
	const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const unsigned long long i = (unsigned long long)blockIdx.x * FERRY_WALK_WARPS + warp;
	if (i >= n) /* the whole warp */
		return;
	ferry_walk_src s = {(const unsigned char *)src[i], len[i], tiles[warp], 0};
	if (s.n)
		ferry_walk_fill(&s, 0);
	const int bad = ferry__lz4_walk(&s, s.n, cap[i]) != 0;
	if (lane == 0) {
		verdict[i] = bad;
		if (bad) {
			src[i] = dummy;
			len[i] = 2;
		}
	}
}
