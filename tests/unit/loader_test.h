/* Helpers of the loader's unit tests (test_loader.c, test_loader_cz.c). */
#ifndef FERRY_LOADER_TEST_H
#define FERRY_LOADER_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "ferry/data.h"
#include "ferry_test.h"

/* A metric, or -1 when ferry_loader_metric fails. */
static inline double metric(ferry_loader *l, const char *name)
{
	double v;
	return ferry_loader_metric(l, name, &v) ? -1 : v;
}

/* A loader over ds with the knobs kv (key, value, ..., NULL); a knob refused ends the test. */
static inline ferry_loader *make_loader(ferry_dataset *ds, const char *const *kv)
{
	ferry_loader *l;
	T_ASSERT(ferry_loader_create(ds, &l) == 0);
	for (; kv && kv[0]; kv += 2)
		if (ferry_loader_set(l, kv[0], kv[1])) {
			fprintf(stderr, "set %s=%s: %s\n", kv[0], kv[1], ferry_last_error());
			exit(T_EXIT_FAIL);
		}
	return l;
}

#endif
