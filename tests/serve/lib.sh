# lib.sh — shared by the serve client tests: picks the chat model and starts servers.
# SmolLM2-135M-Instruct (scripts/fetch-model.sh smollm2-135m, or $KILN_SMOLLM2) is the
# chat model; without it a kiln-gen model with the Qwen2.5 template stands in and
# MODEL_KIND says so.
serve_pick_model() { # DIR -> sets MODEL, MODEL_ARGS, MODEL_KIND
  local dir=$1 src
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  MODEL=${KILN_SMOLLM2:-}
  [ -n "$MODEL" ] || MODEL=$("$src/scripts/fetch-model.sh" smollm2-135m 2>/dev/null) || MODEL=
  MODEL_ARGS=()
  if [ -n "$MODEL" ] && [ -f "$MODEL" ]; then
    MODEL_KIND=smollm2
  else
    MODEL_KIND="synthetic (SmolLM2 not available: scripts/fetch-model.sh smollm2-135m failed)"
    MODEL=$dir/synthetic.gguf
    "$GEN" -q -p tiny -f qwen2 -t q8_0 -s 5 -o "$MODEL"
    local shared=${KILN_SHARED_DIR:-$src/tests/data/shared}
    MODEL_ARGS=(--chat-template "$shared/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
  fi
}

serve_start() { # DIR NAME ARGS... -> sets SERVE_PID, SERVE_PORT
  local dir=$1 name=$2; shift 2
  rm -f "$dir/ready.$name"
  "$KILN" serve -m "$MODEL" "${MODEL_ARGS[@]}" --port 0 --ready-file "$dir/ready.$name" "$@" \
    2>"$dir/log.$name" &
  SERVE_PID=$!
  for _ in $(seq $((300 * ${KILN_TIME_SCALE:-1}))); do [ -f "$dir/ready.$name" ] && break; sleep 0.1; done
  [ -f "$dir/ready.$name" ] || { echo "FAIL: server $name did not start"; cat "$dir/log.$name"; return 1; }
  SERVE_PORT=$(cut -d' ' -f2 "$dir/ready.$name")
}
