#!/usr/bin/env bash
# kiln_gen.sh — kiln-gen end to end: tiny models of every family in several dtypes, GGUF
# and HF layouts; determinism (same seed and any thread count give identical bytes);
# argument errors exit 2. $1 is the kiln binary; kiln-gen sits next to it.
set -euo pipefail
GEN="$(dirname "$1")/kiln-gen"
[ -x "$GEN" ] || { echo "kiln-gen not found next to $1"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for fam in llama qwen2 qwen3 gemma3; do
  for ty in f16 q4_0 q4_K; do
    "$GEN" -q -f "$fam" -t "$ty" -o "$T/$fam-$ty.gguf" || fail "$fam $ty"
    [ "$(head -c 4 "$T/$fam-$ty.gguf")" = "GGUF" ] || fail "$fam $ty: no GGUF magic"
    sz=$(stat -c %s "$T/$fam-$ty.gguf")
    [ "$sz" -gt 100000 ] && [ "$sz" -lt 8000000 ] || fail "$fam $ty: size $sz"
  done
done
# the Q4_K_M mix: mixed tensor types, llama.cpp's file type 15
"$GEN" -q -f llama -t q4_K_M --layers 8 -o "$T/m.gguf" || fail "q4_K_M"
# HF layout
for fam in llama qwen2 qwen3 gemma3; do
  "$GEN" -q -f "$fam" -t bf16 --format hf -o "$T/hf-$fam" || fail "hf $fam"
  for f in config.json tokenizer.json tokenizer_config.json generation_config.json model.safetensors; do
    [ -s "$T/hf-$fam/$f" ] || fail "hf $fam: $f missing"
  done
done
set +e
"$GEN" -q -t q4_0 --format hf -o "$T/hf-bad" 2>/dev/null; rc=$?
set -e
[ $rc -eq 2 ] || fail "hf with a quantized type: rc $rc"
# determinism: thread count does not matter, the seed does
"$GEN" -q -f qwen2 -t q4_K --threads 1 -o "$T/a.gguf"
"$GEN" -q -f qwen2 -t q4_K --threads 3 -o "$T/b.gguf"
cmp -s "$T/a.gguf" "$T/b.gguf" || fail "thread count changed the bytes"
cmp -s "$T/a.gguf" "$T/qwen2-q4_K.gguf" || fail "same seed, different bytes"
"$GEN" -q -f qwen2 -t q4_K -s 2 -o "$T/c.gguf"
cmp -s "$T/a.gguf" "$T/c.gguf" && fail "different seeds, same bytes"
# overrides
"$GEN" -q -f llama --layers 3 --hidden 128 --ffn 256 --n-vocab 400 -t q8_0 -o "$T/o.gguf"
grep -q "llama.block_count" "$T/o.gguf" || fail "metadata missing"
# a vocabulary copied from a GGUF file: its tokenizer keys are copied byte for byte and
# set the vocab size
V="${KILN_SHARED_DIR:-}/testdata/tokenizer/ggml-vocab-llama-spm.gguf"
if [ -f "$V" ]; then
  "$GEN" -q -f qwen3 --vocab "$V" -t q8_0 -o "$T/v.gguf" || fail "--vocab"
  grep -q "tokenizer.ggml.tokens" "$T/v.gguf" || fail "--vocab: no tokens"
  sz=$(stat -c %s "$T/v.gguf")
  [ "$sz" -gt 9000000 ] || fail "--vocab: 32000-token embedding missing (size $sz)"
else
  echo "skipping --vocab: $V not found"
fi
# errors: exit 2 with a message
set +e
"$GEN" -q -t q9_9 -o "$T/x.gguf" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown --type" "$T/err" || fail "bad type: rc $rc"
"$GEN" -q -p nope -o "$T/x.gguf" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown preset" "$T/err" || fail "bad preset: rc $rc"
"$GEN" -q --bogus 1 -o "$T/x.gguf" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] || fail "bad flag: rc $rc"
"$GEN" -q -p gemma3-270m -f llama -o "$T/x.gguf" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] || fail "family mismatch: rc $rc"
set -e
[ ! -e "$T/x.gguf" ] || fail "a failed run left a file"
echo "kiln_gen: ok"
