"""openai_client.py — kiln serve driven by the official `openai` Python package.

Usage: python3 openai_client.py BASE_URL MODEL_ID KEY LIMITED_KEY
The server must run with tenants KEY (no limits) and LIMITED_KEY (a tokens_per_minute
quota smaller than one request). Exits non-zero with a message on the first failure.
"""
import sys

import openai
from openai import OpenAI

base, model, key, limited_key = sys.argv[1:5]
c = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    checks += 1


ids = [m.id for m in c.models.list()]
check(ids == [model], f"models.list {ids}")

msgs = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]

# chat, not streamed
r = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24)
ch = r.choices[0]
check(r.object == "chat.completion" and ch.message.role == "assistant", "chat shape")
check(isinstance(ch.message.content, str) and ch.message.content, "chat content")
check(ch.finish_reason in ("stop", "length"), f"finish_reason {ch.finish_reason}")
u = r.usage
check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24 and
      u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
if ch.finish_reason == "length":
    check(u.completion_tokens == 24, "length finish uses max_tokens")

# chat, streamed: same text (greedy), usage chunk equal
text, fin, usage = "", None, None
for chunk in c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24,
                                       stream=True, stream_options={"include_usage": True}):
    if chunk.usage:
        usage = chunk.usage
    for x in chunk.choices:
        text += x.delta.content or ""
        fin = x.finish_reason or fin
check(text == ch.message.content, f"streamed {text!r} != {ch.message.content!r}")
check(fin == ch.finish_reason, "streamed finish_reason")
check(usage is not None and usage.completion_tokens == u.completion_tokens and
      usage.prompt_tokens == u.prompt_tokens, f"stream usage {usage}")

# multi-turn: the answer goes back in
msgs2 = msgs + [{"role": "assistant", "content": ch.message.content},
                {"role": "user", "content": "And of Germany?"}]
r2 = c.chat.completions.create(model=model, messages=msgs2, temperature=0, max_tokens=24)
check(r2.usage.prompt_tokens > u.prompt_tokens + u.completion_tokens - 2, "multi-turn prompt")

# n, seed: reproducible samples, n choices
kw = dict(model=model, messages=msgs, temperature=1.0, top_p=0.95, max_tokens=12, seed=1234, n=3)
a = c.chat.completions.create(**kw)
b = c.chat.completions.create(**kw)
check([x.index for x in a.choices] == [0, 1, 2], "n=3 indexes")
check([x.message.content for x in a.choices] == [x.message.content for x in b.choices],
      "same seed, same samples")
check(a.usage.completion_tokens <= 36, "n usage")

# stop
full = ch.message.content
if len(full) > 6:
    stop = full[3:6]
    r = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=24,
                                  stop=[stop])
    check(r.choices[0].message.content == full[:full.index(stop)],
          f"stop {stop!r}: {r.choices[0].message.content!r} from {full!r}")
    check(r.choices[0].finish_reason == "stop", "stop finish_reason")

# logprobs
r = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8,
                              logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop"),
      f"{len(lp)} logprobs for {r.usage.completion_tokens} tokens")
check(all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp), "top_logprobs")
check("".join(t.token for t in lp) == r.choices[0].message.content or
      r.choices[0].finish_reason == "stop", "tokens spell the content")

# legacy completions, streamed and not, logprobs
r = c.completions.create(model=model, prompt="Once upon a time", max_tokens=10, temperature=0,
                         logprobs=2)
check(r.object == "text_completion" and r.choices[0].text, "completion text")
check(len(r.choices[0].logprobs.tokens) == len(r.choices[0].logprobs.token_logprobs) > 0,
      "completion logprobs")
s = "".join(x.choices[0].text for x in c.completions.create(
    model=model, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True))
check(s == r.choices[0].text, f"streamed completion {s!r} != {r.choices[0].text!r}")
r = c.completions.create(model=model, prompt=[1, 2, 3], max_tokens=3, temperature=0)
check(r.usage.prompt_tokens == 3, "token-id prompt")

# errors as the client's typed exceptions
def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(True, what)
        return e
    except Exception as e:  # noqa: BLE001
        raise SystemExit(f"FAIL: {what}: raised {type(e).__name__}: {e}")
    raise SystemExit(f"FAIL: {what}: no exception")


e = raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=model, messages=msgs, temperature=5), "temperature 5 -> BadRequestError")
check(e.body and e.body.get("param") == "temperature", f"param in {e.body}")
raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=model, messages=msgs, response_format={"type": "json_object"}), "json_object -> 400")
raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x " * 9000}]), "context overflow -> 400")
raises(openai.NotFoundError, lambda: c.chat.completions.create(
    model="gpt-4o", messages=msgs), "unknown model -> NotFoundError")
bad = OpenAI(base_url=base, api_key="sk-wrong", max_retries=0)
raises(openai.AuthenticationError, lambda: bad.models.list(), "wrong key -> AuthenticationError")
lim = OpenAI(base_url=base, api_key=limited_key, max_retries=0)
raises(openai.RateLimitError, lambda: lim.chat.completions.create(
    model=model, messages=msgs, max_tokens=4), "over quota -> RateLimitError")
print(f"ok: {checks} checks")
