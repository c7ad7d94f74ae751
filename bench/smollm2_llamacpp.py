#!/usr/bin/env python3
"""SmolLM2-135M-Instruct Q4_1 on the CPU: rlx vs llama.cpp (llama-cpp-python).

Measures, for both engines on the same GGUF and thread count:

- prefill: one forward pass over a `--prefill` (128) token prompt, tokens/s;
- decode: `--decode` (128) greedy tokens generated one at a time right after
  that prompt (positions 128..255), tokens/s.

llama.cpp runs in this process through llama-cpp-python (model loaded once,
`n_threads = n_threads_batch = --threads`, `n_ctx = 512`, `n_batch = 512`,
default KV type f16, no flash attention, mmap). rlx runs as a subprocess,
`target/release/rlx bench-llm --model GGUF --prefill 128 --decode 128
--threads 2 --json`, which prints one JSON line `{"prefill_tok_s": f,
"decode_tok_s": f}`. The two are interleaved round by round so machine noise
hits both; after one warm-up run of each, `--rounds` (7) timed rounds are taken
and the medians reported. A missing or failing rlx binary is recorded as null
with the reason, and the llama.cpp numbers are still written.

rlx runs in two modes, interleaved in the same rounds: the default f32
activations (rows with `"activations": "f32"`) and the opt-in
`--int8-activations` mode that rounds activations to 8-bit blocks as llama.cpp
does (rows with `"activations": "int8"`; `--no-int8` skips it). Every row keeps
`{phase, rlx_tok_s, llamacpp_tok_s, ratio}` against the same llama.cpp medians.

Writes bench/results/smollm2_cpu.json and bench/results/smollm2_cpu.md.
Run with bench/.venv-llamacpp/bin/python (see bench/setup_llamacpp_venv.sh).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# llama_cpp is imported only inside the worker processes (after OMP_WAIT_POLICY is set).
POLICIES = ("default", "passive")

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "crates/rlx-models/tests/data/smollm2_logits.json"
# Prompt text repeated until it has enough tokens; only its length matters for speed.
PROMPT_TEXT = (
    "Once upon a time, there was a little robot who lived in a small town by the sea. "
    "Every morning it walked to the harbour, counted the boats, and wrote their names "
    "in a notebook. The fishermen laughed at first, but soon they asked the robot "
    "which boats had come home and which were still out on the water. "
)


def disp(path: Path | str) -> str:
    """A path as shown in messages and committed results: repo-relative or ~-relative."""
    p = Path(path)
    for base, label in ((REPO, ""), (Path.home(), "~/")):
        try:
            return label + str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(p)


def default_model() -> Path:
    root = os.environ.get("RLX_MODELS_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rlx" / "models"
    return base / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def machine_info() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"python {platform.python_version()}")


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python: timed prefill then greedy decode."""

    def __init__(self, model: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(model), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         n_batch=n_ctx, n_ubatch=n_ctx, seed=0, verbose=False)

    def prompt(self, n: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < n:
            ids += self.llm.tokenize(PROMPT_TEXT.encode(), add_bos=False, special=False)
        return ids[:n]

    def last_argmax(self) -> int:
        # Logits of the last evaluated token (eval() requests only that row).
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))

    def run(self, prompt: list[int], n_decode: int) -> tuple[float, float, list[int]]:
        """Returns (prefill tok/s, decode tok/s, generated ids)."""
        self.llm.reset()  # n_past = 0; eval() drops the KV cache past it
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        tok = self.last_argmax()
        t1 = time.perf_counter()
        out = [tok]
        t2 = time.perf_counter()
        for _ in range(n_decode):
            self.llm.eval([tok])
            tok = self.last_argmax()
            out.append(tok)
        t3 = time.perf_counter()
        return len(prompt) / (t1 - t0), n_decode / (t3 - t2), out

    def check_reference(self) -> list[str]:
        """Tokenization and greedy tokens against the HF reference prompts (informational)."""
        notes = []
        try:
            cases = json.loads(REFERENCE.read_text())["cases"]
        except (OSError, ValueError, KeyError) as e:
            return [f"reference not read: {e}"]
        for c in cases:
            ids = self.llm.tokenize(c["prompt"].encode(), add_bos=False, special=False)
            self.llm.reset()
            self.llm.eval(ids)
            gen = []
            for _ in range(len(c["greedy_ids"])):
                tok = self.last_argmax()
                gen.append(tok)
                self.llm.eval([tok])
            same = 0
            for a, b in zip(gen, c["greedy_ids"]):
                if a != b:
                    break
                same += 1
            notes.append(f"{c['prompt']!r}: prompt ids {'match' if ids == c['prompt_ids'] else 'DIFFER'}, "
                         f"greedy agrees with the fp32 reference for {same}/{len(gen)} tokens")
        return notes


class RlxRunner:
    """Invokes `rlx bench-llm ... --json`; disables itself (with a reason) on failure."""

    def __init__(self, binary: Path, model: Path, prefill: int, decode: int, threads: int,
                 timeout_s: float, extra: list[str] | None = None) -> None:
        self.cmd = [str(binary), "bench-llm", "--model", str(model), "--prefill", str(prefill),
                    "--decode", str(decode), "--threads", str(threads), "--json", *(extra or [])]
        self.timeout_s = timeout_s
        self.broken: str | None = None
        if not binary.is_file():
            self._fail(f"{disp(binary)} not found (build it with `cargo build --release -p rlx-cli`)")

    def show(self) -> str:
        return " ".join([disp(self.cmd[0]), *self.cmd[1:3], disp(self.cmd[3]), *self.cmd[4:]])

    def run(self) -> tuple[float, float] | None:
        if self.broken:
            return None
        try:
            proc = subprocess.run(self.cmd, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            self._fail(f"{self.show()}: {e}")
            return None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            self._fail(f"{self.show()} exited {proc.returncode}: {' | '.join(tail)}")
            return None
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        try:
            out = json.loads(lines[-1])
            pre, dec = float(out["prefill_tok_s"]), float(out["decode_tok_s"])
            if not (pre > 0 and dec > 0):
                raise ValueError(f"non-positive rates {pre}, {dec}")
            return pre, dec
        except (IndexError, KeyError, ValueError, TypeError) as e:
            self._fail(f"{self.show()} printed no valid JSON line ({e}): {proc.stdout.strip()[:300]!r}")
            return None

    def _fail(self, reason: str) -> None:
        self.broken = reason
        print(f"[rlx] disabled: {reason}; rlx results will be null", flush=True)


def median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def worker(args: argparse.Namespace) -> int:
    """Worker process: one llama.cpp model under one OpenMP wait policy.

    Prints one JSON line when ready, then one JSON line per `run` command read
    from stdin, and exits on `quit` or end of input.
    """
    if args.worker != "default":
        os.environ["OMP_WAIT_POLICY"] = args.worker  # must precede loading libgomp
    import llama_cpp

    runner = LlamaCppRunner(args.model, args.threads, args.n_ctx)
    notes = runner.check_reference() if args.check else []
    prompt = runner.prompt(args.prefill)
    runner.run(prompt, args.decode)  # warm-up, not timed
    print(json.dumps({
        "ready": True,
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "reference_check": notes,
    }), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "run":
            p, d, _ = runner.run(prompt, args.decode)
            print(json.dumps({"prefill_tok_s": p, "decode_tok_s": d}), flush=True)
    return 0


class LlamaWorker:
    """Client side of a `--worker POLICY` subprocess."""

    def __init__(self, policy: str, args: argparse.Namespace, check: bool) -> None:
        self.policy = policy
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", policy, "--model", str(args.model),
               "--prefill", str(args.prefill), "--decode", str(args.decode), "--threads", str(args.threads),
               "--n-ctx", str(args.n_ctx)] + (["--check"] if check else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip().startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"llama.cpp worker ({self.policy}) exited with {self.proc.wait()}")

    def run(self) -> tuple[float, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        out = self._read()
        return float(out["prefill_tok_s"]), float(out["decode_tok_s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=default_model(), help="SmolLM2 GGUF")
    ap.add_argument("--prefill", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--decode", type=int, default=128, help="generated tokens (default 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7, help="timed interleaved rounds (>= 5)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="llama.cpp OpenMP wait policies to measure, comma-separated from: default, passive, active "
                         "(default: default,passive)")
    ap.add_argument("--rlx-bin", type=Path, default=REPO / "target" / "release" / "rlx")
    ap.add_argument("--rlx-timeout", type=float, default=600.0, help="seconds per rlx invocation")
    ap.add_argument("--skip-rlx", action="store_true")
    ap.add_argument("--no-int8", action="store_true", help="skip the rlx --int8-activations runs")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--worker", choices=("default", "passive", "active"), help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if not args.model.is_file():
        print(f"model {disp(args.model)} missing; run python3 scripts/fetch_models.py smollm2", file=sys.stderr)
        return 1
    if args.prefill + args.decode + 1 > args.n_ctx:
        print(f"--prefill + --decode must fit in --n-ctx {args.n_ctx}", file=sys.stderr)
        return 2
    if args.worker:
        return worker(args)
    if args.rounds < 5:
        print("--rounds must be >= 5", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or any(p not in ("default", "passive", "active") for p in policies):
        print(f"--policies {args.policies!r}: expected a comma-separated subset of default,passive,active",
              file=sys.stderr)
        return 2

    load_before = os.getloadavg()
    # One worker per OpenMP wait policy (the policy is fixed when libgomp loads); each loads the
    # model and does one untimed warm-up run before reporting ready.
    workers = [LlamaWorker(p, args, check=(i == 0)) for i, p in enumerate(policies)]
    info = workers[0].info
    for n in info["reference_check"]:
        print(f"[llama.cpp] {n}", flush=True)
    modes = ["f32"] + ([] if args.no_int8 else ["int8"])
    rlxs = {m: RlxRunner(args.rlx_bin, args.model, args.prefill, args.decode, args.threads, args.rlx_timeout,
                         ["--int8-activations"] if m == "int8" else [])
            for m in modes}
    for rlx in rlxs.values():
        if args.skip_rlx:
            rlx._fail("skipped (--skip-rlx)")
        rlx.run()  # warm-up, not timed

    ll: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in policies}
    rx: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
    try:
        for r in range(args.rounds):
            msg = []
            for w in workers:
                p, d = w.run()
                ll[w.policy][0].append(p)
                ll[w.policy][1].append(d)
                msg.append(f"llama.cpp[{w.policy}] {p:.1f} / {d:.1f}")
            for m, rlx in rlxs.items():
                got = rlx.run()
                if got is not None:
                    rx[m][0].append(got[0])
                    rx[m][1].append(got[1])
                    msg.append(f"rlx[{m}] {got[0]:.1f} / {got[1]:.1f}")
                else:
                    msg.append(f"rlx[{m}] —")
            print(f"[round {r + 1}/{args.rounds}] prefill / decode tok/s: " + " | ".join(msg), flush=True)
    finally:
        for w in workers:
            w.close()

    rows = []
    for m, rlx in rlxs.items():
        for k, phase in enumerate(("prefill", "decode")):
            rx_runs = rx[m][k]
            rx_m = median(rx_runs) if not rlx.broken else None
            per_policy = {p: median(ll[p][k]) for p in policies}
            best = max(policies, key=lambda p: per_policy[p] or 0.0)
            ll_m = per_policy[best]
            rows.append({
                "phase": phase,
                "activations": m,
                "tokens": args.prefill if phase == "prefill" else args.decode,
                "rlx_tok_s": round(rx_m, 2) if rx_m is not None else None,
                "llamacpp_tok_s": round(ll_m, 2) if ll_m is not None else None,
                "ratio": round(rx_m / ll_m, 3) if rx_m and ll_m else None,
                "llamacpp_policy": best,
                "llamacpp_tok_s_by_policy": {p: round(v, 2) if v is not None else None
                                             for p, v in per_policy.items()},
                "rlx_runs": [round(x, 2) for x in rx_runs] if not rlx.broken else [],
                "llamacpp_runs": {p: [round(x, 2) for x in ll[p][k]] for p in policies},
            })

    result = {
        "model": disp(args.model),
        "machine": machine_info() + f", llama-cpp-python {info['version']}",
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "prefill_tokens": args.prefill,
        "decode_tokens": args.decode,
        "rounds": args.rounds,
        "llamacpp_policies": policies,
        "llamacpp_system_info": info["system_info"],
        "llamacpp_reference_check": info["reference_check"],
        "rlx_command": rlxs["f32"].show(),
        "rlx_commands": {m: r.show() for m, r in rlxs.items()},
        "rlx_unavailable": rlxs["f32"].broken,
        "rlx_unavailable_by_mode": {m: r.broken for m, r in rlxs.items()},
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "rows": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "smollm2_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / "smollm2_cpu.md").write_text(markdown(result))
    print(f"wrote {disp(args.out_dir / 'smollm2_cpu.json')} and {disp(args.out_dir / 'smollm2_cpu.md')}")
    return 0


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    pol = res["llamacpp_policies"]
    lines = [
        "# SmolLM2-135M-Instruct Q4_1 on the CPU: rlx vs llama.cpp",
        "",
        f"- model: `{res['model']}`",
        f"- machine: {res['machine']}",
        f"- date: {res['date']}",
        f"- llama.cpp: llama-cpp-python, n_threads = n_threads_batch = {res['threads']}, n_ctx = {res['n_ctx']}, "
        f"n_batch = {res['n_ctx']}, KV cache f16, no flash attention, OpenMP wait policies measured: "
        f"{', '.join(pol)} (the faster one per phase is the baseline); `{res['llamacpp_system_info']}`",
        *[f"- rlx [{m}]: `{c}`" for m, c in res["rlx_commands"].items()],
        f"- method: prefill = one forward pass over a {res['prefill_tokens']}-token prompt; decode = "
        f"{res['decode_tokens']} greedy tokens one at a time right after it; median over {res['rounds']} "
        f"interleaved rounds after one warm-up run of each engine",
        "- rlx activations: `f32` = the default (exact up to f32 rounding, matches the fp32 reference "
        "within 0.02); `int8` = `--int8-activations`, activations rounded to 8-bit blocks of 32 with "
        "integer dot products, as llama.cpp does (top-1 equal and top-10 logits within 0.5 of the reference)",
        f"- machine load average (1 min) before / after: {res['loadavg_1m_before_after'][0]} / "
        f"{res['loadavg_1m_before_after'][1]} (above the core count means other work competed for the CPUs)",
        "",
        "| phase | rlx activations | tokens | rlx tok/s | llama.cpp tok/s | rlx / llama.cpp | "
        + " | ".join(f"llama.cpp [{p}]" for p in pol) + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(pol),
    ]
    for r in res["rows"]:
        by = r["llamacpp_tok_s_by_policy"]
        lines.append(f"| {r['phase']} | {r.get('activations', 'f32')} | {r['tokens']} | {fmt(r['rlx_tok_s'])} "
                     f"| {fmt(r['llamacpp_tok_s'])} "
                     f"({r['llamacpp_policy']}) | {fmt(r['ratio'], '.3f')} | "
                     + " | ".join(fmt(by[p]) for p in pol) + " |")
    lines.append("")
    lines.append("Higher is better; ratio > 1 means rlx is faster.")
    for m, why in res["rlx_unavailable_by_mode"].items():
        if why:
            lines += ["", f"rlx [{m}] not measured (— in the table): {why}"]
    if res["llamacpp_reference_check"]:
        lines += ["", "llama.cpp against the fp32 HF reference (`crates/rlx-models/tests/data/smollm2_logits.json`;"
                  " llama.cpp quantizes activations to 8 bits, so greedy paths may part after a few tokens):", ""]
        lines += [f"- {n}" for n in res["llamacpp_reference_check"]]
    lines += ["", "Reproduce: `bash bench/setup_llamacpp_venv.sh && bench/.venv-llamacpp/bin/python "
              "bench/smollm2_llamacpp.py`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
