/* dlopen and all-or-none symbol resolution shared by the CUDA, cuFile and NVML shims. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/shim.h"

void *ferry__dl_open(const char *soname, const char *env, const char *missing, char *why, size_t len)
{
	const char *path = env ? getenv(env) : NULL;
	void *h;

	if (!path || !*path)
		path = NULL;
	h = dlopen(path ? path : soname, RTLD_NOW | RTLD_LOCAL);
	if (h)
		return h;
	const char *err = dlerror();
	if (path)
		snprintf(why, len, "%s not loaded from %s (set by %s): dlopen: %s", soname, path, env,
			 err ? err : "unknown error");
	else
		snprintf(why, len, "%s not found (%s): dlopen: %s", soname, missing,
			 err ? err : "unknown error");
	return NULL;
}

static void *find(void *handle, const struct ferry__sym *s, ferry__dl_lookup_fn lookup, void *arg)
{
	void *p = NULL;

	if (lookup && s->base)
		p = lookup(s->base, arg);
	if (!p)
		p = dlsym(handle, s->name);
	if (!p && s->alt)
		p = dlsym(handle, s->alt);
	return p;
}

static void store(void *api, size_t offset, void *p)
{
	/* POSIX guarantees that a data pointer from dlsym converts to a function pointer. */
	memcpy((char *)api + offset, &p, sizeof(p));
}

int ferry__dl_resolve(void *handle, const char *soname, void *api, const struct ferry__sym *syms,
		      size_t n, ferry__dl_lookup_fn lookup, void *lookup_arg, unsigned *groups_missing,
		      char *why, size_t len)
{
	const char *first = NULL;
	unsigned missing = 0, gmiss = 0;

	for (size_t i = 0; i < n; i++) {
		void *p = find(handle, &syms[i], lookup, lookup_arg);
		store(api, syms[i].offset, p);
		if (p)
			continue;
		if (syms[i].group == 0) {
			if (!first)
				first = syms[i].name;
			missing++;
		} else if (syms[i].group <= 32) {
			gmiss |= 1u << (syms[i].group - 1);
		}
	}
	if (missing) {
		if (missing > 1)
			snprintf(why, len, "symbol %s missing from %s (and %u more required symbols): "
				 "the library is too old or not the real one", first, soname, missing - 1);
		else
			snprintf(why, len, "symbol %s missing from %s: the library is too old or not "
				 "the real one", first, soname);
		for (size_t i = 0; i < n; i++)
			store(api, syms[i].offset, NULL);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		if (syms[i].group > 0 && syms[i].group <= 32 && (gmiss & (1u << (syms[i].group - 1))))
			store(api, syms[i].offset, NULL);
	if (groups_missing)
		*groups_missing = gmiss;
	return 0;
}
