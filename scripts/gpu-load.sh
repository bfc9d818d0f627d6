#!/usr/bin/env bash
# gpu-load.sh — the loader's measurements on the lent GPU machine (issue 11), in one call.
# Here: scripts/gpu-load.sh pack DIR  builds build-gpu (CUDA on) and packs the binaries and
#       the shared libraries a bare CUDA image lacks into DIR (bin/, lib/, this script).
# There: bash DIR/gpu-load.sh run      generates a Llama-3-8B-shaped q4_0 model with kiln-gen,
#       then bench_load on it: cold/warm alias, transform, and the upload lane against pinned
#       cudaMemcpy H2D in the same run (--cuda 0); bench_load --model (the engine's own load
#       path, cpu backend, 16 threads); test_load (its GPU test: upload lane == residual
#       bytes) and test_load_engine. Logs go to $OUT.
set -uo pipefail
mode=${1:-run}
if [ "$mode" = pack ]; then
  D=${2:?pack DIR}
  cd "$(dirname "$0")/.."
  B=${B:-build-gpu}
  [ -n "${NO_BUILD:-}" ] || cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 \
    -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache >/dev/null
  [ -n "${NO_BUILD:-}" ] || cmake --build $B -j2 --target bench_load kiln-gen kiln-bin test_load \
    test_load_engine >/dev/null
  rm -rf "$D"
  scripts/gpu-pack.sh --bins "$D" $B/kiln $B/kiln-gen $B/bench/bench_load $B/tests/test_load $B/tests/test_load_engine || exit 1
  cp scripts/gpu-load.sh "$D/"
  du -sh "$D"
  exit 0
fi
D=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} PATH=$D/bin:$PATH KILN_NO_PROGRESS=1
export KILN_BINARY_DIR=$D/bin
OUT=${OUT:-/tmp/kiln-gpu-out}; mkdir -p "$OUT"
rc=0
echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
free -g | head -2
M=/tmp/models/llama3-8b-q4_0.gguf; mkdir -p /tmp/models
echo "== kiln-gen llama3-8b q4_0"
t0=$(date +%s%N)
kiln-gen -q --preset llama3-8b --type q4_0 -o $M || rc=1
echo "gen: $(( ($(date +%s%N) - t0) / 1000000 )) ms"; ls -la $M
echo "== bench_load (file, --cuda 0)"
timeout 240 bench_load --file $M --cuda 0 --reps 3 --threads 16 2>&1 | tee "$OUT/bench_load.txt" || rc=1
echo "== bench_load --model (engine load path, cpu backend)"
timeout 120 bench_load --model $M --reps 3 --threads 16 2>&1 | tee "$OUT/bench_engine.txt" || rc=1
echo "== kiln run -n 1 (cpu, 16 threads, warm file) with --load-report"
( time kiln run -m $M -p "Hello" -n 1 --temp 0 -t 16 --load-report ) 2>&1 | tail -20 | tee "$OUT/run.txt"
echo "== tests"
for t in test_load test_load_engine; do
  if timeout 120 "$D/bin/$t" > "$OUT/$t.log" 2>&1; then echo "PASS $t"; else echo "FAIL $t"; tail -20 "$OUT/$t.log"; rc=1; fi
done
grep -i "upload" "$OUT/test_load.log" | head -5
exit $rc
