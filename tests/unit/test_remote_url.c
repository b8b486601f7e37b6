/* The remote backend's pure parts (src/engine/aws.c): the INI reader of ~/.aws files, S3 URL
 * addressing (path-style, virtual-hosted, forced), credentials, region and endpoint from the
 * environment and from a profile, S3 error bodies. Requests against a server: tests/python/test_s3.py. */
#include "ferry_test.h"
#include "engine/remote.h"

static void clear_env(void)
{
	static const char *const vars[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
					   "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
					   "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_NO_SIGN_REQUEST",
					   "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "FERRY_S3_ADDRESSING"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

static void test_ini(void)
{
	const char *t = "# comment\n[default]\naws_access_key_id = AKIA1 \r\n; other\n[ prod ]\n"
			"aws_access_key_id=AKIA2\nregion =  eu-west-1\nregion = eu-west-2\n[broken\nx = y\n";
	char v[32];

	T_EQ_INT(ferry__ini_get(t, strlen(t), "default", "aws_access_key_id", v, sizeof(v)), 1);
	T_EQ_STR(v, "AKIA1");
	T_EQ_INT(ferry__ini_get(t, strlen(t), "prod", "aws_access_key_id", v, sizeof(v)), 1);
	T_EQ_STR(v, "AKIA2");
	T_EQ_INT(ferry__ini_get(t, strlen(t), "prod", "region", v, sizeof(v)), 1);
	T_EQ_STR(v, "eu-west-2"); /* the last one wins */
	T_EQ_INT(ferry__ini_get(t, strlen(t), "default", "region", v, sizeof(v)), 0);
	T_EQ_INT(ferry__ini_get(t, strlen(t), "broken", "x", v, sizeof(v)), 0); /* no "]": no section */
	T_EQ_INT(ferry__ini_get(t, strlen(t), "nosuch", "region", v, sizeof(v)), 0);
	T_EQ_INT(ferry__ini_get(t, strlen(t), "prod", "region", v, 5), -ENAMETOOLONG);
	T_EQ_STR(v, "");
	/* not NUL-terminated: only len bytes are read */
	T_EQ_INT(ferry__ini_get("[a]\nk=vvvv", 8, "a", "k", v, sizeof(v)), 1);
	T_EQ_STR(v, "vv");
	T_EQ_INT(ferry__ini_get("", 0, "a", "k", v, sizeof(v)), 0);
}

static void test_urls(void)
{
	struct ferry__aws a;
	char u[512];

	T_CHECK(ferry__is_url("s3://b/k"));
	T_CHECK(ferry__is_url("HTTPS://h/x"));
	T_CHECK(ferry__is_url("http://h/x"));
	T_CHECK(!ferry__is_url("/tmp/s3://x"));
	T_CHECK(!ferry__is_url("file.bin"));

	memset(&a, 0, sizeof(a));
	strcpy(a.region, "us-west-2");
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/dir/a b+c.bin", u, sizeof(u)), 0);
	T_EQ_STR(u, "https://bkt.s3.us-west-2.amazonaws.com/dir/a%20b%2Bc.bin"); /* virtual-hosted on AWS */
	T_EQ_INT(ferry__s3_http_url(&a, "s3://my.bkt/k", u, sizeof(u)), 0);
	T_EQ_STR(u, "https://s3.us-west-2.amazonaws.com/my.bkt/k"); /* dots: path-style (TLS names) */
	a.addressing = FERRY__ADDR_PATH;
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/k", u, sizeof(u)), 0);
	T_EQ_STR(u, "https://s3.us-west-2.amazonaws.com/bkt/k");
	a.addressing = FERRY__ADDR_AUTO;
	strcpy(a.endpoint, "http://127.0.0.1:9000");
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/k/x", u, sizeof(u)), 0);
	T_EQ_STR(u, "http://127.0.0.1:9000/bkt/k/x"); /* custom endpoint: path-style */
	a.addressing = FERRY__ADDR_VIRTUAL;
	strcpy(a.endpoint, "https://minio.example:9000");
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/k", u, sizeof(u)), 0);
	T_EQ_STR(u, "https://bkt.minio.example:9000/k");
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt", u, sizeof(u)), -EINVAL);
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/", u, sizeof(u)), -EINVAL);
	T_EQ_INT(ferry__s3_http_url(&a, "s3:///k", u, sizeof(u)), -EINVAL);
	T_EQ_INT(ferry__s3_http_url(&a, "s3://b?t/k", u, sizeof(u)), -EINVAL);
	T_EQ_INT(ferry__s3_http_url(&a, "s3://bkt/k", u, 10), -ENAMETOOLONG);
}

static void test_error_body(void)
{
	const char *x = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The key\ndoes not "
			"exist.</Message></Error>";
	char code[32], msg[64];

	ferry__s3_error_code(x, strlen(x), code, sizeof(code), msg, sizeof(msg));
	T_EQ_STR(code, "NoSuchKey");
	T_EQ_STR(msg, "The key does not exist.");
	ferry__s3_error_code(x, 30, code, sizeof(code), msg, sizeof(msg)); /* cut off: nothing */
	T_EQ_STR(code, "");
	ferry__s3_error_code("<Code>SlowDownAndMore", 21, code, 5, msg, sizeof(msg));
	T_EQ_STR(code, "");
}

static void write_file(const char *path, const char *text)
{
	FILE *fp = fopen(path, "w");
	T_ASSERT(fp);
	fputs(text, fp);
	fclose(fp);
}

static void test_config(const char *tmp)
{
	struct ferry__aws a;
	char dir[512], path[600];

	clear_env();
	snprintf(dir, sizeof(dir), "%s/aws-XXXXXX", tmp);
	T_ASSERT(mkdtemp(dir));
	setenv("HOME", dir, 1);
	/* nothing anywhere: unsigned, us-east-1 */
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_CHECK(!a.sign);
	T_EQ_STR(a.region, "us-east-1");
	T_CHECK(strstr(a.cred_source, "no credentials") != NULL);

	snprintf(path, sizeof(path), "%s/.aws", dir);
	T_ASSERT(mkdir(path, 0700) == 0);
	snprintf(path, sizeof(path), "%s/.aws/credentials", dir);
	write_file(path, "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n"
			 "[prod]\naws_access_key_id = PROD\naws_secret_access_key = prodsecret\naws_session_token = tok\n");
	snprintf(path, sizeof(path), "%s/.aws/config", dir);
	write_file(path, "[default]\nregion = ap-south-1\n[profile prod]\nregion = eu-central-1\n"
			 "endpoint_url = http://127.0.0.1:9000/\n");
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_CHECK(a.sign);
	T_EQ_STR(a.access_key, "DEF");
	T_EQ_STR(a.secret_key, "defsecret");
	T_EQ_STR(a.region, "ap-south-1");
	T_EQ_STR(a.endpoint, "");

	setenv("AWS_PROFILE", "prod", 1);
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_EQ_STR(a.access_key, "PROD");
	T_EQ_STR(a.token, "tok");
	T_EQ_STR(a.region, "eu-central-1");
	T_EQ_STR(a.endpoint, "http://127.0.0.1:9000"); /* trailing '/' dropped */
	T_CHECK(strstr(a.cred_source, "credentials [prod]") != NULL);

	/* the environment before the files */
	setenv("AWS_ACCESS_KEY_ID", "ENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
	setenv("AWS_REGION", "us-west-1", 1);
	setenv("AWS_ENDPOINT_URL", "http://a:1", 1);
	setenv("AWS_ENDPOINT_URL_S3", "http://s3:2", 1);
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_EQ_STR(a.access_key, "ENV");
	T_EQ_STR(a.token, "");
	T_EQ_STR(a.region, "us-west-1");
	T_EQ_STR(a.endpoint, "http://s3:2");
	T_CHECK(strstr(a.cred_source, "environment") != NULL);

	setenv("AWS_NO_SIGN_REQUEST", "true", 1);
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_CHECK(!a.sign);
	unsetenv("AWS_NO_SIGN_REQUEST");

	setenv("FERRY_S3_ADDRESSING", "virtual", 1);
	T_EQ_INT(ferry__aws_load(&a), 0);
	T_EQ_INT(a.addressing, FERRY__ADDR_VIRTUAL);
	setenv("FERRY_S3_ADDRESSING", "sideways", 1);
	T_EQ_INT(ferry__aws_load(&a), FERRY_EBADOPT);
	T_CHECK(strstr(ferry_last_error(), "FERRY_S3_ADDRESSING=sideways") != NULL);

	/* a key without its secret names the file and the profile */
	clear_env();
	setenv("HOME", dir, 1);
	setenv("AWS_PROFILE", "half", 1);
	snprintf(path, sizeof(path), "%s/.aws/credentials", dir);
	write_file(path, "[half]\naws_access_key_id = H\n");
	T_EQ_INT(ferry__aws_load(&a), -EINVAL);
	T_CHECK(strstr(ferry_last_error(), "[half]: aws_access_key_id without aws_secret_access_key") != NULL);
	clear_env();
	T_CHECK(t_rmtree(dir) == 0);
}

int main(void)
{
	const char *tmp = getenv("FERRY_TEST_TMPDIR");
	char tmpdir[512];

	snprintf(tmpdir, sizeof(tmpdir), "%s", tmp && *tmp ? tmp : "/tmp");
	mkdir(tmpdir, 0755);
	test_ini();
	test_urls();
	test_error_body();
	test_config(tmpdir);
	return t_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
