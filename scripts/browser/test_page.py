"""The page at `/` of `rlx serve`, driven in headless Chromium over the
Chrome DevTools Protocol (websocket-client only; Debian's chromium, no
chromedriver, no downloaded browser).

Starts `$RLX_BIN serve --embed-model minilm --llm smollm2 --ctx 128 --port 0`
and checks, in the browser:
- the page loads and finds both models;
- a chat message typed and sent streams into the chat box: the reply's text
  appears and grows over several DOM updates before it ends, and the final
  text equals the greedy (temperature 0) answer of the API to the same
  messages;
- the similarity box shows, for three sentences, cosines equal (to 1e-4)
  to those of the embeddings the API returns;
- the plan picture has as many segment and thunk-range shapes per plan as
  GET /v1/plans lists;
- a screenshot (PNG) is saved to $RLX_SCREENSHOT and is a real picture;
then, against a second server with only --embed-model, that the page says
the chat has no model instead of failing.

Exits non-zero with a message on the first failed check.
"""

import base64
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib

import websocket  # websocket-client, pinned in setup.sh

RLX = os.environ.get("RLX_BIN", "target/debug/rlx")
SHOT = os.environ.get("RLX_SCREENSHOT", "target/browser/page.png")
PROMPT = "What is the capital of France? Answer in one short sentence."
MAX_TOKENS = 32
SENTENCES = [
    "The cat sits on the mat.",
    "A cat is sitting on a rug.",
    "Stock markets fell sharply today.",
]
T0 = time.time()


def log(msg):
    print(f"[browser {time.time() - T0:5.1f}s] {msg}", flush=True)


def fail(msg):
    print(f"[browser] FAIL: {msg}", flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


# ------------------------------------------------------------------ server

def start_server(args):
    p = subprocess.Popen([RLX, "serve", *args, "--port", "0"],
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        p.kill()
        fail(f"rlx serve did not start: {line!r}")
    base = m.group(1)
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health") as r:
                if r.status == 200:
                    return p, base
        except Exception:
            pass
        if p.poll() is not None:
            fail(f"rlx serve {' '.join(args)} exited with {p.returncode}")
        time.sleep(0.2)
    p.kill()
    fail("rlx serve was not healthy after 120 s")


def stop_server(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def http_json(base, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


# ----------------------------------------------------------------- browser

def chromium_binary():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    fail("no chromium on PATH (scripts/browser/setup.sh installs it)")


class Browser:
    """Headless Chromium and one page, over the DevTools Protocol."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rlx-chromium-")
        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.dir}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        port_file = os.path.join(self.dir, "DevToolsActivePort")
        for _ in range(300):
            if os.path.exists(port_file):
                lines = open(port_file).read().split("\n")
                if len(lines) >= 2 and lines[1]:
                    break
            if self.proc.poll() is not None:
                fail(f"chromium exited with {self.proc.returncode} before listening")
            time.sleep(0.1)
        else:
            fail("chromium wrote no DevToolsActivePort after 30 s")
        port, path = lines[0].strip(), lines[1].strip()
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=120,
                                              suppress_origin=True)
        self.next_id = 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page("Emulation.setDeviceMetricsOverride",
                  {"width": 1100, "height": 1300, "deviceScaleFactor": 1, "mobile": False})

    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            r = json.loads(self.ws.recv())
            if r.get("id") == self.next_id:
                if "error" in r:
                    fail(f"{method}: {r['error']}")
                return r.get("result", {})

    def page(self, method, params=None):
        return self.send(method, params, self.session)

    def eval(self, expr):
        r = self.page("Runtime.evaluate",
                      {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            fail(f"page script {expr[:80]!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, what, timeout=60.0):
        t = time.time()
        while time.time() - t < timeout:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.05)
        fail(f"timed out after {timeout:.0f} s waiting for {what}")

    def goto(self, url):
        self.page("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", f"{url} to load", 30)

    def click(self, selector):
        """A real mouse click at the middle of the element."""
        box = self.eval(f"""(() => {{
            const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: "center"}});
            const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent",
                      {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def type_into(self, selector, text):
        """Focus the field, clear it and type `text` (as keyboard input)."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                  " e.focus(); e.value = ''; return true; })()")
        self.page("Input.insertText", {"text": text})

    def screenshot(self, path):
        data = self.page("Page.captureScreenshot",
                         {"format": "png", "captureBeyondViewport": True})["data"]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------- checks

def check_png(path):
    """A real picture: PNG signature and chunks, at least 600 x 400, and
    pixels that are not all one colour."""
    b = open(path, "rb").read()
    check(b[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG")
    w, h = struct.unpack(">II", b[16:24])
    check(b[12:16] == b"IHDR" and w >= 600 and h >= 400, f"{path}: {w}x{h}")
    idat, i = b"", 8
    while i < len(b):
        n = struct.unpack(">I", b[i:i + 4])[0]
        kind = b[i + 4:i + 8]
        if kind == b"IDAT":
            idat += b[i + 8:i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    distinct = len(set(raw))
    check(distinct >= 32, f"{path}: only {distinct} distinct byte values: a blank picture")
    return w, h, len(b), distinct


def check_chat(br, base, model):
    # Record every change of the reply's text, with when it happened.
    br.eval("""(() => {
        window.__lens = [];
        const log = document.getElementById("chat-log");
        new MutationObserver(() => {
            const m = log.querySelector(".msg.assistant:last-child");
            if (m) window.__lens.push([performance.now(), m.textContent.length,
                                       m.getAttribute("data-state")]);
        }).observe(log, {childList: true, subtree: true, characterData: true, attributes: true});
        document.getElementById("chat-max-tokens").value = "%d";
        document.getElementById("chat-temperature").value = "0";
        return true;
    })()""" % MAX_TOKENS)
    br.type_into("#chat-input", PROMPT)
    br.click("#chat-send")
    state = br.wait_for(
        "(() => { const m = document.querySelector('#chat-log .msg.assistant');"
        " const s = m && m.getAttribute('data-state');"
        " return s === 'done' || s === 'error' ? s : null; })()",
        "the chat reply to finish", 90)
    text = br.eval("document.querySelector('#chat-log .msg.assistant').textContent")
    check(state == "done", f"the chat ended in state {state}: {text!r}")
    lens = br.eval("window.__lens")
    grew = [n for _, n, s in lens if s == "streaming"]
    distinct = sorted(set(n for n in grew if n > 0))
    check(len(distinct) >= 3,
          f"the reply did not grow while streaming: lengths {grew} (final {len(text)})")
    check(grew == sorted(grew), f"the reply's length went down while streaming: {grew}")
    check(distinct[0] < len(text), "the first text shown was already the whole reply")
    first_t = next(t for t, n, _ in lens if n > 0)
    last_t = lens[-1][0]
    want = http_json(base, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS, "temperature": 0})["choices"][0]["message"]["content"]
    check(text == want, f"the page's reply {text!r} != the API's greedy answer {want!r}")
    check(len(text) > 0, "an empty reply")
    log(f"chat: streamed {len(text)} chars in {len(distinct)} visible steps over "
        f"{(last_t - first_t) / 1000:.2f} s; equals the API's greedy answer: {text!r}")


def check_similarity(br, base, model):
    br.type_into("#sim-input", "\n".join(SENTENCES))
    br.click("#sim-run")
    br.wait_for("document.getElementById('sim-table') !== null", "the similarity table", 60)
    shown = br.eval("""Array.from(document.querySelectorAll('#sim-table td')).map(
        td => [Number(td.dataset.i), Number(td.dataset.j), td.textContent])""")
    n = len(SENTENCES)
    check(len(shown) == n * n, f"{len(shown)} cells, expected {n * n}")
    data = http_json(base, "/v1/embeddings", {"model": model, "input": SENTENCES})["data"]
    vecs = [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]

    def cos(a, b):
        dot = sum(x * y for x, y in zip(a, b))
        return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    worst = 0.0
    for i, j, txt in shown:
        want = cos(vecs[i], vecs[j])
        got = float(txt)
        worst = max(worst, abs(got - want))
        check(abs(got - want) <= 1e-4, f"cell ({i},{j}) shows {txt}, the API's cosine is {want}")
    c01, c02 = cos(vecs[0], vecs[1]), cos(vecs[0], vecs[2])
    check(c01 > c02, f"cat/cat {c01} should exceed cat/markets {c02}")
    log(f"similarity: {n}x{n} cells equal the API's cosines (worst |diff| {worst:.1e}); "
        f"cat/cat {c01:.4f}, cat/markets {c02:.4f}")


def check_plans(br, base):
    plans = http_json(base, "/v1/plans")
    want = [(m["model"], p["name"], len(p["segments"]), len(p["ranges"]))
            for m in plans["data"] for p in m["plans"]]
    for m in plans["data"]:
        for p in m["plans"]:
            check(p["compiled_segments"] == len(p["segments"])
                  and p["thunk_ranges"] == len(p["ranges"]), f"{p['name']}: counts disagree")
    got = br.eval("""Array.from(document.querySelectorAll('#plans .plan')).map(f => [
        f.dataset.model, f.dataset.plan,
        f.querySelectorAll('svg rect.seg').length, f.querySelectorAll('svg rect.thunks').length])""")
    got = [tuple(g) for g in got]
    check(got == want, f"the picture's shapes {got} != the plans {want}")
    check(len(want) >= 2 and all(s > 0 and r > 0 for _, _, s, r in want),
          f"expected plans with segments and thunk ranges: {want}")
    log("plans: " + "; ".join(f"{m} {n}: {s} segments, {r} thunk ranges" for m, n, s, r in want))


def main():
    check(os.path.exists(RLX), f"no rlx binary at {RLX} (cargo build -p rlx-cli, or set RLX_BIN)")
    server, base = start_server(["--embed-model", "minilm", "--llm", "smollm2", "--ctx", "128"])
    br = None
    only = None
    try:
        log(f"rlx serve on {base}")
        models = {m["kind"]: m["model"] for m in http_json(base, "/v1/plans")["data"]}
        br = Browser()
        br.goto(base + "/")
        br.wait_for("document.body.dataset.ready === 'true'", "the page to find the models", 30)
        status = br.eval("document.getElementById('status').textContent")
        check("generation" in status and "embeddings" in status, f"status: {status!r}")
        log(f"page loaded: {status}")
        check_plans(br, base)
        check_chat(br, base, models["generation"])
        check_similarity(br, base, models["embeddings"])
        br.screenshot(SHOT)
        w, h, size, distinct = check_png(SHOT)
        log(f"screenshot: {SHOT} ({w}x{h}, {size} bytes, {distinct} distinct pixel bytes)")
        # Only an embedding model: the chat box says so, the rest works.
        only, base2 = start_server(["--embed-model", "minilm"])
        br.goto(base2 + "/")
        br.wait_for("document.body.dataset.ready === 'true'", "the embed-only page", 30)
        note = br.eval("""(() => { const e = document.getElementById('chat-unavailable');
            return e.hidden ? null : e.textContent; })()""")
        check(note and "No language model" in note, f"the chat box did not say so: {note!r}")
        check(br.eval("document.getElementById('chat-ui').hidden") is True,
              "the chat box is shown without a model")
        check(br.eval("document.getElementById('sim-ui').hidden") is False,
              "the similarity box is hidden with a model")
        log(f"embed-only server: the chat box says {note!r}")
    finally:
        if br:
            br.close()
        stop_server(server)
        if only:
            stop_server(only)
    log("all browser checks passed")


if __name__ == "__main__":
    main()
