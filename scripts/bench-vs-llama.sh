#!/usr/bin/env bash
# bench-vs-llama.sh — kiln and llama.cpp side by side, in one run, on the same model files
# and thread count; prints medians, spreads and the kiln / llama.cpp ratios.
#
#   LLAMA_BENCH=/work/llama.cpp/build/bin/llama-bench scripts/bench-vs-llama.sh \
#       [-t THREADS] [-p N] [-n N] [-r REPS] [-k KILN] [-b BENCH_CPU_MATMUL] [-j FILE] \
#       [-g GGUF -G N] MODEL.gguf [MODEL.gguf ...]
#
# Per model, REPS rounds of (kiln bench -r 1, llama-bench -r 1), alternating A B A B, so
# drifts and bursts of a shared machine hit both; each invocation does its own warm-up
# run. A cell is the median of the REPS rounds, [min-max] after it; the ratio is of the
# medians, and "pairs" is the range of the per-round ratios. llama-bench runs with its
# defaults otherwise (f16 KV cache, like kiln bench).
#
# Memory bandwidth is measured in the same run (bench_cpu_matmul -d none: 1 GiB read by
# THREADS threads, 2 MiB pages, best of 5) before and after the models; each tg row then
# also shows kiln's and llama.cpp's weight stream (bytes of weights read per token x t/s,
# from `kiln inspect`) and its fraction of the larger of the two bandwidth runs.
# The bandwidth of this VM moves by +-30 % within minutes, so it is also measured before
# every round (best of 3), and each tg row shows kiln's stream over that round's own
# bandwidth: the median and range of the per-round fractions ("kiln of round bw").
#
# -g GGUF: also sampled generation (-G tokens, default 64) with each tool's default
# sampler: `kiln run -m GGUF -p PROMPT -n N --ignore-eos $KILN_RUN_ARGS` against
# `$LLAMA_COMPLETION -m GGUF -p PROMPT -n N --ignore-eos -no-cnv` (its defaults), REPS
# alternating rounds, decode tokens per second as each tool reports it.
#
# This script never builds llama.cpp: LLAMA_BENCH (and LLAMA_COMPLETION for -g) must point
# at existing binaries. -j FILE writes every raw number as JSON lines, as the rounds finish.
set -euo pipefail

threads=2 n_prompt=128 n_gen=32 reps=3 gguf_s="" n_s=64
root="$(cd "$(dirname "$0")/.." && pwd)"
kiln="$root/build/kiln"
bwbench="$root/build/bench/bench_cpu_matmul"
json_out=""
while getopts "t:p:n:r:k:b:j:g:G:h" o; do
  case $o in
    t) threads=$OPTARG ;;
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    k) kiln=$OPTARG ;;
    b) bwbench=$OPTARG ;;
    j) json_out=$OPTARG ;;
    g) gguf_s=$OPTARG ;;
    G) n_s=$OPTARG ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || [ -n "$gguf_s" ] || { echo "bench-vs-llama: give at least one model file" >&2; exit 2; }
: "${LLAMA_BENCH:?set LLAMA_BENCH to an already built llama-bench binary}"
[ -x "$LLAMA_BENCH" ] || { echo "bench-vs-llama: $LLAMA_BENCH is not executable" >&2; exit 2; }
[ -x "$kiln" ] || { echo "bench-vs-llama: $kiln not found (build kiln first, or -k)" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench-vs-llama: needs jq" >&2; exit 2; }
if [ -n "$gguf_s" ]; then
  : "${LLAMA_COMPLETION:?-g needs LLAMA_COMPLETION (an already built llama-completion)}"
  [ -x "$LLAMA_COMPLETION" ] || { echo "bench-vs-llama: $LLAMA_COMPLETION is not executable" >&2; exit 2; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
raw="${json_out:-$tmp/raw.jsonl}" # -j: written as the rounds finish
: > "$raw"

# median / min / max of the numbers on stdin
stats() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "0 0 0"; exit }
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.6g %.6g %.6g\n", m, v[1], v[NR] }'; }

bandwidth() { # prints the best 2 MiB-page read bandwidth in GB/s, or 0
  [ -x "$bwbench" ] || { echo 0; return; }
  "$bwbench" -t "$threads" -r 5 -d none 2>/dev/null |
    sed -n 's/.*2 MiB pages): best \([0-9.]*\) GB\/s.*/\1/p' | head -1
}

# Bytes of weights read per decoded token: every tensor of the file except the token
# embedding table (one row of it is read: left out), unless the LM head is tied to it (no
# output.weight), when it is read whole. From `kiln inspect --json`.
weight_bytes() {
  "$kiln" inspect --json -m "$1" 2>/dev/null | jq '[.tensors[] | {n: .stored_name, b: .bytes}] as $t |
    ($t | map(select(.n != "token_embd.weight") | .b) | add) +
    (if ($t | map(.n) | index("output.weight")) then 0
     else ($t | map(select(.n == "token_embd.weight") | .b) | add) end)' 2>/dev/null || echo 0
}

kiln_rev=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo '?')
echo "# kiln $kiln_rev ($kiln) vs llama.cpp ($LLAMA_BENCH)"
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), threads $threads," \
     "pp$n_prompt tg$n_gen, $reps alternating rounds"
bw0=$(bandwidth)
echo "# memory read bandwidth before: ${bw0:-0} GB/s (2 MiB pages, $threads threads, best of 5)"
echo

declare -A K L B
i=0
for m in "$@"; do
  i=$((i + 1))
  for r in $(seq 1 "$reps"); do
    bwr=$("$bwbench" -t "$threads" -r 3 -d none 2>/dev/null |
      sed -n 's/.*2 MiB pages): best \([0-9.]*\) GB\/s.*/\1/p' | head -1)
    B[$i]+="${bwr:-0} "
    "$kiln" bench -m "$m" -t "$threads" -p "$n_prompt" -n "$n_gen" -r 1 -o json > "$tmp/k.json"
    "$LLAMA_BENCH" -m "$m" -t "$threads" -p "$n_prompt" -n "$n_gen" -r 1 -o json \
      > "$tmp/l.json" 2> "$tmp/l.err" || { cat "$tmp/l.err" >&2; exit 1; }
    for test in "pp$n_prompt" "tg$n_gen"; do
      kv=$(jq -r --arg t "$test" '.[] | select(.test == $t) | .avg_ts' "$tmp/k.json")
      if [ "${test#pp}" != "$test" ]; then
        lv=$(jq -r --argjson n "$n_prompt" '.[] | select(.n_prompt == $n and .n_gen == 0) | .avg_ts' "$tmp/l.json")
      else
        lv=$(jq -r --argjson n "$n_gen" '.[] | select(.n_gen == $n and .n_prompt == 0) | .avg_ts' "$tmp/l.json")
      fi
      K[$i,$test]+="$kv "
      L[$i,$test]+="$lv "
      printf '{"model":"%s","test":"%s","round":%d,"kiln_ts":%s,"llama_ts":%s,"bw_gbs":%s,"t":"%s"}\n' \
        "$(basename "$m")" "$test" "$r" "$kv" "$lv" "${bwr:-0}" "$(date -u +%T)" >> "$raw"
    done
  done
done

bw1=$(bandwidth)
bw=$(awk -v a="${bw0:-0}" -v b="${bw1:-0}" 'BEGIN { print (a > b ? a : b) }')
echo "# memory read bandwidth after: ${bw1:-0} GB/s; the tg rows use $bw GB/s; finished $(date -u +%T)," \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf '| model | test | kiln t/s median [min-max] | llama.cpp t/s median [min-max] | kiln / llama.cpp | pairs | weights MB/token | kiln GB/s (of bw) | llama.cpp GB/s (of bw) | kiln of round bw | llama.cpp of round bw |\n'
printf '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
i=0
for m in "$@"; do
  i=$((i + 1))
  wb=$(weight_bytes "$m")
  for test in "pp$n_prompt" "tg$n_gen"; do
    read -r km kmin kmax <<< "$(tr ' ' '\n' <<< "${K[$i,$test]}" | grep . | stats)"
    read -r lm lmin lmax <<< "$(tr ' ' '\n' <<< "${L[$i,$test]}" | grep . | stats)"
    read -r _ pmin pmax <<< "$(paste -d' ' <(tr ' ' '\n' <<< "${K[$i,$test]}" | grep .) \
      <(tr ' ' '\n' <<< "${L[$i,$test]}" | grep .) | awk '$2 > 0 { print $1 / $2 }' | stats)"
    ratio=$(awk -v a="$km" -v b="$lm" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
    extra=" | | | |"
    if [ "${test#tg}" != "$test" ] && [ "${wb:-0}" -gt 0 ]; then
      extra=$(awk -v w="$wb" -v k="$km" -v l="$lm" -v bw="$bw" 'BEGIN {
        kg = w * k / 1e9; lg = w * l / 1e9
        if (bw > 0) printf "%.1f | %.1f (%.0f %%) | %.1f (%.0f %%)", w / 1e6, kg, 100 * kg / bw, lg, 100 * lg / bw
        else printf "%.1f | %.1f | %.1f", w / 1e6, kg, lg }')
      # per round: that round's stream over that round's bandwidth (percent)
      frac() { paste -d' ' <(tr ' ' '\n' <<< "$1" | grep .) <(tr ' ' '\n' <<< "${B[$i]}" | grep .) |
        awk -v w="$wb" '$2 > 0 { print 100 * w * $1 / 1e9 / $2 }' | stats; }
      read -r fkm fkmin fkmax <<< "$(frac "${K[$i,$test]}")"
      read -r flm flmin flmax <<< "$(frac "${L[$i,$test]}")"
      extra+=$(printf ' | %.0f %% [%.0f-%.0f] | %.0f %% [%.0f-%.0f]' "$fkm" "$fkmin" "$fkmax" "$flm" "$flmin" "$flmax")
    fi
    printf '| %s | %s | %.2f [%.2f-%.2f] | %.2f [%.2f-%.2f] | %s | %.2f-%.2f | %s |\n' "$(basename "$m")" \
      "$test" "$km" "$kmin" "$kmax" "$lm" "$lmin" "$lmax" "$ratio" "$pmin" "$pmax" "$extra"
  done
done

if [ -n "$gguf_s" ]; then
  prompt="The capital of France is"
  ks="" ls=""
  for r in $(seq 1 "$reps"); do
    # shellcheck disable=SC2086
    kt=$("$kiln" run -m "$gguf_s" -p "$prompt" -n "$n_s" -t "$threads" --ignore-eos ${KILN_RUN_ARGS:-} \
      2>&1 >/dev/null | sed -n 's/.*generated [0-9]* tokens in [0-9.]* ms (\([0-9.]*\) tok\/s).*/\1/p')
    lt=$("$LLAMA_COMPLETION" -m "$gguf_s" -p "$prompt" -n "$n_s" -t "$threads" --ignore-eos -no-cnv \
      < /dev/null 2>&1 >/dev/null | sed -n 's/.*eval time.*runs.*, *\([0-9.]*\) tokens per second.*/\1/p' | tail -1)
    ks+="${kt:-0} " ls+="${lt:-0} "
    printf '{"model":"%s","test":"run-n%d","round":%d,"kiln_ts":%s,"llama_ts":%s,"t":"%s"}\n' \
      "$(basename "$gguf_s")" "$n_s" "$r" "${kt:-0}" "${lt:-0}" "$(date -u +%T)" >> "$raw"
  done
  read -r km kmin kmax <<< "$(tr ' ' '\n' <<< "$ks" | grep . | stats)"
  read -r lm lmin lmax <<< "$(tr ' ' '\n' <<< "$ls" | grep . | stats)"
  ratio=$(awk -v a="$km" -v b="$lm" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  echo
  echo "Sampled generation, $n_s tokens, each tool's default sampler (kiln run ${KILN_RUN_ARGS:-}" \
       "vs llama-completion), decode tok/s as each reports it:"
  echo
  printf '| model | kiln run tok/s | llama-completion tok/s | kiln / llama.cpp |\n| --- | ---: | ---: | ---: |\n'
  printf '| %s | %.2f [%.2f-%.2f] | %.2f [%.2f-%.2f] | %s |\n' "$(basename "$gguf_s")" "$km" "$kmin" "$kmax" \
    "$lm" "$lmin" "$lmax" "$ratio"
fi
