"""loadgen.py — load for OpenAI-compatible servers (kiln serve, llama-server), stdlib only.

  python3 loadgen.py stress URL MODEL [--streams 256] [--prompts 16] [--seed 1]
      Solo greedy runs of a few prompts, then STREAMS concurrent clients over loopback:
      most stream a prompt and must get exactly its solo text; some disconnect at a random
      point; some send malformed requests (bad JSON, wrong types, garbage bytes, huge
      headers, truncated bodies, unknown routes) and must get a 4xx or a closed socket.
      Afterwards the server must be healthy with nothing running. Exit 1 on any failure.

  python3 loadgen.py bench URL MODEL --clients N [--requests R] [--rate-per-client X]
      N clients, each sending requests with Poisson arrivals (exponential gaps, mean
      1/X s; X=0: back to back), synthetic ShareGPT-like lengths (log-normal prompt and
      output lengths, fixed seed, the same for every server). Streams /v1/completions with
      the end-of-text token banned so both servers generate max_tokens. Prints one JSON
      line: requests/s, output tok/s, TTFT and inter-token p50/p99 (ms).
"""
import argparse
import http.client
import json
import math
import random
import socket
import sys
import threading
import time
import urllib.parse

WORDS = ("the of and to in is was that for on with as by at from his her they this which or "
         "had are not but be have one all were we when there can an your more if out so said "
         "what up its about into than them time only new some could these two may first "
         "then do any like my now over such our man me even most made after also did many "
         "before must through back years where much way well down should because each just "
         "those people how too little state good very make world still own see men work long "
         "get here between both life being under never day same another know while last "
         "might us great old year off come since against go came right used take three").split()


def hostport(url):
    u = urllib.parse.urlparse(url)
    return u.hostname, u.port or 80


def post(url, path, body, timeout=300, headers=None):
    h, p = hostport(url)
    c = http.client.HTTPConnection(h, p, timeout=timeout)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json", **(headers or {})})
    return c, c.getresponse()


def sse_events(resp):
    """Yields the JSON payloads of an SSE response until [DONE]."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.rstrip(b"\r\n")
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            return
        yield json.loads(data)


def complete_stream(url, model, prompt, max_tokens, extra=None, on_chunk=None):
    """Streams one completion; returns (text, ttft_s, gaps, n_chunks, usage)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    c, r = post(url, "/v1/completions", body)
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    text, ttft, last, gaps, n, usage = "", None, None, [], 0, None
    for ev in sse_events(r):
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("text") or ""
            if piece:
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
                n += 1
                text += piece
                if on_chunk and on_chunk(n):
                    c.close()
                    return text, ttft, gaps, n, None
    c.close()
    return text, ttft, gaps, n, usage


def make_prompt(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


MALFORMED = [
    ("POST", "/v1/completions", b"{not json", {}),
    ("POST", "/v1/completions", b'{"model": 5, "prompt": "x"}', {}),
    ("POST", "/v1/chat/completions", b'{"model":"M","messages":"hi"}', {}),
    ("POST", "/v1/chat/completions", b'{"model":"M","messages":[{"role":"user","content":"x"}],'
     b'"temperature":"hot"}', {}),
    ("POST", "/v1/completions", b'{"model":"M","prompt":"x","max_tokens":-4}', {}),
    ("POST", "/v1/completions", b'{"model":"M","prompt":[1,2,99999999]}', {}),
    ("POST", "/v1/completions", b'{"model":"M","prompt":"\xff\xfe\xfd"}', {}),
    ("POST", "/v1/completions", b"[" * 5000, {}),
    ("POST", "/v1/completions", b'{"model":"M","prompt":"x","logit_bias":{"a":1}}', {}),
    ("POST", "/v1/nothing", b"{}", {}),
    ("GET", "/v1/models", b"", {"X-Huge": "h" * 100000}),
]


def raw_garbage(url, rng):
    """Garbage bytes / a truncated body on a raw socket; the server must not crash."""
    h, p = hostport(url)
    s = socket.create_connection((h, p), timeout=30)
    try:
        kind = rng.randrange(3)
        if kind == 0:
            s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4000))))
        elif kind == 1:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                      b"Content-Type: application/json\r\n\r\n{\"model\":")
        else:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                      b"\r\n\r\nzz\r\nabc\r\n")
        s.settimeout(5)
        try:
            s.recv(4096)
        except OSError:
            pass
    finally:
        s.close()


def stress(a):
    rng = random.Random(a.seed)
    prompts = [(make_prompt(rng, rng.randrange(3, 40)), rng.randrange(4, 48))
               for _ in range(a.prompts)]
    ban = {"logit_bias": {t: -100 for t in a.eos.split(",")}} if a.eos else {}
    solo = []
    for p, n in prompts:
        text, *_ = complete_stream(a.url, a.model, p, n, ban)
        solo.append(text)
    print(f"solo: {len(solo)} prompts", flush=True)
    results = {"same": 0, "diff": 0, "disc": 0, "bad_ok": 0, "bad_fail": 0, "err": 0}
    errors = []
    lock = threading.Lock()

    def worker(i):
        r = random.Random(a.seed * 1000 + i)
        roll = r.random()
        try:
            if roll < 0.6:
                k = i % len(prompts)
                text, *_ = complete_stream(a.url, a.model, prompts[k][0], prompts[k][1], ban)
                key = "same" if text == solo[k] else "diff"
                if key == "diff":
                    with lock:
                        errors.append(f"stream {i}: {text!r} != solo {solo[k]!r}")
            elif roll < 0.8:
                k = i % len(prompts)
                cut = r.randrange(1, 6)
                complete_stream(a.url, a.model, prompts[k][0], 400, ban,
                                on_chunk=lambda n: n >= cut)
                key = "disc"
            elif roll < 0.9:
                m, path, body, hdr = MALFORMED[i % len(MALFORMED)]
                body = body.replace(b'"M"', json.dumps(a.model).encode())
                h, p = hostport(a.url)
                c = http.client.HTTPConnection(h, p, timeout=60)
                try:
                    c.request(m, path, body=body or None,
                              headers={"Content-Type": "application/json", **hdr})
                    st = c.getresponse().status
                except (ConnectionError, http.client.HTTPException):
                    st = 400  # the server closed the connection: fine for garbage
                c.close()
                key = "bad_ok" if 400 <= st < 500 else "bad_fail"
                if key == "bad_fail":
                    with lock:
                        errors.append(f"malformed {i % len(MALFORMED)} got HTTP {st}")
            else:
                raw_garbage(a.url, r)
                key = "bad_ok"
        except Exception as e:  # noqa: BLE001
            key = "err"
            with lock:
                errors.append(f"client {i}: {type(e).__name__}: {e}")
        with lock:
            results[key] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    h, p = hostport(a.url)
    c = http.client.HTTPConnection(h, p, timeout=30)
    for _ in range(100):
        c.request("GET", "/metrics")
        m = c.getresponse().read().decode()
        if "kiln_requests_running 0" in m and "kiln_requests_waiting 0" in m:
            break
        time.sleep(0.1)
    c.request("GET", "/health")
    health = c.getresponse().status
    print(json.dumps({"streams": a.streams, "seconds": round(dt, 1), **results,
                      "health": health}), flush=True)
    for e in errors[:20]:
        print("  " + e)
    if errors or health != 200 or "kiln_requests_running 0" not in m:
        sys.exit(1)


def pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def bench(a):
    rng = random.Random(a.seed)
    # ShareGPT-like: log-normal prompt (median ~ 60 words) and output (median ~ 48 tokens)
    work = []
    for _ in range(a.requests):
        pw = int(min(a.max_prompt_words, max(4, rng.lognormvariate(math.log(60), 0.8))))
        ot = int(min(a.max_tokens, max(4, rng.lognormvariate(math.log(48), 0.7))))
        work.append((make_prompt(rng, pw), ot))
    ban = {"logit_bias": {t: -100 for t in a.eos.split(",")}} if a.eos else {}
    ttfts, gaps, toks, done, fails = [], [], [0], [0], []
    lock = threading.Lock()
    nxt = [0]

    def client(ci):
        r = random.Random(a.seed * 7919 + ci)
        while True:
            with lock:
                if nxt[0] >= len(work):
                    return
                k = nxt[0]
                nxt[0] += 1
            if a.rate_per_client > 0:
                time.sleep(r.expovariate(a.rate_per_client))
            try:
                text, ttft, g, n, usage = complete_stream(a.url, a.model, work[k][0], work[k][1],
                                                          ban)
            except Exception as e:  # noqa: BLE001
                with lock:
                    fails.append(str(e))
                continue
            with lock:
                if ttft is not None:
                    ttfts.append(ttft)
                gaps.extend(g)
                toks[0] += usage["completion_tokens"] if usage else n
                done[0] += 1

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    print(json.dumps({
        "clients": a.clients, "requests": done[0], "failed": len(fails), "wall_s": round(wall, 2),
        "req_per_s": round(done[0] / wall, 3), "out_tok_per_s": round(toks[0] / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, .5) * 1e3, 1), "ttft_p99_ms": round(pct(ttfts, .99) * 1e3, 1),
        "itl_p50_ms": round(pct(gaps, .5) * 1e3, 2), "itl_p99_ms": round(pct(gaps, .99) * 1e3, 2),
    }), flush=True)
    if fails:
        print("  first failure: " + fails[0], file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["stress", "bench"])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eos", default="", help="token ids to ban (logit_bias -100), comma-separated")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate-per-client", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-words", type=int, default=400)
    a = ap.parse_args()
    stress(a) if a.mode == "stress" else bench(a)


if __name__ == "__main__":
    main()
