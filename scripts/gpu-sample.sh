#!/usr/bin/env bash
# gpu-sample.sh — sampling on the GPU (issue 17, session 10) in one device call: builds the
# targets it needs (sm_90), then, most important first, each step's output in $OUT/<step>.log:
#   tests   test_sample_device (ref.sample vs the CPU chain) and test_cuda_sample
#           (cuda.sample vs ref.sample and the CPU chain, repeatability, kiln_generate on
#           cuda with device sampling == host sampling == the cpu backend)
#   chain   bench_cuda_sample 128256 262144: the kernel per step for 1 / 16 / 64 rows, next
#           to the host path (copy of the logits + kiln_sample_batch on one thread)
#   run8b   8B q4_0 (kiln-gen -p llama3-8b -t q4_0): kiln run --backend cuda -n 256
#           --ignore-eos, default sampling (the device samples) / --temp 0 (fused argmax) /
#           default sampling with KILN_HOST_SAMPLING=1 (logits copied, host chain),
#           alternating, $RUNS times (default 3); the generated tok/s lines in run8b.txt
#   sched   bench_sched --mode overhead on the 8B (64 requests through the scheduler,
#           greedy and sampled: the sampled rows go through the device's sampled steps)
#   bash scripts/gpu-sample.sh [STEP...]    (default: tests chain run8b sched)
# Unpack the tree into a fresh directory on the device (a warm machine may hold another
# helper's /tmp/w with a newer build-gpu, which make would take as up to date), e.g.
#   rm -rf /tmp/gsw && mkdir /tmp/gsw && tar xzf .carry/h-NAME/src.tgz -C /tmp/gsw && \
#   cp -r .carry /tmp/gsw/ && cd /tmp/gsw && OUT=$OUT bash scripts/gpu-sample.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
STEPS=${*:-tests chain run8b sched}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
source scripts/gpu-env.sh
B=build-gpu
T0=$SECONDS
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 \
  -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}" >"$OUT/build.log" 2>&1
cmake --build $B -j"$(nproc)" --target kiln-bin kiln-gen test_sample_device test_cuda_sample \
  bench_cuda_sample bench_sched >>"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "build: $((SECONDS - T0)) s"
export PATH=$PWD/$B:$PWD/$B/bench:$PWD/$B/tests:$PATH KILN_NO_PROGRESS=1
M=/tmp/m8-q4_0.gguf
case " $STEPS " in *" run8b "* | *" sched "*) (kiln-gen -q -p llama3-8b -t q4_0 -o $M.tmp && mv $M.tmp $M) >"$OUT/gen.log" 2>&1 & ;; esac
for s in $STEPS; do
  t0=$SECONDS
  case $s in
    tests)
      (cd $B && timeout 170 ctest -R '^(test_sample_device|test_cuda_sample)$' -V) >"$OUT/tests.log" 2>&1
      echo "tests: rc $? $((SECONDS - t0)) s"; grep -E "mismatch|steps on|rows|tokens equal|generate:|part at|PASSED|FAILED|tests passed|Passed|Failed" "$OUT/tests.log" | head -40 ;;
    chain)
      timeout 120 bench_cuda_sample 128256 262144 >"$OUT/chain.log" 2>&1
      echo "chain: rc $? $((SECONDS - t0)) s"; cat "$OUT/chain.log" ;;
    run8b)
      wait
      [ -f $M ] || { echo "run8b: no model"; cat "$OUT/gen.log"; continue; }
      cat $M >/dev/null
      : >"$OUT/run8b.txt"
      P="Write a long story about a dragon who learns to bake bread."
      for r in $(seq 1 "${RUNS:-3}"); do
        for mode in sampled greedy host; do
          case $mode in
            sampled) a=(); e=() ;;
            greedy) a=(--temp 0); e=() ;;
            host) a=(); e=(KILN_HOST_SAMPLING=1) ;;
          esac
          l=$(env "${e[@]}" timeout 60 kiln run -m $M --backend cuda -p "$P" -n 256 --ignore-eos -s 1 \
            "${a[@]}" 2>&1 >/dev/null | grep "kiln run:")
          echo "$mode $r $l" | tee -a "$OUT/run8b.txt"
        done
      done ;;
    sched)
      wait
      [ -f $M ] && timeout 60 bench_sched -m $M -b cuda --mode overhead >"$OUT/sched.log" 2>&1
      echo "sched: rc $? $((SECONDS - t0)) s"; tail -12 "$OUT/sched.log" ;;
  esac
done
echo "total: $((SECONDS - T0)) s"
