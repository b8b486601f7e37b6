/* The checkpoint-interval arithmetic behind `ferry ckpt plan` (tools/ferry_ckpt_plan.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_ckpt_plan.h"

double ferry_ckpt_plan_mtbf_s(double node_mtbf_h, double nodes)
{
	return node_mtbf_h * 3600.0 / nodes;
}

double ferry_ckpt_plan_young(double c, double m)
{
	return sqrt(2.0 * c * m);
}

double ferry_ckpt_plan_daly(double c, double m)
{
	if (c >= 2.0 * m)
		return m;
	return sqrt(2.0 * c * m) * (1.0 + sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c;
}

int ferry_ckpt_plan_loss(double tau, double c, double rollback, double r, double m, struct ferry_ckpt_loss *out)
{
	if (!(tau > 0) || !(m > 0) || !(c >= 0) || !(r >= 0) || !(rollback >= 0))
		return -1;
	out->ckpt = c / tau;
	out->failure = (tau + rollback) / (2.0 * m) + r / m;
	out->total = out->ckpt + out->failure;
	return 0;
}

/* The number after "key": at the object's top level; 1 found, 0 absent, -1 not a number. */
static int find_number(const char *text, const char *key, double *out)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\"", key);
	int depth = 0, in_str = 0;
	for (const char *p = text; *p; p++) {
		if (in_str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"')
				in_str = 0;
			continue;
		}
		if (*p == '{' || *p == '[') {
			depth++;
		} else if (*p == '}' || *p == ']') {
			depth--;
		} else if (*p == '"') {
			if (depth == 1 && !strncmp(p, pat, strlen(pat))) {
				const char *q = p + strlen(pat);
				while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
					q++;
				if (*q == ':') {
					char *end;
					errno = 0;
					double v = strtod(q + 1, &end);
					if (end == q + 1 || errno || !isfinite(v))
						return -1;
					*out = v;
					return 1;
				}
			}
			in_str = 1;
		}
	}
	return 0;
}

int ferry_ckpt_plan_from_bench(const char *text, double *save_s, double *async_blocked_s, double *async_total_s,
			       char *why, unsigned long len)
{
	const char *p = text;
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p != '{')
		return snprintf(why, len, "not a JSON object (expected the output of 'ferry ckpt bench --json')"), -1;
	const char *keys[3] = {"save_s", "async_blocked_s", "async_total_s"};
	double *outs[3] = {save_s, async_blocked_s, async_total_s};
	for (int i = 0; i < 3; i++) {
		*outs[i] = 0;
		int f = find_number(p, keys[i], outs[i]);
		if (f < 0 || (f && *outs[i] < 0))
			return snprintf(why, len, "field \"%s\" is not a number of seconds >= 0", keys[i]), -1;
		if (!i && (!f || !(*save_s > 0)))
			return snprintf(why, len, "field \"save_s\" %s (expected the output of 'ferry ckpt bench --json')",
					f ? "is not above 0" : "is missing"), -1;
	}
	return 0;
}
