#!/usr/bin/env bash
# The scatter kernel's embedded PTX (src/gpu/scatter_ptx.c) is what src/gpu/scatter.cu compiles to:
# regenerated with scripts/gen-scatter-ptx.sh (which also assembles it with ptxas for sm_75 and
# sm_90) into a temporary file and compared. Skipped (77) where nvcc is not installed, or is another
# release than the one the committed file names, since another nvcc writes other (valid) PTX text.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${NVCC:-nvcc}
if ! command -v "$nvcc" >/dev/null; then
	echo "skipped: nvcc not installed (set NVCC), the embedded PTX cannot be regenerated here"
	exit 77
fi
have=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 \2/p')
made=$(sed -n 's/.*with nvcc \(.*\):$/\1/p' "$root/src/gpu/scatter_ptx.c")
if [ "$have" != "$made" ]; then
	echo "skipped: nvcc here is $have, src/gpu/scatter_ptx.c was made with $made"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! bash "$root/scripts/gen-scatter-ptx.sh" "$tmp/scatter_ptx.c" >"$tmp/log" 2>&1; then
	echo "FAILED: scripts/gen-scatter-ptx.sh:"; cat "$tmp/log"
	exit 1
fi
if ! diff -u "$root/src/gpu/scatter_ptx.c" "$tmp/scatter_ptx.c" >"$tmp/diff"; then
	echo "FAILED: src/gpu/scatter_ptx.c is not what src/gpu/scatter.cu compiles to; run: bash scripts/gen-scatter-ptx.sh"
	head -40 "$tmp/diff"
	exit 1
fi
echo "ok: src/gpu/scatter_ptx.c matches src/gpu/scatter.cu (nvcc $have; ptxas assembled it for sm_75 and sm_90)"
