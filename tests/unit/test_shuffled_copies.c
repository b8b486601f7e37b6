/* Pre-shuffled copies (issue 27): ferry_dataset_writer_set_copies writes N copies and ferry.copies;
 * the loader with copies=1 gives, per rank per epoch, exactly distributed_indices of the order of
 * copy e mod N, with the original samples' bytes, read from the copies' shards (the original shards
 * are overwritten to prove it); a state resumes it exactly; refusals (no copies, wrong order or seed), a ferry.copies from
 * another index refused at open, a corrupt one named. */
#include <fcntl.h>

#include "ferry_test.h"
#include "base/byteorder.h"
#include "base/crc32c.h"
#include "ferry/data.h"
#include "format/shards.h"

static ferry_ctx *ctx;
static char dir[512], path[600], plain[600];
static const uint64_t N = 613;
static uint8_t *stream;
static uint64_t *soff;

static size_t slen(uint64_t i) { return 2 * (1 + (i * 53) % 120); }

static void make(const char *p, uint32_t copies, uint64_t seed)
{
	ferry_dataset_writer *w;
	T_ASSERT(ferry_dataset_writer_create(ctx, p, FERRY_WRITE_FERRY, FERRY_DT_U16, 16384, &w) == 0);
	for (uint64_t i = 0; i < N; i++)
		T_ASSERT(ferry_dataset_writer_add(w, slen(i), NULL, 0, 1) >= 0);
	T_ASSERT(ferry_dataset_writer_layout(w) > 3);
	for (uint64_t i = 0; i < N; i++)
		T_ASSERT(ferry_dataset_writer_put(w, i, stream + soff[i], slen(i)) == 0);
	T_ASSERT(ferry_dataset_writer_set_copies(w, copies, seed) == 0);
	T_ASSERT(ferry_dataset_writer_finish(w) == 0);
	ferry_dataset_writer_destroy(w);
}

static ferry_loader *loader(ferry_dataset *ds, uint32_t W, uint32_t r, uint64_t epoch, int dl, int copies,
			    const char *seed, const char *order)
{
	ferry_loader *l;
	char ws[16], rs[16], es[24], d[4], c[4];
	snprintf(ws, sizeof(ws), "%u", W);
	snprintf(rs, sizeof(rs), "%u", r);
	snprintf(es, sizeof(es), "%llu", (unsigned long long)epoch);
	snprintf(d, sizeof(d), "%d", dl);
	snprintf(c, sizeof(c), "%d", copies);
	const char *kv[] = {"batch_size", "7", "world_size", ws, "rank", rs, "order", order, "seed", seed,
			    "epoch", es, "epochs", "1", "threads", "2", "drop_last", d, "copies", c, NULL};
	T_ASSERT(ferry_loader_create(ds, &l) == 0);
	for (const char *const *p = kv; p[0]; p += 2)
		if (ferry_loader_set(l, p[0], p[1])) {
			fprintf(stderr, "set %s=%s: %s\n", p[0], p[1], ferry_last_error());
			exit(T_EXIT_FAIL);
		}
	return l;
}

/* The rank's indices of one epoch into out; counts samples whose bytes differ from the original's. */
static uint64_t drain(ferry_loader *l, int64_t *out, uint64_t *bad)
{
	uint64_t k = 0;
	ferry_loader_batch *bt;
	int r;
	while ((r = ferry_loader_next(l, &bt)) == 1) {
		const uint8_t *d = ferry_loader_batch_data(bt);
		const uint64_t *o = ferry_loader_batch_offsets(bt);
		const int64_t *ix = ferry_loader_batch_indices(bt);
		for (uint32_t s = 0; s < ferry_loader_batch_samples(bt); s++) {
			size_t len = slen((uint64_t)ix[s]);
			if (o[s + 1] - o[s] != len || memcmp(d + o[s], stream + soff[ix[s]], len))
				(*bad)++;
			out[k++] = ix[s];
		}
		ferry_loader_batch_destroy(bt);
	}
	T_EQ_INT(r, 0);
	return k;
}

/* Every rank, epochs 0..4: the loader's ids equal distributed_indices of the epoch's order (copy
 * e mod 3 with copies, epoch e without); returns the samples whose bytes were wrong. */
static uint64_t check(ferry_dataset *ds, int copies)
{
	uint32_t worlds[] = {1, 3, 8};
	uint64_t bad = 0;
	int64_t *got = malloc(N * 8), *want = malloc(N * 8);
	for (int wi = 0; wi < 3; wi++)
		for (int dl = 0; dl < 2; dl++)
			for (uint64_t e = 0; e < 5; e++)
				for (uint32_t r = 0; r < worlds[wi]; r++) {
					uint32_t W = worlds[wi];
					ferry_loader *l = loader(ds, W, r, e, dl, copies, "5", "shuffle");
					uint64_t per = ferry_distributed_num_samples(N, W, dl);
					T_EQ_INT(drain(l, got, &bad), per);
					T_EQ_INT(ferry_distributed_indices(N, W, r, 1, 5, copies ? e % 3 : e, dl, want, N),
						 per);
					if (memcmp(got, want, per * 8)) {
						fprintf(stderr, "copies=%d world %u rank %u epoch %llu drop_last %d: ids "
							"differ from distributed_indices\n", copies, W, r,
							(unsigned long long)e, dl);
						t_failures++;
					}
					ferry_loader_destroy(l);
				}
	free(got);
	free(want);
	return bad;
}

static int refused(ferry_dataset *ds, const char *seed, const char *order)
{
	ferry_loader *l = loader(ds, 1, 0, 0, 0, 1, seed, order);
	int err = ferry_loader_start(l);
	ferry_loader_destroy(l);
	return err == FERRY_EBADOPT;
}

static void read_file(const char *p, uint8_t **b, size_t *len)
{
	int fd = open(p, O_RDONLY);
	T_ASSERT(fd >= 0);
	off_t sz = lseek(fd, 0, SEEK_END);
	*b = malloc((size_t)sz);
	T_ASSERT(pread(fd, *b, (size_t)sz, 0) == sz);
	*len = (size_t)sz;
	close(fd);
}

static void write_file(const char *p, const uint8_t *b, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_ASSERT(fd >= 0 && write(fd, b, len) == (ssize_t)len);
	close(fd);
}

int main(void)
{
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(dir, sizeof(dir), "%s/test_shuffled_copies.%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
	snprintf(path, sizeof(path), "%s/ds", dir);
	snprintf(plain, sizeof(plain), "%s/plain", dir);
	soff = malloc((N + 1) * 8);
	uint64_t total = 0;
	for (uint64_t i = 0; i < N; i++)
		soff[i] = total, total += slen(i);
	soff[N] = total;
	stream = malloc(total);
	t_fill_pattern(stream, total, 0, 11);
	make(path, 3, 5);
	make(plain, 0, 0);

	ferry_dataset *ds, *pd;
	T_ASSERT(ferry_dataset_open(ctx, path, &ds) == 0);
	T_ASSERT(ferry_dataset_open(ctx, plain, &pd) == 0);
	uint64_t seed = 0;
	T_EQ_INT(ferry_dataset_copies(ds, &seed), 3);
	T_EQ_INT(seed, 5);
	T_EQ_INT(ferry_dataset_copies(pd, NULL), 0);

	/* each copy's shards hold the samples in its order, back to back */
	{
		int64_t *ord = malloc(N * 8);
		for (uint32_t c = 0; c < 3; c++) {
			T_ASSERT(ferry_order_indices(N, FERRY_ORDER_SHUFFLE, 0, 5, c, ord) == 0);
			uint64_t p = 0;
			for (uint32_t s = 0; p < N; s++) {
				char f[700];
				snprintf(f, sizeof(f), "%s/copy-%03u-shard-%05u.fsh", path, c, s);
				uint8_t *b;
				size_t len, at = 0;
				read_file(f, &b, &len);
				while (p < N && at + slen((uint64_t)ord[p]) <= len) {
					if (memcmp(b + at, stream + soff[ord[p]], slen((uint64_t)ord[p]))) {
						fprintf(stderr, "copy %u position %llu: wrong bytes\n", c,
							(unsigned long long)p);
						t_failures++;
					}
					at += slen((uint64_t)ord[p++]);
				}
				T_EQ_INT(at, len);
				free(b);
			}
		}
		free(ord);
	}

	/* ferry_dataset_verify checks the copies against the index: a flipped byte in copy 1 is named */
	T_EQ_INT(ferry_dataset_verify(ds), 0);
	{
		char f[700];
		snprintf(f, sizeof(f), "%s/copy-001-shard-00001.fsh", path);
		uint8_t *b;
		size_t len;
		read_file(f, &b, &len);
		b[len / 2] ^= 0x40;
		write_file(f, b, len);
		T_EQ_INT(ferry_dataset_verify(ds), FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "copy-001-shard-00001.fsh: copy 1, position") != NULL);
		b[len / 2] ^= 0x40;
		write_file(f, b, len);
		free(b);
		T_EQ_INT(ferry_dataset_verify(ds), 0);
	}

	T_EQ_INT(check(ds, 1), 0);
	T_EQ_INT(check(ds, 0), 0);

	/* resume: a state taken after 4 batches of epoch 3 (copy 0) resumes the same ids; a loader
	 * without copies refuses it (its epoch 3 is another order) */
	{
		int64_t *all = malloc(N * 8), *rest = malloc(N * 8);
		uint64_t bad = 0, k = 0;
		ferry_loader *l = loader(ds, 3, 1, 3, 0, 1, "5", "shuffle");
		uint64_t per = drain(l, all, &bad);
		ferry_loader_destroy(l);
		l = loader(ds, 3, 1, 3, 0, 1, "5", "shuffle");
		ferry_loader_batch *bt;
		for (int b = 0; b < 4; b++) {
			T_ASSERT(ferry_loader_next(l, &bt) == 1);
			k += ferry_loader_batch_samples(bt);
			ferry_loader_batch_destroy(bt);
		}
		char st[512];
		T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
		T_CHECK(strstr(st, "order=shuffle-copies-3 ") != NULL);
		ferry_loader_destroy(l);
		l = loader(ds, 3, 1, 3, 0, 1, "5", "shuffle");
		T_EQ_INT(ferry_loader_set(l, "state", st), 0);
		T_EQ_INT(drain(l, rest, &bad), per - k);
		T_CHECK(memcmp(rest, all + k, (per - k) * 8) == 0);
		ferry_loader_destroy(l);
		l = loader(ds, 3, 1, 3, 0, 0, "5", "shuffle");
		T_EQ_INT(ferry_loader_set(l, "state", st), FERRY_EBADOPT);
		ferry_loader_destroy(l);
		T_EQ_INT(bad, 0);
		free(all);
		free(rest);
	}

	T_CHECK(refused(pd, "5", "shuffle"));      /* no copies */
	T_CHECK(refused(ds, "6", "shuffle"));      /* another seed */
	T_CHECK(refused(ds, "5", "sequential"));   /* another order */
	T_CHECK(!refused(ds, "5", "shuffle"));

	/* the copies are what copies=1 reads: with the original shards zeroed, it still gives the
	 * original bytes, and copies=0 does not */
	for (uint32_t s = 0; s < ferry_dataset_shards(ds); s++) {
		uint8_t *b;
		size_t len;
		read_file(ferry_dataset_shard_path(ds, s), &b, &len);
		memset(b, 0, len);
		write_file(ferry_dataset_shard_path(ds, s), b, len);
		free(b);
	}
	{
		ferry_loader *l = loader(ds, 3, 1, 4, 0, 1, "5", "shuffle");
		int64_t *got = malloc(N * 8);
		uint64_t bad = 0;
		drain(l, got, &bad);
		T_EQ_INT(bad, 0);
		ferry_loader_destroy(l);
		l = loader(ds, 3, 1, 4, 0, 0, "5", "shuffle");
		drain(l, got, &bad);
		T_CHECK(bad > 0);
		ferry_loader_destroy(l);
		free(got);
	}
	ferry_dataset_destroy(ds);
	ferry_dataset_destroy(pd);

	/* a ferry.copies beside another index (one sample's bytes differ) is refused at open */
	stream[0] ^= 1;
	make(plain, 0, 0);
	stream[0] ^= 1;
	char a[700], b2[700];
	snprintf(a, sizeof(a), "%s/ferry.copies", path);
	snprintf(b2, sizeof(b2), "%s/ferry.copies", plain);
	uint8_t *cb;
	size_t cl;
	read_file(a, &cb, &cl);
	write_file(b2, cb, cl);
	T_EQ_INT(ferry_dataset_open(ctx, plain, &pd), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "written for another index") != NULL);
	/* a position table with a sample twice is refused by the parser (checksum skipped) */
	{
		uint8_t *ib;
		size_t il;
		char ip[700];
		snprintf(ip, sizeof(ip), "%s/ferry.idx", path);
		read_file(ip, &ib, &il);
		struct ferry__index x;
		struct ferry__copies c;
		T_ASSERT(ferry__shard_index_parse(ib, il, 1, "idx", &x) == 0);
		uint32_t icrc = ferry__rd32(ib + il - 8);
		T_EQ_INT(ferry__copies_parse(cb, cl, 1, "copies", &x, icrc, &c), 0);
		T_EQ_INT(c.ncopies, 3);
		ferry__copies_free(&c);
		uint32_t ns = ferry__rd32(cb + FERRY__CPY_HEADER);
		uint8_t *pos = cb + FERRY__CPY_HEADER + FERRY__CPY_COPY_HEADER + ns * FERRY__IDX_SHARD_ENTRY;
		memcpy(pos + FERRY__CPY_POS_ENTRY, pos, 8); /* position 1 names position 0's sample */
		T_EQ_INT(ferry__copies_parse(cb, cl, 0, "copies", &x, icrc, &c), FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "repeated") != NULL);
		T_EQ_INT(ferry__copies_parse(cb, cl, 1, "copies", &x, icrc, &c), FERRY_ECORRUPT);
		ferry__index_free(&x);
		free(ib);
	}
	free(cb);
	T_EQ_INT(ferry_dataset_writer_set_copies(NULL, 1, 0), -EINVAL);
	ferry_ctx_destroy(ctx);
	T_CHECK(t_rmtree(dir) == 0);
	return t_result();
}
