//! A decode step's RoPE and KV-cache writes as one launch, inside compiled
//! segments.
//!
//! In a decode step a `Rope` rotates one row (q and k heads together), one
//! `CacheWrite` stores the roped k part at the step's position and another
//! stores v. Here the `Rope` launch also does both writes:
//! - the k write: a one-row `CacheWrite` whose rows are the `Rope` output
//!   or a last-axis `Narrow` of it;
//! - optionally a v write: another one-row `CacheWrite` at the same
//!   position node whose rows are computed before the `Rope` (so they are
//!   ready at its launch).
//!
//! The writes move earlier, to the `Rope`'s place in the schedule, so each
//! cache param may have no reader but its `CacheWrite` (every reader of a
//! cache reads the `CacheWrite` output, which comes after). All values are
//! f32 in f32 storage.

use crate::fuse::Fusion;
use crate::store::{Dt, Store};
use rlx_ir::{DType, Graph, Node, NodeId, Op};
use std::collections::HashMap;
use std::sync::Arc;

/// A `Rope` with the cache writes its launch performs.
#[derive(Debug)]
pub(crate) struct RopeCache {
    /// The write of (part of) the roped row: the `CacheWrite` and the
    /// first column of the `Rope` output it stores.
    pub k: (NodeId, usize),
    /// A write of a row computed earlier.
    pub v: Option<NodeId>,
}

/// `(ctx, d)` of a one-row `CacheWrite` into a param `[1, ctx, d]` that
/// nothing else reads, at position `pos`.
fn one_row_write(g: &Graph, n: &Node, pos: NodeId) -> Option<(usize, usize)> {
    if !matches!(n.op, Op::CacheWrite { axis: 1 }) || n.inputs.get(2) != Some(&pos) {
        return None;
    }
    let (c, r) = (g.node(n.inputs[0]), &g.node(n.inputs[1]).shape);
    let ok = matches!(c.op, Op::Param { .. })
        && g.users(c.id) == [n.id]
        && c.shape.dtype == DType::F32
        && c.shape.rank() == 3
        && c.shape.dims[0] == 1
        && r.dtype == DType::F32
        && r.dims == [1, 1, c.shape.dims[2]];
    ok.then_some((c.shape.dims[1], c.shape.dims[2]))
}

/// The first column of `rope`'s output that `rows` holds, if `rows` is the
/// output or a last-axis `Narrow` of it.
fn column_of(g: &Graph, rows: NodeId, rope: NodeId) -> Option<usize> {
    if rows == rope {
        return Some(0);
    }
    match g.node(rows).op {
        Op::Narrow { axis: 2, start, .. } if g.node(rows).inputs[0] == rope => Some(start),
        _ => None,
    }
}

/// The fused ropes of a segment's sub-graph: each `Rope` maps to
/// [`Fusion::RopeCache`], its writes to [`Fusion::Done`]. `taken` holds
/// nodes already fused otherwise; `store` gives each node's storage.
pub(crate) fn find_rope_cache(
    g: &Graph,
    taken: &HashMap<NodeId, Fusion>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let mut out = HashMap::new();
    let f32_store = |i: NodeId| {
        let s = store(i);
        s.dt == Dt::F32 && !s.folded
    };
    for rope in g.nodes() {
        let Op::Rope { .. } = rope.op else {
            continue;
        };
        // Ropes with frequency divisors are not lowered on CUDA.
        if rope.inputs.len() > 2 {
            continue;
        }
        let (x, pos) = (&g.node(rope.inputs[0]).shape, rope.inputs[1]);
        let one_row = x.rank() == 3 && x.dims[0] * x.dims[1] == 1 && x.dtype == DType::F32;
        if !one_row
            || g.node(pos).shape.numel() != 1
            || taken.contains_key(&rope.id)
            || !f32_store(rope.id)
            || !f32_store(rope.inputs[0])
        {
            continue;
        }
        let free = |n: &Node| {
            !taken.contains_key(&n.id) && !out.contains_key(&n.id) && f32_store(n.inputs[1])
        };
        let k = g.nodes().iter().find_map(|n| {
            one_row_write(g, n, pos)?;
            let col = column_of(g, n.inputs[1], rope.id)?;
            free(n).then_some((n.id, col))
        });
        let Some(k) = k else {
            continue;
        };
        let v = g.nodes()[rope.id.index() + 1..].iter().find(|n| {
            n.id != k.0 && one_row_write(g, n, pos).is_some() && n.inputs[1] < rope.id && free(n)
        });
        let v = v.map(|n| n.id);
        out.insert(k.0, Fusion::Done);
        if let Some(v) = v {
            out.insert(v, Fusion::Done);
        }
        out.insert(rope.id, Fusion::RopeCache(Arc::new(RopeCache { k, v })));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::op::RopeStyle;
    use rlx_ir::Shape;

    fn rope() -> Op {
        Op::Rope {
            head_dim: 8,
            n_rot: 8,
            theta: 10000.0,
            style: RopeStyle::NeoX,
        }
    }

    fn narrow(g: &mut Graph, x: NodeId, start: usize, len: usize) -> NodeId {
        g.push(
            Op::Narrow {
                axis: 2,
                start,
                len,
            },
            vec![x],
        )
        .unwrap()
    }

    #[test]
    fn a_decode_step_ropes_and_writes_both_caches_in_one_launch() {
        let mut g = Graph::new("decode");
        let qkv = g.input("qkv", Shape::f32(&[1, 1, 32]));
        let pos = g.input("pos", Shape::new(&[1], DType::I64));
        let v = narrow(&mut g, qkv, 24, 8);
        let qk = narrow(&mut g, qkv, 0, 24);
        let r = g.push(rope(), vec![qk, pos]).unwrap();
        let q = narrow(&mut g, r, 0, 16);
        let k = narrow(&mut g, r, 16, 8);
        let ck = g.param("ck", Shape::f32(&[1, 4, 8]));
        let cv = g.param("cv", Shape::f32(&[1, 4, 8]));
        let wk = g
            .push(Op::CacheWrite { axis: 1 }, vec![ck, k, pos])
            .unwrap();
        let wv = g
            .push(Op::CacheWrite { axis: 1 }, vec![cv, v, pos])
            .unwrap();
        let s = g
            .push(Op::Binary(rlx_ir::BinaryOp::Add), vec![wk, wv])
            .unwrap();
        g.set_outputs(vec![q, s]);
        g.verify().unwrap();
        let m = find_rope_cache(&g, &HashMap::new(), |_| Store::default());
        let Some(Fusion::RopeCache(f)) = m.get(&r) else {
            panic!("{m:?}")
        };
        assert_eq!((f.k, f.v), ((wk, 16), Some(wv)));
        assert!(matches!(m.get(&wk), Some(Fusion::Done)));
        assert!(matches!(m.get(&wv), Some(Fusion::Done)));
        // A second reader of a cache param keeps its write where it is.
        let _peek = g
            .push(Op::Activation(rlx_ir::Activation::Relu), vec![cv])
            .unwrap();
        let m = find_rope_cache(&g, &HashMap::new(), |_| Store::default());
        let Some(Fusion::RopeCache(f)) = m.get(&r) else {
            panic!("{m:?}")
        };
        assert_eq!(f.v, None);
        // Rows computed after the rope cannot be written at its launch.
        let mut g2 = Graph::new("late");
        let x = g2.input("x", Shape::f32(&[1, 1, 24]));
        let pos = g2.input("pos", Shape::new(&[1], DType::I64));
        let r = g2.push(rope(), vec![x, pos]).unwrap();
        let late = g2
            .push(Op::Activation(rlx_ir::Activation::Relu), vec![r])
            .unwrap();
        let late = narrow(&mut g2, late, 0, 8);
        let cv = g2.param("cv", Shape::f32(&[1, 4, 8]));
        let wv = g2
            .push(Op::CacheWrite { axis: 1 }, vec![cv, late, pos])
            .unwrap();
        g2.set_outputs(vec![r, wv]);
        assert!(find_rope_cache(&g2, &HashMap::new(), |_| Store::default()).is_empty());
    }
}
