//! CPU kernels: one reference-checked kernel per op, plus the row-level
//! building blocks the fused segment compiler calls with its own epilogues.
//!
//! [`run_op`] is the thunk entry point: it validates buffers against shapes,
//! re-runs shape inference, and dispatches to the op family's module. The
//! building blocks in the submodules are serial unless they take a
//! `parallel` flag; `run_op` parallelizes them over rows with rayon when the
//! work is at least [`PAR_MIN_ELEMS`] elements.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx_tiles;
pub mod attention;
pub mod elementwise;
pub mod fma_peak;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod packed_gemm;
pub mod quant;
pub mod quant_panels;
pub mod quant_q8;
pub mod quant_q8k;
pub mod quant_rows;
pub mod recurrent;
pub mod reduce;
pub mod rope;
pub mod simd;
pub mod softmax;
pub mod team;

use rayon::prelude::*;
use rlx_ir::{infer::infer_shape, DType, Op, Shape};

/// Below this many elements of work a kernel runs on the calling thread:
/// a rayon fork/join costs several microseconds.
pub const PAR_MIN_ELEMS: usize = 16 * 1024;

/// A read-only input buffer, contiguous row-major. `U8` also carries `Bool`.
#[derive(Debug, Clone, Copy)]
pub enum In<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// i32 elements.
    I32(&'a [i32]),
    /// i64 elements.
    I64(&'a [i64]),
    /// u8 or bool elements (one byte each).
    U8(&'a [u8]),
}

/// A writable output buffer, contiguous row-major. `U8` also carries `Bool`.
#[derive(Debug)]
pub enum Out<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// i32 elements.
    I32(&'a mut [i32]),
    /// i64 elements.
    I64(&'a mut [i64]),
    /// u8 or bool elements (one byte each).
    U8(&'a mut [u8]),
}

impl In<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            In::F32(v) => v.len(),
            In::I32(v) => v.len(),
            In::I64(v) => v.len(),
            In::U8(v) => v.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Name of the buffer's element kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            In::F32(_) => "f32",
            In::I32(_) => "i32",
            In::I64(_) => "i64",
            In::U8(_) => "u8",
        }
    }
}

impl Out<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Out::F32(v) => v.len(),
            Out::I32(v) => v.len(),
            Out::I64(v) => v.len(),
            Out::U8(v) => v.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Name of the buffer's element kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Out::F32(_) => "f32",
            Out::I32(_) => "i32",
            Out::I64(_) => "i64",
            Out::U8(_) => "u8",
        }
    }
}

/// Why a kernel refused to run. Every variant names the op.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum KernelError {
    /// The op, or this combination of dtypes/attributes, has no CPU kernel.
    #[error("{op}: no CPU kernel for {what}")]
    Unsupported {
        /// Op name.
        op: &'static str,
        /// What was asked for (dtypes, attributes).
        what: String,
    },
    /// A leaf (Input/Param/Constant) was passed to `run_op`.
    #[error("{op}: leaves hold data and are bound by the executor, they are not run as kernels")]
    Leaf {
        /// Op name.
        op: &'static str,
    },
    /// Wrong number of input buffers or shapes.
    #[error("{op}: expected {expected} inputs, got {got}")]
    Arity {
        /// Op name.
        op: &'static str,
        /// Expected count (buffers must equal shapes).
        expected: usize,
        /// Count given.
        got: usize,
    },
    /// A buffer's length does not match its shape.
    #[error("{op}: {which} buffer holds {got} elements, expected {expected_len}")]
    BadBuffer {
        /// Op name.
        op: &'static str,
        /// Which buffer ("input 0", "output", "q", ...).
        which: String,
        /// Length the shape (or strides) require.
        expected_len: usize,
        /// Length given.
        got: usize,
    },
    /// A buffer's element kind does not match its shape's dtype.
    #[error("{op}: {which} has dtype {expected} but its buffer is {got}")]
    BadDtype {
        /// Op name.
        op: &'static str,
        /// Which buffer.
        which: String,
        /// The shape's dtype.
        expected: DType,
        /// The buffer kind given.
        got: &'static str,
    },
    /// Shapes or attributes are inconsistent with the op.
    #[error("{op}: {detail}")]
    BadShape {
        /// Op name.
        op: &'static str,
        /// Shapes involved and what was expected.
        detail: String,
    },
    /// An index (gather id) is outside its table.
    #[error("{op}: index {index} out of range for size {size}")]
    IndexOutOfRange {
        /// Op name.
        op: &'static str,
        /// The offending index.
        index: i64,
        /// The valid range is `0..size`.
        size: usize,
    },
}

pub(crate) fn bad_shape(op: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::BadShape {
        op,
        detail: detail.into(),
    }
}

/// Check that a slice has at least `need` elements.
pub(crate) fn need_len(
    op: &'static str,
    which: &str,
    got: usize,
    need: usize,
) -> Result<(), KernelError> {
    if got < need {
        return Err(KernelError::BadBuffer {
            op,
            which: which.to_string(),
            expected_len: need,
            got,
        });
    }
    Ok(())
}

/// Check that a slice has exactly `need` elements.
pub(crate) fn exact_len(
    op: &'static str,
    which: &str,
    got: usize,
    need: usize,
) -> Result<(), KernelError> {
    if got != need {
        return Err(KernelError::BadBuffer {
            op,
            which: which.to_string(),
            expected_len: need,
            got,
        });
    }
    Ok(())
}

/// Number of rayon worker threads.
pub fn num_threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Split `out` into chunks of whole rows of `row_len` elements and call
/// `f(first_row, chunk)` on each. Runs on the calling thread when the total
/// work (`rows * cost_per_row`) is below [`PAR_MIN_ELEMS`], otherwise in
/// parallel with a few chunks per rayon thread.
pub fn par_rows<T, F>(out: &mut [T], row_len: usize, cost_per_row: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    if row_len == 0 || out.is_empty() {
        return;
    }
    let rows = out.len() / row_len;
    let threads = num_threads();
    let work = rows.saturating_mul(cost_per_row.max(1));
    if threads == 1 || rows < 2 || work < PAR_MIN_ELEMS {
        f(0, out);
        return;
    }
    // A few chunks per thread for load balance, but each chunk at least
    // ~4K elements of work so the split is worth its cost.
    let by_threads = rows.div_ceil(threads * 4);
    let by_work = (4096 / cost_per_row.max(1)).max(1);
    let rows_per_chunk = by_threads.max(by_work).min(rows);
    out.par_chunks_mut(rows_per_chunk * row_len)
        .enumerate()
        .for_each(|(ci, chunk)| f(ci * rows_per_chunk, chunk));
}

fn check_inputs(op: &Op, inputs: &[In<'_>], in_shapes: &[&Shape]) -> Result<(), KernelError> {
    let name = op.name();
    if inputs.len() != in_shapes.len() {
        return Err(KernelError::Arity {
            op: name,
            expected: in_shapes.len(),
            got: inputs.len(),
        });
    }
    for (i, (buf, shape)) in inputs.iter().zip(in_shapes).enumerate() {
        let ok = matches!(
            (buf, shape.dtype),
            (In::F32(_), DType::F32)
                | (In::I32(_), DType::I32)
                | (In::I64(_), DType::I64)
                | (In::U8(_), DType::U8 | DType::Bool)
        );
        if !ok {
            if matches!(shape.dtype, DType::F16 | DType::BF16) {
                return Err(KernelError::Unsupported {
                    op: name,
                    what: format!("input {i} of dtype {}", shape.dtype),
                });
            }
            return Err(KernelError::BadDtype {
                op: name,
                which: format!("input {i}"),
                expected: shape.dtype,
                got: buf.kind(),
            });
        }
        exact_len(name, &format!("input {i}"), buf.len(), shape.numel())?;
    }
    Ok(())
}

fn check_output(op: &Op, out: &Out<'_>, out_shape: &Shape) -> Result<(), KernelError> {
    let name = op.name();
    let ok = matches!(
        (out, out_shape.dtype),
        (Out::F32(_), DType::F32)
            | (Out::I32(_), DType::I32)
            | (Out::I64(_), DType::I64)
            | (Out::U8(_), DType::U8 | DType::Bool)
    );
    if !ok {
        if matches!(out_shape.dtype, DType::F16 | DType::BF16) {
            return Err(KernelError::Unsupported {
                op: name,
                what: format!("output dtype {}", out_shape.dtype),
            });
        }
        return Err(KernelError::BadDtype {
            op: name,
            which: "output".into(),
            expected: out_shape.dtype,
            got: out.kind(),
        });
    }
    exact_len(name, "output", out.len(), out_shape.numel())
}

fn f32_in<'a>(op: &'static str, x: &In<'a>, i: usize) -> Result<&'a [f32], KernelError> {
    match x {
        In::F32(v) => Ok(v),
        other => Err(KernelError::BadDtype {
            op,
            which: format!("input {i}"),
            expected: DType::F32,
            got: other.kind(),
        }),
    }
}

fn f32_out<'a, 'b>(op: &'static str, out: &'b mut Out<'a>) -> Result<&'b mut [f32], KernelError> {
    match out {
        Out::F32(v) => Ok(v),
        other => Err(KernelError::BadDtype {
            op,
            which: "output".into(),
            expected: DType::F32,
            got: other.kind(),
        }),
    }
}

/// Integer positions or ids widened to i64.
fn index_in(op: &'static str, x: &In<'_>, i: usize) -> Result<Vec<i64>, KernelError> {
    match x {
        In::I32(v) => Ok(v.iter().map(|&p| p as i64).collect()),
        In::I64(v) => Ok(v.to_vec()),
        other => Err(KernelError::Unsupported {
            op,
            what: format!(
                "input {i} of element kind {} (expected i32 or i64)",
                other.kind()
            ),
        }),
    }
}

/// Call a generic movement kernel on an input and an output of the same
/// element kind.
macro_rules! same_kind {
    ($op:expr, $inp:expr, $out:expr, |$a:ident, $o:ident| $body:expr) => {
        match ($inp, $out) {
            (In::F32($a), Out::F32($o)) => $body,
            (In::I32($a), Out::I32($o)) => $body,
            (In::I64($a), Out::I64($o)) => $body,
            (In::U8($a), Out::U8($o)) => $body,
            (a, o) => Err(KernelError::Unsupported {
                op: $op,
                what: format!("input {} with output {}", a.kind(), o.kind()),
            }),
        }
    };
}

/// [`run_op`] for `MatMul` / `FusedMatMulBiasAct` whose 2-D right-hand side
/// is also available packed (`packed` must hold the same values as
/// `inputs[1]`). Validates exactly as [`run_op`] does.
pub fn run_matmul_packed(
    op: &Op,
    inputs: &[In<'_>],
    in_shapes: &[&Shape],
    packed: &packed_gemm::PackedB,
    mut out: Out<'_>,
    out_shape: &Shape,
) -> Result<(), KernelError> {
    let name = op.name();
    let act = match op {
        Op::MatMul => None,
        Op::FusedMatMulBiasAct { activation } => *activation,
        _ => return Err(bad_shape(name, "not a matmul")),
    };
    check_inputs(op, inputs, in_shapes)?;
    check_output(op, &out, out_shape)?;
    let (a_dims, b_dims) = (&in_shapes[0].dims, &in_shapes[1].dims);
    let k = *a_dims.last().unwrap_or(&0);
    let mut want = a_dims.clone();
    if let Some(last) = want.last_mut() {
        *last = packed.n();
    }
    if b_dims.as_slice() != [packed.k(), packed.n()] || k != packed.k() || want != out_shape.dims {
        return Err(bad_shape(
            name,
            format!(
                "{} x {} (packed [{}, {}]) does not give {out_shape}",
                in_shapes[0],
                in_shapes[1],
                packed.k(),
                packed.n()
            ),
        ));
    }
    let a = f32_in(name, &inputs[0], 0)?;
    let bias = match op {
        Op::FusedMatMulBiasAct { .. } => Some(f32_in(name, &inputs[2], 2)?),
        _ => None,
    };
    let o = f32_out(name, &mut out)?;
    let m = a_dims[..a_dims.len().saturating_sub(1)].iter().product();
    packed_gemm::gemm_packed(m, a, k, packed, o, packed.n(), bias, act, true)
}

/// A `DequantMatMul` over weights repacked into panels (the GGUF bytes read
/// as input 1 are only checked, not read). Checks as [`run_op`] does, and
/// that the panels are `[N, K]` of this node's shapes.
pub fn run_dequant_panels(
    op: &Op,
    inputs: &[In<'_>],
    in_shapes: &[&Shape],
    panels: &quant_panels::QuantPanels,
    mut out: Out<'_>,
    out_shape: &Shape,
) -> Result<(), KernelError> {
    let name = op.name();
    let Op::DequantMatMul { activations, .. } = op else {
        return Err(bad_shape(name, "panels serve DequantMatMul only"));
    };
    check_inputs(op, inputs, in_shapes)?;
    check_output(op, &out, out_shape)?;
    let k = in_shapes[0].last_dim();
    let n = in_shapes[1].dims.first().copied().unwrap_or(0);
    if (n, k) != (panels.n(), panels.k()) {
        return Err(bad_shape(
            name,
            format!(
                "{} x W[{n}] with K = {k} against panels [{}, {}]",
                in_shapes[0],
                panels.n(),
                panels.k()
            ),
        ));
    }
    let m = in_shapes[0].numel() / k.max(1);
    let x = f32_in(name, &inputs[0], 0)?;
    let o = f32_out(name, &mut out)?;
    panels.matmul(*activations, x, m, o, true)
}

/// Run one op. `inputs[i]` has shape `in_shapes[i]`; `out` has `out_shape`.
/// Buffers are contiguous row-major.
///
/// Validates buffer kinds and lengths against the shapes and the shapes
/// against the op's shape rule, then computes the op. Leaves are refused.
pub fn run_op(
    op: &Op,
    inputs: &[In<'_>],
    in_shapes: &[&Shape],
    out: Out<'_>,
    out_shape: &Shape,
) -> Result<(), KernelError> {
    run_op_with(op, inputs, in_shapes, out, out_shape, false)
}

/// [`run_op`], with `bf16` asking for bf16 products in the ops that have
/// them beyond the matmuls: `Attention` (see
/// [`attention::AttentionParams::bf16`]). The executor passes its
/// `CpuOptions::bf16`.
pub fn run_op_with(
    op: &Op,
    inputs: &[In<'_>],
    in_shapes: &[&Shape],
    mut out: Out<'_>,
    out_shape: &Shape,
    bf16: bool,
) -> Result<(), KernelError> {
    let name = op.name();
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => {
            return Err(KernelError::Leaf { op: name })
        }
        _ => {}
    }
    check_inputs(op, inputs, in_shapes)?;
    check_output(op, &out, out_shape)?;
    let owned: Vec<Shape> = in_shapes.iter().map(|s| (*s).clone()).collect();
    let inferred = infer_shape(op, &owned).map_err(|e| {
        bad_shape(
            name,
            format!(
                "inputs [{}]: {e}",
                owned
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    if inferred != *out_shape {
        return Err(bad_shape(
            name,
            format!("output shape {out_shape} but the inputs give {inferred}"),
        ));
    }
    let dims = |i: usize| in_shapes[i].dims.as_slice();

    match op {
        Op::MatMul => {
            let a = f32_in(name, &inputs[0], 0)?;
            let b = f32_in(name, &inputs[1], 1)?;
            let o = f32_out(name, &mut out)?;
            matmul::matmul(a, dims(0), b, dims(1), o, &out_shape.dims)
        }
        Op::FusedMatMulBiasAct { activation } => {
            let a = f32_in(name, &inputs[0], 0)?;
            let b = f32_in(name, &inputs[1], 1)?;
            let bias = f32_in(name, &inputs[2], 2)?;
            let o = f32_out(name, &mut out)?;
            matmul::matmul(a, dims(0), b, dims(1), o, &out_shape.dims)?;
            let n = bias.len();
            let act = *activation;
            par_rows(o, n, n * 4, |_, rows| {
                matmul::bias_act_rows(rows, bias, act);
            });
            Ok(())
        }
        Op::Activation(act) => {
            let x = f32_in(name, &inputs[0], 0)?;
            let o = f32_out(name, &mut out)?;
            elementwise::activation(*act, x, o);
            Ok(())
        }
        Op::Binary(bop) => {
            let a = f32_in(name, &inputs[0], 0)?;
            let b = f32_in(name, &inputs[1], 1)?;
            let o = f32_out(name, &mut out)?;
            elementwise::binary(*bop, a, dims(0), b, dims(1), o, &out_shape.dims)
        }
        Op::FusedSwiGLU { packed } => {
            let o = f32_out(name, &mut out)?;
            if *packed {
                let x = f32_in(name, &inputs[0], 0)?;
                elementwise::swiglu_packed(x, o, out_shape.last_dim())
            } else {
                let g = f32_in(name, &inputs[0], 0)?;
                let u = f32_in(name, &inputs[1], 1)?;
                elementwise::swiglu(g, u, o)
            }
        }
        Op::LayerNorm { eps, .. } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let g = f32_in(name, &inputs[1], 1)?;
            let b = f32_in(name, &inputs[2], 2)?;
            let o = f32_out(name, &mut out)?;
            norm::layer_norm(x, g, b, *eps, o, out_shape.last_dim())
        }
        Op::RmsNorm { eps, .. } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let g = f32_in(name, &inputs[1], 1)?;
            let o = f32_out(name, &mut out)?;
            norm::rms_norm(x, g, *eps, o, out_shape.last_dim())
        }
        Op::FusedResidualLN { has_bias, eps } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let r = f32_in(name, &inputs[1], 1)?;
            let mut i = 2;
            let bias = if *has_bias {
                i += 1;
                Some(f32_in(name, &inputs[2], 2)?)
            } else {
                None
            };
            let g = f32_in(name, &inputs[i], i)?;
            let b = f32_in(name, &inputs[i + 1], i + 1)?;
            let o = f32_out(name, &mut out)?;
            norm::residual_layer_norm(x, r, bias, g, b, *eps, o, out_shape.last_dim())
        }
        Op::FusedResidualRmsNorm { has_bias, eps } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let r = f32_in(name, &inputs[1], 1)?;
            let mut i = 2;
            let bias = if *has_bias {
                i += 1;
                Some(f32_in(name, &inputs[2], 2)?)
            } else {
                None
            };
            let g = f32_in(name, &inputs[i], i)?;
            let o = f32_out(name, &mut out)?;
            norm::residual_rms_norm(x, r, bias, g, *eps, o, out_shape.last_dim())
        }
        Op::Reshape { .. } => same_kind!(name, inputs[0], out, |a, o| movement::copy(a, o)),
        Op::Expand { shape } => same_kind!(name, inputs[0], out, |a, o| {
            movement::expand(a, dims(0), o, shape)
        }),
        Op::Narrow { axis, start, len } => same_kind!(name, inputs[0], out, |a, o| {
            movement::narrow(a, dims(0), *axis, *start, *len, o)
        }),
        Op::Transpose { perm } => same_kind!(name, inputs[0], out, |a, o| {
            movement::transpose(a, dims(0), perm, o)
        }),
        Op::Concat { axis } => movement::concat_any(inputs, in_shapes, *axis, out),
        Op::Gather { .. } => {
            let ids = index_in(name, &inputs[1], 1)?;
            let table_dims = dims(0);
            let row: usize = table_dims[1..].iter().product();
            let vocab = table_dims[0];
            same_kind!(name, inputs[0], out, |a, o| {
                movement::gather_rows(a, vocab, row, &ids, o)
            })
        }
        Op::Cast { to } => movement::cast(&inputs[0], *to, out),
        Op::Rope {
            head_dim,
            n_rot,
            theta,
            style,
        } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let pos = index_in(name, &inputs[1], 1)?;
            let o = f32_out(name, &mut out)?;
            let d = dims(0);
            let freqs = match inputs.get(2) {
                Some(_) => Some(std::sync::Arc::from(f32_in(name, &inputs[2], 2)?)),
                None => None,
            };
            let spec = rope::RopeSpec {
                head_dim: *head_dim,
                n_rot: *n_rot,
                theta: *theta,
                style: *style,
                freqs,
            };
            rope::rope(&spec, x, d[0], d[1], &pos, o)
        }
        Op::Attention {
            num_heads,
            head_dim,
            mask_kind,
            score_scale,
            attn_logit_softcap,
        } => {
            let q = f32_in(name, &inputs[0], 0)?;
            let k = f32_in(name, &inputs[1], 1)?;
            let v = f32_in(name, &inputs[2], 2)?;
            let (qd, kd) = (dims(0), dims(1));
            let hkv = kd[2] / head_dim;
            let mask = match mask_kind {
                rlx_ir::MaskKind::Custom => match inputs[3] {
                    In::F32(m) => attention::AttnMask::KeepF32(m),
                    In::U8(m) => attention::AttnMask::KeepU8(m),
                    ref other => {
                        return Err(KernelError::Unsupported {
                            op: name,
                            what: format!("a Custom mask of element kind {}", other.kind()),
                        })
                    }
                },
                rlx_ir::MaskKind::Bias => {
                    let m = f32_in(name, &inputs[3], 3)?;
                    let md = dims(3);
                    attention::AttnMask::Bias {
                        data: m,
                        dims: [md[0], md[1], md[2], md[3]],
                    }
                }
                _ => attention::AttnMask::None,
            };
            let p = attention::AttentionParams {
                batch: qd[0],
                seq_q: qd[1],
                seq_k: kd[1],
                num_heads: *num_heads,
                num_kv_heads: hkv,
                head_dim: *head_dim,
                scale: score_scale.unwrap_or(1.0 / (*head_dim as f32).sqrt()),
                softcap: *attn_logit_softcap,
                mask_kind: *mask_kind,
                q_row_stride: qd[2],
                k_row_stride: kd[2],
                v_row_stride: kd[2],
                out_row_stride: qd[2],
                bf16,
            };
            let o = f32_out(name, &mut out)?;
            attention::attention(&p, q, k, v, mask, o, true)
        }
        Op::CacheWrite { .. } => {
            let cache = f32_in(name, &inputs[0], 0)?;
            let rows = f32_in(name, &inputs[1], 1)?;
            let pos = index_in(name, &inputs[2], 2)?;
            let o = f32_out(name, &mut out)?;
            let p = pos
                .first()
                .copied()
                .ok_or_else(|| bad_shape(name, "empty position"))?;
            movement::cache_write(cache, dims(0), rows, dims(1), p, o)
        }
        Op::DequantMatMul {
            scheme,
            activations,
        } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let w = match inputs[1] {
                In::U8(w) => w,
                ref other => {
                    return Err(KernelError::BadDtype {
                        op: name,
                        which: "input 1 (packed weights)".into(),
                        expected: DType::U8,
                        got: other.kind(),
                    })
                }
            };
            let k = in_shapes[0].last_dim();
            let n = dims(1)[0];
            let m = x.len().checked_div(k).unwrap_or(0);
            let o = f32_out(name, &mut out)?;
            quant::dequant_matmul_act(*scheme, *activations, x, m, k, w, n, o, true)
        }
        Op::GatedDeltaNet {
            state_size,
            carry_state,
        } => {
            let f = |i: usize| f32_in(name, &inputs[i], i);
            let state = if *carry_state { Some(f(5)?) } else { None };
            let d = dims(0);
            let gd = recurrent::GdnDims {
                batch: d[0],
                seq: d[1],
                heads: d[2],
                n: *state_size,
            };
            let (q, k, v, g, beta) = (f(0)?, f(1)?, f(2)?, f(3)?, f(4)?);
            let o = f32_out(name, &mut out)?;
            let form = recurrent::GdnForm::Auto;
            recurrent::gated_delta_net(&gd, q, k, v, g, beta, state, form, o)
        }
        Op::Lstm {
            hidden_size,
            num_layers,
            bidirectional,
            carry,
        } => {
            let f = |i: usize| f32_in(name, &inputs[i], i);
            let state = if *carry { Some((f(4)?, f(5)?)) } else { None };
            let d = dims(0);
            let spec = recurrent::LstmSpec {
                batch: d[0],
                seq: d[1],
                input: d[2],
                hidden: *hidden_size,
                layers: *num_layers,
                bidirectional: *bidirectional,
            };
            let (x, wi, wh, b) = (f(0)?, f(1)?, f(2)?, f(3)?);
            let o = f32_out(name, &mut out)?;
            recurrent::lstm(&spec, x, wi, wh, b, state, o)
        }
        Op::Softmax { axis } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let o = f32_out(name, &mut out)?;
            softmax::softmax_axis(x, dims(0), *axis, o)
        }
        Op::Reduce {
            op: rop,
            axes,
            keep_dims: _,
        } => {
            let x = f32_in(name, &inputs[0], 0)?;
            let o = f32_out(name, &mut out)?;
            reduce::reduce(*rop, x, dims(0), axes, o)
        }
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => {
            Err(KernelError::Unsupported {
                op: name,
                what: "this op".into(),
            })
        }
    }
}
