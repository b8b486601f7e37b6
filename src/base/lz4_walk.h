/*
 * The walk that bounds a raw LZ4 block before nvCOMP decodes it (nvCOMP 6 does not bound its
 * output: docs/GPU.md). One source for three builds: the host (src/format/cz.c's
 * ferry__cz_check_gpu_frame, the tests), the GPU kernel that runs it over nvCOMP's batch (src/gpu/scatter.cu,
 * ferry_lz4_walk) and the fake driver that stands in for that kernel in CI
 * (tests/unit/fakes/fake_libcuda.c). Plain C that nvcc compiles too: no headers, no size_t.
 *
 * 0 when the block of n bytes decodes to exactly want bytes under the reference decoder's rules
 * (liblz4 1.9.4, LZ4_decompress_generic on a whole block), else -1: every match inside the bytes
 * decoded before it and ending at least 5 bytes (LASTLITERALS) before the output's end; a sequence
 * whose literals come within 12 bytes (MFLIMIT) of the output's end or 8 of the input's is the
 * last, its literals ending exactly at the input's end; a length's extra bytes stop 15 (literals)
 * or 4 (matches) bytes before the input's end. The sequences are followed, nothing is copied. What
 * it accepts, LZ4_decompress_safe decodes to want bytes (tests/fuzz/fuzz_lz4_block.c); offset 0,
 * which liblz4 never writes and the reference takes, is refused as well.
 *
 * The block's bytes are read through FERRY__LZ4_GET(src, i) (0 <= i < n) on a src of type
 * FERRY__LZ4_SRC, both defined before the include where the bytes are not plain memory (the
 * kernel reads them from a tile in shared memory); by default src is a pointer to them. In the
 * common sequence (short literals and match) the next token's position depends on one byte read,
 * the token's.
 */
#ifndef FERRY_BASE_LZ4_WALK_H
#define FERRY_BASE_LZ4_WALK_H

#ifdef __CUDACC__
#define FERRY__LZ4_WALK_FN static __device__ __forceinline__
#else
#define FERRY__LZ4_WALK_FN static inline
#endif
#ifndef FERRY__LZ4_GET
#define FERRY__LZ4_SRC const unsigned char *
#define FERRY__LZ4_GET(src, i) ((unsigned)(src)[i])
#endif

/* Adds to *len the extra length bytes at *i (a byte of 255 says another follows); -1 where they
 * reach within stop bytes of the input's end (liblz4: 15 for literals, 4 for matches, whose first
 * byte lies at least 6 from the end). */
FERRY__LZ4_WALK_FN int ferry__lz4_more(FERRY__LZ4_SRC src, unsigned long long n, unsigned long long *i,
				       unsigned long long *len, unsigned stop)
{
	unsigned b;
	if (n - *i <= stop)
		return -1;
	do {
		b = FERRY__LZ4_GET(src, *i);
		(*i)++;
		*len += b;
		if (n - *i < stop)
			return -1;
	} while (b == 255);
	return 0;
}

FERRY__LZ4_WALK_FN int ferry__lz4_walk(FERRY__LZ4_SRC src, unsigned long long n, unsigned long long want)
{
	unsigned long long i = 0, out = 0; /* i < n at each token */
	if (!n || !want)
		return -1;
	for (;;) {
		const unsigned tok = FERRY__LZ4_GET(src, i);
		unsigned long long lit = tok >> 4;
		i++;
		if (lit == 15 && ferry__lz4_more(src, n, &i, &lit, 15))
			return -1;
		if (out + lit + 12 > want || lit + 8 > n - i) /* the last sequence */
			return lit == n - i && out + lit == want ? 0 : -1;
		i += lit;
		out += lit;
		const unsigned long long off = FERRY__LZ4_GET(src, i) | FERRY__LZ4_GET(src, i + 1) << 8;
		i += 2;
		if (!off || off > out)
			return -1;
		unsigned long long ml = (tok & 15u) + 4;
		if ((tok & 15u) == 15 && ferry__lz4_more(src, n, &i, &ml, 4))
			return -1;
		if (ml + 5 > want - out)
			return -1;
		out += ml;
	}
}

#endif
