#!/usr/bin/env bash
# Documentation that runs: the README's C example compiles against the built library and works.
set -u
ferry=$1
build=$(cd "$(dirname "$ferry")" && pwd)
src=${FERRY_SOURCE_DIR:?}
tmp=${FERRY_TEST_TMPDIR:-/tmp}/readme-$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
awk '/^## The C API/{f=1} f && /^```c$/{c=1; next} c && /^```$/{exit} c' "$src/README.md" >"$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "FAIL: no C example found in README.md"; exit 1; }
# a sanitizer build of the library needs the same runtime in the program that loads it
san=${FERRY_SANITIZE:+-fsanitize=$FERRY_SANITIZE}
cc -std=c11 -Wall -Werror $san -I"$src/include" "$tmp/example.c" "$build/libferry.so" -Wl,-rpath,"$build" \
	-o "$tmp/example" || { echo "FAIL: the README's example does not compile"; exit 1; }
head -c 100000 /dev/urandom >"$tmp/data"
out=$("$tmp/example" "$tmp/data" 2>&1) || { echo "FAIL: the example exited $?: $out"; exit 1; }
case $out in
"read 100000 bytes: $tmp/data:"*) echo "ok: $out" ;;
*) echo "FAIL: unexpected output: $out"; exit 1 ;;
esac
"$tmp/example" "$tmp/missing" 2>"$tmp/err" && { echo "FAIL: a missing file did not fail"; exit 1; }
grep -q "$tmp/missing" "$tmp/err" || { echo "FAIL: the error does not name the file: $(cat "$tmp/err")"; exit 1; }
exit 0
