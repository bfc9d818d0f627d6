#!/usr/bin/env bash
# `kiln template` CLI contract: renders a real template byte-exactly (compared with the
# jinja2 rendering in tests/data/templates/cli/), fails with exit 1 and a message naming
# line and column on template errors, exit 2 on usage errors. $1 = kiln binary.
set -u
kiln=$1
src=${KILN_SOURCE_DIR:-$(dirname "$0")/../..}
shared=${KILN_SHARED_DIR:-$src/../shared}
data=$src/tests/data/templates/cli
tpl=$shared/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
if [ -f "$tpl" ]; then
  "$kiln" template --template "$tpl" --messages "$data/messages.json" --tools "$data/tools.json" \
    --add-generation-prompt >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: render exit $?"; cat "$tmp/err"; fail=1; }
  cmp "$tmp/out" "$data/expected-qwen25-tool_call.txt" || { echo "FAIL: rendering differs from jinja2"; fail=1; }
else
  echo "SKIP render check: $tpl missing (KILN_SHARED_DIR)"
fi
# -m: the template (and BOS/EOS) from GGUF metadata; --name picks a variant
gguf=$data/qwen25-template.gguf
"$kiln" template -m "$gguf" --messages "$data/messages.json" --tools "$data/tools.json" \
  --add-generation-prompt >"$tmp/out" 2>"$tmp/err" || { echo "FAIL: -m render exit $?"; cat "$tmp/err"; fail=1; }
cmp "$tmp/out" "$data/expected-qwen25-tool_call.txt" || { echo "FAIL: -m rendering differs from jinja2"; fail=1; }
out=$("$kiln" template -m "$gguf" --name tool_use --messages "$data/messages.json" --tools "$data/tools.json")
[ "$out" = "<|im_start|>tools=1<|im_end|>" ] || { echo "FAIL: --name tool_use gave '$out'"; fail=1; }
"$kiln" template -m "$gguf" --name nope --messages "$data/messages.json" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "no metadata key 'tokenizer.chat_template.nope' (named templates: tool_use)" "$tmp/err" ||
  { echo "FAIL: missing variant message:"; cat "$tmp/err"; fail=1; }
printf '[{"role": "user", "content": "hi"}]' >"$tmp/m.json"
printf 'line one\n{{ messages[0].content | nosuch }}' >"$tmp/bad.jinja"
"$kiln" template --template "$tmp/bad.jinja" --messages "$tmp/m.json" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || { echo "FAIL: bad template exit $rc, want 1"; fail=1; }
grep -q "line 2, column 26: no filter named 'nosuch'" "$tmp/err" || { echo "FAIL: error message:"; cat "$tmp/err"; fail=1; }
printf '{{ bos_token }}{{ messages[0].content }}{%% if add_generation_prompt %%}!{%% endif %%}\n' >"$tmp/ok.jinja"
out=$("$kiln" template --template "$tmp/ok.jinja" --messages "$tmp/m.json" --bos '<s>' --add-generation-prompt)
[ "$out" = "<s>hi!" ] || { echo "FAIL: simple render gave '$out'"; fail=1; }
"$kiln" template --messages "$tmp/m.json" >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: missing --template/-m should exit 2"; fail=1; }
"$kiln" template --template "$tmp/ok.jinja" --messages "$tmp/nonexistent.json" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "nonexistent.json" "$tmp/err" || { echo "FAIL: missing messages file"; fail=1; }
exit $fail
