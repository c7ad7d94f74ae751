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
//! Only small row counts fuse (at most [`MAX_ROWS`]): each 16-row tile
//! reads the whole weight, which pays while the matmul is latency-bound
//! and not once it is bandwidth-bound. Widths: the norm's `N` a multiple
//! of 64 up to 1024, the matmul's `K` a multiple of 64.

use crate::fuse::Fusion;
use crate::store::{Dt, Store};
use rlx_ir::{Graph, NodeId, Op};
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
                && n.is_multiple_of(64)
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
            (128, 384, 96, None),
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
