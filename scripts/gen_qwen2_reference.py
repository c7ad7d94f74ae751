#!/usr/bin/env python3
"""Reference data for the qwen2 test: llama.cpp on Qwen2.5-Coder-0.5B-Instruct Q4_K_M.

Writes crates/rlx-models/tests/data/qwen2_llamacpp.json with, per prompt, the
token ids llama.cpp's tokenizer gives (no BOS, no special-token parsing), the
top-10 next-token logits `[id, logit]` after the prompt, and 8 greedy ids.

llama.cpp rounds activations to 8 bits (q8_K for the K-quant matmuls), so its
logits differ from an fp32-activation engine by up to a few tenths; the test
compares ids exactly and logits loosely.

Run with the llama.cpp venv of the benchmarks, after fetching the model:
    python3 scripts/fetch_models.py qwen2
    bash bench/setup_llamacpp_venv.sh
    bench/.venv-llamacpp/bin/python scripts/gen_qwen2_reference.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from llama_cpp import Llama, __version__

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates/rlx-models/tests/data/qwen2_llamacpp.json"
PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "Numbers 12345 and 3.14, ünïcödé — emoji 🤖!\n\n    indented\tline's end",
]


def main() -> None:
    root = os.environ.get("RLX_MODELS_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rlx" / "models"
    model = base / "qwen2.5-coder-0.5b" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    llm = Llama(model_path=str(model), n_ctx=256, n_batch=256, n_threads=2, seed=0, verbose=False)

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()

    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        logits = last_logits()
        top = np.argsort(-logits)[:10]
        greedy = []
        for _ in range(8):
            tok = int(np.argmax(last_logits()))
            greedy.append(tok)
            llm.eval([tok])
        cases.append({
            "prompt": text,
            "prompt_ids": ids,
            "top10_next": [[int(i), float(logits[i])] for i in top],
            "greedy_ids": greedy,
        })
    OUT.write_text(json.dumps({
        "model": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (scripts/fetch_models.py qwen2)",
        "produced_with": f"llama-cpp-python {__version__} (llama.cpp, CPU, 2 threads, int8 activations), "
                         "scripts/gen_qwen2_reference.py",
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
