"""ferry bench of a ferry compressed file (issue 26): reads go through ferry_cz_pread over the
uncompressed bytes, and the output gives the ratio, the effective and compressed rates and where
the chunks were decoded; --raw reads the stored bytes as before."""
import os
import subprocess

from _bench import FERRY, check, finish, run, run_json, scratch

d = scratch()
plain, fz = os.path.join(d, "plain"), os.path.join(d, "data.fz")
with open(plain, "wb") as f:  # half text-like (compresses), half random (stored chunks)
    f.write((b"the quick brown fox jumps over the lazy dog " * 200000)[:8 << 20])
    f.write(os.urandom(8 << 20))
p = subprocess.run([FERRY, "cp", "--compress", "zstd", "--quiet", plain, fz], capture_output=True, text=True)
check(p.returncode == 0, "ferry cp --compress zstd", p.stderr, 0)
csize = os.path.getsize(fz)

doc = run_json("--filename", fz, "--bs", "1m", "--numjobs", "2")
if doc:
    job = doc["jobs"][0]
    cz = job["ferry"].get("compressed")
    check(cz is not None, "jobs[0].ferry.compressed present", job["ferry"].keys())
    if cz:
        check(cz["codec"] == "zstd" and cz["bytes"] == 16 << 20, "codec and uncompressed bytes",
              (cz["codec"], cz["bytes"]), ("zstd", 16 << 20))
        check(1.5 < cz["ratio"] < 2.5 and cz["compressed_bytes"] < csize, "ratio of half text, half random",
              (cz["ratio"], cz["compressed_bytes"], csize))
        check(abs(cz["effective_gbps"] / cz["compressed_gbps"] - cz["ratio"]) < 1e-3 * cz["ratio"],
              "effective = compressed x ratio", (cz["effective_gbps"], cz["compressed_gbps"], cz["ratio"]))
        check(cz["decoded"] == "cpu (host memory)", "decoded on the CPU into host memory", cz["decoded"])
    # every job read the whole uncompressed region once: 2 x 16 MiB
    check(job["read"]["io_bytes"] == 2 * (16 << 20), "io_bytes over the uncompressed bytes",
          job["read"]["io_bytes"], 2 * (16 << 20))

rc, out, err = run("--filename", fz, "--bs", "1m")
check(rc == 0 and "compressed (zstd): bs 1 MiB ratio" in out and "decoded: cpu (host memory)" in out,
      "the normal output's compressed line", (rc, out, err))

raw = run_json("--filename", fz, "--bs", "4k", "--raw")
if raw:
    check("compressed" not in raw["jobs"][0]["ferry"], "--raw: no compressed object", raw["jobs"][0]["ferry"].keys())
    check(raw["jobs"][0]["read"]["io_bytes"] == csize // 4096 * 4096, "--raw reads the stored bytes",
          raw["jobs"][0]["read"]["io_bytes"], csize // 4096 * 4096)
finish()
