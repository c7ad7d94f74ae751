//! Rotary embeddings, and the decode rope fused with its cache writes.

use super::cx::{wrong_op, Addr, Cx};
use crate::fuse::cache::RopeCache;
use crate::launch::{elementwise, int, Arg, Launch};
use rlx_ir::op::RopeStyle;
use rlx_ir::{DType, NodeId, Op};

/// The one launch of a decode step's `Rope` (`cx.node`) with its cache
/// writes.
pub(super) fn rope_cache<A: Addr>(cx: &Cx<'_, A>, f: &RopeCache) -> Result<Vec<Launch>, String> {
    let Op::Rope {
        head_dim,
        n_rot,
        theta,
        style,
    } = &cx.node.op
    else {
        return Err("a rope-and-cache launch on a node that is not a Rope".into());
    };
    let w = cx.shape(0).last_dim();
    if *head_dim == 0 || !w.is_multiple_of(*head_dim) || *n_rot > *head_dim || n_rot % 2 != 0 {
        return Err(format!(
            "x {}: expected heads of {head_dim} and an even n_rot <= head_dim (n_rot {n_rot})",
            cx.shape(0)
        ));
    }
    let g = cx.graph;
    let at = |id: NodeId| {
        cx.addr
            .addr(id)
            .ok_or_else(|| format!("cache write input (node {id}) has no device address"))
    };
    // (cache address, [1, ctx, d] dims, node id) of a write.
    let cache = |id: NodeId| -> Result<(u64, usize, usize, i32), String> {
        let c = g.node(g.node(id).inputs[0]);
        let node = int(cx.addr.graph_id(id).index(), "node")?;
        Ok((at(c.id)?, c.shape.dims[1], c.shape.dims[2], node))
    };
    let (k, col) = f.k;
    let (c0, ctx0, d0, node0) = cache(k)?;
    if col + d0 > w {
        return Err(format!(
            "cache rows {col}..{} outside the roped row of {w}",
            col + d0
        ));
    }
    let (c1, s1, ctx1, d1, node1) = match f.v {
        Some(v) => {
            let (c, ctx, d, node) = cache(v)?;
            (c, at(g.node(v).inputs[1])?, ctx, d, node)
        }
        None => (0, 0, 0, 0, 0),
    };
    let pos = g.node(cx.node.inputs[1]);
    if !pos.shape.dtype.is_index() {
        return Err(format!("positions {}: expected i32 or i64", pos.shape));
    }
    let threads = w.max(d1);
    Ok(vec![Launch::Kernel {
        name: "rope_cache_row",
        grid: [threads.div_ceil(128) as u32, 1, 1],
        block: 128,
        smem: 0,
        args: vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::P(cx.input(1)?),
            Arg::I((pos.shape.dtype == DType::I64) as i32),
            Arg::I(int(w, "row")?),
            Arg::I(int(*head_dim, "head_dim")?),
            Arg::I(int(*n_rot, "n_rot")?),
            Arg::F(*theta),
            Arg::I((*style == RopeStyle::GptJ) as i32),
            Arg::P(c0),
            Arg::I(int(col, "column")?),
            Arg::I(int(d0, "width")?),
            Arg::I(int(ctx0, "ctx")?),
            Arg::I(node0),
            Arg::P(c1),
            Arg::P(s1),
            Arg::I(int(d1, "width")?),
            Arg::I(int(ctx1, "ctx")?),
            Arg::I(node1),
            Arg::Status,
        ],
    }])
}

/// A `Rope`.
pub(super) fn rope<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Rope {
        head_dim,
        n_rot,
        theta,
        style,
    } = &node.op
    else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    cx.f32_in(0)?;
    let x = cx.shape(0).clone();
    let pos = cx.shape(1).clone();
    if x.rank() != 3 || *head_dim == 0 || !x.dims[2].is_multiple_of(*head_dim) {
        return Err(format!("x {x}: expected [B, S, H*{head_dim}]"));
    }
    if *n_rot > *head_dim || n_rot % 2 != 0 {
        return Err(format!(
            "n_rot {n_rot} must be even and <= head_dim {head_dim}"
        ));
    }
    if !pos.dtype.is_index() {
        return Err(format!("positions {pos}: expected i32 or i64"));
    }
    let (b, s) = (x.dims[0], x.dims[1]);
    let pos_b = if pos.dims == [s] {
        0
    } else if pos.dims == [b, s] {
        1
    } else {
        return Err(format!("positions {pos}: expected [{s}] or [{b}, {s}]"));
    };
    // Llama 3 rope scaling: a third input divides each pair's frequency.
    let divisors = if node.inputs.len() > 2 {
        cx.f32_in(2)?;
        let f = cx.shape(2);
        if f.dims != [n_rot / 2] {
            return Err(format!(
                "frequency divisors {f}: expected [{}] (n_rot / 2)",
                n_rot / 2
            ));
        }
        cx.input(2)?
    } else {
        0
    };
    if n == 0 {
        return Ok(vec![]);
    }
    Ok(vec![elementwise(
        "rope_f32",
        n,
        vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::P(cx.input(1)?),
            Arg::P(divisors),
            Arg::I(int(b, "batch")?),
            Arg::I(int(s, "seq")?),
            Arg::I(int(x.dims[2] / head_dim, "heads")?),
            Arg::I(int(*head_dim, "head_dim")?),
            Arg::I(int(*n_rot, "n_rot")?),
            Arg::F(*theta),
            Arg::I((*style == RopeStyle::GptJ) as i32),
            Arg::I((pos.dtype == DType::I64) as i32),
            Arg::I(pos_b),
        ],
    )])
}
