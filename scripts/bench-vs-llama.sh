#!/usr/bin/env bash
# bench-vs-llama.sh — kiln bench and llama-bench side by side, in one run, on the same
# model files and thread count; prints both and the kiln / llama.cpp ratios.
#
#   LLAMA_BENCH=/work/llama.cpp/build/bin/llama-bench scripts/bench-vs-llama.sh \
#       [-t THREADS] [-p N] [-n N] [-r REPS] [-k KILN] MODEL.gguf [MODEL.gguf ...]
#
# The two benchmarks alternate per model (kiln, llama.cpp, next model...), so slow
# drifts of the machine hit both. llama-bench runs with its defaults otherwise (f16 KV
# cache, like kiln bench). This script never builds llama.cpp: LLAMA_BENCH must point
# at an existing binary. Output: a markdown table (model, test, kiln t/s, llama.cpp t/s,
# ratio) and, with -j FILE, the raw JSON of both tools.
set -euo pipefail

threads=2 n_prompt=128 n_gen=32 reps=5
kiln="$(cd "$(dirname "$0")/.." && pwd)/build/kiln"
json_out=""
while getopts "t:p:n:r:k:j:h" o; do
  case $o in
    t) threads=$OPTARG ;;
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    k) kiln=$OPTARG ;;
    j) json_out=$OPTARG ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "bench-vs-llama: give at least one model file" >&2; exit 2; }
: "${LLAMA_BENCH:?set LLAMA_BENCH to an already built llama-bench binary}"
[ -x "$LLAMA_BENCH" ] || { echo "bench-vs-llama: $LLAMA_BENCH is not executable" >&2; exit 2; }
[ -x "$kiln" ] || { echo "bench-vs-llama: $kiln not found (build kiln first, or -k)" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench-vs-llama: needs jq" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# kiln $(git -C "$(dirname "$0")" rev-parse --short=12 HEAD 2>/dev/null || echo '?') vs" \
     "$("$LLAMA_BENCH" --version 2>&1 | grep -m1 -i 'version' || echo llama-bench)"
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, threads $threads, pp$n_prompt tg$n_gen, $reps reps"
echo
printf '| model | test | kiln t/s | llama.cpp t/s | kiln / llama.cpp |\n'
printf '| --- | --- | ---: | ---: | ---: |\n'
i=0
for m in "$@"; do
  i=$((i + 1))
  "$kiln" bench -m "$m" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o json \
    > "$tmp/kiln$i.json"
  "$LLAMA_BENCH" -m "$m" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o json \
    > "$tmp/llama$i.json" 2> "$tmp/llama$i.err" || { cat "$tmp/llama$i.err" >&2; exit 1; }
  for test in "pp$n_prompt" "tg$n_gen"; do
    kp=$(jq -r --arg t "$test" '.[] | select(.test == $t) | "\(.avg_ts) \(.stddev_ts)"' "$tmp/kiln$i.json")
    if [ "${test#pp}" != "$test" ]; then
      lp=$(jq -r --argjson n "$n_prompt" '.[] | select(.n_prompt == $n and .n_gen == 0) | "\(.avg_ts) \(.stddev_ts)"' "$tmp/llama$i.json")
    else
      lp=$(jq -r --argjson n "$n_gen" '.[] | select(.n_gen == $n and .n_prompt == 0) | "\(.avg_ts) \(.stddev_ts)"' "$tmp/llama$i.json")
    fi
    read -r ka ks <<< "$kp"
    read -r la ls <<< "$lp"
    ratio=$(awk -v a="$ka" -v b="$la" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    printf '| %s | %s | %.2f ± %.2f | %.2f ± %.2f | %s |\n' "$(basename "$m")" "$test" \
      "$ka" "$ks" "$la" "$ls" "$ratio"
  done
done
if [ -n "$json_out" ]; then
  jq -n --argjson k "$(jq -s 'add' "$tmp"/kiln*.json)" --argjson l "$(jq -s 'add' "$tmp"/llama*.json)" \
    '{kiln: $k, llama: $l}' > "$json_out"
fi
