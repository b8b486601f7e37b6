#!/usr/bin/env bash
# The repaired wheel (issue 25; scripts/test.sh builds it): a manylinux tag; the extension and the
# CLI inside, with the console entry point that execs it; no C sources; every ELF file finds its
# libraries through $ORIGIN (auditwheel's vendored ferry_io.libs/), never an absolute path.
#   test_wheel.sh <wheel | folder holding one>          exit 0 pass, 1 fail, 77 no wheel (skipped)
set -uo pipefail
w=${1:?usage: test_wheel.sh <wheel or folder>}
if [ "${w%.whl}" = "$w" ]; then # a folder
	set -- "$w"/ferry_io-*manylinux*.whl
	if [ ! -f "$1" ]; then
		echo "skipped: no repaired wheel in $w (scripts/test.sh's python tests build one)"
		exit 77
	fi
	w=$1
fi
[ -f "$w" ] || { echo "FAIL: $w: no such wheel"; exit 1; }
command -v readelf >/dev/null || { echo "skipped: readelf is not installed"; exit 77; }
fail=0
bad() { echo "FAIL: $(basename "$w"): $*"; fail=1; }

case $(basename "$w") in
ferry_io-*-manylinux_*_x86_64.whl | ferry_io-*-manylinux_*_aarch64.whl) ;;
*) bad "name: expected ferry_io-<version>-<python>-manylinux_<glibc>_<arch>.whl" ;;
esac
d=$(mktemp -d) && trap 'rm -rf "$d"' EXIT
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$d" || exit 1
# extractall drops the mode bits; read them from the archive.
mode=$(python3 -c 'import sys, zipfile; print(oct(zipfile.ZipFile(sys.argv[1]).getinfo("ferry/_bin/ferry").external_attr >> 16))' "$w" 2>/dev/null)

set -- "$d"/ferry/_ferry.*.so
[ -f "$1" ] || bad "no extension ferry/_ferry.*.so"
[ -f "$d/ferry/_bin/ferry" ] || bad "no CLI ferry/_bin/ferry"
case $mode in 0o1007[57][57]) ;; *) bad "ferry/_bin/ferry mode is '$mode', expected executable (0o100755)" ;; esac
[ -f "$d/ferry/_cli.py" ] || bad "no ferry/_cli.py"
ep=$(cat "$d"/ferry_io-*.dist-info/entry_points.txt 2>/dev/null)
grep -qx 'ferry = ferry._cli:main' <<<"$ep" || bad "entry_points.txt: no 'ferry = ferry._cli:main' console script: '$ep'"
grep -q '^Name: ferry-io$' "$d"/ferry_io-*.dist-info/METADATA || bad "METADATA: Name is not ferry-io"
src=$(cd "$d" && find ferry -name '*.[ch]')
[ -z "$src" ] || bad "C sources shipped: $src"

n=0
while IFS= read -r f; do
	head -c4 "$f" | grep -q $'\x7fELF' || continue
	n=$((n + 1))
	rel=${f#"$d"/}
	rp=$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')
	IFS=: read -ra parts <<<"$rp"
	for p in "${parts[@]}"; do
		case $p in '$ORIGIN'*) ;; *) bad "$rel: rpath '$p' is not under \$ORIGIN" ;; esac
	done
	# Each library it needs is vendored in the wheel or on the manylinux policy's list of libraries
	# every system has (auditwheel's policy/manylinux-policy.json: glibc's, libz, libgcc_s, ...).
	for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		case $lib in lib[cm].so.* | libdl.so.* | librt.so.* | libpthread.so.* | libresolv.so.* | libutil.so.* | \
			libnsl.so.* | libcrypt.so.* | libz.so.1 | libgcc_s.so.* | libstdc++.so.* | ld-linux*) continue ;; esac
		[ -n "$(find "$d" -name "$lib" -print -quit)" ] || bad "$rel: needs $lib, which is not in the wheel"
	done
done < <(find "$d" -type f \( -name '*.so*' -o -path '*/_bin/*' \))
[ "$n" -ge 2 ] || bad "$n ELF files found, expected the extension and the CLI at least"
[ $fail = 0 ] && echo "ok: $(basename "$w"): $n ELF files, rpaths under \$ORIGIN, extension, CLI and entry point present"
exit $fail
