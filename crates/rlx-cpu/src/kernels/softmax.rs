//! Softmax (max-subtracted) over rows or any axis.

use super::simd::{self, simd_dispatch};
use super::{bad_shape, exact_len, par_rows, KernelError};

/// `out[i] = e^(x[i] - m)`; returns the sum of `out` (8 accumulators).
#[inline(always)]
pub(crate) fn exp_sub_sum<M: simd::Fma>(x: &[f32], m: f32, out: &mut [f32]) -> f32 {
    let n = x.len().min(out.len());
    let out = &mut out[..n];
    out.copy_from_slice(&x[..n]);
    exp_sub_sum_inplace::<M>(out, m)
}

/// `x[i] = e^(x[i] - m)`, returning the sum ([`simd::sum`]'s order).
#[inline(always)]
pub(crate) fn exp_sub_sum_inplace<M: simd::Fma>(x: &mut [f32], m: f32) -> f32 {
    // Two passes: a plain map vectorizes (an exp fused with an 8-lane
    // accumulator did not, and ran scalar), then the sum.
    for v in x.iter_mut() {
        *v = simd::exp_nonpos_m::<M>(*v - m);
    }
    M::sum(x)
}

/// Multiply every element by `s`.
#[inline(always)]
pub(crate) fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

simd_dispatch! {
    fn rows_unchecked(x: &[f32], out: &mut [f32], d: usize) {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let m = simd::max_slice(xr);
            let s = exp_sub_sum::<M>(xr, m, or);
            scale(or, 1.0 / s);
        }
    }
}

simd_dispatch! {
    /// Softmax of each row of width `d`, in place (serial).
    pub fn softmax_rows_inplace(x: &mut [f32], d: usize) {
        if d == 0 {
            return;
        }
        for row in x.chunks_exact_mut(d) {
            let m = simd::max_slice(row);
            let s = exp_sub_sum_inplace::<M>(row, m);
            scale(row, 1.0 / s);
        }
    }
}

/// Softmax of each row of width `d` (serial).
pub fn softmax_rows(x: &[f32], out: &mut [f32], d: usize) -> Result<(), KernelError> {
    exact_len("Softmax", "output", out.len(), x.len())?;
    if d == 0 {
        return Ok(());
    }
    exact_len("Softmax", "x", x.len(), x.len() / d * d)?;
    rows_unchecked(x, out, d);
    Ok(())
}

simd_dispatch! {
    /// Softmax along the middle axis of `[n, inner]` blocks.
    fn strided_blocks(x: &[f32], out: &mut [f32], n: usize, inner: usize) {
        let block = n * inner;
        let mut m = vec![f32::NEG_INFINITY; inner];
        let mut s = vec![0.0f32; inner];
        for (xb, ob) in x.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
            m.fill(f32::NEG_INFINITY);
            s.fill(0.0);
            for xr in xb.chunks_exact(inner) {
                for (mi, &v) in m.iter_mut().zip(xr) {
                    *mi = simd::max_nan(v, *mi);
                }
            }
            for (xr, or) in xb.chunks_exact(inner).zip(ob.chunks_exact_mut(inner)) {
                for (((o, &v), &mi), si) in or.iter_mut().zip(xr).zip(&m).zip(s.iter_mut()) {
                    let e = simd::exp_m::<M>(v - mi);
                    *o = e;
                    *si += e;
                }
            }
            for si in s.iter_mut() {
                *si = 1.0 / *si;
            }
            for or in ob.chunks_exact_mut(inner) {
                for (o, &r) in or.iter_mut().zip(&s) {
                    *o *= r;
                }
            }
        }
    }
}

/// Softmax along `axis` of a tensor with `dims`, parallel over rows/blocks.
pub fn softmax_axis(
    x: &[f32],
    dims: &[usize],
    axis: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if axis >= dims.len() {
        return Err(bad_shape(
            "Softmax",
            format!("axis {axis} out of range for {dims:?}"),
        ));
    }
    let numel: usize = dims.iter().product();
    exact_len("Softmax", "x", x.len(), numel)?;
    exact_len("Softmax", "output", out.len(), numel)?;
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    if numel == 0 {
        return Ok(());
    }
    if inner == 1 {
        par_rows(out, n, n * 6, |r0, o| {
            rows_unchecked(&x[r0 * n..r0 * n + o.len()], o, n);
        });
    } else {
        let block = n * inner;
        par_rows(out, block, block * 6, |b0, o| {
            strided_blocks(&x[b0 * block..b0 * block + o.len()], o, n, inner);
        });
    }
    Ok(())
}
