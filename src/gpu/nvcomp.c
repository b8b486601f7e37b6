/*
 * GPU decompression through nvCOMP (gpu/nvcomp.h), loaded at run time from the library the PyPI
 * wheel nvidia-libnvcomp-cu13 ships (libnvcomp.so.6) or the system's. Only nvCOMP 6's batched C
 * API is used (nvcomp/zstd.h, nvcomp/lz4.h: the *DecompressOpts_t structs passed by value; another
 * major version is refused by name); the few types are declared here by hand, so no nvCOMP header
 * is needed to build.
 *
 * What nvCOMP's headers (6.0.0.12) say about the data, which the format must respect:
 *  - zstd: standard frames of at most 2^31-1 bytes decompressed per chunk
 *    (nvcompZstdDecompressionMaxAllowedChunkSize); LZ4: raw blocks (not frames) of at most 2^32-1.
 *  - each compressed chunk aligned to `input`, each output to `output` of
 *    nvcompBatched*DecompressGetRequiredAlignments (8 and 8 for zstd, 4 for LZ4 in 6.0: queried,
 *    not assumed); ferry__nvc_decompress refuses a misaligned chunk by index.
 *  - "Providing a corrupt buffer for decompression will result in undefined behavior" and "only a
 *    limited validation is performed": a status names a bad chunk when nvCOMP notices, but only
 *    the format's checksums make corrupt data safe to hand it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gpu/nvcomp.h"
#include "gpu/scatter.h"
#include "gpu/shim.h"

/* ------------------------------------------------------------------ nvCOMP's ABI, by hand */

typedef int nvc_status; /* nvcompStatus_t */
/*
 * nvcompBatchedZstdDecompressOpts_t ({backend, char reserved[60]}) and
 * nvcompBatchedLZ4DecompressOpts_t ({backend, sort_before_hw_decompress, data_type,
 * bitshuffle_mode, char reserved[48]}) are both 64 bytes of ints and chars, so one layout passes
 * either by value; all zero is each one's default (NVCOMP_DECOMPRESS_BACKEND_DEFAULT, NVCOMP_TYPE_CHAR,
 * NVCOMP_BITSHUFFLE_NONE).
 */
typedef struct {
	int backend;
	int sort_before_hw_decompress;
	int data_type;
	int bitshuffle_mode;
	char reserved[48];
} nvc_dopts;
_Static_assert(sizeof(nvc_dopts) == 64, "nvCOMP 6's decompression options are 64 bytes");
typedef struct {
	size_t input, output, temp;
} nvc_align;
typedef struct {
	uint32_t version;       /* major * 1000 + minor * 100 + patch */
	uint32_t cudart_version;
} nvc_props;

struct codec_api {
	nvc_status (*GetRequiredAlignments)(nvc_dopts opts, nvc_align *align);
	nvc_status (*GetTempSize)(size_t num_chunks, size_t max_uncompressed_chunk_bytes, nvc_dopts opts,
				  size_t *temp_bytes, size_t max_total_uncompressed_bytes, void *stream);
	nvc_status (*DecompressAsync)(const void *const *comp_ptrs, const size_t *comp_bytes,
				      const size_t *buffer_bytes, size_t *uncomp_bytes, size_t num_chunks,
				      void *const temp, size_t temp_bytes, void *const *uncomp_ptrs,
				      nvc_dopts opts, nvc_status *statuses, void *stream);
};

struct nvc_api {
	nvc_status (*GetProperties)(nvc_props *props);
	const char *(*GetStatusString)(nvc_status status); /* optional */
	struct codec_api lz4, zstd;
};

#define OFF(field) offsetof(struct nvc_api, field)
enum { G_STATUS = 1, G_LZ4, G_ZSTD };
static const struct ferry__sym nvc_syms[] = {
	{ "nvcompGetProperties", NULL, NULL, OFF(GetProperties), 0 },
	{ "nvcompGetStatusString", NULL, NULL, OFF(GetStatusString), G_STATUS },
	{ "nvcompBatchedLZ4DecompressGetRequiredAlignments", NULL, NULL, OFF(lz4.GetRequiredAlignments), G_LZ4 },
	{ "nvcompBatchedLZ4DecompressGetTempSize", NULL, NULL, OFF(lz4.GetTempSize), G_LZ4 },
	{ "nvcompBatchedLZ4DecompressAsync", NULL, NULL, OFF(lz4.DecompressAsync), G_LZ4 },
	{ "nvcompBatchedZstdDecompressGetRequiredAlignments", NULL, NULL, OFF(zstd.GetRequiredAlignments), G_ZSTD },
	{ "nvcompBatchedZstdDecompressGetTempSize", NULL, NULL, OFF(zstd.GetTempSize), G_ZSTD },
	{ "nvcompBatchedZstdDecompressAsync", NULL, NULL, OFF(zstd.DecompressAsync), G_ZSTD },
};
#undef OFF

/* nvcomp/shared_types.h */
static const struct {
	nvc_status code;
	const char *name;
} nvc_statuses[] = {
	{ 0, "nvcompSuccess" },
	{ 10, "nvcompErrorInvalidValue" },
	{ 11, "nvcompErrorNotSupported" },
	{ 12, "nvcompErrorCannotDecompress" },
	{ 13, "nvcompErrorBadChecksum" },
	{ 14, "nvcompErrorCannotVerifyChecksums" },
	{ 15, "nvcompErrorOutputBufferTooSmall" },
	{ 16, "nvcompErrorWrongHeaderLength" },
	{ 17, "nvcompErrorAlignment" },
	{ 18, "nvcompErrorChunkSizeTooLarge" },
	{ 19, "nvcompErrorCannotCompress" },
	{ 20, "nvcompErrorWrongInputLength" },
	{ 21, "nvcompErrorBatchSizeTooLarge" },
	{ 22, "nvcompErrorSubChunkCountTooLarge" },
	{ 23, "nvcompErrorSubChunkCountTooSmall" },
	{ 24, "nvcompErrorOutputBufferAlignmentTooSmall" },
	{ 1000, "nvcompErrorCudaError" },
	{ 10000, "nvcompErrorInternal" },
};

/* ------------------------------------------------------------------ loading, once */

static struct nvc_api api;
static unsigned groups_missing;
static int loaded;
static char reason[768], version[32], libpath[PATH_MAX];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
	const char *env = getenv("FERRY_NVCOMP_LIB");
	static const char *const sonames[] = {"libnvcomp.so.6", "libnvcomp.so"};
	void *h = NULL;
	nvc_props props;

	if (env && *env) {
		/* An explicit path is the only one tried: a fallback would hide that it is wrong. */
		h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			const char *e = dlerror();
			snprintf(reason, sizeof(reason), "library not found: FERRY_NVCOMP_LIB=%s: dlopen: %s", env,
				 e ? e : "unknown error");
			return;
		}
	} else {
		char first[384] = "";
		for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]) && !h; i++) {
			h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
			if (!h && !first[0]) {
				const char *e = dlerror();
				snprintf(first, sizeof(first), "%s", e ? e : "unknown error");
			}
		}
		if (!h) {
			snprintf(reason, sizeof(reason),
				 "library not found: libnvcomp.so.6 or libnvcomp.so (pip install nvidia-libnvcomp-cu13, "
				 "or set FERRY_NVCOMP_LIB): dlopen: %s", first);
			return;
		}
	}
	if (ferry__dl_resolve(h, "libnvcomp", &api, nvc_syms, sizeof(nvc_syms) / sizeof(nvc_syms[0]), NULL,
			      NULL, &groups_missing, reason, sizeof(reason)) < 0)
		return; /* the handle stays open: nothing else may unload what a failed resolve touched */
	Dl_info info;
	if (dladdr((void *)api.GetProperties, &info) && info.dli_fname) {
		char *real = realpath(info.dli_fname, NULL);
		snprintf(libpath, sizeof(libpath), "%s", real ? real : info.dli_fname);
		free(real);
	} else {
		snprintf(libpath, sizeof(libpath), "%s", env && *env ? env : "libnvcomp");
	}
	memset(&props, 0, sizeof(props));
	if (api.GetProperties(&props) != 0 || !props.version) {
		snprintf(reason, sizeof(reason), "unsupported version: %.600s: nvcompGetProperties gave no version", libpath);
		return;
	}
	snprintf(version, sizeof(version), "%u.%u.%u", props.version / 1000, props.version % 1000 / 100,
		 props.version % 100);
	/* The prototypes above are nvCOMP 6's headers'; another major may give the same names other
	 * arguments (the options structs passed by value are recent), and a call through the wrong
	 * prototype corrupts the stack: refuse it by name. */
	if (props.version / 1000 != 6) {
		snprintf(reason, sizeof(reason), "unsupported version: nvCOMP %s (%.600s): ferry speaks nvCOMP 6's batched API "
			 "(pip install nvidia-libnvcomp-cu13==6.*)", version, libpath);
		return;
	}
	loaded = 1;
	FERRY__LOG(FERRY__LOG_INFO, "nvCOMP %s loaded from %s%s%s", version, libpath,
		   groups_missing & (1u << (G_LZ4 - 1)) ? " (no batched LZ4)" : "",
		   groups_missing & (1u << (G_ZSTD - 1)) ? " (no batched zstd)" : "");
}

static const struct codec_api *codec_of(int codec, const char **name)
{
	switch (codec) {
	case FERRY__NVC_LZ4:
		*name = "LZ4";
		return groups_missing & (1u << (G_LZ4 - 1)) ? NULL : &api.lz4;
	case FERRY__NVC_ZSTD:
		*name = "Zstd";
		return groups_missing & (1u << (G_ZSTD - 1)) ? NULL : &api.zstd;
	default:
		*name = NULL;
		return NULL;
	}
}

int ferry__nvc_available(int codec, const char **why)
{
	static __thread char buf[1024];
	const char *name;

	pthread_once(&once, load);
	if (!loaded) {
		if (why)
			*why = reason;
		return 0;
	}
	if (!codec_of(codec, &name)) {
		if (why) {
			if (!name)
				snprintf(buf, sizeof(buf), "unknown codec %d", codec);
			else
				snprintf(buf, sizeof(buf), "symbol missing: %.900s has no nvcompBatched%sDecompressAsync",
					 libpath, name);
			*why = buf;
		}
		return 0;
	}
	if (!ferry__cuda()) {
		if (why) {
			snprintf(buf, sizeof(buf), "no GPU: %s", ferry__cuda_unavailable_reason());
			*why = buf;
		}
		return 0;
	}
	if (why)
		*why = "";
	return 1;
}

const char *ferry__nvc_version(void)
{
	pthread_once(&once, load);
	return loaded ? version : NULL;
}

const char *ferry__nvc_path(void)
{
	pthread_once(&once, load);
	return loaded ? libpath : NULL;
}

static const char *status_name(nvc_status s)
{
	for (size_t i = 0; i < sizeof(nvc_statuses) / sizeof(nvc_statuses[0]); i++)
		if (nvc_statuses[i].code == s)
			return nvc_statuses[i].name;
	return "nvcompError?";
}

static const char *status_text(nvc_status s)
{
	const char *t = api.GetStatusString ? api.GetStatusString(s) : NULL;
	return t ? t : "";
}

/* ------------------------------------------------------------------ decoders */

/*
 * Device scratch: one allocation holding, for `cap` chunks, the four input arrays (compressed
 * pointers, compressed sizes, output pointers, output capacities) then the two outputs
 * (decompressed sizes, statuses), so that a batch costs one upload and one download; a pinned host
 * mirror of the same layout is what the copies read and write.
 */
struct ferry__nvc {
	int dev, codec;
	const char *name; /* "LZ4", "Zstd" */
	const struct codec_api *c;
	nvc_align align;
	bool walk;                    /* LZ4: each batch walked on the GPU first (ferry__lz4_walk_ready) */
	size_t cap;                   /* chunks the arrays hold */
	ferry__CUdeviceptr arrays;    /* ARRAYS_BYTES(cap): the dummy block, then the arrays */
	unsigned char *host;          /* pinned mirror */
	size_t failed;                /* the last finish's first failed chunk (SIZE_MAX: none) */
	ferry__CUdeviceptr temp;
	size_t temp_cap;
	size_t n;    /* chunks of the batch in flight (0: none) */
	void *stream; /* its stream */
	ferry__CUevent done; /* recorded after the batch's results: the stream may run later work
			      * (the next batch of a pipeline) before finish is called */
};

/*
 * The device arrays, mirrored in pinned host memory: ARRAYS_AT bytes for the walk's dummy block (a
 * literal byte: 0x10 0x00, in the first two), then, for a batch of n, src ptrs | src sizes | dst
 * ptrs | dst rooms | out sizes (8 bytes each) | statuses | the walk's verdicts (4 bytes each).
 */
#define ARRAYS_AT 256
#define ARRAYS_BYTES(cap) (ARRAYS_AT + (cap) * (5 * sizeof(uint64_t) + sizeof(nvc_status) + sizeof(int)))

int ferry__nvc_open(int dev, int codec, struct ferry__nvc **out)
{
	const char *why, *name;
	ferry__CUcontext prev;
	struct ferry__nvc *d;
	nvc_dopts opts;
	nvc_status s;
	int r;

	*out = NULL;
	if (!ferry__nvc_available(codec, &why))
		return ferry__error(-ENOTSUP, "nvcomp: device %d: GPU decompression not available: %s", dev, why);
	codec_of(codec, &name);
	if ((r = ferry__cuda_enter_device(dev, &prev)) < 0)
		return r;
	d = calloc(1, sizeof(*d));
	if (!d) {
		ferry__cuda_leave_device(prev);
		return ferry__error(-ENOMEM, "nvcomp: out of memory");
	}
	d->dev = dev;
	d->codec = codec;
	d->name = name;
	d->failed = SIZE_MAX;
	/* nvCOMP's LZ4 does not bound its output: each block is walked before it runs, on the GPU
	 * where ferry's kernels load, else by the callers on the host (ferry__cz_check_gpu_frame) */
	d->walk = codec == FERRY__NVC_LZ4 && ferry__nvc_walks_lz4(dev);
	d->c = codec_of(codec, &name);
	memset(&opts, 0, sizeof(opts));
	s = d->c->GetRequiredAlignments(opts, &d->align);
	ferry__CUresult er = s == 0 ? ferry__cuda()->EventCreate(&d->done, FERRY__CU_EVENT_DISABLE_TIMING) : 0;
	ferry__cuda_leave_device(prev);
	if (er != FERRY__CUDA_SUCCESS) {
		free(d);
		return ferry__cuda_fail(er, "nvcomp: cuEventCreate");
	}
	if (s != 0) {
		if (d->done)
			ferry__cuda()->EventDestroy(d->done);
		free(d);
		return ferry__error(FERRY_ECUDA, "nvcomp: nvcompBatched%sDecompressGetRequiredAlignments: %s (%d) %s",
				    name, status_name(s), s, status_text(s));
	}
	if (!d->align.input)
		d->align.input = 1;
	if (!d->align.output)
		d->align.output = 1;
	*out = d;
	return 0;
}

size_t ferry__nvc_input_align(const struct ferry__nvc *d)
{
	return d->align.input;
}

bool ferry__nvc_walks_lz4(int dev)
{
	return ferry__lz4_walk_ready(dev);
}

size_t ferry__nvc_failed(const struct ferry__nvc *d)
{
	return d ? d->failed : SIZE_MAX;
}

static void free_arrays(const struct ferry__cuda_api *cu, struct ferry__nvc *d)
{
	if (d->arrays)
		cu->MemFree(d->arrays);
	if (d->host)
		cu->MemFreeHost(d->host);
	d->arrays = 0;
	d->host = NULL;
	d->cap = 0;
}

void ferry__nvc_close(struct ferry__nvc *d)
{
	const struct ferry__cuda_api *cu;
	ferry__CUcontext prev;

	if (!d)
		return;
	cu = ferry__cuda();
	if (cu && ferry__cuda_enter_device(d->dev, &prev) == 0) {
		free_arrays(cu, d);
		if (d->temp)
			cu->MemFree(d->temp);
		if (d->done)
			cu->EventDestroy(d->done);
		ferry__cuda_leave_device(prev);
	}
	free(d);
}

static int grow(const struct ferry__cuda_api *cu, struct ferry__nvc *d, size_t n, size_t temp_bytes)
{
	ferry__CUresult r;

	if (n > d->cap) {
		size_t cap = d->cap * 2 > n ? d->cap * 2 : n;
		free_arrays(cu, d);
		if ((r = cu->MemAlloc(&d->arrays, ARRAYS_BYTES(cap))) != FERRY__CUDA_SUCCESS) {
			d->arrays = 0;
			return ferry__cuda_fail(r, "nvcomp: cuMemAlloc(%zu bytes of chunk arrays)", ARRAYS_BYTES(cap));
		}
		if ((r = cu->MemHostAlloc((void **)&d->host, ARRAYS_BYTES(cap), 0)) != FERRY__CUDA_SUCCESS) {
			d->host = NULL;
			cu->MemFree(d->arrays);
			d->arrays = 0;
			return ferry__cuda_fail(r, "nvcomp: cuMemHostAlloc(%zu bytes of chunk arrays)", ARRAYS_BYTES(cap));
		}
		d->cap = cap;
		d->host[0] = 0x10, d->host[1] = 0x00; /* the dummy block: one literal, a zero byte */
	}
	if (temp_bytes > d->temp_cap) {
		if (d->temp)
			cu->MemFree(d->temp);
		d->temp = 0;
		d->temp_cap = 0;
		/* a quarter more: the next batch, a few chunks more or larger, needs no new cuMemAlloc */
		size_t want = temp_bytes + temp_bytes / 4 < temp_bytes ? temp_bytes : temp_bytes + temp_bytes / 4;
		if ((r = cu->MemAlloc(&d->temp, want)) != FERRY__CUDA_SUCCESS) {
			d->temp = 0;
			return ferry__cuda_fail(r, "nvcomp: cuMemAlloc(%zu bytes of temporary space)", want);
		}
		d->temp_cap = want;
	}
	return 0;
}

int ferry__nvc_decompress(struct ferry__nvc *d, void *stream, size_t n, const uint64_t *src,
			  const size_t *src_len, const uint64_t *dst, const size_t *dst_cap)
{
	const struct ferry__cuda_api *cu = ferry__cuda();
	size_t max_out = 0, total_out = 0, temp_bytes = 0;
	const size_t limit = d && d->codec == FERRY__NVC_ZSTD ? ((size_t)1 << 31) - 1 : ((size_t)1 << 32) - 1;
	ferry__CUcontext prev;
	ferry__CUresult cr;
	nvc_dopts opts;
	nvc_status s;
	int r;

	if (!d || (n && (!src || !src_len || !dst || !dst_cap)))
		return ferry__error(-EINVAL, "nvcomp: decompress: NULL argument");
	if (!cu)
		return ferry__cuda_require();
	if (d->n) {
		/* A batch left unfinished (its caller failed between enqueue and finish) is dropped once
		 * its stream has drained: its results land in the host mirror this batch reuses. */
		if ((r = ferry__cuda_enter_device(d->dev, &prev)) < 0)
			return r;
		cr = cu->EventSynchronize(d->done);
		ferry__cuda_leave_device(prev);
		size_t left = d->n;
		d->n = 0;
		if (cr != FERRY__CUDA_SUCCESS)
			return ferry__cuda_fail(cr, "nvcomp: cuEventSynchronize (the unfinished batch of %zu chunks)", left);
	}
	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (src[i] % d->align.input || dst[i] % d->align.output)
			return ferry__error(-EINVAL, "nvcomp: chunk %zu of %zu: %s misaligned (input at 0x%llx, output at 0x%llx): nvCOMP's %s "
					    "needs input aligned to %zu bytes and output to %zu", i, n,
					    src[i] % d->align.input ? "input" : "output", (unsigned long long)src[i],
					    (unsigned long long)dst[i], d->name, d->align.input, d->align.output);
		if (d->walk && !dst_cap[i]) /* the walk points a refused block at one that decodes to a byte */
			return ferry__error(-EINVAL, "nvcomp: chunk %zu of %zu: no room for its output", i, n);
		if (dst_cap[i] > limit || src_len[i] > limit)
			return ferry__error(-EINVAL, "nvcomp: chunk %zu of %zu: %zu bytes (%zu compressed) exceed nvCOMP's "
					    "%s chunk limit of %zu bytes", i, n, dst_cap[i], src_len[i], d->name, limit);
		if (dst_cap[i] > max_out)
			max_out = dst_cap[i];
		total_out += dst_cap[i];
	}
	if ((r = ferry__cuda_enter_device(d->dev, &prev)) < 0)
		return r;
	memset(&opts, 0, sizeof(opts));
	s = d->c->GetTempSize(n, max_out, opts, &temp_bytes, total_out, stream);
	if (s != 0) {
		r = ferry__error(FERRY_ECUDA, "nvcomp: nvcompBatched%sDecompressGetTempSize(%zu chunks, largest %zu bytes): "
				 "%s (%d) %s", d->name, n, max_out, status_name(s), s, status_text(s));
		goto out;
	}
	if ((r = grow(cu, d, n, temp_bytes)) < 0)
		goto out;

	/* host mirror (ARRAYS_BYTES): the dummy block, src ptrs | src sizes | dst ptrs | dst caps | out
	 * sizes | statuses | verdicts; the first four go up, with the dummy */
	uint64_t *h = (uint64_t *)(d->host + ARRAYS_AT);
	memcpy(h, src, n * sizeof(uint64_t));
	for (size_t i = 0; i < n; i++) {
		h[n + i] = src_len[i];
		h[3 * n + i] = dst_cap[i];
	}
	memcpy(h + 2 * n, dst, n * sizeof(uint64_t));
	ferry__CUdeviceptr a = d->arrays + ARRAYS_AT;
	if ((cr = cu->MemcpyHtoDAsync(d->arrays, d->host, ARRAYS_AT + 4 * n * sizeof(uint64_t), (ferry__CUstream)stream)) !=
	    FERRY__CUDA_SUCCESS) {
		r = ferry__cuda_fail(cr, "nvcomp: cuMemcpyHtoDAsync(chunk arrays of %zu chunks)", n);
		goto out;
	}
	if (d->walk && (r = ferry__lz4_walk_launch(d->dev, stream, n, a, a + 8 * n, a + 24 * n, a + 44 * n, d->arrays)))
		goto out; /* nothing went to nvCOMP */
	s = d->c->DecompressAsync((const void *const *)(uintptr_t)a, (const size_t *)(uintptr_t)(a + 8 * n),
				  (const size_t *)(uintptr_t)(a + 24 * n), (size_t *)(uintptr_t)(a + 32 * n), n,
				  (void *)(uintptr_t)d->temp, temp_bytes, (void *const *)(uintptr_t)(a + 16 * n), opts,
				  (nvc_status *)(uintptr_t)(a + 40 * n), stream);
	if (s != 0) {
		r = ferry__error(FERRY_ECUDA, "nvcomp: nvcompBatched%sDecompressAsync(%zu chunks): %s (%d) %s", d->name,
				 n, status_name(s), s, status_text(s));
		goto out;
	}
	/* The outputs come back in the same stream order: finish reads them after the caller's sync. */
	if ((cr = cu->MemcpyDtoHAsync(h + 4 * n, a + 32 * n,
				      n * (sizeof(uint64_t) + sizeof(nvc_status) + (d->walk ? sizeof(int) : 0)),
				      (ferry__CUstream)stream)) != FERRY__CUDA_SUCCESS) {
		r = ferry__cuda_fail(cr, "nvcomp: cuMemcpyDtoHAsync(statuses of %zu chunks)", n);
		goto out;
	}
	if ((cr = cu->EventRecord(d->done, (ferry__CUstream)stream)) != FERRY__CUDA_SUCCESS) {
		r = ferry__cuda_fail(cr, "nvcomp: cuEventRecord (after the batch of %zu chunks)", n);
		goto out;
	}
	d->n = n;
	d->stream = stream;
	r = 0;
out:
	ferry__cuda_leave_device(prev);
	return r;
}

int ferry__nvc_finish(struct ferry__nvc *d, size_t *out_len)
{
	size_t n;
	int r = 0;

	if (!d)
		return ferry__error(-EINVAL, "nvcomp: finish: NULL decoder");
	n = d->n;
	if (!n)
		return 0;
	/* The sizes and statuses are the batch's last copy: read before it ran, they are stale. Its
	 * event, not the stream: later work (the next window's batch) may be queued behind it. */
	const struct ferry__cuda_api *cu = ferry__cuda();
	ferry__CUcontext prev;
	ferry__CUresult cr = FERRY__CUDA_SUCCESS;
	if (cu && (r = ferry__cuda_enter_device(d->dev, &prev)) == 0) {
		cr = cu->EventQuery(d->done);
		ferry__cuda_leave_device(prev);
	}
	if (r < 0)
		return r;
	if (cr == FERRY__CUDA_ERROR_NOT_READY)
		return ferry__error(FERRY_EBUSY, "nvcomp: finish: the batch of %zu chunks is still running (synchronise its stream first)", n);
	d->n = 0;
	if (cr != FERRY__CUDA_SUCCESS)
		return ferry__cuda_fail(cr, "nvcomp: cuEventQuery (the batch of %zu chunks)", n);
	const uint64_t *h = (const uint64_t *)(d->host + ARRAYS_AT);
	const uint64_t *len = h + 4 * n;
	const nvc_status *st = (const nvc_status *)(len + n);
	const int *verdict = (const int *)(st + n);
	d->failed = SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		if (out_len)
			out_len[i] = (size_t)len[i];
		if (r)
			continue;
		if (d->walk && verdict[i]) {
			r = ferry__error(FERRY_ECORRUPT, "nvcomp: chunk %zu of %zu: %s block refused before nvCOMP ran: it does not "
					 "decode to exactly its %llu bytes (the walk on the GPU)", i, n, d->name,
					 (unsigned long long)h[3 * n + i]);
			d->failed = i;
		} else if (st[i] != 0) {
			r = ferry__error(FERRY_ECORRUPT, "nvcomp: chunk %zu of %zu: %s decompression failed: %s (%d)%s%s", i, n,
					 d->name, status_name(st[i]), st[i], *status_text(st[i]) ? ": " : "",
					 status_text(st[i]));
			d->failed = i;
		}
	}
	return r;
}
