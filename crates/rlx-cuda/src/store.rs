//! The storage plan: how each node's value is laid out on the device.
//!
//! - Element type of float tensors: f32, or (in a half [`Precision`]) bf16
//!   or f16 for matmul weights and for activations between ops that have
//!   mixed-precision kernels. Graph inputs and outputs stay f32, so callers
//!   always bind and read f32.
//! - Matmul weights (rank-2 params used only as a matmul's right operand)
//!   are stored transposed, `[out, in]`, so that cuBLAS runs the TN layout
//!   its fastest kernels use.
//!
//! The plan is a pure function of the graph and the precision; uploads
//! convert host params to it ([`device_bytes`]).

use rlx_ir::{DType, Graph, Node, NodeId, Op, Tensor};
use rlx_runtime::bind::tensor_bytes;
use rlx_runtime::Precision;
use std::borrow::Cow;

/// Device element type of a float tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) enum Dt {
    /// IEEE f32.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl Dt {
    /// The code the mixed-precision kernels take (0 f32, 1 bf16, 2 f16).
    pub(crate) fn code(self) -> i32 {
        match self {
            Dt::F32 => 0,
            Dt::Bf16 => 1,
            Dt::F16 => 2,
        }
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            Dt::F32 => 4,
            Dt::Bf16 | Dt::F16 => 2,
        }
    }

    /// The 16-bit type of a half precision, if any.
    pub(crate) fn half_of(p: Precision) -> Option<Dt> {
        match p {
            Precision::Bf16 => Some(Dt::Bf16),
            Precision::F16 => Some(Dt::F16),
            Precision::F32 | Precision::Tf32 => None,
        }
    }
}

/// How one node's value is stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) struct Store {
    /// Element type (meaningful for f32-typed nodes; others are native).
    pub dt: Dt,
    /// A rank-2 weight stored as its transpose (`[cols, rows]`).
    pub transposed: bool,
    /// A last-axis Narrow that is never materialized: it aliases its
    /// source, and the attention kernels that read it use the source's
    /// row stride.
    pub folded: bool,
    /// A small 16-bit matmul that may run on rlx's own kernel (`gemm_pf`)
    /// instead of cuBLASLt ([`StorePlan::allow_own_gemms`]).
    pub own_gemm: bool,
}

/// The storage of every node of one graph.
#[derive(Debug, Clone)]
pub(crate) struct StorePlan {
    /// The precision the plan was made for.
    pub precision: Precision,
    stores: Vec<Store>,
}

/// Ops with mixed-precision kernels: they read and write any [`Dt`].
fn half_capable(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul
            | Op::FusedMatMulBiasAct { .. }
            | Op::Binary(_)
            | Op::Activation(_)
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::FusedResidualLN { .. }
            | Op::FusedResidualRmsNorm { .. }
            | Op::Softmax { .. }
            | Op::Reduce { .. }
            | Op::Attention { .. }
            | Op::Gather { .. }
    )
}

/// Ops that move elements without arithmetic: their output must have the
/// storage of their (float) inputs.
fn transparent(graph: &Graph, n: &Node) -> bool {
    match &n.op {
        Op::Reshape { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. }
        | Op::Transpose { .. } => true,
        Op::Cast { to } => n.inputs.first().map(|&i| graph.node(i).shape.dtype) == Some(*to),
        _ => false,
    }
}

/// Whether `user` can read input position `pos` in a 16-bit type.
fn reads_half(graph: &Graph, user: &Node, pos: usize) -> bool {
    if transparent(graph, user) {
        return true;
    }
    match &user.op {
        // The keep-mask / bias of attention is read as f32 (or u8).
        Op::Attention { .. } => pos < 3,
        op => half_capable(op),
    }
}

fn is_matmul(op: &Op) -> bool {
    matches!(op, Op::MatMul | Op::FusedMatMulBiasAct { .. })
}

/// Union-find root.
fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Whether `id` is stored in 16 bits under the current (partial) decisions.
fn is_half(
    graph: &Graph,
    id: NodeId,
    half_weight: &[bool],
    parent: &mut [usize],
    bad: &[bool],
) -> bool {
    let node = graph.node(id);
    if matches!(node.op, Op::Param { .. }) {
        return half_weight[id.index()];
    }
    node.shape.dtype == DType::F32 && !node.op.is_leaf() && !bad[find(parent, id.index())]
}

impl StorePlan {
    /// The plan for `graph` at `precision`.
    pub(crate) fn new(graph: &Graph, precision: Precision) -> StorePlan {
        let n = graph.len();
        let mut plan = StorePlan {
            precision,
            stores: vec![Store::default(); n],
        };
        let outputs: Vec<bool> = {
            let mut v = vec![false; n];
            for &o in &graph.outputs {
                v[o.index()] = true;
            }
            v
        };
        // Params used only as the right operand of rank-2-weight matmuls.
        let weight = |node: &Node| -> bool {
            matches!(node.op, Op::Param { .. })
                && node.shape.dtype == DType::F32
                && node.shape.rank() == 2
                && !outputs[node.id.index()]
                && !graph.users(node.id).is_empty()
                && graph.users(node.id).iter().all(|&u| {
                    let un = graph.node(u);
                    is_matmul(&un.op)
                        && un.inputs.get(1) == Some(&node.id)
                        && un.inputs[0] != node.id
                        && un.inputs.get(2) != Some(&node.id)
                })
        };
        for node in graph.nodes() {
            if weight(node) {
                plan.stores[node.id.index()].transposed = true;
            }
            let users = graph.users(node.id);
            if foldable_narrow(graph, node)
                && !outputs[node.id.index()]
                && !users.is_empty()
                && users.iter().all(|&u| {
                    let un = graph.node(u);
                    matches!(un.op, Op::Attention { .. })
                        && un.inputs.iter().skip(3).all(|&x| x != node.id)
                })
            {
                plan.stores[node.id.index()].folded = true;
            }
        }
        let Some(half) = Dt::half_of(precision) else {
            return plan;
        };
        // Activations: groups of nodes tied by transparent ops are half
        // together or not at all.
        let mut parent: Vec<usize> = (0..n).collect();
        for node in graph.nodes() {
            if transparent(graph, node) {
                for &i in &node.inputs {
                    if graph.node(i).shape.dtype.is_float() {
                        let (a, b) = (
                            find(&mut parent, node.id.index()),
                            find(&mut parent, i.index()),
                        );
                        parent[a] = b;
                    }
                }
            }
        }
        let mut bad = vec![false; n];
        for node in graph.nodes() {
            let i = node.id.index();
            let ok = node.shape.dtype == DType::F32
                && !node.op.is_leaf()
                && !outputs[i]
                && (half_capable(&node.op) || transparent(graph, node))
                && graph.users(node.id).iter().all(|&u| {
                    let un = graph.node(u);
                    un.inputs
                        .iter()
                        .enumerate()
                        .filter(|(_, &x)| x == node.id)
                        .all(|(pos, _)| reads_half(graph, un, pos))
                });
            if !ok {
                let r = find(&mut parent, i);
                bad[r] = true;
            }
        }
        let mut half_weight: Vec<bool> = graph.nodes().iter().map(weight).collect();
        // Matmul operands must agree (cuBLAS takes one input type), and a
        // half output needs half operands: demote until stable.
        loop {
            let mut changed = false;
            for node in graph.nodes() {
                if !is_matmul(&node.op) || node.inputs.len() < 2 {
                    continue;
                }
                let (a, b) = (node.inputs[0], node.inputs[1]);
                let ha = is_half(graph, a, &half_weight, &mut parent, &bad);
                let hb = is_half(graph, b, &half_weight, &mut parent, &bad);
                let ho = is_half(graph, node.id, &half_weight, &mut parent, &bad);
                for (id, h, other) in [(a, ha, hb), (b, hb, ha)] {
                    if h && !other {
                        if matches!(graph.node(id).op, Op::Param { .. }) {
                            half_weight[id.index()] = false;
                        } else {
                            let r = find(&mut parent, id.index());
                            bad[r] = true;
                        }
                        changed = true;
                    }
                }
                if ho && !(ha && hb) {
                    let r = find(&mut parent, node.id.index());
                    bad[r] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for node in graph.nodes() {
            let i = node.id.index();
            if is_half(graph, node.id, &half_weight, &mut parent, &bad) {
                plan.stores[i].dt = half;
            }
        }
        // Matmul biases follow their output when every user agrees.
        for node in graph.nodes() {
            if !matches!(node.op, Op::Param { .. })
                || node.shape.dtype != DType::F32
                || outputs[node.id.index()]
            {
                continue;
            }
            let users = graph.users(node.id);
            let all = !users.is_empty()
                && users.iter().all(|&u| {
                    let un = graph.node(u);
                    matches!(un.op, Op::FusedMatMulBiasAct { .. })
                        && un.inputs.get(2) == Some(&node.id)
                        && un.inputs[..2].iter().all(|&x| x != node.id)
                        && plan.stores[u.index()].dt == half
                });
            if all {
                plan.stores[node.id.index()].dt = half;
            }
        }
        plan
    }

    /// Un-fold every folded Narrow that has a user in another step
    /// (`step_of[node]`): a reader outside the Narrow's step sees a
    /// materialized tensor.
    pub(crate) fn unfold_across(&mut self, graph: &Graph, step_of: &[usize]) {
        for node in graph.nodes() {
            let i = node.id.index();
            if self.stores[i].folded
                && graph
                    .users(node.id)
                    .iter()
                    .any(|&u| step_of.get(u.index()) != step_of.get(i))
            {
                self.stores[i].folded = false;
            }
        }
    }

    /// Let every matmul of `graph` run on rlx's small-matmul kernel where
    /// its shapes fit (`CudaOptions::small_matmul_kernel`).
    pub(crate) fn allow_own_gemms(&mut self, graph: &Graph) {
        for n in graph.nodes() {
            if matches!(n.op, Op::MatMul | Op::FusedMatMulBiasAct { .. }) {
                self.stores[n.id.index()].own_gemm = true;
            }
        }
    }

    /// The storage of `id`.
    pub(crate) fn get(&self, id: NodeId) -> Store {
        self.stores.get(id.index()).copied().unwrap_or_default()
    }

    /// How many nodes are stored in 16 bits (for reports and tests).
    pub(crate) fn half_nodes(&self) -> usize {
        self.stores.iter().filter(|s| s.dt != Dt::F32).count()
    }
}

/// The bytes to upload for a host tensor stored as `store`.
pub(crate) fn device_bytes(t: &Tensor, store: Store) -> Result<Cow<'_, [u8]>, String> {
    if !store.transposed && store.dt == Dt::F32 {
        return Ok(Cow::Borrowed(tensor_bytes(t)));
    }
    let v = t
        .as_f32()
        .ok_or_else(|| format!("{}: a converted weight must be f32", t.shape))?;
    let v: Cow<'_, [f32]> = if store.transposed {
        if t.shape.rank() != 2 {
            return Err(format!("{}: only rank-2 weights are transposed", t.shape));
        }
        let (r, c) = (t.shape.dims[0], t.shape.dims[1]);
        let mut o = vec![0f32; r * c];
        for i in 0..r {
            for j in 0..c {
                o[j * r + i] = v[i * c + j];
            }
        }
        Cow::Owned(o)
    } else {
        Cow::Borrowed(v)
    };
    Ok(match store.dt {
        Dt::F32 => Cow::Owned(bytemuck::cast_slice(&v).to_vec()),
        Dt::Bf16 => Cow::Owned(
            v.iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
                .collect(),
        ),
        Dt::F16 => Cow::Owned(
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
                .collect(),
        ),
    })
}

/// Whether `node` is a last-axis Narrow of a rank-3 tensor that attention
/// kernels can read in place (row stride = the source's width).
pub(crate) fn foldable_narrow(graph: &Graph, node: &Node) -> bool {
    let Op::Narrow { axis, .. } = node.op else {
        return false;
    };
    let Some(&src) = node.inputs.first() else {
        return false;
    };
    let s = &graph.node(src).shape;
    s.rank() == 3 && axis == 2 && s.dtype == DType::F32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::op::{Activation, BinaryOp, MaskKind};
    use rlx_ir::Shape;

    /// x -> matmul(w) + b, gelu -> attention -> LN -> output.
    fn block() -> (Graph, [NodeId; 8]) {
        let mut g = Graph::new("blk");
        let x = g.input("x", Shape::f32(&[1, 4, 8]));
        let m = g.input("m", Shape::f32(&[1, 4]));
        let w = g.param("w", Shape::f32(&[8, 8]));
        let b = g.param("b", Shape::f32(&[8]));
        let gm = g.param("g", Shape::f32(&[8]));
        let h = g
            .push(
                Op::FusedMatMulBiasAct {
                    activation: Some(Activation::Gelu),
                },
                vec![x, w, b],
            )
            .unwrap();
        let att = g
            .push(
                Op::Attention {
                    num_heads: 2,
                    head_dim: 4,
                    mask_kind: MaskKind::Custom,
                    score_scale: None,
                    attn_logit_softcap: None,
                },
                vec![h, h, h, m],
            )
            .unwrap();
        let w2 = g.param("w2", Shape::f32(&[8, 8]));
        let p = g.push(Op::MatMul, vec![att, w2]).unwrap();
        let y = g
            .push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-6,
                },
                vec![p, gm],
            )
            .unwrap();
        let z = g.push(Op::Binary(BinaryOp::Add), vec![y, y]).unwrap();
        g.set_outputs(vec![z]);
        (g, [x, w, b, h, att, p, y, z])
    }

    #[test]
    fn f32_plan_transposes_weights_only() {
        let (g, [x, w, b, h, ..]) = block();
        let p = StorePlan::new(&g, Precision::F32);
        assert!(p.get(w).transposed && !p.get(b).transposed && !p.get(x).transposed);
        assert_eq!(p.half_nodes(), 0);
        assert!(!p.get(h).transposed);
    }

    #[test]
    fn half_plan_keeps_the_io_f32_and_operands_agreeing() {
        let (g, [x, w, b, h, att, p2, y, z]) = block();
        let p = StorePlan::new(&g, Precision::Bf16);
        // The first matmul reads the f32 input x: its weight must stay f32,
        // so its output (and bias) cannot be half either.
        assert_eq!(p.get(x).dt, Dt::F32);
        assert_eq!(p.get(w).dt, Dt::F32);
        assert_eq!(p.get(h).dt, Dt::F32);
        assert_eq!(p.get(b).dt, Dt::F32);
        // Attention output feeds a matmul with a convertible weight: half.
        assert_eq!(p.get(att).dt, Dt::Bf16);
        assert_eq!(p.get(p2).dt, Dt::Bf16);
        assert_eq!(p.get(y).dt, Dt::Bf16);
        // The graph output stays f32.
        assert_eq!(p.get(z).dt, Dt::F32);
        let w2 = g.node(p2).inputs[1];
        assert_eq!(
            p.get(w2),
            Store {
                dt: Dt::Bf16,
                transposed: true,
                folded: false,
                own_gemm: false,
            }
        );
    }

    #[test]
    fn uploads_convert_and_transpose() {
        let t = Tensor::f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = device_bytes(
            &t,
            Store {
                dt: Dt::F32,
                transposed: true,
                folded: false,
                own_gemm: false,
            },
        )
        .unwrap();
        let v: Vec<f32> = bytemuck::pod_collect_to_vec(&b);
        assert_eq!(v, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let b = device_bytes(
            &t,
            Store {
                dt: Dt::Bf16,
                ..Store::default()
            },
        )
        .unwrap();
        assert_eq!(&b[..2], &0x3f80u16.to_le_bytes());
        let b = device_bytes(
            &t,
            Store {
                dt: Dt::F16,
                ..Store::default()
            },
        )
        .unwrap();
        assert_eq!(&b[..2], &0x3c00u16.to_le_bytes());
        let bad = Tensor::f32(&[2, 3, 1], vec![0.0; 6]);
        assert!(device_bytes(
            &bad,
            Store {
                dt: Dt::F32,
                transposed: true,
                folded: false,
                own_gemm: false,
            }
        )
        .is_err());
    }
}
