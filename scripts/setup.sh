#!/usr/bin/env bash
# Installs kiln's build dependencies (Debian packages from DESIGN.md's list), then
# configures and builds into build/. Safe to run twice: apt skips what is installed and
# CMake rebuilds only what changed.
#   scripts/setup.sh            # deps + Release build (CUDA when nvcc is present)
#   KILN_SKIP_APT=1 scripts/setup.sh   # build only
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config git clang clang-format
      libmicrohttpd-dev libjansson-dev libyaml-dev libsqlite3-dev libpcre2-dev
      libutf8proc-dev libedit-dev liburing-dev libxxhash-dev libcmocka-dev
      libopenblas-dev libdnnl-dev python3 python3-pip)

if [ -z "${KILN_SKIP_APT:-}" ]; then
  missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

BUILD_DIR=${KILN_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${KILN_BUILD_TYPE:-Release} ${KILN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "setup: built $BUILD_DIR/kiln"
