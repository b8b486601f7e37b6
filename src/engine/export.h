/*
 * What the engine offers the layers above it (formats, checkpoints, the loader, the tools), beside
 * the public API. Everything else in src/engine/ is the engine's own: the build gives the upper
 * layers this header only (CMakeLists.txt, FERRY_EXPORTS_engine).
 */
#ifndef FERRY_ENGINE_EXPORT_H
#define FERRY_ENGINE_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "ferry/ferry.h"

/* true if every page of [off, off+len) of fd is in the page cache (cachestat; false when unknown). */
bool ferry__range_resident(int fd, uint64_t off, uint64_t len);
/* The buffered descriptor of an open file (always open; the file keeps it). */
int ferry__file_fd(const ferry_file *f);
/*
 * ferry_file_open of the file a caller has just made (durable.h's temporary: made_fd open on it) as
 * dirfd/name: opened relative to the directory, never through a symlink, and refused (-ESTALE) when
 * the name no longer leads to that file. path: how errors and the file name it.
 */
int ferry__file_open_made(ferry_ctx *ctx, int dirfd, const char *name, int made_fd, const char *path,
			  int flags, ferry_file **out);
/* The context's host_budget knob: pinned host memory its users may hold (0: no limit). */
uint64_t ferry__ctx_host_budget(const ferry_ctx *ctx);

#endif
