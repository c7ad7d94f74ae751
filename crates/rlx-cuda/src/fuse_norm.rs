//! Matmuls that carry the LayerNorm reading them.
//!
//! Inside compiled segments a `FusedResidualLN` whose `x` or residual is a
//! 16-bit matmul against a `[out, in]` weight (plain or with a bias, no
//! activation; no other user, not a segment output) runs as one `gemm_ln`
//! launch: the matmul's tile, its bias, the residual sum and the row
//! statistics in one kernel, the normalization by the last block of each
//! row tile (see the kernel's comment in [`crate::mixed`]). A transformer
//! layer's output projection and second FFN matmul each lose a launch
//! and a round trip of their output through memory.
//!
//! A norm (LayerNorm, RMSNorm, with or without a residual) whose `x` is an
//! `Add` with no other user also reads the Add's two operands itself
//! ([`find_norm_adds`]): the second may repeat as a trailing block (a
//! BERT embedding sum, word + position, before its LayerNorm).
//!
//! Opt-in (`CudaOptions::fuse_matmul_norm`): on the H200 the kernel is
//! correct but slower than cuBLASLt and the norm kernel (MiniLM 1x128
//! bf16: 0.33 vs 0.22 ms per run; its 16 x 32 tiles wait on memory
//! latency). Only small row counts fuse (at most [`MAX_ROWS`]): each
//! 16-row tile
//! reads the whole weight, which pays while the matmul is latency-bound
//! and not once it is bandwidth-bound. Widths: the norm's `N` a multiple
//! of 32 up to 1024, the matmul's `K` a multiple of 64.

use crate::fuse::Fusion;
use crate::store::{Dt, Store};
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Rows (the product of the matmul's leading dims) up to which a matmul
/// and its norm fuse.
pub(crate) const MAX_ROWS: usize = 256;

/// A matmul whose output only its `FusedResidualLN` reads.
#[derive(Debug)]
pub(crate) struct GemmNorm {
    /// The absorbed matmul (`MatMul` or `FusedMatMulBiasAct` without an
    /// activation).
    pub matmul: NodeId,
    /// The norm input the matmul feeds (0: `x`, 1: the residual).
    pub pos: usize,
    /// `[matmul, norm]`: the group's nodes, the root last.
    pub nodes: Vec<NodeId>,
}

/// The matmul-norm groups of a segment's sub-graph, skipping nodes in
/// `claimed`: the norm maps to [`Fusion::GemmNorm`], its matmul to
/// [`Fusion::Interior`].
pub(crate) fn find_gemm_norms(
    g: &Graph,
    claimed: &HashSet<NodeId>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for ln in g.nodes() {
        if !matches!(ln.op, Op::FusedResidualLN { .. }) || claimed.contains(&ln.id) {
            continue;
        }
        let t = store(ln.id).dt;
        if t == Dt::F32 {
            continue;
        }
        let n = ln.shape.last_dim();
        for pos in 0..2 {
            let mm = g.node(ln.inputs[pos]);
            let plain = match mm.op {
                Op::MatMul => true,
                Op::FusedMatMulBiasAct { activation: None } => false,
                _ => continue,
            };
            let (a, w) = (g.node(mm.inputs[0]), g.node(mm.inputs[1]));
            let k = a.shape.last_dim();
            let rows = a.shape.numel() / k.max(1);
            let fits = !claimed.contains(&mm.id)
                && !outputs.contains(&mm.id)
                && g.users(mm.id).len() == 1
                && ln.inputs[1 - pos] != mm.id
                && mm.shape.dims == ln.shape.dims
                && w.shape.rank() == 2
                && store(w.id).transposed
                && !store(a.id).folded
                && (1..=MAX_ROWS).contains(&rows)
                && k > 0
                && k.is_multiple_of(64)
                && n.is_multiple_of(32)
                && n <= 1024
                && [a.id, w.id, mm.id, ln.inputs[1 - pos]]
                    .iter()
                    .all(|&i| store(i).dt == t)
                && (plain || store(mm.inputs[2]).dt == t);
            if fits {
                out.insert(mm.id, Fusion::Interior);
                let f = GemmNorm {
                    matmul: mm.id,
                    pos,
                    nodes: vec![mm.id, ln.id],
                };
                out.insert(ln.id, Fusion::GemmNorm(Arc::new(f)));
                break;
            }
        }
    }
    out
}

/// A norm that computes the `Add` making its input.
#[derive(Debug)]
pub(crate) struct NormAdd {
    /// The absorbed Add's operand of the norm input's full shape.
    pub full: NodeId,
    /// Its other operand (a trailing block of that shape, repeated).
    pub other: NodeId,
    /// `[add, norm]`: the group's nodes, the root last.
    pub nodes: Vec<NodeId>,
}

/// The norm-add groups of a segment's sub-graph, skipping nodes in
/// `claimed`: the norm maps to [`Fusion::NormAdd`], its Add to
/// [`Fusion::Interior`]. The full operand has the Add's storage; the
/// repeated one may have any.
pub(crate) fn find_norm_adds(
    g: &Graph,
    claimed: &HashSet<NodeId>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for ln in g.nodes() {
        let is_norm = matches!(
            ln.op,
            Op::LayerNorm { .. }
                | Op::RmsNorm { .. }
                | Op::FusedResidualLN { .. }
                | Op::FusedResidualRmsNorm { .. }
        );
        if !is_norm || claimed.contains(&ln.id) {
            continue;
        }
        let add = g.node(ln.inputs[0]);
        if add.op != Op::Binary(BinaryOp::Add)
            || claimed.contains(&add.id)
            || outputs.contains(&add.id)
            || g.users(add.id).len() != 1
            || ln.inputs[1..].contains(&add.id)
            || add.shape.dtype != DType::F32
        {
            continue;
        }
        let dims = &add.shape.dims;
        let (p, q) = (g.node(add.inputs[0]), g.node(add.inputs[1]));
        // The trailing-block operand: its dims (leading 1s dropped) end
        // the Add's dims.
        let block = |n: &rlx_ir::Node| {
            let d: Vec<usize> = n
                .shape
                .dims
                .iter()
                .copied()
                .skip_while(|&x| x == 1)
                .collect();
            n.shape.numel() > 0 && dims.ends_with(&d)
        };
        let (full, other) = if &p.shape.dims == dims && block(q) {
            (p, q)
        } else if &q.shape.dims == dims && block(p) {
            (q, p)
        } else {
            continue;
        };
        let fits = store(full.id).dt == store(add.id).dt
            && [full.id, other.id]
                .iter()
                .all(|&i| !store(i).folded && g.node(i).shape.dtype == DType::F32);
        if fits {
            out.insert(add.id, Fusion::Interior);
            let f = NormAdd {
                full: full.id,
                other: other.id,
                nodes: vec![add.id, ln.id],
            };
            out.insert(ln.id, Fusion::NormAdd(Arc::new(f)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, Shape};

    /// `FusedResidualLN(a @ w + b, r)` over `[rows, k] x [k, n]`.
    fn layer(rows: usize, k: usize, n: usize, act: Option<Activation>) -> (Graph, NodeId, NodeId) {
        let mut g = Graph::new("ln");
        let a = g.input("a", Shape::f32(&[rows, k]));
        let r = g.input("r", Shape::f32(&[rows, n]));
        let w = g.param("w", Shape::f32(&[k, n]));
        let b = g.param("b", Shape::f32(&[n]));
        let gm = g.param("g", Shape::f32(&[n]));
        let bt = g.param("beta", Shape::f32(&[n]));
        let op = Op::FusedMatMulBiasAct { activation: act };
        let mm = g.push(op, vec![a, w, b]).unwrap();
        let op = Op::FusedResidualLN {
            has_bias: false,
            eps: 1e-5,
        };
        let ln = g.push(op, vec![mm, r, gm, bt]).unwrap();
        g.set_outputs(vec![ln]);
        (g, mm, ln)
    }

    fn half(transposed: NodeId) -> impl Fn(NodeId) -> Store {
        move |i| Store {
            dt: Dt::Bf16,
            transposed: i == transposed,
            folded: false,
            own_gemm: false,
        }
    }

    #[test]
    fn a_small_bias_matmul_and_its_norm_fuse() {
        let (g, mm, ln) = layer(128, 384, 384, None);
        let w = g.node(mm).inputs[1];
        let m = find_gemm_norms(&g, &HashSet::new(), half(w));
        assert!(matches!(m.get(&mm), Some(Fusion::Interior)));
        let Some(Fusion::GemmNorm(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((f.matmul, f.pos, f.nodes.clone()), (mm, 0, vec![mm, ln]));
    }

    #[test]
    fn an_embedding_sum_is_absorbed_by_its_norm() {
        // word [2, 8, 16] + position [8, 16] (repeated per batch), then a
        // residual LayerNorm with the token-type rows.
        let mut g = Graph::new("emb");
        let w = g.input("w", Shape::f32(&[2, 8, 16]));
        let p = g.input("p", Shape::f32(&[8, 16]));
        let t = g.input("t", Shape::f32(&[2, 8, 16]));
        let gm = g.param("g", Shape::f32(&[16]));
        let bt = g.param("b", Shape::f32(&[16]));
        let add = g.push(Op::Binary(BinaryOp::Add), vec![p, w]).unwrap();
        let op = Op::FusedResidualLN {
            has_bias: false,
            eps: 1e-12,
        };
        let ln = g.push(op, vec![add, t, gm, bt]).unwrap();
        // An Add with a second user, and one broadcasting on a middle
        // axis, stay.
        let add2 = g.push(Op::Binary(BinaryOp::Add), vec![t, t]).unwrap();
        let op = Op::LayerNorm {
            axis: -1,
            eps: 1e-5,
        };
        let ln2 = g.push(op.clone(), vec![add2, gm, bt]).unwrap();
        let mid = g.input("m", Shape::f32(&[2, 1, 16]));
        let add3 = g.push(Op::Binary(BinaryOp::Add), vec![w, mid]).unwrap();
        let ln3 = g.push(op, vec![add3, gm, bt]).unwrap();
        g.set_outputs(vec![ln, ln2, add2, ln3]);
        let m = find_norm_adds(&g, &HashSet::new(), |_| Store::default());
        assert!(matches!(m.get(&add), Some(Fusion::Interior)));
        let Some(Fusion::NormAdd(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((f.full, f.other, f.nodes.clone()), (w, p, vec![add, ln]));
        assert_eq!(m.len(), 2, "{m:?}");
        // The full operand must have the Add's storage; the repeated one
        // may differ.
        let mixed = |i: NodeId| Store {
            dt: if i == w { Dt::Bf16 } else { Dt::F32 },
            ..Store::default()
        };
        assert!(!find_norm_adds(&g, &HashSet::new(), mixed).contains_key(&ln));
        let mixed = |i: NodeId| Store {
            dt: if i == p { Dt::F32 } else { Dt::Bf16 },
            ..Store::default()
        };
        assert!(find_norm_adds(&g, &HashSet::new(), mixed).contains_key(&ln));
    }

    #[test]
    fn the_cuda_plan_fuses_a_half_layer_and_not_an_f32_one() {
        // (a + a) @ w + b, residual r + r, LayerNorm, negated: the matmul
        // and norm are 16-bit inside the segment (graph inputs and outputs
        // stay f32). Planned without a device.
        let mut g = Graph::new("plan");
        let a = g.input("a", Shape::f32(&[128, 384]));
        let r = g.input("r", Shape::f32(&[128, 384]));
        let add = |g: &mut Graph, x| g.push(Op::Binary(BinaryOp::Add), vec![x, x]).unwrap();
        let (a2, r2) = (add(&mut g, a), add(&mut g, r));
        let w = g.param("w", Shape::f32(&[384, 384]));
        let b = g.param("b", Shape::f32(&[384]));
        let gm = g.param("g", Shape::f32(&[384]));
        let bt = g.param("beta", Shape::f32(&[384]));
        let op = Op::FusedMatMulBiasAct { activation: None };
        let mm = g.push(op, vec![a2, w, b]).unwrap();
        let op = Op::FusedResidualLN {
            has_bias: false,
            eps: 1e-5,
        };
        let ln = g.push(op, vec![mm, r2, gm, bt]).unwrap();
        let y = g.push(Op::Activation(Activation::Neg), vec![ln]).unwrap();
        g.set_outputs(vec![y]);
        for (precision, fused) in [
            (rlx_runtime::Precision::Bf16, 1),
            (rlx_runtime::Precision::F32, 0),
        ] {
            let opts = crate::CudaOptions {
                hybrid: true,
                precision,
                fuse_matmul_norm: true,
                ..Default::default()
            };
            let p = crate::plan(g.clone(), &opts).unwrap();
            assert_eq!(p.fused_gemm_norms, fused, "{precision}: {p:?}");
        }
    }

    #[test]
    fn what_does_not_fuse() {
        // f32 storage, an activation, too many rows, widths off the tile
        // grid, an untransposed weight, a claimed node.
        let (g, mm, _) = layer(128, 384, 384, None);
        let w = g.node(mm).inputs[1];
        let f32 = move |i: NodeId| Store {
            transposed: i == w,
            ..Store::default()
        };
        assert!(find_gemm_norms(&g, &HashSet::new(), f32).is_empty());
        for (rows, k, n, act) in [
            (128, 384, 384, Some(Activation::Gelu)),
            (MAX_ROWS + 1, 384, 384, None),
            (128, 100, 384, None),
            (128, 384, 80, None),
            (128, 384, 1088, None),
        ] {
            let (g, mm, _) = layer(rows, k, n, act);
            let w = g.node(mm).inputs[1];
            let m = find_gemm_norms(&g, &HashSet::new(), half(w));
            assert!(m.is_empty(), "{rows}x{k}x{n} {act:?} fused");
        }
        let (g, mm, _) = layer(128, 384, 384, None);
        assert!(find_gemm_norms(&g, &HashSet::new(), half(NodeId(999))).is_empty());
        let claimed: HashSet<NodeId> = [mm].into_iter().collect();
        let w = g.node(mm).inputs[1];
        assert!(find_gemm_norms(&g, &claimed, half(w)).is_empty());
    }
}
