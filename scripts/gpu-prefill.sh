#!/usr/bin/env bash
# gpu-prefill.sh — session 11's device call for the prefill path (issue 17): build kiln on
# the lent GPU machine from a copy of the tree, the kernel tests of the coalesced T16
# dequantization (test_cuda_prefill: bitwise vs the old kernel and the host) and of the
# flash attention (test_cuda_attention test_attention_flash, and test_attention), then
# `kiln bench -p 512 -n 128 -r 3` on the 8B q4_0 / q8_0 / f16 with the new path and the old
# one in the same call (old: KILN_CUDA_OLD_DQ=1 KILN_CUDA_FLASH=0), nsys per-kernel stats of
# one pp512 (q4_0), the e2e test last. A failing flash test turns the flash kernel off for
# the benchmarks (KILN_CUDA_FLASH=0, written to fallback.txt). Stops starting steps after
# $LIMIT seconds (default 450). Logs: one tarball in $OUT. Extract the tree into a directory of
# your own (not /tmp/w): a warm machine is shared by the team, and make keeps newer objects
# built from another tree (session 11 run 2).
#
#   bash scripts/gpu-prefill.sh [STEP...]   (default: kern bench prof e2e sanitize)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
LOG=/tmp/prefill-logs/logs # tarred into $OUT after every step (a killed call keeps its logs)
mkdir -p "$LOG" "$OUT" /tmp/models
LIMIT=${LIMIT:-450}
STEPS=${*:-kern bench prof e2e sanitize}
export KILN_NO_PROGRESS=1 KILN_SOURCE_DIR=$PWD
ROWS=()
rc=0
source scripts/gpu-step.sh
after_step() { # the summary and the logs so far into $OUT (a killed call keeps them)
  printf '%s\n' "${ROWS[@]}" >"$LOG/summary.txt"
  tar czf "$OUT/logs.tgz" -C /tmp/prefill-logs logs
}
STEP_AFTER=after_step
has() { [[ " $STEPS " == *" $1 "* ]]; }
finish() {
  printf '%s\n' "${ROWS[@]}" | tee "$LOG/summary.txt"
  tar czf "$OUT/logs.tgz" -C /tmp/prefill-logs logs
}
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
git log --oneline -1 >"$LOG/commit.txt" 2>/dev/null || true
source scripts/gpu-env.sh >/dev/null
B=build-gpu
step configure 300 cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}"
step build 400 cmake --build $B -j"$(nproc)" --target kiln-bin kiln-gen test_cuda_kernels test_cuda_attention \
  test_cuda_prefill test_cuda_e2e || { grep -E "error" "$LOG/build.log" | head -30; exit 1; }
export PATH=$PWD/$B:$PWD/$B/bench:$PWD/$B/tests:$PATH
M=/tmp/models
TYPES=${KILN_8B_TYPES:-q4_0 q8_0 f16}
(for t in $TYPES; do kiln-gen -q -p llama3-8b -t $t -o $M/$t.gguf; done) >"$LOG/gen8b.log" 2>&1 &
GEN=$!
if has kern; then
  step kern-dequant 120 test_cuda_prefill
  if ! step kern-flash 200 env KILN_TEST_FILTER=test_attention_flash test_cuda_attention; then
    if grep -q "ldmatrix)\?: rel err\|ldmatrix: a second" "$LOG/kern-flash.log"; then
      export KILN_CUDA_FA_LDSM=0
      echo "kern-flash failed (ldmatrix): KILN_CUDA_FA_LDSM=0 for the rest" | tee "$LOG/fallback.txt"
    else
      export KILN_CUDA_FLASH=0
      echo "kern-flash failed: KILN_CUDA_FLASH=0 for the rest" | tee "$LOG/fallback.txt"
    fi
  fi
  step kern-attn 200 env KILN_TEST_FILTER=test_attention test_cuda_attention
fi
wait $GEN
OLD="KILN_CUDA_OLD_DQ=1 KILN_CUDA_FLASH=0"
if has bench; then
  for t in $TYPES; do
    step "pp-$t-new" 120 kiln bench -m $M/$t.gguf --backend cuda -p 512 -n 128 -r 3
    step "pp-$t-old" 120 env $OLD kiln bench -m $M/$t.gguf --backend cuda -p 512 -n 128 -r 3
  done
  # one change at a time (q4_0): the dequantization's plain stores (variant 1), the flash
  # kernel's plain shared loads, no flash kernel
  step pp-q4_0-dqv1 120 env KILN_CUDA_DQ_V=1 kiln bench -m $M/q4_0.gguf --backend cuda \
    -p 512 -n 0 -r 3
  step pp-q4_0-fa-plain 120 env KILN_CUDA_FA_LDSM=0 kiln bench -m $M/q4_0.gguf --backend cuda \
    -p 512 -n 0 -r 3
  step pp-q4_0-flashoff 120 env KILN_CUDA_FLASH=0 kiln bench -m $M/q4_0.gguf --backend cuda \
    -p 512 -n 0 -r 3
  step pp-q8_0-dqv1 120 env KILN_CUDA_DQ_V=1 kiln bench -m $M/q8_0.gguf --backend cuda \
    -p 512 -n 0 -r 3
  step pp-q4_0-new-2 120 kiln bench -m $M/q4_0.gguf --backend cuda -p 512 -n 128 -r 3
  step pp-q4_0-old-2 120 env $OLD kiln bench -m $M/q4_0.gguf --backend cuda -p 512 -n 128 -r 3
fi
if has prof; then
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
    /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  echo "nsys: ${NSYS:-none}" >"$LOG/prof-tool.txt"
  if [ -n "$NSYS" ]; then
    step nsys-pp-new 120 "$NSYS" profile -t cuda --stats=true -f true -o /tmp/pp-new \
      kiln bench -m $M/q4_0.gguf --backend cuda -p 512 -n 0 -r 1
    step nsys-pp-old 120 env $OLD "$NSYS" profile -t cuda --stats=true -f true -o /tmp/pp-old \
      kiln bench -m $M/q4_0.gguf --backend cuda -p 512 -n 0 -r 1
  else
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    echo "ncu: ${NCU:-none}" >>"$LOG/prof-tool.txt"
    [ -n "$NCU" ] && step ncu-pp-new 150 "$NCU" --metrics gpu__time_duration.sum \
      --cache-control none --clock-control none --csv kiln bench -m $M/q4_0.gguf --backend cuda \
      -p 512 -n 0 -r 1
  fi
fi
if has e2e; then
  E=/tmp/kiln-e2e
  mkdir -p $E
  for f in llama qwen2 qwen3 gemma3; do
    for t in f32 f16 q8_0 q4_0 q4_K q6_K; do echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"; done
  done | xargs -P 8 -L 1 kiln-gen -q --threads 2 >"$LOG/gen-tiny.log" 2>&1
  kiln-gen -q -p llama-110m -t q4_0 -o $E/llama-110m-q4_0.gguf >>"$LOG/gen-tiny.log" 2>&1
  step e2e 200 env KILN_E2E_DIR=$E test_cuda_e2e
  step e2e-flashoff 200 env KILN_E2E_DIR=$E KILN_CUDA_FLASH=0 test_cuda_e2e
fi
if has sanitize; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  step racecheck-flash 150 env KILN_TEST_FILTER=test_attention_flash "$CS" --tool racecheck \
    test_cuda_attention
  step memcheck-flash 150 env KILN_TEST_FILTER=test_attention_flash "$CS" --tool memcheck \
    test_cuda_attention
  step memcheck-dequant 150 "$CS" --tool memcheck test_cuda_prefill
fi
