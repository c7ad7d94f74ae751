#!/usr/bin/env python3
"""Embeddings over HTTP: `rlx serve` vs Infinity (infinity-emb), all-MiniLM-L6-v2, CPU.

Method
------
- Peers: `rlx serve --embed-model DIR --threads T` and
  `infinity_emb v2 --model-id ONNX_DIR --engine optimum --device cpu` (its
  ONNX Runtime backend; the ONNX export is target/fastembed-minilm, written
  by bench/minilm_fastembed_dir.py from the same model.safetensors, since the
  Hugging Face hub is unreachable). Each runs alone on a free loopback port
  (never both at once: they share the cores); the script waits for its
  health endpoint, checks it, warms it up, then measures. Infinity's own
  offline ONNX optimization step (ORTOptimizer, level 99) fails with the
  optimum 2.1 that its dependencies resolve to ("OptimizationConfig got an
  unexpected keyword argument 'optimize_with_onnxruntime_only'"); Infinity
  then serves the unoptimized graph, which ONNX Runtime still optimizes at
  session creation (its default ORT_ENABLE_ALL). The log is in
  target/serve-bench-logs/serve_embed_infinity.log.
- Check: both return 384-dim vectors, and rlx's equal Infinity's to cosine
  >= 0.9999 on a few sentences (recorded; a failure is reported, not hidden).
- Load: a fixed list of requests from a seeded generator, each 1-4 short
  sentences (5-20 words drawn from the model's vocab.txt). For each client
  count N in --clients (1, 8, 64), N async aiohttp clients share one queue of
  the first --requests requests (the same requests for both servers) and each
  sends its next request as soon as its previous answer came back (closed
  loop), stopping early if --max-seconds has passed. Throughput =
  sentences embedded / wall time (first send to last answer); latency = per
  request, p50 and p99. Non-200 answers are counted and excluded. Also
  recorded per level: the CPU time of the server's process tree (from
  /proc) per sentence, the work done, far less inflated than wall time by
  other jobs on a shared machine.
- Rounds: --rounds interleaved rounds, the server order alternating per round
  (rlx, Infinity / Infinity, rlx / ...), each server restarted per round; the
  figures reported are medians over rounds. The load average is recorded
  before and after each level: other jobs may share the machine, and
  interleaving gives both servers the same noise.
- The load generator runs in this process, on the same cores as the server
  under test (as it would for both).

Writes bench/results/serve_embed.{json,md,png} (or --out-dir).
Usage: bench/.venv-serve/bin/python bench/serve_embed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import (HERE, ROOT, Server, free_port, git_commit, http_json, versions,  # noqa: E402
                          loadavg, machine, median, pct)

CHECK_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on stage.",
    "Rust is a systems programming language.",
    "What is the capital of France?",
]


# Packages whose versions the results record.
VERSIONED = ["infinity_emb", "optimum", "optimum-onnx", "onnxruntime", "transformers", "torch",
              "aiohttp", "numpy"]

def make_requests(vocab_txt: Path, n: int, seed: int = 0) -> list[list[str]]:
    """`n` requests, each 1-4 sentences of 5-20 whole-word vocab entries."""
    words = [w for w in vocab_txt.read_text(encoding="utf-8").split("\n")
             if w.isalpha() and w.isascii() and len(w) >= 2]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        req = []
        for _ in range(rng.randint(1, 4)):
            s = " ".join(rng.choice(words) for _ in range(rng.randint(5, 20)))
            req.append(s[0].upper() + s[1:] + ".")
        out.append(req)
    return out


def model_id(base: str) -> str:
    d = http_json(base + "/v1/models")
    data = d.get("data", [])
    return data[0].get("id") or data[0].get("model")


def embed_sync(base: str, model: str, texts: list[str]) -> np.ndarray:
    d = http_json(base + "/v1/embeddings", {"model": model, "input": texts})
    rows = sorted(d["data"], key=lambda x: x["index"])
    return np.array([r["embedding"] for r in rows], dtype=np.float64)


async def run_level(base: str, model: str, reqs: list[list[str]], clients: int,
                    max_seconds: float) -> dict:
    """N closed-loop clients over the shared list `reqs`."""
    lat: list[float] = []
    sentences = 0
    errors: dict[str, int] = {}
    nxt = 0
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal nxt, sentences
        while nxt < len(reqs) and time.perf_counter() < deadline:
            r = reqs[nxt]
            nxt += 1
            t = time.perf_counter()
            try:
                async with session.post(base + "/v1/embeddings",
                                        json={"model": model, "input": r}) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        errors[str(resp.status)] = errors.get(str(resp.status), 0) + 1
                        continue
                    n = len(json.loads(body)["data"])
            except Exception as e:  # noqa: BLE001 - counted, not fatal
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            lat.append(time.perf_counter() - t)
            sentences += n

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "clients": clients, "requests_ok": len(lat), "sentences": sentences,
        "errors": errors, "wall_s": round(wall, 3),
        "sentences_per_s": sentences / wall if wall > 0 else None,
        "p50_ms": None if not lat else pct(lat, 50) * 1e3,
        "p99_ms": None if not lat else pct(lat, 99) * 1e3,
    }


def servers(args, port_rlx: int, port_inf: int) -> dict[str, Server]:
    logs = Path(args.log_dir)
    rlx = Server(
        "rlx", [args.rlx_bin, "serve", "--embed-model", str(args.model_dir),
                "--threads", str(args.threads), "--port", str(port_rlx),
                "--queue", str(args.rlx_queue)],
        port_rlx, "/health", logs / "serve_embed_rlx.log")
    inf = Server(
        "infinity", [str(Path(sys.executable).parent / "infinity_emb"), "v2",
                     "--model-id", ".", "--served-model-name", "all-minilm-l6-v2",
                     "--engine", "optimum", "--device", "cpu", "--port", str(port_inf),
                     "--batch-size", str(args.infinity_batch_size),
                     "--pooling-method", "mean", "--no-bettertransformer",
                     "--url-prefix", "/v1", "--host", "127.0.0.1", "--log-level", "warning"],
        port_inf, "/health", logs / "serve_embed_infinity.log",
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
             "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": str(args.threads)},
        # run from the model directory with --model-id ".": given an absolute
        # path, Infinity 0.0.78 passes the absolute ONNX path as file_name,
        # which optimum 2.1 matches against bare file names and rejects
        cwd=args.onnx_dir)
    return {"rlx": rlx, "infinity": inf}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    for name, style in [("rlx", "o-"), ("infinity", "s--")]:
        rows = [r for r in res["summary"] if r["server"] == name and r["sentences_per_s"]]
        if not rows:
            continue
        c = [r["clients"] for r in rows]
        ax[0].plot(c, [r["sentences_per_s"] for r in rows], style, label=name)
        ax[1].plot(c, [r["p50_ms"] for r in rows], style, label=name)
        ax[2].plot(c, [r["p99_ms"] for r in rows], style, label=name)
    for a, t in zip(ax, ["throughput (sentences/s)", "p50 latency (ms)", "p99 latency (ms)"]):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent clients")
        a.set_title(t)
        a.grid(alpha=0.3)
        a.legend()
    ax[1].set_yscale("log")
    ax[2].set_yscale("log")
    fig.suptitle(f"all-MiniLM-L6-v2 over HTTP, {res['threads']} threads, "
                 f"{res['machine'].get('cpu', '?')} ({res['machine']['nproc']} cores); medians of "
                 f"{res['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(res: dict, path: Path) -> None:
    L = [f"# Embeddings over HTTP: rlx serve vs Infinity ({res['date']})", "",
         f"Machine: {res['machine'].get('cpu')} ({res['machine']['nproc']} cores), "
         f"threads {res['threads']}, rlx at {res['commit']}; load average before/after "
         f"{res['loadavg_start']} / {res['loadavg_end']} (other jobs shared the machine).",
         "", f"Infinity: {res['infinity_cmd']}", "", f"rlx: {res['rlx_cmd']}", "",
         f"Versions: {res['versions']}", "",
         f"Check: {res['check']}", "",
         "Medians over rounds (per round: sentences/s, p50, p99 per server and level):", "",
         "| clients | server | sentences/s | p50 ms | p99 ms | server CPU ms/sentence | errors | rounds |",
         "|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in res["summary"]:
        L.append(f"| {r['clients']} | {r['server']} | {f(r['sentences_per_s'])} | {f(r['p50_ms'])} "
                 f"| {f(r['p99_ms'])} | {f(r.get('server_cpu_ms_per_sentence'), 2)} | {r['errors']} "
                 f"| {r['n_rounds']} |")
    L += ["", "Server CPU ms/sentence: CPU time (user + system) of the server's process tree during "
          "the level, per sentence embedded: the work done, which other jobs on a shared machine "
          "inflate much less than wall time (spin-waiting threads still count)."]
    L += ["", "Targets (issue #23, CPU):", ""]
    for t in res["targets"]:
        L.append(f"- {t['what']}: measured {f(t['ratio'], 2)} (target {t['target']}) -> "
                 f"{'met' if t['met'] else 'NOT met' if t['met'] is False else 'n/a'}")
    L += ["", "Per round:", "", "| round | server | clients | sentences/s | p50 ms | p99 ms | "
          "server CPU ms/sentence | load before/after |",
          "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        L.append(f"| {r['round']} | {r['server']} | {r['clients']} | {f(r['sentences_per_s'])} | "
                 f"{f(r['p50_ms'])} | {f(r['p99_ms'])} | {f(r.get('server_cpu_ms_per_sentence'), 2)} | "
                 f"{r['loadavg_before'][0]} / {r['loadavg_after'][0]} |")
    path.write_text("\n".join(L) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rlx-bin", default=str(ROOT / "target" / "release" / "rlx"))
    ap.add_argument("--model-dir", type=Path,
                    default=Path.home() / ".cache" / "rlx" / "models" / "all-minilm-l6-v2")
    ap.add_argument("--onnx-dir", type=Path, default=ROOT / "target" / "fastembed-minilm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--requests", type=int, default=256, help="requests per level")
    ap.add_argument("--max-seconds", type=float, default=60, help="per level")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rlx-queue", type=int, default=1024)
    ap.add_argument("--infinity-batch-size", type=int, default=32)
    ap.add_argument("--servers", default="rlx,infinity")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--log-dir", type=Path, default=ROOT / "target" / "serve-bench-logs")
    args = ap.parse_args()
    clients = [int(x) for x in args.clients.split(",")]
    reqs = make_requests(args.model_dir / "vocab.txt", args.requests, seed=0)
    srv = servers(args, free_port(), free_port())
    names = args.servers.split(",")
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
                 "commit": git_commit(), "threads": args.threads, "rounds": args.rounds,
                 "requests_per_level": args.requests, "max_seconds": args.max_seconds,
                 "sentences_per_request": "1-4 (5-20 words each)", "versions": versions(VERSIONED),
                 "rlx_cmd": " ".join(srv["rlx"].cmd), "infinity_cmd": " ".join(srv["infinity"].cmd),
                 "loadavg_start": loadavg(), "runs": [], "unavailable": {}, "startup_s": {}}
    check_vecs: dict[str, np.ndarray] = {}
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            if name in res["unavailable"]:
                continue
            s = srv[name]
            try:
                up = s.start()
            except Exception as e:  # noqa: BLE001 - recorded
                res["unavailable"][name] = str(e)
                print(f"[serve_embed] {name} unavailable: {e}", flush=True)
                continue
            try:
                res["startup_s"].setdefault(name, []).append(round(up, 2))
                model = model_id(s.base)
                v = embed_sync(s.base, model, CHECK_SENTENCES)
                check_vecs[name] = v
                for r in reqs[:16]:  # warm-up
                    embed_sync(s.base, model, r)
                for n in clients:
                    lb = loadavg()
                    c0, cc0 = s.cpu_seconds(), time.process_time()
                    r = asyncio.run(run_level(s.base, model, reqs, n, args.max_seconds))
                    c1, cc1 = s.cpu_seconds(), time.process_time()
                    r.update(server=name, round=rnd, loadavg_before=lb, loadavg_after=loadavg())
                    # CPU time per sentence: the work each server did, which
                    # other jobs on a shared machine inflate far less than
                    # wall time (the load generator's own, for scale).
                    sent = max(r["sentences"], 1)
                    r["server_cpu_ms_per_sentence"] = (None if c0 is None or c1 is None
                                                       else (c1 - c0) * 1e3 / sent)
                    r["client_cpu_ms_per_sentence"] = (cc1 - cc0) * 1e3 / sent
                    res["runs"].append(r)
                    cpu = r["server_cpu_ms_per_sentence"]
                    print(f"[serve_embed] round {rnd} {name:8s} clients {n:3d}: "
                          f"{r['sentences_per_s']:.1f} sent/s p50 {r['p50_ms']:.1f} ms "
                          f"p99 {r['p99_ms']:.1f} ms errors {r['errors']} load {lb[0]} "
                          f"server cpu {cpu if cpu is None else round(cpu, 2)} ms/sentence",
                          flush=True)
            finally:
                s.stop()
    res["loadavg_end"] = loadavg()

    check: dict = {"dims": {k: int(v.shape[1]) for k, v in check_vecs.items()}}
    if "rlx" in check_vecs and "infinity" in check_vecs:
        a, b = check_vecs["rlx"], check_vecs["infinity"]
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        check["cos_rlx_vs_infinity"] = [round(float(c), 7) for c in cos]
        check["ok"] = bool(cos.min() >= 0.9999 and a.shape[1] == b.shape[1] == 384)
    res["check"] = check

    summary = []
    for n in clients:
        for name in names:
            rs = [r for r in res["runs"] if r["server"] == name and r["clients"] == n]
            if not rs:
                continue
            summary.append({
                "server": name, "clients": n, "n_rounds": len(rs),
                "sentences_per_s": median([r["sentences_per_s"] for r in rs]),
                "p50_ms": median([r["p50_ms"] for r in rs]),
                "p99_ms": median([r["p99_ms"] for r in rs]),
                "server_cpu_ms_per_sentence": median(
                    [r.get("server_cpu_ms_per_sentence") for r in rs]),
                "errors": sum(sum(r["errors"].values()) for r in rs)})
    res["summary"] = summary

    def get(name, n, k):
        for r in summary:
            if r["server"] == name and r["clients"] == n:
                return r[k]
        return None

    targets = []
    ti, tr = get("infinity", 64, "sentences_per_s"), get("rlx", 64, "sentences_per_s")
    ratio = tr / ti if ti and tr else None
    targets.append({"what": "throughput at 64 clients, rlx / Infinity", "ratio": ratio,
                    "target": ">= 1.5", "met": None if ratio is None else ratio >= 1.5})
    pi, pr = get("infinity", 8, "p99_ms"), get("rlx", 8, "p99_ms")
    ratio = pr / pi if pi and pr else None
    targets.append({"what": "p99 latency at 8 clients, rlx / Infinity", "ratio": ratio,
                    "target": "<= 1.0", "met": None if ratio is None else ratio <= 1.0})
    res["targets"] = targets

    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "serve_embed.json").write_text(json.dumps(res, indent=1) + "\n")
    write_md(res, args.out_dir / "serve_embed.md")
    try:
        plot(res, args.out_dir / "serve_embed.png")
    except Exception as e:  # noqa: BLE001
        print(f"[serve_embed] plot failed: {e}")
    print((args.out_dir / "serve_embed.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
