#!/usr/bin/env bash
# serve_bench.sh — kiln serve next to llama-server on the same model and load, in one run.
#   bench/serve_bench.sh KILN MODEL.gguf [LLAMA_SERVER] [CLIENTS...]
# For each client count (default 1 8 32 128): both servers get the same synthetic
# ShareGPT-like requests (tests/serve/loadgen.py bench: Poisson arrivals, log-normal
# prompt/output lengths, end-of-text banned so both generate max_tokens), kiln with
# --slots N, llama-server with --parallel N (continuous batching is on by default).
# Prints one JSON line per (server, clients) plus kiln's server time per streamed token
# outside the generation loop, from /metrics (docs/SERVE.md "Server time per streamed
# token"): http_cpu_us_per_token = the CPU time of libmicrohttpd's one thread while a
# stream is open (wakeups, formatting, send(), accepting and parsing requests) plus the
# resumes of parked connections (in the scheduler's sink), per token;
# http_us_per_token = the same thread's time running or waiting for a core, plus the
# resumes; http_collect_us_per_token = the part collecting and formatting chunks under
# the loop lock; http_resumes_per_token / http_batches_per_step = resumes per token and
# resume bursts per scheduler step (1: one wakeup of the HTTP thread per step). Env:
# THREADS (default 2),
# REQS (requests per client, default 4), RATE (requests/s per client, default 1), EOS
# (banned ids, default 0,2 = SmolLM2's), PORT (kiln's; llama-server's is PORT + 1;
# default 18181).
# KILN_ARGS / LS_ARGS (extra flags, e.g. "--backend cuda --kv-f16" / "-ngl 99 -fa on"
# on a GPU).
# STEADY=TOKENS: instead, kiln alone with N streams started at once, each TOKENS tokens
# long (end-of-text banned), per client count: the steady-state server time per token
# (kiln_http_stream_cpu_seconds_total / tokens over the run) and output tok/s.
set -euo pipefail
KILN=$1 MODEL=$2 LS=${3:-}
shift $(( $# >= 3 ? 3 : $# ))
CLIENTS=("$@"); [ ${#CLIENTS[@]} -gt 0 ] || CLIENTS=(1 8 32 128)
THREADS=${THREADS:-2} REQS=${REQS:-4} RATE=${RATE:-1} EOS=${EOS:-0,2} PORT=${PORT:-18181}
read -r -a KA <<<"${KILN_ARGS:-}"
read -r -a LA <<<"${LS_ARGS:-}"
HERE=$(cd "$(dirname "$0")" && pwd)
LG=$HERE/../tests/serve/loadgen.py
T=$(mktemp -d); trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
PID=
wait_http() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
if [ -n "${STEADY:-}" ]; then
  "$KILN" serve -m "$MODEL" --port $PORT -t "$THREADS" --slots 128 --queue 4096 -c 2048 \
    --alias bench "${KA[@]}" 2>"$T/kiln.log" & PID=$!
  wait_http $PORT || { tail "$T/kiln.log"; exit 1; }
  met() { curl -s http://127.0.0.1:$PORT/metrics | awk '/^kiln_http_stream_cpu_seconds_total/{c=$2}
    /^kiln_http_stream_tokens_total/{t=$2} END{print c, t}'; }
  ban=$(python3 -c "import json; print(json.dumps({i: -100 for i in '$EOS'.split(',')}))")
  for n in "${CLIENTS[@]}"; do
    read -r c0 t0 <<<"$(met)"; w0=$(date +%s.%N); pids=()
    for k in $(seq "$n"); do
      curl -sN http://127.0.0.1:$PORT/v1/completions -o /dev/null -d "{\"model\":\"bench\",\"prompt\":\"Once upon a time $k\",\"stream\":true,\"max_tokens\":$STEADY,\"logit_bias\":$ban}" &
      pids+=($!)
    done
    wait "${pids[@]}"
    read -r c1 t1 <<<"$(met)"; w1=$(date +%s.%N)
    python3 -c "print('kiln steady streams=$n tokens=%d http_cpu_us_per_token=%.1f out_tok_per_s=%.1f' % ($t1-$t0, ($c1-$c0)/max(1,$t1-$t0)*1e6, ($t1-$t0)/($w1-$w0)))"
  done
  kill -TERM $PID; wait $PID || true
  exit 0
fi
for n in "${CLIENTS[@]}"; do
  reqs=$(( n * REQS ))
  "$KILN" serve -m "$MODEL" --port $PORT -t "$THREADS" --slots "$n" --queue 4096 -c 2048 \
    --alias bench "${KA[@]}" 2>"$T/kiln.log" & PID=$!
  wait_http $PORT || { tail "$T/kiln.log"; exit 1; }
  out=$(python3 "$LG" bench http://127.0.0.1:$PORT bench --clients "$n" --requests "$reqs" \
        --rate-per-client "$RATE" --eos "$EOS")
  m=$(curl -s http://127.0.0.1:$PORT/metrics)
  s=$(echo "$m" | awk '/^kiln_http_stream_seconds_total/{print $2}')
  k=$(echo "$m" | awk '/^kiln_http_stream_tokens_total/{print $2}')
  cs=$(echo "$m" | awk '/^kiln_http_stream_cpu_seconds_total/{print $2}')
  ks=$(echo "$m" | awk '/^kiln_http_stream_collect_seconds_total/{print $2}')
  rs=$(echo "$m" | awk '/^kiln_http_resumes_total/{print $2}')
  bs=$(echo "$m" | awk '/^kiln_http_resume_batches_total/{print $2}')
  ns=$(echo "$m" | awk '/^kiln_steps_total/{print $2}')
  kill -TERM $PID; wait $PID || true; PID=
  echo "kiln $out http_us_per_token=$(python3 -c "print(round($s/$k*1e6,2) if $k else 0)") http_cpu_us_per_token=$(python3 -c "print(round(${cs:-0}/$k*1e6,2) if $k else 0)") http_collect_us_per_token=$(python3 -c "print(round(${ks:-0}/$k*1e6,2) if $k else 0)") http_resumes_per_token=$(python3 -c "print(round(${rs:-0}/$k,2) if $k else 0)") http_batches_per_step=$(python3 -c "print(round(${bs:-0}/${ns:-1},2) if ${ns:-0} else 0)")"
  if [ -n "$LS" ]; then
    "$LS" -m "$MODEL" --port $((PORT + 1)) -t "$THREADS" --parallel "$n" -c $((2048 * n)) --no-webui \
      "${LA[@]}" >"$T/ls.log" 2>&1 & PID=$!
    wait_http $((PORT + 1)) || { tail "$T/ls.log"; exit 1; }
    out=$(python3 "$LG" bench http://127.0.0.1:$((PORT + 1)) bench --clients "$n" --requests "$reqs" \
          --rate-per-client "$RATE" --eos "$EOS")
    kill -TERM $PID; wait $PID || true; PID=
    echo "llama-server $out"
  fi
done
