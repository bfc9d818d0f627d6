#!/usr/bin/env bash
# gpu-check.sh — one command on the lent GPU machine: kiln's binaries (carried in .carry/
# by `scripts/gpu-pack.sh`, or built here from source with the Debian packages that
# `scripts/gpu-pack.sh --source DEST` put in .deps/), `kiln doctor`, the test binaries
# (unit + gpu), compute-sanitizer memcheck and racecheck on the gpu tests, bench_cuda, and
# the steps named in $KILN_GPU_STEPS (space-separated: gen8b load). A short table last.
# Logs go to $OUT (when set, else /tmp/kiln-gpu-out).
#
#   [KILN_GPU_STEPS="gen8b load"] scripts/gpu-check.sh [--no-bench] [--no-sanitizer]
#       [--no-unit] [--arch 90] [--jobs N]
#
# Exit status 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ARCH=90 JOBS=$(nproc) BENCH=1 SAN=1 UNIT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) BENCH=0 ;;
    --no-sanitizer) SAN=0 ;;
    --no-unit) UNIT=0 ;;
    --arch) ARCH=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    *) echo "usage: $0 [--no-bench] [--no-sanitizer] [--no-unit] [--arch SM] [--jobs N]" >&2
       exit 2 ;;
  esac
  shift
done
export KILN_SOURCE_DIR=$PWD KILN_SHARED_DIR=$PWD/tests/data/shared KILN_NO_PROGRESS=1
OUT=${OUT:-/tmp/kiln-gpu-out}; mkdir -p "$OUT"
ROWS=()
rc=0
step() { # name, command... (output in $OUT/name.log)
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local r=$?
  ROWS+=("$(printf '%-26s %-8s %4ss' "$name" "$([ $r = 0 ] && echo ok || echo "FAIL:$r")" \
    "$((SECONDS - t0))")")
  [ $r = 0 ] || rc=1
  return $r
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
  >"$OUT/gpu.txt" 2>&1

if [ -x .carry/bin/kiln ]; then
  # binaries built by gpu-pack.sh on the development machine
  export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
  BIN=$PWD/.carry/bin TESTS=$PWD/.carry/bin
else
  # build here; kiln's C dependencies from carried Debian packages when missing, the
  # libraries found through the binaries' RPATH (not LD_LIBRARY_PATH: the image's own
  # tools keep their libraries)
  DEPS_DIR=.deps source scripts/gpu-env.sh
  step configure cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_ARCHITECTURES="$ARCH" \
    -DKILN_ONEDNN=OFF -DKILN_OPENBLAS=OFF "${KILN_CMAKE_ARGS[@]}"
  step build cmake --build build -j"$JOBS"
  BIN=$PWD/build TESTS=$PWD/build/tests
  mkdir -p build/bin && cp -f build/bench/bench_* build/bin/ 2>/dev/null
fi
export PATH=$BIN:$BIN/bin:$PATH

step doctor "$BIN/kiln" doctor
for t in "$TESTS"/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ $UNIT = 0 ]; then case $name in test_cuda_*) ;; *) continue ;; esac; fi
  step "$name" "$t"
done
if [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null && [ -x "$TESTS/test_cuda_kernels" ]; then
  step memcheck timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$TESTS/test_cuda_kernels"
  step racecheck timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$TESTS/test_cuda_kernels"
  step memcheck-attention timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$TESTS/test_cuda_attention"
  step racecheck-attention timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$TESTS/test_cuda_attention"
fi
[ $BENCH = 1 ] && step bench_cuda timeout 300 bench_cuda
for s in ${KILN_GPU_STEPS:-}; do
  case $s in
    gen8b)
      mkdir -p /tmp/models
      step gen8b kiln-gen --preset llama3-8b --type q4_0 -o /tmp/models/llama3-8b-q4_0.gguf ;;
    load)
      step load bench_load --file /tmp/models/llama3-8b-q4_0.gguf --cuda 0 --reps 3 --threads 16 ;;
    *) echo "unknown step $s"; rc=1 ;;
  esac
done

echo
grep -h "rel err\|FAILED\|PASSED\|SKIP" "$OUT"/test_cuda_kernels.log 2>/dev/null | tail -6
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/memcheck.log "$OUT"/racecheck.log 2>/dev/null
[ -f "$OUT/bench_cuda.log" ] && sed -n '/^bandwidth/p;/^Llama-3-8B/,$p' "$OUT/bench_cuda.log"
echo "gpu: $(cat "$OUT/gpu.txt")"
printf '%s\n' "${ROWS[@]}"
exit $rc
