#!/usr/bin/env bash
# Long libFuzzer runs (docs/RELIABILITY.md): each target in turn, ONE fuzzer process at a
# time, at nice 19, until RUNS executions (default 10M) or SECONDS seconds (default 3600)
# per target, starting from the committed corpus; new inputs go to a work directory
# (kept: build-fuzz/fuzz-long/<target>/), crashes to build-fuzz/fuzz-long/<target>/crash-*.
# Appends one line per target to build-fuzz/fuzz-long/results.tsv:
#   target  commit  execs  seconds  exec/s  cov  ft  corpus  result
# usage: tests/fuzz/run_long.sh [TARGET...]     (default: every build-fuzz/tests/fuzz_*)
#   RUNS=10000000 SECONDS_MAX=3600 TIMEOUT=10 tests/fuzz/run_long.sh fuzz_gguf
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/fuzz/max_len.sh # fuzz_max_len: -max_len per target (was 262144 for all)
runs=${RUNS:-10000000}
secs=${SECONDS_MAX:-3600}
timeout=${TIMEOUT:-10} # per input; raise it when the run may be paused (SIGSTOP) for a measurement
out=build-fuzz/fuzz-long
mkdir -p "$out"
commit=${COMMIT:-$(git rev-parse --short HEAD)}  # COMMIT: the commit build-fuzz was built from
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for b in build-fuzz/tests/fuzz_*; do [ -x "$b" ] && targets+=("$(basename "$b")"); done
fi
# kiln's warnings about rejected inputs (e.g. "default eos token out of range", one
# line per input of fuzz_hf_tokenizer) only slow a long run: errors only (KILN_LOG overrides)
export KILN_LOG=${KILN_LOG:-error}
export KILN_SOURCE_DIR=$PWD KILN_SHARED_DIR=${KILN_SHARED_DIR:-$PWD/../shared} KILN_NO_PROGRESS=1
for t in "${targets[@]}"; do
  bin=build-fuzz/tests/$t
  work=$out/$t
  mkdir -p "$work"
  log=$out/$t.log
  start=$(date +%s)
  nice -n 19 "$bin" -runs="$runs" -max_total_time="$secs" -rss_limit_mb=2048 -timeout="$timeout" \
       -max_len="$(fuzz_max_len "$t")" -print_final_stats=1 -artifact_prefix="$work/" "$work" \
       "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | awk '{print $2}')
  el=$((end - start))
  eps=$(( el > 0 ? ${execs:-0} / el : 0 ))
  res=$([ $rc -eq 0 ] && echo ok || echo "FAIL(rc=$rc, see $log)")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$commit" "${execs:-?}" "$el" "$eps" \
         "${cov:-?}" "${ft:-?}" "${corp:-?}" "$res" | tee -a "$out/results.tsv"
done
