//! `DequantMatMul`: every weight row is dequantized to f32 with
//! `rlx_formats::quant::dequantize` (bit-exact with ggml), then multiplied
//! in f64.

use crate::value::{prod, Value};
use rlx_formats::{quant::dequantize, GgmlType};
use rlx_ir::QuantScheme;

/// `x [.., K] x W^T -> [.., N]` with `W` packed as `u8 [N, row_bytes]`.
///
/// Returns a reason string when a row cannot be dequantized (a byte value
/// outside `0..=255` or a size mismatch; shape inference rules out the latter).
pub(crate) fn dequant_matmul(
    x: &Value,
    w: &Value,
    scheme: QuantScheme,
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
    let xv = x.floats();
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
