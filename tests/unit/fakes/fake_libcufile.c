/*
 * A stand-in for libcufile.so.0, built by tests/unit/test_gpu_shim.c at test time. Knobs:
 * -DFAKE_OPEN_RESULT=n, -DFAKE_REGISTER_RESULT=n (cuFileDriverOpen's and cuFileHandleRegister's
 * CUfileOpError), -DFAKE_CLOSE_V2 (export cuFileDriverClose_v2 too), -D<symbol>=renamed_<symbol>.
 */
#include <stddef.h>
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

static int opens, live, registers;
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
API ssize_t cuFileRead(void *fh, void *p, size_t n, off_t fo, off_t bo) { return pread((int)((size_t)fh - 0x1000), (char *)p + bo, n, fo); }
API ssize_t cuFileWrite(void *fh, const void *p, size_t n, off_t fo, off_t bo) { return pwrite((int)((size_t)fh - 0x1000), (const char *)p + bo, n, fo); }
API CUfileError_t cuFileGetVersion(int *v) { *v = 1150; return ok; }
API CUfileError_t cuFileReadAsync(void *fh, void *p, size_t *n, off_t *fo, off_t *bo, ssize_t *r, void *s) { (void)fh; (void)p; (void)fo; (void)bo; (void)s; *r = (ssize_t)*n; return ok; }
API CUfileError_t cuFileWriteAsync(void *fh, void *p, size_t *n, off_t *fo, off_t *bo, ssize_t *r, void *s) { (void)fh; (void)p; (void)fo; (void)bo; (void)s; *r = (ssize_t)*n; return ok; }
API CUfileError_t cuFileStreamRegister(void *s, unsigned f) { (void)s; (void)f; return ok; }
API CUfileError_t cuFileStreamDeregister(void *s) { (void)s; return ok; }
API CUfileError_t cuFileBatchIOSetUp(void **b, unsigned n) { (void)n; *b = (void *)1; return ok; }
API CUfileError_t cuFileBatchIOSubmit(void *b, unsigned n, void *p, unsigned f) { (void)b; (void)n; (void)p; (void)f; return ok; }
API CUfileError_t cuFileBatchIOGetStatus(void *b, unsigned m, unsigned *n, void *e, void *t) { (void)b; (void)m; (void)e; (void)t; *n = 0; return ok; }
API CUfileError_t cuFileBatchIOCancel(void *b) { (void)b; return ok; }
API void cuFileBatchIODestroy(void *b) { (void)b; }
