#!/usr/bin/env python3
"""Corpus embedding on Ray Data: the same pipeline with rlx, with
sentence-transformers (torch, CPU) and with fastembed (ONNX Runtime).

The pipeline is the one of crates/rlx-py/examples/ray_embed.py: read a
Parquet file, ``map_batches(Embedder, concurrency=W, batch_size=B,
batch_format="pyarrow")`` with a callable class that loads the model once per
actor, then ``materialize()``; only the embedder class differs.

- Ray: ``ray.init(num_cpus=W + 1)`` on this machine (one CPU for the read
  tasks, which reserve 0.25 each); W actors (default 2), each reserving one
  CPU and running its library on one thread (``SentenceEmbedder(threads=1)``,
  ``torch.set_num_threads(1)``, fastembed ``threads=1``).
- Corpus: ``--n`` sentences (default 4,000) from bench/python_embed.py's
  generator (5 to 40 vocab words, seeded), repartitioned into 2W blocks so
  every actor gets work.
- Each library's pipeline runs once as a warm-up (imports, Ray workers), then
  ``--rounds`` interleaved rounds (the order alternates); the figure is the
  median wall time of the whole pipeline, actor start and model load
  included (what a user's job pays), as rows/s.
- Also reported: the seconds the actors spent inside `__call__` (each batch
  returns its own time), as rows per actor-second: the libraries' own
  single-thread throughput without Ray's scheduling and the actors' start.
- ``--bf16`` adds rlx with ``precision="bf16"`` (opt-in bf16 matmuls) as a
  fourth row; the others stay fp32.
- Checks every run: as many rows out as in, each input row once (by an id
  column); each library's embeddings against sentence-transformers in one
  process (min cosine).

Writes bench/results/python_ray.{json,md}. Set up with
bench/setup_python_bench.sh (which installs Ray too), then:
    bench/.venv-pybench/bin/python bench/python_ray.py
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from python_embed import DEFAULT_FASTEMBED_DIR, default_model_dir, lscpu, make_corpus  # noqa: E402

REPO = HERE.parent


class RlxEmbedder:
    """rlx.SentenceEmbedder, one per actor."""

    def __init__(self, model_dir: str, threads: int) -> None:
        import rlx

        self.model = rlx.SentenceEmbedder(model_dir, threads=threads)

    def __call__(self, table):
        t0 = time.perf_counter()
        emb = self.model.encode(table.column("text"), batch_size=32)
        return with_embedding(table, emb, time.perf_counter() - t0)


class RlxBf16Embedder(RlxEmbedder):
    """rlx.SentenceEmbedder with ``precision="bf16"`` (opt-in: bf16 matmul
    operands, f32 sums; AMX tiles where the CPU has them), one per actor."""

    def __init__(self, model_dir: str, threads: int) -> None:
        import rlx

        self.model = rlx.SentenceEmbedder(model_dir, threads=threads, precision="bf16")


class StEmbedder:
    """sentence-transformers on torch (CPU), one per actor."""

    def __init__(self, model_dir: str, threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(model_dir, device="cpu")

    def __call__(self, table):
        t0 = time.perf_counter()
        texts = table.column("text").to_pylist()
        emb = self.model.encode(texts, batch_size=32, normalize_embeddings=True,
                                convert_to_numpy=True)
        return with_embedding(table, emb, time.perf_counter() - t0)


class FastembedEmbedder:
    """fastembed (ONNX Runtime) from a local export, one per actor."""

    def __init__(self, model_dir: str, threads: int) -> None:
        from fastembed import TextEmbedding

        self.model = TextEmbedding(model_name="sentence-transformers/all-MiniLM-L6-v2",
                                   threads=threads, specific_model_path=model_dir)

    def __call__(self, table):
        import numpy as np

        t0 = time.perf_counter()
        texts = table.column("text").to_pylist()
        emb = np.stack(list(self.model.embed(texts, batch_size=32)))
        return with_embedding(table, emb, time.perf_counter() - t0)


def with_embedding(table, emb, seconds: float):
    """`table` with an `embedding` column, and the call's embedding time on
    its first row (`encode_s`, 0 on the others) so the driver can add up the
    time actors spent embedding."""
    import numpy as np
    import pyarrow as pa

    emb = np.ascontiguousarray(emb, dtype=np.float32)
    values = pa.array(emb.reshape(-1), type=pa.float32())
    t = table.append_column("embedding", pa.FixedSizeListArray.from_arrays(values, emb.shape[1]))
    spent = np.zeros(len(table))
    spent[:1] = seconds
    return t.append_column("encode_s", pa.array(spent))


def run_pipeline(ray, src: str, cls, model_dir: str, workers: int, batch: int):
    """One pipeline run: (wall seconds, seconds the actors spent embedding,
    ids, embeddings in id order)."""
    import numpy as np

    t0 = time.perf_counter()
    ds = ray.data.read_parquet(src, num_cpus=0.25).repartition(2 * workers)
    ds = ds.map_batches(cls, fn_constructor_kwargs={"model_dir": model_dir, "threads": 1},
                        concurrency=workers, batch_size=batch, batch_format="pyarrow", num_cpus=1)
    out = ds.materialize()
    dt = time.perf_counter() - t0
    table = out.to_arrow_refs()
    import pyarrow as pa

    t = pa.concat_tables(ray.get(table))
    ids = t.column("id").to_numpy()
    col = t.column("embedding").combine_chunks()
    emb = col.values.to_numpy(zero_copy_only=False).reshape(-1, col.type.list_size)
    order = np.argsort(ids, kind="stable")
    return dt, float(t.column("encode_s").to_numpy().sum()), ids[order], emb[order]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256, help="rows per map_batches call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--fastembed-dir", type=Path, default=DEFAULT_FASTEMBED_DIR)
    ap.add_argument("--bf16", action="store_true",
                    help="also run rlx with precision='bf16' (opt-in; its min cos vs ST is reported)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "python_ray.json")
    a = ap.parse_args()

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    mdir = str(a.model_dir)
    corpus = make_corpus(a.model_dir / "vocab.txt", a.n)
    tmp = tempfile.mkdtemp(prefix="rlx-ray-bench-")
    src = os.path.join(tmp, "corpus.parquet")
    pq.write_table(pa.table({"id": np.arange(len(corpus)), "text": corpus}), src)

    # Single-process reference: sentence-transformers, normalized.
    from sentence_transformers import SentenceTransformer
    import torch

    torch.set_num_threads(2)
    ref = SentenceTransformer(mdir, device="cpu").encode(
        corpus, batch_size=32, normalize_embeddings=True, convert_to_numpy=True).astype(np.float64)

    libs = {"rlx": (RlxEmbedder, mdir), "sentence-transformers": (StEmbedder, mdir)}
    if a.bf16:
        libs["rlx bf16"] = (RlxBf16Embedder, mdir)
    fe_note = None
    if a.fastembed_dir.is_dir():
        libs["fastembed"] = (FastembedEmbedder, str(a.fastembed_dir))
    else:
        fe_note = f"no local ONNX export at {a.fastembed_dir} (run bench/minilm_fastembed_dir.py)"

    ray.init(num_cpus=a.workers + 1, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    times: dict[str, list[float]] = {k: [] for k in libs}
    busy: dict[str, list[float]] = {k: [] for k in libs}
    checks: dict[str, dict] = {}
    names = list(libs)
    for r in range(a.rounds + 1):
        seq = names if r % 2 == 0 else names[::-1]
        for name in seq:
            cls, md = libs[name]
            dt, spent, ids, emb = run_pipeline(ray, src, cls, md, a.workers, a.batch)
            ok_rows = len(ids) == len(corpus) and bool((ids == np.arange(len(corpus))).all())
            e = emb.astype(np.float64)
            cos = (e * ref).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
            c = checks.setdefault(name, {"rows_ok": True, "min_cos": 1.0})
            c["rows_ok"] &= ok_rows
            c["min_cos"] = min(c["min_cos"], float(cos.min()))
            if r == 0:
                print(f"warm-up {name}: {dt:.2f} s, rows ok {ok_rows}, min cos {cos.min():.7f}", flush=True)
            else:
                times[name].append(dt)
                busy[name].append(spent)
        if r:
            print(f"round {r}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in names), flush=True)
    ray.shutdown()

    import sentence_transformers
    import rlx

    results = {}
    for name in names:
        med = statistics.median(times[name])
        spent = statistics.median(busy[name])
        results[name] = {"median_s": med, "times_s": times[name], "rows_per_s": len(corpus) / med,
                         "actor_encode_s": busy[name],
                         "rows_per_actor_encode_s": len(corpus) / spent,
                         **checks[name]}
    st = results["sentence-transformers"]["rows_per_s"]
    st_enc = results["sentence-transformers"]["rows_per_actor_encode_s"]
    for name in names:
        results[name]["ratio_vs_sentence_transformers"] = results[name]["rows_per_s"] / st
        results[name]["encode_ratio_vs_sentence_transformers"] = (
            results[name]["rows_per_actor_encode_s"] / st_enc)
        if "fastembed" in results:
            results[name]["ratio_vs_fastembed"] = (results[name]["rows_per_s"]
                                                   / results["fastembed"]["rows_per_s"])
    versions = {"python": platform.python_version(), "ray": ray.__version__,
                "rlx": rlx.__version__, "torch": torch.__version__,
                "sentence-transformers": sentence_transformers.__version__,
                "numpy": np.__version__}
    try:
        import fastembed
        versions["fastembed"] = fastembed.__version__
    except Exception:  # noqa: BLE001 - recorded as absent
        versions["fastembed"] = None
    load = os.getloadavg()[0]
    doc = {"benchmark": "bench/python_ray.py",
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": lscpu(), "load_avg_1min_at_end": load, "workers": a.workers,
           "threads_per_worker": 1, "rows": len(corpus), "map_batches_batch_size": a.batch,
           "encode_batch_size": 32, "rounds": a.rounds, "versions": versions,
           "results": results, "fastembed_note": fe_note}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    m, v = doc["machine"], doc["versions"]
    lines = [
        "# Ray Data corpus embedding: rlx vs sentence-transformers vs fastembed",
        "",
        f"`bench/python_ray.py`, {doc['date']}. Machine: {m['model_name']} ({m.get('nproc')} logical "
        f"CPUs; flags: {', '.join(m['flags']) or 'none of avx2/avx512'}); load average at the end "
        f"{doc['load_avg_1min_at_end']:.1f}.",
        "",
        f"all-MiniLM-L6-v2, {doc['rows']} sentences from Parquet, `map_batches(concurrency="
        f"{doc['workers']}, batch_size={doc['map_batches_batch_size']})`, one thread per actor, "
        f"encode batches of {doc['encode_batch_size']}; median wall time of the whole pipeline over "
        f"{doc['rounds']} interleaved rounds after a warm-up (actor start and model load included).",
        "",
        "| library | median s | rows/s | vs sentence-transformers | vs fastembed | "
        "embedding only: rows per actor-second | vs sentence-transformers | rows ok | min cos vs ST |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, r in doc["results"].items():
        fe = f"{r['ratio_vs_fastembed']:.2f}x" if "ratio_vs_fastembed" in r else "-"
        lines.append(f"| {name} | {r['median_s']:.2f} | {r['rows_per_s']:.1f} | "
                     f"{r['ratio_vs_sentence_transformers']:.2f}x | {fe} | "
                     f"{r['rows_per_actor_encode_s']:.1f} | "
                     f"{r['encode_ratio_vs_sentence_transformers']:.2f}x | {r['rows_ok']} | "
                     f"{r['min_cos']:.7f} |")
    lines += ["", "rows/s is the whole pipeline (Ray scheduling, actor start, model load, Parquet "
              "read, embedding). The embedding-only columns divide the rows by the time the "
              "actors spent inside their `__call__` (summed over actors): the libraries' own "
              "throughput on one thread.", "", "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".", ""]
    if doc.get("fastembed_note"):
        lines += [f"fastembed: {doc['fastembed_note']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
