#!/usr/bin/env bash
# Installs what ferry needs to build and test (Debian/Ubuntu packages), then builds it in build/.
# Idempotent: installs only what is missing, rebuilds only what changed.
#   scripts/setup.sh            build (Release with debug info) into build/
#   BUILD_DIR=... CMAKE_ARGS=... scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config liburing-dev libxxhash-dev python3 python3-venv fio tmux curl
      clang libclang-rt-14-dev libcurl4-openssl-dev libzstd-dev liblz4-dev zstd lz4 nginx)
missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "setup: installing ${missing[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >/dev/null
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	elif command -v sudo >/dev/null; then
		sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
	else
		echo "setup: missing packages: ${missing[*]} (run as root: apt-get install ${missing[*]})" >&2
		exit 1
	fi
fi

BUILD_DIR=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" >/dev/null
echo "setup: built $BUILD_DIR/ferry" >&2
