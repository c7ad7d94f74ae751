"""Embed a Parquet corpus with rlx on Ray Data.

Reads Parquet files with a string column, runs
``map_batches(RlxEmbedder, concurrency=N, batch_size=B)`` (a pool of N actors,
each loading the model once) and writes Parquet with an ``embedding`` column
(fixed-size list of float32, one row per input row, every other column kept).

    python examples/ray_embed.py IN_DIR_OR_FILE OUT_DIR --concurrency 2 --batch-size 256

Local: ``ray.init()`` starts a Ray on this machine (``--num-cpus`` caps it).

A multi-node cluster: start Ray on every node (``ray start --head`` on one,
``ray start --address=HEAD:6379`` on the others), install the same rlx wheel
on each, put the input where every node can read it (S3, GCS, NFS: Ray Data
reads ``s3://...`` paths through pyarrow), and run this script on the head
node or with ``ray job submit -- python ray_embed.py s3://in/ s3://out/
--address auto --concurrency <total workers>``. The model is fetched on each
node on first use (or set RLX_MODELS_DIR to a shared path that holds it).

GPUs: build the wheel with ``maturin build --release --features cuda`` and pass
``--device cuda --num-gpus 1``: each actor then reserves one GPU
(``num_gpus=1`` in ``map_batches``) and runs the model there; use a larger
``--batch-size`` (512-2048) so each call fills the GPU.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pyarrow as pa


class RlxEmbedder:
    """A Ray Data callable class: loads an rlx SentenceEmbedder once per
    actor and embeds one batch (a ``pyarrow.Table``) per call."""

    def __init__(
        self,
        model: str = "minilm",
        column: str = "text",
        device: str = "cpu",
        threads: int | None = None,
        encode_batch_size: int = 64,
    ) -> None:
        import rlx

        self.model = rlx.SentenceEmbedder(model, device=device, threads=threads)
        self.column = column
        self.encode_batch_size = encode_batch_size

    def __call__(self, table: pa.Table) -> pa.Table:
        emb = self.model.encode(table.column(self.column), batch_size=self.encode_batch_size)
        values = pa.array(emb.reshape(-1), type=pa.float32())
        col = pa.FixedSizeListArray.from_arrays(values, emb.shape[1])
        return table.append_column("embedding", col)


def embed_parquet(
    src: str,
    dst: str,
    *,
    concurrency: int = 2,
    batch_size: int = 256,
    column: str = "text",
    model: str = "minilm",
    device: str = "cpu",
    threads_per_worker: int = 1,
    num_cpus_per_worker: float | None = None,
    io_num_cpus: float = 0.25,
    num_gpus: float = 0,
    num_blocks: int | None = None,
) -> None:
    """Read Parquet from ``src``, embed ``column`` on ``concurrency`` actors
    in batches of ``batch_size`` rows, write Parquet to ``dst``.

    Each actor runs rlx on ``threads_per_worker`` threads and reserves
    ``num_cpus_per_worker`` CPUs (default: as many as its threads); the read
    and write tasks reserve ``io_num_cpus`` each. Leave room for them: actors
    that reserve every CPU of the cluster starve the reads and the pipeline
    waits forever (e.g. 2 actors x 1 CPU on ``ray.init(num_cpus=2)``).

    ``num_blocks``: repartition the input into this many blocks before the
    actors (None: as read). Each block goes to one actor, and Ray Data
    reads a small input (a few MB) as a single block, so all but one actor
    would sit idle: give at least ``concurrency`` blocks for a small
    corpus."""
    import ray

    io = {"num_cpus": io_num_cpus}
    ds = ray.data.read_parquet(src, num_cpus=io_num_cpus)
    if num_blocks is not None:
        ds = ds.repartition(num_blocks)
    extra: dict[str, Any] = {"num_gpus": num_gpus} if num_gpus else {}
    ds = ds.map_batches(
        RlxEmbedder,
        fn_constructor_kwargs={
            "model": model,
            "column": column,
            "device": device,
            "threads": threads_per_worker,
        },
        concurrency=concurrency,
        batch_size=batch_size,
        batch_format="pyarrow",
        num_cpus=threads_per_worker if num_cpus_per_worker is None else num_cpus_per_worker,
        **extra,
    )
    ds.write_parquet(dst, ray_remote_args=io)


def read_embeddings(path: str, column: str = "embedding") -> tuple[pa.Table, np.ndarray]:
    """A written result as (table, float32 array ``[rows, dim]``)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    col = t.column(column).combine_chunks()
    dim = col.type.list_size
    return t, col.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="input Parquet file or directory")
    p.add_argument("dst", help="output directory")
    p.add_argument("--column", default="text")
    p.add_argument("--model", default="minilm")
    p.add_argument("--concurrency", type=int, default=2, help="actors (model copies)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per map_batches call")
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--num-cpus-per-worker", type=float, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="repartition the input into this many blocks (default: as read; "
                        "at least --concurrency for a small input)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    p.add_argument("--num-cpus", type=int, default=None, help="local Ray only")
    a = p.parse_args()

    import ray

    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=a.num_cpus)
    embed_parquet(
        a.src,
        a.dst,
        concurrency=a.concurrency,
        batch_size=a.batch_size,
        column=a.column,
        model=a.model,
        device=a.device,
        threads_per_worker=a.threads_per_worker,
        num_cpus_per_worker=a.num_cpus_per_worker,
        num_gpus=a.num_gpus,
        num_blocks=a.num_blocks,
    )


if __name__ == "__main__":
    main()
