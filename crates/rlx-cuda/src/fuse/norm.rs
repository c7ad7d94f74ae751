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
//! ([`find_norm_feeds`]): the second may repeat as a trailing block (a
//! BERT embedding sum, word + position, before its LayerNorm). Embedding
//! `Gather`s making its `x` (or that Add's full operand) or its residual
//! are read in place too: rows straight from the tables.
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

/// A norm that reads its input's producers itself: the `Add` making its
/// `x` and / or the `Gather`s making its `x` (or that Add's full operand)
/// and its residual.
#[derive(Debug)]
pub(crate) struct NormFeed {
    /// The absorbed Add, if any.
    pub add: Option<AddFeed>,
    /// Gathers whose rows the norm reads from their tables: for `x` (or
    /// the Add's full operand) and for the residual.
    pub gathers: [Option<NodeId>; 2],
    /// The group's nodes in topological order, the norm (root) last.
    pub nodes: Vec<NodeId>,
}

/// The operands of an Add absorbed by a norm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddFeed {
    /// The operand of the norm input's full shape.
    pub full: NodeId,
    /// The other operand (a trailing block of that shape, repeated).
    pub other: NodeId,
}

/// The Add a norm can absorb: its `x` is an Add of f32 values with no
/// other user, one operand of the full shape in the Add's storage and the
/// other a trailing block; neither read through a folded Narrow.
fn absorbed_add(
    g: &Graph,
    ln: &rlx_ir::Node,
    claimed: &HashSet<NodeId>,
    outputs: &HashSet<NodeId>,
    store: &impl Fn(NodeId) -> Store,
) -> Option<(NodeId, AddFeed)> {
    let add = g.node(ln.inputs[0]);
    if add.op != Op::Binary(BinaryOp::Add)
        || claimed.contains(&add.id)
        || outputs.contains(&add.id)
        || g.users(add.id).len() != 1
        || ln.inputs[1..].contains(&add.id)
        || add.shape.dtype != DType::F32
    {
        return None;
    }
    let dims = &add.shape.dims;
    let (p, q) = (g.node(add.inputs[0]), g.node(add.inputs[1]));
    // The trailing-block operand: its dims (leading 1s dropped) end the
    // Add's dims.
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
        return None;
    };
    let fits = store(full.id).dt == store(add.id).dt
        && [full.id, other.id]
            .iter()
            .all(|&i| !store(i).folded && g.node(i).shape.dtype == DType::F32);
    fits.then_some((
        add.id,
        AddFeed {
            full: full.id,
            other: other.id,
        },
    ))
}

/// The norm-feed groups of a segment's sub-graph, skipping nodes in
/// `claimed`: the norm maps to [`Fusion::NormFeed`], the absorbed Add and
/// Gathers to [`Fusion::Interior`]. An Add may feed any norm. Gathers
/// (axis 0 of a `[V, d]` f32 table by one id per row, no other user, not
/// an output, stored as the norm) feed only norms the one-warp-per-row
/// kernel runs: `d % 4 == 0`, `d <= 1024`, x, residual and output in one
/// storage type, the norm's parameters all f32 or all that type, an
/// absorbed Add's repeated operand a multiple of 4 values. A BERT
/// embedding (word and token-type rows, position rows added, LayerNorm)
/// becomes one launch.
pub(crate) fn find_norm_feeds(
    g: &Graph,
    claimed: &HashSet<NodeId>,
    store: impl Fn(NodeId) -> Store,
) -> HashMap<NodeId, Fusion> {
    let outputs: HashSet<NodeId> = g.outputs.iter().copied().collect();
    let mut out = HashMap::new();
    for ln in g.nodes() {
        let residual = matches!(
            ln.op,
            Op::FusedResidualLN { .. } | Op::FusedResidualRmsNorm { .. }
        );
        let is_norm = residual || matches!(ln.op, Op::LayerNorm { .. } | Op::RmsNorm { .. });
        if !is_norm || claimed.contains(&ln.id) {
            continue;
        }
        let add = absorbed_add(g, ln, claimed, &outputs, &store);
        let t = store(ln.id).dt;
        let d = ln.shape.last_dim();
        let rows = ln.shape.numel() / d.max(1);
        let first_param = if residual { 2 } else { 1 };
        let p = ln.inputs.get(first_param).map(|&i| store(i).dt);
        let x_src = add.map_or(ln.inputs[0], |(_, a)| a.full);
        let warp = d > 0
            && d.is_multiple_of(4)
            && d <= 1024
            && store(x_src).dt == t
            && (!residual || store(ln.inputs[1]).dt == t)
            && p.is_some_and(|p| p == Dt::F32 || p == t)
            && ln.inputs[first_param..]
                .iter()
                .all(|&i| Some(store(i).dt) == p)
            && add.is_none_or(|(_, a)| g.node(a.other).shape.numel().is_multiple_of(4));
        let gathered = |id: NodeId| -> Option<NodeId> {
            let n = g.node(id);
            let Op::Gather { axis: 0 } = n.op else {
                return None;
            };
            let (table, ids) = (g.node(n.inputs[0]), g.node(n.inputs[1]));
            let fits = warp
                && !claimed.contains(&id)
                && !outputs.contains(&id)
                && g.users(id).len() == 1
                && n.shape.dims == ln.shape.dims
                && store(id).dt == t
                && table.shape.dtype == DType::F32
                && table.shape.dims.len() == 2
                && table.shape.dims[1] == d
                && ids.shape.dtype.is_index()
                && ids.shape.numel() == rows
                && !store(table.id).folded
                && !store(ids.id).folded;
            fits.then_some(id)
        };
        let gathers = [
            gathered(x_src),
            residual.then(|| gathered(ln.inputs[1])).flatten(),
        ];
        if add.is_none() && gathers == [None, None] {
            continue;
        }
        let mut nodes: Vec<NodeId> = gathers.iter().flatten().copied().collect();
        nodes.extend(add.map(|(id, _)| id));
        nodes.sort();
        for &i in &nodes {
            out.insert(i, Fusion::Interior);
        }
        nodes.push(ln.id);
        let f = NormFeed {
            add: add.map(|(_, a)| a),
            gathers,
            nodes,
        };
        out.insert(ln.id, Fusion::NormFeed(Arc::new(f)));
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
        let m = find_norm_feeds(&g, &HashSet::new(), |_| Store::default());
        assert!(matches!(m.get(&add), Some(Fusion::Interior)));
        let Some(Fusion::NormFeed(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        let a = f.add.expect("the Add is absorbed");
        assert_eq!((a.full, a.other, f.nodes.clone()), (w, p, vec![add, ln]));
        assert_eq!(f.gathers, [None, None]);
        assert_eq!(m.len(), 2, "{m:?}");
        // The full operand must have the Add's storage; the repeated one
        // may differ.
        let mixed = |i: NodeId| Store {
            dt: if i == w { Dt::Bf16 } else { Dt::F32 },
            ..Store::default()
        };
        assert!(!find_norm_feeds(&g, &HashSet::new(), mixed).contains_key(&ln));
        let mixed = |i: NodeId| Store {
            dt: if i == p { Dt::F32 } else { Dt::Bf16 },
            ..Store::default()
        };
        assert!(find_norm_feeds(&g, &HashSet::new(), mixed).contains_key(&ln));
    }

    #[test]
    fn embedding_gathers_are_read_by_their_norm() {
        // LayerNorm(word[ids] + pos, residual type[tt]) over rows of d.
        let graph = |d: usize, shared: bool| {
            let mut g = Graph::new("emb");
            let word = g.param("word", Shape::f32(&[50, d]));
            let types = g.param("types", Shape::f32(&[2, d]));
            let pos = g.param("pos", Shape::f32(&[8, d]));
            let gm = g.param("g", Shape::f32(&[d]));
            let bt = g.param("b", Shape::f32(&[d]));
            let ids = g.input("ids", Shape::new(&[2, 8], DType::I64));
            let tt = g.input("tt", Shape::new(&[2, 8], DType::I32));
            let w = g.push(Op::Gather { axis: 0 }, vec![word, ids]).unwrap();
            let t = g.push(Op::Gather { axis: 0 }, vec![types, tt]).unwrap();
            let add = g.push(Op::Binary(BinaryOp::Add), vec![w, pos]).unwrap();
            let op = Op::FusedResidualLN {
                has_bias: false,
                eps: 1e-12,
            };
            let ln = g.push(op, vec![add, t, gm, bt]).unwrap();
            let mut outs = vec![ln];
            if shared {
                // The token-type rows are read by a second op too.
                outs.push(g.push(Op::Binary(BinaryOp::Mul), vec![t, t]).unwrap());
            }
            g.set_outputs(outs);
            (g, [w, t, add, ln])
        };
        let half = |_| Store {
            dt: Dt::Bf16,
            ..Store::default()
        };
        let (g, [w, t, add, ln]) = graph(384, false);
        let m = find_norm_feeds(&g, &HashSet::new(), half);
        let Some(Fusion::NormFeed(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!(f.gathers, [Some(w), Some(t)]);
        assert_eq!(f.nodes, vec![w, t, add, ln]);
        assert!([w, t, add]
            .iter()
            .all(|i| matches!(m.get(i), Some(Fusion::Interior))));
        // A width the one-warp kernel does not take, and a shared gather.
        let (g, [_, _, add, ln]) = graph(30, false);
        let m = find_norm_feeds(&g, &HashSet::new(), half);
        let Some(Fusion::NormFeed(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((f.gathers, f.nodes.clone()), ([None, None], vec![add, ln]));
        let (g, [w, _, add, ln]) = graph(384, true);
        let m = find_norm_feeds(&g, &HashSet::new(), half);
        let Some(Fusion::NormFeed(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!(
            (f.gathers, f.nodes.clone()),
            ([Some(w), None], vec![w, add, ln])
        );
        // The norm's output in f32 and its operands in bf16: no gathers.
        let (g, [_, _, add, ln]) = graph(384, false);
        let mixed = move |i: NodeId| Store {
            dt: if i == ln { Dt::F32 } else { Dt::Bf16 },
            ..Store::default()
        };
        let m = find_norm_feeds(&g, &HashSet::new(), mixed);
        let Some(Fusion::NormFeed(f)) = m.get(&ln) else {
            panic!("not fused: {m:?}");
        };
        assert_eq!((f.gathers, f.nodes.clone()), ([None, None], vec![add, ln]));
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
