#!/usr/bin/env bash
# gpu-pf.sh — session 18's decode calls (issue 17): this tree against a base commit on the
# T16 / f16-row gemvs at one token (session 18: the GLU fused into gate / up,
# KILN_CUDA_GLU_FUSE; tried and dropped: an L2 prefetch distance, the B fragments through
# shared memory, docs/CUDA.md). Builds kiln on the GPU machine (and, with `base`, the tree in .carry/base.tgz, a `git
# archive` of the commit to compare against, in the background), runs the GPU kernel tests,
# test_cuda_e2e on tiny models, bench_cuda's T16 tables and kiln bench on kiln-gen
# Llama-3-8B files, alternating the runs of $RUNS per file. A summary last.
#
#   bash scripts/gpu-pf.sh [base] [tests] [e2e] [bench]   (carry [".carry/deps", ...])
#   env: TYPES_8B (default "q4_0 q4_K_M"), BENCH_TYPES (default q4_0,q4_k_m),
#        RUNS (default "base new base new": `base`, `new` or `new:VAR=VALUE`)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-common.sh
step build 600 cmake --build $B -j"$(nproc)" --target kiln-bin kiln-gen bench_cuda test_cuda_kernels \
  test_cuda_e2e || grep -E "error" "$LOG/build.log" | head
N=$PWD/$B
if [[ " $* " == *" base "* ]]; then
  ( rm -rf /tmp/base && mkdir -p /tmp/base && tar xzf .carry/base.tgz -C /tmp/base &&
    cmake -S /tmp/base -B /tmp/base/$B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
      -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}" &&
    cmake --build /tmp/base/$B -j8 --target kiln-bin bench_cuda ) >"$LOG/build-base.log" 2>&1 &
  BP=$!
fi
gen() { [ -f "$M/$1-$2.gguf" ] || $N/kiln-gen -q -p "$1" -t "$2" -o "$M/$1-$2.gguf"; }
( for t in ${TYPES_8B:-q4_0 q4_K_M}; do gen llama3-8b $t; done ) >"$LOG/gen.log" 2>&1 &
GP=$!
for s in "$@"; do
  case $s in
    tests)
      step test_cuda_kernels 300 $N/tests/test_cuda_kernels ;;
    e2e)
      E=/tmp/kiln-e2e; mkdir -p $E
      for f in llama qwen3 gemma3; do for t in f16 q8_0 q4_0 q4_K q6_K; do
        echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"; done; done |
        xargs -P 8 -L 1 $N/kiln-gen -q --threads 2 >"$LOG/gen-e2e.log" 2>&1
      step test_cuda_e2e 300 env KILN_E2E_DIR=$E $N/tests/test_cuda_e2e ;;
    bench)
      step bench_cuda 480 $N/bench/bench_cuda --t16-only --dtypes ${BENCH_TYPES:-q4_0,q4_k_m} --reps 10 ;;
  esac
done
wait $GP
[ -n "${BP:-}" ] && { wait $BP; ROWS+=("$(printf '%-30s %s' build-base "$(tail -1 "$LOG/build-base.log" | cut -c1-50)")"); }
for t in ${TYPES_8B:-q4_0 q4_K_M}; do
  i=0
  for r in ${RUNS:-base new base new}; do
    i=$((i + 1))
    d=$N; [ "${r%%:*}" = base ] && d=/tmp/base/$B
    e=; [[ $r == *:* ]] && e=${r#*:}
    step "8b-$t-$i-${r//[:=]/-}" 240 env $e $d/kiln bench -m $M/llama3-8b-$t.gguf \
      --backend cuda -p 512 -n 128 -r 3
  done
done
[ -n "${BP:-}" ] && [[ " $* " == *" bench "* ]] &&
  step bench_cuda-base 300 /tmp/base/$B/bench/bench_cuda --t16-only --dtypes ${BENCH_TYPES:-q4_0,q4_k_m} --reps 10
echo
grep -h "FAILED\|PASSED\|SKIP\|passed\|failed" "$LOG"/test_*.log 2>/dev/null | tail -8
grep -h "prefetch\|fusion on + PDL\|part " "$LOG"/bench_cuda.log 2>/dev/null
grep -h "fusion on + PDL\|part " "$LOG"/bench_cuda-base.log 2>/dev/null | sed 's/^/base: /'
for f in "$LOG"/8b-*.log; do
  printf '%-34s %s\n' "$(basename "$f" .log)" "$(awk -F'|' '/pp512|tg128/{printf "%s %s  ", $5, $6}' "$f")"
done
printf '%s\n' "${ROWS[@]}"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
exit ${rc:-0}
