/* Small shared utilities: version, sizes, clocks, logging, root overrides, aligned memory. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/base.h"

int ferry__log_level;

const char *ferry_version(void)
{
	return FERRY_VERSION_STRING;
}

int ferry__parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;
	uint64_t mult = 1;

	if (!s || !*s || *s == '-' || isspace((unsigned char)*s))
		return FERRY_EBADOPT;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return FERRY_EBADOPT;
	switch (tolower((unsigned char)*end)) {
	case '\0':
		break;
	case 'k':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
		mult = 1ull << 30;
		end++;
		break;
	case 't':
		mult = 1ull << 40;
		end++;
		break;
	default:
		return FERRY_EBADOPT;
	}
	/* accept "k", "kb", "kib" (fio's habits), all as powers of 1024 */
	if (mult > 1) {
		if (tolower((unsigned char)*end) == 'i')
			end++;
		if (tolower((unsigned char)*end) == 'b')
			end++;
	} else if (tolower((unsigned char)*end) == 'b') {
		end++;
	}
	if (*end)
		return FERRY_EBADOPT;
	v *= (double)mult;
	if (v > 9.2e18 || v != v)
		return FERRY_EBADOPT;
	*out = (uint64_t)v;
	return 0;
}

uint64_t ferry__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ferry__log(int level, const char *fmt, ...)
{
	static const char *names[] = {"", "error", "warn", "info", "debug"};
	va_list ap;

	/* The library never prints unless the user raised log_level (FERRY_LOG_LEVEL) explicitly. */
	fprintf(stderr, "ferry[%s]: ", names[level < 0 || level > 4 ? 0 : level]);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void *ferry_alloc_aligned(size_t len)
{
	void *p;

	if (len == 0)
		len = 1;
	/* mmap gives page alignment and zeroed, lazily backed memory; huge pages help large
	 * bounce buffers (fewer TLB misses in memcpy and fewer pages to pin). */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (len >= (2u << 20))
		madvise(p, len, MADV_HUGEPAGE);
	return p;
}

void ferry_free_aligned(void *p, size_t len)
{
	if (p)
		munmap(p, len ? len : 1);
}

int ferry__grow(void **p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 16;
	while (c < need)
		c *= 2;
	if (c > SIZE_MAX / size)
		return -ENOMEM;
	void *q = realloc(*p, c * size);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}
