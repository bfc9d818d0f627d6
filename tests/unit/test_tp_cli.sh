#!/usr/bin/env bash
# test_tp_cli.sh — `kiln run|bench|serve|perplexity --tp N` on the cpu
# backend (docs/TP.md): on kiln-gen models of every family, greedy ids of TP = 2 and 4
# equal TP = 1's; --load-report shows every rank; bench names the group; a completion
# through the server; bad --tp values fail with a message. $1 is the kiln binary;
# kiln-gen sits next to it.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
[ -x "$GEN" ] || { echo "kiln-gen not found next to $1"; exit 1; }
T=$(mktemp -d)
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
export NCCL_NVLS_ENABLE=0 # NVLink multicast off (device docs); unused by the cpu backend

for fam in llama qwen2 qwen3 gemma3; do
  "$GEN" -q -p tiny -f $fam -t q8_0 -s 4 -o "$T/$fam.gguf"
  ref=$("$KILN" run -m "$T/$fam.gguf" -p "hello world" -n 24 --temp 0 --ids -t 2 2>"$T/err") ||
    fail "$fam tp 1: $(cat "$T/err")"
  for tp in 2 4; do
    got=$("$KILN" run -m "$T/$fam.gguf" -p "hello world" -n 24 --temp 0 --ids -t 2 --tp $tp 2>"$T/err") ||
      fail "$fam tp $tp: $(cat "$T/err")"
    [ "$got" = "$ref" ] || fail "$fam: tp $tp gave '$got', tp 1 '$ref'"
  done
done
"$KILN" run -m "$T/llama.gguf" -p "hi" -n 2 --temp 0 --tp 2 -t 2 --load-report >/dev/null 2>"$T/err" ||
  fail "load report: $(cat "$T/err")"
[ "$(grep -c '^tensor-parallel rank [01] of 2' "$T/err")" = 2 ] || fail "load report: not every rank"
"$KILN" bench -m "$T/qwen3.gguf" -p 16 -n 4 -r 1 -t 2 --tp 2 >"$T/bench" 2>"$T/err" || fail "bench: $(cat "$T/err")"
grep -q '| cpu tp2 | 2 | pp16 |' "$T/bench" || fail "bench table: $(cat "$T/bench")"
"$KILN" bench -m "$T/qwen3.gguf" -p 0 -n 4 -r 1 -t 2 --tp 2 -o json >"$T/bench" 2>/dev/null || fail "bench json"
grep -q '"tp": 2' "$T/bench" || fail "bench json: no tp"
# serve: one completion through a TP group
if command -v curl >/dev/null; then
  "$KILN" serve -m "$T/qwen2.gguf" --port 0 --tp 2 -t 2 --ready-file "$T/ready" 2>"$T/serve.err" &
  SRV=$!
  for _ in $(seq 100); do [ -s "$T/ready" ] && break; sleep 0.1; done
  [ -s "$T/ready" ] || fail "serve --tp 2 not ready: $(cat "$T/serve.err")"
  port=$(grep -o '[0-9]*' "$T/ready" | tail -1)
  out=$(curl -s -m 20 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "qwen2", "prompt": "hello", "max_tokens": 5, "temperature": 0}') || fail "serve request"
  echo "$out" | grep -q '"choices"' || fail "serve --tp 2 answered '$out'"
  kill "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=
fi
# perplexity (teacher forcing through the CLI): within 1e-5 relative (q8_0 weights: sums in
# another order, docs/TP.md)
head -c 3000 "$KILN_SOURCE_DIR/tests/data/parity/text.txt" > "$T/text.txt"
p1=$("$KILN" perplexity -m "$T/gemma3.gguf" -f "$T/text.txt" -c 64 -t 2 2>/dev/null | tail -1)
p2=$("$KILN" perplexity -m "$T/gemma3.gguf" -f "$T/text.txt" -c 64 -t 2 --tp 2 2>/dev/null | tail -1)
[[ "$p1" =~ ^PPL\ =\ [0-9]+\.[0-9]+$ ]] || fail "perplexity tp 1: '$p1'"
awk -v a="${p1#PPL = }" -v b="${p2#PPL = }" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' ||
  fail "perplexity: tp 2 '$p2', tp 1 '$p1'"
# errors
set +e
"$KILN" run -m "$T/llama.gguf" -p hi -n 1 --tp 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] || fail "--tp 0: rc $rc"
"$KILN" run -m "$T/llama.gguf" -p hi -n 1 --tp 3 >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "heads" "$T/err" || fail "--tp 3 on 4 heads: rc $rc, $(cat "$T/err")"
set -e
echo OK
