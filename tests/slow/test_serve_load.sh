#!/usr/bin/env bash
# test_serve_load.sh — kiln serve under load on the AddressSanitizer build: 256 concurrent
# clients over loopback (tests/serve/loadgen.py stress): greedy streams that must equal
# their solo runs, random disconnects, malformed requests and raw garbage; then SIGTERM:
# exit 0 with no ASan/LeakSanitizer report. Uses $KILN_ASAN_BUILD/kiln (default
# build-asan/ in the source tree), configuring and building it when missing.
# $1 is the kiln binary of this build (its kiln-gen makes the model).
set -euo pipefail
GEN="$(dirname "$1")/kiln-gen"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
AB=${KILN_ASAN_BUILD:-$SRC/build-asan}
if [ ! -x "$AB/kiln" ]; then
  cmake -S "$SRC" -B "$AB" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF \
        -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF >/dev/null
  cmake --build "$AB" -j"$(nproc)" --target kiln-bin >/dev/null
fi
KILN=$AB/kiln
T=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
"$GEN" -q -p tiny -f llama -t q8_0 -s 11 -o "$T/m.gguf"
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
"$KILN" serve -m "$T/m.gguf" --port 0 --ready-file "$T/ready" -t 2 -c 2048 --slots 32 \
  --queue 512 2>"$T/log" &
PID=$!
for _ in $(seq 600); do [ -f "$T/ready" ] && break; sleep 0.1; done
[ -f "$T/ready" ] || { cat "$T/log"; echo "FAIL: server did not start"; exit 1; }
PORT=$(cut -d' ' -f2 "$T/ready")
python3 "$(dirname "$0")/../serve/loadgen.py" stress "http://127.0.0.1:$PORT" m --streams 256 --eos 2 \
  || { tail -30 "$T/log"; echo "FAIL: load"; exit 1; }
kill -TERM $PID
rc=0; wait $PID || rc=$?
if [ $rc != 0 ] || grep -q "Sanitizer" "$T/log"; then
  grep -A30 "Sanitizer" "$T/log" | head -60; echo "FAIL: exit $rc"; exit 1
fi
echo "ok: no crash, no leak, exit 0"
