//! Dense, elementwise, normalization and layout ops. Every function takes
//! inputs that passed shape inference, so dims and dtypes are consistent.

use crate::math::{activation, max_nan, min_nan, sigmoid};
use crate::value::{broadcast_offsets, pick_multi, prod, strided_offsets, Data, Value};
use rlx_ir::{contiguous_strides, Activation, BinaryOp, DType, ReduceOp};

/// `[.., M, K] x [.., K, N] -> [.., M, N]` with broadcast batch dims.
pub(crate) fn matmul(a: &Value, b: &Value, out_dims: &[usize]) -> Value {
    let (ra, rb, ro) = (a.dims.len(), b.dims.len(), out_dims.len());
    let (m, k) = (a.dims[ra - 2], a.dims[ra - 1]);
    let n = b.dims[rb - 1];
    let batch = &out_dims[..ro - 2];
    let a_batch = broadcast_offsets(batch, &a.dims[..ra - 2]);
    let b_batch = broadcast_offsets(batch, &b.dims[..rb - 2]);
    let (av, bv) = (a.floats(), b.floats());
    let mut out = vec![0.0f64; prod(out_dims)];
    for (bi, (&ab, &bb)) in a_batch.iter().zip(&b_batch).enumerate() {
        let (ao, bo, oo) = (ab * m * k, bb * k * n, bi * m * n);
        for i in 0..m {
            let row = &mut out[oo + i * n..oo + (i + 1) * n];
            for p in 0..k {
                let x = av[ao + i * k + p];
                for (j, o) in row.iter_mut().enumerate() {
                    *o += x * bv[bo + p * n + j];
                }
            }
        }
    }
    Value::float(out_dims, out)
}

/// `act(a x b + bias)`.
pub(crate) fn matmul_bias_act(
    a: &Value,
    b: &Value,
    bias: &Value,
    act: Option<Activation>,
    out_dims: &[usize],
) -> Value {
    let mut y = matmul(a, b, out_dims);
    let bias = bias.floats();
    let n = bias.len();
    if let Data::F(v) = &mut y.data {
        for (i, x) in v.iter_mut().enumerate() {
            let z = *x + bias[i % n];
            *x = act.map_or(z, |a| activation(a, z));
        }
    }
    y
}

/// Elementwise activation.
pub(crate) fn unary(x: &Value, act: Activation) -> Value {
    let v = x.floats().iter().map(|&z| activation(act, z)).collect();
    Value::float(&x.dims, v)
}

fn binary_scalar(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => max_nan(a, b),
        BinaryOp::Min => min_nan(a, b),
        BinaryOp::Pow => a.powf(b),
    }
}

/// Elementwise binary op with numpy broadcasting to `out_dims`.
pub(crate) fn binary(a: &Value, b: &Value, op: BinaryOp, out_dims: &[usize]) -> Value {
    let (av, bv) = (a.floats(), b.floats());
    let ia = broadcast_offsets(out_dims, &a.dims);
    let ib = broadcast_offsets(out_dims, &b.dims);
    let v = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| binary_scalar(op, av[i], bv[j]))
        .collect();
    Value::float(out_dims, v)
}

/// Rows and row width of a tensor normalized over its last axis.
fn rows_cols(dims: &[usize]) -> (usize, usize) {
    match dims.split_last() {
        Some((&d, rest)) => (prod(rest), d),
        None => (1, 1),
    }
}

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis, biased variance.
pub(crate) fn layer_norm(x: &Value, gamma: &Value, beta: Option<&Value>, eps: f32) -> Value {
    let (rows, d) = rows_cols(&x.dims);
    let (xv, g) = (x.floats(), gamma.floats());
    let b = beta.map(|b| b.floats().into_owned());
    let eps = f64::from(eps);
    let mut out = vec![0.0; xv.len()];
    for r in 0..rows {
        let row = &xv[r * d..(r + 1) * d];
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for j in 0..d {
            let shift = b.as_ref().map_or(0.0, |b| b[j]);
            out[r * d + j] = (row[j] - mean) * inv * g[j] + shift;
        }
    }
    Value::float(&x.dims, out)
}

/// `x / sqrt(mean(x^2) + eps) * gamma` over the last axis.
pub(crate) fn rms_norm(x: &Value, gamma: &Value, eps: f32) -> Value {
    let (rows, d) = rows_cols(&x.dims);
    let (xv, g) = (x.floats(), gamma.floats());
    let eps = f64::from(eps);
    let mut out = vec![0.0; xv.len()];
    for r in 0..rows {
        let row = &xv[r * d..(r + 1) * d];
        let ms = row.iter().map(|&v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for j in 0..d {
            out[r * d + j] = row[j] * inv * g[j];
        }
    }
    Value::float(&x.dims, out)
}

/// `x + residual [+ bias]`, bias `[D]` broadcast over rows.
pub(crate) fn residual_sum(x: &Value, r: &Value, bias: Option<&Value>) -> Value {
    let (xv, rv) = (x.floats(), r.floats());
    let b = bias.map(|b| b.floats().into_owned());
    let (_, d) = rows_cols(&x.dims);
    let v = xv
        .iter()
        .zip(rv.iter())
        .enumerate()
        .map(|(i, (&a, &c))| a + c + b.as_ref().map_or(0.0, |b| b[i % d]))
        .collect();
    Value::float(&x.dims, v)
}

/// Broadcast to `shape` (numpy rules).
pub(crate) fn expand(x: &Value, shape: &[usize]) -> Value {
    x.pick(shape, &broadcast_offsets(shape, &x.dims))
}

/// Convert one value of an F32 tensor (held in f64) to `to`.
fn cast_float(x: f64, to: DType) -> i64 {
    let f = x as f32;
    match to {
        DType::I32 => i64::from(f as i32),
        DType::I64 => f as i64,
        DType::U8 => i64::from(f as u8),
        _ => i64::from(f != 0.0),
    }
}

/// Convert one integer value to the integer dtype `to` with Rust `as`.
fn cast_int(x: i64, to: DType) -> i64 {
    match to {
        DType::I32 => i64::from(x as i32),
        DType::I64 => x,
        DType::U8 => i64::from(x as u8),
        _ => i64::from(x != 0),
    }
}

/// `Cast`; the error is a reason for `Unsupported`.
pub(crate) fn cast(x: &Value, to: DType) -> Result<Value, String> {
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    if half(to) || half(x.dtype) {
        return Err(format!(
            "cast from {} to {} (f16/bf16 values are not representable)",
            x.dtype, to
        ));
    }
    let data = match (&x.data, to) {
        (Data::F(v), DType::F32) => Data::F(v.iter().map(|&z| f64::from(z as f32)).collect()),
        (Data::I(v), DType::F32) => Data::F(v.iter().map(|&z| f64::from(z as f32)).collect()),
        (Data::F(v), _) => Data::I(v.iter().map(|&z| cast_float(z, to)).collect()),
        (Data::I(v), _) => Data::I(v.iter().map(|&z| cast_int(z, to)).collect()),
    };
    Ok(Value {
        dims: x.dims.clone(),
        dtype: to,
        data,
    })
}

/// Row lookup along axis 0. The error is (position in ids, id) of the
/// first id outside `0..rows`.
pub(crate) fn gather(
    table: &Value,
    ids: &Value,
    out_dims: &[usize],
) -> Result<Value, (usize, i64)> {
    let rows = table.dims[0];
    let row_len = prod(&table.dims[1..]);
    let ids = ids.ints();
    let mut picks = Vec::with_capacity(ids.len() * row_len);
    for (pos, &id) in ids.iter().enumerate() {
        if id < 0 || id as u64 >= rows as u64 {
            return Err((pos, id));
        }
        let base = id as usize * row_len;
        picks.extend(base..base + row_len);
    }
    Ok(table.pick(out_dims, &picks))
}

/// Slice `start..start+len` along `axis`.
pub(crate) fn narrow(x: &Value, axis: usize, start: usize, len: usize) -> Value {
    let strides = contiguous_strides(&x.dims);
    let mut dims = x.dims.clone();
    dims[axis] = len;
    x.pick(
        &dims,
        &strided_offsets(&dims, &strides, start * strides[axis]),
    )
}

/// `silu(gate) * up`, packed (`[.., 2N]`, gate first) or as two inputs.
pub(crate) fn swiglu(ins: &[&Value], packed: bool, out_dims: &[usize]) -> Value {
    let (rows, n) = rows_cols(out_dims);
    let mut out = vec![0.0; rows * n];
    if packed {
        let x = ins[0].floats();
        for r in 0..rows {
            for j in 0..n {
                let (g, u) = (x[r * 2 * n + j], x[r * 2 * n + n + j]);
                out[r * n + j] = g * sigmoid(g) * u;
            }
        }
    } else {
        let (g, u) = (ins[0].floats(), ins[1].floats());
        for i in 0..out.len() {
            out[i] = g[i] * sigmoid(g[i]) * u[i];
        }
    }
    Value::float(out_dims, out)
}

/// Concatenate along `axis`.
pub(crate) fn concat(ins: &[&Value], axis: usize, out_dims: &[usize]) -> Value {
    let outer = prod(&out_dims[..axis]);
    let inner = prod(&out_dims[axis + 1..]);
    let mut picks = Vec::with_capacity(prod(out_dims));
    for o in 0..outer {
        for (s, v) in ins.iter().enumerate() {
            let chunk = v.dims[axis] * inner;
            picks.extend((o * chunk..(o + 1) * chunk).map(|p| (s, p)));
        }
    }
    pick_multi(ins, out_dims, &picks)
}

/// Softmax along `axis`, subtracting the max first.
pub(crate) fn softmax(x: &Value, axis: usize) -> Value {
    let outer = prod(&x.dims[..axis]);
    let d = x.dims[axis];
    let inner = prod(&x.dims[axis + 1..]);
    let xv = x.floats();
    let mut out = vec![0.0; xv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * d * inner + j * inner + i;
            let mut m = f64::NEG_INFINITY;
            for j in 0..d {
                m = max_nan(m, xv[at(j)]);
            }
            let mut sum = 0.0;
            for j in 0..d {
                let e = (xv[at(j)] - m).exp();
                out[at(j)] = e;
                sum += e;
            }
            for j in 0..d {
                out[at(j)] /= sum;
            }
        }
    }
    Value::float(&x.dims, out)
}

/// Permute axes: `out.dims[i] = x.dims[perm[i]]`.
pub(crate) fn transpose(x: &Value, perm: &[usize]) -> Value {
    let strides = contiguous_strides(&x.dims);
    let dims: Vec<usize> = perm.iter().map(|&p| x.dims[p]).collect();
    let st: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    x.pick(&dims, &strided_offsets(&dims, &st, 0))
}

/// Reduce over `axes` (ascending); `out_dims` already reflects `keep_dims`.
pub(crate) fn reduce(x: &Value, op: ReduceOp, axes: &[usize], out_dims: &[usize]) -> Value {
    // Output offset of each input element: reduced axes get stride 0, the
    // kept axes the strides of the output with reduced axes as size 1.
    let kept: Vec<usize> = x
        .dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let mut st = contiguous_strides(&kept);
    for &a in axes {
        st[a] = 0;
    }
    let map = strided_offsets(&x.dims, &st, 0);
    let count: usize = axes.iter().map(|&a| x.dims[a]).product();
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut out = vec![init; prod(out_dims)];
    for (&o, &v) in map.iter().zip(x.floats().iter()) {
        out[o] = match op {
            ReduceOp::Sum | ReduceOp::Mean => out[o] + v,
            ReduceOp::Max => max_nan(out[o], v),
            ReduceOp::Min => min_nan(out[o], v),
        };
    }
    if op == ReduceOp::Mean {
        for v in &mut out {
            *v /= count as f64;
        }
    }
    Value::float(out_dims, out)
}

/// `cache` with rows `pos..pos+n` along axis 1 replaced by `rows`.
pub(crate) fn cache_write(cache: &Value, rows: &Value, pos: usize) -> Value {
    let (b, ctx, d) = (cache.dims[0], cache.dims[1], cache.dims[2]);
    let n = rows.dims[1];
    let mut out = cache.floats().into_owned();
    let src = rows.floats();
    for bi in 0..b {
        for r in 0..n {
            let dst = (bi * ctx + pos + r) * d;
            out[dst..dst + d].copy_from_slice(&src[(bi * n + r) * d..(bi * n + r + 1) * d]);
        }
    }
    Value::float(&cache.dims, out)
}
