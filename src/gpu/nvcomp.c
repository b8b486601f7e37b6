/* GPU decompression through nvCOMP loaded at run time (gpu/nvcomp.h). */
#include <errno.h>
#include <stddef.h>

#include "base/base.h"
#include "gpu/nvcomp.h"

int ferry__nvc_available(int codec, const char **why)
{
	(void)codec;
	if (why)
		*why = "not implemented yet";
	return 0;
}

const char *ferry__nvc_version(void)
{
	return NULL;
}

const char *ferry__nvc_path(void)
{
	return NULL;
}

int ferry__nvc_open(int dev, int codec, struct ferry__nvc **out)
{
	(void)dev;
	(void)codec;
	*out = NULL;
	return ferry__error(-ENOTSUP, "nvcomp: not implemented yet");
}

void ferry__nvc_close(struct ferry__nvc *d)
{
	(void)d;
}

int ferry__nvc_decompress(struct ferry__nvc *d, void *stream, size_t n, const uint64_t *src,
			  const size_t *src_len, const uint64_t *dst, const size_t *dst_cap)
{
	(void)d; (void)stream; (void)n; (void)src; (void)src_len; (void)dst; (void)dst_cap;
	return ferry__error(-ENOTSUP, "nvcomp: not implemented yet");
}

int ferry__nvc_finish(struct ferry__nvc *d, size_t *out_len)
{
	(void)d; (void)out_len;
	return ferry__error(-ENOTSUP, "nvcomp: not implemented yet");
}
