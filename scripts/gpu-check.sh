#!/usr/bin/env bash
# Runs on the lent GPU machine over the copy of the work tree, with .carry/ built by
# scripts/gpu-pack.sh. Everything that needs the GPU happens in this one call: doctor,
# the unit and gpu-labelled test binaries, and the steps named in $KILN_GPU_STEPS
# (space-separated: gen8b load bench). Logs go to $OUT (when set) for the session.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PATH=$PWD/.carry/bin:$PATH
export KILN_SOURCE_DIR=$PWD KILN_SHARED_DIR=$PWD/tests/data/shared KILN_NO_PROGRESS=1
OUT=${OUT:-/tmp/kiln-gpu-out}; mkdir -p "$OUT"
log() { echo "== $*"; }
rc=0
log "nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
log "kiln doctor"; kiln doctor | tee "$OUT/doctor.txt" || rc=1
log "test binaries"
for t in .carry/bin/test_*; do
  [ -x "$t" ] || continue
  if "$t" > "$OUT/$(basename "$t").log" 2>&1; then echo "PASS $(basename "$t")"
  else echo "FAIL $(basename "$t")"; tail -20 "$OUT/$(basename "$t").log"; rc=1; fi
done
for step in ${KILN_GPU_STEPS:-}; do
  log "step $step"
  case $step in
    gen8b)
      mkdir -p /tmp/models
      t0=$(date +%s.%N)
      kiln-gen --preset llama3-8b --type q4_0 -o /tmp/models/llama3-8b-q4_0.gguf 2>&1 \
        | tee "$OUT/gen8b.txt" || rc=1
      python3 -c "import sys,time; print(\"kiln-gen llama3-8b q4_0 wall: %.1f s\" % (time.time()-float(sys.argv[1])))" "$t0"; ls -la /tmp/models
      kiln inspect /tmp/models/llama3-8b-q4_0.gguf 2>&1 | head -30 ;;
    load)
      bench_load --file /tmp/models/llama3-8b-q4_0.gguf --cuda 0 --reps 3 --threads 16 \
        2>&1 | tee "$OUT/bench_load.txt" || rc=1 ;;
    *) echo "unknown step $step"; rc=1 ;;
  esac
done
exit $rc
