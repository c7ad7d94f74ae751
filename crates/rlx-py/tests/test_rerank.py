"""rlx.Reranker: scores equal sentence-transformers' CrossEncoder on the
random-init reranker of crates/rlx-models/tests/data/families (written by
scripts/gen_model_refs.py reranker), ranking, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlx

ROOT = Path(__file__).resolve().parents[3]
DIR = ROOT / "crates/rlx-models/tests/data/families/reranker"


@pytest.fixture(scope="module")
def reranker() -> rlx.Reranker:
    return rlx.Reranker(DIR)


def test_scores_equal_cross_encoder(reranker):
    ref = json.loads((DIR / "reference.json").read_text())
    for query in dict.fromkeys(c["query"] for c in ref["cases"]):
        cases = [c for c in ref["cases"] if c["query"] == query]
        docs = [c["document"] for c in cases]
        got = reranker.rerank(query, docs)
        assert got.dtype == np.float32 and got.shape == (len(docs),)
        want = np.array([c["score"] for c in cases], dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-4)
        ranked = reranker.rank(query, docs, top_k=3, return_documents=True)
        assert [r["corpus_id"] for r in ranked] == list(np.argsort(-want, kind="stable")[:3])
        for r in ranked:
            assert r["text"] == docs[r["corpus_id"]]
            assert abs(r["score"] - want[r["corpus_id"]]) <= 1e-4 * abs(want[r["corpus_id"]])
    assert reranker.max_length == 48
    assert reranker.rerank("q", []).shape == (0,)


def test_bad_input(reranker):
    with pytest.raises(TypeError, match="single str"):
        reranker.rerank("q", "a document")
    with pytest.raises(TypeError, match=r"documents\[1\]"):
        reranker.rerank("q", ["a", 3])
    with pytest.raises(ValueError, match="top_k=0"):
        reranker.rank("q", ["a"], top_k=0)
    with pytest.raises(rlx.ModelLoadError, match="BertForSequenceClassification"):
        rlx.Reranker(ROOT / "crates/rlx-models/tests/data/families/bert_cls")
    with pytest.raises(rlx.ModelLoadError, match="not a directory"):
        rlx.Reranker(ROOT / "no-such-dir")
