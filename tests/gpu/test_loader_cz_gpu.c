/* The loader on a device over compressed shards decoded on the GPU (issue 26, the loader's
 * cz_decode knob): zstd (cz_decode=auto) and LZ4 (cz_decode=gpu; auto keeps LZ4 on the CPU) give
 * every sample's bytes, in the same order as the CPU's decoding (cz_decode=cpu), with chunks counted
 * in gpu_chunk_decodes, each chunk decoded about once an epoch under the chunk window; stored
 * (random) chunks among them are copied, not sent to nvCOMP; a resume mid-epoch, three pipeline
 * threads, the sequential order, and a cache far smaller than a batch's chunks (full shuffle,
 * 2 MiB) give the same bytes; a damaged chunk fails the batch naming the shard and chunk; a host
 * loader refuses cz_decode=gpu. Without nvCOMP, cz_decode=gpu must refuse (FERRY_EBACKEND) and the
 * test says skipped. Run over the fake driver and nvCOMP in CI (tests/unit/test_loader_cz_device.c). */
#include "unit/loader_cz_data.h"


/* A device loader: kv (up to 16 pairs) with device 0 and cz_decode. */
static ferry_loader *dev_loader(ferry_dataset *ds, const char *decode, const char *const *kv)
{
	const char *all[40];
	int n = 0;
	for (; kv && kv[0]; kv += 2)
		all[n++] = kv[0], all[n++] = kv[1];
	all[n++] = "device", all[n++] = "0", all[n++] = "cz_decode", all[n++] = decode;
	all[n] = NULL;
	return make_loader(ds, all);
}

/* 1 when nvCOMP decodes for the loader here, 0 when cz_decode=gpu is refused (FERRY_EBACKEND). */
static int nvcomp_here(ferry_dataset *ds)
{
	const char *kv[] = {"batch_size", "16", "epochs", "1", NULL};
	ferry_loader *l = dev_loader(ds, "gpu", kv);
	int r = ferry_loader_start(l);
	if (r)
		printf("cz_decode=gpu: %d: %s\n", r, ferry_last_error());
	ferry_loader_destroy(l);
	if (r == FERRY_EBACKEND && !getenv("FERRY_CZ_EXPECT_NVCOMP"))
		return 0;
	T_EQ_INT(r, 0);
	return 1;
}

/* A device loader over ds with kv, drained into b: every sample's bytes, in a's order. The
 * loader is returned for its metrics. */
static ferry_loader *same_order(ferry_dataset *ds, const char *decode, const char *const *kv, const int64_t *a, int64_t *b)
{
	ferry_loader *l = dev_loader(ds, decode, kv);
	T_EQ_INT(drain(l, b, 0), N);
	T_CHECK(!memcmp(a, b, N * 8));
	return l;
}

static void gpu_checks(const char *cz_path, uint64_t chunks, int codec, int stored)
{
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, cz_path, &ds) == 0);
	int64_t *a = malloc(N * 8), *b = malloc(N * 8);
	const char *gpu = codec == FERRY_CZ_ZSTD ? "auto" : "gpu";
	const char *win[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1", NULL};

	ferry_loader *l = dev_loader(ds, "cpu", win);
	uint64_t k = drain(l, a, 0);
	check_once(a, k);
	T_CHECK(metric(l, "gpu_chunk_decodes") == 0);
	ferry_loader_destroy(l);

	l = same_order(ds, gpu, win, a, b);
	double dec = metric(l, "chunk_decodes"), g = metric(l, "gpu_chunk_decodes"), nb = metric(l, "gpu_decode_batches");
	printf("%s, cz_decode=%s: %.0f chunk decodes, %.0f on the GPU in %.0f nvCOMP batches, for %llu chunks\n",
	       ferry_cz_codec_name(codec), gpu, dec, g, nb, (unsigned long long)chunks);
	T_CHECK(g > 0 && dec >= (double)chunks && dec <= 2.0 * (double)chunks);
	/* the look-ahead: a window's chunks go in one nvCOMP batch, by the batch that reaches it first
	 * (windows of 2 chunks here: at most about one batch for each) */
	T_CHECK(nb >= 1 && nb <= (double)chunks / 2 + 2);
	T_CHECK(stored ? dec > g : dec == g); /* stored chunks are copied, not sent to nvCOMP */
	ferry_loader_destroy(l);

	if (codec == FERRY_CZ_LZ4) { /* auto: LZ4 decodes on the CPU (faster there: cz_decode, CONFIG.md) */
		l = same_order(ds, "auto", win, a, b);
		T_CHECK(metric(l, "gpu_chunk_decodes") == 0 && metric(l, "chunk_decodes") > 0);
		ferry_loader_destroy(l);
	}

	/* a 4 MiB cache: the look-ahead (2 MiB of items) reaches a window or two at a time, so the
	 * chunks go in several nvCOMP batches, each chunk still about once */
	const char *small[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1",
			       "chunk_cache", "4m", NULL};
	l = same_order(ds, gpu, small, a, b);
	dec = metric(l, "chunk_decodes"), nb = metric(l, "gpu_decode_batches");
	printf("4 MiB cache: %.0f chunk decodes in %.0f nvCOMP batches\n", dec, nb);
	T_CHECK(nb >= 2 && dec >= (double)chunks && dec <= 2.0 * (double)chunks);
	ferry_loader_destroy(l);

	/* resume after 37 batches: exactly the rest */
	l = dev_loader(ds, gpu, win);
	T_EQ_INT(drain(l, b, 37), 37 * 16);
	char st[512];
	T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
	ferry_loader_destroy(l);
	l = dev_loader(ds, gpu, win);
	T_ASSERT(ferry_loader_set(l, "state", st) == 0);
	T_EQ_INT(37 * 16 + drain(l, b + 37 * 16, 0), N);
	T_CHECK(!memcmp(a, b, N * 8));
	ferry_loader_destroy(l);

	/* three pipeline threads, a device cache each */
	const char *thr[] = {"batch_size", "16", "order", "shuffle", "seed", "5", "chunk_window", "2", "epochs", "1",
			     "threads", "3", NULL};
	l = same_order(ds, gpu, thr, a, b);
	T_CHECK(metric(l, "gpu_chunk_decodes") > 0);
	ferry_loader_destroy(l);

	/* the full shuffle with a 2 MiB cache: batches of 3 samples may need more chunks than it holds
	 * (it grows for the batch) and evict between batches */
	const char *full[] = {"batch_size", "3", "order", "shuffle", "seed", "9", "chunk_window", "0", "epochs", "1",
			      "chunk_cache", "2m", NULL};
	l = dev_loader(ds, gpu, full);
	check_once(b, drain(l, b, 0));
	dec = metric(l, "chunk_decodes");
	printf("full shuffle, 2 MiB cache: %.0f chunk decodes for %llu chunks\n", dec, (unsigned long long)chunks);
	T_CHECK(dec > 4.0 * (double)chunks);
	ferry_loader_destroy(l);

	/* sequential */
	const char *seq[] = {"batch_size", "16", "epochs", "1", NULL};
	l = dev_loader(ds, gpu, seq);
	k = drain(l, a, 0);
	T_EQ_INT(k, N);
	for (uint64_t i = 0; i < k; i++)
		T_EQ_INT(a[i], (int64_t)i);
	dec = metric(l, "chunk_decodes");
	printf("sequential: %.0f chunk decodes for %llu chunks\n", dec, (unsigned long long)chunks);
	T_CHECK(dec >= (double)chunks && dec <= 2.0 * (double)chunks);
	ferry_loader_destroy(l);

	/* a host loader refuses cz_decode=gpu */
	const char *host[] = {"batch_size", "16", "epochs", "1", "cz_decode", "gpu", NULL};
	l = make_loader(ds, host);
	T_EQ_INT(ferry_loader_start(l), FERRY_EBADOPT);
	ferry_loader_destroy(l);
	free(a);
	free(b);
	ferry_dataset_destroy(ds);
}

/* A damaged frame: checked before nvCOMP sees it, the batch fails naming the shard and chunk. */
static void damaged(const char *cz_path, int codec)
{
	uint64_t c1 = damage_chunk1(cz_path);
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, cz_path, &ds) == 0);
	const char *kv[] = {"batch_size", "16", "order", "shuffle", "epochs", "1", NULL};
	ferry_loader *l = dev_loader(ds, codec == FERRY_CZ_ZSTD ? "auto" : "gpu", kv);
	expect_damaged(l, c1);
	ferry_loader_destroy(l);
	ferry_dataset_destroy(ds);
}

int main(void)
{
	char why[256];
	if (!ferry_gpu_available(why, sizeof(why)))
		T_SKIP("no GPU: %s", why);
	lcz_begin("test_loader_cz_gpu");
	char plain[600], cz[600];
	int have = -1;
	for (int noise = 0; noise < 2; noise++) {
		lcz_noise = noise;
		snprintf(plain, sizeof(plain), "%s/plain%d", dir, noise);
		make_plain(plain);
		for (int codec = FERRY_CZ_LZ4; codec <= FERRY_CZ_ZSTD; codec++) {
			snprintf(cz, sizeof(cz), "%s/%s%d", dir, ferry_cz_codec_name(codec), noise);
			uint64_t chunks = make_cz(plain, cz, codec);
			if (have < 0) {
				ferry_dataset *ds;
				T_ASSERT(ferry_dataset_open(ctx, cz, &ds) == 0);
				have = nvcomp_here(ds);
				ferry_dataset_destroy(ds);
			}
			if (!have)
				break;
			gpu_checks(cz, chunks, codec, noise);
			if (!noise)
				damaged(cz, codec);
		}
	}
	lcz_end();
	if (!have && !t_failures)
		T_SKIP("nvCOMP cannot decode here (cz_decode=gpu refused, as it must)");
	return t_result();
}
