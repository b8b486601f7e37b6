/*
 * The loader: pipeline threads plan each batch (the sampler's indices, or token windows mapped to
 * pieces of samples), sort and merge the reads of neighbouring samples, submit them as one
 * ferry_batch, assemble the batch in a pinned slot, and copy it to the device on the thread's own
 * stream with an event. The consumer takes batches in order; the time it blocks is the step's wait.
 * Slots cycle FREE -> FILLING -> READY -> HELD (by the consumer) -> FREE.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/knob.h"
#include "base/mapcopy.h"
#include "ferry/data.h"
#include "format/cz.h"
#include "format/shards.h"
#include "gpu/nvcomp.h"
#include "gpu/ring.h"
#include "engine/export.h"
#include "loader/sampler.h"

int ferry__distributed_from_order(const int64_t *order, uint64_t n, uint32_t num_replicas,
				  uint32_t rank, uint64_t count, int64_t *out);

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

/*
 * Device memory for one batch. A slot holds one while it fills; ferry_loader_take gives it to the
 * caller (the slot takes another for its next batch), and ferry_loader_buffer_destroy puts it back in
 * the spare queue with an event recorded on the caller's stream, which the next upload into it
 * waits for on the GPU. Buffers may outlive the loader: each holds a reference to it.
 */
struct ferry_loader_buffer {
	struct ferry_loader *l;
	uint64_t dev;
	void *fence; /* recorded by ferry_loader_buffer_destroy; never recorded: nothing to wait for */
	struct ferry_loader_buffer *next;
};

struct ferry_loader_batch {
	struct ferry_loader *l;
	int state;
	int err;
	uint64_t seq, epoch, step;
	uint32_t count;
	size_t bytes;
	void *host;
	int pinned;
	struct ferry_loader_buffer *buf; /* device loaders: the batch's device memory */
	struct ferry__ring_gpu *ring; /* the ring that uploaded it (ticket: the slot's index) */
	uint64_t *offsets; /* [batch_size + 1] */
	int64_t *indices;  /* [batch_size] */
	/* documents=1: each element's position in its sequence, and the sequences' cumulative lengths,
	 * in the slot after the data (pos_off, cu_off): uploaded with it */
	int64_t *pos;      /* [slot elements] */
	int32_t *cu;       /* [ncu], at most cu_cap */
	uint32_t ncu, cu_cap, max_seqlen;
};

struct piece {
	uint32_t file;
	uint64_t off, len, dst;
	int64_t sample; /* >= 0: the sample it reads; < 0: -1 - the stream byte it starts at (runs) */
};

/*
 * Token windows over samples that lie back to back in their shard: a run is a stretch of the
 * stream (all samples concatenated) that is one stretch of one file, so a window in it is one read
 * at an offset computed from the window's index, without looking up the samples (their prefix sums,
 * lengths and offsets: three to four cache misses a window over a large index, most of the pipeline
 * thread's own time; docs/PERFORMANCE.md, issue 22). A Megatron .bin is one run.
 */
struct run {
	uint64_t at;  /* its first stream byte; runs[nruns].at is the stream's length */
	uint64_t off; /* where that byte lies in the file */
	uint32_t file;
};

/*
 * A shard mapped by a pipeline thread (mapped=1). Residency is known per segment of 2 MiB: a
 * segment whose last check (one cachestat of the segment) found all its pages in the page cache is
 * copied out of the mapping, without a pread and a cachestat per read, until the check is repeated
 * max(5 s, 200x its cost) later (a 2 GiB shard's 1,024 checks cost ~25-40 ms on the development
 * VM). A segment not resident is read as before (pread when the range is resident, else the
 * engine). A page evicted between two checks is read back by the copy's page fault: slower, still
 * right. The file's size is checked (fstat) once a second. A page's first copy maps it into the
 * process (a minor fault, ~2.2 µs there; on tmpfs one fault a page, where a disk file's page cache
 * gets 16 pages mapped a fault: fault-around, kernel 6.18, 60,437 faults for 65,536 pages of
 * /dev/shm against 1,024 for 16,384 of /var/tmp): over issue 22's 2 GiB, CPU a batch of 64 x 2049 with
 * mapped=1 was 345 µs in the first epoch, 109-111 after it; with pread 270-295 throughout. Reading
 * a segment's first epoch with pread and mapping it after only moved the faults: the second epoch
 * then cost 525-535. MADV_POPULATE_READ of a segment when first seen resident cost the same per
 * page, only sooner (the first batch after 237 ms instead of 126).
 */
#define SEG_SHIFT 21 /* 2 MiB: a check costs ~30 us here (cachestat ~65 ns a page, loaded VM) */
#define SEG_RECHECK_NS 5000000000ull /* a segment's residency is checked again after 5 s at least */
#define STAT_EVERY_NS 1000000000ull  /* a mapped shard's size is checked again after 1 s */
/* shard_map.seg's entries: the time of the next check, | 1 while resident */
static inline uint64_t seg_entry(uint64_t next, int res) { return (next & ~1ull) | (uint64_t)!!res; }
struct shard_map {
	uint8_t *base;       /* NULL: not mapped */
	uint64_t size;       /* mapped bytes: the file's size when checked */
	uint64_t next_stat;  /* ferry__now_ns() of the next fstat */
	uint64_t *seg;       /* [segments]: the next check's time, | 1 while resident */
	const ferry_file *mf; /* the file mapped: the shard's own, or its staged copy in a dataset cache */
	uint64_t mgen;       /* ferry__dataset_file_gen of mf (0: the shard's own file) */
	uint64_t used_end;   /* the batch being filled: the end of its copies from here */
	uint64_t used_gen;   /* the batch (worker's gen) used_end belongs to */
	bool lent;           /* base is the dataset cache's mapping of mf (ferry__dataset_file_map), not ours */
};

struct skey { /* sort_pieces */
	uint64_t key;
	uint32_t i;
};

struct worker {
	struct ferry_loader *l;
	pthread_t tid;
	int started;
	ferry_batch *batch;
	struct ferry__ring_gpu *ring; /* device loaders: this worker's uploads, a ticket per slot */
	uint64_t drops_seen; /* ferry__dataset_cache_drops when the maps were last checked */
	int64_t *epoch_idx; /* this rank's indices of cached_epoch */
	uint64_t cached_epoch;
	int64_t *order;
	struct piece *pieces;
	uint32_t *sorted;
	struct skey *skeys; /* [min(pieces_cap, 256)] */
	size_t pieces_cap;
	uint8_t *stage;
	size_t stage_cap;
	uint8_t *inl; /* per group of the batch being filled: read inline (1) or by the engine */
	ferry_file **gf; /* per group: the file it reads (ferry__dataset_file_get), put after the reads */
	size_t inl_cap;
	struct shard_map *maps; /* [nmaps]: by shard (the copies' after the dataset's) */
	uint32_t nmaps;
	struct ferry__mcopy *mc;
	size_t mc_cap;
	uint32_t *used; /* [nmaps]: the shards the batch being filled copies from */
	uint32_t nused;
	uint64_t gen;   /* batches filled */
	uint64_t mapped_reads; /* not yet added to the loader's */
	uint64_t lent_maps;    /* the same: mappings lent by the dataset's cache (map_lent) */
	struct ferry__bus_guard *guard; /* claimed by the thread itself */
	uint64_t cpu_ns;
	struct ferry__cz_cache *czc; /* compressed shards' decoded chunks (chunk_cache bytes) */
	struct ferry__cz_cache_stats cz_seen; /* czc's counters already added to the loader's */
	struct ferry__cz_dcache *dc; /* device loaders: chunks decoded on the GPU (chunk_cache bytes of device memory) */
	struct ferry__cz_dcache_stats dc_seen;
};

struct ferry_loader {
	pid_t pid; /* the process that made it: in a fork()ed child its threads do not exist (forked()) */
	ferry_dataset *ds;
	/* knobs */
	uint32_t batch_size, world_size, rank, threads, prefetch;
	uint64_t seq_len, seed, epoch, epochs, block, merge_gap;
	int order, drop_last, drop_last_batch, device, inline_cached, mapped, documents;
	int64_t shard_window; /* the knob: -1 auto, 0 off, N shards */
	uint32_t window;      /* resolved by setup: shards a window of the shuffle (0: plain shuffle) */
	uint64_t *wbound;     /* [wunits + 1] with window: each unit's first item */
	int64_t chunk_window; /* the knob: -1 auto, 0 off, N units */
	uint64_t chunk_cache; /* the knob: bytes of decoded chunks a pipeline thread keeps */
	int cz_decode;        /* the knob: CZD_* */
	unsigned cz_gpu_codecs; /* resolved at start: 1 << codec for the codecs decoded on the GPU */
	int chunked;          /* the window's units are runs of compressed shards' chunks, not shards */
	uint32_t wunits;      /* units of the window order (shards, or runs of chunks) */
	int copies; /* epoch e from pre-shuffled copy e mod N (ferry.copies) */
	/* resume position */
	uint64_t pos_epoch, pos_batch;
	/* derived */
	uint64_t items, per_rank, bpe, end_seq;
	size_t esize, slot_bytes;
	size_t pos_off, cu_off; /* documents=1: where position_ids and cu_seqlens lie in a slot */
	uint32_t cu_max;
	uint64_t *cum; /* token mode: byte prefix sums of the samples, [n + 1] */
	struct run *runs; /* token mode without documents, when samples lie in few runs: [nruns + 1] */
	uint64_t nruns;
	uint8_t *doc_start; /* documents=1, Megatron: sample i starts a document; NULL: every one does */
	/* pipeline */
	int started, stop, failed;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t next_claim, next_consume;
	struct ferry_loader_batch *slots;
	uint32_t nslots;
	struct worker *workers;
	/* device buffers: spare ones (oldest freed first), how many exist; under mu */
	struct ferry_loader_buffer *spare, *spare_tail;
	uint32_t nbufs;
	/* the owner's reference and one per taken buffer; `destroyed` once the owner let go */
	long refs;
	int destroyed;
	struct ferry__pinned_pool *pool;
	int gpu; /* started on a device: its buffers and rings exist */
	/* metrics */
	uint64_t *waits, nwaits, waits_cap;
	uint64_t t_start, bytes, samples, reads, merged, inline_reads, mapped_reads, mapped_faults, lent_maps;
	uint64_t chunk_decodes, chunk_decoded; /* the workers' decoded chunk caches, added after each batch */
	uint64_t gpu_chunk_decodes, gpu_decode_batches; /* of chunk_decodes, those nvCOMP decoded; its batches */
	struct ferry__activity *act; /* what `ferry top` shows of this loader (NULL: not publishing) */
	int err;
	char errmsg[768];
};

static const char *const metric_names[] = {
	"steps", "wait_total_ns", "wait_mean_ns", "wait_p50_ns", "wait_p90_ns", "wait_p99_ns",
	"wait_max_ns", "bytes", "samples", "elapsed_ns", "samples_per_s", "bytes_per_s", "reads",
	"merged", "cpu_ns", "inline_reads", "device_buffers", "mapped_reads", "mapped_faults",
	"chunk_decodes", "chunk_decoded_bytes", "gpu_chunk_decodes", "gpu_decode_batches", "lent_maps", NULL,
};

const char *const *ferry_loader_metric_names(void) { return metric_names; }

/* The device knob: cpu or -1 (host memory), N, cuda:N or cuda (device 0). */
static int parse_device(const char *text, uint64_t *out)
{
	char *end;

	if (!strcmp(text, "cpu") || !strcmp(text, "-1")) {
		*out = (uint64_t)-1;
		return 0;
	}
	if (!strncmp(text, "cuda:", 5))
		text += 5;
	else if (!strcmp(text, "cuda"))
		text = "0";
	if (!*text || *text == '-')
		return FERRY_EBADOPT;
	errno = 0;
	*out = strtoull(text, &end, 0);
	return errno || *end ? FERRY_EBADOPT : 0;
}

static const char *const order_choices[] = {"sequential", "shuffle", "block", NULL}; /* ferry_order */
enum { CZD_AUTO, CZD_CPU, CZD_GPU };
static const char *const cz_decode_choices[] = {"auto", "cpu", "gpu", NULL};

/* A row of the loader's table: integers in C syntax (strtoull's base 0), as the loader has taken. */
#define LOADER(n, t, d, lo, hi, ...)                                                                     \
	{.name = #n, .type = FERRY__KNOB_##t, FERRY__KNOB_AT(struct ferry_loader, n), .def = d, .min = lo, \
	 .max = hi, .flags = FERRY__KNOB_C_INT, __VA_ARGS__}

/*
 * The knobs of what a rank reads (batch_size to drop_last_batch, device) have no environment
 * variable: the environment must not change which samples a program sees. The pipeline's shape
 * has one (docs/CONFIG.md).
 */
static const struct ferry__knob loader_rows[] = {
	LOADER(batch_size, UINT, 1, 1, UINT32_MAX, .doc = "samples per batch"),
	LOADER(seq_len, UINT, 0, 0, UINT64_MAX, .doc = "0: one sample per dataset sample; N: windows of N tokens"),
	LOADER(world_size, UINT, 1, 1, UINT32_MAX, .doc = "ranks the samples are split across"),
	LOADER(rank, UINT, 0, 0, UINT32_MAX, .doc = "this rank"),
	LOADER(seed, UINT, 0, 0, UINT64_MAX, .doc = "seed of shuffle and block orders"),
	LOADER(epoch, UINT, 0, 0, UINT64_MAX, .doc = "first epoch"),
	LOADER(epochs, UINT, 0, 0, UINT64_MAX, .doc = "epochs to run (0: until destroyed)"),
	{.name = "order", .type = FERRY__KNOB_ENUM, FERRY__KNOB_AT(struct ferry_loader, order),
	 .max = 2, .choices = order_choices, .doc = "sample order"},
	LOADER(block, UINT, 256, 1, UINT64_MAX, .doc = "samples per block of the block order"),
	{.name = "shard_window", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct ferry_loader, shard_window),
	 .def = (uint64_t)-1, .min = (uint64_t)-1, .max = UINT32_MAX, .flags = FERRY__KNOB_SIGNED | FERRY__KNOB_C_INT,
	 .doc = "order shuffle: shards visited N at a time, their items shuffled together (0: off; -1: "
		"off unless the dataset's cache is smaller than the dataset, then (budget / shard - 1) / 2 shards)"},
	{.name = "chunk_window", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct ferry_loader, chunk_window),
	 .def = (uint64_t)-1, .min = (uint64_t)-1, .max = UINT32_MAX, .flags = FERRY__KNOB_SIGNED | FERRY__KNOB_C_INT,
	 .doc = "order shuffle over compressed shards: runs of 1 MiB of chunks visited N at a time, their items "
		"shuffled together (0: off; -1: on where a shard is compressed, N from chunk_cache and batch_size)"},
	{.name = "chunk_cache", .type = FERRY__KNOB_SIZE, FERRY__KNOB_AT(struct ferry_loader, chunk_cache),
	 .def = 64u << 20, .min = 1u << 20, .max = 1ull << 40, .env = "FERRY_LOADER_CHUNK_CACHE",
	 .doc = "bytes of decoded chunks of compressed shards each pipeline thread keeps"},
	{.name = "cz_decode", .type = FERRY__KNOB_ENUM, FERRY__KNOB_AT(struct ferry_loader, cz_decode), .max = 2,
	 .choices = cz_decode_choices, .env = "FERRY_LOADER_CZ_DECODE",
	 .doc = "compressed shards on a device loader: auto (zstd by nvCOMP on the GPU where it is loaded, "
		"else the CPU), cpu, gpu (required, LZ4 too)"},
	LOADER(copies, BOOL, 0, 0, 1,
	       .doc = "order shuffle: epoch e read sequentially from the dataset's pre-shuffled copy e mod N"),
	LOADER(drop_last, BOOL, 0, 0, 1, .doc = "the sampler's drop_last"),
	LOADER(drop_last_batch, BOOL, 0, 0, 1, .doc = "drop a short last batch"),
	LOADER(documents, BOOL, 0, 0, 1,
	       .doc = "each batch also gives position_ids and cu_seqlens of the documents in it"),
	{.name = "device", .type = FERRY__KNOB_UINT, FERRY__KNOB_AT(struct ferry_loader, device),
	 .def = (uint64_t)-1, .min = (uint64_t)-1, .max = 1024, .flags = FERRY__KNOB_SIGNED,
	 .parse = parse_device, .expect = "cpu, -1, N, cuda:N or cuda (N from 0 to 1024)",
	 .doc = "where batches go: -1 host memory, N CUDA device N"},
	LOADER(prefetch, UINT, 4, 1, UINT32_MAX, .env = "FERRY_LOADER_PREFETCH", .doc = "batches kept ready"),
	LOADER(threads, UINT, 1, 1, UINT32_MAX, .env = "FERRY_LOADER_THREADS", .doc = "pipeline threads"),
	LOADER(merge_gap, UINT, 0, 0, UINT64_MAX, .env = "FERRY_LOADER_MERGE_GAP",
	       .doc = "bytes between two reads that are still merged into one"),
	LOADER(inline_cached, BOOL, 1, 0, 1, .env = "FERRY_LOADER_INLINE_CACHED",
	       .doc = "page-cache-resident reads done by the pipeline thread itself"),
	LOADER(mapped, BOOL, 1, 0, 1, .env = "FERRY_LOADER_MAPPED",
	       .doc = "with inline_cached: shards wholly in the page cache copied from a mapping (SIGBUS guarded)"),
};
#undef LOADER

static const char *loader_keys[sizeof(loader_rows) / sizeof(loader_rows[0]) + 1];
static const struct ferry__knobs loader_knobs = {"loader", loader_rows,
						 sizeof(loader_rows) / sizeof(loader_rows[0]), loader_keys};

/*
 * 1 in a child made by fork() without exec (a DataLoader worker, os.fork): the loader's threads are
 * the parent's and do not exist here, and its mutex may have been held by one of them at the fork.
 * Destroying the loader or returning its memory there does nothing (the child's copy is left as
 * it is, freed with the process) instead of joining threads that never end or waiting on a lock
 * no one will release.
 */
static int forked(const struct ferry_loader *l)
{
	return l->pid != getpid();
}

int ferry_loader_create(ferry_dataset *ds, ferry_loader **out)
{
	if (!ds || !out)
		return ferry__error(-EINVAL, "ferry_loader_create: NULL argument");
	struct ferry_loader *l = calloc(1, sizeof(*l));
	if (l)
		l->pid = getpid();
	if (!l)
		return ferry__error(-ENOMEM, "ferry_loader_create");
	l->ds = ds;
	int err = ferry__knobs_init(&loader_knobs, l);
	if (err) {
		free(l);
		return err;
	}
	l->pos_epoch = UINT64_MAX;
	l->refs = 1;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	*out = l;
	return 0;
}

static const char *order_name(int o)
{
	return o == FERRY_ORDER_SHUFFLE ? "shuffle" : o == FERRY_ORDER_BLOCK ? "block" : "sequential";
}

static int set_state(struct ferry_loader *l, const char *v);

/* The order a state names: with copies=1 epoch e's order is copy e mod N's, so N is part of it. */
static const char *state_order(const struct ferry_loader *l, char *buf, size_t len)
{
	if (!l->copies && l->window && l->chunked) {
		snprintf(buf, len, "%s-chunks-%u-of-%u", order_name(l->order), l->window, l->wunits);
		return buf;
	}
	if (!l->copies && l->window) {
		snprintf(buf, len, "%s-window-%u", order_name(l->order), l->window);
		return buf;
	}
	if (!l->copies)
		return order_name(l->order);
	snprintf(buf, len, "%s-copies-%u", order_name(l->order), ferry_dataset_copies(l->ds, NULL));
	return buf;
}

const char *const *ferry_loader_keys(void)
{
	return ferry__knobs_keys(&loader_knobs);
}

int ferry_loader_set(ferry_loader *l, const char *key, const char *value)
{
	if (!l || !key || !value)
		return ferry__error(-EINVAL, "ferry_loader_set: NULL argument");
	if (l->started)
		return ferry__error(FERRY_EBUSY, "ferry_loader_set(%s): the loader has started", key);
	if (!strcmp(key, "state")) /* not a knob: where to resume */
		return set_state(l, value);
	return ferry__knobs_set(&loader_knobs, l, key, value, "ferry_loader_set");
}

/* ----------------------------------------------------------------------------------- planning */

static void seq_pos(const struct ferry_loader *l, uint64_t seq, uint64_t *epoch, uint64_t *b)
{
	uint64_t g = l->pos_batch + seq;
	*epoch = l->pos_epoch + g / l->bpe;
	*b = g % l->bpe;
}

/* With the shard-window shuffle: the shard whose window item i is read in (wbound's). */
static uint32_t window_shard(const struct ferry_loader *l, uint64_t i)
{
	return ferry__first_le(l->wbound, l->ds->x.nfiles, i);
}

static int epoch_indices(struct worker *w, uint64_t epoch)
{
	struct ferry_loader *l = w->l;
	if (w->epoch_idx && w->cached_epoch == epoch)
		return 0;
	const struct ferry__copies *cp = &l->ds->copies;
	/* with copies the epoch's order is the one its copy was written in */
	const int64_t *order = l->copies ? cp->sample + (epoch % cp->ncopies) * cp->n : w->order;
	int err = 0;
	if (l->window) {
		uint32_t nf = l->wunits;
		uint32_t *seq = malloc(2 * (size_t)nf * sizeof(*seq));
		err = seq ? ferry__window_order(l->items, l->wbound, nf, l->window, l->seed, epoch, w->order, seq)
			  : ferry__error(-ENOMEM, "loader: %u shards", nf);
		/* the dataset's cache stages the shards in this order, and the next epoch's, as far ahead
		 * as its budget holds, and evicts the shard whose next use in them is farthest */
		if (!err && l->ds->cache && !l->chunked) {
			int r = ferry__window_shards(nf, l->seed, epoch + 1, seq + nf);
			if (r) /* (no memory for it: the plan goes without the next epoch's order) */
				ferry__error_clear();
			ferry__dataset_cache_plan(l->ds, epoch, seq, r ? NULL : seq + nf, nf, l->window);
		}
		free(seq);
	} else if (!l->copies) {
		err = ferry_order_indices(l->items, l->order, l->block, l->seed, epoch, w->order);
	}
	if (err)
		return err;
	ferry__distributed_from_order(order, l->items, l->world_size, l->rank, l->per_rank,
				      w->epoch_idx);
	w->cached_epoch = epoch;
	ferry__dataset_cache_rewind(l->ds); /* shards that found no room in the cache are tried again */
	return 0;
}

static int add_piece(struct worker *w, size_t *np, uint32_t file, uint64_t off, uint64_t len,
		     uint64_t dst, int64_t sample)
{
	if (*np == w->pieces_cap) {
		size_t c = w->pieces_cap ? w->pieces_cap * 2 : 256;
		struct piece *p = realloc(w->pieces, c * sizeof(*p));
		uint32_t *s = p ? realloc(w->sorted, c * sizeof(*s)) : NULL;
		if (p)
			w->pieces = p;
		if (s)
			w->sorted = s;
		struct skey *k = s ? realloc(w->skeys, (c < 256 ? c : 256) * sizeof(*k)) : NULL;
		if (!k)
			return ferry__error(-ENOMEM, "loader: %zu reads", c);
		w->skeys = k;
		w->pieces_cap = c;
	}
	w->pieces[(*np)++] = (struct piece){file, off, len, dst, sample};
	return 0;
}

static int cmp_piece(const void *a, const void *b, void *base)
{
	const struct piece *pieces = base;
	const struct piece *x = &pieces[*(const uint32_t *)a], *y = &pieces[*(const uint32_t *)b];
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/*
 * sorted[] = the pieces' indices in (file, off, dst) order. A piece's dst grows with its index, so
 * a stable sort on (file, off) gives that order: packed into one 64-bit key when they fit, sorted
 * with their indices by insertion for a batch's few dozen pieces (qsort_r's indirect comparisons
 * cost ~30 µs a batch of 64; perf, docs/PERFORMANCE.md, issue 22), else qsort_r.
 */
static void sort_pieces(struct worker *w, size_t np)
{
	const struct piece *pieces = w->pieces;
	uint32_t *sorted = w->sorted;
	struct skey *k = w->skeys;
	int packed = np <= 256;
	for (size_t i = 0; packed && i < np; i++) {
		packed = pieces[i].file < (1u << 20) && pieces[i].off < (1ull << 44);
		struct skey x = {(uint64_t)pieces[i].file << 44 | pieces[i].off, (uint32_t)i};
		size_t j = i;
		for (; j && k[j - 1].key > x.key; j--)
			k[j] = k[j - 1];
		k[j] = x;
	}
	if (packed) {
		for (size_t i = 0; i < np; i++)
			sorted[i] = k[i].i;
		return;
	}
	for (size_t i = 0; i < np; i++)
		sorted[i] = (uint32_t)i;
	qsort_r(sorted, np, sizeof(*sorted), cmp_piece, (void *)pieces);
}

/*
 * The group of sorted pieces that starts at g: neighbours in one file no more than merge_gap apart,
 * read with one I/O. Returns the index after the group; *end is the group's end offset and *inplace
 * says whether it lies in the batch as it lies in the file (then it is read in place, not staged).
 */
static size_t group_end(const struct ferry_loader *l, const struct worker *w, size_t g, size_t np,
			uint64_t *end, int *inplace)
{
	const struct piece *p0 = &w->pieces[w->sorted[g]];
	size_t h = g + 1;

	*end = p0->off + p0->len;
	*inplace = 1;
	for (; h < np; h++) {
		const struct piece *p = &w->pieces[w->sorted[h]], *q = &w->pieces[w->sorted[h - 1]];
		if (p->file != p0->file || p->off < *end || p->off - *end > l->merge_gap)
			break;
		if (p->off != *end || p->dst != q->dst + q->len)
			*inplace = 0;
		*end = p->off + p->len;
	}
	return h;
}

#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

static void map_drop(struct shard_map *m)
{
	if (m->base && !m->lent)
		munmap(m->base, m->size);
	free(m->seg);
	m->lent = false;
	m->base = NULL;
	m->seg = NULL;
	m->size = 0;
	m->next_stat = 0;
}

/* Maps shard m again when its size changed (one fstat a second). 0: mapped. */
static int map_stat(struct shard_map *m, int fd, uint64_t now)
{
	struct stat st;
	int ok = !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size > 0;
	if (!ok || (uint64_t)st.st_size != m->size)
		map_drop(m);
	m->next_stat = now + STAT_EVERY_NS;
	if (m->base || !ok)
		return m->base ? 0 : -1;
	uint64_t nseg = (((uint64_t)st.st_size - 1) >> SEG_SHIFT) + 1;
	/* a dataset cache's entry is mapped through an open file description of its own: a mapping
	 * keeps the one it was made from, and with it the entry's flock, after the cache closed its
	 * descriptor, and eviction (an exclusive flock) would never take the entry */
	int mfd = fd;
	if (m->mgen) {
		char pp[40];
		snprintf(pp, sizeof(pp), "/proc/self/fd/%d", fd);
		if ((mfd = open(pp, O_RDONLY | O_CLOEXEC)) < 0)
			return -1;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, mfd, 0);
	if (mfd != fd)
		close(mfd);
	if (p == MAP_FAILED)
		return -1;
	if (!(m->seg = calloc(nseg, sizeof(*m->seg)))) {
		munmap(p, (size_t)st.st_size);
		return -1;
	}
	m->base = p;
	m->size = (uint64_t)st.st_size;
	return 0;
}

/*
 * m as the dataset cache's mapping of f (shard file's staged copy), when it lends one: its pages
 * were all brought in by the stager that staged it, so they count as resident until the first
 * check is due, and the size is f's (a staged file never changes; another staging has another
 * gen). The reader's copies from it fault nothing. Else m stays unmapped (map_stat maps it).
 */
static void map_lent(const struct ferry_loader *l, struct worker *w, struct shard_map *m, uint32_t file,
		     const ferry_file *f, uint64_t now)
{
	uint64_t len = 0;
	const uint8_t *p = ferry__dataset_file_map(l->ds, file, f, &len);
	if (!p || !len)
		return;
	uint64_t nseg = ((len - 1) >> SEG_SHIFT) + 1;
	if (!(m->seg = malloc(nseg * sizeof(*m->seg))))
		return;
	for (uint64_t k = 0; k < nseg; k++)
		m->seg[k] = seg_entry(now + SEG_RECHECK_NS, 1);
	m->base = (uint8_t *)p;
	m->size = len;
	m->lent = true;
	m->next_stat = now + STAT_EVERY_NS;
	w->lent_maps++;
}

/* 1 when segment k of m was resident at its last check (checked again now when that is due). */
static int seg_resident(struct shard_map *m, int fd, uint64_t k, uint64_t now)
{
	uint64_t v = m->seg[k];
	if (now < (v & ~1ull))
		return (int)(v & 1);
	struct {
		uint64_t off, len;
	} r = {k << SEG_SHIFT, (uint64_t)1 << SEG_SHIFT};
	struct {
		uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
	} cs;
	if (r.len > m->size - r.off)
		r.len = m->size - r.off;
	uint64_t t0 = ferry__now_ns();
	int res = syscall(__NR_cachestat, fd, &r, &cs, 0) == 0 && cs.nr_cache >= (r.len + 4095) / 4096;
	uint64_t cost = ferry__now_ns() - t0;
	m->seg[k] = seg_entry(now + (cost * 200 > SEG_RECHECK_NS ? cost * 200 : SEG_RECHECK_NS), res);
	return res;
}

/*
 * Where [off, off + len) of shard `file` lies in the worker's mapping of it, when every segment it
 * touches was resident at its last check; NULL: read it otherwise. f is the file
 * ferry__dataset_file_get gave: the shard's own, or its staged copy in the dataset's cache (a
 * mapping of another staging of it is replaced; the object itself has no descriptor to map).
 */
static const uint8_t *mapped_at(const struct ferry_loader *l, struct worker *w, uint32_t file, ferry_file *f,
				uint64_t off, uint64_t len, uint64_t now)
{
	if (file >= w->nmaps || !len)
		return NULL;
	struct shard_map *m = &w->maps[file];
	uint64_t gen = ferry__dataset_file_gen(l->ds, file, f);
	if (!gen && f != l->ds->files[file])
		return NULL;
	if (m->mf != f || m->mgen != gen) {
		map_drop(m);
		m->mf = f;
		m->mgen = gen;
	}
	int fd = ferry__file_fd(f);
	if (fd < 0)
		return NULL;
	if (!m->base && gen)
		map_lent(l, w, m, file, f, now);
	if (now >= m->next_stat && map_stat(m, fd, now))
		return NULL;
	if (!m->base || off > m->size || len > m->size - off)
		return NULL;
	for (uint64_t k = off >> SEG_SHIFT; k <= (off + len - 1) >> SEG_SHIFT; k++)
		if (!seg_resident(m, fd, k, now))
			return NULL;
	if (m->used_gen != w->gen) {
		m->used_gen = w->gen;
		m->used_end = 0;
		w->used[w->nused++] = file;
	}
	if (off + len > m->used_end)
		m->used_end = off + len;
	return m->base + off;
}

static void maps_free(struct worker *w)
{
	for (uint32_t i = 0; w->maps && i < w->nmaps; i++)
		map_drop(&w->maps[i]);
	free(w->maps);
	free(w->mc);
	free(w->used);
	w->used = NULL;
	w->maps = NULL;
	w->mc = NULL;
}

/*
 * Reads [off, off + len) of a shard with pread in the pipeline thread when the page cache holds all
 * of it (cachestat: no side effects, unlike a RWF_NOWAIT read that starts read-ahead of what is
 * missing). Returns 1 when done here, 0 when the engine must read it. Handing resident data to the
 * engine costs a worker handoff per read and, for io_uring buffered reads that cannot complete
 * inline (tmpfs here), a punt to an io-wq kernel thread: measured in docs/DATA.md, "Loader notes".
 */
static int read_inline(const struct ferry_loader *l, ferry_file *f, uint64_t off, uint64_t len, void *dst)
{
	int fd = ferry__file_fd(f);
	if (!l->inline_cached || !ferry__range_resident(f, off, len))
		return 0;
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = pread(fd, (uint8_t *)dst + done, len - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) /* an error or end of file: the engine's read reports it with its detail */
			return 0;
		done += (uint64_t)r;
	}
	return 1;
}

/*
 * p[e] = base + e for n elements: the position_ids of a piece. GCC vectorizes this loop only from
 * -O3 (at -O2 its "very cheap" cost model declines loops of unknown length); vectorized, documents=1
 * costs the pipeline ~0.3 ns per token instead of ~0.5 (docs/PERFORMANCE.md, "Loader documents").
 */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void iota64(int64_t *p, int64_t base, uint64_t n)
{
	for (uint64_t e = 0; e < n; e++)
		p[e] = base + (int64_t)e;
}

/*
 * The sample holding stream byte `at` (cum: n + 1 byte prefix sums, cum[0] = 0 <= at < cum[n]): a
 * guess from the mean sample length, a gallop to bracket `at`, then a binary search inside the
 * bracket. Samples of one length (packed tokens) land on the guess. A binary search over the whole
 * of cum, ~17 dependent loads for 131k samples, was half of the pipeline thread's own time per
 * window (perf, docs/PERFORMANCE.md, issue 22).
 */
static uint64_t sample_at(const uint64_t *cum, uint64_t n, uint64_t at)
{
	uint64_t lo, hi, g = cum[n] ? (uint64_t)((unsigned __int128)at * n / cum[n]) : 0;
	if (g >= n)
		g = n - 1;
	if (cum[g] <= at) {
		lo = g;
		for (uint64_t step = 1;; step *= 2) {
			hi = lo + step;
			if (hi >= n) {
				hi = n;
				break;
			}
			if (cum[hi] > at)
				break;
			lo = hi;
		}
	} else {
		hi = g;
		for (uint64_t step = 1;; step *= 2) {
			if (hi <= step) {
				lo = 0;
				break;
			}
			lo = hi - step;
			if (cum[lo] <= at)
				break;
			hi = lo;
		}
	}
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (cum[mid] <= at)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The run holding stream byte `at` (< runs[nruns].at). */
static uint64_t run_at(const struct run *runs, uint64_t nruns, uint64_t at)
{
	uint64_t lo = 0, hi = nruns;
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (runs[mid].at <= at)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The sample a piece reads (its first byte's, for error details). */
static int64_t piece_sample(const struct ferry_loader *l, const struct piece *p)
{
	return p->sample >= 0 ? p->sample : (int64_t)sample_at(l->cum, l->ds->x.n, (uint64_t)(-1 - p->sample));
}

/* Hands back the files a batch's groups read (a dataset's cache may evict them again). */
static void put_files(const struct ferry_loader *l, struct worker *w, size_t np)
{
	for (size_t g = 0; g < np; g++)
		if (w->gf[g]) {
			ferry__dataset_file_put(l->ds, w->pieces[w->sorted[g]].file, w->gf[g]);
			w->gf[g] = NULL;
		}
}

static int cu_push(struct ferry_loader_batch *s, uint64_t at, uint64_t *seg)
{
	if (s->ncu == s->cu_cap) /* not reached: a batch has at most elements + samples + 1 */
		return ferry__error(-EOVERFLOW, "loader: cu_seqlens past its %u entries", s->cu_cap);
	if (s->ncu && at - (uint64_t)s->cu[s->ncu - 1] > s->max_seqlen)
		s->max_seqlen = (uint32_t)(at - (uint64_t)s->cu[s->ncu - 1]);
	s->cu[s->ncu++] = (int32_t)at; /* setup bounds a batch's elements by INT32_MAX */
	*seg = at;
	return 0;
}

/* Where item's bytes start: its shard, the offset, and the bytes from there in that sample or run
 * (the whole item unless it spans more than one). */
static void item_first(const struct ferry_loader *l, uint64_t item, uint32_t *file, uint64_t *off, uint64_t *len)
{
	const struct ferry__index *x = &l->ds->x;
	if (!l->seq_len) {
		*file = ferry__index_shard_of(x, item), *off = x->off[item], *len = x->len[item];
		return;
	}
	uint64_t want = l->seq_len * l->esize, at = item * want;
	if (l->runs) {
		const struct run *ru = &l->runs[run_at(l->runs, l->nruns, at)];
		*file = ru->file, *off = ru->off + (at - ru->at);
		*len = ru[1].at - at < want ? ru[1].at - at : want;
		return;
	}
	uint64_t i = sample_at(l->cum, x->n, at), in = at - l->cum[i];
	*file = ferry__index_shard_of(x, i), *off = x->off[i] + in;
	*len = x->len[i] - in < want ? x->len[i] - in : want;
}

/*
 * A device loader decoding on the GPU (cz_decode), when the batch being filled has chunks to
 * decode: the chunks of this rank's next items, up to half of chunk_cache of their bytes, go in the
 * same nvCOMP batch. An nvCOMP batch takes about one chunk's decoding however many it holds (a
 * 1 MiB zstd chunk: about 10 ms, CONFIG.md cz_gpu_min), and the batch's pipeline thread waits for
 * it, so that under the chunk window a window's chunks are decoded in one batch, by the first batch
 * that reaches the window, instead of a batch for each of the window's first batches, which miss a
 * few each. Only where the next items lie near: the chunk window, sequential and block orders (the
 * full shuffle's lie anywhere, and their chunks would be evicted before use).
 */
static int lookahead(struct worker *w, uint64_t from)
{
	struct ferry_loader *l = w->l;
	const struct ferry__index *x = &l->ds->x;
	if ((l->order == FERRY_ORDER_SHUFFLE && !l->chunked) || l->copies || !x->n)
		return 0;
	uint64_t per = l->seq_len ? l->seq_len * l->esize : ferry_dataset_bytes(l->ds) / x->n;
	uint64_t n = l->chunk_cache / 2 / (per ? per : 1) + 1, last_chunk = UINT64_MAX;
	const ferry_cz *last = NULL;
	for (uint64_t k = from; k < l->per_rank && k - from < n; k++) {
		uint32_t file;
		uint64_t off, len;
		item_first(l, (uint64_t)w->epoch_idx[k], &file, &off, &len);
		ferry_cz *cz = ferry__dataset_cz(l->ds, file);
		if (!cz || !len || !(l->cz_gpu_codecs >> ferry_cz_codec(cz) & 1))
			continue;
		uint64_t cs = (uint64_t)ferry_cz_chunk_size(cz);
		if (cz == last && off / cs == last_chunk && (off + len - 1) / cs == last_chunk)
			continue; /* the chunk of the item before */
		last = cz, last_chunk = (off + len - 1) / cs;
		int r = ferry__cz_dcache_prefetch(w->dc, cz, off, len);
		if (r)
			return r < 0 ? r : 0;
	}
	return 0;
}

static int fill(struct worker *w, struct ferry_loader_batch *s)
{
	struct ferry_loader *l = w->l;
	struct ferry__index *x = &l->ds->x;
	uint64_t epoch, b;
	seq_pos(l, s->seq, &epoch, &b);
	int err = epoch_indices(w, epoch);
	if (err)
		return err;
	uint64_t first = b * l->batch_size;
	uint64_t count = l->per_rank - first < l->batch_size ? l->per_rank - first : l->batch_size;
	if (l->window && !l->chunked && count) /* where the reads are: the window of the batch's first item */
		ferry__dataset_cache_reading(l->ds, epoch, window_shard(l, (uint64_t)w->epoch_idx[first]));
	s->epoch = epoch;
	s->step = b;
	s->count = (uint32_t)count;
	size_t np = 0;
	uint64_t pos = 0, seg = 0;
	const int docs = l->documents;
	s->ncu = 0;
	s->max_seqlen = 0;
	for (uint64_t k = 0; k < count; k++) {
		int64_t item = w->epoch_idx[first + k];
		s->indices[k] = item;
		s->offsets[k] = pos;
		/* each row (or sample) starts a sequence */
		if (docs && (err = cu_push(s, pos / l->esize, &seg)))
			return err;
		if (!l->seq_len && l->copies) { /* this rank's position in the epoch's copy */
			const struct ferry__copies *cp = &l->ds->copies;
			size_t at = (size_t)(epoch % cp->ncopies) * cp->n +
				    (l->rank + (first + k) * l->world_size) % cp->n;
			if ((err = add_piece(w, &np, x->nfiles + cp->file[at], cp->off[at], x->len[item], pos,
					     item)))
				return err;
		} else if (!l->seq_len) {
			uint64_t i = (uint64_t)item;
			if ((err = add_piece(w, &np, ferry__index_shard_of(x, i), x->off[i], x->len[i], pos, item)))
				return err;
		}
		if (!l->seq_len) {
			if (docs)
				iota64(s->pos + seg, 0, x->len[item] / l->esize);
			pos += x->len[item];
			continue;
		}
		uint64_t want = l->seq_len * l->esize, at = (uint64_t)item * want;
		if (l->runs) {
			for (uint64_t r = run_at(l->runs, l->nruns, at); want; r++) {
				const struct run *ru = &l->runs[r];
				uint64_t take = ru[1].at - at < want ? ru[1].at - at : want;
				if ((err = add_piece(w, &np, ru->file, ru->off + (at - ru->at), take, pos,
						     -1 - (int64_t)at)))
					return err;
				pos += take;
				at += take;
				want -= take;
			}
			continue;
		}
		int pending = 0; /* a document starts with the next token */
		for (uint64_t i = sample_at(l->cum, x->n, at); want; i++) {
			uint64_t in = at - l->cum[i], take = x->len[i] - in;
			if (take > want)
				take = want;
			if (docs) {
				if (!in && (!l->doc_start || l->doc_start[i]))
					pending = 1;
				if (take) {
					uint64_t e0 = pos / l->esize, ne = take / l->esize;
					if (pending && e0 != seg && (err = cu_push(s, e0, &seg)))
						return err;
					pending = 0;
					iota64(s->pos + e0, (int64_t)(e0 - seg), ne);
				}
			}
			if (take && (err = add_piece(w, &np, ferry__index_shard_of(x, i), x->off[i] + in, take,
						     pos, (int64_t)i)))
				return err;
			pos += take;
			at += take;
			want -= take;
		}
	}
	s->offsets[count] = pos;
	s->bytes = pos;
	if (docs && (err = cu_push(s, pos / l->esize, &seg)))
		return err;
	sort_pieces(w, np);

	/* Groups of neighbours: one read each. A group laid out in the batch as it is in the file is
	 * read in place; any other group goes through the staging buffer and is scattered. */
	ferry_batch_reset(w->batch);
	size_t stage_need = 0;
	uint64_t reads = 0, merged = 0, inlined = 0;
	/* One flag per group: read here (1) or by the engine (0); the error path below skips the former. */
	if (np > w->inl_cap) {
		uint8_t *f = realloc(w->inl, np);
		if (f)
			w->inl = f;
		ferry_file **gf = f ? realloc(w->gf, np * sizeof(*gf)) : NULL;
		if (!gf)
			return ferry__error(-ENOMEM, "loader: %zu reads", np);
		w->gf = gf;
		w->inl_cap = np;
	}
	memset(w->gf, 0, np * sizeof(*w->gf));
	/* copies out of mappings: shards on the local file system or staged in a dataset's cache (not
	 * compressed), the SIGBUS handler in place */
	const int use_maps = l->mapped && l->inline_cached && w->maps && w->guard && ferry__bus_guarded();
	if (use_maps && l->ds->cache) {
		/* entries the cache gave up: their mappings go (an unlinked entry's pages stay in memory
		 * while mapped, past the cache's budget) */
		uint64_t drops = ferry__dataset_cache_drops(l->ds);
		if (drops != w->drops_seen) {
			w->drops_seen = drops;
			for (uint32_t i = 0; i < w->nmaps; i++)
				if (w->maps[i].mgen && !ferry__dataset_file_current(l->ds, i, w->maps[i].mf, w->maps[i].mgen)) {
					map_drop(&w->maps[i]);
					w->maps[i].mf = NULL;
					w->maps[i].mgen = 0;
				}
		}
	}
	const uint64_t now = use_maps ? ferry__now_ns() : 0;
	size_t nmc = 0;
	w->gen++;
	w->nused = 0;
	if (use_maps && np > w->mc_cap) {
		struct ferry__mcopy *mc = realloc(w->mc, np * sizeof(*mc));
		if (!mc)
			return ferry__error(-ENOMEM, "loader: %zu reads", np);
		w->mc = mc;
		w->mc_cap = np;
	}
	for (int pass = 0; pass < 2; pass++) {
		size_t stage_pos = 0;
		for (size_t g = 0; g < np;) {
			const struct piece *p0 = &w->pieces[w->sorted[g]];
			uint64_t end;
			int inplace;
			size_t h = group_end(l, w, g, np, &end, &inplace);
			uint64_t span = end - p0->off;
			if (pass == 0) {
				if (!inplace)
					stage_need += span;
			} else {
				void *dst = inplace ? (uint8_t *)s->host + p0->dst : w->stage + stage_pos;
				ferry_file *f = w->gf[g] = ferry__dataset_file_get(l->ds, p0->file);
				ferry_cz *cz = ferry__dataset_cz(l->ds, p0->file);
				if (cz && !w->czc && (err = ferry__cz_cache_create(l->chunk_cache, &w->czc))) {
					put_files(l, w, np);
					return err;
				}
				if (cz && (l->cz_gpu_codecs >> ferry_cz_codec(cz) & 1)) {
					/* decoded on the GPU into the thread's device cache and copied from it
					 * into the batch's device buffer after its upload (worker_main) */
					if (!w->dc && (err = ferry__cz_dcache_create(l->device, l->chunk_cache, l->pool, &w->dc))) {
						put_files(l, w, np);
						return err;
					}
					for (size_t k = g; k < h && !err; k++) {
						const struct piece *p = &w->pieces[w->sorted[k]];
						err = ferry__cz_dcache_add(w->dc, cz, p->off, p->len, p->dst);
					}
					if (err) {
						ferry__error_append("loader: %s: bytes %llu..%llu", ferry_dataset_shard_path(l->ds, p0->file),
								    (unsigned long long)p0->off, (unsigned long long)end);
						put_files(l, w, np);
						return err;
					}
					w->inl[g] = 2;
					inlined++;
					if (!inplace)
						stage_pos += span;
					reads++;
					if (h - g > 1)
						merged += h - g;
					g = h;
					continue;
				}
				if (cz) { /* a compressed shard: decoded here, on the worker's thread, each
					   * chunk once while the thread's cache holds it */
					ssize_t k = ferry__cz_pread_cached(cz, w->czc, dst, span, p0->off);
					if (k != (ssize_t)span) {
						put_files(l, w, np);
						return k < 0 ? (int)k : ferry__error(FERRY_ECORRUPT, "loader: %s: bytes %llu..%llu past the end of the compressed shard",
										     ferry_dataset_shard_path(l->ds, p0->file), (unsigned long long)p0->off,
										     (unsigned long long)end);
					}
				}
				const uint8_t *src = !cz && use_maps ? mapped_at(l, w, p0->file, f, p0->off, span, now) : NULL;
				if (src)
					w->mc[nmc++] = (struct ferry__mcopy){src, dst, span, g};
				w->inl[g] = cz || src ? 1 : (uint8_t)read_inline(l, f, p0->off, span, dst);
				if (w->inl[g]) {
					inlined++;
				} else {
					int r = ferry_batch_add_read(w->batch, f, p0->off, span, dst);
					if (r < 0) {
						put_files(l, w, np);
						return r;
					}
				}
				if (!inplace)
					stage_pos += span;
			}
			if (pass == 1) {
				reads++;
				if (h - g > 1)
					merged += h - g;
			}
			g = h;
		}
		if (pass == 0 && stage_need > w->stage_cap) {
			ferry_free_aligned(w->stage, w->stage_cap);
			w->stage_cap = stage_need * 2;
			if (!(w->stage = ferry_alloc_aligned(w->stage_cap))) {
				w->stage_cap = 0;
				return ferry__error(-ENOMEM, "loader: staging %zu bytes", stage_need);
			}
		}
	}
	if (w->dc && ferry__cz_dcache_pending(w->dc) && (err = lookahead(w, first + count))) {
		put_files(l, w, np);
		return err;
	}
	if (nmc) {
		size_t done = ferry__copy_guarded(w->guard, w->mc, nmc);
		/* A shard cut short under the copies faults past its last page, but its last page reads
		 * as zeros past the new end without a fault: each shard copied from is as long as the
		 * copies' end after them, else the batch is read again (and the reads report it). */
		for (uint32_t u = 0; done == nmc && u < w->nused; u++) {
			struct shard_map *m = &w->maps[w->used[u]];
			struct stat st;
			if (fstat(ferry__file_fd(m->mf), &st) || (uint64_t)st.st_size < m->used_end) {
				m->next_stat = 0;
				done = 0;
			}
		}
		w->mapped_reads += done;
		if (done < nmc) {
			/* a mapped page could not be read (the shard was cut short, or a disk error): the
			 * shard is checked again before its next use, the rest of the batch is read */
			pthread_mutex_lock(&l->mu); /* now: the batch may fail below */
			l->mapped_faults++;
			pthread_mutex_unlock(&l->mu);
			w->maps[w->pieces[w->sorted[w->mc[done].tag]].file].next_stat = 0;
			for (size_t k = done; k < nmc; k++) {
				size_t g = w->mc[k].tag;
				const struct piece *p0 = &w->pieces[w->sorted[g]];
				w->inl[g] = (uint8_t)read_inline(l, w->gf[g], p0->off, w->mc[k].len, w->mc[k].dst);
				if (!w->inl[g]) {
					inlined--;
					int r = ferry_batch_add_read(w->batch, w->gf[g], p0->off, w->mc[k].len, w->mc[k].dst);
					if (r < 0) {
						put_files(l, w, np);
						return r;
					}
				}
			}
		}
	}
	if (ferry_batch_count(w->batch)) {
		if ((err = ferry_batch_submit(w->batch))) {
			put_files(l, w, np);
			return err;
		}
		int r = ferry_batch_wait(w->batch, -1);
		put_files(l, w, np);
		if (r != 0) {
			/* Name the entry that failed or came back short. */
			size_t e = 0;
			for (size_t g = 0, k = 0; g < np;) {
				const struct piece *p0 = &w->pieces[w->sorted[g]];
				uint64_t end = p0->off + p0->len;
				size_t h = g + 1;
				for (; h < np; h++) {
					const struct piece *p = &w->pieces[w->sorted[h]];
					if (p->file != p0->file || p->off < end || p->off - end > l->merge_gap)
						break;
					end = p->off + p->len;
				}
				if (w->inl[g]) {
					g = h;
					continue;
				}
				ssize_t res = ferry_batch_result(w->batch, k++);
				if (res < 0 || (uint64_t)res != end - p0->off) {
					e = g;
					if (res < 0)
						return ferry__error((int)res, "%s: reading sample %" PRId64
								    " (bytes %" PRIu64 "..%" PRIu64 "): %s",
								    l->ds->paths[p0->file], piece_sample(l, p0), p0->off,
								    end, ferry_strerror((int)res));
					return ferry__error(FERRY_ECORRUPT, "%s (shard %u): sample %" PRId64
							    " (bytes %" PRIu64 "..%" PRIu64 ") lies past the end of "
							    "the file (truncated shard)", l->ds->paths[p0->file],
							    p0->file, piece_sample(l, &w->pieces[w->sorted[e]]), p0->off, end);
				}
				g = h;
			}
			return r < 0 ? r : ferry__error(FERRY_ECORRUPT, "loader: short read");
		}
	}
	put_files(l, w, np);
	/* Scatter the staged groups. */
	size_t stage_pos = 0;
	for (size_t g = 0; g < np;) {
		const struct piece *p0 = &w->pieces[w->sorted[g]];
		uint64_t end;
		int inplace;
		size_t h = group_end(l, w, g, np, &end, &inplace);
		if (!inplace) {
			for (size_t k = g; k < h && w->inl[g] != 2; k++) { /* 2: copied on the GPU */
				const struct piece *p = &w->pieces[w->sorted[k]];
				memcpy((uint8_t *)s->host + p->dst, w->stage + stage_pos + (p->off - p0->off), p->len);
			}
			stage_pos += end - p0->off;
		}
		g = h;
	}
	pthread_mutex_lock(&l->mu);
	l->reads += reads;
	l->merged += merged;
	l->inline_reads += inlined;
	l->mapped_reads += w->mapped_reads;
	l->lent_maps += w->lent_maps;
	w->mapped_reads = w->lent_maps = 0;
	if (w->czc) {
		struct ferry__cz_cache_stats st;
		ferry__cz_cache_stats(w->czc, &st);
		l->chunk_decodes += st.decodes - w->cz_seen.decodes;
		l->chunk_decoded += st.decoded - w->cz_seen.decoded;
		w->cz_seen = st;
	}
	l->bytes += s->bytes;
	l->samples += count;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A new device buffer (in the device's context). */
static int buf_new(struct ferry_loader *l, struct ferry_loader_buffer **out)
{
	struct ferry_loader_buffer *b = calloc(1, sizeof(*b));
	if (!b)
		return ferry__error(-ENOMEM, "loader: device buffer");
	int r = ferry__gpu_alloc(l->device, l->slot_bytes, &b->dev);
	if (!r && (r = ferry__fence_create(l->device, &b->fence)))
		ferry__gpu_release(l->device, b->dev);
	if (r) {
		free(b);
		ferry__error_append("loader: a batch buffer");
		return r;
	}
	b->l = l;
	*out = b;
	return 0;
}

/* Frees b once the work its event follows is done (in the device's context). */
static void buf_destroy(struct ferry_loader *l, struct ferry_loader_buffer *b)
{
	ferry__fence_destroy(b->fence); /* waits for it first */
	ferry__gpu_release(l->device, b->dev);
	free(b);
}

/*
 * Gives slot s a device buffer: the spare one freed longest ago, or a new one while that one's
 * event has not fired and there are fewer than twice the slots plus 4 (so the consumer's queued
 * work does not delay uploads). The upload is ordered after the buffer's event on the GPU.
 */
static int slot_buffer(struct worker *w, struct ferry_loader_batch *s)
{
	struct ferry_loader *l = w->l;
	pthread_mutex_lock(&l->mu);
	struct ferry_loader_buffer *b = l->spare;
	if (b && l->nbufs < 2 * l->nslots + 4 && ferry__fence_query(b->fence) != 1)
		b = NULL;
	if (b) {
		l->spare = b->next;
		if (!l->spare)
			l->spare_tail = NULL;
		b->next = NULL;
	} else {
		l->nbufs++;
	}
	pthread_mutex_unlock(&l->mu);
	if (b) {
		s->buf = b;
		int r = ferry__ring_after(w->ring, b->fence);
		if (r)
			ferry__error_append("loader: waiting for a batch buffer's release");
		return r;
	}
	int err = buf_new(l, &s->buf);
	if (err) {
		pthread_mutex_lock(&l->mu);
		l->nbufs--;
		pthread_mutex_unlock(&l->mu);
	}
	return err;
}

/* Waits for ticket t of a spinning ring without spinning: polls every 50 us (nvCOMP's batch takes
 * milliseconds, which a spin would spend on a core). 0 or a negative code. */
static int sync_sleeping(struct ferry__ring_gpu *ring, unsigned t)
{
	int q;
	while ((q = ferry__ring_query(ring, t)) == 0)
		nanosleep(&(struct timespec){0, 50000}, NULL);
	return q < 0 ? q : 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct ferry_loader *l = w->l;
	int err = 0;
	/* the consumer waits for a batch right before using it: spin, as a step's wait is short */
	if (l->device >= 0 && (err = ferry__ring_create(l->device, l->nslots, FERRY__RING_SPIN, &w->ring)))
		ferry__error_append("loader: worker's copy ring");
	if (w->maps)
		w->guard = ferry__bus_guard_claim();
	pthread_mutex_lock(&l->mu);
	while (!err && !l->stop && !l->failed && l->next_claim < l->end_seq) {
		struct ferry_loader_batch *s = &l->slots[l->next_claim % l->nslots];
		if (s->state != SLOT_FREE) {
			pthread_cond_wait(&l->cv, &l->mu);
			continue;
		}
		s->seq = l->next_claim++;
		s->state = SLOT_FILLING;
		pthread_mutex_unlock(&l->mu);
		int e = fill(w, s);
		if (!e && l->device >= 0 && !s->buf)
			e = slot_buffer(w, s);
		if (!e && l->device >= 0) {
			e = ferry__ring_h2d(w->ring, s->buf->dev, s->host, s->bytes, s->pinned);
			if (!e && l->documents && s->bytes)
				e = ferry__ring_h2d(w->ring, s->buf->dev + l->pos_off, s->pos,
						    s->bytes / l->esize * sizeof(int64_t), s->pinned);
			if (!e && l->documents)
				e = ferry__ring_h2d(w->ring, s->buf->dev + l->cu_off, s->cu,
						    s->ncu * sizeof(int32_t), s->pinned);
			int pending = 0;
			if (!e && w->dc) /* after the upload: the samples of compressed shards over it */
				e = ferry__cz_dcache_queue(w->dc, w->ring, s->buf->dev, &pending);
			if (!e)
				e = ferry__ring_record(w->ring, (unsigned)(s - l->slots));
			if (!e && pending) {
				/* nvCOMP's statuses before the batch is handed out, and the staging free for
				 * the next: a wait in a window's first batch (the rest hit the cache) */
				e = sync_sleeping(w->ring, (unsigned)(s - l->slots));
				e = e ? e : ferry__cz_dcache_finish(w->dc);
			}
			if (e)
				ferry__error_append("loader: upload of batch %" PRIu64 " (%zu bytes)", s->step, s->bytes);
			s->ring = w->ring;
		} else if (e && w->dc) {
			ferry__cz_dcache_reset(w->dc);
		}
		w->cpu_ns = thread_cpu_ns();
		pthread_mutex_lock(&l->mu);
		if (w->dc) { /* the chunks its finished batches decoded on the GPU (or copied: stored) */
			struct ferry__cz_dcache_stats st;
			ferry__cz_dcache_stats(w->dc, &st);
			l->chunk_decodes += st.gpu_decodes + st.cpu_decodes - w->dc_seen.gpu_decodes - w->dc_seen.cpu_decodes;
			l->gpu_chunk_decodes += st.gpu_decodes - w->dc_seen.gpu_decodes;
			l->gpu_decode_batches += st.batches - w->dc_seen.batches;
			l->chunk_decoded += st.decoded - w->dc_seen.decoded;
			w->dc_seen = st;
		}
		s->err = e;
		s->state = SLOT_READY;
		if (e && !l->failed) {
			/* the detail is thread-local: keep it for the consumer */
			l->failed = 1;
			l->err = e;
			snprintf(l->errmsg, sizeof(l->errmsg), "%s", ferry_last_error());
		}
		pthread_cond_broadcast(&l->cv);
	}
	if (err && !l->failed) {
		l->failed = 1;
		l->err = err;
		snprintf(l->errmsg, sizeof(l->errmsg), "%s", ferry_last_error());
	}
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	ferry__bus_guard_release(w->guard);
	w->guard = NULL;
	w->cpu_ns = thread_cpu_ns();
	return NULL;
}

/* -------------------------------------------------------------------------------- life cycle */

/*
 * l->runs from the index (l->cum built), or none when the samples lie in more than one run per 16
 * samples: then the prefix sums serve as well. Empty samples join any run.
 */
static int build_runs(struct ferry_loader *l)
{
	const struct ferry__index *x = &l->ds->x;
	uint64_t nr = 0, cap = 16, limit = x->n / 16 + 1;
	struct run *r = malloc(cap * sizeof(*r));
	uint32_t file = 0;
	uint64_t end = 0; /* where the current run ends in its file */
	if (!r)
		return ferry__error(-ENOMEM, "loader: runs of %" PRIu64 " samples", x->n);
	for (uint64_t i = 0; i < x->n; i++) {
		while (file + 1 < x->nfiles && x->file_first[file + 1] <= i)
			file++;
		if (!x->len[i])
			continue;
		if (nr && r[nr - 1].file == file && x->off[i] == end) {
			end += x->len[i];
			continue;
		}
		if (nr + 1 > limit) {
			free(r);
			return 0;
		}
		if (nr + 1 == cap) {
			struct run *q = realloc(r, (cap *= 2) * sizeof(*r));
			if (!q) {
				free(r);
				return ferry__error(-ENOMEM, "loader: runs of %" PRIu64 " samples", x->n);
			}
			r = q;
		}
		r[nr++] = (struct run){l->cum[i], x->off[i], file};
		end = x->off[i] + x->len[i];
	}
	r[nr] = (struct run){l->cum[x->n], 0, 0};
	l->runs = r;
	l->nruns = nr;
	return 0;
}

/*
 * The shard-window shuffle (docs/DATA.md): shard_window -1 turns it on for order shuffle over a
 * dataset whose cache budget is smaller than the dataset, with windows of a sixteenth of what the
 * budget holds, at least one shard (the window read and the next one staged ahead in an eighth of
 * it, the rest kept from one epoch to the next); the default order is unchanged otherwise.
 * wbound: each shard's first item (a token window belongs to the shard of its first byte).
 */
#define CZ_UNIT (1u << 20) /* the chunk window's unit: a compressed shard's chunks, 1 MiB of them or one */

/* A shard's unit of the chunk window: whole chunks, CZ_UNIT of them (plain shards: CZ_UNIT). */
static uint64_t unit_bytes(const struct ferry_loader *l, uint32_t s)
{
	ferry_cz *cz = ferry__dataset_cz(l->ds, s);
	uint64_t c = cz ? (uint64_t)ferry_cz_chunk_size(cz) : CZ_UNIT;
	return c < CZ_UNIT ? CZ_UNIT / c * c : c;
}

/*
 * The chunk window (docs/DATA.md, "Sample orders"): over a dataset with compressed shards, the
 * window shuffle's units are runs of a shard's chunks (unit_bytes: a chunk, or 1 MiB of 64 KiB
 * chunks), an item belonging to the unit of its first byte, so that a window's chunks are decoded
 * once each into the pipeline thread's cache (chunk_cache) while the window is read, instead of
 * once a sample. chunk_window -1: on for order shuffle where a shard is compressed, with
 * N = C - min(C / 2, batch_size) - 1 units, C = chunk_cache / largest unit: the batch that crosses
 * from one window to the next reads up to batch_size units of each, and the next window's must stay
 * in the cache (with N = C - 1 a 16 MiB cache decoded 1.3-2x the floor). 0 when it does not apply (or the items do
 * not lie in file order within their shards, as a Megatron index may have them), 1 when set up,
 * or a negative code.
 */
static int chunk_window_setup(struct ferry_loader *l)
{
	struct ferry__index *x = &l->ds->x;
	int64_t want = l->chunk_window;
	uint32_t ncz = 0;
	for (uint32_t s = 0; s < x->nfiles; s++)
		ncz += !!ferry__dataset_cz(l->ds, s);
	if (!want || !ncz || l->order != FERRY_ORDER_SHUFFLE || l->copies)
		return 0;
	uint64_t *ubase = malloc(((size_t)x->nfiles + 1) * sizeof(*ubase)), maxu = 0, nu = 0;
	if (!ubase)
		return ferry__error(-ENOMEM, "loader: %u shards", x->nfiles);
	for (uint32_t s = 0; s < x->nfiles; s++) {
		uint64_t u = unit_bytes(l, s);
		ubase[s] = nu;
		nu += (x->file_bytes[s] + u - 1) / u;
		maxu = u > maxu ? u : maxu;
	}
	ubase[x->nfiles] = nu;
	if (nu < 2 || nu > UINT32_MAX) {
		free(ubase);
		return 0;
	}
	uint64_t *bound = malloc((nu + 1) * sizeof(*bound));
	if (!bound) {
		free(ubase);
		return ferry__error(-ENOMEM, "loader: %" PRIu64 " chunk runs", nu);
	}
	/* each item's unit, in item order: nondecreasing, else not in file order (returns 0) */
	uint64_t next = 0, at = 0, per = l->seq_len * l->esize, j = 0;
	int ok = 1;
	uint32_t s = 0;
	uint64_t ub = x->nfiles ? unit_bytes(l, 0) : 1;
	for (uint64_t i = 0; i < x->n && ok; i++) {
		while (s + 1 < x->nfiles && x->file_first[s + 1] <= i)
			ub = unit_bytes(l, ++s);
		/* the items starting in sample i: itself, or the token windows whose first byte it holds */
		for (; ok && (!per ? j == i : j < l->items && j * per < at + x->len[i]); j++) {
			uint64_t u = ubase[s] + (x->off[i] + (per ? j * per - at : 0)) / ub;
			ok = u < ubase[s + 1] && u + 1 >= next; /* the item before's unit (next - 1), or later */
			while (ok && next <= u)
				bound[next++] = j;
		}
		at += x->len[i];
	}
	while (ok && next <= nu)
		bound[next++] = l->items;
	free(ubase);
	if (!ok) {
		free(bound);
		return 0;
	}
	free(l->wbound);
	l->wbound = bound;
	l->wunits = (uint32_t)nu;
	l->chunked = 1;
	if (want < 0) { /* the cache's units less one and less those a batch crossing from one window
			 * to the next may keep of the window before (batch_size, at most half) */
		uint64_t c = l->chunk_cache / maxu, keep = l->batch_size < c / 2 ? l->batch_size : c / 2;
		want = c > keep + 1 ? (int64_t)(c - keep - 1) : 1;
	}
	l->window = want > (int64_t)nu ? (uint32_t)nu : (uint32_t)want;
	return 1;
}

/*
 * Where compressed shards decode (cz_decode): on a device loader, zstd on the GPU wherever nvCOMP is
 * loaded (auto), LZ4 only when asked (gpu: each block is walked first, since nvCOMP 6.0's LZ4
 * does not bound its output, at nearly the CPU cost of decoding it; cz_gpu's reason, CONFIG.md);
 * host loaders, and everything else, on the pipeline threads. gpu where nvCOMP cannot run is an
 * error naming why.
 */
static int cz_decode_setup(struct ferry_loader *l)
{
	unsigned present = 0;
	l->cz_gpu_codecs = 0;
	for (uint32_t s = 0; s < l->ds->x.nfiles; s++) {
		ferry_cz *cz = ferry__dataset_cz(l->ds, s);
		if (cz)
			present |= 1u << ferry_cz_codec(cz);
	}
	if (!present || l->cz_decode == CZD_CPU)
		return 0;
	if (l->device < 0)
		return l->cz_decode == CZD_GPU
			       ? ferry__error(FERRY_EBADOPT, "loader: cz_decode=gpu decodes into device memory: set device too")
			       : 0;
	for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
		if (!(present >> codec & 1) || (codec == FERRY_CZ_LZ4 && l->cz_decode != CZD_GPU))
			continue;
		const char *why = NULL;
		if (ferry__nvc_available(codec, &why) == 1)
			l->cz_gpu_codecs |= 1u << codec;
		else if (l->cz_decode == CZD_GPU)
			return ferry__error(FERRY_EBACKEND, "loader: cz_decode=gpu, but nvCOMP cannot decode %s here: %s",
					    ferry_cz_codec_name(codec), why ? why : "unknown");
	}
	return 0;
}

static int window_setup(struct ferry_loader *l)
{
	struct ferry__index *x = &l->ds->x;
	free(l->wbound);
	l->wbound = NULL;
	l->window = 0;
	l->chunked = 0;
	l->wunits = x->nfiles;
	int r = chunk_window_setup(l);
	if (r)
		return r < 0 ? r : 0;
	int64_t want = l->shard_window;
	if (want < 0) {
		uint64_t budget = ferry__dataset_cache_budget(l->ds), maxb = 0, total = 0;
		for (uint32_t s = 0; s < x->nfiles; s++) {
			maxb = x->file_bytes[s] > maxb ? x->file_bytes[s] : maxb;
			total += x->file_bytes[s];
		}
		/* the window being read and the next one staged in an eighth of the budget: the rest keeps
		 * shards from one epoch to the next, so that an epoch fetches about the dataset less 7/8
		 * of the budget. A window of half the budget (the default before) kept none and fetched
		 * the whole dataset each epoch: 0.72x local files' samples/s on the H200, against 0.99x
		 * at window 1 and 0.89x at 3 with a budget of 30 shards (docs/CONFIG.md, shard_window) */
		want = budget && budget < total && maxb ? (int64_t)(budget / maxb / 16) : 0;
		if (budget && budget < total && want < 1)
			want = 1;
	}
	if (!want || l->order != FERRY_ORDER_SHUFFLE || l->copies || x->nfiles < 2)
		return 0;
	if (!(l->wbound = malloc(((size_t)x->nfiles + 1) * sizeof(*l->wbound))))
		return ferry__error(-ENOMEM, "loader: %u shards", x->nfiles);
	if (!l->seq_len) {
		memcpy(l->wbound, x->file_first, ((size_t)x->nfiles + 1) * sizeof(*l->wbound));
	} else {
		uint64_t at = 0, per = l->seq_len * l->esize;
		uint32_t s = 0;
		for (uint64_t i = 0; i <= x->n; i++) {
			for (; s <= x->nfiles && x->file_first[s] == i; s++) {
				uint64_t b = (at + per - 1) / per;
				l->wbound[s] = b < l->items ? b : l->items;
			}
			if (i < x->n)
				at += x->len[i];
		}
		l->wbound[x->nfiles] = l->items;
	}
	l->window = want > x->nfiles ? x->nfiles : (uint32_t)want;
	return 0;
}

static int setup(struct ferry_loader *l, int with_cum)
{
	struct ferry__index *x = &l->ds->x;
	int err;
	free(l->cum);
	free(l->doc_start);
	free(l->runs);
	l->cum = NULL;
	l->doc_start = NULL;
	l->runs = NULL;
	l->nruns = 0;
	l->esize = (size_t)ferry_dtype_bits(x->dtype) / 8; /* datasets hold whole-byte types only */
	if (l->rank >= l->world_size)
		return ferry__error(FERRY_EBADOPT, "loader: rank %u is not below world_size %u", l->rank,
				    l->world_size);
	if (l->seq_len && !l->esize)
		return ferry__error(FERRY_EBADOPT, "loader: seq_len needs a dataset of tokens");
	if (l->seq_len && with_cum) {
		l->cum = malloc((x->n + 1) * sizeof(uint64_t));
		if (!l->cum)
			return ferry__error(-ENOMEM, "loader: %" PRIu64 " samples", x->n);
		l->cum[0] = 0;
		for (uint64_t i = 0; i < x->n; i++)
			l->cum[i + 1] = l->cum[i] + x->len[i];
		if (!l->documents && (err = build_runs(l)))
			return err;
	}
	if (l->seq_len) {
		l->items = x->bytes / l->esize / l->seq_len;
		l->slot_bytes = (size_t)(l->batch_size * l->seq_len * l->esize);
	} else {
		uint64_t maxlen = 0;
		for (uint64_t i = 0; i < x->n; i++)
			maxlen = x->len[i] > maxlen ? x->len[i] : maxlen;
		l->items = x->n;
		l->slot_bytes = (size_t)(l->batch_size * maxlen);
	}
	if (!l->slot_bytes)
		l->slot_bytes = 1;
	if (l->documents && !l->esize)
		return ferry__error(FERRY_EBADOPT, "loader: documents needs a dataset of tokens");
	if (l->documents && l->slot_bytes / l->esize > INT32_MAX - l->batch_size - 1)
		return ferry__error(FERRY_EBADOPT, "loader: documents: a batch of %zu elements; cu_seqlens are "
				    "int32 (at most %d elements a batch)", l->slot_bytes / l->esize,
				    INT32_MAX - (int)l->batch_size - 1);
	if (l->documents) {
		/* a slot: the data, then (256-byte aligned) position_ids, then cu_seqlens, so that one
		 * upload carries all three and a taken device buffer holds them all */
		size_t elems = l->slot_bytes / l->esize;
		l->pos_off = (l->slot_bytes + 255) & ~(size_t)255;
		l->cu_off = l->pos_off + elems * sizeof(int64_t);
		l->cu_max = (uint32_t)(elems + l->batch_size + 1);
		l->slot_bytes = l->cu_off + (size_t)l->cu_max * sizeof(int32_t);
	}
	/* Megatron: a document is the run of sequences from one document index to the next; in a
	 * ferry dataset every sample is a document */
	if (l->documents && with_cum && x->format == 1 && x->ndocs) {
		if (!(l->doc_start = calloc(x->n ? x->n : 1, 1)))
			return ferry__error(-ENOMEM, "loader: %" PRIu64 " samples", x->n);
		for (uint64_t d = 0; d < x->ndocs; d++)
			if ((uint64_t)x->doc_idx[d] < x->n)
				l->doc_start[x->doc_idx[d]] = 1;
	}
	if ((err = window_setup(l)))
		return err;
	l->per_rank = ferry_distributed_num_samples(l->items, l->world_size, l->drop_last);
	l->bpe = l->drop_last_batch ? l->per_rank / l->batch_size
				    : (l->per_rank + l->batch_size - 1) / l->batch_size;
	/* checked last: batches_per_epoch (which ignores setup's errors) still counts, so that the
	 * first batch reports this */
	uint64_t cseed;
	uint32_t nc = ferry_dataset_copies(l->ds, &cseed);
	if (l->copies && (!nc || l->order != FERRY_ORDER_SHUFFLE || l->seq_len || cseed != l->seed))
		return ferry__error(FERRY_EBADOPT, "loader: copies=1 reads a dataset's pre-shuffled copies in "
				    "order shuffle, seq_len 0, with the seed they were written with; %s has %u copies "
				    "(seed %" PRIu64 "), the loader has order %s, seq_len %" PRIu64 ", seed %" PRIu64,
				    l->ds->path, nc, cseed, order_name(l->order), l->seq_len, l->seed);
	return 0;
}

static void set_end(struct ferry_loader *l)
{
	if (l->pos_epoch == UINT64_MAX) {
		l->pos_epoch = l->epoch;
		l->pos_batch = 0;
	}
	if (!l->bpe) {
		l->end_seq = 0;
	} else if (l->epochs) {
		uint64_t last = l->epoch + l->epochs;
		l->end_seq = l->pos_epoch >= last ? 0 : (last - l->pos_epoch) * l->bpe - l->pos_batch;
	} else {
		l->end_seq = UINT64_MAX;
	}
}

int ferry_loader_start(ferry_loader *l)
{
	if (!l)
		return -EINVAL;
	if (l->started)
		return l->failed ? l->err : 0;
	int err = setup(l, 1);
	if (err)
		return err;
	set_end(l);
	void *prev = NULL;
	int entered = 0;
	if (l->device >= 0) {
		if ((err = ferry__gpu_enter(l->device, &prev)))
			return err;
		entered = l->gpu = 1;
	}
	l->nslots = l->prefetch + l->threads;
	l->slots = calloc(l->nslots, sizeof(*l->slots));
	l->workers = calloc(l->threads, sizeof(*l->workers));
	if (!l->slots || !l->workers) {
		err = ferry__error(-ENOMEM, "loader: %u slots", l->nslots);
		goto out;
	}
	if ((err = ferry__pinned_pool_create(0, l->device, &l->pool)))
		goto out;
	if ((err = cz_decode_setup(l)))
		goto out;
	for (uint32_t i = 0; i < l->nslots; i++) {
		struct ferry_loader_batch *s = &l->slots[i];
		s->l = l;
		s->offsets = malloc((l->batch_size + 1) * sizeof(uint64_t));
		s->indices = malloc(l->batch_size * sizeof(int64_t));
		if (!s->offsets || !s->indices) {
			err = ferry__error(-ENOMEM, "loader: batch %u", i);
			goto out;
		}
		if ((err = ferry__pinned_alloc(l->pool, l->slot_bytes, &s->host, &s->pinned))) {
			ferry__error_append("loader: %u batches of %zu bytes", l->nslots, l->slot_bytes);
			goto out;
		}
		if (l->documents) {
			s->pos = (int64_t *)(void *)((uint8_t *)s->host + l->pos_off);
			s->cu = (int32_t *)(void *)((uint8_t *)s->host + l->cu_off);
			s->cu_cap = l->cu_max;
		}
		if (l->device >= 0) {
			if ((err = buf_new(l, &s->buf)))
				goto out;
			l->nbufs++;
		}
	}
	for (uint32_t t = 0; t < l->threads; t++) {
		struct worker *w = &l->workers[t];
		w->l = l;
		w->cached_epoch = UINT64_MAX;
		w->epoch_idx = malloc((l->per_rank ? l->per_rank : 1) * sizeof(int64_t));
		w->order = malloc((l->items ? l->items : 1) * sizeof(int64_t));
		if (!w->epoch_idx || !w->order) {
			err = ferry__error(-ENOMEM, "loader: sample order of %" PRIu64, l->items);
			goto out;
		}
		if ((err = ferry_batch_create(l->ds->ctx, &w->batch)))
			goto out;
		if (l->mapped && l->inline_cached) {
			/* a dataset cache's stagers map what they stage, every page in, for the reads */
			ferry__dataset_cache_lend(l->ds);
			w->nmaps = l->ds->x.nfiles + l->ds->copies.nfiles;
			w->gen = 1;
			w->used = malloc((w->nmaps ? w->nmaps : 1) * sizeof(*w->used));
			if (!(w->maps = calloc(w->nmaps ? w->nmaps : 1, sizeof(*w->maps))) || !w->used) {
				err = ferry__error(-ENOMEM, "loader: %u shards", w->nmaps);
				goto out;
			}
		}
	}
	l->started = 1;
	l->t_start = ferry__now_ns();
	l->act = ferry__activity_begin(l->ds->ctx, FERRY__ACTIVITY_LOADER, l->ds->path);
	ferry__activity_set(l->act, FERRY__ACT_THREADS, l->threads);
	ferry__activity_set(l->act, FERRY__ACT_PHASE, FERRY__PHASE_MOVE);
	for (uint32_t t = 0; t < l->threads; t++) {
		if (pthread_create(&l->workers[t].tid, NULL, worker_main, &l->workers[t])) {
			err = ferry__error(-EAGAIN, "loader: pthread_create");
			pthread_mutex_lock(&l->mu);
			l->stop = 1;
			pthread_mutex_unlock(&l->mu);
			break;
		}
		l->workers[t].started = 1;
	}
out:
	if (entered)
		ferry__gpu_leave(prev);
	if (err)
		l->started = 1, l->failed = 1, l->err = err,
		snprintf(l->errmsg, sizeof(l->errmsg), "%s", ferry_last_error());
	return err;
}

static void loader_free(struct ferry_loader *l);

void ferry_loader_destroy(ferry_loader *l)
{
	if (!l || forked(l))
		return;
	pthread_mutex_lock(&l->mu);
	l->stop = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	ferry__activity_end(l->act, FERRY__PHASE_DONE);
	l->act = NULL;
	void *prev = NULL;
	int entered = l->gpu && !ferry__gpu_enter(l->device, &prev);
	for (uint32_t t = 0; l->workers && t < l->threads; t++) {
		struct worker *w = &l->workers[t];
		if (w->started)
			pthread_join(w->tid, NULL);
		if (entered)
			ferry__ring_destroy(w->ring);
		ferry_batch_destroy(w->batch);
		free(w->epoch_idx);
		free(w->order);
		free(w->pieces);
		free(w->sorted);
		free(w->skeys);
		ferry__cz_cache_destroy(w->czc);
		ferry__cz_dcache_destroy(w->dc); /* after its ring: nothing of its runs */
		free(w->inl);
		free(w->gf);
		maps_free(w);
		if (w->stage)
			ferry_free_aligned(w->stage, w->stage_cap);
	}
	for (uint32_t i = 0; l->slots && i < l->nslots; i++) {
		struct ferry_loader_batch *s = &l->slots[i];
		if (entered && s->buf)
			buf_destroy(l, s->buf);
		free(s->offsets);
		free(s->indices);
	}
	pthread_mutex_lock(&l->mu);
	struct ferry_loader_buffer *spare = l->spare;
	l->spare = l->spare_tail = NULL;
	l->destroyed = 1;
	int last = --l->refs == 0;
	pthread_mutex_unlock(&l->mu);
	while (spare) {
		struct ferry_loader_buffer *next = spare->next;
		if (entered)
			buf_destroy(l, spare);
		else
			free(spare);
		spare = next;
	}
	if (entered)
		ferry__gpu_leave(prev);
	ferry__pinned_pool_destroy(l->pool);
	free(l->slots);
	free(l->workers);
	free(l->cum);
	free(l->wbound);
	free(l->runs);
	free(l->doc_start);
	free(l->waits);
	l->slots = NULL;
	l->workers = NULL;
	l->cum = NULL;
	l->wbound = NULL;
	l->runs = NULL;
	l->doc_start = NULL;
	l->waits = NULL;
	l->pool = NULL;
	if (last)
		loader_free(l);
}

/* What is left once the owner and every taken buffer let go. */
static void loader_free(struct ferry_loader *l)
{
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}

uint64_t ferry_loader_samples_per_epoch(const ferry_loader *l)
{
	if (!l)
		return 0;
	if (!l->started)
		setup((struct ferry_loader *)l, 0);
	return l->per_rank;
}

uint64_t ferry_loader_batches_per_epoch(const ferry_loader *l)
{
	if (!l)
		return 0;
	if (!l->started)
		setup((struct ferry_loader *)l, 0);
	return l->bpe;
}

int ferry_loader_next(ferry_loader *l, ferry_loader_batch **out)
{
	if (!l || !out)
		return ferry__error(-EINVAL, "ferry_loader_next: NULL argument");
	*out = NULL;
	uint64_t t0 = ferry__now_ns();
	if (!l->started) {
		int err = ferry_loader_start(l);
		if (err)
			return err;
	}
	pthread_mutex_lock(&l->mu);
	if (l->next_consume >= l->end_seq) {
		pthread_mutex_unlock(&l->mu);
		return 0;
	}
	struct ferry_loader_batch *s = &l->slots[l->next_consume % l->nslots];
	if (s->state == SLOT_HELD) {
		pthread_mutex_unlock(&l->mu);
		return ferry__error(FERRY_EBUSY, "ferry_loader_next: %u batches are held; release one first",
				    l->prefetch);
	}
	while (!(s->state == SLOT_READY && s->seq == l->next_consume) && !l->failed)
		pthread_cond_wait(&l->cv, &l->mu);
	if (l->failed && !(s->state == SLOT_READY && s->seq == l->next_consume && !s->err)) {
		int err = l->err;
		char msg[sizeof(l->errmsg)];
		snprintf(msg, sizeof(msg), "%s", l->errmsg);
		pthread_mutex_unlock(&l->mu);
		return ferry__error_raise(err, msg);
	}
	pthread_mutex_unlock(&l->mu);
	if (l->device >= 0) {
		void *prev;
		int err = ferry__gpu_enter(l->device, &prev);
		if (err)
			return err;
		err = ferry__ring_sync(s->ring, (unsigned)(s - l->slots));
		ferry__gpu_leave(prev);
		if (err < 0) {
			ferry__error_append("ferry_loader_next: batch %" PRIu64 "'s upload", s->step);
			return err;
		}
	}
	uint64_t wait = ferry__now_ns() - t0;
	pthread_mutex_lock(&l->mu);
	s->state = SLOT_HELD;
	l->next_consume++;
	if (l->nwaits == l->waits_cap) {
		uint64_t c = l->waits_cap ? l->waits_cap * 2 : 1024;
		uint64_t *p = realloc(l->waits, c * sizeof(*p));
		if (p) {
			l->waits = p;
			l->waits_cap = c;
		}
	}
	if (l->nwaits < l->waits_cap)
		l->waits[l->nwaits++] = wait;
	pthread_mutex_unlock(&l->mu);
	ferry__activity_add(l->act, FERRY__ACT_BATCHES, 1);
	ferry__activity_add(l->act, FERRY__ACT_ITEMS, s->count);
	ferry__activity_add(l->act, FERRY__ACT_BYTES, s->bytes);
	ferry__activity_add(l->act, FERRY__ACT_WAIT_NS, wait);
	*out = s;
	return 1;
}

void ferry_loader_batch_destroy(ferry_loader_batch *b)
{
	if (!b)
		return;
	struct ferry_loader *l = b->l;
	if (forked(l))
		return;
	pthread_mutex_lock(&l->mu);
	if (b->state == SLOT_HELD) {
		b->state = SLOT_FREE;
		pthread_cond_broadcast(&l->cv);
	}
	pthread_mutex_unlock(&l->mu);
}

int ferry_loader_take(ferry_loader *l, ferry_loader_batch *b, ferry_loader_buffer **out)
{
	if (!l || !b || !out)
		return ferry__error(-EINVAL, "ferry_loader_take: NULL argument");
	*out = NULL;
	pthread_mutex_lock(&l->mu);
	int held = b->state == SLOT_HELD, dev = b->buf != NULL;
	if (held && dev) {
		*out = b->buf;
		b->buf = NULL; /* the slot gets another before its next upload */
		l->refs++;
	}
	pthread_mutex_unlock(&l->mu);
	if (held)
		ferry_loader_batch_destroy(b);
	if (!held || !dev)
		return ferry__error(-EINVAL, "ferry_loader_take: %s",
				    !held ? "the batch is not held" : "the loader is not on a CUDA device");
	return 0;
}

void *ferry_loader_buffer_data(const ferry_loader_buffer *buf)
{
	return buf ? (void *)(uintptr_t)buf->dev : NULL;
}

int ferry_loader_buffer_destroy(ferry_loader_buffer *buf, void *stream)
{
	if (!buf)
		return 0;
	struct ferry_loader *l = buf->l;
	if (forked(l))
		return 0;
	void *prev;
	int err = ferry__gpu_enter(l->device, &prev), entered = !err;
	if (entered && (err = ferry__fence_record(buf->fence, stream)))
		ferry__error_append("ferry_loader_buffer_destroy");
	pthread_mutex_lock(&l->mu);
	if (!err && !l->destroyed) {
		if (l->spare_tail)
			l->spare_tail->next = buf;
		else
			l->spare = buf;
		l->spare_tail = buf;
		buf = NULL;
	}
	int last = --l->refs == 0;
	pthread_mutex_unlock(&l->mu);
	if (buf && entered)
		buf_destroy(l, buf); /* after the event just recorded (or, if that failed, the last one) */
	else if (buf)
		free(buf); /* no context to free device memory in: it stays with the process */
	if (entered)
		ferry__gpu_leave(prev);
	if (last)
		loader_free(l);
	return err;
}

void *ferry_loader_batch_data(const ferry_loader_batch *b)
{
	return b ? (b->buf ? (void *)(uintptr_t)b->buf->dev : b->host) : NULL;
}
size_t ferry_loader_batch_bytes(const ferry_loader_batch *b) { return b ? b->bytes : 0; }
uint32_t ferry_loader_batch_samples(const ferry_loader_batch *b) { return b ? b->count : 0; }
const uint64_t *ferry_loader_batch_offsets(const ferry_loader_batch *b) { return b ? b->offsets : NULL; }
const int64_t *ferry_loader_batch_indices(const ferry_loader_batch *b) { return b ? b->indices : NULL; }
uint64_t ferry_loader_batch_epoch(const ferry_loader_batch *b) { return b ? b->epoch : 0; }
uint64_t ferry_loader_batch_step(const ferry_loader_batch *b) { return b ? b->step : 0; }

const int64_t *ferry_loader_batch_position_ids(const ferry_loader_batch *b)
{
	return b && b->l->documents ? b->pos : NULL;
}

int ferry_loader_documents_layout(const ferry_loader *l, size_t *pos_offset, size_t *cu_offset)
{
	if (!l || !l->documents || !l->started || l->failed)
		return ferry__error(-EINVAL, "ferry_loader_documents_layout: %s",
				    !l ? "NULL loader" : !l->documents ? "documents is off" : "the loader has not started");
	if (pos_offset)
		*pos_offset = l->pos_off;
	if (cu_offset)
		*cu_offset = l->cu_off;
	return 0;
}

const int32_t *ferry_loader_batch_cu_seqlens(const ferry_loader_batch *b, uint32_t *count,
					     uint32_t *max_seqlen)
{
	int on = b && b->l->documents;
	if (count)
		*count = on ? b->ncu : 0;
	if (max_seqlen)
		*max_seqlen = on ? b->max_seqlen : 0;
	return on ? b->cu : NULL;
}

/* --------------------------------------------------------------------------------- resumption */

#define STATE_FMT                                                                                 \
	"ferry-loader-state 1 start_epoch=%" PRIu64 " epoch=%" PRIu64 " batch=%" PRIu64               \
	" items=%" PRIu64 " world_size=%u rank=%u seed=%" PRIu64 " order=%s block=%" PRIu64         \
	" batch_size=%u seq_len=%" PRIu64 " drop_last=%d drop_last_batch=%d dataset_bytes=%" PRIu64

int ferry_loader_state(const ferry_loader *l, char *buf, size_t len)
{
	if (!l || !buf)
		return -EINVAL;
	struct ferry_loader *m = (struct ferry_loader *)l;
	if (!m->started && setup(m, 0))
		return -EINVAL;
	pthread_mutex_lock(&m->mu);
	uint64_t epoch = m->pos_epoch == UINT64_MAX ? m->epoch : m->pos_epoch;
	uint64_t b = m->pos_epoch == UINT64_MAX ? 0 : m->pos_batch;
	if (m->bpe) {
		uint64_t g = b + m->next_consume;
		epoch = epoch + g / m->bpe;
		b = g % m->bpe;
	}
	pthread_mutex_unlock(&m->mu);
	char on[48];
	int n = snprintf(buf, len, STATE_FMT, m->epoch, epoch, b, m->items, m->world_size, m->rank,
			 m->seed, state_order(m, on, sizeof(on)), m->block, m->batch_size, m->seq_len, m->drop_last,
			 m->drop_last_batch, m->ds->x.bytes);
	if (n < 0 || (size_t)n >= len)
		return ferry__error(-ENOSPC, "ferry_loader_state: %zu bytes are too few", len);
	return n;
}

static int set_state(struct ferry_loader *l, const char *v)
{
	uint64_t start, epoch, b, items, seed, block, seq_len;
	unsigned world, rank, bs;
	int dl, dlb;
	char order[48], on[48];
	int n = sscanf(v, "ferry-loader-state 1 start_epoch=%" SCNu64 " epoch=%" SCNu64
			  " batch=%" SCNu64 " items=%" SCNu64 " world_size=%u rank=%u seed=%" SCNu64
			  " order=%47s block=%" SCNu64 " batch_size=%u seq_len=%" SCNu64
			  " drop_last=%d drop_last_batch=%d",
		       &start, &epoch, &b, &items, &world, &rank, &seed, order, &block, &bs, &seq_len,
		       &dl, &dlb);
	if (n != 13)
		return ferry__error(FERRY_EBADOPT, "loader state: not a ferry-loader-state 1 line: '%.80s'", v);
	/* At its own world size a state resumes its own rank only (another rank's batches are other
	 * samples); at another world size it is remapped below when that is exact. */
	if (world == l->world_size && rank != l->rank)
		return ferry__error(FERRY_EBADOPT, "loader state: it was saved by rank %u of world_size %u, "
				    "this loader is rank %u of world_size %u", rank, world, l->rank, l->world_size);
#define SAME(field, have, want)                                                                  \
	if ((uint64_t)(have) != (uint64_t)(want))                                                \
		return ferry__error(FERRY_EBADOPT, "loader state: %s was %llu, the loader has %llu", \
				    field, (unsigned long long)(have), (unsigned long long)(want));
	SAME("seed", seed, l->seed)
	SAME("batch_size", bs, l->batch_size)
	SAME("seq_len", seq_len, l->seq_len)
	SAME("drop_last", dl, l->drop_last)
	SAME("drop_last_batch", dlb, l->drop_last_batch)
	if (l->order == FERRY_ORDER_BLOCK)
		SAME("block", block, l->block)
#undef SAME
	int err = setup(l, 0); /* first: it resolves shard_window, part of the order's name */
	if (err)
		return err;
	unsigned w = 0;
	char tail;
	if (strcmp(order, state_order(l, on, sizeof(on))) && l->shard_window < 0 && l->order == FERRY_ORDER_SHUFFLE &&
	    !l->copies && (!strcmp(order, "shuffle") || sscanf(order, "shuffle-window-%u%c", &w, &tail) == 1)) {
		/* shard_window left to its default: the state's windows (or none), so that a run resumes
		 * the order it began with when the default's choice moved (cache_bytes changed, or the
		 * default itself did: half the budget before f650f11) */
		l->shard_window = w;
		if ((err = setup(l, 0)))
			return err;
	}
	if (strcmp(order, state_order(l, on, sizeof(on))))
		return ferry__error(FERRY_EBADOPT, "loader state: order was %s, the loader has %s", order,
				    state_order(l, on, sizeof(on)));
	if (items != l->items)
		return ferry__error(FERRY_EBADOPT, "loader state: the dataset had %" PRIu64 " samples, "
				    "this one has %" PRIu64, items, l->items);
	/* dataset_bytes came later: a line without it is still accepted */
	const char *db = strstr(v, " dataset_bytes=");
	if (db) {
		uint64_t bytes = strtoull(db + 15, NULL, 10);
		if (bytes != l->ds->x.bytes)
			return ferry__error(FERRY_EBADOPT, "loader state: the dataset had %" PRIu64 " bytes, "
					    "this one has %" PRIu64 " (another dataset)", bytes, l->ds->x.bytes);
	}
	if (world != l->world_size) {
		/*
		 * Every rank of `world` has taken b full batches (only an epoch's last batch is short):
		 * together the first b * bs * world entries of the epoch's global order, which holds no
		 * padding before n. At this world size that prefix is b' whole steps when it divides,
		 * and the rest of the epoch is the rest of the same order: exact. Otherwise refused.
		 */
		uint64_t done = b * bs * (uint64_t)world, step = (uint64_t)l->batch_size * l->world_size;
		uint64_t total = l->per_rank * l->world_size;
		if (done % step || done > l->items || done > total || (l->bpe && done / step > l->bpe))
			return ferry__error(FERRY_EBADOPT, "loader state: it was saved by rank %u of world_size %u "
					    "after %" PRIu64 " batches of %u (%" PRIu64 " samples of epoch %" PRIu64
					    " across its ranks), this loader is rank %u of world_size %u: that is not a "
					    "whole number of its steps of %" PRIu64 " samples (or reaches past the "
					    "epoch's unpadded samples), so it cannot resume there exactly (docs/DATA.md, "
					    "\"Epochs, iteration and resumption\")", rank, world, b, bs, done, epoch,
					    l->rank, l->world_size, step);
		b = done / step;
		if (l->bpe && b == l->bpe)
			b = 0, epoch++;
	}
	if (l->bpe && b >= l->bpe)
		return ferry__error(FERRY_EBADOPT, "loader state: batch %" PRIu64 " of %" PRIu64, b, l->bpe);
	l->epoch = start;
	l->pos_epoch = epoch;
	l->pos_batch = b;
	return 0;
}

/* ------------------------------------------------------------------------------------ metrics */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int ferry_loader_metric(ferry_loader *l, const char *name, double *out)
{
	if (!l || !name || !out)
		return -EINVAL;
	pthread_mutex_lock(&l->mu);
	uint64_t n = l->nwaits, total = 0, max = 0;
	for (uint64_t i = 0; i < n; i++) {
		total += l->waits[i];
		max = l->waits[i] > max ? l->waits[i] : max;
	}
	double elapsed = l->started ? (double)(ferry__now_ns() - l->t_start) : 0;
	double r = -1;
	if (!strcmp(name, "steps"))
		r = (double)n;
	else if (!strcmp(name, "wait_total_ns"))
		r = (double)total;
	else if (!strcmp(name, "wait_mean_ns"))
		r = n ? (double)total / (double)n : 0;
	else if (!strcmp(name, "wait_max_ns"))
		r = (double)max;
	else if (!strncmp(name, "wait_p", 6)) {
		int q = atoi(name + 6);
		if (q == 50 || q == 90 || q == 99) {
			r = 0;
			uint64_t *c = n ? malloc(n * sizeof(*c)) : NULL;
			if (c) {
				memcpy(c, l->waits, n * sizeof(*c));
				qsort(c, n, sizeof(*c), cmp_u64);
				uint64_t k = (n * (uint64_t)q + 99) / 100;
				r = (double)c[k ? k - 1 : 0];
				free(c);
			}
		}
	} else if (!strcmp(name, "bytes"))
		r = (double)l->bytes;
	else if (!strcmp(name, "samples"))
		r = (double)l->samples;
	else if (!strcmp(name, "elapsed_ns"))
		r = elapsed;
	else if (!strcmp(name, "samples_per_s"))
		r = elapsed > 0 ? (double)l->samples * 1e9 / elapsed : 0;
	else if (!strcmp(name, "bytes_per_s"))
		r = elapsed > 0 ? (double)l->bytes * 1e9 / elapsed : 0;
	else if (!strcmp(name, "reads"))
		r = (double)l->reads;
	else if (!strcmp(name, "merged"))
		r = (double)l->merged;
	else if (!strcmp(name, "inline_reads"))
		r = (double)l->inline_reads;
	else if (!strcmp(name, "device_buffers"))
		r = (double)l->nbufs;
	else if (!strcmp(name, "mapped_reads") || !strcmp(name, "mapped_faults")) {
		r = (double)(name[7] == 'r' ? l->mapped_reads : l->mapped_faults);
	} else if (!strcmp(name, "lent_maps")) {
		r = (double)l->lent_maps;
	} else if (!strcmp(name, "chunk_decodes") || !strcmp(name, "chunk_decoded_bytes")) {
		r = (double)(name[12] == 's' ? l->chunk_decodes : l->chunk_decoded);
	} else if (!strcmp(name, "gpu_chunk_decodes") || !strcmp(name, "gpu_decode_batches")) {
		r = (double)(name[4] == 'c' ? l->gpu_chunk_decodes : l->gpu_decode_batches);
	} else if (!strcmp(name, "cpu_ns")) {
		r = 0;
		for (uint32_t t = 0; l->workers && t < l->threads; t++)
			r += (double)l->workers[t].cpu_ns;
	}
	pthread_mutex_unlock(&l->mu);
	if (r < 0) /* every metric is >= 0: the name matched none */
		return ferry__error(FERRY_EBADOPT, "ferry_loader_metric: unknown metric \"%s\"", name);
	*out = r;
	return 0;
}

uint64_t ferry_loader_waits(ferry_loader *l, uint64_t *out, uint64_t len)
{
	if (!l)
		return 0;
	pthread_mutex_lock(&l->mu);
	uint64_t n = l->nwaits;
	for (uint64_t i = 0; out && i < n && i < len; i++)
		out[i] = l->waits[i];
	pthread_mutex_unlock(&l->mu);
	return n;
}
