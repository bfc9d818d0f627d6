#!/usr/bin/env bash
# gpu-e2e.sh — the cuda backend end to end on the lent GPU machine (issue 17), in one call.
# Here: scripts/gpu-e2e.sh pack DIR   builds build-gpu (CUDA on, sm_90, no OpenBLAS/oneDNN)
#       and packs kiln, kiln-gen, the gpu tests, bench_cuda and the shared libraries a bare
#       CUDA image lacks (not the CUDA libraries: the image has them) into DIR.
# There: bash DIR/gpu-e2e.sh run [SRC]  (SRC: the checkout, for tests/data; default .)
#   1. test_cuda_backend; kiln-gen: tiny models of every family x weight type,
#      llama-110m in 4 types, gemma3-270m q4_K, into /tmp/kiln-e2e; test_cuda_e2e on them
#      (teacher forcing vs ref / cpu, batch invariance);
#   2. `kiln run --backend cuda` (default sampling) and `kiln bench --backend cuda` on
#      Llama-3-8B-shaped models (q4_0, q8_0, f16; generated there), bench_cuda's device
#      read bandwidth for the decode bound;
#   3. test_cuda_kernels and test_cuda_attention (kernels vs ref), compute-sanitizer memcheck on one model's e2e.
# Most important first: a call that runs out of time still returns the first steps.
# Logs go to $OUT (else /tmp/kiln-gpu-out); a short table is printed last.
set -uo pipefail
mode=${1:-run}
if [ "$mode" = pack ]; then
  D=${2:?pack DIR}
  cd "$(dirname "$0")/.."
  B=${B:-build-gpu}
  if [ -z "${NO_BUILD:-}" ]; then
    cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 \
      -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF >/dev/null || exit 1
    cmake --build $B -j2 --target kiln-bin kiln-gen test_cuda_e2e test_cuda_kernels \
      test_cuda_attention test_cuda_backend bench_cuda bench_sched >/dev/null || exit 1
  fi
  rm -rf "$D"
  scripts/gpu-pack.sh --bins "$D" $B/kiln $B/kiln-gen $B/tests/test_cuda_e2e $B/tests/test_cuda_kernels \
    $B/tests/test_cuda_attention $B/tests/test_cuda_backend $B/bench/bench_cuda $B/bench/bench_sched || exit 1
  cp scripts/gpu-e2e.sh "$D/"
  du -sh "$D"
  exit 0
fi
D=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "${2:-.}" && pwd)
OUT=${OUT:-/tmp/kiln-gpu-out}; mkdir -p "$OUT"
export PATH=$D/bin:$PATH KILN_NO_PROGRESS=1 KILN_SOURCE_DIR=$SRC NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd "$D/bin/kiln" | grep -q "not found"; then # the CUDA libraries of the image
  for l in $(ldd "$D/bin/kiln" | awk '/not found/{print $1}'); do
    f=$(find / -xdev -name "$l" 2>/dev/null | head -1)
    [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f")
  done
  export LD_LIBRARY_PATH
fi
ldd "$D/bin/kiln" | grep "not found"
ROWS=() rc=0
step() { # name, timeout, command... (output in $OUT/name.log)
  local name=$1 to=$2; shift 2
  local t0=$SECONDS
  timeout "$to" "$@" >"$OUT/$name.log" 2>&1
  local r=$?
  ROWS+=("$(printf '%-22s %-8s %4ss' "$name" "$([ $r = 0 ] && echo ok || echo "FAIL:$r")" \
    "$((SECONDS - t0))")")
  [ $r = 0 ] || rc=1
  return $r
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
M=/tmp/kiln-e2e; mkdir -p $M
# models: small ones in the background while the kernel tests run
(
  for f in llama qwen2 qwen3 gemma3; do
    for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
      echo "-p tiny -f $f -t $t -o $M/tiny-$f-$t.gguf"
    done
  done
  for t in f16 q8_0 q4_0 q4_K; do echo "-p llama-110m -t $t -o $M/llama-110m-$t.gguf"; done
  echo "-p gemma3-270m -t q4_K -o $M/gemma3-270m-q4_K.gguf"
) | xargs -P 8 -L 1 kiln-gen -q --threads 2 >"$OUT/gen.log" 2>&1 &
GEN=$!
step test_cuda_backend 60 test_cuda_backend
wait $GEN; echo "gen rc=$?" >>"$OUT/gen.log"
step test_cuda_e2e 240 env KILN_E2E_DIR=$M test_cuda_e2e
step run_cuda 60 kiln run -m $M/llama-110m-q4_0.gguf -p "Once upon a time" -n 64 --backend cuda \
  --load-report
# Llama-3-8B-shaped models: decode / prompt speed on the device
B8=/tmp/kiln-8b; mkdir -p $B8
step bandwidth 90 bench_cuda --dtypes f16,q8_0,q4_0 --layers 32 --reps 10
for t in ${KILN_8B_TYPES:-q4_0 q8_0 f16}; do
  step gen8b-$t 120 kiln-gen -q -p llama3-8b -t $t -o $B8/llama3-8b-$t.gguf || continue
  step bench8b-$t 120 kiln bench -m $B8/llama3-8b-$t.gguf --backend cuda -p 512 -n 128 -r 3
  # A/B in the same call: the same bench with step graphs off (runtime/graph.h)
  step bench8b-$t-nographs 120 env KILN_GRAPHS=0 kiln bench -m $B8/llama3-8b-$t.gguf \
    --backend cuda -p 512 -n 128 -r 3
  if [ $t = q4_0 ]; then # the scheduler on the GPU engine (issue 12): batched decode, TTFT
    step sched-decode 120 bench_sched -m $B8/llama3-8b-$t.gguf -b cuda --mode decode \
      --npl 1,4,16,64 --pp 128 --tg 128
    step sched-ttft 90 bench_sched -m $B8/llama3-8b-$t.gguf -b cuda --mode ttft --reps 5
  fi
  rm -f $B8/llama3-8b-$t.gguf
done
step test_cuda_kernels 150 test_cuda_kernels
step test_cuda_attention 150 test_cuda_attention
step memcheck_e2e 150 env KILN_E2E_TOKENS=64 compute-sanitizer --tool memcheck --error-exitcode 9 \
  test_cuda_e2e $M/tiny-gemma3-q4_K.gguf
echo
grep -h "FAIL\|PASSED\|FAILED\|SKIP" "$OUT"/test_cuda_e2e.log | tail -30
grep -h "ERROR SUMMARY" "$OUT"/memcheck_e2e.log
for f in "$OUT"/bench8b-*.log; do echo "$(basename $f .log):"; grep -h "tg128\|pp512" $f; done
tail -8 "$OUT"/sched-decode.log "$OUT"/sched-ttft.log
grep -h "^bandwidth\|read" "$OUT"/bandwidth.log | head -4
tail -2 "$OUT"/run_cuda.log
echo "gpu: $(cat "$OUT/gpu.txt")"
printf '%s\n' "${ROWS[@]}"
# every log in one file (the device tool returns at most 8 files)
tar czf /tmp/logs.tgz -C "$OUT" . && rm -f "$OUT"/*.log "$OUT"/gpu.txt && mv /tmp/logs.tgz "$OUT/"
exit $rc
