# gpu-env.sh — sourced by the gpu-*.sh scripts on the lent GPU machine before they build kiln
# there: NVLink multicast off (the device docs require it in every program's environment),
# kiln's C dependencies from carried Debian packages when the image lacks them (DEPS_DIR,
# default .carry/deps; fill it here with `scripts/gpu-pack.sh --deps .carry/deps`), and NCCL
# (the toolkit's, else the one PyTorch ships). Sets the array KILN_CMAKE_ARGS for
# `cmake -S . -B ...` and exports LD_LIBRARY_PATH for NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
KILN_CMAKE_ARGS=()
_deps=${DEPS_DIR:-.carry/deps}
if ! pkg-config --exists jansson 2>/dev/null && [ -d "$_deps" ]; then
  _k=/tmp/kdeps _l=/tmp/kdeps/usr/lib/x86_64-linux-gnu
  mkdir -p $_k/bin
  for f in "$_deps"/*.deb; do dpkg -x "$f" $_k; done
  # shared linking only: private requirements (gnutls for libmicrohttpd) are not carried
  sed -i '/^Requires.private/d' $_l/pkgconfig/*.pc
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$_l" "$_k/usr/bin/pkgconf" >$_k/bin/pkg-config
  chmod +x $_k/bin/pkg-config
  export PKG_CONFIG_SYSROOT_DIR=$_k PKG_CONFIG_LIBDIR=$_l/pkgconfig:$_k/usr/share/pkgconfig
  # the libraries are found through the binaries' RPATH (not LD_LIBRARY_PATH: the image's
  # own tools keep theirs)
  KILN_CMAKE_ARGS+=(-DPKG_CONFIG_EXECUTABLE=$_k/bin/pkg-config -DCMAKE_BUILD_RPATH=$_l
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -Wl,-rpath-link,$_l")
fi
_nh=$(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -1)
[ -n "$_nh" ] || _nh=$(find /usr /opt -name nccl.h -path '*include*' 2>/dev/null | head -1)
_nl=$(ls /usr/local/cuda/lib*/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
[ -n "$_nl" ] || _nl=$(find /usr /opt -name 'libnccl.so*' 2>/dev/null | head -1)
echo "nccl.h: ${_nh:-none}  libnccl: ${_nl:-none}"
if [ -n "$_nh" ] && [ -n "$_nl" ]; then
  KILN_CMAKE_ARGS+=(-DKILN_NCCL_INCLUDE="$(dirname "$_nh")" -DKILN_NCCL_LIB="$_nl")
  export LD_LIBRARY_PATH=$(dirname "$_nl"):${LD_LIBRARY_PATH:-}
fi
