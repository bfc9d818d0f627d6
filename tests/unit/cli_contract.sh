#!/usr/bin/env bash
# CLI contract: every command answers --help with exit 0; unknown commands and flags exit
# 2 with the usage on stderr; `kiln version` and `kiln doctor` work. $1 = kiln binary.
set -u
kiln=$1
fail=0
check() { # expected_rc description cmd...
  local want=$1 what=$2; shift 2
  "$@" >/tmp/kiln-cli-out.$$ 2>/tmp/kiln-cli-err.$$; local rc=$?
  if [ $rc -ne "$want" ]; then echo "FAIL: $what: exit $rc, want $want"; cat /tmp/kiln-cli-err.$$; fail=1; fi
}
for c in run chat serve bench perplexity inspect explain kernels tune solve doctor tokenize \
         detokenize template version; do
  check 0 "$c --help" "$kiln" "$c" --help
  grep -q "usage: kiln $c" /tmp/kiln-cli-out.$$ || { echo "FAIL: $c --help prints no usage"; fail=1; }
  check 2 "$c --no-such-flag" "$kiln" "$c" --no-such-flag
  grep -q "unknown option" /tmp/kiln-cli-err.$$ || { echo "FAIL: $c: no 'unknown option' message"; fail=1; }
done
check 2 "no command" "$kiln"
check 2 "unknown command" "$kiln" frobnicate
grep -q "unknown command 'frobnicate'" /tmp/kiln-cli-err.$$ || { echo "FAIL: unknown command message"; fail=1; }
grep -q "usage: kiln <command>" /tmp/kiln-cli-err.$$ || { echo "FAIL: usage after unknown command"; fail=1; }
check 0 "help" "$kiln" --help
check 0 "version" "$kiln" version
grep -q "^kiln [0-9]" /tmp/kiln-cli-out.$$ || { echo "FAIL: version output"; fail=1; }
check 0 "doctor" "$kiln" doctor
for k in "cpu:" "isa:" "memory:" "cuda:" "libraries:"; do
  grep -q "$k" /tmp/kiln-cli-out.$$ || { echo "FAIL: doctor lacks '$k'"; fail=1; }
done
rm -f /tmp/kiln-cli-out.$$ /tmp/kiln-cli-err.$$
[ $fail -eq 0 ] && echo "cli contract: ok"
exit $fail
