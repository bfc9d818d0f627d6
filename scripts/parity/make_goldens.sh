#!/usr/bin/env bash
# make_goldens.sh — regenerates kiln's parity goldens (tests/data/parity/) with llama.cpp.
#
# Needs llama.cpp built beside kiln (LLAMA_DIR, default /work/llama.cpp, commit
# 3f545beccee69d9975f466ec7e45fd9aacd8ba90 for the committed data); this script only
# compiles scripts/parity/llama_dump.c against its libllama and runs llama-perplexity and
# llama-quantize. It never builds llama.cpp.
#
#   scripts/parity/make_goldens.sh NAME MODEL   one golden directory for MODEL (a .gguf)
#
# Writes tests/data/parity/NAME/{greedy.txt,tf.txt,ppl.txt,manifest-lines}; the manifest
# itself (which model path the test loads, thresholds) is written by hand.
set -euo pipefail
LLAMA_DIR=${LLAMA_DIR:-/work/llama.cpp}
cd "$(dirname "$0")/../.."
name=$1 model=$2
out=tests/data/parity/$name
mkdir -p "$out"
dump=${TMPDIR:-/tmp}/kiln_llama_dump
cc -O2 -o "$dump" scripts/parity/llama_dump.c -I"$LLAMA_DIR/include" -I"$LLAMA_DIR/ggml/include" \
   -L"$LLAMA_DIR/build/bin" -lllama -lm -Wl,-rpath,"$LLAMA_DIR/build/bin"
"$dump" greedy "$model" tests/data/parity/prompts.txt 32 > "$out/greedy.txt"
"$dump" tf "$model" tests/data/parity/text.txt 512 20 > "$out/tf.txt"
# the running value of the last chunk, "[N]ppl," with N from "over N chunks" (llama-perplexity
# omits its "Final estimate" line when its variance estimate comes out negative, as it can
# for near-uniform random models); fails when that value is missing
log=$(mktemp)
"$LLAMA_DIR/build/bin/llama-perplexity" -m "$model" -f tests/data/parity/text.txt -c 256 -t 2 > "$log" 2>&1 || true
nch=$(sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p' "$log")
grep -o "\[$nch\][0-9.]*," "$log" | sed 's/.*\]\([0-9.]*\),/\1/' > "$out/ppl.txt"
rm -f "$log"
[ -s "$out/ppl.txt" ] || { echo "llama-perplexity gave no value for chunk $nch" >&2; exit 1; }
# the commit: git's when the checkout has its metadata, else LLAMA_COMMIT (the commit the
# committed data came from)
commit=$(git -C "$LLAMA_DIR" rev-parse HEAD 2>/dev/null ||
         echo "${LLAMA_COMMIT:-3f545beccee69d9975f466ec7e45fd9aacd8ba90}")
echo "llama.cpp $commit" > "$out/SOURCE"
echo "wrote $out (PPL $(cat "$out/ppl.txt"))"
