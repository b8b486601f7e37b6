/*
 * ferry ckpt inspect/verify of PyTorch's own files, without Python: a torch.distributed.checkpoint
 * directory (its `.metadata` read by the restricted unpickler of tools/torchfmt.c, every item's byte
 * range checked against its file, every item's zip and crc32s) and a torch.save file (the zip's
 * records and crc32s, the tensors data.pkl rebuilds and their storages).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_torch.h"
#include "ferry/ferry.h"
#include "ferry_tools.h"
#include "ferry_torchfmt.h"

#define META_MAX (1ull << 30)
#define PKL_MAX (256ull << 20)

/* A reader of [base, base + length) of a file. */
struct src {
	int fd;
	uint64_t base, length;
};

static int64_t src_read(void *u, uint64_t off, void *buf, size_t n)
{
	struct src *s = u;
	if (off >= s->length)
		return 0;
	if (n > s->length - off)
		n = (size_t)(s->length - off);
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(s->fd, (char *)buf + got, n - got, (off_t)(s->base + off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (int64_t)got;
}

enum ckpt_torch_kind ckpt_torch_kind(const char *path)
{
	struct stat st;
	char p[4200];
	if (stat(path, &st))
		return CKPT_TORCH_NONE;
	if (S_ISDIR(st.st_mode)) {
		snprintf(p, sizeof(p), "%s/.metadata", path);
		return access(p, F_OK) ? CKPT_TORCH_NONE : CKPT_TORCH_DCP;
	}
	if (!S_ISREG(st.st_mode))
		return CKPT_TORCH_NONE; /* a FIFO's open would block: the safetensors path refuses it by name */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	char magic[4] = {0};
	int zip = fd >= 0 && pread(fd, magic, 4, 0) == 4 && !memcmp(magic, "PK\x03\x04", 4);
	if (fd >= 0)
		close(fd);
	return zip ? CKPT_TORCH_ZIP : CKPT_TORCH_NONE;
}

/* ------------------------------------------------------------------------------------------ problems */

struct problems {
	char **msg;
	int *code;
	size_t n, cap;
	int json;
};

static void problem(struct problems *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void problem(struct problems *p, int code, const char *fmt, ...)
{
	char buf[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (p->n == p->cap) {
		size_t c = p->cap ? 2 * p->cap : 8;
		char **m = realloc(p->msg, c * sizeof(*m));
		int *k = m ? realloc(p->code, c * sizeof(*k)) : NULL;
		if (m)
			p->msg = m;
		if (!k)
			return;
		p->code = k;
		p->cap = c;
	}
	char *s = strdup(buf);
	if (!s)
		return;
	p->msg[p->n] = s;
	p->code[p->n++] = code;
}

static void problems_free(struct problems *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->msg[i]);
	free(p->msg);
	free(p->code);
}

static void json_problems(const struct problems *p)
{
	printf("\"problems\":[");
	for (size_t i = 0; i < p->n; i++) {
		printf("%s{\"error\":", i ? "," : "");
		ferry_tools_json_string(stdout, ferry_strerror(p->code[i]));
		printf(",\"message\":");
		ferry_tools_json_string(stdout, p->msg[i]);
		printf("}");
	}
	printf("]");
}

static void text_problems(const struct problems *p)
{
	for (size_t i = 0; i < p->n; i++)
		fprintf(stderr, "ferry ckpt verify: %s: %s\n", ferry_strerror(p->code[i]), p->msg[i]);
}

static int failed(const char *cmd, const char *path, int json, int code)
{
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, path);
		printf(",\"ok\":false,\"problems\":[{\"error\":");
		ferry_tools_json_string(stdout, ferry_strerror(code));
		printf(",\"message\":");
		ferry_tools_json_string(stdout, ferry_last_error());
		printf("}]}\n");
	} else {
		fprintf(stderr, "ferry ckpt %s: %s: %s\n", cmd, ferry_strerror(code), ferry_last_error());
	}
	return 1;
}

static void json_dims(const char *key, const uint64_t *d, int n)
{
	printf(",\"%s\":[", key);
	for (int i = 0; i < n; i++)
		printf("%s%" PRIu64, i ? "," : "", d[i]);
	printf("]");
}

static void text_dims(const uint64_t *d, int n)
{
	printf("[");
	for (int i = 0; i < n; i++)
		printf("%s%" PRIu64, i ? ", " : "", d[i]);
	printf("]");
}

static uint64_t volume(const uint64_t *d, int n)
{
	uint64_t v = 1;
	for (int i = 0; i < n; i++)
		v = __builtin_mul_overflow(v, d[i], &v) ? UINT64_MAX : v;
	return v;
}

/* ---------------------------------------------------------------------------------- torch.save */

static void print_tensor(const struct ferry_tf_tensor *t, int json, int first)
{
	uint64_t bytes = volume(t->shape, t->ndim) * (uint64_t)t->elsize;
	if (json) {
		printf("%s{\"name\":", first ? "" : ",");
		ferry_tools_json_string(stdout, t->name);
		printf(",\"dtype\":\"%s\"", t->dtype);
		json_dims("shape", t->shape, t->ndim);
		json_dims("stride", t->stride, t->ndim);
		printf(",\"storage\":");
		ferry_tools_json_string(stdout, t->key);
		printf(",\"location\":");
		ferry_tools_json_string(stdout, t->location);
		printf(",\"storage_offset\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", t->offset, bytes);
	} else {
		printf("  %-40s %-9s ", t->name[0] ? t->name : "(the object)", t->dtype);
		text_dims(t->shape, t->ndim);
		printf(" storage %s on %s, %" PRIu64 " bytes\n", t->key, t->location, bytes);
	}
}

static int zip_inspect(const char *path, int json)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		if (fd >= 0)
			close(fd);
		return fprintf(stderr, "ferry ckpt inspect: %s: %s\n", path, strerror(errno)), 1;
	}
	struct src s = {fd, 0, (uint64_t)st.st_size};
	struct ferry_tf_pt pt;
	int r = ferry_tf_pt_open(path, 0, s.length, src_read, &s, &pt);
	close(fd);
	if (r)
		return failed("inspect", path, 0, r);
	uint64_t sbytes = 0, nst = 0;
	for (size_t i = 0; i < pt.zip.n; i++)
		if (!strncmp(pt.zip.rec[i].name + pt.zip.prefix_len, "data/", 5))
			sbytes += pt.zip.rec[i].size, nst++;
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, path);
		printf(",\"format\":\"torch.save\",\"size\":%" PRIu64 ",\"storages\":%" PRIu64 ",\"storage_bytes\":%" PRIu64
		       ",\"records\":[", (uint64_t)st.st_size, nst, sbytes);
		for (size_t i = 0; i < pt.zip.n; i++) {
			printf("%s{\"name\":", i ? "," : "");
			ferry_tools_json_string(stdout, pt.zip.rec[i].name);
			printf(",\"offset\":%" PRIu64 ",\"size\":%" PRIu64 ",\"crc32\":\"%08" PRIx32 "\"}", pt.zip.rec[i].data,
			       pt.zip.rec[i].size, pt.zip.rec[i].crc);
		}
		printf("],\"tensors\":[");
		for (size_t i = 0; i < pt.n; i++)
			print_tensor(&pt.t[i], 1, i == 0);
		printf("]}\n");
	} else {
		printf("%s: torch.save file, %zu records, %" PRIu64 " storages of %" PRIu64 " bytes, %zu tensors\n", path,
		       pt.zip.n, nst, sbytes, pt.n);
		for (size_t i = 0; i < pt.zip.n; i++)
			printf("  record %-40s offset %" PRIu64 " size %" PRIu64 "\n", pt.zip.rec[i].name, pt.zip.rec[i].data,
			       pt.zip.rec[i].size);
		for (size_t i = 0; i < pt.n; i++)
			print_tensor(&pt.t[i], 0, i == 0);
	}
	ferry_tf_pt_free(&pt);
	return 0;
}

/* Every record's crc32 and every tensor's storage; counts into *crc_ok, *crc_none. */
static void pt_verify(const char *name, const struct src *s, struct ferry_tf_pt *pt, struct problems *p,
		      uint64_t *crc_ok, uint64_t *crc_none)
{
	for (size_t i = 0; i < pt->zip.n; i++) {
		int r = ferry_tf_zip_check(name, s->base, &pt->zip.rec[i], src_read, (void *)s);
		if (r == 1)
			++*crc_ok;
		else if (r == 0)
			++*crc_none;
		else
			problem(p, r, "%s", ferry_last_error());
	}
	for (size_t i = 0; i < pt->n; i++) {
		int r = ferry_tf_pt_check(name, s->base, pt, i);
		if (r)
			problem(p, r, "%s", ferry_last_error());
	}
}

static int zip_verify(const char *path, int json)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		if (fd >= 0)
			close(fd);
		return fprintf(stderr, "ferry ckpt verify: %s: %s\n", path, strerror(errno)), 1;
	}
	struct src s = {fd, 0, (uint64_t)st.st_size};
	struct ferry_tf_pt pt;
	struct problems p = {0};
	uint64_t ok = 0, none = 0;
	int r = ferry_tf_pt_open(path, 0, s.length, src_read, &s, &pt);
	if (r) {
		close(fd);
		return failed("verify", path, json, r);
	}
	pt_verify(path, &s, &pt, &p, &ok, &none);
	close(fd);
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, path);
		printf(",\"format\":\"torch.save\",\"ok\":%s,\"records\":%zu,\"tensors\":%zu,\"crc32_verified\":%" PRIu64
		       ",\"crc32_absent\":%" PRIu64 ",",
		       p.n ? "false" : "true", pt.zip.n, pt.n, ok, none);
		json_problems(&p);
		printf("}\n");
	} else {
		text_problems(&p);
		printf("%s: torch.save file, %zu records (%" PRIu64 " crc32s verified, %" PRIu64 " stored as 0), %zu "
		       "tensors\n%s\n", path, pt.zip.n, ok, none, pt.n, p.n ? "FAILED" : "OK");
	}
	int rc = p.n ? 1 : 0;
	problems_free(&p);
	ferry_tf_pt_free(&pt);
	return rc;
}

/* ------------------------------------------------------------------------------------------- DCP */

/* 0, 1 after an error printed, or a negative code (ferry_last_error()) for a .metadata that does not parse. */
static int dcp_load(const char *dir, struct ferry_tf_dcp *d)
{
	memset(d, 0, sizeof(*d));
	char p[4200];
	snprintf(p, sizeof(p), "%s/.metadata", dir);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		fprintf(stderr, "ferry ckpt: %s: %s\n", p, strerror(e));
		return 1;
	}
	if ((uint64_t)st.st_size > META_MAX) {
		close(fd);
		fprintf(stderr, "ferry ckpt: %s: %lld bytes, more than the 1 GiB read here\n", p, (long long)st.st_size);
		return 1;
	}
	uint8_t *b = malloc(st.st_size ? (size_t)st.st_size : 1);
	struct src s = {fd, 0, (uint64_t)st.st_size};
	int64_t got = b ? src_read(&s, 0, b, (size_t)st.st_size) : -ENOMEM;
	close(fd);
	if (got != st.st_size) {
		free(b);
		fprintf(stderr, "ferry ckpt: %s: %s\n", p, got < 0 ? strerror((int)-got) : "short read");
		return 1;
	}
	int r = ferry_tf_dcp_parse(p, b, (size_t)st.st_size, d);
	free(b);
	return r;
}

/* The files the pieces name, in first-named order, with their pieces and bytes. */
struct dfile {
	const char *name;
	uint64_t pieces, bytes;
	int64_t size; /* -1: missing */
};

static struct dfile *dcp_files(const char *dir, const struct ferry_tf_dcp *d, size_t *nf)
{
	struct dfile *f = NULL;
	size_t n = 0, cap = 0;
	for (size_t i = 0; i < d->n; i++)
		for (size_t c = 0; c < d->item[i].n; c++) {
			const struct ferry_tf_dcp_piece *pc = &d->item[i].piece[c];
			if (!pc->file)
				continue;
			size_t k = 0;
			while (k < n && strcmp(f[k].name, pc->file))
				k++;
			if (k == n) {
				if (n == cap) {
					cap = cap ? 2 * cap : 8;
					struct dfile *g = realloc(f, cap * sizeof(*g));
					if (!g) {
						free(f);
						return NULL;
					}
					f = g;
				}
				char p[4300];
				struct stat st;
				snprintf(p, sizeof(p), "%s/%s", dir, pc->file);
				f[n] = (struct dfile){pc->file, 0, 0, stat(p, &st) || !S_ISREG(st.st_mode) ? -1 : st.st_size};
				n++;
			}
			f[k].pieces++;
			f[k].bytes += pc->length;
		}
	*nf = n;
	return f ? f : calloc(1, sizeof(*f));
}

static int dcp_inspect(const char *dir, int json)
{
	struct ferry_tf_dcp d;
	int r = dcp_load(dir, &d);
	if (r)
		return r > 0 ? 1 : failed("inspect", dir, 0, r);
	size_t nf = 0, ntensor = 0;
	struct dfile *f = dcp_files(dir, &d, &nf);
	uint64_t tbytes = 0;
	for (size_t i = 0; i < d.n; i++)
		if (!d.item[i].is_bytes)
			ntensor++, tbytes += volume(d.item[i].size, d.item[i].ndim) * (uint64_t)d.item[i].elsize;
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, dir);
		printf(",\"format\":\"dcp\",\"version\":");
		ferry_tools_json_string(stdout, d.version);
		printf(",\"tensors\":%zu,\"bytes_items\":%zu,\"tensor_bytes\":%" PRIu64 ",\"items\":[", ntensor, d.n - ntensor,
		       tbytes);
		for (size_t i = 0; i < d.n; i++) {
			const struct ferry_tf_dcp_item *it = &d.item[i];
			printf("%s{\"fqn\":", i ? "," : "");
			ferry_tools_json_string(stdout, it->fqn);
			if (it->is_bytes) {
				printf(",\"kind\":\"bytes\"");
			} else {
				printf(",\"kind\":\"tensor\",\"dtype\":\"%s\"", it->dtype);
				json_dims("shape", it->size, it->ndim);
				printf(",\"bytes\":%" PRIu64, volume(it->size, it->ndim) * (uint64_t)it->elsize);
			}
			printf(",\"pieces\":[");
			for (size_t c = 0; c < it->n; c++) {
				const struct ferry_tf_dcp_piece *pc = &it->piece[c];
				printf("%s{\"file\":", c ? "," : "");
				if (pc->file)
					ferry_tools_json_string(stdout, pc->file);
				else
					printf("null");
				if (!it->is_bytes) {
					json_dims("offsets", pc->offsets, it->ndim);
					json_dims("sizes", pc->sizes, it->ndim);
				}
				printf(",\"offset\":%" PRIu64 ",\"length\":%" PRIu64 ",\"transformed\":%s}", pc->offset, pc->length,
				       pc->transformed ? "true" : "false");
			}
			printf("]}");
		}
		printf("],\"files\":[");
		for (size_t k = 0; k < nf; k++) {
			printf("%s{\"name\":", k ? "," : "");
			ferry_tools_json_string(stdout, f[k].name);
			printf(",\"pieces\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"size\":%" PRId64 "}", f[k].pieces, f[k].bytes,
			       f[k].size);
		}
		printf("]}\n");
	} else {
		printf("%s: torch.distributed.checkpoint (version %s), %zu tensors of %" PRIu64 " bytes, %zu bytes items, "
		       "%zu files\n", dir, d.version[0] ? d.version : "?", ntensor, tbytes, d.n - ntensor, nf);
		for (size_t i = 0; i < d.n; i++) {
			const struct ferry_tf_dcp_item *it = &d.item[i];
			if (it->is_bytes) {
				const struct ferry_tf_dcp_piece *pc = &it->piece[0];
				printf("  %-40s bytes     in %s at %" PRIu64 ", %" PRIu64 " bytes\n", it->fqn,
				       pc->file ? pc->file : "(no file)", pc->offset, pc->length);
				continue;
			}
			printf("  %-40s %-9s ", it->fqn, it->dtype);
			text_dims(it->size, it->ndim);
			printf(" %zu chunk%s, %" PRIu64 " bytes\n", it->n, it->n == 1 ? "" : "s",
			       volume(it->size, it->ndim) * (uint64_t)it->elsize);
		}
		for (size_t k = 0; k < nf; k++) {
			printf("  file %s: %" PRIu64 " items, %" PRIu64 " bytes", f[k].name, f[k].pieces, f[k].bytes);
			if (f[k].size < 0)
				printf(" (missing)");
			putchar('\n');
		}
	}
	free(f);
	ferry_tf_dcp_free(&d);
	return 0;
}

/* One piece: inside its file, and the torch.save zip it holds (crc32s; a tensor chunk's dtype and shape). */
static void dcp_piece(const char *dir, const struct ferry_tf_dcp_item *it, const struct ferry_tf_dcp_piece *pc,
		      const struct dfile *f, struct problems *p, uint64_t *crc_ok, uint64_t *crc_none)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/%s", dir, pc->file);
	if (f->size < 0)
		return; /* reported once per file */
	if (pc->offset > (uint64_t)f->size || pc->length > (uint64_t)f->size - pc->offset) {
		problem(p, FERRY_ECORRUPT, "%s: offset %" PRIu64 ": item %s: %" PRIu64 " bytes run past the end of the "
			"file (%" PRId64 " bytes)", path, pc->offset, it->fqn, pc->length, f->size);
		return;
	}
	if (pc->transformed)
		return; /* compressed or otherwise transformed: the range is all that can be checked */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		problem(p, -errno, "%s: %s", path, strerror(errno));
		return;
	}
	struct src s = {fd, pc->offset, pc->length};
	char magic[4] = {0};
	if (it->is_bytes && (src_read(&s, 0, magic, 4) != 4 || memcmp(magic, "PK\x03\x04", 4))) {
		close(fd); /* raw bytes a user put in the state dict: not a torch.save zip */
		return;
	}
	struct ferry_tf_pt pt;
	int r = ferry_tf_pt_open(path, pc->offset, pc->length, src_read, &s, &pt);
	if (r) {
		problem(p, r, "%s (item %s)", ferry_last_error(), it->fqn);
		close(fd);
		return;
	}
	pt_verify(path, &s, &pt, p, crc_ok, crc_none);
	if (!it->is_bytes) {
		const struct ferry_tf_tensor *t = pt.n == 1 ? &pt.t[0] : NULL;
		if (!t)
			problem(p, FERRY_ECORRUPT, "%s: offset %" PRIu64 ": item %s: %zu tensors in the item's data.pkl, not one",
				path, pc->offset, it->fqn, pt.n);
		else if (strcmp(t->dtype, it->dtype) || t->ndim != it->ndim ||
			 memcmp(t->shape, pc->sizes, sizeof(t->shape[0]) * (size_t)t->ndim))
			problem(p, FERRY_ECORRUPT, "%s: offset %" PRIu64 ": item %s: the stored chunk is %s of %d dims, "
				".metadata says %s of %d (or another shape)", path, pc->offset, it->fqn, t->dtype, t->ndim,
				it->dtype, it->ndim);
	}
	ferry_tf_pt_free(&pt);
	close(fd);
}

static int dcp_verify(const char *dir, int json)
{
	struct ferry_tf_dcp d;
	struct problems p = {0};
	int r = dcp_load(dir, &d);
	if (r)
		return r > 0 ? 1 : failed("verify", dir, json, r);
	size_t nf = 0;
	uint64_t ok = 0, none = 0, pieces = 0, bytes = 0;
	struct dfile *f = dcp_files(dir, &d, &nf);
	for (size_t k = 0; f && k < nf; k++)
		if (f[k].size < 0)
			problem(&p, -ENOENT, "%s/%s: missing (holds %" PRIu64 " items of .metadata)", dir, f[k].name, f[k].pieces);
	for (size_t i = 0; f && i < d.n; i++) {
		const struct ferry_tf_dcp_item *it = &d.item[i];
		uint64_t covered = 0;
		for (size_t c = 0; c < it->n; c++) {
			const struct ferry_tf_dcp_piece *pc = &it->piece[c];
			covered += volume(pc->sizes, it->ndim);
			if (!pc->file) {
				problem(&p, FERRY_ECORRUPT, "%s/.metadata: item %s: a %s without a storage_data entry", dir, it->fqn,
					it->is_bytes ? "bytes item" : "chunk");
				continue;
			}
			size_t k = 0;
			while (strcmp(f[k].name, pc->file))
				k++;
			pieces++;
			bytes += pc->length;
			dcp_piece(dir, it, pc, &f[k], &p, &ok, &none);
		}
		if (!it->is_bytes && covered != volume(it->size, it->ndim))
			problem(&p, FERRY_ECORRUPT, "%s/.metadata: tensor %s: its chunks hold %" PRIu64 " of its %" PRIu64
				" elements", dir, it->fqn, covered, volume(it->size, it->ndim));
	}
	if (json) {
		printf("{\"path\":");
		ferry_tools_json_string(stdout, dir);
		printf(",\"format\":\"dcp\",\"ok\":%s,\"items\":%zu,\"files\":%zu,\"pieces\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"crc32_verified\":%" PRIu64 ",\"crc32_absent\":%" PRIu64 ",",
		       p.n ? "false" : "true", d.n, nf, pieces, bytes, ok, none);
		json_problems(&p);
		printf("}\n");
	} else {
		text_problems(&p);
		printf("%s: torch.distributed.checkpoint, %zu items in %zu files, %" PRIu64 " pieces of %" PRIu64 " bytes: "
		       "%" PRIu64 " crc32s verified, %" PRIu64 " stored as 0\n%s\n", dir, d.n, nf, pieces, bytes, ok, none,
		       p.n ? "FAILED" : "OK");
	}
	int rc = p.n ? 1 : 0;
	problems_free(&p);
	free(f);
	ferry_tf_dcp_free(&d);
	return rc;
}

int ckpt_torch_inspect(const char *path, enum ckpt_torch_kind kind, int json)
{
	return kind == CKPT_TORCH_DCP ? dcp_inspect(path, json) : zip_inspect(path, json);
}

int ckpt_torch_verify(const char *path, enum ckpt_torch_kind kind, int json)
{
	return kind == CKPT_TORCH_DCP ? dcp_verify(path, json) : zip_verify(path, json);
}
