/* The loader on host memory: batches hold the right bytes, every sample once per epoch across
 * ranks (one process and forked processes), resume equals an uninterrupted run, token windows,
 * merged reads, truncated shards named, held-batch limit. */
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>

#include "ferry_test.h"
#include "ferry/data.h"
#include "loader_test.h"

static ferry_ctx *ctx;
static char dir[512], path[600];
static uint64_t N = 997;
static uint8_t *stream; /* all samples concatenated */
static uint64_t *soff;

static size_t slen(uint64_t i) { return 2 * (1 + (i * 53) % 200); }

/* cachestat(2) (Linux 6.5) answers here: the loader's inline reads depend on it. */
static int cachestat_works(const char *file)
{
	struct {
		uint64_t off, len;
	} r = {0, 4096};
	uint64_t cs[5];
	int fd = open(file, O_RDONLY);
	long rc = fd >= 0 ? syscall(451, fd, &r, cs, 0) : -1;
	if (fd >= 0)
		close(fd);
	return rc == 0;
}

static void fill(uint8_t *p, uint64_t n) { t_fill_pattern(p, n, 0, 7); }

static void make_dataset(void)
{
	T_ASSERT(write_samples(ctx, path, 32768, N, slen, fill, &stream, &soff) > 3);
}

/* Runs up to max batches (0: all), checking each batch's bytes; appends indices to out. */
static uint64_t drain(ferry_loader *l, uint64_t seq_len, int64_t *out, uint64_t max, uint64_t *nbatches)
{
	uint64_t k = 0, b = 0;
	ferry_loader_batch *bt;
	int r;
	while ((!max || b < max) && (r = ferry_loader_next(l, &bt)) == 1) {
		const uint8_t *d = ferry_loader_batch_data(bt);
		const uint64_t *o = ferry_loader_batch_offsets(bt);
		const int64_t *ix = ferry_loader_batch_indices(bt);
		for (uint32_t s = 0; s < ferry_loader_batch_samples(bt); s++) {
			const uint8_t *want = seq_len ? stream + (uint64_t)ix[s] * seq_len * 2 : stream + soff[ix[s]];
			size_t len = seq_len ? seq_len * 2 : slen((uint64_t)ix[s]);
			if (o[s + 1] - o[s] != len || memcmp(d + o[s], want, len)) {
				fprintf(stderr, "batch %llu sample %u (index %lld): wrong bytes\n",
					(unsigned long long)b, s, (long long)ix[s]);
				t_failures++;
			}
			out[k++] = ix[s];
		}
		T_EQ_INT(o[ferry_loader_batch_samples(bt)], ferry_loader_batch_bytes(bt));
		ferry_loader_batch_destroy(bt);
		b++;
	}
	if (!max)
		T_EQ_INT(r, 0);
	if (nbatches)
		*nbatches = b;
	return k;
}

static void check_epoch_cover(ferry_dataset *ds, const char *order, uint32_t W, int drop_last)
{
	uint64_t per = ferry_distributed_num_samples(N, W, drop_last);
	int64_t *all = malloc(per * W * 8);
	int64_t *want = malloc(N * 8);
	char ws[16], rs[16], dl[4];
	snprintf(ws, sizeof(ws), "%u", W);
	snprintf(dl, sizeof(dl), "%d", drop_last);
	for (uint32_t r = 0; r < W; r++) {
		snprintf(rs, sizeof(rs), "%u", r);
		const char *kv[] = {"batch_size", "16", "world_size", ws, "rank", rs, "order", order, "seed", "5",
				    "epoch", "2", "epochs", "1", "threads", "2", "prefetch", "3", "drop_last", dl,
				    "block", "10", NULL};
		ferry_loader *l = make_loader(ds, kv);
		T_EQ_INT(ferry_loader_samples_per_epoch(l), per);
		uint64_t k = drain(l, 0, all + r * per, 0, NULL);
		T_EQ_INT(k, per);
		if (!strcmp(order, "shuffle")) {
			T_EQ_INT(ferry_distributed_indices(N, W, r, 1, 5, 2, drop_last, want, N), per);
			T_CHECK(memcmp(want, all + r * per, per * 8) == 0);
		}
		ferry_loader_destroy(l);
	}
	/* every sample once, plus the padding DistributedSampler adds (the order's first ones) */
	uint32_t *seen = calloc(N, 4);
	for (uint64_t i = 0; i < per * W; i++)
		seen[all[i]]++;
	uint64_t once = 0, twice = 0, none = 0;
	for (uint64_t i = 0; i < N; i++)
		once += seen[i] == 1, twice += seen[i] == 2, none += seen[i] == 0;
	if (drop_last) {
		T_EQ_INT(once, per * W);
		T_EQ_INT(none, N - per * W);
	} else {
		T_EQ_INT(twice, per * W - N);
		T_EQ_INT(once + twice, N);
	}
	free(seen);
	free(all);
	free(want);
}

/* One rank of 4 in its own process: its indices, binary, to stdout. */
static int rank_main(const char *rank, const char *ds_path)
{
	ferry_dataset *d2;
	if (ferry_ctx_create(&ctx) || ferry_dataset_open(ctx, ds_path, &d2))
		return 1;
	N = ferry_dataset_count(d2);
	const char *kv[] = {"batch_size", "8", "world_size", "4", "rank", rank, "order", "shuffle",
			    "seed", "9", "epochs", "1", NULL};
	ferry_loader *l = make_loader(d2, kv);
	uint64_t per = ferry_loader_samples_per_epoch(l);
	int64_t *ix = malloc(per * 8);
	ferry_loader_batch *b;
	uint64_t k = 0;
	while (ferry_loader_next(l, &b) == 1) {
		memcpy(ix + k, ferry_loader_batch_indices(b), ferry_loader_batch_samples(b) * 8);
		k += ferry_loader_batch_samples(b);
		ferry_loader_batch_destroy(b);
	}
	ssize_t wr = write(1, ix, k * 8);
	ferry_loader_destroy(l);
	ferry_dataset_destroy(d2);
	ferry_ctx_destroy(ctx);
	free(ix);
	return wr == (ssize_t)(per * 8) && k == per ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--rank"))
		return rank_main(argv[2], argv[3]);
	char self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	T_ASSERT(sl > 0);
	self[sl] = 0;
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(dir, sizeof(dir), "%s/test_loader.%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
	snprintf(path, sizeof(path), "%s/ds", dir);
	make_dataset();
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, path, &ds) == 0);

	const char *orders[] = {"sequential", "shuffle", "block"};
	uint32_t worlds[] = {1, 3, 8};
	for (int o = 0; o < 3; o++)
		for (int wi = 0; wi < 3; wi++)
			for (int dl = 0; dl < 2; dl++)
				check_epoch_cover(ds, orders[o], worlds[wi], dl);

	/* ranks in separate processes (this program run again with --rank, so no threads cross a
	 * fork): each writes its indices to a pipe */
	{
		uint32_t W = 4;
		uint64_t per = ferry_distributed_num_samples(N, W, 0);
		int fds[4][2];
		for (uint32_t r = 0; r < W; r++) {
			T_ASSERT(pipe(fds[r]) == 0);
			pid_t pid = fork();
			T_ASSERT(pid >= 0);
			if (pid == 0) {
				char rs[8];
				snprintf(rs, sizeof(rs), "%u", r);
				dup2(fds[r][1], 1);
				execl(self, self, "--rank", rs, path, (char *)NULL);
				_exit(127);
			}
			close(fds[r][1]);
		}
		int64_t *all = malloc(per * W * 8);
		for (uint32_t r = 0; r < W; r++) {
			size_t got = 0;
			ssize_t n;
			while ((n = read(fds[r][0], (char *)(all + r * per) + got, per * 8 - got)) > 0)
				got += (size_t)n;
			T_EQ_INT(got, per * 8);
			close(fds[r][0]);
		}
		for (uint32_t r = 0; r < W; r++) {
			int st;
			wait(&st);
			T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		}
		uint8_t *seen = calloc(N, 1);
		for (uint64_t i = 0; i < per * W; i++)
			seen[all[i]]++;
		uint64_t covered = 0;
		for (uint64_t i = 0; i < N; i++)
			covered += seen[i] > 0;
		T_EQ_INT(covered, N);
		free(seen);
		free(all);
	}

	/* resume: K batches, state, a new loader from there equals the uninterrupted run (across an
	 * epoch boundary, token windows too) */
	for (int tokens = 0; tokens < 2; tokens++) {
		const char *kv[] = {"batch_size", "7", "world_size", "2", "rank", "1", "order", "shuffle", "seed", "3",
				    "epochs", "3", "seq_len", tokens ? "33" : "0", "prefetch", "2", NULL};
		ferry_loader *l = make_loader(ds, kv);
		uint64_t bpe = ferry_loader_batches_per_epoch(l);
		uint64_t total = 3 * bpe * 7;
		int64_t *full = malloc(total * 8), *part = malloc(total * 8);
		uint64_t nfull = drain(l, tokens ? 33 : 0, full, 0, NULL);
		ferry_loader_destroy(l);
		uint64_t cut = bpe + 3;
		l = make_loader(ds, kv);
		uint64_t k = drain(l, tokens ? 33 : 0, part, cut, NULL);
		char st[512];
		T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
		T_CHECK(strstr(st, "epoch=1 batch=3") != NULL);
		ferry_loader_destroy(l);
		l = make_loader(ds, kv);
		T_ASSERT(ferry_loader_set(l, "state", st) == 0);
		k += drain(l, tokens ? 33 : 0, part + k, 0, NULL);
		ferry_loader_destroy(l);
		T_EQ_INT(k, nfull);
		T_CHECK(memcmp(full, part, k * 8) == 0);
		/* a state from another configuration is refused, naming the field */
		const char *kv2[] = {"batch_size", "7", "world_size", "2", "rank", "1", "order", "shuffle",
				     "seed", "4", "seq_len", tokens ? "33" : "0", NULL};
		l = make_loader(ds, kv2);
		T_EQ_INT(ferry_loader_set(l, "state", st), FERRY_EBADOPT);
		T_CHECK(strstr(ferry_last_error(), "seed was 3") != NULL);
		ferry_loader_destroy(l);
		free(full);
		free(part);
	}

	/* token windows, sequential, one rank: windows are consecutive, reads merge */
	{
		const char *kv[] = {"batch_size", "8", "seq_len", "64", "epochs", "1", "merge_gap", "0", NULL};
		ferry_loader *l = make_loader(ds, kv);
		uint64_t items = ferry_loader_samples_per_epoch(l);
		T_EQ_INT(items, soff[N] / 2 / 64);
		int64_t *ix = malloc(items * 8);
		T_EQ_INT(drain(l, 64, ix, 0, NULL), items);
		for (uint64_t i = 0; i < items; i++)
			T_EQ_INT(ix[i], i);
		T_CHECK(metric(l, "reads") < metric(l, "samples"));
		T_EQ_INT(metric(l, "steps"), (items + 7) / 8);
		T_CHECK(metric(l, "wait_p99_ns") >= metric(l, "wait_p50_ns"));
		T_CHECK(metric(l, "bytes") == (double)(items * 128));
		T_EQ_INT(ferry_loader_metric(l, "no_such_metric", &(double){0}), FERRY_EBADOPT);
		T_CHECK(strstr(ferry_last_error(), "\"no_such_metric\"") != NULL);
		ferry_loader_destroy(l);
		free(ix);
	}
	/* block order with a merge gap: neighbours out of batch order are staged and scattered */
	{
		const char *kv[] = {"batch_size", "32", "order", "block", "block", "32", "epochs", "1",
				    "merge_gap", "4096", NULL};
		ferry_loader *l = make_loader(ds, kv);
		int64_t *ix = malloc(N * 8);
		T_EQ_INT(drain(l, 0, ix, 0, NULL), N);
		T_CHECK(metric(l, "merged") > 0);
		ferry_loader_destroy(l);
		free(ix);
	}

	/* resident data is read by the pipeline thread itself (inline_cached=1, the default): copied
	 * from a mapping of the shard (mapped=1, the default, inl 2) or with pread (mapped=0, inl 1);
	 * with inline_cached=0 every read goes through the engine. All give the same bytes (drain
	 * checks each sample), on the in-place path (sequential windows) and the staged one (block
	 * order, merge gap). */
	for (int inl = 0; inl < 3; inl++) {
		const char *kvs[2][18] = {
			{"batch_size", "8", "seq_len", "64", "epochs", "1", "inline_cached", inl ? "1" : "0",
			 "mapped", inl == 2 ? "1" : "0", NULL},
			{"batch_size", "32", "order", "block", "block", "32", "epochs", "1", "merge_gap", "4096",
			 "inline_cached", inl ? "1" : "0", "mapped", inl == 2 ? "1" : "0", NULL},
		};
		for (int c = 0; c < 2; c++) {
			ferry_loader *l = make_loader(ds, kvs[c]);
			uint64_t items = ferry_loader_samples_per_epoch(l);
			int64_t *ix = malloc(items * 8);
			T_EQ_INT(drain(l, c ? 0 : 64, ix, 0, NULL), items);
			double il = metric(l, "inline_reads"), reads = metric(l, "reads");
			double mapped = metric(l, "mapped_reads");
			if (!inl)
				T_EQ_INT(il, 0);
			if (inl < 2)
				T_EQ_INT(mapped, 0);
			if (inl && cachestat_works(self)) {
				T_EQ_INT(il, reads); /* the dataset was just written: all of it is cached */
				if (inl == 2)
					T_EQ_INT(mapped, reads);
			} else if (inl)
				printf("inline reads not checked: cachestat(2) is missing here\n");
			ferry_loader_destroy(l);
			free(ix);
		}
	}
	/* documents=1: position_ids restart at each row and each sample (a ferry dataset's documents);
	 * cu_seqlens are those starts, checked against a reference from the samples' offsets. Windows
	 * (shuffled, two ranks) and whole samples; off, both are NULL. */
	for (int tokens = 0; tokens < 2; tokens++) {
		const uint64_t L = 97;
		const char *kv[] = {"batch_size", "5", "world_size", "2", "rank", "1", "seed", "9", "epochs", "1",
				    "seq_len", tokens ? "97" : "0", "documents", "1", NULL};
		ferry_loader *l = make_loader(ds, kv);
		ferry_loader_batch *b;
		uint64_t batches = 0, checked = 0;
		int32_t *want = malloc((5 * 200 + 8) * sizeof(int32_t) * 4);
		while (ferry_loader_next(l, &b) == 1) {
			const int64_t *pos = ferry_loader_batch_position_ids(b);
			const int64_t *ix = ferry_loader_batch_indices(b);
			const uint64_t *o = ferry_loader_batch_offsets(b);
			uint32_t n = ferry_loader_batch_samples(b), ncu = 0, maxlen = 0, nwant = 0, wmax = 0;
			const int32_t *cu = ferry_loader_batch_cu_seqlens(b, &ncu, &maxlen);
			T_ASSERT(pos && cu);
			/* both lie in the batch's memory, where ferry_loader_documents_layout says */
			size_t po = 0, co = 0;
			T_EQ_INT(ferry_loader_documents_layout(l, &po, &co), 0);
			T_CHECK((const uint8_t *)pos == (const uint8_t *)ferry_loader_batch_data(b) + po &&
				(const uint8_t *)cu == (const uint8_t *)ferry_loader_batch_data(b) + co);
			uint64_t elems = o[n] / 2;
			for (uint32_t r = 0; r < n; r++) {
				uint64_t e0 = o[r] / 2, e1 = o[r + 1] / 2;
				uint64_t g0 = tokens ? (uint64_t)ix[r] * L : soff[ix[r]] / 2; /* in the whole stream */
				want[nwant++] = (int32_t)e0;
				uint64_t seg = e0;
				for (uint64_t e = e0; e < e1; e++) {
					uint64_t g = g0 + (e - e0);
					/* does a sample start at stream element g? (binary search of soff) */
					uint64_t lo = 0, hi = N;
					while (hi - lo > 1) {
						uint64_t mid = (lo + hi) / 2;
						if (soff[mid] / 2 <= g)
							lo = mid;
						else
							hi = mid;
					}
					if (e != e0 && soff[lo] / 2 == g) {
						want[nwant++] = (int32_t)e;
						seg = e;
					}
					if (pos[e] != (int64_t)(e - seg)) {
						fprintf(stderr, "batch %llu element %llu: position %lld, want %llu\n",
							(unsigned long long)batches, (unsigned long long)e, (long long)pos[e],
							(unsigned long long)(e - seg));
						t_failures++;
						break;
					}
					checked++;
				}
			}
			want[nwant++] = (int32_t)elems;
			for (uint32_t k = 1; k < nwant; k++)
				wmax = (uint32_t)(want[k] - want[k - 1]) > wmax ? (uint32_t)(want[k] - want[k - 1]) : wmax;
			T_EQ_INT(ncu, nwant);
			T_CHECK(ncu == nwant && memcmp(cu, want, nwant * sizeof(int32_t)) == 0);
			T_EQ_INT(maxlen, wmax);
			ferry_loader_batch_destroy(b);
			batches++;
		}
		T_EQ_INT(batches, ferry_loader_batches_per_epoch(l));
		T_CHECK(checked > 0);
		free(want);
		ferry_loader_destroy(l);
		const char *off[] = {"batch_size", "5", "seq_len", tokens ? "97" : "0", NULL};
		l = make_loader(ds, off);
		T_EQ_INT(ferry_loader_next(l, &b), 1);
		uint32_t ncu = 7;
		T_CHECK(ferry_loader_batch_position_ids(b) == NULL &&
			ferry_loader_batch_cu_seqlens(b, &ncu, NULL) == NULL && ncu == 0);
		T_EQ_INT(ferry_loader_documents_layout(l, NULL, NULL), -EINVAL);
		ferry_loader_batch_destroy(b);
		ferry_loader_destroy(l);
	}
	/* a state names its world size; at another world size it resumes only where that is exact
	 * (the samples taken so far are whole steps there), else it is refused saying both */
	{
		const char *kv[] = {"batch_size", "7", "world_size", "2", "rank", "1", NULL};
		ferry_loader *l = make_loader(ds, kv);
		char st[512];
		T_EQ_INT(drain(l, 0, (int64_t[32]){0}, 3, NULL), 21);
		T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
		T_CHECK(strstr(st, " world_size=2 rank=1 ") && strstr(st, " dataset_bytes="));
		ferry_loader_destroy(l);
		const char *kv4[] = {"batch_size", "7", "world_size", "4", "rank", "1", NULL};
		l = make_loader(ds, kv4);
		T_EQ_INT(ferry_loader_set(l, "state", st), FERRY_EBADOPT); /* 42 samples, steps of 28 */
		T_CHECK(strstr(ferry_last_error(), "rank 1 of world_size 2") &&
			strstr(ferry_last_error(), "rank 1 of world_size 4"));
		ferry_loader_destroy(l);
		/* another rank at the same world size is refused */
		const char *kv0[] = {"batch_size", "7", "world_size", "2", "rank", "0", NULL};
		l = make_loader(ds, kv0);
		T_EQ_INT(ferry_loader_set(l, "state", st), FERRY_EBADOPT);
		ferry_loader_destroy(l);
		/* another dataset of as many samples (dataset_bytes differs) is refused too */
		char other[600];
		snprintf(other, sizeof(other), "%s", st);
		char *db = strstr(other, "dataset_bytes=");
		T_ASSERT(db);
		snprintf(db, sizeof(other) - (size_t)(db - other), "dataset_bytes=12");
		l = make_loader(ds, kv);
		T_EQ_INT(ferry_loader_set(l, "state", other), FERRY_EBADOPT);
		T_CHECK(strstr(ferry_last_error(), "another dataset") != NULL);
		/* a line from before dataset_bytes existed is still accepted */
		*strstr(other, " dataset_bytes=") = 0;
		T_EQ_INT(ferry_loader_set(l, "state", other), 0);
		ferry_loader_destroy(l);
	}
	/* the exact remap: 2 ranks take 4 batches of 7 (56 samples), 4 ranks resume from one of their
	 * states at batch 2 of theirs; together every sample of the epoch is seen once, plus only the
	 * 4-rank order's padding (1000 - 997 = 3 repeats) */
	{
		uint64_t *seen = calloc(N, sizeof(uint64_t)), total = 0;
		int64_t *ix = malloc(N * 8 * 2);
		char st[512];
		for (int r = 0; r < 2; r++) {
			const char *kv[] = {"batch_size", "7", "world_size", "2", "rank", r ? "1" : "0", "seed", "5",
					    "epochs", "1", NULL};
			ferry_loader *l = make_loader(ds, kv);
			uint64_t k = drain(l, 0, ix, 4, NULL);
			T_EQ_INT(k, 28);
			for (uint64_t i = 0; i < k; i++)
				seen[ix[i]]++, total++;
			T_ASSERT(ferry_loader_state(l, st, sizeof(st)) > 0);
			ferry_loader_destroy(l);
		}
		for (int r = 0; r < 4; r++) {
			char rs[4];
			snprintf(rs, sizeof(rs), "%d", r);
			const char *kv[] = {"batch_size", "7", "world_size", "4", "rank", rs, "seed", "5", "epochs", "1", NULL};
			ferry_loader *l = make_loader(ds, kv);
			T_ASSERT(ferry_loader_set(l, "state", st) == 0);
			char now[512];
			T_ASSERT(ferry_loader_state(l, now, sizeof(now)) > 0);
			T_CHECK(strstr(now, " epoch=0 batch=2 ") != NULL);
			uint64_t k = drain(l, 0, ix, 0, NULL);
			T_EQ_INT(k, 250 - 14);
			for (uint64_t i = 0; i < k; i++)
				seen[ix[i]]++, total++;
			ferry_loader_destroy(l);
		}
		uint64_t once = 0, twice = 0;
		for (uint64_t i = 0; i < N; i++)
			once += seen[i] == 1, twice += seen[i] == 2;
		T_EQ_INT(total, 1000);
		T_EQ_INT(once + twice, N);
		T_EQ_INT(twice, 3);
		free(seen);
		free(ix);
	}
	/* held batches are bounded by prefetch */
	{
		const char *kv[] = {"batch_size", "4", "prefetch", "2", NULL};
		ferry_loader *l = make_loader(ds, kv);
		ferry_loader_batch *a, *b, *c;
		T_EQ_INT(ferry_loader_next(l, &a), 1);
		T_EQ_INT(ferry_loader_next(l, &b), 1);
		T_EQ_INT(ferry_loader_next(l, &c), 1); /* prefetch + threads slots */
		ferry_loader_batch *d;
		T_EQ_INT(ferry_loader_next(l, &d), FERRY_EBUSY);
		ferry_loader_batch_destroy(a);
		T_EQ_INT(ferry_loader_next(l, &d), 1);
		T_EQ_INT(ferry_loader_batch_step(d), 3);
		ferry_loader_destroy(l); /* with batches held */
	}
	/* bad knobs */
	{
		ferry_loader *l = make_loader(ds, NULL);
		T_EQ_INT(ferry_loader_set(l, "order", "random"), FERRY_EBADOPT);
		T_EQ_INT(ferry_loader_set(l, "batch_size", "0"), FERRY_EBADOPT);
		T_EQ_INT(ferry_loader_set(l, "nope", "1"), FERRY_EBADOPT);
		T_EQ_INT(ferry_loader_set(l, "rank", "3"), 0);
		ferry_loader_batch *b;
		T_EQ_INT(ferry_loader_next(l, &b), FERRY_EBADOPT); /* rank >= world_size */
		ferry_loader_destroy(l);
	}

	/*
	 * A shard cut short while the loader copies it out of its mapping (mapped=1): the copy that
	 * touches a page past the new end raises SIGBUS, which the loader's guard turns into a read
	 * of the batch with pread, and the batch fails naming the shard; the process lives on. Epoch
	 * 0 is read whole first, so every shard is mapped at its full size.
	 */
	char shard2[700];
	snprintf(shard2, sizeof(shard2), "%s/shard-00002.fsh", path);
	if (cachestat_works(shard2)) {
		const char *shard = shard2;
		struct stat st;
		T_ASSERT(stat(shard, &st) == 0);
		const char *kv[] = {"batch_size", "50", "epochs", "2", "order", "sequential", "prefetch", "1", NULL};
		ferry_loader *l = make_loader(ds, kv);
		ferry_loader_batch *b;
		int r = 0;
		uint64_t bpe = ferry_loader_batches_per_epoch(l);
		for (uint64_t i = 0; i < bpe && (r = ferry_loader_next(l, &b)) == 1; i++)
			ferry_loader_batch_destroy(b);
		T_EQ_INT(r, 1);
		double mapped = metric(l, "mapped_reads");
		T_CHECK(mapped > 0);
		T_ASSERT(truncate(shard, st.st_size / 2 + 1) == 0);
		while ((r = ferry_loader_next(l, &b)) == 1)
			ferry_loader_batch_destroy(b);
		T_EQ_INT(r, FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "shard-00002.fsh") != NULL);
		T_CHECK(metric(l, "mapped_faults") >= 1);
		if (t_failures)
			fprintf(stderr, "detail: %s (mapped_reads %.0f)\n", ferry_last_error(), mapped);
		ferry_loader_destroy(l);
	} else {
		printf("skipped: the mapped-shard truncation case (cachestat(2) does not answer here)\n");
	}

	/* a shard truncated after open: the batch that needs it fails, naming shard and sample */
	{
		char shard[700];
		snprintf(shard, sizeof(shard), "%s/shard-00002.fsh", path);
		T_ASSERT(truncate(shard, 100) == 0);
		const char *kv[] = {"batch_size", "50", "epochs", "1", NULL};
		ferry_loader *l = make_loader(ds, kv);
		int64_t *ix = malloc(N * 8);
		ferry_loader_batch *b;
		int r;
		while ((r = ferry_loader_next(l, &b)) == 1)
			ferry_loader_batch_destroy(b);
		T_EQ_INT(r, FERRY_ECORRUPT);
		T_CHECK(strstr(ferry_last_error(), "shard-00002.fsh") && strstr(ferry_last_error(), "sample "));
		if (t_failures)
			fprintf(stderr, "detail: %s\n", ferry_last_error());
		ferry_loader_destroy(l);
		free(ix);
	}

	ferry_dataset_destroy(ds);
	ferry_ctx_destroy(ctx);
	free(stream);
	free(soff);
	if (!t_failures && t_rmtree(dir))
		fprintf(stderr, "could not remove %s\n", dir);
	return t_result();
}
