//! Elementwise kernels: activations, broadcasting binary ops, SwiGLU.

use super::simd::{self, simd_dispatch};
use super::{bad_shape, exact_len, par_rows, KernelError};
use rlx_ir::{broadcast_dims, Activation, BinaryOp};

/// Expand `$e` once per activation with `$f` bound to its scalar function.
macro_rules! with_act {
    ($act:expr, $f:ident => $e:expr) => {
        match $act {
            Activation::Relu => {
                let $f = relu;
                $e
            }
            Activation::Gelu => {
                let $f = simd::gelu_m::<M>;
                $e
            }
            Activation::GeluTanh => {
                let $f = simd::gelu_tanh_m::<M>;
                $e
            }
            Activation::Silu => {
                let $f = simd::silu_m::<M>;
                $e
            }
            Activation::Sigmoid => {
                let $f = simd::sigmoid_m::<M>;
                $e
            }
            Activation::Tanh => {
                let $f = simd::tanh_m::<M>;
                $e
            }
            Activation::Exp => {
                let $f = simd::exp_m::<M>;
                $e
            }
            Activation::Neg => {
                let $f = |x: f32| -x;
                $e
            }
            Activation::Sqrt => {
                let $f = |x: f32| x.sqrt();
                $e
            }
            Activation::Rsqrt => {
                let $f = |x: f32| 1.0 / x.sqrt();
                $e
            }
            Activation::Abs => {
                let $f = |x: f32| x.abs();
                $e
            }
            Activation::Softplus => {
                let $f = softplus;
                $e
            }
            Activation::Mish => {
                let $f = |x: f32| x * softplus(x).tanh();
                $e
            }
            // No kernel of its own: the activation table's formula, in f32
            // (every activation without one has an arm above).
            a => {
                let formula = a.formula().unwrap_or(rlx_ir::Formula::C(f64::NAN));
                let $f = move |x: f32| formula.eval_f32(x);
                $e
            }
        }
    };
}

/// Expand `$e` once per binary op with `$f` bound to its scalar function.
macro_rules! with_binop {
    ($op:expr, $f:ident => $e:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |a: f32, b: f32| a + b;
                $e
            }
            BinaryOp::Sub => {
                let $f = |a: f32, b: f32| a - b;
                $e
            }
            BinaryOp::Mul => {
                let $f = |a: f32, b: f32| a * b;
                $e
            }
            BinaryOp::Div => {
                let $f = |a: f32, b: f32| a / b;
                $e
            }
            BinaryOp::Max => {
                let $f = simd::max_nan;
                $e
            }
            BinaryOp::Min => {
                let $f = simd::min_nan;
                $e
            }
            BinaryOp::Pow => {
                let $f = |a: f32, b: f32| a.powf(b);
                $e
            }
        }
    };
}

/// `max(x, 0)`, NaN-propagating.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `ln(1 + e^x)` without overflow: `max(x, 0) + ln(1 + e^-|x|)`.
#[inline(always)]
fn softplus(x: f32) -> f32 {
    let m = if x > 0.0 { x } else { 0.0 };
    m + (-x.abs()).exp().ln_1p()
}

/// One activation, scalar. Matches the vectorized kernels exactly.
pub fn activation_scalar(act: Activation, x: f32) -> f32 {
    type M = simd::NoFma;
    with_act!(act, f => f(x))
}

simd_dispatch! {
    /// Apply `act` in place to every element (serial).
    pub fn apply_activation(act: Activation, x: &mut [f32]) {
        with_act!(act, f => {
            for v in x.iter_mut() {
                *v = f(*v);
            }
        })
    }
}

simd_dispatch! {
    fn act_into_unchecked(act: Activation, x: &[f32], out: &mut [f32]) {
        with_act!(act, f => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f(v);
            }
        })
    }
}

/// `out[i] = act(x[i])` (serial). Lengths must match.
pub fn activation_into(act: Activation, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    exact_len("Activation", "output", out.len(), x.len())?;
    act_into_unchecked(act, x, out);
    Ok(())
}

/// Cost of one element of an activation, in "simple op" units, for the
/// parallel split.
fn act_cost(act: Activation) -> usize {
    match act {
        Activation::Relu | Activation::Neg | Activation::Abs => 1,
        Activation::Sqrt | Activation::Rsqrt => 2,
        _ => 8,
    }
}

/// `out[i] = act(x[i])`, parallel over chunks for large tensors. Runs
/// over `min(x.len(), out.len())` elements (run_op checks they are equal).
pub fn activation(act: Activation, x: &[f32], out: &mut [f32]) {
    const CHUNK: usize = 4096;
    let n = out.len().min(x.len());
    let whole = n / CHUNK * CHUNK;
    let (head, tail) = out[..n].split_at_mut(whole);
    par_rows(head, CHUNK, CHUNK * act_cost(act), |row0, chunk| {
        let s = row0 * CHUNK;
        act_into_unchecked(act, &x[s..s + chunk.len()], chunk);
    });
    act_into_unchecked(act, &x[whole..n], tail);
}

simd_dispatch! {
    /// `out[i] = op(a[i], b[i])` (serial, lengths from `out`).
    pub fn binary_vv(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
        with_binop!(op, f => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        })
    }
}

simd_dispatch! {
    /// `out[i] = op(a[i], s)` (serial).
    pub fn binary_vs(op: BinaryOp, a: &[f32], s: f32, out: &mut [f32]) {
        with_binop!(op, f => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x, s);
            }
        })
    }
}

simd_dispatch! {
    /// `out[i] = op(s, b[i])` (serial).
    pub fn binary_sv(op: BinaryOp, s: f32, b: &[f32], out: &mut [f32]) {
        with_binop!(op, f => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = f(s, y);
            }
        })
    }
}

simd_dispatch! {
    /// `x[i] = op(x[i], b[i])` in place (serial).
    pub fn binary_inplace(op: BinaryOp, x: &mut [f32], b: &[f32]) {
        with_binop!(op, f => {
            for (o, &y) in x.iter_mut().zip(b) {
                *o = f(*o, y);
            }
        })
    }
}

/// One scalar binary op.
pub fn binary_scalar(op: BinaryOp, a: f32, b: f32) -> f32 {
    with_binop!(op, f => f(a, b))
}

/// A broadcast binary op coalesced to `outer dims x inner run`.
struct BinPlan {
    /// Outer dims (row-major) with the strides of a and b.
    outer: Vec<(usize, usize, usize)>,
    /// Inner run length and whether a / b advance along it (stride 1) or
    /// stay (stride 0).
    inner: usize,
    a_vec: bool,
    b_vec: bool,
}

fn plan_binary(a_dims: &[usize], b_dims: &[usize], out_dims: &[usize]) -> BinPlan {
    let r = out_dims.len();
    let pad = |d: &[usize]| -> Vec<usize> {
        let mut v = vec![1; r - d.len()];
        v.extend_from_slice(d);
        v
    };
    let (ad, bd) = (pad(a_dims), pad(b_dims));
    let strides = |d: &[usize]| -> Vec<usize> {
        let mut s = vec![0; r];
        let mut acc = 1;
        for i in (0..r).rev() {
            s[i] = if d[i] == 1 { 0 } else { acc };
            acc *= d[i];
        }
        s
    };
    let (sa, sb) = (strides(&ad), strides(&bd));
    // Drop size-1 dims, then merge neighbours that are contiguous in both.
    let mut dims: Vec<(usize, usize, usize)> = Vec::new();
    for i in 0..r {
        let n = out_dims[i];
        if n == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            if last.1 == sa[i] * n && last.2 == sb[i] * n {
                *last = (last.0 * n, sa[i], sb[i]);
                continue;
            }
        }
        dims.push((n, sa[i], sb[i]));
    }
    let (inner, ia, ib) = dims.pop().unwrap_or((1, 1, 1));
    BinPlan {
        outer: dims,
        inner,
        a_vec: ia != 0,
        b_vec: ib != 0,
    }
}

/// Broadcasting binary op: `out = op(a, b)` with numpy rules, parallel
/// over rows of the coalesced inner run for large outputs.
pub fn binary(
    op: BinaryOp,
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out: &mut [f32],
    out_dims: &[usize],
) -> Result<(), KernelError> {
    let name = "Binary";
    exact_len(name, "lhs", a.len(), a_dims.iter().product())?;
    exact_len(name, "rhs", b.len(), b_dims.iter().product())?;
    exact_len(name, "output", out.len(), out_dims.iter().product())?;
    match broadcast_dims(a_dims, b_dims) {
        Some(d) if d == out_dims => {}
        _ => {
            return Err(bad_shape(
                name,
                format!("lhs {a_dims:?} and rhs {b_dims:?} do not broadcast to {out_dims:?}"),
            ))
        }
    }
    if out.is_empty() {
        return Ok(());
    }
    let plan = plan_binary(a_dims, b_dims, out_dims);
    let inner = plan.inner;
    let cost = if op == BinaryOp::Pow { 16 } else { 1 };
    par_rows(out, inner, inner * cost, |row0, chunk| {
        for (ri, orow) in chunk.chunks_exact_mut(inner).enumerate() {
            // Offsets of this row in a and b.
            let mut r = row0 + ri;
            let (mut oa, mut ob) = (0usize, 0usize);
            for &(n, sa, sb) in plan.outer.iter().rev() {
                let i = r % n;
                r /= n;
                oa += i * sa;
                ob += i * sb;
            }
            match (plan.a_vec, plan.b_vec) {
                (true, true) => binary_vv(op, &a[oa..oa + inner], &b[ob..ob + inner], orow),
                (true, false) => binary_vs(op, &a[oa..oa + inner], b[ob], orow),
                (false, true) => binary_sv(op, a[oa], &b[ob..ob + inner], orow),
                (false, false) => orow.fill(binary_scalar(op, a[oa], b[ob])),
            }
        }
    });
    Ok(())
}

simd_dispatch! {
    fn swiglu_row(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, &x), &y) in out.iter_mut().zip(g).zip(u) {
            *o = simd::silu_m::<M>(x) * y;
        }
    }
}

/// `out = silu(gate) * up` (all the same length), parallel when large.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    exact_len("FusedSwiGLU", "gate", gate.len(), out.len())?;
    exact_len("FusedSwiGLU", "up", up.len(), out.len())?;
    const CHUNK: usize = 4096;
    let n = out.len();
    let whole = n / CHUNK * CHUNK;
    let (head, tail) = out.split_at_mut(whole);
    par_rows(head, CHUNK, CHUNK * 8, |row0, chunk| {
        let s = row0 * CHUNK;
        swiglu_row(&gate[s..s + chunk.len()], &up[s..s + chunk.len()], chunk);
    });
    swiglu_row(&gate[whole..], &up[whole..], tail);
    Ok(())
}

/// Packed SwiGLU on rows: `x` rows are `[gate (n) | up (n)]`, `out` rows `n`.
pub fn swiglu_packed(x: &[f32], out: &mut [f32], n: usize) -> Result<(), KernelError> {
    if n == 0 {
        return exact_len("FusedSwiGLU", "output", out.len(), 0);
    }
    let rows = out.len() / n;
    exact_len("FusedSwiGLU", "output", out.len(), rows * n)?;
    exact_len("FusedSwiGLU", "input", x.len(), rows * 2 * n)?;
    par_rows(out, n, n * 8, |row0, chunk| {
        for (i, orow) in chunk.chunks_exact_mut(n).enumerate() {
            let xr = &x[(row0 + i) * 2 * n..(row0 + i + 1) * 2 * n];
            swiglu_row(&xr[..n], &xr[n..], orow);
        }
    });
    Ok(())
}
