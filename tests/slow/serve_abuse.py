#!/usr/bin/env python3
"""serve_abuse.py — malformed requests, half-open (slowloris) connections and concurrent
streams against a running `kiln serve` (issue #14). Usage: serve_abuse.py PORT PID [N_SLOW]
[N_STREAMS] [SECONDS]. Prints one line per check and a summary; exits 1 when the server
crashed, answered a malformed request with 5xx other than 503, stopped answering /health,
or its RSS grew more than 20% between the warm-up and the end of the stream phase."""
import http.client, json, os, random, resource, socket, sys, threading, time

port, pid = int(sys.argv[1]), int(sys.argv[2])
n_slow = int(sys.argv[3]) if len(sys.argv) > 3 else 200
n_streams = int(sys.argv[4]) if len(sys.argv) > 4 else 32
seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 30
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
bad = []

def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1])
    return -1

def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False

def req(method, path, body=None, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data

def health():
    try:
        return req("GET", "/health", timeout=10)[0] == 200
    except Exception as e:
        return False

chat = lambda **kw: json.dumps(dict({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}, **kw))
cases = {
    "bad json": b'{"model": "m", "messages": [',
    "not an object": b'[1,2,3]',
    "wrong types": json.dumps({"model": 5, "messages": "hi", "max_tokens": "ten"}).encode(),
    "huge number": b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e400}',
    "huge integer": b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":123456789012345678901234567890}',
    "invalid utf-8": b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe\xc3\x28"}]}',
    "10 MB body": chat(messages=[{"role": "user", "content": "a" * (10 << 20)}]).encode(),
    "5000 stop strings": chat(stop=["s%d" % i for i in range(5000)]).encode(),
    "n = 10^6": chat(n=1000000).encode(),
    "max_tokens = 10^9": chat(max_tokens=1000000000).encode(),
    "negative temperature": chat(temperature=-1).encode(),
    "nan top_p": b'{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":NaN}',
    "deep nesting": b'{"model":"m","messages":' + b'[' * 100000 + b']' * 100000 + b'}',
    "null messages": b'{"model":"m","messages":null}',
    "empty body": b'',
    "logit_bias out of range": chat(logit_bias={"99999999": 5, "-3": 1}).encode(),
    "prompt ids out of range": json.dumps({"model": "m", "prompt": [1, -5, 2**40], "max_tokens": 2}).encode(),
}
for name, body in cases.items():
    path = "/v1/completions" if b'"prompt"' in body[:200] else "/v1/chat/completions"
    try:
        st, data = req("POST", path, body)
    except Exception as e:
        st, data = -1, str(e).encode()
    # a server may answer 413 before the body is sent and close: the client then sees a
    # broken pipe / reset instead of the status
    ok = (400 <= st < 500) or st == 503 or (st == 200 and name in ("max_tokens = 10^9",)) or \
        (name == "10 MB body" and st == -1 and (b"Broken pipe" in data or b"reset" in data))
    print(f"{'ok ' if ok else 'BAD'} {name}: HTTP {st} {data[:100]!r}")
    if not ok:
        bad.append(name)
    if not alive():
        print("server died"); sys.exit(1)
print(f"health after malformed requests: {health()}")

# slowloris: n_slow connections that send part of a request line and headers, slowly
socks = []
for i in range(n_slow):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    except Exception as e:
        print(f"slowloris: connection {i} refused: {e}")
        break
t0 = time.time()
h = health()
print(f"slowloris: {len(socks)} half-open connections held; /health {'answered' if h else 'FAILED'} in {time.time()-t0:.2f}s")
if not h:
    bad.append(f"health under {len(socks)} half-open connections")
for s in socks:
    s.close()

# greedy answers of a fixed prompt set, each alone (one request at a time): every stream
# below that completes must give the same text (the server's deterministic default)
N_PROMPTS, SOLO_TOKENS = 16, 12
def content_of(data):
    return json.loads(data)["choices"][0]["message"]["content"]
solo = []
for p in range(N_PROMPTS):
    st, data = req("POST", "/v1/chat/completions", chat(max_tokens=SOLO_TOKENS, messages=[{"role": "user", "content": "tell me %d" % p}]).encode(), timeout=120)
    solo.append(content_of(data) if st == 200 else None)
    if st != 200:
        bad.append(f"solo request {p}: HTTP {st}")

def sse_text(raw):
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            try:
                d = json.loads(line[6:])
                out.append(d["choices"][0]["delta"].get("content") or "")
            except Exception:
                return None
    return "".join(out)

def counters():
    # the server's own books: HTTP answers by status (/metrics) and the tenant's ledger
    st, m = req("GET", "/metrics")
    by = {}
    for line in m.decode().splitlines():
        if line.startswith("kiln_http_requests_total{status="):
            by[line.split('"')[1]] = int(float(line.split()[-1]))
    st, u = req("GET", "/v1/tenants/default/usage")
    return by, json.loads(u)

# concurrent streams with random cancels and slow readers: a warm-up phase, then a
# measured phase of the same length; RSS after each
stats = {"done": 0, "cancelled": 0, "errors": 0, "503": 0, "429": 0, "mismatch": 0}
lock = threading.Lock()
err_kinds = {}
def worker(i, stop_at):
    rnd = random.Random(i * 7919 + int(stop_at))
    while time.time() < stop_at:
        p = rnd.randrange(N_PROMPTS)
        body = chat(stream=True, max_tokens=SOLO_TOKENS, messages=[{"role": "user", "content": "tell me %d" % p}])
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status in (503, 429):
                r.read(); k = str(r.status)   # queue full / the tenant's queue limit: retry
            elif r.status != 200:
                msg = r.read()[:80]; k = "errors"
                with lock:
                    key = "HTTP %d %s" % (r.status, msg)
                    err_kinds[key] = err_kinds.get(key, 0) + 1
            elif rnd.random() < 0.2:
                r.read(10); c.sock.close(); k = "cancelled"   # client disconnect mid-stream
            else:
                raw = b""
                while True:
                    chunk = r.read(64)
                    if not chunk:
                        break
                    raw += chunk
                    if rnd.random() < 0.05:
                        time.sleep(0.2)                          # slow reader
                k = "done" if sse_text(raw) == solo[p] else "mismatch"
            c.close()
        except Exception as e:
            k = "errors"
            with lock:
                err_kinds[type(e).__name__ + ": " + str(e)[:60]] = err_kinds.get(type(e).__name__ + ": " + str(e)[:60], 0) + 1
        with lock:
            stats[k] += 1
def phase():
    stop_at = time.time() + seconds / 2
    threads = [threading.Thread(target=worker, args=(i, stop_at)) for i in range(n_streams)]
    for t in threads: t.start()
    for t in threads: t.join()
by0, u0 = counters()
phase()
rss0 = rss_kb()
phase()
rss1 = rss_kb()
by1, u1 = counters()
print(f"streams: {n_streams} concurrent for {seconds:.0f}s: {stats}; RSS after warm-up {rss0} kB, at the end {rss1} kB")
if stats["errors"]:
    bad.append(f"{stats['errors']} stream errors: {err_kinds}")
if stats["mismatch"]:
    bad.append(f"{stats['mismatch']} completed greedy streams differ from their solo answer")
# the books: between the two snapshots the clients got done + cancelled + mismatch 200s
# and the 503s; the tenant ledger counts the same requests. The snapshots themselves: a
# /metrics answer counts itself before it is written, a usage answer after, so the first
# usage read and the second /metrics read fall between them (the tenant ledger sees the
# usage read only: /metrics has no tenant)
d200 = by1.get("200", 0) - by0.get("200", 0)
d503 = by1.get("503", 0) - by0.get("503", 0)
d429 = by1.get("429", 0) - by0.get("429", 0)
chats = stats["done"] + stats["cancelled"] + stats["mismatch"]
ok200 = chats + 2
dreq = u1["requests"] - u0["requests"]
sent = chats + stats["503"] + stats["429"] + stats["errors"] + 1
print(f"books: HTTP 200 +{d200} (clients {ok200}), 503 +{d503} (clients {stats['503']}), 429 +{d429} (clients {stats['429']}), tenant requests +{dreq} (clients {sent}), rejected_busy +{u1['rejected_busy'] - u0['rejected_busy']}, rejected_quota +{u1['rejected_quota'] - u0['rejected_quota']}, cancelled +{u1['cancelled'] - u0['cancelled']} (clients {stats['cancelled']}, some finish before the disconnect is seen)")
if d200 != ok200 or d503 != stats["503"] or d429 != stats["429"] or dreq != sent or \
        u1["rejected_busy"] - u0["rejected_busy"] != stats["503"] or \
        u1["rejected_quota"] - u0["rejected_quota"] != stats["429"]:
    bad.append("metrics / ledger do not add up to the requests sent")
if u1["cancelled"] - u0["cancelled"] > stats["cancelled"]:
    bad.append("more cancels in the ledger than clients cancelled")
if rss0 > 0 and rss1 > rss0 * 1.2:
    bad.append(f"RSS grew {rss0} -> {rss1} kB after warm-up")
h = health()
print(f"health at the end: {h}; alive: {alive()}")
if not h or not alive():
    bad.append("server not healthy at the end")
print("RESULT:", "ok" if not bad else "BAD: " + "; ".join(bad))
sys.exit(1 if bad else 0)
