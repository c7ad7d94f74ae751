//! Reductions that absorb the elementwise `Binary` making their input.
//!
//! Inside compiled segments a `Reduce` whose input is a `Binary` node with
//! no other user (and not a segment output) reads the binary's two
//! operands and applies it per element: the masked product of a mean
//! pooling (`h * mask` then a sum over the sequence) or the square of an L2
//! norm (`x * x` then a sum) is never materialized. Both operands
//! broadcast to the binary's shape (zero strides); any storage type.
//! Values read through a folded (strided) Narrow do not fuse.

use crate::fuse::Fusion;
use crate::store::Store;
use rlx_ir::{BinaryOp, DType, Graph, NodeId, Op};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A `Reduce` with its `Binary` prologue.
#[derive(Debug)]
pub(crate) struct ReducePrologue {
    /// The absorbed binary.
    pub binary: NodeId,
    /// Its operation.
    pub op: BinaryOp,
    /// `[binary, reduce]`: the group's nodes, the root last.
    pub nodes: Vec<NodeId>,
}

/// The reduce groups of a segment's sub-graph, skipping nodes in
/// `claimed`: the reduce maps to [`Fusion::Reduce`], its binary to
/// [`Fusion::Interior`].
pub(crate) fn find_reduce_prologues(
    g: &Graph,
    claimed: &HashSet<NodeId>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for r in g.nodes() {
        if !matches!(r.op, Op::Reduce { .. }) || claimed.contains(&r.id) {
            continue;
        }
        let b = g.node(r.inputs[0]);
        let Op::Binary(op) = b.op else {
            continue;
        };
        let fits = !claimed.contains(&b.id)
            && !outputs.contains(&b.id)
            && g.users(b.id).len() == 1
            && b.shape.dtype == DType::F32
            && b.shape.numel() > 0
            && b.inputs.iter().all(|&i| {
                let s = &g.node(i).shape;
                s.dtype == DType::F32 && s.rank() <= b.shape.rank() && !store(i).folded
            });
        if !fits {
            continue;
        }
        out.insert(b.id, Fusion::Interior);
        let f = ReducePrologue {
            binary: b.id,
            op,
            nodes: vec![b.id, r.id],
        };
        out.insert(r.id, Fusion::Reduce(Arc::new(f)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{ReduceOp, Shape};

    fn sum(g: &mut Graph, x: NodeId, axes: Vec<usize>) -> NodeId {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims: false,
        };
        g.push(op, vec![x]).unwrap()
    }

    #[test]
    fn mean_pooling_and_l2_norm_products_are_absorbed() {
        let mut g = Graph::new("pool");
        let h = g.input("h", Shape::f32(&[2, 8, 16]));
        let m = g.input("m", Shape::f32(&[2, 8, 1]));
        let hm = g.push(Op::Binary(BinaryOp::Mul), vec![h, m]).unwrap();
        let s = sum(&mut g, hm, vec![1]);
        let sq = g.push(Op::Binary(BinaryOp::Mul), vec![s, s]).unwrap();
        let n = sum(&mut g, sq, vec![1]);
        // A binary with a second user stays: it must be materialized.
        let d = g.push(Op::Binary(BinaryOp::Sub), vec![h, h]).unwrap();
        let ds = sum(&mut g, d, vec![2]);
        g.set_outputs(vec![n, ds, d]);
        let m = find_reduce_prologues(&g, &HashSet::new(), |_| Store::default());
        for (bin, red) in [(hm, s), (sq, n)] {
            assert!(matches!(m.get(&bin), Some(Fusion::Interior)));
            let Some(Fusion::Reduce(f)) = m.get(&red) else {
                panic!("{red} not fused: {m:?}");
            };
            assert_eq!(
                (f.binary, f.op, f.nodes.clone()),
                (bin, BinaryOp::Mul, vec![bin, red])
            );
        }
        assert!(!m.contains_key(&d) && !m.contains_key(&ds));
        // Claimed nodes and folded operands do not fuse.
        let claimed: HashSet<NodeId> = [s].into_iter().collect();
        let m = find_reduce_prologues(&g, &claimed, |_| Store::default());
        assert!(!m.contains_key(&s) && !m.contains_key(&hm) && m.contains_key(&n));
        let folded = |i: NodeId| Store {
            folded: i == h,
            ..Store::default()
        };
        let m = find_reduce_prologues(&g, &HashSet::new(), folded);
        assert!(!m.contains_key(&s) && m.contains_key(&n));
    }
}
