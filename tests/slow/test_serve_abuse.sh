#!/usr/bin/env bash
# test_serve_abuse.sh (label slow) — `kiln serve` on a kiln-gen model under abuse
# (tests/slow/serve_abuse.py): every malformed request of issue #14 answered 4xx (bad
# JSON, wrong types, huge numbers, invalid UTF-8, 10 MB body, 5000 stop strings, n=10^6,
# max_tokens=10^9, negative temperature, NaN, deep nesting, out-of-range ids), 1100
# half-open (slowloris) connections not blocking /health, then concurrent streams with
# client disconnects and slow readers (KILN_ABUSE_STREAMS, default 32, for
# KILN_ABUSE_SECONDS, default 60): no errors, RSS after the warm-up half within 20% at
# the end, server healthy. $1 is the kiln binary; kiln-gen sits next to it.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 0; }
T=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
SHARED=${KILN_SHARED_DIR:-$(dirname "$0")/../data/shared}
TPL=$SHARED/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja
[ -f "$TPL" ] || TPL=$(dirname "$0")/../data/shared/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja
"$GEN" -q -p tiny -f llama -t q8_0 -s 7 -o "$T/m.gguf"
"$KILN" serve -m "$T/m.gguf" --alias m --port 0 --ready-file "$T/ready" -t 1 -c 512 --slots 8 \
  --queue 64 --chat-template "$TPL" 2>"$T/log" &
PID=$!
for _ in $(seq 200); do [ -f "$T/ready" ] && break; sleep 0.1; done
[ -f "$T/ready" ] || { echo "FAIL: server did not start"; cat "$T/log"; exit 1; }
python3 "$(dirname "$0")/serve_abuse.py" "$(cut -d' ' -f2 "$T/ready")" "$PID" 1100 \
  "${KILN_ABUSE_STREAMS:-32}" "${KILN_ABUSE_SECONDS:-60}"
