"""The official `openai` Python client against `rlx serve` on loopback.

Starts `$RLX_BIN serve --embed-model minilm --llm smollm2 --port 0 --ctx 512`,
then checks, with `openai.OpenAI`: embeddings as floats and as base64 (the
same float32 values, equal to `rlx embed`'s output), `dimensions`;
completions and chat, streamed and not, greedy text equal to
`rlx generate`'s (same context of 512); stop strings; error cases raising
the client's typed errors; then SIGTERM with a request in flight, which
completes. Prints `N passed, M failed` and exits non-zero on a failure.
"""

import base64
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import openai

RLX = os.environ.get("RLX_BIN", "target/debug/rlx")
EMBED_ID = "all-minilm-l6-v2"
LLM_ID = "SmolLM2-135M-Instruct.Q4_1"


def start():
    p = subprocess.Popen(
        [RLX, "serve", "--embed-model", "minilm", "--llm", "smollm2", "--port", "0",
         "--ctx", "512"],
        stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"rlx serve did not start: {line!r}")
    base = m.group(1)
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health") as r:
                if r.status == 200:
                    return p, base
        except Exception:
            pass
        time.sleep(0.2)
    p.kill()
    sys.exit("rlx serve was not healthy after 120 s")


def rlx_embed(text):
    out = subprocess.run([RLX, "embed", text], check=True, capture_output=True, text=True)
    return [float(x) for x in json.loads(out.stdout.splitlines()[0])]


def rlx_generate(prompt, n):
    out = subprocess.run([RLX, "generate", prompt, "--max-tokens", str(n), "--ctx", "512"],
                         check=True, capture_output=True, text=True)
    return out.stdout[:-1]  # generate ends with a newline


def f32(xs):
    return [struct.unpack("<f", struct.pack("<f", x))[0] for x in xs]


TESTS = []


def test(f):
    TESTS.append(f)
    return f


@test
def embeddings_float_base64_and_dimensions(c):
    text = "The quick brown fox jumps over the lazy dog."
    want = f32(rlx_embed(text))
    r = c.embeddings.create(model=EMBED_ID, input=[text, "another one"])
    assert [d.index for d in r.data] == [0, 1]
    assert f32(r.data[0].embedding) == want, "float embedding differs from rlx embed"
    assert r.usage.prompt_tokens > 0
    raw = c.embeddings.with_raw_response.create(
        model=EMBED_ID, input=text, encoding_format="base64").http_response.json()
    b = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(b) // 4}f", b)) == want, "base64 differs"
    r = c.embeddings.create(model=EMBED_ID, input=text, dimensions=32)
    v = r.data[0].embedding
    assert len(v) == 32 and abs(sum(x * x for x in v) - 1) < 1e-5


@test
def completions_greedy_equal_rlx_generate_streamed_and_not(c):
    prompt = "The history of computing is"
    want = rlx_generate(prompt, 12)
    r = c.completions.create(model=LLM_ID, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == want, (r.choices[0].text, want)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    s = c.completions.create(model=LLM_ID, prompt=prompt, max_tokens=12, temperature=0,
                             stream=True)
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == want


@test
def stop_strings(c):
    prompt = "The history of computing is"
    full = rlx_generate(prompt, 12)
    stop = full.split()[2]
    r = c.completions.create(model=LLM_ID, prompt=prompt, max_tokens=12, temperature=0,
                             stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)], (r.choices[0].text, stop)
    assert r.choices[0].finish_reason == "stop"


@test
def chat_streamed_and_not(c):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=LLM_ID, messages=msgs, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.choices[0].finish_reason == "stop"
    s = c.chat.completions.create(model=LLM_ID, messages=msgs, max_tokens=24, temperature=0,
                                  stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == text
    assert [m.id for m in c.models.list()] == [EMBED_ID, LLM_ID]


@test
def errors_are_typed(c):
    for call, err in [
        (lambda: c.embeddings.create(model="nope", input="x"), openai.NotFoundError),
        (lambda: c.embeddings.create(model=EMBED_ID, input=""), openai.BadRequestError),
        (lambda: c.completions.create(model=LLM_ID, prompt="x", max_tokens=-1),
         openai.BadRequestError),
        (lambda: c.chat.completions.create(model=LLM_ID, messages=[]), openai.BadRequestError),
    ]:
        try:
            call()
        except err as e:
            assert e.body and "message" in e.body, e.body
        else:
            raise AssertionError(f"no {err.__name__}")


def main():
    p, base = start()
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    passed = failed = 0
    try:
        for t in TESTS:
            try:
                t(c)
                passed += 1
                print(f"ok {t.__name__}")
            except Exception as e:  # report every test, then fail
                failed += 1
                print(f"FAILED {t.__name__}: {e!r}")
        # SIGTERM with a request in flight: it completes, then the server exits.
        out = {}

        def long():
            out["r"] = c.completions.create(model=LLM_ID, prompt="1, 2, 3, 4,", max_tokens=24,
                                            temperature=0)
        th = threading.Thread(target=long)
        th.start()
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        th.join(120)
        code = p.wait(60)
        if out.get("r") and out["r"].usage.completion_tokens == 24 and code == 0:
            passed += 1
            print("ok sigterm_drains_the_request_in_flight")
        else:
            failed += 1
            print(f"FAILED sigterm_drains_the_request_in_flight: {out}, exit {code}")
    finally:
        if p.poll() is None:
            p.kill()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
