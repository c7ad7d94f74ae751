//! Views and broadcasts: which nodes alias their input instead of
//! launching anything ([`view_of`]), and how operands broadcast to an
//! output ([`is_suffix`], [`bcast_strides`]).

use crate::store::Store;
use rlx_ir::{DType, Graph, Node, NodeId, Op, Shape};

/// Whether the CUDA backend executes `node` as an alias of its first input
/// (and at which byte offset). Mirrors the CPU's rules.
pub(crate) fn view_of(graph: &Graph, node: &Node) -> Option<(NodeId, usize)> {
    view_of_st(graph, node, &|_| Store::default())
}

/// [`view_of`] under a storage plan: offsets count stored element sizes,
/// and a Narrow that only attention reads (`folded`) aliases its source.
pub(crate) fn view_of_st(
    graph: &Graph,
    node: &Node,
    store: &dyn Fn(NodeId) -> Store,
) -> Option<(NodeId, usize)> {
    let src = *node.inputs.first()?;
    let s = &graph.node(src).shape;
    let esz = if s.dtype == DType::F32 {
        store(src).dt.size()
    } else {
        s.dtype.size_bytes()
    };
    match &node.op {
        Op::Reshape { .. } => Some((src, 0)),
        Op::Cast { to } if *to == s.dtype => Some((src, 0)),
        Op::Expand { shape } if *shape == s.dims => Some((src, 0)),
        Op::Narrow { axis, start, .. }
            if s.dims[..*axis].iter().all(|&d| d == 1) || store(node.id).folded =>
        {
            Some((src, start * s.strides()[*axis] * esz))
        }
        _ => None,
    }
}

/// `dims` padded with leading 1s to `rank`.
pub(crate) fn pad(dims: &[usize], rank: usize) -> Vec<usize> {
    let mut v = vec![1; rank - dims.len()];
    v.extend_from_slice(dims);
    v
}

/// Whether an operand of `dims` broadcast to `out` is `out`'s trailing block
/// (so that `out[i]` reads operand element `i % numel`).
pub(crate) fn is_suffix(dims: &[usize], out: &[usize]) -> bool {
    let p = pad(dims, out.len());
    match p.iter().position(|&d| d != 1) {
        None => true,
        Some(i) => p[i..] == out[i..],
    }
}

/// Element strides of `dims` broadcast to `out` (0 where broadcast).
pub(crate) fn bcast_strides(dims: &[usize], out: &[usize]) -> Vec<i32> {
    let p = pad(dims, out.len());
    let st = Shape::new(&p, DType::F32).strides();
    p.iter()
        .zip(st)
        .zip(out)
        .map(|((&d, s), &o)| if d == 1 && o != 1 { 0 } else { s as i32 })
        .collect()
}
