//! LayerNorm / RmsNorm over the last axis, with the residual (+ bias)
//! fused variants. Row functions (`*_rows`) are serial and work on any
//! whole number of rows; the plain names parallelize over rows.

use super::simd::{self, simd_dispatch};
use super::{exact_len, par_rows, KernelError};

fn check_rows(
    op: &'static str,
    d: usize,
    x_len: usize,
    out_len: usize,
    vecs: &[(&str, usize)],
) -> Result<(), KernelError> {
    if d == 0 {
        return exact_len(op, "x", x_len, 0).and(exact_len(op, "output", out_len, 0));
    }
    exact_len(op, "output", out_len, x_len)?;
    exact_len(op, "x", x_len, x_len / d * d)?;
    for (name, len) in vecs {
        exact_len(op, name, *len, d)?;
    }
    Ok(())
}

/// `(mean, 1 / sqrt(var + eps))` of one row, biased variance, two-pass.
#[inline(always)]
fn ln_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let d = row.len() as f32;
    let mean = simd::sum(row) / d;
    let var = simd::sum_sq_dev(row, mean) / d;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `1 / sqrt(mean(x^2) + eps)` of one row.
#[inline(always)]
fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let ms = simd::dot(row, row) / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

simd_dispatch! {
    fn ln_rows_unchecked(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32], d: usize) {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let (mean, rstd) = ln_stats(xr, eps);
            for (((o, &v), &g), &b) in or.iter_mut().zip(xr).zip(gamma).zip(beta) {
                *o = (v - mean) * rstd * g + b;
            }
        }
    }
}

simd_dispatch! {
    fn ln_rows_inplace_unchecked(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32, d: usize) {
        for xr in x.chunks_exact_mut(d) {
            let (mean, rstd) = ln_stats(xr, eps);
            for ((v, &g), &b) in xr.iter_mut().zip(gamma).zip(beta) {
                *v = (*v - mean) * rstd * g + b;
            }
        }
    }
}

simd_dispatch! {
    fn rms_rows_unchecked(x: &[f32], gamma: &[f32], eps: f32, out: &mut [f32], d: usize) {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let s = rms_scale(xr, eps);
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(gamma) {
                *o = v * s * g;
            }
        }
    }
}

simd_dispatch! {
    fn rms_rows_inplace_unchecked(x: &mut [f32], gamma: &[f32], eps: f32, d: usize) {
        for xr in x.chunks_exact_mut(d) {
            let s = rms_scale(xr, eps);
            for (v, &g) in xr.iter_mut().zip(gamma) {
                *v = *v * s * g;
            }
        }
    }
}

simd_dispatch! {
    fn add_residual_unchecked(x: &[f32], residual: &[f32], bias: Option<&[f32]>, out: &mut [f32], d: usize) {
        match bias {
            Some(bias) => {
                for ((or, xr), rr) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(residual.chunks_exact(d)) {
                    for (((o, &a), &r), &b) in or.iter_mut().zip(xr).zip(rr).zip(bias) {
                        *o = a + r + b;
                    }
                }
            }
            None => {
                for ((o, &a), &r) in out.iter_mut().zip(x).zip(residual) {
                    *o = a + r;
                }
            }
        }
    }
}

/// LayerNorm of rows of width `d` (serial): `out = (x - mean) / sqrt(var +
/// eps) * gamma + beta`, biased variance.
pub fn layer_norm_rows(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    check_rows(
        "LayerNorm",
        d,
        x.len(),
        out.len(),
        &[("gamma", gamma.len()), ("beta", beta.len())],
    )?;
    if d > 0 {
        ln_rows_unchecked(x, gamma, beta, eps, out, d);
    }
    Ok(())
}

/// In-place [`layer_norm_rows`] (serial), for fused epilogues.
pub fn layer_norm_rows_inplace(
    x: &mut [f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    d: usize,
) -> Result<(), KernelError> {
    check_rows(
        "LayerNorm",
        d,
        x.len(),
        x.len(),
        &[("gamma", gamma.len()), ("beta", beta.len())],
    )?;
    if d > 0 {
        ln_rows_inplace_unchecked(x, gamma, beta, eps, d);
    }
    Ok(())
}

/// RmsNorm of rows of width `d` (serial): `out = x / sqrt(mean(x^2) + eps) * gamma`.
pub fn rms_norm_rows(
    x: &[f32],
    gamma: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    check_rows("RmsNorm", d, x.len(), out.len(), &[("gamma", gamma.len())])?;
    if d > 0 {
        rms_rows_unchecked(x, gamma, eps, out, d);
    }
    Ok(())
}

/// In-place [`rms_norm_rows`] (serial).
pub fn rms_norm_rows_inplace(
    x: &mut [f32],
    gamma: &[f32],
    eps: f32,
    d: usize,
) -> Result<(), KernelError> {
    check_rows("RmsNorm", d, x.len(), x.len(), &[("gamma", gamma.len())])?;
    if d > 0 {
        rms_rows_inplace_unchecked(x, gamma, eps, d);
    }
    Ok(())
}

/// `LayerNorm(x + residual [+ bias])` on rows of width `d` (serial).
#[allow(clippy::too_many_arguments)]
pub fn residual_layer_norm_rows(
    x: &[f32],
    residual: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    let op = "FusedResidualLN";
    check_rows(
        op,
        d,
        x.len(),
        out.len(),
        &[("gamma", gamma.len()), ("beta", beta.len())],
    )?;
    exact_len(op, "residual", residual.len(), x.len())?;
    if let Some(b) = bias {
        exact_len(op, "bias", b.len(), d)?;
    }
    if d > 0 {
        add_residual_unchecked(x, residual, bias, out, d);
        ln_rows_inplace_unchecked(out, gamma, beta, eps, d);
    }
    Ok(())
}

/// `RmsNorm(x + residual [+ bias])` on rows of width `d` (serial).
#[allow(clippy::too_many_arguments)]
pub fn residual_rms_norm_rows(
    x: &[f32],
    residual: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    let op = "FusedResidualRmsNorm";
    check_rows(op, d, x.len(), out.len(), &[("gamma", gamma.len())])?;
    exact_len(op, "residual", residual.len(), x.len())?;
    if let Some(b) = bias {
        exact_len(op, "bias", b.len(), d)?;
    }
    if d > 0 {
        add_residual_unchecked(x, residual, bias, out, d);
        rms_rows_inplace_unchecked(out, gamma, eps, d);
    }
    Ok(())
}

/// Parallel [`layer_norm_rows`].
pub fn layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    check_rows(
        "LayerNorm",
        d,
        x.len(),
        out.len(),
        &[("gamma", gamma.len()), ("beta", beta.len())],
    )?;
    par_rows(out, d, d * 4, |r0, o| {
        ln_rows_unchecked(&x[r0 * d..r0 * d + o.len()], gamma, beta, eps, o, d);
    });
    Ok(())
}

/// Parallel [`rms_norm_rows`].
pub fn rms_norm(
    x: &[f32],
    gamma: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    check_rows("RmsNorm", d, x.len(), out.len(), &[("gamma", gamma.len())])?;
    par_rows(out, d, d * 3, |r0, o| {
        rms_rows_unchecked(&x[r0 * d..r0 * d + o.len()], gamma, eps, o, d);
    });
    Ok(())
}

/// Parallel [`residual_layer_norm_rows`].
#[allow(clippy::too_many_arguments)]
pub fn residual_layer_norm(
    x: &[f32],
    residual: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    let op = "FusedResidualLN";
    check_rows(
        op,
        d,
        x.len(),
        out.len(),
        &[("gamma", gamma.len()), ("beta", beta.len())],
    )?;
    exact_len(op, "residual", residual.len(), x.len())?;
    if let Some(b) = bias {
        exact_len(op, "bias", b.len(), d)?;
    }
    par_rows(out, d, d * 6, |r0, o| {
        let s = r0 * d..r0 * d + o.len();
        add_residual_unchecked(&x[s.clone()], &residual[s], bias, o, d);
        ln_rows_inplace_unchecked(o, gamma, beta, eps, d);
    });
    Ok(())
}

/// Parallel [`residual_rms_norm_rows`].
#[allow(clippy::too_many_arguments)]
pub fn residual_rms_norm(
    x: &[f32],
    residual: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) -> Result<(), KernelError> {
    let op = "FusedResidualRmsNorm";
    check_rows(op, d, x.len(), out.len(), &[("gamma", gamma.len())])?;
    exact_len(op, "residual", residual.len(), x.len())?;
    if let Some(b) = bias {
        exact_len(op, "bias", b.len(), d)?;
    }
    par_rows(out, d, d * 5, |r0, o| {
        let s = r0 * d..r0 * d + o.len();
        add_residual_unchecked(&x[s.clone()], &residual[s], bias, o, d);
        rms_rows_inplace_unchecked(o, gamma, eps, d);
    });
    Ok(())
}
