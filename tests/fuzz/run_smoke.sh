#!/usr/bin/env bash
# Smoke test of a libFuzzer target (CTest label `fuzz`, run by scripts/test.sh):
#   1. replay every file of the seed corpus (regression: each must parse without a
#      crash, leak or sanitizer report);
#   2. fuzz for a short fixed time (KILN_FUZZ_SECONDS, default 20) starting from the
#      corpus; new inputs go to a temporary directory, never into the committed corpus.
# usage: run_smoke.sh FUZZ_BINARY CORPUS_DIR
set -euo pipefail
bin=$1
corpus=$2
secs=${KILN_FUZZ_SECONDS:-20}
[ -x "$bin" ] || { echo "run_smoke.sh: $bin is not executable" >&2; exit 2; }
[ -d "$corpus" ] || { echo "run_smoke.sh: no corpus directory $corpus" >&2; exit 2; }
shopt -s nullglob
seeds=("$corpus"/*)
[ ${#seeds[@]} -gt 0 ] || { echo "run_smoke.sh: empty corpus $corpus" >&2; exit 2; }
echo "replaying ${#seeds[@]} corpus files"
"$bin" -rss_limit_mb=2048 -timeout=10 "${seeds[@]}"
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "fuzzing for ${secs}s"
"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
       -print_final_stats=1 "$work" "$corpus"
