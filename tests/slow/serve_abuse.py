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

# concurrent streams with random cancels and slow readers: a warm-up phase, then a
# measured phase of the same length; RSS after each
stats = {"done": 0, "cancelled": 0, "errors": 0, "503": 0}
lock = threading.Lock()
def worker(i, stop_at):
    rnd = random.Random(i * 7919 + int(stop_at))
    while time.time() < stop_at:
        body = chat(stream=True, max_tokens=rnd.randint(1, 16), messages=[{"role": "user", "content": "tell me %d" % rnd.randint(0, 99)}])
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 503:
                r.read(); k = "503"
            elif r.status != 200:
                r.read(); k = "errors"
            elif rnd.random() < 0.2:
                r.read(10); c.sock.close(); k = "cancelled"   # client disconnect mid-stream
            else:
                while True:
                    chunk = r.read(64)
                    if not chunk:
                        break
                    if rnd.random() < 0.05:
                        time.sleep(0.2)                          # slow reader
                k = "done"
            c.close()
        except Exception:
            k = "errors"
        with lock:
            stats[k] += 1
def phase():
    stop_at = time.time() + seconds / 2
    threads = [threading.Thread(target=worker, args=(i, stop_at)) for i in range(n_streams)]
    for t in threads: t.start()
    for t in threads: t.join()
phase()
rss0 = rss_kb()
phase()
rss1 = rss_kb()
print(f"streams: {n_streams} concurrent for {seconds:.0f}s: {stats}; RSS after warm-up {rss0} kB, at the end {rss1} kB")
if stats["errors"]:
    bad.append(f"{stats['errors']} stream errors")
if rss0 > 0 and rss1 > rss0 * 1.2:
    bad.append(f"RSS grew {rss0} -> {rss1} kB after warm-up")
h = health()
print(f"health at the end: {h}; alive: {alive()}")
if not h or not alive():
    bad.append("server not healthy at the end")
print("RESULT:", "ok" if not bad else "BAD: " + "; ".join(bad))
sys.exit(1 if bad else 0)
