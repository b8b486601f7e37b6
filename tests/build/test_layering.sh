#!/usr/bin/env bash
# The layers are enforced by the build (DESIGN.md, CMakeLists.txt): each layer compiles against an
# include tree of its own (build/layers/<layer>/) that holds its own headers and the headers the
# layers below export. This checks, for every layer, that each header of the project outside its
# tree fails to compile when included (an upward include, or a lower layer's private header), that
# each header inside compiles (so the failures are the tree's doing, not a broken command), and that
# no source goes around the trees with a relative "../" include.
#   test_layering.sh CC BUILD_DIR SOURCE_DIR
set -u
CC=$1 BUILD=$2 SRC=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 checked=0
headers=$(cd "$SRC" && ls src/*/*.h tools/*.h | sed -e 's#^src/##')
for tree in "$BUILD"/layers/*/; do
	layer=$(basename "$tree")
	[ "$layer" = tests ] && continue
	for h in $headers; do
		printf '#include "%s"\n' "$h" >"$tmp/t.c"
		if [ -e "$tree/$h" ]; then want=ok; else want=fail; fi
		if "$CC" -fsyntax-only -D_GNU_SOURCE -I "$tree" -I "$SRC/include" "$tmp/t.c" 2>"$tmp/err"; then got=ok; else got=fail; fi
		checked=$((checked + 1))
		if [ "$want" != "$got" ]; then
			echo "FAIL: layer $layer including \"$h\": expected $want, got $got"
			head -3 "$tmp/err"
			fail=1
		fi
	done
done
rel=$(cd "$SRC" && grep -rn '#include *"\.\./' src tools cli python/ferry --include='*.[ch]' || true)
if [ -n "$rel" ]; then
	echo "FAIL: relative includes go around the layer trees:"
	echo "$rel"
	fail=1
fi
if [ "$checked" -lt 20 ]; then
	echo "FAIL: only $checked includes checked (no layer trees under $BUILD/layers?)"
	fail=1
fi
echo "layering: $checked includes checked"
exit $fail
