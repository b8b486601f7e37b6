/* ferry bench: log-linear latency histogram (fixed size, no allocation per I/O). */
#include <math.h>
#include <string.h>

#include "bench.h"

const double bench_percentiles[] = {1,  5,  10, 20, 30,   40,   50,    60,    70,
				    80, 90, 95, 99, 99.5, 99.9, 99.95, 99.99};
const unsigned bench_npercentiles = sizeof(bench_percentiles) / sizeof(bench_percentiles[0]);

void bench_hist_init(struct bench_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

static unsigned bucket_of(uint64_t v)
{
	if (v < BENCH_HIST_SUB)
		return (unsigned)v;
	unsigned e = 63 - (unsigned)__builtin_clzll(v);
	unsigned sub = (unsigned)(v >> (e - 6)) - BENCH_HIST_SUB;
	return BENCH_HIST_SUB + (e - 6) * BENCH_HIST_SUB + sub;
}

static uint64_t bucket_mid(unsigned i)
{
	if (i < BENCH_HIST_SUB)
		return i;
	unsigned e = (i - BENCH_HIST_SUB) / BENCH_HIST_SUB + 6;
	uint64_t sub = (i - BENCH_HIST_SUB) % BENCH_HIST_SUB;
	uint64_t lo = (BENCH_HIST_SUB + sub) << (e - 6);
	return lo + ((1ull << (e - 6)) >> 1);
}

void bench_hist_add(struct bench_hist *h, uint64_t ns)
{
	h->count[bucket_of(ns)]++;
	h->n++;
	h->sum += ns;
	h->sumsq += (double)ns * (double)ns;
	if (ns < h->min)
		h->min = ns;
	if (ns > h->max)
		h->max = ns;
}

void bench_hist_merge(struct bench_hist *into, const struct bench_hist *from)
{
	if (!from->n)
		return;
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++)
		into->count[i] += from->count[i];
	into->n += from->n;
	into->sum += from->sum;
	into->sumsq += from->sumsq;
	if (from->min < into->min)
		into->min = from->min;
	if (from->max > into->max)
		into->max = from->max;
}

uint64_t bench_hist_percentile(const struct bench_hist *h, double p)
{
	if (!h->n)
		return 0;
	uint64_t rank = (uint64_t)ceil(p / 100.0 * (double)h->n);
	if (rank < 1)
		rank = 1;
	if (rank > h->n)
		rank = h->n;
	uint64_t seen = 0;
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
		seen += h->count[i];
		if (seen >= rank) {
			uint64_t v = bucket_mid(i);
			if (v < h->min)
				v = h->min;
			if (v > h->max)
				v = h->max;
			return v;
		}
	}
	return h->max;
}

double bench_hist_mean(const struct bench_hist *h)
{
	return h->n ? (double)h->sum / (double)h->n : 0.0;
}

/* Sample standard deviation, as fio reports it. */
double bench_hist_stddev(const struct bench_hist *h)
{
	if (h->n < 2)
		return 0.0;
	double n = (double)h->n, mean = (double)h->sum / n;
	double var = (h->sumsq - n * mean * mean) / (n - 1.0);
	return var > 0 ? sqrt(var) : 0.0;
}
