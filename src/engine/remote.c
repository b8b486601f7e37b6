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

#else

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define BODY_MAX 4096 /* of an error body: S3's XML error is a few hundred bytes */

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
	unsigned connections, retries;
	size_t part_size;
	pthread_mutex_t mu; /* pool, err */
	struct conn_set *pool;
	char err[1536];
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

/* Options every request of r carries. */
static void common_opts(struct ferry__remote *r, CURL *e)
{
	curl_easy_setopt(e, CURLOPT_URL, r->http);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
	/* a connection that cannot be made in 10 s, or a transfer below 1 KiB/s for 30 s, is retried */
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 30L);
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
	char body[BODY_MAX];
	size_t blen;
};

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
	if ((x->status == 200 && !(x->whole && x->p->got == 0 && x->p->off == 0)) || x->p->got + n > x->p->len) {
		x->refused = true;
		return 0;
	}
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
	x->blen = 0;
	p->active = true;
	common_opts(r, x->e);
	curl_easy_setopt(x->e, CURLOPT_HTTPGET, 1L);
	snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)(p->off + p->got),
		 (unsigned long long)(p->off + p->len - 1));
	curl_easy_setopt(x->e, CURLOPT_RANGE, range);
	curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(x->e, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(x->e, CURLOPT_PRIVATE, x);
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
	if ((flags & 0x3) != FERRY_O_RDONLY)
		return ferry__error(-EOPNOTSUPP, "open(%s): remote objects open read-only (writes are not done yet: "
				    "docs/REMOTE.md)", url);
	if ((ret = remote_probe(why, sizeof(why))))
		return ferry__error(ret, "open(%s): %s", url, why);
	if (!(r = calloc(1, sizeof(*r))))
		return ferry__error(-ENOMEM, "open(%s)", url);
	pthread_mutex_init(&r->mu, NULL);
	r->ctx = ctx;
	r->connections = (unsigned)ctx->cfg.remote_connections;
	r->part_size = (size_t)ctx->cfg.remote_part_size;
	r->retries = (unsigned)ctx->cfg.remote_retries;
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

uint64_t ferry__remote_size(const struct ferry__remote *r)
{
	return r->size;
}

int ferry__remote_info(const struct ferry__remote *r, char *buf, size_t len)
{
	return snprintf(buf, len, "%s: remote (%s), %llu bytes, ETag %s, ranged GETs of %zu bytes over up to %u "
			"connections, %u retries; credentials: %s", r->url, r->http, (unsigned long long)r->size,
			r->etag[0] ? r->etag : "none (a change during a read goes unnoticed)", r->part_size,
			r->connections, r->retries, r->s3 ? r->aws.cred_source : "none (plain HTTP)");
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
