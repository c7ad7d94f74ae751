//! Quantized GEMVs with their neighbours, inside compiled segments.
//!
//! A decode step is latency-bound: every kernel costs a few microseconds
//! whatever its work, and a layer's RmsNorms, SwiGLU and residual Adds
//! launch as many kernels as its matmuls. Here a `DequantMatMul` of at most
//! [`FUSED_ROWS_MAX`] rows absorbs
//! - a prologue: the `RmsNorm` or packed `FusedSwiGLU` that makes its
//!   activations, when the matmul is that node's only user (each warp
//!   recomputes the row's RMS; the SwiGLU is applied as activations load);
//! - an epilogue: the `Add` that is the matmul's only user, when the other
//!   operand is a residual of the product's shape or a bias `[N]`.
//!
//! The group launches one GEMV at its last node (the root): the Add when
//! there is an epilogue, else the matmul. The other nodes launch nothing,
//! and their values are never materialized. Every node must be f32 in f32
//! storage and none but the root may be a segment output. Thunks never
//! fuse: a thunk is one op by definition.

use crate::fuse::Fusion;
use crate::quant::FUSED_ROWS_MAX;
use crate::store::{Dt, Store};
use rlx_ir::{ActivationPrecision, BinaryOp, DType, Graph, Node, NodeId, Op};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One GEMV with what it absorbs.
#[derive(Debug)]
pub(crate) struct GemvFusion {
    /// The `DequantMatMul`.
    pub matmul: NodeId,
    /// The `RmsNorm` or `FusedSwiGLU` feeding it, if absorbed.
    pub prologue: Option<NodeId>,
    /// The absorbed `Add` and its other operand.
    pub add: Option<(NodeId, NodeId)>,
    /// The group in topological order; the root (which launches) last.
    pub nodes: Vec<NodeId>,
}

impl GemvFusion {
    /// Inputs of the group from outside it.
    pub fn inputs(&self, g: &Graph) -> Vec<NodeId> {
        let mut v = Vec::new();
        for &n in &self.nodes {
            for &i in &g.node(n).inputs {
                if !self.nodes.contains(&i) && !v.contains(&i) {
                    v.push(i);
                }
            }
        }
        v
    }
}

fn only_user(g: &Graph, outputs: &HashSet<NodeId>, id: NodeId) -> Option<NodeId> {
    match g.users(id).as_slice() {
        [u] if !outputs.contains(&id) => Some(*u),
        _ => None,
    }
}

/// The matmul's `(m, k)` if it is a GEMV the fused kernel takes.
fn gemv_dims(g: &Graph, n: &Node) -> Option<(usize, usize)> {
    let Op::DequantMatMul {
        scheme,
        activations: ActivationPrecision::F32,
    } = n.op
    else {
        return None;
    };
    if !crate::quant::has_kernels(scheme) {
        return None;
    }
    let (x, w) = (&g.node(n.inputs[0]).shape, &g.node(n.inputs[1]).shape);
    let k = x.last_dim();
    let m = x.numel().checked_div(k)?;
    let ok = x.dtype == DType::F32
        && k > 0
        && k.is_multiple_of(scheme.block_elems())
        && (1..=FUSED_ROWS_MAX).contains(&m)
        && w.dtype == DType::U8
        && w.rank() == 2
        && scheme.row_bytes(k) == Some(w.dims[1]);
    ok.then_some((m, k))
}

fn prologue(g: &Graph, outputs: &HashSet<NodeId>, mm: &Node, k: usize) -> Option<NodeId> {
    let p = g.node(mm.inputs[0]);
    if only_user(g, outputs, p.id) != Some(mm.id) {
        return None;
    }
    let f32_of = |i: NodeId| g.node(i).shape.dtype == DType::F32;
    match p.op {
        Op::RmsNorm { axis, .. } => {
            let rank = p.shape.rank() as i32;
            let gamma = &g.node(p.inputs[1]).shape;
            let ok = (axis == -1 || axis == rank - 1)
                && p.inputs.iter().all(|&i| f32_of(i))
                && gamma.numel() == k;
            ok.then_some(p.id)
        }
        Op::FusedSwiGLU { packed: true } => {
            let x = &g.node(p.inputs[0]).shape;
            (f32_of(p.inputs[0]) && x.last_dim() == 2 * k).then_some(p.id)
        }
        _ => None,
    }
}

fn epilogue(g: &Graph, outputs: &HashSet<NodeId>, mm: &Node) -> Option<(NodeId, NodeId)> {
    let add = g.node(only_user(g, outputs, mm.id)?);
    if add.op != Op::Binary(BinaryOp::Add) || add.shape != mm.shape {
        return None;
    }
    let other = match add.inputs[..] {
        [a, b] if a == mm.id && b != mm.id => b,
        [a, b] if b == mm.id && a != mm.id => a,
        _ => return None,
    };
    let o = &g.node(other).shape;
    let n = mm.shape.last_dim();
    let ok = o.dtype == DType::F32 && (o.dims == mm.shape.dims || o.dims == [n]);
    ok.then_some((add.id, other))
}

/// The GEMV groups of a segment's sub-graph: the root of each maps to
/// [`Fusion::Gemv`], the other members to [`Fusion::Interior`]. `store`
/// gives each node's storage; only f32 storage fuses, and no value read
/// through a folded (strided) Narrow.
pub(crate) fn find_gemv(g: &Graph, store: impl Fn(NodeId) -> Store) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for mm in g.nodes() {
        let Some((_, k)) = gemv_dims(g, mm) else {
            continue;
        };
        let prologue = prologue(g, &outputs, mm, k);
        let add = epilogue(g, &outputs, mm);
        if prologue.is_none() && add.is_none() {
            continue;
        }
        let mut nodes: Vec<NodeId> = prologue.into_iter().collect();
        nodes.push(mm.id);
        nodes.extend(add.map(|(a, _)| a));
        let f = GemvFusion {
            matmul: mm.id,
            prologue,
            add,
            nodes,
        };
        let mut touched = f.inputs(g);
        touched.extend(&f.nodes);
        let unfit = |i: NodeId| {
            let s = store(i);
            s.folded || (g.node(i).shape.dtype == DType::F32 && s.dt != Dt::F32)
        };
        if touched.iter().any(|&i| unfit(i)) {
            continue;
        }
        let f = Arc::new(f);
        let (&root, rest) = f.nodes.split_last().expect("a group has its matmul");
        for &i in rest {
            out.insert(i, Fusion::Interior);
        }
        out.insert(root, Fusion::Gemv(f.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{QuantScheme, Shape};

    fn dq(g: &mut Graph, x: NodeId, n: usize, k: usize, name: &str) -> NodeId {
        let w = g.param(name, Shape::new(&[n, k / 32 * 20], DType::U8));
        let op = Op::DequantMatMul {
            scheme: QuantScheme::Q4_1,
            activations: ActivationPrecision::F32,
        };
        g.push(op, vec![x, w]).unwrap()
    }

    fn kinds(m: &HashMap<NodeId, Fusion>, ids: &[NodeId]) -> Vec<&'static str> {
        ids.iter()
            .map(|i| match m.get(i) {
                None | Some(Fusion::None) => "-",
                Some(Fusion::Interior) => "interior",
                Some(Fusion::Root(_)) => "chain",
                Some(Fusion::Gemv(_)) => "gemv",
                Some(Fusion::RopeCache(_) | Fusion::Done) => "rope",
                Some(Fusion::Reduce(_)) => "reduce",
                Some(Fusion::GemmNorm(_)) => "gemm-norm",
                Some(Fusion::NormFeed(_)) => "norm-feed",
                Some(Fusion::Pool(_)) => "pool",
            })
            .collect()
    }

    #[test]
    fn a_decoder_layer_becomes_three_gemvs() {
        let mut g = Graph::new("layer");
        let x = g.input("x", Shape::f32(&[1, 1, 64]));
        let gamma = g.param("g", Shape::f32(&[64]));
        let h = g
            .push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-5,
                },
                vec![x, gamma],
            )
            .unwrap();
        let o = dq(&mut g, h, 64, 64, "wo");
        let x2 = g.push(Op::Binary(BinaryOp::Add), vec![x, o]).unwrap();
        let h2 = g
            .push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-5,
                },
                vec![x2, gamma],
            )
            .unwrap();
        let gu = dq(&mut g, h2, 256, 64, "wgu");
        let a = g.push(Op::FusedSwiGLU { packed: true }, vec![gu]).unwrap();
        let d = dq(&mut g, a, 64, 128, "wd");
        let x3 = g.push(Op::Binary(BinaryOp::Add), vec![x2, d]).unwrap();
        g.set_outputs(vec![x3]);
        g.verify().unwrap();
        let m = find_gemv(&g, |_| Store::default());
        assert_eq!(
            kinds(&m, &[h, o, x2, h2, gu, a, d, x3]),
            ["interior", "interior", "gemv", "interior", "gemv", "interior", "interior", "gemv"]
        );
        let Some(Fusion::Gemv(f)) = m.get(&x3) else {
            unreachable!()
        };
        assert_eq!((f.prologue, f.add), (Some(a), Some((x3, x2))));
        assert_eq!(f.inputs(&g), vec![gu, g.node(d).inputs[1], x2]);
    }

    #[test]
    fn shared_values_outputs_and_half_storage_do_not_fuse() {
        let mut g = Graph::new("shared");
        let x = g.input("x", Shape::f32(&[1, 64]));
        let gamma = g.param("g", Shape::f32(&[64]));
        let h = g
            .push(
                Op::RmsNorm {
                    axis: -1,
                    eps: 1e-5,
                },
                vec![x, gamma],
            )
            .unwrap();
        let a = dq(&mut g, h, 32, 64, "wa");
        let b = dq(&mut g, h, 32, 64, "wb");
        let s = g.push(Op::Binary(BinaryOp::Add), vec![a, b]).unwrap();
        let y = g.push(Op::Binary(BinaryOp::Add), vec![s, a]).unwrap();
        g.set_outputs(vec![y, s]);
        g.verify().unwrap();
        // h and a have two users each; b's Add may be an output (the root).
        let m = find_gemv(&g, |_| Store::default());
        assert_eq!(
            kinds(&m, &[h, a, b, s, y]),
            ["-", "-", "interior", "gemv", "-"]
        );
        let mut g = Graph::new("output");
        let x = g.input("x", Shape::f32(&[1, 64]));
        let r = g.input("r", Shape::f32(&[1, 32]));
        let a = dq(&mut g, x, 32, 64, "w");
        let y = g.push(Op::Binary(BinaryOp::Add), vec![a, r]).unwrap();
        g.set_outputs(vec![y, a]);
        // The product itself is an output: it must be materialized.
        assert!(find_gemv(&g, |_| Store::default()).is_empty());
        // A residual into a GEMV of 17 rows is beyond the fused kernel.
        let mut g = Graph::new("rows");
        let x = g.input("x", Shape::f32(&[17, 64]));
        let r = g.input("r", Shape::f32(&[17, 32]));
        let a = dq(&mut g, x, 32, 64, "w");
        let y = g.push(Op::Binary(BinaryOp::Add), vec![a, r]).unwrap();
        g.set_outputs(vec![y]);
        assert!(find_gemv(&g, |_| Store::default()).is_empty());
        // The same with one row fuses, unless a value is stored in 16 bits.
        let mut g = Graph::new("half");
        let x = g.input("x", Shape::f32(&[1, 64]));
        let r = g.input("r", Shape::f32(&[1, 32]));
        let a = dq(&mut g, x, 32, 64, "w");
        let y = g.push(Op::Binary(BinaryOp::Add), vec![a, r]).unwrap();
        g.set_outputs(vec![y]);
        assert_eq!(find_gemv(&g, |_| Store::default()).len(), 2);
        let half = |id: NodeId| Store {
            dt: if id == r { Dt::Bf16 } else { Dt::F32 },
            ..Store::default()
        };
        assert!(find_gemv(&g, half).is_empty());
    }
}
