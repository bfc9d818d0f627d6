#!/usr/bin/env bash
# gpu-decode.sh — session 11's decode call (issue 17; docs/PERF_GPU.md "Session 11",
# gpu-decode): this tree and a baseline tree (BASE, e.g. main's commit unpacked from a
# carried `git archive`) built on the GPU machine, the gpu tests on this tree, then kiln
# bench side by side (alternating base / this tree per model) on kiln-gen models:
# Llama-3-8B shape in f16, q4_K_M, q4_0, q8_0 (-p 512 -n 128 -r 3) and the small models'
# shapes (gemma3-270m q4_K_M, smollm2-135m q4_1; -p 512 -n 128 -r 5), each switch of
# $AB_<type> (8B; VAR=VALUE ...) or $AB_small once more on this tree; bench_cuda's T16
# tables on both trees.
#
#   bash scripts/gpu-decode.sh BASE_DIR          (device run with carry [".carry"])
#
# Logs: one tarball in $OUT (a call returns at most 8 files); a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/kiln-gpu-out}
LOG=$OUT/logs; mkdir -p "$LOG"
M=/tmp/models; mkdir -p $M
export KILN_NO_PROGRESS=1
ROWS=() rc=0
source scripts/gpu-step.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
source scripts/gpu-env.sh
cfg() { cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}"; }
cfg "$PWD" >"$LOG/configure.log" 2>&1 || { echo "configure failed"; tail -20 "$LOG/configure.log"; }
step build 600 cmake --build build-gpu -j"$(nproc)" --target kiln-bin kiln-gen test_cuda_kernels \
  test_cuda_e2e bench_cuda
# the baseline builds while the tests and the model generation run (no benchmark overlaps it)
(cfg "$BASE" && cmake --build "$BASE/build-gpu" -j"$(nproc)" --target kiln-bin bench_cuda) \
  >"$LOG/build-base.log" 2>&1 &
BP=$!
N=$PWD/build-gpu
E=/tmp/kiln-e2e; mkdir -p $E
for f in llama qwen2 qwen3 gemma3; do
  for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
    echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"
  done
done | xargs -P 8 -L 1 $N/kiln-gen -q --threads 2 >"$LOG/gen.log" 2>&1
step test_cuda_kernels 300 $N/tests/test_cuda_kernels
step test_cuda_e2e 300 env KILN_E2E_DIR=$E $N/tests/test_cuda_e2e
gen() { [ -f "$M/$1-$2.gguf" ] || $N/kiln-gen -q -p "$1" -t "$2" -o "$M/$1-$2.gguf" >>"$LOG/gen.log" 2>&1; }
for t in ${TYPES_8B:-f16 q4_K_M q4_0 q8_0}; do gen llama3-8b $t; done
gen gemma3-270m q4_K_M; gen smollm2-135m q4_1
wait $BP; ROWS+=("$(printf '%-34s %-8s' build-base "$(tail -1 "$LOG/build-base.log" | cut -c1-40)")")
B=$BASE/build-gpu
kb() { # name, binary dir, model, args... (+ env from KB_ENV)
  local name=$1 dir=$2 f=$3; shift 3
  step "$name" 300 env $KB_ENV $dir/kiln bench -m "$f" --backend cuda "$@"
}
for t in ${TYPES_8B:-f16 q4_K_M q4_0 q8_0}; do
  f=$M/llama3-8b-$t.gguf
  KB_ENV= kb "8b-$t-base" $B "$f" -p 512 -n 128 -r 3
  KB_ENV= kb "8b-$t-new" $N "$f" -p 512 -n 128 -r 3
  v=AB_$t
  for ab in ${!v:-}; do KB_ENV=$ab kb "8b-$t-new-${ab%%=*}" $N "$f" -p 512 -n 128 -r 3; done
  KB_ENV= kb "8b-$t-base2" $B "$f" -p 512 -n 128 -r 3
done
for f in $M/gemma3-270m-q4_K_M.gguf $M/smollm2-135m-q4_1.gguf; do
  n=$(basename "$f" .gguf)
  KB_ENV= kb "$n-base" $B "$f" -p 512 -n 128 -r 5
  KB_ENV= kb "$n-new" $N "$f" -p 512 -n 128 -r 5
  for ab in ${AB_small:-}; do KB_ENV=$ab kb "$n-new-${ab%%=*}" $N "$f" -p 512 -n 128 -r 5; done
  KB_ENV= kb "$n-base2" $B "$f" -p 512 -n 128 -r 5
done
step bench_cuda-new 300 $N/bench/bench_cuda --t16-only --dtypes ${BENCH_TYPES:-f16,q4_k_m} --reps 10
step bench_cuda-base 300 $B/bench/bench_cuda --t16-only --dtypes ${BENCH_BASE_TYPES:-q4_k_m} --reps 10
echo
grep -h "FAILED\|PASSED\|SKIP" "$LOG"/test_*.log 2>/dev/null | tail -6
for f in "$LOG"/bench_cuda-*.log; do
  echo "== $(basename "$f" .log)"
  grep -E "engine's groups|^\| (f16|q4_k_m|q4_0|q8_0) " "$f" | tail -14
done
for f in "$LOG"/8b-*.log "$LOG"/gemma*.log "$LOG"/smollm*.log; do
  [ -f "$f" ] || continue
  printf '%-40s %s\n' "$(basename "$f" .log)" "$(grep -E '\| (pp|tg)[0-9]' "$f" | awk -F'|' '{printf "%s %s  ", $5, $6}')"
done
printf '%s\n' "${ROWS[@]}"
tar czf "$OUT/logs-decode.tgz" -C "$LOG" . 2>/dev/null && rm -rf "$LOG"
exit $rc
