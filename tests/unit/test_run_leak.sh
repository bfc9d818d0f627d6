#!/usr/bin/env bash
# test_run_leak.sh — `kiln run` releases everything it took on every early exit: with a
# --chat-template read and a model that fails to open (issue #18: the template leaked),
# a prompt file that does not exist, and a bad policy file. valgrind's leak checker
# must report no definitely or indirectly lost block. Skips (exit 0, saying why) when
# valgrind is not installed.
set -euo pipefail
KILN=$1
# the sanitizer build: LeakSanitizer checks the same runs (valgrind cannot run ASan binaries)
SAN=${KILN_SANITIZED:-}
[ -n "$SAN" ] || command -v valgrind >/dev/null || { echo "SKIP: valgrind not installed"; exit 0; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
echo '{{ messages[0].content }}' > "$T/tpl.jinja"
echo 'hello' > "$T/prompt.txt"
vg() {
  local rc=0
  if [ -n "$SAN" ]; then
    "$KILN" "$@" >"$T/out" 2>"$T/err" || rc=$?
    [ $rc = 0 ] && fail "kiln $* succeeded"
    grep -q "Sanitizer" "$T/err" && fail "kiln $*: $(grep -A12 'Sanitizer' "$T/err" | head -40)"
    return 0
  fi
  valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect --error-exitcode=99 "$KILN" "$@" >"$T/out" 2>"$T/err" || rc=$?
  [ $rc = 0 ] && fail "kiln $* succeeded"
  [ $rc = 99 ] && fail "kiln $*: leaks: $(grep -A8 'definitely\|indirectly' "$T/err" | head -40)"
  return 0
}
vg run -m "$T/nope.gguf" --chat-template "$T/tpl.jinja" -p hi
grep -q "nope.gguf" "$T/err" || fail "missing model message: $(cat "$T/err")"
vg run -m "$T/nope.gguf" --chat-template "$T/tpl.jinja" -f "$T/prompt.txt"
vg run -m "$T/nope.gguf" --chat-template "$T/tpl.jinja" -f "$T/no-prompt.txt"
grep -q "no-prompt.txt" "$T/err" || fail "missing prompt file message: $(cat "$T/err")"
vg run -m "$T/nope.gguf" -f "$T/prompt.txt" --chat-template "$T/no-tpl.jinja"
echo "run leak checks OK"
