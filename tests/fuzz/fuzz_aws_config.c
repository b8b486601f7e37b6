/* libFuzzer target: the INI reader of ~/.aws/credentials and ~/.aws/config (src/engine/aws.c) on
 * arbitrary bytes, and the S3 error-body reader. The first byte picks the output size, so values
 * that just fit and just do not are both reached. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/remote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const keys[][2] = {{"default", "aws_access_key_id"}, {"profile prod", "region"},
					      {"prod", "aws_session_token"}, {"", ""}};
	char out[64], code[16], msg[32];

	if (!size)
		return 0;
	size_t outlen = 1 + data[0] % sizeof(out);
	const char *text = (const char *)data + 1;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		memset(out, 'X', sizeof(out));
		int r = ferry__ini_get(text, size - 1, keys[i][0], keys[i][1], out, outlen);
		if (r < -ENAMETOOLONG || r > 1 || strnlen(out, outlen) >= outlen)
			abort(); /* a value is NUL-terminated inside out, and only 1, 0 or -ENAMETOOLONG */
		if (r == 1 && !memmem(text, size - 1, out, strlen(out)))
			abort(); /* a value found is bytes of the input */
	}
	ferry__s3_error_code(text, size - 1, code, sizeof(code), msg, sizeof(msg));
	if (strnlen(code, sizeof(code)) >= sizeof(code) || strnlen(msg, sizeof(msg)) >= sizeof(msg))
		abort();
	return 0;
}
