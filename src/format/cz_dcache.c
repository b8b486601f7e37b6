/*
 * Decoded chunks of compressed files kept in device memory (format/cz.h, ferry__cz_dcache): the
 * loader's pipeline threads on a device decode with nvCOMP into these entries and copy their
 * batches' samples out of them on the GPU, so that a compressed shard costs the loader's CPU a
 * frame's read and checksum instead of its decoding (issue 26: "decompression never costing the
 * loader more than one core"). An nvCOMP batch takes about one chunk's decoding however many chunks
 * it holds (GPU.md), so the chunks a batch misses are decoded together: under the chunk window
 * (loader.c) the first batch of a window misses most of its chunks and the rest hit.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/cz.h"
#include "gpu/nvcomp.h"
#include "gpu/ring.h"

struct dentry {
	const struct ferry_cz *z; /* NULL: empty */
	uint64_t i, used, batch;  /* the chunk; last use; the batch that last used it */
	uint64_t dev;             /* device memory, cap bytes */
	size_t cap;
	size_t next; /* the next held entry of its bucket, SIZE_MAX: none */
};

struct drange {
	size_t e;     /* the entry */
	uint64_t src; /* bytes into the entry */
	uint64_t at, len;
};

struct dpend {
	size_t e;
	struct ferry_cz *z;
	uint64_t i;
	size_t at; /* where its frame (its payload at a 256-byte boundary) or, stored, its bytes lie in the staging */
	int codec; /* FERRY__CZ_* for nvCOMP; 0: a stored chunk, copied */
};

struct ferry__cz_dcache {
	int dev;
	uint64_t budget, bytes, tick, batch;
	struct dentry *e;
	size_t n, cap;
	size_t *head; /* head_cap buckets of held entries by chunk (SIZE_MAX: none), see find */
	size_t head_cap;
	struct drange *r;
	size_t nr, rcap;
	struct dpend *p;
	size_t np, pcap;
	struct ferry__pinned_pool *pool;
	void *stage; /* pinned: the frames of the chunks to decode, stored chunks' bytes */
	size_t stage_cap;
	int stage_pin;
	uint8_t *frame; /* a stored chunk's frame (host) */
	size_t frame_cap;
	uint64_t scratch; /* device: the frames nvCOMP reads */
	size_t scratch_len;
	struct ferry__nvc *nvc[3]; /* by codec */
	size_t ng[3];              /* chunks of the last batch per codec (finish) */
	int queued;                /* nvCOMP batches not finished */
	struct ferry__cz_dcache_stats st;
};

int ferry__cz_dcache_create(int dev, uint64_t budget, struct ferry__pinned_pool *pool, struct ferry__cz_dcache **out)
{
	struct ferry__cz_dcache *c = calloc(1, sizeof(*c));
	*out = NULL;
	if (!c)
		return ferry__error(-ENOMEM, "decoded chunks in device memory");
	c->dev = dev;
	c->budget = budget;
	c->pool = pool;
	*out = c;
	return 0;
}

void ferry__cz_dcache_destroy(struct ferry__cz_dcache *c)
{
	if (!c)
		return;
	for (size_t k = 0; k < c->n; k++)
		if (c->e[k].dev)
			ferry__gpu_release(c->dev, c->e[k].dev);
	if (c->scratch)
		ferry__gpu_release(c->dev, c->scratch);
	if (c->stage)
		ferry__pinned_free(c->pool, c->stage);
	for (int k = 0; k < 3; k++)
		ferry__nvc_close(c->nvc[k]);
	free(c->e), free(c->head), free(c->r), free(c->p), free(c->frame);
	free(c);
}

void ferry__cz_dcache_stats(const struct ferry__cz_dcache *c, struct ferry__cz_dcache_stats *out)
{
	if (c)
		*out = c->st;
	else
		memset(out, 0, sizeof(*out));
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 64;
	while (nc < need)
		nc *= 2;
	void *q = realloc(*p, nc * size);
	if (!q)
		return ferry__error(-ENOMEM, "decoded chunks in device memory: %zu entries", nc);
	*p = q;
	*cap = nc;
	return 0;
}

/*
 * Held entries are found through a hash of their chunk. A scan of the entries for each range and
 * each look-ahead item took 35% of the pipeline thread's CPU at 256 KiB chunks (256 entries at the
 * default chunk_cache), 9% at 1 MiB (64): more than the frames' checksums. With the hash, 2.19 µs
 * a sample became 1.37 at 256 KiB, 1.96 became 1.78 at 1 MiB (perf and the loader's cpu_ns over
 * tests/unit/fakes with the fakes' decoding and bulk copies turned off, zstd token shards, batches
 * of 64 x 2,048 tokens, one pipeline thread, the chunk window; medians of 5). Chains through
 * dentry.next; as many buckets as the entries have room for (a power of two).
 */
static size_t bucket(const struct ferry__cz_dcache *c, const struct ferry_cz *z, uint64_t i)
{
	uint64_t h = ((uint64_t)(uintptr_t)z >> 4) * 0x9e3779b97f4a7c15ull ^ i * 0xc2b2ae3d27d4eb4full;
	return (size_t)(h ^ h >> 29) & (c->head_cap - 1);
}

static size_t find(const struct ferry__cz_dcache *c, const struct ferry_cz *z, uint64_t i)
{
	if (!c->head)
		return SIZE_MAX;
	size_t k = c->head[bucket(c, z, i)];
	while (k != SIZE_MAX && (c->e[k].z != z || c->e[k].i != i))
		k = c->e[k].next;
	return k;
}

static void link_entry(struct ferry__cz_dcache *c, size_t k)
{
	size_t *h = &c->head[bucket(c, c->e[k].z, c->e[k].i)];
	c->e[k].next = *h;
	*h = k;
}

/* Entry k emptied (held no longer). */
static void unhold(struct ferry__cz_dcache *c, size_t k)
{
	struct dentry *x = &c->e[k];
	if (!x->z)
		return;
	size_t *at = &c->head[bucket(c, x->z, x->i)];
	while (*at != k)
		at = &c->e[*at].next;
	*at = x->next;
	x->z = NULL;
}

/* Room for entry n (the entries and their buckets, which follow the entries' capacity). */
static int grow_entries(struct ferry__cz_dcache *c)
{
	int r = grow((void **)&c->e, &c->cap, c->n + 1, sizeof(*c->e));
	if (r || c->head_cap == c->cap)
		return r;
	size_t *h = malloc(c->cap * sizeof(*h));
	if (!h)
		return ferry__error(-ENOMEM, "decoded chunks in device memory: %zu buckets", c->cap);
	free(c->head);
	c->head = h;
	c->head_cap = c->cap;
	for (size_t k = 0; k < c->cap; k++)
		h[k] = SIZE_MAX;
	for (size_t k = 0; k < c->n; k++)
		if (c->e[k].z)
			link_entry(c, k);
	return 0;
}

/* The least recently used entry no range of this batch reads, SIZE_MAX: none. */
static size_t victim(const struct ferry__cz_dcache *c)
{
	size_t lru = SIZE_MAX;
	for (size_t k = 0; k < c->n; k++) {
		const struct dentry *x = &c->e[k];
		if (x->batch != c->batch && (lru == SIZE_MAX || x->used < c->e[lru].used))
			lru = k;
	}
	return lru;
}

/* Chunk i of z, not held, made a pending decode in entry lru (SIZE_MAX: none to evict) or in a new
 * one while the budget allows. */
static int make(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t i, size_t lru, size_t *out)
{
	const struct ferry__cz_meta *m = ferry__cz_meta_of(z);
	const struct ferry__cz_chunk *ch = &m->chunks[i];
	int r;
	size_t k = lru;
	if (k == SIZE_MAX || c->bytes + ch->u_size <= c->budget) {
		if ((r = grow_entries(c)))
			return r;
		k = c->n++;
		memset(&c->e[k], 0, sizeof(c->e[k]));
	}
	struct dentry *x = &c->e[k];
	unhold(c, k);
	if (x->cap < ch->u_size) { /* entries hold a whole chunk of the file's size, so they are reused */
		size_t want = m->chunk_size > ch->u_size ? m->chunk_size : ch->u_size;
		if (x->dev)
			ferry__gpu_release(c->dev, x->dev);
		c->bytes -= x->cap;
		x->dev = 0, x->cap = 0;
		if ((r = ferry__gpu_alloc(c->dev, want, &x->dev))) {
			ferry__error_append("%s: chunk %llu: device memory for its decoded bytes", ferry__cz_name(z),
					    (unsigned long long)i);
			return r;
		}
		x->cap = want;
		c->bytes += want;
	}
	if ((r = grow((void **)&c->p, &c->pcap, c->np + 1, sizeof(*c->p))))
		return r;
	c->p[c->np++] = (struct dpend){k, z, i, 0, 0};
	x->z = z, x->i = i, x->used = c->tick, x->batch = c->batch;
	link_entry(c, k);
	*out = k;
	return 0;
}

/* The entry of chunk i of z: held, or made (a pending decode) in the least recently used entry no
 * range of this batch reads, or a new one while the budget allows (or none can be evicted). */
static int entry_for(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t i, size_t *out)
{
	c->tick++;
	size_t k = find(c, z, i);
	if (k == SIZE_MAX)
		return make(c, z, i, victim(c), out);
	c->e[k].used = c->tick;
	c->e[k].batch = c->batch;
	c->st.hits++;
	*out = k;
	return 0;
}

int ferry__cz_dcache_add(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t off, size_t len, uint64_t at)
{
	const struct ferry__cz_meta *m = ferry__cz_meta_of(z);
	if (!len)
		return 0;
	if (off > m->total || len > m->total - off)
		return ferry__error(FERRY_ECORRUPT, "%s: bytes %llu to %llu lie past the end of the data (%llu bytes)",
				    ferry__cz_name(z), (unsigned long long)off, (unsigned long long)(off + len),
				    (unsigned long long)m->total);
	/* the chunks covering [off, off + len): the index's u_off are increasing, chunk_size apart */
	uint64_t a = off / m->chunk_size, b = (off + len - 1) / m->chunk_size + 1;
	for (uint64_t i = a; i < b; i++) {
		const struct ferry__cz_chunk *e = &m->chunks[i];
		uint64_t lo = e->u_off > off ? e->u_off : off;
		uint64_t hi = e->u_off + e->u_size < off + len ? e->u_off + e->u_size : off + len;
		size_t k;
		int r = entry_for(c, z, i, &k);
		if (!r)
			r = grow((void **)&c->r, &c->rcap, c->nr + 1, sizeof(*c->r));
		if (r)
			return r;
		c->r[c->nr++] = (struct drange){k, lo - e->u_off, at + (lo - off), hi - lo};
	}
	return 0;
}

/*
 * Chunks a later batch will read, made pending for this batch's nvCOMP batch (the loader's
 * look-ahead: one batch for a window's chunks instead of one for each batch that misses a few, each
 * costing a chunk's decoding time). Held ones are kept for their batch. 0, 1 when the cache is full
 * (no entry left that this batch does not use, and the budget reached: the caller stops), or a
 * negative code.
 */
int ferry__cz_dcache_prefetch(struct ferry__cz_dcache *c, struct ferry_cz *z, uint64_t off, size_t len)
{
	const struct ferry__cz_meta *m = ferry__cz_meta_of(z);
	if (!len || off >= m->total)
		return 0;
	if (len > m->total - off)
		len = (size_t)(m->total - off);
	uint64_t a = off / m->chunk_size, b = (off + len - 1) / m->chunk_size + 1;
	for (uint64_t i = a; i < b; i++) {
		size_t k = find(c, z, i);
		if (k != SIZE_MAX) {
			c->e[k].used = ++c->tick;
			c->e[k].batch = c->batch;
			continue;
		}
		size_t lru = victim(c);
		if (lru == SIZE_MAX && c->bytes + m->chunks[i].u_size > c->budget)
			return 1;
		c->tick++;
		int r = make(c, z, i, lru, &k);
		if (r)
			return r;
	}
	return 0;
}

size_t ferry__cz_dcache_pending(const struct ferry__cz_dcache *c) { return c ? c->np : 0; }

/* The pending entries forgotten (a batch that failed): nothing of theirs is decoded. */
static void forget(struct ferry__cz_dcache *c)
{
	for (size_t q = 0; q < c->np; q++)
		unhold(c, c->p[q].e);
	c->np = 0;
}

void ferry__cz_dcache_reset(struct ferry__cz_dcache *c)
{
	if (!c)
		return;
	forget(c);
	c->nr = 0;
	c->queued = 0;
	c->batch++;
}

#define A256(x) (((x) + 255) & ~(size_t)255)

/* The pending chunks' frames (nvCOMP's) and stored chunks' bytes into the pinned staging. */
static int stage_pending(struct ferry__cz_dcache *c, size_t *frames_end, size_t *total)
{
	size_t at = 0;
	for (size_t q = 0; q < c->np; q++) { /* nvCOMP's frames first, a payload at each 256 bytes */
		struct dpend *p = &c->p[q];
		const struct ferry__cz_meta *m = ferry__cz_meta_of(p->z);
		const struct ferry__cz_chunk *e = &m->chunks[p->i];
		if (e->flags & FERRY__CZ_STORED)
			continue;
		p->codec = m->codec;
		p->at = A256(at + e->payload_off) - e->payload_off;
		at = p->at + e->c_size;
	}
	*frames_end = at;
	for (size_t q = 0; q < c->np; q++) {
		struct dpend *p = &c->p[q];
		const struct ferry__cz_chunk *e = &ferry__cz_meta_of(p->z)->chunks[p->i];
		if (!(e->flags & FERRY__CZ_STORED))
			continue;
		p->codec = 0;
		p->at = A256(at);
		at = p->at + e->u_size;
	}
	*total = at;
	int r;
	if (at > c->stage_cap) {
		if (c->stage)
			ferry__pinned_free(c->pool, c->stage);
		c->stage = NULL, c->stage_cap = 0;
		size_t want = A256(at + at / 2);
		if ((r = ferry__pinned_alloc(c->pool, want, &c->stage, &c->stage_pin)))
			return r;
		c->stage_cap = want;
	}
	uint8_t *st = c->stage;
	for (size_t q = 0; q < c->np; q++) {
		struct dpend *p = &c->p[q];
		const struct ferry__cz_meta *m = ferry__cz_meta_of(p->z);
		const struct ferry__cz_chunk *e = &m->chunks[p->i];
		const char *name = ferry__cz_name(p->z);
		if (p->codec) {
			r = ferry__cz_read_raw(p->z, st + p->at, e->c_size, e->c_off, p->i);
			if (!r)
				r = ferry__cz_check_gpu_frame(m, p->i, st + p->at, name,
							      p->codec == FERRY__CZ_LZ4 && ferry__nvc_walks_lz4(c->dev));
		} else {
			if (c->frame_cap < e->c_size) {
				free(c->frame);
				c->frame_cap = 0;
				if (!(c->frame = malloc(e->c_size)))
					return ferry__error(-ENOMEM, "%s: chunk %llu: %u bytes", name, (unsigned long long)p->i, e->c_size);
				c->frame_cap = e->c_size;
			}
			r = ferry__cz_read_raw(p->z, c->frame, e->c_size, e->c_off, p->i);
			if (!r)
				r = ferry__cz_decode(m, p->i, c->frame, st + p->at, ferry__cz_verifies(p->z), name);
		}
		if (r)
			return r;
	}
	return 0;
}

/* The copies in from pinned (or, where the pool could not pin, pageable: synchronous) memory, one
 * call each: not ferry__ring_h2d_gather, which merges pieces whose sources and destinations follow
 * on, and two entries' allocations can lie side by side (the H200 refused such a copy spanning
 * two, CUDA_ERROR_INVALID_VALUE). A batch has one piece of frames and one per stored chunk. */
static int copy_in(struct ferry__cz_dcache *c, struct ferry__ring_gpu *ring, const struct ferry__ring_piece *p, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		int r = p[k].len ? ferry__ring_h2d(ring, p[k].dst, p[k].src, p[k].len, c->stage_pin) : 0;
		if (r)
			return r;
	}
	return 0;
}

static int decode_pending(struct ferry__cz_dcache *c, struct ferry__ring_gpu *ring)
{
	size_t frames_end = 0, total = 0;
	int r = stage_pending(c, &frames_end, &total);
	if (r)
		return r;
	struct ferry__ring_piece *in = calloc(c->np + 1, sizeof(*in));
	uint64_t *src = calloc(c->np, sizeof(*src) * 2);
	size_t *len = calloc(c->np, sizeof(*len) * 2);
	if (!in || !src || !len) {
		free(in), free(src), free(len);
		return ferry__error(-ENOMEM, "decoded chunks in device memory: a batch of %zu chunks", c->np);
	}
	size_t nin = 0;
	if (frames_end) {
		if (c->scratch_len < frames_end) {
			if (c->scratch)
				ferry__gpu_release(c->dev, c->scratch);
			c->scratch = 0, c->scratch_len = 0;
			size_t want = A256(frames_end + frames_end / 2);
			if ((r = ferry__gpu_alloc(c->dev, want, &c->scratch))) {
				ferry__error_append("decoded chunks in device memory: scratch for %zu bytes of frames", frames_end);
				goto out;
			}
			c->scratch_len = want;
		}
		in[nin++] = (struct ferry__ring_piece){c->scratch, c->stage, frames_end};
	}
	for (size_t q = 0; q < c->np; q++) {
		const struct dpend *p = &c->p[q];
		const struct ferry__cz_chunk *e = &ferry__cz_meta_of(p->z)->chunks[p->i];
		if (!p->codec)
			in[nin++] = (struct ferry__ring_piece){c->e[p->e].dev, (uint8_t *)c->stage + p->at, e->u_size};
	}
	if ((r = copy_in(c, ring, in, nin)))
		goto out;
	for (int codec = FERRY__CZ_LZ4; codec <= FERRY__CZ_ZSTD; codec++) {
		uint64_t *dst = src + c->np;
		size_t *cap = len + c->np, ng = 0;
		for (size_t q = 0; q < c->np; q++) {
			const struct dpend *p = &c->p[q];
			if (p->codec != codec)
				continue;
			const struct ferry__cz_chunk *e = &ferry__cz_meta_of(p->z)->chunks[p->i];
			src[ng] = c->scratch + p->at + e->payload_off;
			len[ng] = codec == FERRY__CZ_LZ4 ? e->c_size - FERRY__CZ_LZ4_PAYLOAD - 4 : e->c_size;
			dst[ng] = c->e[p->e].dev;
			cap[ng] = e->u_size;
			ng++;
		}
		c->ng[codec] = 0;
		if (!ng)
			continue;
		if (!c->nvc[codec] && (r = ferry__nvc_open(c->dev, codec, &c->nvc[codec])))
			goto out;
		if ((r = ferry__nvc_decompress(c->nvc[codec], ferry__ring_stream(ring), ng, src, len, dst, cap)))
			goto out;
		c->ng[codec] = ng;
		c->queued = 1;
		c->st.batches++;
	}
out:
	free(in), free(src), free(len);
	return r;
}

int ferry__cz_dcache_queue(struct ferry__cz_dcache *c, struct ferry__ring_gpu *ring, uint64_t base, int *pending)
{
	int r = 0;
	*pending = 0;
	if (c->np) {
		if ((r = decode_pending(c, ring))) {
			(void)ferry__ring_drain(ring); /* nothing may still read the staging */
			if (c->queued)
				for (int k = 0; k < 3; k++)
					if (c->ng[k])
						(void)ferry__nvc_finish(c->nvc[k], NULL);
			ferry__cz_dcache_reset(c);
			return r;
		}
		*pending = 1; /* the staging's copies (and nvCOMP's batches) must be over before the next */
	}
	struct ferry__ring_dpiece *g = c->nr ? malloc(c->nr * sizeof(*g)) : NULL;
	if (c->nr && !g)
		r = ferry__error(-ENOMEM, "decoded chunks in device memory: %zu copies", c->nr);
	for (size_t k = 0; !r && k < c->nr; k++)
		g[k] = (struct ferry__ring_dpiece){c->e[c->r[k].e].dev + c->r[k].src, base + c->r[k].at, c->r[k].len};
	if (!r)
		r = ferry__ring_d2d_gather(ring, c->dev, g, c->nr, NULL);
	free(g);
	c->nr = 0;
	c->batch++;
	if (r && *pending) {
		(void)ferry__ring_drain(ring);
		(void)ferry__cz_dcache_finish(c);
		*pending = 0;
		forget(c);
	}
	return r;
}

int ferry__cz_dcache_finish(struct ferry__cz_dcache *c)
{
	int r = 0;
	size_t *got = NULL;
	for (int codec = FERRY__CZ_LZ4; c->queued && codec <= FERRY__CZ_ZSTD; codec++) {
		size_t ng = c->ng[codec];
		if (!ng)
			continue;
		c->ng[codec] = 0;
		size_t *g = realloc(got, ng * sizeof(*got));
		if (!g) {
			(void)ferry__nvc_finish(c->nvc[codec], NULL);
			r = r ? r : ferry__error(-ENOMEM, "decoded chunks in device memory: %zu sizes", ng);
			continue;
		}
		got = g;
		int q = ferry__nvc_finish(c->nvc[codec], got);
		const size_t bad = ferry__nvc_failed(c->nvc[codec]);
		/* the pending chunks of this codec, in the order they went to nvCOMP */
		for (size_t k = 0, j = 0; k < c->np && j < ng; k++) {
			const struct dpend *p = &c->p[k];
			if (p->codec != codec)
				continue;
			const struct ferry__cz_chunk *e = &ferry__cz_meta_of(p->z)->chunks[p->i];
			if (!q && got[j] != e->u_size)
				q = ferry__error(FERRY_ECORRUPT, "%s: chunk %llu: nvCOMP decoded %zu bytes, the index says %u",
						 ferry__cz_name(p->z), (unsigned long long)p->i, got[j], e->u_size);
			else if (q && j == bad) /* nvCOMP's status or the walk's verdict names it */
				ferry__error_append("%s: chunk %llu (compressed offset %llu)", ferry__cz_name(p->z),
						    (unsigned long long)p->i, (unsigned long long)e->c_off);
			else if (q && j == 0 && bad >= ng)
				ferry__error_append("%s: %zu chunks decoded on the GPU, from chunk %llu", ferry__cz_name(p->z), ng,
						    (unsigned long long)p->i);
			j++;
		}
		if (q && !r)
			r = q;
	}
	free(got);
	c->queued = 0;
	if (r) {
		forget(c);
		return r;
	}
	for (size_t q = 0; q < c->np; q++) {
		const struct dpend *p = &c->p[q];
		const struct ferry__cz_chunk *e = &ferry__cz_meta_of(p->z)->chunks[p->i];
		if (p->codec)
			c->st.gpu_decodes++;
		else
			c->st.cpu_decodes++;
		c->st.decoded += e->u_size;
	}
	c->np = 0;
	return 0;
}
