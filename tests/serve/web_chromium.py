"""web_chromium.py — the web chat page of kiln serve in headless Chromium, driven over
the Chrome DevTools protocol: type a message into the page, press Enter, watch the
answer grow token by token (streamed), take a phone-sized screenshot, then start a
second answer and press Stop.

Usage: python3 web_chromium.py URL SCREENSHOT.png [MAX_TOKENS]
"""
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings

from websockets.sync.client import connect

warnings.filterwarnings("ignore", category=DeprecationWarning)

url, shot = sys.argv[1], sys.argv[2]
max_tokens = sys.argv[3] if len(sys.argv) > 3 else "64"
prof = tempfile.mkdtemp(prefix="kiln-chromium-")
chrome = subprocess.Popen(
    ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
     "--remote-debugging-port=0", f"--user-data-dir={prof}", "--window-size=390,844",
     "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    port_file = os.path.join(prof, "DevToolsActivePort")
    for _ in range(300):
        if os.path.exists(port_file) and open(port_file).read().count("\n") >= 1:
            break
        time.sleep(0.1)
    port = int(open(port_file).read().split("\n")[0])
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    ws = connect(ws_url, max_size=64 << 20)
    seq = [0]

    def cdp(method, **params):
        seq[0] += 1
        ws.send(json.dumps({"id": seq[0], "method": method, "params": params}))
        while True:
            m = json.loads(ws.recv(timeout=60))
            if m.get("id") == seq[0]:
                if "error" in m:
                    raise SystemExit(f"FAIL: {method}: {m['error']}")
                return m.get("result", {})

    def js(expr):
        r = cdp("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def wait_for(expr, what, secs=60):
        secs *= int(os.environ.get("KILN_TIME_SCALE", "1"))  # slow (sanitizer) builds
        t0 = time.time()
        while time.time() - t0 < secs:
            v = js(expr)
            if v:
                return v
            time.sleep(0.05)
        raise SystemExit(f"FAIL: timed out waiting for {what}")

    cdp("Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2,
        mobile=True)
    cdp("Page.navigate", url=url)
    wait_for("document.readyState === 'complete' && document.getElementById('model')"
             ".textContent.length > 0", "the page and its model name")

    def send(text):
        js("document.getElementById('input').focus()")
        cdp("Input.insertText", text=text)
        for t in ("keyDown", "keyUp"):
            cdp("Input.dispatchKeyEvent", type=t, key="Enter", code="Enter",
                windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)

    # short answers keep the test quick (the settings panel of the page)
    js(f"document.getElementById('max_tokens').value = '{max_tokens}'")
    send("Write a short poem about the sea.")
    last = "document.getElementById('last-answer')"
    body = last + " && " + last + ".querySelector('.body').textContent"
    lengths = set()
    t0 = time.time()
    while time.time() - t0 < 120:
        txt = js(body) or ""
        if txt:
            lengths.add(len(txt))
        if js(last + " && " + last + ".querySelector('.stats')"):
            break
        time.sleep(0.01)
    final = js(body) or ""
    stats = js(last + ".querySelector('.stats').textContent")
    if not final or "[" in final[:1]:
        raise SystemExit(f"FAIL: no answer ({final!r}, {stats!r})")
    if len(lengths) < 3:
        raise SystemExit(f"FAIL: the answer did not stream (saw lengths {sorted(lengths)})")
    user = js("document.querySelector('.msg.user .body').textContent")
    if user != "Write a short poem about the sea.":
        raise SystemExit(f"FAIL: the user's message shows as {user!r}")
    png = base64.b64decode(cdp("Page.captureScreenshot", format="png")["data"])
    os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
    with open(shot, "wb") as f:
        f.write(png)
    # second turn, stopped mid-answer with the Stop button
    js("document.getElementById('last-answer').removeAttribute('id')")
    send("Now write a long story about a lighthouse keeper, at least five paragraphs.")
    wait_for(body, "the second answer to start")
    js("document.getElementById('stop').click()")
    stopped = wait_for(last + " && " + last + ".querySelector('.stats') && " + last +
                       ".querySelector('.stats').textContent", "the stop")
    n_msgs = js("document.querySelectorAll('.msg').length")
    print(f"ok: streamed in {len(lengths)} steps, {len(final)} chars ({stats}); "
          f"second answer: {stopped}; {n_msgs} messages; screenshot {shot} ({len(png)} bytes)")
    if n_msgs != 4:
        raise SystemExit(f"FAIL: {n_msgs} messages on the page, want 4")
finally:
    chrome.terminate()
    try:
        chrome.wait(10)
    except subprocess.TimeoutExpired:
        chrome.kill()
