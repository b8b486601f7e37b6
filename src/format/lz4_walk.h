/*
 * The walk that bounds a raw LZ4 block before nvCOMP decodes it (nvCOMP 6 does not bound its
 * output: docs/GPU.md). One source for three builds: the host (src/format/cz.c,
 * ferry__cz_lz4_bounded), the GPU kernel that runs it over nvCOMP's batch (src/gpu/scatter.cu,
 * ferry_lz4_walk) and the fake driver that stands in for that kernel in CI
 * (tests/unit/fakes/fake_libcuda.c). Plain C that nvcc compiles too: no headers, no size_t.
 *
 * 0 when the block p[0, n) decodes to exactly want bytes under the reference decoder's rules
 * (liblz4 1.9.4, LZ4_decompress_generic on a whole block), else -1: every match inside the bytes
 * decoded before it and ending at least 5 bytes (LASTLITERALS) before the output's end; a sequence
 * whose literals come within 12 bytes (MFLIMIT) of the output's end or 8 of the input's is the
 * last, its literals ending exactly at the input's end; a length's extra bytes stop 15 (literals)
 * or 4 (matches) bytes before the input's end. The sequences are followed, nothing is copied. What
 * it accepts, LZ4_decompress_safe decodes to want bytes (tests/fuzz/fuzz_lz4_block.c); offset 0,
 * which liblz4 never writes and the reference takes, is refused as well.
 */
#ifndef FERRY_FORMAT_LZ4_WALK_H
#define FERRY_FORMAT_LZ4_WALK_H

#ifdef __CUDACC__
#define FERRY__LZ4_WALK_FN static __device__ __forceinline__
#else
#define FERRY__LZ4_WALK_FN static inline
#endif

FERRY__LZ4_WALK_FN int ferry__lz4_walk(const unsigned char *p, unsigned long long n, unsigned long long want)
{
	const unsigned char *const end = p + n;
	unsigned long long out = 0;
	if (!n || !want)
		return -1;
	for (;;) {
		const unsigned tok = *p++;
		unsigned long long lit = tok >> 4;
		if (lit == 15) {
			unsigned b;
			if (end - p <= 15)
				return -1;
			do {
				b = *p++;
				lit += b;
				if (end - p < 15)
					return -1;
			} while (b == 255);
		}
		if (out + lit + 12 > want || lit + 8 > (unsigned long long)(end - p)) /* the last sequence */
			return lit == (unsigned long long)(end - p) && out + lit == want ? 0 : -1;
		p += lit;
		out += lit;
		const unsigned long long off = (unsigned long long)p[0] | (unsigned long long)p[1] << 8;
		p += 2;
		if (!off || off > out)
			return -1;
		unsigned long long ml = (tok & 15u) + 4;
		if ((tok & 15u) == 15) {
			unsigned b;
			do {
				b = *p++;
				ml += b;
				if (end - p < 4)
					return -1;
			} while (b == 255);
		}
		if (ml + 5 > want - out)
			return -1;
		out += ml;
	}
}

#endif
