#!/usr/bin/env bash
# The test command of the README: runs the `unit` label of the build in build/ (built by
# scripts/setup.sh), then, when clang is available, builds the libFuzzer targets in
# build-fuzz/ and runs their smoke tests (label `fuzz`: corpus replay + a short run).
#   scripts/test.sh            # unit + fuzz smoke
#   KILN_TEST_LABEL=slow scripts/test.sh   # another label (slow, gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
[ -x "$BUILD_DIR/kiln" ] || scripts/setup.sh
cmake --build "$BUILD_DIR" -j"$(nproc)" >/dev/null
label=${KILN_TEST_LABEL:-unit}
(cd "$BUILD_DIR" && ctest -L "^${label}\$" --output-on-failure -j"$(nproc)")
if [ "$label" = unit ] && [ -z "${KILN_SKIP_FUZZ:-}" ] && command -v clang >/dev/null && \
   ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKILN_FUZZ=ON -DKILN_CUDA=OFF \
        -DKILN_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-fuzz -j"$(nproc)" >/dev/null
  (cd build-fuzz && ctest -L '^fuzz$' --output-on-failure)
fi
