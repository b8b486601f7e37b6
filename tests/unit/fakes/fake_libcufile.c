/*
 * A stand-in for libcufile.so.0, built by tests/unit/test_gpu_shim.c at test time. Knobs:
 * -DFAKE_OPEN_RESULT=n, -DFAKE_REGISTER_RESULT=n (cuFileDriverOpen's and cuFileHandleRegister's
 * CUfileOpError), -DFAKE_CLOSE_V2 (export cuFileDriverClose_v2 too), -D<symbol>=renamed_<symbol>.
 */
#include <stddef.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef FAKE_OPEN_RESULT
#define FAKE_OPEN_RESULT 0
#endif
#ifndef FAKE_REGISTER_RESULT
#define FAKE_REGISTER_RESULT 0
#endif
#define API __attribute__((visibility("default")))

typedef struct {
	int err;
	int cu_err;
} CUfileError_t;
typedef struct {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} CUfileDescr_t;

static int opens, live, registers, batch_ops;
API int fake_batch_ops(void) { return batch_ops; }
static const CUfileError_t ok = { 0, 0 };

API int fake_opens(void) { return opens; }
API int fake_live_handles(void) { return live; }
API int fake_registers(void) { return registers; }

API CUfileError_t cuFileDriverOpen(void) { opens++; return (CUfileError_t){ FAKE_OPEN_RESULT, 0 }; }
API CUfileError_t cuFileDriverClose(void) { return ok; }
#ifdef FAKE_CLOSE_V2
API CUfileError_t cuFileDriverClose_v2(void) { return ok; }
#endif
API CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
	registers++;
	if (FAKE_REGISTER_RESULT || d->type != 1 || d->handle.fd < 0)
		return (CUfileError_t){ FAKE_REGISTER_RESULT ? FAKE_REGISTER_RESULT : 5022, 0 };
	live++;
	*fh = (void *)(size_t)(0x1000 + d->handle.fd);
	return ok;
}
API void cuFileHandleDeregister(void *fh) { if (fh) live--; }
API CUfileError_t cuFileBufRegister(const void *p, size_t n, int f) { (void)p; (void)n; (void)f; return ok; }
API CUfileError_t cuFileBufDeregister(const void *p) { (void)p; return ok; }
/* the fake's "device memory" is host memory: plain pread/pwrite on the registered fd */
static int rw;
API int fake_rw_calls(void) { return rw; }
API ssize_t cuFileRead(void *fh, void *p, size_t n, off_t fo, off_t bo) { __atomic_fetch_add(&rw, 1, __ATOMIC_RELAXED); return pread((int)((size_t)fh - 0x1000), (char *)p + bo, n, fo); }
API ssize_t cuFileWrite(void *fh, const void *p, size_t n, off_t fo, off_t bo) { __atomic_fetch_add(&rw, 1, __ATOMIC_RELAXED); return pwrite((int)((size_t)fh - 0x1000), (const char *)p + bo, n, fo); }
API CUfileError_t cuFileGetVersion(int *v) { *v = 1150; return ok; }
API CUfileError_t cuFileReadAsync(void *fh, void *p, size_t *n, off_t *fo, off_t *bo, ssize_t *r, void *s) { (void)fh; (void)p; (void)fo; (void)bo; (void)s; *r = (ssize_t)*n; return ok; }
API CUfileError_t cuFileWriteAsync(void *fh, void *p, size_t *n, off_t *fo, off_t *bo, ssize_t *r, void *s) { (void)fh; (void)p; (void)fo; (void)bo; (void)s; *r = (ssize_t)*n; return ok; }
API CUfileError_t cuFileStreamRegister(void *s, unsigned f) { (void)s; (void)f; return ok; }
API CUfileError_t cuFileStreamDeregister(void *s) { (void)s; return ok; }
/* the batch API: each op is done at submit (pread/pwrite, as above) and its event kept until a
 * status call takes it; at most FAKE_BATCH events outstanding */
#define FAKE_BATCH 256
typedef struct {
	int mode;
	union {
		struct {
			void *devPtr_base;
			off_t file_offset;
			off_t devPtr_offset;
			size_t size;
		} batch;
	} u;
	void *fh;
	int opcode;
	void *cookie;
} CUfileIOParams_t;
typedef struct {
	void *cookie;
	int status;
	size_t ret;
} CUfileIOEvents_t;
/* One state per batch, as cuFile keeps: several workers each have their batch (the engine's take
 * shares spread a request's chunks over workers), and one shared list let one take another's
 * completions and wait for ever on its own. */
struct fake_batch {
	CUfileIOEvents_t ev[FAKE_BATCH];
	unsigned n;
};
API CUfileError_t cuFileBatchIOSetUp(void **b, unsigned n)
{
	(void)n;
	*b = calloc(1, sizeof(struct fake_batch));
	return *b ? ok : (CUfileError_t){ 5022, 0 };
}
API CUfileError_t cuFileBatchIOSubmit(void *b, unsigned n, CUfileIOParams_t *p, unsigned f)
{
	struct fake_batch *fb = b;
	(void)f;
	if (fb->n + n > FAKE_BATCH)
		return (CUfileError_t){ 5022, 0 };
	__atomic_fetch_add(&batch_ops, (int)n, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < n; i++) {
		char *buf = (char *)p[i].u.batch.devPtr_base + p[i].u.batch.devPtr_offset;
		ssize_t r = p[i].opcode ? cuFileWrite(p[i].fh, buf, p[i].u.batch.size, p[i].u.batch.file_offset, 0)
					: cuFileRead(p[i].fh, buf, p[i].u.batch.size, p[i].u.batch.file_offset, 0);
		fb->ev[fb->n++] = (CUfileIOEvents_t){ p[i].cookie, r < 0 ? 0x40 /* FAILED */ : 0x10 /* COMPLETE */, (size_t)r };
	}
	return ok;
}
API CUfileError_t cuFileBatchIOGetStatus(void *b, unsigned m, unsigned *n, CUfileIOEvents_t *e, void *t)
{
	struct fake_batch *fb = b;
	(void)t;
	unsigned k = fb->n < *n ? fb->n : *n;
	if (k < m)
		return (CUfileError_t){ 5022, 0 }; /* would wait for ever: nothing else is in flight */
	for (unsigned i = 0; i < k; i++)
		e[i] = fb->ev[i];
	for (unsigned i = k; i < fb->n; i++)
		fb->ev[i - k] = fb->ev[i];
	fb->n -= k;
	*n = k;
	return ok;
}
API CUfileError_t cuFileBatchIOCancel(void *b) { (void)b; return ok; }
API void cuFileBatchIODestroy(void *b) { free(b); }
