#!/usr/bin/env python3
"""A local model directory for fastembed's all-MiniLM-L6-v2, with no download.

fastembed fetches its ONNX export of all-MiniLM-L6-v2 from the Hugging Face
hub; ``TextEmbedding(..., specific_model_path=DIR)`` reads it from DIR
instead. This writes DIR (default target/fastembed-minilm):

- ``model.onnx``: the BERT encoder built from rlx's model.safetensors by
  bench/minilm_ort.py's ``build_minilm_onnx`` (checked there against the
  sentence-transformers reference), cut before its pooling, so that it takes
  what fastembed feeds (input_ids, attention_mask, token_type_ids, all
  int64) and returns the last hidden states ``[batch, seq, 384]``, which
  fastembed mean-pools and normalizes itself;
- the tokenizer and config files, copied from the rlx model directory.

Usage: python bench/minilm_fastembed_dir.py [MODEL_DIR] [OUT_DIR]
(needs onnx, numpy, safetensors; bench/setup_python_bench.sh installs them).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from safetensors.numpy import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import minilm_ort  # noqa: E402  (the checked ONNX builder)

FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
         "vocab.txt"]


def encoder_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with an int64 attention_mask input and the last hidden states
    (the output of the last LayerNormalization) as its only output."""
    g = model.graph
    last_ln = max(i for i, n in enumerate(g.node) if n.op_type == "LayerNormalization")
    hidden = g.node[last_ln].output[0]
    nodes = list(g.node[: last_ln + 1])
    for n in nodes:
        for j, name in enumerate(n.input):
            if name == "attention_mask":
                n.input[j] = "attention_mask_f32"
    cast = helper.make_node("Cast", ["attention_mask"], ["attention_mask_f32"],
                            name="mask_cast", to=TensorProto.FLOAT)
    out = helper.make_node("Identity", [hidden], ["last_hidden_state"], name="output")
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        [cast, *nodes, out],
        g.name,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", "seq", minilm_ort.HIDDEN])],
        initializer=[t for t in g.initializer if t.name in used],
    )
    m = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name="rlx-bench")
    m.ir_version = model.ir_version
    onnx.checker.check_model(m)
    return m


def main() -> int:
    mdir = Path(sys.argv[1]) if len(sys.argv) > 1 else minilm_ort.default_model_dir()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE.parent / "target" / "fastembed-minilm"
    out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(mdir / "model.safetensors"))
    weights = {k.removeprefix("bert."): v for k, v in weights.items()}
    onnx.save(encoder_only(minilm_ort.build_minilm_onnx(weights)), str(out / "model.onnx"))
    for f in FILES:
        shutil.copy(mdir / f, out / f)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
