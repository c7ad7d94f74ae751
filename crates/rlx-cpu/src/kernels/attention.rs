//! Scaled dot-product attention on `[B, S, H*D]` rows with arbitrary row
//! strides (so q/k/v can be read straight out of a packed QKV buffer).
//!
//! Semantics (op.rs): `s = (q . k) * scale`, then softcap `c * tanh(s / c)`,
//! then the mask, then softmax over keys; query head `h` reads kv head
//! `h / (Hq / Hkv)`; a query row whose keys are all masked outputs zeros.

use super::simd::{self, simd_dispatch};
use super::softmax::scale as scale_slice;
use super::{bad_shape, need_len, par_rows, KernelError};
use rlx_ir::MaskKind;

const OP: &str = "Attention";

/// Sizes, strides and options of one attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionParams {
    /// Batch size B.
    pub batch: usize,
    /// Query length S_q.
    pub seq_q: usize,
    /// Key/value length S_k.
    pub seq_k: usize,
    /// Query heads Hq.
    pub num_heads: usize,
    /// Key/value heads Hkv (divides Hq).
    pub num_kv_heads: usize,
    /// Dims per head D.
    pub head_dim: usize,
    /// Score multiplier (usually `1/sqrt(D)`).
    pub scale: f32,
    /// Logit soft-cap `c`: scores become `c * tanh(s / c)` before masking.
    pub softcap: Option<f32>,
    /// Mask kind; `Custom`/`Bias` need the matching [`AttnMask`].
    pub mask_kind: MaskKind,
    /// Elements between consecutive q rows (`(b, s)` -> `(b, s + 1)`), >= Hq*D.
    pub q_row_stride: usize,
    /// Elements between consecutive k rows, >= Hkv*D.
    pub k_row_stride: usize,
    /// Elements between consecutive v rows, >= Hkv*D.
    pub v_row_stride: usize,
    /// Elements between consecutive output rows, >= Hq*D.
    pub out_row_stride: usize,
}

/// The mask operand of an attention call.
#[derive(Debug, Clone, Copy)]
pub enum AttnMask<'a> {
    /// No mask operand (`None`, `Causal`, `SlidingWindow`).
    None,
    /// `Custom` keep-mask `[B, S_k]`, f32: non-zero keeps the key.
    KeepF32(&'a [f32]),
    /// `Custom` keep-mask `[B, S_k]`, u8/bool: non-zero keeps the key.
    KeepU8(&'a [u8]),
    /// `Bias`: additive f32 bias with `dims` broadcastable to `[B, Hq, S_q, S_k]`.
    Bias {
        /// Row-major bias values.
        data: &'a [f32],
        /// Bias dims; each is 1 or the full size.
        dims: [usize; 4],
    },
}

/// Element strides of a broadcast `[B, H, S_q, S_k]` bias (0 on size-1 dims).
fn bias_strides(dims: [usize; 4]) -> [usize; 4] {
    let mut s = [0; 4];
    let mut acc = 1;
    for i in (0..4).rev() {
        s[i] = if dims[i] == 1 { 0 } else { acc };
        acc *= dims[i];
    }
    s
}

fn span(rows: usize, stride: usize, width: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (rows - 1) * stride + width
    }
}

fn validate(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    out_len: usize,
) -> Result<(), KernelError> {
    let (hq, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    if hq == 0 || hkv == 0 || d == 0 || hq % hkv != 0 {
        return Err(bad_shape(
            OP,
            format!("expected Hq ({hq}) a positive multiple of Hkv ({hkv}) and head_dim ({d}) > 0"),
        ));
    }
    let (qw, kw) = (hq * d, hkv * d);
    if p.q_row_stride < qw || p.out_row_stride < qw || p.k_row_stride < kw || p.v_row_stride < kw {
        return Err(bad_shape(
            OP,
            format!(
                "row strides q {} / out {} must be >= {qw} and k {} / v {} >= {kw}",
                p.q_row_stride, p.out_row_stride, p.k_row_stride, p.v_row_stride
            ),
        ));
    }
    let (rq, rk) = (p.batch * p.seq_q, p.batch * p.seq_k);
    need_len(OP, "q", q.len(), span(rq, p.q_row_stride, qw))?;
    need_len(OP, "k", k.len(), span(rk, p.k_row_stride, kw))?;
    need_len(OP, "v", v.len(), span(rk, p.v_row_stride, kw))?;
    need_len(OP, "output", out_len, span(rq, p.out_row_stride, qw))?;
    match (p.mask_kind, mask) {
        (MaskKind::Custom, AttnMask::KeepF32(m)) => need_len(OP, "mask", m.len(), rk)?,
        (MaskKind::Custom, AttnMask::KeepU8(m)) => need_len(OP, "mask", m.len(), rk)?,
        (MaskKind::Bias, AttnMask::Bias { data, dims }) => {
            let full = [p.batch, hq, p.seq_q, p.seq_k];
            if dims.iter().zip(&full).any(|(&a, &f)| a != 1 && a != f) {
                return Err(bad_shape(
                    OP,
                    format!("bias dims {dims:?} do not broadcast to {full:?}"),
                ));
            }
            need_len(OP, "bias", data.len(), dims.iter().product())?;
        }
        (MaskKind::SlidingWindow(0), _) => {
            return Err(bad_shape(OP, "sliding window of 0 keys"));
        }
        (MaskKind::None | MaskKind::Causal | MaskKind::SlidingWindow(_), AttnMask::None) => {}
        (kind, m) => {
            return Err(bad_shape(
                OP,
                format!(
                    "mask kind {kind:?} does not match the mask operand {}",
                    match m {
                        AttnMask::None => "none",
                        AttnMask::KeepF32(_) => "f32 keep-mask",
                        AttnMask::KeepU8(_) => "u8 keep-mask",
                        AttnMask::Bias { .. } => "bias",
                    }
                ),
            ))
        }
    }
    Ok(())
}

/// Keys `lo..hi` that query row `i` may see under a structural mask.
#[inline(always)]
fn key_range(kind: MaskKind, i: usize, sq: usize, sk: usize) -> (usize, usize) {
    let last = i as i64 + sk as i64 - sq as i64; // last visible key
    let clamp = |x: i64| x.clamp(0, sk as i64) as usize;
    match kind {
        MaskKind::Causal => (0, clamp(last + 1)),
        MaskKind::SlidingWindow(w) => (clamp(last - w as i64 + 1), clamp(last + 1)),
        _ => (0, sk),
    }
}

simd_dispatch! {
    /// Rows `row0..` of the flattened `(b, s_q)` index into `out` (which
    /// starts at row `row0`); all heads.
    fn attend_rows(
        p: &AttentionParams,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &AttnMask<'_>,
        out: &mut [f32],
        row0: usize,
    ) {
        let (d, sq, sk) = (p.head_dim, p.seq_q, p.seq_k);
        let group = p.num_heads / p.num_kv_heads;
        let ors = p.out_row_stride;
        let nrows = out.len().div_ceil(ors);
        let mut scores = vec![0.0f32; sk];
        let bias = match *mask {
            AttnMask::Bias { data, dims } => Some((data, bias_strides(dims))),
            _ => None,
        };
        for h in 0..p.num_heads {
            let hk = h / group;
            for r in 0..nrows {
                let row = row0 + r;
                let (b, i) = (row / sq, row % sq);
                let orow = &mut out[r * ors + h * d..r * ors + (h + 1) * d];
                let (lo, hi) = key_range(p.mask_kind, i, sq, sk);
                if lo >= hi {
                    orow.fill(0.0);
                    continue;
                }
                let qo = row * p.q_row_stride + h * d;
                let qrow = &q[qo..qo + d];
                let sc = &mut scores[lo..hi];
                for (jj, s) in sc.iter_mut().enumerate() {
                    let ko = (b * sk + lo + jj) * p.k_row_stride + hk * d;
                    *s = simd::dot(qrow, &k[ko..ko + d]) * p.scale;
                }
                if let Some(c) = p.softcap {
                    let inv = 1.0 / c;
                    for s in sc.iter_mut() {
                        *s = c * simd::tanh(*s * inv);
                    }
                }
                match *mask {
                    AttnMask::KeepF32(m) => {
                        for (s, &keep) in sc.iter_mut().zip(&m[b * sk + lo..b * sk + hi]) {
                            if keep == 0.0 {
                                *s = f32::NEG_INFINITY;
                            }
                        }
                    }
                    AttnMask::KeepU8(m) => {
                        for (s, &keep) in sc.iter_mut().zip(&m[b * sk + lo..b * sk + hi]) {
                            if keep == 0 {
                                *s = f32::NEG_INFINITY;
                            }
                        }
                    }
                    _ => {}
                }
                if let Some((data, st)) = bias {
                    let base = b * st[0] + h * st[1] + i * st[2];
                    if st[3] == 0 {
                        let add = data[base];
                        for s in sc.iter_mut() {
                            *s += add;
                        }
                    } else {
                        for (s, &add) in sc.iter_mut().zip(&data[base + lo..base + hi]) {
                            *s += add;
                        }
                    }
                }
                let m = simd::max_slice(sc);
                if m == f32::NEG_INFINITY {
                    orow.fill(0.0);
                    continue;
                }
                let mut total = 0.0f32;
                for s in sc.iter_mut() {
                    *s = simd::exp(*s - m);
                    total += *s;
                }
                orow.fill(0.0);
                for (jj, &w) in sc.iter().enumerate() {
                    let vo = (b * sk + lo + jj) * p.v_row_stride + hk * d;
                    simd::axpy(w, &v[vo..vo + d], orow);
                }
                scale_slice(orow, 1.0 / total);
            }
        }
    }
}

/// Attention over all `(b, s_q)` rows and heads. `q[(b*S_q + s) *
/// q_row_stride + h*D + e]` is element `e` of head `h` of query `(b, s)`;
/// k, v and out are addressed the same way with their own strides.
/// With `parallel`, rows are split over the rayon pool when the work is
/// large enough. Output elements between heads' rows (stride padding) are
/// not touched.
pub fn attention(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: AttnMask<'_>,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    validate(p, q, k, v, &mask, out.len())?;
    let rows = p.batch * p.seq_q;
    if rows == 0 {
        return Ok(());
    }
    let need = span(rows, p.out_row_stride, p.num_heads * p.head_dim);
    let out = &mut out[..need];
    let cost = p.num_heads * p.seq_k.max(1) * p.head_dim * 2;
    if parallel {
        par_rows(out, p.out_row_stride, cost, |r0, chunk| {
            attend_rows(p, q, k, v, &mask, chunk, r0);
        });
    } else {
        attend_rows(p, q, k, v, &mask, out, 0);
    }
    Ok(())
}
