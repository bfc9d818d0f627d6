#!/usr/bin/env bash
# test_select_cli.sh — CLI contracts of the kernel tools: `kiln kernels` lists the
# registry with availability; a bad policy file is rejected with its line number;
# `kiln explain` / `kiln solve` / `kiln run --dispatch` on the real model (skipped when it
# is not cached).
set -u
KILN=$1
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$KILN" kernels) || fail "kiln kernels exited $?"
grep -q '^ref ' <<<"$out" || fail "no ref provider in: $out"
grep -q '^openblas ' <<<"$out" || fail "no openblas provider"
grep -q 'openblas.sgemm.matmul.f32' <<<"$out" || fail "no sgemm kernel"
"$KILN" kernels --op matmul --json | grep -q '"op": "matmul"' || fail "kernels --json"
"$KILN" kernels --op nope >/dev/null 2>&1 && fail "unknown op accepted"

# an unavailable provider (descriptor rejected) is listed, never fatal
mkdir -p "$tmp/desc"
echo '{"schema": "kiln.kernel-descriptor", "schema_version": 7}' >"$tmp/desc/openblas.json"
out=$(KILN_DESCRIPTOR_DIR="$tmp/desc" "$KILN" kernels 2>/dev/null) || fail "kernels with bad descriptor"
grep -q 'openblas .*UNAVAILABLE (descriptor rejected' <<<"$out" || fail "rejected descriptor not shown: $out"

model=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models/gemma-3-270m-q4_k_m.gguf
if [ ! -f "$model" ]; then
  echo "SKIP explain/solve: $model not present (scripts/fetch-model.sh gemma3-270m)"
  exit 0
fi
printf 'strict: false\nlocks:\n  matmull: x\n' >"$tmp/bad.yaml"
err=$(KILN_POLICY="$tmp/bad.yaml" "$KILN" explain -m "$model" 2>&1) && fail "bad policy accepted"
grep -q "bad.yaml:3: locks: unknown op 'matmull'" <<<"$err" || fail "policy error lacks line: $err"

out=$("$KILN" explain -m "$model" --site 'blk.0.attn.q' --perfdb "$tmp/none.sqlite") || fail "explain: $out"
grep -q 'blk.0.attn.q \[matmul; q5_0, n=1024 k=640\] (plan insn' <<<"$out" || fail "explain output: $out"
grep -q -- '-> ' <<<"$out" || fail "no chosen kernel: $out"
grep -q 'openblas.sgemm.matmul.f32 .*rejected: DTYPE_UNSUPPORTED' <<<"$out" || fail "no reasons: $out"
# avoid through the environment shows up as POLICY_AVOIDED
out=$(KILN_AVOID=openblas "$KILN" explain -m "$model" --site 'blk.0.attn.q' --perfdb "$tmp/none.sqlite")
grep -q 'openblas.sgemm.matmul.dq .*POLICY_AVOIDED' <<<"$out" || fail "KILN_AVOID ignored: $out"
# solve -> run --dispatch uses the table silently; on another backend it warns and selects
"$KILN" solve -m "$model" -o "$tmp/table.json" --perfdb "$tmp/none.sqlite" >/dev/null || fail "solve"
grep -q '"schema": "kiln.dispatch"' "$tmp/table.json" || fail "solve wrote no table"
grep -q '"registry"' "$tmp/table.json" || fail "no signature"
err=$("$KILN" run -m "$model" -p "Hi" -n 1 --temp 0 --backend cpu --dispatch "$tmp/table.json" 2>&1 >/dev/null)
grep -q "not used" <<<"$err" && fail "baked table rejected on its own machine: $err"
err=$("$KILN" run -m "$model" -p "Hi" -n 1 --temp 0 --backend ref --dispatch "$tmp/table.json" 2>&1 >/dev/null)
grep -q 'not used (signature differs: backend' <<<"$err" || fail "no warning for another backend: $err"
# the table is the bound plan's own (one dispatch table): one kernel per token bucket,
# repeated over its four context buckets, for every call site of the plan
jq -e '[.sites[].kernels | . as $k | range(0; 20) | select($k[.] != $k[(. / 4 | floor) * 4])] | length == 0' \
  "$tmp/table.json" >/dev/null || fail "context buckets of a token bucket differ: not the runtime's table"
jq -e '[.sites[] | select(.name == "blk.0.attn.core")] | length == 1' "$tmp/table.json" >/dev/null ||
  fail "no attention site in the table"
# greedy output with the table equals the output without it (the same kernels; solved
# with the PerfDB `kiln run` uses)
"$KILN" solve -m "$model" -o "$tmp/default.json" >/dev/null || fail "solve (default PerfDB)"
a=$("$KILN" run -m "$model" -p "The capital of France is" -n 8 --temp 0 --ids 2>/dev/null) || fail "run"
b=$("$KILN" run -m "$model" -p "The capital of France is" -n 8 --temp 0 --ids --dispatch "$tmp/default.json" 2>/dev/null) ||
  fail "run --dispatch"
[ "$a" = "$b" ] || fail "greedy ids differ with the baked table: '$a' vs '$b'"
# the binding takes each site's kernel from the file: a site forced to the reference
# matmul is used silently; an unknown kernel id is reported and that site selected
jq '(.sites[] | select(.name == "blk.0.attn.q") | .kernels) |= map("ref.matmul")' \
  "$tmp/table.json" >"$tmp/forced.json"
err=$("$KILN" run -m "$model" -p "Hi" -n 1 --temp 0 --dispatch "$tmp/forced.json" 2>&1 >/dev/null)
grep -q "dispatch table" <<<"$err" && fail "forced reference kernel rejected: $err"
jq '(.sites[] | select(.name == "blk.0.attn.q") | .kernels) |= map("no.such.kernel")' \
  "$tmp/table.json" >"$tmp/bad.json"
err=$("$KILN" run -m "$model" -p "Hi" -n 1 --temp 0 --dispatch "$tmp/bad.json" 2>&1 >/dev/null) ||
  fail "a table naming an unknown kernel is fatal: $err"
grep -q "call site 'blk.0.attn.q' names an unknown kernel" <<<"$err" || fail "unknown kernel not reported: $err"
echo ok
