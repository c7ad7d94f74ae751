//! Masked mean pooling, and the L2 normalization after it, as one kernel.
//!
//! Inside compiled segments the tail of a sentence-embedding graph
//!
//! ```text
//! mean = Sum_1(x * m) / Max(Sum_1(c), tiny)          x [B, S, H], m [B, S, 1], c [B, S]
//! out  = mean / Max(Sqrt(Sum_1(mean * mean)), eps)   (optional)
//! ```
//!
//! (`Sum_1` a sum over axis 1, the count kept as `[B, 1]`; `tiny` and
//! `eps` one-element constants, either operand order of `Max` and the
//! product) runs as one `pool_mean_x` launch, one block per batch row:
//! five launches (two reductions with their products absorbed, the count,
//! two elementwise chains) become one: on the H200 (ncu, MiniLM bf16)
//! 7.6 us instead of 17.2 at 1x128, 8.2 instead of 25.2 at 32x128. Every interior node has its users inside the group
//! and is not a segment output; `x`, `m` and `c` are read in their storage
//! (none through a folded Narrow). Statistics are f32; only the root is
//! stored.

use crate::fuse::Fusion;
use crate::store::Store;
use rlx_ir::{Activation, BinaryOp, DType, Graph, Node, NodeId, Op, ReduceOp};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Widest row (`H`) the kernel takes: its column sums live in shared
/// memory (`H` floats per row group, within the default 48 KB).
pub(crate) const MAX_WIDTH: usize = 8192;

/// One fused pooling group.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The pooled values `[B, S, H]`.
    pub x: NodeId,
    /// The product mask, `B * S` values (`[B, S, 1]`).
    pub mask: NodeId,
    /// The counted mask `[B, S]`.
    pub count: NodeId,
    /// The floor of the count (`Max(count, tiny)`).
    pub tiny: f32,
    /// With an L2 normalization: the floor of the norm.
    pub eps: Option<f32>,
    /// The group's nodes in topological order, the root last.
    pub nodes: Vec<NodeId>,
}

/// The pooling groups of a segment's sub-graph, skipping nodes in
/// `claimed`: the root maps to [`Fusion::Pool`], the other members to
/// [`Fusion::Interior`].
pub(crate) fn find_pools(
    g: &Graph,
    claimed: &HashSet<NodeId>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for n in g.nodes() {
        let Some(mut p) = mean_pool(g, n, &store) else {
            continue;
        };
        // The L2 normalization of this mean, if it follows.
        let users = g.users(n.id);
        let l2 = users
            .iter()
            .find_map(|&u| l2_norm(g, g.node(u), n.id))
            .filter(|(_, nodes)| {
                users.len() == 2
                    && users.iter().all(|u| nodes.contains(u))
                    && !outputs.contains(&n.id)
            });
        if let Some((eps, nodes)) = l2 {
            p.eps = Some(eps);
            p.nodes.extend(nodes);
        }
        let root = *p.nodes.last().expect("a group has a root");
        let interior = &p.nodes[..p.nodes.len() - 1];
        let sealed = interior
            .iter()
            .all(|&i| !outputs.contains(&i) && g.users(i).iter().all(|u| p.nodes.contains(u)));
        if !sealed || p.nodes.iter().any(|i| claimed.contains(i)) {
            continue;
        }
        for &i in interior {
            out.insert(i, Fusion::Interior);
        }
        out.insert(root, Fusion::Pool(Arc::new(p)));
    }
    out
}

/// The single f32 value of a one-element constant.
fn scalar(g: &Graph, id: NodeId) -> Option<f32> {
    match &g.node(id).op {
        Op::Constant { value } if value.shape.numel() == 1 => value.as_f32().map(|v| v[0]),
        _ => None,
    }
}

/// `Max(a, k)` or `Max(k, a)` with `k` a one-element constant: `(a, k)`.
fn max_const(g: &Graph, n: &Node) -> Option<(NodeId, f32)> {
    if n.op != Op::Binary(BinaryOp::Max) {
        return None;
    }
    let [a, b] = n.inputs[..] else { return None };
    scalar(g, b)
        .map(|k| (a, k))
        .or_else(|| scalar(g, a).map(|k| (b, k)))
}

/// A sum over axis 1 of `x`, its dims kept or not.
fn sum_1(n: &Node, keep: bool) -> Option<NodeId> {
    match &n.op {
        Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims,
        } if axes[..] == [1] && *keep_dims == keep => Some(n.inputs[0]),
        _ => None,
    }
}

/// `mean = Sum_1(x * m) / Max(Sum_1(c), tiny)` rooted at `n`.
fn mean_pool(g: &Graph, n: &Node, store: impl Fn(NodeId) -> Store) -> Option<Pool> {
    if n.op != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let (sum, floor) = (g.node(n.inputs[0]), g.node(n.inputs[1]));
    let prod = g.node(sum_1(sum, false)?);
    let (cnt, tiny) = max_const(g, floor)?;
    let cnt = g.node(cnt);
    let c = sum_1(cnt, true)?;
    if prod.op != Op::Binary(BinaryOp::Mul) {
        return None;
    }
    let [p, q] = prod.inputs[..] else { return None };
    let dims = |id: NodeId| g.node(id).shape.dims.clone();
    let fits = |x: NodeId, m: NodeId| {
        let [b, s, h] = dims(x)[..] else { return false };
        dims(m) == [b, s, 1]
            && dims(c) == [b, s]
            && cnt.shape.dims == [b, 1]
            && n.shape.dims == [b, h]
            && b * s * h > 0
            && h <= MAX_WIDTH
    };
    let (x, m) = if fits(p, q) {
        (p, q)
    } else if fits(q, p) {
        (q, p)
    } else {
        return None;
    };
    let typed = [x, m, c]
        .iter()
        .all(|&i| g.node(i).shape.dtype == DType::F32 && !store(i).folded)
        && [prod.id, sum.id, cnt.id, floor.id, n.id]
            .iter()
            .all(|&i| g.node(i).shape.dtype == DType::F32);
    typed.then(|| Pool {
        x,
        mask: m,
        count: c,
        tiny,
        eps: None,
        nodes: vec![prod.id, sum.id, cnt.id, floor.id, n.id],
    })
}

/// `v / Max(Sqrt(Sum_1(v * v)), eps)` rooted at `n` (`v` of rank 2, the
/// sum kept as `[B, 1]`): `(eps, [square, sum, sqrt, max, n])`.
fn l2_norm(g: &Graph, n: &Node, v: NodeId) -> Option<(f32, Vec<NodeId>)> {
    if n.op != Op::Binary(BinaryOp::Div) || n.inputs[0] != v || n.inputs[1] == v {
        return None;
    }
    let floor = g.node(n.inputs[1]);
    let (root, eps) = max_const(g, floor)?;
    let root = g.node(root);
    if root.op != Op::Activation(Activation::Sqrt) {
        return None;
    }
    let ss = g.node(root.inputs[0]);
    let sq = g.node(sum_1(ss, true)?);
    let fits = sq.op == Op::Binary(BinaryOp::Mul)
        && sq.inputs[..] == [v, v]
        && g.node(v).shape.rank() == 2
        && [sq.id, ss.id, root.id, floor.id, n.id]
            .iter()
            .all(|&i| g.node(i).shape.dtype == DType::F32);
    fits.then(|| (eps, vec![sq.id, ss.id, root.id, floor.id, n.id]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Shape, Tensor};

    fn sum1(g: &mut Graph, x: NodeId, keep: bool) -> NodeId {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims: keep,
        };
        g.push(op, vec![x]).unwrap()
    }

    fn bin(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        g.push(Op::Binary(op), vec![a, b]).unwrap()
    }

    /// The sentence-embedding tail over `[2, 8, 16]`: `(graph, mean, out,
    /// nodes in order)`.
    fn tail(l2: bool) -> (Graph, NodeId, NodeId, Vec<NodeId>) {
        let mut g = Graph::new("pool");
        let x = g.input("x", Shape::f32(&[2, 8, 16]));
        let mask = g.input("mask", Shape::f32(&[2, 8]));
        let m3 = g
            .push(
                Op::Reshape {
                    shape: vec![2, 8, 1],
                },
                vec![mask],
            )
            .unwrap();
        let xm = bin(&mut g, BinaryOp::Mul, m3, x);
        let sum = sum1(&mut g, xm, false);
        let cnt = sum1(&mut g, mask, true);
        let tiny = g.constant(Tensor::f32(&[1], vec![1e-9]));
        let floor = bin(&mut g, BinaryOp::Max, tiny, cnt);
        let mean = bin(&mut g, BinaryOp::Div, sum, floor);
        let mut nodes = vec![xm, sum, cnt, floor, mean];
        let mut out = mean;
        if l2 {
            let sq = bin(&mut g, BinaryOp::Mul, mean, mean);
            let ss = sum1(&mut g, sq, true);
            let r = g.push(Op::Activation(Activation::Sqrt), vec![ss]).unwrap();
            let eps = g.constant(Tensor::f32(&[1], vec![1e-12]));
            let nf = bin(&mut g, BinaryOp::Max, r, eps);
            out = bin(&mut g, BinaryOp::Div, mean, nf);
            nodes.extend([sq, ss, r, nf, out]);
        }
        g.set_outputs(vec![out]);
        (g, mean, out, nodes)
    }

    #[test]
    fn mean_pooling_and_its_l2_norm_are_one_group() {
        let (g, _, out, nodes) = tail(true);
        let m = find_pools(&g, &HashSet::new(), |_| Store::default());
        let Some(Fusion::Pool(p)) = m.get(&out) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!(p.nodes, nodes);
        assert_eq!((p.x, p.mask, p.count), (NodeId(0), NodeId(2), NodeId(1)));
        assert_eq!((p.tiny, p.eps), (1e-9, Some(1e-12)));
        for i in &nodes[..nodes.len() - 1] {
            assert!(matches!(m.get(i), Some(Fusion::Interior)), "{i}");
        }
        // Without the norm the mean is the root.
        let (g, mean, _, nodes) = tail(false);
        let m = find_pools(&g, &HashSet::new(), |_| Store::default());
        let Some(Fusion::Pool(p)) = m.get(&mean) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((p.nodes.clone(), p.eps), (nodes, None));
    }

    #[test]
    fn a_shared_interior_value_or_a_folded_input_keeps_the_ops_apart() {
        // The mean is also a segment output: only the pooling fuses, as
        // the root; the norm stays apart.
        let (mut g, mean, out, nodes) = tail(true);
        g.set_outputs(vec![out, mean]);
        let m = find_pools(&g, &HashSet::new(), |_| Store::default());
        let Some(Fusion::Pool(p)) = m.get(&mean) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((p.nodes.clone(), p.eps), (nodes[..5].to_vec(), None));
        assert!(!m.contains_key(&out));
        // The masked sum is read elsewhere too: nothing fuses.
        let (mut g, _, out, nodes) = tail(true);
        g.set_outputs(vec![out, nodes[1]]);
        assert!(find_pools(&g, &HashSet::new(), |_| Store::default()).is_empty());
        // A folded input, or a claimed member: nothing fuses.
        let (g, _, _, nodes) = tail(true);
        let folded = |i: NodeId| Store {
            folded: i == NodeId(0),
            ..Store::default()
        };
        assert!(find_pools(&g, &HashSet::new(), folded).is_empty());
        let claimed: HashSet<NodeId> = [nodes[3]].into_iter().collect();
        assert!(find_pools(&g, &claimed, |_| Store::default()).is_empty());
    }

    #[test]
    fn a_floor_that_is_not_a_constant_does_not_match() {
        let mut g = Graph::new("pool");
        let x = g.input("x", Shape::f32(&[2, 8, 16]));
        let m = g.input("m", Shape::f32(&[2, 8, 1]));
        let mask = g.input("mask", Shape::f32(&[2, 8]));
        let tiny = g.input("tiny", Shape::f32(&[1]));
        let xm = bin(&mut g, BinaryOp::Mul, x, m);
        let sum = sum1(&mut g, xm, false);
        let cnt = sum1(&mut g, mask, true);
        let floor = bin(&mut g, BinaryOp::Max, cnt, tiny);
        let mean = bin(&mut g, BinaryOp::Div, sum, floor);
        // Another reduction of x, which does not match either.
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![2],
            keep_dims: false,
        };
        let s2 = g.push(op, vec![x]).unwrap();
        g.set_outputs(vec![mean, s2]);
        assert!(find_pools(&g, &HashSet::new(), |_| Store::default()).is_empty());
    }
}
