/* The loader over compressed shards (issue 26): the chunk window gives every sample once an epoch
 * with the right bytes and decodes each chunk about once (chunk_decodes), for zstd and LZ4; a
 * resume mid-epoch gives exactly the rest; three pipeline threads give the same order; sequential reads decode each chunk about once; a
 * damaged chunk fails the batch naming the chunk; the decoded chunk cache (ferry__cz_pread_cached)
 * gives ferry_cz_pread's bytes for any range, heads and evictions included. Run under ASan by
 * scripts/test.sh. */
#include "format/cz.h"
#include "unit/loader_cz_data.h"


static void loader_checks(const char *cz_path, uint64_t chunks)
{
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, cz_path, &ds) == 0);
	int64_t *a = malloc(N * 8), *b = malloc(N * 8);
	const char *win[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1", NULL};
	ferry_loader *l = make_loader(ds, win);
	uint64_t k = drain(l, a, 0);
	check_once(a, k);
	double dec = metric(l, "chunk_decodes");
	printf("chunk window 2: %llu samples, %.0f decodes for %llu chunks\n", (unsigned long long)k, dec,
	       (unsigned long long)chunks);
	T_CHECK(dec >= (double)chunks && dec <= 2.0 * (double)chunks);
	ferry_loader_destroy(l);

	/* resume after 37 batches: exactly the rest */
	l = make_loader(ds, win);
	T_EQ_INT(drain(l, b, 37), 37 * 16);
	char st[512];
	T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
	T_CHECK(strstr(st, "shuffle-chunks-2-of-") != NULL);
	ferry_loader_destroy(l);
	l = make_loader(ds, win);
	T_ASSERT(ferry_loader_set(l, "state", st) == 0);
	uint64_t rest = drain(l, b + 37 * 16, 0);
	T_EQ_INT(37 * 16 + rest, N);
	T_CHECK(!memcmp(a, b, N * 8));
	ferry_loader_destroy(l);

	/* three pipeline threads, each with its own cache over the shared readers: the same order */
	const char *thr[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1",
			     "threads", "3", NULL};
	l = make_loader(ds, thr);
	T_EQ_INT(drain(l, b, 0), N);
	T_CHECK(!memcmp(a, b, N * 8));
	ferry_loader_destroy(l);

	/* sequential: each chunk decoded about once (a sample crossing into a chunk: its head) */
	const char *seq[] = {"batch_size", "16", "epochs", "1", NULL};
	l = make_loader(ds, seq);
	k = drain(l, a, 0);
	T_EQ_INT(k, N);
	for (uint64_t i = 0; i < k; i++)
		T_EQ_INT(a[i], (int64_t)i);
	dec = metric(l, "chunk_decodes");
	T_CHECK(dec >= (double)chunks && dec <= 2.0 * (double)chunks);
	ferry_loader_destroy(l);
	free(a);
	free(b);
	ferry_dataset_destroy(ds);
}

/* ferry__cz_pread_cached against ferry_cz_pread over random ranges, a small budget evicting. */
static void cache_checks(const char *file)
{
	ferry_cz *z;
	T_ASSERT(ferry_cz_open(ctx, file, &z) == 0);
	uint64_t size = (uint64_t)ferry_cz_size(z), s = 3;
	struct ferry__cz_cache *c;
	T_ASSERT(ferry__cz_cache_create(2u << 20, &c) == 0);
	uint8_t *x = malloc(3u << 20), *y = malloc(3u << 20);
	for (int t = 0; t < 300; t++) {
		uint64_t len = t % 10 == 0 ? (3u << 20) : 1 + t_rand(&s) % 9000;
		uint64_t off = t_rand(&s) % size;
		if (t % 7 == 0) /* a range crossing into a chunk's head */
			off = ((t_rand(&s) % (size >> 20)) + 1) * (1u << 20) - 100;
		ssize_t p = ferry_cz_pread(z, x, len, off), q = ferry__cz_pread_cached(z, c, y, len, off);
		T_EQ_INT(p, q);
		if (p > 0 && memcmp(x, y, (size_t)p)) {
			fprintf(stderr, "range %llu+%llu differs\n", (unsigned long long)off, (unsigned long long)len);
			t_failures++;
		}
	}
	struct ferry__cz_cache_stats st;
	ferry__cz_cache_stats(c, &st);
	printf("cache: %llu decodes, %llu hits\n", (unsigned long long)st.decodes, (unsigned long long)st.hits);
	T_CHECK(st.hits > 0 && st.decodes > 0);
	ferry__cz_cache_destroy(c);
	free(x);
	free(y);
	ferry_cz_destroy(z);
}

/* A damaged frame: the loader's batch fails naming the shard and the chunk. */
static void damaged(const char *cz_path)
{
	uint64_t c1 = damage_chunk1(cz_path);
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, cz_path, &ds) == 0);
	const char *kv[] = {"batch_size", "16", "order", "shuffle", "epochs", "1", NULL};
	ferry_loader *l = make_loader(ds, kv);
	expect_damaged(l, c1);
	ferry_loader_destroy(l);
	ferry_dataset_destroy(ds);
}

int main(void)
{
	lcz_begin("test_loader_cz");
	char plain[600], cz[600], shard[700];
	snprintf(plain, sizeof(plain), "%s/plain", dir);
	make_plain(plain);
	const char *names[] = {"zstd", "lz4"};
	for (int k = 0; k < 2; k++) {
		snprintf(cz, sizeof(cz), "%s/%s", dir, names[k]);
		uint64_t chunks = make_cz(plain, cz, k ? FERRY_CZ_LZ4 : FERRY_CZ_ZSTD);
		loader_checks(cz, chunks);
		snprintf(shard, sizeof(shard), "%s/shard-00000.fsh", cz);
		cache_checks(shard);
		damaged(cz);
	}
	lcz_end();
	return t_result();
}
