//! Shape inference: one rule per op. A rule returns the output shape or a
//! sentence saying what it expected.

use crate::shape::broadcast_dims;
use crate::{DType, MaskKind, Op, Shape};

type R = Result<Shape, String>;

fn arity(inputs: &[Shape], n: usize) -> Result<(), String> {
    if inputs.len() != n {
        return Err(format!("expected {n} inputs, got {}", inputs.len()));
    }
    Ok(())
}

fn float(s: &Shape, what: &str) -> Result<(), String> {
    if s.dtype != DType::F32 {
        return Err(format!("expected {what} to be f32, got {}", s.dtype));
    }
    Ok(())
}

fn last_axis(axis: i32, rank: usize) -> Result<(), String> {
    let ok = rank > 0 && (axis == -1 || axis == rank as i32 - 1);
    if !ok {
        return Err(format!(
            "expected normalization over the last axis (-1 or {}), got axis {axis}",
            rank as i32 - 1
        ));
    }
    Ok(())
}

fn vec_of(s: &Shape, d: usize, what: &str) -> Result<(), String> {
    if s.dims != [d] {
        return Err(format!("expected {what} of shape [{d}], got {s}"));
    }
    float(s, what)
}

fn matmul_shape(a: &Shape, b: &Shape) -> R {
    float(a, "lhs")?;
    float(b, "rhs")?;
    if a.rank() < 2 || b.rank() < 2 {
        return Err("expected both operands to have rank >= 2".into());
    }
    let (m, k) = (a.dims[a.rank() - 2], a.dims[a.rank() - 1]);
    let (k2, n) = (b.dims[b.rank() - 2], b.dims[b.rank() - 1]);
    if k != k2 {
        return Err(format!("expected lhs K ({k}) to equal rhs K ({k2})"));
    }
    let batch = broadcast_dims(&a.dims[..a.rank() - 2], &b.dims[..b.rank() - 2])
        .ok_or("expected broadcastable batch dims")?;
    let mut dims = batch;
    dims.extend([m, n]);
    Ok(Shape::new(&dims, DType::F32))
}

fn norm_residual(inputs: &[Shape], has_bias: bool, n_affine: usize) -> R {
    arity(inputs, 2 + has_bias as usize + n_affine)?;
    let x = &inputs[0];
    float(x, "x")?;
    if inputs[1] != *x {
        return Err(format!("expected residual of shape {x}, got {}", inputs[1]));
    }
    let d = x.last_dim();
    for s in &inputs[2..] {
        vec_of(s, d, "bias/gamma/beta")?;
    }
    Ok(x.clone())
}

/// Infer the output shape of `op` applied to inputs of the given shapes.
pub fn infer_shape(op: &Op, inputs: &[Shape]) -> R {
    match op {
        Op::Input { .. } | Op::Param { .. } => {
            Err("leaves have no inferred shape; they carry their own".into())
        }
        Op::Constant { value } => {
            arity(inputs, 0)?;
            if !value.data.fits(&value.shape) {
                return Err(format!(
                    "expected constant data to fill {} ({} elements of {:?})",
                    value.shape,
                    value.data.len(),
                    value.data.dtype()
                ));
            }
            Ok(value.shape.clone())
        }
        Op::MatMul => {
            arity(inputs, 2)?;
            matmul_shape(&inputs[0], &inputs[1])
        }
        Op::FusedMatMulBiasAct { .. } => {
            arity(inputs, 3)?;
            let out = matmul_shape(&inputs[0], &inputs[1])?;
            vec_of(&inputs[2], out.last_dim(), "bias")?;
            Ok(out)
        }
        Op::Activation(_) => {
            arity(inputs, 1)?;
            float(&inputs[0], "x")?;
            Ok(inputs[0].clone())
        }
        Op::Binary(_) => {
            arity(inputs, 2)?;
            let (a, b) = (&inputs[0], &inputs[1]);
            float(a, "lhs")?;
            float(b, "rhs")?;
            let dims = broadcast_dims(&a.dims, &b.dims)
                .ok_or_else(|| "expected broadcast-compatible shapes".to_string())?;
            Ok(Shape::new(&dims, DType::F32))
        }
        Op::LayerNorm { axis, .. } => {
            arity(inputs, 3)?;
            let x = &inputs[0];
            float(x, "x")?;
            last_axis(*axis, x.rank())?;
            vec_of(&inputs[1], x.last_dim(), "gamma")?;
            vec_of(&inputs[2], x.last_dim(), "beta")?;
            Ok(x.clone())
        }
        Op::RmsNorm { axis, .. } => {
            arity(inputs, 2)?;
            let x = &inputs[0];
            float(x, "x")?;
            last_axis(*axis, x.rank())?;
            vec_of(&inputs[1], x.last_dim(), "gamma")?;
            Ok(x.clone())
        }
        Op::FusedResidualLN { has_bias, .. } => norm_residual(inputs, *has_bias, 2),
        Op::FusedResidualRmsNorm { has_bias, .. } => norm_residual(inputs, *has_bias, 1),
        Op::Reshape { shape } => {
            arity(inputs, 1)?;
            let n = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    format!("expected a target shape whose size fits, {shape:?} overflows")
                })?;
            if Some(n) != inputs[0].checked_numel() {
                return Err(format!(
                    "expected target {:?} to hold {} elements, it holds {n}",
                    shape,
                    inputs[0].numel()
                ));
            }
            Ok(inputs[0].with_dims(shape))
        }
        Op::Expand { shape } => {
            arity(inputs, 1)?;
            match broadcast_dims(&inputs[0].dims, shape) {
                Some(d) if d == *shape => Ok(inputs[0].with_dims(shape)),
                _ => Err(format!("expected a shape broadcastable to {shape:?}")),
            }
        }
        Op::Cast { to } => {
            arity(inputs, 1)?;
            Ok(inputs[0].with_dtype(*to))
        }
        Op::Gather { axis } => {
            arity(inputs, 2)?;
            let (t, ids) = (&inputs[0], &inputs[1]);
            if *axis != 0 {
                return Err(format!("expected axis 0, got {axis}"));
            }
            if t.rank() < 1 {
                return Err("expected a table of rank >= 1".into());
            }
            if !ids.dtype.is_index() {
                return Err(format!("expected i32 or i64 ids, got {}", ids.dtype));
            }
            let mut dims = ids.dims.clone();
            dims.extend_from_slice(&t.dims[1..]);
            Ok(t.with_dims(&dims))
        }
        Op::Narrow { axis, start, len } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            if *axis >= x.rank() || start + len > x.dims[*axis] || *len == 0 {
                return Err(format!(
                    "expected axis < {} and 0 < start+len <= dim (axis {axis}, start {start}, len {len})",
                    x.rank()
                ));
            }
            let mut d = x.dims.clone();
            d[*axis] = *len;
            Ok(x.with_dims(&d))
        }
        Op::FusedSwiGLU { packed } => {
            if *packed {
                arity(inputs, 1)?;
                let x = &inputs[0];
                float(x, "x")?;
                if x.rank() == 0 || !x.last_dim().is_multiple_of(2) {
                    return Err("expected an even last dim holding [gate | up]".into());
                }
                let mut d = x.dims.clone();
                *d.last_mut().unwrap() /= 2;
                Ok(x.with_dims(&d))
            } else {
                arity(inputs, 2)?;
                float(&inputs[0], "gate")?;
                if inputs[0] != inputs[1] {
                    return Err("expected gate and up of the same shape".into());
                }
                Ok(inputs[0].clone())
            }
        }
        Op::Concat { axis } => {
            if inputs.len() < 2 {
                return Err(format!("expected >= 2 inputs, got {}", inputs.len()));
            }
            let first = &inputs[0];
            if *axis >= first.rank() {
                return Err(format!("expected axis < rank {}", first.rank()));
            }
            let mut total = 0;
            for s in inputs {
                let mut a = s.dims.clone();
                let mut b = first.dims.clone();
                if s.rank() != first.rank() || s.dtype != first.dtype {
                    return Err("expected inputs of one rank and dtype".into());
                }
                total += a[*axis];
                a[*axis] = 0;
                b[*axis] = 0;
                if a != b {
                    return Err(format!("expected equal dims except on axis {axis}"));
                }
            }
            let mut d = first.dims.clone();
            d[*axis] = total;
            Ok(first.with_dims(&d))
        }
        Op::Rope {
            head_dim, n_rot, ..
        } => {
            if inputs.len() == 3 {
                let f = &inputs[2];
                if f.dtype != DType::F32 || f.dims != [n_rot / 2] {
                    return Err(format!(
                        "expected frequency divisors f32 [{}] (n_rot / 2), got {f}",
                        n_rot / 2
                    ));
                }
            } else {
                arity(inputs, 2)?;
            }
            let (x, pos) = (&inputs[0], &inputs[1]);
            float(x, "x")?;
            if x.rank() != 3 || *head_dim == 0 || x.dims[2] % head_dim != 0 {
                return Err(format!("expected x [B, S, H*{head_dim}] of rank 3"));
            }
            if *n_rot > *head_dim || n_rot % 2 != 0 {
                return Err(format!("expected even n_rot <= head_dim, got {n_rot}"));
            }
            let (b, s) = (x.dims[0], x.dims[1]);
            let pos_ok = pos.dims == [s] || pos.dims == [b, s];
            if !pos.dtype.is_index() || !pos_ok {
                return Err(format!(
                    "expected integer positions of shape [{s}] or [{b}, {s}], got {pos}"
                ));
            }
            Ok(x.clone())
        }
        Op::Attention {
            num_heads,
            head_dim,
            mask_kind,
            ..
        } => {
            let want = if matches!(mask_kind, MaskKind::Custom | MaskKind::Bias) {
                4
            } else {
                3
            };
            arity(inputs, want)?;
            let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
            for (s, n) in [(q, "q"), (k, "k"), (v, "v")] {
                float(s, n)?;
                if s.rank() != 3 {
                    return Err(format!("expected {n} of rank 3 [B, S, H*D]"));
                }
            }
            let (b, sq) = (q.dims[0], q.dims[1]);
            if *num_heads == 0 || *head_dim == 0 || q.dims[2] != num_heads * head_dim {
                return Err(format!(
                    "expected q [B, S_q, {}] ({num_heads} heads x {head_dim})",
                    num_heads * head_dim
                ));
            }
            let sk = k.dims[1];
            if k.dims != v.dims || k.dims[0] != b || k.dims[2] % head_dim != 0 {
                return Err(format!(
                    "expected k and v of equal shape [{b}, S_k, Hkv*{head_dim}]"
                ));
            }
            let hkv = k.dims[2] / head_dim;
            if hkv == 0 || num_heads % hkv != 0 {
                return Err(format!(
                    "expected query heads ({num_heads}) divisible by kv heads ({hkv})"
                ));
            }
            match mask_kind {
                MaskKind::Custom => {
                    let m = &inputs[3];
                    if m.dims != [b, sk]
                        || !(m.dtype == DType::F32
                            || m.dtype == DType::U8
                            || m.dtype == DType::Bool)
                    {
                        return Err(format!(
                            "expected a Custom keep-mask f32/u8/bool[{b},{sk}], got {m}"
                        ));
                    }
                }
                MaskKind::Bias => {
                    let m = &inputs[3];
                    let full = [b, *num_heads, sq, sk];
                    let ok = m.dtype == DType::F32
                        && m.rank() == 4
                        && broadcast_dims(&m.dims, &full).as_deref() == Some(&full[..]);
                    if !ok {
                        return Err(format!(
                            "expected an f32 bias broadcastable to {full:?}, got {m}"
                        ));
                    }
                }
                MaskKind::SlidingWindow(0) => {
                    return Err("expected a sliding window of at least 1".into())
                }
                _ => {}
            }
            Ok(q.clone())
        }
        Op::GatedDeltaNet {
            state_size,
            carry_state,
        } => {
            arity(inputs, 5 + *carry_state as usize)?;
            let q = &inputs[0];
            if q.rank() != 4 || q.dims[3] != *state_size {
                return Err(format!("expected q [B, S, H, {state_size}]"));
            }
            for s in &inputs[..5] {
                float(s, "q/k/v/g/beta")?;
            }
            if inputs[1] != *q || inputs[2] != *q {
                return Err("expected q, k and v of one shape".into());
            }
            let gate = &q.dims[..3];
            if inputs[3].dims != gate || inputs[4].dims != gate {
                return Err(format!("expected g and beta of shape {gate:?}"));
            }
            let (b, s, h, n) = (q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
            if *carry_state {
                if inputs[5].dims != [b, h, n, n] {
                    return Err(format!("expected state [{b}, {h}, {n}, {n}]"));
                }
                Ok(q.with_dims(&[b, s + n, h, n]))
            } else {
                Ok(q.clone())
            }
        }
        Op::Lstm {
            hidden_size,
            num_layers,
            bidirectional,
            carry,
        } => {
            arity(inputs, 4 + 2 * *carry as usize)?;
            let x = &inputs[0];
            float(x, "x")?;
            if x.rank() != 3 || *num_layers == 0 {
                return Err("expected x [B, S, in] and at least one layer".into());
            }
            let d = if *bidirectional { 2 } else { 1 };
            let (b, s) = (x.dims[0], x.dims[1]);
            let h = *hidden_size;
            // Packing: w_ih [L*D, 4H, max(in, D*H)], w_hh [L*D, 4H, H],
            // bias [L*D, 4H] (b_ih + b_hh); see the rlx-ref crate docs.
            let ld = num_layers * d;
            let max_in = x.dims[2].max(d * h);
            let weights = [
                (&inputs[1], vec![ld, 4 * h, max_in], "w_ih"),
                (&inputs[2], vec![ld, 4 * h, h], "w_hh"),
                (&inputs[3], vec![ld, 4 * h], "bias"),
            ];
            for (w, want, what) in weights {
                float(w, what)?;
                if w.dims != want {
                    return Err(format!("expected {what} of shape {want:?}, got {w}"));
                }
            }
            if *carry {
                for st in &inputs[4..6] {
                    float(st, "h0/c0")?;
                    if st.dims != [num_layers * d, b, h] {
                        return Err(format!("expected h0/c0 [{}, {b}, {h}]", num_layers * d));
                    }
                }
            }
            Ok(x.with_dims(&[b, s, d * h]))
        }
        Op::DequantMatMul { scheme, .. } => {
            arity(inputs, 2)?;
            let (x, w) = (&inputs[0], &inputs[1]);
            float(x, "x")?;
            let k = x.last_dim();
            let rb = scheme.row_bytes(k).ok_or_else(|| {
                format!(
                    "expected K ({k}) to be a multiple of the {} block size {}",
                    scheme.name(),
                    scheme.block_elems()
                )
            })?;
            if w.dtype != DType::U8 || w.rank() != 2 || w.dims[1] != rb {
                return Err(format!(
                    "expected packed {} weights u8[N, {rb}] for K = {k}",
                    scheme.name()
                ));
            }
            let mut d = x.dims.clone();
            *d.last_mut().unwrap() = w.dims[0];
            Ok(x.with_dims(&d))
        }
        Op::CacheWrite { axis } => {
            arity(inputs, 3)?;
            let (c, x, pos) = (&inputs[0], &inputs[1], &inputs[2]);
            float(c, "cache")?;
            float(x, "new rows")?;
            if *axis != 1 || c.rank() != 3 || x.rank() != 3 {
                return Err("expected axis 1, cache [B, ctx, D] and rows [B, n, D]".into());
            }
            if x.dims[0] != c.dims[0] || x.dims[2] != c.dims[2] || x.dims[1] > c.dims[1] {
                return Err(format!(
                    "expected rows [{}, <= {}, {}]",
                    c.dims[0], c.dims[1], c.dims[2]
                ));
            }
            if !pos.dtype.is_index() || pos.dims != [1] {
                return Err(format!("expected an integer position [1], got {pos}"));
            }
            Ok(c.clone())
        }
        Op::Softmax { axis } => {
            arity(inputs, 1)?;
            float(&inputs[0], "x")?;
            if *axis >= inputs[0].rank() {
                return Err(format!("expected axis < rank {}", inputs[0].rank()));
            }
            Ok(inputs[0].clone())
        }
        Op::Transpose { perm } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() {
                return Err(format!("expected a permutation of {} axes", x.rank()));
            }
            for &p in perm {
                if p >= x.rank() || seen[p] {
                    return Err(format!("expected a permutation of 0..{}", x.rank()));
                }
                seen[p] = true;
            }
            let d: Vec<usize> = perm.iter().map(|&p| x.dims[p]).collect();
            Ok(x.with_dims(&d))
        }
        Op::Reduce {
            axes, keep_dims, ..
        } => {
            arity(inputs, 1)?;
            let x = &inputs[0];
            float(x, "x")?;
            if axes.is_empty()
                || axes.windows(2).any(|w| w[0] >= w[1])
                || axes.iter().any(|&a| a >= x.rank())
            {
                return Err(format!("expected ascending distinct axes < {}", x.rank()));
            }
            let mut d = Vec::new();
            for (i, &n) in x.dims.iter().enumerate() {
                if axes.contains(&i) {
                    if *keep_dims {
                        d.push(1);
                    }
                } else {
                    d.push(n);
                }
            }
            Ok(x.with_dims(&d))
        }
    }
}
