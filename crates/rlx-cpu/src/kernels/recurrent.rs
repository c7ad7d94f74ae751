//! Recurrent scans: the gated delta rule (`Op::GatedDeltaNet`) and the
//! multi-layer, optionally bidirectional LSTM (`Op::Lstm`).
//!
//! # Gated delta rule
//!
//! Per (batch, head) with state `S [n, n]` and per step `t` (op.rs):
//! `S <- exp(g_t) S`; `d <- beta_t (v_t - S^T k_t)`; `S <- S + k_t ⊗ d`;
//! `o_t <- S^T q_t / sqrt(n)`.
//!
//! Two forms compute it:
//!
//! - [`GdnForm::Recurrent`] walks the steps one by one, two passes over the
//!   state per step (decay + `S^T k`, then the rank-1 update + `S^T q`).
//!   This is the decode path.
//! - [`GdnForm::Chunked`] processes `C` steps at a time with the WY / UT
//!   transform. Within a chunk starting from state `S0`, with the inclusive
//!   cumulative log decay `G_t` and `γ_t = exp(G_t)`:
//!   `S_t = γ_t S0 + Σ_{s<=t} exp(G_t - G_s) k_s d_sᵀ`, so the deltas solve the
//!   unit lower-triangular system `(I + diag(β) L) D = diag(β) (V - diag(γ) K S0)`
//!   with `L[t, s] = exp(G_t - G_s) (k_t · k_s)` for `s < t`. Writing
//!   `U = A⁻¹ diag(β) V` and `W = A⁻¹ diag(βγ) K` gives `D = U - W S0`, then
//!   `O = (diag(γ) Q S0 + M D) / sqrt(n)` with the causal
//!   `M[t, s] = exp(G_t - G_s) (q_t · k_s)` (`s <= t`), and the chunk's final
//!   state `γ_C S0 + (diag(exp(G_C - G_t)) K)ᵀ D`. Every product except the
//!   triangular solve is a gemm, and the state is read once per chunk
//!   instead of once per step. This is the prefill path.
//!
//! Both run in f32 and are parallel over (batch, head) with rayon.
//!
//! # LSTM
//!
//! Weights are packed as documented in the rlx-ref crate: `w_ih
//! [L*D, 4H, max_in]`, `w_hh [L*D, 4H, H]`, `bias [L*D, 4H]` (b_ih + b_hh),
//! optional `h0`, `c0 [L*D, B, H]`. For each layer and direction the input
//! projection of every timestep is one gemm; the recurrence then runs per
//! step as a `[B, H] x [H, 4H]` gemm plus the gate nonlinearities.

use super::matmul::{gemm, gemm_bt, gemm_strided};
use super::simd::{self, simd_dispatch};
use super::{bad_shape, exact_len, KernelError, PAR_MIN_ELEMS};
use rayon::prelude::*;

const GDN: &str = "GatedDeltaNet";
const LSTM: &str = "Lstm";

/// Chunk length used by [`GdnForm::Auto`] for prefill.
pub const GDN_CHUNK: usize = 64;

/// Below this many steps [`GdnForm::Auto`] uses the recurrent form.
pub const GDN_CHUNKED_MIN_STEPS: usize = 16;

/// Sizes of one gated delta-rule call: q, k, v are `[batch, seq, heads, n]`,
/// g and beta `[batch, seq, heads]`, the state `[batch, heads, n, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Batch size B.
    pub batch: usize,
    /// Steps S.
    pub seq: usize,
    /// Heads H.
    pub heads: usize,
    /// State width n (the head dim of q, k and v).
    pub n: usize,
}

/// Which algorithm computes the gated delta rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdnForm {
    /// Step by step (decode).
    Recurrent,
    /// WY/UT-transform chunks of the given length (prefill); 0 is refused.
    Chunked(usize),
    /// Recurrent below [`GDN_CHUNKED_MIN_STEPS`] steps, else chunks of [`GDN_CHUNK`].
    Auto,
}

/// Gated delta rule over `q, k, v [B, S, H, n]`, `g, beta [B, S, H]`, and an
/// optional initial state `[B, H, n, n]`.
///
/// Without `state`, `out` is o `[B, S, H, n]`. With it, `out` is
/// `[B, S + n, H, n]`: o in rows `0..S` of axis 1 and the final state in
/// rows `S..S+n` (`out[b, S+i, h, j] = state[b, h, i, j]`), as documented on
/// `Op::GatedDeltaNet`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    dims: &GdnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: Option<&[f32]>,
    form: GdnForm,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let GdnDims {
        batch,
        seq,
        heads,
        n,
    } = *dims;
    let act = batch * seq * heads * n;
    let gates = batch * seq * heads;
    for (what, buf, len) in [
        ("q", q, act),
        ("k", k, act),
        ("v", v, act),
        ("g", g, gates),
        ("beta", beta, gates),
    ] {
        exact_len(GDN, what, buf.len(), len)?;
    }
    if let Some(s0) = state {
        exact_len(GDN, "state", s0.len(), batch * heads * n * n)?;
    }
    let rows = seq + if state.is_some() { n } else { 0 };
    exact_len(GDN, "output", out.len(), batch * rows * heads * n)?;
    let chunk = match form {
        GdnForm::Recurrent => None,
        GdnForm::Chunked(0) => {
            return Err(bad_shape(GDN, "chunk length 0 (expected at least 1)"));
        }
        GdnForm::Chunked(c) => Some(c),
        GdnForm::Auto => (seq >= GDN_CHUNKED_MIN_STEPS).then_some(GDN_CHUNK),
    };
    if out.is_empty() {
        return Ok(());
    }
    let io = Io { q, k, v, g, beta };
    let head = |bh: usize| -> Result<(Vec<f32>, Vec<f32>), KernelError> {
        let (b, h) = (bh / heads, bh % heads);
        let mut st = match state {
            Some(s0) => s0[bh * n * n..(bh + 1) * n * n].to_vec(),
            None => vec![0.0; n * n],
        };
        let mut o = vec![0.0f32; seq * n];
        match chunk {
            None => recurrent_head(dims, &io, b, h, &mut st, &mut o),
            Some(c) => chunked_head(dims, &io, b, h, c, &mut st, &mut o)?,
        }
        Ok((o, st))
    };
    let work = batch * heads * seq.max(1) * n * n;
    let results: Vec<(Vec<f32>, Vec<f32>)> = if work >= PAR_MIN_ELEMS && batch * heads > 1 {
        (0..batch * heads)
            .into_par_iter()
            .map(head)
            .collect::<Result<_, _>>()?
    } else {
        (0..batch * heads).map(head).collect::<Result<_, _>>()?
    };
    // Scatter per-head results into [B, rows, H, n].
    let row_w = heads * n;
    let scatter = |bt: usize, dst: &mut [f32]| {
        let (b, t) = (bt / rows, bt % rows);
        for h in 0..heads {
            let (o, st) = &results[b * heads + h];
            let src = if t < seq {
                &o[t * n..(t + 1) * n]
            } else {
                &st[(t - seq) * n..(t - seq + 1) * n]
            };
            dst[h * n..(h + 1) * n].copy_from_slice(src);
        }
    };
    if out.len() >= PAR_MIN_ELEMS * 4 {
        out.par_chunks_mut(row_w)
            .enumerate()
            .for_each(|(bt, dst)| scatter(bt, dst));
    } else {
        out.chunks_mut(row_w)
            .enumerate()
            .for_each(|(bt, dst)| scatter(bt, dst));
    }
    Ok(())
}

/// The five per-step operands.
struct Io<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

simd_dispatch! {
    /// One recurrent step on state `st [n, n]`: decay, delta, rank-1 update
    /// and the scaled readout into `o [n]`. `tmp [n]` is scratch.
    fn gdn_step(
        st: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: f32,
        beta: f32,
        scale: f32,
        tmp: &mut [f32],
        o: &mut [f32],
    ) {
        let n = q.len();
        // Pass 1: S <- decay S and tmp <- S^T k.
        tmp.fill(0.0);
        for (i, row) in st.chunks_exact_mut(n).enumerate() {
            let ki = k[i];
            for (s, t) in row.iter_mut().zip(tmp.iter_mut()) {
                *s *= decay;
                *t += ki * *s;
            }
        }
        // d <- beta (v - S^T k), kept in tmp.
        for (t, &vj) in tmp.iter_mut().zip(v) {
            *t = beta * (vj - *t);
        }
        // Pass 2: S <- S + k ⊗ d and o <- S^T q.
        o.fill(0.0);
        for (i, row) in st.chunks_exact_mut(n).enumerate() {
            let (ki, qi) = (k[i], q[i]);
            for ((s, &d), oj) in row.iter_mut().zip(tmp.iter()).zip(o.iter_mut()) {
                *s += ki * d;
                *oj += qi * *s;
            }
        }
        for x in o.iter_mut() {
            *x *= scale;
        }
    }
}

/// Step-by-step gated delta rule for one (batch, head); `o` is `[S, n]`.
fn recurrent_head(d: &GdnDims, io: &Io<'_>, b: usize, h: usize, st: &mut [f32], o: &mut [f32]) {
    let n = d.n;
    let scale = 1.0 / (n as f32).sqrt();
    let mut tmp = vec![0.0f32; n];
    for t in 0..d.seq {
        let gi = (b * d.seq + t) * d.heads + h;
        let vo = gi * n;
        gdn_step(
            st,
            &io.q[vo..vo + n],
            &io.k[vo..vo + n],
            &io.v[vo..vo + n],
            io.g[gi].exp(),
            io.beta[gi],
            scale,
            &mut tmp,
            &mut o[t * n..(t + 1) * n],
        );
    }
}

/// Chunked (WY/UT-transform) gated delta rule for one (batch, head).
#[allow(clippy::needless_range_loop)]
fn chunked_head(
    d: &GdnDims,
    io: &Io<'_>,
    b: usize,
    h: usize,
    chunk: usize,
    st: &mut [f32],
    o: &mut [f32],
) -> Result<(), KernelError> {
    let n = d.n;
    let rs = d.heads * n; // row stride of q, k, v between steps
    let scale = 1.0 / (n as f32).sqrt();
    let cmax = chunk.min(d.seq).max(1);
    let mut cum = vec![0.0f32; cmax]; // G_t
    let mut kk = vec![0.0f32; cmax * cmax]; // K K^T, then M
    let mut qk = vec![0.0f32; cmax * cmax]; // Q K^T
    let mut x = vec![0.0f32; cmax * 2 * n]; // [U | -W]
    let mut dd = vec![0.0f32; cmax * n]; // D
    let mut kd = vec![0.0f32; cmax * n]; // exp(G_C - G_t) k_t
    let mut t0 = 0;
    while t0 < d.seq {
        let c = chunk.min(d.seq - t0);
        let gate0 = (b * d.seq + t0) * d.heads + h;
        let base = gate0 * n;
        let qs = &io.q[base..];
        let ks = &io.k[base..];
        let vs = &io.v[base..];
        let gate = |t: usize| gate0 + t * d.heads;
        let mut acc = 0.0f32;
        for t in 0..c {
            acc += io.g[gate(t)];
            cum[t] = acc;
        }
        // K K^T and Q K^T (c x c).
        gemm_bt(c, c, n, ks, rs, ks, rs, &mut kk, cmax, false, false)?;
        gemm_bt(c, c, n, qs, rs, ks, rs, &mut qk, cmax, false, false)?;
        // Right-hand sides: U rows beta_t v_t, -W rows -beta_t gamma_t k_t.
        for t in 0..c {
            let bt = io.beta[gate(t)];
            let gam = cum[t].exp();
            let xr = &mut x[t * 2 * n..(t + 1) * 2 * n];
            let (u, w) = xr.split_at_mut(n);
            let (vr, kr) = (&vs[t * rs..t * rs + n], &ks[t * rs..t * rs + n]);
            for j in 0..n {
                u[j] = bt * vr[j];
                w[j] = -bt * gam * kr[j];
            }
        }
        // Forward substitution with the unit lower-triangular I + diag(beta) L.
        for t in 1..c {
            let bt = io.beta[gate(t)];
            let (done, rest) = x.split_at_mut(t * 2 * n);
            let xt = &mut rest[..2 * n];
            for s in 0..t {
                let coef = bt * (cum[t] - cum[s]).exp() * kk[t * cmax + s];
                if coef != 0.0 {
                    simd::axpy(-coef, &done[s * 2 * n..(s + 1) * 2 * n], xt);
                }
            }
        }
        // D = U + (-W) S0.
        for t in 0..c {
            dd[t * n..(t + 1) * n].copy_from_slice(&x[t * 2 * n..t * 2 * n + n]);
        }
        gemm(c, n, n, &x[n..], 2 * n, st, n, &mut dd, n, true, false)?;
        // O = diag(gamma) Q S0 + M D, then / sqrt(n).
        let oc = &mut o[t0 * n..(t0 + c) * n];
        gemm(c, n, n, qs, rs, st, n, oc, n, false, false)?;
        for t in 0..c {
            let gam = cum[t].exp();
            oc[t * n..(t + 1) * n].iter_mut().for_each(|v| *v *= gam);
            for s in 0..cmax {
                kk[t * cmax + s] = if s <= t && s < c {
                    (cum[t] - cum[s]).exp() * qk[t * cmax + s]
                } else {
                    0.0
                };
            }
        }
        gemm(c, n, c, &kk, cmax, &dd, n, oc, n, true, false)?;
        oc.iter_mut().for_each(|v| *v *= scale);
        // S <- gamma_C S0 + (diag(exp(G_C - G_t)) K)^T D.
        let last = cum[c - 1];
        for t in 0..c {
            let w = (last - cum[t]).exp();
            let kr = &ks[t * rs..t * rs + n];
            for (dst, &kv) in kd[t * n..(t + 1) * n].iter_mut().zip(kr) {
                *dst = w * kv;
            }
        }
        let gl = last.exp();
        st.iter_mut().for_each(|v| *v *= gl);
        gemm_strided(n, n, c, &kd, 1, n, &dd, n, 1, st, n, true, false)?;
        t0 += c;
    }
    Ok(())
}

/// Sizes and flags of one LSTM call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LstmSpec {
    /// Batch size B.
    pub batch: usize,
    /// Steps S.
    pub seq: usize,
    /// Input width of layer 0.
    pub input: usize,
    /// Hidden width H.
    pub hidden: usize,
    /// Stacked layers L (at least 1).
    pub layers: usize,
    /// Whether each layer also runs backward (D = 2).
    pub bidirectional: bool,
}

/// Multi-layer LSTM: `x [B, S, in]`, `w_ih [L*D, 4H, max(in, D*H)]`,
/// `w_hh [L*D, 4H, H]`, `bias [L*D, 4H]`, optional `(h0, c0)` each
/// `[L*D, B, H]`; writes the last layer's hidden states `out [B, S, D*H]`
/// (forward in `0..H`, backward in `H..2H`). Gate order i, f, g, o.
#[allow(clippy::too_many_arguments)]
pub fn lstm(
    spec: &LstmSpec,
    x: &[f32],
    w_ih: &[f32],
    w_hh: &[f32],
    bias: &[f32],
    state: Option<(&[f32], &[f32])>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let LstmSpec {
        batch: bsz,
        seq,
        input,
        hidden: hh,
        layers,
        bidirectional,
    } = *spec;
    if layers == 0 {
        return Err(bad_shape(LSTM, "0 layers (expected at least 1)"));
    }
    let dirs = if bidirectional { 2 } else { 1 };
    let ld = layers * dirs;
    let max_in = input.max(dirs * hh);
    exact_len(LSTM, "x", x.len(), bsz * seq * input)?;
    exact_len(LSTM, "w_ih", w_ih.len(), ld * 4 * hh * max_in)?;
    exact_len(LSTM, "w_hh", w_hh.len(), ld * 4 * hh * hh)?;
    exact_len(LSTM, "bias", bias.len(), ld * 4 * hh)?;
    if let Some((h0, c0)) = state {
        exact_len(LSTM, "h0", h0.len(), ld * bsz * hh)?;
        exact_len(LSTM, "c0", c0.len(), ld * bsz * hh)?;
    }
    exact_len(LSTM, "output", out.len(), bsz * seq * dirs * hh)?;
    if out.is_empty() {
        return Ok(());
    }
    let g4 = 4 * hh;
    let mut layer_in: Vec<f32> = x.to_vec();
    let mut in_w = input;
    let mut xproj = vec![0.0f32; bsz * seq * g4];
    let mut gates = vec![0.0f32; bsz * g4];
    let mut h = vec![0.0f32; bsz * hh];
    let mut c = vec![0.0f32; bsz * hh];
    for l in 0..layers {
        let mut layer_out = vec![0.0f32; bsz * seq * dirs * hh];
        for dir in 0..dirs {
            let ldi = l * dirs + dir;
            let wi = &w_ih[ldi * g4 * max_in..(ldi + 1) * g4 * max_in];
            let wh = &w_hh[ldi * g4 * hh..(ldi + 1) * g4 * hh];
            let bs = &bias[ldi * g4..(ldi + 1) * g4];
            // Input projection of every step at once: [B*S, in] x w_ih^T.
            let par = bsz * seq * g4 * in_w >= PAR_MIN_ELEMS * 16;
            gemm_bt(
                bsz * seq,
                g4,
                in_w,
                &layer_in,
                in_w,
                wi,
                max_in,
                &mut xproj,
                g4,
                false,
                par,
            )?;
            for row in xproj.chunks_exact_mut(g4) {
                for (r, &bv) in row.iter_mut().zip(bs) {
                    *r += bv;
                }
            }
            match state {
                Some((h0, c0)) => {
                    let so = ldi * bsz * hh;
                    h.copy_from_slice(&h0[so..so + bsz * hh]);
                    c.copy_from_slice(&c0[so..so + bsz * hh]);
                }
                None => {
                    h.fill(0.0);
                    c.fill(0.0);
                }
            }
            for step in 0..seq {
                let t = if dir == 0 { step } else { seq - 1 - step };
                for b in 0..bsz {
                    let src = (b * seq + t) * g4;
                    gates[b * g4..(b + 1) * g4].copy_from_slice(&xproj[src..src + g4]);
                }
                // gates += h w_hh^T.
                gemm_bt(bsz, g4, hh, &h, hh, wh, hh, &mut gates, g4, true, false)?;
                for b in 0..bsz {
                    lstm_cell(
                        &gates[b * g4..(b + 1) * g4],
                        &mut h[b * hh..(b + 1) * hh],
                        &mut c[b * hh..(b + 1) * hh],
                    );
                    let oo = (b * seq + t) * dirs * hh + dir * hh;
                    layer_out[oo..oo + hh].copy_from_slice(&h[b * hh..(b + 1) * hh]);
                }
            }
        }
        layer_in = layer_out;
        in_w = dirs * hh;
    }
    out.copy_from_slice(&layer_in);
    Ok(())
}

simd_dispatch! {
    /// One LSTM cell update from pre-activation gates `[i | f | g | o]`.
    fn lstm_cell(gates: &[f32], h: &mut [f32], c: &mut [f32]) {
        let hh = h.len();
        let (gi, rest) = gates.split_at(hh);
        let (gf, rest) = rest.split_at(hh);
        let (gg, go) = rest.split_at(hh);
        for u in 0..hh {
            let ig = simd::sigmoid(gi[u]);
            let fg = simd::sigmoid(gf[u]);
            let g = simd::tanh(gg[u]);
            let og = simd::sigmoid(go[u]);
            c[u] = fg * c[u] + ig * g;
            h[u] = og * simd::tanh(c[u]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn f32(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
            (0..n).map(|_| self.f32() * s).collect()
        }
    }

    /// Inputs with L2-normalized q and k rows, g in (-0.5, 0), beta in (0, 1).
    #[allow(clippy::type_complexity)]
    fn inputs(
        d: &GdnDims,
        seed: u64,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut r = Rng(seed | 1);
        let act = d.batch * d.seq * d.heads * d.n;
        let gates = d.batch * d.seq * d.heads;
        let norm = |mut x: Vec<f32>| {
            for row in x.chunks_exact_mut(d.n) {
                let s = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                row.iter_mut().for_each(|v| *v /= s);
            }
            x
        };
        let q = norm(r.vec(act, 1.0));
        let k = norm(r.vec(act, 1.0));
        let v = r.vec(act, 1.0);
        let g: Vec<f32> = r.vec(gates, 0.25).iter().map(|x| x - 0.25).collect();
        let beta: Vec<f32> = r.vec(gates, 0.5).iter().map(|x| x + 0.5).collect();
        let s0 = r.vec(d.batch * d.heads * d.n * d.n, 0.5);
        (q, k, v, g, beta, s0)
    }

    /// Naive f64 recurrence, straight from the formula.
    #[allow(clippy::needless_range_loop)]
    fn naive(
        d: &GdnDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        s0: &[f32],
    ) -> Vec<f64> {
        let n = d.n;
        let rows = d.seq + n;
        let mut out = vec![0.0f64; d.batch * rows * d.heads * n];
        for b in 0..d.batch {
            for h in 0..d.heads {
                let so = (b * d.heads + h) * n * n;
                let mut st: Vec<f64> = s0[so..so + n * n].iter().map(|&x| x as f64).collect();
                for t in 0..d.seq {
                    let gi = (b * d.seq + t) * d.heads + h;
                    let vo = gi * n;
                    let a = (g[gi] as f64).exp();
                    st.iter_mut().for_each(|x| *x *= a);
                    let mut dl = vec![0.0; n];
                    for j in 0..n {
                        let skj: f64 = (0..n).map(|i| st[i * n + j] * k[vo + i] as f64).sum();
                        dl[j] = beta[gi] as f64 * (v[vo + j] as f64 - skj);
                    }
                    for i in 0..n {
                        for j in 0..n {
                            st[i * n + j] += k[vo + i] as f64 * dl[j];
                        }
                    }
                    for j in 0..n {
                        let sq: f64 = (0..n).map(|i| st[i * n + j] * q[vo + i] as f64).sum();
                        out[((b * rows + t) * d.heads + h) * n + j] = sq / (n as f64).sqrt();
                    }
                }
                for i in 0..n {
                    for j in 0..n {
                        out[((b * rows + d.seq + i) * d.heads + h) * n + j] = st[i * n + j];
                    }
                }
            }
        }
        out
    }

    fn max_err(a: &[f32], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y).abs() / y.abs().max(1.0))
            .fold(0.0, f64::max)
    }

    fn run(d: &GdnDims, form: GdnForm, seed: u64) -> (Vec<f32>, Vec<f64>) {
        let (q, k, v, g, beta, s0) = inputs(d, seed);
        let mut out = vec![f32::NAN; d.batch * (d.seq + d.n) * d.heads * d.n];
        gated_delta_net(d, &q, &k, &v, &g, &beta, Some(&s0), form, &mut out).unwrap();
        (out, naive(d, &q, &k, &v, &g, &beta, &s0))
    }

    #[test]
    fn recurrent_and_chunked_match_naive_and_each_other() {
        for (d, chunk) in [
            (
                GdnDims {
                    batch: 2,
                    seq: 37,
                    heads: 3,
                    n: 16,
                },
                8,
            ),
            (
                GdnDims {
                    batch: 1,
                    seq: 130,
                    heads: 2,
                    n: 32,
                },
                64,
            ),
            (
                GdnDims {
                    batch: 1,
                    seq: 5,
                    heads: 1,
                    n: 8,
                },
                64,
            ),
            (
                GdnDims {
                    batch: 2,
                    seq: 64,
                    heads: 2,
                    n: 128,
                },
                64,
            ),
        ] {
            let (rec, want) = run(&d, GdnForm::Recurrent, 11);
            let (chk, _) = run(&d, GdnForm::Chunked(chunk), 11);
            let (er, ec) = (max_err(&rec, &want), max_err(&chk, &want));
            assert!(er < 1e-5, "{d:?}: recurrent vs naive {er:e}");
            assert!(ec < 1e-5, "{d:?}: chunked({chunk}) vs naive {ec:e}");
            let between = rec
                .iter()
                .zip(&chk)
                .map(|(&a, &b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0.0f32, f32::max);
            assert!(between < 1e-5, "{d:?}: recurrent vs chunked {between:e}");
        }
    }

    #[test]
    fn no_state_output_equals_state_output_prefix() {
        let d = GdnDims {
            batch: 1,
            seq: 20,
            heads: 2,
            n: 8,
        };
        let (q, k, v, g, beta, _) = inputs(&d, 5);
        let zeros = vec![0.0; d.heads * d.n * d.n];
        let mut a = vec![0.0; d.seq * d.heads * d.n];
        let mut b = vec![0.0; (d.seq + d.n) * d.heads * d.n];
        gated_delta_net(&d, &q, &k, &v, &g, &beta, None, GdnForm::Auto, &mut a).unwrap();
        gated_delta_net(
            &d,
            &q,
            &k,
            &v,
            &g,
            &beta,
            Some(&zeros),
            GdnForm::Auto,
            &mut b,
        )
        .unwrap();
        assert_eq!(a[..], b[..a.len()]);
        assert!(a.iter().any(|&x| x != 0.0));
    }

    #[test]
    fn bad_lengths_are_errors() {
        let d = GdnDims {
            batch: 1,
            seq: 2,
            heads: 1,
            n: 4,
        };
        let x = vec![0.0; 8];
        let mut out = vec![0.0; 8];
        let e = gated_delta_net(
            &d,
            &x,
            &x,
            &x,
            &[0.0; 3],
            &[0.0; 2],
            None,
            GdnForm::Auto,
            &mut out,
        );
        assert!(matches!(e, Err(KernelError::BadBuffer { .. })), "{e:?}");
        let e = gated_delta_net(
            &d,
            &x,
            &x,
            &x,
            &[0.0; 2],
            &[0.0; 2],
            None,
            GdnForm::Chunked(0),
            &mut out,
        );
        assert!(matches!(e, Err(KernelError::BadShape { .. })), "{e:?}");
        let spec = LstmSpec {
            batch: 1,
            seq: 2,
            input: 3,
            hidden: 2,
            layers: 1,
            bidirectional: false,
        };
        let e = lstm(
            &spec,
            &[0.0; 6],
            &[0.0; 8 * 3],
            &[0.0; 16],
            &[0.0; 7],
            None,
            &mut [0.0; 4],
        );
        assert!(matches!(e, Err(KernelError::BadBuffer { .. })), "{e:?}");
    }
}
