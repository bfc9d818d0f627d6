#!/usr/bin/env bash
# Parallel libFuzzer runs for a many-core machine (docs/RELIABILITY.md "Fork runs"): every
# target at once, each with libFuzzer's -fork=N (N jobs in child processes; crashes,
# timeouts and OOMs are counted and kept, and fuzzing goes on), for SECONDS_MAX seconds,
# the targets sharing the cores. Writes, per target, a line of results.tsv:
#   target commit jobs seconds execs exec/s cov ft corpus oom timeout crash artifacts result
# and the logs (logs.tgz), the artifacts (artifacts.tgz: crash-/timeout-/oom-/leak-* inputs)
# and the new corpus inputs (corpus-new.tgz) into OUT (at most 4 files, for a device call's
# $OUT). results.tsv is also printed.
#
# usage: tests/fuzz/run_fork.sh [TARGET...]        (default: the eight slow targets)
# env:
#   SECONDS_MAX  fuzzing time of every target, all at the same time (default 420). libFuzzer's
#                fork mode lets running jobs finish after it (a job runs min(300, its number)
#                seconds), so everything still running at SECONDS_MAX + 90 gets SIGINT (the
#                jobs' executions after the parent's last stats line are then not counted):
#                a 600 s device call fits SECONDS_MAX=420 with the unpacking and the tars
#   CORES        cores to share (default: nproc)
#   FORKS        jobs per target, e.g. "fuzz_perfdb=12 fuzz_quants=6"; targets not named
#                share the rest of CORES by the weights below (at least one job each)
#   BIN_DIR      the fuzz binaries (default build-fuzz/tests)
#   LIB_DIR      shared libraries for the fuzz binaries only (LD_LIBRARY_PATH of the fuzzers,
#                not of this script's tools: a pack's Debian libraries stay out of bash, tar)
#   CORPUS_DIRS  ':'-separated roots of <target>/ seed directories (default tests/fuzz/corpus)
#   OUT          results (default build-fuzz/fuzz-fork); WORK: scratch (default mktemp -d)
#   TIMEOUT      seconds per input (default 10); RSS_MB per job (default 2048)
#   COMMIT       the commit the binaries were built from (default: BIN_DIR/COMMIT or git)
# KILN_SOURCE_DIR (fuzz_chat_json's templates: $KILN_SOURCE_DIR/tests/fuzz/corpus/fuzz_template;
# fuzz_http's model: .../fuzz_model_gguf/llama-q8_0.gguf)
# and KILN_SHARED_DIR (fuzz_tokenizer's vocabularies: $KILN_SHARED_DIR/testdata/tokenizer)
# default to this checkout and ../shared.
#
# The pack for the GPU host (docs/RELIABILITY.md): binaries, libraries, corpora, this
# script and the two vocabularies under one folder; there
#   cd DIR && LIB_DIR=$PWD/lib BIN_DIR=$PWD/bin CORPUS_DIRS=$PWD/corpus \
#     KILN_SOURCE_DIR=$PWD KILN_SHARED_DIR=$PWD OUT=$OUT bash run_fork.sh
# (scripts/fuzz-pack.sh says how to unpack it there)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." 2>/dev/null && pwd)
secs=${SECONDS_MAX:-420}
cores=${CORES:-$(nproc)}
bindir=${BIN_DIR:-$root/build-fuzz/tests}
libpath=${LIB_DIR:+$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}
libpath=${libpath:-${LD_LIBRARY_PATH:-}}
corpus_dirs=${CORPUS_DIRS:-$root/tests/fuzz/corpus}
out=${OUT:-$root/build-fuzz/fuzz-fork}
timeout=${TIMEOUT:-10}
rss=${RSS_MB:-2048}
# kiln's warnings about rejected inputs (e.g. "default eos token out of range", one
# line per input of fuzz_hf_tokenizer) only slow a long run: errors only (KILN_LOG overrides)
export KILN_LOG=${KILN_LOG:-error}
export KILN_SOURCE_DIR=${KILN_SOURCE_DIR:-$root} KILN_SHARED_DIR=${KILN_SHARED_DIR:-$root/../shared}
export KILN_NO_PROGRESS=1
# UBSan reports are fatal in the build (-fno-sanitize-recover); these make ASan/UBSan name
# the frames of a report in the log
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
if [ -n "${COMMIT:-}" ]; then
  commit=$COMMIT
elif [ -f "$bindir/COMMIT" ]; then
  commit=$(cat "$bindir/COMMIT")
else
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_chat_json fuzz_perfdb fuzz_hf_tokenizer fuzz_tokenizer
                                     fuzz_model_gguf fuzz_template fuzz_quants fuzz_http)
# -max_len per target: fuzz_max_len of max_len.sh (beside this script)
. "$here/max_len.sh"
# share of the cores (out of 64): enough for 10 M executions in ~7 minutes for the four
# that can get there (quants, chat_json, tokenizer, hf_tokenizer: 2.7-4.4 k core-seconds for
# 10 M at their exec/s on this VM), the rest to the three that cannot (template and
# model_gguf ~13 k, perfdb ~28 k core-seconds), which add up over runs
weight() {
  case $1 in
    fuzz_tokenizer | fuzz_hf_tokenizer) echo 12 ;;
    fuzz_chat_json) echo 11 ;;
    fuzz_quants | fuzz_template | fuzz_model_gguf) echo 8 ;;
    fuzz_perfdb) echo 5 ;;
    fuzz_http) echo 8 ;; # ~700 exec/s a job on this VM (a server round trip per input)
    *) echo 4 ;;
  esac
}
declare -A jobs=()
for kv in ${FORKS:-}; do jobs[${kv%%=*}]=${kv#*=}; done
left=$cores
wsum=0
for t in "${targets[@]}"; do
  if [ -n "${jobs[$t]:-}" ]; then left=$((left - jobs[$t])); else wsum=$((wsum + $(weight "$t"))); fi
done
for t in "${targets[@]}"; do
  if [ -z "${jobs[$t]:-}" ]; then
    n=$(( wsum > 0 && left > 0 ? left * $(weight "$t") / wsum : 1 ))
    jobs[$t]=$(( n > 0 ? n : 1 ))
  fi
done

work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-fork-XXXXXX")}
mkdir -p "$out" "$work/logs"
echo "run_fork: ${#targets[@]} targets, ${secs}s, $cores cores, commit $commit, work $work" >&2
pids=()
for t in "${targets[@]}"; do
  bin=$bindir/$t
  [ -x "$bin" ] || { echo "run_fork: no $bin" >&2; continue; }
  seeds=()
  IFS=: read -ra roots <<<"$corpus_dirs"
  for r in "${roots[@]}"; do [ -d "$r/$t" ] && seeds+=("$r/$t"); done
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  echo "run_fork: $t: ${jobs[$t]} jobs, -max_len=$(fuzz_max_len "$t"), seeds ${seeds[*]:-none}" >&2
  # the first directory gets the new inputs; timeout signals its whole process group (the
  # fork jobs too)
  ( cd "$work/$t" &&
    start=$(date +%s) &&
    timeout -s INT -k 15 $((secs + 90)) env LD_LIBRARY_PATH="$libpath" nice -n 19 "$bin" \
      -fork="${jobs[$t]}" \
      -max_total_time="$secs" -rss_limit_mb="$rss" -timeout="$timeout" \
      -max_len="$(fuzz_max_len "$t")" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
      -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
      "$work/$t/corpus" "${seeds[@]}" >"$work/logs/$t.log" 2>&1
    echo "$? $(( $(date +%s) - start ))" >"$work/$t/rc" ) &
  pids+=($!)
done
wait "${pids[@]}"

tsv=$out/results.tsv
[ -f "$tsv" ] || printf 'target\tcommit\tjobs\tseconds\texecs\texec/s\tcov\tft\tcorpus\toom\ttimeout\tcrash\tartifacts\tresult\n' >"$tsv"
for t in "${targets[@]}"; do
  [ -f "$work/$t/rc" ] || continue
  read -r rc el <"$work/$t/rc"
  log=$work/logs/$t.log
  last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
  execs=$(echo "$last" | sed -n 's/^#\([0-9]*\):.*/\1/p')
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | awk '{print $2}')
  otc=$(echo "$last" | grep -o 'oom/timeout/crash: [0-9/]*' | awk '{print $2}')
  IFS=/ read -r oom tmo crash <<<"${otc:-?/?/?}"
  arts=$(find "$work/$t/artifacts" -type f | wc -l)
  res=ok
  [ "$rc" = 124 ] && res="ok (stopped at SECONDS_MAX + 90)"
  if { [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || [ "${oom:-?}/${tmo:-?}/${crash:-?}" != 0/0/0 ] || [ "$arts" != 0 ]; then
    res="FAIL(rc=$rc)"
  fi
  eps=$(( el > 0 ? ${execs:-0} / el : 0 ))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$commit" "${jobs[$t]}" \
    "$el" "${execs:-?}" "$eps" "${cov:-?}" "${ft:-?}" "${corp:-?}" "${oom:-?}" "${tmo:-?}" \
    "${crash:-?}" "$arts" "$res" >>"$tsv"
done
(cd "$work" && tar czf "$out/logs.tgz" logs)
(cd "$work" && tar czf "$out/artifacts.tgz" $(for t in "${targets[@]}"; do [ -d "$t/artifacts" ] && echo "$t/artifacts"; done))
# the new inputs (16 MiB is what a device call brings back per file): the targets' corpora
# from the smallest up, as many as fit in 15 MiB (a big one, e.g. fuzz_template's after a
# 64-core run, no longer keeps the small ones from coming back)
corp=()
while read -r _ d; do corp+=("$d"); done < <(cd "$work" && for t in "${targets[@]}"; do
  [ -d "$t/corpus" ] && echo "$(du -sk "$t/corpus" | cut -f1) $t/corpus"; done | sort -n)
while [ ${#corp[@]} -gt 0 ]; do
  (cd "$work" && tar czf "$out/corpus-new.tgz" "${corp[@]}")
  [ "$(stat -c %s "$out/corpus-new.tgz")" -le $((15 * 1024 * 1024)) ] && break
  echo "run_fork: corpus-new.tgz over 15 MiB: ${corp[-1]} left out" >&2
  unset 'corp[-1]'
  rm -f "$out/corpus-new.tgz"
done
column -t -s $'\t' "$tsv" 2>/dev/null || cat "$tsv"
[ -n "${WORK:-}" ] || rm -rf "$work"
