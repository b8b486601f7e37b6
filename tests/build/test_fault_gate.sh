#!/usr/bin/env bash
# FERRY_FAULT_INJECT (the tests' short transfers, EINTR and EAGAIN) is read only by a library built
# with FERRY_TESTING (on for ctest builds, off for the wheel and Release builds): the engine's chunk.c
# compiled without it holds no trace of the variable; with it, it reads it (docs/CONFIG.md).
#   test_fault_gate.sh CC BUILD_DIR SOURCE_DIR
set -u
CC=$1 BUILD=$2 SRC=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
flags=(-std=gnu11 -D_GNU_SOURCE -c -I "$BUILD/layers/engine" -I "$SRC/include" "$SRC/src/engine/chunk.c")
if ! "$CC" "${flags[@]}" -o "$tmp/off.o" 2>"$tmp/err"; then echo "FAIL: chunk.c without FERRY_TESTING does not compile"; cat "$tmp/err"; exit 1; fi
if ! "$CC" -DFERRY_TESTING=1 "${flags[@]}" -o "$tmp/on.o" 2>"$tmp/err"; then echo "FAIL: chunk.c with FERRY_TESTING does not compile"; cat "$tmp/err"; exit 1; fi
if grep -q FERRY_FAULT_INJECT "$tmp/off.o"; then echo "FAIL: a build without FERRY_TESTING reads FERRY_FAULT_INJECT"; fail=1; fi
if ! grep -q FERRY_FAULT_INJECT "$tmp/on.o"; then echo "FAIL: a FERRY_TESTING build does not read FERRY_FAULT_INJECT"; fail=1; fi
[ $fail = 0 ] && echo "test_fault_gate: passed"
exit $fail
