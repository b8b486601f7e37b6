/*
 * The compressed format's bytes (docs/FORMATS.md): trailer and index parsing, one chunk's encoding
 * and decoding on the CPU, and the small parallel loop the reader and writer share.
 */
#include "format/cz.h"
#include "base/lz4_walk.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <lz4frame.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_decompressBound */
#include <zstd.h>

#include "base/base.h"
#include "base/xxh.h"

static const char body_magic[8] = {'F', 'E', 'R', 'R', 'Y', '-', 'C', 'Z'};

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}
static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t zstd_raw_len(uint64_t n)
{
	return FERRY__CZ_ZSTD_RAW_HEAD + n + 3 * ((n + FERRY__CZ_ZSTD_RAW_BLOCK - 1) / FERRY__CZ_ZSTD_RAW_BLOCK);
}

/* ------------------------------------------------------------------------------------ parsing */

int ferry__cz_is_trailer(const uint8_t *t, uint64_t file_size)
{
	return file_size >= FERRY__CZ_TRAILER_LEN && get32(t) == FERRY__CZ_TRAILER_MAGIC &&
	       memcmp(t + 8, body_magic, 8) == 0;
}

int ferry__cz_parse_trailer(const uint8_t *t, uint64_t file_size, const char *name, struct ferry__cz_meta *m)
{
	memset(m, 0, sizeof(*m));
	if (file_size < FERRY__CZ_TRAILER_LEN)
		return ferry__error(FERRY_ECORRUPT, "%s: %llu bytes: too short for a compressed file's %u-byte trailer",
				    name, (unsigned long long)file_size, FERRY__CZ_TRAILER_LEN);
	uint64_t at = file_size - FERRY__CZ_TRAILER_LEN;
#define BAD(...) ferry__error(FERRY_ECORRUPT, __VA_ARGS__)
	if (get32(t) != FERRY__CZ_TRAILER_MAGIC || get32(t + 4) != FERRY__CZ_TRAILER_LEN - 8 ||
	    memcmp(t + 8, body_magic, 8) != 0)
		return BAD("%s: trailer at offset %llu: magic: not a ferry compressed file (no FERRY-CZ trailer frame)",
			   name, (unsigned long long)at);
	uint64_t sum = get64(t + 72);
	if (ferry__xxh3_64(t, 72) != sum)
		return BAD("%s: trailer at offset %llu: checksum: %016llx stored, %016llx computed", name,
			   (unsigned long long)at, (unsigned long long)sum, (unsigned long long)ferry__xxh3_64(t, 72));
	uint32_t version = get32(t + 16);
	if (version != FERRY__CZ_VERSION)
		return BAD("%s: trailer: version: %u, this ferry reads version %u", name, version, FERRY__CZ_VERSION);
	m->codec = (int)get32(t + 20);
	if (m->codec != FERRY__CZ_LZ4 && m->codec != FERRY__CZ_ZSTD)
		return BAD("%s: trailer: codec: %d is neither lz4 (1) nor zstd (2)", name, m->codec);
	m->chunk_size = get32(t + 24);
	if (m->chunk_size < FERRY__CZ_CHUNK_MIN || m->chunk_size > FERRY__CZ_CHUNK_MAX)
		return BAD("%s: trailer: chunk size: %u is outside %u to %u", name, m->chunk_size,
			   FERRY__CZ_CHUNK_MIN, FERRY__CZ_CHUNK_MAX);
	m->level = get32(t + 28);
	m->index_off = get64(t + 32);
	m->index_len = get64(t + 40);
	m->total = get64(t + 48);
	m->nchunks = get64(t + 56);
	m->index_xxh = get64(t + 64);
	uint64_t want_chunks = m->total / m->chunk_size + (m->total % m->chunk_size != 0);
	if (m->nchunks != want_chunks)
		return BAD("%s: trailer: chunk count: %llu, but %llu bytes in chunks of %u make %llu", name,
			   (unsigned long long)m->nchunks, (unsigned long long)m->total, m->chunk_size,
			   (unsigned long long)want_chunks);
	/* each chunk's frame is at least 9 bytes (an LZ4 or zstd header), which bounds the count */
	if (m->nchunks > at / (FERRY__CZ_ENTRY_LEN + 9))
		return BAD("%s: trailer: chunk count: %llu chunks cannot fit in %llu bytes", name,
			   (unsigned long long)m->nchunks, (unsigned long long)at);
	if (m->index_len != ferry__cz_index_len(m->nchunks))
		return BAD("%s: trailer: index length: %llu, but %llu chunks need %zu", name,
			   (unsigned long long)m->index_len, (unsigned long long)m->nchunks,
			   ferry__cz_index_len(m->nchunks));
	if (m->index_off > at || m->index_len > at - m->index_off || m->index_off + m->index_len != at)
		return BAD("%s: trailer: index offset: %llu + length %llu does not end where the trailer starts (%llu)",
			   name, (unsigned long long)m->index_off, (unsigned long long)m->index_len,
			   (unsigned long long)at);
	m->compressed = m->index_off;
	return 0;
}

static int bad_chunk(const char *name, uint64_t i, const char *field, const char *fmt, unsigned long long a,
		     unsigned long long b)
{
	char why[160];
	snprintf(why, sizeof(why), fmt, a, b);
	return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu: %s: %s", name, (unsigned long long)i, field, why);
}

int ferry__cz_parse_index(const uint8_t *idx, const char *name, struct ferry__cz_meta *m)
{
	m->chunks = NULL;
	if (ferry__xxh3_64(idx, m->index_len) != m->index_xxh)
		return BAD("%s: index at offset %llu: checksum: %016llx stored in the trailer, %016llx computed", name,
			   (unsigned long long)m->index_off, (unsigned long long)m->index_xxh,
			   (unsigned long long)ferry__xxh3_64(idx, m->index_len));
	if (get32(idx) != FERRY__CZ_INDEX_MAGIC || get32(idx + 4) != m->index_len - 8 ||
	    get32(idx + 8) != FERRY__CZ_VERSION || get32(idx + 12) != 0 || get64(idx + 16) != m->nchunks)
		return BAD("%s: index at offset %llu: header: magic, length, version or chunk count disagrees with the trailer",
			   name, (unsigned long long)m->index_off);
	struct ferry__cz_chunk *c = calloc(m->nchunks ? m->nchunks : 1, sizeof(*c));
	if (!c)
		return ferry__error(-ENOMEM, "%s: index of %llu chunks", name, (unsigned long long)m->nchunks);
	uint64_t c_off = 0;
	int r = 0;
	for (uint64_t i = 0; i < m->nchunks && !r; i++) {
		const uint8_t *p = idx + FERRY__CZ_INDEX_HEAD + i * FERRY__CZ_ENTRY_LEN;
		struct ferry__cz_chunk *e = &c[i];
		e->c_off = get64(p);
		e->u_off = get64(p + 8);
		e->xxh_u = get64(p + 16);
		e->xxh_c = get64(p + 24);
		e->c_size = get32(p + 32);
		e->u_size = get32(p + 36);
		e->payload_off = get32(p + 40);
		e->flags = get32(p + 44);
		uint64_t u_off = i * m->chunk_size;
		uint64_t u_size = m->total - u_off < m->chunk_size ? m->total - u_off : m->chunk_size;
		uint64_t c_min = m->codec == FERRY__CZ_LZ4 ? FERRY__CZ_LZ4_PAYLOAD + 4 : 9;
		if (e->c_off != c_off)
			r = bad_chunk(name, i, "compressed offset", "%llu, but the chunk before ends at %llu",
				      e->c_off, c_off);
		else if (e->c_size < c_min || e->c_size > m->index_off - c_off)
			r = bad_chunk(name, i, "compressed size", "%llu bytes: past the chunks' end (the index at %llu) or too small for a frame",
				      e->c_size, m->index_off);
		else if (e->u_off != u_off)
			r = bad_chunk(name, i, "uncompressed offset", "%llu, expected %llu", e->u_off, u_off);
		else if (e->u_size != u_size)
			r = bad_chunk(name, i, "uncompressed size", "%llu, expected %llu", e->u_size, u_size);
		else if (e->flags & ~FERRY__CZ_STORED)
			r = bad_chunk(name, i, "flags", "%#llx has unknown bits (%#llx)", e->flags, FERRY__CZ_STORED);
		else if (m->codec == FERRY__CZ_LZ4) {
			uint64_t payload = e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4;
			if (e->payload_off != FERRY__CZ_LZ4_PAYLOAD)
				r = bad_chunk(name, i, "block offset", "%llu, an LZ4 frame's block starts at %llu",
					      e->payload_off, FERRY__CZ_LZ4_PAYLOAD);
			else if ((e->flags & FERRY__CZ_STORED) && payload != e->u_size)
				r = bad_chunk(name, i, "compressed size", "a stored block of %llu bytes for %llu bytes",
					      payload, e->u_size);
			else if (!(e->flags & FERRY__CZ_STORED) &&
				 payload > (uint64_t)LZ4_compressBound((int)e->u_size))
				r = bad_chunk(name, i, "compressed size", "a block of %llu bytes cannot decode to %llu",
					      payload, e->u_size);
		} else {
			if (e->payload_off != 0)
				r = bad_chunk(name, i, "block offset", "%llu, a zstd chunk is a whole frame (0)%.0llu",
					      e->payload_off, 0);
			else if ((e->flags & FERRY__CZ_STORED) && e->c_size != zstd_raw_len(e->u_size))
				r = bad_chunk(name, i, "compressed size", "%llu for a stored frame of %llu bytes",
					      e->c_size, e->u_size);
		}
		c_off += e->c_size;
	}
	if (!r && c_off != m->index_off)
		r = BAD("%s: index: the chunks end at %llu, but the index starts at %llu", name,
			(unsigned long long)c_off, (unsigned long long)m->index_off);
	if (r) {
		free(c);
		return r;
	}
	m->chunks = c;
	return 0;
}

void ferry__cz_meta_free(struct ferry__cz_meta *m)
{
	free(m->chunks);
	m->chunks = NULL;
}

/* ----------------------------------------------------------------------------------- decoding */

int ferry__cz_check_frame(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, const char *name)
{
	const struct ferry__cz_chunk *e = &m->chunks[i];
	uint64_t h = ferry__xxh3_64(frame, e->c_size);
	if (h != e->xxh_c)
		return ferry__error(FERRY_ECORRUPT,
				    "%s: chunk %llu (compressed offset %llu, %u bytes): compressed checksum: %016llx in the index, %016llx read",
				    name, (unsigned long long)i, (unsigned long long)e->c_off, e->c_size,
				    (unsigned long long)e->xxh_c, (unsigned long long)h);
	return 0;
}

/*
 * nvCOMP 6.0 does not bound its output by the room it is given (a chunk given half its size wrote
 * the other half past it, H100, tests/nvcomp_check.h), so a damaged frame, or one that decodes to
 * more than its index entry says, never reaches it: zstd, the checksum and the frame's own bound
 * (its content size, else its blocks'); LZ4, the checksum and a walk of the block's sequences
 * (ferry__lz4_walk, base/lz4_walk.h: a raw LZ4 block has no size of its own), here unless nvCOMP's decoder
 * walks the batch on the GPU (lz4_walked_on_gpu: ferry__nvc_walks_lz4, src/gpu/nvcomp.c).
 */
int ferry__cz_check_gpu_frame(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, const char *name,
			       bool lz4_walked_on_gpu)
{
	const struct ferry__cz_chunk *e = &m->chunks[i];
	int r = ferry__cz_check_frame(m, i, frame, name);
	if (!r && m->codec == FERRY__CZ_LZ4 && !(e->flags & FERRY__CZ_STORED) && !lz4_walked_on_gpu &&
	    ferry__lz4_walk(frame + FERRY__CZ_LZ4_PAYLOAD, e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4, e->u_size))
		r = ferry__error(FERRY_ECORRUPT,
				 "%s: chunk %llu (compressed offset %llu): LZ4 block: malformed or does not decode to the index's %u bytes",
				 name, (unsigned long long)i, (unsigned long long)e->c_off, e->u_size);
	if (!r && m->codec == FERRY__CZ_ZSTD && !(e->flags & FERRY__CZ_STORED)) {
		unsigned long long bound = ZSTD_decompressBound(frame, e->c_size);
		if (bound == ZSTD_CONTENTSIZE_ERROR || bound > e->u_size)
			r = ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): zstd frame decodes to %s, the index says %u bytes",
					 name, (unsigned long long)i, (unsigned long long)e->c_off,
					 bound == ZSTD_CONTENTSIZE_ERROR ? "an unknown size (malformed)" : "more than that",
					 e->u_size);
	}
	return r;
}

static int decode_lz4(const struct ferry__cz_chunk *e, uint64_t i, const uint8_t *f, uint8_t *dst, const char *name)
{
	uint32_t word = get32(f + FERRY__CZ_LZ4_PAYLOAD - 4);
	uint32_t payload = e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4;
	bool stored = word >> 31;
	if (get32(f) != 0x184D2204u || f[4] != 0x68 || get64(f + 6) != e->u_size || (word & 0x7fffffffu) != payload ||
	    stored != !!(e->flags & FERRY__CZ_STORED) || get32(f + e->c_size - 4) != 0)
		return ferry__error(FERRY_ECORRUPT,
				    "%s: chunk %llu (compressed offset %llu): LZ4 frame: its header, block size or end mark disagrees with the index",
				    name, (unsigned long long)i, (unsigned long long)e->c_off);
	if (stored) {
		memcpy(dst, f + FERRY__CZ_LZ4_PAYLOAD, e->u_size);
		return 0;
	}
	int n = LZ4_decompress_safe((const char *)f + FERRY__CZ_LZ4_PAYLOAD, (char *)dst, (int)payload, (int)e->u_size);
	if (n != (int)e->u_size)
		return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): LZ4 block: %s (%d of %u bytes)",
				    name, (unsigned long long)i, (unsigned long long)e->c_off,
				    n < 0 ? "malformed" : "decodes to the wrong size", n, e->u_size);
	return 0;
}

static int decode_zstd(const struct ferry__cz_chunk *e, uint64_t i, const uint8_t *f, uint8_t *dst, ZSTD_DCtx *d,
		       const char *name)
{
	if (e->flags & FERRY__CZ_STORED) {
		if (get32(f) != 0xFD2FB528u || f[4] != 0xE0 || get64(f + 5) != e->u_size)
			goto bad;
		const uint8_t *p = f + FERRY__CZ_ZSTD_RAW_HEAD;
		for (uint32_t done = 0; done < e->u_size;) {
			uint32_t n = e->u_size - done < FERRY__CZ_ZSTD_RAW_BLOCK ? e->u_size - done : FERRY__CZ_ZSTD_RAW_BLOCK;
			uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
			if (h != (n << 3 | (done + n == e->u_size)))
				goto bad;
			memcpy(dst + done, p + 3, n);
			p += 3 + n;
			done += n;
		}
		return 0;
	}
	if (ZSTD_getFrameContentSize(f, e->c_size) != e->u_size || ZSTD_findFrameCompressedSize(f, e->c_size) != e->c_size)
		goto bad;
	size_t n = d ? ZSTD_decompressDCtx(d, dst, e->u_size, f, e->c_size) : ZSTD_decompress(dst, e->u_size, f, e->c_size);
	if (ZSTD_isError(n) || n != e->u_size)
		return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): zstd frame: %s", name,
				    (unsigned long long)i, (unsigned long long)e->c_off,
				    ZSTD_isError(n) ? ZSTD_getErrorName(n) : "decodes to the wrong size");
	return 0;
bad:
	return ferry__error(FERRY_ECORRUPT,
			    "%s: chunk %llu (compressed offset %llu): zstd frame: its header or blocks disagree with the index",
			    name, (unsigned long long)i, (unsigned long long)e->c_off);
}

/* The decoded bytes of chunk i against the index's XXH3. */
int ferry__cz_check_bytes(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *dst, const char *name)
{
	const struct ferry__cz_chunk *e = &m->chunks[i];
	uint64_t h = ferry__xxh3_64(dst, e->u_size);
	if (h != e->xxh_u)
		return ferry__error(FERRY_ECORRUPT,
				    "%s: chunk %llu (bytes %llu to %llu): checksum: %016llx in the index, %016llx decoded",
				    name, (unsigned long long)i, (unsigned long long)e->u_off,
				    (unsigned long long)(e->u_off + e->u_size), (unsigned long long)e->xxh_u,
				    (unsigned long long)h);
	return 0;
}

/*
 * A whole chunk. With verify, one checksum on the way that succeeds: the bytes' XXH3 after the
 * decode (it covers what the caller gets); the frame's is computed only when the decoder or the
 * bytes' checksum fails, so a damaged frame is still named by its compressed checksum as when both
 * were checked every time. The CPU decoders are bounded by the room given (LZ4_decompress_safe,
 * ZSTD_decompressDCtx, the raw blocks' checks), so an unchecked frame cannot write past dst; a
 * frame bound for nvCOMP, which is not, is checked first (ferry__cz_check_gpu_frame).
 */
static int decode_whole(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, uint8_t *dst, int verify,
			ZSTD_DCtx *d, const char *name)
{
	const struct ferry__cz_chunk *e = &m->chunks[i];
	int r = m->codec == FERRY__CZ_LZ4 ? decode_lz4(e, i, frame, dst, name) : decode_zstd(e, i, frame, dst, d, name);
	if (!r && verify)
		r = ferry__cz_check_bytes(m, i, dst, name);
	if (r && verify && ferry__xxh3_64(frame, e->c_size) != e->xxh_c)
		r = ferry__cz_check_frame(m, i, frame, name); /* the frame's error, not its symptom's */
	return r;
}

int ferry__cz_decode(const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame, uint8_t *dst, int verify,
		     const char *name)
{
	return decode_whole(m, i, frame, dst, verify, NULL, name);
}

struct ferry__cz_dctx {
	ZSTD_DCtx *z;
};

int ferry__cz_dctx_create(struct ferry__cz_dctx **out)
{
	struct ferry__cz_dctx *d = calloc(1, sizeof(*d));
	if (d && !(d->z = ZSTD_createDCtx())) {
		free(d);
		d = NULL;
	}
	*out = d;
	return d ? 0 : ferry__error(-ENOMEM, "zstd decompression context");
}

void ferry__cz_dctx_destroy(struct ferry__cz_dctx *d)
{
	if (!d)
		return;
	ZSTD_freeDCtx(d->z);
	free(d);
}

/* The first want bytes of a zstd frame (want < u_size), streamed: zstd decodes block by block
 * (128 KiB at most), so a head costs the blocks it spans, not the frame. */
static int zstd_head(ZSTD_DCtx *d, const struct ferry__cz_chunk *e, uint64_t i, const uint8_t *f, uint8_t *dst,
		     uint32_t want, const char *name)
{
	if (ZSTD_getFrameContentSize(f, e->c_size) != e->u_size)
		return ferry__error(FERRY_ECORRUPT,
				    "%s: chunk %llu (compressed offset %llu): zstd frame: its header disagrees with the index",
				    name, (unsigned long long)i, (unsigned long long)e->c_off);
	ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
	ZSTD_inBuffer in = {f, e->c_size, 0};
	ZSTD_outBuffer out = {dst, want, 0};
	while (out.pos < want) {
		size_t ipos = in.pos, opos = out.pos;
		size_t r = ZSTD_decompressStream(d, &out, &in);
		if (ZSTD_isError(r))
			return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): zstd frame: %s", name,
					    (unsigned long long)i, (unsigned long long)e->c_off, ZSTD_getErrorName(r));
		if (!r || (in.pos == ipos && out.pos == opos))
			break;
	}
	if (out.pos != want)
		return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): zstd frame: ends after %zu bytes, the index says %u",
				    name, (unsigned long long)i, (unsigned long long)e->c_off, out.pos, e->u_size);
	return 0;
}

int ferry__cz_decode_with(struct ferry__cz_dctx *d, const struct ferry__cz_meta *m, uint64_t i, const uint8_t *frame,
			  uint8_t *dst, uint32_t want, int verify, uint32_t *have, const char *name)
{
	const struct ferry__cz_chunk *e = &m->chunks[i];
	*have = 0;
	if (want >= e->u_size || (e->flags & FERRY__CZ_STORED) || !d) { /* whole: as ferry__cz_decode */
		int r = decode_whole(m, i, frame, dst, verify, d ? d->z : NULL, name);
		if (!r)
			*have = e->u_size;
		return r;
	}
	/* a head: the frame's checksum before (the bytes' covers the whole chunk, not decoded here) */
	int r = verify ? ferry__cz_check_frame(m, i, frame, name) : 0;
	if (r)
		return r;
	if (m->codec == FERRY__CZ_ZSTD) {
		if (!(r = zstd_head(d->z, e, i, frame, dst, want, name)))
			*have = want;
		return r;
	}
	uint32_t word = get32(frame + FERRY__CZ_LZ4_PAYLOAD - 4);
	uint32_t payload = e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4;
	if (get32(frame) != 0x184D2204u || frame[4] != 0x68 || get64(frame + 6) != e->u_size || word != payload)
		return ferry__error(FERRY_ECORRUPT,
				    "%s: chunk %llu (compressed offset %llu): LZ4 frame: its header or block size disagrees with the index",
				    name, (unsigned long long)i, (unsigned long long)e->c_off);
	int n = LZ4_decompress_safe_partial((const char *)frame + FERRY__CZ_LZ4_PAYLOAD, (char *)dst, (int)payload,
					    (int)want, (int)e->u_size);
	if (n < (int)want)
		return ferry__error(FERRY_ECORRUPT, "%s: chunk %llu (compressed offset %llu): LZ4 block: %s (%d of the first %u bytes)",
				    name, (unsigned long long)i, (unsigned long long)e->c_off,
				    n < 0 ? "malformed" : "ends early", n, want);
	*have = want; /* (it may decode past want: those bytes count as not there) */
	return 0;
}

/* ----------------------------------------------------------------------------------- encoding */

struct ferry__cz_cctx {
	ZSTD_CCtx *z;
	LZ4F_cctx *l;
};

int ferry__cz_cctx_create(int codec, struct ferry__cz_cctx **out)
{
	struct ferry__cz_cctx *c = calloc(1, sizeof(*c));
	if (!c)
		return ferry__error(-ENOMEM, "compressor context");
	if (codec == FERRY__CZ_ZSTD)
		c->z = ZSTD_createCCtx();
	else if (LZ4F_isError(LZ4F_createCompressionContext(&c->l, LZ4F_VERSION)))
		c->l = NULL;
	if (!c->z && !c->l) {
		free(c);
		return ferry__error(-ENOMEM, "compressor context");
	}
	*out = c;
	return 0;
}

void ferry__cz_cctx_destroy(struct ferry__cz_cctx *c)
{
	if (!c)
		return;
	ZSTD_freeCCtx(c->z);
	LZ4F_freeCompressionContext(c->l);
	free(c);
}

static LZ4F_preferences_t lz4_prefs(int level, uint32_t chunk_size, size_t n)
{
	LZ4F_preferences_t p;
	memset(&p, 0, sizeof(p));
	p.frameInfo.blockSizeID = chunk_size <= (64u << 10)    ? LZ4F_max64KB
				  : chunk_size <= (256u << 10) ? LZ4F_max256KB
				  : chunk_size <= (1u << 20)   ? LZ4F_max1MB
							       : LZ4F_max4MB;
	p.frameInfo.blockMode = LZ4F_blockIndependent;
	p.frameInfo.contentSize = n;
	p.compressionLevel = level;
	p.autoFlush = 1;
	return p;
}

size_t ferry__cz_bound(int codec, size_t n)
{
	size_t raw = zstd_raw_len(n);
	size_t b;
	if (codec == FERRY__CZ_ZSTD)
		b = ZSTD_compressBound(n);
	else {
		LZ4F_preferences_t p = lz4_prefs(0, FERRY__CZ_CHUNK_MAX, n);
		b = LZ4F_compressFrameBound(n, &p) + 32;
	}
	return b > raw ? b : raw;
}

int ferry__cz_encode(struct ferry__cz_cctx *c, int codec, int level, uint32_t chunk_size, const uint8_t *src,
		     size_t n, uint8_t *out, struct ferry__cz_chunk *e)
{
	size_t cap = ferry__cz_bound(codec, n);
	e->u_size = (uint32_t)n;
	e->flags = 0;
	e->xxh_u = ferry__xxh3_64(src, n);
	if (codec == FERRY__CZ_ZSTD) {
		e->payload_off = 0;
		size_t r = ZSTD_CCtx_reset(c->z, ZSTD_reset_session_and_parameters);
		if (!ZSTD_isError(r))
			r = ZSTD_CCtx_setParameter(c->z, ZSTD_c_compressionLevel, level ? level : 3);
		if (!ZSTD_isError(r))
			r = ZSTD_CCtx_setParameter(c->z, ZSTD_c_contentSizeFlag, 1);
		if (!ZSTD_isError(r))
			r = ZSTD_compress2(c->z, out, cap, src, n);
		if (ZSTD_isError(r))
			return ferry__error(FERRY_ECORRUPT, "zstd compression of %zu bytes: %s", n, ZSTD_getErrorName(r));
		if (r < n) {
			e->c_size = (uint32_t)r;
		} else { /* does not pay: a frame of raw blocks, which the reader copies */
			uint8_t *p = out;
			put32(p, 0xFD2FB528u);
			p[4] = 0xE0; /* 8-byte content size, single segment, no checksum, no dictionary */
			put64(p + 5, n);
			p += FERRY__CZ_ZSTD_RAW_HEAD;
			for (size_t done = 0; done < n;) {
				size_t b = n - done < FERRY__CZ_ZSTD_RAW_BLOCK ? n - done : FERRY__CZ_ZSTD_RAW_BLOCK;
				uint32_t h = (uint32_t)(b << 3 | (done + b == n));
				p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8), p[2] = (uint8_t)(h >> 16);
				memcpy(p + 3, src + done, b);
				p += 3 + b;
				done += b;
			}
			e->c_size = (uint32_t)(p - out);
			e->flags = FERRY__CZ_STORED;
		}
	} else {
		LZ4F_preferences_t p = lz4_prefs(level, chunk_size, n);
		size_t h = LZ4F_compressBegin(c->l, out, cap, &p), u = 0, end = 0, r = h;
		if (!LZ4F_isError(h))
			r = u = LZ4F_compressUpdate(c->l, out + h, cap - h, src, n, NULL);
		if (!LZ4F_isError(r))
			r = end = LZ4F_compressEnd(c->l, out + h + u, cap - h - u, NULL);
		if (!LZ4F_isError(r))
			r = h + u + end;
		if (LZ4F_isError(r))
			return ferry__error(FERRY_ECORRUPT, "lz4 compression of %zu bytes: %s", n, LZ4F_getErrorName(r));
		/* LZ4F writes exactly one block (the block maximum is at least the chunk), stored
		 * uncompressed (the size word's high bit) when compressing does not pay. */
		uint32_t word = get32(out + FERRY__CZ_LZ4_PAYLOAD - 4);
		if (r < FERRY__CZ_LZ4_PAYLOAD + 4 || out[4] != 0x68 || (word & 0x7fffffffu) + FERRY__CZ_LZ4_PAYLOAD + 4 != r)
			return ferry__error(FERRY_ECORRUPT, "lz4 compression of %zu bytes: the frame is not one block (%zu bytes)",
					    n, r);
		e->c_size = (uint32_t)r;
		e->payload_off = FERRY__CZ_LZ4_PAYLOAD;
		if (word >> 31)
			e->flags = FERRY__CZ_STORED;
	}
	e->xxh_c = ferry__xxh3_64(out, e->c_size);
	return 0;
}

size_t ferry__cz_index_len(uint64_t nchunks)
{
	return FERRY__CZ_INDEX_HEAD + (size_t)nchunks * FERRY__CZ_ENTRY_LEN;
}

void ferry__cz_write_index(struct ferry__cz_meta *m, uint8_t *idx, uint8_t *t)
{
	size_t len = ferry__cz_index_len(m->nchunks);
	put32(idx, FERRY__CZ_INDEX_MAGIC);
	put32(idx + 4, (uint32_t)(len - 8));
	put32(idx + 8, FERRY__CZ_VERSION);
	put32(idx + 12, 0);
	put64(idx + 16, m->nchunks);
	for (uint64_t i = 0; i < m->nchunks; i++) {
		uint8_t *p = idx + FERRY__CZ_INDEX_HEAD + i * FERRY__CZ_ENTRY_LEN;
		const struct ferry__cz_chunk *e = &m->chunks[i];
		put64(p, e->c_off);
		put64(p + 8, e->u_off);
		put64(p + 16, e->xxh_u);
		put64(p + 24, e->xxh_c);
		put32(p + 32, e->c_size);
		put32(p + 36, e->u_size);
		put32(p + 40, e->payload_off);
		put32(p + 44, e->flags);
	}
	m->index_len = len;
	m->index_xxh = ferry__xxh3_64(idx, len);
	put32(t, FERRY__CZ_TRAILER_MAGIC);
	put32(t + 4, FERRY__CZ_TRAILER_LEN - 8);
	memcpy(t + 8, body_magic, 8);
	put32(t + 16, FERRY__CZ_VERSION);
	put32(t + 20, (uint32_t)m->codec);
	put32(t + 24, m->chunk_size);
	put32(t + 28, m->level);
	put64(t + 32, m->index_off);
	put64(t + 40, m->index_len);
	put64(t + 48, m->total);
	put64(t + 56, m->nchunks);
	put64(t + 64, m->index_xxh);
	put64(t + 72, ferry__xxh3_64(t, 72));
}

/* ------------------------------------------------------------------------------ parallel loop */

struct par {
	size_t n;
	atomic_size_t next;
	int (*fn)(void *arg, size_t i);
	void *arg;
	pthread_mutex_t lock;
	size_t err_i; /* lowest failed index, n when none */
	int err;
	char detail[512];
};

static void *par_run(void *p)
{
	struct par *w = p;
	for (;;) {
		size_t i = atomic_fetch_add(&w->next, 1);
		if (i >= w->n)
			break;
		int r = w->fn(w->arg, i);
		if (r < 0) {
			pthread_mutex_lock(&w->lock);
			if (i < w->err_i) {
				w->err_i = i;
				w->err = r;
				snprintf(w->detail, sizeof(w->detail), "%s", ferry_last_error());
			}
			pthread_mutex_unlock(&w->lock);
			atomic_store(&w->next, w->n); /* no new work after a failure */
		}
	}
	return NULL;
}

int ferry__cz_parallel(size_t n, unsigned threads, int (*fn)(void *arg, size_t i), void *arg)
{
	if (n == 0)
		return 0;
	if (threads <= 1 || n == 1) {
		for (size_t i = 0; i < n; i++) {
			int r = fn(arg, i);
			if (r < 0)
				return r;
		}
		return 0;
	}
	struct par w = {.n = n, .fn = fn, .arg = arg, .err_i = n};
	atomic_init(&w.next, 0);
	pthread_mutex_init(&w.lock, NULL);
	size_t extra = (threads < n ? threads : n) - 1;
	pthread_t tid[256];
	size_t started = 0;
	if (extra > 255)
		extra = 255;
	for (; started < extra; started++)
		if (pthread_create(&tid[started], NULL, par_run, &w) != 0)
			break; /* fewer threads: the caller's thread still does all the work left */
	par_run(&w);
	for (size_t k = 0; k < started; k++)
		pthread_join(tid[k], NULL);
	pthread_mutex_destroy(&w.lock);
	if (w.err_i < n)
		return ferry__error_raise(w.err, w.detail);
	return 0;
}
