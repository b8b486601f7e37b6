/* Copies out of mappings under a SIGBUS guard (mapcopy.h). */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "base/mapcopy.h"

/* A thread's guard: in static storage, so that the handler never reads freed memory, and
 * found by pthread_self() (thread-local storage of a dlopen()ed module is not safe to touch in a
 * signal handler, and its initial-exec form does not load under torch: no static TLS room left). */
struct ferry__bus_guard {
	atomic_int used, on;
	pthread_t self;
	sigjmp_buf jb;
};
#define BUS_GUARDS 64
static struct ferry__bus_guard bus_guards[BUS_GUARDS];
static struct sigaction bus_prev;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;
static int bus_installed;

static void bus_handler(int sig, siginfo_t *info, void *uc)
{
	if (info && info->si_code > 0) { /* a fault, not kill(2): in a guarded copy? */
		pthread_t me = pthread_self();
		for (int i = 0; i < BUS_GUARDS; i++) {
			struct ferry__bus_guard *g = &bus_guards[i];
			if (atomic_load(&g->on) && pthread_equal(g->self, me)) {
				atomic_store(&g->on, 0);
				siglongjmp(g->jb, 1);
			}
		}
	}
	if (bus_prev.sa_flags & SA_SIGINFO) {
		bus_prev.sa_sigaction(sig, info, uc);
	} else if (bus_prev.sa_handler != SIG_DFL && bus_prev.sa_handler != SIG_IGN) {
		bus_prev.sa_handler(sig);
	} else {
		/* the previous disposition back: a fault happens again on return and takes it; a
		 * signal sent by kill(2) is sent again */
		sigaction(SIGBUS, &bus_prev, NULL);
		if (!info || info->si_code <= 0)
			raise(sig);
	}
}

/* A fork()ed child has only the forking thread: no guarded copy runs there (a new thread could
 * reuse a pipeline thread's pthread_t). */
static void bus_atfork_child(void)
{
	for (int i = 0; i < BUS_GUARDS; i++)
		atomic_store(&bus_guards[i].on, 0);
}

static void bus_install(void)
{
	pthread_atfork(NULL, NULL, bus_atfork_child);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = bus_handler;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK; /* NODEFER: nothing to unblock after the jump */
	sigemptyset(&sa.sa_mask);
	bus_installed = sigaction(SIGBUS, &sa, &bus_prev) == 0;
}

/* 1 when copies out of mappings are guarded now (one sigaction(2) call). */
int ferry__bus_guarded(void)
{
	struct sigaction cur;
	pthread_once(&bus_once, bus_install);
	return bus_installed && !sigaction(SIGBUS, NULL, &cur) && (cur.sa_flags & SA_SIGINFO) &&
	       cur.sa_sigaction == bus_handler;
}

/* A guard for the calling thread, or NULL when all are taken (then it maps nothing). */
struct ferry__bus_guard *ferry__bus_guard_claim(void)
{
	for (int i = 0; i < BUS_GUARDS; i++)
		if (!atomic_exchange(&bus_guards[i].used, 1)) {
			bus_guards[i].self = pthread_self();
			return &bus_guards[i];
		}
	return NULL;
}

void ferry__bus_guard_release(struct ferry__bus_guard *g)
{
	if (g) {
		atomic_store(&g->on, 0);
		atomic_store(&g->used, 0);
	}
}

/* Does the batch's copies out of mappings; returns how many were done (< n: copy n faulted). */
size_t ferry__copy_guarded(struct ferry__bus_guard *g, const struct ferry__mcopy *mc, size_t n)
{
	volatile size_t i = 0;
	if (sigsetjmp(g->jb, 0)) /* savemask 0: no system call; SA_NODEFER left SIGBUS unblocked */
		return i;
	atomic_store(&g->on, 1);
	for (; i < n; i++)
		memcpy(mc[i].dst, mc[i].src, mc[i].len);
	atomic_store(&g->on, 0);
	return n;
}
