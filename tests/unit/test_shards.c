/* Ferry shards and Megatron .bin/.idx: write, read back, keys, checksums, corrupt indexes and
 * truncated shards rejected with the shard and the sample named. */
#include <fcntl.h>

#include "ferry_test.h"
#include "base/crc32c.h"
#include "ferry/data.h"
#include "format/shards.h"

static ferry_ctx *ctx;
static char dir[512];

static size_t sample_len(uint64_t i) { return 2 * (1 + (i * 37) % 300); }

static void sample_fill(uint64_t i, uint8_t *b, size_t len)
{
	for (size_t k = 0; k < len; k++)
		b[k] = (uint8_t)(i * 131 + k * 7);
}

static int write_ds(const char *path, int kind, uint64_t n, uint64_t shard_size, int keys)
{
	ferry_dataset_writer *w;
	int err = ferry_dataset_writer_create(ctx, path, kind, FERRY_DT_U16, shard_size, &w);
	if (err)
		return err;
	for (uint64_t i = 0; i < n; i++) {
		char key[32];
		int kl = snprintf(key, sizeof(key), "doc-%llu", (unsigned long long)i);
		T_ASSERT(ferry_dataset_writer_add(w, sample_len(i), keys ? key : NULL, keys ? (size_t)kl : 0, 1) ==
			 (int64_t)i);
	}
	T_ASSERT(ferry_dataset_writer_layout(w) >= (n ? 1 : 0));
	uint8_t buf[1024];
	for (uint64_t i = n; i-- > 0;) { /* any order */
		sample_fill(i, buf, sample_len(i));
		T_ASSERT(ferry_dataset_writer_put(w, i, buf, sample_len(i)) == 0);
	}
	err = ferry_dataset_writer_finish(w);
	ferry_dataset_writer_destroy(w);
	return err;
}

static void check_read(const char *path, uint64_t n, const char *format, int keys)
{
	ferry_dataset *ds;
	int err = ferry_dataset_open(ctx, path, &ds);
	if (err)
		fprintf(stderr, "open %s: %s\n", path, ferry_last_error());
	T_ASSERT(err == 0);
	T_EQ_INT(ferry_dataset_count(ds), n);
	T_EQ_STR(ferry_dataset_format(ds), format);
	T_EQ_INT(ferry_dataset_dtype(ds), FERRY_DT_U16);
	uint8_t buf[1024], want[1024];
	for (uint64_t i = 0; i < n; i++) {
		ssize_t r = ferry_dataset_read(ds, i, buf, sizeof(buf));
		T_EQ_INT(r, sample_len(i));
		sample_fill(i, want, sample_len(i));
		T_CHECK(memcmp(buf, want, sample_len(i)) == 0);
		/* locate + shard_path give the same bytes straight from the file */
		uint32_t shard;
		uint64_t off;
		T_EQ_INT(ferry_dataset_locate(ds, i, &shard, &off), 0);
		T_ASSERT(shard < ferry_dataset_shards(ds));
		FILE *fp = fopen(ferry_dataset_shard_path(ds, shard), "rb");
		T_ASSERT(fp != NULL);
		T_CHECK(fseek(fp, (long)off, SEEK_SET) == 0);
		T_EQ_INT(fread(buf, 1, sample_len(i), fp), sample_len(i));
		fclose(fp);
		T_CHECK(memcmp(buf, want, sample_len(i)) == 0);
		size_t kl;
		const char *k = ferry_dataset_key(ds, i, &kl);
		if (keys) {
			char key[32];
			snprintf(key, sizeof(key), "doc-%llu", (unsigned long long)i);
			T_CHECK(k && kl == strlen(key) && !memcmp(k, key, kl));
		} else {
			T_CHECK(!k && !kl);
		}
	}
	T_EQ_INT(ferry_dataset_locate(ds, n, NULL, NULL), -EINVAL);
	T_CHECK(ferry_dataset_shard_path(ds, ferry_dataset_shards(ds)) == NULL);
	T_EQ_INT(ferry_dataset_verify(ds), 0);
	ferry_dataset_destroy(ds);
}

static void expect_corrupt(const char *path, const char *must1, const char *must2)
{
	ferry_dataset *ds = NULL;
	int err = ferry_dataset_open(ctx, path, &ds);
	if (!err) { /* a shard cut inside the data may only show when the sample is read */
		uint8_t buf[1024];
		for (uint64_t i = 0; i < ferry_dataset_count(ds) && !err; i++) {
			ssize_t r = ferry_dataset_read(ds, i, buf, sizeof(buf));
			err = r < 0 ? (int)r : 0;
		}
		ferry_dataset_destroy(ds);
	}
	T_EQ_INT(err, FERRY_ECORRUPT);
	const char *msg = ferry_last_error();
	if (must1 && !strstr(msg, must1))
		fprintf(stderr, "detail '%s' lacks '%s'\n", msg, must1), t_failures++;
	if (must2 && !strstr(msg, must2))
		fprintf(stderr, "detail '%s' lacks '%s'\n", msg, must2), t_failures++;
}

static void flip_byte(const char *path, long off)
{
	FILE *f = fopen(path, "r+b");
	T_ASSERT(f);
	fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
	int c = fgetc(f);
	fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
	fputc(c ^ 0x5a, f);
	fclose(f);
}

static void copy_file(const char *from, const char *to)
{
	uint8_t *b;
	size_t n;
	T_ASSERT(ferry__read_whole(from, &b, &n) == 0);
	FILE *f = fopen(to, "wb");
	T_ASSERT(f && fwrite(b, 1, n, f) == n);
	fclose(f);
	free(b);
}

int main(void)
{
	T_ASSERT(ferry_ctx_create(&ctx) == 0);
	snprintf(dir, sizeof(dir), "%s/test_shards.%d", t_tmpdir(), (int)getpid());
	T_ASSERT(mkdir(dir, 0755) == 0);
	char p[600], q[700];

	/* dtype names: NumPy's for samples, in any case; safetensors' exactly */
	enum ferry_dtype dt = FERRY_DT_INVALID;
	T_EQ_INT(ferry_dtype_from_numpy_name("uint16", &dt), 0);
	T_EQ_INT(dt, FERRY_DT_U16);
	T_EQ_INT(ferry_dtype_from_numpy_name("i4", &dt), 0);
	T_EQ_INT(dt, FERRY_DT_I32);
	T_EQ_INT(ferry_dtype_from_numpy_name("Bytes", &dt), 0);
	T_EQ_INT(dt, FERRY_DT_BYTES);
	T_EQ_INT(ferry_dtype_bits(FERRY_DT_F64), 64);
	T_EQ_INT(ferry_dtype_from_numpy_name("complex", &dt), FERRY_EBADOPT);
	T_EQ_INT(ferry_dtype_from_name("uint16", &dt), FERRY_EBADOPT);
	T_EQ_STR(ferry_dtype_numpy_name(FERRY_DT_U16), "uint16");
	T_CHECK(ferry_dtype_numpy_name(FERRY_DT_BF16) == NULL && ferry_dtype_name(FERRY_DT__COUNT) == NULL);
	ferry_dataset_writer *bw;
	T_EQ_INT(ferry_dataset_writer_create(ctx, dir, FERRY_WRITE_FERRY, FERRY_DT_BF16, 0, &bw), FERRY_EBADOPT);
	/* CRC-32C check value */
	T_EQ_INT(ferry__crc32c(0, "123456789", 9), 0xe3069283u);

	/* ferry shards: several shards, keys, and the empty dataset */
	snprintf(p, sizeof(p), "%s/ds", dir);
	T_ASSERT(write_ds(p, FERRY_WRITE_FERRY, 500, 16384, 1) == 0);
	check_read(p, 500, "ferry", 1);
	snprintf(q, sizeof(q), "%s/ferry.idx", p);
	check_read(q, 500, "ferry", 1);
	/* the index stores Megatron's dtype code (8: uint16), not the enum's number */
	uint8_t code[4];
	int fd = open(q, O_RDONLY);
	T_ASSERT(fd >= 0 && pread(fd, code, 4, 16) == 4);
	close(fd);
	T_EQ_INT(code[0] | code[1] << 8 | code[2] << 16 | (uint32_t)code[3] << 24, 8);
	ferry_dataset *ds;
	T_ASSERT(ferry_dataset_open(ctx, p, &ds) == 0);
	T_CHECK(ferry_dataset_shards(ds) > 3);
	uint32_t nshards = ferry_dataset_shards(ds);
	ferry_dataset_destroy(ds);
	snprintf(p, sizeof(p), "%s/nokeys", dir);
	T_ASSERT(write_ds(p, FERRY_WRITE_FERRY, 50, 0, 0) == 0);
	check_read(p, 50, "ferry", 0);
	snprintf(p, sizeof(p), "%s/empty", dir);
	T_ASSERT(write_ds(p, FERRY_WRITE_FERRY, 0, 0, 0) == 0);
	check_read(p, 0, "ferry", 0);

	/* Megatron */
	snprintf(p, sizeof(p), "%s/mega", dir);
	T_ASSERT(write_ds(p, FERRY_WRITE_MEGATRON, 300, 0, 0) == 0);
	check_read(p, 300, "megatron", 0);
	snprintf(q, sizeof(q), "%s.idx", p);
	check_read(q, 300, "megatron", 0);
	fd = open(q, O_RDONLY);
	T_ASSERT(fd >= 0 && pread(fd, code, 1, 17) == 1);
	close(fd);
	T_EQ_INT(code[0], 8);

	/* a flipped byte in the index: checksum */
	snprintf(p, sizeof(p), "%s/ds", dir);
	snprintf(q, sizeof(q), "%s/ferry.idx", p);
	char save[700];
	snprintf(save, sizeof(save), "%s/idx.save", dir);
	copy_file(q, save);
	flip_byte(q, 200);
	expect_corrupt(p, "checksum", "ferry.idx");
	copy_file(save, q);
	/* a truncated index */
	T_ASSERT(truncate(q, 1000) == 0);
	expect_corrupt(p, "ferry.idx", "truncated");
	copy_file(save, q);
	/* a truncated shard: named with the first sample cut */
	char shard[700];
	snprintf(shard, sizeof(shard), "%s/shard-%05u.fsh", p, nshards - 2);
	struct stat st;
	T_ASSERT(stat(shard, &st) == 0);
	T_ASSERT(truncate(shard, st.st_size - 100) == 0);
	expect_corrupt(p, "shard-", "sample ");
	T_ASSERT(ferry_dataset_open(ctx, p, &ds) != 0);
	/* a flipped byte in a shard: verify names the sample */
	T_ASSERT(truncate(shard, st.st_size) == 0);
	T_ASSERT(ferry_dataset_open(ctx, p, &ds) == 0);
	flip_byte(shard, 10);
	T_EQ_INT(ferry_dataset_verify(ds), FERRY_ECORRUPT);
	T_CHECK(strstr(ferry_last_error(), "checksum") && strstr(ferry_last_error(), "sample "));
	ferry_dataset_destroy(ds);

	/* Megatron: bad magic, truncated index, truncated .bin */
	snprintf(p, sizeof(p), "%s/mega", dir);
	snprintf(q, sizeof(q), "%s/mega.idx", dir);
	copy_file(q, save);
	flip_byte(q, 0);
	expect_corrupt(p, "mega.idx", "MMIDIDX");
	copy_file(save, q);
	T_ASSERT(truncate(q, 40) == 0);
	expect_corrupt(p, "mega.idx", "truncated");
	copy_file(save, q);
	/* pointers out of order (1 and 2 swapped) or overlapping (1 inside 0): refused, naming the
	 * sequence and both byte ranges (issue 20) */
	{
		const off_t ptrs = FERRY__MEGATRON_HEADER + 300 * 4;
		int64_t ptr[3];
		int32_t size0;
		fd = open(q, O_RDWR);
		T_ASSERT(fd >= 0 && pread(fd, ptr, sizeof(ptr), ptrs) == (ssize_t)sizeof(ptr));
		T_ASSERT(pread(fd, &size0, 4, FERRY__MEGATRON_HEADER) == 4 && size0 > 0 && ptr[1] < ptr[2]);
		int64_t swapped[2] = {ptr[2], ptr[1]};
		T_ASSERT(pwrite(fd, swapped, sizeof(swapped), ptrs + 8) == (ssize_t)sizeof(swapped));
		close(fd);
		char want[64];
		snprintf(want, sizeof(want), "[%lld, ", (long long)ptr[1]);
		expect_corrupt(p, "mega.idx: sequence 2", want);
		copy_file(save, q);
		fd = open(q, O_RDWR);
		T_ASSERT(fd >= 0 && pwrite(fd, &ptr[0], 8, ptrs + 8) == 8);
		close(fd);
		snprintf(want, sizeof(want), "sequence 0's [%lld, %lld)", (long long)ptr[0],
			 (long long)(ptr[0] + size0 * 2));
		expect_corrupt(p, "overlap", want);
		copy_file(save, q);
	}
	snprintf(q, sizeof(q), "%s/mega.bin", dir);
	T_ASSERT(stat(q, &st) == 0);
	T_ASSERT(truncate(q, st.st_size / 2) == 0);
	expect_corrupt(p, "mega.bin", "sample ");

	/* not a dataset at all */
	snprintf(p, sizeof(p), "%s/nothing", dir);
	T_EQ_INT(ferry_dataset_open(ctx, p, &ds), -ENOENT);

	/* a crash before finish leaves no index: the directory does not open */
	snprintf(p, sizeof(p), "%s/unfinished", dir);
	ferry_dataset_writer *w;
	T_ASSERT(ferry_dataset_writer_create(ctx, p, FERRY_WRITE_FERRY, FERRY_DT_BYTES, 0, &w) == 0);
	T_ASSERT(ferry_dataset_writer_add(w, 10, NULL, 0, 1) == 0);
	T_ASSERT(ferry_dataset_writer_layout(w) == 1);
	ferry_dataset_writer_destroy(w);
	T_EQ_INT(ferry_dataset_open(ctx, p, &ds), -ENOENT);

	ferry_ctx_destroy(ctx);
	if (!t_failures && t_rmtree(dir))
		fprintf(stderr, "could not remove %s\n", dir);
	return t_result();
}
