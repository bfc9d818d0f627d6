#!/usr/bin/env bash
# test_chat_smollm2.sh — the instruct model with a chat template (SmolLM2-135M-Instruct
# Q4_1, ChatML; `scripts/fetch-model.sh smollm2-135m`): the template in its GGUF renders
# the ChatML turns byte-exactly (with its default system prompt), <|im_start|> and
# <|im_end|> tokenize as single control tokens, `kiln run --chat` answers a factual
# question greedily, and `kiln chat -m smollm2-135m` holds two turns reusing the KV
# prefix. Skips (exit 0, saying why) when the model is not in the cache. $1 = kiln.
set -euo pipefail
KILN=$1
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models
[ -f "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" ] || {
  echo "SKIP: $cache/SmolLM2-135M-Instruct.Q4_1.gguf absent (scripts/fetch-model.sh smollm2-135m)"
  exit 0
}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat > "$T/m.json" <<'JSON'
[{"role":"user","content":"Hi there"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"What is 2+2?"}]
JSON
printf '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n' > "$T/want"
"$KILN" template -m smollm2-135m --messages "$T/m.json" --add-generation-prompt > "$T/got" 2>"$T/err" ||
  fail "template: $(cat "$T/err")"
cmp -s "$T/got" "$T/want" || fail "ChatML rendering differs: $(diff <(od -c "$T/got") <(od -c "$T/want") | head)"
ids=$(printf '<|im_start|>user\nhi<|im_end|>' | "$KILN" tokenize -m smollm2-135m --parse-special --ids)
set -- $ids
[ "$1" = 1 ] && [ "${!#}" = 2 ] || fail "ChatML markers are not single tokens 1 and 2: $ids"
out=$("$KILN" run -m smollm2-135m --chat -p "What is the capital of France?" --temp 0 -n 24 -t 2 2>"$T/err") ||
  fail "run --chat: $(cat "$T/err")"
grep -q "Paris" <<<"$out" || fail "run --chat answered '$out'"
printf 'What is the capital of France?\nAnd of Italy?\n' |
  "$KILN" chat -m smollm2-135m --temp 0 -n 24 -t 2 >"$T/chat" 2>"$T/err" || fail "chat: $(cat "$T/err")"
grep -q "Paris" "$T/chat" || fail "chat turn 1: $(cat "$T/chat")"
grep -q "Rome" "$T/chat" || fail "chat turn 2: $(cat "$T/chat")"
[ "$(grep -c reused "$T/err")" = 2 ] || fail "chat: expected two turns: $(cat "$T/err")"
echo "SmolLM2 chat template OK"
