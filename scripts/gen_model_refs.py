#!/usr/bin/env python3
"""Regenerates the model reference data under crates/*/tests/data.

Run in the pinned venv (scripts/model_refs/setup.sh):

    scripts/model_refs/.venv/bin/python scripts/gen_model_refs.py FAMILY...|all

Each family name maps to a function of a module in scripts/model_refs/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "model_refs"))

import embed  # noqa: E402
import gdn  # noqa: E402
import llm  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent)

FAMILIES = {
    **{n: (lambda f: lambda: f(ROOT))(getattr(embed, n))
       for n in ("bert_cls", "bert_mean", "bert_max", "gte", "bert_last", "xlmr", "reranker", "mpnet",
                 "modernbert", "modernbert_bias")},
    "mpnet-real": lambda: embed.mpnet_real(ROOT),
    **llm.FAMILIES,
    **llm.REAL,
    **gdn.FAMILIES,
}
# Families that need a fetched model (scripts/fetch_models.py); `all` runs
# only the random-init ones, which need nothing but the venv.
NEEDS_FETCH = set(llm.REAL) | {"mpnet-real"}


def main(argv: list[str]) -> int:
    names = argv or ["all"]
    if names == ["all"]:
        names = [n for n in FAMILIES if n not in NEEDS_FETCH]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}; known: {sorted(FAMILIES)} or all", file=sys.stderr)
        return 2
    for n in names:
        FAMILIES[n]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
