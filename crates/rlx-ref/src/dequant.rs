//! `DequantMatMul`: every weight row is dequantized to f32 with
//! `rlx_formats::quant::dequantize` (bit-exact with ggml), then multiplied
//! in f64. With `Int8` activations, x is first rounded to Q8 blocks of 32 as
//! `rlx_ir::op` specifies ([`q8_round`]), written here independently of the
//! CPU kernels so that it checks them.

use crate::value::{prod, Value};
use rlx_formats::{quant::dequantize, GgmlType};
use rlx_ir::{ActivationPrecision, QuantScheme};

/// `x [.., K] x W^T -> [.., N]` with `W` packed as `u8 [N, row_bytes]`.
///
/// Returns a reason string when a row cannot be dequantized (a byte value
/// outside `0..=255` or a size mismatch; shape inference rules out the latter).
pub(crate) fn dequant_matmul(
    x: &Value,
    w: &Value,
    scheme: QuantScheme,
    activations: ActivationPrecision,
    out_dims: &[usize],
) -> Result<Value, String> {
    let k = *x.dims.last().unwrap_or(&0);
    let n = w.dims[0];
    let rb = w.dims[1];
    let ty = GgmlType::from(scheme);
    let bytes: Vec<u8> = w
        .ints()
        .iter()
        .map(|&b| u8::try_from(b).map_err(|_| format!("weight byte {b} is not a u8")))
        .collect::<Result<_, _>>()?;
    let mut wf = vec![0.0f32; n * k];
    for (r, (src, dst)) in bytes
        .chunks_exact(rb.max(1))
        .zip(wf.chunks_exact_mut(k.max(1)))
        .enumerate()
    {
        dequantize(ty, src, k, dst).map_err(|e| format!("weight row {r}: {e}"))?;
    }
    let mut xv = x.floats();
    if activations == ActivationPrecision::Int8 {
        if !k.is_multiple_of(32) {
            return Err(format!("K = {k} is not a multiple of the Q8 block size 32"));
        }
        for blk in xv.to_mut().chunks_exact_mut(32) {
            q8_round(blk);
        }
    }
    let m = xv
        .len()
        .checked_div(k)
        .unwrap_or_else(|| prod(&x.dims[..x.dims.len() - 1]));
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        let xr = &xv[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &wf[j * k..(j + 1) * k];
            out[i * n + j] = xr.iter().zip(wr).map(|(&a, &b)| a * f64::from(b)).sum();
        }
    }
    Ok(Value::float(out_dims, out))
}

/// Replace one block of 32 activations by its Q8 rounding `d * q`:
/// `d = amax / 127` and `q = round_half_even(x * (1 / d))` in f32; zeros
/// when `d` is below the smallest normal f32, NaN everywhere when the block
/// holds a NaN or an infinity.
pub(crate) fn q8_round(blk: &mut [f64]) {
    if blk.iter().any(|v| !v.is_finite()) {
        blk.fill(f64::NAN);
        return;
    }
    let amax = blk.iter().fold(0.0f32, |m, &v| m.max((v as f32).abs()));
    let d = amax / 127.0;
    if d < f32::MIN_POSITIVE {
        blk.fill(0.0);
        return;
    }
    let id = 1.0 / d;
    for v in blk.iter_mut() {
        let q = (*v as f32 * id).round_ties_even();
        *v = f64::from(d) * f64::from(q);
    }
}
