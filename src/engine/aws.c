/* S3 as users configure it: AWS_* variables, ~/.aws/credentials and ~/.aws/config profiles, the
 * endpoint and the addressing style (docs/REMOTE.md). No signing here: libcurl signs (SigV4). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/remote.h"

bool ferry__is_url(const char *path)
{
	return path && (!strncasecmp(path, "s3://", 5) || !strncasecmp(path, "http://", 7) ||
			!strncasecmp(path, "https://", 8));
}

static bool blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* [s, e) trimmed of blanks at both ends */
static void trim(const char **s, const char **e)
{
	while (*s < *e && blank(**s))
		(*s)++;
	while (*e > *s && blank((*e)[-1]))
		(*e)--;
}

static bool equals(const char *s, const char *e, const char *word)
{
	size_t n = strlen(word);
	return (size_t)(e - s) == n && !memcmp(s, word, n);
}

int ferry__ini_get(const char *text, size_t len, const char *section, const char *key, char *out,
		   size_t outlen)
{
	const char *p = text, *end = text + len;
	bool in = false;
	int found = 0;

	if (outlen)
		out[0] = 0;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *s = p, *e = nl ? nl : end;
		p = nl ? nl + 1 : end;
		trim(&s, &e);
		if (s == e || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			const char *close = memchr(s, ']', (size_t)(e - s));
			if (!close) {
				in = false;
				continue;
			}
			const char *ns = s + 1, *ne = close;
			trim(&ns, &ne);
			in = equals(ns, ne, section);
			continue;
		}
		if (!in)
			continue;
		const char *eq = memchr(s, '=', (size_t)(e - s));
		if (!eq)
			continue;
		const char *ks = s, *ke = eq, *vs = eq + 1, *ve = e;
		trim(&ks, &ke);
		trim(&vs, &ve);
		if (!equals(ks, ke, key))
			continue;
		if ((size_t)(ve - vs) >= outlen || memchr(vs, 0, (size_t)(ve - vs))) {
			found = -ENAMETOOLONG;
			if (outlen)
				out[0] = 0;
			continue;
		}
		memcpy(out, vs, (size_t)(ve - vs));
		out[ve - vs] = 0;
		found = 1;
	}
	return found;
}

/* The whole of a small file (at most 1 MiB), or NULL (missing, unreadable, too large). */
static char *slurp(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *buf = NULL;

	*len = 0;
	if (!fp)
		return NULL;
	buf = malloc(1 << 20);
	if (buf)
		*len = fread(buf, 1, 1 << 20, fp);
	fclose(fp);
	return buf;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static bool truthy(const char *v)
{
	return v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

static int copy(char *dst, size_t n, const char *src, const char *what)
{
	if (strlen(src) >= n)
		return ferry__error(-ENAMETOOLONG, "S3 configuration: %s is longer than %zu bytes", what, n - 1);
	strcpy(dst, src);
	return 0;
}

/* A file named by a variable, else ~/.aws/<name>. */
static void aws_file(char *out, size_t n, const char *var, const char *name)
{
	const char *v = env(var), *home = env("HOME");
	if (v)
		snprintf(out, n, "%s", v);
	else if (home)
		snprintf(out, n, "%s/.aws/%s", home, name);
	else
		out[0] = 0;
}

int ferry__aws_load(struct ferry__aws *a)
{
	const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : env("AWS_DEFAULT_PROFILE");
	char cred_path[4096], conf_path[4096], conf_section[300];
	char *cred = NULL, *conf = NULL;
	size_t cred_len = 0, conf_len = 0;
	int ret = 0;

	memset(a, 0, sizeof(*a));
	if (!profile)
		profile = "default";
	aws_file(cred_path, sizeof(cred_path), "AWS_SHARED_CREDENTIALS_FILE", "credentials");
	aws_file(conf_path, sizeof(conf_path), "AWS_CONFIG_FILE", "config");
	if (cred_path[0])
		cred = slurp(cred_path, &cred_len);
	if (conf_path[0])
		conf = slurp(conf_path, &conf_len);
	/* ~/.aws/config names profiles "[profile NAME]", except "[default]" */
	if (!strcmp(profile, "default"))
		snprintf(conf_section, sizeof(conf_section), "default");
	else
		snprintf(conf_section, sizeof(conf_section), "profile %.280s", profile);

	if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
		if ((ret = copy(a->access_key, sizeof(a->access_key), env("AWS_ACCESS_KEY_ID"), "AWS_ACCESS_KEY_ID")) ||
		    (ret = copy(a->secret_key, sizeof(a->secret_key), env("AWS_SECRET_ACCESS_KEY"),
				"AWS_SECRET_ACCESS_KEY")))
			goto out;
		if (env("AWS_SESSION_TOKEN") &&
		    (ret = copy(a->token, sizeof(a->token), env("AWS_SESSION_TOKEN"), "AWS_SESSION_TOKEN")))
			goto out;
		snprintf(a->cred_source, sizeof(a->cred_source), "environment (AWS_ACCESS_KEY_ID)");
	} else {
		const char *src = NULL, *sec = NULL;
		const char *text = NULL;
		size_t tlen = 0;
		if (cred && ferry__ini_get(cred, cred_len, profile, "aws_access_key_id", a->access_key,
					   sizeof(a->access_key)) == 1) {
			src = cred_path, sec = profile, text = cred, tlen = cred_len;
		} else if (conf && ferry__ini_get(conf, conf_len, conf_section, "aws_access_key_id", a->access_key,
						  sizeof(a->access_key)) == 1) {
			src = conf_path, sec = conf_section, text = conf, tlen = conf_len;
		}
		if (src) {
			if (ferry__ini_get(text, tlen, sec, "aws_secret_access_key", a->secret_key,
					   sizeof(a->secret_key)) != 1) {
				ret = ferry__error(-EINVAL, "%s [%s]: aws_access_key_id without aws_secret_access_key",
						   src, sec);
				goto out;
			}
			ferry__ini_get(text, tlen, sec, "aws_session_token", a->token, sizeof(a->token));
			snprintf(a->cred_source, sizeof(a->cred_source), "%.400s [%.150s]", src, sec);
		}
	}
	a->sign = a->access_key[0] && !truthy(env("AWS_NO_SIGN_REQUEST"));
	if (!a->sign)
		snprintf(a->cred_source, sizeof(a->cred_source), "none: unsigned requests (%s)",
			 a->access_key[0] ? "AWS_NO_SIGN_REQUEST" : "no credentials found");

	const char *region = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
	if (region)
		ret = copy(a->region, sizeof(a->region), region, "AWS_REGION");
	else if (!conf || ferry__ini_get(conf, conf_len, conf_section, "region", a->region, sizeof(a->region)) != 1)
		strcpy(a->region, "us-east-1");
	if (ret)
		goto out;

	const char *ep = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
	if (ep)
		ret = copy(a->endpoint, sizeof(a->endpoint), ep, "AWS_ENDPOINT_URL_S3");
	else if (conf)
		ferry__ini_get(conf, conf_len, conf_section, "endpoint_url", a->endpoint, sizeof(a->endpoint));
	if (ret)
		goto out;
	size_t el = strlen(a->endpoint);
	while (el && a->endpoint[el - 1] == '/')
		a->endpoint[--el] = 0;

	const char *st = env("FERRY_S3_ADDRESSING");
	if (!st || !strcasecmp(st, "auto"))
		a->addressing = FERRY__ADDR_AUTO;
	else if (!strcasecmp(st, "path"))
		a->addressing = FERRY__ADDR_PATH;
	else if (!strcasecmp(st, "virtual"))
		a->addressing = FERRY__ADDR_VIRTUAL;
	else
		ret = ferry__error(FERRY_EBADOPT, "FERRY_S3_ADDRESSING=%s: expected auto, path or virtual", st);
out:
	free(cred);
	free(conf);
	return ret;
}

static bool unreserved(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/';
}

int ferry__s3_http_url(const struct ferry__aws *a, const char *url, char *out, size_t len)
{
	const char *b = url + 5, *slash = strchr(b, '/');
	char bucket[256], key[3 * 1024 + 1];
	size_t bl, k = 0;
	int n;

	if (strncasecmp(url, "s3://", 5))
		return ferry__error(-EINVAL, "%s: not an s3:// URL", url);
	if (!slash || slash == b || !slash[1])
		return ferry__error(-EINVAL, "%s: expected s3://bucket/key", url);
	bl = (size_t)(slash - b);
	if (bl >= sizeof(bucket))
		return ferry__error(-ENAMETOOLONG, "%s: bucket name longer than 255 bytes", url);
	memcpy(bucket, b, bl);
	bucket[bl] = 0;
	for (size_t i = 0; i < bl; i++)
		if (!(isalnum((unsigned char)bucket[i]) || bucket[i] == '-' || bucket[i] == '.' || bucket[i] == '_'))
			return ferry__error(-EINVAL, "%s: bucket name \"%s\" has a character S3 does not allow", url,
					    bucket);
	for (const unsigned char *p = (const unsigned char *)slash + 1; *p; p++) {
		if (k + 4 > sizeof(key))
			return ferry__error(-ENAMETOOLONG, "%s: key longer than 1024 bytes", url);
		if (unreserved(*p))
			key[k++] = (char)*p;
		else
			k += (size_t)sprintf(key + k, "%%%02X", *p);
	}
	key[k] = 0;
	bool path = a->addressing == FERRY__ADDR_PATH ||
		    (a->addressing == FERRY__ADDR_AUTO && (a->endpoint[0] || strchr(bucket, '.')));
	if (path) {
		if (a->endpoint[0])
			n = snprintf(out, len, "%s/%s/%s", a->endpoint, bucket, key);
		else
			n = snprintf(out, len, "https://s3.%s.amazonaws.com/%s/%s", a->region, bucket, key);
	} else if (a->endpoint[0]) { /* virtual-hosted on a custom endpoint: the bucket before its host */
		const char *h = strstr(a->endpoint, "://");
		h = h ? h + 3 : a->endpoint;
		n = snprintf(out, len, "%.*s%s.%s/%s", (int)(h - a->endpoint), a->endpoint, bucket, h, key);
	} else {
		n = snprintf(out, len, "https://%s.s3.%s.amazonaws.com/%s", bucket, a->region, key);
	}
	if (n < 0 || (size_t)n >= len)
		return ferry__error(-ENAMETOOLONG, "%s: request URL too long", url);
	return 0;
}

/* The text of <tag>...</tag> in body, bounded. */
static void xml_text(const char *body, size_t len, const char *tag, char *out, size_t out_len)
{
	char open[32], close[32];
	int ol = snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	if (out_len)
		out[0] = 0;
	if (!out_len || ol <= 0)
		return;
	for (size_t i = 0; i + (size_t)ol <= len; i++) {
		if (memcmp(body + i, open, (size_t)ol))
			continue;
		const char *s = body + i + ol, *e = s;
		size_t cl = strlen(close);
		while ((size_t)(e - body) + cl <= len && memcmp(e, close, cl))
			e++;
		if ((size_t)(e - body) + cl > len)
			return;
		size_t n = (size_t)(e - s) < out_len - 1 ? (size_t)(e - s) : out_len - 1;
		for (size_t j = 0; j < n; j++) /* no control bytes from a server into messages */
			out[j] = (unsigned char)s[j] < 0x20 ? ' ' : s[j];
		out[n] = 0;
		return;
	}
}

void ferry__s3_error_code(const char *body, size_t len, char *code, size_t code_len, char *msg, size_t msg_len)
{
	xml_text(body, len, "Code", code, code_len);
	xml_text(body, len, "Message", msg, msg_len);
}
