#!/usr/bin/env bash
# The public API is one list (DESIGN.md): the functions include/ferry/*.h declares FERRY_API, the
# names the version script src/ferry.map exports, and the function symbols libferry.so defines
# must be the same, and docs/API.md must document each ("- `name(...)`: ..." entries, no entry for
# a function that is not there). Prints every difference.
#   test_api.sh SOURCE_DIR LIBFERRY_SO
set -u
SRC=$1 LIB=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# A declaration may span lines: join each header's text, leave out preprocessor lines (the
# FERRY_API definition itself), and take the identifier before the first parenthesis.
for h in "$SRC"/include/ferry/*.h; do
	grep -v '^[[:space:]]*#' "$h" | tr '\n' ' ' | grep -o 'FERRY_API[^;(]*(' |
		sed -E 's/[[:space:]]*\($//; s/.*[^A-Za-z0-9_]//'
done | sort >"$tmp/headers"
sed -n '/global:/,/local:/p' "$SRC/src/ferry.map" | sed 's#/\*.*\*/##' |
	grep -oE '^[[:space:]]*[A-Za-z_][A-Za-z0-9_]*;' | tr -d ' \t;' | sort >"$tmp/map"
nm -D --defined-only "$LIB" | awk '$2 == "T" || $2 == "W" || $2 == "i" { sub(/@.*/, "", $3); print $3 }' |
	sort >"$tmp/lib"
grep -oE '^- `[A-Za-z_][A-Za-z0-9_]*\(' "$SRC/docs/API.md" | sed -E 's/^- `//; s/\($//' | sort >"$tmp/doc"

for list in headers map lib doc; do
	dups=$(uniq -d "$tmp/$list")
	if [ -n "$dups" ]; then
		echo "FAIL: named twice in $list:" $dups
		fail=1
	fi
	sort -u -o "$tmp/$list" "$tmp/$list"
done
if [ "$(wc -l <"$tmp/headers")" -lt 100 ]; then
	echo "FAIL: only $(wc -l <"$tmp/headers") FERRY_API declarations found in $SRC/include/ferry"
	fail=1
fi
# what: a list; where it is missing from
report() {
	local only
	only=$(comm -23 "$tmp/$1" "$tmp/$2")
	if [ -n "$only" ]; then
		echo "FAIL: in $3 but not in $4:"
		echo "$only" | sed 's/^/  /'
		fail=1
	fi
}
report headers map "include/ferry/*.h" "src/ferry.map"
report map headers "src/ferry.map" "include/ferry/*.h"
report headers lib "include/ferry/*.h" "nm -D $LIB"
report lib headers "nm -D $LIB" "include/ferry/*.h"
report headers doc "include/ferry/*.h" "docs/API.md"
report doc headers "docs/API.md" "include/ferry/*.h"
echo "api: $(wc -l <"$tmp/headers") functions declared, $(wc -l <"$tmp/map") in the map, $(wc -l <"$tmp/lib") exported, $(wc -l <"$tmp/doc") documented"
exit $fail
