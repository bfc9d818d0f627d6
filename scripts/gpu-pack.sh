#!/usr/bin/env bash
# Builds kiln for the lent GPU machine and packs what it needs into .carry/ (git-ignored):
# the binaries (kiln, kiln-gen, gpu-labelled tests, benchmarks) and the shared libraries
# they link that a bare CUDA image lacks (jansson, pcre2, ...). `--bins DEST FILE...`
# packs just those binaries the same way (scripts/gpu-e2e.sh, gpu-load.sh). The GPU machine cannot
# fetch packages, so everything travels (limit 64 MiB): OpenBLAS and oneDNN are left out
# of this build (CPU providers; not needed there).
#   scripts/gpu-pack.sh && <device run with carry [".carry"]> bash scripts/gpu-check.sh
#
# --deps DIR: only download the Debian packages kiln builds against into DIR (for a device
# call that builds there: scripts/gpu-env.sh, gpu-round.sh).
# --source DEST [FILE...]: instead, copy the tracked files of this checkout (and FILEs) to
# DEST and download the Debian packages kiln builds against (headers, .pc files, shared
# libraries, pkgconf, cmocka; ~10 MB) into DEST/.deps/: gpu-check.sh then builds on the GPU
# machine (16 cores, nvcc there) instead of carrying binaries built on this 2-core one.
# The packages are this machine's distribution's (Debian 12, glibc 2.36): the GPU image
# needs a glibc at least as new.
set -euo pipefail
# pack_bins DEST FILE...: the binaries into DEST/bin, the shared libraries they link that a
# bare CUDA image lacks into DEST/lib (not glibc's, not the C++ runtime, not CUDA's: the
# image has those, and cuBLAS alone is over the 64 MiB a call carries)
pack_bins() {
  local dest=$1; shift
  mkdir -p "$dest/bin" "$dest/lib"
  cp "$@" "$dest/bin/"
  for b in "$@"; do
    ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
        libstdc++.so*|libcuda.so*|libcublas*|libcudart*) ;;
        *) cp -Ln "$lib" "$dest/lib/" ;;
      esac
    done
  done
  strip --strip-debug "$dest"/bin/* 2>/dev/null || true
}
# download_deps DIR: the Debian packages kiln builds against (headers, .pc files, shared
# libraries, pkgconf, cmocka; ~10 MB), for building on the GPU machine (scripts/gpu-env.sh)
download_deps() {
  mkdir -p "$1"
  PKGS="libjansson-dev libjansson4 libyaml-dev libyaml-0-2 libsqlite3-dev libsqlite3-0
    libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev
    libutf8proc2 libedit-dev libedit2 libbsd0 libmd0 liburing-dev liburing2 libmicrohttpd-dev
    libmicrohttpd12 libxxhash-dev libxxhash0 libcmocka-dev libcmocka0 pkgconf pkgconf-bin
    libpkgconf3 libgnutls30 libnettle8 libhogweed6 libp11-kit0 libtasn1-6 libidn2-0
    libunistring2 libffi8 libgmp10 libncurses-dev libtinfo6 libncursesw6 libncurses6
    libbsd-dev libmd-dev"
  (cd "$1" && apt-get download $PKGS >/dev/null 2>&1)
}
if [ "${1:-}" = "--deps" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --deps DIR" >&2; exit 2; }
  download_deps "$2"
  du -sh "$2"
  exit 0
fi
if [ "${1:-}" = "--bins" ]; then
  [ $# -ge 3 ] || { echo "usage: $0 --bins DEST FILE..." >&2; exit 2; }
  d=$2; shift 2
  pack_bins "$d" "$@"
  exit 0
fi
if [ "${1:-}" = "--source" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --source DEST [FILE...]" >&2; exit 2; }
  DEST=$2; shift 2
  SRC=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
  rm -rf "$DEST" && mkdir -p "$DEST/.deps"
  git -C "$SRC" ls-files -z | (cd "$SRC" && xargs -0 cp --parents -a -t "$DEST")
  for f in "$@"; do cp -a "$f" "$DEST/"; done
  download_deps "$DEST/.deps"
  echo "packed $(git -C "$SRC" rev-parse --short HEAD) into $DEST ($(du -sh "$DEST" | cut -f1))"
  exit 0
fi
cd "$(dirname "$0")/.."
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_OPENBLAS=OFF \
      -DKILN_ONEDNN=OFF >/dev/null
cmake --build $B -j"$(nproc)" >/dev/null
rm -rf .carry
bins=("$B/kiln")
[ -x $B/kiln-gen ] && bins+=("$B/kiln-gen")
for t in $B/tests/test_* $B/bench/bench_*; do [ -x "$t" ] && bins+=("$t"); done
pack_bins .carry "${bins[@]}"
du -sh .carry
