"""Regenerates the model reference data under crates/*/tests/data.

Run in the pinned venv (scripts/model_refs/setup.sh):
    scripts/model_refs/.venv/bin/python scripts/gen_model_refs.py FAMILY|all
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_refs"))

import gdn  # noqa: E402

FAMILIES = {
    **gdn.FAMILIES,
}


def main(argv):
    names = argv[1:] or ["all"]
    if names == ["all"]:
        names = list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        sys.exit(f"unknown families {unknown}; known: {sorted(FAMILIES)} or all")
    for n in names:
        FAMILIES[n]()


if __name__ == "__main__":
    main(sys.argv)
