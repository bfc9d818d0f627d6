#!/usr/bin/env bash
# test_serve_web.sh — the web chat page of `kiln serve` in headless Chromium (Debian's
# chromium package): type a message, see the answer stream in, stop a second answer.
# The phone-sized screenshot is kept as a test artifact:
# $KILN_BINARY_DIR/test-artifacts/serve_web.png. $1 is the kiln binary.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serve/lib.sh"
command -v chromium >/dev/null || { echo "SKIP: chromium is not installed (apt-get install chromium)"; exit 0; }
PYP=$("$HERE/../../scripts/serve-test-deps.sh" 2>/dev/null) || { echo "SKIP: the websockets package could not be installed (no network?)"; exit 0; }
T=$(mktemp -d)
trap 'kill $SERVE_PID 2>/dev/null || true; rm -rf "$T"' EXIT
serve_pick_model "$T"
echo "model: $MODEL_KIND"
serve_start "$T" web -t 2 --slots 2
ART=${KILN_BINARY_DIR:-$(dirname "$KILN")}/test-artifacts
PYTHONPATH=$PYP python3 "$HERE/../serve/web_chromium.py" "http://127.0.0.1:$SERVE_PORT/" "$ART/serve_web.png" || { tail -5 "$T/log.web"; exit 1; }
kill -TERM $SERVE_PID
wait $SERVE_PID
