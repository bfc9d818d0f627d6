#!/usr/bin/env bash
# CLI contract of `kiln tokenize` / `kiln detokenize` (issue #4). $1 = kiln binary.
set -u
kiln=$1
vocabs=${KILN_SHARED_DIR:-$(dirname "$0")/../../../shared}/testdata/tokenizer
spm=$vocabs/ggml-vocab-llama-spm.gguf
bpe=$vocabs/ggml-vocab-gpt-2.gguf
if [ ! -r "$spm" ] || [ ! -r "$bpe" ]; then
  echo "tok cli: skipped: vocabulary files absent ($vocabs; they are in ../shared)"
  exit 0
fi
fail=0
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
expect() { # description expected actual
  if [ "$2" != "$3" ]; then echo "FAIL: $1: got '$3', want '$2'"; fail=1; fi
}
# ids on one line, single spaces; no BOS without --add-special; TEXT argument
expect "spm ids" "15043 3186" "$("$kiln" tokenize -m "$spm" --ids "Hello world")"
expect "spm add-special" "1 15043 3186" "$("$kiln" tokenize -m "$spm" --ids --add-special "Hello world")"
# stdin, byte-exactly: the trailing newline is a token
expect "spm stdin" "15043 3186 13" "$(printf 'Hello world\n' | "$kiln" tokenize -m "$spm" --ids)"
# special tokens: text unless --parse-special
expect "parse-special" "1" "$("$kiln" tokenize -m "$spm" --ids --parse-special "<s>")"
[ "$("$kiln" tokenize -m "$spm" --ids "<s>")" != "1" ] || { echo "FAIL: <s> parsed without --parse-special"; fail=1; }
# a golden case of llama.cpp (gpt-2: "ied 4 ½ months")
expect "bpe golden" "798 604 25208 1933" "$("$kiln" tokenize -m "$bpe" --ids "ied 4 ½ months")"
# detokenize prints the text byte-exactly (no newline when stdout is not a terminal)
printf 'x  y\n\tz ½ 日本\n' > "$t/in"
ids=$("$kiln" tokenize -m "$bpe" --ids < "$t/in")
"$kiln" detokenize -m "$bpe" $ids > "$t/out"
cmp -s "$t/in" "$t/out" || { echo "FAIL: bpe detokenize(tokenize(x)) != x"; fail=1; }
ids=$("$kiln" tokenize -m "$spm" --ids < "$t/in")
"$kiln" detokenize -m "$spm" $ids > "$t/out"
cmp -s "$t/in" "$t/out" || { echo "FAIL: spm detokenize(tokenize(x)) != x"; fail=1; }
# errors: exit 1 with a message naming the problem; usage errors exit 2
"$kiln" detokenize -m "$spm" 99999999 2> "$t/err" >/dev/null; rc=$?
expect "bad id rc" 1 $rc
grep -q "99999999" "$t/err" || { echo "FAIL: bad id message"; fail=1; }
"$kiln" detokenize -m "$spm" abc 2>/dev/null >/dev/null; expect "non-number rc" 2 $?
"$kiln" tokenize --ids x 2>/dev/null >/dev/null; expect "no model rc" 2 $?
"$kiln" tokenize -m /nonexistent.gguf x 2> "$t/err" >/dev/null; expect "missing model rc" 1 $?
grep -q "/nonexistent.gguf" "$t/err" || { echo "FAIL: missing model message"; fail=1; }
[ $fail -eq 0 ] && echo "tok cli: ok"
exit $fail
