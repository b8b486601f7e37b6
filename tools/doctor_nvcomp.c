/* The doctor's gpu.nvcomp row: can compressed chunks be decompressed on the GPU here (issue 26). */
#include <stdio.h>
#include <string.h>

#include "gpu/nvcomp.h"
#include "tools/sys.h"

void ferry__doctor_nvcomp(ferry_report *r, int ngpus)
{
	const char *expect = "nvCOMP loadable with batched LZ4 and zstd decompression (else the CPU decompresses)";
	const char *src = "$FERRY_NVCOMP_LIB, dlopen(libnvcomp.so.6, libnvcomp.so), nvcompGetProperties";
	const char *fix = "pip install nvidia-libnvcomp-cu13 (the Python package finds it), or set FERRY_NVCOMP_LIB "
			  "to libnvcomp.so.6";
	const char *why_lz4 = "", *why_zstd = "";
	char codecs[64] = "";

	if (ferry__sys_fixture_mode()) {
		ferry__report_add(r, "gpu.nvcomp", "host", FERRY_VERDICT_UNKNOWN,
				  "fixture mode: libraries are probed only on the live machine", expect, src, "");
		return;
	}
	int lz4 = ferry__nvc_available(FERRY__NVC_LZ4, &why_lz4);
	int zstd = ferry__nvc_available(FERRY__NVC_ZSTD, &why_zstd);
	if (!ferry__nvc_version()) {
		ferry__report_addf(r, "gpu.nvcomp", "host", ngpus ? FERRY_VERDICT_WARN : FERRY_VERDICT_OK, expect, src,
				   ngpus ? fix : "", "%s%s", why_zstd,
				   ngpus ? "; compressed data decompresses on the CPU" : "; not needed: no NVIDIA GPU");
		return;
	}
	snprintf(codecs, sizeof(codecs), "%s%s%s", lz4 ? "LZ4" : "", lz4 && zstd ? ", " : "", zstd ? "zstd" : "");
	if (lz4 && zstd)
		ferry__report_addf(r, "gpu.nvcomp", "host", FERRY_VERDICT_OK, expect, src, "",
				   "nvCOMP %s (%s): GPU decompression of %s", ferry__nvc_version(), ferry__nvc_path(), codecs);
	else
		ferry__report_addf(r, "gpu.nvcomp", "host", ngpus ? FERRY_VERDICT_WARN : FERRY_VERDICT_OK, expect, src,
				   ngpus ? fix : "", "nvCOMP %s (%s): %s%s: %s%s", ferry__nvc_version(), ferry__nvc_path(),
				   codecs[0] ? codecs : "cannot decompress here", codecs[0] ? " only" : "",
				   lz4 ? why_zstd : why_lz4, ngpus ? "" : "; not needed: no NVIDIA GPU");
}
