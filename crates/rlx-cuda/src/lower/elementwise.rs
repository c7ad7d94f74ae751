//! Elementwise launches: activations, binary ops, casts, SwiGLU and fused elementwise chains.

use super::cx::{out_esz, wrong_op, Addr, Cx};
use super::layout::same_or_copy;
use crate::fuse::Chain;
use crate::launch::{activation_launch, elementwise, grid1, int, Arg, Launch};
use crate::opcodes::{act_code, bin_code, dtype_code};
use crate::views::{bcast_strides, is_suffix};
use rlx_ir::Op;

/// The root of a fused elementwise chain: one launch of its generated kernel.
pub(super) fn chain<A: Addr>(cx: &Cx<'_, A>, c: &Chain) -> Result<Vec<Launch>, String> {
    let graph = cx.graph;
    let out_shape = &cx.node.shape;
    let n = out_shape.numel();
    let mut args = vec![
        Arg::P(cx.out()?),
        Arg::L(n as i64),
        Arg::I(cx.dt_out().code()),
    ];
    for &l in &c.leaves {
        let a = cx
            .addr
            .addr(l)
            .ok_or_else(|| format!("chain input (node {l}) has no device address"))?;
        let dt = cx.addr.store(l).dt;
        args.extend([
            Arg::P(a),
            Arg::L(graph.node(l).shape.numel().max(1) as i64),
            Arg::I(dt.code()),
        ]);
    }
    Ok(vec![Launch::Dyn {
        name: c.name.clone(),
        source: c.source.clone(),
        grid: grid1(n),
        block: 256,
        args,
    }])
}

/// An `Activation`.
pub(super) fn activation<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Activation(act) = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    cx.f32_in(0)?;
    if n == 0 {
        return Ok(vec![]);
    }
    if cx.half_any(1) {
        return Ok(vec![activation_launch(
            cx.out()?,
            cx.input(0)?,
            n,
            *act,
            cx.dt_out(),
            cx.dt_in(0),
        )]);
    }
    Ok(vec![elementwise(
        "activation",
        n,
        vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::L(n as i64),
            Arg::I(act_code(Some(*act))),
        ],
    )])
}

/// A `Binary` op, broadcasting.
pub(super) fn binary<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Binary(op) = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    cx.f32_in(0)?;
    cx.f32_in(1)?;
    if n == 0 {
        return Ok(vec![]);
    }
    let (da, db) = (cx.shape(0).dims.clone(), cx.shape(1).dims.clone());
    let od = out_shape.dims.clone();
    if da.len() > od.len() || db.len() > od.len() {
        return Err("operand rank above output rank".into());
    }
    let (pa, pb, po) = (cx.input(0)?, cx.input(1)?, cx.out()?);
    let mixed = cx.half_any(2);
    let types = [
        Arg::I(cx.dt_out().code()),
        Arg::I(cx.dt_in(0).code()),
        Arg::I(cx.dt_in(1).code()),
    ];
    if is_suffix(&da, &od) && is_suffix(&db, &od) {
        let na: usize = da.iter().product();
        let nb: usize = db.iter().product();
        let mut args = vec![
            Arg::P(po),
            Arg::P(pa),
            Arg::P(pb),
            Arg::L(n as i64),
            Arg::L(na.max(1) as i64),
            Arg::L(nb.max(1) as i64),
            Arg::I(bin_code(*op)),
        ];
        if mixed {
            args.extend(types);
            return Ok(vec![elementwise("binary_mod_x", n, args)]);
        }
        return Ok(vec![elementwise("binary_mod", n, args)]);
    }
    let mut m = vec![od.len() as i32];
    for &d in &od {
        m.push(int(d, "dim")?);
    }
    m.extend(bcast_strides(&da, &od));
    m.extend(bcast_strides(&db, &od));
    let at = cx.push_meta(&m);
    let mut args = vec![
        Arg::P(po),
        Arg::P(pa),
        Arg::P(pb),
        Arg::L(n as i64),
        Arg::Meta(at),
        Arg::I(bin_code(*op)),
    ];
    if mixed {
        args.extend(types);
        return Ok(vec![elementwise("binary_bcast_x", n, args)]);
    }
    Ok(vec![elementwise("binary_bcast", n, args)])
}

/// A `Cast`.
pub(super) fn cast<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::Cast { to } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    let esz = out_esz(cx);
    let from = cx.shape(0).dtype;
    if *to == from {
        return same_or_copy(cx, 0, n * esz);
    }
    let (Some(f), Some(t)) = (dtype_code(from), dtype_code(*to)) else {
        return Err(format!("cast {from} -> {to} has no CUDA kernel"));
    };
    if n == 0 {
        return Ok(vec![]);
    }
    Ok(vec![elementwise(
        "cast_kernel",
        n,
        vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::L(n as i64),
            Arg::I(f),
            Arg::I(t),
        ],
    )])
}

/// A `FusedSwiGLU`.
pub(super) fn swiglu<A: Addr>(cx: &mut Cx<'_, A>) -> Result<Vec<Launch>, String> {
    let node = cx.node;
    let Op::FusedSwiGLU { packed } = &node.op else {
        return Err(wrong_op(node));
    };
    let out_shape = &node.shape;
    let n = out_shape.numel();
    for i in 0..node.inputs.len() {
        cx.f32_in(i)?;
    }
    let cols = out_shape.last_dim();
    let rows = n.checked_div(cols).unwrap_or(0);
    if n == 0 {
        return Ok(vec![]);
    }
    let up = if *packed { 0 } else { cx.input(1)? };
    Ok(vec![elementwise(
        "swiglu",
        n,
        vec![
            Arg::P(cx.out()?),
            Arg::P(cx.input(0)?),
            Arg::P(up),
            Arg::L(rows as i64),
            Arg::L(cols as i64),
            Arg::I(*packed as i32),
        ],
    )])
}
