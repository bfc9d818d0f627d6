#!/usr/bin/env bash
# test_load_cli.sh — `kiln inspect [--load] [--json]` end to end on kiln-gen models of every
# family, GGUF (several types) and HF safetensors (single and sharded): metadata keys the
# families read are present with GGUF names, every tensor is loaded, the JSON report
# parses and accounts for every byte, and each forced layout is byte-exact with the
# residual lane (checked in test_load.c; here: the CLI reports). The real Gemma 3 270M
# runs when it is in the model cache. $1 is the kiln binary; kiln-gen sits next to it.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
[ -x "$GEN" ] || { echo "kiln-gen not found next to $1"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# checks a `kiln inspect --load --execute -v --json` document (the engine's plan):
# fields present, executed, lanes add up to the planned tensors, every file tensor the
# model uses is planned, and each planned tensor is a tensor of the file or of memory
check_json() {
  python3 - "$1" "$2" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1])); arch = sys.argv[2]
m = d["metadata"]
assert m["general.architecture"] == arch, m.get("general.architecture")
for k in ("block_count", "embedding_length", "attention.head_count"):
    assert f"{arch}.{k}" in m, k
names = {t["name"] for t in d["tensors"]}
for n in ("token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
    assert n in names, n
L = d["load"]; lanes = L["lanes"]
assert L["executed"]
planned = L["tensors"]
assert sum(l["tensors"] for l in lanes.values()) == len(planned)
assert sum(l["bytes"] for l in lanes.values()) == sum(t["bytes"] for t in planned)
pn = {t["name"] for t in planned}
for n in names:
    if n != "rope_freqs.weight": assert n in pn, ("not planned", n)
for t in planned:
    assert t["lane"] in ("alias", "transform", "upload", "residual"), t
PY
}

# the whole-file probe (--layout/--copy): every tensor of the file, once
check_probe() {
  python3 - "$1" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1])); L = d["load"]; lanes = L["lanes"]
assert L["executed"]
assert sum(l["tensors"] for l in lanes.values()) == len(d["tensors"])
assert sum(l["read_bytes"] for l in lanes.values()) == sum(t["bytes"] for t in d["tensors"])
PY
}

command -v python3 >/dev/null || { echo "skipping: python3 needed to check the JSON"; exit 0; }
for fam in llama qwen2 qwen3 gemma3; do
  for ty in q4_K f16; do
    "$GEN" -q -f "$fam" -t "$ty" -o "$T/$fam.gguf"
    "$KILN" inspect --load --execute -v --json "$T/$fam.gguf" > "$T/out.json" \
      || fail "$fam $ty: inspect --load"
    check_json "$T/out.json" "$fam" || fail "$fam $ty: report"
    "$KILN" inspect --load --layout native --json "$T/$fam.gguf" > "$T/out.json" \
      || fail "$fam $ty: inspect --load --layout native"
    check_probe "$T/out.json" || fail "$fam $ty: probe report"
    # the plan without executing it names the same lanes and says it did not run
    "$KILN" inspect --load --backend ref -m "$T/$fam.gguf" > "$T/out.txt" || fail "$fam $ty: plan"
    grep -q "(not executed)" "$T/out.txt" || fail "$fam $ty: plan said it ran"
    "$KILN" inspect --load --layout f32 -m "$T/$fam.gguf" > "$T/out.txt" || fail "$fam $ty: --layout f32"
    grep -q "^  transform " "$T/out.txt" || fail "$fam $ty: no transform lane line"
  done
  "$GEN" -q -f "$fam" -t bf16 --format hf --shard-mb 1 -o "$T/hf-$fam"
  "$KILN" inspect --load --execute -v --json "$T/hf-$fam" > "$T/out.json" \
    || fail "hf $fam: inspect --load"
  check_json "$T/out.json" "$fam" || fail "hf $fam: report"
  grep -q '"source": "safetensors"' "$T/out.json" || fail "hf $fam: source"
  "$KILN" inspect --load --copy --io pread "$T/hf-$fam/model.safetensors.index.json" > /dev/null \
    || fail "hf $fam: index path, --copy --io pread"
done
# errors: a missing model and a bad layout fail with a message naming them
set +e
"$KILN" inspect "$T/nope.gguf" 2> "$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "nope.gguf" "$T/err" || fail "missing model: rc $rc"
"$KILN" inspect --load --layout bogus "$T/llama.gguf" 2> "$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "unknown target layout 'bogus'" "$T/err" || fail "bad layout: rc $rc"
"$KILN" inspect 2> /dev/null; rc=$?
[ $rc -eq 2 ] || fail "no model: rc $rc"
"$KILN" inspect --load --backend nope "$T/llama.gguf" 2> "$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "backend 'nope'" "$T/err" || fail "bad backend: rc $rc"
set -e
# kiln serve --load-report: the report on stderr once loaded (then SIGTERM: drain, exit 0)
"$KILN" serve -m "$T/llama.gguf" --port 0 -t 1 --load-report --ready-file "$T/ready" \
  2> "$T/serve.err" &
sp=$!
for _ in $(seq 1200); do [ -s "$T/ready" ] && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
kill -TERM $sp 2>/dev/null || true
wait $sp || fail "serve --load-report: exit status $? ($(tail -2 "$T/serve.err"))"
grep -q "^load report: " "$T/serve.err" && grep -q "ready in" "$T/serve.err" ||
  fail "serve --load-report: no report ($(head -3 "$T/serve.err"))"
G="${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models/gemma-3-270m-q4_k_m.gguf"
if [ -f "$G" ]; then
  "$KILN" inspect --load --execute -v --json gemma3-270m > "$T/out.json" || fail "gemma3-270m"
  check_json "$T/out.json" gemma3 || fail "gemma3-270m: report"
else
  echo "skipping the real model: $G not found (scripts/fetch-model.sh gemma3-270m)"
fi
echo "test_load_cli: ok"
