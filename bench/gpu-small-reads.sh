#!/usr/bin/env bash
# Issue 22's small random reads into GPU memory (GPU_BENCHES=gpu-small-reads, about 1-2 minutes):
# bench/small-reads.py --device cuda --mem pinned --sizes 4k,64k,1m --depths 1,32,256 from a file in
# /dev/shm, through the batch API and per-piece futures, beside kvikio (16 threads) and the same reads
# into pinned host memory, all in one run; then the depth-256 rows of 4 KiB and 64 KiB again in a
# process with FERRY_SCATTER=0 (the gathered copies as before the scatter kernel: cuMemcpyBatchAsync),
# to show what the kernel changed; before them, the cost of one gather three ways (test_scatter_gpu
# bench). TABLE rows: each api and size at depth 256 (the issue's ">= 64 in flight") against both
# targets, 1.5x kvikio and 0.8x the same reads into pinned host memory; the kernel's load (from the
# library's log); the A/B ratio; the per-gather costs. The full tables are in this script's log.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
D=/dev/shm/ferry-small-reads-bench
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	echo "skipped: torch sees no CUDA device"
	exit 77
fi
rm -rf "$D" && mkdir -p "$D"
rc=0
# the claimed cause first: one gather of 16 pieces, the kernel's launch against cuMemcpyBatchAsync
# and one plain copy of the same bytes (CPU in the call, wall to the end), in C (tests/gpu)
T=${FERRY_BUILD_DIR:-build}/tests/gpu/test_scatter_gpu
if [ -x "$T" ]; then
	# every byte of kernel-copied pieces checked first (a few seconds; also in the gpu ctest step)
	echo "=== correctness: $T"
	if FERRY_TEST_TMPDIR=$D "$T"; then
		echo "TABLE scatter test_scatter_gpu | passed | launches and engine reads (batch, futures) byte-exact"
	else
		echo "TABLE scatter test_scatter_gpu | FAILED | see this log"
		rc=1
	fi
	echo "=== per gather: $T bench"
	"$T" bench || rc=1
else
	echo "TABLE scatter gather | not run | $T not built (-DFERRY_GPU_TESTS=ON)"
fi
# FERRY_LOG_LEVEL=3: the library logs whether the scatter kernel loaded (and in how long), or why not
echo "=== kernel: small-reads.py (scatter kernel on: the default)"
FERRY_LOG_LEVEL=3 "$PY" bench/small-reads.py --device cuda --mem pinned --sizes 4k,64k,1m --depths 1,32,256 \
	--pieces 4096 --rounds 3 --file "$D/reads.bin" --keep --json "$D/kernel.json" 2>"$D/kernel.err" ||
	{ rc=1; tail -20 "$D/kernel.err"; }
grep -E 'scatter|gathered' "$D/kernel.err" | sort | uniq -c | head -5
echo "=== copies: FERRY_SCATTER=0, depth 256, 4k and 64k"
FERRY_SCATTER=0 "$PY" bench/small-reads.py --device cuda --mem pinned --sizes 4k,64k --depths 256 \
	--apis batch,futures --pieces 4096 --rounds 3 --file "$D/reads.bin" --json "$D/copies.json" || rc=1
"$PY" - "$D" <<'EOF' || rc=1
import json, os, re, sys
d = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(d, name)))["rows"]
    except (OSError, ValueError, KeyError) as e:
        print("TABLE small-reads %s | FAILED | %s" % (name, e))
        return []
kernel, copies = load("kernel.json"), load("copies.json")
err = open(os.path.join(d, "kernel.err")).read() if os.path.exists(os.path.join(d, "kernel.err")) else ""
m = re.search(r"scatter kernel loaded on device 0 in ([0-9.]+) ms", err)
n = re.search(r"scatter kernel unavailable on device 0: (.*)", err) or re.search(r"scatter kernel refused on device 0: (.*)", err)
print("TABLE small-reads scatter kernel | %s | %s" % (
    "loaded" if m else "NOT USED", "JIT and load %s ms, off the request's thread" % m.group(1) if m
    else (n.group(1)[:200] if n else "no log line (FERRY_LOG_LEVEL=3)")))
name = lambda b: "%dk" % (b >> 10) if b < 1 << 20 else "%dm" % (b >> 20)
for r in kernel:
    if r["memory"] != "cuda" or r["depth"] < 64 or r["api"] == "kvikio":
        continue
    tag = "small-reads %s %s d%d" % (r["api"], name(r["size"]), r["depth"])
    kv, pin = r.get("vs_kvikio"), r.get("vs_host")
    print("TABLE %s vs kvikio | %s | %s (target 1.5x; %.0f IOPS)" % (
        tag, "-" if kv is None else "met" if kv >= 1.5 else "missed", "-" if kv is None else "%.2fx" % kv, r["iops"]))
    print("TABLE %s vs pinned | %s | %s (target 0.8x)" % (
        tag, "-" if pin is None else "met" if pin >= 0.8 else "missed", "-" if pin is None else "%.2fx" % pin))
    fut = [f for f in kernel if f["api"] == "futures" and f["memory"] == r["memory"] and f["size"] == r["size"]
           and f["depth"] == r["depth"]]
    if r["api"] == "batch" and fut:
        # the batch API should not trail the same pieces as futures (issue 22): into pinned host too
        pf = [(b, f) for b in kernel for f in kernel if b["api"] == "batch" and f["api"] == "futures"
              and b["memory"] == f["memory"] != "cuda" and b["size"] == f["size"] == r["size"]
              and b["depth"] == f["depth"] == r["depth"]]
        print("TABLE %s vs futures | ran | %.2fx (%.0f vs %.0f IOPS; into %s memory %s)" % (
            tag, r["iops"] / fut[0]["iops"], r["iops"], fut[0]["iops"], pf[0][0]["memory"] if pf else "host",
            "%.2fx" % (pf[0][0]["iops"] / pf[0][1]["iops"]) if pf else "-"))
    old = [c for c in copies if c["memory"] == "cuda" and c["api"] == r["api"] and c["size"] == r["size"]
           and c["depth"] == r["depth"]]
    if old:
        print("TABLE %s kernel vs copies | ran | %.2fx (%.0f vs %.0f IOPS; copies' vs pinned %s)" % (
            tag, r["iops"] / old[0]["iops"], r["iops"], old[0]["iops"],
            "%.2fx" % old[0]["vs_host"] if old[0].get("vs_host") else "-"))
EOF
[ -n "${FERRY_LOG_DIR:-}" ] && cp "$D"/*.json "$D"/kernel.err "$FERRY_LOG_DIR/" 2>/dev/null
rm -rf "$D"
exit $rc
