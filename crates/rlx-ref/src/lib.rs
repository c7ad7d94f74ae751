//! rlx-ref: the reference interpreter of rlx, the test oracle for every backend.
//!
//! It is naive on purpose: plain loops with index arithmetic, one node at a
//! time in schedule order, no parallelism and no `unsafe`. Float values are
//! held and accumulated in f64 and converted to the node's dtype only when
//! returned; integer values (I32, I64, U8, Bool) are held exactly as i64.
//!
//! Every [`rlx_ir::Op`] follows the semantics documented in `rlx_ir::op`.
//! Details that the IR docs leave to the implementation:
//!
//! - `Relu`, `Max`, `Min` and `Reduce{Max, Min}` propagate NaN.
//! - `Softmax` of a row that is all `-inf` is NaN (as in PyTorch); an
//!   `Attention` query row whose keys are all masked outputs zeros.
//! - `Cast` from F32 first rounds the value to f32, then converts with Rust
//!   `as` (truncation toward zero, saturation, NaN -> 0); integer to integer
//!   also follows Rust `as` (wrapping); to `Bool` is `x != 0`. Casts to or
//!   from F16/BF16 are [`RefError::Unsupported`].
//! - `Gather` ids must lie in `0..rows`; any other id is
//!   [`RefError::IndexOutOfRange`].
//! - `GatedDeltaNet`, per (batch, head), with state `S [n, n]` (zeros or the
//!   carried state) and per step `t`:
//!   `S <- exp(g_t) S`; `d <- beta_t (v_t - S^T k_t)`; `S <- S + k_t ⊗ d`
//!   (`S[i][j] += k[i] d[j]`); `o_t <- S^T q_t / sqrt(n)`, where
//!   `(S^T k)[j] = sum_i S[i][j] k[i]`.
//! - `DequantMatMul` dequantizes each weight row to f32 exactly as ggml does
//!   (`rlx_formats::quant`), then multiplies in f64; `Int8` activations are
//!   first rounded to their Q8 values in f32 as `rlx_ir::op` specifies.
//!
//! # LSTM weight packing
//!
//! `Op::Lstm { hidden_size: H, num_layers: L, bidirectional, carry }` takes
//! inputs `x, w_ih, w_hh, bias` and, with `carry`, `h0, c0`. With `D = 2`
//! when bidirectional (else 1), `in = x.dims[2]` and
//! `max_in = max(in, D*H)`, all f32:
//!
//! - `x`: `[B, S, in]` (batch first);
//! - `w_ih`: `[L*D, 4H, max_in]`; slice `l*D + d` is PyTorch's
//!   `weight_ih_l{l}{_reverse if d == 1}`. Layer 0 uses its first `in`
//!   columns, later layers their first `D*H` columns; the remaining columns
//!   are padding and are ignored (zero them);
//! - `w_hh`: `[L*D, 4H, H]`, slice `l*D + d` is `weight_hh_l{l}{_reverse}`;
//! - `bias`: `[L*D, 4H]`, slice `l*D + d` is `bias_ih + bias_hh` of that
//!   layer and direction;
//! - `h0`, `c0` (with `carry`): `[L*D, B, H]`, PyTorch's layout; zeros otherwise.
//!
//! Rows of the `4H` axis are the gates in PyTorch order i, f, g, o. Per step:
//! `gates = w_ih x_t + w_hh h + bias`; `c = σ(f) c + σ(i) tanh(g)`;
//! `h = σ(o) tanh(c)`. The backward direction walks `t = S-1 .. 0`. The output
//! is the last layer's hidden states `[B, S, D*H]`: forward in `0..H`,
//! backward in `H..2H`; each layer feeds that same concatenation to the next.

#![deny(missing_docs)]
// Plain index loops are the house style here: they mirror the formulas.
#![allow(clippy::needless_range_loop)]

mod dequant;
mod math;
mod ops;
mod seq;
mod value;

pub use math::{activation, erf, erfc, max_nan, min_nan, sigmoid};

use rlx_ir::{DType, Graph, IrError, Node, NodeId, Op, Shape, Tensor};
use std::collections::HashMap;
use value::Value;

/// An error from [`run`] or [`run_all`]. Each names the node and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RefError {
    /// The graph failed [`Graph::verify`].
    #[error("invalid graph: {0}")]
    InvalidGraph(#[from] IrError),
    /// An Input or Param has no binding.
    #[error("node {node}: missing binding for {kind} '{name}', expected a tensor {expected}")]
    MissingBinding {
        /// The leaf node.
        node: NodeId,
        /// "input" or "param".
        kind: &'static str,
        /// The leaf's name.
        name: String,
        /// The shape and dtype the leaf declares.
        expected: Shape,
    },
    /// A binding's shape, dtype or data does not match its leaf.
    #[error(
        "node {node}: binding for {kind} '{name}' expected {expected}, got {got} \
         holding {got_len} {got_data} elements"
    )]
    BadBinding {
        /// The leaf node.
        node: NodeId,
        /// "input" or "param".
        kind: &'static str,
        /// The leaf's name.
        name: String,
        /// The shape and dtype the leaf declares.
        expected: Shape,
        /// The shape and dtype of the bound tensor.
        got: Shape,
        /// Number of elements in the bound tensor's data.
        got_len: usize,
        /// Element type of the bound tensor's data.
        got_data: DType,
    },
    /// The interpreter does not implement this op (or this dtype for it).
    #[error("node {node} ({op}): unsupported by the reference interpreter: {reason}")]
    Unsupported {
        /// The node.
        node: NodeId,
        /// Op name.
        op: &'static str,
        /// What is not supported.
        reason: String,
    },
    /// A `Gather` id outside `0..rows`.
    #[error(
        "node {node} (Gather): id {id} at position {position} of the ids is out of \
         range for a table of {rows} rows"
    )]
    IndexOutOfRange {
        /// The Gather node.
        node: NodeId,
        /// The offending id.
        id: i64,
        /// Flat position of the id in the ids tensor.
        position: usize,
        /// Rows in the table.
        rows: usize,
    },
    /// The interpreter produced a value whose dims differ from the node's
    /// recorded shape (an interpreter bug; never silently returned).
    #[error("node {node} ({op}): computed dims {got:?} ({len} elements) but the node records {expected}")]
    Internal {
        /// The node.
        node: NodeId,
        /// Op name.
        op: &'static str,
        /// Dims that were computed.
        got: Vec<usize>,
        /// Elements that were computed.
        len: usize,
        /// The recorded shape.
        expected: Shape,
    },
}

/// Run `graph` and return one tensor per `graph.outputs`, in order.
///
/// `bindings` holds a tensor for every Input and Param, by name; extra
/// bindings are ignored. The graph is verified first.
pub fn run(graph: &Graph, bindings: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, RefError> {
    graph.verify()?;
    let values = evaluate(graph, bindings)?;
    graph
        .outputs
        .iter()
        .map(|&o| to_tensor(graph.node(o), &values[o.index()]))
        .collect()
}

/// Run `graph` and return the value of every node, indexed by `NodeId`
/// (leaves included). For debugging and tests.
pub fn run_all(graph: &Graph, bindings: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, RefError> {
    graph.verify()?;
    let values = evaluate(graph, bindings)?;
    graph
        .nodes()
        .iter()
        .zip(&values)
        .map(|(n, v)| to_tensor(n, v))
        .collect()
}

fn to_tensor(node: &Node, v: &Value) -> Result<Tensor, RefError> {
    v.to_tensor(node.shape.dtype)
        .ok_or_else(|| RefError::Unsupported {
            node: node.id,
            op: node.op.name(),
            reason: format!("values of dtype {} cannot be returned", node.shape.dtype),
        })
}

/// Evaluate every node in schedule order. The graph must be verified.
fn evaluate(graph: &Graph, bindings: &HashMap<String, Tensor>) -> Result<Vec<Value>, RefError> {
    let mut values: Vec<Value> = Vec::with_capacity(graph.len());
    for node in graph.nodes() {
        let ins: Vec<&Value> = node.inputs.iter().map(|i| &values[i.index()]).collect();
        let v = eval_node(node, &ins, bindings)?;
        if v.dims != node.shape.dims || v.len() != node.shape.numel() {
            return Err(RefError::Internal {
                node: node.id,
                op: node.op.name(),
                got: v.dims.clone(),
                len: v.len(),
                expected: node.shape.clone(),
            });
        }
        values.push(v);
    }
    Ok(values)
}

/// Look up and check the binding of an Input or Param.
fn bind(
    node: &Node,
    kind: &'static str,
    name: &str,
    bindings: &HashMap<String, Tensor>,
) -> Result<Value, RefError> {
    let t = bindings.get(name).ok_or_else(|| RefError::MissingBinding {
        node: node.id,
        kind,
        name: name.to_string(),
        expected: node.shape.clone(),
    })?;
    let want = &node.shape;
    let byte_like = |d: DType| matches!(d, DType::U8 | DType::Bool);
    let dtype_ok =
        t.shape.dtype == want.dtype || (byte_like(t.shape.dtype) && byte_like(want.dtype));
    if t.shape.dims != want.dims || !dtype_ok || !t.data.fits(&t.shape) {
        return Err(RefError::BadBinding {
            node: node.id,
            kind,
            name: name.to_string(),
            expected: want.clone(),
            got: t.shape.clone(),
            got_len: t.data.len(),
            got_data: t.data.dtype(),
        });
    }
    let mut v = Value::from_tensor(t);
    v.dtype = want.dtype;
    Ok(v)
}

fn unsupported(node: &Node, reason: impl Into<String>) -> RefError {
    RefError::Unsupported {
        node: node.id,
        op: node.op.name(),
        reason: reason.into(),
    }
}

fn eval_node(
    node: &Node,
    ins: &[&Value],
    bindings: &HashMap<String, Tensor>,
) -> Result<Value, RefError> {
    let out = &node.shape.dims;
    Ok(match &node.op {
        Op::Input { name } => bind(node, "input", name, bindings)?,
        Op::Param { name } => bind(node, "param", name, bindings)?,
        Op::Constant { value } => Value::from_tensor(value),
        Op::MatMul => ops::matmul(ins[0], ins[1], out),
        Op::FusedMatMulBiasAct { activation } => {
            ops::matmul_bias_act(ins[0], ins[1], ins[2], *activation, out)
        }
        Op::Activation(a) => ops::unary(ins[0], *a),
        Op::Binary(b) => ops::binary(ins[0], ins[1], *b, out),
        Op::LayerNorm { eps, .. } => ops::layer_norm(ins[0], ins[1], Some(ins[2]), *eps),
        Op::RmsNorm { eps, .. } => ops::rms_norm(ins[0], ins[1], *eps),
        Op::FusedResidualLN { has_bias, eps } => {
            let bias = has_bias.then(|| ins[2]);
            let a = 2 + *has_bias as usize;
            let sum = ops::residual_sum(ins[0], ins[1], bias);
            ops::layer_norm(&sum, ins[a], Some(ins[a + 1]), *eps)
        }
        Op::FusedResidualRmsNorm { has_bias, eps } => {
            let bias = has_bias.then(|| ins[2]);
            let a = 2 + *has_bias as usize;
            let sum = ops::residual_sum(ins[0], ins[1], bias);
            ops::rms_norm(&sum, ins[a], *eps)
        }
        Op::Reshape { shape } => Value {
            dims: shape.clone(),
            ..ins[0].clone()
        },
        Op::Expand { shape } => ops::expand(ins[0], shape),
        Op::Cast { to } => ops::cast(ins[0], *to).map_err(|r| unsupported(node, r))?,
        Op::Gather { .. } => ops::gather(ins[0], ins[1], out).map_err(|(position, id)| {
            RefError::IndexOutOfRange {
                node: node.id,
                id,
                position,
                rows: ins[0].dims.first().copied().unwrap_or(0),
            }
        })?,
        Op::Narrow { axis, start, len } => ops::narrow(ins[0], *axis, *start, *len),
        Op::FusedSwiGLU { packed } => ops::swiglu(ins, *packed, out),
        Op::Concat { axis } => ops::concat(ins, *axis, out),
        Op::Rope {
            head_dim,
            n_rot,
            theta,
            style,
        } => seq::rope(
            ins[0],
            ins[1],
            ins.get(2).copied(),
            *head_dim,
            *n_rot,
            *theta,
            *style,
        ),
        Op::Attention {
            num_heads,
            head_dim,
            mask_kind,
            score_scale,
            attn_logit_softcap,
        } => seq::attention(
            ins,
            &seq::AttnParams {
                num_heads: *num_heads,
                head_dim: *head_dim,
                mask_kind: *mask_kind,
                score_scale: *score_scale,
                softcap: *attn_logit_softcap,
            },
        ),
        Op::GatedDeltaNet {
            state_size,
            carry_state,
        } => seq::gated_delta_net(ins, *state_size, *carry_state, out),
        Op::Lstm {
            hidden_size,
            num_layers,
            bidirectional,
            carry,
        } => seq::lstm(ins, *hidden_size, *num_layers, *bidirectional, *carry),
        Op::DequantMatMul {
            scheme,
            activations,
        } => dequant::dequant_matmul(ins[0], ins[1], *scheme, *activations, out)
            .map_err(|r| unsupported(node, r))?,
        Op::CacheWrite { .. } => {
            let pos = ins[2].ints()[0];
            let (cache, rows) = (ins[0], ins[1]);
            if pos < 0 || pos as usize + rows.dims[1] > cache.dims[1] {
                return Err(unsupported(
                    node,
                    format!(
                        "position {pos} + {} rows does not fit a cache of {} rows",
                        rows.dims[1], cache.dims[1]
                    ),
                ));
            }
            ops::cache_write(cache, rows, pos as usize)
        }
        Op::Softmax { axis } => ops::softmax(ins[0], *axis),
        Op::Transpose { perm } => ops::transpose(ins[0], perm),
        Op::Reduce {
            op,
            axes,
            keep_dims: _,
        } => ops::reduce(ins[0], *op, axes, out),
    })
}
