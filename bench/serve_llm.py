#!/usr/bin/env python3
"""Streamed chat over HTTP: `rlx serve --llm` vs llama-cpp-python's server, SmolLM2-135M Q4_1, CPU.

Method
------
- Peers, same GGUF, same thread count, each alone on a free loopback port
  (never both at once):
  - `rlx serve --llm GGUF --threads T --max-concurrent S` (S slots of
    continuous batching, S = the largest stream count, so that every stream
    is decoded in the same batch);
  - `python -m llama_cpp.server --model GGUF --n_threads T --n_threads_batch T
    --n_ctx C --interrupt_requests False`. llama-cpp-python 0.3.16's server
    has no parallel decoding or batching across requests: one request is
    served at a time behind a lock, the others wait. Its default
    `interrupt_requests=True` cuts a stream short as soon as another request
    is waiting, which would end every concurrent stream after a token or so;
    it is turned off so that every stream runs to its end.
- Load: for N in --streams (1, 4, 16), N concurrent clients (aiohttp) each
  send one `POST /v1/chat/completions` with a distinct prompt, stream=true,
  max_tokens 128, temperature 0 (greedy), repetition penalty off (llama.cpp's
  server applies 1.1 by default), `stream_options.include_usage`. Neither
  server supports `ignore_eos`, so a stream may end before 128 tokens: the
  tokens counted are the completion tokens actually generated, from the
  `usage` the server reports at the end of the stream when it does, else
  the number of SSE chunks that carried text (one per token for both).
- Aggregate tok/s = tokens received over all streams / wall time (first
  send to last `[DONE]`). Time to first token (TTFT) = send to the first
  chunk with non-empty text, per stream; p50 over the streams of a level.
- Rounds: --rounds (2) interleaved rounds, the server order alternating per
  round, each server restarted per round after a one-request warm-up;
  figures are medians over rounds. The load average is recorded before and
  after each level (other jobs may share the machine).

Writes bench/results/serve_llm.{json,md,png} (or --out-dir).
Usage: bench/.venv-serve/bin/python bench/serve_llm.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import (HERE, ROOT, Server, free_port, git_commit, http_json, versions,  # noqa: E402
                          loadavg, machine, median, pct)

TOPICS = ["a lighthouse keeper", "the history of bread", "a robot learning to paint",
          "volcanoes", "a trip to the moon", "the water cycle", "a lost cat in Paris",
          "how bicycles work", "the first winter of a fox", "ancient Rome's roads",
          "a chess tournament", "coral reefs", "a baker who cannot sleep", "thunderstorms",
          "the invention of the printing press", "a friendly dragon", "honey bees",
          "a train crossing the desert", "the northern lights", "a village by the sea"]


# Packages whose versions the results record.
VERSIONED = ["llama_cpp_python", "aiohttp"]

def prompts(n: int, offset: int = 0) -> list[str]:
    return [f"Write a long, detailed story about {TOPICS[(offset + i) % len(TOPICS)]}."
            for i in range(n)]


async def one_stream(session: aiohttp.ClientSession, base: str, model: str | None,
                     prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0.0,
            "repeat_penalty": 1.0, "repetition_penalty": 1.0,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    text = []
    usage = None
    finish = None
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return {"error": f"{resp.status}: {(await resp.text())[:300]}"}
        buf = b""
        async for piece in resp.content.iter_any():
            buf += piece
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                d = json.loads(data)
                if d.get("usage"):
                    usage = d["usage"]
                for c in d.get("choices") or []:
                    content = (c.get("delta") or {}).get("content")
                    if content:
                        chunks += 1
                        text.append(content)
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                    if c.get("finish_reason"):
                        finish = c["finish_reason"]
    end = time.perf_counter() - t0
    tokens = usage.get("completion_tokens") if usage else None
    return {"ttft_s": ttft, "end_s": end, "chunks": chunks, "usage_tokens": tokens,
            "tokens": tokens if tokens is not None else chunks,
            "token_source": "usage" if tokens is not None else "chunks",
            "finish_reason": finish, "text_head": "".join(text)[:80]}


async def run_level(base: str, model: str | None, n: int, max_tokens: int, offset: int) -> dict:
    conn = aiohttp.TCPConnector(limit=n)
    timeout = aiohttp.ClientTimeout(total=1800)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        outs = await asyncio.gather(*(one_stream(s, base, model, p, max_tokens)
                                      for p in prompts(n, offset)), return_exceptions=True)
    wall = time.perf_counter() - t0
    ok = [o for o in outs if isinstance(o, dict) and "error" not in o]
    errs = [str(o) if not isinstance(o, dict) else o["error"] for o in outs
            if not (isinstance(o, dict) and "error" not in o)]
    tokens = sum(o["tokens"] for o in ok)
    ttfts = [o["ttft_s"] for o in ok if o["ttft_s"] is not None]
    return {"streams": n, "ok": len(ok), "errors": errs, "wall_s": round(wall, 3),
            "tokens": tokens, "tok_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_ms": None if not ttfts else pct(ttfts, 50) * 1e3,
            "ttft_max_ms": None if not ttfts else max(ttfts) * 1e3,
            "token_source": sorted({o["token_source"] for o in ok}),
            "tokens_per_stream": [o["tokens"] for o in ok],
            "chunks_per_stream": [o["chunks"] for o in ok],
            "finish_reasons": [o["finish_reason"] for o in ok],
            "sample": ok[0]["text_head"] if ok else None}


def servers(args, p_rlx: int, p_llama: int) -> dict[str, Server]:
    logs = Path(args.log_dir)
    smax = max(int(x) for x in args.streams.split(","))
    rlx = Server("rlx", [args.rlx_bin, "serve", "--llm", str(args.gguf),
                         "--threads", str(args.threads), "--port", str(p_rlx),
                         "--max-concurrent", str(smax), "--ctx", str(args.ctx)],
                 p_rlx, "/health", logs / "serve_llm_rlx.log")
    llama = Server("llama_cpp", [sys.executable, "-m", "llama_cpp.server",
                                 "--model", str(args.gguf), "--n_threads", str(args.llama_threads),
                                 "--n_threads_batch", str(args.llama_threads), "--n_ctx", str(args.ctx),
                                 "--interrupt_requests", "False",
                                 "--host", "127.0.0.1", "--port", str(p_llama)],
                   p_llama, "/v1/models", logs / "serve_llm_llama_cpp.log")
    return {"rlx": rlx, "llama_cpp": llama}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in [("rlx", "o-"), ("llama_cpp", "s--")]:
        rows = [r for r in res["summary"] if r["server"] == name and r["tok_per_s"]]
        if not rows:
            continue
        c = [r["streams"] for r in rows]
        ax[0].plot(c, [r["tok_per_s"] for r in rows], style, label=name)
        ax[1].plot(c, [r["ttft_p50_ms"] for r in rows], style, label=name)
    for a, t in zip(ax, ["aggregate tok/s", "time to first token, p50 (ms)"]):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent chat streams")
        a.set_title(t)
        a.grid(alpha=0.3)
        a.legend()
    ax[1].set_yscale("log")
    fig.suptitle(f"SmolLM2-135M Q4_1 chat streams, {res['threads']} threads, "
                 f"{res['machine'].get('cpu', '?')}; medians of {res['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(res: dict, path: Path) -> None:
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    L = [f"# Streamed chat over HTTP: rlx serve vs llama-cpp-python's server ({res['date']})", "",
         f"Machine: {res['machine'].get('cpu')} ({res['machine']['nproc']} cores), threads "
         f"{res['threads']}, rlx at {res['commit']}; load average before/after "
         f"{res['loadavg_start']} / {res['loadavg_end']} (other jobs shared the machine).", "",
         f"rlx: {res['rlx_cmd']}", "", f"llama-cpp-python: {res['llama_cmd']}", "",
         f"Versions: {res['versions']}", "",
         f"Requests: max_tokens {res['max_tokens']}, temperature 0, distinct prompts, no ignore_eos "
         "(tokens counted as generated).", "",
         *(["**Incomplete: the run was cut short; the figures below are those of the levels "
             "that finished.**", ""] if not res.get("complete") else []),
         "Medians over rounds:", "",
         "| streams | server | aggregate tok/s | TTFT p50 ms | tokens | errors | rounds |",
         "|---|---|---|---|---|---|---|"]
    for r in res["summary"]:
        L.append(f"| {r['streams']} | {r['server']} | {f(r['tok_per_s'])} | {f(r['ttft_p50_ms'])} | "
                 f"{r['tokens']} | {r['errors']} | {r['n_rounds']} |")
    L += ["", "Targets (issue #23, CPU):", ""]
    for t in res["targets"]:
        L.append(f"- {t['what']}: measured {f(t['ratio'], 2)} (target {t['target']}) -> "
                 f"{'met' if t['met'] else 'NOT met' if t['met'] is False else 'n/a'}")
    L += ["", "Per round:", "",
          "| round | server | streams | tok/s | TTFT p50 ms | tokens per stream | token source | load before/after |",
          "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        L.append(f"| {r['round']} | {r['server']} | {r['streams']} | {f(r['tok_per_s'])} | "
                 f"{f(r['ttft_p50_ms'])} | {r['tokens_per_stream']} | {r['token_source']} | "
                 f"{r['loadavg_before'][0]} / {r['loadavg_after'][0]} |")
    if res["unavailable"]:
        L += ["", f"Unavailable: {res['unavailable']}"]
    path.write_text("\n".join(L) + "\n")


def write_all(res: dict, args, streams: list[int], names: list[str], complete: bool) -> None:
    """Summary, targets and the output files from the runs so far (written after
    every level, so that a run cut short still leaves its figures)."""
    res["loadavg_end"] = loadavg()
    res["complete"] = complete
    summary = []
    for n in streams:
        for name in names:
            rs = [r for r in res["runs"] if r["server"] == name and r["streams"] == n]
            if rs:
                summary.append({"server": name, "streams": n, "n_rounds": len(rs),
                                "tok_per_s": median([r["tok_per_s"] for r in rs]),
                                "ttft_p50_ms": median([r["ttft_p50_ms"] for r in rs]),
                                "tokens": [r["tokens"] for r in rs],
                                "errors": sum(len(r["errors"]) for r in rs)})
    res["summary"] = summary
    g = {(r["server"], r["streams"]): r for r in summary}
    a, b = g.get(("rlx", 16)), g.get(("llama_cpp", 16))
    ratio = a["tok_per_s"] / b["tok_per_s"] if a and b and b["tok_per_s"] else None
    res["targets"] = [{"what": "aggregate tok/s at 16 streams, rlx / llama-cpp-python",
                       "ratio": ratio, "target": ">= 2", "met": None if ratio is None else ratio >= 2}]
    s1 = g.get(("rlx", 1))
    res["rlx_16_over_1"] = (a["tok_per_s"] / s1["tok_per_s"]) if a and s1 and s1["tok_per_s"] else None
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "serve_llm.json").write_text(json.dumps(res, indent=1) + "\n")
    write_md(res, args.out_dir / "serve_llm.md")
    try:
        plot(res, args.out_dir / "serve_llm.png")
    except Exception as e:  # noqa: BLE001
        print(f"[serve_llm] plot failed: {e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rlx-bin", default=str(ROOT / "target" / "release" / "rlx"))
    ap.add_argument("--gguf", type=Path, default=Path.home() / ".cache" / "rlx" / "models" /
                    "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-threads", type=int, default=None,
                    help="llama.cpp's n_threads (default: --threads); on this 2-core machine "
                         "n_threads 2 thrashed while the server's Python thread and other jobs "
                         "shared the cores, 1 was faster")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="rlx,llama_cpp")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--log-dir", type=Path, default=ROOT / "target" / "serve-bench-logs")
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    if args.llama_threads is None:
        args.llama_threads = args.threads
    names = args.servers.split(",")
    srv = servers(args, free_port(), free_port())
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
                 "commit": git_commit(), "threads": args.threads, "rounds": args.rounds,
                 "max_tokens": args.max_tokens, "versions": versions(VERSIONED),
                 "rlx_cmd": " ".join(srv["rlx"].cmd), "llama_cmd": " ".join(srv["llama_cpp"].cmd),
                 "loadavg_start": loadavg(), "runs": [], "unavailable": {}, "startup_s": {}}
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
                print(f"[serve_llm] {name} unavailable: {e}", flush=True)
                continue
            try:
                res["startup_s"].setdefault(name, []).append(round(up, 2))
                try:
                    model = http_json(s.base + "/v1/models")["data"][0].get("id")
                except Exception:  # noqa: BLE001
                    model = None
                asyncio.run(run_level(s.base, model, 1, 16, offset=19))  # warm-up
                for n in streams:
                    lb = loadavg()
                    r = asyncio.run(run_level(s.base, model, n, args.max_tokens, offset=0))
                    r.update(server=name, round=rnd, loadavg_before=lb, loadavg_after=loadavg())
                    res["runs"].append(r)
                    write_all(res, args, streams, names, complete=False)
                    print(f"[serve_llm] round {rnd} {name:9s} streams {n:2d}: "
                          f"{r['tok_per_s'] or 0:.1f} tok/s, TTFT p50 {r['ttft_p50_ms'] or 0:.0f} ms, "
                          f"tokens {r['tokens_per_stream']} ({r['token_source']}), "
                          f"errors {r['errors'][:2]}, load {lb[0]}", flush=True)
            finally:
                s.stop()
    write_all(res, args, streams, names, complete=True)
    print((args.out_dir / "serve_llm.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
