//! Sequence ops: rotary embedding, attention, gated delta-net and LSTM.

use crate::math::sigmoid;
use crate::value::{prod, Value};
use rlx_ir::{contiguous_strides, MaskKind, RopeStyle};

/// Rotary embedding of `x [B, S, H*head_dim]` at integer `pos [S]` or `[B, S]`.
pub(crate) fn rope(
    x: &Value,
    pos: &Value,
    freqs: Option<&Value>,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    style: RopeStyle,
) -> Value {
    let (b, s, width) = (x.dims[0], x.dims[1], x.dims[2]);
    let heads = width / head_dim;
    let p = pos.ints();
    let per_batch = pos.dims.len() == 2;
    let half = n_rot / 2;
    let theta = f64::from(theta);
    let divisors: Vec<f64> = match freqs {
        Some(f) => f.floats().into_owned(),
        None => vec![1.0; half],
    };
    let mut out = x.floats().into_owned();
    for bi in 0..b {
        for si in 0..s {
            let position = p[if per_batch { bi * s + si } else { si }] as f64;
            for h in 0..heads {
                let base = (bi * s + si) * width + h * head_dim;
                for i in 0..half {
                    let angle = position * theta.powf(-2.0 * i as f64 / n_rot as f64) / divisors[i];
                    let (sin, cos) = angle.sin_cos();
                    let (ia, ib) = match style {
                        RopeStyle::NeoX => (base + i, base + i + half),
                        RopeStyle::GptJ => (base + 2 * i, base + 2 * i + 1),
                    };
                    let (a, c) = (out[ia], out[ib]);
                    out[ia] = a * cos - c * sin;
                    out[ib] = a * sin + c * cos;
                }
            }
        }
    }
    Value::float(&x.dims, out)
}

/// Attributes of `Op::Attention`.
pub(crate) struct AttnParams {
    pub num_heads: usize,
    pub head_dim: usize,
    pub mask_kind: MaskKind,
    pub score_scale: Option<f32>,
    pub softcap: Option<f32>,
}

/// Scaled dot-product attention; inputs q, k, v and the mask for Custom/Bias.
pub(crate) fn attention(ins: &[&Value], p: &AttnParams) -> Value {
    let (q, k, v) = (ins[0].floats(), ins[1].floats(), ins[2].floats());
    let (b, sq) = (ins[0].dims[0], ins[0].dims[1]);
    let sk = ins[1].dims[1];
    let (hq, d) = (p.num_heads, p.head_dim);
    let hkv = ins[1].dims[2] / d;
    let group = hq / hkv;
    let scale = p.score_scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let mask = ins
        .get(3)
        .map(|m| (m.floats().into_owned(), m.dims.clone()));
    // Strides of the Bias input broadcast to [B, H, S_q, S_k]: 0 on size-1 axes.
    let bias_strides: Vec<usize> = match &mask {
        Some((_, dims)) if p.mask_kind == MaskKind::Bias => contiguous_strides(dims)
            .iter()
            .zip(dims)
            .map(|(&st, &n)| if n == 1 { 0 } else { st })
            .collect(),
        _ => vec![0; 4],
    };
    let offset = sk as i64 - sq as i64;
    let mut out = vec![0.0; b * sq * hq * d];
    let mut scores = vec![0.0; sk];
    let mut keep = vec![false; sk];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..sq {
                let qo = (bi * sq + i) * hq * d + h * d;
                for j in 0..sk {
                    let ko = (bi * sk + j) * hkv * d + kh * d;
                    let dot: f64 = (0..d).map(|t| q[qo + t] * k[ko + t]).sum();
                    let mut s = dot * scale;
                    if let Some(c) = p.softcap {
                        let c = f64::from(c);
                        s = c * (s / c).tanh();
                    }
                    let (ii, jj) = (i as i64, j as i64);
                    keep[j] = match p.mask_kind {
                        MaskKind::None => true,
                        MaskKind::Causal => jj <= ii + offset,
                        MaskKind::SlidingWindow(w) => {
                            jj <= ii + offset && jj > ii + offset - w as i64
                        }
                        MaskKind::Custom => {
                            mask.as_ref().is_some_and(|(m, _)| m[bi * sk + j] != 0.0)
                        }
                        MaskKind::Bias => {
                            if let Some((m, _)) = &mask {
                                let st = &bias_strides;
                                s += m[bi * st[0] + h * st[1] + i * st[2] + j * st[3]];
                            }
                            s != f64::NEG_INFINITY
                        }
                    };
                    scores[j] = s;
                }
                let max = (0..sk)
                    .filter(|&j| keep[j])
                    .map(|j| scores[j])
                    .fold(f64::NEG_INFINITY, crate::math::max_nan);
                if max == f64::NEG_INFINITY {
                    continue; // every key masked: the row stays zero
                }
                let mut sum = 0.0;
                for j in 0..sk {
                    scores[j] = if keep[j] {
                        (scores[j] - max).exp()
                    } else {
                        0.0
                    };
                    sum += scores[j];
                }
                let oo = qo;
                for j in 0..sk {
                    let w = scores[j] / sum;
                    let vo = (bi * sk + j) * hkv * d + kh * d;
                    for t in 0..d {
                        out[oo + t] += w * v[vo + t];
                    }
                }
            }
        }
    }
    Value::float(&ins[0].dims, out)
}

/// Gated delta-rule recurrence (see the crate docs for the formula).
pub(crate) fn gated_delta_net(
    ins: &[&Value],
    n: usize,
    carry_state: bool,
    out_dims: &[usize],
) -> Value {
    let (q, k, v) = (ins[0].floats(), ins[1].floats(), ins[2].floats());
    let (g, beta) = (ins[3].floats(), ins[4].floats());
    let (b, s, h) = (ins[0].dims[0], ins[0].dims[1], ins[0].dims[2]);
    let init = if carry_state {
        Some(ins[5].floats())
    } else {
        None
    };
    let rows = out_dims[1]; // S, or S + n with carry_state
    let mut out = vec![0.0; prod(out_dims)];
    let inv_sqrt_n = 1.0 / (n as f64).sqrt();
    let mut st = vec![0.0f64; n * n];
    let mut delta = vec![0.0f64; n];
    for bi in 0..b {
        for hi in 0..h {
            let so = (bi * h + hi) * n * n;
            match &init {
                Some(s0) => st.copy_from_slice(&s0[so..so + n * n]),
                None => st.iter_mut().for_each(|x| *x = 0.0),
            }
            for t in 0..s {
                let gi = (bi * s + t) * h + hi;
                let vo = gi * n; // q, k, v [B, S, H, n] share this offset
                let decay = g[gi].exp();
                st.iter_mut().for_each(|x| *x *= decay);
                for j in 0..n {
                    let stk: f64 = (0..n).map(|i| st[i * n + j] * k[vo + i]).sum();
                    delta[j] = beta[gi] * (v[vo + j] - stk);
                }
                for i in 0..n {
                    for j in 0..n {
                        st[i * n + j] += k[vo + i] * delta[j];
                    }
                }
                let oo = ((bi * rows + t) * h + hi) * n;
                for j in 0..n {
                    let stq: f64 = (0..n).map(|i| st[i * n + j] * q[vo + i]).sum();
                    out[oo + j] = stq * inv_sqrt_n;
                }
            }
            if carry_state {
                for i in 0..n {
                    let oo = ((bi * rows + s + i) * h + hi) * n;
                    out[oo..oo + n].copy_from_slice(&st[i * n..(i + 1) * n]);
                }
            }
        }
    }
    Value::float(out_dims, out)
}

/// Multi-layer, optionally bidirectional LSTM; packing in the crate docs.
pub(crate) fn lstm(
    ins: &[&Value],
    hidden: usize,
    layers: usize,
    bidirectional: bool,
    carry: bool,
) -> Value {
    let x = ins[0];
    let (w_ih, w_hh, bias) = (ins[1].floats(), ins[2].floats(), ins[3].floats());
    let states = carry.then(|| (ins[4].floats(), ins[5].floats()));
    let (b, s) = (x.dims[0], x.dims[1]);
    let dirs = if bidirectional { 2 } else { 1 };
    let hh = hidden;
    let max_in = ins[1].dims[2];
    let mut layer_in = x.floats().into_owned();
    let mut in_w = x.dims[2];
    let mut gates = vec![0.0f64; 4 * hh];
    for l in 0..layers {
        let mut out = vec![0.0f64; b * s * dirs * hh];
        for dir in 0..dirs {
            let ld = l * dirs + dir;
            let wi = &w_ih[ld * 4 * hh * max_in..(ld + 1) * 4 * hh * max_in];
            let wh = &w_hh[ld * 4 * hh * hh..(ld + 1) * 4 * hh * hh];
            let bs = &bias[ld * 4 * hh..(ld + 1) * 4 * hh];
            for bi in 0..b {
                let so = (ld * b + bi) * hh;
                let (mut h, mut c) = match &states {
                    Some((h0, c0)) => (h0[so..so + hh].to_vec(), c0[so..so + hh].to_vec()),
                    None => (vec![0.0; hh], vec![0.0; hh]),
                };
                for step in 0..s {
                    let t = if dir == 0 { step } else { s - 1 - step };
                    let xt = &layer_in[(bi * s + t) * in_w..(bi * s + t + 1) * in_w];
                    for (r, gate) in gates.iter_mut().enumerate() {
                        let from_x: f64 = (0..in_w).map(|p| wi[r * max_in + p] * xt[p]).sum();
                        let from_h: f64 = (0..hh).map(|p| wh[r * hh + p] * h[p]).sum();
                        *gate = bs[r] + from_x + from_h;
                    }
                    for u in 0..hh {
                        let ig = sigmoid(gates[u]);
                        let fg = sigmoid(gates[hh + u]);
                        let gg = gates[2 * hh + u].tanh();
                        let og = sigmoid(gates[3 * hh + u]);
                        c[u] = fg * c[u] + ig * gg;
                        h[u] = og * c[u].tanh();
                    }
                    let oo = (bi * s + t) * dirs * hh + dir * hh;
                    out[oo..oo + hh].copy_from_slice(&h);
                }
            }
        }
        layer_in = out;
        in_w = dirs * hh;
    }
    Value::float(&[b, s, dirs * hh], layer_in)
}
