#!/usr/bin/env bash
# gpu-tp.sh — on a lent multi-GPU machine: build kiln with CUDA + NCCL and run the tensor-
# parallel gpu test (tests/gpu/test_tp_nccl.c; docs/TP.md). NVLink multicast stays off.
# kiln's C dependencies come from Debian packages in .carry/deps/ when the image lacks them
# (here: mkdir -p .carry/deps && cd .carry/deps && apt-get download <the list in
# scripts/gpu-pack.sh>), then a device run with carry [".carry"]:
#   bash scripts/gpu-tp.sh        (results in $OUT/tp.txt when $OUT is set)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp}
JOBS=$(nproc)
exec > >(tee "$OUT/tp.txt") 2>&1
nvidia-smi -L
DEPS=()
if ! pkg-config --exists jansson 2>/dev/null && [ -d .carry/deps ]; then
  K=/tmp/kdeps L=/tmp/kdeps/usr/lib/x86_64-linux-gnu
  mkdir -p $K/bin
  for f in .carry/deps/*.deb; do dpkg -x "$f" $K; done
  sed -i '/^Requires.private/d' $L/pkgconfig/*.pc
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$L" "$K/usr/bin/pkgconf" >$K/bin/pkg-config
  chmod +x $K/bin/pkg-config
  export PKG_CONFIG_SYSROOT_DIR=$K PKG_CONFIG_LIBDIR=$L/pkgconfig:$K/usr/share/pkgconfig
  DEPS=(-DPKG_CONFIG_EXECUTABLE=$K/bin/pkg-config -DCMAKE_BUILD_RPATH=$L
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -Wl,-rpath-link,$L")
fi
# NCCL: the toolkit's, else the one PyTorch ships
NH=$(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -1)
[ -n "$NH" ] || NH=$(find /usr /opt -name nccl.h -path '*include*' 2>/dev/null | head -1)
NL=$(ls /usr/local/cuda/lib*/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
[ -n "$NL" ] || NL=$(find /usr /opt -name 'libnccl.so*' 2>/dev/null | head -1)
echo "nccl.h: ${NH:-none}  libnccl: ${NL:-none}"
NCCL=()
[ -n "$NH" ] && [ -n "$NL" ] && NCCL=(-DKILN_NCCL_INCLUDE="$(dirname "$NH")" -DKILN_NCCL_LIB="$NL")
[ -n "$NL" ] && export LD_LIBRARY_PATH=$(dirname "$NL"):${LD_LIBRARY_PATH:-}
cmake -S . -B build-gpu-tp -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 \
  -DKILN_ONEDNN=OFF -DKILN_OPENBLAS=OFF "${DEPS[@]}" "${NCCL[@]}" | grep -E "NCCL|CUDA|Error"
time cmake --build build-gpu-tp -j"$JOBS" --target test_tp_nccl kiln-gen 2>&1 | grep -E "error|warning|Built target" 
KILN_BINARY_DIR=$PWD/build-gpu-tp ./build-gpu-tp/tests/test_tp_nccl
echo "test_tp_nccl exit $?"
