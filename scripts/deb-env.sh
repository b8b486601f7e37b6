# Sourced: makes the Debian packages carried in .deb/ (liburing, xxhash; staged by
# ../shared/device/stage-debs.sh) usable without installing them, for machines without network
# (the GPU machine). A no-op where there is no .deb/ directory.
#   source scripts/deb-env.sh
if [ -d .deb ]; then
	mkdir -p /tmp/debroot && for f in .deb/*.deb; do dpkg -x "$f" /tmp/debroot; done
	export CPATH=/tmp/debroot/usr/include${CPATH:+:$CPATH}
	export LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
	export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	# The unpacked packages' .pc files point into /tmp/debroot themselves: a global
	# PKG_CONFIG_SYSROOT_DIR would also prefix the machine's own .pc files (libcurl's include
	# directory became /tmp/debroot/usr/include/..., which CMake refuses as a missing path).
	sed -i 's|^prefix=/usr$|prefix=/tmp/debroot/usr|' /tmp/debroot/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc 2>/dev/null
	export PKG_CONFIG_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
fi
