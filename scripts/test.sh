#!/usr/bin/env bash
# The test command of the README: runs the `unit` label of the build in build/ (built by
# scripts/setup.sh), then, when clang is available, builds build-fuzz/ (clang, ASan +
# UBSan + libFuzzer instrumentation) and runs there (1) the `unit` label again — the
# sanitizer build of the unit tests: any ASan/LSan/UBSan report fails the test — and
# (2) the fuzz targets' smoke tests (label `fuzz`: corpus replay + KILN_FUZZ_SECONDS,
# default 5, of fuzzing each). KILN_SKIP_ASAN=1 skips (1). Long fuzz runs:
# tests/fuzz/run_long.sh (docs/RELIABILITY.md).
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
  if [ -z "${KILN_SKIP_ASAN:-}" ]; then
    # format_check is not about the build (it ran above); test_serve_web drives a headless
    # chromium against the page (~100 s under ASan, the browser's time): the server side it
    # uses (the static page, the chat API) runs under ASan in test_serve_http / _openai
    (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0 \
       UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       LSAN_OPTIONS=suppressions="$PWD/../tests/fuzz/lsan.supp" \
       ctest -L '^unit$' -E '^(format_check|test_serve_web)$' --output-on-failure -j"$(nproc)")
  fi
  (cd build-fuzz && KILN_FUZZ_SECONDS=${KILN_FUZZ_SECONDS:-5} ctest -L '^fuzz$' --output-on-failure)
fi
