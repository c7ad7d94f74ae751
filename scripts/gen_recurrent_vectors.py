#!/usr/bin/env python3
"""Generate reference vectors for rlx's recurrent ops (GatedDeltaNet, Lstm).

Writes one JSON file per case into crates/rlx/tests/data/recurrent/:

    {"name": ..., "op": "gated_delta_net" | "lstm", <op attributes>,
     "producer": "...",
     "inputs": {"<name>": {"dims": [...], "data": [...]}, ...},
     "output": {"dims": [...], "data": [...]}}

Input data are float32 values (stored exactly as decimal), outputs are float64.

- GatedDeltaNet is implemented here naively with numpy in float64, one step at a
  time, exactly as the issue states it, per (batch, head) with state S [n, n]:
      S <- exp(g) * S
      d <- beta * (v - S^T k)
      S <- S + k (outer) d
      o <- S^T q / sqrt(n)
  q and k are L2-normalized per head. With carry_state the output is
  [B, S + n, H, n]: o, then the final state rows (out[b, S+i, h, j] = S[i, j]),
  as documented on rlx_ir::Op::GatedDeltaNet.
- Lstm runs torch.nn.LSTM (batch_first) with weights from a seeded generator.
  The weights are also written in rlx's packing (see the rlx-ref crate docs):
  w_ih [L*D, 4H, max(in, D*H)] zero-padded, w_hh [L*D, 4H, H],
  bias [L*D, 4H] = b_ih + b_hh, h0/c0 [L*D, B, H].

Usage: python3 scripts/gen_recurrent_vectors.py   (creates/uses .venv-torch with
numpy and torch from PyPI)
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-torch")
VENV_PY = os.path.join(VENV, "bin", "python")
OUT_DIR = os.path.join(ROOT, "crates", "rlx", "tests", "data", "recurrent")


def ensure_venv():
    """Re-executes this script inside .venv-torch with numpy and torch installed."""
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    if not os.path.exists(VENV_PY):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    subprocess.check_call([VENV_PY, "-m", "pip", "install", "-q", "numpy", "torch"])
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])


ensure_venv()

import numpy as np  # noqa: E402
import torch  # noqa: E402


def tensor_json(a):
    a = np.asarray(a)
    return {"dims": list(a.shape), "data": [float(x) for x in a.reshape(-1)]}


def l2norm(x):
    return (x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True))).astype(np.float32)


def gdn_naive(q, k, v, g, beta, s0):
    """Step-by-step gated delta rule in float64; returns o [B,S,H,n] and the final state."""
    b, s, h, n = q.shape
    q, k, v, g, beta = (x.astype(np.float64) for x in (q, k, v, g, beta))
    o = np.zeros((b, s, h, n))
    final = np.zeros((b, h, n, n))
    for bi in range(b):
        for hi in range(h):
            st = s0[bi, hi].astype(np.float64).copy()
            for t in range(s):
                st = np.exp(g[bi, t, hi]) * st
                d = beta[bi, t, hi] * (v[bi, t, hi] - st.T @ k[bi, t, hi])
                st = st + np.outer(k[bi, t, hi], d)
                o[bi, t, hi] = st.T @ q[bi, t, hi] / np.sqrt(n)
            final[bi, hi] = st
    return o, final


def gdn_case(name, seed, b, s, h, n, carry):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = l2norm(rng.standard_normal((b, s, h, n)).astype(f32))
    k = l2norm(rng.standard_normal((b, s, h, n)).astype(f32))
    v = rng.standard_normal((b, s, h, n)).astype(f32)
    # g = -exp(A) * softplus(a): a log decay in (-inf, 0).
    a = rng.standard_normal((b, s, h)).astype(f32)
    g = (-0.5 * np.log1p(np.exp(a))).astype(f32)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((b, s, h))))).astype(f32)
    s0 = (0.3 * rng.standard_normal((b, h, n, n))).astype(f32) if carry else np.zeros((b, h, n, n), f32)
    o, final = gdn_naive(q, k, v, g, beta, s0)
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if carry:
        inputs["state"] = s0
        # [B, S + n, H, n]: o, then state rows i with out[b, S+i, h, j] = S[b, h, i, j].
        out = np.concatenate([o, final.transpose(0, 2, 1, 3)], axis=1)
    else:
        out = o
    return {
        "name": name,
        "op": "gated_delta_net",
        "state_size": n,
        "carry_state": carry,
        "producer": f"numpy {np.__version__}, float64 step-by-step recurrence",
        "inputs": {k_: tensor_json(v_) for k_, v_ in inputs.items()},
        "output": tensor_json(out),
    }


def lstm_case(name, seed, b, s, inp, hidden, layers, bidirectional, carry):
    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(inp, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    dirs = 2 if bidirectional else 1
    x = torch.randn(b, s, inp)
    h0 = torch.randn(layers * dirs, b, hidden) * 0.5
    c0 = torch.randn(layers * dirs, b, hidden) * 0.5
    with torch.no_grad():
        y, _ = lstm(x, (h0, c0)) if carry else lstm(x)
    max_in = max(inp, dirs * hidden)
    w_ih = np.zeros((layers * dirs, 4 * hidden, max_in), np.float32)
    w_hh = np.zeros((layers * dirs, 4 * hidden, hidden), np.float32)
    bias = np.zeros((layers * dirs, 4 * hidden), np.float32)
    for l in range(layers):
        for d in range(dirs):
            sfx = f"l{l}" + ("_reverse" if d == 1 else "")
            wi = getattr(lstm, f"weight_ih_{sfx}").detach().numpy()
            w_ih[l * dirs + d, :, : wi.shape[1]] = wi
            w_hh[l * dirs + d] = getattr(lstm, f"weight_hh_{sfx}").detach().numpy()
            bias[l * dirs + d] = (
                getattr(lstm, f"bias_ih_{sfx}").detach().numpy() + getattr(lstm, f"bias_hh_{sfx}").detach().numpy()
            )
    inputs = {"x": x.numpy(), "w_ih": w_ih, "w_hh": w_hh, "bias": bias}
    if carry:
        inputs["h0"] = h0.numpy()
        inputs["c0"] = c0.numpy()
    return {
        "name": name,
        "op": "lstm",
        "hidden_size": hidden,
        "num_layers": layers,
        "bidirectional": bidirectional,
        "carry": carry,
        "producer": f"torch {torch.__version__} torch.nn.LSTM (batch_first, float32)",
        "inputs": {k_: tensor_json(v_) for k_, v_ in inputs.items()},
        "output": tensor_json(y.numpy().astype(np.float64)),
    }


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    cases = [
        gdn_case("gdn_small", 1, b=2, s=7, h=3, n=8, carry=False),
        gdn_case("gdn_carry_chunked", 2, b=1, s=70, h=2, n=16, carry=True),
        gdn_case("gdn_decode_step", 3, b=2, s=1, h=2, n=16, carry=True),
        lstm_case("lstm_1layer", 4, b=2, s=6, inp=5, hidden=4, layers=1, bidirectional=False, carry=False),
        lstm_case("lstm_2layer_bidir_carry", 5, b=2, s=7, inp=6, hidden=5, layers=2, bidirectional=True, carry=True),
        lstm_case("lstm_2layer_bidir_narrow_input", 6, b=3, s=5, inp=3, hidden=4, layers=2, bidirectional=True, carry=False),
    ]
    for c in cases:
        path = os.path.join(OUT_DIR, c["name"] + ".json")
        with open(path, "w") as f:
            json.dump(c, f)
        print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
