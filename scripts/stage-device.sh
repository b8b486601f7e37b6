#!/usr/bin/env bash
# Stages here what the GPU machine lacks (it has no network), for device calls that carry
# [".deb", ".whl"]:
#   .deb/  liburing and xxhash packages (unpacked there by scripts/deb-env.sh, never installed),
#          fio 3.33 built statically from Debian's source package (./fio; the GPU machine has none),
#          criu in .deb/criu/ and nginx in .deb/nginx/ (each unpacked for itself alone);
#   .whl/  Python 3.12 wheels of the peers: kvikio (bench/gpu-read.sh), fastsafetensors and
#          runai-model-streamer (bench/ckpt-gpu.py), mosaicml-streaming and what it imports
#          (bench/loader-gpu.sh), runai-model-streamer-s3, tensorizer and boto3 with what they
#          import (bench/remote-read.sh), InstantTensor (bench/gpu-st-fresh.sh) and nvCOMP
#          (bench/gpu-cz-read.sh, the GPU tests);
#   .gpu/base  with base=REV: the tree of commit REV, for bench/gpu-ab.sh (that commit's build beside
#          this tree's in one device call).
# The folders are git-ignored. Each part is skipped when already there.
#   scripts/stage-device.sh            # everything
#   scripts/stage-device.sh debs fio   # a subset: debs fio wheels
#   scripts/stage-device.sh base=46d4396
set -euo pipefail
cd "$(dirname "$0")/.."
parts=${*:-debs fio wheels}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }

if has debs; then
	mkdir -p .deb
	(cd .deb && ls liburing-dev_*.deb libxxhash-dev_*.deb >/dev/null 2>&1 ||
		apt-get download liburing2 liburing-dev libxxhash0 libxxhash-dev >/dev/null)
	# CRIU (tests/gpu/test_snapshot.sh) and the libraries it links, in .deb/criu/: deb-env.sh puts
	# .deb/*.deb on everything's LD_LIBRARY_PATH, and Debian 12's gnutls and kin must not replace the
	# GPU machine's own; the test unpacks these for criu alone.
	mkdir -p .deb/criu
	(cd .deb/criu && ls criu_*.deb >/dev/null 2>&1 ||
		apt-get download criu libbsd0 libmd0 libgnutls30 libnettle8 libhogweed6 libgmp10 libidn2-0 \
			libunistring2 libp11-kit0 libffi8 libtasn1-6 libnftables1 libnftnl11 libmnl0 libjansson4 \
			libxtables12 libprotobuf-c1 libnl-3-200 libnet1 >/dev/null)
	# nginx (bench/remote-read.sh's server, issue 23) and the libraries its binary links, in
	# .deb/nginx/: tests/python/_nginx.py unpacks them for nginx alone, like .deb/criu (nginx-common
	# holds only /etc files: the bench writes its own configuration).
	mkdir -p .deb/nginx
	(cd .deb/nginx && ls nginx_*.deb >/dev/null 2>&1 ||
		apt-get download nginx libssl3 libpcre2-8-0 zlib1g libcrypt1 >/dev/null)
	echo "stage-device: .deb: $(cd .deb && ls *.deb | tr '\n' ' ')"
fi

if has fio && [ ! -x .deb/fio ]; then
	# Debian 12's fio, from its source package, without the optional engines (rbd, rdma, gfapi...
	# whose libraries the GPU machine lacks), linked statically so it runs on any x86-64 glibc.
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	mkdir -p "$tmp/lists/partial"
	echo 'deb-src http://deb.debian.org/debian bookworm main' >"$tmp/src.list"
	o="-o Dir::Etc::SourceList=$tmp/src.list -o Dir::Etc::SourceParts=- -o Dir::State::Lists=$tmp/lists"
	apt-get $o update >/dev/null
	(cd "$tmp" && apt-get $o source --download-only fio=3.33-3 >/dev/null 2>&1 && tar xzf fio_3.33.orig.tar.gz)
	(cd "$tmp/fio-3.33" && ./configure --build-static --disable-native --disable-numa --disable-rdma \
		--disable-rados --disable-rbd --disable-http --disable-gfapi --disable-libnfs --disable-pmem \
		--disable-xnvme --disable-libzbc --disable-tcmalloc --disable-dfs >/dev/null &&
		make -j"$(nproc)" fio >/dev/null 2>&1)
	mkdir -p .deb
	cp "$tmp/fio-3.33/fio" .deb/fio
	echo "stage-device: .deb/fio: $(.deb/fio --version)"
fi

if has wheels; then
	mkdir -p .whl
	# Python 3.12 manylinux wheels; versions pinned to what the figures in docs/PERFORMANCE.md used.
	pyget() {
		python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
			--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
			--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$@"
	}
	pyget kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 "rapids-logger==0.3.*"
	pyget fastsafetensors==0.5.0 runai-model-streamer==0.16.1 || true
	# InstantTensor (bench/gpu-st-fresh.sh's peer) and nvCOMP's library (GPU decompression: tests/gpu,
	# bench/gpu-cz-read.sh; 30 MB: .whl is then over the 64 MiB a device call carries, so a call
	# carries the wheels it needs by name)
	pyget instanttensor==0.2.2 nvidia-libnvcomp-cu13==6.0.0.12
	# nvCOMP's Python API: bench/gpu-nvcomp-codecs.sh (its own formats against zstd and LZ4)
	pyget nvidia-nvcomp-cu13==6.0.0.12
	pyget mosaicml-streaming brotli python-snappy cramjam zstd xxhash tqdm pillow catalogue torchvision==0.26.0
	# bench/remote-read.sh's peers: runai's S3 reader and tensorizer, boto3 (and what the three import
	# that the GPU machine's image lacks: tensorizer imports redis and libnacl at import time)
	pyget runai-model-streamer-s3==0.16.1 tensorizer==2.12.1 boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 \
		jmespath==1.1.0 python-dateutil==4.0.0 six==1.17.0 humanize==4.17.0 protobuf==7.36.2 psutil==7.2.2 \
		redis==8.1.0 hiredis==3.5.0 libnacl==2.1.0 urllib3==2.8.0
	du -sh .whl
fi

for part in $parts; do
	case $part in
	base=*)
		rev=${part#base=}
		grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
		rm -rf .gpu/base && mkdir -p .gpu/base
		git archive "$rev" | tar -x -C .gpu/base
		rm -rf .gpu/base/docs/measurements # raw logs of old commits: not needed to build
		echo "stage-device: .gpu/base: $(git rev-parse --short "$rev"), $(du -sh .gpu/base | cut -f1)"
		;;
	esac
done
