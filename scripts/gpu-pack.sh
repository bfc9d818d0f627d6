#!/usr/bin/env bash
# Builds kiln for the lent GPU machine and packs what it needs into .carry/ (git-ignored):
# the binaries (kiln, kiln-gen, gpu-labelled tests, benchmarks) and the shared libraries
# they link that a bare CUDA image lacks (jansson, pcre2, ...). The GPU machine cannot
# fetch packages, so everything travels (limit 64 MiB): OpenBLAS and oneDNN are left out
# of this build (CPU providers; not needed there).
#   scripts/gpu-pack.sh && <device run with carry [".carry"]> bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_OPENBLAS=OFF \
      -DKILN_ONEDNN=OFF >/dev/null
cmake --build $B -j"$(nproc)" >/dev/null
rm -rf .carry && mkdir -p .carry/bin .carry/lib
cp $B/kiln .carry/bin/
[ -x $B/kiln-gen ] && cp $B/kiln-gen .carry/bin/
for t in $B/tests/test_* $B/bench/bench_*; do [ -x "$t" ] && cp "$t" .carry/bin/; done
# non-glibc shared libraries of every binary
for b in .carry/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      *) cp -Ln "$lib" .carry/lib/ ;;
    esac
  done
done
strip --strip-debug .carry/bin/* 2>/dev/null || true
du -sh .carry
