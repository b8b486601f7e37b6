/* The pinned slot pool: page-aligned host memory, page-locked for the GPU when one is usable. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "gpu/shim.h"

struct slot {
	void *ptr;
	size_t size;
	int pinned;
	int deferred; /* made by ferry__pinned_alloc_unpinned: not page-locked until ferry__pinned_pin */
	int in_use;
	struct slot *next;
};

struct ferry__pinned_pool {
	pthread_mutex_t lock;
	uint64_t budget; /* 0: none */
	uint64_t held;   /* bytes of all slots, in use or cached, plus reservations being made */
	int device;
	struct slot *slots;
	char unpinned[384];
};

#define HUGE_PAGE (2u << 20)

int ferry__pinned_pool_create(uint64_t budget, int device, struct ferry__pinned_pool **out)
{
	struct ferry__pinned_pool *p = calloc(1, sizeof(*p));

	if (!p)
		return ferry__error(-ENOMEM, "pinned slot pool: out of memory");
	pthread_mutex_init(&p->lock, NULL);
	p->budget = budget;
	p->device = device;
	*out = p;
	return 0;
}

static void release(struct ferry__pinned_pool *p, struct slot *s)
{
	const struct ferry__cuda_api *cu = s->pinned ? ferry__cuda() : NULL;

	/* Unregistering works from any context: the registration was portable. */
	if (cu)
		cu->MemHostUnregister(s->ptr);
	munmap(s->ptr, s->size);
	free(s);
	(void)p;
}

void ferry__pinned_pool_destroy(struct ferry__pinned_pool *p)
{
	ferry__CUcontext prev = NULL;
	int any = 0, entered = 0;

	if (!p)
		return;
	for (struct slot *s = p->slots; s; s = s->next)
		any |= s->pinned;
	if (any && ferry__cuda_enter_device(p->device, &prev) == 0)
		entered = 1;
	while (p->slots) {
		struct slot *s = p->slots;
		p->slots = s->next;
		release(p, s);
	}
	if (entered)
		ferry__cuda_leave_device(prev);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

/* Page-locks [ptr, ptr + size) for every context; on failure says why in p->unpinned. */
static int pin(struct ferry__pinned_pool *p, void *ptr, size_t size)
{
	const struct ferry__cuda_api *cu;
	ferry__CUcontext prev = NULL;
	ferry__CUresult r;
	char detail[256];

	if (p->device < 0)
		return 0;
	cu = ferry__cuda();
	if (!cu) {
		pthread_mutex_lock(&p->lock);
		snprintf(p->unpinned, sizeof(p->unpinned), "no GPU: %s", ferry__cuda_unavailable_reason());
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	if (ferry__cuda_enter_device(p->device, &prev) != 0) {
		snprintf(detail, sizeof(detail), "%s", ferry_last_error());
		r = -1;
	} else {
		r = cu->MemHostRegister(ptr, size, FERRY__CU_MEMHOSTREGISTER_PORTABLE);
		ferry__cuda_leave_device(prev);
		if (r != FERRY__CUDA_SUCCESS) {
			ferry__cuda_fail(r, "cuMemHostRegister(%zu bytes)", size);
			snprintf(detail, sizeof(detail), "%s", ferry_last_error());
		}
	}
	if (r != FERRY__CUDA_SUCCESS) {
		pthread_mutex_lock(&p->lock);
		snprintf(p->unpinned, sizeof(p->unpinned), "%s", detail);
		pthread_mutex_unlock(&p->lock);
		FERRY__LOG(FERRY__LOG_WARN, "pinned slot pool: slot left pageable: %s", detail);
		return 0;
	}
	return 1;
}

static int alloc(struct ferry__pinned_pool *p, size_t size, void **out, int *is_pinned, int now);

/* Locks a deferred slot its caller has claimed (deferred cleared under the lock), outside the lock. */
static void pin_claimed(struct ferry__pinned_pool *p, struct slot *s)
{
	int pinned = pin(p, s->ptr, s->size);
	pthread_mutex_lock(&p->lock);
	s->pinned = pinned;
	pthread_mutex_unlock(&p->lock);
}

int ferry__pinned_alloc(struct ferry__pinned_pool *p, size_t size, void **out, int *is_pinned)
{
	return alloc(p, size, out, is_pinned, 1);
}

int ferry__pinned_alloc_unpinned(struct ferry__pinned_pool *p, size_t size, void **out, int *is_pinned)
{
	return alloc(p, size, out, is_pinned, 0);
}

int ferry__pinned_pin(struct ferry__pinned_pool *p, void *ptr, int *is_pinned)
{
	struct slot *s;
	int claimed = 0;

	pthread_mutex_lock(&p->lock);
	for (s = p->slots; s && s->ptr != ptr; s = s->next)
		;
	if (!s) {
		pthread_mutex_unlock(&p->lock);
		return ferry__error(-EINVAL, "pinned slot pool: %p is not a slot of this pool", ptr);
	}
	if (s->deferred) {
		s->deferred = 0; /* claimed: the slot is its caller's, in use */
		claimed = 1;
	}
	pthread_mutex_unlock(&p->lock);
	if (claimed)
		pin_claimed(p, s);
	*is_pinned = s->pinned;
	return 0;
}

static int alloc(struct ferry__pinned_pool *p, size_t size, void **out, int *is_pinned, int now)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct slot *s, **pp, *drop = NULL;
	uint64_t held;
	void *ptr;

	if (size == 0 || size > SIZE_MAX - page)
		return ferry__error(-EINVAL, "pinned slot of %zu bytes", size);
	size = (size + page - 1) & ~(page - 1);
	pthread_mutex_lock(&p->lock);
	for (s = p->slots; s; s = s->next) {
		if (!s->in_use && s->size == size) {
			int pin_now = now && s->deferred; /* a deferred slot, never locked, for a caller that needs it locked */
			s->in_use = 1;
			s->deferred &= !pin_now;
			pthread_mutex_unlock(&p->lock);
			if (pin_now)
				pin_claimed(p, s);
			*out = s->ptr;
			if (is_pinned)
				*is_pinned = s->pinned;
			return 0;
		}
	}
	/* Over budget: drop cached slots of other sizes before giving up. */
	for (pp = &p->slots; p->budget && p->held + size > p->budget && *pp;) {
		s = *pp;
		if (s->in_use) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		p->held -= s->size;
		s->next = drop;
		drop = s;
	}
	held = p->held;
	if (p->budget && held + size > p->budget) {
		pthread_mutex_unlock(&p->lock);
		while (drop) {
			s = drop;
			drop = s->next;
			release(p, s);
		}
		return ferry__error(FERRY_EBUDGET, "pinned slot of %zu bytes: host_budget is %llu bytes "
				    "and %llu are held", size, (unsigned long long)p->budget,
				    (unsigned long long)held);
	}
	p->held += size; /* reserved while the slot is made outside the lock */
	pthread_mutex_unlock(&p->lock);
	while (drop) {
		s = drop;
		drop = s->next;
		release(p, s);
	}

	s = calloc(1, sizeof(*s));
	ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!s || ptr == MAP_FAILED) {
		free(s);
		if (ptr != MAP_FAILED)
			munmap(ptr, size);
		pthread_mutex_lock(&p->lock);
		p->held -= size;
		pthread_mutex_unlock(&p->lock);
		return ferry__error(-ENOMEM, "pinned slot of %zu bytes: out of memory", size);
	}
	if (size >= HUGE_PAGE)
		madvise(ptr, size, MADV_HUGEPAGE);
	s->ptr = ptr;
	s->size = size;
	s->in_use = 1;
	s->pinned = now ? pin(p, ptr, size) : 0;
	s->deferred = !now && p->device >= 0;
	pthread_mutex_lock(&p->lock);
	s->next = p->slots;
	p->slots = s;
	pthread_mutex_unlock(&p->lock);
	*out = ptr;
	if (is_pinned)
		*is_pinned = s->pinned;
	return 0;
}

void ferry__pinned_free(struct ferry__pinned_pool *p, void *ptr)
{
	if (!p || !ptr)
		return;
	pthread_mutex_lock(&p->lock);
	for (struct slot *s = p->slots; s; s = s->next) {
		if (s->ptr == ptr) {
			s->in_use = 0;
			break;
		}
	}
	pthread_mutex_unlock(&p->lock);
}

uint64_t ferry__pinned_held(struct ferry__pinned_pool *p)
{
	uint64_t held;

	pthread_mutex_lock(&p->lock);
	held = p->held;
	pthread_mutex_unlock(&p->lock);
	return held;
}

const char *ferry__pinned_unpinned_reason(struct ferry__pinned_pool *p)
{
	return p->unpinned;
}
