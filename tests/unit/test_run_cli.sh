#!/usr/bin/env bash
# test_run_cli.sh — `kiln run`, `kiln perplexity` and `kiln chat` end to end on kiln-gen
# models of every family (GGUF; kiln-gen's HF tokenizer.json is SentencePiece-style BPE,
# which the tokenizer does not read yet): greedy output is deterministic and
# the same through --ids, the prompt is not echoed, speeds go to stderr, perplexity ends
# with "PPL = <value>", chat answers two turns, bad input fails with a message.
# $1 is the kiln binary; kiln-gen sits next to it.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
[ -x "$GEN" ] || { echo "kiln-gen not found next to $1"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for fam in llama qwen2 qwen3 gemma3; do
  "$GEN" -q -p tiny -f $fam -t q8_0 -s 3 -o "$T/$fam.gguf"
  a=$("$KILN" run -m "$T/$fam.gguf" -p "hello world" -n 12 --temp 0 -t 2 2>"$T/err") || fail "$fam run: $(cat "$T/err")"
  b=$("$KILN" run -m "$T/$fam.gguf" -p "hello world" -n 12 --temp 0 -t 1 2>/dev/null)
  [ "$a" = "$b" ] || fail "$fam: greedy output differs between 1 and 2 threads"
  grep -q "generated 12 tokens" "$T/err" || grep -q "generated [0-9]* tokens" "$T/err" || fail "$fam: no speed line on stderr"
  ids=$("$KILN" run -m "$T/$fam.gguf" -p "hello world" -n 12 --temp 0 --ids 2>/dev/null)
  [[ "$ids" =~ ^[0-9\ ]+$ ]] || fail "$fam --ids printed '$ids'"
  s1=$("$KILN" run -m "$T/$fam.gguf" -p "hello" -n 8 --temp 1 --seed 5 --ids 2>/dev/null)
  s2=$("$KILN" run -m "$T/$fam.gguf" -p "hello" -n 8 --temp 1 --seed 5 --ids 2>/dev/null)
  [ "$s1" = "$s2" ] || fail "$fam: same seed gave different samples"
  head -c 3000 "$KILN_SOURCE_DIR/tests/data/parity/text.txt" > "$T/text.txt"
  last=$("$KILN" perplexity -m "$T/$fam.gguf" -f "$T/text.txt" -c 64 -t 2 2>/dev/null | tail -1)
  [[ "$last" =~ ^PPL\ =\ [0-9]+\.[0-9]+$ ]] || fail "$fam perplexity last line '$last'"
done
# chat: two turns with the built-in gemma template, KV prefix reused on turn 2
printf 'hi\nagain\n' | "$KILN" chat -m "$T/gemma3.gguf" --temp 0 -n 4 >/dev/null 2>"$T/err" || fail "chat: $(cat "$T/err")"
grep -q "reused" "$T/err" || fail "chat: no turn statistics"
[ "$(grep -c reused "$T/err")" = 2 ] || fail "chat: expected two turns"
grep -q "(0 reused)" "$T/err" || fail "chat: first turn should reuse nothing"
! grep -q "^\[.*(0 reused)" <(sed -n 2p "$T/err") || fail "chat: second turn reused nothing"
# errors
"$KILN" run -m "$T/nope.gguf" -p x 2>"$T/err" && fail "missing model accepted"
grep -q "nope.gguf" "$T/err" || fail "missing model message does not name it"
"$KILN" run -m "$T/llama.gguf" 2>/dev/null && fail "run without a prompt accepted"
"$KILN" perplexity -m "$T/llama.gguf" -f "$T/text.txt" -c 100000 2>"$T/err" && fail "too-short text accepted"
grep -q "needs at least" "$T/err" || fail "short text message: $(cat "$T/err")"
echo "run/perplexity/chat CLI OK"
