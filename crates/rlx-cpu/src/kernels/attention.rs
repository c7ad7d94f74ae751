//! Scaled dot-product attention on `[B, S, H*D]` rows with arbitrary row
//! strides (so q/k/v can be read straight out of a packed QKV buffer).
//!
//! Semantics (op.rs): `s = (q . k) * scale`, then softcap `c * tanh(s / c)`,
//! then the mask, then softmax over keys; query head `h` reads kv head
//! `h / (Hq / Hkv)`; a query row whose keys are all masked outputs zeros.

use super::matmul::gemm_strided;
use super::packed_gemm::{
    gemm_packed_window, gemm_packed_window_a16, prefetch, prefetch_l2, round_bf16, PackedB, NR,
};
use super::simd::{self, simd_dispatch};
use super::softmax::scale as scale_slice;
use super::{bad_shape, need_len, num_threads, KernelError, PAR_MIN_ELEMS};
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
    /// Multiply `q . k` and probabilities times `v` in bf16 (operands
    /// rounded to bf16, exact products, f32 sums: the opt-in bf16
    /// precision of the matmuls, `CpuOptions::bf16`) where the packed
    /// path runs (`S_q >= 16` query rows: prefill and encoders). The
    /// softmax stays in f32, and so do the few-query paths (decode).
    pub bf16: bool,
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

/// Raw `q . k` scores of keys `lo..lo + sc.len()` for query row `i` of
/// batch `b`, head `h`, in place: scale, softcap, then the mask (a masked
/// key becomes `-inf`, a bias adds).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn adjust_scores<M: simd::Fma>(
    p: &AttentionParams,
    mask: &AttnMask<'_>,
    sc: &mut [f32],
    b: usize,
    h: usize,
    i: usize,
    lo: usize,
) {
    let hi = lo + sc.len();
    for s in sc.iter_mut() {
        *s *= p.scale;
    }
    if let Some(c) = p.softcap {
        let inv = 1.0 / c;
        for s in sc.iter_mut() {
            *s = c * simd::tanh_m::<M>(*s * inv);
        }
    }
    let sk = p.seq_k;
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
        AttnMask::Bias { data, dims } => {
            let st = bias_strides(dims);
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
        AttnMask::None => {}
    }
}

simd_dispatch! {
    /// Turn one block's raw `q . k` rows (`scores`, `rows x nk`, keys
    /// `klo..klo+nk`) into normalized probabilities: scale, softcap, mask,
    /// softmax. Keys outside a row's visible range, and rows with no
    /// visible key, get probability 0.
    ///
    /// With `inv`, rows are left unnormalized (`e^(s - max)`) and `inv[r]`
    /// gets `1 / sum` (0 for a row with no visible key), for the caller to
    /// scale the row's `d`-wide output instead of its `nk` probabilities.
    fn probs_rows(
        p: &AttentionParams,
        mask: &AttnMask<'_>,
        scores: &mut [f32],
        nk: usize,
        b: usize,
        h: usize,
        i0: usize,
        klo: usize,
        inv: Option<&mut [f32]>,
    ) {
        let mut inv = inv;
        let mut finish = |r: usize, sc: &mut [f32], total: f32| match inv.as_deref_mut() {
            Some(inv) => inv[r] = 1.0 / total,
            None => scale_slice(sc, 1.0 / total),
        };
        let (sq, sk) = (p.seq_q, p.seq_k);
        // No mask operand (callers pass `None` when every key of the window
        // is kept), no softcap, positive scale: the single-pass form below.
        let plain = matches!(mask, AttnMask::None) && p.softcap.is_none() && p.scale > 0.0;
        for (r, row) in scores.chunks_exact_mut(nk).enumerate() {
            let i = i0 + r;
            let (lo, hi) = key_range(p.mask_kind, i, sq, sk);
            // The block may cover fewer keys (trailing masked keys dropped).
            let hi = hi.min(klo + nk);
            if lo >= hi {
                row.fill(0.0);
                finish(r, row, f32::INFINITY);
                continue;
            }
            let (l, u) = (lo - klo, hi - klo);
            row[..l].fill(0.0);
            row[u..].fill(0.0);
            let sc = &mut row[l..u];
            if plain {
                // max(scale * s) = scale * max(s) for scale > 0, and the
                // scale folds into the exponent's FMA: one pass fewer.
                // NaNs are skipped here but reach the sum (e^NaN), so the
                // row still comes out NaN; an all-NaN or all -inf row takes
                // the general path.
                let m = M::max_num(sc);
                if m != f32::NEG_INFINITY {
                    let ms = m * p.scale;
                    for s in sc.iter_mut() {
                        *s = simd::exp_nonpos_m::<M>(M::fma(*s, p.scale, -ms));
                    }
                    let total = M::sum(sc);
                    finish(r, sc, total);
                    continue;
                }
            }
            adjust_scores::<M>(p, mask, sc, b, h, i, lo);
            let m = simd::max_slice(sc);
            if m == f32::NEG_INFINITY {
                sc.fill(0.0);
                finish(r, sc, f32::INFINITY);
                continue;
            }
            let total = super::softmax::exp_sub_sum_inplace::<M>(sc, m);
            finish(r, sc, total);
        }
    }
}

/// The mask to apply over keep-mask elements `j0..j1`: `None` when a
/// keep-mask keeps all of them (the common unpadded batch), which lets
/// `probs_rows` skip the mask and use its single-pass softmax.
fn window_mask<'a>(mask: &AttnMask<'a>, j0: usize, j1: usize) -> AttnMask<'a> {
    match *mask {
        AttnMask::KeepF32(m) if m[j0..j1].iter().all(|&x| x != 0.0) => AttnMask::None,
        AttnMask::KeepU8(m) if m[j0..j1].iter().all(|&x| x != 0) => AttnMask::None,
        other => other,
    }
}

/// Keys `klo..khi` that any of query rows `i0..i0 + rows` of batch `b` may
/// see (structural ranges, then trailing masked keys dropped: a decode
/// step over a preallocated KV cache costs the valid length, not the
/// capacity), with the mask to apply over them ([`window_mask`]).
fn visible_keys<'a>(
    p: &AttentionParams,
    mask: &AttnMask<'a>,
    b: usize,
    i0: usize,
    rows: usize,
) -> (usize, usize, AttnMask<'a>) {
    let (sq, sk) = (p.seq_q, p.seq_k);
    // Ranges grow with i.
    let klo = key_range(p.mask_kind, i0, sq, sk).0;
    let mut khi = key_range(p.mask_kind, i0 + rows - 1, sq, sk).1;
    let last_kept =
        |keep: &dyn Fn(usize) -> bool| (klo..khi).rev().find(|&j| keep(j)).map_or(klo, |j| j + 1);
    match *mask {
        AttnMask::KeepF32(m) => khi = last_kept(&|j| m[b * sk + j] != 0.0),
        AttnMask::KeepU8(m) => khi = last_kept(&|j| m[b * sk + j] != 0),
        _ => {}
    }
    let mask = window_mask(mask, b * sk + klo, b * sk + khi.max(klo));
    (klo, khi, mask)
}

/// Keys per task of one-query attention ([`attention_one_query`]). Fixed,
/// so that the bits never depend on the thread count.
const QUERY_CHUNK: usize = 32;

/// Fewest multiply-adds (`heads x keys x head_dim x 2`) for which a decode
/// step's attention splits its keys over the threads. A fork-join of the
/// pool costs several microseconds, about as long as one thread takes for
/// half a million multiply-adds here: SmolLM2's decode attention (9 heads
/// of 64, 64-192 keys) measured 16-19 us per layer split over 2 threads of
/// the 16-core Xeon, for ~0.1 M multiply-adds.
const ONE_QUERY_PAR_MIN: usize = 1 << 15;

simd_dispatch! {
    /// Keys `j0..j0 + n` (`n <= QUERY_CHUNK`) of the single query row of
    /// batch 0, every head: per head the chunk's scores (scale, softcap,
    /// mask as [`probs_rows`]), their largest value `m`, `e_j = exp(s_j -
    /// m)`, `l = Σ e_j` and `o = Σ e_j v_j`, written to `part` as
    /// `[m, l, o...]` (`head_dim + 2` floats per head). A chunk whose keys
    /// are all masked has `m = -inf`, `l = 0`, `o = 0`. Each head reads
    /// the chunk's K and V rows of its KV head, so the heads of a group
    /// find them in L1.
    fn one_query_chunk(
        p: &AttentionParams,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &AttnMask<'_>,
        j0: usize,
        n: usize,
        part: &mut [f32],
    ) {
        let d = p.head_dim;
        let group = p.num_heads / p.num_kv_heads;
        let mut buf = [0f32; QUERY_CHUNK];
        let sc = &mut buf[..n];
        let plain = matches!(mask, AttnMask::None) && p.softcap.is_none() && p.scale > 0.0;
        for (h, slot) in part.chunks_exact_mut(d + 2).enumerate() {
            let hk = h / group;
            M::dot_rows(&q[h * d..(h + 1) * d], &k[j0 * p.k_row_stride + hk * d..], p.k_row_stride, sc);
            let mut m = f32::NEG_INFINITY;
            if plain {
                // As in `probs_rows`: the scale folds into the exponent.
                let ms = M::max_num(sc) * p.scale;
                if ms != f32::NEG_INFINITY {
                    for s in sc.iter_mut() {
                        *s = simd::exp_nonpos_m::<M>(M::fma(*s, p.scale, -ms));
                    }
                    m = ms;
                }
            }
            if m == f32::NEG_INFINITY {
                adjust_scores::<M>(p, mask, sc, 0, h, 0, j0);
                m = simd::max_slice(sc);
                if m == f32::NEG_INFINITY {
                    slot.fill(0.0);
                    slot[0] = f32::NEG_INFINITY;
                    continue;
                }
                for s in sc.iter_mut() {
                    *s = simd::exp_nonpos_m::<M>(*s - m);
                }
            }
            let (ml, o) = slot.split_at_mut(2);
            ml[0] = m;
            ml[1] = M::sum(sc);
            o.fill(0.0);
            M::weighted_rows(sc, &v[j0 * p.v_row_stride + hk * d..], p.v_row_stride, o);
        }
    }
}

thread_local! {
    /// [`attention_one_query`]'s per-chunk partials, reused across calls.
    static QUERY_PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One query row of one batch (a decode step), split over the keys:
/// each task takes [`QUERY_CHUNK`] visible keys of every head, reading
/// the K and V rows in order (all KV heads of a row are adjacent), and
/// the chunks' partial softmaxes are combined per head as
/// `Σ_c e^(m_c - M) o_c / Σ_c e^(m_c - M) l_c`. The tasks spread one
/// head's long cache over every thread, which a task per head could not.
fn attention_one_query(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    let (d, hq) = (p.head_dim, p.num_heads);
    let (klo, khi, mask) = visible_keys(p, mask, 0, 0, 1);
    let out = &mut out[..hq * d];
    if klo >= khi {
        out.fill(0.0);
        return Ok(());
    }
    let nk = khi - klo;
    let chunks = nk.div_ceil(QUERY_CHUNK);
    let slot = hq * (d + 2);
    QUERY_PARTS.with(|cell| {
        // A model run that this thread picks up while it waits for the
        // loop below (rayon steals whole runs of other models on the
        // same pool) may call here again: it then uses a buffer of its own.
        let mut own = Vec::new();
        let mut held = cell.try_borrow_mut();
        let parts = match held.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut own,
        };
        parts.resize(chunks * slot, 0.0);
        let run = |(c, part): (usize, &mut [f32])| {
            let j0 = klo + c * QUERY_CHUNK;
            let n = QUERY_CHUNK.min(khi - j0);
            one_query_chunk(p, q, k, v, &mask, j0, n, part);
        };
        let work = hq * nk * d * 2;
        if parallel && chunks > 1 && super::team::threads() > 1 && work >= ONE_QUERY_PAR_MIN {
            super::team::for_each_chunk_mut(parts, slot, |c, part| run((c, part)));
        } else {
            parts.chunks_mut(slot).enumerate().for_each(run);
        }
        for (h, o) in out.chunks_exact_mut(d).enumerate() {
            let at = |c: usize| &parts[c * slot + h * (d + 2)..c * slot + (h + 1) * (d + 2)];
            let big = (0..chunks).fold(f32::NEG_INFINITY, |a, c| a.max(at(c)[0]));
            o.fill(0.0);
            if big == f32::NEG_INFINITY {
                continue;
            }
            let mut den = 0.0f32;
            for c in 0..chunks {
                let part = at(c);
                if part[0] == f32::NEG_INFINITY {
                    continue;
                }
                let w = (part[0] - big).exp();
                den += w * part[1];
                for (a, &x) in o.iter_mut().zip(&part[2..]) {
                    *a += w * x;
                }
            }
            let inv = 1.0 / den;
            o.iter_mut().for_each(|a| *a *= inv);
        }
    });
    Ok(())
}

/// Query rows `i0..i0+rows` of batch `b`, all heads, into `out` (which
/// starts at that block's first row). Scores come from one gemm per head
/// over the block's visible key range, probabilities times V from another,
/// written straight into the output rows.
#[allow(clippy::too_many_arguments)]
fn attend_block(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    (out, ors): (&mut [f32], usize),
    heads: std::ops::Range<usize>,
    b: usize,
    i0: usize,
    rows: usize,
    scores: &mut Vec<f32>,
) -> Result<(), KernelError> {
    let (d, sq, sk) = (p.head_dim, p.seq_q, p.seq_k);
    // Head h's columns start at (h - h0) * d of each `out` row.
    let h0 = heads.start;
    let group = p.num_heads / p.num_kv_heads;
    let (klo, khi, mask) = visible_keys(p, mask, b, i0, rows);
    let mask = &mask;
    if klo >= khi {
        for r in 0..rows {
            for h in heads.clone() {
                out[r * ors + (h - h0) * d..r * ors + (h - h0 + 1) * d].fill(0.0);
            }
        }
        return Ok(());
    }
    let nk = khi - klo;
    scores.clear();
    scores.resize(rows * nk, 0.0);
    if rows == 1 {
        // A decode step: dot products and axpys instead of two 1-row GEMMs
        // per head (whose setup dominated at these sizes).
        for h in heads {
            let o = &mut out[(h - h0) * d..(h - h0 + 1) * d];
            one_query_head(p, q, k, v, mask, o, h, b, i0, klo, scores);
        }
        return Ok(());
    }
    for h in heads {
        let hk = h / group;
        let qo = (b * sq + i0) * p.q_row_stride + h * d;
        let ko = (b * sk + klo) * p.k_row_stride + hk * d;
        let vo = (b * sk + klo) * p.v_row_stride + hk * d;
        // scores[r, j] = q[i0 + r] . k[klo + j]
        gemm_strided(
            rows,
            nk,
            d,
            &q[qo..],
            p.q_row_stride,
            1,
            &k[ko..],
            1,
            p.k_row_stride,
            scores,
            nk,
            false,
            false,
        )?;
        probs_rows(p, mask, scores, nk, b, h, i0, klo, None);
        // out[r, h] = sum_j P[r, j] v[klo + j]
        gemm_strided(
            rows,
            d,
            nk,
            scores,
            nk,
            1,
            &v[vo..],
            p.v_row_stride,
            1,
            &mut out[(h - h0) * d..],
            ors,
            false,
            false,
        )?;
    }
    Ok(())
}

simd_dispatch! {
    /// Head `h` of the single query row `i0` of batch `b` over keys
    /// `klo..klo + scores.len()` into `out` (`head_dim` values): scores
    /// by dot products, [`probs_rows`], then `out = Σ_j P_j v_j`. The
    /// caller validated every extent.
    fn one_query_head(
        p: &AttentionParams,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &AttnMask<'_>,
        out: &mut [f32],
        h: usize,
        b: usize,
        i0: usize,
        klo: usize,
        scores: &mut [f32],
    ) {
        let (d, sq, sk) = (p.head_dim, p.seq_q, p.seq_k);
        let hk = h / (p.num_heads / p.num_kv_heads);
        let qo = (b * sq + i0) * p.q_row_stride + h * d;
        let qh = &q[qo..qo + d];
        let k0 = (b * sk + klo) * p.k_row_stride + hk * d;
        M::dot_rows(qh, &k[k0..], p.k_row_stride, scores);
        let nk = scores.len();
        probs_rows(p, mask, scores, nk, b, h, i0, klo, None);
        out.fill(0.0);
        let v0 = (b * sk + klo) * p.v_row_stride + hk * d;
        M::weighted_rows(scores, &v[v0..], p.v_row_stride, out);
    }
}

/// Query rows per block of the packed path (a `64 x S_k` score tile).
const PACKED_ROWS: usize = 64;
/// Query rows per (batch, head) from which packing K and V pays off.
const PACKED_MIN_ROWS: usize = 16;

/// Per-thread buffers of the packed path, reused across calls.
struct HeadScratch {
    kt: PackedB,
    v: PackedB,
    scores: Vec<f32>,
    out: Vec<f32>,
    /// bf16 jobs: a block's unnormalized probabilities in bf16, and each
    /// row's `1 / sum`.
    p16: Vec<u16>,
    inv: Vec<f32>,
}

impl HeadScratch {
    fn new() -> HeadScratch {
        HeadScratch {
            kt: PackedB::empty(),
            v: PackedB::empty(),
            scores: Vec::new(),
            out: Vec::new(),
            p16: Vec::new(),
            inv: Vec::new(),
        }
    }
}

thread_local! {
    static HEAD_SCRATCH: std::cell::RefCell<HeadScratch> = std::cell::RefCell::new(HeadScratch::new());
}

/// `f` with this thread's [`HeadScratch`], or with a fresh one when this
/// thread already holds it: a task stolen while the holder waits inside a
/// parallel product may call here again.
fn with_head_scratch<R>(f: impl FnOnce(&mut HeadScratch) -> R) -> R {
    HEAD_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut HeadScratch::new()),
    })
}

/// The output's base pointer, shared by (batch, head) tasks that write
/// disjoint column stripes.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used by `attention_packed` and `attention_by_head`, whose
// tasks write disjoint elements of one exclusively borrowed slice.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the `Sync` wrapper and
    /// not its raw field).
    fn base(self) -> *mut f32 {
        self.0
    }
}

/// `dst.copy_from_slice(src)` in 16-float pieces that the compiler
/// inlines: a call to memcpy per 128-byte head row cost about as much as
/// the copy. A tail of fewer than 16 floats is copied by memcpy.
#[inline(always)]
fn copy_floats(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (a, b) in (&mut d).zip(&mut s) {
        let a: &mut [f32; 16] = a.try_into().expect("16 floats");
        *a = b.try_into().expect("16 floats");
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

/// Query rows `rows` (whole [`PACKED_ROWS`] blocks from row 0, but for the
/// last) of one (batch, head): pack this head's `K^T` and `V` once (keys up
/// to the last one these rows see), then per block of query rows: scores
/// against the visible key window, probabilities, times V. Every block
/// computes what it would in a call over all the rows: the split changes
/// no bits.
///
/// # Safety
/// `out` points at an output buffer validated for `p`, and no other task
/// writes rows `rows` of head `h` of batch `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_head_packed(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    b: usize,
    h: usize,
    rows: (usize, usize),
    next: Option<(usize, usize, (usize, usize))>,
    out: SharedOut,
) -> Result<(), KernelError> {
    let (d, sq, sk) = (p.head_dim, p.seq_q, p.seq_k);
    let hk = h / (p.num_heads / p.num_kv_heads);
    let (r_lo, r_hi) = rows;
    if r_lo >= r_hi {
        return Ok(());
    }
    // The head this thread most likely runs next: its rows lie a row
    // stride apart (a page or more), where the hardware prefetchers do not
    // follow, so without this each head's K, V and Q rows come from L3 or
    // memory as they are read, and its output rows are written cold (at
    // batch 32 a MiniLM head took 40 µs against 26 µs at batch 1). Issued
    // in `STAGES` parts between this head's steps: all at once, the hints
    // wait on the line fill buffers as long as the misses would have.
    const STAGES: usize = 8;
    let ahead = |stage: usize| {
        let Some((nb, nh, (n_lo, n_hi))) = next else {
            return;
        };
        let nk = nh / (p.num_heads / p.num_kv_heads);
        for r in sk * stage / STAGES..sk * (stage + 1) / STAGES {
            prefetch_l2(
                k.as_ptr()
                    .wrapping_add((nb * sk + r) * p.k_row_stride + nk * d),
                d,
            );
            prefetch_l2(
                v.as_ptr()
                    .wrapping_add((nb * sk + r) * p.v_row_stride + nk * d),
                d,
            );
        }
        let n = n_hi.saturating_sub(n_lo);
        for r in n_lo + n * stage / STAGES..n_lo + n * (stage + 1) / STAGES {
            prefetch_l2(
                q.as_ptr()
                    .wrapping_add((nb * sq + r) * p.q_row_stride + nh * d),
                d,
            );
            prefetch_l2(
                out.base()
                    .wrapping_add((nb * sq + r) * p.out_row_stride + nh * d),
                d,
            );
        }
    };
    let mut stage = 0;
    let mut step = || {
        if stage < STAGES {
            ahead(stage);
            stage += 1;
        }
    };
    step();
    // The key window of the whole head decides the mask (whether every key
    // is kept, and with it the softmax path), as in an unsplit call.
    let klo = key_range(p.mask_kind, 0, sq, sk).0;
    let mut khi = key_range(p.mask_kind, sq - 1, sq, sk).1;
    let last_kept =
        |keep: &dyn Fn(usize) -> bool| (klo..khi).rev().find(|&j| keep(j)).map_or(klo, |j| j + 1);
    match *mask {
        AttnMask::KeepF32(m) => khi = last_kept(&|j| m[b * sk + j] != 0.0),
        AttnMask::KeepU8(m) => khi = last_kept(&|j| m[b * sk + j] != 0),
        _ => {}
    }
    let mask = &window_mask(mask, b * sk + klo, b * sk + khi.max(klo));
    // These rows see no key past the last one their last row sees.
    let khi = khi.min(key_range(p.mask_kind, r_hi - 1, sq, sk).1);
    with_head_scratch(|s| {
        // Rows with keys to attend to are written in full below; rows with
        // none are zeroed where they are skipped (no clearing up front).
        s.out.resize((r_hi - r_lo) * d, 0.0);
        if klo >= khi {
            s.out.fill(0.0);
        } else {
            // This head's query rows lie a row stride apart (often a page
            // or more): fetch each block's rows ahead of its product.
            let fetch_q = |i0: usize| {
                for r in i0..(i0 + PACKED_ROWS).min(r_hi) {
                    prefetch(
                        q.as_ptr()
                            .wrapping_add((b * sq + r) * p.q_row_stride + h * d),
                        d,
                    );
                }
            };
            fetch_q(r_lo);
            let ko = b * sk * p.k_row_stride + hk * d;
            let vo = b * sk * p.v_row_stride + hk * d;
            if p.bf16 {
                s.kt.repack_strided_bf16(&k[ko..], d, khi, 1, p.k_row_stride)?;
                s.v.repack_strided_bf16(&v[vo..], khi, d, p.v_row_stride, 1)?;
            } else {
                s.kt.repack_strided(&k[ko..], d, khi, 1, p.k_row_stride)?;
                s.v.repack_strided(&v[vo..], khi, d, p.v_row_stride, 1)?;
            }
            step();
            let mut i0 = r_lo;
            while i0 < r_hi {
                let rows = PACKED_ROWS.min(r_hi - i0);
                fetch_q(i0 + PACKED_ROWS);
                let lo = key_range(p.mask_kind, i0, sq, sk).0;
                let hi = key_range(p.mask_kind, i0 + rows - 1, sq, sk).1.min(khi);
                if lo < hi {
                    let col0 = lo / NR * NR;
                    let nk = hi - col0;
                    s.scores.resize(rows * nk, 0.0);
                    let qo = (b * sq + i0) * p.q_row_stride + h * d;
                    let qs = &q[qo..];
                    gemm_packed_window(
                        rows,
                        qs,
                        p.q_row_stride,
                        &s.kt,
                        (0, d),
                        (col0, nk),
                        &mut s.scores,
                        nk,
                    )?;
                    step();
                    let out = &mut s.out[(i0 - r_lo) * d..(i0 - r_lo + rows) * d];
                    if p.bf16 {
                        // Probabilities rounded while hot, normalized in the
                        // d-wide output rows instead of the nk-wide ones.
                        s.inv.resize(rows, 0.0);
                        probs_rows(p, mask, &mut s.scores, nk, b, h, i0, col0, Some(&mut s.inv));
                        let nk16 = 2 * nk.div_ceil(2);
                        s.p16.resize(rows * nk16, 0);
                        for (src, dst) in
                            s.scores.chunks_exact(nk).zip(s.p16.chunks_exact_mut(nk16))
                        {
                            round_bf16(src, dst);
                        }
                        let window = (col0, col0 + nk);
                        gemm_packed_window_a16(rows, &s.p16, &s.v, window, (0, d), out, d)?;
                        for (row, &f) in out.chunks_exact_mut(d).zip(&s.inv) {
                            scale_slice(row, f);
                        }
                    } else {
                        probs_rows(p, mask, &mut s.scores, nk, b, h, i0, col0, None);
                        step();
                        gemm_packed_window(
                            rows,
                            &s.scores,
                            nk,
                            &s.v,
                            (col0, col0 + nk),
                            (0, d),
                            out,
                            d,
                        )?;
                    }
                } else {
                    s.out[(i0 - r_lo) * d..(i0 - r_lo + rows) * d].fill(0.0);
                }
                step();
                i0 += rows;
            }
        }
        (0..STAGES).for_each(|_| step());
        write_head_rows(p, out, b, r_lo, h, &s.out);
        Ok(())
    })
}

/// Copy `src` (rows of `d` floats) into head `h` of output rows
/// `(b, i0..)`.
///
/// # Safety
/// `out` points at an output buffer validated for `p`, the rows exist, and
/// no other task writes head `h` of those rows meanwhile.
unsafe fn write_head_rows(
    p: &AttentionParams,
    out: SharedOut,
    b: usize,
    i0: usize,
    h: usize,
    src: &[f32],
) {
    let d = p.head_dim;
    for (r, row) in src.chunks_exact(d).enumerate() {
        let dst = out
            .base()
            .add((b * p.seq_q + i0 + r) * p.out_row_stride + h * d);
        // SAFETY: inside the validated buffer, and no other task reads or
        // writes these `d` elements meanwhile (the contract).
        copy_floats(std::slice::from_raw_parts_mut(dst, d), row);
    }
}

/// Row blocks of `blk` rows (`per_batch` per batch) times heads, one task
/// each: every task attends one head of one block into its own scratch and
/// copies it into its column stripe of `out`.
#[allow(clippy::too_many_arguments)]
fn attention_by_head(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    out: &mut [f32],
    blk: usize,
    per_batch: usize,
) -> Result<(), KernelError> {
    use rayon::prelude::*;
    let (d, sq, hq) = (p.head_dim, p.seq_q, p.num_heads);
    let ptr = SharedOut(out.as_mut_ptr());
    (0..p.batch * per_batch * hq)
        .into_par_iter()
        .try_for_each(|t| {
            let (bi, h) = (t / hq, t % hq);
            let (b, i0) = (bi / per_batch, bi % per_batch * blk);
            let rows = blk.min(sq - i0);
            with_head_scratch(|s| {
                s.out.resize(rows * d, 0.0);
                let dst = (&mut s.out[..], d);
                attend_block(p, q, k, v, mask, dst, h..h + 1, b, i0, rows, &mut s.scores)?;
                // SAFETY: rows (b, i0..i0 + rows), head h of the output validated
                // by `attention`; task t is the only one writing them.
                unsafe { write_head_rows(p, ptr, b, i0, h, &s.out) };
                Ok(())
            })
        })
}

/// Parts (of whole query blocks, `1..=blocks`) to cut each (batch, head)
/// into, for `heads` of them on `threads`: the fewest parts whose tasks
/// spread evenly. Every part packs the keys it sees, so a part more costs
/// packing; it pays where the heads do not divide among the threads
/// (SmolLM2's 9 heads on 2 threads: 5 heads on one thread, 4 on the
/// other; in halves, 9 and 9) or are fewer than the threads (MiniLM 1x128:
/// 12 on 16 threads).
fn head_parts(heads: usize, threads: usize, blocks: usize) -> usize {
    if heads < threads {
        // Parts for every thread (the busiest's share is one part either
        // way, but smaller parts even out what the threads' speeds do not).
        return threads.div_ceil(heads).min(blocks).max(1);
    }
    // The busiest thread's share, in whole heads, with `parts` parts each.
    let busiest = |parts: usize| (heads * parts).div_ceil(threads) as f64 / parts as f64;
    let best = (1..=blocks.max(1))
        .map(busiest)
        .fold(f64::INFINITY, f64::min);
    (1..=blocks.max(1))
        .find(|&parts| busiest(parts) <= best * 1.05)
        .unwrap_or(1)
}

/// Attention with K and V packed once per (batch, head), one task each.
fn attention_packed(
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &AttnMask<'_>,
    out: &mut [f32],
    parallel: bool,
) -> Result<(), KernelError> {
    let heads = p.batch * p.num_heads;
    let threads = if parallel { num_threads() } else { 1 };
    let blocks = p.seq_q.div_ceil(PACKED_ROWS);
    let parts = head_parts(heads, threads, blocks);
    let part_rows = blocks.div_ceil(parts) * PACKED_ROWS;
    let tasks = heads * parts;
    let task = |t: usize| {
        let (bh, part) = (t / parts, t % parts);
        let rows = (
            (part * part_rows).min(p.seq_q),
            ((part + 1) * part_rows).min(p.seq_q),
        );
        (bh / p.num_heads, bh % p.num_heads, rows)
    };
    let ptr = SharedOut(out.as_mut_ptr());
    let run = |t: usize| {
        let (b, h, rows) = task(t);
        // With rayon's splitting a thread takes consecutive tasks, so task
        // t + 1 is what this thread most likely runs next.
        let next = (t + 1 < tasks).then(|| task(t + 1));
        // SAFETY: `out` was validated for `p` by the caller, and task t is
        // the only one writing rows `rows` of (batch b, head h).
        unsafe { attend_head_packed(p, q, k, v, mask, b, h, rows, next, ptr) }
    };
    if parallel && tasks > 1 && threads > 1 {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().try_for_each(run)
    } else {
        (0..tasks).try_for_each(run)
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
    let ors = p.out_row_stride;
    let need = span(rows, ors, p.num_heads * p.head_dim);
    let out = &mut out[..need];
    if p.seq_q >= PACKED_MIN_ROWS {
        return attention_packed(p, q, k, v, &mask, out, parallel);
    }
    if p.batch == 1 && p.seq_q == 1 {
        return attention_one_query(p, q, k, v, &mask, out, parallel);
    }
    let sq = p.seq_q;
    // Row blocks never cross a batch; enough blocks to feed every thread.
    let threads = if parallel { num_threads() } else { 1 };
    let per_batch_blocks = if p.batch >= 2 * threads {
        1
    } else {
        (2 * threads).div_ceil(p.batch).min(sq)
    };
    let blk = sq.div_ceil(per_batch_blocks).max(1);
    // Cap a block's score buffer at ~256 KiB.
    let blk = blk.min((65_536 / p.seq_k.max(1)).max(1));
    let blocks_per_batch = sq.div_ceil(blk);
    let work = p.batch * sq * p.num_heads * p.seq_k.max(1) * p.head_dim * 2;
    let blocks = p.batch * blocks_per_batch;
    if parallel && threads > 1 && blocks < threads && p.num_heads > 1 && work >= PAR_MIN_ELEMS {
        // Fewer row blocks than threads (a decode step is one row): one
        // task per (block, head) instead.
        return attention_by_head(p, q, k, v, &mask, out, blk, blocks_per_batch);
    }
    let run_block = |bi: usize, chunk: &mut [f32], scores: &mut Vec<f32>| {
        let (b, ib) = (bi / blocks_per_batch, bi % blocks_per_batch);
        let i0 = ib * blk;
        let nrows = blk.min(sq - i0);
        attend_block(
            p,
            q,
            k,
            v,
            &mask,
            (chunk, ors),
            0..p.num_heads,
            b,
            i0,
            nrows,
            scores,
        )
    };
    // Chunks of `blk` rows, restarting at each batch boundary.
    let mut chunks: Vec<&mut [f32]> = Vec::with_capacity(p.batch * blocks_per_batch);
    let mut rest = out;
    for b in 0..p.batch {
        for ib in 0..blocks_per_batch {
            let nrows = blk.min(sq - ib * blk);
            let last = b + 1 == p.batch && ib + 1 == blocks_per_batch;
            let take = if last { rest.len() } else { nrows * ors };
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(take);
            chunks.push(head);
            rest = tail;
        }
    }
    if parallel && threads > 1 && chunks.len() > 1 && work >= PAR_MIN_ELEMS {
        use rayon::prelude::*;
        chunks
            .into_par_iter()
            .enumerate()
            .try_for_each_init(Vec::new, |scores, (bi, chunk)| run_block(bi, chunk, scores))
    } else {
        let mut scores = Vec::new();
        for (bi, chunk) in chunks.into_iter().enumerate() {
            run_block(bi, chunk, &mut scores)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::head_parts;

    #[test]
    fn heads_are_cut_only_where_they_do_not_spread_evenly() {
        // (heads, threads, blocks) -> parts
        for (case, want) in [
            ((9, 2, 2), 2),
            ((12, 2, 2), 1),
            ((12, 16, 2), 2),
            ((384, 16, 2), 1),
            ((9, 8, 2), 2),
            ((9, 16, 2), 2),
            ((1, 16, 4), 4),
            ((9, 1, 2), 1),
            ((9, 2, 1), 1),
            ((3, 2, 0), 1),
        ] {
            let (h, t, b) = case;
            assert_eq!(head_parts(h, t, b), want, "{case:?}");
        }
    }
}
