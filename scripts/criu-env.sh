# Sourced (bash): where no criu is installed and FERRY_CRIU is unset, unpacks the Debian packages
# staged in .deb/criu by scripts/stage-device.sh into $1 (a scratch directory) and exports
# FERRY_CRIU as a wrapper that gives criu alone their libraries. Used by tests/gpu/test_snapshot.sh
# and bench/gpu-snapshot.sh.
#   source scripts/criu-env.sh SCRATCH_DIR
if [ -z "${FERRY_CRIU:-}" ] && ! command -v criu >/dev/null && [ ! -x /usr/sbin/criu ] &&
	ls "$(dirname "${BASH_SOURCE[0]}")"/../.deb/criu/criu_*.deb >/dev/null 2>&1; then
	criu_env_r=$1/criuroot
	for criu_env_f in "$(dirname "${BASH_SOURCE[0]}")"/../.deb/criu/*.deb; do dpkg -x "$criu_env_f" "$criu_env_r"; done
	printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/usr/lib/x86_64-linux-gnu:%s/lib/x86_64-linux-gnu exec %s/usr/sbin/criu "$@"\n' \
		"$criu_env_r" "$criu_env_r" "$criu_env_r" >"$1/criu"
	chmod +x "$1/criu"
	export FERRY_CRIU=$1/criu
	echo "criu: Debian's package from .deb/criu, $("$FERRY_CRIU" --version | head -1)"
fi
