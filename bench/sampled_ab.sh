#!/usr/bin/env bash
# sampled_ab.sh — issue 16's "default sampling >= 0.95 x its own --temp 0 decode": `kiln run`
# with the default sampler chain (A) and with --temp 0 (B, the fused-argmax greedy path) in
# ABBA pairs, so neither arm always runs first; prints each run's decode tok/s, each pair's
# A/B ratio and the median ratio. Pauses running fuzz_* processes (SIGSTOP) for the
# duration and resumes them on exit, as bench/quiet-pairs.sh does.
#   bench/sampled_ab.sh [MODEL] [PAIRS] [extra kiln run args...]
#   e.g. bench/sampled_ab.sh gemma3-270m 8 -t 2
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gemma3-270m}
PAIRS=${2:-8}
shift $(($# < 2 ? $# : 2))
KILN=${KILN:-build/kiln}
PROMPT=${PROMPT:-"The capital of France is"}
N=${N:-64}
pkill -STOP -f "fuzz_.* -runs" # long fuzz runs (tests/fuzz/run_long.sh), resumed on exit
trap 'pkill -CONT -f "fuzz_.* -runs"' EXIT
run() { # args -> decode tok/s
  "$KILN" run -m "$MODEL" -p "$PROMPT" -n "$N" --ignore-eos "$@" 2>&1 >/dev/null |
    sed -n 's/.*generated [0-9]* tokens in [0-9]* ms (\([0-9.]*\) tok\/s).*/\1/p'
}
ratios=()
for ((i = 1; i <= PAIRS; i++)); do
  if ((i % 2)); then
    a=$(run "$@"); b=$(run --temp 0 "$@")
  else
    b=$(run --temp 0 "$@"); a=$(run "$@")
  fi
  [ -n "$a" ] && [ -n "$b" ] || { echo "pair $i: a run failed" >&2; exit 1; }
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$r")
  echo "pair $i: sampled $a tok/s, greedy $b tok/s, ratio $r"
done
printf '%s\n' "${ratios[@]}" | sort -n |
  awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
         printf "median ratio %.3f (min %.3f, max %.3f, %d pairs)\n", m, v[1], v[NR], NR }'
