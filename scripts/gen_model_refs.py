#!/usr/bin/env python3
"""Regenerate the random-init model reference data under crates/*/tests/data.

Run in the pinned venv (bash scripts/model_refs/setup.sh creates it):

    scripts/model_refs/.venv/bin/python scripts/gen_model_refs.py all
    scripts/model_refs/.venv/bin/python scripts/gen_model_refs.py bert_cls reranker

Each family builds a small random-initialized model from a config with
transformers itself, saves it (safetensors, tokenizer, sentence-transformers
files) and writes the reference outputs of transformers / sentence-transformers
next to it, with the versions used. The per-family code lives in
scripts/model_refs/<group>.py; FAMILIES below maps a family name to its
generator (a function taking the repository root).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from model_refs import embed  # noqa: E402

# family name -> generator(root). Other groups add their entries here.
FAMILIES = {
    "bert_cls": embed.bert_cls,
    "bert_mean": embed.bert_mean,
    "bert_max": embed.bert_max,
    "gte": embed.gte,
    "bert_last": embed.bert_last,
    "xlmr": embed.xlmr,
    "reranker": embed.reranker,
}


def main(argv):
    names = argv[1:] or ["all"]
    if names == ["all"]:
        names = list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        sys.exit(f"unknown families {unknown}: expected 'all' or some of {sorted(FAMILIES)}")
    for n in names:
        print(f"[gen_model_refs] {n}", flush=True)
        FAMILIES[n](ROOT)


if __name__ == "__main__":
    main(sys.argv)
