#!/usr/bin/env bash
# gpu-round.sh — one device call's worth of GPU work, built there from source: kiln (CUDA
# sm_90 + NCCL, only the targets the steps need) with the Debian packages carried in
# .carry/deps (scripts/gpu-pack.sh --deps .carry/deps; scripts/gpu-env.sh), then the named
# steps, most important first; logs in a tarball in $OUT (else /tmp/kiln-gpu-out), a table last.
#
#   bash scripts/gpu-round.sh STEP...        (device run with carry [".carry"])
#
# Steps:
#   kernels   test_cuda_kernels and test_cuda_attention (every CUDA kernel vs ref) and bench_cuda (decode matmuls
#             of an 8B shape vs the bandwidth bound, each gemv variant)
#   bench     bench_cuda alone ($BENCH_TYPES, default q4_0,q8_0,q4_k,q4_k_m): the 8B-shaped
#             decode matmuls, plain and T16 tables (with verify: no second test_cuda_kernels)
#   e2e       scripts/gpu-e2e.sh's checks (every family x type vs ref, batch invariance)
#   side8b    Llama-3-8B-shaped models ($KILN_8B_TYPES, default "q4_0 q8_0 f16"):
#             kiln bench --backend cuda -p 512 -n 128, and llama-bench -ngl 99 -fa 1 on the
#             same file when $LLAMA_BIN holds llama.cpp's binaries (built in the same call)
#   batched   8B q4_0: bench_sched (1/4/16/64 sequences through the engine) and
#             llama-batched-bench on the same file
#   tp        test_tp_nccl (NCCL collectives, TP 2 logits vs TP 1), then 8B q4_0 kiln bench
#             --tp 1 / --tp 2, llama-bench -sm layer / row on the GPUs
#   tp70b     a Llama-3-70B-shaped q4_0 (38 GiB; fits one H100 too): kiln bench and
#             bench_sched (1 and 64 sequences) at --tp 2 and 1, llama-bench -sm layer / row
#             and on one GPU, llama-batched-bench -sm layer
#   sanitize2 compute-sanitizer on session 12's kernels: memcheck and racecheck on
#             test_cuda_gemm_i8 (the int8 GEMM) and test_attention (split decode attention),
#             memcheck on test_cuda_prefill (the coalesced K-quant dequantization)
#   fault     test_cuda_fault: the N-th CUDA / cuBLAS call fails, for every N of bind and
#             of a step (issue 14)
#   ttft      8B q4_0: bench_sched --mode ttft (128-token prompt, 112 cached vs cold)
#   load      8B q4_0: bench_load --cuda 0 (upload lane in each KILN_UPLOAD way vs pinned
#             H2D) and the engine's load for the cuda backend
#   upload    8B q4_0: bench_load --upload-only ($UPLOAD_RUNS times, default 3): the
#             upload lane's stream way (plain / streaming stores) next to pinned H2D
#   transform 8B q4_0 (R16 streaming vs temporal stores) and q4_K_M: bench_load --model (R16
#             repack vs memcpy of the same bytes)
#   wakeup    bench_wakeup: the kernel's floor per streamed token (eventfd wakeup of an
#             epoll thread + one loopback send, 5 ms apart like an 8B decode step; and the
#             producer sending itself), 3 runs (issue 13)
#   starve    bench_sched --mode starve (16 slots: an interactive request's inter-token
#             p99 / p50 while a batch tenant saturates 15 slots) on this quiet host: llama-110m
#             q4_0 on the cpu backend (-t 2 and -t 8), 3 runs each, and 8B q4_0 on cuda
#   ready     8B q4_0, warm file: whole-process `kiln run -n 1 --backend cuda` next to
#             llama-completion -n 1 -ngl 99 (when in $LLAMA_BIN), alternating, 3 each
#   real      the real Gemma 3 270M Q4_K_M and SmolLM2-135M-Instruct Q4_1 files, joined from
#             pieces carried over earlier warm calls (scripts/carry-pieces.sh) into
#             ~/.cache/kiln/models (where test_cuda_e2e, run by `verify` after it, finds them:
#             teacher forcing vs cpu, Gemma's 12 greedy prompts): kiln bench --backend cuda
#             -p 512 -n 128 (and llama-bench -ngl 99 -fa 1 when in $LLAMA_BIN), and a greedy
#             `kiln run --chat` on SmolLM2 with cuda and cpu, texts compared
#   sample    test_cuda_sample (cuda.sample vs ref.sample and the CPU chain; generation with
#             device sampling == host sampling) and bench_cuda_sample (the chain per step)
#   depth     8B q4_0 at depths $DEPTHS (default 8192): kiln bench -d N, split-K attention on
#             and off (KILN_CUDA_NO_SPLITK=1) and session 11's ranges (KILN_CUDA_OLD_SPLITK=1),
#             llama-bench -d N when in $LLAMA_BIN
#   sampledrun  kiln run --backend cuda -n 256: default sampling on the device (split
#             sample kernel), the one-block-per-row kernel (KILN_CUDA_OLD_SAMPLE=1), --temp
#             0, host sampling; $RUNS rounds alternating; real files when present, kiln-gen
#             gemma3-270m q4_K_M and llama3-8b q4_0 (sampledrun.log)
#   tune      `kiln tune --backend cuda` on 8B q4_0 (matmul, attention, norms; 1 / 16 / 64 /
#             512 tokens) into a fresh PerfDB, `kiln explain --backend cuda` with those
#             timings, then kiln bench with the tuned PerfDB and without (tune.log)
#   sanitize  compute-sanitizer memcheck and racecheck on test_cuda_kernels and
#             test_cuda_attention, memcheck on
#             test_cuda_sample
#   (side8b and real also run `kiln bench` once more per assignment in $SIDE_AB, e.g.
#   SIDE_AB="KILN_ADD_NORM=0 KILN_CUDA_OLD_GEMM=1": same-call A/B of a switch; batched
#   likewise with $BATCHED_AB)
#   smalldec  small models' decode (issue 17, the step's fixed costs): kiln-gen gemma3-270m
#             q4_K_M and smollm2-135m q4_1 (the real files' shapes and types): kiln bench
#             --backend cuda -p 0 -n 128 -r 3, then ncu's time of every kernel over 8 decode
#             steps (scripts/ncu-step.py: per kernel name, launches and us per step)
#   i8        test_cuda_gemm_i8 (the int8 GEMM vs ref) and bench_cuda --gemm on q4_0 / q8_0
#             (8B matmuls of a step at 16-512 tokens: T16 GEMM, int8 GEMM, cuBLAS)
#   e2eonly   verify's test_cuda_e2e alone
#   ncui8     ncu over an 8B q4_0 pp512 (kiln bench): 6 launches of the matmul kernels
#             ($PROFILE_RE, default the int8 GEMM) after 40: speed of light,
#             memory, pipes, occupancy, stalls
#   verify    test_cuda_kernels, test_cuda_attention, and test_cuda_e2e on tiny models of every family x type
#             (every model through the upload lane, cuda vs ref teacher-forced)
#   profile   ncu on the single-token gemv of one layer ($PROFILE_TYPES, default q4_0 q8_0;
#             kernel names matching $PROFILE_RE, default gemv):
#             speed of light, memory, occupancy, warp stalls (when ncu is installed)
#   serve     8B q4_0: bench/serve_bench.sh, kiln serve --backend cuda next to llama-server
#             -ngl 99 (when in $LLAMA_BIN) at $SERVE_CLIENTS (default 1 8 32 128)
# Exit status 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
LOG=$OUT/logs; mkdir -p "$LOG" # a device call returns at most 8 files: logs go in a tarball
M=/tmp/models; mkdir -p $M
export KILN_NO_PROGRESS=1 KILN_SOURCE_DIR=$PWD
# ../shared does not travel to the GPU machine: the gpu tests that read its test data (a
# tokenizer vocabulary for test_cuda_sample) take the repo's copy in tests/data/shared
[ -z "${KILN_SHARED_DIR:-}" ] && [ -d tests/data/shared/testdata ] &&
  export KILN_SHARED_DIR=$PWD/tests/data/shared
ROWS=() rc=0
source scripts/gpu-step.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
NGPU=$(nvidia-smi -L | wc -l)
source scripts/gpu-env.sh
B=build-gpu
TG="kiln-bin kiln-gen"
for s in "$@"; do
  case $s in
    kernels) TG="$TG test_cuda_kernels test_cuda_attention bench_cuda" ;;
    bench) TG="$TG bench_cuda" ;;
    e2e) TG="$TG test_cuda_e2e test_cuda_kernels test_cuda_attention test_cuda_backend bench_cuda bench_sched" ;;
    batched) TG="$TG bench_sched" ;;
    tp) TG="$TG test_tp_nccl" ;;
    tp70b | ttft) TG="$TG bench_sched" ;;
    fault) TG="$TG test_cuda_fault" ;;
    verify) TG="$TG test_cuda_kernels test_cuda_attention test_cuda_e2e" ;;
    i8) TG="$TG test_cuda_gemm_i8 bench_cuda" ;;
    e2eonly) TG="$TG test_cuda_e2e" ;;
    ncui8) TG="$TG" ;;
    real) TG="$TG" ;;
    sample) TG="$TG test_cuda_sample bench_cuda_sample" ;;
    sampledrun|depth|tune) TG="$TG" ;;
    sanitize) TG="$TG test_cuda_kernels test_cuda_attention test_cuda_sample" ;;
    sanitize2) TG="$TG test_cuda_gemm_i8 test_cuda_attention test_cuda_prefill" ;;
    profile) TG="$TG bench_cuda" ;;
    smalldec) TG="$TG" ;;
    load) TG="$TG bench_load test_load" ;;
    upload|transform) TG="$TG bench_load" ;;
    wakeup) TG="$TG bench_wakeup" ;;
    starve) TG="$TG bench_sched" ;;
  esac
done
if [ ! -f $B/CMakeCache.txt ]; then
  step configure 600 cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
    -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}"
fi
step build 900 cmake --build $B -j"$(nproc)" --target $TG || grep -E "error" "$LOG/build.log" | head
export PATH=$PWD/$B:$PWD/$B/bench:$PWD/$B/tests:$PATH
gen() { # preset type -> path (generated once)
  local f=$M/$1-$2.gguf
  [ -f "$f" ] || kiln-gen -q -p "$1" -t "$2" -o "$f" >&2
  echo "$f"
}
LB=${LLAMA_BIN:-}
llama() { [ -n "$LB" ] && [ -x "$LB/$1" ]; }
for s in "$@"; do
  case $s in
    kernels)
      step test_cuda_kernels 600 test_cuda_kernels
      step test_cuda_attention 300 test_cuda_attention
      step bench_cuda 420 bench_cuda --dtypes f16,q8_0,q4_0,q4_k,q4_k_m ;;
    bench)
      step bench_cuda 420 bench_cuda --dtypes "${BENCH_TYPES:-q4_0,q8_0,q4_k,q4_k_m}" ;;
    e2e)
      D=/tmp/kd; rm -rf $D; mkdir -p $D/bin $D/lib
      for b in kiln kiln-gen test_cuda_e2e test_cuda_kernels test_cuda_attention test_cuda_backend \
        bench_cuda \
        bench_sched; do ln -sf "$(command -v $b)" $D/bin/$b; done
      cp scripts/gpu-e2e.sh $D/
      step e2e 900 env OUT=$LOG/e2e bash $D/gpu-e2e.sh run . ;;
    side8b)
      for t in ${KILN_8B_TYPES:-q4_0 q8_0 f16}; do
        f=$(gen llama3-8b $t)
        step "kiln-8b-$t" 300 kiln bench -m "$f" --backend cuda -p 512 -n 128 -r 3
        for ab in ${SIDE_AB:-}; do
          step "kiln-8b-$t-${ab%%=*}" 300 env "$ab" kiln bench -m "$f" --backend cuda -p 512 -n 128 -r 3
        done
        llama llama-bench && step "llama-8b-$t" 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 \
          -p 512 -n 128 -r 3
      done ;;
    batched)
      f=$(gen llama3-8b q4_0)
      step kiln-batched 400 bench_sched -m "$f" -b cuda --mode decode --npl 1,4,16,64 --pp 128 \
        --tg 128
      for ab in ${BATCHED_AB:-}; do
        step "kiln-batched-${ab%%=*}" 400 env "$ab" bench_sched -m "$f" -b cuda --mode decode \
          --npl 1,4,16,64 --pp 128 --tg 128
      done
      llama llama-batched-bench && step llama-batched 400 "$LB/llama-batched-bench" -m "$f" \
        -ngl 99 -fa 1 -c 33792 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,4,16,64 ;;
    tp)
      step test_tp_nccl 600 env KILN_BINARY_DIR=$PWD/$B test_tp_nccl
      f=$(gen llama3-8b q4_0)
      step kiln-8b-tp1 300 kiln bench -m "$f" --backend cuda -p 512 -n 128 -r 3
      [ "$NGPU" -ge 2 ] && step kiln-8b-tp2 300 kiln bench -m "$f" --backend cuda --tp 2 -p 512 \
        -n 128 -r 3
      if llama llama-bench && [ "$NGPU" -ge 2 ]; then
        step llama-8b-layer 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -sm layer -p 512 -n 128 -r 3
        step llama-8b-row 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -sm row -p 512 -n 128 -r 3
      fi ;;
    tp70b)
      [ "$NGPU" -ge 2 ] || { echo "tp70b: needs 2 GPUs"; continue; }
      f=$M/llama3-70b-q4_0.gguf
      [ -f "$f" ] || step gen70b 600 kiln-gen -q -p llama3-70b -t q4_0 -o "$f"
      df -h $M | tail -1
      step kiln-70b-tp2 300 kiln bench -m "$f" --backend cuda --tp 2 -p 512 -n 64 -r 2
      step kiln-70b-tp1 300 kiln bench -m "$f" --backend cuda -p 512 -n 64 -r 2
      step kiln-70b-sched-tp2 300 bench_sched -m "$f" -b cuda --tp 2 --mode decode --npl 1,64 \
        --pp 128 --tg 64
      step kiln-70b-sched-tp1 300 bench_sched -m "$f" -b cuda --mode decode --npl 1,64 --pp 128 \
        --tg 64
      if llama llama-bench; then
        step llama-70b-layer 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -sm layer -p 512 -n 64 -r 2
        step llama-70b-row 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -sm row -p 512 -n 64 -r 2
        step llama-70b-one 300 env CUDA_VISIBLE_DEVICES=0 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 \
          -p 512 -n 64 -r 2
      fi
      llama llama-batched-bench && step llama-70b-batched 300 "$LB/llama-batched-bench" -m "$f" \
        -ngl 99 -fa 1 -sm layer -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,64 ;;
    real)
      R=$HOME/.cache/kiln/models; mkdir -p "$R"
      [ -f /tmp/kiln-pieces/manifest ] &&
        step join 180 bash scripts/carry-pieces.sh join /tmp/kiln-pieces/manifest "$R"
      for f in "$R/gemma-3-270m-q4_k_m.gguf" "$R/SmolLM2-135M-Instruct.Q4_1.gguf"; do
        [ -f "$f" ] || { echo "real: $f absent (scripts/carry-pieces.sh)" | tee -a "$LOG/real.log"; continue; }
        n=$(basename "$f" .gguf)
        step "kiln-$n" 300 kiln bench -m "$f" --backend cuda -p 512 -n 128 -r 5
        for ab in ${SIDE_AB:-}; do
          step "kiln-$n-${ab%%=*}" 300 env "$ab" kiln bench -m "$f" --backend cuda -p 512 -n 128 -r 5
        done
        llama llama-bench && step "llama-$n" 300 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 \
          -p 512 -n 128 -r 5
      done
      f=$R/SmolLM2-135M-Instruct.Q4_1.gguf
      if [ -f "$f" ]; then
        for be in cuda cpu; do
          step "chat-$be" 120 sh -c "kiln run -m '$f' --backend $be --chat --temp 0 -n 96 \
            -p 'Write a haiku about a kiln, then explain it in one sentence.' >'$LOG/chat-$be.txt'"
        done
        step chat-same 10 cmp "$LOG/chat-cuda.txt" "$LOG/chat-cpu.txt"
        cat "$LOG/chat-cuda.txt"
        step sampled-cuda 120 kiln run -m "$f" --backend cuda --chat -n 64 -s 7 \
          -p 'Name three uses of fired clay.'
      fi ;;
    sample)
      step test_cuda_sample 240 env KILN_BINARY_DIR=$PWD/$B test_cuda_sample
      step bench_cuda_sample 120 bench_cuda_sample 128256 262144 ;;
    depth)
      # long contexts: 8B q4_0 at depth $DEPTHS (default 8192): kiln bench -d N with split-K
      # attention and without (KILN_CUDA_NO_SPLITK=1), llama-bench -d N when built
      F=$(gen llama3-8b q4_0)
      for d in ${DEPTHS:-8192}; do
        step "depth$d-kiln" 300 kiln bench -m "$F" --backend cuda -p 512 -n 128 -d "$d" -r 3
        step "depth$d-nosplit" 300 env KILN_CUDA_NO_SPLITK=1 kiln bench -m "$F" --backend cuda \
          -p 512 -n 128 -d "$d" -r 3
        step "depth$d-oldsplit" 300 env KILN_CUDA_OLD_SPLITK=1 kiln bench -m "$F" --backend cuda \
          -p 512 -n 128 -d "$d" -r 3
        llama llama-bench && step "depth$d-llama" 300 "$LB/llama-bench" -m "$F" -ngl 99 -fa 1 \
          -p 512 -n 128 -d "$d" -r 3
      done ;;
    tune)
      # kiln tune on the GPU: timings keyed by host + GPU model, read back by selection
      F=$(gen llama3-8b q4_0)
      TD=$(mktemp -d)
      step tune-run "${TUNE_TIMEOUT:-400}" env XDG_CACHE_HOME="$TD" kiln tune -m "$F" --backend cuda \
        --ops matmul,attention,rms_norm,glu --tokens 1,16,64,512 --reps "${TUNE_REPS:-5}"
      for n in 1 64 512; do
        step "tune-explain$n" 60 env XDG_CACHE_HOME="$TD" kiln explain -m "$F" --backend cuda \
          --tokens $n --site 'blk.0.*'
      done
      for r in 1 2; do
        step "tune-bench-tuned$r" 300 env XDG_CACHE_HOME="$TD" kiln bench -m "$F" \
          --backend cuda -p 512 -n 128 -r 3
        step "tune-bench-untuned$r" 300 env XDG_CACHE_HOME="$TD/none" kiln bench -m "$F" \
          --backend cuda -p 512 -n 128 -r 3
      done ;;
    sampledrun)
      # kiln run --backend cuda -n 256 --ignore-eos: default sampling (the device samples,
      # split path) / the one-block-per-row sample kernel (KILN_CUDA_OLD_SAMPLE=1) / --temp 0
      # / host sampling (KILN_HOST_SAMPLING=1), alternating, $RUNS rounds; real files when
      # present, kiln-gen gemma3-270m q4_K_M and llama3-8b q4_0
      R=$HOME/.cache/kiln/models
      P="Write a long story about a dragon who learns to bake bread."
      : >"$LOG/sampledrun.log"
      for f in "$R/gemma-3-270m-q4_k_m.gguf" "$R/SmolLM2-135M-Instruct.Q4_1.gguf" \
        "$(gen gemma3-270m q4_K_M)" "$(gen llama3-8b q4_0)"; do
        [ -f "$f" ] || continue
        cat "$f" >/dev/null
        for r in $(seq 1 "${RUNS:-3}"); do
          for mode in sampled old greedy host; do
            case $mode in
              sampled) a=(); e=(KILN_NO_PROGRESS=1) ;;
              old) a=(); e=(KILN_CUDA_OLD_SAMPLE=1) ;;
              greedy) a=(--temp 0); e=(KILN_NO_PROGRESS=1) ;;
              host) a=(); e=(KILN_HOST_SAMPLING=1) ;;
            esac
            l=$(env "${e[@]}" timeout 60 kiln run -m "$f" --backend cuda -p "$P" -n 256 \
              --ignore-eos -s 1 "${a[@]}" 2>&1 >/dev/null | grep "kiln run:")
            echo "$(basename "$f") $mode $r $l" >>"$LOG/sampledrun.log"
          done
        done
      done
      ROWS+=("sampledrun: $(wc -l <"$LOG/sampledrun.log") runs (sampledrun.log)") ;;
    sanitize)
      CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
      if [ -z "$CS" ]; then echo "sanitize: no compute-sanitizer" | tee "$LOG/sanitize.log"; else
        step memcheck-kernels 420 "$CS" --tool memcheck --error-exitcode 1 test_cuda_kernels
        step racecheck-kernels 420 "$CS" --tool racecheck --error-exitcode 1 test_cuda_kernels
        step memcheck-attention 300 "$CS" --tool memcheck --error-exitcode 1 test_cuda_attention
        step racecheck-attention 300 "$CS" --tool racecheck --error-exitcode 1 test_cuda_attention
        step memcheck-sample 300 env KILN_BINARY_DIR=$PWD/$B "$CS" --tool memcheck \
          --error-exitcode 1 test_cuda_sample
      fi ;;
    sanitize2)
      CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
      if [ -z "$CS" ]; then echo "sanitize2: no compute-sanitizer" | tee "$LOG/sanitize2.log"; else
        for tool in memcheck racecheck; do
          step $tool-gemm-i8 150 "$CS" --tool $tool --error-exitcode 1 test_cuda_gemm_i8
          step $tool-attention-split 150 env KILN_TEST_FILTER=test_attention "$CS" --tool $tool \
            --error-exitcode 1 test_cuda_attention
        done
        step memcheck-prefill 150 "$CS" --tool memcheck --error-exitcode 1 test_cuda_prefill
      fi ;;
    fault)
      step test_cuda_fault 240 env KILN_BINARY_DIR=$PWD/$B test_cuda_fault ;;
    i8)
      step test_cuda_gemm_i8 300 test_cuda_gemm_i8
      step bench_gemm 300 bench_cuda --gemm --dtypes q4_0,q8_0 --reps 10 ;;
    ncui8)
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [ -z "$NCU" ]; then echo "ncui8: no ncu" | tee "$LOG/ncu-i8.log"; else
        f=$(gen llama3-8b q4_0)
        step ncu-i8 300 "$NCU" --kernel-name "regex:${PROFILE_RE:-gemm_i8_kernel}" \
          --launch-skip 40 --launch-count 6 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
          --section LaunchStats kiln bench -m "$f" --backend cuda -p 512 -n 1 -r 1
      fi ;;
    verify | e2eonly)
      E=/tmp/kiln-e2e; mkdir -p $E
      for f in llama qwen2 qwen3 gemma3; do
        for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
          echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"
        done
      done | xargs -P 8 -L 1 kiln-gen -q --threads 2 >"$LOG/gen.log" 2>&1
      if [ "$s" = verify ]; then
        step test_cuda_kernels 420 test_cuda_kernels
        step test_cuda_attention 300 test_cuda_attention
      fi
      step test_cuda_e2e 300 env KILN_E2E_DIR=$E test_cuda_e2e ;;
    profile)
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [ -z "$NCU" ]; then echo "profile: no ncu" | tee "$LOG/ncu.log"; else
        for t in ${PROFILE_TYPES:-q4_0 q8_0}; do
          step "ncu-$t" 300 "$NCU" --kernel-name "regex:${PROFILE_RE:-gemv}" --launch-skip 20 --launch-count 4 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
            --section WarpStateStats --section LaunchStats --section SchedulerStats \
            bench_cuda --dtypes $t --layers 1 --reps 2
        done
      fi ;;
    smalldec)
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      for pt in gemma3-270m:q4_K_M smollm2-135m:q4_1; do
        f=$(gen ${pt%%:*} ${pt#*:}) n=${pt%%:*}
        step "small-$n" 120 kiln bench -m "$f" --backend cuda -p 0 -n 128 -r 3
        for ab in ${SIDE_AB:-}; do
          step "small-$n-${ab%%=*}" 120 env "$ab" kiln bench -m "$f" --backend cuda -p 0 -n 128 -r 3
        done
        [ -n "$NCU" ] && step "ncu-small-$n" 240 "$NCU" --metrics gpu__time_duration.sum \
          --cache-control none --clock-control none --csv kiln bench -m "$f" --backend cuda \
          -p 0 -n 8 -r 1 && python3 scripts/ncu-step.py "$LOG/ncu-small-$n.log" 0 \
          >"$LOG/ncu-small-$n.txt" 2>&1 && cat "$LOG/ncu-small-$n.txt"
      done ;;
    ttft)
      f=$(gen llama3-8b q4_0)
      step kiln-ttft 300 bench_sched -m "$f" -b cuda --mode ttft --pp 128 --reps 5 ;;
    load)
      f=$(gen llama3-8b q4_0)
      step test_load 120 env KILN_BINARY_DIR=$PWD/$B test_load
      step bench_load 400 bench_load --file "$f" --cuda 0 --reps 3
      step bench_load_engine 300 bench_load --model "$f" --backend cuda --reps 3 ;;
    upload)
      f=$(gen llama3-8b q4_0)
      cat "$f" >/dev/null
      : >"$LOG/upload.txt"
      for r in $(seq ${UPLOAD_RUNS:-3}); do
        echo "== run $r" >>"$LOG/upload.txt"
        timeout 120 bench_load --file "$f" --cuda 0 --reps 3 --upload-only 2>&1 |
          grep -E "pinned|upload lane" >>"$LOG/upload.txt"
      done
      cat "$LOG/upload.txt" ;;
    transform)
      : >"$LOG/transform.txt"
      n=0
      for ts in ${TRANSFORM_RUNS:-q4_0 q4_K_M}; do # TYPE[:ENV=VALUE]
        t=${ts%%:*} ev=; [ "$ts" != "$t" ] && ev=${ts#*:}
        f=$(gen llama3-8b $t)
        cat "$f" >/dev/null
        n=$((n + 1))
        echo "== $t ${ev:-(defaults)}" >>"$LOG/transform.txt"
        step transform-$n-$t 300 env $ev bench_load --model "$f" --backend cpu --reps 2
        grep -E "transform|memcpy" "$LOG/transform-$n-$t.log" >>"$LOG/transform.txt"
      done
      cat "$LOG/transform.txt" ;;
    wakeup)
      : >"$LOG/wakeup.txt"
      for r in 1 2 3; do
        for a in "-g 0" "-g 5000" "-g 5000 -d" "-g 5000 -s 8" "-g 5000 -s 8 -d"; do
          timeout 60 bench_wakeup -n 1000 $a >>"$LOG/wakeup.txt" 2>&1
        done
      done
      cat "$LOG/wakeup.txt" ;;
    starve)
      f=$(gen llama-110m q4_0)
      : >"$LOG/starve.txt"
      for t in 2 8; do
        for r in 1 2 3; do
          step starve-cpu-t$t-$r 300 bench_sched -m "$f" -b cpu -t $t --mode starve
          echo "cpu -t $t run $r: $(grep -E '^\| [0-9]' "$LOG/starve-cpu-t$t-$r.log")" >>"$LOG/starve.txt"
        done
      done
      f=$(gen llama3-8b q4_0)
      for r in 1 2 3; do
        step starve-cuda-$r 300 bench_sched -m "$f" -b cuda --mode starve
        echo "cuda 8B run $r: $(grep -E '^\| [0-9]' "$LOG/starve-cuda-$r.log")" >>"$LOG/starve.txt"
      done
      cat "$LOG/starve.txt" ;;
    ready)
      f=$(gen llama3-8b q4_0)
      cat "$f" >/dev/null
      : >"$LOG/ready.txt"
      for r in 1 2 3; do
        t0=$(date +%s.%N)
        kiln run -m "$f" -p Hello -n 1 --temp 0 --backend cuda </dev/null >/dev/null 2>>"$LOG/ready.err"
        echo "kiln run $r $(awk "BEGIN{printf \"%.3f\", $(date +%s.%N) - $t0}") s" >>"$LOG/ready.txt"
        if llama llama-completion; then
          t0=$(date +%s.%N)
          "$LB/llama-completion" -m "$f" -p Hello -n 1 --temp 0 -ngl 99 -no-cnv </dev/null \
            >/dev/null 2>>"$LOG/ready.err"
          echo "llama-completion $r $(awk "BEGIN{printf \"%.3f\", $(date +%s.%N) - $t0}") s" >>"$LOG/ready.txt"
        fi
      done
      cat "$LOG/ready.txt" ;;
    serve)
      f=$(gen llama3-8b q4_0)
      command -v python3 curl
      LS=; llama llama-server && LS=$LB/llama-server
      step serve 560 env THREADS=16 REQS=${SERVE_REQS:-2} KILN_ARGS="--backend cuda --kv-f16" \
        LS_ARGS="-ngl 99 -fa on" bash bench/serve_bench.sh "$PWD/$B/kiln" "$f" "$LS" \
        ${SERVE_CLIENTS:-1 8 32 128} ;;
    *) echo "unknown step $s"; rc=1 ;;
  esac
done
echo
grep -h "FAILED\|PASSED\|SKIP\|wrapped\|failed:" "$LOG"/test_*.log 2>/dev/null | tail -12
for f in "$LOG"/kiln-ttft.log "$LOG"/serve.log; do [ -f "$f" ] && grep -E "^\||^kiln|^llama" "$f"; done
[ -f "$LOG/bench_load.log" ] && grep -E "pinned|upload" "$LOG/bench_load.log"
[ -f "$LOG/ready.txt" ] && cat "$LOG/ready.txt"
[ -f "$LOG/bench_cuda.log" ] && sed -n '/^bandwidth/p;/^Llama-3-8B/,$p' "$LOG/bench_cuda.log"
for f in "$LOG"/kiln-*.log "$LOG"/llama-*.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .log)"; grep -E "^\|.*(pp|tg)[0-9]|t/s|tok/s|S_TG|^\| *[0-9]" "$f" | tail -8
done
printf '%s\n' "${ROWS[@]}"
tar czf "$OUT/logs-$(date +%H%M%S).tgz" -C "$LOG" . 2>/dev/null
exit $rc
