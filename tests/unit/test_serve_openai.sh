#!/usr/bin/env bash
# test_serve_openai.sh — `kiln serve` with the official `openai` Python client
# (tests/serve/openai_client.py): chat and completions, streamed and not, n, seed, stop,
# logprobs, usage, and errors raised as the client's typed exceptions (BadRequestError,
# NotFoundError, AuthenticationError, RateLimitError). $1 is the kiln binary.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serve/lib.sh"
PYP=$("$HERE/../../scripts/serve-test-deps.sh" 2>/dev/null) || { echo "SKIP: the openai package could not be installed (no network?)"; exit 0; }
T=$(mktemp -d)
trap 'kill $SERVE_PID 2>/dev/null || true; rm -rf "$T"' EXIT
serve_pick_model "$T"
echo "model: $MODEL_KIND"
cat > "$T/kiln.yaml" <<'YAML'
tenants:
  - id: tester
    keys: [sk-test]
  - id: limited
    key: sk-limited
    tokens_per_minute: 5
YAML
serve_start "$T" oa --config "$T/kiln.yaml" -t 2 --slots 4 --alias smollm2
PYTHONPATH=$PYP python3 "$HERE/../serve/openai_client.py" "http://127.0.0.1:$SERVE_PORT/v1" smollm2 sk-test sk-limited || { tail -5 "$T/log.oa"; exit 1; }
kill -TERM $SERVE_PID
wait $SERVE_PID
