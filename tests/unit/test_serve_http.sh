#!/usr/bin/env bash
# test_serve_http.sh — `kiln serve` over raw HTTP with curl, on kiln-gen models (no
# download): routes, SSE framing (data: lines, blank-line separators, role chunk,
# finish chunk, usage chunk, [DONE]), streamed text == non-streamed text (greedy), exact
# text (prompt text + output text == detokenized whole sequence, SPM llama vocabulary),
# usage counts, n, stop, logprobs, error bodies naming the field (400/401/403/404/405/
# 413/429/503 with Retry-After), a client disconnect cancelling its request, API keys and
# the per-tenant usage ledger, and SIGTERM draining a stream in flight, then exit 0.
# $1 is the kiln binary; kiln-gen sits next to it.
set -euo pipefail
S=${KILN_TIME_SCALE:-1} # waits stretched in slow builds (sanitizers: tests/CMakeLists.txt)
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
[ -x "$GEN" ] || { echo "kiln-gen not found next to $1"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 0; }
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$T"/log*; do echo "== $f"; tail -5 "$f"; done
  for f in "$T"/q* "$T"/x*; do [ -f "$f" ] && { echo "== $f"; tail -c 400 "$f"; echo; }; done
  exit 1
}
SHARED=${KILN_SHARED_DIR:-$(dirname "$0")/../data/shared}
TPL=$SHARED/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja
[ -f "$TPL" ] || TPL=$(dirname "$0")/../data/shared/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja
jqf() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

"$GEN" -q -p tiny -f llama -t q8_0 -s 7 --ctx 16384 -o "$T/m.gguf"

# start NAME ARGS...: starts a server, sets PORT
start() {
  local name=$1; shift
  rm -f "$T/ready.$name"
  "$KILN" serve -m "$T/m.gguf" --port 0 --ready-file "$T/ready.$name" -t 1 -c 16384 "$@" \
    2>"$T/log.$name" &
  PIDS+=($!)
  eval "PID_$name=$!"
  for _ in $(seq $((200 * S))); do [ -f "$T/ready.$name" ] && break; sleep 0.1; done
  [ -f "$T/ready.$name" ] || fail "$name: server did not start"
  PORT=$(cut -d' ' -f2 "$T/ready.$name")
}

start a --chat-template "$TPL" --slots 4 --queue 2 --max-body 65536
U=http://127.0.0.1:$PORT
code() { curl -s -o "$T/body" -w '%{http_code}' "$@"; }
post() { local path=$1; shift; curl -s -o "$T/body" -D "$T/hdr" -w '%{http_code}' "$U$path" -H 'Content-Type: application/json' "$@"; }

# -- plain routes
[ "$(code $U/health)" = 200 ] || fail "/health"
grep -q '"ok"' "$T/body" || fail "/health body"
[ "$(code $U/v1/models)" = 200 ] || fail "/v1/models"
[ "$(jqf "d['data'][0]['id']" < "$T/body")" = m ] || fail "model id"
[ "$(code $U/)" = 200 ] || fail "/"
grep -q '<title>kiln chat</title>' "$T/body" || fail "web page"
[ "$(code $U/metrics)" = 200 ] || fail "/metrics"
grep -q '^kiln_requests_running 0' "$T/body" || fail "metrics gauges"
[ "$(code $U/nope)" = 404 ] || fail "unknown route"
[ "$(code -X DELETE $U/v1/models)" = 405 ] || fail "DELETE"

# -- completions: usage, exact text, stream == non-stream
P='"model":"m","prompt":"hello world","temperature":0,"max_tokens":12,"return_token_ids":true'
[ "$(post /v1/completions -d "{$P}")" = 200 ] || fail "completion: $(cat "$T/body")"
cp "$T/body" "$T/c1"
fin=$(jqf "d['choices'][0]['finish_reason']" < "$T/c1")
ntok=$(jqf "len(d['choices'][0]['token_ids'])" < "$T/c1")
ct=$(jqf "d['usage']['completion_tokens']" < "$T/c1")
pt=$(jqf "d['usage']['prompt_tokens']" < "$T/c1")
[ "$(jqf "len(d['prompt_token_ids'])" < "$T/c1")" = "$pt" ] || fail "prompt_tokens != prompt ids"
if [ "$fin" = length ]; then [ "$ct" = 12 ] && [ "$ntok" = 12 ] || fail "usage $ct / $ntok tokens for length"
else [ "$ct" = $((ntok + 1)) ] || fail "usage $ct with $ntok tokens + end token"; fi
[ "$(jqf "d['usage']['total_tokens']" < "$T/c1")" = $((pt + ct)) ] || fail "total_tokens"
# the whole sequence without its leading BOS (llama.cpp's detokenize with remove_special)
bos=$("$KILN" tokenize -m "$T/m.gguf" --add-special --ids "" | tr -d ' \n')
ids=$(jqf "' '.join(map(str, [i for k, i in enumerate(d['prompt_token_ids'] + d['choices'][0]['token_ids']) if not (k == 0 and str(i) == '$bos')]))" < "$T/c1")
"$KILN" detokenize -m "$T/m.gguf" --no-special $ids > "$T/whole"
# the server sends valid UTF-8: bytes that never form a character become U+FFFD
python3 - "$T/whole" "$T/c1" <<'EOF' || fail "exact text"
import json, sys
whole = open(sys.argv[1], "rb").read().decode("utf-8", errors="replace")
text = json.load(open(sys.argv[2]))["choices"][0]["text"]
assert "hello world" + text == whole, ("hello world" + text, whole)
EOF
curl -sN "$U/v1/completions" -d "{$P,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$T/sse"
python3 - "$T/sse" "$T/c1" <<'EOF' || fail "completion SSE framing"
import json, sys
raw = open(sys.argv[1]).read()
ref = json.load(open(sys.argv[2]))
events = raw.split("\n\n")
assert events[-1] == "", "stream must end with a blank line"
events = events[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), events
assert events[-1] == "data: [DONE]"
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert all(c["object"] == "text_completion" for c in chunks)
text = "".join(ch["text"] for c in chunks for ch in c["choices"])
assert text == ref["choices"][0]["text"], (text, ref["choices"][0]["text"])
fins = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
assert fins == [ref["choices"][0]["finish_reason"]], fins
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == ref["usage"], chunks[-1]
assert all(c["usage"] is None for c in chunks[:-1])
EOF

# -- chat: role chunk, content, finish chunk; n=2 greedy choices agree; stop; logprobs
C='"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"temperature":0,"max_tokens":10'
[ "$(post /v1/chat/completions -d "{$C,\"n\":2,\"logprobs\":true,\"top_logprobs\":3}")" = 200 ] || fail "chat: $(cat "$T/body")"
python3 - "$T/body" <<'EOF' || fail "chat body"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["object"] == "chat.completion" and len(d["choices"]) == 2
a, b = d["choices"]
assert a["message"]["role"] == "assistant" and a["message"]["content"] == b["message"]["content"]
lp = a["logprobs"]["content"]
assert len(lp) >= 1 and all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in lp)
assert abs(lp[0]["top_logprobs"][0]["logprob"] - lp[0]["logprob"]) < 1e-6  # greedy: the top one
n = sum(len(c["logprobs"]["content"]) + (c["finish_reason"] == "stop") for c in d["choices"])
assert d["usage"]["completion_tokens"] == n, (d["usage"], n)
EOF
curl -sN "$U/v1/chat/completions" -d "{$C,\"stream\":true}" > "$T/sse"
post /v1/chat/completions -d "{$C}" >/dev/null
python3 - "$T/sse" "$T/body" <<'EOF' || fail "chat SSE"
import json, sys
events = open(sys.argv[1]).read().split("\n\n")[:-1]
ref = json.load(open(sys.argv[2]))
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert events[-1] == "data: [DONE]"
assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
assert text == ref["choices"][0]["message"]["content"]
assert chunks[-1]["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
EOF
full=$(jqf "d['choices'][0]['message']['content']" < "$T/body")
if [ ${#full} -ge 4 ]; then
  stop=${full:2:2}
  post /v1/chat/completions -d "{$C,\"stop\":$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$stop")}" >/dev/null
  got=$(jqf "d['choices'][0]['message']['content']" < "$T/body")
  [ "$got" = "${full%%"$stop"*}" ] || fail "stop '$stop': got '$got' from '$full'"
  [ "$(jqf "d['choices'][0]['finish_reason']" < "$T/body")" = stop ] || fail "stop finish_reason"
fi

# -- errors: OpenAI-shaped, naming the field
err() { # STATUS PARAM PATH BODY
  local st; st=$(post "$3" -d "$4")
  [ "$st" = "$1" ] || fail "$4 -> $st (want $1): $(cat "$T/body")"
  [ "$(jqf "d['error']['param']" < "$T/body")" = "$2" ] || fail "$4 -> param $(cat "$T/body")"
  jqf "d['error']['message']" < "$T/body" >/dev/null
}
err 400 None /v1/chat/completions '{"model":'
err 400 messages /v1/chat/completions '{"model":"m"}'
err 400 temperature /v1/chat/completions "{$C,\"temperature\":9}"
err 400 "messages[0].role" /v1/chat/completions '{"model":"m","messages":[{"role":"x","content":"y"}]}'
err 400 response_format /v1/chat/completions "{$C,\"response_format\":{\"type\":\"json_object\"}}"
err 404 model /v1/chat/completions '{"model":"gpt-4","messages":[{"role":"user","content":"x"}]}'
err 400 prompt /v1/completions '{"model":"m","prompt":"x","max_tokens":16384}'
[ "$(jqf "d['error']['code']" < "$T/body")" = context_length_exceeded ] || fail "context code"
err 400 "prompt[0]" /v1/completions '{"model":"m","prompt":[99999]}'
head -c 70000 /dev/zero | tr '\0' 'a' > "$T/big"
[ "$(post /v1/completions --data-binary @"$T/big")" = 413 ] || fail "body limit"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/models" -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' b)")" -ge 400 ] || fail "header limit"

# -- disconnect cancels; queue full answers 503 with Retry-After
L='"model":"m","prompt":"a","temperature":0,"max_tokens":16000,"logit_bias":{"2":-100},"stream":true'
# 6 streams at once: 4 fill the slots and 2 the queue (2), whatever the scheduler took
# before the others came (a tenant's queue limit once counted the ones bound for free slots,
# and a loaded machine got 429s here: sched.c), then 4 more until the server answers 503
for i in 1 2 3 4 5 6; do curl -sN "$U/v1/completions" -d "{$L}" > "$T/q$i" & PIDS+=($!); done
for _ in $(seq $((300 * S))); do
  curl -s "$U/metrics" > "$T/m"
  grep -q '^kiln_requests_running 4$' "$T/m" && grep -q '^kiln_requests_waiting 2$' "$T/m" && break
  sleep 0.05
done
grep -q '^kiln_requests_running 4' "$T/m" || fail "4 slots never ran: $(grep '^kiln_requests' "$T/m")"
grep -q '^kiln_requests_waiting 2' "$T/m" || fail "2 never queued: $(grep '^kiln_requests' "$T/m")"
for i in 1 2 3 4; do
  curl -s -o "$T/x$i" -D "$T/h$i" -w '%{http_code}' "$U/v1/completions" -d "{$L}" > "$T/st$i" &
  PIDS+=($!)
done
st=
for _ in $(seq $((100 * S))); do
  for i in 1 2 3 4; do grep -q 503 "$T/st$i" 2>/dev/null && { st=503; cp "$T/x$i" "$T/body"; cp "$T/h$i" "$T/hdr"; }; done
  [ "$st" = 503 ] && break
  sleep 0.1
done
[ "$st" = 503 ] || fail "queue full: no 503 among 4 more requests"
[ "$(jqf "d['error']['code']" < "$T/body")" = queue_full ] || fail "503 body $(cat "$T/body")"
grep -qi '^Retry-After: [0-9]' "$T/hdr" || fail "503 without Retry-After"
n=${#PIDS[@]}
for p in "${PIDS[@]:1:10}"; do kill "$p" 2>/dev/null || true; done
for _ in $(seq $((50 * S))); do
  curl -s "$U/metrics" > "$T/m"
  grep -q '^kiln_requests_running 0' "$T/m" && grep -q '^kiln_requests_waiting 0' "$T/m" && break
  sleep 0.1
done
grep -q '^kiln_requests_running 0' "$T/m" || fail "disconnected streams still running: $(grep requests_ "$T/m")"
grep -q 'kiln_tenant_cancelled_total{tenant="default"} [1-9]' "$T/m" || fail "no cancellations counted"
grep -q 'kiln_http_requests_total{status="503"} [1-9]' "$T/m" || fail "503 not counted"

# -- SIGTERM drains a stream in flight, then exit 0
curl -sN "$U/v1/completions" -d '{"model":"m","prompt":"a","temperature":0,"max_tokens":300,"logit_bias":{"2":-100},"stream":true}' > "$T/drain" &
CURL=$!
sleep 0.3
kill -TERM "$PID_a"
wait "$CURL" || true
rc=0; wait "$PID_a" || rc=$?
[ "$rc" = 0 ] || fail "server exit $rc after SIGTERM"
tail -c 20 "$T/drain" | grep -q 'data: \[DONE\]' || fail "drained stream did not finish"
grep -q '"finish_reason":"length"' "$T/drain" || fail "drained stream cut short"

# -- API keys, quotas, ledger
cat > "$T/kiln.yaml" <<'EOF'
tenants:
  - id: alice
    keys: [sk-alice]
  - id: bob
    key: sk-bob
    tokens_per_minute: 40
  - id: carol
    api_keys: [sk-carol]
    qos: batch
    max_slots: 1
    max_context: 16
    isolation_group: team-c
EOF
start b --config "$T/kiln.yaml"
U=http://127.0.0.1:$PORT
[ "$(code $U/v1/models)" = 401 ] || fail "no key accepted"
[ "$(code $U/v1/models -H 'Authorization: Bearer sk-wrong')" = 401 ] || fail "wrong key accepted"
[ "$(code $U/v1/models -H 'Authorization: Bearer sk-alice')" = 200 ] || fail "alice's key refused"
B='"model":"m","prompt":"hello","max_tokens":5,"temperature":0'
[ "$(post /v1/completions -d "{$B}")" = 401 ] || fail "completion without key"
[ "$(post /v1/completions -H 'Authorization: Bearer sk-bob' -d "{$B}")" = 200 ] || fail "bob 1: $(cat "$T/body")"
[ "$(post /v1/completions -H 'Authorization: Bearer sk-bob' -d "{$B,\"prompt\":\"$(printf 'hello %.0s' $(seq 30))\"}")" = 429 ] || fail "bob over quota: $(cat "$T/body")"
grep -qi '^Retry-After: [0-9]' "$T/hdr" || fail "429 without Retry-After"
[ "$(code $U/v1/tenants/bob/usage -H 'Authorization: Bearer sk-bob')" = 200 ] || fail "bob usage"
[ "$(jqf "d['completion_tokens'] > 0 and d['rejected_quota'] == 1" < "$T/body")" = True ] || fail "ledger $(cat "$T/body")"
[ "$(code $U/v1/tenants/bob/usage -H 'Authorization: Bearer sk-alice')" = 403 ] || fail "alice read bob's usage"
# issue #12's keys reach the scheduler: carol's max_context (16) refuses what alice's allows
[ "$(post /v1/completions -H 'Authorization: Bearer sk-carol' -d "{$B}")" = 200 ] || fail "carol 1: $(cat "$T/body")"
[ "$(post /v1/completions -H 'Authorization: Bearer sk-carol' -d "{$B,\"max_tokens\":40}")" = 400 ] || fail "carol over max_context: $(cat "$T/body")"
grep -q 'tenant max_context' "$T/body" || fail "carol's refusal does not name max_context: $(cat "$T/body")"
[ "$(post /v1/completions -H 'Authorization: Bearer sk-alice' -d "{$B,\"max_tokens\":40}")" = 200 ] || fail "alice 40 tokens: $(cat "$T/body")"
! grep -q 'sk-' "$T/log.b" || fail "a key was logged"
kill -INT "$PID_b"
rc=0; wait "$PID_b" || rc=$?
[ "$rc" = 0 ] || fail "server exit $rc after SIGINT"
echo "ok"
