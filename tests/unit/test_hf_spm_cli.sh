#!/usr/bin/env bash
# test_hf_spm_cli.sh — `kiln run -m DIR` on a Hugging Face checkpoint whose tokenizer.json
# is SentencePiece-style BPE (byte_fallback, Prepend/Replace normalizer, as kiln-gen
# --format hf derives it from the llama SPM vocabulary): the prompt's ids equal those
# of the GGUF with the same vocabulary (including CJK and byte-fallback characters) and
# the greedy generation equals the GGUF's (same weights, same seed). $1 = kiln binary.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
VOCAB=${KILN_SHARED_DIR:-$KILN_SOURCE_DIR/../shared}/testdata/tokenizer/ggml-vocab-llama-spm.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$GEN" -q -p tiny -f llama -t f16 -s 3 --vocab "$VOCAB" --format hf -o "$T/hf"
"$GEN" -q -p tiny -f llama -t f16 -s 3 --vocab "$VOCAB" -o "$T/m.gguf"
grep -q '"byte_fallback": *true' "$T/hf/tokenizer.json" || fail "kiln-gen did not write byte_fallback"
p="The capital of France is 東京 🦙 –  naïve"
a=$("$KILN" tokenize -m "$T/hf" --add-special --ids "$p" 2>"$T/err") || fail "tokenize DIR: $(cat "$T/err")"
b=$("$KILN" tokenize -m "$T/m.gguf" --add-special --ids "$p")
[ "$a" = "$b" ] || fail "ids differ: tokenizer.json [$a] GGUF [$b]"
x=$("$KILN" run -m "$T/hf" -p "$p" -n 12 --temp 0 --ids -t 2 2>"$T/err") || fail "run DIR: $(cat "$T/err")"
y=$("$KILN" run -m "$T/m.gguf" -p "$p" -n 12 --temp 0 --ids -t 2 2>/dev/null)
[ "$x" = "$y" ] || fail "greedy ids differ: DIR [$x] GGUF [$y]"
echo "SentencePiece-style tokenizer.json OK"
