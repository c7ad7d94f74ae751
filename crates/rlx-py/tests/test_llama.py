"""rlx.LlamaModel: greedy generation equals `rlx generate`, streaming, chat,
tokenizer round trips, bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import rlx

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "Once upon a time, there was a little robot who"


def rlx_bin() -> str:
    """The `rlx` binary (`cargo test --workspace` leaves target/debug/rlx)."""
    path = os.environ.get("RLX_BIN", str(ROOT / "target/debug/rlx"))
    if not os.path.exists(path):
        pytest.fail(f"{path} not found: build it with `cargo build -p rlx-cli` or set RLX_BIN")
    return path


def cli_generate(*args: str) -> dict:
    out = subprocess.run(
        [rlx_bin(), "generate", *args, "--ctx", "512", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(out.stdout)


def test_greedy_generate_equals_the_cli(llm):
    want = cli_generate(PROMPT, "--max-tokens", "24")
    assert llm.tokenize(PROMPT) == want["prompt_ids"]
    got = llm.generate(PROMPT, max_tokens=24, temperature=0.0)
    assert got == want["text"]
    assert len(got) > 20
    # The generated ids re-tokenize to the same text.
    assert llm.detokenize([i for i in want["ids"] if i != llm.eos_id]).startswith(got)


def test_chat_equals_the_cli_chat(llm):
    question = "What is the capital of France?"
    want = cli_generate(question, "--max-tokens", "16", "--chat")
    got = llm.chat([{"role": "user", "content": question}], max_tokens=16)
    assert got == want["text"]
    assert "Paris" in got
    text = llm.apply_chat_template([{"role": "user", "content": question}])
    assert question in text and text.endswith("assistant\n")
    assert llm.tokenize(text, add_bos=False) == want["prompt_ids"]


def test_stream_pieces_concatenate_to_generate(llm):
    whole = llm.generate(PROMPT, max_tokens=20)
    s = llm.stream(PROMPT, max_tokens=20)
    assert s.finish_reason is None
    pieces = list(s)
    assert len(pieces) > 3
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == whole
    assert s.finish_reason == "length" and s.generated_tokens == 20
    chat = llm.chat([{"role": "user", "content": "Say hi"}], max_tokens=8, stream=True)
    assert isinstance(chat, rlx.TextStream)
    assert "".join(chat) == llm.chat([{"role": "user", "content": "Say hi"}], max_tokens=8)


def test_stop_strings_cut_the_text(llm):
    whole = llm.generate(PROMPT, max_tokens=24)
    cut_at = whole[len(whole) // 2 :].split()[0]
    got = llm.generate(PROMPT, max_tokens=24, stop=[cut_at, "zzzz-not-there"])
    assert got == whole[: whole.index(cut_at)]
    assert llm.generate(PROMPT, max_tokens=24, stop="zzzz-not-there") == whole


def test_sampling_is_seeded(llm):
    a = llm.generate(PROMPT, max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    b = llm.generate(PROMPT, max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    assert a == b
    others = {
        llm.generate(PROMPT, max_tokens=12, temperature=1.5, seed=s) for s in range(1, 5)
    }
    assert len(others) > 1


def test_a_new_generation_interrupts_an_open_stream(llm):
    s = llm.stream(PROMPT, max_tokens=10)
    next(s)
    llm.generate("Hello", max_tokens=2)
    with pytest.raises(rlx.RlxError, match="interrupted"):
        next(s)


def test_tokenize_round_trip(llm):
    text = "Grüße, 世界! 123"
    ids = llm.tokenize(text, add_bos=False)
    assert all(0 <= i < llm.vocab_size for i in ids)
    assert llm.detokenize(ids) == text
    assert llm.vocab_size == 49152 and llm.arch == "llama" and llm.ctx == 512


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"max_tokens": 0}, ValueError, "max_tokens=0"),
        ({"max_tokens": 10**6}, ValueError, "max_tokens=1000000: expected 1..="),
        ({"max_tokens": 10**30}, (ValueError, OverflowError), "max_tokens|too big|overflow"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"top_p": 2.0}, ValueError, "top_p"),
        ({"top_k": -3}, ValueError, "top_k=-3"),
        ({"seed": -1}, ValueError, "seed=-1"),
        ({"stop": 5}, TypeError, "stop: expected"),
    ],
)
def test_bad_generation_arguments_raise(llm, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        llm.generate("Hi", **kwargs)


def test_bad_inputs_raise(llm, tmp_path):
    with pytest.raises(ValueError, match=r"ids\[1\] = -1"):
        llm.detokenize([1, -1])
    with pytest.raises(ValueError, match="49152"):
        llm.detokenize([49152])
    with pytest.raises(TypeError, match="ids: expected a list of int"):
        llm.detokenize("abc")
    with pytest.raises(ValueError, match="no tokens"):
        llm.generate("", max_tokens=3)  # SmolLM2 adds no BOS
    with pytest.raises(TypeError, match="messages"):
        llm.chat("hello")
    with pytest.raises(ValueError, match=r'messages\[0\]: missing key "content"'):
        llm.chat([{"role": "user"}])
    with pytest.raises(TypeError, match=r'messages\[0\]\["content"\]: expected str'):
        llm.chat([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="empty"):
        llm.chat([])
    with pytest.raises(rlx.ModelLoadError):
        rlx.LlamaModel(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(rlx.ModelLoadError, match="bad.gguf"):
        rlx.LlamaModel(bad)
    with pytest.raises(rlx.ModelLoadError, match="is a directory"):
        rlx.LlamaModel(tmp_path)
    with pytest.raises(ValueError, match="ctx=0"):
        rlx.LlamaModel("smollm2", ctx=0)
    with pytest.raises(ValueError, match="ctx=100000000"):
        rlx.LlamaModel("smollm2", ctx=10**8)
    with pytest.raises(rlx.RlxError, match="CUDA|CPU"):
        rlx.LlamaModel("smollm2", device="cuda")
    # The model still works after all of that.
    assert llm.generate(PROMPT, max_tokens=3)
