/* ferry top: a live view of block devices, CPU, GPUs and ferry processes; JSON lines; Prometheus. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "ferry/ferry.h"
#include "ferry_tools.h"

#define MAX_CLIENTS 16
#define REQ_MAX 8192

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

struct top_opts {
	double interval;
	int count, json;
	const char *prometheus;
};

#define TO(f) offsetof(struct top_opts, f)

static const struct cli_opt rows[] = {
	{.name = "interval", .letter = 'i', .kind = CLI_DOUBLE, .off = TO(interval), .arg = "SECONDS", .min = 0.05,
	 .max = 3600, .help = "refresh period, fractions allowed (default 1)"},
	{.name = "count", .letter = 'n', .kind = CLI_INT, .off = TO(count), .arg = "N", .min = 1, .max = INT_MAX,
	 .help = "stop after N samples"},
	{.name = "json", .kind = CLI_FLAG, .off = TO(json), .help = "one JSON object per sample per line"},
	{.name = "prometheus", .kind = CLI_STR, .off = TO(prometheus), .arg = "ADDR", .flags = CLI_OPTIONAL,
	 .implicit = "127.0.0.1:9464",
	 .help = "serve GET /metrics in Prometheus text format on ADDR\n(default 127.0.0.1:9464; port 0 picks a free one)"},
	{.name = NULL},
};

static const struct cli_cmd cmd = {
	.name = "top",
	.synopsis = "ferry top [-i SECONDS] [--count N] [--json] [--prometheus [ADDR]]",
	.about = "Live view: per block device MB/s, IOPS, latency and queue depth (/proc/diskstats), CPU busy,\n"
		 "iowait and softirq (/proc/stat), per GPU utilisation, memory and PCIe traffic (NVML), and\n"
		 "the ferry processes that publish their counters (docs/DOCTOR.md, 'ferry top').",
	.opts = rows,
	.max_args = 0,
};

static double val(const ferry_sampler *s, size_t i, const char *m)
{
	double v;
	return ferry_sampler_row_value(s, i, m, &v) == 0 ? v : NAN;
}

static int count_notes(const ferry_sampler *s)
{
	int k = 0;
	while (ferry_sampler_note(s, (size_t)k))
		k++;
	return k;
}

static int count_kind(const ferry_sampler *s, const char *kind)
{
	int k = 0;
	for (size_t i = 0; i < ferry_sampler_rows(s); i++)
		k += !strcmp(ferry_sampler_row_kind(s, i), kind);
	return k;
}

static double disk_activity(const ferry_sampler *s, size_t i)
{
	double r = val(s, i, "read_mbps"), w = val(s, i, "write_mbps");
	return (isnan(r) ? 0 : r) + (isnan(w) ? 0 : w);
}

/*
 * How many disk rows fit on the terminal with everything else shown, so that the header never
 * scrolls away on a machine with many block devices (loop devices, partitions of many drives).
 */
static int disk_rows_that_fit(const ferry_sampler *s, int tty)
{
	struct winsize ws;
	int disks = count_kind(s, "disk");
	if (!tty || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) || ws.ws_row == 0)
		return disks;
	int notes = 0, cols = ws.ws_col ? ws.ws_col : 80;
	for (size_t k = 0; ferry_sampler_note(s, k); k++) /* a long note wraps */
		notes += 1 + (int)(strlen(ferry_sampler_note(s, k)) / (size_t)cols);
	int gpus = count_kind(s, "gpu"), procs = count_kind(s, "ferry") + count_kind(s, "activity");
	int other = 2 /* title */ + 2 /* cpu */ + 1 /* disk header */ + (gpus ? 2 + gpus : 0) + notes + count_notes(s) +
		    (procs ? 2 + procs : 2) + 1 /* the cursor's line */;
	int fit = (int)ws.ws_row - other;
	if (fit >= disks)
		return disks;
	return fit > 1 ? fit - 1 : 1; /* one line says how many are not shown */
}

/* Numbers that fit their columns whatever their size: 1234567 -> "1.23M". */
static const char *human(double v, char *buf, size_t len)
{
	const char *unit = "";
	if (!isfinite(v))
		v = 0;
	if (v >= 1e9)
		v /= 1e9, unit = "G";
	else if (v >= 1e6)
		v /= 1e6, unit = "M";
	else if (v >= 1e4)
		v /= 1e3, unit = "k";
	snprintf(buf, len, v < 10 && *unit ? "%.2f%s" : "%.0f%s", v, unit);
	return buf;
}

/* A process's activity, indented under it: at most 100 columns. */
static void draw_activity(ferry_sampler *s, size_t i)
{
	const char *kind = ferry_sampler_row_text(s, i, "kind"), *name = ferry_sampler_row_text(s, i, "name");
	const char *phase = ferry_sampler_row_text(s, i, "phase");
	char a[16], b[16];
	kind = kind ? kind : "?";
	name = name ? name : "";
	/* the end of a long name (a path) says most */
	size_t len = strlen(name);
	if (len > 22)
		name += len - 22;
	printf("  %-6s %-22s %-8.8s", kind, name, phase ? phase : "");
	if (!strcmp(kind, "loader")) {
		printf(" %6s smp/s %6.1f bat/s %6.2f GB/s wait %5.1f%% %2.0f thr\n",
		       human(val(s, i, "samples_per_s"), a, sizeof(a)), val(s, i, "batches_per_s"), val(s, i, "gbps"),
		       val(s, i, "wait_pct"), val(s, i, "threads"));
		return;
	}
	double step = val(s, i, "step"), pct = val(s, i, "progress_pct");
	if (!isnan(step))
		printf(" step %-7.0f", step);
	else
		printf(" %12s", "");
	printf(" %3.0f%% %6sB %6.2f GB/s %5s tensors %5.1fs\n", isnan(pct) ? 0 : pct,
	       human(val(s, i, "total_bytes"), a, sizeof(a)), val(s, i, "gbps"), human(val(s, i, "tensors"), b, sizeof(b)),
	       val(s, i, "elapsed_s"));
}

static void draw(ferry_sampler *s, int tty)
{
	size_t n = ferry_sampler_rows(s);
	int show = disk_rows_that_fit(s, tty), disks = count_kind(s, "disk");
	double floor = -1; /* disks busier than this are shown when not all fit */
	if (show < disks) {
		double *act = calloc((size_t)disks, sizeof(*act));
		int k = 0;
		for (size_t i = 0; act && i < n; i++)
			if (!strcmp(ferry_sampler_row_kind(s, i), "disk"))
				act[k++] = disk_activity(s, i);
		for (int a = 0; act && a < show; a++) /* the show-th largest, by selection */
			for (int b = a + 1; b < k; b++)
				if (act[b] > act[a]) {
					double t = act[a];
					act[a] = act[b];
					act[b] = t;
				}
		floor = act && show > 0 ? act[show - 1] : 0;
		free(act);
	}
	if (tty)
		fputs("\033[H\033[2J", stdout);
	time_t t = time(NULL);
	char when[32];
	strftime(when, sizeof(when), "%H:%M:%S", localtime(&t));
	printf("ferry top  %s  interval %.2fs  (Ctrl-C quits)\n\n", when, ferry_sampler_interval(s));
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ferry_sampler_row_kind(s, i), "cpu"))
			printf("CPU  busy %5.1f%%  iowait %5.1f%%  softirq %5.1f%%\n\n", val(s, i, "busy_pct"),
			       val(s, i, "iowait_pct"), val(s, i, "softirq_pct"));
	printf("%-12s %9s %9s %9s %9s %9s %9s %7s %6s\n", "DEVICE", "rMB/s", "wMB/s", "r/s", "w/s", "r_await", "w_await",
	       "aqu-sz", "util%");
	int shown = 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(ferry_sampler_row_kind(s, i), "disk") || shown >= show ||
		    (floor >= 0 && disk_activity(s, i) < floor))
			continue;
		shown++;
		printf("%-12.12s %9.1f %9.1f %9.0f %9.0f %9.2f %9.2f %7.2f %6.1f\n", ferry_sampler_row_name(s, i),
		       val(s, i, "read_mbps"), val(s, i, "write_mbps"), val(s, i, "read_iops"),
		       val(s, i, "write_iops"), val(s, i, "read_await_ms"), val(s, i, "write_await_ms"),
		       val(s, i, "queue_depth"), val(s, i, "util_pct"));
	}
	if (shown < disks)
		printf("(+%d quieter devices not shown: a taller terminal, or --json, shows them all)\n", disks - shown);
	int gpus = 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(ferry_sampler_row_kind(s, i), "gpu"))
			continue;
		if (!gpus++)
			printf("\n%-4s %-24s %6s %10s %10s %10s %10s\n", "GPU", "MODEL", "util%", "mem MiB", "of MiB",
			       "rxMB/s", "txMB/s");
		const char *model = ferry_sampler_row_text(s, i, "name");
		printf("%-4s %-24.24s %6.0f %10.0f %10.0f %10.1f %10.1f\n", ferry_sampler_row_name(s, i),
		       model ? model : "", val(s, i, "util_pct"), val(s, i, "mem_used_mib"), val(s, i, "mem_total_mib"),
		       val(s, i, "pcie_rx_mbps"), val(s, i, "pcie_tx_mbps"));
	}
	for (size_t k = 0; ferry_sampler_note(s, k); k++)
		printf("\n%s\n", ferry_sampler_note(s, k));
	int procs = 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(ferry_sampler_row_kind(s, i), "ferry"))
			continue;
		if (!procs++)
			printf("\n%-8s %-20s %-10s %9s %9s %9s %9s %6s\n", "PID", "FERRY", "PATH", "rMB/s", "wMB/s", "r/s",
			       "w/s", "wait%");
		const char *name = ferry_sampler_row_text(s, i, "name"), *path = ferry_sampler_row_text(s, i, "path");
		printf("%-8s %-20.20s %-10.10s %9.1f %9.1f %9.0f %9.0f %6.1f\n", ferry_sampler_row_name(s, i),
		       name ? name : "", path ? path : "", val(s, i, "read_mbps"), val(s, i, "write_mbps"),
		       val(s, i, "read_iops"), val(s, i, "write_iops"), val(s, i, "wait_pct"));
		for (size_t k = i + 1; k < n && !strcmp(ferry_sampler_row_kind(s, k), "activity"); k++)
			draw_activity(s, k);
	}
	if (!procs)
		printf("\nno ferry process publishes statistics\n");
	if (!tty)
		printf("\n");
	fflush(stdout);
}

/* ------------------------------------------------------------------------------- HTTP server */

struct client {
	int fd;
	size_t len;
	double since;
	char buf[REQ_MAX];
};

static int listen_on(const char *addr, char *shown, size_t len)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	long port = 9464;
	if (colon) {
		snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
		char *end;
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 0 || port > 65535)
			return -EINVAL;
	} else {
		snprintf(host, sizeof(host), "%s", addr);
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (!host[0])
		snprintf(host, sizeof(host), "127.0.0.1");
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	socklen_t sl = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
	snprintf(shown, len, "%s:%u", ip, ntohs(sa.sin_port));
	return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
	double deadline = ferry_tools_now_s() + 2.0;
	while (n && ferry_tools_now_s() < deadline) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
		} else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd pf = {.fd = fd, .events = POLLOUT};
			poll(&pf, 1, 100);
		} else {
			return;
		}
	}
}

static void respond(struct client *c, ferry_sampler *s)
{
	char method[16] = "", target[256] = "";
	sscanf(c->buf, "%15s %255s", method, target);
	const char *body = "not found: only GET /metrics is served\n", *status = "404 Not Found";
	const char *ctype = "text/plain; charset=utf-8";
	if (!strcmp(method, "GET") && (!strcmp(target, "/metrics") || !strncmp(target, "/metrics?", 9))) {
		if (ferry_sampler_prometheus(s, &body) == 0) {
			status = "200 OK";
			ctype = "text/plain; version=0.0.4; charset=utf-8";
		} else {
			status = "500 Internal Server Error";
			body = "out of memory\n";
		}
	}
	char head[256];
	int hn = snprintf(head, sizeof(head),
			  "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
			  ctype, strlen(body));
	send_all(c->fd, head, (size_t)hn);
	if (strcmp(method, "HEAD"))
		send_all(c->fd, body, strlen(body));
}

/* Serves until deadline (monotonic seconds). The sampler holds the latest sample. */
static void serve(int lfd, struct client *cl, ferry_sampler *s, double deadline)
{
	while (!stop) {
		double left = deadline - ferry_tools_now_s();
		if (left <= 0)
			return;
		struct pollfd pf[MAX_CLIENTS + 1];
		int np = 0;
		pf[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
		for (int i = 0; i < MAX_CLIENTS; i++)
			if (cl[i].fd >= 0)
				pf[np++] = (struct pollfd){.fd = cl[i].fd, .events = POLLIN};
		int r = poll(pf, (nfds_t)np, (int)(left * 1000) + 1);
		if (r < 0 && errno != EINTR)
			return;
		if (r <= 0)
			continue;
		if (pf[0].revents & POLLIN) {
			int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			int slot = -1;
			for (int i = 0; fd >= 0 && i < MAX_CLIENTS && slot < 0; i++)
				if (cl[i].fd < 0)
					slot = i;
			if (fd >= 0 && slot < 0) {
				close(fd); /* too many at once: the client retries */
			} else if (fd >= 0) {
				cl[slot].fd = fd;
				cl[slot].len = 0;
				cl[slot].buf[0] = '\0';
				cl[slot].since = ferry_tools_now_s();
			}
		}
		for (int i = 0; i < MAX_CLIENTS; i++) {
			struct client *c = &cl[i];
			if (c->fd < 0)
				continue;
			ssize_t got = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, 0);
			if (got > 0) {
				c->len += (size_t)got;
				c->buf[c->len] = '\0';
			}
			int done = got > 0 && (strstr(c->buf, "\r\n\r\n") || strstr(c->buf, "\n\n"));
			int dead = got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR) ||
				   c->len >= sizeof(c->buf) - 1 || ferry_tools_now_s() - c->since > 5.0;
			if (done)
				respond(c, s);
			if (done || dead) {
				close(c->fd);
				c->fd = -1;
			}
		}
	}
}

int ferry_cmd_top(int argc, char **argv)
{
	struct top_opts o = {.interval = 1.0, .count = -1};
	struct cli_args a = {0};
	int rc = cli_parse(&cmd, &o, argc, argv, &a);
	if (rc != CLI_CONTINUE)
		return rc;
	double interval = o.interval;
	long count = o.count;
	int json = o.json;
	const char *prom = o.prometheus;
	int lfd = -1;
	struct client cl[MAX_CLIENTS];
	for (int i = 0; i < MAX_CLIENTS; i++)
		cl[i].fd = -1;
	if (prom) {
		char shown[64];
		lfd = listen_on(prom, shown, sizeof(shown));
		if (lfd == -EINVAL) {
			return cli_usage_error(&cmd, NULL, "--prometheus expects IPv4ADDR:PORT; got '%s'", prom);
		}
		if (lfd < 0) {
			fprintf(stderr, "ferry top: cannot listen on %s: %s\n", prom, strerror(-lfd));
			return 1;
		}
		fprintf(stderr, "ferry top: serving http://%s/metrics\n", shown);
	}
	ferry_sampler *s;
	if (ferry_sampler_create(&s)) {
		fprintf(stderr, "ferry top: %s\n", ferry_last_error());
		return 1;
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	int tty = isatty(STDOUT_FILENO);
	rc = 0;
	if (ferry_sampler_sample(s)) {
		fprintf(stderr, "ferry top: %s\n", ferry_last_error());
		ferry_sampler_destroy(s);
		if (lfd >= 0)
			close(lfd);
		return 1;
	}
	double next = ferry_tools_now_s() + interval;
	for (long shown = 0; !stop && (count < 0 || shown < count); shown++) {
		if (lfd >= 0) {
			serve(lfd, cl, s, next);
		} else {
			double left;
			while (!stop && (left = next - ferry_tools_now_s()) > 0) {
				struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
				nanosleep(&ts, NULL);
			}
		}
		if (stop)
			break;
		next += interval;
		if (ferry_sampler_sample(s)) {
			fprintf(stderr, "ferry top: %s\n", ferry_last_error());
			rc = 1;
			break;
		}
		if (json) {
			const char *line;
			if (ferry_sampler_json(s, &line) == 0)
				printf("%s\n", line);
			if (fflush(stdout) == EOF) /* the reader went away */
				break;
		} else if (lfd < 0) {
			draw(s, tty);
		}
	}
	for (int i = 0; i < MAX_CLIENTS; i++)
		if (cl[i].fd >= 0)
			close(cl[i].fd);
	if (lfd >= 0)
		close(lfd);
	ferry_sampler_destroy(s);
	return rc;
}
