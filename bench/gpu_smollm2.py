"""SmolLM2-135M decode at batch 1 on one GPU: rlx (`rlx bench-llm --device
cuda`, hybrid = the whole decode step as one CUDA graph, and thunks) against
PyTorch + HF transformers with a static KV cache, eagerly and with the
decode step captured into one CUDA graph (optionally also
torch.compile(mode="reduce-overhead")), in one run.

Runs ON the GPU machine (PyTorch + transformers there, no network):

    python3 bench/gpu_smollm2.py --rlx BIN --out DIR [--gguf FILE] [--compile]

With --gguf, both sides use that file: rlx reads it, and PyTorch gets its
weights dequantized to the benchmark dtype by the small GGUF reader below
(Q4_1, Q8_0, F32; Q/K rows un-permuted back to HF's rotary layout). The
fp32 PyTorch model's greedy ids are checked against the reference file when
it is present. Without --gguf both sides use random weights of SmolLM2's
shapes (rlx: `--synthetic`); timings do not depend on the values.

Timing: `decode` tokens after a `prefill`-token prompt; each generated token
is taken to the host (rlx hands back the logits every step and picks the
argmax on the host; PyTorch takes the device argmax with `.item()`), as a
streaming generation loop must. Medians over repetitions.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import torch

CFG = dict(vocab=49152, d=576, layers=30, heads=9, kv_heads=3, ff=1536, eps=1e-5, theta=100000.0)


# ---------------------------------------------------------------- GGUF reader
def gguf_tensors(path):
    data = open(path, "rb").read()
    at = 0

    def take(n):
        nonlocal at
        b = data[at:at + n]
        at += n
        return b

    u32 = lambda: struct.unpack("<I", take(4))[0]
    u64 = lambda: struct.unpack("<Q", take(8))[0]
    string = lambda: take(u64()).decode("utf-8", "replace")
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = u32(), u64()
            if et in (8, 9):
                return [value(et) for _ in range(n)]
            take(sizes[et] * n)
            return None
        return take(sizes[t])

    assert take(4) == b"GGUF"
    u32()
    nt, nkv = u64(), u64()
    for _ in range(nkv):
        string()
        value(u32())
    infos = []
    for _ in range(nt):
        name = string()
        dims = [u64() for _ in range(u32())]
        infos.append((name, dims, u32(), u64()))
    start = (at + 31) // 32 * 32
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = {}
    for name, dims, t, off in infos:
        n = 1
        for x in dims:
            n *= x
        base = start + off
        if t == 0:
            w = raw[base:base + 4 * n].view(torch.float32).clone()
        elif t == 8:  # Q8_0
            b = raw[base:base + n // 32 * 34].view(-1, 34)
            d = b[:, :2].contiguous().view(torch.float16).float()
            q = b[:, 2:].contiguous().view(torch.int8).float()
            w = (q * d).reshape(-1)
        elif t == 3:  # Q4_1
            b = raw[base:base + n // 32 * 20].view(-1, 20)
            d = b[:, :2].contiguous().view(torch.float16).float()
            m = b[:, 2:4].contiguous().view(torch.float16).float()
            qs = b[:, 4:].long()
            q = torch.cat([qs & 15, qs >> 4], dim=1).float()
            w = (q * d + m).reshape(-1)
        else:
            raise SystemExit(f"{name}: ggml type {t} not handled here")
        out[name] = w.reshape(list(reversed(dims)))
    return out


def unpermute(w, heads):
    # Inverse of llama.cpp's convert permute (rotary pairs made adjacent).
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state_dict(t):
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"]}
    for l in range(CFG["layers"]):
        p, q = f"blk.{l}.", f"model.layers.{l}."
        sd[q + "self_attn.q_proj.weight"] = unpermute(t[p + "attn_q.weight"], CFG["heads"])
        sd[q + "self_attn.k_proj.weight"] = unpermute(t[p + "attn_k.weight"], CFG["kv_heads"])
        sd[q + "self_attn.v_proj.weight"] = t[p + "attn_v.weight"]
        sd[q + "self_attn.o_proj.weight"] = t[p + "attn_output.weight"]
        sd[q + "mlp.gate_proj.weight"] = t[p + "ffn_gate.weight"]
        sd[q + "mlp.up_proj.weight"] = t[p + "ffn_up.weight"]
        sd[q + "mlp.down_proj.weight"] = t[p + "ffn_down.weight"]
        sd[q + "input_layernorm.weight"] = t[p + "attn_norm.weight"]
        sd[q + "post_attention_layernorm.weight"] = t[p + "ffn_norm.weight"]
    return sd


# ---------------------------------------------------------------- PyTorch
def build(sd, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=CFG["vocab"], hidden_size=CFG["d"], intermediate_size=CFG["ff"],
                      num_hidden_layers=CFG["layers"], num_attention_heads=CFG["heads"],
                      num_key_value_heads=CFG["kv_heads"], rms_norm_eps=CFG["eps"],
                      rope_theta=CFG["theta"], max_position_embeddings=8192,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    if sd is not None:
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if m != "lm_head.weight"]
        assert not missing and not unexpected, (missing, unexpected)
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            model.lm_head.weight = model.model.embed_tokens.weight
    return cfg, model.to(dtype).eval()


def static_cache(cfg, ctx, dtype):
    from transformers import StaticCache

    try:
        return StaticCache(config=cfg, max_cache_len=ctx)
    except TypeError:
        return StaticCache(config=cfg, max_batch_size=1, max_cache_len=ctx, device="cuda", dtype=dtype)


class Decoder:
    """A static-cache decode step over fixed input buffers."""

    def __init__(self, cfg, model, ctx, dtype):
        self.model, self.ctx = model, ctx
        self.cache = static_cache(cfg, ctx, dtype)
        self.ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        self.pos = torch.zeros((1,), dtype=torch.long, device="cuda")
        self.graph, self.out = None, None

    @torch.no_grad()
    def step(self):
        return self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.pos,
                          position_ids=self.pos.view(1, 1), use_cache=True).logits[:, -1, :]

    @torch.no_grad()
    def prefill(self, prompt):
        ids = torch.tensor([prompt], device="cuda")
        pos = torch.arange(len(prompt), device="cuda")
        out = self.model(input_ids=ids, past_key_values=self.cache, cache_position=pos,
                         position_ids=pos.view(1, -1), use_cache=True).logits[:, -1, :]
        return int(out.argmax())

    def capture(self):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.step()

    def generate(self, prompt, n, fn=None):
        """Greedy: prefill, then n decode steps; returns (ids, decode seconds)."""
        # Static layers may count their own fill position: start from zero
        # (in place, so captured graphs keep their addresses).
        self.cache.reset()
        tok = self.prefill(prompt)
        ids = [tok]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            self.ids.fill_(tok)
            self.pos.fill_(len(prompt) + i)
            if self.graph is not None:
                self.graph.replay()
                out = self.out
            else:
                out = (fn or self.step)()
            tok = int(out.argmax())
            ids.append(tok)
        torch.cuda.synchronize()
        return ids, time.perf_counter() - t


def torch_runs(sd, args, prompt, results, reference):
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    for dname in args.dtypes.split(","):
        dtype = dtypes[dname]
        cfg, model = build(sd, dtype)
        ctx = len(prompt) + args.decode + 8
        # Eager (fewer tokens: slow).
        dec = Decoder(cfg, model, ctx, dtype)
        dec.generate(prompt, 4)
        _, t = dec.generate(prompt, 32)
        results[f"torch_eager_{dname}"] = {"tok_s": 32 / t, "ms_per_token": 1e3 * t / 32}
        # One CUDA graph per decode step.
        dec = Decoder(cfg, model, ctx, dtype)
        dec.capture()
        runs = []
        for _ in range(args.reps):
            ids, t = dec.generate(prompt, args.decode)
            runs.append(args.decode / t)
        med = statistics.median(runs)
        results[f"torch_cudagraph_{dname}"] = {"tok_s": med, "ms_per_token": 1e3 / med, "runs": runs}
        if reference is not None and dname == "fp32":
            for case in reference["cases"]:
                d2 = Decoder(cfg, model, len(case["prompt_ids"]) + 32, dtype)
                d2.capture()
                got, _ = d2.generate(case["prompt_ids"], len(case["greedy_ids"]) - 1)
                ok = got == case["greedy_ids"]
                results.setdefault("torch_reference_check", []).append(
                    {"prompt": case["prompt"], "greedy_ids_equal": ok})
                print(f"torch fp32 cuda-graph greedy ids equal to the reference for {case['prompt']!r}: {ok}",
                      flush=True)
        if args.compile and dname == "bf16":
            dec = Decoder(cfg, model, ctx, dtype)
            fn = torch.compile(dec.step, mode="reduce-overhead", fullgraph=False)
            t0 = time.perf_counter()
            for _ in range(3):
                dec.generate(prompt, 4, fn)
            compile_s = time.perf_counter() - t0
            runs = []
            for _ in range(args.reps):
                _, t = dec.generate(prompt, args.decode, fn)
                runs.append(args.decode / t)
            med = statistics.median(runs)
            results[f"torch_compile_reduce_overhead_{dname}"] = {
                "tok_s": med, "ms_per_token": 1e3 / med, "runs": runs, "compile_s": compile_s}
        for k, v in results.items():
            if k.startswith("torch_") and isinstance(v, dict):
                print(f"{k}: {v['tok_s']:.1f} tok/s ({v['ms_per_token']:.3f} ms/token)", flush=True)
        del model
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- rlx
def rlx_runs(args, results):
    base = [args.rlx, "bench-llm", "--device", "cuda", "--prefill", str(args.prefill),
            "--decode", str(args.decode), "--reps", str(args.reps), "--json"]
    base += ["--model", args.gguf] if args.gguf else ["--synthetic"]
    for rnd in range(2):
        for mode in ["hybrid", "thunks"]:
            p = subprocess.run(base + ["--mode", mode], capture_output=True, text=True, timeout=300)
            sys.stderr.write(p.stderr)
            if p.returncode != 0:
                results[f"rlx_{mode}_error"] = p.stderr[-2000:]
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            results.setdefault(f"rlx_{mode}_rounds", []).append(r)
    for mode in ["hybrid", "thunks"]:
        rs = results.get(f"rlx_{mode}_rounds", [])
        if rs:
            tok = statistics.median(r["decode_tok_s"] for r in rs)
            results[f"rlx_{mode}"] = {
                "tok_s": tok, "ms_per_token": 1e3 / tok,
                "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in rs),
                "dispatches_per_step": rs[0]["decode_dispatches"],
                "device_ops_per_step": rs[0]["decode_device_ops"]}
            print(f"rlx_{mode}: {tok:.1f} tok/s ({1e3 / tok:.3f} ms/token), "
                  f"{rs[0]['decode_dispatches']} dispatches per step", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--reference", default="crates/rlx-models/tests/data/smollm2_logits.json")
    ap.add_argument("--prefill", type=int, default=16)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-rlx", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp32")
    args = ap.parse_args()
    import transformers

    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "transformers": transformers.__version__, "prefill": args.prefill,
               "decode": args.decode, "weights": "gguf" if args.gguf else "synthetic"}
    if not args.skip_rlx:
        rlx_runs(args, results)
    if not args.skip_torch:
        sd, reference = None, None
        if args.gguf:
            sd = hf_state_dict(gguf_tensors(args.gguf))
            if os.path.exists(args.reference):
                reference = json.load(open(args.reference))
        prompt = [1 + (i * 37) % 1000 for i in range(args.prefill)]
        torch.backends.cuda.matmul.allow_tf32 = False
        torch_runs(sd, args, prompt, results, reference)
    best = max((v["tok_s"] for k, v in results.items()
                if k.startswith("torch_cudagraph") or k.startswith("torch_compile")), default=None)
    if best and "rlx_hybrid" in results:
        results["rlx_hybrid_over_best_torch_graph"] = results["rlx_hybrid"]["tok_s"] / best
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_smollm2.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_rounds")}, indent=1))


if __name__ == "__main__":
    main()
