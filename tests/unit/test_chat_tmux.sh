#!/usr/bin/env bash
# test_chat_tmux.sh — `kiln chat` in a real terminal (tmux send-keys / capture-pane):
# two turns where the second reuses the first's KV cache (its statistics line shows
# reused tokens and prefills only the new turn), Ctrl-C stopping an answer without
# leaving, /help, /save (valid JSON of the conversation), /system, /load, Ctrl-D
# leaving with status 0. $1 is the kiln binary.
set -euo pipefail
KILN=$1
GEN="$(dirname "$1")/kiln-gen"
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serve/lib.sh"
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed"; exit 0; }
T=$(mktemp -d)
S=kiln-chat-$$
trap 'tmux kill-session -t $S 2>/dev/null || true; rm -rf "$T"' EXIT
serve_pick_model "$T"
echo "model: $MODEL_KIND"
fail() { echo "FAIL: $*"; tmux capture-pane -p -t $S -S -100 2>/dev/null | tail -40; exit 1; }
tmux new-session -d -s $S -x 160 -y 50 \
  "$KILN chat -m '$MODEL' ${MODEL_ARGS[*]} --temp 0 -n 400 -t 2; echo EXIT=\$? > '$T/exit'; sleep 30"
pane() { tmux capture-pane -p -J -t $S -S -1000; }
wait_for() { # PATTERN COUNT WHAT
  for _ in $(seq 1200); do
    [ "$(pane | grep -c -- "$1" || true)" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "timed out waiting for $3"
}
wait_for '^> ' 1 "the prompt"
tmux send-keys -t $S "My name is Ada. Say hello to me." Enter
wait_for 'reused)' 1 "turn 1"
tmux send-keys -t $S "What is my name?" Enter
wait_for 'reused)' 2 "turn 2"
stats=$(pane | grep 'reused)')
first=$(echo "$stats" | sed -n 1p); second=$(echo "$stats" | sed -n 2p)
echo "$first" | grep -q '(0 reused)' || fail "turn 1 reused tokens: $first"
reused=$(echo "$second" | sed -E 's/.*\(([0-9]+) reused\).*/\1/')
new=$(echo "$second" | sed -E 's/^\[([0-9]+) new prompt tokens.*/\1/')
total1=$(echo "$first" | sed -E 's/^\[([0-9]+) new prompt tokens.*/\1/')
[ "$reused" -ge "$total1" ] || fail "turn 2 reused $reused < turn 1's prompt $total1: $second"
# (a random-weight model's answer is not stable under re-tokenization, so only the real
# model's second turn must prefill less than it reuses)
[ "$MODEL_KIND" != smollm2 ] || [ "$new" -lt "$reused" ] || fail "turn 2 prefilled $new tokens, reused $reused: $second"
# Ctrl-C mid-answer stops the answer, not the program
tmux send-keys -t $S "Write a very long story about a dragon and a knight, with many chapters." Enter
for _ in $(seq 600); do
  [ "$(pane | grep -c 'reused)')" -ge 3 ] && break
  # some text of the answer is on screen: the last line is not the prompt
  last=$(pane | grep -v '^$' | tail -1)
  [ ${#last} -gt 20 ] && [[ "$last" != "> "* ]] && break
  sleep 0.05
done
tmux send-keys -t $S C-c
wait_for 'reused)' 3 "the stopped turn's statistics"
pane | grep -q '\[stopped\]' || fail "Ctrl-C did not stop the answer"
[ ! -f "$T/exit" ] || fail "Ctrl-C left the program"
tmux send-keys -t $S "/help" Enter
wait_for '^/save FILE' 1 "/help"
tmux send-keys -t $S "/save $T/conv.json" Enter
wait_for 'saved 6 messages' 1 "/save"
python3 -c "
import json,sys
m=json.load(open('$T/conv.json'))
assert [x['role'] for x in m]==['user','assistant']*3, m
assert m[0]['content'].startswith('My name is Ada')
" || fail "saved conversation"
ls "$T" | grep -q 'conv.json.tmp' && fail "temporary file left behind"
tmux send-keys -t $S "/system You are a pirate." Enter
wait_for 'system prompt set' 1 "/system"
tmux send-keys -t $S "/load $T/conv.json" Enter
wait_for 'loaded 6 messages' 1 "/load"
tmux send-keys -t $S C-d
for _ in $(seq 100); do [ -f "$T/exit" ] && break; sleep 0.1; done
[ -f "$T/exit" ] || fail "Ctrl-D did not leave"
[ "$(cat "$T/exit")" = EXIT=0 ] || fail "exit status $(cat "$T/exit")"
echo "ok: $first / $second"
