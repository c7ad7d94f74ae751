#!/usr/bin/env python3
"""all-MiniLM-L6-v2 from Python on the CPU: rlx.SentenceEmbedder versus
sentence-transformers (torch) and, where it can run offline, fastembed.

- Both read the same model directory: rlx's cache (``$RLX_MODELS_DIR`` or
  ``~/.cache/rlx/models``)/all-minilm-l6-v2, fetched by
  ``python3 scripts/fetch_models.py minilm``. Nothing is downloaded from the
  Hugging Face hub (HF_HUB_OFFLINE=1).
- A fixed corpus: ``--n`` sentences (default 1,000) of 5 to 40 words drawn
  with a seeded RNG from the whole-word entries of the model's vocab.txt.
- The same thread count for both (``--threads``, default 2):
  ``SentenceEmbedder(threads=...)``, ``torch.set_num_threads`` (and one
  inter-op thread), OMP/MKL variables set before torch is imported.
- ``encode(corpus, batch_size=32)`` with L2-normalized output for every
  library, one warm-up call each, then ``--rounds`` interleaved rounds (the
  order alternates per round so drift hits both); medians, sentences/s.
- sentence-transformers sorts the texts by length before batching (less
  padding); ``rlx.SentenceEmbedder.encode`` batches them in the order
  given. The row "rlx (length-sorted)" feeds rlx the same order
  sentence-transformers uses internally and restores the order afterwards,
  to show what that costs; the headline ratio is the plain API call.
- Parity: the cosine of each row of rlx against sentence-transformers
  (both normalized); the minimum is reported.
- fastembed downloads its ONNX model from the Hugging Face hub, which this
  machine cannot reach (the error of that path is recorded). It runs with
  ``specific_model_path`` pointing at a local export instead
  (``--fastembed-dir``, default target/fastembed-minilm, written by
  bench/minilm_fastembed_dir.py from the same safetensors: the encoder as
  ONNX, fastembed does the mean pooling and normalization). Its ONNX graph
  is rlx's own export (bench/minilm_ort.py), not the hub's file, so its
  speed is ONNX Runtime's on that graph.

Writes bench/results/python_embed.{json,md}. Set up with
bench/setup_python_bench.sh, then:
    bench/.venv-pybench/bin/python bench/python_embed.py
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FASTEMBED_DIR = REPO / "target" / "fastembed-minilm"


def default_model_dir() -> Path:
    root = os.environ.get("RLX_MODELS_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rlx" / "models"
    return base / "all-minilm-l6-v2"


def make_corpus(vocab_txt: Path, n: int, seed: int = 0) -> list[str]:
    """`n` sentences of 5 to 40 words from the whole-word vocab entries."""
    words = [w for w in vocab_txt.read_text(encoding="utf-8").split("\n")
             if w.isalpha() and w.isascii() and len(w) >= 2]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(5, 40)
        s = " ".join(rng.choice(words) for _ in range(k))
        out.append(s[0].upper() + s[1:] + ".")
    return out


def lscpu() -> dict:
    info = {"model_name": platform.processor() or "?", "flags": []}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model name":
                info["model_name"] = v.strip()
            if k.strip() == "Flags":
                fl = v.split()
                info["flags"] = sorted(f for f in fl if f in (
                    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                    "avx512_bf16", "amx_tile", "amx_bf16"))
    except Exception as e:  # noqa: BLE001 - machine info is best effort
        info["error"] = str(e)
    info["nproc"] = os.cpu_count()
    return info


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--fastembed-dir", type=Path,
                    default=DEFAULT_FASTEMBED_DIR if DEFAULT_FASTEMBED_DIR.is_dir() else None)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "python_embed.json")
    args = ap.parse_args()

    t = str(args.threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = t
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    import numpy as np
    import torch
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    import rlx

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    mdir = args.model_dir
    if not (mdir / "model.safetensors").exists():
        print(f"error: {mdir}/model.safetensors not found; run "
              "`python3 scripts/fetch_models.py minilm`", file=sys.stderr)
        return 2
    corpus = make_corpus(mdir / "vocab.txt", args.n)
    words = [len(s.split()) for s in corpus]
    print(f"corpus: {len(corpus)} sentences, {min(words)}-{max(words)} words "
          f"(mean {statistics.mean(words):.1f}), batch {args.batch}, {args.threads} threads",
          flush=True)

    r_model = rlx.SentenceEmbedder(str(mdir), threads=args.threads)
    st_model = SentenceTransformer(str(mdir), device="cpu")

    # The order sentence-transformers batches in (longest first, by
    # characters): its encode sorts by -len(text).
    order = np.argsort([-len(s) for s in corpus], kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    sorted_corpus = [corpus[i] for i in order]

    runners = {
        "rlx": lambda: r_model.encode(corpus, batch_size=args.batch, normalize=True),
        "rlx (length-sorted)": lambda: r_model.encode(
            sorted_corpus, batch_size=args.batch, normalize=True)[inv],
        "sentence-transformers": lambda: st_model.encode(
            corpus, batch_size=args.batch, normalize_embeddings=True, convert_to_numpy=True),
    }

    fastembed_info: dict = {}
    try:
        import fastembed
        from fastembed import TextEmbedding
        fastembed_info["version"] = fastembed.__version__
        kw = {"model_name": "sentence-transformers/all-MiniLM-L6-v2", "threads": args.threads}
        try:  # its own download path, offline: expected to fail here
            TextEmbedding(**kw)
            fastembed_info["offline_download_path"] = "loaded from its cache"
        except Exception as e:  # noqa: BLE001 - recorded
            fastembed_info["offline_download_path"] = f"{type(e).__name__}: {e}"
        fe_dir = args.fastembed_dir
        if fe_dir is None:
            raise FileNotFoundError(
                f"no local ONNX export at {DEFAULT_FASTEMBED_DIR}; run bench/minilm_fastembed_dir.py")
        fastembed_info["how"] = f"specific_model_path={fe_dir} (bench/minilm_fastembed_dir.py)"
        fe_model = TextEmbedding(**kw, specific_model_path=str(fe_dir))
        runners["fastembed"] = lambda: np.stack(list(fe_model.embed(corpus, batch_size=args.batch)))
        fastembed_info["status"] = "ran"
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        fastembed_info["status"] = "blocked"
        fastembed_info["error"] = f"{type(e).__name__}: {e}"
        print(f"fastembed blocked: {fastembed_info['error']}", flush=True)

    outputs = {}
    for name, fn in runners.items():  # warm-up, and the outputs for parity
        dt, outputs[name] = timed(fn)
        print(f"warm-up {name}: {dt:.2f} s", flush=True)

    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in range(args.rounds):
        seq = names if r % 2 == 0 else names[::-1]
        for name in seq:
            dt, _ = timed(runners[name])
            times[name].append(dt)
        print(f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in names), flush=True)

    ref = np.asarray(outputs["sentence-transformers"], dtype=np.float64)
    results = {}
    for name in names:
        med = statistics.median(times[name])
        out = np.asarray(outputs[name], dtype=np.float64)
        cos = (out * ref).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
        results[name] = {
            "median_s": med,
            "times_s": times[name],
            "sentences_per_s": len(corpus) / med,
            "min_cos_vs_sentence_transformers": float(cos.min()),
            "mean_cos_vs_sentence_transformers": float(cos.mean()),
            "shape": list(out.shape),
        }
    st_rate = results["sentence-transformers"]["sentences_per_s"]
    for name in names:
        results[name]["ratio_vs_sentence_transformers"] = results[name]["sentences_per_s"] / st_rate

    doc = {
        "benchmark": "bench/python_embed.py",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": lscpu(),
        "threads": args.threads,
        "corpus": {"sentences": len(corpus), "words_min": min(words), "words_max": max(words),
                   "words_mean": statistics.mean(words), "seed": 0,
                   "source": "whole-word entries of the model's vocab.txt"},
        "batch_size": args.batch,
        "rounds": args.rounds,
        "model_dir": str(mdir),
        "versions": {"python": platform.python_version(), "rlx": rlx.__version__,
                     "torch": torch.__version__,
                     "sentence-transformers": sentence_transformers.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "fastembed": fastembed_info.get("version")},
        "results": results,
        "fastembed": fastembed_info,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    md = args.out.with_suffix(".md")
    md.write_text(markdown(doc))
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    m = doc["machine"]
    v = doc["versions"]
    lines = [
        "# all-MiniLM-L6-v2 from Python: rlx vs sentence-transformers",
        "",
        f"`bench/python_embed.py`, {doc['date']}. Machine: {m['model_name']} "
        f"({m.get('nproc')} logical CPUs visible; flags: {', '.join(m['flags']) or 'none of avx2/avx512'}). "
        f"{doc['threads']} threads for every library.",
        "",
        f"Corpus: {doc['corpus']['sentences']} sentences of {doc['corpus']['words_min']}-"
        f"{doc['corpus']['words_max']} words (mean {doc['corpus']['words_mean']:.1f}), "
        f"batch {doc['batch_size']}, normalized embeddings; {doc['rounds']} interleaved rounds "
        "after one warm-up, medians.",
        "",
        "| library | median s | sentences/s | vs sentence-transformers | min cos vs ST |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in doc["results"].items():
        lines.append(f"| {name} | {r['median_s']:.3f} | {r['sentences_per_s']:.1f} | "
                     f"{r['ratio_vs_sentence_transformers']:.2f}x | "
                     f"{r['min_cos_vs_sentence_transformers']:.7f} |")
    fe = doc["fastembed"]
    lines += ["", "sentence-transformers sorts texts by length before batching; `rlx` batches "
              "them in the order given (the length-sorted row feeds rlx that order).", ""]
    if fe.get("status") != "ran":
        lines += [f"fastembed {fe.get('version', '(not installed)')}: **blocked**: `{fe.get('error')}`", ""]
    else:
        lines += [f"fastembed's own model download is unreachable offline "
                  f"(`{fe.get('offline_download_path')}`); it ran from {fe.get('how')}: an ONNX export "
                  "of the same safetensors made by bench/minilm_ort.py's builder, not the hub's file.", ""]
    lines += [f"Versions: Python {v['python']}, rlx {v['rlx']}, torch {v['torch']}, "
              f"sentence-transformers {v['sentence-transformers']}, transformers {v['transformers']}, "
              f"numpy {v['numpy']}, fastembed {v['fastembed']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
