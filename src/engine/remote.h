/* The remote backend (docs/REMOTE.md): object storage and HTTP(S) URLs opened as ferry_files and read
 * with ranged GETs over libcurl. Private to src/engine/ (and the unit tests). */
#ifndef FERRY_ENGINE_REMOTE_H
#define FERRY_ENGINE_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* s3://, http:// or https:// (case-insensitive scheme): a path ferry opens with the remote backend. */
bool ferry__is_url(const char *path);

/* ------------------------------------------------------------------- AWS configuration (aws.c) */

/*
 * The value of key in [section] of an INI text of len bytes (AWS's credentials and config files:
 * '#' and ';' comment lines, "key = value", surrounding blanks trimmed, the last occurrence wins).
 * Copies it NUL-terminated into out (at most outlen - 1 bytes, longer values are refused).
 * Returns 1 found, 0 not found, -ENAMETOOLONG too long. Takes any bytes (fuzzed).
 */
int ferry__ini_get(const char *text, size_t len, const char *section, const char *key, char *out,
		   size_t outlen);

enum { FERRY__ADDR_AUTO, FERRY__ADDR_PATH, FERRY__ADDR_VIRTUAL };

/* Where an S3 request goes and how it is signed, resolved from the environment and ~/.aws. */
struct ferry__aws {
	char access_key[256], secret_key[256], token[4096];
	char region[64];
	char endpoint[512]; /* custom endpoint (AWS_ENDPOINT_URL_S3, ...) or "" for AWS */
	char cred_source[600]; /* where the credentials came from, for messages and docs */
	int addressing;        /* FERRY__ADDR_* (FERRY_S3_ADDRESSING) */
	bool sign;             /* false: unsigned requests (no credentials, or AWS_NO_SIGN_REQUEST) */
};

/* Reads AWS_* variables and the profile's files. Returns 0, or a negative code with the detail set. */
int ferry__aws_load(struct ferry__aws *a);

/*
 * The HTTP URL of s3://bucket/key under a's endpoint and addressing: path-style
 * (<endpoint>/<bucket>/<key>) for custom endpoints, virtual-hosted
 * (https://<bucket>.s3.<region>.amazonaws.com/<key>) for AWS unless the bucket name has dots or
 * path-style is forced. The key is percent-encoded (every byte but A-Z a-z 0-9 - _ . ~ /).
 * Returns 0, or -EINVAL (malformed URL: no bucket, no key) / -ENAMETOOLONG with the detail set.
 */
int ferry__s3_http_url(const struct ferry__aws *a, const char *url, char *out, size_t len);

/* The Code and Message of an S3 XML error body ("" when absent). */
void ferry__s3_error_code(const char *body, size_t len, char *code, size_t code_len, char *msg,
			  size_t msg_len);

/* ------------------------------------------------------------------------- files (remote.c) */

struct ferry__remote;

/* Opens url (read-only): HEAD for the size and ETag. Returns 0 or a negative code, detail set. */
int ferry__remote_open(ferry_ctx *ctx, const char *url, int flags, struct ferry__remote **out);
void ferry__remote_close(struct ferry__remote *r);
uint64_t ferry__remote_size(const struct ferry__remote *r);
/* One line for ferry_file_path_info: the request URL, ETag, knobs, credentials' source. */
int ferry__remote_info(const struct ferry__remote *r, char *buf, size_t len);

/*
 * Reads [off, off+len) into host memory buf (clipped at the object's end) with ranged GETs of
 * remote_part_size over up to remote_connections kept-alive connections. Returns bytes read or a
 * negative code; the detail (URL, range, HTTP status, S3 Code) is set in this thread and kept in r
 * for ferry__remote_last_error (a worker's failure reported by the waiting thread).
 */
int64_t ferry__remote_read(struct ferry__remote *r, void *buf, size_t len, uint64_t off);
/*
 * Writes of a new object opened FERRY_O_WRONLY (s3:// only): in order (off must be the bytes
 * written so far, else -ESPIPE), buffered into parts uploaded remote_connections at a time as a
 * multipart upload. Returns len or a negative code; a failure aborts the upload.
 */
int64_t ferry__remote_write(struct ferry__remote *r, const void *buf, size_t len, uint64_t off);
/* Makes the written object visible (one PUT, or the last parts and CompleteMultipartUpload); a
 * file closed without it leaves nothing behind (AbortMultipartUpload). 0 for reads. */
int ferry__remote_commit(struct ferry__remote *r);
/* Copies the detail of r's last failure into buf ("" if none). */
void ferry__remote_last_error(struct ferry__remote *r, char *buf, size_t len);

/* ferry_file_open and ferry_file_destroy of a URL (file.c dispatches). */
int ferry__remote_file_open(ferry_ctx *ctx, const char *url, int flags, ferry_file **out);
void ferry__remote_file_destroy(ferry_file *f);

#endif
