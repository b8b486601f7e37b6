/* The CLI's progress line (cli/progress.h). */
#include "progress.h"
#include "ferry_tools.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *human(char *buf, size_t len, double v)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int k = 0;
	while (v >= 1024 && k < 4) {
		v /= 1024;
		k++;
	}
	snprintf(buf, len, k ? "%.1f %s" : "%.0f %s", v, u[k]);
	return buf;
}

void cli_progress_format(char *buf, size_t len, const char *label, const char *unit, uint64_t done,
			 uint64_t total, double elapsed)
{
	char bar[32] = "", amount[64], rate[48] = "", left[48] = "", a[24], b[24];
	if (total) {
		double frac = done >= total ? 1 : (double)done / (double)total;
		int w = 24, k = (int)(frac * w);
		bar[0] = '[';
		for (int i = 0; i < w; i++)
			bar[1 + i] = i < k ? '#' : ' ';
		bar[w + 1] = ']';
		bar[w + 2] = 0;
		if (unit)
			snprintf(amount, sizeof(amount), "%3.0f%% %llu/%llu %s", frac * 100, (unsigned long long)done,
				 (unsigned long long)total, unit);
		else
			snprintf(amount, sizeof(amount), "%3.0f%% %s/%s", frac * 100, human(a, sizeof(a), (double)done),
				 human(b, sizeof(b), (double)total));
		if (done && done < total && elapsed >= 0.1)
			snprintf(left, sizeof(left), ", %.0f s left", elapsed * (double)(total - done) / (double)done);
	} else if (unit) {
		snprintf(amount, sizeof(amount), "%llu %s", (unsigned long long)done, unit);
	} else {
		snprintf(amount, sizeof(amount), "%s", human(a, sizeof(a), (double)done));
	}
	if (!unit && elapsed >= 0.1) /* a rate over less is noise (a pack's copy drawn only at its end) */
		snprintf(rate, sizeof(rate), ", %s/s", human(a, sizeof(a), (double)done / elapsed));
	snprintf(buf, len, "%s: %s%s%s%s%s", label, bar, bar[0] ? " " : "", amount, rate, left);
}

static void draw(struct cli_progress *p, int complete)
{
	char line[512];
	uint64_t done = p->poll ? p->poll(p->arg) : atomic_load(&p->done);
	if (complete && done < p->total) /* parts the work did not need to read (no checksum to check) */
		done = p->total;
	cli_progress_format(line, sizeof(line), p->label, p->unit, done, p->total, ferry_tools_now_s() - p->t0);
	fprintf(stderr, "\r%s\033[K", line);
	fflush(stderr);
}

static void *progress_main(void *arg)
{
	struct cli_progress *p = arg;
	while (!atomic_load(&p->stop)) {
		for (int k = 0; k < 10 && !atomic_load(&p->stop); k++)
			usleep(10000); /* short work does not wait for the next redraw to end */
		if (!atomic_load(&p->stop))
			draw(p, 0);
	}
	return NULL;
}

int cli_progress_wanted(int quiet)
{
	return !quiet && isatty(2);
}

void cli_progress_start(struct cli_progress *p, const char *label, const char *unit, uint64_t total, int quiet,
			uint64_t (*poll)(void *arg), void *arg)
{
	memset(p, 0, sizeof(*p));
	p->label = label;
	p->unit = unit;
	p->total = total;
	p->poll = poll;
	p->arg = arg;
	p->t0 = ferry_tools_now_s();
	if (cli_progress_wanted(quiet) && pthread_create(&p->tid, NULL, progress_main, p) == 0)
		p->on = 1;
}

void cli_progress_set(struct cli_progress *p, uint64_t done)
{
	atomic_store(&p->done, done);
}

void cli_progress_clear(struct cli_progress *p)
{
	if (p->on) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
}

void cli_progress_stop(struct cli_progress *p, int keep)
{
	if (!p->on)
		return;
	atomic_store(&p->stop, 1);
	pthread_join(p->tid, NULL);
	p->on = 0;
	if (keep) {
		draw(p, 1);
		fputc('\n', stderr);
	} else {
		fputs("\r\033[K", stderr);
	}
	fflush(stderr);
}
