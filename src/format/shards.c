/*
 * The ferry shard format: shard-NNNNN.fsh data files and one ferry.idx (docs/DATA.md), its strict
 * parser, the dataset reader shared with Megatron datasets, and the writer used by `ferry pack`.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/byteorder.h"
#include "base/crc32c.h"
#include "base/durable.h"
#include "format/dtype.h"
#include "format/shards.h"

void ferry__index_free(struct ferry__index *x)
{
	free(x->file_bytes);
	free(x->file_first);
	free(x->off);
	free(x->len);
	free(x->crc);
	free(x->key_off);
	free(x->keys);
	free(x->doc_idx);
	memset(x, 0, sizeof(*x));
}

uint32_t ferry__first_le(const uint64_t *first, uint32_t n, uint64_t i)
{
	uint32_t lo = 0, hi = n;
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (first[mid] <= i)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

uint32_t ferry__index_shard_of(const struct ferry__index *x, uint64_t i)
{
	return ferry__first_le(x->file_first, x->nfiles, i);
}

/* --------------------------------------------------------------------------------------- parser */

#define CORRUPT(...) ferry__error(FERRY_ECORRUPT, __VA_ARGS__)

int ferry__shard_index_parse(const uint8_t *buf, size_t len, int check_crc, const char *name,
			     struct ferry__index *out)
{
	memset(out, 0, sizeof(*out));
	if (len < FERRY__IDX_HEADER + 8)
		return CORRUPT("%s: %zu bytes, too short for a ferry index (%d at least)", name, len,
			       FERRY__IDX_HEADER + 8);
	if (memcmp(buf, FERRY__IDX_MAGIC, 8))
		return CORRUPT("%s: not a ferry index (bad magic)", name);
	uint32_t version = ferry__rd32(buf + 8), flags = ferry__rd32(buf + 12), dtype = ferry__rd32(buf + 16);
	uint32_t nshards = ferry__rd32(buf + 20);
	uint64_t n = ferry__rd64(buf + 24), bytes = ferry__rd64(buf + 32), file_len = ferry__rd64(buf + 40);
	uint64_t keys_len = ferry__rd64(buf + 48);
	if (version != FERRY__IDX_VERSION)
		return CORRUPT("%s: index version %u, this reader knows version %d", name, version,
			       FERRY__IDX_VERSION);
	if (file_len != len)
		return CORRUPT("%s: index is %zu bytes, its header says %llu (truncated or extended)",
			       name, len, (unsigned long long)file_len);
	if (memcmp(buf + len - 4, FERRY__IDX_END, 4))
		return CORRUPT("%s: bad end marker (truncated index)", name);
	if (check_crc) {
		uint32_t want = ferry__rd32(buf + len - 8), got = ferry__crc32c(0, buf, len - 8);
		if (want != got)
			return CORRUPT("%s: index checksum mismatch (crc32c %08x, stored %08x)", name, got,
				       want);
	}
	if (flags & ~FERRY__IDX_FLAG_KEYS)
		return CORRUPT("%s: unknown flags 0x%x", name, flags);
	enum ferry_dtype dt;
	if (ferry__dtype_from_megatron_code(dtype, &dt))
		return CORRUPT("%s: unknown dtype code %u", name, dtype);
	if (ferry__rd32(buf + 56) || ferry__rd32(buf + 60))
		return CORRUPT("%s: reserved header fields are not zero", name);
	int keys = flags & FERRY__IDX_FLAG_KEYS;
	if (!keys && keys_len)
		return CORRUPT("%s: %llu key bytes without the keys flag", name, (unsigned long long)keys_len);
	/* Sizes from the header must add up to the file length exactly; overflow-safe because each
	 * table is bounded by len before it is multiplied out. */
	uint64_t avail = len - FERRY__IDX_HEADER - 8;
	if (nshards > avail / FERRY__IDX_SHARD_ENTRY || (n && !nshards))
		return CORRUPT("%s: %u shards do not fit the index", name, nshards);
	avail -= (uint64_t)nshards * FERRY__IDX_SHARD_ENTRY;
	if (n > avail / FERRY__IDX_SAMPLE_ENTRY)
		return CORRUPT("%s: %llu samples do not fit the index", name, (unsigned long long)n);
	avail -= n * FERRY__IDX_SAMPLE_ENTRY;
	uint64_t need = 0;
	if (keys) {
		if (n + 1 > avail / 8)
			return CORRUPT("%s: key offsets do not fit the index", name);
		need = (n + 1) * 8;
		if (keys_len > avail - need)
			return CORRUPT("%s: %llu key bytes do not fit the index", name,
				       (unsigned long long)keys_len);
		need += (keys_len + 7) & ~7ull;
	}
	if (need != avail)
		return CORRUPT("%s: index tables take %llu bytes, %llu are there", name,
			       (unsigned long long)(len - avail + need), (unsigned long long)len);

	out->format = 0;
	out->dtype = dt;
	out->n = n;
	out->nfiles = nshards;
	out->bytes = bytes;
	out->file_bytes = calloc(nshards ? nshards : 1, sizeof(uint64_t));
	out->file_first = calloc((size_t)nshards + 1, sizeof(uint64_t));
	out->off = malloc((n ? n : 1) * sizeof(uint64_t));
	out->len = malloc((n ? n : 1) * sizeof(uint64_t));
	out->crc = malloc((n ? n : 1) * sizeof(uint32_t));
	if (!out->file_bytes || !out->file_first || !out->off || !out->len || !out->crc)
		goto nomem;
	const uint8_t *p = buf + FERRY__IDX_HEADER;
	uint64_t next = 0;
	for (uint32_t s = 0; s < nshards; s++, p += FERRY__IDX_SHARD_ENTRY) {
		uint64_t sb = ferry__rd64(p), first = ferry__rd64(p + 8), cnt = ferry__rd64(p + 16);
		if (first != next || cnt > n - next)
			goto bad_shard;
		if (ferry__rd64(p + 24))
			goto bad_shard;
		out->file_bytes[s] = sb;
		out->file_first[s] = first;
		next = first + cnt;
		continue;
bad_shard:
		ferry__index_free(out);
		return CORRUPT("%s: shard %u: entry inconsistent (first sample %llu, %llu samples, "
			       "expected first %llu of %llu)", name, s, (unsigned long long)first,
			       (unsigned long long)cnt, (unsigned long long)next, (unsigned long long)n);
	}
	if (next != n) {
		ferry__index_free(out);
		return CORRUPT("%s: shards hold %llu samples, header says %llu", name,
			       (unsigned long long)next, (unsigned long long)n);
	}
	out->file_first[nshards] = n;
	uint64_t total = 0;
	for (uint32_t s = 0; s < nshards; s++) {
		uint64_t end = 0;
		for (uint64_t i = out->file_first[s]; i < out->file_first[s + 1]; i++, p += 16) {
			uint64_t off = ferry__rd64(p);
			uint32_t l = ferry__rd32(p + 8);
			out->off[i] = off;
			out->len[i] = l;
			out->crc[i] = ferry__rd32(p + 12);
			uint64_t sb = out->file_bytes[s];
			if (off < end || off > sb || l > sb - off) {
				ferry__index_free(out); /* it clears out: the message uses sb */
				return CORRUPT("%s: shard %u (shard-%05u.fsh), sample %llu: bytes %llu..%llu "
					       "overlap the previous sample or lie past the shard's %llu bytes",
					       name, s, s, (unsigned long long)i, (unsigned long long)off,
					       (unsigned long long)off + l, (unsigned long long)sb);
			}
			if (l % ferry__dtype_size(dt)) {
				ferry__index_free(out);
				return CORRUPT("%s: shard %u, sample %llu: %u bytes is not a whole number of "
					       "%s elements", name, s, (unsigned long long)i, l,
					       ferry_dtype_numpy_name(dt));
			}
			end = off + l;
			total += l;
		}
	}
	if (total != bytes) {
		ferry__index_free(out);
		return CORRUPT("%s: samples hold %llu bytes, header says %llu", name,
			       (unsigned long long)total, (unsigned long long)bytes);
	}
	if (keys) {
		out->key_off = malloc((n + 1) * sizeof(uint64_t));
		out->keys = malloc(keys_len + 1);
		if (!out->key_off || !out->keys)
			goto nomem;
		for (uint64_t i = 0; i <= n; i++, p += 8) {
			out->key_off[i] = ferry__rd64(p);
			if (out->key_off[i] > keys_len || (i && out->key_off[i] < out->key_off[i - 1]) ||
			    (i == 0 && out->key_off[0]) || (i == n && out->key_off[n] != keys_len)) {
				ferry__index_free(out);
				return CORRUPT("%s: key offset of sample %llu out of order or range", name,
					       (unsigned long long)i);
			}
		}
		memcpy(out->keys, p, keys_len);
		out->keys[keys_len] = 0;
		out->keys_len = keys_len;
	}
	return 0;
nomem:
	ferry__index_free(out);
	return ferry__error(-ENOMEM, "%s: index of %llu samples", name, (unsigned long long)n);
}

/* ------------------------------------------------------------------------- pre-shuffled copies */

void ferry__copies_free(struct ferry__copies *c)
{
	free(c->copy_file);
	free(c->file_bytes);
	free(c->sample);
	free(c->off);
	free(c->file);
	memset(c, 0, sizeof(*c));
}

int ferry__copies_parse(const uint8_t *buf, size_t len, int check_crc, const char *name,
			const struct ferry__index *x, uint32_t idx_crc, struct ferry__copies *out)
{
	memset(out, 0, sizeof(*out));
	if (len < FERRY__CPY_HEADER + 8)
		return CORRUPT("%s: %zu bytes, too short for ferry copies (%d at least)", name, len,
			       FERRY__CPY_HEADER + 8);
	if (memcmp(buf, FERRY__CPY_MAGIC, 8))
		return CORRUPT("%s: not a ferry copies file (bad magic)", name);
	uint32_t version = ferry__rd32(buf + 8), flags = ferry__rd32(buf + 12);
	uint64_t n = ferry__rd64(buf + 16), seed = ferry__rd64(buf + 32), file_len = ferry__rd64(buf + 40);
	uint32_t crc = ferry__rd32(buf + 24), ncopies = ferry__rd32(buf + 28);
	if (version != FERRY__CPY_VERSION)
		return CORRUPT("%s: copies version %u, this reader knows version %d", name, version,
			       FERRY__CPY_VERSION);
	if (file_len != len)
		return CORRUPT("%s: %zu bytes, its header says %llu (truncated or extended)", name, len,
			       (unsigned long long)file_len);
	if (memcmp(buf + len - 4, FERRY__IDX_END, 4))
		return CORRUPT("%s: bad end marker (truncated copies file)", name);
	if (check_crc) {
		uint32_t want = ferry__rd32(buf + len - 8), got = ferry__crc32c(0, buf, len - 8);
		if (want != got)
			return CORRUPT("%s: checksum mismatch (crc32c %08x, stored %08x)", name, got, want);
	}
	if (flags || ferry__rd64(buf + 48) || ferry__rd64(buf + 56))
		return CORRUPT("%s: unknown flags 0x%x or reserved header fields not zero", name, flags);
	if (n != x->n || crc != idx_crc)
		return CORRUPT("%s: written for another index (%llu samples, index checksum %08x; "
			       "ferry.idx has %llu samples, checksum %08x)", name, (unsigned long long)n, crc,
			       (unsigned long long)x->n, idx_crc);
	uint64_t avail = len - FERRY__CPY_HEADER - 8;
	if (!ncopies || ncopies > avail / FERRY__CPY_COPY_HEADER)
		return CORRUPT("%s: %u copies do not fit the file", name, ncopies);
	/* Each copy takes at least its header and n position entries. */
	if (n && (uint64_t)ncopies > avail / (FERRY__CPY_COPY_HEADER + n * FERRY__CPY_POS_ENTRY))
		return CORRUPT("%s: %u copies of %llu samples do not fit the file", name, ncopies,
			       (unsigned long long)n);
	out->ncopies = ncopies;
	out->seed = seed;
	out->n = n;
	out->copy_file = calloc((size_t)ncopies + 1, sizeof(uint32_t));
	size_t all = n && ncopies ? (size_t)n * ncopies : 1;
	out->sample = malloc(all * sizeof(int64_t));
	out->off = malloc(all * sizeof(uint64_t));
	out->file = malloc(all * sizeof(uint32_t));
	uint8_t *seen = malloc(n ? n : 1);
	if (!out->copy_file || !out->sample || !out->off || !out->file || !seen)
		goto nomem;
	const uint8_t *p = buf + FERRY__CPY_HEADER, *end = buf + len - 8;
	for (uint32_t c = 0; c < ncopies; c++) {
		if ((size_t)(end - p) < FERRY__CPY_COPY_HEADER)
			goto short_file;
		uint32_t ns = ferry__rd32(p);
		if (ferry__rd32(p + 4)) {
			free(seen);
			ferry__copies_free(out);
			return CORRUPT("%s: copy %u: reserved field not zero", name, c);
		}
		p += FERRY__CPY_COPY_HEADER;
		if ((size_t)(end - p) / FERRY__IDX_SHARD_ENTRY < ns || (n && !ns) ||
		    (size_t)(end - p - (size_t)ns * FERRY__IDX_SHARD_ENTRY) / FERRY__CPY_POS_ENTRY < n)
			goto short_file;
		uint32_t base = out->nfiles;
		if (ns > UINT32_MAX - base)
			goto short_file;
		uint64_t *fb = realloc(out->file_bytes, ((size_t)base + ns + 1) * sizeof(uint64_t));
		if (!fb)
			goto nomem;
		out->file_bytes = fb;
		out->copy_file[c] = base;
		const uint8_t *shards = p;
		uint64_t next = 0;
		for (uint32_t s = 0; s < ns; s++, p += FERRY__IDX_SHARD_ENTRY) {
			uint64_t first = ferry__rd64(p + 8), cnt = ferry__rd64(p + 16);
			if (first != next || cnt > n - next || ferry__rd64(p + 24)) {
				free(seen);
				ferry__copies_free(out);
				return CORRUPT("%s: copy %u, shard %u: entry inconsistent (first position %llu, "
					       "%llu samples, expected first %llu of %llu)", name, c, s,
					       (unsigned long long)first, (unsigned long long)cnt,
					       (unsigned long long)next, (unsigned long long)n);
			}
			fb[base + s] = ferry__rd64(p);
			next = first + cnt;
		}
		if (next != n) {
			free(seen);
			ferry__copies_free(out);
			return CORRUPT("%s: copy %u: shards hold %llu positions, %llu samples", name, c,
				       (unsigned long long)next, (unsigned long long)n);
		}
		out->nfiles = base + ns;
		memset(seen, 0, n ? n : 1);
		uint64_t pos = 0;
		for (uint32_t s = 0; s < ns; s++) {
			const uint8_t *se = shards + (size_t)s * FERRY__IDX_SHARD_ENTRY;
			uint64_t cnt = ferry__rd64(se + 16), sb = fb[base + s], e = 0;
			for (uint64_t k = 0; k < cnt; k++, pos++, p += FERRY__CPY_POS_ENTRY) {
				uint64_t i = ferry__rd64(p), off = ferry__rd64(p + 8);
				uint64_t l = i < n ? x->len[i] : 0;
				if (i >= n || seen[i] || off < e || off > sb || l > sb - off) {
					free(seen);
					ferry__copies_free(out);
					return CORRUPT("%s: copy %u, shard %u, position %llu: sample %llu (bytes "
						       "%llu..%llu) out of range, repeated, overlapping the previous "
						       "one or past the shard's %llu bytes", name, c, s,
						       (unsigned long long)pos, (unsigned long long)i,
						       (unsigned long long)off, (unsigned long long)(off + l),
						       (unsigned long long)sb);
				}
				seen[i] = 1;
				size_t at = (size_t)c * n + pos;
				out->sample[at] = (int64_t)i;
				out->off[at] = off;
				out->file[at] = base + s;
				e = off + l;
			}
		}
	}
	out->copy_file[ncopies] = out->nfiles;
	free(seen);
	if (p != end) {
		ferry__copies_free(out);
		return CORRUPT("%s: %zu bytes after the last copy's table", name, (size_t)(end - p));
	}
	return 0;
short_file:
	free(seen);
	ferry__copies_free(out);
	return CORRUPT("%s: copy tables do not fit the file's %zu bytes", name, len);
nomem:
	free(seen);
	ferry__copies_free(out);
	return ferry__error(-ENOMEM, "%s: %u copies of %llu samples", name, ncopies, (unsigned long long)n);
}

/* ---------------------------------------------------------------------------------- the reader */

int ferry__read_whole(const char *path, uint8_t **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ferry__error(-errno, "open(%s)", path);
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = -errno;
		close(fd);
		return ferry__error(e, "fstat(%s)", path);
	}
	size_t n = (size_t)st.st_size;
	uint8_t *b = malloc(n ? n : 1);
	if (!b) {
		close(fd);
		return ferry__error(-ENOMEM, "reading %s (%zu bytes)", path, n);
	}
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, b + got, n - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? -errno : -EIO;
			free(b);
			close(fd);
			return ferry__error(e, "pread(%s, offset %zu)", path, got);
		}
		got += (size_t)r;
	}
	close(fd);
	*buf = b;
	*len = n;
	return 0;
}

int ferry__path_is_url(const char *p)
{
	return !strncasecmp(p, "s3://", 5) || !strncasecmp(p, "http://", 7) || !strncasecmp(p, "https://", 8);
}

int ferry__read_whole_at(ferry_ctx *ctx, const char *path, uint8_t **buf, size_t *len)
{
	if (!ferry__path_is_url(path))
		return ferry__read_whole(path, buf, len);
	ferry_file *f;
	int r = ferry_file_open(ctx, path, FERRY_O_RDONLY, &f);
	if (r)
		return r;
	if (ferry__cache_get_small(ctx, path, f, buf, len)) { /* unchanged since cached: no GET */
		ferry_file_destroy(f);
		return 0;
	}
	int64_t size = ferry_file_size(f);
	uint8_t *b = size < 0 ? NULL : malloc(size ? (size_t)size : 1);
	if (!b) {
		ferry_file_destroy(f);
		return size < 0 ? (int)size : ferry__error(-ENOMEM, "reading %s (%lld bytes)", path, (long long)size);
	}
	ssize_t got = size ? ferry_pread(f, b, (size_t)size, 0) : 0;
	if (got == size)
		ferry__cache_put_small(ctx, path, f, b, (size_t)size);
	ferry_file_destroy(f);
	if (got != size) {
		free(b);
		return got < 0 ? (int)got : ferry__error(-EIO, "%s: short read (%zd of %lld bytes)", path, got, (long long)size);
	}
	*buf = b;
	*len = (size_t)size;
	return 0;
}

int ferry__dataset_check_sizes(struct ferry_dataset *ds)
{
	struct ferry__index *x = &ds->x;
	for (uint32_t s = 0; s < x->nfiles; s++) {
		int64_t sz = ds->cz && ds->cz[s] ? ferry_cz_size(ds->cz[s]) : ferry_file_size(ds->files[s]); /* cz: uncompressed */
		if (sz < 0)
			return (int)sz;
		if ((uint64_t)sz >= x->file_bytes[s])
			continue;
		uint64_t i = x->file_first[s];
		while (i < x->file_first[s + 1] && x->off[i] + x->len[i] <= (uint64_t)sz)
			i++;
		if (x->format == 1) {
			/* Megatron samples need not be in file order: find the first one cut. */
			for (i = 0; i < x->n && x->off[i] + x->len[i] <= (uint64_t)sz; i++)
				;
		}
		return CORRUPT("%s: truncated: %lld bytes, the index needs %llu; sample %llu (bytes "
			       "%llu..%llu) lies past its end (shard %u)", ds->paths[s], (long long)sz,
			       (unsigned long long)x->file_bytes[s], (unsigned long long)i,
			       (unsigned long long)(i < x->n ? x->off[i] : 0),
			       (unsigned long long)(i < x->n ? x->off[i] + x->len[i] : 0), s);
	}
	return 0;
}

static int open_files(struct ferry_dataset *ds)
{
	uint32_t all = ds->x.nfiles + ds->copies.nfiles;
	ds->files = calloc(all ? all : 1, sizeof(*ds->files));
	if (!ds->files)
		return ferry__error(-ENOMEM, "opening %u shards", all);
	for (uint32_t s = 0; s < all; s++) {
		int err = ferry_file_open(ds->ctx, ds->paths[s], FERRY_O_RDONLY, &ds->files[s]);
		if (err < 0) {
			ferry__error_append("shard %u of %s", s, ds->path);
			return err;
		}
	}
	/* compressed shards (ferry pack --compress; local datasets): read through a cz reader */
	if (ds->x.nfiles && !ferry__path_is_url(ds->paths[0]) && !(ds->cz = calloc(ds->x.nfiles, sizeof(*ds->cz))))
		return ferry__error(-ENOMEM, "opening %u shards", ds->x.nfiles);
	for (uint32_t s = 0; ds->cz && s < ds->x.nfiles; s++) {
		int cz = ferry_cz_is_compressed(ds->ctx, ds->paths[s]);
		if (cz == 1)
			cz = ferry_cz_open(ds->ctx, ds->paths[s], &ds->cz[s]);
		if (cz < 0) {
			ferry__error_append("shard %u of %s", s, ds->path);
			return cz;
		}
	}
	for (uint32_t k = 0; k < ds->copies.nfiles; k++) {
		int64_t sz = ferry_file_size(ds->files[ds->x.nfiles + k]);
		if (sz < 0)
			return (int)sz;
		if ((uint64_t)sz < ds->copies.file_bytes[k])
			return CORRUPT("%s: truncated: %lld bytes, %s needs %llu", ds->paths[ds->x.nfiles + k],
				       (long long)sz, FERRY__CPY_NAME, (unsigned long long)ds->copies.file_bytes[k]);
	}
	return ferry__dataset_check_sizes(ds);
}

/* The file name of shard s of pre-shuffled copy c. */
static void copy_shard_name(uint32_t c, uint32_t s, char *out, size_t len)
{
	snprintf(out, len, "copy-%03u-shard-%05u.fsh", c, s);
}

/* Reads dir/ferry.copies when it exists (none: no copies). */
static int open_copies(struct ferry_dataset *ds, const char *dir, uint32_t idx_crc)
{
	size_t l = strlen(dir) + 64;
	char *p = malloc(l);
	if (!p)
		return ferry__error(-ENOMEM, "%s", dir);
	snprintf(p, l, "%s/%s", dir, FERRY__CPY_NAME);
	uint8_t *buf;
	size_t len;
	if (!ferry__path_is_url(p) && access(p, F_OK) < 0 && errno == ENOENT) {
		free(p);
		return 0;
	}
	int err = ferry__read_whole_at(ds->ctx, p, &buf, &len);
	if (err == -ENOENT && ferry__path_is_url(p)) { /* no such object: no copies */
		free(p);
		return 0;
	}
	if (!err) {
		err = ferry__copies_parse(buf, len, 1, p, &ds->x, idx_crc, &ds->copies);
		free(buf);
	}
	free(p);
	return err;
}

static int path_is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static int ferry_open_index(struct ferry_dataset *ds, const char *idx_path, const char *dir)
{
	uint8_t *buf;
	size_t len;
	int err = ferry__read_whole_at(ds->ctx, idx_path, &buf, &len);
	if (err)
		return err;
	err = ferry__shard_index_parse(buf, len, 1, idx_path, &ds->x);
	uint32_t idx_crc = err ? 0 : ferry__rd32(buf + len - 8);
	free(buf);
	if (err || (err = open_copies(ds, dir, idx_crc)))
		return err;
	uint32_t all = ds->x.nfiles + ds->copies.nfiles;
	ds->paths = calloc(all ? all : 1, sizeof(char *));
	if (!ds->paths)
		return ferry__error(-ENOMEM, "%s", idx_path);
	for (uint32_t c = 0; c < ds->copies.ncopies; c++)
		for (uint32_t k = ds->copies.copy_file[c]; k < ds->copies.copy_file[c + 1]; k++) {
			char name[64];
			copy_shard_name(c, k - ds->copies.copy_file[c], name, sizeof(name));
			size_t pl = strlen(dir) + sizeof(name) + 2;
			if (!(ds->paths[ds->x.nfiles + k] = malloc(pl)))
				return ferry__error(-ENOMEM, "%s", idx_path);
			snprintf(ds->paths[ds->x.nfiles + k], pl, "%s/%s", dir, name);
		}
	for (uint32_t s = 0; s < ds->x.nfiles; s++) {
		size_t l = strlen(dir) + 32;
		ds->paths[s] = malloc(l);
		if (!ds->paths[s])
			return ferry__error(-ENOMEM, "%s", idx_path);
		snprintf(ds->paths[s], l, "%s/shard-%05u.fsh", dir, s);
	}
	return open_files(ds);
}

int ferry_dataset_open(ferry_ctx *ctx, const char *path, ferry_dataset **out)
{
	if (!ctx || !path || !out)
		return ferry__error(-EINVAL, "ferry_dataset_open: NULL argument");
	struct ferry_dataset *ds = calloc(1, sizeof(*ds));
	if (!ds || !(ds->path = strdup(path))) {
		free(ds);
		return ferry__error(-ENOMEM, "ferry_dataset_open(%s)", path);
	}
	ds->ctx = ctx;
	int err;
	size_t pl = strlen(path);
	char *tmp = malloc(pl + 32);
	if (!tmp) {
		ferry_dataset_destroy(ds);
		return ferry__error(-ENOMEM, "ferry_dataset_open(%s)", path);
	}
	int url = ferry__path_is_url(path);
	if (url && !ends_with(path, ".idx") && !ends_with(path, ".bin")) {
		/* a prefix of objects: a ferry dataset's (ferry.idx under it), else a Megatron prefix */
		memcpy(tmp, path, pl + 1);
		while (pl > 1 && tmp[pl - 1] == '/')
			tmp[--pl] = 0;
		char *idx = malloc(pl + 32);
		if (!idx) {
			err = ferry__error(-ENOMEM, "ferry_dataset_open(%s)", path);
		} else {
			snprintf(idx, pl + 32, "%s/%s", tmp, FERRY__IDX_NAME);
			err = ferry_open_index(ds, idx, tmp);
			free(idx);
		}
		if (err == -ENOENT && !ds->paths) {
			ferry__error_clear();
			err = ferry__megatron_open(ds, tmp);
			if (!err)
				err = open_files(ds);
		}
	} else if (!url && path_is_dir(path)) {
		snprintf(tmp, pl + 32, "%s/%s", path, FERRY__IDX_NAME);
		err = ferry_open_index(ds, tmp, path);
	} else if (ends_with(path, "/" FERRY__IDX_NAME) || !strcmp(path, FERRY__IDX_NAME)) {
		memcpy(tmp, path, pl + 1);
		char *slash = strrchr(tmp, '/');
		if (slash)
			*slash = 0;
		else
			strcpy(tmp, ".");
		err = ferry_open_index(ds, path, tmp);
	} else {
		memcpy(tmp, path, pl + 1);
		if (ends_with(tmp, ".idx") || ends_with(tmp, ".bin"))
			tmp[pl - 4] = 0;
		err = ferry__megatron_open(ds, tmp);
		if (!err)
			err = open_files(ds);
	}
	free(tmp);
	if (!err && url)
		err = ferry__dataset_cache_open(ds);
	if (err) {
		ferry_dataset_destroy(ds);
		return err;
	}
	*out = ds;
	return 0;
}

void ferry_dataset_destroy(ferry_dataset *ds)
{
	if (!ds)
		return;
	ferry__dataset_cache_close(ds); /* its threads read files[] */
	for (uint32_t s = 0; ds->cz && s < ds->x.nfiles; s++)
		ferry_cz_destroy(ds->cz[s]);
	free(ds->cz);
	for (uint32_t s = 0; s < ds->x.nfiles + ds->copies.nfiles; s++) {
		if (ds->files)
			ferry_file_destroy(ds->files[s]);
		if (ds->paths)
			free(ds->paths[s]);
	}
	free(ds->files);
	free(ds->paths);
	free(ds->path);
	ferry__index_free(&ds->x);
	ferry__copies_free(&ds->copies);
	free(ds);
}

uint64_t ferry_dataset_count(const ferry_dataset *ds) { return ds ? ds->x.n : 0; }
enum ferry_dtype ferry_dataset_dtype(const ferry_dataset *ds) { return ds ? ds->x.dtype : FERRY_DT_INVALID; }
const char *ferry_dataset_format(const ferry_dataset *ds) { return ds && ds->x.format ? "megatron" : "ferry"; }
uint64_t ferry_dataset_bytes(const ferry_dataset *ds) { return ds ? ds->x.bytes : 0; }
uint32_t ferry_dataset_shards(const ferry_dataset *ds) { return ds ? ds->x.nfiles : 0; }

uint32_t ferry_dataset_copies(const ferry_dataset *ds, uint64_t *seed)
{
	if (seed)
		*seed = ds ? ds->copies.seed : 0;
	return ds ? ds->copies.ncopies : 0;
}

int64_t ferry_dataset_sample_bytes(const ferry_dataset *ds, uint64_t i)
{
	if (!ds || i >= ds->x.n)
		return ferry__error(-EINVAL, "sample %llu out of range", (unsigned long long)i);
	return (int64_t)ds->x.len[i];
}

int ferry_dataset_locate(const ferry_dataset *ds, uint64_t i, uint32_t *shard, uint64_t *offset)
{
	if (!ds || i >= ds->x.n)
		return ferry__error(-EINVAL, "sample %llu out of range", (unsigned long long)i);
	if (shard)
		*shard = ferry__index_shard_of(&ds->x, i);
	if (offset)
		*offset = ds->x.off[i];
	return 0;
}

ferry_cz *ferry__dataset_cz(const struct ferry_dataset *ds, uint32_t s)
{
	return ds->cz && s < ds->x.nfiles ? ds->cz[s] : NULL;
}

const char *ferry_dataset_shard_path(const ferry_dataset *ds, uint32_t k)
{
	return ds && k < ds->x.nfiles ? ds->paths[k] : NULL;
}

const char *ferry_dataset_key(const ferry_dataset *ds, uint64_t i, size_t *len)
{
	if (!ds || !ds->x.key_off || i >= ds->x.n) {
		if (len)
			*len = 0;
		return NULL;
	}
	if (len)
		*len = ds->x.key_off[i + 1] - ds->x.key_off[i];
	return ds->x.keys + ds->x.key_off[i];
}

ssize_t ferry_dataset_read(ferry_dataset *ds, uint64_t i, void *buf, size_t len)
{
	if (!ds || i >= ds->x.n)
		return ferry__error(-EINVAL, "ferry_dataset_read: sample %llu out of range (%llu samples)",
				    (unsigned long long)i, (unsigned long long)(ds ? ds->x.n : 0));
	uint64_t l = ds->x.len[i];
	if (len < l)
		return ferry__error(-ENOSPC, "ferry_dataset_read: sample %llu is %llu bytes, buffer %zu",
				    (unsigned long long)i, (unsigned long long)l, len);
	uint32_t s = ferry__index_shard_of(&ds->x, i);
	ferry_file *f = ferry__dataset_file_get(ds, s);
	ferry_cz *cz = ferry__dataset_cz(ds, s);
	ssize_t r = cz ? ferry_cz_pread(cz, buf, l, ds->x.off[i]) : ferry_pread(f, buf, l, ds->x.off[i]);
	ferry__dataset_file_put(ds, s, f);
	if (r < 0) {
		ferry__error_append("sample %llu of %s", (unsigned long long)i, ds->paths[s]);
		return r;
	}
	if ((uint64_t)r != l)
		return CORRUPT("%s: sample %llu (shard %u, bytes %llu..%llu) ends past the end of the file",
			       ds->paths[s], (unsigned long long)i, s, (unsigned long long)ds->x.off[i],
			       (unsigned long long)(ds->x.off[i] + l));
	return r;
}

int ferry_dataset_verify(ferry_dataset *ds)
{
	if (!ds || !ds->x.crc)
		return 0;
	size_t cap = 1 << 20;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (uint64_t i = 0; i < ds->x.n; i++) {
		if (ds->x.len[i] > cap) {
			free(buf);
			cap = ds->x.len[i];
			if (!(buf = malloc(cap)))
				return -ENOMEM;
		}
		ssize_t r = ferry_dataset_read(ds, i, buf, cap);
		if (r < 0) {
			free(buf);
			return (int)r;
		}
		uint32_t c = ferry__crc32c(0, buf, (size_t)r);
		if (c != ds->x.crc[i]) {
			uint32_t s = ferry__index_shard_of(&ds->x, i);
			free(buf);
			return CORRUPT("%s: sample %llu (shard %u, bytes %llu..%llu): checksum mismatch "
				       "(crc32c %08x, index says %08x)", ds->paths[s], (unsigned long long)i,
				       s, (unsigned long long)ds->x.off[i],
				       (unsigned long long)(ds->x.off[i] + ds->x.len[i]), c, ds->x.crc[i]);
		}
	}
	/* the pre-shuffled copies hold the same samples: each against the index's checksum */
	const struct ferry__copies *cp = &ds->copies;
	for (size_t k = 0; k < (size_t)cp->ncopies * cp->n; k++) {
		uint64_t i = (uint64_t)cp->sample[k], l = ds->x.len[i];
		uint32_t f = ds->x.nfiles + cp->file[k];
		if (l > cap) {
			free(buf);
			cap = l;
			if (!(buf = malloc(cap)))
				return -ENOMEM;
		}
		ssize_t r = ferry_pread(ds->files[f], buf, l, cp->off[k]);
		if (r >= 0 && (uint64_t)r == l && ferry__crc32c(0, buf, l) == ds->x.crc[i])
			continue;
		free(buf);
		if (r < 0) {
			ferry__error_append("sample %llu of %s", (unsigned long long)i, ds->paths[f]);
			return (int)r;
		}
		return CORRUPT("%s: copy %zu, position %zu, sample %llu (bytes %llu..%llu): %s", ds->paths[f],
			       k / cp->n, k % cp->n, (unsigned long long)i, (unsigned long long)cp->off[k],
			       (unsigned long long)(cp->off[k] + l),
			       (uint64_t)r == l ? "checksum mismatch with the index" : "past the end of the file");
	}
	free(buf);
	return 0;
}

/* ---------------------------------------------------------------------------------- the writer */

struct ferry_dataset_writer {
	ferry_ctx *ctx;
	char *path;
	enum ferry_dataset_kind kind;
	enum ferry_dtype dtype;
	uint64_t shard_size;
	uint64_t n, cap;
	uint64_t *len, *off;
	uint32_t *crc, *shard;
	uint8_t *doc_end;
	char *keys;
	uint64_t keys_len, keys_cap, *key_off;
	int has_keys, laid_out;
	uint32_t nshards;
	uint64_t *shard_bytes, *shard_first;
	int *fds;
	/* Each data file is a temporary in dirfd until finish renames it into place (durable.h), so
	 * that a pack that fails or dies leaves no half-written shard under a shard's name. */
	struct ferry__tmpfile *tmp;
	int dirfd;
	uint32_t ncopies; /* ferry_dataset_writer_set_copies */
	uint64_t copies_seed;
};

/* The name in the writer's directory of data file s, or of the index (s < 0). */
static void writer_name(const struct ferry_dataset_writer *w, int64_t s, char *out, size_t len)
{
	const char *slash = strrchr(w->path, '/'), *base = slash ? slash + 1 : w->path;
	if (w->kind != FERRY_WRITE_FERRY)
		snprintf(out, len, "%s.%s", base, s < 0 ? "idx" : "bin");
	else if (s < 0)
		snprintf(out, len, "%s", FERRY__IDX_NAME);
	else
		snprintf(out, len, "shard-%05u.fsh", (unsigned)s);
}

/* The directory a writer's files go to. */
static void writer_dir(const struct ferry_dataset_writer *w, char *dir, size_t len)
{
	snprintf(dir, len, "%s", w->path);
	if (w->kind != FERRY_WRITE_FERRY) {
		char *slash = strrchr(dir, '/');
		if (slash)
			*slash = slash == dir ? (slash[1] = 0, '/') : 0;
		else
			snprintf(dir, len, ".");
	}
}

int ferry_dataset_writer_create(ferry_ctx *ctx, const char *path, enum ferry_dataset_kind kind,
				enum ferry_dtype dtype, uint64_t shard_size, ferry_dataset_writer **out)
{
	if (!path || !out || (kind != FERRY_WRITE_FERRY && kind != FERRY_WRITE_MEGATRON))
		return ferry__error(-EINVAL, "ferry_dataset_writer_create: bad argument");
	if (ferry__dtype_megatron_code(dtype) < 0)
		return ferry__error(FERRY_EBADOPT, "ferry_dataset_writer_create: dtype %s cannot be a dataset's",
				    ferry_dtype_name(dtype) ? ferry_dtype_name(dtype) : "(unknown)");
	if (kind == FERRY_WRITE_MEGATRON && dtype == FERRY_DT_BYTES)
		dtype = FERRY_DT_U8;
	struct ferry_dataset_writer *w = calloc(1, sizeof(*w));
	if (!w || !(w->path = strdup(path))) {
		free(w);
		return ferry__error(-ENOMEM, "ferry_dataset_writer_create(%s)", path);
	}
	w->ctx = ctx;
	w->dirfd = -1;
	w->kind = kind;
	w->dtype = dtype;
	w->shard_size = shard_size ? shard_size : (1ull << 30);
	char dir[PATH_MAX], idx[256];
	writer_dir(w, dir, sizeof(dir));
	if (kind == FERRY_WRITE_FERRY && mkdir(path, 0755) < 0 && errno != EEXIST) {
		int e = -errno;
		ferry_dataset_writer_destroy(w);
		return ferry__error(e, "mkdir(%s)", path);
	}
	w->dirfd = ferry__dir_open(dir, FERRY__DIR_FOLLOW);
	if (w->dirfd < 0) {
		int e = w->dirfd;
		ferry_dataset_writer_destroy(w);
		return e;
	}
	/* An index left from an earlier dataset at this path must not describe the new data files. */
	writer_name(w, -1, idx, sizeof(idx));
	/* nor copies left from one (ferry.copies names the index it belongs to; removed all the same) */
	int gone = kind == FERRY_WRITE_FERRY && unlinkat(w->dirfd, FERRY__CPY_NAME, 0) == 0;
	if (unlinkat(w->dirfd, idx, 0) == 0 || gone) {
		int err = ferry__fsync_dirfd(w->dirfd, dir);
		if (err) {
			ferry_dataset_writer_destroy(w);
			return err;
		}
	}
	*out = w;
	return 0;
}

void ferry_dataset_writer_destroy(ferry_dataset_writer *w)
{
	if (!w)
		return;
	if (w->tmp) /* closes each data file and removes it unless finish renamed it */
		for (uint32_t s = 0; s < w->nshards; s++)
			ferry__tmp_abort(&w->tmp[s]);
	if (w->dirfd >= 0)
		close(w->dirfd);
	free(w->tmp);
	free(w->fds);
	free(w->len);
	free(w->off);
	free(w->crc);
	free(w->shard);
	free(w->doc_end);
	free(w->keys);
	free(w->key_off);
	free(w->shard_bytes);
	free(w->shard_first);
	free(w->path);
	free(w);
}

static int grow(void **p, uint64_t cap, size_t elem)
{
	void *q = realloc(*p, cap * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	return 0;
}

int64_t ferry_dataset_writer_add(ferry_dataset_writer *w, uint64_t bytes, const char *key,
				 size_t key_len, int document_end)
{
	if (!w || w->laid_out)
		return ferry__error(FERRY_EBUSY, "ferry_dataset_writer_add after layout");
	if (w->kind == FERRY_WRITE_FERRY && bytes > UINT32_MAX)
		return ferry__error(-EFBIG, "sample %llu: %llu bytes, a ferry shard sample holds 4 GiB - 1 at most",
				    (unsigned long long)w->n, (unsigned long long)bytes);
	if (bytes % ferry__dtype_size(w->dtype))
		return ferry__error(-EINVAL, "sample %llu: %llu bytes is not a whole number of %s",
				    (unsigned long long)w->n, (unsigned long long)bytes,
				    ferry_dtype_numpy_name(w->dtype));
	if (w->kind == FERRY_WRITE_MEGATRON && bytes / ferry__dtype_size(w->dtype) > INT32_MAX)
		return ferry__error(-EFBIG, "sample %llu: too many elements for Megatron's int32 sizes",
				    (unsigned long long)w->n);
	if (w->n == w->cap) {
		uint64_t c = w->cap ? w->cap * 2 : 1024;
		if (grow((void **)&w->len, c, 8) || grow((void **)&w->off, c, 8) ||
		    grow((void **)&w->crc, c, 4) || grow((void **)&w->shard, c, 4) ||
		    grow((void **)&w->doc_end, c, 1) || grow((void **)&w->key_off, c + 1, 8))
			return ferry__error(-ENOMEM, "ferry_dataset_writer_add: %llu samples", (unsigned long long)c);
		w->cap = c;
	}
	if (key && key_len) {
		w->has_keys = 1;
		if (w->keys_len + key_len > w->keys_cap) {
			uint64_t c = (w->keys_cap + key_len) * 2;
			if (grow((void **)&w->keys, c, 1))
				return ferry__error(-ENOMEM, "ferry_dataset_writer_add: keys");
			w->keys_cap = c;
		}
		memcpy(w->keys + w->keys_len, key, key_len);
	}
	w->key_off[w->n] = w->keys_len;
	w->keys_len += key && key_len ? key_len : 0;
	w->len[w->n] = bytes;
	w->crc[w->n] = 0;
	w->doc_end[w->n] = document_end ? 1 : 0;
	return (int64_t)w->n++;
}

int ferry_dataset_writer_layout(ferry_dataset_writer *w)
{
	if (!w || w->laid_out)
		return ferry__error(FERRY_EBUSY, "ferry_dataset_writer_layout: already laid out");
	w->key_off = w->key_off ? w->key_off : calloc(1, 8);
	if (!w->key_off)
		return -ENOMEM;
	w->key_off[w->n] = w->keys_len;
	uint32_t ns = 0;
	uint64_t cur = 0;
	/* Count shards first: a sample never straddles two. Megatron output is one .bin. */
	for (uint64_t i = 0; i < w->n; i++) {
		if (w->kind == FERRY_WRITE_FERRY && ns && cur && cur + w->len[i] > w->shard_size) {
			ns++;
			cur = 0;
		}
		if (!ns)
			ns = 1;
		cur += w->len[i];
	}
	if (!ns && w->kind == FERRY_WRITE_MEGATRON)
		ns = 1;
	w->nshards = ns;
	w->shard_bytes = calloc(ns ? ns : 1, 8);
	w->shard_first = calloc((size_t)ns + 1, 8);
	w->fds = malloc((ns ? ns : 1) * sizeof(int));
	w->tmp = calloc(ns ? ns : 1, sizeof(*w->tmp));
	if (!w->shard_bytes || !w->shard_first || !w->fds || !w->tmp)
		return ferry__error(-ENOMEM, "ferry_dataset_writer_layout");
	for (uint32_t s = 0; s < ns; s++)
		w->fds[s] = w->tmp[s].fd = -1;
	uint32_t s = 0;
	cur = 0;
	for (uint64_t i = 0; i < w->n; i++) {
		if (w->kind == FERRY_WRITE_FERRY && cur && cur + w->len[i] > w->shard_size) {
			w->shard_bytes[s++] = cur;
			w->shard_first[s] = i;
			cur = 0;
		}
		w->off[i] = cur;
		w->shard[i] = s;
		cur += w->len[i];
	}
	if (ns)
		w->shard_bytes[s] = cur;
	w->shard_first[ns] = w->n;
	for (s = 0; s < ns; s++) {
		char name[256];
		writer_name(w, s, name, sizeof(name));
		int r = ferry__tmp_create(w->dirfd, name, 0644, 0, &w->tmp[s]);
		if (r) {
			ferry__error_append("writing the dataset %s", w->path);
			return r;
		}
		w->fds[s] = w->tmp[s].fd;
		if (ftruncate(w->fds[s], (off_t)w->shard_bytes[s]) < 0)
			return ferry__error(-errno, "ftruncate(%s/%s, %llu)", w->path, w->tmp[s].name,
					    (unsigned long long)w->shard_bytes[s]);
	}
	w->laid_out = 1;
	return (int)ns;
}

int64_t ferry_dataset_writer_shard_of(const ferry_dataset_writer *w, uint64_t i)
{
	if (!w || !w->laid_out || i >= w->n)
		return -EINVAL;
	return w->shard[i];
}

int ferry_dataset_writer_put(ferry_dataset_writer *w, uint64_t i, const void *data, size_t len)
{
	if (!w || !w->laid_out || i >= w->n)
		return ferry__error(-EINVAL, "ferry_dataset_writer_put: sample %llu", (unsigned long long)i);
	if (len != w->len[i])
		return ferry__error(-EINVAL, "ferry_dataset_writer_put: sample %llu is %zu bytes, declared %llu",
				    (unsigned long long)i, len, (unsigned long long)w->len[i]);
	w->crc[i] = ferry__crc32c(0, data, len);
	const uint8_t *p = data;
	size_t done = 0;
	while (done < len) {
		ssize_t r = pwrite(w->fds[w->shard[i]], p + done, len - done, (off_t)(w->off[i] + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return ferry__error(-errno, "pwrite(shard %u, offset %llu, %zu bytes) of sample %llu",
					    w->shard[i], (unsigned long long)(w->off[i] + done), len - done,
					    (unsigned long long)i);
		done += (size_t)r;
	}
	return 0;
}

static int build_ferry_index(ferry_dataset_writer *w, uint8_t **out, size_t *out_len)
{
	uint64_t keys_len = w->has_keys ? w->keys_len : 0;
	size_t len = FERRY__IDX_HEADER + (size_t)w->nshards * FERRY__IDX_SHARD_ENTRY +
		     w->n * FERRY__IDX_SAMPLE_ENTRY + 8;
	if (w->has_keys)
		len += (w->n + 1) * 8 + ((keys_len + 7) & ~7ull);
	uint8_t *b = calloc(1, len);
	if (!b)
		return ferry__error(-ENOMEM, "index of %llu samples", (unsigned long long)w->n);
	uint64_t bytes = 0;
	for (uint64_t i = 0; i < w->n; i++)
		bytes += w->len[i];
	memcpy(b, FERRY__IDX_MAGIC, 8);
	ferry__wr32(b + 8, FERRY__IDX_VERSION);
	ferry__wr32(b + 12, w->has_keys ? FERRY__IDX_FLAG_KEYS : 0);
	ferry__wr32(b + 16, (uint32_t)ferry__dtype_megatron_code(w->dtype)); /* Megatron's codes, 0 bytes */
	ferry__wr32(b + 20, w->nshards);
	ferry__wr64(b + 24, w->n);
	ferry__wr64(b + 32, bytes);
	ferry__wr64(b + 40, len);
	ferry__wr64(b + 48, keys_len);
	uint8_t *p = b + FERRY__IDX_HEADER;
	for (uint32_t s = 0; s < w->nshards; s++, p += FERRY__IDX_SHARD_ENTRY) {
		ferry__wr64(p, w->shard_bytes[s]);
		ferry__wr64(p + 8, w->shard_first[s]);
		ferry__wr64(p + 16, w->shard_first[s + 1] - w->shard_first[s]);
	}
	for (uint64_t i = 0; i < w->n; i++, p += FERRY__IDX_SAMPLE_ENTRY) {
		ferry__wr64(p, w->off[i]);
		ferry__wr32(p + 8, (uint32_t)w->len[i]);
		ferry__wr32(p + 12, w->crc[i]);
	}
	if (w->has_keys) {
		for (uint64_t i = 0; i <= w->n; i++, p += 8)
			ferry__wr64(p, w->key_off[i]);
		memcpy(p, w->keys, keys_len);
	}
	ferry__wr32(b + len - 8, ferry__crc32c(0, b, len - 8));
	memcpy(b + len - 4, FERRY__IDX_END, 4);
	*out = b;
	*out_len = len;
	return 0;
}

int ferry_dataset_writer_set_copies(ferry_dataset_writer *w, uint32_t ncopies, uint64_t seed)
{
	if (!w)
		return ferry__error(-EINVAL, "ferry_dataset_writer_set_copies: NULL writer");
	if (ncopies && w->kind != FERRY_WRITE_FERRY)
		return ferry__error(-EINVAL, "%s: pre-shuffled copies are for the ferry format, not Megatron's",
				    w->path);
	if (ncopies > 999)
		return ferry__error(-EINVAL, "%s: %u pre-shuffled copies, 999 at most", w->path, ncopies);
	w->ncopies = ncopies;
	w->copies_seed = seed;
	return 0;
}

/*
 * Writes copy c: the samples in the order of epoch c of the shuffle, read back from the committed
 * shards (just written: mostly in the page cache) and written sequentially into new shards, laid
 * out as the writer's own (a sample never straddles two). Appends the copy's table to *cb.
 */
static int write_copy(ferry_dataset_writer *w, uint32_t c, const int *in_fd, int64_t *perm, uint8_t **cb,
		      size_t *cb_len)
{
	uint64_t n = w->n;
	int err = ferry_order_indices(n, FERRY_ORDER_SHUFFLE, 0, w->copies_seed, c, perm);
	if (err)
		return err;
	uint32_t ns = 0;
	uint64_t cur = 0;
	for (uint64_t p = 0; p < n; p++) {
		uint64_t l = w->len[perm[p]];
		if (!ns || (cur && cur + l > w->shard_size)) {
			ns++;
			cur = 0;
		}
		cur += l;
	}
	size_t add = FERRY__CPY_COPY_HEADER + (size_t)ns * FERRY__IDX_SHARD_ENTRY + n * FERRY__CPY_POS_ENTRY;
	uint8_t *b = realloc(*cb, *cb_len + add);
	if (!b)
		return ferry__error(-ENOMEM, "%s: copy %u", w->path, c);
	*cb = b;
	uint8_t *h = b + *cb_len, *sh = h + FERRY__CPY_COPY_HEADER, *pe = sh + (size_t)ns * FERRY__IDX_SHARD_ENTRY;
	memset(h, 0, add);
	ferry__wr32(h, ns);
	*cb_len += add;
	size_t cap = 1 << 20;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return ferry__error(-ENOMEM, "%s: copy %u", w->path, c);
	struct ferry__tmpfile t = {.fd = -1};
	int32_t s = -1;
	uint64_t first = 0;
	cur = 0;
	for (uint64_t p = 0; p <= n && !err; p++) {
		uint64_t i = p < n ? (uint64_t)perm[p] : 0, l = p < n ? w->len[i] : 0;
		if (s < 0 || p == n || (cur && cur + l > w->shard_size)) {
			if (s >= 0) { /* shard s is complete */
				ferry__wr64(sh + (size_t)s * FERRY__IDX_SHARD_ENTRY, cur);
				ferry__wr64(sh + (size_t)s * FERRY__IDX_SHARD_ENTRY + 8, first);
				ferry__wr64(sh + (size_t)s * FERRY__IDX_SHARD_ENTRY + 16, p - first);
				err = ferry__tmp_commit(&t, 0);
				if (err)
					break;
			}
			if (p == n)
				break;
			char name[64];
			copy_shard_name(c, (uint32_t)++s, name, sizeof(name));
			if ((err = ferry__tmp_create(w->dirfd, name, 0644, 0, &t)))
				break;
			first = p;
			cur = 0;
		}
		if (l > cap) {
			free(buf);
			cap = l;
			if (!(buf = malloc(cap))) {
				err = ferry__error(-ENOMEM, "%s: sample %llu", w->path, (unsigned long long)i);
				break;
			}
		}
		for (uint64_t done = 0; done < l && !err;) {
			ssize_t r = pread(in_fd[w->shard[i]], buf + done, l - done, (off_t)(w->off[i] + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				err = ferry__error(r < 0 ? -errno : -EIO, "%s: reading back sample %llu (shard %u)",
						   w->path, (unsigned long long)i, w->shard[i]);
			else
				done += (uint64_t)r;
		}
		for (uint64_t done = 0; done < l && !err;) {
			ssize_t r = pwrite(t.fd, buf + done, l - done, (off_t)(cur + done));
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				err = ferry__error(-errno, "%s: writing copy %u, shard %d", w->path, c, s);
			else
				done += (uint64_t)r;
		}
		ferry__wr64(pe + p * FERRY__CPY_POS_ENTRY, i);
		ferry__wr64(pe + p * FERRY__CPY_POS_ENTRY + 8, cur);
		cur += l;
	}
	if (err)
		ferry__tmp_abort(&t);
	free(buf);
	return err;
}

/* Writes the copies' shards, then ferry.copies naming the index by its checksum idx_crc. */
static int write_copies(ferry_dataset_writer *w, uint32_t idx_crc)
{
	int err = 0;
	int *fd = calloc(w->nshards ? w->nshards : 1, sizeof(int));
	int64_t *perm = malloc((w->n ? w->n : 1) * sizeof(int64_t));
	size_t len = FERRY__CPY_HEADER;
	uint8_t *b = calloc(1, len);
	if (!fd || !perm || !b)
		err = ferry__error(-ENOMEM, "%s: copies of %llu samples", w->path, (unsigned long long)w->n);
	for (uint32_t s = 0; s < w->nshards && fd; s++)
		fd[s] = -1;
	for (uint32_t s = 0; s < w->nshards && !err; s++) {
		char name[256];
		writer_name(w, s, name, sizeof(name));
		fd[s] = openat(w->dirfd, name, O_RDONLY | O_CLOEXEC);
		if (fd[s] < 0)
			err = ferry__error(-errno, "%s: reopening %s", w->path, name);
	}
	for (uint32_t c = 0; c < w->ncopies && !err; c++)
		err = write_copy(w, c, fd, perm, &b, &len);
	for (uint32_t s = 0; s < w->nshards && fd; s++)
		if (fd[s] >= 0)
			close(fd[s]);
	free(fd);
	free(perm);
	uint8_t *nb = err ? NULL : realloc(b, len + 8);
	if (!err && !nb)
		err = ferry__error(-ENOMEM, "%s: copies", w->path);
	if (err) {
		free(b);
		return err;
	}
	b = nb;
	len += 8;
	memcpy(b, FERRY__CPY_MAGIC, 8);
	ferry__wr32(b + 8, FERRY__CPY_VERSION);
	ferry__wr32(b + 12, 0);
	ferry__wr64(b + 16, w->n);
	ferry__wr32(b + 24, idx_crc);
	ferry__wr32(b + 28, w->ncopies);
	ferry__wr64(b + 32, w->copies_seed);
	ferry__wr64(b + 40, len);
	ferry__wr32(b + len - 8, ferry__crc32c(0, b, len - 8));
	memcpy(b + len - 4, FERRY__IDX_END, 4);
	err = ferry__durable_write(w->dirfd, FERRY__CPY_NAME, b, len, 0644, 0);
	free(b);
	return err;
}

int ferry__megatron_build_index(enum ferry_dtype dtype, uint64_t n, const uint64_t *len, const uint64_t *off,
				const uint8_t *doc_end, uint8_t **out, size_t *out_len);

int ferry_dataset_writer_finish(ferry_dataset_writer *w)
{
	if (!w || !w->laid_out)
		return ferry__error(-EINVAL, "ferry_dataset_writer_finish before layout");
	char idx[256];
	int err = 0;
	/* Data files first (each fsynced, renamed, the directory fsynced), then the index that names them. */
	for (uint32_t s = 0; s < w->nshards && !err; s++) {
		err = ferry__tmp_commit(&w->tmp[s], 0);
		w->fds[s] = -1;
	}
	if (err) {
		ferry__error_append("shards of %s", w->path);
		return err;
	}
	uint8_t *buf;
	size_t len;
	if (w->kind == FERRY_WRITE_FERRY)
		err = build_ferry_index(w, &buf, &len);
	else
		err = ferry__megatron_build_index(w->dtype, w->n, w->len, w->off, w->doc_end, &buf, &len);
	if (err)
		return err;
	/* the copies (their shards, then ferry.copies) before the index that makes the dataset exist */
	if (w->kind == FERRY_WRITE_FERRY && w->ncopies && (err = write_copies(w, ferry__rd32(buf + len - 8)))) {
		free(buf);
		ferry__error_append("pre-shuffled copies of %s", w->path);
		return err;
	}
	writer_name(w, -1, idx, sizeof(idx));
	err = ferry__durable_write(w->dirfd, idx, buf, len, 0644, 0);
	free(buf);
	return err;
}
