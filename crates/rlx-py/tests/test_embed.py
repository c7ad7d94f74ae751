"""rlx.SentenceEmbedder: parity with sentence-transformers, input kinds,
threads, bad input, memory."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rlx

FAMILIES = Path(__file__).resolve().parents[3] / "crates/rlx-models/tests/data/families"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_parity_with_sentence_transformers(embedder, reference):
    texts = reference["sentences"]
    want = np.asarray(reference["embeddings"], dtype=np.float32)
    got = embedder.encode(texts)
    assert got.dtype == np.float32
    assert got.shape == (len(texts), 384) == want.shape
    cos = cosines(got, want)
    assert cos.min() >= 0.99999, (cos.min(), texts[int(cos.argmin())])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # Batching does not change a row beyond float rounding.
    one_by_one = np.concatenate([embedder.encode([t]) for t in texts])
    np.testing.assert_allclose(one_by_one, got, atol=2e-5)
    small_batches = embedder.encode(texts, batch_size=3)
    assert cosines(small_batches, want).min() >= 0.99999


def test_properties(embedder):
    assert embedder.dim == 384
    assert embedder.max_seq_length == 256
    assert embedder.device == "cpu" and embedder.precision == "f32"
    assert os.path.isdir(embedder.path)
    assert "SentenceEmbedder" in repr(embedder)


def test_unnormalized_keeps_the_models_normalize_module(embedder, reference):
    # all-MiniLM-L6-v2's modules.json ends in Normalize: as with
    # sentence-transformers' encode(normalize_embeddings=False), its rows
    # stay unit length.
    texts = reference["sentences"][:4]
    raw = embedder.encode(texts, normalize=False)
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-5)
    want = np.asarray(reference["embeddings"][:4], dtype=np.float32)
    assert cosines(raw, want).min() >= 0.99999
    np.testing.assert_allclose(raw, want, atol=1e-4)
    # normalize=True returns the already unit rows as they are.
    assert np.array_equal(embedder.encode(texts), raw)


@pytest.mark.parametrize("family", ["gte", "bert_max", "bert_cls"])
def test_normalize_false_is_the_models_own_pipeline(family):
    # Reference: SentenceTransformer(dir).encode(texts) (normalize_embeddings
    # False; the default prompt applied), written by
    # scripts/gen_model_refs.py. gte: mean pooling, no Normalize module;
    # bert_max: max + cls + mean_sqrt_len_tokens without the prompt's
    # tokens, a default prompt, no Normalize; bert_cls: CLS then Normalize.
    ref = json.loads((FAMILIES / family / "reference.json").read_text())
    cases = [c for c in ref["cases"] if c["prompt_name"] is None]
    texts = [c["text"] for c in cases]
    want = np.asarray([c["embedding"] for c in cases], dtype=np.float32)
    m = rlx.SentenceEmbedder(FAMILIES / family)
    raw = m.encode(texts, normalize=False)
    assert raw.dtype == np.float32 and raw.shape == want.shape
    scale = np.maximum(np.abs(want).max(axis=1, keepdims=True), 1.0)
    assert (np.abs(raw - want) / scale).max() <= 1e-4
    assert cosines(raw, want).min() >= 0.99999
    unit = m.encode(texts)
    norms = np.linalg.norm(raw, axis=1)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(unit, raw / norms[:, None], atol=1e-6)
    if ref["normalize"]:
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
        assert np.array_equal(unit, raw)
    else:
        assert np.all(np.abs(norms - 1.0) > 1e-2), norms
        # sentence-transformers' normalize_embeddings=True: its vectors
        # L2-normalized.
        want_unit = want / np.linalg.norm(want, axis=1, keepdims=True)
        np.testing.assert_allclose(unit, want_unit, atol=1e-5)


def test_input_kinds_give_the_same_rows(embedder):
    texts = ["first sentence", "second one, a little longer", "3"]
    want = embedder.encode(texts)
    assert np.array_equal(embedder.encode(tuple(texts)), want)
    assert np.array_equal(embedder.encode(iter(texts)), want)
    assert np.array_equal(embedder.encode(np.array(texts)), want)
    assert np.array_equal(embedder.encode(np.array(texts, dtype=object)), want)
    empty = embedder.encode([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32


def test_pyarrow_arrays(embedder):
    pa = pytest.importorskip("pyarrow")
    texts = ["alpha", "beta gamma", "delta"]
    want = embedder.encode(texts)
    assert np.array_equal(embedder.encode(pa.array(texts)), want)
    assert np.array_equal(embedder.encode(pa.array(texts, type=pa.large_string())), want)
    assert np.array_equal(embedder.encode(pa.chunked_array([texts[:1], texts[1:]])), want)
    with pytest.raises(TypeError, match="texts\\[1\\]: expected str, got None"):
        embedder.encode(pa.array(["a", None]))
    with pytest.raises(TypeError, match="pyarrow array of type int64"):
        embedder.encode(pa.array([1, 2]))


def test_long_text_is_truncated_not_refused(embedder):
    long = "word " * 20000
    v = embedder.encode([long])
    assert v.shape == (1, 384) and np.all(np.isfinite(v))
    # 256 tokens are read: a text that only differs after them embeds the same.
    np.testing.assert_allclose(embedder.encode([long + "tail words"]), v, atol=1e-6)


def test_threads_give_identical_results_and_release_the_gil(embedder):
    texts = [f"sentence number {i} about {'rust ' * (i % 7)}" for i in range(40)]
    want = embedder.encode(texts, batch_size=8)
    results: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            results[k] = [embedder.encode(texts, batch_size=8) for _ in range(3)]
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    # While the workers hold the model, this thread keeps running Python:
    # encode releases the GIL.
    ticks = 0
    while any(t.is_alive() for t in threads):
        ticks += 1
        time.sleep(0.001)
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4
    for runs in results.values():
        for r in runs:
            assert np.array_equal(r, want)
    assert ticks > 10


def test_gil_is_released_during_encode(embedder):
    texts = ["a sentence long enough to take a while " * 6] * 64
    counter = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counter
        while not stop.is_set():
            counter += 1

    t = threading.Thread(target=count)
    t.start()
    before = counter
    embedder.encode(texts)
    during = counter - before
    stop.set()
    t.join()
    # Holding the GIL for the whole call would leave the counter at ~0
    # (only the interpreter's 5 ms switch interval would let it run).
    assert during > 1000, during


@pytest.mark.parametrize(
    "texts, exc, match",
    [
        ("a single str", TypeError, "single str"),
        ([1, 2], TypeError, r"texts\[0\]: expected str, got int"),
        (["ok", None], TypeError, r"texts\[1\]: expected str, got None"),
        ([b"bytes"], TypeError, r"texts\[0\]: expected str, got bytes"),
        (42, TypeError, "expected a list of str"),
        (np.zeros(3), TypeError, "dtype float64"),
        (np.array([["a", "b"]]), ValueError, "2 dimensions"),
        (["\ud800"], ValueError, r"texts\[0\]: not valid Unicode"),
    ],
)
def test_bad_texts_raise(embedder, texts, exc, match):
    with pytest.raises(exc, match=match):
        embedder.encode(texts)


@pytest.mark.parametrize("bs", [0, -1, 1025, 10**30])
def test_bad_batch_size_raises(embedder, bs):
    with pytest.raises((ValueError, OverflowError), match="batch_size|int too big"):
        embedder.encode(["x"], batch_size=bs)


def test_bad_constructor_arguments(tmp_path):
    with pytest.raises(rlx.ModelLoadError, match="not a directory"):
        rlx.SentenceEmbedder(str(tmp_path / "missing"))
    with pytest.raises(rlx.RlxError, match="config.json"):
        rlx.SentenceEmbedder(tmp_path)  # an empty directory (os.PathLike)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(rlx.ModelLoadError, match="config.json"):
        rlx.SentenceEmbedder(str(tmp_path))
    with pytest.raises(ValueError, match="device"):
        rlx.SentenceEmbedder("minilm", device="tpu")
    with pytest.raises(ValueError, match="precision"):
        rlx.SentenceEmbedder("minilm", precision="f64")
    with pytest.raises(ValueError, match="threads=0"):
        rlx.SentenceEmbedder("minilm", threads=0)
    with pytest.raises(ValueError, match="threads=100000"):
        rlx.SentenceEmbedder("minilm", threads=100000)
    with pytest.raises(TypeError, match="model: expected a str or os.PathLike"):
        rlx.SentenceEmbedder(3)
    assert issubclass(rlx.ModelLoadError, rlx.RlxError)
    assert issubclass(rlx.RlxError, Exception)


def test_low_precision_stays_close(reference):
    texts = reference["sentences"]
    want = np.asarray(reference["embeddings"], dtype=np.float32)
    f16 = rlx.SentenceEmbedder("minilm", precision="f16", threads=1)
    assert cosines(f16.encode(texts), want).min() >= 0.9999


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_memory_does_not_grow_over_1000_calls(embedder):
    texts = ["memory check sentence", "another one"]
    for _ in range(50):  # warm up: compile the shape, fill allocator pools
        embedder.encode(texts)
    start = rss_bytes()
    for i in range(1000):
        out = embedder.encode(texts)
        assert out.shape == (2, 384)
    grown = rss_bytes() - start
    # A leak of even one 384-float row per call would be 1.5 MB; of the
    # inputs or outputs, several MB.
    assert grown < 1 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 1000 calls"
