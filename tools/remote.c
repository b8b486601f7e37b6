/* Object storage for the CLI (ferry stage, ferry cp): the remote backend's listing, which the
 * public API does not offer yet (docs/REMOTE.md). */
#include "tools/sys.h"
#include "engine/export.h"

int ferry_tools_list(ferry_ctx *ctx, const char *prefix,
		     int (*fn)(void *arg, const char *url, uint64_t size, const char *etag), void *arg)
{
	return ferry__remote_list(ctx, prefix, fn, arg);
}
