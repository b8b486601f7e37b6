/* libFuzzer target: the readers of PyTorch's files that `ferry ckpt inspect/verify` use
 * (tools/torchfmt.c) on arbitrary bytes: DCP's .metadata through the restricted unpickler, a
 * torch.save data.pkl, and a zip with its records, tensors and crc32s. The first byte picks which. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_torchfmt.h"

struct mem {
	const uint8_t *p;
	size_t n;
};

static int64_t mem_read(void *u, uint64_t off, void *buf, size_t n)
{
	const struct mem *m = u;
	if (off >= m->n)
		return 0;
	if (n > m->n - off)
		n = (size_t)(m->n - off);
	memcpy(buf, m->p + off, n);
	return (int64_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!size)
		return 0;
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	switch (data[0] % 3) {
	case 0: {
		struct ferry_tf_dcp d;
		if (!ferry_tf_dcp_parse("fuzz", p, n, &d)) {
			for (size_t i = 0; i < d.n; i++) {
				if (!d.item[i].fqn || d.item[i].ndim > FERRY_TF_MAX_DIMS)
					abort();
				for (size_t c = 0; c < d.item[i].n; c++)
					if (d.item[i].piece[c].file && strchr(d.item[i].piece[c].file, '/'))
						abort(); /* a relative_path never leaves the directory */
			}
			ferry_tf_dcp_free(&d);
		}
		break;
	}
	case 1: {
		struct ferry_tf_tensor *t;
		size_t nt;
		if (!ferry_tf_pt_tensors("fuzz", p, n, &t, &nt))
			ferry_tf_tensors_free(t, nt);
		break;
	}
	default: {
		struct mem m = {p, n};
		struct ferry_tf_pt pt;
		if (!ferry_tf_pt_open("fuzz", 0, n, mem_read, &m, &pt)) {
			for (size_t i = 0; i < pt.zip.n; i++) {
				if (pt.zip.rec[i].data > n || pt.zip.rec[i].size > n - pt.zip.rec[i].data)
					abort(); /* a record accepted lies inside the input */
				(void)ferry_tf_zip_check("fuzz", 0, &pt.zip.rec[i], mem_read, &m);
			}
			for (size_t i = 0; i < pt.n; i++)
				(void)ferry_tf_pt_check("fuzz", 0, &pt, i);
			ferry_tf_pt_free(&pt);
		}
		break;
	}
	}
	return 0;
}
