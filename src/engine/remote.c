/* The remote backend: s3://, http:// and https:// objects read with ranged GETs through libcurl's multi
 * interface (docs/REMOTE.md). A read is cut into parts of remote_part_size; up to remote_connections
 * of them run at once on easy handles kept with their multi handle (a file's pool), so connections
 * stay alive from one read to the next; each part's bytes land where they belong in the caller's
 * memory (or the chunk's pinned slot: device reads are staged by the engine like any host backend). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "gpu/shim.h"
#include "engine/remote.h"

#ifdef FERRY_HAVE_LIBCURL
#include <curl/curl.h>
#endif

#ifndef FERRY_HAVE_LIBCURL

static int remote_probe(char *why, size_t len)
{
	snprintf(why, len, "built without libcurl");
	return FERRY_EBACKEND;
}

int ferry__remote_open(ferry_ctx *ctx, const char *url, int flags, struct ferry__remote **out)
{
	*out = NULL;
	return ferry__error(FERRY_EBACKEND, "open(%s): remote URLs are unavailable: built without libcurl", url);
}
void ferry__remote_close(struct ferry__remote *r)
{
}
uint64_t ferry__remote_size(const struct ferry__remote *r)
{
	return 0;
}
int ferry__remote_info(const struct ferry__remote *r, char *buf, size_t len)
{
	return snprintf(buf, len, "remote: built without libcurl");
}
int64_t ferry__remote_read(struct ferry__remote *r, void *buf, size_t len, uint64_t off)
{
	return ferry__error(FERRY_EBACKEND, "remote read: built without libcurl");
}
void ferry__remote_last_error(struct ferry__remote *r, char *buf, size_t len)
{
	if (len)
		buf[0] = 0;
}
int64_t ferry__remote_write(struct ferry__remote *r, const void *buf, size_t len, uint64_t off)
{
	return ferry__error(FERRY_EBACKEND, "remote write: built without libcurl");
}
int ferry__remote_commit(struct ferry__remote *r)
{
	return 0;
}
int ferry__remote_list(ferry_ctx *ctx, const char *prefix, ferry__remote_list_fn fn, void *arg)
{
	return ferry__error(FERRY_EBACKEND, "list(%s): built without libcurl", prefix);
}
int ferry__remote_delete(ferry_ctx *ctx, const char *url)
{
	return ferry__error(FERRY_EBACKEND, "delete(%s): built without libcurl", url);
}
const char *ferry__file_etag(const ferry_file *f)
{
	(void)f;
	return NULL;
}
int ferry__file_put_condition(ferry_file *f, const char *header)
{
	(void)f;
	return ferry__error(FERRY_EBACKEND, "conditional write (%s): built without libcurl", header);
}

#else

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define BODY_MAX 4096 /* of an error body: S3's XML error is a few hundred bytes */
#define MIN_PART (5u << 20) /* S3's smallest part but the last */
/*
 * libcurl's receive buffer for a ranged GET: each recv() fills it and each fill is one write
 * callback (a copy into the destination). libcurl's default is 16 KiB; 512 KiB is the most libcurl
 * 7.x takes (CURL_MAX_READ_SIZE). Against nginx on the loopback (2-core VM, a 286 MB object, 4
 * connections), CPU per GB went 0.80 -> 0.46 -> 0.37 s at 16 -> 128 -> 512 KiB (docs/CONFIG.md).
 */
#define RECV_BUFFER (512L << 10)

/* A multi handle and its easy handles: one read at a time uses a set; idle sets wait in the pool. */
struct conn_set {
	CURLM *multi;
	CURL **easy;
	unsigned n;
	struct conn_set *next;
};

struct ferry__remote {
	ferry_ctx *ctx;
	char *url;  /* as the user wrote it */
	char *http; /* the request URL */
	bool s3;
	struct ferry__aws aws;
	char sigv4[128];
	char etag[256];
	uint64_t size;
	struct curl_slist *headers; /* If-Match, x-amz-security-token, x-amz-content-sha256 */
	unsigned connections, retries, timeout;
	size_t part_size;
	pthread_mutex_t mu; /* pool, err */
	struct conn_set *pool;
	char err[1536];
	/* writes (a new object, in order): parts of wpart_size buffered, uploaded remote_connections
	 * at a time as parts of a multipart upload; committed by ferry_file_sync, aborted otherwise */
	bool writing, committed;
	int write_err;      /* the first failure: every later write and the commit return it */
	uint64_t written;   /* bytes taken so far */
	size_t wpart_size;
	char upload_id[1024]; /* "" until the first full batch of parts goes up */
	struct wpart *wparts; /* buffered, not yet uploaded: connections of them */
	unsigned nwparts;
	char **etags;       /* of the uploaded parts, by part number - 1 */
	unsigned nuploaded, etags_cap;
	pthread_mutex_t wmu; /* one writer at a time */
	char cond[320];      /* the commit's condition (ferry__file_put_condition), "" for none */
	bool lock;           /* the context's remote_lock knob */
};

static void abort_upload(struct ferry__remote *r);

struct wpart {
	char *buf;
	size_t len, sent;
	unsigned num; /* part number, from 1 */
	unsigned tries;
	char etag[256];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int remote_probe(char *why, size_t len)
{
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK) {
		snprintf(why, len, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
		return FERRY_EBACKEND;
	}
	return 0;
}

/* Sets the detail in this thread and keeps it in r for a waiting thread. */
static int fail(struct ferry__remote *r, int code, const char *fmt, ...) FERRY__PRINTF(3, 4);
static int fail(struct ferry__remote *r, int code, const char *fmt, ...)
{
	char buf[sizeof(r->err)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&r->mu);
	memcpy(r->err, buf, sizeof(buf));
	pthread_mutex_unlock(&r->mu);
	return ferry__error(code, "%s", buf);
}

void ferry__remote_last_error(struct ferry__remote *r, char *buf, size_t len)
{
	pthread_mutex_lock(&r->mu);
	snprintf(buf, len, "%s", r->err);
	pthread_mutex_unlock(&r->mu);
}

static uint64_t now_ms(void)
{
	return ferry__now_ns() / 1000000u;
}

/* Exponential backoff with jitter: 100 ms doubling to at most 5 s, each wait a random 50-100% of it. */
static uint64_t backoff_ms(unsigned tries)
{
	uint64_t d = 100u << (tries > 6 ? 6 : tries - 1);
	if (d > 5000)
		d = 5000;
	unsigned seed = (unsigned)ferry__now_ns();
	return d / 2 + (uint64_t)rand_r(&seed) % (d / 2 + 1);
}

static bool retryable_curl(CURLcode rc)
{
	switch (rc) {
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_COULDNT_CONNECT:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

static int curl_code_errno(CURLcode rc)
{
	switch (rc) {
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
		return -EHOSTUNREACH;
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

static bool retryable_status(long status)
{
	return status >= 500 || status == 429 || status == 408;
}

static int status_errno(long status)
{
	switch (status) {
	case 404:
		return -ENOENT;
	case 401:
	case 403:
		return -EACCES;
	case 412:
		return -ESTALE;
	case 408:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

/*
 * The CA certificates to check https:// servers with. libcurl looks where the distribution that
 * built it keeps them (Debian: /etc/ssl/certs/ca-certificates.crt); a wheel carries Debian's libcurl
 * to machines that keep them elsewhere. SSL_CERT_FILE and CURL_CA_BUNDLE (the variables OpenSSL and
 * curl read) come first, then the first of the usual places that exists; NULL leaves libcurl's own.
 */
static const char *ca_found;
static pthread_once_t ca_once = PTHREAD_ONCE_INIT;

static void ca_find(void)
{
	static const char *const env[] = {"CURL_CA_BUNDLE", "SSL_CERT_FILE"};
	static const char *const files[] = {
		"/etc/ssl/certs/ca-certificates.crt",                /* Debian, Ubuntu, Arch */
		"/etc/pki/tls/certs/ca-bundle.crt",                  /* RHEL, Fedora, CentOS */
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", /* RHEL 7+ */
		"/etc/ssl/ca-bundle.pem",                            /* openSUSE */
		"/etc/ssl/cert.pem",                                 /* Alpine, macOS */
	};
	for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++) {
		const char *v = getenv(env[i]);
		if (v && *v) {
			ca_found = v;
			return;
		}
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]) && !ca_found; i++)
		if (!access(files[i], R_OK))
			ca_found = files[i];
}

/* Looked up once per process (every request sets it: a part's GET must not stat five paths). */
static const char *ca_bundle(void)
{
	pthread_once(&ca_once, ca_find);
	return ca_found;
}

/* Options every request of r carries. */
static void common_opts(struct ferry__remote *r, CURL *e)
{
	const char *ca = ca_bundle();
	if (ca)
		curl_easy_setopt(e, CURLOPT_CAINFO, ca);
	curl_easy_setopt(e, CURLOPT_URL, r->http);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
	/* a connection not made, or a transfer below 1 KiB/s, for remote_timeout seconds is retried */
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)r->timeout * 1000L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)r->timeout);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
	if (r->s3 && r->aws.sign) {
		curl_easy_setopt(e, CURLOPT_AWS_SIGV4, r->sigv4);
		curl_easy_setopt(e, CURLOPT_USERNAME, r->aws.access_key);
		curl_easy_setopt(e, CURLOPT_PASSWORD, r->aws.secret_key);
	}
}

/* --------------------------------------------------------------------------------------- parts */

struct part {
	uint64_t off; /* object offset of its first byte */
	size_t len, got;
	unsigned tries;
	uint64_t not_before; /* ms: the next try waits for its backoff */
	bool active, done;
};

struct xfer {
	struct ferry__remote *r;
	CURL *e;
	struct part *p;
	char *dst;    /* the part's first byte in the destination */
	bool whole;   /* the part is the whole object: a 200 without Range is the same bytes */
	long status;
	bool refused; /* the write callback stopped the transfer (too many bytes, Range ignored) */
	bool range_checked; /* the 206's Content-Range was found right (once a transfer, not per callback) */
	uint64_t want; /* the first byte asked for */
	char range[96]; /* the answer's Content-Range, "" if none */
	char body[BODY_MAX];
	size_t blen;
};

static size_t on_range_header(char *data, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t n = size * nmemb;

	if (n > 14 && !strncasecmp(data, "Content-Range:", 14)) {
		size_t s = 14;
		while (s < n && (data[s] == ' ' || data[s] == '\t'))
			s++;
		size_t k = n - s < sizeof(x->range) - 1 ? n - s : sizeof(x->range) - 1;
		memcpy(x->range, data + s, k);
		x->range[k] = 0;
	}
	return n;
}

/* A 206 for other bytes than asked (another start, or an object of another size: changed on a
 * server without ETags, or a proxy that misbehaves) must not land in the buffer. */
static bool range_ok(const struct xfer *x)
{
	unsigned long long a, b, total;
	if (sscanf(x->range, " bytes %llu-%llu/%llu", &a, &b, &total) == 3)
		return a == x->want && total == x->r->size;
	return sscanf(x->range, " bytes %llu-%llu/*", &a, &b) == 2 && a == x->want;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t n = size * nmemb;

	if (!x->status)
		curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &x->status);
	if (x->status != 206 && x->status != 200) {
		size_t room = sizeof(x->body) - x->blen;
		size_t k = n < room ? n : room;
		memcpy(x->body + x->blen, data, k);
		x->blen += k;
		return n;
	}
	if ((x->status == 200 && !(x->whole && x->p->got == 0 && x->p->off == 0)) || x->p->got + n > x->p->len ||
	    (x->status == 206 && !x->range_checked && !range_ok(x))) {
		x->refused = true;
		return 0;
	}
	x->range_checked = true;
	memcpy(x->dst + x->p->got, data, n);
	x->p->got += n;
	return n;
}

static void start_part(struct ferry__remote *r, CURLM *m, struct xfer *x, struct part *p, char *dst, bool whole)
{
	char range[64];

	x->p = p;
	x->dst = dst;
	x->whole = whole;
	x->status = 0;
	x->refused = false;
	x->range_checked = false;
	x->blen = 0;
	x->want = p->off + p->got;
	x->range[0] = 0;
	p->active = true;
	common_opts(r, x->e);
	curl_easy_setopt(x->e, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(x->e, CURLOPT_HEADERFUNCTION, on_range_header);
	curl_easy_setopt(x->e, CURLOPT_HEADERDATA, x);
	snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)(p->off + p->got),
		 (unsigned long long)(p->off + p->len - 1));
	curl_easy_setopt(x->e, CURLOPT_RANGE, range);
	curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(x->e, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(x->e, CURLOPT_PRIVATE, x);
	curl_easy_setopt(x->e, CURLOPT_BUFFERSIZE, RECV_BUFFER);
	curl_multi_add_handle(m, x->e);
}

/* "HTTP 404 NoSuchKey (The specified key does not exist.)" from a finished transfer. */
static void describe_status(const struct xfer *x, char *buf, size_t len)
{
	char code[64], msg[320];
	ferry__s3_error_code(x->body, x->blen, code, sizeof(code), msg, sizeof(msg));
	if (code[0])
		snprintf(buf, len, "HTTP %ld %s (%s)", x->status, code, msg);
	else
		snprintf(buf, len, "HTTP %ld", x->status);
}

enum { PART_DONE, PART_RETRY, PART_FAILED };

/* Judges a finished transfer; PART_FAILED with the detail set. */
static int judge(struct ferry__remote *r, struct xfer *x, CURLcode rc, char *why, size_t wlen, int *err)
{
	struct part *p = x->p;
	unsigned long long a = p->off, b = p->off + p->len - 1;

	if (!x->status)
		curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &x->status);
	if (rc == CURLE_WRITE_ERROR && x->refused && x->status == 206 && !range_ok(x)) {
		size_t l = strlen(x->range);
		while (l && (x->range[l - 1] == '\r' || x->range[l - 1] == '\n'))
			l--;
		*err = fail(r, -ESTALE, "%s: GET bytes=%llu-%llu (%s): HTTP 206 Content-Range \"%.*s\" for bytes from %llu of an "
			    "object of %llu bytes: the object changed, or the server answered other bytes; none of "
			    "them is returned", r->url, a, b, r->http, (int)l, x->range, (unsigned long long)x->want,
			    (unsigned long long)r->size);
		return PART_FAILED;
	}
	if (rc == CURLE_WRITE_ERROR && x->refused) {
		*err = fail(r, -EIO, "%s: GET bytes=%llu-%llu (%s): HTTP %ld: the server sent %s", r->url, a, b,
			    r->http, x->status, x->status == 200 ? "the whole object (it ignored Range)"
								 : "more bytes than the range holds");
		return PART_FAILED;
	}
	if (rc != CURLE_OK) {
		snprintf(why, wlen, "%s (curl error %d)", curl_easy_strerror(rc), (int)rc);
		if (retryable_curl(rc))
			return PART_RETRY;
		*err = fail(r, curl_code_errno(rc), "%s: GET bytes=%llu-%llu (%s): %s", r->url, a, b, r->http, why);
		return PART_FAILED;
	}
	if (x->status == 206 || x->status == 200) {
		if (p->got == p->len)
			return PART_DONE;
		snprintf(why, wlen, "HTTP %ld: the body ended after %zu of %zu bytes", x->status, p->got, p->len);
		return PART_RETRY; /* resumed from where it stopped */
	}
	describe_status(x, why, wlen);
	if (retryable_status(x->status))
		return PART_RETRY;
	if (x->status == 412)
		*err = fail(r, -ESTALE, "%s: GET bytes=%llu-%llu (%s): %s: the object changed during the read (If-Match "
			    "%s failed); nothing read from the new object is returned", r->url, a, b, r->http, why, r->etag);
	else
		*err = fail(r, status_errno(x->status), "%s: GET bytes=%llu-%llu (%s): %s", r->url, a, b, r->http, why);
	return PART_FAILED;
}

static struct conn_set *set_take(struct ferry__remote *r)
{
	struct conn_set *s;

	pthread_mutex_lock(&r->mu);
	s = r->pool;
	if (s)
		r->pool = s->next;
	pthread_mutex_unlock(&r->mu);
	if (s)
		return s;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->multi = curl_multi_init();
	s->easy = calloc(r->connections, sizeof(*s->easy));
	if (!s->multi || !s->easy) {
		if (s->multi)
			curl_multi_cleanup(s->multi);
		free(s->easy);
		free(s);
		return NULL;
	}
	curl_multi_setopt(s->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r->connections);
	curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, (long)r->connections);
	return s;
}

static void set_free(struct conn_set *s)
{
	for (unsigned i = 0; i < s->n; i++)
		curl_easy_cleanup(s->easy[i]);
	curl_multi_cleanup(s->multi);
	free(s->easy);
	free(s);
}

static void set_give(struct ferry__remote *r, struct conn_set *s)
{
	pthread_mutex_lock(&r->mu);
	s->next = r->pool;
	r->pool = s;
	pthread_mutex_unlock(&r->mu);
}

int64_t ferry__remote_read(struct ferry__remote *r, void *buf, size_t len, uint64_t off)
{
	if (off >= r->size || !len)
		return 0;
	if (len > r->size - off)
		len = (size_t)(r->size - off);
	size_t ps = r->part_size, np = (len + ps - 1) / ps;
	unsigned nx = np < r->connections ? (unsigned)np : r->connections;
	struct part *parts = calloc(np, sizeof(*parts));
	struct xfer *xs = calloc(nx, sizeof(*xs));
	struct conn_set *s = parts && xs ? set_take(r) : NULL;
	int err = 0;
	char why[512] = "";

	if (!s) {
		free(parts);
		free(xs);
		return fail(r, -ENOMEM, "%s: read of %zu bytes at %llu: out of memory", r->url, len,
			    (unsigned long long)off);
	}
	for (size_t i = 0; i < np; i++) {
		parts[i].off = off + i * ps;
		parts[i].len = i + 1 < np ? ps : len - i * ps;
	}
	while (s->n < nx) {
		if (!(s->easy[s->n] = curl_easy_init())) {
			err = fail(r, -ENOMEM, "%s: curl_easy_init failed", r->url);
			break;
		}
		s->n++;
	}
	for (unsigned i = 0; i < nx; i++) {
		xs[i].r = r;
		xs[i].e = s->easy[i];
	}
	size_t done = 0, next = 0;
	unsigned active = 0;
	bool whole = off == 0 && len == r->size && np == 1;
	while (!err && done < np) {
		uint64_t t = now_ms(), wake = 0;
		/* idle handles take the next parts whose backoff is over, in order */
		for (unsigned i = 0; i < nx && !err; i++) {
			if (xs[i].p)
				continue;
			size_t k = np;
			for (size_t j = next; j < np; j++) {
				if (parts[j].done || parts[j].active)
					continue;
				if (parts[j].not_before <= t) {
					k = j;
					break;
				}
				if (!wake || parts[j].not_before < wake)
					wake = parts[j].not_before;
			}
			if (k == np)
				break;
			start_part(r, s->multi, &xs[i], &parts[k], (char *)buf + (parts[k].off - off), whole);
			active++;
		}
		while (next < np && parts[next].done)
			next++;
		int running = 0;
		CURLMcode mc = curl_multi_perform(s->multi, &running);
		if (mc != CURLM_OK) {
			err = fail(r, -EIO, "%s: curl_multi_perform: %s", r->url, curl_multi_strerror(mc));
			break;
		}
		CURLMsg *msg;
		int left;
		bool freed = false; /* a handle came free: give it the next part before waiting */
		while (!err && (msg = curl_multi_info_read(s->multi, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct xfer *x = NULL;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
			CURLcode rc = msg->data.result;
			curl_multi_remove_handle(s->multi, x->e);
			active--;
			freed = true;
			struct part *p = x->p;
			int v = judge(r, x, rc, why, sizeof(why), &err);
			x->p = NULL;
			p->active = false;
			if (v == PART_DONE) {
				p->done = true;
				done++;
			} else if (v == PART_RETRY) {
				if (++p->tries > r->retries) {
					unsigned long long a = p->off, b = p->off + p->len - 1;
					int code = rc != CURLE_OK ? curl_code_errno(rc)
						   : x->status >= 300 ? status_errno(x->status) : -EIO;
					err = fail(r, code, "%s: GET bytes=%llu-%llu (%s): %s, after %u retries", r->url,
						   a, b, r->http, why, r->retries);
				} else {
					ferry__stat_add(r->ctx, FERRY_STAT_RETRIES, 1);
					p->not_before = now_ms() + backoff_ms(p->tries);
				}
			}
		}
		if (err || done == np)
			break;
		if (freed)
			continue;
		int timeout = 100;
		if (!active && wake) {
			uint64_t t2 = now_ms();
			timeout = wake > t2 ? (int)(wake - t2) : 0;
		}
		if (active)
			curl_multi_poll(s->multi, NULL, 0, timeout, NULL);
		else if (timeout > 0)
			usleep((useconds_t)timeout * 1000u);
	}
	/* a failure stops the other parts: their connections are closed, the pool keeps the handles */
	for (unsigned i = 0; i < nx; i++)
		if (xs[i].p)
			curl_multi_remove_handle(s->multi, xs[i].e);
	set_give(r, s);
	free(parts);
	free(xs);
	return err ? err : (int64_t)len;
}

/* ---------------------------------------------------------------------------------------- open */

struct head {
	char etag[256];
	char body[BODY_MAX];
	size_t blen;
};

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
	struct head *h = ud;
	size_t n = size * nmemb;

	if (n > 5 && !strncasecmp(data, "ETag:", 5)) {
		const char *s = data + 5, *e = data + n;
		while (s < e && (*s == ' ' || *s == '\t'))
			s++;
		while (e > s && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
			e--;
		if ((size_t)(e - s) < sizeof(h->etag)) {
			memcpy(h->etag, s, (size_t)(e - s));
			h->etag[e - s] = 0;
		}
	}
	return n;
}

static size_t on_error_body(char *data, size_t size, size_t nmemb, void *ud)
{
	struct head *h = ud;
	size_t n = size * nmemb, room = sizeof(h->body) - h->blen, k = n < room ? n : room;
	memcpy(h->body + h->blen, data, k);
	h->blen += k;
	return h->blen >= sizeof(h->body) ? 0 : n;
}

/* HEAD: the size and the ETag; retried like a part. A failed HEAD has no body, so the error's S3
 * Code comes from a GET of the same URL (its body bounded: an error is a few hundred bytes). */
static int head(struct ferry__remote *r)
{
	CURL *e = curl_easy_init();
	struct head h;
	int ret = 0;
	unsigned tries = 0;
	long status = 0;

	if (!e)
		return fail(r, -ENOMEM, "%s: curl_easy_init failed", r->url);
	for (;;) {
		memset(&h, 0, sizeof(h));
		curl_easy_reset(e);
		common_opts(r, e);
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
		curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(e, CURLOPT_HEADERDATA, &h);
		CURLcode rc = curl_easy_perform(e);
		status = 0;
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
		bool again = rc != CURLE_OK ? retryable_curl(rc) : retryable_status(status);
		if (again && tries++ < r->retries) {
			ferry__stat_add(r->ctx, FERRY_STAT_RETRIES, 1);
			usleep((useconds_t)backoff_ms(tries) * 1000u);
			continue;
		}
		if (rc != CURLE_OK) {
			ret = fail(r, curl_code_errno(rc), "%s: HEAD %s: %s (curl error %d)%s", r->url, r->http,
				   curl_easy_strerror(rc), (int)rc, again ? ", after retries" : "");
			break;
		}
		if (status >= 200 && status < 300) {
			curl_off_t cl = -1;
			curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
			if (cl < 0) {
				ret = fail(r, -EIO, "%s: HEAD %s: HTTP %ld without a Content-Length", r->url, r->http, status);
				break;
			}
			r->size = (uint64_t)cl;
			memcpy(r->etag, h.etag, sizeof(r->etag));
			break;
		}
		/* the error's Code, from the body of a GET */
		struct head g;
		memset(&g, 0, sizeof(g));
		curl_easy_reset(e);
		common_opts(r, e);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_error_body);
		curl_easy_setopt(e, CURLOPT_WRITEDATA, &g);
		long gstatus = 0;
		if (curl_easy_perform(e) == CURLE_OK)
			curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &gstatus);
		char code[128] = "", msg[384] = "";
		if (gstatus == status)
			ferry__s3_error_code(g.body, g.blen, code, sizeof(code), msg, sizeof(msg));
		ret = fail(r, status_errno(status), "%s: HEAD %s: HTTP %ld%s%s%s%s%s", r->url, r->http, status,
			   code[0] ? " " : "", code, msg[0] ? " (" : "", msg, msg[0] ? ")" : "");
		if (status == 403 || status == 401)
			ferry__error_append("credentials: %s", r->aws.cred_source);
		break;
	}
	curl_easy_cleanup(e);
	return ret;
}

int ferry__remote_open(ferry_ctx *ctx, const char *url, int flags, struct ferry__remote **out)
{
	struct ferry__remote *r;
	char why[256];
	int ret;

	*out = NULL;
	bool writing = (flags & 0x3) == FERRY_O_WRONLY;
	if ((flags & 0x3) == FERRY_O_RDWR || (flags & FERRY_O_EXCL) || (writing && strncasecmp(url, "s3://", 5)))
		return ferry__error(-EOPNOTSUPP, "open(%s): a remote object opens for reading, or (s3:// only) for "
				    "writing a new object in order; not read/write, not exclusive (docs/REMOTE.md)", url);
	if ((ret = remote_probe(why, sizeof(why))))
		return ferry__error(ret, "open(%s): %s", url, why);
	if (!(r = calloc(1, sizeof(*r))))
		return ferry__error(-ENOMEM, "open(%s)", url);
	pthread_mutex_init(&r->mu, NULL);
	pthread_mutex_init(&r->wmu, NULL);
	r->ctx = ctx;
	r->connections = (unsigned)ctx->cfg.remote_connections;
	r->lock = ctx->cfg.remote_lock != 0;
	r->part_size = (size_t)ctx->cfg.remote_part_size;
	r->retries = (unsigned)ctx->cfg.remote_retries;
	r->timeout = (unsigned)ctx->cfg.remote_timeout;
	r->s3 = !strncasecmp(url, "s3://", 5);
	if (!(r->url = strdup(url)) || !(r->http = malloc(8192))) {
		ferry__remote_close(r);
		return ferry__error(-ENOMEM, "open(%s)", url);
	}
	if (r->s3) {
		if ((ret = ferry__aws_load(&r->aws)) || (ret = ferry__s3_http_url(&r->aws, url, r->http, 8192))) {
			ferry__remote_close(r);
			return ret;
		}
		snprintf(r->sigv4, sizeof(r->sigv4), "aws:amz:%s:s3", r->aws.region);
		r->headers = curl_slist_append(r->headers, "x-amz-content-sha256: " EMPTY_SHA256);
		if (r->aws.sign && r->aws.token[0]) {
			char *hdr = malloc(strlen(r->aws.token) + 32);
			if (hdr) {
				sprintf(hdr, "x-amz-security-token: %s", r->aws.token);
				r->headers = curl_slist_append(r->headers, hdr);
				free(hdr);
			}
		}
	} else {
		snprintf(r->http, 8192, "%s", url);
		snprintf(r->aws.cred_source, sizeof(r->aws.cred_source), "none (plain HTTP)");
	}
	if (writing) {
		r->writing = true;
		r->wpart_size = r->part_size < MIN_PART ? MIN_PART : r->part_size;
		if (!(r->wparts = calloc(r->connections, sizeof(*r->wparts)))) {
			ferry__remote_close(r);
			return ferry__error(-ENOMEM, "open(%s)", url);
		}
		*out = r;
		return 0;
	}
	if ((ret = head(r))) {
		ferry__remote_close(r);
		return ret;
	}
	if (r->etag[0]) {
		char hdr[300];
		snprintf(hdr, sizeof(hdr), "If-Match: %s", r->etag);
		r->headers = curl_slist_append(r->headers, hdr);
	}
	*out = r;
	return 0;
}

void ferry__remote_close(struct ferry__remote *r)
{
	if (!r)
		return;
	if (r->writing && !r->committed) { /* never committed: nothing becomes visible */
		for (unsigned i = 0; i < r->nwparts; i++)
			ferry_free_aligned(r->wparts[i].buf, r->wpart_size);
		r->nwparts = 0;
		abort_upload(r);
	}
	for (unsigned i = 0; i < r->etags_cap; i++)
		free(r->etags ? r->etags[i] : NULL);
	free(r->etags);
	free(r->wparts);
	pthread_mutex_destroy(&r->wmu);
	while (r->pool) {
		struct conn_set *s = r->pool;
		r->pool = s->next;
		set_free(s);
	}
	curl_slist_free_all(r->headers);
	pthread_mutex_destroy(&r->mu);
	free(r->url);
	free(r->http);
	free(r);
}

const char *ferry__file_etag(const ferry_file *f)
{
	return f && f->remote ? f->remote->etag : NULL;
}

int ferry__file_put_condition(ferry_file *f, const char *header)
{
	struct ferry__remote *r = f ? f->remote : NULL;
	if (!r || !r->writing || !r->s3)
		return ferry__error(-EINVAL, "%s: a condition is for an s3:// object being written", f ? f->path : "(null)");
	if (!r->lock)
		return 0;
	if (strlen(header) >= sizeof(r->cond))
		return ferry__error(-ENAMETOOLONG, "%s: condition too long", r->url);
	snprintf(r->cond, sizeof(r->cond), "%s", header);
	return 1;
}

uint64_t ferry__remote_size(const struct ferry__remote *r)
{
	return r->writing && !r->committed ? r->written : r->size;
}

int ferry__remote_info(const struct ferry__remote *r, char *buf, size_t len)
{
	if (r->writing)
		return snprintf(buf, len, "%s: remote (%s), writing a new object in order: parts of %zu bytes, up to %u "
				"uploaded at once, visible at ferry_file_sync; credentials: %s", r->url, r->http,
				r->wpart_size, r->connections, r->aws.cred_source);
	return snprintf(buf, len, "%s: remote (%s), %llu bytes, ETag %s, ranged GETs of %zu bytes over up to %u "
			"connections, %u retries; credentials: %s", r->url, r->http, (unsigned long long)r->size,
			r->etag[0] ? r->etag : "none (a change during a read goes unnoticed)", r->part_size,
			r->connections, r->retries, r->s3 ? r->aws.cred_source : "none (plain HTTP)");
}

/* --------------------------------------------------------------------------------------- writes */

/*
 * A new object written in order: pwrite at the end of what was written (anything else is
 * -ESPIPE). The bytes fill parts of wpart_size (remote_part_size, at least S3's 5 MiB minimum);
 * every remote_connections full parts go up at once as parts of a multipart upload (created with
 * the first batch). ferry_file_sync commits: a small object is one PUT, a large one the last parts
 * and CompleteMultipartUpload; only then is the object visible. A failure, or a file destroyed
 * before its commit, aborts the upload: no half object is ever visible.
 */

#define WBODY_MAX (64 * 1024) /* of a response body kept: the UploadId, an error */

struct wreq {
	struct wpart *p; /* the body sent, or NULL */
	char etag[256];
	char body[WBODY_MAX];
	size_t blen;
	long status;
	CURL *e;
	struct curl_slist *hdrs;
	const char *cond; /* a conditional write's header (If-None-Match: *, If-Match: ETag), or NULL */
};

static size_t on_wbody(char *data, size_t size, size_t nmemb, void *ud)
{
	struct wreq *w = ud;
	size_t n = size * nmemb, room = sizeof(w->body) - 1 - w->blen, k = n < room ? n : room;
	memcpy(w->body + w->blen, data, k);
	w->blen += k;
	w->body[w->blen] = 0;
	return n;
}

static size_t on_wheader(char *data, size_t size, size_t nmemb, void *ud)
{
	struct wreq *w = ud;
	struct head h;

	h.etag[0] = 0;
	on_header(data, size, nmemb, &h);
	if (h.etag[0])
		memcpy(w->etag, h.etag, sizeof(w->etag));
	return size * nmemb;
}

static size_t on_read_part(char *dst, size_t size, size_t nmemb, void *ud)
{
	struct wpart *p = ud;
	size_t n = size * nmemb, left = p->len - p->sent, k = n < left ? n : left;
	memcpy(dst, p->buf + p->sent, k);
	p->sent += k;
	return k;
}

/* r->http with a query ("?uploads=", "?partNumber=1&uploadId=..."): the upload ID percent-encoded,
 * so that the query as sent is the canonical one SigV4 signs. */
static void write_url(const struct ferry__remote *r, char *out, size_t len, const char *query, unsigned part)
{
	char id[3 * sizeof(r->upload_id)];
	size_t k = 0;
	for (const unsigned char *s = (const unsigned char *)r->upload_id; *s && k + 4 < sizeof(id); s++) {
		if ((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
		    *s == '-' || *s == '_' || *s == '.' || *s == '~')
			id[k++] = (char)*s;
		else
			k += (size_t)sprintf(id + k, "%%%02X", *s);
	}
	id[k] = 0;
	if (!strcmp(query, "uploads"))
		snprintf(out, len, "%s?uploads=", r->http);
	else if (part)
		snprintf(out, len, "%s?partNumber=%u&uploadId=%s", r->http, part, id);
	else
		snprintf(out, len, "%s?uploadId=%s", r->http, id);
}

/* Sets up e for one write request: method, URL, the body (p, or post/plen), signing headers. */
static void wreq_setup(struct ferry__remote *r, struct wreq *w, const char *method, const char *url,
		       struct wpart *p, const char *post, size_t plen)
{
	CURL *e = w->e;

	curl_easy_reset(e);
	w->p = p;
	w->blen = 0;
	w->body[0] = 0;
	w->etag[0] = 0;
	w->status = 0;
	if (!w->hdrs) {
		/* bodies are not hashed (UNSIGNED-PAYLOAD, which S3 takes over HTTP and HTTPS). No
		 * "Expect:" to drop curl's 100-continue: libcurl would sign it as an empty header
		 * that the server never sees (SignatureDoesNotMatch); the wait is cut instead. */
		w->hdrs = curl_slist_append(w->hdrs, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
		if (!strcmp(method, "POST")) /* not a form: a server would parse the XML away */
			w->hdrs = curl_slist_append(w->hdrs, "Content-Type: application/xml");
		for (struct curl_slist *h = r->headers; h; h = h->next)
			if (strncasecmp(h->data, "x-amz-content-sha256:", 21))
				w->hdrs = curl_slist_append(w->hdrs, h->data);
		if (w->cond && w->cond[0])
			w->hdrs = curl_slist_append(w->hdrs, w->cond);
	}
	common_opts(r, e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, w->hdrs);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_wbody);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, w);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_wheader);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, w);
	curl_easy_setopt(e, CURLOPT_PRIVATE, w);
	if (p) {
		curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
		p->sent = 0;
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read_part);
		curl_easy_setopt(e, CURLOPT_READDATA, p);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)p->len);
	} else if (!strcmp(method, "POST")) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, post ? post : "");
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)plen);
	} else {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	}
}

static void wreq_free(struct wreq *w)
{
	if (w->e)
		curl_easy_cleanup(w->e);
	curl_slist_free_all(w->hdrs);
}

/* "HTTP 403 AccessDenied (...)" or the curl error of a finished write request. */
static void wreq_describe(struct wreq *w, CURLcode rc, char *buf, size_t len)
{
	char code[64], msg[320];
	if (rc != CURLE_OK) {
		snprintf(buf, len, "%s (curl error %d)", curl_easy_strerror(rc), (int)rc);
		return;
	}
	ferry__s3_error_code(w->body, w->blen, code, sizeof(code), msg, sizeof(msg));
	if (code[0])
		snprintf(buf, len, "HTTP %ld %s (%s)", w->status, code, msg);
	else
		snprintf(buf, len, "HTTP %ld", w->status);
}

/* One request, retried like a read's parts; 0 with w filled, or the error (what names the step). */
static int wreq_run(struct ferry__remote *r, struct wreq *w, const char *method, const char *url,
		    struct wpart *p, const char *post, size_t plen, const char *what)
{
	char why[512];
	for (unsigned tries = 0;; tries++) {
		wreq_setup(r, w, method, url, p, post, plen);
		CURLcode rc = curl_easy_perform(w->e);
		curl_easy_getinfo(w->e, CURLINFO_RESPONSE_CODE, &w->status);
		/* CompleteMultipartUpload can fail after its 200: the error is in the body */
		bool body_error = rc == CURLE_OK && w->status == 200 && strstr(w->body, "<Error>");
		if (rc == CURLE_OK && w->status >= 200 && w->status < 300 && !body_error)
			return 0;
		wreq_describe(w, rc, why, sizeof(why));
		bool again = rc != CURLE_OK ? retryable_curl(rc) : body_error || retryable_status(w->status);
		if (again && tries < r->retries) {
			ferry__stat_add(r->ctx, FERRY_STAT_RETRIES, 1);
			usleep((useconds_t)backoff_ms(tries + 1) * 1000u);
			continue;
		}
		int code = rc != CURLE_OK ? curl_code_errno(rc) : body_error ? -EIO : status_errno(w->status);
		return fail(r, code, "%s: %s %s (%s): %s%s", r->url, what, method, url, why,
			    again ? ", after retries" : "");
	}
}

static int start_upload(struct ferry__remote *r)
{
	struct wreq *w = calloc(1, sizeof(*w));
	char url[9000];
	int ret;

	if (!w || !(w->e = curl_easy_init())) {
		free(w);
		return fail(r, -ENOMEM, "%s: CreateMultipartUpload: out of memory", r->url);
	}
	write_url(r, url, sizeof(url), "uploads", 0);
	ret = wreq_run(r, w, "POST", url, NULL, NULL, 0, "CreateMultipartUpload");
	if (!ret) {
		char *s = strstr(w->body, "<UploadId>"), *e = s ? strstr(s, "</UploadId>") : NULL;
		size_t n = s && e ? (size_t)(e - s - 10) : 0;
		if (!n || n >= sizeof(r->upload_id))
			ret = fail(r, -EIO, "%s: CreateMultipartUpload POST %s: no UploadId in the answer", r->url, url);
		else {
			memcpy(r->upload_id, s + 10, n);
			r->upload_id[n] = 0;
		}
	}
	wreq_free(w);
	free(w);
	return ret;
}

/* Uploads the buffered parts, all at once (at most remote_connections), each retried on its own. */
static int upload_parts(struct ferry__remote *r)
{
	unsigned n = r->nwparts;
	struct wreq *ws = calloc(n, sizeof(*ws));
	CURLM *m = curl_multi_init();
	char (*urls)[9000] = calloc(n, sizeof(*urls));
	int err = 0;

	if (!ws || !m || !urls) {
		err = fail(r, -ENOMEM, "%s: upload of %u parts: out of memory", r->url, n);
		goto out;
	}
	for (unsigned i = 0; i < n && !err; i++) {
		if (!(ws[i].e = curl_easy_init())) {
			err = fail(r, -ENOMEM, "%s: curl_easy_init failed", r->url);
			break;
		}
		write_url(r, urls[i], sizeof(urls[i]), "", r->wparts[i].num);
		r->wparts[i].tries = 0;
		wreq_setup(r, &ws[i], "PUT", urls[i], &r->wparts[i], NULL, 0);
		curl_multi_add_handle(m, ws[i].e);
	}
	unsigned left = err ? 0 : n;
	while (left && !err) {
		int running = 0;
		curl_multi_perform(m, &running);
		CURLMsg *msg;
		int q;
		while (!err && (msg = curl_multi_info_read(m, &q))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct wreq *w = NULL;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&w);
			CURLcode rc = msg->data.result;
			curl_easy_getinfo(w->e, CURLINFO_RESPONSE_CODE, &w->status);
			curl_multi_remove_handle(m, w->e);
			struct wpart *p = w->p;
			if (rc == CURLE_OK && w->status >= 200 && w->status < 300 && w->etag[0]) {
				memcpy(p->etag, w->etag, sizeof(p->etag));
				left--;
				continue;
			}
			char why[512];
			wreq_describe(w, rc, why, sizeof(why));
			bool again = rc != CURLE_OK ? retryable_curl(rc) : retryable_status(w->status);
			if (again && p->tries++ < r->retries) {
				ferry__stat_add(r->ctx, FERRY_STAT_RETRIES, 1);
				usleep((useconds_t)backoff_ms(p->tries) * 1000u);
				wreq_setup(r, w, "PUT", urls[w - ws], p, NULL, 0);
				curl_multi_add_handle(m, w->e);
				continue;
			}
			int code = rc != CURLE_OK ? curl_code_errno(rc) : w->status < 300 ? -EIO : status_errno(w->status);
			err = fail(r, code, "%s: UploadPart %u (bytes %llu-%llu) PUT %s: %s%s", r->url, p->num,
				   (unsigned long long)(p->num - 1) * r->wpart_size,
				   (unsigned long long)(p->num - 1) * r->wpart_size + p->len - 1, urls[w - ws],
				   w->status < 300 && rc == CURLE_OK ? "no ETag in the answer" : why,
				   again ? ", after retries" : "");
		}
		if (left && !err)
			curl_multi_poll(m, NULL, 0, 100, NULL);
	}
	for (unsigned i = 0; !err && i < n; i++) {
		struct wpart *p = &r->wparts[i];
		if (p->num > r->etags_cap) {
			unsigned cap = r->etags_cap ? 2 * r->etags_cap : 64;
			while (cap < p->num)
				cap *= 2;
			char **e = realloc(r->etags, cap * sizeof(*e));
			if (!e) {
				err = fail(r, -ENOMEM, "%s: out of memory", r->url);
				break;
			}
			memset(e + r->etags_cap, 0, (cap - r->etags_cap) * sizeof(*e));
			r->etags = e;
			r->etags_cap = cap;
		}
		if (!(r->etags[p->num - 1] = strdup(p->etag)))
			err = fail(r, -ENOMEM, "%s: out of memory", r->url);
		else
			r->nuploaded++;
	}
out:
	for (unsigned i = 0; ws && i < n; i++) {
		if (ws[i].e && m)
			curl_multi_remove_handle(m, ws[i].e);
		wreq_free(&ws[i]);
	}
	if (m)
		curl_multi_cleanup(m);
	free(ws);
	free(urls);
	for (unsigned i = 0; i < r->nwparts; i++)
		ferry_free_aligned(r->wparts[i].buf, r->wpart_size);
	r->nwparts = 0;
	return err;
}

/* Best effort: AbortMultipartUpload of a started upload (its parts are then discarded). */
static void abort_upload(struct ferry__remote *r)
{
	struct wreq *w;
	char url[9000];

	if (!r->upload_id[0] || !(w = calloc(1, sizeof(*w))))
		return;
	if ((w->e = curl_easy_init())) {
		write_url(r, url, sizeof(url), "", 0);
		if (wreq_run(r, w, "DELETE", url, NULL, NULL, 0, "AbortMultipartUpload") == 0)
			r->upload_id[0] = 0;
	}
	wreq_free(w);
	free(w);
}

/*
 * A conditional commit refused: 412 is another writer's object (or `latest` changed under us), 501
 * (or S3's NotImplemented) a store that does not do conditional writes; other errors stay as they are.
 */
static int cond_failed(struct ferry__remote *r, struct wreq *w, int err)
{
	char code[64], msg[320], why[sizeof(r->err)];
	if (!r->cond[0])
		return err;
	ferry__s3_error_code(w->body, w->blen, code, sizeof(code), msg, sizeof(msg));
	snprintf(why, sizeof(why), "%s", ferry_last_error());
	if (w->status == 412)
		return fail(r, -EEXIST, "%s: the conditional write (%s) was refused: another writer wrote this object "
			    "first (a second job saving to this prefix?): %s", r->url, r->cond, why);
	if (w->status == 501 || !strcmp(code, "NotImplemented"))
		return fail(r, -EOPNOTSUPP, "%s: the store does not support conditional writes (%s), so it cannot "
			    "keep a second writer from committing over this one; remote_lock=0 (FERRY_REMOTE_LOCK=0) "
			    "writes without the condition: %s", r->url, r->cond, why);
	return err;
}

static int write_failed(struct ferry__remote *r, int err)
{
	r->write_err = err;
	for (unsigned i = 0; i < r->nwparts; i++)
		ferry_free_aligned(r->wparts[i].buf, r->wpart_size);
	r->nwparts = 0;
	char keep[sizeof(r->err)];
	ferry__remote_last_error(r, keep, sizeof(keep));
	abort_upload(r);
	return fail(r, err, "%s (the upload is aborted: no object was written)", keep);
}

int64_t ferry__remote_write(struct ferry__remote *r, const void *buf, size_t len, uint64_t off)
{
	int64_t ret = (int64_t)len;

	pthread_mutex_lock(&r->wmu);
	if (!r->writing)
		ret = fail(r, -EBADF, "pwrite(%s): opened read-only", r->url);
	else if (r->write_err)
		ret = ferry__error(r->write_err, "pwrite(%s): an earlier write failed; the upload was aborted", r->url);
	else if (r->committed)
		ret = fail(r, -EROFS, "pwrite(%s): the object is committed (ferry_file_sync); open it again to "
			   "write a new one", r->url);
	else if (off != r->written)
		ret = fail(r, -ESPIPE, "pwrite(%s, offset %llu): a remote object is written in order, and the next "
			   "byte is %llu", r->url, (unsigned long long)off, (unsigned long long)r->written);
	for (size_t done = 0; ret >= 0 && done < len;) {
		struct wpart *p = r->nwparts ? &r->wparts[r->nwparts - 1] : NULL;
		if (!p || p->len == r->wpart_size) {
			if (r->nwparts == r->connections) { /* a full batch: up it goes */
				int e = 0;
				if (!r->upload_id[0])
					e = start_upload(r);
				if (!e)
					e = upload_parts(r);
				if (e) {
					ret = write_failed(r, e);
					break;
				}
			}
			p = &r->wparts[r->nwparts];
			memset(p, 0, sizeof(*p));
			if (!(p->buf = ferry_alloc_aligned(r->wpart_size))) {
				ret = write_failed(r, fail(r, -ENOMEM, "%s: a part buffer of %zu bytes", r->url, r->wpart_size));
				break;
			}
			p->num = r->nuploaded + r->nwparts + 1;
			r->nwparts++;
		}
		size_t k = len - done < r->wpart_size - p->len ? len - done : r->wpart_size - p->len;
		memcpy(p->buf + p->len, (const char *)buf + done, k);
		p->len += k;
		done += k;
		r->written += k;
	}
	pthread_mutex_unlock(&r->wmu);
	return ret;
}

int ferry__remote_commit(struct ferry__remote *r)
{
	int ret = 0;

	pthread_mutex_lock(&r->wmu);
	if (!r->writing || r->committed) {
		pthread_mutex_unlock(&r->wmu);
		return 0; /* nothing to commit: reads, or already visible */
	}
	if (r->write_err) {
		ret = ferry__error(r->write_err, "commit(%s): an earlier write failed; the upload was aborted", r->url);
		goto out;
	}
	if (!r->upload_id[0] && r->nwparts <= 1) { /* small: one PUT */
		struct wpart empty = {0};
		struct wreq *w = calloc(1, sizeof(*w));
		if (!w || !(w->e = curl_easy_init())) {
			free(w);
			ret = write_failed(r, fail(r, -ENOMEM, "%s: PUT: out of memory", r->url));
			goto out;
		}
		w->cond = r->cond;
		ret = wreq_run(r, w, "PUT", r->http, r->nwparts ? &r->wparts[0] : &empty, NULL, 0, "PutObject");
		if (ret)
			ret = cond_failed(r, w, ret);
		wreq_free(w);
		free(w);
		if (ret)
			ret = write_failed(r, ret);
		for (unsigned i = 0; i < r->nwparts; i++)
			ferry_free_aligned(r->wparts[i].buf, r->wpart_size);
		r->nwparts = 0;
		goto out;
	}
	if (!r->upload_id[0])
		ret = start_upload(r);
	if (!ret && r->nwparts)
		ret = upload_parts(r);
	if (!ret) {
		size_t cap = 128 + (size_t)r->nuploaded * 360, n = 0;
		char *xml = malloc(cap), url[9000];
		struct wreq *w = calloc(1, sizeof(*w));
		if (!xml || !w || !(w->e = curl_easy_init())) {
			ret = fail(r, -ENOMEM, "%s: CompleteMultipartUpload: out of memory", r->url);
		} else {
			n += (size_t)snprintf(xml + n, cap - n, "<CompleteMultipartUpload>");
			for (unsigned i = 0; i < r->nuploaded; i++)
				n += (size_t)snprintf(xml + n, cap - n, "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
						      i + 1, r->etags[i]);
			n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
			write_url(r, url, sizeof(url), "", 0);
			w->cond = r->cond;
			ret = wreq_run(r, w, "POST", url, NULL, xml, n, "CompleteMultipartUpload");
			if (ret)
				ret = cond_failed(r, w, ret);
		}
		if (w)
			wreq_free(w);
		free(w);
		free(xml);
	}
	if (ret)
		ret = write_failed(r, ret);
out:
	if (!ret) {
		r->committed = true;
		r->upload_id[0] = 0;
		r->size = r->written;
	}
	pthread_mutex_unlock(&r->wmu);
	return ret;
}

/* ------------------------------------------------------------------------- listing, deleting */

/* Percent-encodes s for a query value (SigV4's canonical form: all but A-Z a-z 0-9 - _ . ~). */
static void query_encode(const char *s, char *out, size_t len)
{
	size_t k = 0;
	for (const unsigned char *c = (const unsigned char *)s; *c && k + 4 < len; c++) {
		if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' ||
		    *c == '_' || *c == '.' || *c == '~')
			out[k++] = (char)*c;
		else
			k += (size_t)sprintf(out + k, "%%%02X", *c);
	}
	out[k] = 0;
}

/* The text of <tag>...</tag> from *pos in body, XML entities decoded; advances *pos. 1 found, 0 not. */
static int xml_next(const char *body, const char **pos, const char *tag, char *out, size_t len)
{
	char open[64], close[64];
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	const char *a = strstr(*pos, open), *b = a ? strstr(a, close) : NULL;
	(void)body;
	if (!b)
		return 0;
	a += strlen(open);
	size_t k = 0;
	static const char *const ent[][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}};
	while (a < b && k + 1 < len) {
		size_t i = 0;
		for (; i < 5; i++)
			if (!strncmp(a, ent[i][0], strlen(ent[i][0])))
				break;
		if (i < 5) {
			out[k++] = ent[i][1][0];
			a += strlen(ent[i][0]);
		} else {
			out[k++] = *a++;
		}
	}
	out[k] = 0;
	*pos = b + strlen(close);
	return 1;
}

/*
 * A handle of prefix's bucket for requests other than an object's read or write: opened as a
 * write (no HEAD: the key need not exist; its close aborts nothing, no upload was started), with
 * r->http cut back to the bucket's URL ("<endpoint>/bucket/" or "https://bucket.s3.../").
 */
static int bucket_open(ferry_ctx *ctx, const char *url, const char *what, struct ferry__remote **out, char *key,
		       size_t klen)
{
	const char *b = strncasecmp(url, "s3://", 5) ? NULL : url + 5, *slash = b ? strchr(b, '/') : NULL;
	if (!b || !*b || slash == b)
		return ferry__error(-EINVAL, "%s(%s): not an s3://bucket/... URL", what, url);
	snprintf(key, klen, "%s", slash ? slash + 1 : "");
	char probe[1024];
	snprintf(probe, sizeof(probe), "s3://%.*s/x", slash ? (int)(slash - b) : (int)strlen(b), b);
	int r = ferry__remote_open(ctx, probe, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, out);
	if (r)
		return r;
	size_t n = strlen((*out)->http);
	(*out)->http[n - 1] = 0; /* "…/x" -> "…/" */
	free((*out)->url);
	(*out)->url = strdup(url);
	if (!(*out)->url) {
		ferry__remote_close(*out);
		*out = NULL;
		return ferry__error(-ENOMEM, "%s(%s)", what, url);
	}
	return 0;
}

int ferry__remote_list(ferry_ctx *ctx, const char *prefix, ferry__remote_list_fn fn, void *arg)
{
	struct ferry__remote *r;
	char key[1024], enc[3 * 1024], token[1024] = "", tenc[3 * 1024], bucket[256];
	int ret = bucket_open(ctx, prefix, "ListObjectsV2", &r, key, sizeof(key));
	if (ret)
		return ret;
	const char *b = prefix + 5;
	snprintf(bucket, sizeof(bucket), "%.*s", (int)strcspn(b, "/"), b);
	struct wreq *w = calloc(1, sizeof(*w));
	char *url = malloc(16384), *k = malloc(2048), *item = malloc(4096);
	if (!w || !url || !k || !item || !(w->e = curl_easy_init()))
		ret = ferry__error(-ENOMEM, "ListObjectsV2(%s): out of memory", prefix);
	query_encode(key, enc, sizeof(enc));
	while (!ret) {
		/* parameters in sorted order: the canonical query that SigV4 signs; 100 keys a page keep
		 * an answer (about 350 bytes a key) inside the response buffer */
		query_encode(token, tenc, sizeof(tenc));
		snprintf(url, 16384, "%s?%s%s%slist-type=2&max-keys=100&prefix=%s", r->http, token[0] ? "continuation-token=" : "",
			 token[0] ? tenc : "", token[0] ? "&" : "", enc);
		if ((ret = wreq_run(r, w, "GET", url, NULL, NULL, 0, "ListObjectsV2")))
			break;
		if (w->blen >= WBODY_MAX - 1) {
			ret = fail(r, -EIO, "%s: ListObjectsV2 GET %s: an answer larger than %d bytes", prefix, url, WBODY_MAX);
			break;
		}
		const char *pos = w->body;
		char val[300], etag[300];
		while (!ret && xml_next(w->body, &pos, "Contents", item, 4096)) {
			const char *ip = item;
			uint64_t size = 0;
			etag[0] = 0;
			if (!xml_next(item, &ip, "Key", k, 2048)) {
				ret = fail(r, -EIO, "%s: ListObjectsV2: an entry without <Key>", prefix);
				break;
			}
			ip = item;
			if (xml_next(item, &ip, "Size", val, sizeof(val)))
				size = strtoull(val, NULL, 10);
			ip = item;
			(void)xml_next(item, &ip, "ETag", etag, sizeof(etag));
			char *obj = malloc(strlen(bucket) + strlen(k) + 8);
			if (!obj) {
				ret = ferry__error(-ENOMEM, "ListObjectsV2(%s): out of memory", prefix);
				break;
			}
			sprintf(obj, "s3://%s/%s", bucket, k);
			ret = fn(arg, obj, size, etag);
			free(obj);
		}
		pos = w->body;
		if (ret || !xml_next(w->body, &pos, "IsTruncated", val, sizeof(val)) || strcmp(val, "true"))
			break;
		pos = w->body;
		if (!xml_next(w->body, &pos, "NextContinuationToken", token, sizeof(token)) || !token[0]) {
			ret = fail(r, -EIO, "%s: ListObjectsV2: truncated without a NextContinuationToken", prefix);
			break;
		}
	}
	if (w)
		wreq_free(w);
	free(w);
	free(url);
	free(k);
	free(item);
	ferry__remote_close(r);
	return ret;
}

int ferry__remote_delete(ferry_ctx *ctx, const char *url)
{
	struct ferry__remote *r;
	char key[1024];
	int ret = ferry__remote_open(ctx, url, FERRY_O_WRONLY | FERRY_O_CREAT | FERRY_O_TRUNC, &r);
	if (ret)
		return ret;
	(void)key;
	struct wreq *w = calloc(1, sizeof(*w));
	if (!w || !(w->e = curl_easy_init()))
		ret = ferry__error(-ENOMEM, "DeleteObject(%s): out of memory", url);
	else
		ret = wreq_run(r, w, "DELETE", r->http, NULL, NULL, 0, "DeleteObject");
	if (w)
		wreq_free(w);
	free(w);
	ferry__remote_close(r);
	return ret;
}

#endif /* FERRY_HAVE_LIBCURL */

/* ------------------------------------------------------------------------------ files, ops set */

int ferry__remote_file_open(ferry_ctx *ctx, const char *url, int flags, ferry_file **out)
{
	struct ferry__remote *r;
	struct ferry_file *f;
	int ret;

	*out = NULL;
	if (!ctx)
		return ferry__error(-EINVAL, "ferry_file_open: NULL context");
	if ((ret = ferry__remote_open(ctx, url, flags, &r)))
		return ret;
	if (!(f = calloc(1, sizeof(*f))) || !(f->path = strdup(url))) {
		free(f);
		ferry__remote_close(r);
		return ferry__error(-ENOMEM, "opening %s", url);
	}
	f->ctx = ctx;
	f->remote = r;
	f->writable = (flags & 0x3) != FERRY_O_RDONLY;
	f->fd_buf = -1;
	f->fd_direct = -1;
	f->slot = -1;
	f->block_size = 1;
	f->mem_align = 1;
	f->gds_state = FERRY__GDS_REFUSED;
	snprintf(f->gds_note, sizeof(f->gds_note), "a remote object: staged through pinned slots");
	snprintf(f->direct_note, sizeof(f->direct_note), "remote object");
	pthread_mutex_init(&f->gds_mu, NULL);
	*out = f;
	return 0;
}

void ferry__remote_file_destroy(ferry_file *f)
{
	ferry__remote_close(f->remote);
	pthread_mutex_destroy(&f->gds_mu);
	free(f->path);
	free(f);
}

/*
 * The ops set: each op is one read of a remote file (op->remote), done at submit with parallel
 * ranged GETs, like psync does a pread. The workers run remote chunks on their own thread's list
 * (ioq.c: copied_by_thread), through ferry__psync_do, whatever the context's storage backend.
 */
struct ferry__ring {
	unsigned depth, nq, ndone;
	struct ferry__op *q;
	void **tags;
	int64_t *res;
};

static int ring_init(struct ferry__ring **out, unsigned depth, const struct ferry__ring_opts *o)
{
	struct ferry__ring *r = calloc(1, sizeof(*r));
	if (!r || !(r->q = calloc(depth, sizeof(*r->q))) || !(r->tags = calloc(depth, sizeof(void *))) ||
	    !(r->res = calloc(depth, sizeof(int64_t)))) {
		if (r) {
			free(r->q);
			free(r->tags);
		}
		free(r);
		return -ENOMEM;
	}
	r->depth = depth;
	*out = r;
	return 0;
}

static void ring_exit(struct ferry__ring *r)
{
	if (!r)
		return;
	free(r->q);
	free(r->tags);
	free(r->res);
	free(r);
}

static int ring_prep(struct ferry__ring *r, const struct ferry__op *op)
{
	if (r->nq + r->ndone >= r->depth)
		return -EBUSY;
	if (!op->remote || op->is_write)
		return -EOPNOTSUPP;
	r->q[r->nq++] = *op;
	return 0;
}

static int ring_submit(struct ferry__ring *r)
{
	unsigned n = r->nq;
	for (unsigned i = 0; i < n; i++) {
		r->tags[r->ndone] = r->q[i].tag;
		r->res[r->ndone++] = ferry__remote_read(r->q[i].remote, r->q[i].addr, r->q[i].len, r->q[i].off);
	}
	r->nq = 0;
	return (int)n;
}

static int ring_reap(struct ferry__ring *r, unsigned min, void **tags, int64_t *res, unsigned max)
{
	unsigned n = r->ndone < max ? r->ndone : max;
	for (unsigned i = 0; i < n; i++) {
		tags[i] = r->tags[i];
		res[i] = r->res[i];
	}
	memmove(r->tags, r->tags + n, (r->ndone - n) * sizeof(void *));
	memmove(r->res, r->res + n, (r->ndone - n) * sizeof(int64_t));
	r->ndone -= n;
	return (int)n;
}

const struct ferry__backend_ops ferry__backend_remote = {
	.name = "remote",
	.caps = FERRY__CAP_REMOTE,
	.probe = remote_probe,
	.ring_init = ring_init,
	.ring_exit = ring_exit,
	.prep = ring_prep,
	.submit = ring_submit,
	.reap = ring_reap,
};
