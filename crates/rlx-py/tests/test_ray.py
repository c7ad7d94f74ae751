"""The Ray Data recipe (examples/ray_embed.py) on a local Ray: every row's
embedding equals the single-process result, no row lost or duplicated.

Opt-in: needs `ray` (scripts/python/run.sh installs it, pinned, with
RLX_PY_RAY=1); skipped when ray is not installed.

The 3,000 rows (three small files) would be read into one block, which
only one actor can take: the other actor idled and the whole corpus went
through one single-threaded actor (ray 2.60 warns "the operator only
received 1 input(s)"), several minutes on a loaded 2-core machine, which
looked like a stall (it passes in 3.5-4.5 minutes here). The test
repartitions it into 6 blocks (``num_blocks``) so both actors can work.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples/ray_embed.py"


def load_example():
    spec = importlib.util.spec_from_file_location("ray_embed", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ray_embed"] = mod
    spec.loader.exec_module(mod)
    return mod


def corpus(n: int) -> list[str]:
    words = "rust python ray data embed vector model token batch worker cluster node".split()
    rng = np.random.default_rng(3)
    return [
        f"{i}: " + " ".join(rng.choice(words, size=int(rng.integers(1, 30))))
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def local_ray():
    # Workers import the example module by name (Ray pickles the class by
    # reference), so they get its folder on their path.
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLE.parent)}},
    )
    yield
    ray.shutdown()


def test_ray_pipeline_matches_single_process(tmp_path, local_ray, embedder):
    ex = load_example()
    texts = corpus(3000)
    src = tmp_path / "in"
    src.mkdir()
    # Three input files, so the pipeline reads several blocks.
    for k in range(3):
        part = slice(k * 1000, (k + 1) * 1000)
        ids = list(range(3000))[part]
        pq.write_table(pa.table({"id": ids, "text": texts[part]}), src / f"part{k}.parquet")
    dst = tmp_path / "out"
    # Two actors on rlx's one thread each. Ray's accounting must leave room
    # for Ray Data's file listing (1 CPU) and the read/write tasks on this
    # 2-CPU Ray: with 2 x 1 (or 2 x 0.75) CPU reserved by the actors the
    # pipeline waited forever, so each actor reserves 0.5.
    ex.embed_parquet(
        str(src),
        str(dst),
        concurrency=2,
        batch_size=250,
        num_cpus_per_worker=0.5,
        num_blocks=6,
    )

    table, emb = ex.read_embeddings(str(dst))
    ids = table.column("id").to_pylist()
    assert len(ids) == 3000, "rows lost or duplicated"
    assert sorted(ids) == list(range(3000)), "rows lost or duplicated"
    assert table.column("text").to_pylist() == [texts[i] for i in ids]
    want = embedder.encode([texts[i] for i in ids], batch_size=64)
    assert emb.shape == want.shape == (3000, 384)
    # Batches differ between the runs (padding to each batch's length), so
    # rows agree to float rounding, not bit for bit.
    assert np.abs(emb - want).max() <= 2e-5
