#!/usr/bin/env bash
# gpu-attn.sh — session 12's device call for long-context decode attention and the q4_K /
# q6_K coalesced dequantization (helper gpu-attn, issue 17): builds kiln there (sm_90, the
# carried Debian deps: scripts/gpu-env.sh), then the named steps; logs in a tarball in $OUT.
#
#   bash scripts/gpu-attn.sh STEP...      (device run with carry [".carry"])
#
# Steps:
#   tests    test_cuda_attention and test_cuda_prefill (the kernels vs ref / the old kernels)
#   kernels  test_cuda_kernels (the T16 cuBLAS path runs the dequantization)
#   e2e      test_cuda_e2e on tiny models of every family x type (cuda vs ref)
#   depth    8B q4_0: kiln bench -p 512 -n 128 -r 3 at -d $DEPTHS (default "0 $DEPTH", DEPTH
#            default 8192),
#            session 12's split (default) and session 11's (KILN_CUDA_OLD_SPLITK=1),
#            alternating; -d $DEPTH also once per assignment in $DEPTH_AB (e.g.
#            "KILN_CUDA_ATT2_POS=128 KILN_CUDA_ATT2_POS=512") and without split-K when NOSPLIT=1
#   q4km     8B q4_K_M: kiln bench -p 512 -n 128 -r 3, the coalesced K-quant dequantization
#            (default) and the old one (KILN_CUDA_OLD_DQK=1), alternating
#   flash    ncu time of the flash attention kernel over kiln bench -p 512 -n 0 -d $DEPTH -r 1
#            (per launch, in launch order; when ncu is installed)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
LOG=$OUT/logs
mkdir -p "$LOG"
M=/tmp/models
mkdir -p $M
export KILN_NO_PROGRESS=1 KILN_SOURCE_DIR=$PWD
[ -z "${KILN_SHARED_DIR:-}" ] && [ -d tests/data/shared/testdata ] &&
  export KILN_SHARED_DIR=$PWD/tests/data/shared
ROWS=() rc=0
source scripts/gpu-step.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
source scripts/gpu-env.sh
B=build-gpu
TG="kiln-bin kiln-gen"
for s in "$@"; do
  case $s in
    tests) TG="$TG test_cuda_attention test_cuda_prefill" ;;
    kernels) TG="$TG test_cuda_kernels" ;;
    e2e) TG="$TG test_cuda_e2e" ;;
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
D=${DEPTH:-8192}
for s in "$@"; do
  case $s in
    tests)
      step test_cuda_attention 300 test_cuda_attention
      step test_cuda_prefill 200 test_cuda_prefill ;;
    kernels)
      step test_cuda_kernels ${KTIME:-420} test_cuda_kernels ;;
    e2e)
      E=/tmp/kiln-e2e
      mkdir -p $E
      for f in llama qwen2 qwen3 gemma3; do
        for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
          echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"
        done
      done | xargs -P 8 -L 1 kiln-gen -q --threads 2 >"$LOG/gen.log" 2>&1
      step test_cuda_e2e 300 env KILN_E2E_DIR=$E test_cuda_e2e ;;
    depth)
      F=$(gen llama3-8b q4_0)
      for r in 1 2; do
        for d in ${DEPTHS:-0 $D}; do
          step "q4_0-d$d-new-$r" 200 kiln bench -m "$F" --backend cuda -p 512 -n 128 -d $d -r 3
          step "q4_0-d$d-old-$r" 200 env KILN_CUDA_OLD_SPLITK=1 kiln bench -m "$F" \
            --backend cuda -p 512 -n 128 -d $d -r 3
        done
        [ "${RUNS:-1}" -ge 2 ] || break
      done
      for ab in ${DEPTH_AB:-}; do
        step "q4_0-d$D-${ab#*=}" 200 env "$ab" kiln bench -m "$F" --backend cuda -p 512 -n 128 \
          -d $D -r 3
      done
      [ "${NOSPLIT:-0}" = 1 ] && step "q4_0-d$D-nosplit" 200 env KILN_CUDA_NO_SPLITK=1 kiln bench \
        -m "$F" --backend cuda -p 512 -n 128 -d $D -r 3 ;;
    q4km)
      F=$(gen llama3-8b q4_K_M)
      for r in 1 2; do
        step "q4km-new-$r" 200 kiln bench -m "$F" --backend cuda -p 512 -n 128 -r 3
        step "q4km-old-$r" 200 env KILN_CUDA_OLD_DQK=1 kiln bench -m "$F" --backend cuda \
          -p 512 -n 128 -r 3
        [ "${RUNS:-1}" -ge 2 ] || break
      done ;;
    flash)
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      F=$(gen llama3-8b q4_0)
      if [ -z "$NCU" ]; then echo "flash: no ncu" | tee "$LOG/ncu-flash.log"; else
        step ncu-flash 200 "$NCU" --metrics gpu__time_duration.sum --cache-control none \
          --clock-control none --csv --kernel-name regex:flash kiln bench -m "$F" --backend cuda \
          -p 512 -n 0 -d $D -r 1
        python3 - "$LOG/ncu-flash.log" >"$LOG/ncu-flash.txt" <<'EOF'
import csv, sys
rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
us = []
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    u = r.get("Metric Unit", "")
    us.append(v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v)
print("flash launches", len(us), "total us %.1f" % sum(us))
for i in range(0, len(us), 32):
    c = us[i:i + 32]
    print("launches %4d-%4d: %8.1f us (mean %.1f, max %.1f)" % (i, i + len(c) - 1, sum(c), sum(c) / len(c), max(c)))
EOF
        cat "$LOG/ncu-flash.txt"
      fi ;;
  esac
done
echo "== results"
grep -h "FAILED\|PASSED\|SKIP\|failed:\|not bitwise" "$LOG"/test_*.log 2>/dev/null | tail -20
for f in "$LOG"/q4*.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .log)"
  grep -E "^\|.*(pp|tg)[0-9]" "$f" | tail -4
done
printf '%s\n' "${ROWS[@]}"
tar czf "$OUT/logs-$(date +%H%M%S).tgz" -C "$LOG" . 2>/dev/null
exit $rc
