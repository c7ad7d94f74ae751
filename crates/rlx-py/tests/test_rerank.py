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


def test_predict_pairs_equal_cross_encoder(reranker):
    # CrossEncoder(dir).predict(pairs, batch_size=4): every case's score.
    ref = json.loads((DIR / "reference.json").read_text())
    cases = ref["cases"]
    pairs = [(c["query"], c["document"]) for c in cases]
    assert len({q for q, _ in pairs}) > 1  # pairs of several queries at once
    want = np.array([c["score"] for c in cases], dtype=np.float32)
    got = reranker.predict(pairs)
    assert got.dtype == np.float32 and got.shape == (len(pairs),)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # Lists as pairs, any iterable of pairs, other batch sizes: the same
    # scores to float rounding.
    np.testing.assert_allclose(reranker.predict([list(p) for p in pairs]), got, atol=1e-6)
    np.testing.assert_allclose(reranker.predict(iter(pairs), batch_size=1), got, atol=1e-6)
    np.testing.assert_allclose(reranker.predict(pairs, batch_size=5), got, atol=1e-6)
    # The same as rerank of each query's documents.
    query = pairs[0][0]
    docs = [d for q, d in pairs if q == query]
    np.testing.assert_allclose(
        reranker.predict([(query, d) for d in docs]), reranker.rerank(query, docs), atol=1e-6
    )
    empty = reranker.predict([])
    assert empty.shape == (0,) and empty.dtype == np.float32


@pytest.mark.parametrize(
    "pairs, exc, match",
    [
        ("q", TypeError, "single str"),
        (("q", "d"), TypeError, r"single \(query, document\) pair; wrap it in a list"),
        (3, TypeError, "got int"),
        ([("q", "d"), "qd"], TypeError, r"pairs\[1\]: expected a \(query, document\) tuple or list of two str, got str"),
        ([("q", "d"), {"q": "d"}], TypeError, r"pairs\[1\]: .* got dict"),
        ([("q", "d"), ("q",)], ValueError, r"pairs\[1\]: 1 items"),
        ([("q", "d", "e")], ValueError, r"pairs\[0\]: 3 items"),
        ([("q", 3)], TypeError, r"pairs\[0\]\[1\]: expected str, got int"),
        ([(None, "d")], TypeError, r"pairs\[0\]\[0\]: expected str, got None"),
        ([(b"q", "d")], TypeError, r"pairs\[0\]\[0\]: expected str, got bytes"),
    ],
)
def test_predict_bad_pairs_raise(reranker, pairs, exc, match):
    with pytest.raises(exc, match=match):
        reranker.predict(pairs)
    # The model is still usable after the error.
    assert reranker.predict([("q", "d")]).shape == (1,)


@pytest.mark.parametrize("bs", [0, -1, 1025])
def test_predict_bad_batch_size_raises(reranker, bs):
    with pytest.raises(ValueError, match=f"batch_size={bs}: expected 1 to 1024"):
        reranker.predict([("q", "d")], batch_size=bs)


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
