#!/usr/bin/env bash
# quiet-pairs.sh — kiln bench and llama-bench side by side on a shared machine: each round
# (kiln bench -r 1, then llama-bench -r 1 with the same arguments) starts only when no
# compiler or build tool is running, with long fuzz runs (tests/fuzz/run_long.sh) paused by
# SIGSTOP for the round (run them with TIMEOUT=300 or more). A round that a build started
# during is marked BUSY, to be dropped. This script never builds llama.cpp.
#
#   LLAMA_BENCH=/path/to/llama-bench bench/quiet-pairs.sh MODEL ROUNDS -t 2 -p 128 -n 0
#
# Prints one line per round: time, model, arguments, kiln t/s, llama.cpp t/s, quiet|BUSY.
# KILN_B=/path/to/another/kiln: each round also runs that build right after $KILN (a
# before/after of two kiln builds next to llama.cpp), printed as "kiln_b".
set -uo pipefail
: "${LLAMA_BENCH:?set LLAMA_BENCH to an already built llama-bench}"
KILN=${KILN:-$(cd "$(dirname "$0")/.." && pwd)/build/kiln}
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
M=$1 R=$2
shift 2
busy() { ps -eo comm= | grep -qxE "cc1|cc1plus|nvcc|ptxas|cicc|ld|clang|cudafe\+\+|fatbinary|make|cmake|ninja"; }
for _ in $(seq "$R"); do
  while busy; do sleep 5; done
  pkill -STOP -f "fuzz_.* -runs"
  sleep 1
  k=$("$KILN" bench -m "$M" "$@" -r 1 2>&1 | grep -E "\| (pp|tg)[0-9]" | awk -F'|' '{printf "%s", $6}')
  kb=""
  if [ -n "${KILN_B:-}" ]; then
    kb=" kiln_b $("$KILN_B" bench -m "$M" "$@" -r 1 2>&1 | grep -E "\| (pp|tg)[0-9]" | awk -F'|' '{printf "%s", $6}')"
  fi
  l=$("$LLAMA_BENCH" -m "$M" "$@" -r 1 2>&1 | grep -E "(pp|tg)[0-9]" | awk -F'|' '{printf "%s", $8}')
  b=$(busy && echo BUSY || echo quiet)
  pkill -CONT -f "fuzz_.* -runs"
  echo "$(date +%H:%M:%S) $(basename "$M") $* kiln $k$kb llama $l $b"
done
