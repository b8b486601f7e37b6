/* Whether native GDS can exist here, decided without loading cuFile: nvidia-fs loaded, or
 * use_pci_p2pdma enabled (and not commented out) in cufile.json. */
#include <fcntl.h>

#include "ferry_test.h"
#include "gpu/shim.h"

static int with_json(const char *text, char *why, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/cufile-%d.json", t_tmpdir(), (int)getpid());
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs(text, f);
	fclose(f);
	setenv("CUFILE_ENV_PATH_JSON", path, 1);
	int r = ferry__gds_native_probe(why, len);
	unlink(path);
	return r;
}

int main(void)
{
	char why[512] = "";

	if (access("/proc/driver/nvidia-fs/version", F_OK) == 0)
		T_SKIP("nvidia-fs is loaded here: native GDS is possible whatever cufile.json says");
	T_EQ_INT(with_json("{ \"properties\": { \"use_pci_p2pdma\": true } }\n", why, sizeof(why)), 1);
	T_EQ_INT(with_json("{ \"properties\": {\n  \"use_pci_p2pdma\" :  true,\n } }\n", why, sizeof(why)), 1);
	why[0] = '\0';
	T_EQ_INT(with_json("{ \"properties\": { \"use_pci_p2pdma\": false } }\n", why, sizeof(why)), 0);
	T_CHECK(strstr(why, "nvidia-fs is not loaded") != NULL);
	T_EQ_INT(with_json("{\n  // \"use_pci_p2pdma\": true,\n  \"allow_compat_mode\": true\n}\n", why, sizeof(why)), 0);
	setenv("CUFILE_ENV_PATH_JSON", "/nonexistent/cufile.json", 1);
	T_EQ_INT(ferry__gds_native_probe(why, sizeof(why)), 0);

	/* path=auto's question is answered once per process: a cufile.json changed afterwards is not
	 * read again at each request (it was, about 50 us per request into device memory) */
	why[0] = '\0';
	T_EQ_INT(ferry__gds_native_possible(why, sizeof(why)), 0);
	T_CHECK(strstr(why, "nvidia-fs is not loaded") != NULL);
	char path[512];
	snprintf(path, sizeof(path), "%s/cufile-on-%d.json", t_tmpdir(), (int)getpid());
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs("{ \"properties\": { \"use_pci_p2pdma\": true } }\n", f);
	fclose(f);
	setenv("CUFILE_ENV_PATH_JSON", path, 1);
	T_EQ_INT(ferry__gds_native_probe(why, sizeof(why)), 1);
	T_EQ_INT(ferry__gds_native_possible(why, sizeof(why)), 0);
	unlink(path);
	return t_result();
}
