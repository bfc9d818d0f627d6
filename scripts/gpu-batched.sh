#!/usr/bin/env bash
# gpu-batched.sh — session 19's batched-decode calls (issue 12: aggregate decode at 16 / 64
# sequences; issue 17: the same GEMMs). Builds kiln on the GPU machine, generates the
# kiln-gen Llama-3-8B file(s), then per step named on the command line:
#   prof    bench_sched decode at $PROF_NPL with KILN_OP_PROFILE=1 (the device synced around
#           each plan instruction: where a step's time goes, per opcode, per tokens bucket)
#   ab      bench_sched decode at 1,4,16,64 sequences, alternating the runs of $RUNS
#           ("base new ..." where `new:VAR=VALUE` sets an environment variable; plain `new`
#           is this tree's default, `base` the tree in .carry/base.tgz when `base` is named)
#   ncu     per-kernel GPU time of a short 16-sequence run (ncu, gpu__time_duration only)
#   bench   bench_cuda --gemm (the 8B's matmuls of a step at 16-512 tokens)
#   pp      kiln bench -p $PP (default "128 512") -n 16 -r 3, alternating the runs of $RUNS
#   tests   test_cuda_gemm_i8, test_cuda_kernels
#   e2e     test_cuda_e2e on kiln-gen tiny models (3 families x 5 types) and llama-110m q4_0
# A summary last.
#
#   bash scripts/gpu-batched.sh [base] [prof] [ab] [pp] [ncu] [bench] [tests] [e2e]   (carry [".carry/deps"])
#   env: TYPES_8B (default q4_0), RUNS (default "new new:KILN_GRAPH_BUCKET=1" twice),
#        PROF_NPL (default 16,64), TG (default 128)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-common.sh
TGTS=(kiln-bin kiln-gen bench_sched)
[[ " $* " == *" bench "* ]] && TGTS+=(bench_cuda)
[[ " $* " == *" tests "* ]] && TGTS+=(test_cuda_gemm_i8 test_cuda_kernels)
[[ " $* " == *" e2e "* ]] && TGTS+=(test_cuda_e2e)
step build 600 cmake --build $B -j"$(nproc)" --target "${TGTS[@]}" || grep -E "error" "$LOG/build.log" | head
N=$PWD/$B
if [[ " $* " == *" base "* ]]; then
  ( rm -rf /tmp/base && mkdir -p /tmp/base && tar xzf .carry/base.tgz -C /tmp/base &&
    cmake -S /tmp/base -B /tmp/base/$B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
      -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}" &&
    cmake --build /tmp/base/$B -j8 --target bench_sched kiln-bin ) >"$LOG/build-base.log" 2>&1 &
  BP=$!
fi
gen() { [ -f "$M/$1-$2.gguf" ] || $N/kiln-gen -q -p "$1" -t "$2" -o "$M/$1-$2.gguf"; }
[[ " $* " =~ " "(prof|ab|pp|ncu|bench)" " ]] && # (tests and e2e alone need no 8B file)
  step gen 300 bash -c "$(declare -f gen); M=$M N=$N; for t in ${TYPES_8B:-q4_0}; do gen llama3-8b \$t; done"
[ -n "${BP:-}" ] && { wait $BP; ROWS+=("$(printf '%-34s %s' build-base "$(tail -1 "$LOG/build-base.log" | cut -c1-50)")"); }
T8=${TYPES_8B:-q4_0}
each_run() { # runs "$@" once per entry of $RUNS with i (its index), d (the build's folder),
  # e (its VAR=VALUE, if any) and tag (the entry as a file-name part) set
  local r
  i=0
  for r in ${RUNS:-new new:KILN_GRAPH_BUCKET=1 new new:KILN_GRAPH_BUCKET=1}; do
    i=$((i + 1))
    d=$N; [ "${r%%:*}" = base ] && d=/tmp/base/$B
    e=; [[ $r == *:* ]] && e=${r#*:}
    tag=${r//[:=]/-}
    "$@"
  done
}
for s in "$@"; do
  case $s in
    prof)
      for t in $T8; do
        step "prof-$t" 400 env KILN_OP_PROFILE=1 $N/bench/bench_sched -m $M/llama3-8b-$t.gguf \
          -b cuda --mode decode --npl ${PROF_NPL:-16,64} --pp 128 --tg ${TG:-128}
      done ;;
    ab)
      ab_one() {
        step "ab-$t-$i-$tag" 300 env $e $d/bench/bench_sched -m $M/llama3-8b-$t.gguf \
          -b cuda --mode decode --npl 1,4,16,64 --pp 128 --tg ${TG:-128}
      }
      for t in $T8; do each_run ab_one; done ;;
    ncu)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      t=${T8%% *}
      step ncu 200 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv \
        --log-file "$LOG/ncu.csv" $N/bench/bench_sched -m $M/llama3-8b-$t.gguf -b cuda \
        --mode decode --npl 16 --pp 32 --tg 5
      # per kernel: calls and total us (all steps of the run: one 512-token prefill, 4 decode steps)
      python3 - "$LOG/ncu.csv" >"$LOG/ncu-sum.txt" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v = v / 1e3 if u in ("ns", "nsecond") else v * 1e3 if u in ("ms", "msecond") else v
    name = r[ki].split("(")[0][:70]; tot[name] += v; cnt[name] += 1
print("kernels", sum(cnt.values()), "total us", round(sum(tot.values()), 1))
for n, v in sorted(tot.items(), key=lambda kv: -kv[1]): print(f"{v:12.1f} us {cnt[n]:6d}  {n}")
EOF
      ;;
    pp)
      pp_one() {
        for p in ${PP:-128 512}; do
          step "pp$p-$t-$i-$tag" 240 env $e $d/kiln bench -m $M/llama3-8b-$t.gguf \
            --backend cuda -p $p -n 16 -r 3
        done
      }
      for t in $T8; do each_run pp_one; done ;;
    e2e)
      E=/tmp/kiln-e2e; mkdir -p $E
      ( for f in llama qwen3 gemma3; do for t in f16 q8_0 q4_0 q4_K q6_K; do
          echo "-p tiny -f $f -t $t -o $E/tiny-$f-$t.gguf"; done; done
        echo "-p llama-110m -t q4_0 -o $E/llama-110m-q4_0.gguf" ) |
        xargs -P 8 -L 1 $N/kiln-gen -q --threads 2 >"$LOG/gen-e2e.log" 2>&1
      step test_cuda_e2e 400 env KILN_E2E_DIR=$E $N/tests/test_cuda_e2e ;;
    bench)
      step bench_cuda 400 $N/bench/bench_cuda --gemm --dtypes q4_0 --reps 5 ;;
    tests)
      step test_cuda_gemm_i8 300 $N/tests/test_cuda_gemm_i8
      step test_cuda_kernels 300 $N/tests/test_cuda_kernels ;;
  esac
done
echo
grep -h "PASSED\|FAILED\|passed\|failed" "$LOG"/test_*.log 2>/dev/null | tail -6
grep -h "^graphs, \|^batch invariance" "$LOG"/test_cuda_e2e.log 2>/dev/null
for f in "$LOG"/prof-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -A40 "^op profile" "$f" | grep -v "^$"; grep "^| [0-9]" "$f"; }; done
for f in "$LOG"/ab-*.log; do
  [ -f "$f" ] && printf '%-44s %s\n' "$(basename "$f" .log)" "$(awk -F'|' '/^\| [0-9]/{printf "%s:%s ", $2, $5}' "$f")"
done
for f in "$LOG"/pp*.log; do
  [ -f "$f" ] && printf '%-44s %s\n' "$(basename "$f" .log)" "$(awk -F'|' '/pp[0-9]+|tg[0-9]+/{printf "%s %s  ", $5, $6}' "$f")"
done
[ -f "$LOG/ncu-sum.txt" ] && head -40 "$LOG/ncu-sum.txt"
printf '%s\n' "${ROWS[@]}"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
exit ${rc:-0}
