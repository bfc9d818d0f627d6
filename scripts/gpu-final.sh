#!/usr/bin/env bash
# gpu-final.sh — the lead's end-of-session device call(s): llama.cpp built beside kiln (from
# .carry/llama-src.tgz, in the background while kiln builds and its GPU tests run), then
# scripts/gpu-round.sh with LLAMA_BIN for the side-by-side steps; tables printed last.
#   bash scripts/gpu-final.sh "TEST STEPS" "SIDE STEPS"     (device run, carry [".carry"])
# e.g. bash scripts/gpu-final.sh "verify sample" "side8b"; on a warm machine a second call
# finds llama.cpp built (/tmp/ll/b/bin) and skips the build. Session 13: the llama.cpp CUDA
# build (then at -j8) took over 7 minutes beside kiln's build and tests and ran the call out;
# the machine goes back after 30 s idle, so a second call must follow at once (it finished
# the build in 19 s: only libllama and the two tools were left).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu-out}
LL=/tmp/ll
if [ ! -x $LL/b/bin/llama-batched-bench ]; then
  mkdir -p $LL && tar xzf .carry/llama-src.tgz -C $LL &&
    (cmake -S $LL -B $LL/b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
      -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF >/tmp/ll.log 2>&1 &&
      cmake --build $LL/b -j"$(nproc)" --target llama-bench llama-batched-bench >>/tmp/ll.log 2>&1) &
fi
[ -n "${1:-}" ] && OUT=$OUT bash scripts/gpu-round.sh $1
wait
[ -x $LL/b/bin/llama-bench ] || { echo "llama.cpp build failed"; tail -20 /tmp/ll.log; }
[ -n "${2:-}" ] && OUT=$OUT LLAMA_BIN=$LL/b/bin bash scripts/gpu-round.sh $2
for f in "$OUT"/logs/kiln-8b-*.log "$OUT"/logs/llama-8b-*.log "$OUT"/logs/depth*.log \
  "$OUT"/logs/kiln-batched*.log "$OUT"/logs/llama-batched.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")"
  grep -E "^\||S_TG|^ *[0-9]+ *\|" "$f" | grep -v -- "---" | tail -12
done
