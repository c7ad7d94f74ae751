"""Shared fixtures: one loaded model per test session (loading is the slow part)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlx

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "crates/rlx-models/tests/data/minilm_embeddings.json"


@pytest.fixture(scope="session")
def embedder() -> rlx.SentenceEmbedder:
    return rlx.SentenceEmbedder("minilm")


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def llm() -> rlx.LlamaModel:
    return rlx.LlamaModel("smollm2", ctx=512)
